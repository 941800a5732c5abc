/* stress.c -- many threads creating, using, sharing and releasing handles
 * at once, against the fake CUDA (two devices), with a shutdown midway.
 *
 * usage: stress [THREADS [ITERATIONS [paused|racy]]]   (default 8 2000)
 *
 * The main thread makes the shared objects: a context, two streams, three
 * device buffers, an event and the built-in kernels for each device, and a
 * pinned and a managed buffer.  Then every worker, in a loop, picks one of:
 * a private buffer written and read back (and compared); a private buffer
 * handed to another thread through a mailbox, whose last reference that
 * thread releases; retain, query and release of shared handles; copies
 * between shared buffers (also across devices) on shared streams; kernel
 * launches on shared buffers and streams, while other threads declare the
 * kernel's parameter types again; a private stream with
 * stream-ordered allocation, events and waits, released with work queued;
 * views of shared buffers; context creation (the same context, one more
 * reference) and release; labels; modules loaded, launched and released
 * with the launch in flight; synchronisations; launches whose kernel,
 * stream and buffer another thread may release at the same time (they must
 * succeed or fail with a stale handle, never touch what was destroyed).
 *
 * The workers start together; worker 0 calls cusafe_shutdown() once half
 * of all the iterations are done, while the others go on.  Every call must
 * then return CUSAFE_ERROR_SHUTDOWN, and every release CUSAFE_SUCCESS; a
 * call that ended before the shutdown began must have succeeded; one that
 * overlapped it may have either.  After the threads are joined the fake must
 * hold nothing alive.  A lifetime violation makes the fake abort; built with
 * -fsanitize=thread, any data race fails the run
 * (TSAN_OPTIONS=halt_on_error=1).
 *
 * Captures meet the rest: a worker captures work on a private stream or
 * on a wrapper of it, through either of the two (launches and fills of
 * shared buffers, a DLPack export whose consumer is the capturing
 * stream), then ends it and replays the graph on a shared stream, or
 * hands the capturing stream's last handle to a mailbox, where another
 * thread may release it at any time (which ends the capture), or releases
 * the wrapper or the stream midway.  Exported tensors go to a mailbox too,
 * whose next user runs their deleters, on its own thread, while their
 * consumers' streams may still capture; those left run after the
 * shutdown.
 *
 * With `racy` the workers do nothing but that last operation: the even ones
 * launch with the racy handles, the odd ones replace them, as fast as they
 * can; each launch sleeps 100 us inside CUDA's launch call, so that
 * releases meet launches in progress.
 *
 * With `paused` the fake's streams run their work only when synchronised,
 * so that much work is still queued when buffers are released and when the
 * library shuts down. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cusafe.h"
#ifdef CUSAFE_HAVE_DLPACK
#include "cusafe_dlpack.h"
#endif
#include "fakecuda.h"
#include "../abortutil.h"

#define NDEV 2
#define NBUF 3
#define BUF_BYTES 4096
#define MAILBOX 16

static struct {
  cusafe_context ctx[NDEV];
  cusafe_stream stream[NDEV][2];
  cusafe_buffer buf[NDEV][NBUF];
  cusafe_event event[NDEV];
  cusafe_module module[NDEV];
  cusafe_kernel fill[NDEV], axpy[NDEV];
  cusafe_buffer pinned, managed;
} S;

static _Atomic cusafe_buffer mailbox[MAILBOX];
/* Streams whose last handle another thread releases, maybe capturing. */
static _Atomic cusafe_stream stream_box[MAILBOX];
#ifdef CUSAFE_HAVE_DLPACK
/* Exported tensors whose deleters another thread runs. */
static DLManagedTensorVersioned *_Atomic tensor_box[MAILBOX];
#endif
/* Handles that workers replace, releasing the old one, while others launch
 * with them without a reference of their own. */
static _Atomic cusafe_kernel racy_kernel[NDEV];
static _Atomic cusafe_stream racy_stream[NDEV];
static _Atomic cusafe_buffer racy_buffer[NDEV];
static _Atomic int shutdown_started, shutdown_done;
/* Calls that ended before the shutdown began, overlapped it, or began
 * after it ended. */
static _Atomic unsigned long ops_before, ops_during, ops_after;
/* Launches with racy handles, and those that found one stale. */
static _Atomic unsigned long racy_launches, racy_stale;
static _Atomic long iterations_done;
static int iterations, nthreads, racy_only;
static pthread_barrier_t start;

