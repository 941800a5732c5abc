/* exit_c.c -- how a C program that uses cusafe ends.
 *
 *   exit_c SCENARIO
 *
 * Each scenario runs in a fresh process; tests/exit-c.sh runs them and
 * checks the exit status and that stderr stays empty (no CUDA error, no
 * "fakecuda: VIOLATION", no signal).  The program is built twice: linked
 * with the fake CUDA (exit_c_fake, with CUSAFE_TEST_FAKE defined) and with
 * the real runtime (exit_c_gpu).  Scenarios:
 *
 *   probe          exit 0 if a CUDA device is there, 77 if not (no driver
 *                  or no device), 2 on another failure
 *   layout         print the layout of the public structs (for the
 *                  Python binding's test)
 *   live           return from main with handles of every type alive and
 *                  work queued; prints "... N live handles ..." on stdout
 *   exit3          the same, leaving through exit(3)
 *   _exit          the same, leaving through _exit(0)
 *   shutdown       cusafe_shutdown() with everything alive, then release
 *                  everything: every release returns CUSAFE_SUCCESS, other
 *                  calls CUSAFE_ERROR_SHUTDOWN
 *   thread         main returns while a thread allocates, writes, reads
 *                  and releases in a loop; the thread stops quietly at
 *                  CUSAFE_ERROR_SHUTDOWN
 *   thread-shutdown
 *                  cusafe_shutdown() while that thread runs; the thread
 *                  ends at CUSAFE_ERROR_SHUTDOWN and main returns
 *   fork           fork() after CUDA was used: the child gets
 *                  CUSAFE_ERROR_FORKED with its message, its releases are
 *                  no-ops, and it exits normally; the parent carries on
 *   fault          a kernel fault (the real runtime: a kernel compiled
 *                  with NVRTC writes through an invalid pointer; the fake:
 *                  a sticky cudaErrorIllegalAddress), then a synchronize
 *                  that reports it (CUSAFE_ERROR_CUDA, CUDA error 700), and
 *                  exit with everything alive
 *   atexit-before  an atexit handler registered before cusafe's first
 *                  call releases every handle: it runs after cusafe's
 *                  shutdown (and the runtime's teardown), so each release
 *                  is a no-op that returns CUSAFE_SUCCESS
 *   graph-replays  a graph with 100 replays queued, its buffers released,
 *                  and a capture left open on another stream
 *   devices        work queued on every device (fills, launches, peer
 *                  copies between neighbours), all handles alive; exits
 *                  77 where there are fewer than 2 devices
 *
 * Any unexpected result is reported on stderr and ends the program with
 * status 2 (or 77 when the machine has no CUDA driver or device). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cusafe.h>

#ifdef CUSAFE_TEST_FAKE
#include "fakecuda.h"
#endif

/* The message of CUSAFE_ERROR_FORKED, as the library words it. */
#define FORKED_MESSAGE                                                         \
  "cusafe cannot be used in a process forked after CUDA was initialised"

#define N ((size_t)1 << 16) /* floats per buffer */

static const char *scenario = "?";

static void fail(const char *fmt, ...)
    __attribute__((noreturn, format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "exit_c %s: ", scenario);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
  _exit(2);
}

/* Fails unless `got` is `want`, naming the call. */
static void expect(const char *what, cusafe_status got, cusafe_status want) {
  if (got == want)
    return;
  if (want == CUSAFE_SUCCESS &&
      (got == CUSAFE_ERROR_NO_DRIVER || got == CUSAFE_ERROR_NO_DEVICE))
    _exit(77); /* no GPU here: skip */
  fail("%s returned %s (%s), expected %s", what, cusafe_status_string(got),
       cusafe_last_error_message(), cusafe_status_string(want));
}

#define OK(call) expect(#call, (call), CUSAFE_SUCCESS)

/* Handles of every type, with work queued on them. */
struct live {
  cusafe_context ctx;
  cusafe_stream stream;
  cusafe_event event;
  cusafe_buffer a, b, view;
  cusafe_module module;
  cusafe_kernel fill;
};
#define LIVE_HANDLES 8

static struct live L;
static float host[N];