#define fail(...) tu_abortf("stress", __VA_ARGS__)

/* C_RACY: a call whose handles another thread may release meanwhile;
 * C_DEVICE: a synchronisation of a device, refused while another thread
 * captures on it. */
enum { C_CALL, C_RELEASE, C_QUERY, C_RACY, C_DEVICE };

/* Checks one call's status against the shutdown: `before` is whether the
 * shutdown had finished when the call began, `after` whether it had begun
 * when the call returned. */
static cusafe_status verify(cusafe_status st, int kind, int before, int after,
                            const char *expr, int line) {
  if ((unsigned)st > (unsigned)CUSAFE_ERROR_CAPTURING)
    fail("line %d: %s returned %d, no cusafe_status", line, expr, (int)st);
  if (st != CUSAFE_SUCCESS && !*cusafe_last_error_message())
    fail("line %d: %s returned %s with no message", line, expr,
         cusafe_status_string(st));
  int ok;
  if (kind == C_RELEASE)
    ok = st == CUSAFE_SUCCESS;
  else if (before)
    ok = st == CUSAFE_ERROR_SHUTDOWN;
  else if (after)
    ok = st == CUSAFE_SUCCESS || st == CUSAFE_ERROR_SHUTDOWN ||
         (kind == C_QUERY && st == CUSAFE_ERROR_NOT_READY);
  else
    ok = st == CUSAFE_SUCCESS ||
         (kind == C_QUERY && st == CUSAFE_ERROR_NOT_READY);
  if (!ok && kind == C_DEVICE && !before && st == CUSAFE_ERROR_CAPTURING)
    ok = 1;
  if (!ok && kind == C_RACY && !before && st == CUSAFE_ERROR_INVALID_HANDLE)
    ok = strstr(cusafe_last_error_message(), " is stale: ") != NULL;
  if (kind == C_RACY) {
    atomic_fetch_add(&racy_launches, 1);
    if (st == CUSAFE_ERROR_INVALID_HANDLE)
      atomic_fetch_add(&racy_stale, 1);
  }
  if (!ok)
    fail("line %d: %s returned %s (%s) %s the shutdown", line, expr,
         cusafe_status_string(st), cusafe_last_error_message(),
         before  ? "after"
         : after ? "during"
                 : "before");
  atomic_fetch_add_explicit(before  ? &ops_after
                            : after ? &ops_during
                                    : &ops_before,
                            1, memory_order_relaxed);
  return st;
}

#define DO(kind, expr)                                                         \
  ({                                                                           \
    int before_ = atomic_load(&shutdown_done);                                 \
    cusafe_status st_ = (expr);                                                \
    verify(st_, (kind), before_, atomic_load(&shutdown_started), #expr,        \
           __LINE__);                                                          \
  })
#define CALL(expr) DO(C_CALL, expr)
#define QUERY(expr) DO(C_QUERY, expr)
#define RELEASE(expr) DO(C_RELEASE, expr)
#define RACY(expr) DO(C_RACY, expr)
#define DEVICE_SYNC(expr) DO(C_DEVICE, expr)

/* xorshift, one state per thread */
static uint32_t next(uint32_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 17;
  *s ^= *s << 5;
  return *s;
}

struct worker {
  int id;
  uint32_t rng;
  pthread_t tid;
  unsigned char host[BUF_BYTES], back[BUF_BYTES];
};

/* ---- operations -------------------------------------------------------- */

static void op_private_buffer(struct worker *w) {
  int d = next(&w->rng) % NDEV;
  cusafe_memory kind = (cusafe_memory)(next(&w->rng) % 3);
  size_t size = 1 + next(&w->rng) % BUF_BYTES;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  if (CALL(cusafe_buffer_alloc(&b, S.ctx[d], kind, size)) != CUSAFE_SUCCESS)
    return;
  unsigned char seed = (unsigned char)next(&w->rng);
  for (size_t i = 0; i < size; i++)
    w->host[i] = (unsigned char)(seed + i * 13);
  if (CALL(cusafe_buffer_write(b, 0, w->host, size)) == CUSAFE_SUCCESS &&
      CALL(cusafe_buffer_read(b, 0, w->back, size)) == CUSAFE_SUCCESS &&
      memcmp(w->host, w->back, size))
    fail("thread %d: a private buffer of %zu bytes read back differently",
         w->id, size);
  if (next(&w->rng) % 2) {
    /* Hand it over: whoever takes it releases it, maybe from another
     * thread, and that is the last reference. */
    cusafe_buffer old = atomic_exchange(&mailbox[next(&w->rng) % MAILBOX], b);
    RELEASE(cusafe_buffer_release(old));
  } else {
    RELEASE(cusafe_buffer_release(b));
  }
}

static cusafe_handle any_shared(struct worker *w) {
  uint32_t r = next(&w->rng);
  int d = r % NDEV;
  switch ((r >> 4) % 8) {
  case 0: return S.ctx[d];
  case 1: return S.stream[d][(r >> 8) & 1];
  case 2: return S.event[d];
  case 3: return S.module[d];
  case 4: return S.fill[d];
  case 5: return S.pinned;
  case 6: return S.managed;
  default: return S.buf[d][(r >> 8) % NBUF];
  }
}

static void op_retain_release(struct worker *w) {
  cusafe_handle h = any_shared(w);
  int n = 1 + next(&w->rng) % 3;
  for (int i = 0; i < n; i++)
    CALL(cusafe_retain(h));
  cusafe_handle_type type;
  CALL(cusafe_handle_get_type(&type, h));
  for (int i = 0; i < n; i++)
    RELEASE(next(&w->rng) % 2                   ? cusafe_release(h)
            : (h == S.pinned || h == S.managed) ? cusafe_buffer_release(h)
                                                : cusafe_release(h));
}

static cusafe_buffer any_buffer(struct worker *w, int *dev) {
  uint32_t r = next(&w->rng);
  *dev = r % NDEV;
  if ((r >> 4) % 8 == 0)
    return S.pinned;
  if ((r >> 4) % 8 == 1)
    return S.managed;
  return S.buf[*dev][(r >> 8) % NBUF];
}

static void op_copy(struct worker *w) {
  int dd, sd;
  cusafe_buffer dst = any_buffer(w, &dd), src = any_buffer(w, &sd);
  if (dst == src)
    return;
  size_t size = 1 + next(&w->rng) % (BUF_BYTES / 2);
  size_t doff = next(&w->rng) % (BUF_BYTES - size + 1);
  size_t soff = next(&w->rng) % (BUF_BYTES - size + 1);
  /* A stream of one of the two buffers' contexts (pinned and managed
   * buffers live in device 0's context). */
  int sdev = next(&w->rng) % 2 ? dd : sd;
  if (dst == S.pinned || dst == S.managed)
    dd = 0;
  if (src == S.pinned || src == S.managed)
    sd = 0;
  if (sdev != dd && sdev != sd)
    sdev = dd;
  cusafe_stream s = next(&w->rng) % 3 ? S.stream[sdev][next(&w->rng) & 1]
                                      : CUSAFE_STREAM_DEFAULT;
  if (s == CUSAFE_STREAM_DEFAULT)
    sdev = dd;
  CALL(cusafe_buffer_copy(dst, doff, src, soff, size, s));
}

static void op_launch(struct worker *w) {
  int d = next(&w->rng) % NDEV;
  cusafe_launch_config cfg = {{1 + next(&w->rng) % 4, 1, 1},
                              {32 << (next(&w->rng) % 3), 1, 1},
                              0,
                              next(&w->rng) % 3 ? S.stream[d][next(&w->rng) & 1]
                                                : CUSAFE_STREAM_DEFAULT};
  cusafe_buffer y = S.buf[d][next(&w->rng) % NBUF];
  cusafe_buffer x = S.buf[d][next(&w->rng) % NBUF];
  size_t n = BUF_BYTES / sizeof(float);
  if (next(&w->rng) % 2)
    CALL(CUSAFE_LAUNCH(S.fill[d], &cfg, CUSAFE_ARG_BUF(y),
                       CUSAFE_ARG_F32V(1.0f), CUSAFE_ARG_U64V(n)));
  else
    CALL(CUSAFE_LAUNCH(S.axpy[d], &cfg, CUSAFE_ARG_BUF(y),
                       CUSAFE_ARG_F32V(0.5f), CUSAFE_ARG_BUF(x),
                       CUSAFE_ARG_U64V(n)));
}

/* Declares the fill kernel's types again while others launch it: either
 * declaration takes the launches' arguments, and the signature read back
 * is one of the two, never a mix. */