static void make_live(struct live *l) {
  OK(cusafe_context_create(&l->ctx, 0));
  OK(cusafe_stream_create(&l->stream, l->ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  OK(cusafe_event_create(&l->event, l->ctx, 0));
  OK(cusafe_buffer_alloc(&l->a, l->ctx, CUSAFE_MEMORY_DEVICE, sizeof host));
  OK(cusafe_buffer_alloc(&l->b, l->ctx, CUSAFE_MEMORY_HOST_PINNED,
                         sizeof host));
  OK(cusafe_buffer_view(&l->view, l->a, sizeof host / 2, sizeof host / 2));
  OK(cusafe_module_load_builtin(&l->module, l->ctx));
  OK(cusafe_module_get_kernel(&l->fill, l->module, "cusafe_fill_f32"));

  for (size_t i = 0; i < N; i++)
    host[i] = (float)i;
  OK(cusafe_buffer_write(l->a, 0, host, sizeof host));
  /* Queued and never waited for. */
  cusafe_launch_config config = {
      {(N / 2 + 255) / 256, 1, 1}, {256, 1, 1}, 0, l->stream};
  OK(cusafe_buffer_fill(l->a, 0, sizeof host / 2, 0, l->stream));
  OK(CUSAFE_LAUNCH(l->fill, &config, CUSAFE_ARG_BUF(l->view),
                   CUSAFE_ARG_F32V(3.0f), CUSAFE_ARG_U64V(N / 2)));
  OK(cusafe_buffer_copy(l->b, 0, l->a, 0, sizeof host, l->stream));
  OK(cusafe_event_record(l->event, l->stream));
}

/* Releases every handle of l, expecting `want` from each release. */
static void release_live(struct live *l, cusafe_status want) {
  expect("cusafe_kernel_release", cusafe_kernel_release(l->fill), want);
  expect("cusafe_module_release", cusafe_module_release(l->module), want);
  expect("cusafe_buffer_release(view)", cusafe_buffer_release(l->view), want);
  expect("cusafe_buffer_release(b)", cusafe_buffer_release(l->b), want);
  expect("cusafe_release(a)", cusafe_release(l->a), want);
  expect("cusafe_event_release", cusafe_event_release(l->event), want);
  expect("cusafe_stream_release", cusafe_stream_release(l->stream), want);
  expect("cusafe_context_release", cusafe_context_release(l->ctx), want);
}

/* ---- scenarios ----------------------------------------------------------- */

static int probe(void) {
  int n = 0;
  cusafe_status st = cusafe_device_count(&n);
  if (st == CUSAFE_ERROR_NO_DRIVER || st == CUSAFE_ERROR_NO_DEVICE)
    return 77;
  expect("cusafe_device_count", st, CUSAFE_SUCCESS);
  printf("%d device(s)\n", n);
  return 0;
}

#define FIELD(type, field)                                                     \
  printf("%s.%s %zu %zu\n", #type, #field, offsetof(type, field),              \
         sizeof(((type *)0)->field))
#define SIZE(type) printf("%s %zu\n", #type, sizeof(type))

static int layout(void) {
  SIZE(cusafe_device_properties);
  FIELD(cusafe_device_properties, name);
  FIELD(cusafe_device_properties, total_memory);
  FIELD(cusafe_device_properties, compute_capability_major);
  FIELD(cusafe_device_properties, compute_capability_minor);
  FIELD(cusafe_device_properties, multiprocessor_count);
  FIELD(cusafe_device_properties, max_threads_per_block);
  FIELD(cusafe_device_properties, max_block_dim);
  FIELD(cusafe_device_properties, max_grid_dim);
  FIELD(cusafe_device_properties, shared_memory_per_block);
  FIELD(cusafe_device_properties, shared_memory_per_block_optin);
  FIELD(cusafe_device_properties, warp_size);
  FIELD(cusafe_device_properties, managed_memory);
  FIELD(cusafe_device_properties, concurrent_managed_access);
  FIELD(cusafe_device_properties, memory_pools);
  FIELD(cusafe_device_properties, pci_bus_id);
  FIELD(cusafe_device_properties, pci_device_id);
  FIELD(cusafe_device_properties, pci_domain_id);
  SIZE(cusafe_arg);
  FIELD(cusafe_arg, kind);
  FIELD(cusafe_arg, size);
  FIELD(cusafe_arg, value);
  FIELD(cusafe_arg, value.buffer);
  FIELD(cusafe_arg, value.i);
  FIELD(cusafe_arg, value.u);
  FIELD(cusafe_arg, value.f32);
  FIELD(cusafe_arg, value.f64);
  FIELD(cusafe_arg, value.bytes);
  SIZE(cusafe_launch_config);
  FIELD(cusafe_launch_config, grid);
  FIELD(cusafe_launch_config, block);
  FIELD(cusafe_launch_config, shared_memory);
  FIELD(cusafe_launch_config, stream);
  SIZE(cusafe_handle);
  SIZE(cusafe_status);
  SIZE(cusafe_memory);
  SIZE(cusafe_handle_type);
  return 0;
}

static int live(void) {
  make_live(&L);
  printf("live: exiting with %d live handles and work queued\n", LIVE_HANDLES);
  return 0;
}

static int exit3(void) {
  make_live(&L);
  fflush(stdout);
  exit(3);
}

static int quick_exit0(void) {
  make_live(&L);
  fflush(stdout);
  _exit(0);
}

static int shutdown_first(void) {
  cusafe_buffer extra;
  cusafe_context ctx2;
  int n;

  make_live(&L);
  OK(cusafe_shutdown());
  OK(cusafe_shutdown()); /* idempotent */
  expect("cusafe_buffer_alloc after shutdown",
         cusafe_buffer_alloc(&extra, L.ctx, CUSAFE_MEMORY_DEVICE, 64),
         CUSAFE_ERROR_SHUTDOWN);
  if (extra != CUSAFE_NULL_HANDLE)
    fail("cusafe_buffer_alloc after shutdown left a handle in *out");
  expect("cusafe_context_create after shutdown",
         cusafe_context_create(&ctx2, 0), CUSAFE_ERROR_SHUTDOWN);
  expect("cusafe_buffer_write after shutdown",
         cusafe_buffer_write(L.a, 0, host, 4), CUSAFE_ERROR_SHUTDOWN);
  expect("cusafe_device_count after shutdown", cusafe_device_count(&n),
         CUSAFE_ERROR_SHUTDOWN);
  if (cusafe_last_error_message()[0] == '\0')
    fail("no message after CUSAFE_ERROR_SHUTDOWN");
  expect("cusafe_retain after shutdown", cusafe_retain(L.a),
         CUSAFE_ERROR_SHUTDOWN);
  release_live(&L, CUSAFE_SUCCESS);
  release_live(&L, CUSAFE_SUCCESS); /* releases stay no-ops */
  return 0;
}

/* thread: a worker inside cusafe calls while main returns. */
static volatile int iterations;

static void *worker(void *arg) {
  cusafe_context ctx = *(cusafe_context *)arg;
  static float in[N], out[N];
  for (;;) {
    cusafe_buffer buf;
    cusafe_status st =
        cusafe_buffer_alloc(&buf, ctx, CUSAFE_MEMORY_DEVICE, sizeof in);
    if (st == CUSAFE_ERROR_SHUTDOWN)
      return NULL; /* the process is exiting */
    expect("cusafe_buffer_alloc (thread)", st, CUSAFE_SUCCESS);
    st = cusafe_buffer_write(buf, 0, in, sizeof in);
    if (st == CUSAFE_SUCCESS)
      st = cusafe_buffer_read(buf, 0, out, sizeof out);
    if (st != CUSAFE_SUCCESS && st != CUSAFE_ERROR_SHUTDOWN)
      expect("cusafe_buffer_write/read (thread)", st, CUSAFE_SUCCESS);
    /* A release succeeds, also after shutdown. */
    expect("cusafe_buffer_release (thread)", cusafe_buffer_release(buf),
           CUSAFE_SUCCESS);
    if (st == CUSAFE_ERROR_SHUTDOWN)
      return NULL;
    __atomic_add_fetch(&iterations, 1, __ATOMIC_SEQ_CST);
  }
}

/* Makes the live handles and starts the worker; returns once it has been
 * round its loop a few times. */
static pthread_t start_worker(void) {
  pthread_t t;
  make_live(&L);
  if (pthread_create(&t, NULL, worker, &L.ctx) != 0)
    fail("pthread_create failed");
  while (__atomic_load_n(&iterations, __ATOMIC_SEQ_CST) < 3)
    usleep(100);
  return t;
}

static int thread(void) {
  (void)start_worker();
  return 0; /* exit() runs while the worker is inside cusafe calls */
}

static int thread_shutdown(void) {
  pthread_t t = start_worker();
  OK(cusafe_shutdown()); /* while the worker is inside cusafe calls */
  if (pthread_join(t, NULL) != 0)
    fail("pthread_join failed");
  return 0;
}

static int forked(void) {
  pid_t pid;
  int status;

  make_live(&L);
  OK(cusafe_stream_synchronize(L.stream));
  fflush(stdout);
  fflush(stderr);
  pid = fork();
  if (pid < 0)
    fail("fork failed");
  if (pid == 0) {
    cusafe_buffer buf = 1234;
    int n;
    scenario = "fork (child)";
    expect("cusafe_buffer_alloc in the child",
           cusafe_buffer_alloc(&buf, L.ctx, CUSAFE_MEMORY_DEVICE, 64),
           CUSAFE_ERROR_FORKED);
    if (strcmp(cusafe_last_error_message(), FORKED_MESSAGE) != 0)
      fail("the message of CUSAFE_ERROR_FORKED is \"%s\", expected \"%s\"",
           cusafe_last_error_message(), FORKED_MESSAGE);
    if (buf != CUSAFE_NULL_HANDLE)
      fail("cusafe_buffer_alloc in the child left a handle in *out");
    expect("cusafe_buffer_read in the child",
           cusafe_buffer_read(L.a, 0, host, 4), CUSAFE_ERROR_FORKED);
    expect("cusafe_device_count in the child", cusafe_device_count(&n),
           CUSAFE_ERROR_FORKED);
    expect("cusafe_context_create in the child",
           cusafe_context_create(&L.ctx, 0), CUSAFE_ERROR_FORKED);
    release_live(&L, CUSAFE_SUCCESS);
    OK(cusafe_shutdown());
    exit(0); /* the atexit handlers inherited from the parent run */
  }
  if (waitpid(pid, &status, 0) != pid)
    fail("waitpid failed");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail("the child ended with status 0x%x", status);
  /* The parent's CUDA is untouched. */
  float x[4] = {1, 2, 3, 4}, y[4] = {0};
  OK(cusafe_buffer_write(L.a, 0, x, sizeof x));
  OK(cusafe_buffer_read(L.a, 0, y, sizeof y));
  if (memcmp(x, y, sizeof x) != 0)
    fail("the parent's buffer lost its data after the fork");
  return 0;
}

static int fault(void) {
  cusafe_status st;
  make_live(&L);
#ifdef CUSAFE_TEST_FAKE
  /* What a kernel fault leaves behind: every call on the device fails. */
  fake_set_sticky_error(0, cudaErrorIllegalAddress);
#else
  static const char source[] =
      "extern \"C\" __global__ void cusafe_test_fault(void)\n"
      "{\n"
      "  *(volatile int *)0x10 = 1;\n"
      "}\n";
  cusafe_module module;
  cusafe_kernel kernel;
  cusafe_launch_config config = {{1, 1, 1}, {1, 1, 1}, 0, L.stream};
  OK(cusafe_module_compile(&module, L.ctx, source, "fault.cu", NULL, 0));
  OK(cusafe_module_get_kernel(&kernel, module, "cusafe_test_fault"));
  OK(cusafe_kernel_launch(kernel, &config, NULL, 0));
#endif
  st = cusafe_context_synchronize(L.ctx);
  expect("cusafe_context_synchronize after the fault", st, CUSAFE_ERROR_CUDA);
  if (cusafe_last_cuda_error() != 700)
    fail("cusafe_last_cuda_error() is %d after the fault, expected 700",
         cusafe_last_cuda_error());
  printf("fault reported: %s\n", cusafe_last_error_message());
  return 0; /* exit with everything alive in a broken context */
}

static void release_at_exit(void) {
  cusafe_buffer buf;
  scenario = "atexit-before (handler)";
  release_live(&L, CUSAFE_SUCCESS);
  expect("cusafe_buffer_alloc in a late atexit handler",
         cusafe_buffer_alloc(&buf, L.ctx, CUSAFE_MEMORY_DEVICE, 64),
         CUSAFE_ERROR_SHUTDOWN);
}

static int atexit_before(void) {
  if (atexit(release_at_exit) != 0)
    fail("atexit failed");
  make_live(&L);
  return 0;
}

/* Exits with a graph whose replays are queued, its buffers released, and
 * a capture left open on another stream. */
static int graph_replays(void) {
  cusafe_stream other;
  cusafe_graph g;
  make_live(&L);
  OK(cusafe_stream_create(&other, L.ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  cusafe_launch_config config = {
      {(N / 2 + 255) / 256, 1, 1}, {256, 1, 1}, 0, L.stream};
  OK(cusafe_stream_begin_capture(L.stream));
  OK(CUSAFE_LAUNCH(L.fill, &config, CUSAFE_ARG_BUF(L.view),
                   CUSAFE_ARG_F32V(1.0f), CUSAFE_ARG_U64V(N / 2)));
  OK(cusafe_buffer_copy(L.b, 0, L.a, 0, sizeof host, L.stream));
  OK(cusafe_stream_end_capture(&g, L.stream));
  for (int i = 0; i < 100; i++)
    OK(cusafe_graph_launch(g, i % 2 ? L.stream : other));
  release_live(&L, CUSAFE_SUCCESS);
  config.stream = other;
  OK(cusafe_stream_begin_capture(other)); /* never ended */
  OK(cusafe_graph_launch(g, CUSAFE_STREAM_DEFAULT));
  printf("graph-replays: exiting with 100 replays queued and a capture "
         "open\n");
  return 0;
}

/* Exits with work queued on every device: on each, a fill and a launch
 * of its own, and peer copies from each device's buffer into the next
 * one's, all handles alive.  Needs 2 devices or more (77 otherwise). */
static int devices(void) {
  enum { MAX_DEVICES = 16 };
  int n = 0;
  OK(cusafe_device_count(&n));
  if (n < 2) {
    printf("devices: %d device, 2 needed\n", n);
    return 77;
  }
  if (n > MAX_DEVICES)
    n = MAX_DEVICES;
  struct live d[MAX_DEVICES];
  for (int i = 0; i < n; i++) {
    OK(cusafe_context_create(&d[i].ctx, i));
    OK(cusafe_stream_create(&d[i].stream, d[i].ctx, CUSAFE_STREAM_NON_BLOCKING,
                            0));
    OK(cusafe_buffer_alloc(&d[i].a, d[i].ctx, CUSAFE_MEMORY_DEVICE,
                           sizeof host));
    OK(cusafe_module_load_builtin(&d[i].module, d[i].ctx));
    OK(cusafe_module_get_kernel(&d[i].fill, d[i].module, "cusafe_fill_f32"));
    cusafe_launch_config config = {
        {(N + 255) / 256, 1, 1}, {256, 1, 1}, 0, d[i].stream};
    OK(cusafe_buffer_fill(d[i].a, 0, sizeof host, 0, d[i].stream));
    OK(CUSAFE_LAUNCH(d[i].fill, &config, CUSAFE_ARG_BUF(d[i].a),
                     CUSAFE_ARG_F32V((float)i), CUSAFE_ARG_U64V(N)));
  }
  /* Each device's buffer into the next one's, on the sender's stream and
   * then on the receiver's. */
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < n; i++) {
      int j = (i + 1) % n;
      OK(cusafe_buffer_copy(d[j].a, 0, d[i].a, 0, sizeof host,
                            round ? d[j].stream : d[i].stream));
    }
  printf("devices: exiting with work queued on %d devices\n", n);
  return 0;
}

static const struct {
  const char *name;
  int (*run)(void);
} scenarios[] = {
    {"probe", probe},
    {"layout", layout},
    {"live", live},
    {"exit3", exit3},
    {"_exit", quick_exit0},
    {"shutdown", shutdown_first},
    {"thread", thread},
    {"thread-shutdown", thread_shutdown},
    {"fork", forked},
    {"fault", fault},
    {"atexit-before", atexit_before},
    {"graph-replays", graph_replays},
    {"devices", devices},
};

int main(int argc, char **argv) {
  size_t i;
  if (argc != 2) {
    fprintf(stderr, "usage: exit_c SCENARIO\n");
    return 2;
  }
  scenario = argv[1];
  for (i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
    if (strcmp(argv[1], scenarios[i].name) == 0)
      return scenarios[i].run();
  fprintf(stderr, "exit_c: unknown scenario %s\n", argv[1]);
  return 2;
}