static void op_declare(struct worker *w) {
  static const char *const decls[] = {"float *x, float value, size_t n",
                                      "float*, float, unsigned long"};
  static const char *const sigs[] = {
      "cusafe_fill_f32(float*, float, size_t)",
      "cusafe_fill_f32(float*, float, unsigned long)"};
  int d = next(&w->rng) % NDEV;
  char text[64];
  size_t n = 0;
  CALL(cusafe_kernel_declare(S.fill[d], decls[next(&w->rng) & 1]));
  if (CALL(cusafe_kernel_get_signature(text, sizeof text, &n, S.fill[d])) ==
          CUSAFE_SUCCESS &&
      strcmp(text, sigs[0]) != 0 && strcmp(text, sigs[1]) != 0)
    fail("signature \"%s\" of the fill kernel", text);
}

/* Replaces one of a device's racy handles, or launches with all three
 * (only one or the other if `role` is 1 or 2). */
static void op_racy(struct worker *w, int role) {
  int d = next(&w->rng) % NDEV;
  unsigned pick = next(&w->rng) % 4;
  if (role)
    pick = role == 1 ? pick % 3 : 3;
  switch (pick) {
  case 0: {
    cusafe_kernel k;
    if (CALL(cusafe_module_get_kernel(&k, S.module[d], "cusafe_fill_f32")) ==
        CUSAFE_SUCCESS)
      RELEASE(cusafe_kernel_release(atomic_exchange(&racy_kernel[d], k)));
    break;
  }
  case 1: {
    cusafe_stream s;
    if (CALL(cusafe_stream_create(&s, S.ctx[d], 0, 0)) == CUSAFE_SUCCESS)
      RELEASE(cusafe_stream_release(atomic_exchange(&racy_stream[d], s)));
    break;
  }
  case 2: {
    cusafe_buffer b;
    if (CALL(cusafe_buffer_alloc(&b, S.ctx[d], CUSAFE_MEMORY_DEVICE,
                                 BUF_BYTES)) == CUSAFE_SUCCESS)
      RELEASE(cusafe_buffer_release(atomic_exchange(&racy_buffer[d], b)));
    break;
  }
  default: {
    cusafe_launch_config cfg = {
        {2, 1, 1}, {64, 1, 1}, 0, atomic_load(&racy_stream[d])};
    RACY(CUSAFE_LAUNCH(atomic_load(&racy_kernel[d]), &cfg,
                       CUSAFE_ARG_BUF(atomic_load(&racy_buffer[d])),
                       CUSAFE_ARG_F32V(2.0f),
                       CUSAFE_ARG_U64V(BUF_BYTES / sizeof(float))));
  }
  }
}

static void op_private_stream(struct worker *w) {
  int d = next(&w->rng) % NDEV;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_event ev = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  if (CALL(cusafe_stream_create(&s, S.ctx[d], next(&w->rng) & 1, 0)) ==
          CUSAFE_SUCCESS &&
      CALL(cusafe_buffer_alloc_async(&b, s, BUF_BYTES)) == CUSAFE_SUCCESS &&
      CALL(cusafe_buffer_fill(b, 0, BUF_BYTES, 7, s)) == CUSAFE_SUCCESS &&
      CALL(cusafe_buffer_copy(S.buf[d][next(&w->rng) % NBUF], 0, b, 0,
                              BUF_BYTES / 2, s)) == CUSAFE_SUCCESS &&
      CALL(cusafe_event_create(&ev, S.ctx[d], next(&w->rng) & 1)) ==
          CUSAFE_SUCCESS &&
      CALL(cusafe_event_record(ev, s)) == CUSAFE_SUCCESS) {
    CALL(cusafe_stream_wait_event(S.stream[d][next(&w->rng) & 1], ev));
    QUERY(cusafe_event_query(ev));
    QUERY(cusafe_stream_query(s));
  }
  /* Released with their work possibly still queued. */
  RELEASE(cusafe_buffer_release(b));
  RELEASE(cusafe_event_release(ev));
  RELEASE(cusafe_stream_release(s));
}

static void op_view(struct worker *w) {
  int d;
  cusafe_buffer parent = any_buffer(w, &d);
  size_t off = next(&w->rng) % BUF_BYTES;
  size_t size = 1 + next(&w->rng) % (BUF_BYTES - off);
  cusafe_buffer v = CUSAFE_NULL_HANDLE, vv = CUSAFE_NULL_HANDLE;
  if (CALL(cusafe_buffer_view(&v, parent, off, size)) != CUSAFE_SUCCESS)
    return;
  CALL(cusafe_buffer_write(v, 0, w->host, size));
  if (size > 1 &&
      CALL(cusafe_buffer_view(&vv, v, 1, size - 1)) == CUSAFE_SUCCESS)
    CALL(cusafe_buffer_fill(vv, 0, size - 1, 3, CUSAFE_STREAM_DEFAULT));
  /* The parent view goes first: the inner one keeps it alive. */
  RELEASE(cusafe_buffer_release(v));
  RELEASE(cusafe_buffer_release(vv));
}

static void op_context(struct worker *w) {
  int d = next(&w->rng) % NDEV;
  cusafe_context c = CUSAFE_NULL_HANDLE;
  if (CALL(cusafe_context_create(&c, d)) == CUSAFE_SUCCESS && c != S.ctx[d])
    fail("thread %d: device %d has two contexts", w->id, d);
  cusafe_context c2 = CUSAFE_NULL_HANDLE;
  CALL(cusafe_buffer_get_context(&c2, S.buf[d][0]));
  RELEASE(cusafe_context_release(c));
  RELEASE(cusafe_context_release(c2));
  int least, greatest;
  CALL(cusafe_context_stream_priority_range(&least, &greatest, S.ctx[d]));
}

static void op_event(struct worker *w) {
  int d = next(&w->rng) % NDEV;
  cusafe_stream s = S.stream[d][next(&w->rng) & 1];
  CALL(cusafe_event_record(S.event[d], s));
  QUERY(cusafe_event_query(S.event[d]));
  CALL(cusafe_event_synchronize(S.event[d]));
}

static void op_label(struct worker *w) {
  char label[32];
  snprintf(label, sizeof label, "thread %d", w->id);
  CALL(
      cusafe_handle_set_label(any_shared(w), next(&w->rng) % 4 ? label : NULL));
}

static void op_module(struct worker *w) {
  int d = next(&w->rng) % NDEV;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_kernel k = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  if (CALL(cusafe_module_load_builtin(&m, S.ctx[d])) == CUSAFE_SUCCESS &&
      CALL(cusafe_module_get_kernel(&k, m, "cusafe_scale_f64")) ==
          CUSAFE_SUCCESS &&
      CALL(cusafe_buffer_alloc(&b, S.ctx[d], CUSAFE_MEMORY_DEVICE, 1024)) ==
          CUSAFE_SUCCESS) {
    uint32_t block = 0, grid = 0;
    CALL(cusafe_kernel_suggest_config(&block, &grid, k, 0, 128));
    cusafe_launch_config cfg = {
        {1, 1, 1}, {64, 1, 1}, 0, S.stream[d][next(&w->rng) & 1]};
    CALL(CUSAFE_LAUNCH(k, &cfg, CUSAFE_ARG_BUF(b), CUSAFE_ARG_F64V(2.0),
                       CUSAFE_ARG_U64V(128)));
  }
  /* The module first: the kernel keeps it, the launch keeps the buffer. */
  RELEASE(cusafe_module_release(m));
  RELEASE(cusafe_buffer_release(b));
  RELEASE(cusafe_kernel_release(k));
}

static void op_sync(struct worker *w) {
  int d = next(&w->rng) % NDEV;
  switch (next(&w->rng) % 3) {
  case 0:
    CALL(cusafe_stream_synchronize(S.stream[d][next(&w->rng) & 1]));
    break;
  case 1: DEVICE_SYNC(cusafe_context_synchronize(S.ctx[d])); break;
  default: {
    size_t size;
    CALL(cusafe_buffer_get_size(&size, S.buf[d][0]));
    CALL(cusafe_buffer_read(S.buf[d][next(&w->rng) % NBUF], 0, w->back,
                            BUF_BYTES));
  }
  }
}

/* Hands s's last handle (the caller's) to another thread, and releases
 * the one it finds there. */
static void stream_to_box(struct worker *w, cusafe_stream s) {
  RELEASE(cusafe_stream_release(
      atomic_exchange(&stream_box[next(&w->rng) % MAILBOX], s)));
}

#ifdef CUSAFE_HAVE_DLPACK
/* Exports 256 bytes of b with `consumer` as the consumer's stream and
 * hands the tensor to the mailbox, running the deleter of the one found
 * there (exported on another thread, its consumer's stream maybe
 * capturing). */
static void tensor_to_box(struct worker *w, cusafe_buffer b,
                          cusafe_stream consumer) {
  static const DLDataType u8 = {kDLUInt, 8, 1};
  int64_t n = 256;
  DLManagedTensorVersioned *t = NULL;
  if (CALL(cusafe_buffer_to_dlpack(&t, b, 0, u8, 1, &n, NULL, consumer)) !=
      CUSAFE_SUCCESS)
    return;
  t = atomic_exchange(&tensor_box[next(&w->rng) % MAILBOX], t);
  if (t)
    t->deleter(t);
}
#endif

static void op_capture(struct worker *w) {
  int d = next(&w->rng) % NDEV;
  cusafe_stream s = CUSAFE_NULL_HANDLE, wr = CUSAFE_NULL_HANDLE;
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  if (CALL(cusafe_stream_create(&s, S.ctx[d], next(&w->rng) & 1, 0)) !=
      CUSAFE_SUCCESS)
    return;
  void *raw = NULL;
  if (next(&w->rng) % 2 &&
      CALL(cusafe_stream_interop_handle(&raw, s)) == CUSAFE_SUCCESS)
    CALL(cusafe_stream_wrap(&wr, S.ctx[d], raw));
  /* The capture begins on `on`; work goes through either. */
  int on_wrapper = wr && next(&w->rng) % 2;
  cusafe_stream on = on_wrapper ? wr : s, other = on_wrapper ? s : wr;
  if (CALL(cusafe_stream_begin_capture(on)) == CUSAFE_SUCCESS) {
    cusafe_launch_config cfg = {
        {2, 1, 1}, {64, 1, 1}, 0, other && next(&w->rng) % 2 ? other : on};
    cusafe_buffer y = S.buf[d][next(&w->rng) % NBUF];
    size_t n = BUF_BYTES / sizeof(float);
    CALL(CUSAFE_LAUNCH(S.fill[d], &cfg, CUSAFE_ARG_BUF(y),
                       CUSAFE_ARG_F32V(1.0f), CUSAFE_ARG_U64V(n)));
    CALL(cusafe_buffer_fill(S.buf[d][next(&w->rng) % NBUF], 0, 64, 5,
                            cfg.stream));
#ifdef CUSAFE_HAVE_DLPACK
    if (next(&w->rng) % 2)
      tensor_to_box(w, S.buf[d][next(&w->rng) % NBUF], cfg.stream);
#endif
    /* The wrapper may go midway: the capture goes on. */
    if (wr && !on_wrapper && next(&w->rng) % 2) {
      RELEASE(cusafe_stream_release(wr));
      wr = CUSAFE_NULL_HANDLE;
    }
    switch (next(&w->rng) % 3) {
    case 0: /* its last handles: one to another thread, one released here,
             * maybe at once; the capture ends with the last */
      if (on_wrapper)
        wr = CUSAFE_NULL_HANDLE;
      else
        s = CUSAFE_NULL_HANDLE;
      CALL(cusafe_stream_retain(on));
      stream_to_box(w, on);
      RELEASE(cusafe_stream_release(on));
      break;
    case 1: /* released here: the capture ends */ break;
    default:
      if (CALL(cusafe_stream_end_capture(&g, on)) == CUSAFE_SUCCESS) {
        CALL(cusafe_graph_launch(g, S.stream[d][next(&w->rng) & 1]));
        CALL(cusafe_graph_launch(g, on));
      }
    }
  }
#ifdef CUSAFE_HAVE_DLPACK
  else if (next(&w->rng) % 2) {
    tensor_to_box(w, S.buf[d][next(&w->rng) % NBUF], s);
  }
#endif
  RELEASE(cusafe_graph_release(g));
  if (next(&w->rng) % 2) { /* either first: a wrapper holds its stream */
    RELEASE(cusafe_stream_release(s));
    RELEASE(cusafe_stream_release(wr));
  } else {
    RELEASE(cusafe_stream_release(wr));
    RELEASE(cusafe_stream_release(s));
  }
}

static double shutdown_ms;
static long shutdown_at; /* iterations done when it began */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void shut_down(void) {
  atomic_store(&shutdown_started, 1);
  shutdown_at = atomic_load(&iterations_done);
  double t0 = now_ms();
  cusafe_status st = cusafe_shutdown();
  shutdown_ms = now_ms() - t0;
  if (st != CUSAFE_SUCCESS)
    fail("cusafe_shutdown returned %s", cusafe_status_string(st));
  atomic_store(&shutdown_done, 1);
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  long half = (long)nthreads * iterations / 2;
  pthread_barrier_wait(&start);
  for (int i = 0; i < iterations; i++) {
    if (w->id == 0 && !atomic_load(&shutdown_started) &&
        atomic_load(&iterations_done) >= half)
      shut_down();
    if (racy_only) {
      op_racy(w, w->id % 2 ? 1 : 2);
      if (w->id % 2) { /* as slow as a launch: the two overlap throughout */
        struct timespec nap = {0, 100000};
        nanosleep(&nap, NULL);
      }
      atomic_fetch_add(&iterations_done, 1);
      continue;
    }
    switch (next(&w->rng) % 16) {
    case 0:
    case 1: op_private_buffer(w); break;
    case 2: op_retain_release(w); break;
    case 3: op_copy(w); break;
    case 4: op_launch(w); break;
    case 5: op_private_stream(w); break;
    case 6: op_view(w); break;
    case 7: op_context(w); break;
    case 8: op_event(w); break;
    case 9: op_label(w); break;
    case 10: op_module(w); break;
    case 11:
    case 12: op_racy(w, 0); break;
    case 13: op_capture(w); break;
    case 15: op_declare(w); break;
    default: op_sync(w); break;
    }
    atomic_fetch_add(&iterations_done, 1);
  }
  if (w->id == 0 && !atomic_load(&shutdown_started)) {
    /* Done early: the shutdown still comes halfway through the others. */
    while (atomic_load(&iterations_done) < half)
      sched_yield();
    shut_down();
  }
  return NULL;
}

#define SETUP(expr)                                                            \
  do {                                                                         \
    cusafe_status st_ = (expr);                                                \
    if (st_ != CUSAFE_SUCCESS)                                                 \
      fail("setup: %s returned %s: %s", #expr, cusafe_status_string(st_),      \
           cusafe_last_error_message());                                       \
  } while (0)

int main(int argc, char **argv) {
  nthreads = argc > 1 ? atoi(argv[1]) : 8;
  iterations = argc > 2 ? atoi(argv[2]) : 2000;
  int paused = argc > 3 && !strcmp(argv[3], "paused");
  racy_only = argc > 3 && !strcmp(argv[3], "racy");
  if (nthreads < 2 || nthreads > 64 || iterations < 2) {
    fprintf(stderr, "usage: %s [THREADS [ITERATIONS [paused|racy]]]\n",
            argv[0]);
    return 2;
  }
  fake_set_paused(paused);
  if (racy_only)
    fake_set_launch_delay(100); /* launches in progress meet releases */

  for (int d = 0; d < NDEV; d++) {
    SETUP(cusafe_context_create(&S.ctx[d], d));
    for (int i = 0; i < 2; i++)
      SETUP(cusafe_stream_create(&S.stream[d][i], S.ctx[d],
                                 i ? CUSAFE_STREAM_NON_BLOCKING : 0, 0));
    for (int i = 0; i < NBUF; i++) {
      SETUP(cusafe_buffer_alloc(&S.buf[d][i], S.ctx[d], CUSAFE_MEMORY_DEVICE,
                                BUF_BYTES));
      SETUP(cusafe_buffer_fill(S.buf[d][i], 0, BUF_BYTES, 0,
                               CUSAFE_STREAM_DEFAULT));
    }
    SETUP(cusafe_event_create(&S.event[d], S.ctx[d], 0));
    SETUP(cusafe_module_load_builtin(&S.module[d], S.ctx[d]));
    SETUP(cusafe_module_get_kernel(&S.fill[d], S.module[d], "cusafe_fill_f32"));
    SETUP(cusafe_module_get_kernel(&S.axpy[d], S.module[d], "cusafe_axpy_f32"));
    cusafe_handle h;
    SETUP(cusafe_module_get_kernel(&h, S.module[d], "cusafe_fill_f32"));
    atomic_init(&racy_kernel[d], h);
    SETUP(cusafe_stream_create(&h, S.ctx[d], 0, 0));
    atomic_init(&racy_stream[d], h);
    SETUP(cusafe_buffer_alloc(&h, S.ctx[d], CUSAFE_MEMORY_DEVICE, BUF_BYTES));
    atomic_init(&racy_buffer[d], h);
  }
  SETUP(cusafe_buffer_alloc(&S.pinned, S.ctx[0], CUSAFE_MEMORY_HOST_PINNED,
                            BUF_BYTES));
  SETUP(cusafe_buffer_alloc(&S.managed, S.ctx[0], CUSAFE_MEMORY_MANAGED,
                            BUF_BYTES));

  pthread_barrier_init(&start, NULL, (unsigned)nthreads);
  struct worker *w = calloc((size_t)nthreads, sizeof *w);
  if (!w)
    fail("out of memory");
  for (int i = 0; i < nthreads; i++) {
    w[i].id = i;
    w[i].rng = 0x9E3779B9u * (uint32_t)(i + 1);
    if (pthread_create(&w[i].tid, NULL, worker_main, &w[i]) != 0)
      fail("pthread_create failed");
  }
  for (int i = 0; i < nthreads; i++)
    pthread_join(w[i].tid, NULL);

  /* After the shutdown: releases are no-ops, the fake holds nothing. */
  for (int i = 0; i < MAILBOX; i++)
    if (cusafe_buffer_release(atomic_exchange(&mailbox[i], 0)) !=
        CUSAFE_SUCCESS)
      fail("a release after the shutdown failed");
  for (int i = 0; i < MAILBOX; i++) {
    if (cusafe_stream_release(atomic_exchange(&stream_box[i], 0)) !=
        CUSAFE_SUCCESS)
      fail("a release after the shutdown failed");
#ifdef CUSAFE_HAVE_DLPACK
    /* A deleter after the shutdown frees the tensor only. */
    DLManagedTensorVersioned *t = atomic_exchange(&tensor_box[i], NULL);
    if (t)
      t->deleter(t);
#endif
  }
  for (int d = 0; d < NDEV; d++)
    if (cusafe_context_release(S.ctx[d]) != CUSAFE_SUCCESS ||
        cusafe_kernel_release(S.fill[d]) != CUSAFE_SUCCESS ||
        cusafe_kernel_release(racy_kernel[d]) != CUSAFE_SUCCESS ||
        cusafe_stream_release(racy_stream[d]) != CUSAFE_SUCCESS ||
        cusafe_buffer_release(racy_buffer[d]) != CUSAFE_SUCCESS)
      fail("a release after the shutdown failed");
  cusafe_buffer b;
  if (cusafe_buffer_alloc(&b, S.ctx[0], CUSAFE_MEMORY_DEVICE, 1) !=
      CUSAFE_ERROR_SHUTDOWN)
    fail("an allocation after the shutdown did not say SHUTDOWN");
  size_t a = fake_live_allocations(-1), s = fake_live_streams(-1),
         e = fake_live_events(-1), l = fake_live_libraries(-1),
         c = fake_live_captures(-1), g = fake_live_graphs(-1),
         x = fake_live_graph_execs(-1);
  int r0 = fake_primary_ctx_refcount(0), r1 = fake_primary_ctx_refcount(1);
  if (a || s || e || l || c || g || x || r0 || r1)
    fail("alive after the shutdown: %zu allocation(s), %zu stream(s), %zu "
         "event(s), %zu librar(ies), %zu capture(s), %zu graph(s), %zu "
         "executable graph(s), primary context references %d and %d",
         a, s, e, l, c, g, x, r0, r1);
  printf("stress: %d threads x %d iterations%s: %lu calls checked: %lu "
         "before the shutdown, %lu during it, %lu after it; the shutdown "
         "began after %ld iterations and took %.1f ms; %lu launches with "
         "racy handles, %lu of them found one stale\n",
         nthreads, iterations,
         paused      ? " (paused streams)"
         : racy_only ? " (racy handles)"
                     : "",
         atomic_load(&ops_before) + atomic_load(&ops_during) +
             atomic_load(&ops_after),
         atomic_load(&ops_before), atomic_load(&ops_during),
         atomic_load(&ops_after), shutdown_at, shutdown_ms,
         atomic_load(&racy_launches), atomic_load(&racy_stale));
  pthread_barrier_destroy(&start);
  free(w);
  return 0;
}
