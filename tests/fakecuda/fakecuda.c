/* fakecuda.c -- a fake CUDA runtime for the test suite (see fakecuda.h).
 *
 * The test build links the library's sources with this file instead of
 * lib/cuda_real.c, so `cs_cuda_table` below is the only CUDA the library
 * sees.  It includes the CUDA headers for their types only and calls no
 * CUDA function.
 *
 * Model, in brief:
 *   - "Device" memory is host memory from malloc(), filled with 0xA5 when
 *     allocated so that no test can depend on zeroes, and followed by a guard
 *     zone that is checked when the memory is freed.
 *   - Each stream is a FIFO of operations.  Unpaused, an operation runs as
 *     soon as it is queued (an infinitely fast GPU); paused, it waits until
 *     a synchronize reaches it.  Positions in a stream are sequence numbers
 *     of queued operations; events capture (stream, position).
 *   - Queued work checks every pointer it touches against the allocation
 *     records when it runs, which is when a real GPU would touch it.
 *   - Every table call is counted and logged, then goes through, in order:
 *     the teardown check, fault injection, the driver state, the device's
 *     sticky error, and only then does its work.
 *
 * One global mutex protects all state.  Nothing here ever blocks waiting for
 * another thread (synchronizing just runs the queues), so holding the lock
 * for the whole of a call is safe. */

#define _GNU_SOURCE /* memfd_create */
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda_api.h"
#include "fakecuda.h"

/* The control API and the table stay visible even when the code they are
 * linked into is built with -fvisibility=hidden, so that tests can reach
 * them through a shared library. */
#define FAKE_EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------------ */
/* Constants                                                                  */
/* ------------------------------------------------------------------------ */

#define MAX_DEVICES 8
#define DEFAULT_DEVICES 2
#define DEFAULT_MEMORY_LIMIT ((size_t)1 << 30)
#define SM_COUNT 132
#define DEFAULT_CLUSTER_SMS 16 /* multiprocessors of a GPC */
#define PRIORITY_LEAST 0
#define PRIORITY_GREATEST (-5)

/* The version the fake driver and runtime report: the toolkit's own, so the
 * library's version checks see a plausible, matching pair. */
#define FAKE_DRIVER_VERSION CUDA_VERSION
#define FAKE_RUNTIME_VERSION CUDART_VERSION

#define FILL_BYTE 0xA5   /* fresh allocations: never zero */
#define GUARD_BYTE 0xFD  /* the zone just past each allocation */
#define POISON_BYTE 0xDD /* freed memory, while it is quarantined */
#define GUARD_BYTES 64

/* Freed memory is not handed back to malloc() at once (see free_now()): up
 * to this much of it stays quarantined, the oldest released first. */
#define QUARANTINE_MAX_BYTES ((size_t)64 << 20)
#define QUARANTINE_MAX_COUNT 4096

#define MAX_FAIL_FUNCTIONS 16
#define FAIL_NAME_MAX 64

/* ------------------------------------------------------------------------ */
/* State                                                                      */
/* ------------------------------------------------------------------------ */

/* KIND_VMM: a mapping of cuMemMap, of shareable memory (a memfd), never
 * poisoned nor given to free(): other processes may map it too. */
enum alloc_kind { KIND_DEVICE, KIND_PINNED, KIND_MANAGED, KIND_VMM };
enum alloc_state { ALLOC_LIVE, ALLOC_FREE_PENDING, ALLOC_FREED };

struct falloc {
  struct falloc *prev, *next; /* in the live list, or the quarantine */
  unsigned char *base;
  size_t size;
  int device;
  enum alloc_kind kind;
  enum alloc_state state;
  struct fvmm *vmm; /* KIND_VMM: the handle whose memory it maps */
};

/* Shareable memory (see "Driver: virtual memory management" below). */
struct fvmm {
  int fd;      /* the memfd, -1 once released */
  size_t size; /* bytes */
  int device;
  int exportable; /* created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
  int released;
  size_t maps; /* mappings of it in this process */
  struct fvmm *next;
};

struct frange {
  uintptr_t base;
  size_t size;
  int freed;
  struct frange *next;
};

static struct fvmm *g_vmms;
static struct frange *g_ranges;

enum op_kind {
  OP_COPY,
  OP_PEER_COPY,
  OP_SET,
  OP_FREE,
  OP_WAIT,          /* cudaStreamWaitEvent */
  OP_IMPLICIT_WAIT, /* the legacy default stream's implicit synchronization */
  OP_LAUNCH,        /* cudaLaunchKernel */
  OP_GRAPH,         /* cudaGraphLaunch */
  OP_WAIT_EXTERNAL  /* a graph's event wait node (cudaEventWaitExternal) */
};

struct fstream;
struct fkernel;
struct fexec;
struct fevent;
struct fcapture;

/* A record of an event: where, and at which position. */
struct frecord {
  struct fstream *stream; /* NULL: nothing to wait for */
  uint64_t pos;
};

struct fop {
  struct fop *next;
  enum op_kind kind;
  void *dst;
  const void *src;
  size_t size;
  int value;
  struct falloc *alloc;    /* OP_FREE */
  struct fstream *wait_on; /* OP_WAIT, OP_IMPLICIT_WAIT */
  uint64_t wait_pos;
  void *staging; /* OP_COPY from pageable memory: the bytes taken at the call;
                   OP_LAUNCH: the argument values taken at the call */
  struct fkernel *kernel; /* OP_LAUNCH */
  struct fexec *exec;     /* OP_GRAPH */
  struct fevent *event;   /* OP_WAIT_EXTERNAL */
  /* OP_GRAPH: for each event wait node of the graph, in order, the record
   * its event had at cudaGraphLaunch, which the node waits for. */
  struct frecord *records;
};

struct fstream {
  int device;
  unsigned int flags;
  int priority;
  int builtin;       /* a device's legacy default stream (stream 0) */
  int destroyed;     /* cudaStreamDestroy was called; may still be draining */
  int running;       /* guards against re-entering this stream's queue */
  uint64_t enqueued; /* operations ever queued: the position of the last */
  uint64_t done;     /* operations completed (run or discarded) */
  struct fop *head, *tail;
  /* The capture this stream takes part in (it began there, or joined by
   * waiting for an event recorded in it), NULL if none; the sequence
   * number of the last node it captured, and of the last of its nodes
   * that another stream of the capture waited for (joined). */
  struct fcapture *capture;
  uint64_t cap_last, cap_joined;
};

struct fevent {
  int device;
  unsigned int flags;
  int destroyed;
  int recorded;
  struct fstream *stream; /* where and at which position it was recorded */
  uint64_t pos;
  uint64_t stamp; /* the device's clock at the record, for elapsed time */
  /* Last recorded in a capture (then the fields above keep the record
   * before it): the capture, the node count there, the capturing stream. */
  struct fcapture *capture;
  uint64_t cap_seq;
  struct fstream *cap_stream;
};

/* A stream capture sequence, kept as a tombstone once ended. */
struct fcapture {
  enum cudaStreamCaptureMode mode;
  struct fstream *origin;
  const void *thread; /* the beginning thread's token (t_self) */
  int device;
  int invalidated;
  int ended;
  unsigned long long id; /* unique, from 1: cudaStreamGetCaptureInfo's */
  uint64_t seq;          /* nodes captured so far */
  struct fop *head, *tail;
};

/* A graph (the nodes of an ended capture) and an executable graph (a copy
 * of a graph's nodes), kept as tombstones once destroyed.  Nodes run in
 * the order they were captured, which is one order their edges allow. */
struct fgraph {
  int device;
  int destroyed;
  struct fop *head;
  size_t nnodes;
};

struct fexec {
  int device;
  int destroyed;
  size_t pending; /* launches queued and not yet run */
  struct fop *head;
  size_t nnodes;
};

struct fdevice {
  int managed;         /* managed memory supported */
  size_t limit;        /* bytes that live allocations may hold */
  size_t bytes;        /* bytes held by live and free-pending allocations */
  cudaError_t sticky;  /* 0, or the error every call on the device returns */
  int ctx_refs;        /* primary context retains */
  uint64_t clock;      /* counts queued operations and records */
  unsigned peers;      /* devices whose memory this one's context reaches */
  unsigned pool_peers; /* devices that this one's memory pool lets in */
  /* fake_set_launch_support, fake_set_compute_capability,
   * fake_set_cluster_sms */
  int cluster_launch, cooperative_launch, cc_major, cc_minor, cluster_sms;
  struct fstream legacy;
};

/* The kernels built into cusafe, as the fake exposes them from any real
 * fatbin or cubin image; see fakecuda.h. */
enum builtin_op { BI_NONE, BI_FILL, BI_SCALE, BI_AXPY, BI_VECADD };

struct fkernel {
  struct flibrary *lib;
  char *name;
  enum builtin_op op;
  size_t elem;          /* built-in kernels: 4 (f32) or 8 (f64) */
  size_t scalar_arg;    /* built-in kernels: the scalar's parameter */
  size_t src_arg;       /* BI_AXPY: x's parameter */
  int maxthreads;       /* maxThreadsPerBlock */
  size_t static_shared; /* sharedSizeBytes */
  /* cudaFuncAttributeMaxDynamicSharedMemorySize, per device */
  int max_dynamic[MAX_DEVICES];
  /* cudaFuncAttributeNonPortableClusterSizeAllowed, per device */
  int nonportable[MAX_DEVICES];
  size_t nparams;
  size_t *psize, *poffset;
  unsigned char *pointer; /* per parameter: declared `p` */
  size_t argbytes;        /* the end of the last parameter */
};

struct flibrary {
  int device;   /* the current device at load time */
  int unloaded; /* kept as a tombstone until teardown or reset */
  int builtin;  /* loaded from a real fatbin or cubin */
  size_t nkernels;
  struct fkernel *kernels; /* a cudaKernel_t points at one of these */
  size_t queued;           /* launches of its kernels not yet run */
  size_t graph_nodes;      /* launch nodes of its kernels in captures,
                              graphs and executable graphs */
};

struct fprogram {
  char *source, *name;
  char *log;   /* "" until a compile */
  char *image; /* a FAKECUBIN image after a successful compile */
  size_t image_size;
  int destroyed; /* kept as a tombstone until teardown or reset */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_initialized;

#define FAKE_MAX_LAUNCH_ATTRS 16
#define PARAM_SPACE_MAX 32764 /* bytes of kernel parameters (CUDA 12.1+) */

static struct {
  enum fake_driver driver;
  int ndev;
  int peer_ok;       /* devices reach each other's memory */
  int driver_launch; /* cuLaunchKernel and cuLaunchKernelEx offered */
  int vmm;           /* the virtual memory management calls offered */
  int paused;
  int strict;
  int torn_down;
  int atexit_registered;

  unsigned long calls;
  unsigned long fail_at; /* 0: none */
  cudaError_t fail_err;
  int fail_persistent;
  struct {
    char name[FAIL_NAME_MAX];
    cudaError_t err;
  } fail_fn[MAX_FAIL_FUNCTIONS];
  int nfail_fn;

  /* The log holds pointers to string literals only, so its entries stay
   * valid for ever and an entry costs no allocation. */
  const char **log;
  size_t log_len, log_cap;

  struct falloc *live; /* live and free-pending allocations */
  struct falloc *quar_head, *quar_tail;
  size_t quar_bytes, quar_count;

  /* Every stream and event ever created, destroyed ones included: their
   * structs are kept (as tombstones) until teardown or reset so that their
   * addresses are never reused, and a stale handle is always recognised. */
  struct fstream **streams;
  size_t nstreams, cap_streams;
  struct fevent **events;
  size_t nevents, cap_events;
  /* Libraries and NVRTC programs, kept the same way. */
  struct flibrary **libraries;
  size_t nlibraries, cap_libraries;
  struct fcapture **captures;
  size_t ncaptures, cap_captures;
  unsigned long long capture_ids; /* the last capture's id */
  struct fgraph **graphs;
  size_t ngraphs, cap_graphs;
  struct fexec **execs;
  size_t nexecs, cap_execs;
  struct fprogram **programs;
  size_t nprograms, cap_programs;
  char *nvrtc_options;        /* the options of the last nvrtcCompileProgram */
  unsigned char *launch_args; /* the argument values of the last launch */
  size_t launch_args_size;
  /* The attributes of the last launch (none for cudaLaunchKernel). */
  cudaLaunchAttribute launch_attrs[FAKE_MAX_LAUNCH_ATTRS];
  size_t launch_nattrs;
  /* The grid, block and dynamic shared memory of the last launch. */
  dim3 launch_grid, launch_block;
  size_t launch_shared;
  size_t param_space; /* bytes of parameters a kernel may take */

  struct fdevice dev[MAX_DEVICES];
} g;

static _Thread_local int t_device;             /* cudaSetDevice */
static _Thread_local cudaError_t t_last_error; /* cudaGetLastError */
static _Thread_local const char *t_call;       /* the runtime call made */
/* fake_set_call_hook(), under the fake's lock. */
static const char *call_hook_name;
static void (*call_hook)(void *);
static void *call_hook_arg;
/* cudaThreadExchangeStreamCaptureMode (Global, 0, by default), and a
 * token whose address tells the threads apart. */
static _Thread_local enum cudaStreamCaptureMode t_capture_mode;
static _Thread_local char t_self;
#define SELF ((const void *)&t_self)

/* A distinct non-NULL address per device to hand out as its CUcontext. */
static char g_ctx_token[MAX_DEVICES];

/* ------------------------------------------------------------------------ */
/* Failing the test                                                           */
/* ------------------------------------------------------------------------ */

/* The message of a fatal error, before abort(). */
static void print_fatal(const char *prefix, const char *fmt, va_list ap) {
  fputs(prefix, stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  fflush(stderr);
}

static void violation(const char *fmt, ...)
    __attribute__((noreturn, format(printf, 1, 2)));
static void violation(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  print_fatal("fakecuda: VIOLATION: ", fmt, ap);
  va_end(ap);
  abort();
}

/* A test used the control API wrongly: as fatal, but not the library's
 * fault, so it says so. */
static void misuse(const char *fmt, ...)
    __attribute__((noreturn, format(printf, 1, 2)));
static void misuse(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  print_fatal("fakecuda: misuse of the control API: ", fmt, ap);
  va_end(ap);
  abort();
}

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n);
  if (!q) {
    fputs("fakecuda: out of host memory\n", stderr);
    abort();
  }
  return q;
}

static const char *plural(size_t n) { return n == 1 ? "" : "s"; }

/* arr, an array of n elements of `size` bytes in room for *cap, with room
 * for one more. */
static void *grow(void *arr, size_t n, size_t *cap, size_t size) {
  if (n < *cap)
    return arr;
  *cap = *cap ? 2 * *cap : 16;
  return xrealloc(arr, *cap * size);
}

/* ------------------------------------------------------------------------ */
/* Defaults, locking                                                          */
/* ------------------------------------------------------------------------ */

static void set_defaults(void) {
  g.driver = FAKE_DRIVER_OK;
  g.ndev = DEFAULT_DEVICES;
  g.peer_ok = 1;
  g.driver_launch = 1;
  g.vmm = 1;
  g.paused = 0;
  g.strict = 1;
  g.calls = 0;
  g.fail_at = 0;
  g.fail_err = cudaSuccess;
  g.fail_persistent = 0;
  g.nfail_fn = 0;
  g.param_space = PARAM_SPACE_MAX;
  for (int i = 0; i < MAX_DEVICES; i++) {
    struct fdevice *d = &g.dev[i];
    memset(d, 0, sizeof *d);
    d->managed = 1;
    d->limit = DEFAULT_MEMORY_LIMIT;
    d->cluster_launch = 1;
    d->cooperative_launch = 1;
    d->cc_major = 9;
    d->cc_minor = 0;
    d->cluster_sms = DEFAULT_CLUSTER_SMS;
    d->legacy.device = i;
    d->legacy.builtin = 1;
  }
  g_initialized = 1;
}

static void lock(void) {
  pthread_mutex_lock(&g_lock);
  if (!g_initialized)
    set_defaults();
}

static void unlock(void) { pthread_mutex_unlock(&g_lock); }

static int valid_device(int d) { return d >= 0 && d < g.ndev; }

static void check_control_device(const char *fn, int device) {
  if (device < 0 || device >= MAX_DEVICES)
    misuse("%s: device %d is not in 0..%d", fn, device, MAX_DEVICES - 1);
}

/* ------------------------------------------------------------------------ */
/* Log                                                                        */
/* ------------------------------------------------------------------------ */

static void log_add(const char *entry) {
  if (g.log_len == g.log_cap) {
    g.log_cap = g.log_cap ? 2 * g.log_cap : 256;
    g.log = xrealloc(g.log, g.log_cap * sizeof *g.log);
  }
  g.log[g.log_len++] = entry;
}

static void log_free(void) {
  free(g.log);
  g.log = NULL;
  g.log_len = g.log_cap = 0;
}

/* ------------------------------------------------------------------------ */
/* Teardown and the common prologue of every call                            */
/* ------------------------------------------------------------------------ */

static void free_op(struct fop *o) {
  free(o->staging);
  free(o->records);
  free(o);
}

static void free_ops(struct fstream *s) {
  struct fop *o = s->head;
  while (o) {
    struct fop *next = o->next;
    free_op(o);
    o = next;
  }
  s->head = s->tail = NULL;
}

/* Frees a list of graph nodes: its launches no longer hold their
 * libraries. */
static void free_nodes(struct fop *o) {
  while (o) {
    struct fop *next = o->next;
    if (o->kind == OP_LAUNCH)
      o->kernel->lib->graph_nodes--;
    free_op(o);
    o = next;
  }
}

static void free_kernel_parts(struct fkernel *k) {
  free(k->name);
  free(k->psize);
  free(k->poffset);
  free(k->pointer);
}

static void free_library(struct flibrary *lib) {
  for (size_t i = 0; i < lib->nkernels; i++)
    free_kernel_parts(&lib->kernels[i]);
  free(lib->kernels);
  free(lib);
}

static void free_program_parts(struct fprogram *p) {
  free(p->source);
  free(p->name);
  free(p->log);
  free(p->image);
  p->source = p->name = p->log = p->image = NULL;
  p->image_size = 0;
}

static void free_allocations(struct falloc *a) {
  while (a) {
    struct falloc *next = a->next;
    if (a->kind != KIND_VMM) /* a mapping's range stays reserved */
      free(a->base);
    free(a);
    a = next;
  }
}

/* Drops every object and allocation without any check: what the real
 * runtime does at its teardown, and what fake_reset() promises.  Settings
 * (device count, limits, faults, ...) and the log are left alone. */
static void free_everything(void) {
  /* Graph nodes first: they point into the libraries. */
  for (size_t i = 0; i < g.ncaptures; i++) {
    free_nodes(g.captures[i]->head);
    free(g.captures[i]);
  }
  free(g.captures);
  g.captures = NULL;
  g.ncaptures = g.cap_captures = 0;
  for (size_t i = 0; i < g.ngraphs; i++) {
    free_nodes(g.graphs[i]->head);
    free(g.graphs[i]);
  }
  free(g.graphs);
  g.graphs = NULL;
  g.ngraphs = g.cap_graphs = 0;
  /* A queued graph launch refers to its executable graph: the queues go
   * before the executable graphs. */
  for (size_t i = 0; i < g.nstreams; i++)
    free_ops(g.streams[i]);
  for (int i = 0; i < MAX_DEVICES; i++)
    free_ops(&g.dev[i].legacy);
  for (size_t i = 0; i < g.nexecs; i++) {
    free_nodes(g.execs[i]->head);
    free(g.execs[i]);
  }
  free(g.execs);
  g.execs = NULL;
  g.nexecs = g.cap_execs = 0;

  free_allocations(g.live);
  g.live = NULL;
  while (g_vmms) {
    struct fvmm *v = g_vmms;
    g_vmms = v->next;
    if (v->fd >= 0)
      close(v->fd);
    free(v);
  }
  free_allocations(g.quar_head);
  g.quar_head = g.quar_tail = NULL;
  g.quar_bytes = g.quar_count = 0;

  for (size_t i = 0; i < g.nstreams; i++) {
    free_ops(g.streams[i]);
    free(g.streams[i]);
  }
  free(g.streams);
  g.streams = NULL;
  g.nstreams = g.cap_streams = 0;

  for (size_t i = 0; i < g.nevents; i++)
    free(g.events[i]);
  free(g.events);
  g.events = NULL;
  g.nevents = g.cap_events = 0;

  for (size_t i = 0; i < g.nlibraries; i++)
    free_library(g.libraries[i]);
  free(g.libraries);
  g.libraries = NULL;
  g.nlibraries = g.cap_libraries = 0;

  /* NVRTC is no part of the runtime, but a program outliving it is of no
   * use to a test: it goes too. */
  for (size_t i = 0; i < g.nprograms; i++) {
    free_program_parts(g.programs[i]);
    free(g.programs[i]);
  }
  free(g.programs);
  g.programs = NULL;
  g.nprograms = g.cap_programs = 0;

  for (int i = 0; i < MAX_DEVICES; i++) {
    struct fdevice *d = &g.dev[i];
    free_ops(&d->legacy);
    d->legacy.enqueued = d->legacy.done = 0;
    d->legacy.running = 0;
    d->bytes = 0;
    d->ctx_refs = 0;
    d->clock = 0;
    d->peers = d->pool_peers = 0;
  }
}

static void teardown_locked(void) {
  if (g.torn_down)
    return;
  free_everything();
  g.torn_down = 1;
}

/* Registered with atexit() at the first call, as the real runtime does, so
 * that handlers registered after that call run before it and handlers
 * registered before it run after it. */
static void teardown_atexit(void) { fake_teardown_now(); }

/* What the fake keeps of past calls for the tests to read: the log, the
 * last NVRTC options and the last launch's arguments. */
static void free_call_records(void) {
  log_free();
  free(g.nvrtc_options);
  g.nvrtc_options = NULL;
  free(g.launch_args);
  g.launch_args = NULL;
  g.launch_args_size = 0;
  g.launch_nattrs = 0;
}

/* The call records survive the teardown (tests of the behaviour after it
 * read them), so they are freed last, after every atexit handler has run:
 * ELF destructors run after them. */
__attribute__((destructor)) static void fake_fini(void) {
  pthread_mutex_lock(&g_lock);
  free_call_records();
  pthread_mutex_unlock(&g_lock);
}

/* Flags of a call's prologue (begin() and the ENTER_* statements below).
 * Every call is counted and logged, and fails after the teardown, on
 * request, and as the driver state says unless NO_DRIVER_CHECK. */
enum {
  NO_DRIVER_CHECK = 1 << 0, /* the version queries, which need no driver */
  STICKY = 1 << 1           /* fails with the sticky error of its device */
};

static cudaError_t driver_error(void) {
  if (g.driver == FAKE_DRIVER_MISSING)
    return cudaErrorInsufficientDriver;
  if (g.driver == FAKE_DRIVER_NO_DEVICE || g.ndev == 0)
    return cudaErrorNoDevice;
  return cudaSuccess;
}

static cudaError_t injected_fault(const char *name) {
  if (g.fail_at != 0 &&
      (g.calls == g.fail_at || (g.fail_persistent && g.calls > g.fail_at)))
    return g.fail_err;
  for (int i = 0; i < g.nfail_fn; i++)
    if (strcmp(g.fail_fn[i].name, name) == 0)
      return g.fail_fn[i].err;
  return cudaSuccess;
}

/* Counts and logs a call (the lock held); returns whether the teardown has
 * run, which under strict teardown is a VIOLATION instead. */
static int count_call(const char *name) {
  g.calls++;
  log_add(name);
  if (g.torn_down && g.strict)
    violation("%s called after the CUDA runtime was torn down", name);
  return g.torn_down;
}

/* Locks, counts and logs the call, then applies the teardown, fault
 * injection and (without NO_DRIVER_CHECK) the driver state.  Whatever it
 * returns, the caller must end through leave() or leave_driver(). */
static cudaError_t begin(const char *name, int flags) {
  lock();
  t_call = name;
  if (!g.atexit_registered) {
    g.atexit_registered = 1;
    atexit(teardown_atexit);
  }
  if (count_call(name))
    return cudaErrorCudartUnloading;
  cudaError_t e = injected_fault(name);
  if (e != cudaSuccess || (flags & NO_DRIVER_CHECK))
    return e;
  return driver_error();
}

/* Runtime calls remember their last error per thread, as the runtime does
 * for cudaGetLastError; cudaErrorNotReady is not an error there. */
static cudaError_t leave(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady)
    t_last_error = e;
  void (*hook)(void *) = NULL;
  void *hook_arg = NULL;
  if (call_hook_name != NULL && t_call && strcmp(call_hook_name, t_call) == 0) {
    hook = call_hook;
    hook_arg = call_hook_arg;
    call_hook_name = NULL;
  }
  unlock();
  if (hook)
    hook(hook_arg);
  return e;
}

/* Driver calls have no "last error".  Runtime codes (an injected fault,
 * the driver state, error 4 after teardown) become CUresults of the same
 * number: the common ones coincide. */
static CUresult leave_driver(int e) {
  unlock();
  return (CUresult)e;
}

/* The current device, or cudaErrorInvalidDevice if the device count was
 * lowered below it. */
static cudaError_t current_device(int *out) {
  if (!valid_device(t_device))
    return cudaErrorInvalidDevice;
  *out = t_device;
  return cudaSuccess;
}

static cudaError_t sticky(int device) { return g.dev[device].sticky; }

/* The current device into *dev and, with STICKY, its sticky error. */
static cudaError_t on_current_device(int flags, int *dev) {
  cudaError_t e = current_device(dev);
  if (e == cudaSuccess && (flags & STICKY))
    e = sticky(*dev);
  return e;
}

/* begin(), then the current device (see on_current_device()): the
 * prologue of the calls that act on the current device. */
static cudaError_t begin_on_device(const char *name, int flags, int *dev) {
  cudaError_t e = begin(name, flags);
  if (e == cudaSuccess)
    e = on_current_device(flags, dev);
  return e;
}

static cudaError_t begin_on_stream(const char *name, cudaStream_t h, int flags,
                                   struct fstream **out);
static cudaError_t legacy_call(const struct fstream *legacy, int invalidate);

/* Each call opens with one of these statements: its prologue (begin() and
 * what its flags ask for, or begin_nvrtc()) and, when that fails, a return
 * from the calling fk_* function through leave(), leave_driver() or
 * leave_nvrtc().  Past it the lock is held, and the function ends through
 * the same leave function. */
#define RETURN_IF_FAILED_(type, ok, prologue, leave_fn)                        \
  do {                                                                         \
    type r_ = (prologue);                                                      \
    if (r_ != (ok))                                                            \
      return leave_fn(r_);                                                     \
  } while (0)
#define ENTER_OR_RETURN(name, flags)                                           \
  RETURN_IF_FAILED_(cudaError_t, cudaSuccess, begin(name, flags), leave)
/* *dev: the current device */
#define ENTER_ON_DEVICE_OR_RETURN(name, flags, dev)                            \
  RETURN_IF_FAILED_(cudaError_t, cudaSuccess,                                  \
                    begin_on_device(name, flags, dev), leave)
/* *s: the stream argument resolved (its device's sticky error: STICKY) */
#define ENTER_ON_STREAM_OR_RETURN(name, stream, flags, s)                      \
  RETURN_IF_FAILED_(cudaError_t, cudaSuccess,                                  \
                    begin_on_stream(name, stream, flags, s), leave)
#define ENTER_DRIVER_OR_RETURN(name)                                           \
  RETURN_IF_FAILED_(cudaError_t, cudaSuccess, begin(name, 0), leave_driver)
#define ENTER_NVRTC_OR_RETURN(name)                                            \
  RETURN_IF_FAILED_(nvrtcResult, NVRTC_SUCCESS, begin_nvrtc(name), leave_nvrtc)

/* ------------------------------------------------------------------------ */
/* Allocations                                                                */
/* ------------------------------------------------------------------------ */

static const char *kind_name(enum alloc_kind k) {
  switch (k) {
  case KIND_DEVICE: return "device";
  case KIND_PINNED: return "pinned host";
  case KIND_MANAGED: return "managed";
  case KIND_VMM: return "mapped shareable";
  }
  return "?";
}

/* Size 0 gives NULL, as in the real runtime. */
static cudaError_t allocate(void **out, size_t size, int device,
                            enum alloc_kind kind) {
  if (size == 0) {
    *out = NULL;
    return cudaSuccess;
  }
  struct fdevice *d = &g.dev[device];
  if (size > d->limit || d->bytes > d->limit - size ||
      size > SIZE_MAX - GUARD_BYTES)
    return cudaErrorMemoryAllocation;
  struct falloc *a = malloc(sizeof *a);
  unsigned char *p = malloc(size + GUARD_BYTES);
  if (!a || !p) {
    free(a);
    free(p);
    return cudaErrorMemoryAllocation;
  }
  memset(p, FILL_BYTE, size);
  memset(p + size, GUARD_BYTE, GUARD_BYTES);
  a->base = p;
  a->size = size;
  a->device = device;
  a->kind = kind;
  a->state = ALLOC_LIVE;
  a->prev = NULL;
  a->next = g.live;
  if (g.live)
    g.live->prev = a;
  g.live = a;
  d->bytes += size;
  *out = p;
  return cudaSuccess;
}

/* The live (or free-pending) allocation that starts exactly at p. */
/* The live allocation that contains p, or NULL. */
static struct falloc *find_live_containing(const void *p) {
  for (struct falloc *a = g.live; a; a = a->next)
    if ((uintptr_t)p >= (uintptr_t)a->base &&
        (uintptr_t)p - (uintptr_t)a->base < a->size)
      return a;
  return NULL;
}

static struct falloc *find_live_base(const void *p) {
  for (struct falloc *a = g.live; a; a = a->next)
    if (a->base == p)
      return a;
  return NULL;
}

/* Whether [p, p + n) and a's memory, guard zone included, intersect. */
static int overlaps(const struct falloc *a, uintptr_t p, size_t n) {
  uintptr_t b = (uintptr_t)a->base;
  uintptr_t e = b + a->size + GUARD_BYTES;
  return p < e && p + (n ? n : 1) > b;
}

static void quarantine_evict_oldest(void) {
  struct falloc *a = g.quar_head;
  g.quar_head = a->next;
  if (g.quar_head)
    g.quar_head->prev = NULL;
  else
    g.quar_tail = NULL;
  g.quar_bytes -= a->size;
  g.quar_count--;
  if (a->kind != KIND_VMM) /* a mapping's range stays reserved */
    free(a->base);
  free(a);
}

/* Really frees an allocation (the point where a free "executes").
 *
 * The host memory is not free()'d at once: it is poisoned and kept, with its
 * record, in a bounded quarantine.  Were it handed back to malloc(), a test's
 * own host buffer could land at the same address and be taken for freed
 * device memory by the checks of queued copies.  Holding the memory while
 * its record exists makes that impossible; when the quarantine is full the
 * oldest memory and record go together, so an old freed pointer is then
 * merely no longer recognised. */
static void free_now(struct falloc *a) {
  for (size_t i = 0; i < GUARD_BYTES && a->kind != KIND_VMM; i++)
    if (a->base[a->size + i] != GUARD_BYTE)
      violation("memory just past the end of %s allocation %p (%zu bytes) "
                "was overwritten",
                kind_name(a->kind), (void *)a->base, a->size);

  if (a->prev)
    a->prev->next = a->next;
  else
    g.live = a->next;
  if (a->next)
    a->next->prev = a->prev;
  if (a->kind != KIND_VMM) /* a mapping's memory is its handle's */
    g.dev[a->device].bytes -= a->size;

  a->state = ALLOC_FREED;
  if (a->kind != KIND_VMM) /* other processes may still map it */
    memset(a->base, POISON_BYTE, a->size);
  a->prev = g.quar_tail;
  a->next = NULL;
  if (g.quar_tail)
    g.quar_tail->next = a;
  else
    g.quar_head = a;
  g.quar_tail = a;
  g.quar_bytes += a->size;
  g.quar_count++;
  /* Always keep the newest, so the last freed block is always recognised. */
  while (g.quar_head != g.quar_tail && (g.quar_bytes > QUARANTINE_MAX_BYTES ||
                                        g.quar_count > QUARANTINE_MAX_COUNT))
    quarantine_evict_oldest();
}

/* Checks the range a queued operation is about to touch.  A range inside a
 * live allocation is fine; one that starts inside it but runs past its end
 * is out of bounds; one that touches freed memory is a use after free.
 * Memory that no record knows is the caller's host memory, used as is. */
static void check_access(const char *op, const void *ptr, size_t n) {
  uintptr_t p = (uintptr_t)ptr;
  for (struct falloc *a = g.live; a; a = a->next) {
    uintptr_t b = (uintptr_t)a->base;
    if (p >= b && p < b + a->size + GUARD_BYTES) {
      if (p >= b + a->size || n > a->size - (p - b))
        violation("queued %s makes an out-of-bounds access: %zu bytes at "
                  "offset %zu of the %zu-byte %s allocation %p",
                  op, n, (size_t)(p - b), a->size, kind_name(a->kind),
                  (void *)a->base);
      return;
    }
  }
  for (struct falloc *a = g.quar_head; a; a = a->next)
    if (overlaps(a, p, n))
      violation("queued %s touches freed memory %p (%zu bytes at offset "
                "%zu of the freed %zu-byte %s allocation %p)",
                op, ptr, n, (size_t)(p - (uintptr_t)a->base), a->size,
                kind_name(a->kind), (void *)a->base);
  for (struct falloc *a = g.live; a; a = a->next)
    if (overlaps(a, p, n))
      violation("queued %s makes an out-of-bounds access: %zu bytes at %p "
                "run into the %zu-byte %s allocation %p",
                op, n, ptr, a->size, kind_name(a->kind), (void *)a->base);
}

/* A pointer argument of a kernel whose accesses the fake does not know: it
 * may point into a live allocation or just past its end (a buffer of 0
 * bytes there), never into freed memory or past the guard zone. */
static void check_pointer_arg(const char *op, const void *ptr) {
  uintptr_t p = (uintptr_t)ptr;
  for (struct falloc *a = g.live; a; a = a->next)
    if (p == (uintptr_t)a->base + a->size)
      return;
  check_access(op, ptr, 1);
}

/* ------------------------------------------------------------------------ */
/* Streams and their queues                                                   */
/* ------------------------------------------------------------------------ */

static int stream_pending(const struct fstream *s) {
  return s->done < s->enqueued;
}

/* A stream counts as alive until it is destroyed and its queue drained. */
static int stream_alive(const struct fstream *s) {
  return !s->destroyed || stream_pending(s);
}

static void run_stream_to(struct fstream *s, uint64_t pos);
static void exec_launch(const struct fop *o);
static void exec_graph(struct fop *o, int discard);

static void exec_op(struct fop *o) {
  switch (o->kind) {
  case OP_COPY:
  case OP_PEER_COPY: {
    const char *name =
        o->kind == OP_COPY ? "cudaMemcpyAsync" : "cudaMemcpyPeerAsync";
    check_access(name, o->dst, o->size);
    check_access(name, o->src, o->size);
    memmove(o->dst, o->src, o->size);
    log_add(o->kind == OP_COPY ? "exec:cudaMemcpyAsync"
                               : "exec:cudaMemcpyPeerAsync");
    break;
  }
  case OP_SET:
    check_access("cudaMemsetAsync", o->dst, o->size);
    memset(o->dst, o->value, o->size);
    log_add("exec:cudaMemsetAsync");
    break;
  case OP_FREE:
    free_now(o->alloc);
    log_add("exec:cudaFreeAsync");
    break;
  case OP_WAIT:
  case OP_IMPLICIT_WAIT:
    /* Running the awaited stream is how this stream "waits" for it. */
    run_stream_to(o->wait_on, o->wait_pos);
    if (o->kind == OP_WAIT)
      log_add("exec:cudaStreamWaitEvent");
    break;
  case OP_LAUNCH:
    o->kernel->lib->queued--;
    exec_launch(o);
    break;
  case OP_GRAPH: exec_graph(o, 0); break;
  case OP_WAIT_EXTERNAL:
    /* Only in a graph, whose launch runs it (exec_graph). */
    violation("an event wait node outside a graph");
  }
}

/* A dead (sticky) device does not run its queued work.  The memory of a
 * queued free is released all the same, as when the driver tears down the
 * broken context; it is logged as executed since the free did happen. */
static void discard_op(struct fop *o) {
  if (o->kind == OP_FREE) {
    free_now(o->alloc);
    log_add("exec:cudaFreeAsync");
  }
  if (o->kind == OP_LAUNCH)
    o->kernel->lib->queued--;
  if (o->kind == OP_GRAPH)
    exec_graph(o, 1);
}

/* Runs (or, on a sticky device, discards) s's queue up to position pos.
 * Waits are captured positions in the past, so no cycle can arise; the
 * `running` guard is only a safety net against re-entering a queue. */
static void run_stream_to(struct fstream *s, uint64_t pos) {
  if (s->running)
    return;
  s->running = 1;
  while (s->done < pos && s->head) {
    struct fop *o = s->head;
    s->head = o->next;
    if (!s->head)
      s->tail = NULL;
    if (sticky(s->device))
      discard_op(o);
    else
      exec_op(o);
    s->done++;
    free_op(o);
  }
  s->running = 0;
}

static void run_stream(struct fstream *s) { run_stream_to(s, s->enqueued); }

/* Everything queued on a device, zombie queues of destroyed streams too. */
static void run_device(int device) {
  run_stream(&g.dev[device].legacy);
  for (size_t i = 0; i < g.nstreams; i++)
    if (g.streams[i]->device == device)
      run_stream(g.streams[i]);
}

static void run_all_devices(void) {
  for (int d = 0; d < MAX_DEVICES; d++)
    run_device(d);
}

static struct fop *new_op(enum op_kind kind) {
  struct fop *o = calloc(1, sizeof *o);
  if (!o) {
    fputs("fakecuda: out of host memory\n", stderr);
    abort();
  }
  o->kind = kind;
  return o;
}

static void push_op(struct fstream *s, struct fop *o) {
  o->next = NULL;
  if (s->tail)
    s->tail->next = o;
  else
    s->head = o;
  s->tail = o;
  s->enqueued++;
  g.dev[s->device].clock++;
}

static void push_wait(struct fstream *s, enum op_kind kind, struct fstream *on,
                      uint64_t pos) {
  struct fop *o = new_op(kind);
  o->wait_on = on;
  o->wait_pos = pos;
  push_op(s, o);
}

/* The legacy default stream's implicit synchronization: work on it waits
 * for all earlier work of the device's blocking streams, and work on a
 * blocking stream waits for earlier work on it.  Modelled as wait
 * operations that are not logged. */
static void implicit_deps(struct fstream *s) {
  if (s->flags & cudaStreamNonBlocking)
    return;
  struct fstream *legacy = &g.dev[s->device].legacy;
  if (s->builtin) {
    for (size_t i = 0; i < g.nstreams; i++) {
      struct fstream *t = g.streams[i];
      if (t->device == s->device && !(t->flags & cudaStreamNonBlocking) &&
          stream_pending(t))
        push_wait(s, OP_IMPLICIT_WAIT, t, t->enqueued);
    }
  } else if (stream_pending(legacy)) {
    push_wait(s, OP_IMPLICIT_WAIT, legacy, legacy->enqueued);
  }
}

/* Adds o to the graph that s's capture is building, instead of queueing
 * it: nothing runs.  On a capture that an illegal call invalidated, every
 * operation fails. */
static cudaError_t capture_op(struct fstream *s, struct fop *o) {
  struct fcapture *c = s->capture;
  if (c->invalidated) {
    if (o->kind == OP_LAUNCH)
      o->kernel->lib->queued--;
    free_op(o);
    return cudaErrorStreamCaptureInvalidated;
  }
  if (o->kind == OP_LAUNCH) {
    o->kernel->lib->queued--;
    o->kernel->lib->graph_nodes++;
  }
  o->next = NULL;
  if (c->tail)
    c->tail->next = o;
  else
    c->head = o;
  c->tail = o;
  s->cap_last = ++c->seq;
  return cudaSuccess;
}

/* Queues o on s, after the implicit dependencies, and runs it at once
 * unless the fake is paused; on a capturing stream, captures it. */
static cudaError_t enqueue(struct fstream *s, struct fop *o) {
  if (s->capture)
    return capture_op(s, o);
  implicit_deps(s);
  push_op(s, o);
  if (!g.paused)
    run_stream(s);
  return cudaSuccess;
}

static struct fstream *find_stream(cudaStream_t h) {
  for (size_t i = 0; i < g.nstreams; i++)
    if (g.streams[i] == (struct fstream *)h)
      return g.streams[i];
  return NULL;
}

static int is_default_stream(cudaStream_t h) {
  /* Both special handles mean the current device's built-in stream here;
   * the fake does not model a separate per-thread default stream. */
  return h == NULL || h == cudaStreamLegacy || h == cudaStreamPerThread;
}

/* Resolves a stream argument; an unknown or destroyed stream is a
 * VIOLATION. */
static cudaError_t resolve_stream(const char *fn, cudaStream_t h,
                                  struct fstream **out) {
  if (is_default_stream(h)) {
    int dev;
    cudaError_t e = current_device(&dev);
    if (e != cudaSuccess)
      return e;
    *out = &g.dev[dev].legacy;
    return cudaSuccess;
  }
  struct fstream *s = find_stream(h);
  if (!s)
    violation("%s on stream %p, which is not a stream", fn, (void *)h);
  if (s->destroyed)
    violation("%s on stream %p after it was destroyed", fn, (void *)h);
  *out = s;
  return cudaSuccess;
}

/* begin(), then the stream argument h resolved into *out (the call's name
 * is the one its VIOLATIONs give) and, with STICKY, its device's sticky
 * error: the prologue of the calls that act on a stream. */
static cudaError_t begin_on_stream(const char *name, cudaStream_t h, int flags,
                                   struct fstream **out) {
  cudaError_t e = begin(name, flags);
  if (e == cudaSuccess)
    e = resolve_stream(name, h, out);
  if (e == cudaSuccess && (*out)->builtin)
    e = legacy_call(*out, 1);
  if (e == cudaSuccess && (flags & STICKY))
    e = sticky((*out)->device);
  return e;
}

static struct fevent *find_event(cudaEvent_t h) {
  for (size_t i = 0; i < g.nevents; i++)
    if (g.events[i] == (struct fevent *)h)
      return g.events[i];
  return NULL;
}

static struct fevent *resolve_event(const char *fn, cudaEvent_t h) {
  struct fevent *ev = find_event(h);
  if (!ev)
    violation("%s on event %p, which is not an event", fn, (void *)h);
  if (ev->destroyed)
    violation("%s on event %p after it was destroyed", fn, (void *)h);
  return ev;
}

/* Whether ev's record has been reached; an event never recorded has. */
static int event_complete(const struct fevent *ev) {
  return !ev->recorded || ev->stream->done >= ev->pos;
}

/* ------------------------------------------------------------------------ */
/* The rules of stream capture, as measured on an H100 (CUDA 13.0, driver   */
/* 580); see fakecuda.h.                                                      */
/* ------------------------------------------------------------------------ */

static int capture_active(const struct fcapture *c) { return !c->ended; }

/* A "potentially unsafe" call (an allocation or free, a query or
 * synchronization of a stream or event, ...) is prohibited for a thread
 * whose mode is not Relaxed while it has a capture of its own that did not
 * begin Relaxed, or, in Global mode, while another thread has a capture
 * that began Global.  The call fails with cudaErrorStreamCaptureUnsupported
 * and invalidates those captures. */
static cudaError_t unsafe_call(void) {
  if (t_capture_mode == cudaStreamCaptureModeRelaxed)
    return cudaSuccess;
  int prohibited = 0;
  for (size_t i = 0; i < g.ncaptures; i++) {
    struct fcapture *c = g.captures[i];
    if (!capture_active(c))
      continue;
    if ((c->thread == SELF && c->mode != cudaStreamCaptureModeRelaxed) ||
        (t_capture_mode == cudaStreamCaptureModeGlobal && c->thread != SELF &&
         c->mode == cudaStreamCaptureModeGlobal)) {
      c->invalidated = 1;
      prohibited = 1;
    }
  }
  return prohibited ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

/* Inside a call's body (the lock held): unsafe_call(), returning its
 * error. */
#define UNSAFE_OR_RETURN()                                                     \
  do {                                                                         \
    cudaError_t u_ = unsafe_call();                                            \
    if (u_ != cudaSuccess)                                                     \
      return leave(u_);                                                        \
  } while (0)

/* A query or synchronization of a capturing stream is never legal: it
 * invalidates the capture.  Of another stream it is a potentially unsafe
 * call. */
static cudaError_t stream_wait_call(struct fstream *s) {
  if (s->capture) {
    s->capture->invalidated = 1;
    return cudaErrorStreamCaptureUnsupported;
  }
  return unsafe_call();
}

/* The same for an event: one last recorded in a capture answers
 * cudaErrorCapturedEvent (and invalidates it) while the capture lasts,
 * cudaErrorInvalidValue after it ended. */
static cudaError_t event_wait_call(struct fevent *ev) {
  if (ev->capture) {
    if (ev->capture->ended)
      return cudaErrorInvalidValue;
    ev->capture->invalidated = 1;
    return cudaErrorCapturedEvent;
  }
  return unsafe_call();
}

/* cudaMallocAsync and cudaFreeAsync: potentially unsafe on a stream that
 * does not capture, graph memory nodes on one that does. */
static cudaError_t capture_memory_call(struct fstream *s) {
  return s->capture ? cudaSuccess : unsafe_call();
}

/* Synchronizing a whole device is illegal while any stream of it
 * captures, whatever the mode: it invalidates every such capture. */
static cudaError_t device_wait_call(int device) {
  int conflict = 0;
  for (size_t i = 0; i < g.ncaptures; i++) {
    struct fcapture *c = g.captures[i];
    if (capture_active(c) && c->device == device) {
      c->invalidated = 1;
      conflict = 1;
    }
  }
  return conflict ? cudaErrorStreamCaptureUnsupported : unsafe_call();
}

/* While a blocking stream (not cudaStreamNonBlocking) of a device
 * captures, any use of the device's legacy stream would make it depend on
 * the capture: cudaErrorStreamCaptureImplicit, and with `invalidate` the
 * capture is invalidated. */
static cudaError_t legacy_call(const struct fstream *legacy, int invalidate) {
  cudaError_t e = cudaSuccess;
  for (size_t i = 0; i < g.nstreams; i++) {
    struct fstream *t = g.streams[i];
    if (t->device == legacy->device && t->capture &&
        !(t->flags & cudaStreamNonBlocking)) {
      if (invalidate)
        t->capture->invalidated = 1;
      e = cudaErrorStreamCaptureImplicit;
    }
  }
  return e;
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                     */
/* ------------------------------------------------------------------------ */

/* Names and descriptions exactly as the real runtime gives them. */
static const struct {
  int code;
  const char *name, *text;
} error_table[] = {
    {0, "cudaSuccess", "no error"},
    {1, "cudaErrorInvalidValue", "invalid argument"},
    {2, "cudaErrorMemoryAllocation", "out of memory"},
    {3, "cudaErrorInitializationError", "initialization error"},
    {4, "cudaErrorCudartUnloading", "driver shutting down"},
    {9, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {13, "cudaErrorInvalidSymbol", "invalid device symbol"},
    {17, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {21, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {34, "cudaErrorStubLibrary", "CUDA driver is a stub library"},
    {35, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {46, "cudaErrorDevicesUnavailable",
     "CUDA-capable device(s) is/are busy or unavailable"},
    {98, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {100, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {101, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {200, "cudaErrorInvalidKernelImage", "device kernel image is invalid"},
    {201, "cudaErrorDeviceUninitialized", "invalid device context"},
    {209, "cudaErrorNoKernelImageForDevice",
     "no kernel image is available for execution on the device"},
    {217, "cudaErrorPeerAccessUnsupported",
     "peer access is not supported between these two devices"},
    {218, "cudaErrorInvalidPtx", "a PTX JIT compilation failed"},
    {221, "cudaErrorJitCompilerNotFound", "PTX JIT compiler library not found"},
    {222, "cudaErrorUnsupportedPtxVersion",
     "the provided PTX was compiled with an unsupported toolchain."},
    {300, "cudaErrorInvalidSource", "device kernel image is invalid"},
    {301, "cudaErrorFileNotFound", "file not found"},
    {400, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {401, "cudaErrorIllegalState",
     "the operation cannot be performed in the present state"},
    {500, "cudaErrorSymbolNotFound", "named symbol not found"},
    {600, "cudaErrorNotReady", "device not ready"},
    {700, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {701, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {702, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
    {709, "cudaErrorContextIsDestroyed", "context is destroyed"},
    {710, "cudaErrorAssert", "device-side assert triggered"},
    {714, "cudaErrorHardwareStackError", "hardware stack error"},
    {715, "cudaErrorIllegalInstruction",
     "an illegal instruction was encountered"},
    {716, "cudaErrorMisalignedAddress", "misaligned address"},
    {719, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {800, "cudaErrorNotPermitted", "operation not permitted"},
    {801, "cudaErrorNotSupported", "operation not supported"},
    {900, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {901, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {902, "cudaErrorStreamCaptureMerge",
     "operation would result in a merge of separate capture sequences"},
    {903, "cudaErrorStreamCaptureUnmatched",
     "capture was not ended in the same stream as it began"},
    {904, "cudaErrorStreamCaptureUnjoined",
     "capturing stream has unjoined work"},
    {905, "cudaErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {906, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking "
     "stream"},
    {907, "cudaErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing "
     "stream"},
    {908, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another "
     "thread"},
    {999, "cudaErrorUnknown", "unknown error"},
};

static const char *fk_get_error_name(cudaError_t err) {
  for (size_t i = 0; i < sizeof error_table / sizeof *error_table; i++)
    if (error_table[i].code == (int)err)
      return error_table[i].name;
  return "unrecognized error code";
}

static const char *fk_get_error_string(cudaError_t err) {
  for (size_t i = 0; i < sizeof error_table / sizeof *error_table; i++)
    if (error_table[i].code == (int)err)
      return error_table[i].text;
  return "unrecognized error code";
}

/* ------------------------------------------------------------------------ */
/* Devices and runtime                                                        */
/* ------------------------------------------------------------------------ */

static cudaError_t fk_get_device_count(int *count) {
  cudaError_t e = begin("cudaGetDeviceCount", 0);
  if (e == cudaSuccess && !count)
    e = cudaErrorInvalidValue;
  if (count)
    *count = e == cudaSuccess ? g.ndev : 0;
  return leave(e);
}

/* Unlike the rest, the two version queries work without a driver, as the
 * real ones do: the driver version is then 0. */
static cudaError_t fk_driver_get_version(int *version) {
  ENTER_OR_RETURN("cudaDriverGetVersion", NO_DRIVER_CHECK);
  if (!version)
    return leave(cudaErrorInvalidValue);
  *version = g.driver == FAKE_DRIVER_MISSING ? 0 : FAKE_DRIVER_VERSION;
  return leave(cudaSuccess);
}

static cudaError_t fk_runtime_get_version(int *version) {
  ENTER_OR_RETURN("cudaRuntimeGetVersion", NO_DRIVER_CHECK);
  if (!version)
    return leave(cudaErrorInvalidValue);
  *version = FAKE_RUNTIME_VERSION;
  return leave(cudaSuccess);
}

/* The one description of a fake device, for both properties and
 * attributes.  Its total memory follows the device's memory limit, so that
 * the library's own size checks and the fake agree. */
static void fill_properties(struct cudaDeviceProp *p, int dev) {
  const struct fdevice *d = &g.dev[dev];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "Fake GPU %d", dev);
  p->uuid.bytes[0] = 'F';
  p->uuid.bytes[15] = (char)dev;
  p->totalGlobalMem = d->limit;
  p->sharedMemPerBlock = 48 * 1024;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->memPitch = 2147483647;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->totalConstMem = 65536;
  p->major = d->cc_major;
  p->minor = d->cc_minor;
  p->textureAlignment = 512;
  p->multiProcessorCount = SM_COUNT;
  p->integrated = 0;
  p->canMapHostMemory = 1;
  p->concurrentKernels = 1;
  p->pciBusID = dev + 1;
  p->pciDeviceID = 0;
  p->pciDomainID = 0;
  p->asyncEngineCount = 2;
  p->unifiedAddressing = 1;
  p->maxThreadsPerMultiProcessor = 2048;
  p->streamPrioritiesSupported = 1;
  p->sharedMemPerMultiprocessor = 228 * 1024;
  p->regsPerMultiprocessor = 65536;
  p->managedMemory = d->managed;
  p->concurrentManagedAccess = d->managed;
  p->cooperativeLaunch = d->cooperative_launch;
  p->clusterLaunch = d->cluster_launch;
  p->sharedMemPerBlockOptin = 227 * 1024;
  p->maxBlocksPerMultiProcessor = 32;
  p->memoryPoolsSupported = 1;
}

static cudaError_t fk_get_device_properties(struct cudaDeviceProp *prop,
                                            int device) {
  ENTER_OR_RETURN("cudaGetDeviceProperties", 0);
  if (!prop)
    return leave(cudaErrorInvalidValue);
  if (!valid_device(device))
    return leave(cudaErrorInvalidDevice);
  fill_properties(prop, device);
  return leave(cudaSuccess);
}

static cudaError_t fk_device_get_attribute(int *value, enum cudaDeviceAttr attr,
                                           int device) {
  ENTER_OR_RETURN("cudaDeviceGetAttribute", 0);
  if (!value)
    return leave(cudaErrorInvalidValue);
  if (!valid_device(device))
    return leave(cudaErrorInvalidDevice);
  struct cudaDeviceProp p;
  fill_properties(&p, device);
  int v;
  switch (attr) {
  case cudaDevAttrMaxThreadsPerBlock: v = p.maxThreadsPerBlock; break;
  case cudaDevAttrMaxBlockDimX: v = p.maxThreadsDim[0]; break;
  case cudaDevAttrMaxBlockDimY: v = p.maxThreadsDim[1]; break;
  case cudaDevAttrMaxBlockDimZ: v = p.maxThreadsDim[2]; break;
  case cudaDevAttrMaxGridDimX: v = p.maxGridSize[0]; break;
  case cudaDevAttrMaxGridDimY: v = p.maxGridSize[1]; break;
  case cudaDevAttrMaxGridDimZ: v = p.maxGridSize[2]; break;
  case cudaDevAttrMaxSharedMemoryPerBlock: v = (int)p.sharedMemPerBlock; break;
  case cudaDevAttrTotalConstantMemory: v = (int)p.totalConstMem; break;
  case cudaDevAttrWarpSize: v = p.warpSize; break;
  case cudaDevAttrMaxRegistersPerBlock: v = p.regsPerBlock; break;
  case cudaDevAttrMultiProcessorCount: v = p.multiProcessorCount; break;
  case cudaDevAttrIntegrated: v = p.integrated; break;
  case cudaDevAttrCanMapHostMemory: v = p.canMapHostMemory; break;
  case cudaDevAttrConcurrentKernels: v = p.concurrentKernels; break;
  case cudaDevAttrPciBusId: v = p.pciBusID; break;
  case cudaDevAttrPciDeviceId: v = p.pciDeviceID; break;
  case cudaDevAttrPciDomainId: v = p.pciDomainID; break;
  case cudaDevAttrMaxThreadsPerMultiProcessor:
    v = p.maxThreadsPerMultiProcessor;
    break;
  case cudaDevAttrAsyncEngineCount: v = p.asyncEngineCount; break;
  case cudaDevAttrUnifiedAddressing: v = p.unifiedAddressing; break;
  case cudaDevAttrComputeCapabilityMajor: v = p.major; break;
  case cudaDevAttrComputeCapabilityMinor: v = p.minor; break;
  case cudaDevAttrStreamPrioritiesSupported:
    v = p.streamPrioritiesSupported;
    break;
  case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
    v = (int)p.sharedMemPerMultiprocessor;
    break;
  case cudaDevAttrMaxRegistersPerMultiprocessor:
    v = p.regsPerMultiprocessor;
    break;
  case cudaDevAttrManagedMemory: v = p.managedMemory; break;
  case cudaDevAttrConcurrentManagedAccess: v = p.concurrentManagedAccess; break;
  case cudaDevAttrCooperativeLaunch: v = p.cooperativeLaunch; break;
  case cudaDevAttrClusterLaunch: v = p.clusterLaunch; break;
  case cudaDevAttrMaxSharedMemoryPerBlockOptin:
    v = (int)p.sharedMemPerBlockOptin;
    break;
  case cudaDevAttrMaxBlocksPerMultiprocessor:
    v = p.maxBlocksPerMultiProcessor;
    break;
  case cudaDevAttrMemoryPoolsSupported: v = p.memoryPoolsSupported; break;
  default: return leave(cudaErrorInvalidValue);
  }
  *value = v;
  return leave(cudaSuccess);
}

static cudaError_t fk_get_device(int *device) {
  ENTER_OR_RETURN("cudaGetDevice", 0);
  if (!device)
    return leave(cudaErrorInvalidValue);
  *device = t_device;
  return leave(cudaSuccess);
}

static cudaError_t fk_set_device(int device) {
  ENTER_OR_RETURN("cudaSetDevice", 0);
  if (!valid_device(device))
    return leave(cudaErrorInvalidDevice);
  t_device = device;
  return leave(cudaSuccess);
}

/* Peer access: every pair of devices can reach each other, or none
 * (fake_set_peer_access). */
static cudaError_t fk_device_can_access_peer(int *can, int device, int peer) {
  ENTER_OR_RETURN("cudaDeviceCanAccessPeer", 0);
  if (!can)
    return leave(cudaErrorInvalidValue);
  if (!valid_device(device) || !valid_device(peer))
    return leave(cudaErrorInvalidDevice);
  *can = device != peer && g.peer_ok;
  return leave(cudaSuccess);
}

static cudaError_t fk_device_enable_peer_access(int peer, unsigned int flags) {
  int dev;
  ENTER_ON_DEVICE_OR_RETURN("cudaDeviceEnablePeerAccess", 0, &dev);
  if (flags)
    return leave(cudaErrorInvalidValue);
  if (!valid_device(peer) || peer == dev)
    return leave(cudaErrorInvalidDevice);
  if (!g.peer_ok)
    return leave(cudaErrorPeerAccessUnsupported);
  if (g.dev[dev].peers & (1u << peer))
    return leave(cudaErrorPeerAccessAlreadyEnabled);
  g.dev[dev].peers |= 1u << peer;
  return leave(cudaSuccess);
}

/* A device's memory pool is named by its fdevice. */
static cudaError_t fk_device_get_mem_pool(cudaMemPool_t *pool, int device) {
  ENTER_OR_RETURN("cudaDeviceGetMemPool", 0);
  if (!pool)
    return leave(cudaErrorInvalidValue);
  if (!valid_device(device))
    return leave(cudaErrorInvalidDevice);
  *pool = (cudaMemPool_t)(void *)&g.dev[device];
  return leave(cudaSuccess);
}

static cudaError_t fk_mem_pool_set_access(cudaMemPool_t pool,
                                          const struct cudaMemAccessDesc *desc,
                                          size_t count) {
  ENTER_OR_RETURN("cudaMemPoolSetAccess", 0);
  int dev = -1;
  for (int i = 0; i < g.ndev; i++)
    if ((void *)pool == (void *)&g.dev[i])
      dev = i;
  if (dev < 0 || (!desc && count))
    return leave(cudaErrorInvalidValue);
  for (size_t i = 0; i < count; i++) {
    const struct cudaMemAccessDesc *d = &desc[i];
    if (d->location.type != cudaMemLocationTypeDevice ||
        !valid_device(d->location.id))
      return leave(cudaErrorInvalidValue);
    /* The pool's own device keeps read-write access. */
    if (d->location.id == dev ? d->flags != cudaMemAccessFlagsProtReadWrite
                              : !g.peer_ok)
      return leave(cudaErrorInvalidDevice);
  }
  for (size_t i = 0; i < count; i++)
    if (desc[i].location.id != dev) {
      unsigned bit = 1u << desc[i].location.id;
      if (desc[i].flags == cudaMemAccessFlagsProtNone)
        g.dev[dev].pool_peers &= ~bit;
      else
        g.dev[dev].pool_peers |= bit;
    }
  return leave(cudaSuccess);
}

static cudaError_t fk_device_synchronize(void) {
  int dev;
  ENTER_ON_DEVICE_OR_RETURN("cudaDeviceSynchronize", 0, &dev);
  cudaError_t e = device_wait_call(dev);
  if (e != cudaSuccess)
    return leave(e);
  run_device(dev); /* discards instead, on a sticky device */
  return leave(sticky(dev));
}

static cudaError_t fk_device_get_stream_priority_range(int *least,
                                                       int *greatest) {
  int dev;
  ENTER_ON_DEVICE_OR_RETURN("cudaDeviceGetStreamPriorityRange", 0, &dev);
  if (least)
    *least = PRIORITY_LEAST;
  if (greatest)
    *greatest = PRIORITY_GREATEST;
  return leave(cudaSuccess);
}

/* Returns and clears the calling thread's last error; a sticky error of the
 * current device is returned and never cleared. */
static cudaError_t fk_get_last_error(void) {
  int dev;
  cudaError_t e = begin("cudaGetLastError", 0);
  if (e == cudaSuccess && current_device(&dev) == cudaSuccess)
    e = sticky(dev);
  if (e == cudaSuccess) {
    e = t_last_error;
    t_last_error = cudaSuccess;
  }
  /* not through leave(): that would make the error it reports "last" */
  unlock();
  return e;
}

/* ------------------------------------------------------------------------ */
/* Driver: primary context                                                    */
/* ------------------------------------------------------------------------ */

static CUresult CUDAAPI fk_primary_ctx_retain(CUcontext *pctx, CUdevice dev) {
  ENTER_DRIVER_OR_RETURN("cuDevicePrimaryCtxRetain");
  if (!pctx)
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  if (!valid_device(dev))
    return leave_driver(CUDA_ERROR_INVALID_DEVICE);
  g.dev[dev].ctx_refs++;
  *pctx = (CUcontext)(void *)&g_ctx_token[dev];
  return leave_driver(cudaSuccess);
}

static size_t count_allocations(int device);
static size_t count_streams(int device);
static size_t count_events(int device);
static size_t count_libraries(int device);
static size_t count_graphs(int device);
static size_t count_execs(int device);
static size_t count_captures(int device);
static struct flibrary *find_library(cudaLibrary_t h);
static CUresult CUDAAPI fk_drv_launch_kernel(CUfunction f, unsigned gx,
                                             unsigned gy, unsigned gz,
                                             unsigned bx, unsigned by,
                                             unsigned bz, unsigned shared,
                                             CUstream hstream, void **params,
                                             void **extra);
static CUresult CUDAAPI fk_drv_launch_kernel_ex(const CUlaunchConfig *config,
                                                CUfunction f, void **params,
                                                void **extra);

/* cuLibraryGetModule: a fake library is loaded whole at cudaLibraryLoadData
 * (its image was checked then), so its module always exists. */
static CUresult CUDAAPI fk_library_get_module(CUmodule *pmod, CUlibrary lib) {
  ENTER_DRIVER_OR_RETURN("cuLibraryGetModule");
  if (!pmod)
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  struct flibrary *l = find_library((cudaLibrary_t)lib);
  if (!l || l->unloaded)
    violation("cuLibraryGetModule of library %p, which is not loaded",
              (void *)lib);
  *pmod = (CUmodule)(void *)l;
  return leave_driver(cudaSuccess);
}

/* cuMemGetAddressRange: the live allocation around dptr. */
static CUresult CUDAAPI fk_mem_get_address_range(CUdeviceptr *base,
                                                 size_t *size,
                                                 CUdeviceptr dptr) {
  ENTER_DRIVER_OR_RETURN("cuMemGetAddressRange");
  struct falloc *a = find_live_containing((const void *)(uintptr_t)dptr);
  if (!a)
    return leave_driver(CUDA_ERROR_NOT_FOUND);
  if (base)
    *base = (CUdeviceptr)(uintptr_t)a->base;
  if (size)
    *size = a->size;
  return leave_driver(cudaSuccess);
}

/* cuStreamIsCapturing: the runtime's answer (fk_stream_is_capturing) as
 * the driver gives it. */
static CUresult CUDAAPI
fk_drv_stream_is_capturing(CUstream hstream, CUstreamCaptureStatus *status) {
  ENTER_DRIVER_OR_RETURN("cuStreamIsCapturing");
  struct fstream *s;
  cudaError_t e =
      resolve_stream("cuStreamIsCapturing", (cudaStream_t)hstream, &s);
  if (e != cudaSuccess)
    return leave_driver(e);
  if (!status)
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (s->builtin) /* answers, and invalidates nothing */
    return leave_driver(legacy_call(s, 0));
  if (s->capture)
    *status = s->capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                      : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return leave_driver(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_primary_ctx_release(CUdevice dev) {
  ENTER_DRIVER_OR_RETURN("cuDevicePrimaryCtxRelease");
  if (!valid_device(dev))
    return leave_driver(CUDA_ERROR_INVALID_DEVICE);
  struct fdevice *d = &g.dev[dev];
  if (d->ctx_refs <= 0)
    violation("cuDevicePrimaryCtxRelease of device %d, whose primary "
              "context is not retained",
              dev);
  if (--d->ctx_refs == 0) {
    /* Peer access goes with the context, both ways. */
    d->peers = d->pool_peers = 0;
    for (int i = 0; i < MAX_DEVICES; i++) {
      g.dev[i].peers &= ~(1u << dev);
      g.dev[i].pool_peers &= ~(1u << dev);
    }
    size_t na = count_allocations(dev), ns = count_streams(dev),
           ne = count_events(dev), nl = count_libraries(dev);
    size_t ngr = count_graphs(dev), nx = count_execs(dev),
           nc = count_captures(dev);
    if (na || ns || ne || nl)
      violation("primary context of device %d released with %zu "
                "allocation%s, %zu stream%s, %zu event%s, %zu librar%s alive",
                dev, na, plural(na), ns, plural(ns), ne, plural(ne), nl,
                nl == 1 ? "y" : "ies");
    if (ngr || nx || nc)
      violation("primary context of device %d released with %zu graph%s, "
                "%zu executable graph%s, %zu capture%s alive",
                dev, ngr, plural(ngr), nx, plural(nx), nc, plural(nc));
  }
  return leave_driver(cudaSuccess);
}

/* ------------------------------------------------------------------------ */
/* Driver: virtual memory management (shareable memory)                       */
/* ------------------------------------------------------------------------ */

/* Physical memory of cuMemCreate is a memfd named "fakecuda-vmm-<device>",
 * so that it can travel to another process (cuMemExportToShareableHandle
 * hands out a duplicate of its descriptor) and lives, as on a GPU, while
 * any process holds a handle to it or maps it.  A handle is a struct
 * fvmm, kept (a tombstone once released) so that a stale one is
 * recognised.  Address ranges are reserved PROT_NONE with a guard zone of
 * one granule after them, and never handed back, so that a freed mapping
 * is always recognised. */
#define VMM_GRANULARITY ((size_t)2 << 20)
#define VMM_NAME "fakecuda-vmm-"

static struct fvmm *find_vmm(CUmemGenericAllocationHandle h) {
  for (struct fvmm *v = g_vmms; v; v = v->next)
    if ((uintptr_t)v == (uintptr_t)h)
      return v;
  return NULL;
}

/* A live handle, or a VIOLATION naming `fn`. */
static struct fvmm *live_vmm(const char *fn, CUmemGenericAllocationHandle h) {
  struct fvmm *v = find_vmm(h);
  if (!v)
    violation("%s of handle 0x%llx, which no cuMemCreate or import gave", fn,
              (unsigned long long)h);
  if (v->released)
    violation("%s of handle 0x%llx, released already", fn,
              (unsigned long long)h);
  return v;
}

/* A fork holds g_lock from its start until it is done in both processes:
 * a child forked while another thread is in the fake finds the lock free
 * (its exit takes it, in fake_fini) and the fake's state whole. */
static void fork_prepare(void) { pthread_mutex_lock(&g_lock); }

static void fork_done(void) { pthread_mutex_unlock(&g_lock); }

__attribute__((constructor)) static void fork_init(void) {
  if (pthread_atfork(fork_prepare, fork_done, fork_done) != 0)
    abort();
}

/* The physical memory goes once its handle is released and unmapped. */
static void vmm_maybe_gone(struct fvmm *v) {
  if (v->released && v->maps == 0 && v->fd >= 0) {
    close(v->fd);
    v->fd = -1;
    g.dev[v->device].bytes -= v->size;
  }
}

static struct fvmm *vmm_new(int fd, size_t size, int device, int exportable) {
  struct fvmm *v = calloc(1, sizeof *v);
  if (!v)
    return NULL;
  v->fd = fd;
  v->size = size;
  v->device = device;
  v->exportable = exportable;
  v->next = g_vmms;
  g_vmms = v;
  g.dev[device].bytes += size;
  return v;
}

static int prop_device(const CUmemAllocationProp *prop) {
  if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !valid_device(prop->location.id))
    return -1;
  return prop->location.id;
}

static CUresult CUDAAPI fk_mem_get_allocation_granularity(
    size_t *granularity, const CUmemAllocationProp *prop,
    CUmemAllocationGranularity_flags option) {
  ENTER_DRIVER_OR_RETURN("cuMemGetAllocationGranularity");
  (void)option;
  if (!granularity || prop_device(prop) < 0)
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  *granularity = VMM_GRANULARITY;
  return leave_driver(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_mem_create(CUmemGenericAllocationHandle *handle,
                                      size_t size,
                                      const CUmemAllocationProp *prop,
                                      unsigned long long flags) {
  ENTER_DRIVER_OR_RETURN("cuMemCreate");
  int dev = prop_device(prop);
  if (!handle || dev < 0 || flags || size == 0 || size % VMM_GRANULARITY)
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  cudaError_t e = sticky(dev);
  if (e != cudaSuccess)
    return leave_driver(e);
  struct fdevice *d = &g.dev[dev];
  if (size > d->limit || d->bytes > d->limit - size)
    return leave_driver(CUDA_ERROR_OUT_OF_MEMORY);
  char name[32];
  snprintf(name, sizeof name, VMM_NAME "%d", dev);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0)
    return leave_driver(CUDA_ERROR_OUT_OF_MEMORY);
  if (ftruncate(fd, (off_t)size) != 0) {
    close(fd);
    return leave_driver(CUDA_ERROR_OUT_OF_MEMORY);
  }
  struct fvmm *v = vmm_new(fd, size, dev,
                           (prop->requestedHandleTypes &
                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0);
  if (!v) {
    close(fd);
    return leave_driver(CUDA_ERROR_OUT_OF_MEMORY);
  }
  /* As fresh device memory: not zeroed. */
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p != MAP_FAILED) {
    memset(p, FILL_BYTE, size);
    munmap(p, size);
  }
  *handle = (CUmemGenericAllocationHandle)(uintptr_t)v;
  return leave_driver(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_mem_release(CUmemGenericAllocationHandle handle) {
  ENTER_DRIVER_OR_RETURN("cuMemRelease");
  struct fvmm *v = live_vmm("cuMemRelease", handle);
  v->released = 1;
  vmm_maybe_gone(v);
  return leave_driver(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_mem_address_reserve(CUdeviceptr *ptr, size_t size,
                                               size_t alignment,
                                               CUdeviceptr addr,
                                               unsigned long long flags) {
  ENTER_DRIVER_OR_RETURN("cuMemAddressReserve");
  if (!ptr || size == 0 || size % VMM_GRANULARITY || addr || flags ||
      (alignment && alignment % VMM_GRANULARITY))
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  struct frange *r = calloc(1, sizeof *r);
  void *p = mmap(NULL, size + VMM_GRANULARITY, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (!r || p == MAP_FAILED) {
    free(r);
    return leave_driver(CUDA_ERROR_OUT_OF_MEMORY);
  }
  r->base = (uintptr_t)p;
  r->size = size;
  r->next = g_ranges;
  g_ranges = r;
  *ptr = (CUdeviceptr)r->base;
  return leave_driver(CUDA_SUCCESS);
}

static struct frange *find_range(uintptr_t p, size_t size) {
  for (struct frange *r = g_ranges; r; r = r->next)
    if (!r->freed && p >= r->base && size <= r->size &&
        p - r->base <= r->size - size)
      return r;
  return NULL;
}

/* The live mapping at [p, p + size) exactly, or NULL. */
static struct falloc *find_mapping(uintptr_t p, size_t size) {
  for (struct falloc *a = g.live; a; a = a->next)
    if (a->kind == KIND_VMM && (uintptr_t)a->base == p && a->size == size)
      return a;
  return NULL;
}

static CUresult CUDAAPI fk_mem_address_free(CUdeviceptr ptr, size_t size) {
  ENTER_DRIVER_OR_RETURN("cuMemAddressFree");
  struct frange *r = find_range((uintptr_t)ptr, size);
  if (!r || r->base != (uintptr_t)ptr || r->size != size)
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  for (struct falloc *a = g.live; a; a = a->next)
    if (a->kind == KIND_VMM && (uintptr_t)a->base >= r->base &&
        (uintptr_t)a->base < r->base + r->size)
      violation("cuMemAddressFree of 0x%llx, where %zu bytes at %p are "
                "still mapped",
                (unsigned long long)ptr, a->size, (void *)a->base);
  r->freed = 1; /* the range stays reserved: see above */
  return leave_driver(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_mem_map(CUdeviceptr ptr, size_t size, size_t offset,
                                   CUmemGenericAllocationHandle handle,
                                   unsigned long long flags) {
  ENTER_DRIVER_OR_RETURN("cuMemMap");
  struct fvmm *v = live_vmm("cuMemMap", handle);
  if (flags || size == 0 || size % VMM_GRANULARITY ||
      offset % VMM_GRANULARITY || offset > v->size || size > v->size - offset)
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  if (!find_range((uintptr_t)ptr, size))
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  for (struct falloc *a = g.live; a; a = a->next)
    if (a->kind == KIND_VMM && (uintptr_t)a->base < (uintptr_t)ptr + size &&
        (uintptr_t)ptr < (uintptr_t)a->base + a->size)
      return leave_driver(CUDA_ERROR_INVALID_VALUE); /* mapped already */
  struct falloc *a = calloc(1, sizeof *a);
  if (!a)
    return leave_driver(CUDA_ERROR_OUT_OF_MEMORY);
  /* No access until cuMemSetAccess. */
  void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE,
                 MAP_SHARED | MAP_FIXED, v->fd, (off_t)offset);
  if (p == MAP_FAILED) {
    free(a);
    return leave_driver(CUDA_ERROR_OUT_OF_MEMORY);
  }
  a->base = p;
  a->size = size;
  a->device = v->device;
  a->kind = KIND_VMM;
  a->state = ALLOC_LIVE;
  a->next = g.live;
  if (g.live)
    g.live->prev = a;
  g.live = a;
  a->vmm = v;
  v->maps++;
  return leave_driver(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_mem_set_access(CUdeviceptr ptr, size_t size,
                                          const CUmemAccessDesc *desc,
                                          size_t count) {
  ENTER_DRIVER_OR_RETURN("cuMemSetAccess");
  struct falloc *a = find_mapping((uintptr_t)ptr, size);
  if (!a || !desc || count == 0)
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  int prot = PROT_NONE;
  for (size_t i = 0; i < count; i++) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !valid_device(desc[i].location.id))
      return leave_driver(CUDA_ERROR_INVALID_VALUE);
    if (desc[i].location.id == a->device &&
        desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      prot = PROT_READ | PROT_WRITE;
    else if (desc[i].location.id == a->device &&
             desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ)
      prot = PROT_READ;
  }
  if (mprotect(a->base, size, prot) != 0)
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  return leave_driver(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_mem_unmap(CUdeviceptr ptr, size_t size) {
  ENTER_DRIVER_OR_RETURN("cuMemUnmap");
  struct falloc *a = find_mapping((uintptr_t)ptr, size);
  if (!a)
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  struct fvmm *v = a->vmm;
  /* The range stays reserved, without access: a use is a VIOLATION (the
   * quarantine's record) or a fault, never another allocation's memory. */
  (void)mmap(a->base, size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  free_now(a);
  v->maps--;
  vmm_maybe_gone(v);
  return leave_driver(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_mem_export_to_shareable_handle(
    void *shareable, CUmemGenericAllocationHandle handle,
    CUmemAllocationHandleType type, unsigned long long flags) {
  ENTER_DRIVER_OR_RETURN("cuMemExportToShareableHandle");
  struct fvmm *v = live_vmm("cuMemExportToShareableHandle", handle);
  if (!shareable || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      !v->exportable)
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0)
    return leave_driver(CUDA_ERROR_OUT_OF_MEMORY);
  *(int *)shareable = fd;
  return leave_driver(CUDA_SUCCESS);
}

/* The device of a fake shareable allocation's descriptor, from its memfd's
 * name; -1 if fd is no such descriptor. */
static int vmm_fd_device(int fd) {
  char link[64], target[128];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0)
    return -1;
  target[n] = '\0';
  static const char prefix[] = "/memfd:" VMM_NAME;
  if (strncmp(target, prefix, sizeof prefix - 1) != 0)
    return -1;
  const char *d = target + sizeof prefix - 1;
  if (!isdigit((unsigned char)d[0]))
    return -1;
  return atoi(d);
}

static CUresult CUDAAPI fk_mem_import_from_shareable_handle(
    CUmemGenericAllocationHandle *handle, void *os_handle,
    CUmemAllocationHandleType type) {
  ENTER_DRIVER_OR_RETURN("cuMemImportFromShareableHandle");
  int fd = (int)(intptr_t)os_handle;
  if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  int dev = vmm_fd_device(fd);
  struct stat st;
  if (dev < 0 || fstat(fd, &st) != 0 || st.st_size <= 0)
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  if (!valid_device(dev))
    return leave_driver(CUDA_ERROR_INVALID_DEVICE);
  cudaError_t e = sticky(dev);
  if (e != cudaSuccess)
    return leave_driver(e);
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0)
    return leave_driver(CUDA_ERROR_OUT_OF_MEMORY);
  struct fvmm *v = vmm_new(own, (size_t)st.st_size, dev, 1);
  if (!v) {
    close(own);
    return leave_driver(CUDA_ERROR_OUT_OF_MEMORY);
  }
  *handle = (CUmemGenericAllocationHandle)(uintptr_t)v;
  return leave_driver(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_mem_get_allocation_properties_from_handle(
    CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle) {
  ENTER_DRIVER_OR_RETURN("cuMemGetAllocationPropertiesFromHandle");
  struct fvmm *v = live_vmm("cuMemGetAllocationPropertiesFromHandle", handle);
  if (!prop)
    return leave_driver(CUDA_ERROR_INVALID_VALUE);
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = v->device;
  if (v->exportable)
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return leave_driver(CUDA_SUCCESS);
}

/* The virtual memory management calls by name into *fn: 1 if found. */
typedef void (*any_fn)(void);
static int vmm_entry(const char *symbol, void **fn) {
  static const struct {
    const char *name;
    any_fn fn;
  } table[] = {
      {"cuMemGetAllocationGranularity",
       (any_fn)fk_mem_get_allocation_granularity},
      {"cuMemCreate", (any_fn)fk_mem_create},
      {"cuMemRelease", (any_fn)fk_mem_release},
      {"cuMemAddressReserve", (any_fn)fk_mem_address_reserve},
      {"cuMemAddressFree", (any_fn)fk_mem_address_free},
      {"cuMemMap", (any_fn)fk_mem_map},
      {"cuMemUnmap", (any_fn)fk_mem_unmap},
      {"cuMemSetAccess", (any_fn)fk_mem_set_access},
      {"cuMemExportToShareableHandle",
       (any_fn)fk_mem_export_to_shareable_handle},
      {"cuMemImportFromShareableHandle",
       (any_fn)fk_mem_import_from_shareable_handle},
      {"cuMemGetAllocationPropertiesFromHandle",
       (any_fn)fk_mem_get_allocation_properties_from_handle},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(symbol, table[i].name) == 0 && g.vmm) {
      memcpy(fn, &table[i].fn, sizeof *fn);
      return 1;
    }
  return 0;
}

static cudaError_t
fk_get_driver_entry_point(const char *symbol, void **func,
                          unsigned int cuda_version, unsigned long long flags,
                          enum cudaDriverEntryPointQueryResult *status) {
  (void)flags; /* no per-thread variants among the fake's functions */
  ENTER_OR_RETURN("cudaGetDriverEntryPointByVersion", 0);
  if (!symbol || !func)
    return leave(cudaErrorInvalidValue);
  /* As documented for the real one: asking for a version newer than the
   * driver is an error. */
  if (cuda_version > FAKE_DRIVER_VERSION)
    return leave(cudaErrorInvalidValue);

  CUresult (*retain)(CUcontext *, CUdevice) = fk_primary_ctx_retain;
  CUresult (*release)(CUdevice) = fk_primary_ctx_release;
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult result =
      cudaDriverEntryPointSymbolNotFound;
  _Static_assert(sizeof fn == sizeof retain, "function pointer size");
  int is_retain = strcmp(symbol, "cuDevicePrimaryCtxRetain") == 0;
  int is_release = strcmp(symbol, "cuDevicePrimaryCtxRelease") == 0;
  if (strcmp(symbol, "cuMemGetAddressRange") == 0) {
    CUresult (*range)(CUdeviceptr *, size_t *, CUdeviceptr) =
        fk_mem_get_address_range;
    result = cudaDriverEntryPointSuccess;
    memcpy(&fn, &range, sizeof fn);
  } else if (strcmp(symbol, "cuStreamIsCapturing") == 0) {
    CUresult (*capturing)(CUstream, CUstreamCaptureStatus *) =
        fk_drv_stream_is_capturing;
    result = cudaDriverEntryPointSuccess;
    memcpy(&fn, &capturing, sizeof fn);
  } else if (strcmp(symbol, "cuLaunchKernel") == 0 && g.driver_launch) {
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                       unsigned, unsigned, unsigned, CUstream, void **,
                       void **) = fk_drv_launch_kernel;
    result = cudaDriverEntryPointSuccess;
    memcpy(&fn, &launch, sizeof fn);
  } else if (strcmp(symbol, "cuLaunchKernelEx") == 0 && g.driver_launch) {
    CUresult (*launch_ex)(const CUlaunchConfig *, CUfunction, void **,
                          void **) = fk_drv_launch_kernel_ex;
    result = cudaDriverEntryPointSuccess;
    memcpy(&fn, &launch_ex, sizeof fn);
  } else if (vmm_entry(symbol, &fn)) {
    result = cudaDriverEntryPointSuccess;
  } else if (strcmp(symbol, "cuLibraryGetModule") == 0) {
    CUresult (*get_module)(CUmodule *, CUlibrary) = fk_library_get_module;
    result = cuda_version < 12000 ? cudaDriverEntryPointVersionNotSufficent
                                  : cudaDriverEntryPointSuccess;
    if (result == cudaDriverEntryPointSuccess)
      memcpy(&fn, &get_module, sizeof fn);
  } else if (is_retain || is_release) {
    /* Both exist since CUDA 7.0. */
    if (cuda_version < 7000) {
      result = cudaDriverEntryPointVersionNotSufficent;
    } else {
      result = cudaDriverEntryPointSuccess;
      /* memcpy: ISO C has no cast between function and object pointers */
      if (is_retain)
        memcpy(&fn, &retain, sizeof fn);
      else
        memcpy(&fn, &release, sizeof fn);
    }
  }
  /* Like the real one: a symbol not found is reported through the status
   * and a NULL function, with cudaSuccess. */
  *func = fn;
  if (status)
    *status = result;
  return leave(cudaSuccess);
}

/* ------------------------------------------------------------------------ */
/* Streams                                                                    */
/* ------------------------------------------------------------------------ */

static cudaError_t fk_stream_create(cudaStream_t *stream, unsigned int flags,
                                    int priority) {
  int dev;
  ENTER_ON_DEVICE_OR_RETURN("cudaStreamCreateWithPriority", STICKY, &dev);
  if (!stream || (flags & ~(unsigned int)cudaStreamNonBlocking))
    return leave(cudaErrorInvalidValue);
  struct fstream *s = calloc(1, sizeof *s);
  if (!s)
    return leave(cudaErrorMemoryAllocation);
  s->device = dev;
  s->flags = flags;
  /* The real runtime clamps priorities to the device's range silently. */
  s->priority = priority > PRIORITY_LEAST      ? PRIORITY_LEAST
                : priority < PRIORITY_GREATEST ? PRIORITY_GREATEST
                                               : priority;
  g.streams = grow(g.streams, g.nstreams, &g.cap_streams, sizeof *g.streams);
  g.streams[g.nstreams++] = s;
  *stream = (cudaStream_t)s;
  return leave(cudaSuccess);
}

/* Destroying a stream with queued work is legal: the work still completes.
 * Paused, the stream becomes a zombie whose queue runs at the next device
 * synchronize or when something that waits on it runs; it counts as alive
 * until then.  On a sticky device the queue is dead and is discarded now. */
static cudaError_t fk_stream_destroy(cudaStream_t stream) {
  ENTER_OR_RETURN("cudaStreamDestroy", 0);
  if (is_default_stream(stream))
    return leave(cudaErrorInvalidResourceHandle);
  struct fstream *s = find_stream(stream);
  if (!s)
    violation("cudaStreamDestroy of %p, which is not a stream", (void *)stream);
  if (s->destroyed)
    violation("cudaStreamDestroy of stream %p, which was already destroyed",
              (void *)stream);
  if (s->capture)
    violation("cudaStreamDestroy of stream %p, which takes part in a stream "
              "capture (cudaStreamEndCapture first)",
              (void *)stream);
  s->destroyed = 1;
  if (!g.paused || sticky(s->device))
    run_stream(s);
  return leave(cudaSuccess);
}

static cudaError_t fk_stream_synchronize(cudaStream_t stream) {
  struct fstream *s;
  ENTER_ON_STREAM_OR_RETURN("cudaStreamSynchronize", stream, 0, &s);
  cudaError_t e = stream_wait_call(s);
  if (e != cudaSuccess)
    return leave(e);
  run_stream(s); /* discards instead, on a sticky device */
  return leave(sticky(s->device));
}

/* cudaPointerGetAttributes: what the fake allocated, by kind; any other
 * address is host memory CUDA does not know (cudaMemoryTypeUnregistered,
 * as since CUDA 11). */
static cudaError_t fk_pointer_get_attributes(struct cudaPointerAttributes *attr,
                                             const void *ptr) {
  ENTER_OR_RETURN("cudaPointerGetAttributes", 0);
  if (!attr)
    return leave(cudaErrorInvalidValue);
  memset(attr, 0, sizeof *attr);
  struct falloc *a = find_live_containing(ptr);
  if (!a) {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    attr->hostPointer = (void *)ptr;
    return leave(cudaSuccess);
  }
  attr->device = a->device;
  attr->devicePointer = (void *)ptr;
  switch (a->kind) {
  case KIND_DEVICE:
  case KIND_VMM: attr->type = cudaMemoryTypeDevice; break;
  case KIND_PINNED:
    attr->type = cudaMemoryTypeHost;
    attr->hostPointer = (void *)ptr;
    break;
  default:
    attr->type = cudaMemoryTypeManaged;
    attr->hostPointer = (void *)ptr;
    break;
  }
  return leave(cudaSuccess);
}

static cudaError_t fk_stream_get_device(cudaStream_t stream, int *device) {
  struct fstream *s;
  ENTER_ON_STREAM_OR_RETURN("cudaStreamGetDevice", stream, 0, &s);
  if (!device)
    return leave(cudaErrorInvalidValue);
  *device = s->device;
  return leave(cudaSuccess);
}

/* Paused, a query only looks; unpaused, the infinitely fast GPU has
 * finished whatever was left over from a paused period. */
static cudaError_t fk_stream_query(cudaStream_t stream) {
  struct fstream *s;
  ENTER_ON_STREAM_OR_RETURN("cudaStreamQuery", stream, STICKY, &s);
  cudaError_t e = stream_wait_call(s);
  if (e != cudaSuccess)
    return leave(e);
  if (g.paused)
    return leave(stream_pending(s) ? cudaErrorNotReady : cudaSuccess);
  run_stream(s);
  return leave(cudaSuccess);
}

static cudaError_t fk_stream_wait_event(cudaStream_t stream, cudaEvent_t event,
                                        unsigned int flags) {
  struct fstream *s;
  ENTER_ON_STREAM_OR_RETURN("cudaStreamWaitEvent", stream, 0, &s);
  struct fevent *ev = resolve_event("cudaStreamWaitEvent", event);
  if (flags & ~(unsigned int)cudaEventWaitExternal)
    return leave(cudaErrorInvalidValue);
  cudaError_t e;
  if ((e = sticky(s->device)) != cudaSuccess ||
      (e = sticky(ev->device)) != cudaSuccess)
    return leave(e);
  if (s->capture && s->capture->invalidated)
    return leave(cudaErrorStreamCaptureInvalidated);
  struct fcapture *c = ev->capture;
  if (c && c->ended) /* a record of a capture that is over */
    return leave(cudaErrorInvalidValue);
  if (c) {
    /* An event recorded in a capture: an edge of that capture's graph.  A
     * stream outside it joins it; one of another capture would merge the
     * two. */
    if (s->capture && s->capture != c) {
      s->capture->invalidated = c->invalidated = 1;
      return leave(cudaErrorStreamCaptureMerge);
    }
    if (!s->capture) {
      s->capture = c;
      s->cap_last = s->cap_joined = 0;
    }
    if (ev->cap_stream != s && ev->cap_stream->cap_joined < ev->cap_seq)
      ev->cap_stream->cap_joined = ev->cap_seq;
    return leave(cudaSuccess);
  }
  if (flags & cudaEventWaitExternal) {
    if (!s->capture) /* only a capture makes event wait nodes */
      return leave(cudaErrorIllegalState);
    struct fop *o = new_op(OP_WAIT_EXTERNAL);
    o->event = ev;
    return leave(enqueue(s, o));
  }
  if (!ev->recorded) /* waiting for a never-recorded event is a no-op */
    return leave(cudaSuccess);
  if (s->capture) { /* a dependency on work outside the capture */
    s->capture->invalidated = 1;
    return leave(cudaErrorStreamCaptureIsolation);
  }
  struct fop *o = new_op(OP_WAIT);
  o->wait_on = ev->stream; /* the record as it is now, not as it will be */
  o->wait_pos = ev->pos;
  return leave(enqueue(s, o));
}

/* ------------------------------------------------------------------------ */
/* Events                                                                     */
/* ------------------------------------------------------------------------ */

static cudaError_t fk_event_create(cudaEvent_t *event, unsigned int flags) {
  int dev;
  ENTER_ON_DEVICE_OR_RETURN("cudaEventCreateWithFlags", STICKY, &dev);
  const unsigned int known =
      cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (!event || (flags & ~known) ||
      ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)))
    return leave(cudaErrorInvalidValue);
  struct fevent *ev = calloc(1, sizeof *ev);
  if (!ev)
    return leave(cudaErrorMemoryAllocation);
  ev->device = dev;
  ev->flags = flags;
  g.events = grow(g.events, g.nevents, &g.cap_events, sizeof *g.events);
  g.events[g.nevents++] = ev;
  *event = (cudaEvent_t)ev;
  return leave(cudaSuccess);
}

static cudaError_t fk_event_destroy(cudaEvent_t event) {
  ENTER_OR_RETURN("cudaEventDestroy", 0);
  struct fevent *ev = find_event(event);
  if (!ev)
    violation("cudaEventDestroy of %p, which is not an event", (void *)event);
  if (ev->destroyed)
    violation("cudaEventDestroy of event %p, which was already destroyed",
              (void *)event);
  /* Waits already queued captured the record's position, not the event, so
   * they are unaffected, as on a GPU. */
  ev->destroyed = 1;
  return leave(cudaSuccess);
}

static cudaError_t fk_event_record(cudaEvent_t event, cudaStream_t stream) {
  struct fstream *s;
  ENTER_ON_STREAM_OR_RETURN("cudaEventRecord", stream, 0, &s);
  struct fevent *ev = resolve_event("cudaEventRecord", event);
  if (ev->device != s->device)
    return leave(cudaErrorInvalidResourceHandle);
  cudaError_t e = sticky(s->device);
  if (e != cudaSuccess)
    return leave(e);
  if (s->capture) { /* a record in the graph, not in the stream */
    if (s->capture->invalidated)
      return leave(cudaErrorStreamCaptureInvalidated);
    ev->capture = s->capture;
    ev->cap_seq = s->capture->seq;
    ev->cap_stream = s;
    return leave(cudaSuccess);
  }
  ev->capture = NULL;
  implicit_deps(s); /* on stream 0 the record waits for blocking streams */
  ev->recorded = 1;
  ev->stream = s;
  ev->pos = s->enqueued;
  ev->stamp = ++g.dev[s->device].clock;
  if (!g.paused)
    run_stream(s);
  return leave(cudaSuccess);
}

static cudaError_t fk_event_synchronize(cudaEvent_t event) {
  ENTER_OR_RETURN("cudaEventSynchronize", 0);
  struct fevent *ev = resolve_event("cudaEventSynchronize", event);
  cudaError_t e = event_wait_call(ev);
  if (e != cudaSuccess)
    return leave(e);
  if (ev->recorded)
    run_stream_to(ev->stream, ev->pos); /* discards, if sticky */
  return leave(sticky(ev->device));
}

static cudaError_t fk_event_query(cudaEvent_t event) {
  ENTER_OR_RETURN("cudaEventQuery", 0);
  struct fevent *ev = resolve_event("cudaEventQuery", event);
  cudaError_t e = event_wait_call(ev);
  if (e == cudaSuccess)
    e = sticky(ev->device);
  if (e != cudaSuccess)
    return leave(e);
  if (g.paused)
    return leave(event_complete(ev) ? cudaSuccess : cudaErrorNotReady);
  if (ev->recorded)
    run_stream_to(ev->stream, ev->pos);
  return leave(cudaSuccess);
}

/* The "time" between two records is 1 microsecond per operation queued or
 * event recorded on the device in between: deterministic, and positive when
 * end was recorded after start. */
static cudaError_t fk_event_elapsed_time(float *ms, cudaEvent_t start,
                                         cudaEvent_t end) {
  ENTER_OR_RETURN("cudaEventElapsedTime", 0);
  struct fevent *a = resolve_event("cudaEventElapsedTime", start);
  struct fevent *b = resolve_event("cudaEventElapsedTime", end);
  if (!ms)
    return leave(cudaErrorInvalidValue);
  cudaError_t w = event_wait_call(a);
  if (w == cudaSuccess)
    w = event_wait_call(b);
  if (w != cudaSuccess)
    return leave(w);
  if (a->device != b->device)
    return leave(cudaErrorInvalidResourceHandle);
  cudaError_t e = sticky(a->device);
  if (e != cudaSuccess)
    return leave(e);
  if ((a->flags | b->flags) & cudaEventDisableTiming)
    return leave(cudaErrorInvalidResourceHandle);
  if (!a->recorded || !b->recorded)
    return leave(cudaErrorInvalidResourceHandle);
  if (!g.paused) {
    run_stream_to(a->stream, a->pos);
    run_stream_to(b->stream, b->pos);
  }
  if (!event_complete(a) || !event_complete(b))
    return leave(cudaErrorNotReady);
  *ms = 0.001f * (float)((int64_t)b->stamp - (int64_t)a->stamp);
  return leave(cudaSuccess);
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                     */
/* ------------------------------------------------------------------------ */

/* Stream-ordered allocation: the memory exists from the call on, as with a
 * pool that has it ready; ordering its first use is the library's job. */
static cudaError_t fk_malloc_async(void **ptr, size_t size,
                                   cudaStream_t stream) {
  struct fstream *s;
  ENTER_ON_STREAM_OR_RETURN("cudaMallocAsync", stream, STICKY, &s);
  cudaError_t e = capture_memory_call(s);
  if (e != cudaSuccess)
    return leave(e);
  if (s->capture)
    misuse("cudaMallocAsync on a capturing stream: graph allocation nodes "
           "are not modelled");
  if (!ptr)
    return leave(cudaErrorInvalidValue);
  return leave(allocate(ptr, size, s->device, KIND_DEVICE));
}

/* The live allocation that starts at ptr, or a VIOLATION. */
static struct falloc *live_allocation(const char *fn, const void *ptr) {
  struct falloc *a = find_live_base(ptr);
  if (!a || a->state != ALLOC_LIVE)
    violation("%s of pointer %p that is not a live allocation", fn, ptr);
  return a;
}

/* The memory stays valid (free-pending) until the free runs in the stream;
 * only then do accesses count as use after free.  On a sticky device the
 * queue is dead, so the memory is released at once, as the driver releases
 * everything of a broken context. */
static cudaError_t fk_free_async(void *ptr, cudaStream_t stream) {
  struct fstream *s;
  ENTER_ON_STREAM_OR_RETURN("cudaFreeAsync", stream, 0, &s);
  cudaError_t e = capture_memory_call(s);
  if (e != cudaSuccess)
    return leave(e);
  if (!ptr)
    return leave(cudaSuccess);
  struct falloc *a = live_allocation("cudaFreeAsync", ptr);
  /* A free node may only free the graph's own allocations, which the fake
   * does not model: memory from outside is refused, and the capture goes
   * on (as measured). */
  if (s->capture)
    return leave(cudaErrorInvalidValue);
  if (a->kind != KIND_DEVICE)
    violation("cudaFreeAsync of pointer %p, which is %s memory, not device "
              "memory",
              ptr, kind_name(a->kind));
  a->state = ALLOC_FREE_PENDING;
  if (sticky(s->device)) {
    free_now(a);
    log_add("exec:cudaFreeAsync");
    return leave(cudaSuccess);
  }
  struct fop *o = new_op(OP_FREE);
  o->alloc = a;
  return leave(enqueue(s, o));
}

static cudaError_t fk_malloc_host(void **ptr, size_t size) {
  int dev;
  ENTER_ON_DEVICE_OR_RETURN("cudaMallocHost", STICKY, &dev);
  UNSAFE_OR_RETURN();
  if (!ptr)
    return leave(cudaErrorInvalidValue);
  /* Pinned memory belongs to the context it was allocated in: it counts
   * against the current device, and its limit. */
  return leave(allocate(ptr, size, dev, KIND_PINNED));
}

/* cudaFreeHost and cudaFree synchronize implicitly: all queued work of all
 * devices runs first (or is discarded, on a sticky device). */
static cudaError_t fk_free_host(void *ptr) {
  ENTER_OR_RETURN("cudaFreeHost", 0);
  UNSAFE_OR_RETURN();
  if (!ptr)
    return leave(cudaSuccess);
  run_all_devices();
  struct falloc *a = live_allocation("cudaFreeHost", ptr);
  if (a->kind != KIND_PINNED)
    violation("cudaFreeHost of pointer %p, which is %s memory, not pinned "
              "host memory",
              ptr, kind_name(a->kind));
  free_now(a);
  return leave(cudaSuccess);
}

static cudaError_t fk_malloc_managed(void **ptr, size_t size,
                                     unsigned int flags) {
  int dev;
  ENTER_ON_DEVICE_OR_RETURN("cudaMallocManaged", STICKY, &dev);
  UNSAFE_OR_RETURN();
  if (!ptr || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
    return leave(cudaErrorInvalidValue);
  if (!g.dev[dev].managed)
    return leave(cudaErrorNotSupported);
  return leave(allocate(ptr, size, dev, KIND_MANAGED));
}

/* cudaFree takes managed memory and, as the real one does, stream-ordered
 * device memory too; pinned memory needs cudaFreeHost. */
static cudaError_t fk_free(void *ptr) {
  ENTER_OR_RETURN("cudaFree", 0);
  UNSAFE_OR_RETURN();
  if (!ptr)
    return leave(cudaSuccess);
  run_all_devices();
  struct falloc *a = live_allocation("cudaFree", ptr);
  if (a->kind == KIND_PINNED)
    violation("cudaFree of pointer %p, which is pinned host memory "
              "(cudaFreeHost frees that)",
              ptr);
  free_now(a);
  return leave(cudaSuccess);
}

/* The check of the queued memory operations' pointers at call time. */
static int valid_range(const void *p, size_t size) {
  return p && (uintptr_t)p <= UINTPTR_MAX - size;
}

static struct fop *new_copy_op(enum op_kind kind, void *dst, const void *src,
                               size_t size) {
  struct fop *o = new_op(kind);
  o->dst = dst;
  o->src = src;
  o->size = size;
  return o;
}

/* Whether ptr is host memory that the fake did not allocate: pageable, as
 * far as CUDA knows.  Freed memory in quarantine is not: copies touching it
 * are reported when they run. */
static int is_pageable(const void *ptr) {
  uintptr_t p = (uintptr_t)ptr;
  for (struct falloc *a = g.live; a; a = a->next)
    if (p >= (uintptr_t)a->base &&
        p < (uintptr_t)a->base + a->size + GUARD_BYTES)
      return 0;
  for (struct falloc *a = g.quar_head; a; a = a->next)
    if (overlaps(a, p, 1))
      return 0;
  return 1;
}

/* Every kind is treated as cudaMemcpyDefault: with unified addressing the
 * pointers say where the memory is.  Pageable host memory behaves as in the
 * real runtime: a copy from it takes the bytes at the call (they go to a
 * staging buffer), and a copy into it returns only once it is complete --
 * with the work queued before it on the stream. */
static cudaError_t fk_memcpy_async(void *dst, const void *src, size_t size,
                                   enum cudaMemcpyKind kind,
                                   cudaStream_t stream) {
  struct fstream *s;
  ENTER_ON_STREAM_OR_RETURN("cudaMemcpyAsync", stream, STICKY, &s);
  if ((int)kind < (int)cudaMemcpyHostToHost ||
      (int)kind > (int)cudaMemcpyDefault)
    return leave(cudaErrorInvalidMemcpyDirection);
  if (size == 0)
    return leave(cudaSuccess);
  if (!valid_range(dst, size) || !valid_range(src, size))
    return leave(cudaErrorInvalidValue);
  struct fop *o = new_copy_op(OP_COPY, dst, src, size);
  /* A captured copy from pageable memory reads it when the graph runs (as
   * measured), and one into it does not wait: nothing runs. */
  if (s->capture)
    return leave(enqueue(s, o));
  if (is_pageable(src)) {
    o->staging = malloc(size);
    if (!o->staging) {
      free(o);
      return leave(cudaErrorMemoryAllocation);
    }
    memcpy(o->staging, src, size);
    o->src = o->staging;
  }
  enqueue(s, o);
  if (is_pageable(dst))
    run_stream(s);
  return leave(cudaSuccess);
}

static cudaError_t fk_memcpy_peer_async(void *dst, int dst_device,
                                        const void *src, int src_device,
                                        size_t size, cudaStream_t stream) {
  struct fstream *s;
  ENTER_ON_STREAM_OR_RETURN("cudaMemcpyPeerAsync", stream, 0, &s);
  if (!valid_device(dst_device) || !valid_device(src_device))
    return leave(cudaErrorInvalidDevice);
  cudaError_t e;
  if ((e = sticky(s->device)) != cudaSuccess ||
      (e = sticky(dst_device)) != cudaSuccess ||
      (e = sticky(src_device)) != cudaSuccess)
    return leave(e);
  /* Measured on H100 and H200 (CUDA 13.0): refused in every capture
   * mode, which it invalidates; cudaMemcpyAsync (cudaMemcpyDefault) of the
   * same memory is captured. */
  if (s->capture) {
    s->capture->invalidated = 1;
    return leave(cudaErrorStreamCaptureUnsupported);
  }
  if (size == 0)
    return leave(cudaSuccess);
  if (!valid_range(dst, size) || !valid_range(src, size))
    return leave(cudaErrorInvalidValue);
  struct fop *o = new_copy_op(OP_PEER_COPY, dst, src, size);
  return leave(enqueue(s, o));
}

static cudaError_t fk_memset_async(void *ptr, int value, size_t size,
                                   cudaStream_t stream) {
  struct fstream *s;
  ENTER_ON_STREAM_OR_RETURN("cudaMemsetAsync", stream, STICKY, &s);
  if (size == 0)
    return leave(cudaSuccess);
  if (!valid_range(ptr, size))
    return leave(cudaErrorInvalidValue);
  struct fop *o = new_op(OP_SET);
  o->dst = ptr;
  o->value = (unsigned char)value;
  o->size = size;
  return leave(enqueue(s, o));
}

/* ------------------------------------------------------------------------ */
/* Libraries and kernels                                                      */
/* ------------------------------------------------------------------------ */

#define FAKE_IMAGE_MAGIC "FAKECUBIN"
#define DEFAULT_MAX_THREADS 1024
#define STATIC_SHARED_MAX (48 * 1024) /* static __shared__ per block */
#define DEFAULT_SHARED (48 * 1024)    /* per block without opt-in */
#define OPTIN_SHARED (227 * 1024)     /* per block with opt-in */
#define SM_SHARED (228 * 1024)        /* per multiprocessor */
#define SM_THREADS 2048
#define SM_BLOCKS 32

/* The kernels built into cusafe (from kernels/), with their layouts, and
 * the one of examples/extension, whose library embeds its own fat binary:
 * a real image's contents are not read, so its kernels are emulated by
 * name like the built-in ones.  The indices say which parameter is which
 * for the semantics of exec_builtin: the output is parameter 0, n the
 * last. */
static const struct builtin_def {
  const char *name;
  enum builtin_op op;
  size_t elem;
  const char *params;
  size_t scalar_arg; /* the scalar (fill, scale, axpy) */
  size_t src_arg;    /* axpy: x */
} builtin_defs[] = {
    {"cusafe_fill_f32", BI_FILL, 4, "p 4 8", 1, 0},
    {"cusafe_fill_f64", BI_FILL, 8, "p 8 8", 1, 0},
    {"cusafe_scale_f32", BI_SCALE, 4, "p 4 8", 1, 0},
    {"cusafe_scale_f64", BI_SCALE, 8, "p 8 8", 1, 0},
    {"cusafe_axpy_f32", BI_AXPY, 4, "p 4 p 8", 1, 2},
    {"cusafe_axpy_f64", BI_AXPY, 8, "p 8 p 8", 1, 2},
    {"cusafe_vecadd_f32", BI_VECADD, 4, "p p p 8", 1, 0},
    {"cusafe_vecadd_f64", BI_VECADD, 8, "p p p 8", 1, 0},
    /* examples/extension/saxpy.cu: (y, x, a, n), y[i] = a * x[i] + y[i] */
    {"myext_saxpy_f32", BI_AXPY, 4, "p p 4 8", 2, 1},
};
#define NBUILTINS (sizeof builtin_defs / sizeof builtin_defs[0])

static char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = xrealloc(NULL, n);
  memcpy(d, s, n);
  return d;
}

static char *xstrndup(const char *s, size_t n) {
  char *d = xrealloc(NULL, n + 1);
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

/* Whether `s` starts with `prefix`, reading no byte of s past the first
 * mismatch (an image of unknown size may be shorter than the prefix). */
static int starts_with(const unsigned char *s, const char *prefix) {
  for (size_t i = 0; prefix[i]; i++)
    if (s[i] != (unsigned char)prefix[i])
      return 0;
  return 1;
}

/* The alignment of a parameter: the largest power of two that divides its
 * size, at most 8 (so 4 -> 4, 8 -> 8, 16 -> 8, 12 -> 4, 3 -> 1). */
static size_t param_align(size_t size) {
  size_t a = 1;
  while (a < 8 && size % (2 * a) == 0)
    a *= 2;
  return a;
}

/* Adds a parameter to k; returns 0 if the parameter space overflows. */
static int kernel_add_param(struct fkernel *k, size_t size, int pointer) {
  size_t align = param_align(size);
  size_t off = (k->argbytes + align - 1) / align * align;
  if (size > g.param_space || off > g.param_space - size)
    return 0;
  k->psize = xrealloc(k->psize, (k->nparams + 1) * sizeof *k->psize);
  k->poffset = xrealloc(k->poffset, (k->nparams + 1) * sizeof *k->poffset);
  k->pointer = xrealloc(k->pointer, (k->nparams + 1) * sizeof *k->pointer);
  k->psize[k->nparams] = size;
  k->poffset[k->nparams] = off;
  k->pointer[k->nparams] = (unsigned char)(pointer != 0);
  k->nparams++;
  k->argbytes = off + size;
  return 1;
}

/* Parses a decimal number in [min, max] from the whole of [s, e). */
static int parse_number(const char *s, const char *e, unsigned long min,
                        unsigned long max, unsigned long *out) {
  unsigned long v = 0;
  if (s == e)
    return 0;
  for (const char *p = s; p < e; p++) {
    if (*p < '0' || *p > '9')
      return 0;
    if (v > (max - (unsigned long)(*p - '0')) / 10)
      return 0;
    v = v * 10 + (unsigned long)(*p - '0');
  }
  if (v < min)
    return 0;
  *out = v;
  return 1;
}

static int is_ident_start(int c) { return isalpha(c) || c == '_'; }
static int is_ident_char(int c) { return isalnum(c) || c == '_'; }

/* One line "kernel NAME [maxthreads=N] [shared=BYTES] PARAM..." (already
 * without its line end) into a new kernel of lib.  Returns 0 if it is
 * malformed. */
static int parse_kernel_line(struct flibrary *lib, const char *line,
                             const char *end) {
  const char *tok[512];
  const char *tok_end[512];
  size_t ntok = 0;
  const char *p = line;
  while (p < end) {
    while (p < end && (*p == ' ' || *p == '\t'))
      p++;
    if (p == end)
      break;
    if (ntok == sizeof tok / sizeof tok[0])
      return 0;
    tok[ntok] = p;
    while (p < end && *p != ' ' && *p != '\t')
      p++;
    tok_end[ntok++] = p;
  }
  if (ntok < 2 || tok_end[0] - tok[0] != 6 || strncmp(tok[0], "kernel", 6))
    return 0;
  if (!is_ident_start((unsigned char)tok[1][0]))
    return 0;
  for (const char *q = tok[1]; q < tok_end[1]; q++)
    if (!is_ident_char((unsigned char)*q))
      return 0;
  size_t namelen = (size_t)(tok_end[1] - tok[1]);
  for (size_t i = 0; i < lib->nkernels; i++)
    if (strlen(lib->kernels[i].name) == namelen &&
        strncmp(lib->kernels[i].name, tok[1], namelen) == 0)
      return 0; /* one name, one kernel */

  lib->kernels =
      xrealloc(lib->kernels, (lib->nkernels + 1) * sizeof *lib->kernels);
  struct fkernel *k = &lib->kernels[lib->nkernels++];
  memset(k, 0, sizeof *k);
  k->lib = lib;
  k->name = xstrndup(tok[1], namelen);
  k->maxthreads = DEFAULT_MAX_THREADS;
  for (size_t i = 2; i < ntok; i++) {
    const char *s = tok[i], *e = tok_end[i];
    unsigned long v;
    if (e - s > 11 && strncmp(s, "maxthreads=", 11) == 0) {
      if (!parse_number(s + 11, e, 1, DEFAULT_MAX_THREADS, &v))
        return 0;
      k->maxthreads = (int)v;
    } else if (e - s > 7 && strncmp(s, "shared=", 7) == 0) {
      if (!parse_number(s + 7, e, 0, STATIC_SHARED_MAX, &v))
        return 0;
      k->static_shared = v;
    } else if (e - s == 1 && *s == 'p') {
      if (!kernel_add_param(k, sizeof(void *), 1))
        return 0;
    } else {
      if (!parse_number(s, e, 1, g.param_space, &v) ||
          !kernel_add_param(k, v, 0))
        return 0;
    }
  }
  for (int d = 0; d < MAX_DEVICES; d++)
    k->max_dynamic[d] = (int)(DEFAULT_SHARED - k->static_shared);
  return 1;
}

/* Parses a NUL-terminated FAKECUBIN text into lib's kernels. */
static int parse_fake_image(struct flibrary *lib, const char *text) {
  const char *p = text + strlen(FAKE_IMAGE_MAGIC);
  /* the rest of the first line: blanks only */
  while (*p == ' ' || *p == '\t' || *p == '\r')
    p++;
  if (*p != '\n' && *p != '\0')
    return 0;
  while (*p) {
    p++; /* past the '\n' */
    const char *line = p;
    while (*p && *p != '\n')
      p++;
    const char *end = p;
    while (end > line && (end[-1] == '\r' || end[-1] == ' ' || end[-1] == '\t'))
      end--;
    const char *first = line;
    while (first < end && (*first == ' ' || *first == '\t'))
      first++;
    if (first == end || *first == '#')
      continue; /* blank lines and comments */
    if (!parse_kernel_line(lib, first, end))
      return 0;
  }
  return 1;
}

/* The built-in kernels, for a real fatbin or cubin image. */
static void make_builtin_kernels(struct flibrary *lib) {
  lib->builtin = 1;
  for (size_t i = 0; i < NBUILTINS; i++) {
    char line[128];
    snprintf(line, sizeof line, "kernel %s %s", builtin_defs[i].name,
             builtin_defs[i].params);
    if (!parse_kernel_line(lib, line, line + strlen(line)))
      abort(); /* the table above is wrong */
    lib->kernels[lib->nkernels - 1].op = builtin_defs[i].op;
    lib->kernels[lib->nkernels - 1].elem = builtin_defs[i].elem;
    lib->kernels[lib->nkernels - 1].scalar_arg = builtin_defs[i].scalar_arg;
    lib->kernels[lib->nkernels - 1].src_arg = builtin_defs[i].src_arg;
  }
}

/* Loads `code` (see fakecuda.h for what is accepted) into a new library of
 * the current device. */
static cudaError_t load_image(cudaLibrary_t *out, const unsigned char *code) {
  int dev;
  cudaError_t e = on_current_device(STICKY, &dev);
  if (e != cudaSuccess)
    return e;
  struct flibrary *lib = calloc(1, sizeof *lib);
  if (!lib)
    return cudaErrorMemoryAllocation;
  lib->device = dev;
  /* The fatbin magic, 0xBA55ED50 little-endian; the prefixes are compared
   * byte by byte, so a shorter text image ends (NUL) before the mismatch. */
  static const char fatbin_magic[] = "\x50\xED\x55\xBA";
  if (starts_with(code, FAKE_IMAGE_MAGIC)) {
    if (!parse_fake_image(lib, (const char *)code))
      e = cudaErrorInvalidKernelImage;
  } else if (starts_with(code, "\177ELF") || starts_with(code, fatbin_magic)) {
    make_builtin_kernels(lib);
  } else if (starts_with(code, ".version") || starts_with(code, "//")) {
    e = cudaErrorInvalidPtx;
  } else {
    e = cudaErrorInvalidKernelImage;
  }
  if (e != cudaSuccess) {
    free_library(lib);
    return e;
  }
  g.libraries =
      grow(g.libraries, g.nlibraries, &g.cap_libraries, sizeof *g.libraries);
  g.libraries[g.nlibraries++] = lib;
  *out = (cudaLibrary_t)(void *)lib;
  return cudaSuccess;
}

/* Whether a library load has its output, its image (or path), and the
 * option arrays that its counts promise. */
static int valid_load_args(const cudaLibrary_t *library, const void *image,
                           enum cudaJitOption *jit_options, void **jit_values,
                           unsigned int njit, enum cudaLibraryOption *options,
                           void **values, unsigned int noptions) {
  return library && image && (!njit || (jit_options && jit_values)) &&
         (!noptions || (options && values));
}

static cudaError_t fk_library_load_data(cudaLibrary_t *library,
                                        const void *code,
                                        enum cudaJitOption *jit_options,
                                        void **jit_values, unsigned int njit,
                                        enum cudaLibraryOption *options,
                                        void **values, unsigned int noptions) {
  ENTER_OR_RETURN("cudaLibraryLoadData", 0);
  UNSAFE_OR_RETURN();
  if (!valid_load_args(library, code, jit_options, jit_values, njit, options,
                       values, noptions))
    return leave(cudaErrorInvalidValue);
  return leave(load_image(library, code));
}

static cudaError_t fk_library_load_file(cudaLibrary_t *library,
                                        const char *path,
                                        enum cudaJitOption *jit_options,
                                        void **jit_values, unsigned int njit,
                                        enum cudaLibraryOption *options,
                                        void **values, unsigned int noptions) {
  ENTER_OR_RETURN("cudaLibraryLoadFromFile", 0);
  UNSAFE_OR_RETURN();
  if (!valid_load_args(library, path, jit_options, jit_values, njit, options,
                       values, noptions))
    return leave(cudaErrorInvalidValue);
  FILE *f = fopen(path, "rb");
  if (!f)
    return leave(cudaErrorFileNotFound);
  /* The whole file, with a NUL after it (and enough zero bytes for the
   * magic checks of a short file). */
  size_t len = 0, cap = 4096;
  unsigned char *buf = xrealloc(NULL, cap);
  size_t n;
  while ((n = fread(buf + len, 1, cap - len - 8, f)) > 0) {
    len += n;
    if (cap - len < 4096) {
      cap *= 2;
      buf = xrealloc(buf, cap);
    }
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    return leave(cudaErrorFileNotFound);
  }
  memset(buf + len, 0, 8);
  cudaError_t e = load_image(library, buf);
  free(buf);
  return leave(e);
}

static struct flibrary *find_library(cudaLibrary_t h) {
  for (size_t i = 0; i < g.nlibraries; i++)
    if (g.libraries[i] == (struct flibrary *)(void *)h)
      return g.libraries[i];
  return NULL;
}

static struct flibrary *resolve_library(const char *fn, cudaLibrary_t h) {
  struct flibrary *lib = find_library(h);
  if (!lib)
    violation("%s of %p, which is not a library", fn, (void *)h);
  if (lib->unloaded)
    violation("%s of library %p after it was unloaded", fn, (void *)h);
  return lib;
}

/* A kernel of a live library, or a VIOLATION. */
static struct fkernel *resolve_kernel(const char *fn, const void *func) {
  uintptr_t p = (uintptr_t)func;
  for (size_t i = 0; i < g.nlibraries; i++) {
    struct flibrary *lib = g.libraries[i];
    uintptr_t b = (uintptr_t)lib->kernels;
    if (lib->nkernels && p >= b &&
        p < b + lib->nkernels * sizeof *lib->kernels &&
        (p - b) % sizeof *lib->kernels == 0) {
      struct fkernel *k = &lib->kernels[(p - b) / sizeof *lib->kernels];
      if (lib->unloaded)
        violation("%s of kernel %s (%p), whose library %p was unloaded", fn,
                  k->name, func, (void *)lib);
      return k;
    }
  }
  violation("%s of %p, which is not a kernel", fn, func);
}

/* Unloading does not wait for queued launches (nothing says it does): a
 * library must outlive the work that runs its kernels. */
static cudaError_t fk_library_unload(cudaLibrary_t library) {
  ENTER_OR_RETURN("cudaLibraryUnload", 0);
  UNSAFE_OR_RETURN();
  struct flibrary *lib = find_library(library);
  if (!lib)
    violation("cudaLibraryUnload of %p, which is not a library",
              (void *)library);
  if (lib->unloaded)
    violation("cudaLibraryUnload of library %p, which was already unloaded",
              (void *)library);
  if (lib->queued && !sticky(lib->device))
    violation("cudaLibraryUnload of library %p while %zu launch%s of its "
              "kernels %s still queued",
              (void *)library, lib->queued, lib->queued == 1 ? "" : "es",
              lib->queued == 1 ? "is" : "are");
  if (lib->graph_nodes)
    violation("cudaLibraryUnload of library %p while %zu launch node%s of its "
              "kernels %s in captures, graphs or executable graphs",
              (void *)library, lib->graph_nodes, plural(lib->graph_nodes),
              lib->graph_nodes == 1 ? "is" : "are");
  lib->unloaded = 1;
  return leave(cudaSuccess);
}

static cudaError_t fk_library_get_kernel(cudaKernel_t *kernel,
                                         cudaLibrary_t library,
                                         const char *name) {
  ENTER_OR_RETURN("cudaLibraryGetKernel", 0);
  if (!kernel || !name)
    return leave(cudaErrorInvalidValue);
  struct flibrary *lib = resolve_library("cudaLibraryGetKernel", library);
  for (size_t i = 0; i < lib->nkernels; i++)
    if (strcmp(lib->kernels[i].name, name) == 0) {
      *kernel = (cudaKernel_t)(void *)&lib->kernels[i];
      return leave(cudaSuccess);
    }
  return leave(cudaErrorSymbolNotFound);
}

static cudaError_t fk_func_get_param_info(const void *func, size_t index,
                                          size_t *offset, size_t *size) {
  ENTER_OR_RETURN("cudaFuncGetParamInfo", 0);
  struct fkernel *k = resolve_kernel("cudaFuncGetParamInfo", func);
  if (!offset || !size || index >= k->nparams)
    return leave(cudaErrorInvalidValue);
  *offset = k->poffset[index];
  *size = k->psize[index];
  return leave(cudaSuccess);
}

static cudaError_t fk_func_get_attributes(struct cudaFuncAttributes *attr,
                                          const void *func) {
  int dev;
  ENTER_ON_DEVICE_OR_RETURN("cudaFuncGetAttributes", 0, &dev);
  struct fkernel *k = resolve_kernel("cudaFuncGetAttributes", func);
  if (!attr)
    return leave(cudaErrorInvalidValue);
  memset(attr, 0, sizeof *attr);
  attr->sharedSizeBytes = k->static_shared;
  attr->maxThreadsPerBlock = k->maxthreads;
  attr->numRegs = 32;
  attr->ptxVersion = 90;
  attr->binaryVersion = 90;
  attr->maxDynamicSharedSizeBytes = k->max_dynamic[dev];
  return leave(cudaSuccess);
}

static cudaError_t fk_kernel_set_attribute_for_device(
    cudaKernel_t kernel, enum cudaFuncAttribute attr, int value, int device) {
  ENTER_OR_RETURN("cudaKernelSetAttributeForDevice", 0);
  struct fkernel *k =
      resolve_kernel("cudaKernelSetAttributeForDevice", (const void *)kernel);
  if (!valid_device(device))
    return leave(cudaErrorInvalidDevice);
  cudaError_t e = sticky(device);
  if (e != cudaSuccess)
    return leave(e);
  switch (attr) {
  case cudaFuncAttributeMaxDynamicSharedMemorySize:
    if (value < 0 || (size_t)value > OPTIN_SHARED - k->static_shared)
      return leave(cudaErrorInvalidValue);
    k->max_dynamic[device] = value;
    return leave(cudaSuccess);
  case cudaFuncAttributePreferredSharedMemoryCarveout:
    if (value < -1 || value > 100)
      return leave(cudaErrorInvalidValue);
    return leave(cudaSuccess); /* a hint; nothing to model */
  case cudaFuncAttributeNonPortableClusterSizeAllowed:
    if (value != 0 && value != 1)
      return leave(cudaErrorInvalidValue);
    if (!g.dev[device].cluster_launch)
      return leave(cudaErrorNotSupported);
    k->nonportable[device] = value;
    return leave(cudaSuccess);
  default: return leave(cudaErrorInvalidValue);
  }
}

/* A deterministic model of an H100-like multiprocessor: 2048 threads (in
 * whole warps), 32 blocks and 228 KiB of shared memory. */
static int blocks_per_sm(const struct fkernel *k, int dev, size_t threads,
                         size_t dynamic_shared) {
  if (threads == 0 || threads > (size_t)k->maxthreads ||
      dynamic_shared > (size_t)k->max_dynamic[dev])
    return 0;
  size_t warps = (threads + 31) / 32;
  size_t n = SM_THREADS / (warps * 32);
  if (n > SM_BLOCKS)
    n = SM_BLOCKS;
  size_t shared = k->static_shared + dynamic_shared;
  if (shared && SM_SHARED / shared < n)
    n = SM_SHARED / shared;
  return (int)n;
}

static cudaError_t fk_occupancy_max_active_blocks(int *blocks, const void *func,
                                                  int block_size,
                                                  size_t dynamic_shared) {
  int dev;
  ENTER_ON_DEVICE_OR_RETURN("cudaOccupancyMaxActiveBlocksPerMultiprocessor",
                            STICKY, &dev);
  struct fkernel *k =
      resolve_kernel("cudaOccupancyMaxActiveBlocksPerMultiprocessor", func);
  if (!blocks || block_size <= 0)
    return leave(cudaErrorInvalidValue);
  *blocks = blocks_per_sm(k, dev, (size_t)block_size, dynamic_shared);
  return leave(cudaSuccess);
}

static _Atomic unsigned launch_delay_us;
static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static void (*launch_hook)(void *);
static void *launch_hook_arg;

/* What a launch does before anything else: the test's hook, the delay. */
static void launch_prologue(void) {
  pthread_mutex_lock(&hook_lock);
  void (*hook)(void *) = launch_hook;
  void *hook_arg = launch_hook_arg;
  launch_hook = NULL;
  pthread_mutex_unlock(&hook_lock);
  if (hook)
    hook(hook_arg);
  unsigned delay = atomic_load(&launch_delay_us);
  if (delay) {
    struct timespec ts = {delay / 1000000, (long)(delay % 1000000) * 1000};
    nanosleep(&ts, NULL);
  }
}

/* The cluster of a launch's attributes into c[3]: 1 if given. */
static int attrs_cluster(const cudaLaunchAttribute *attrs, size_t n,
                         unsigned c[3]) {
  for (size_t i = 0; i < n; i++)
    if (attrs[i].id == cudaLaunchAttributeClusterDimension) {
      c[0] = attrs[i].val.clusterDim.x;
      c[1] = attrs[i].val.clusterDim.y;
      c[2] = attrs[i].val.clusterDim.z;
      return 1;
    }
  return 0;
}

/* Checks a cluster of kernel k on device dev as CUDA does: the device
 * supports clusters; no dimension 0; at most 8 blocks, or 16 once the
 * kernel allows non-portable sizes. */
static cudaError_t check_cluster(const struct fkernel *k, int dev,
                                 const unsigned c[3]) {
  if (!g.dev[dev].cluster_launch)
    return cudaErrorNotSupported;
  if (!c[0] || !c[1] || !c[2])
    return cudaErrorInvalidClusterSize;
  uint64_t n = (uint64_t)c[0] * c[1] * (uint64_t)c[2];
  if (n > (k->nonportable[dev] ? 16u : 8u))
    return cudaErrorInvalidClusterSize;
  return cudaSuccess;
}

/* Clusters of `cluster` blocks that can be resident at once: each lives
 * on one GPC of cluster_sms multiprocessors (fake_set_cluster_sms). */
static int active_clusters(const struct fkernel *k, int dev, size_t threads,
                           size_t shared, uint64_t cluster) {
  int sms = g.dev[dev].cluster_sms;
  uint64_t per_gpc =
      (uint64_t)blocks_per_sm(k, dev, threads, shared) * (uint64_t)sms;
  return (int)((uint64_t)(SM_COUNT / sms) * (per_gpc / cluster));
}

static cudaError_t
fk_occupancy_max_active_clusters(int *clusters, const void *func,
                                 const cudaLaunchConfig_t *config) {
  int dev;
  ENTER_ON_DEVICE_OR_RETURN("cudaOccupancyMaxActiveClusters", STICKY, &dev);
  struct fkernel *k = resolve_kernel("cudaOccupancyMaxActiveClusters", func);
  if (!clusters || !config || (config->numAttrs && !config->attrs))
    return leave(cudaErrorInvalidValue);
  unsigned c[3];
  if (!attrs_cluster(config->attrs, config->numAttrs, c))
    return leave(cudaErrorInvalidClusterSize);
  cudaError_t e = check_cluster(k, dev, c);
  if (e != cudaSuccess)
    return leave(e);
  size_t threads = (size_t)config->blockDim.x * config->blockDim.y *
                   (size_t)config->blockDim.z;
  *clusters = active_clusters(k, dev, threads, config->dynamicSmemBytes,
                              (uint64_t)c[0] * c[1] * (uint64_t)c[2]);
  return leave(cudaSuccess);
}

/* Checks a launch's attributes as CUDA does (see fakecuda.h). */
static cudaError_t check_attrs(const struct fkernel *k, int dev, dim3 grid,
                               dim3 block, size_t shared,
                               const cudaLaunchAttribute *attrs, size_t n) {
  if (n > FAKE_MAX_LAUNCH_ATTRS)
    return cudaErrorInvalidValue;
  unsigned c[3] = {1, 1, 1};
  int cluster = attrs_cluster(attrs, n, c);
  uint64_t blocks = (uint64_t)grid.x * grid.y * (uint64_t)grid.z;
  size_t threads = (size_t)block.x * block.y * (size_t)block.z;
  if (cluster) {
    cudaError_t e = check_cluster(k, dev, c);
    if (e != cudaSuccess)
      return e;
    if (grid.x % c[0] || grid.y % c[1] || grid.z % c[2])
      return cudaErrorInvalidClusterSize;
  }
  for (size_t i = 0; i < n; i++) {
    const cudaLaunchAttribute *a = &attrs[i];
    switch (a->id) {
    case cudaLaunchAttributeClusterDimension: break;
    case cudaLaunchAttributeCooperative:
      if (!a->val.cooperative)
        break;
      if (!g.dev[dev].cooperative_launch)
        return cudaErrorNotSupported;
      uint64_t most =
          cluster ? (uint64_t)active_clusters(k, dev, threads, shared,
                                              (uint64_t)c[0] * c[1] * c[2]) *
                        c[0] * c[1] * c[2]
                  : (uint64_t)blocks_per_sm(k, dev, threads, shared) * SM_COUNT;
      if (blocks > most)
        return cudaErrorCooperativeLaunchTooLarge;
      break;
    case cudaLaunchAttributeProgrammaticStreamSerialization:
      if (a->val.programmaticStreamSerializationAllowed &&
          g.dev[dev].cc_major < 9)
        return cudaErrorNotSupported;
      break;
    case cudaLaunchAttributePriority: break; /* CUDA clamps it */
    default: return cudaErrorInvalidValue;
    }
  }
  return cudaSuccess;
}

/* The launch proper, of cudaLaunchKernel (no attributes) and
 * cudaLaunchKernelExC. */
static cudaError_t launch_common(const char *name, const void *func, dim3 grid,
                                 dim3 block, void **args, size_t shared_memory,
                                 cudaStream_t stream,
                                 const cudaLaunchAttribute *attrs,
                                 size_t nattrs) {
  launch_prologue();
  struct fstream *s;
  ENTER_ON_STREAM_OR_RETURN(name, stream, 0, &s);
  struct fkernel *k = resolve_kernel(name, func);
  if (k->lib->device != s->device)
    violation("%s of kernel %s, loaded on device %d, on a stream of device %d",
              name, k->name, k->lib->device, s->device);
  cudaError_t e = sticky(s->device);
  if (e != cudaSuccess)
    return leave(e);
  uint64_t threads = (uint64_t)block.x * block.y * block.z;
  if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z ||
      block.x > 1024 || block.y > 1024 || block.z > 64 || threads > 1024 ||
      threads > (uint64_t)k->maxthreads || grid.x > 2147483647u ||
      grid.y > 65535 || grid.z > 65535)
    return leave(cudaErrorInvalidConfiguration);
  if (shared_memory > (size_t)k->max_dynamic[s->device])
    return leave(cudaErrorInvalidValue);
  if (nattrs && !attrs)
    return leave(cudaErrorInvalidValue);
  e = check_attrs(k, s->device, grid, block, shared_memory, attrs, nattrs);
  if (e != cudaSuccess)
    return leave(e);
  if (k->nparams && !args)
    violation("%s of kernel %s, which has %zu parameter%s, with args NULL",
              name, k->name, k->nparams, plural(k->nparams));
  unsigned char *values = calloc(1, k->argbytes ? k->argbytes : 1);
  if (!values)
    return leave(cudaErrorMemoryAllocation);
  for (size_t i = 0; i < k->nparams; i++) {
    if (!args[i]) {
      free(values);
      violation("%s of kernel %s with args[%zu] NULL", name, k->name, i);
    }
    memcpy(values + k->poffset[i], args[i], k->psize[i]);
  }
  unsigned char *copy = xrealloc(g.launch_args, k->argbytes + 1);
  memcpy(copy, values, k->argbytes);
  g.launch_args = copy;
  g.launch_args_size = k->argbytes;
  if (nattrs)
    memcpy(g.launch_attrs, attrs, nattrs * sizeof *attrs);
  g.launch_nattrs = nattrs;
  g.launch_grid = grid;
  g.launch_block = block;
  g.launch_shared = shared_memory;
  struct fop *o = new_op(OP_LAUNCH);
  o->kernel = k;
  o->staging = values;
  k->lib->queued++;
  return leave(enqueue(s, o));
}

static cudaError_t fk_launch_kernel(const void *func, dim3 grid, dim3 block,
                                    void **args, size_t shared_memory,
                                    cudaStream_t stream) {
  return launch_common("cudaLaunchKernel", func, grid, block, args,
                       shared_memory, stream, NULL, 0);
}

static cudaError_t fk_launch_kernel_ex(const cudaLaunchConfig_t *config,
                                       const void *func, void **args) {
  if (!config) { /* counted and logged like any call */
    ENTER_OR_RETURN("cudaLaunchKernelExC", 0);
    return leave(cudaErrorInvalidValue);
  }
  return launch_common("cudaLaunchKernelExC", func, config->gridDim,
                       config->blockDim, args, config->dynamicSmemBytes,
                       config->stream, config->attrs, config->numAttrs);
}

/* The driver's launch calls, which the library prefers: the same launch,
 * which leaves the runtime's last error as it was.  A CUkernel launches
 * in its stream's context: as the runtime's launch, here. */
static CUresult CUDAAPI fk_drv_launch_kernel(CUfunction f, unsigned gx,
                                             unsigned gy, unsigned gz,
                                             unsigned bx, unsigned by,
                                             unsigned bz, unsigned shared,
                                             CUstream hstream, void **params,
                                             void **extra) {
  if (extra)
    violation("cuLaunchKernel with extra %p: the library passes none",
              (void *)extra);
  cudaError_t saved = t_last_error;
  cudaError_t e = launch_common("cuLaunchKernel", (const void *)f,
                                (dim3){gx, gy, gz}, (dim3){bx, by, bz}, params,
                                shared, (cudaStream_t)hstream, NULL, 0);
  t_last_error = saved;
  return (CUresult)e;
}

static CUresult CUDAAPI fk_drv_launch_kernel_ex(const CUlaunchConfig *config,
                                                CUfunction f, void **params,
                                                void **extra) {
  if (extra)
    violation("cuLaunchKernelEx with extra %p: the library passes none",
              (void *)extra);
  cudaError_t saved = t_last_error, e;
  if (!config) { /* counted and logged like any call */
    e = begin("cuLaunchKernelEx", 0);
    unlock();
    return (CUresult)(e != cudaSuccess ? e : cudaErrorInvalidValue);
  }
  e = launch_common(
      "cuLaunchKernelEx", (const void *)f,
      (dim3){config->gridDimX, config->gridDimY, config->gridDimZ},
      (dim3){config->blockDimX, config->blockDimY, config->blockDimZ}, params,
      config->sharedMemBytes, (cudaStream_t)config->hStream,
      (const cudaLaunchAttribute *)config->attrs, config->numAttrs);
  t_last_error = saved;
  return (CUresult)e;
}

static void *arg_pointer(const struct fkernel *k, const unsigned char *v,
                         size_t i) {
  void *p;
  memcpy(&p, v + k->poffset[i], sizeof p);
  return p;
}

/* Checks the n elements a built-in kernel touches through parameter i.
 * Returns 0 (after making the device sticky, as a GPU's fault does) if the
 * pointer is misaligned. */
static int check_builtin_range(const struct fkernel *k, const char *what,
                               const unsigned char *v, size_t i, size_t n) {
  void *p = arg_pointer(k, v, i);
  if (n > SIZE_MAX / k->elem)
    violation("queued %s makes an out-of-bounds access: %zu elements of %zu "
              "bytes at %p (argument %zu)",
              what, n, k->elem, p, i);
  check_access(what, p, n * k->elem);
  int known = 0;
  for (struct falloc *a = g.live; a; a = a->next)
    if ((uintptr_t)p >= (uintptr_t)a->base &&
        (uintptr_t)p < (uintptr_t)a->base + a->size)
      known = 1;
  if (!known)
    violation("queued %s reads or writes %p (argument %zu), which is no "
              "memory allocated through CUDA",
              what, p, i);
  if ((uintptr_t)p % k->elem) {
    g.dev[k->lib->device].sticky = cudaErrorMisalignedAddress;
    return 0;
  }
  return 1;
}

/* The semantics of the built-in kernels, over all n elements whatever the
 * grid (they are grid-stride loops). */
static void exec_builtin(const struct fkernel *k, const char *what,
                         const unsigned char *v) {
  size_t n = 0;
  memcpy(&n, v + k->poffset[k->nparams - 1], sizeof n);
  if (n == 0)
    return;
  for (size_t i = 0; i < k->nparams; i++)
    if (k->pointer[i] && !check_builtin_range(k, what, v, i, n))
      return;
  unsigned char *p0 = arg_pointer(k, v, 0);
  const unsigned char *scalar = v + k->poffset[k->scalar_arg];
  for (size_t i = 0; i < n; i++) {
    size_t off = i * k->elem;
    if (k->elem == 4) {
      float x, s, y, z;
      switch (k->op) {
      case BI_FILL: memcpy(p0 + off, scalar, 4); break;
      case BI_SCALE:
        memcpy(&x, p0 + off, 4);
        memcpy(&s, scalar, 4);
        x *= s;
        memcpy(p0 + off, &x, 4);
        break;
      case BI_AXPY: /* y = a * x + y: (y, a, x, n) or (y, x, a, n) */
        memcpy(&y, p0 + off, 4);
        memcpy(&s, scalar, 4);
        memcpy(&x, (unsigned char *)arg_pointer(k, v, k->src_arg) + off, 4);
        y = s * x + y;
        memcpy(p0 + off, &y, 4);
        break;
      case BI_VECADD: /* c = a + b: (c, a, b, n) */
        memcpy(&x, (unsigned char *)arg_pointer(k, v, 1) + off, 4);
        memcpy(&z, (unsigned char *)arg_pointer(k, v, 2) + off, 4);
        y = x + z;
        memcpy(p0 + off, &y, 4);
        break;
      case BI_NONE: break;
      }
    } else {
      double x, s, y, z;
      switch (k->op) {
      case BI_FILL: memcpy(p0 + off, scalar, 8); break;
      case BI_SCALE:
        memcpy(&x, p0 + off, 8);
        memcpy(&s, scalar, 8);
        x *= s;
        memcpy(p0 + off, &x, 8);
        break;
      case BI_AXPY:
        memcpy(&y, p0 + off, 8);
        memcpy(&s, scalar, 8);
        memcpy(&x, (unsigned char *)arg_pointer(k, v, k->src_arg) + off, 8);
        y = s * x + y;
        memcpy(p0 + off, &y, 8);
        break;
      case BI_VECADD:
        memcpy(&x, (unsigned char *)arg_pointer(k, v, 1) + off, 8);
        memcpy(&z, (unsigned char *)arg_pointer(k, v, 2) + off, 8);
        y = x + z;
        memcpy(p0 + off, &y, 8);
        break;
      case BI_NONE: break;
      }
    }
  }
}

/* A queued launch runs: every pointer argument must still point at live
 * memory (or the test's host memory); the built-in kernels do their work. */
static void exec_launch(const struct fop *o) {
  struct fkernel *k = o->kernel;
  const unsigned char *v = o->staging;
  char what[256];
  snprintf(what, sizeof what, "kernel %s", k->name);
  log_add("exec:cudaLaunchKernel");
  if (k->op != BI_NONE) {
    exec_builtin(k, what, v);
    return;
  }
  for (size_t i = 0; i < k->nparams; i++) {
    void *p;
    if (k->pointer[i] && (p = arg_pointer(k, v, i)) != NULL)
      check_pointer_arg(what, p);
  }
}

/* ------------------------------------------------------------------------ */
/* NVRTC                                                                      */
/* ------------------------------------------------------------------------ */

static const char *const nvrtc_names[] = {
    "NVRTC_SUCCESS",
    "NVRTC_ERROR_OUT_OF_MEMORY",
    "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
    "NVRTC_ERROR_INVALID_INPUT",
    "NVRTC_ERROR_INVALID_PROGRAM",
    "NVRTC_ERROR_INVALID_OPTION",
    "NVRTC_ERROR_COMPILATION",
    "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
    "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
    "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
    "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
    "NVRTC_ERROR_INTERNAL_ERROR",
    "NVRTC_ERROR_TIME_FILE_WRITE_FAILED",
    "NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED",
    "NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED",
    "NVRTC_ERROR_PCH_CREATE",
    "NVRTC_ERROR_CANCELLED",
    "NVRTC_ERROR_TIME_TRACE_FILE_WRITE_FAILED",
};

static const char *fk_nvrtc_get_error_string(nvrtcResult result) {
  if ((unsigned)result < sizeof nvrtc_names / sizeof nvrtc_names[0])
    return nvrtc_names[result];
  return "NVRTC_ERROR unknown";
}

/* The result an injected cudaError_t becomes (see fakecuda.h). */
static nvrtcResult nvrtc_of(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return NVRTC_SUCCESS;
  case cudaErrorMemoryAllocation: return NVRTC_ERROR_OUT_OF_MEMORY;
  case cudaErrorInvalidValue: return NVRTC_ERROR_INVALID_INPUT;
  default: return NVRTC_ERROR_INTERNAL_ERROR;
  }
}

/* The prologue of the NVRTC calls: counted, logged and failed on request
 * like the runtime's, but NVRTC needs no driver and has no sticky state.
 * Whatever it returns, the caller ends through leave_nvrtc(). */
static nvrtcResult begin_nvrtc(const char *name) {
  lock();
  if (count_call(name))
    return NVRTC_ERROR_INTERNAL_ERROR;
  return nvrtc_of(injected_fault(name));
}

static nvrtcResult leave_nvrtc(nvrtcResult r) {
  unlock();
  return r;
}

static struct fprogram *resolve_program(const char *fn, nvrtcProgram h) {
  for (size_t i = 0; i < g.nprograms; i++)
    if (g.programs[i] == (struct fprogram *)(void *)h) {
      if (g.programs[i]->destroyed)
        violation("%s of program %p after it was destroyed", fn, (void *)h);
      return g.programs[i];
    }
  violation("%s of %p, which is not a program", fn, (void *)h);
}

static nvrtcResult fk_nvrtc_create_program(nvrtcProgram *prog,
                                           const char *source, const char *name,
                                           int nheaders,
                                           const char *const *headers,
                                           const char *const *include_names) {
  ENTER_NVRTC_OR_RETURN("nvrtcCreateProgram");
  if (!prog || !source || nheaders < 0 ||
      (nheaders > 0 && (!headers || !include_names)))
    return leave_nvrtc(NVRTC_ERROR_INVALID_INPUT);
  struct fprogram *p = calloc(1, sizeof *p);
  if (!p)
    return leave_nvrtc(NVRTC_ERROR_OUT_OF_MEMORY);
  p->source = xstrdup(source);
  p->name = xstrdup(name ? name : "default_program");
  p->log = xstrdup("");
  g.programs =
      grow(g.programs, g.nprograms, &g.cap_programs, sizeof *g.programs);
  g.programs[g.nprograms++] = p;
  *prog = (nvrtcProgram)(void *)p;
  return leave_nvrtc(NVRTC_SUCCESS);
}

static int has_prefix(const char *s, const char *prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* "sm_90", "sm_90a", "compute_90": digits after the prefix, then at most
 * one letter. */
static int valid_arch(const char *v, int *real) {
  const char *d;
  if (has_prefix(v, "sm_")) {
    d = v + 3;
    *real = 1;
  } else if (has_prefix(v, "compute_")) {
    d = v + 8;
    *real = 0;
  } else {
    return 0;
  }
  if (!isdigit((unsigned char)d[0]) || !isdigit((unsigned char)d[1]))
    return 0;
  d += 2;
  while (isdigit((unsigned char)*d))
    d++;
  if (*d == 'a' || *d == 'f')
    d++;
  return *d == '\0';
}

/* Returns 0 and a log if the option is unknown or its value bad.  *real is
 * cleared by an -arch for a virtual architecture (no cubin then). */
static int check_option(const char *o, char **log, int *real) {
  static const char *const exact[] = {"-G", "-lineinfo", "--use_fast_math",
                                      "-default-device"};
  static const char *const prefix[] = {"-D", "-I", "-std=", "--std="};
  for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
    if (strcmp(o, exact[i]) == 0)
      return 1;
  for (size_t i = 0; i < sizeof prefix / sizeof prefix[0]; i++)
    if (has_prefix(o, prefix[i]) && o[strlen(prefix[i])] != '\0')
      return 1;
  const char *arch = has_prefix(o, "-arch=")                ? o + 6
                     : has_prefix(o, "--gpu-architecture=") ? o + 19
                                                            : NULL;
  if (arch) {
    if (valid_arch(arch, real))
      return 1;
    *log = xstrdup("nvrtc: error: invalid value for --gpu-architecture "
                   "(-arch)");
    return 0;
  }
  const char *fmt = "nvrtc: error: unrecognized option %s found";
  size_t n = strlen(fmt) + strlen(o);
  *log = xrealloc(NULL, n);
  snprintf(*log, n, fmt, o);
  return 0;
}

static char *format_log(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static char *format_log(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *s = xrealloc(NULL, (size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}

static int line_of(const char *src, const char *at) {
  int line = 1;
  for (const char *p = src; p < at; p++)
    if (*p == '\n')
      line++;
  return line;
}

/* A copy of src with its comments blanked out (newlines kept, so that
 * line numbers stay right). */
static char *strip_comments(const char *src) {
  char *s = xstrdup(src);
  for (char *p = s; *p; p++) {
    if (p[0] == '/' && p[1] == '/') {
      while (*p && *p != '\n')
        *p++ = ' ';
      if (!*p)
        break;
    } else if (p[0] == '/' && p[1] == '*') {
      *p++ = ' ';
      *p = ' ';
      while (p[1] && !(p[1] == '*' && p[2] == '/')) {
        p++;
        if (*p != '\n')
          *p = ' ';
      }
      if (p[1]) {
        p[1] = p[2] = ' ';
        p += 2;
      } else {
        break;
      }
    }
  }
  return s;
}

/* The size of a parameter of the C type `type` (blanks normalised), or 0. */
static size_t c_type_size(const char *type) {
  static const struct {
    const char *name;
    size_t size;
  } types[] = {
      {"char", 1},          {"signed char", 1},
      {"unsigned char", 1}, {"int8_t", 1},
      {"uint8_t", 1},       {"bool", 1},
      {"short", 2},         {"unsigned short", 2},
      {"int16_t", 2},       {"uint16_t", 2},
      {"int", 4},           {"unsigned", 4},
      {"unsigned int", 4},  {"float", 4},
      {"int32_t", 4},       {"uint32_t", 4},
      {"long", 8},          {"long long", 8},
      {"unsigned long", 8}, {"unsigned long long", 8},
      {"size_t", 8},        {"double", 8},
      {"int64_t", 8},       {"uint64_t", 8},
  };
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (strcmp(type, types[i].name) == 0)
      return types[i].size;
  return 0;
}

static int is_qualifier(const char *w, size_t n) {
  static const char *const q[] = {"const", "volatile", "__restrict__",
                                  "restrict", "__grid_constant__"};
  for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
    if (strlen(q[i]) == n && strncmp(w, q[i], n) == 0)
      return 1;
  return 0;
}

/* Appends to a growing string. */
static void append(char **s, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void append(char **s, size_t *len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  *s = xrealloc(*s, *len + (size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(*s + *len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  *len += (size_t)n;
}

/* One parameter declaration [s, e) of a kernel into the image's line:
 * " p" or " <size>".  Returns 0 with *log set for an unknown type. */
static int add_param_decl(const struct fprogram *p, const char *src,
                          const char *s, const char *e, char **img, size_t *len,
                          char **log) {
  for (const char *q = s; q < e; q++)
    if (*q == '*') {
      append(img, len, " p");
      return 1;
    }
  /* the words, without qualifiers */
  const char *w[16];
  size_t wn[16], nw = 0;
  int odd = 0;
  for (const char *q = s; q < e;) {
    if (isspace((unsigned char)*q)) {
      q++;
      continue;
    }
    const char *b = q;
    if (is_ident_char((unsigned char)*q) || *q == ':') {
      while (q < e && (is_ident_char((unsigned char)*q) || *q == ':'))
        q++;
    } else {
      odd = 1;
      q++;
    }
    if (is_qualifier(b, (size_t)(q - b)))
      continue;
    if (nw == 16)
      odd = 1;
    else {
      w[nw] = b;
      wn[nw++] = (size_t)(q - b);
    }
  }
  char type[256] = "";
  size_t size = 0;
  /* With the parameter's name (the last word) dropped, or without. */
  for (int drop = 0; !odd && drop <= 1 && !size; drop++) {
    if ((size_t)drop >= nw)
      break;
    size_t tl = 0;
    type[0] = '\0';
    for (size_t i = 0; i + (size_t)drop < nw; i++)
      tl += (size_t)snprintf(type + tl, sizeof type - tl, "%s%.*s",
                             i ? " " : "", (int)wn[i], w[i]);
    size = c_type_size(type);
  }
  if (!size) {
    /* the declaration, trimmed, and its line */
    while (s < e && isspace((unsigned char)*s))
      s++;
    while (e > s && isspace((unsigned char)e[-1]))
      e--;
    snprintf(type, sizeof type, "%.*s", (int)(e - s), s);
    *log = format_log("%s(%d): error: unknown type \"%s\"", p->name,
                      line_of(src, s), type);
    return 0;
  }
  append(img, len, " %zu", size);
  return 1;
}

/* C++ kernels' names, mangled as the Itanium C++ ABI says (and nvcc
 * does): _Z, the name's length and the name, then each parameter's type.
 * Types that are not builtins (pointers, qualified types, class names)
 * are substitution candidates: a later use of the same type is S_, S0_,
 * S1_, ... */
struct mangler {
  char cand[64][128]; /* the candidates' codes, unsubstituted */
  size_t n;
};

/* The code of a builtin type spelt `type` (blanks normalised), or NULL. */
static const char *builtin_code(const char *type) {
  static const struct {
    const char *name, *code;
  } codes[] = {
      {"char", "c"},          {"signed char", "a"},
      {"unsigned char", "h"}, {"int8_t", "a"},
      {"uint8_t", "h"},       {"bool", "b"},
      {"short", "s"},         {"unsigned short", "t"},
      {"int16_t", "s"},       {"uint16_t", "t"},
      {"int", "i"},           {"unsigned", "j"},
      {"unsigned int", "j"},  {"float", "f"},
      {"int32_t", "i"},       {"uint32_t", "j"},
      {"long", "l"},          {"long long", "x"},
      {"unsigned long", "m"}, {"unsigned long long", "y"},
      {"size_t", "m"},        {"double", "d"},
      {"int64_t", "l"},       {"uint64_t", "m"},
      {"void", "v"},
  };
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
    if (strcmp(type, codes[i].name) == 0)
      return codes[i].code;
  return NULL;
}

/* Wraps the type (*canon, written *emit) in `prefix` ("P", "K", "VK"): a
 * candidate met before is written as its substitution, a new one is
 * remembered. */
static void mangle_wrap(struct mangler *m, char *canon, char *emit,
                        const char *prefix) {
  char c[128], e[128];
  if (prefix) {
    snprintf(c, sizeof c, "%s%s", prefix, canon);
    snprintf(e, sizeof e, "%s%s", prefix, emit);
  } else {
    snprintf(c, sizeof c, "%s", canon);
    snprintf(e, sizeof e, "%s", emit);
  }
  for (size_t i = 0; i < m->n; i++)
    if (strcmp(m->cand[i], c) == 0) {
      static const char digits[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
      if (i == 0)
        snprintf(e, sizeof e, "S_");
      else if (i - 1 < 36)
        snprintf(e, sizeof e, "S%c_", digits[i - 1]);
      else
        snprintf(e, sizeof e, "S%c%c_", digits[(i - 1) / 36],
                 digits[(i - 1) % 36]);
      break;
    } else if (i + 1 == m->n && m->n < 64) {
      snprintf(m->cand[m->n++], sizeof m->cand[0], "%s", c);
      break;
    }
  if (m->n == 0)
    snprintf(m->cand[m->n++], sizeof m->cand[0], "%s", c);
  strcpy(canon, c);
  strcpy(emit, e);
}

/* Appends the code of the parameter declaration [s, e) to *out; 0 for a
 * type it cannot mangle (a struct passed by value, a template). */
static int mangle_param(struct mangler *m, const char *s, const char *e,
                        char **out, size_t *len) {
  char type[100] = "", canon[128] = "", emit[128] = "";
  const char *name = NULL;
  size_t tl = 0, stars = 0, nwords = 0;
  int cbase = 0, vbase = 0, cstar[8] = {0};
  for (const char *q = s; q < e;) {
    if (isspace((unsigned char)*q)) {
      q++;
    } else if (*q == '*') {
      if (stars == 8)
        return 0;
      stars++;
      q++;
    } else if (is_ident_start((unsigned char)*q)) {
      const char *b = q;
      while (q < e && is_ident_char((unsigned char)*q))
        q++;
      size_t n = (size_t)(q - b);
      if (n == 5 && !strncmp(b, "const", 5)) {
        if (stars)
          cstar[stars - 1] = 1;
        else
          cbase = 1;
      } else if (n == 8 && !strncmp(b, "volatile", 8)) {
        if (!stars)
          vbase = 1;
      } else if (is_qualifier(b, n)) {
        /* restrict: no part of a parameter's type */
      } else if (stars) {
        if (name)
          return 0;
        name = b;
      } else {
        tl += (size_t)snprintf(type + tl, sizeof type - tl, "%s%.*s",
                               nwords++ ? " " : "", (int)n, b);
        if (tl >= sizeof type)
          return 0;
      }
    } else {
      return 0;
    }
  }
  /* Without a '*', the last word may be the name. */
  const char *code = builtin_code(type);
  if (!code && !stars && nwords >= 2) {
    char *sp = strrchr(type, ' ');
    *sp = '\0';
    code = builtin_code(type);
  }
  if (code) {
    snprintf(canon, sizeof canon, "%s", code);
    snprintf(emit, sizeof emit, "%s", code);
  } else if (stars && nwords == 1) {
    /* a pointer to a class: its name is a candidate */
    snprintf(canon, sizeof canon, "%zu%s", strlen(type), type);
    snprintf(emit, sizeof emit, "%s", canon);
    mangle_wrap(m, canon, emit, NULL);
  } else {
    return 0;
  }
  if (!stars) { /* a parameter's own qualifiers are no part of its type */
    append(out, len, "%s", emit);
    return strcmp(code, "v") != 0;
  }
  if (cbase || vbase)
    mangle_wrap(m, canon, emit, cbase && vbase ? "VK" : cbase ? "K" : "V");
  for (size_t i = 0; i < stars; i++) {
    mangle_wrap(m, canon, emit, "P");
    if (cstar[i] && i + 1 < stars)
      mangle_wrap(m, canon, emit, "K");
  }
  append(out, len, "%s", emit);
  return 1;
}

/* The mangled name of C++ kernel NAME with the parameters [params, end),
 * malloc'd; NULL where a type cannot be mangled. */
static char *mangle_kernel(const char *name, size_t namelen, const char *params,
                           const char *end) {
  struct mangler m = {.n = 0};
  char *out = NULL;
  size_t len = 0;
  append(&out, &len, "_Z%zu%.*s", namelen, (int)namelen, name);
  const char *ps = params, *pe = end;
  while (ps < pe && isspace((unsigned char)*ps))
    ps++;
  while (pe > ps && isspace((unsigned char)pe[-1]))
    pe--;
  if (pe == ps || (pe - ps == 4 && strncmp(ps, "void", 4) == 0)) {
    append(&out, &len, "v");
    return out;
  }
  int depth = 0;
  const char *start = params;
  for (const char *c = params; c <= end; c++) {
    if (c < end && (*c == '(' || *c == '<' || *c == '['))
      depth++;
    else if (c < end && (*c == ')' || *c == '>' || *c == ']'))
      depth--;
    if (c == end || (depth == 0 && *c == ',')) {
      if (depth || !mangle_param(&m, start, c, &out, &len)) {
        free(out);
        return NULL;
      }
      start = c + 1;
    }
  }
  return out;
}

/* Finds `[extern "C"] __global__ void [__launch_bounds__(N[,...])]
 * NAME(...)` in the source and makes a FAKECUBIN image of them, C++
 * kernels under their mangled names. */
static nvrtcResult fake_compile(struct fprogram *p, char **log) {
  char *src = strip_comments(p->source);
  char *img = NULL;
  size_t len = 0;
  char **names = NULL;
  size_t nnames = 0;
  nvrtcResult r = NVRTC_SUCCESS;
  append(&img, &len, "%s\n", FAKE_IMAGE_MAGIC);

  /* #error, first */
  for (char *line = src; line && *line;) {
    char *q = line;
    while (*q == ' ' || *q == '\t')
      q++;
    if (*q == '#') {
      q++;
      while (*q == ' ' || *q == '\t')
        q++;
      if (has_prefix(q, "error") &&
          (q[5] == '\0' || q[5] == '\n' || isspace((unsigned char)q[5]))) {
        q += 5;
        while (*q == ' ' || *q == '\t')
          q++;
        char *end = strchr(q, '\n');
        if (!end)
          end = q + strlen(q);
        while (end > q && isspace((unsigned char)end[-1]))
          end--;
        *log = format_log("%s(%d): error: %.*s", p->name, line_of(src, line),
                          (int)(end - q), q);
        r = NVRTC_ERROR_COMPILATION;
        goto out;
      }
    }
    line = strchr(line, '\n');
    if (line)
      line++;
  }

  for (char *g_at = strstr(src, "__global__"); g_at;
       g_at = strstr(g_at + 1, "__global__")) {
    /* a whole word, after `extern "C"` */
    if ((g_at > src && is_ident_char((unsigned char)g_at[-1])) ||
        is_ident_char((unsigned char)g_at[10]))
      continue;
    char *b = g_at;
    int cxx = 0; /* not extern "C": named mangled */
    while (b > src && isspace((unsigned char)b[-1]))
      b--;
    if (b - src < 3 || strncmp(b - 3, "\"C\"", 3) != 0) {
      cxx = 1;
    } else {
      b -= 3;
      while (b > src && isspace((unsigned char)b[-1]))
        b--;
      if (b - src < 6 || strncmp(b - 6, "extern", 6) != 0 ||
          (b - 6 > src && is_ident_char((unsigned char)b[-7])))
        cxx = 1;
    }
    char *q = g_at + 10;
    while (isspace((unsigned char)*q))
      q++;
    if (strncmp(q, "void", 4) != 0 || is_ident_char((unsigned char)q[4]))
      continue;
    q += 4;
    while (isspace((unsigned char)*q))
      q++;
    unsigned long maxthreads = 0;
    if (has_prefix(q, "__launch_bounds__")) {
      q += 17;
      while (isspace((unsigned char)*q))
        q++;
      if (*q != '(')
        continue;
      char *num = ++q;
      while (isspace((unsigned char)*num))
        num++;
      char *ne = num;
      while (isdigit((unsigned char)*ne))
        ne++;
      if (!parse_number(num, ne, 1, DEFAULT_MAX_THREADS, &maxthreads)) {
        *log = format_log("%s(%d): error: bad __launch_bounds__", p->name,
                          line_of(src, q));
        r = NVRTC_ERROR_COMPILATION;
        break;
      }
      q = strchr(q, ')');
      if (!q)
        continue;
      q++;
      while (isspace((unsigned char)*q))
        q++;
    }
    if (!is_ident_start((unsigned char)*q))
      continue;
    char *name = q;
    while (is_ident_char((unsigned char)*q))
      q++;
    size_t namelen = (size_t)(q - name);
    while (isspace((unsigned char)*q))
      q++;
    if (*q != '(')
      continue;
    char *params = ++q;
    int depth = 0;
    while (*q && !(depth == 0 && *q == ')')) {
      if (*q == '(' || *q == '<' || *q == '[')
        depth++;
      else if (*q == ')' || *q == '>' || *q == ']')
        depth--;
      q++;
    }
    if (!*q)
      continue;
    char *params_end = q;
    if (cxx) {
      /* The kernel's mangled name, or no kernel of a type the fake
       * cannot mangle (a struct by value, a template's parameter). */
      char *mangled = mangle_kernel(name, namelen, params, params_end);
      if (!mangled)
        continue;
      for (size_t i = 0; i < nnames; i++)
        if (!strcmp(names[i], mangled)) {
          *log = format_log("%s(%d): error: function \"%.*s\" has already "
                            "been defined",
                            p->name, line_of(src, name), (int)namelen, name);
          r = NVRTC_ERROR_COMPILATION;
        }
      if (r != NVRTC_SUCCESS) {
        free(mangled);
        break;
      }
      names = xrealloc(names, (nnames + 1) * sizeof *names);
      names[nnames++] = mangled;
      name = mangled;
      namelen = strlen(mangled);
    }
    int dup = 0;
    for (size_t i = 0; i < nnames; i++)
      if (strlen(names[i]) == namelen && !strncmp(names[i], name, namelen))
        dup = 1;
    if (dup && !cxx) {
      *log = format_log("%s(%d): error: function \"%.*s\" has already been "
                        "defined",
                        p->name, line_of(src, name), (int)namelen, name);
      r = NVRTC_ERROR_COMPILATION;
      break;
    }
    if (!cxx) {
      names = xrealloc(names, (nnames + 1) * sizeof *names);
      names[nnames++] = xstrndup(name, namelen);
    }
    append(&img, &len, "kernel %.*s", (int)namelen, name);
    if (maxthreads)
      append(&img, &len, " maxthreads=%lu", maxthreads);
    /* (void) and () take nothing */
    char *ps = params;
    while (ps < params_end && isspace((unsigned char)*ps))
      ps++;
    char *pe = params_end;
    while (pe > ps && isspace((unsigned char)pe[-1]))
      pe--;
    if (pe > ps && !(pe - ps == 4 && strncmp(ps, "void", 4) == 0)) {
      char *start = params;
      depth = 0;
      for (char *c = params; c <= params_end; c++) {
        if (c < params_end && (*c == '(' || *c == '<' || *c == '['))
          depth++;
        else if (c < params_end && (*c == ')' || *c == '>' || *c == ']'))
          depth--;
        if (c == params_end || (depth == 0 && *c == ',')) {
          if (!add_param_decl(p, src, start, c, &img, &len, log)) {
            r = NVRTC_ERROR_COMPILATION;
            break;
          }
          start = c + 1;
        }
      }
      if (r != NVRTC_SUCCESS)
        break;
    }
    append(&img, &len, "\n");
  }
out:
  for (size_t i = 0; i < nnames; i++)
    free(names[i]);
  free(names);
  free(src);
  if (r == NVRTC_SUCCESS) {
    p->image = img;
    p->image_size = len + 1;
  } else {
    free(img);
  }
  return r;
}

static nvrtcResult fk_nvrtc_compile_program(nvrtcProgram prog, int noptions,
                                            const char *const *options) {
  ENTER_NVRTC_OR_RETURN("nvrtcCompileProgram");
  struct fprogram *p = resolve_program("nvrtcCompileProgram", prog);
  if (noptions < 0 || (noptions > 0 && !options))
    return leave_nvrtc(NVRTC_ERROR_INVALID_INPUT);
  for (int i = 0; i < noptions; i++)
    if (!options[i])
      return leave_nvrtc(NVRTC_ERROR_INVALID_INPUT);
  /* The options, for fake_last_nvrtc_options(). */
  char *joined = NULL;
  size_t jl = 0;
  append(&joined, &jl, "%s", "");
  for (int i = 0; i < noptions; i++)
    append(&joined, &jl, "%s%s", i ? " " : "", options[i]);
  free(g.nvrtc_options);
  g.nvrtc_options = joined;

  free(p->log);
  free(p->image);
  p->log = NULL;
  p->image = NULL;
  p->image_size = 0;
  char *log = NULL;
  int real = 1;
  for (int i = 0; i < noptions; i++)
    if (!check_option(options[i], &log, &real)) {
      p->log = log;
      return leave_nvrtc(NVRTC_ERROR_INVALID_OPTION);
    }
  nvrtcResult r = fake_compile(p, &log);
  p->log = log ? log : xstrdup("");
  if (r == NVRTC_SUCCESS && !real) { /* PTX only: no cubin */
    free(p->image);
    p->image = NULL;
    p->image_size = 0;
  }
  return leave_nvrtc(r);
}

static nvrtcResult fk_nvrtc_get_program_log_size(nvrtcProgram prog,
                                                 size_t *size) {
  ENTER_NVRTC_OR_RETURN("nvrtcGetProgramLogSize");
  struct fprogram *p = resolve_program("nvrtcGetProgramLogSize", prog);
  if (!size)
    return leave_nvrtc(NVRTC_ERROR_INVALID_INPUT);
  *size = strlen(p->log) + 1;
  return leave_nvrtc(NVRTC_SUCCESS);
}

static nvrtcResult fk_nvrtc_get_program_log(nvrtcProgram prog, char *log) {
  ENTER_NVRTC_OR_RETURN("nvrtcGetProgramLog");
  struct fprogram *p = resolve_program("nvrtcGetProgramLog", prog);
  if (!log)
    return leave_nvrtc(NVRTC_ERROR_INVALID_INPUT);
  memcpy(log, p->log, strlen(p->log) + 1);
  return leave_nvrtc(NVRTC_SUCCESS);
}

/* As the real one: 0 bytes, successfully, when there is no cubin (not
 * compiled, failed, or compiled for a virtual architecture). */
static nvrtcResult fk_nvrtc_get_cubin_size(nvrtcProgram prog, size_t *size) {
  ENTER_NVRTC_OR_RETURN("nvrtcGetCUBINSize");
  struct fprogram *p = resolve_program("nvrtcGetCUBINSize", prog);
  if (!size)
    return leave_nvrtc(NVRTC_ERROR_INVALID_INPUT);
  *size = p->image_size;
  return leave_nvrtc(NVRTC_SUCCESS);
}

static nvrtcResult fk_nvrtc_get_cubin(nvrtcProgram prog, char *cubin) {
  ENTER_NVRTC_OR_RETURN("nvrtcGetCUBIN");
  struct fprogram *p = resolve_program("nvrtcGetCUBIN", prog);
  if (!cubin)
    return leave_nvrtc(NVRTC_ERROR_INVALID_INPUT);
  if (p->image)
    memcpy(cubin, p->image, p->image_size);
  return leave_nvrtc(NVRTC_SUCCESS);
}

static nvrtcResult fk_nvrtc_destroy_program(nvrtcProgram *prog) {
  ENTER_NVRTC_OR_RETURN("nvrtcDestroyProgram");
  if (!prog)
    return leave_nvrtc(NVRTC_ERROR_INVALID_PROGRAM);
  struct fprogram *p = resolve_program("nvrtcDestroyProgram", *prog);
  free_program_parts(p);
  p->destroyed = 1;
  *prog = NULL;
  return leave_nvrtc(NVRTC_SUCCESS);
}

/* ------------------------------------------------------------------------ */
/* The table                                                                  */
/* ------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------ */
/* Stream capture and graphs                                                  */
/* ------------------------------------------------------------------------ */

static cudaError_t fk_stream_begin_capture(cudaStream_t stream,
                                           enum cudaStreamCaptureMode mode) {
  ENTER_OR_RETURN("cudaStreamBeginCapture", 0);
  if (is_default_stream(stream)) /* the legacy stream cannot capture */
    return leave(cudaErrorStreamCaptureUnsupported);
  struct fstream *s;
  cudaError_t e = resolve_stream("cudaStreamBeginCapture", stream, &s);
  if (e == cudaSuccess)
    e = sticky(s->device);
  if (e != cudaSuccess)
    return leave(e);
  if (mode != cudaStreamCaptureModeGlobal &&
      mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return leave(cudaErrorInvalidValue);
  if (s->capture)
    return leave(cudaErrorIllegalState);
  struct fcapture *c = calloc(1, sizeof *c);
  if (!c)
    return leave(cudaErrorMemoryAllocation);
  c->mode = mode;
  c->id = ++g.capture_ids;
  c->origin = s;
  c->thread = SELF;
  c->device = s->device;
  g.captures =
      grow(g.captures, g.ncaptures, &g.cap_captures, sizeof *g.captures);
  g.captures[g.ncaptures++] = c;
  s->capture = c;
  s->cap_last = s->cap_joined = 0;
  return leave(cudaSuccess);
}

/* Ends capture c: every stream leaves it; the nodes go to a new graph
 * (returned) when `keep`, else are dropped. */
static struct fgraph *capture_finish(struct fcapture *c, int keep) {
  for (size_t i = 0; i < g.nstreams; i++)
    if (g.streams[i]->capture == c)
      g.streams[i]->capture = NULL;
  for (int d = 0; d < MAX_DEVICES; d++) /* a legacy stream that joined */
    if (g.dev[d].legacy.capture == c)
      g.dev[d].legacy.capture = NULL;
  c->ended = 1;
  struct fgraph *gr = NULL;
  if (keep) {
    gr = calloc(1, sizeof *gr);
    if (!gr) {
      fputs("fakecuda: out of host memory\n", stderr);
      abort();
    }
    gr->device = c->device;
    gr->head = c->head;
    gr->nnodes = c->seq;
    g.graphs = grow(g.graphs, g.ngraphs, &g.cap_graphs, sizeof *g.graphs);
    g.graphs[g.ngraphs++] = gr;
  } else {
    free_nodes(c->head);
  }
  c->head = c->tail = NULL;
  return gr;
}

/* As measured: from another thread a capture that did not begin Relaxed
 * ends with cudaErrorStreamCaptureWrongThread and no graph; an
 * invalidated one with cudaErrorStreamCaptureInvalidated; one with work of
 * another stream that the origin never waited for with
 * cudaErrorStreamCaptureUnjoined.  Each ends the capture. */
static cudaError_t fk_stream_end_capture(cudaStream_t stream,
                                         cudaGraph_t *graph) {
  struct fstream *s;
  ENTER_ON_STREAM_OR_RETURN("cudaStreamEndCapture", stream, 0, &s);
  if (!graph)
    return leave(cudaErrorInvalidValue);
  *graph = NULL;
  struct fcapture *c = s->capture;
  if (!c)
    return leave(cudaErrorIllegalState);
  if (c->origin != s)
    return leave(cudaErrorStreamCaptureUnmatched);
  cudaError_t e = cudaSuccess;
  if (c->thread != SELF && c->mode != cudaStreamCaptureModeRelaxed)
    e = cudaErrorStreamCaptureWrongThread;
  else if (c->invalidated)
    e = cudaErrorStreamCaptureInvalidated;
  else
    for (size_t i = 0; i < g.nstreams; i++) {
      struct fstream *t = g.streams[i];
      if (t->capture == c && t != s && t->cap_last > t->cap_joined)
        e = cudaErrorStreamCaptureUnjoined;
    }
  struct fgraph *gr = capture_finish(c, e == cudaSuccess);
  if (gr)
    *graph = (cudaGraph_t)(void *)gr;
  return leave(e);
}

static cudaError_t
fk_stream_is_capturing(cudaStream_t stream,
                       enum cudaStreamCaptureStatus *status) {
  ENTER_OR_RETURN("cudaStreamIsCapturing", 0);
  struct fstream *s;
  cudaError_t e = resolve_stream("cudaStreamIsCapturing", stream, &s);
  if (e != cudaSuccess)
    return leave(e);
  if (!status)
    return leave(cudaErrorInvalidValue);
  *status = cudaStreamCaptureStatusNone;
  if (s->builtin) /* answers, and invalidates nothing */
    return leave(legacy_call(s, 0));
  if (s->capture)
    *status = s->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                      : cudaStreamCaptureStatusActive;
  return leave(cudaSuccess);
}

/* The capture's status and id; the rest of what the runtime reports (its
 * graph, dependencies) is not modelled: NULL and 0. */
static cudaError_t fk_stream_get_capture_info(
    cudaStream_t stream, enum cudaStreamCaptureStatus *status,
    unsigned long long *id, cudaGraph_t *graph,
    const cudaGraphNode_t **dependencies, const cudaGraphEdgeData **edge_data,
    size_t *ndependencies) {
  ENTER_OR_RETURN("cudaStreamGetCaptureInfo", 0);
  struct fstream *s;
  cudaError_t e = resolve_stream("cudaStreamGetCaptureInfo", stream, &s);
  if (e != cudaSuccess)
    return leave(e);
  if (!status)
    return leave(cudaErrorInvalidValue);
  *status = cudaStreamCaptureStatusNone;
  if (s->builtin) /* as cudaStreamIsCapturing */
    return leave(legacy_call(s, 0));
  if (s->capture) {
    *status = s->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                      : cudaStreamCaptureStatusActive;
    if (id) /* as a GPU: no id for an invalidated capture */
      *id = s->capture->invalidated ? 0 : s->capture->id;
  }
  if (graph)
    *graph = NULL;
  if (dependencies)
    *dependencies = NULL;
  if (edge_data)
    *edge_data = NULL;
  if (ndependencies)
    *ndependencies = 0;
  return leave(cudaSuccess);
}

static cudaError_t
fk_thread_exchange_stream_capture_mode(enum cudaStreamCaptureMode *mode) {
  ENTER_OR_RETURN("cudaThreadExchangeStreamCaptureMode", 0);
  if (!mode || (*mode != cudaStreamCaptureModeGlobal &&
                *mode != cudaStreamCaptureModeThreadLocal &&
                *mode != cudaStreamCaptureModeRelaxed))
    return leave(cudaErrorInvalidValue);
  enum cudaStreamCaptureMode old = t_capture_mode;
  t_capture_mode = *mode;
  *mode = old;
  return leave(cudaSuccess);
}

static struct fgraph *resolve_graph(const char *fn, cudaGraph_t h) {
  for (size_t i = 0; i < g.ngraphs; i++)
    if (g.graphs[i] == (struct fgraph *)(void *)h) {
      if (g.graphs[i]->destroyed)
        violation("%s of graph %p after it was destroyed", fn, (void *)h);
      return g.graphs[i];
    }
  violation("%s of %p, which is not a graph", fn, (void *)h);
}

static struct fexec *resolve_exec(const char *fn, cudaGraphExec_t h) {
  for (size_t i = 0; i < g.nexecs; i++)
    if (g.execs[i] == (struct fexec *)(void *)h) {
      if (g.execs[i]->destroyed)
        violation("%s of executable graph %p after it was destroyed", fn,
                  (void *)h);
      return g.execs[i];
    }
  violation("%s of %p, which is not an executable graph", fn, (void *)h);
}

/* A copy of a list of nodes, launches with their argument values. */
static struct fop *copy_nodes(const struct fop *o, size_t *n) {
  struct fop *head = NULL, **tail = &head;
  *n = 0;
  for (; o; o = o->next) {
    struct fop *c = new_op(o->kind);
    *c = *o;
    c->next = NULL;
    if (o->kind == OP_LAUNCH) {
      size_t bytes = o->kernel->argbytes ? o->kernel->argbytes : 1;
      c->staging = xrealloc(NULL, bytes);
      memcpy(c->staging, o->staging, bytes);
      o->kernel->lib->graph_nodes++;
    }
    *tail = c;
    tail = &c->next;
    ++*n;
  }
  return head;
}

static cudaError_t fk_graph_instantiate(cudaGraphExec_t *exec,
                                        cudaGraph_t graph,
                                        unsigned long long flags) {
  ENTER_OR_RETURN("cudaGraphInstantiate", 0);
  if (!exec)
    return leave(cudaErrorInvalidValue);
  struct fgraph *gr = resolve_graph("cudaGraphInstantiate", graph);
  if (flags & ~(unsigned long long)(cudaGraphInstantiateFlagAutoFreeOnLaunch |
                                    cudaGraphInstantiateFlagUpload |
                                    cudaGraphInstantiateFlagUseNodePriority))
    return leave(cudaErrorInvalidValue);
  cudaError_t e = sticky(gr->device);
  if (e != cudaSuccess)
    return leave(e);
  struct fexec *x = calloc(1, sizeof *x);
  if (!x)
    return leave(cudaErrorMemoryAllocation);
  x->device = gr->device;
  x->head = copy_nodes(gr->head, &x->nnodes);
  g.execs = grow(g.execs, g.nexecs, &g.cap_execs, sizeof *g.execs);
  g.execs[g.nexecs++] = x;
  *exec = (cudaGraphExec_t)(void *)x;
  return leave(cudaSuccess);
}

/* Runs (or, discarding, drops) one queued launch of an executable graph:
 * its nodes in order, each checked as the same work queued on a stream
 * would be.  The last launch of a destroyed executable graph frees it. */
static void exec_graph(struct fop *o, int discard) {
  struct fexec *x = o->exec;
  if (!discard) {
    log_add("exec:cudaGraphLaunch");
    const struct frecord *r = o->records;
    for (struct fop *n = x->head; n; n = n->next) {
      if (n->kind == OP_LAUNCH) {
        exec_launch(n);
      } else if (n->kind == OP_WAIT_EXTERNAL) {
        if (n->event->destroyed)
          violation("a graph's event wait node waits for event %p, which "
                    "was destroyed",
                    (void *)n->event);
        if (r->stream)
          run_stream_to(r->stream, r->pos);
        r++;
        log_add("exec:cudaStreamWaitEvent");
      } else {
        exec_op(n);
      }
    }
  }
  if (--x->pending == 0 && x->destroyed) {
    free_nodes(x->head);
    x->head = NULL;
  }
}

/* Launches of one executable graph run one after another, in the order
 * they were made, whatever their streams (as measured). */
static cudaError_t fk_graph_launch(cudaGraphExec_t exec, cudaStream_t stream) {
  struct fstream *s;
  ENTER_ON_STREAM_OR_RETURN("cudaGraphLaunch", stream, 0, &s);
  struct fexec *x = resolve_exec("cudaGraphLaunch", exec);
  if (x->device != s->device)
    return leave(cudaErrorInvalidValue);
  if (s->capture) {
    s->capture->invalidated = 1;
    return leave(cudaErrorStreamCaptureUnsupported);
  }
  cudaError_t e = sticky(s->device);
  if (e != cudaSuccess)
    return leave(e);
  /* Each event wait node waits for its event's record as it is now, as
   * cudaStreamWaitEvent does, not for a later one (measured): so no wait
   * is for a position to come, and no cycle can arise. */
  struct fop *o = new_op(OP_GRAPH);
  o->exec = x;
  size_t nwaits = 0;
  for (const struct fop *n = x->head; n; n = n->next)
    nwaits += n->kind == OP_WAIT_EXTERNAL;
  if (nwaits && !(o->records = calloc(nwaits, sizeof *o->records))) {
    free_op(o);
    return leave(cudaErrorMemoryAllocation);
  }
  struct frecord *r = o->records;
  for (const struct fop *n = x->head; n; n = n->next)
    if (n->kind == OP_WAIT_EXTERNAL) {
      const struct fevent *ev = n->event;
      if (ev->recorded && !ev->capture)
        *r = (struct frecord){ev->stream, ev->pos};
      r++;
    }
  for (size_t i = 0; i < g.nstreams; i++) /* after its earlier launches */
    for (struct fop *p = g.streams[i]->head; p; p = p->next)
      if (p->kind == OP_GRAPH && p->exec == x && g.streams[i] != s)
        push_wait(s, OP_IMPLICIT_WAIT, g.streams[i], g.streams[i]->enqueued);
  struct fstream *legacy = &g.dev[s->device].legacy;
  for (struct fop *p = legacy->head; p; p = p->next)
    if (p->kind == OP_GRAPH && p->exec == x && legacy != s)
      push_wait(s, OP_IMPLICIT_WAIT, legacy, legacy->enqueued);
  x->pending++;
  return leave(enqueue(s, o));
}

/* Destroying an executable graph with launches queued is legal: they
 * still run, and it is freed after the last (as measured).  A potentially
 * unsafe call during a capture. */
static cudaError_t fk_graph_exec_destroy(cudaGraphExec_t exec) {
  ENTER_OR_RETURN("cudaGraphExecDestroy", 0);
  UNSAFE_OR_RETURN();
  struct fexec *x = resolve_exec("cudaGraphExecDestroy", exec);
  x->destroyed = 1;
  if (x->pending && sticky(x->device))
    run_device(x->device); /* a dead device's queues: discarded now */
  if (!x->pending) {
    free_nodes(x->head);
    x->head = NULL;
  }
  return leave(cudaSuccess);
}

/* A graph and the executable graphs made of it are independent. */
static cudaError_t fk_graph_destroy(cudaGraph_t graph) {
  ENTER_OR_RETURN("cudaGraphDestroy", 0);
  struct fgraph *gr = resolve_graph("cudaGraphDestroy", graph);
  gr->destroyed = 1;
  free_nodes(gr->head);
  gr->head = NULL;
  return leave(cudaSuccess);
}

FAKE_EXPORT const struct cs_cuda cs_cuda_table = {
    .get_device_count = fk_get_device_count,
    .driver_get_version = fk_driver_get_version,
    .runtime_get_version = fk_runtime_get_version,
    .get_device_properties = fk_get_device_properties,
    .device_get_attribute = fk_device_get_attribute,
    .get_device = fk_get_device,
    .set_device = fk_set_device,
    .device_can_access_peer = fk_device_can_access_peer,
    .device_enable_peer_access = fk_device_enable_peer_access,
    .device_get_mem_pool = fk_device_get_mem_pool,
    .mem_pool_set_access = fk_mem_pool_set_access,
    .device_synchronize = fk_device_synchronize,
    .device_get_stream_priority_range = fk_device_get_stream_priority_range,
    .get_last_error = fk_get_last_error,
    .get_error_name = fk_get_error_name,
    .get_error_string = fk_get_error_string,
    .get_driver_entry_point = fk_get_driver_entry_point,
    .stream_create = fk_stream_create,
    .stream_destroy = fk_stream_destroy,
    .stream_synchronize = fk_stream_synchronize,
    .stream_query = fk_stream_query,
    .stream_get_device = fk_stream_get_device,
    .pointer_get_attributes = fk_pointer_get_attributes,
    .stream_wait_event = fk_stream_wait_event,
    .event_create = fk_event_create,
    .event_destroy = fk_event_destroy,
    .event_record = fk_event_record,
    .event_synchronize = fk_event_synchronize,
    .event_query = fk_event_query,
    .event_elapsed_time = fk_event_elapsed_time,
    .malloc_async = fk_malloc_async,
    .free_async = fk_free_async,
    .malloc_host = fk_malloc_host,
    .free_host = fk_free_host,
    .malloc_managed = fk_malloc_managed,
    .free = fk_free,
    .memcpy_async = fk_memcpy_async,
    .memcpy_peer_async = fk_memcpy_peer_async,
    .memset_async = fk_memset_async,
    .library_load_data = fk_library_load_data,
    .library_load_file = fk_library_load_file,
    .library_unload = fk_library_unload,
    .library_get_kernel = fk_library_get_kernel,
    .func_get_param_info = fk_func_get_param_info,
    .func_get_attributes = fk_func_get_attributes,
    .kernel_set_attribute_for_device = fk_kernel_set_attribute_for_device,
    .occupancy_max_active_blocks = fk_occupancy_max_active_blocks,
    .launch_kernel = fk_launch_kernel,
    .occupancy_max_active_clusters = fk_occupancy_max_active_clusters,
    .launch_kernel_ex = fk_launch_kernel_ex,
    .stream_begin_capture = fk_stream_begin_capture,
    .stream_end_capture = fk_stream_end_capture,
    .stream_is_capturing = fk_stream_is_capturing,
    .stream_get_capture_info = fk_stream_get_capture_info,
    .thread_exchange_stream_capture_mode =
        fk_thread_exchange_stream_capture_mode,
    .graph_instantiate = fk_graph_instantiate,
    .graph_launch = fk_graph_launch,
    .graph_exec_destroy = fk_graph_exec_destroy,
    .graph_destroy = fk_graph_destroy,
    .nvrtc_create_program = fk_nvrtc_create_program,
    .nvrtc_compile_program = fk_nvrtc_compile_program,
    .nvrtc_get_program_log_size = fk_nvrtc_get_program_log_size,
    .nvrtc_get_program_log = fk_nvrtc_get_program_log,
    .nvrtc_get_cubin_size = fk_nvrtc_get_cubin_size,
    .nvrtc_get_cubin = fk_nvrtc_get_cubin,
    .nvrtc_destroy_program = fk_nvrtc_destroy_program,
    .nvrtc_get_error_string = fk_nvrtc_get_error_string,
};

/* ------------------------------------------------------------------------ */
/* Control API (fakecuda.h)                                                   */
/* ------------------------------------------------------------------------ */

static size_t count_allocations(int device) {
  size_t n = 0;
  for (struct falloc *a = g.live; a; a = a->next)
    if (device < 0 || a->device == device)
      n++;
  return n;
}

static size_t count_graphs(int device) {
  size_t n = 0;
  for (size_t i = 0; i < g.ngraphs; i++)
    if ((device < 0 || g.graphs[i]->device == device) &&
        !g.graphs[i]->destroyed)
      n++;
  return n;
}

/* An executable graph counts as alive until destroyed and its last queued
 * launch has run. */
static size_t count_execs(int device) {
  size_t n = 0;
  for (size_t i = 0; i < g.nexecs; i++)
    if ((device < 0 || g.execs[i]->device == device) &&
        (!g.execs[i]->destroyed || g.execs[i]->pending))
      n++;
  return n;
}

static size_t count_captures(int device) {
  size_t n = 0;
  for (size_t i = 0; i < g.ncaptures; i++)
    if ((device < 0 || g.captures[i]->device == device) &&
        capture_active(g.captures[i]))
      n++;
  return n;
}

static size_t count_streams(int device) {
  size_t n = 0;
  for (size_t i = 0; i < g.nstreams; i++)
    if ((device < 0 || g.streams[i]->device == device) &&
        stream_alive(g.streams[i]))
      n++;
  return n;
}

static size_t count_libraries(int device) {
  size_t n = 0;
  for (size_t i = 0; i < g.nlibraries; i++)
    if ((device < 0 || g.libraries[i]->device == device) &&
        !g.libraries[i]->unloaded)
      n++;
  return n;
}

static size_t count_events(int device) {
  size_t n = 0;
  for (size_t i = 0; i < g.nevents; i++)
    if ((device < 0 || g.events[i]->device == device) &&
        !g.events[i]->destroyed)
      n++;
  return n;
}

FAKE_EXPORT void fake_set_driver(enum fake_driver state) {
  if (state != FAKE_DRIVER_OK && state != FAKE_DRIVER_MISSING &&
      state != FAKE_DRIVER_NO_DEVICE)
    misuse("fake_set_driver(%d): unknown state", (int)state);
  lock();
  g.driver = state;
  unlock();
}

FAKE_EXPORT void fake_set_vmm(int offered) {
  lock();
  g.vmm = offered != 0;
  unlock();
}

FAKE_EXPORT void fake_set_driver_launch(int offered) {
  lock();
  g.driver_launch = offered != 0;
  unlock();
}

FAKE_EXPORT void fake_set_peer_access(int allowed) {
  lock();
  g.peer_ok = allowed != 0;
  unlock();
}

FAKE_EXPORT int fake_peer_access(int device, int peer) {
  lock();
  int r = 0;
  if (valid_device(device) && valid_device(peer))
    r = (g.dev[device].peers & (1u << peer) ? 1 : 0) |
        (g.dev[peer].pool_peers & (1u << device) ? 2 : 0);
  unlock();
  return r;
}

FAKE_EXPORT void fake_set_device_count(int n) {
  if (n < 0 || n > MAX_DEVICES)
    misuse("fake_set_device_count(%d): not in 0..%d", n, MAX_DEVICES);
  lock();
  g.ndev = n;
  unlock();
}

FAKE_EXPORT void fake_set_managed_supported(int device, int supported) {
  check_control_device("fake_set_managed_supported", device);
  lock();
  g.dev[device].managed = supported != 0;
  unlock();
}

FAKE_EXPORT void fake_set_memory_limit(int device, size_t bytes) {
  check_control_device("fake_set_memory_limit", device);
  lock();
  g.dev[device].limit = bytes;
  unlock();
}

FAKE_EXPORT void fake_fail_after(unsigned long n, cudaError_t err,
                                 int persistent) {
  if (n == 0)
    misuse("fake_fail_after: n must be >= 1 (1 = the next call)");
  if (err == cudaSuccess)
    misuse("fake_fail_after: err must be an error");
  lock();
  g.fail_at = g.calls + n;
  g.fail_err = err;
  g.fail_persistent = persistent != 0;
  unlock();
}

FAKE_EXPORT void fake_fail_clear(void) {
  lock();
  g.fail_at = 0;
  g.fail_err = cudaSuccess;
  g.fail_persistent = 0;
  g.nfail_fn = 0;
  unlock();
}

FAKE_EXPORT void fake_fail_function(const char *name, cudaError_t err) {
  if (!name || strlen(name) >= FAIL_NAME_MAX)
    misuse("fake_fail_function: bad name");
  lock();
  int i;
  for (i = 0; i < g.nfail_fn; i++)
    if (strcmp(g.fail_fn[i].name, name) == 0)
      break;
  if (err == cudaSuccess) { /* 0 stops failing that one function */
    if (i < g.nfail_fn)
      g.fail_fn[i] = g.fail_fn[--g.nfail_fn];
    unlock();
    return;
  }
  if (i == g.nfail_fn) {
    if (g.nfail_fn == MAX_FAIL_FUNCTIONS) {
      unlock();
      misuse("fake_fail_function: more than %d functions", MAX_FAIL_FUNCTIONS);
    }
    strcpy(g.fail_fn[i].name, name);
    g.nfail_fn++;
  }
  g.fail_fn[i].err = err;
  unlock();
}

FAKE_EXPORT unsigned long fake_call_count(void) {
  lock();
  unsigned long n = g.calls;
  unlock();
  return n;
}

FAKE_EXPORT void fake_set_launch_hook(void (*fn)(void *arg), void *arg) {
  pthread_mutex_lock(&hook_lock);
  launch_hook = fn;
  launch_hook_arg = arg;
  pthread_mutex_unlock(&hook_lock);
}

FAKE_EXPORT void fake_set_call_hook(const char *name, void (*fn)(void *arg),
                                    void *arg) {
  lock();
  call_hook_name = fn ? name : NULL;
  call_hook = fn;
  call_hook_arg = arg;
  unlock();
}

FAKE_EXPORT void fake_set_launch_delay(unsigned microseconds) {
  atomic_store(&launch_delay_us, microseconds);
}

FAKE_EXPORT void fake_set_launch_support(int device, int cluster,
                                         int cooperative) {
  check_control_device("fake_set_launch_support", device);
  lock();
  g.dev[device].cluster_launch = cluster != 0;
  g.dev[device].cooperative_launch = cooperative != 0;
  unlock();
}

FAKE_EXPORT void fake_set_compute_capability(int device, int major, int minor) {
  check_control_device("fake_set_compute_capability", device);
  if (major < 1 || minor < 0)
    misuse("fake_set_compute_capability: no compute capability %d.%d", major,
           minor);
  lock();
  g.dev[device].cc_major = major;
  g.dev[device].cc_minor = minor;
  unlock();
}

FAKE_EXPORT void fake_set_cluster_sms(int device, int sms) {
  check_control_device("fake_set_cluster_sms", device);
  if (sms < 1 || sms > SM_COUNT)
    misuse("fake_set_cluster_sms: %d multiprocessors", sms);
  lock();
  g.dev[device].cluster_sms = sms;
  unlock();
}

FAKE_EXPORT size_t fake_last_launch_attrs(cudaLaunchAttribute *dst,
                                          size_t capacity) {
  lock();
  size_t n = g.launch_nattrs;
  if (dst)
    memcpy(dst, g.launch_attrs, (n < capacity ? n : capacity) * sizeof *dst);
  unlock();
  return n;
}

FAKE_EXPORT void fake_last_launch_config(dim3 *grid, dim3 *block,
                                         size_t *shared) {
  lock();
  *grid = g.launch_grid;
  *block = g.launch_block;
  *shared = g.launch_shared;
  unlock();
}

FAKE_EXPORT void fake_set_param_space(size_t bytes) {
  lock();
  g.param_space = bytes;
  unlock();
}

FAKE_EXPORT void fake_set_paused(int paused) {
  lock();
  g.paused = paused != 0;
  unlock();
}

FAKE_EXPORT void fake_set_sticky_error(int device, cudaError_t err) {
  check_control_device("fake_set_sticky_error", device);
  lock();
  g.dev[device].sticky = err;
  unlock();
}

FAKE_EXPORT void fake_set_strict_teardown(int strict) {
  lock();
  g.strict = strict != 0;
  unlock();
}

FAKE_EXPORT size_t fake_log_length(void) {
  lock();
  size_t n = g.log_len;
  unlock();
  return n;
}

FAKE_EXPORT const char *fake_log_entry(size_t i) {
  lock();
  const char *s = i < g.log_len ? g.log[i] : NULL;
  unlock();
  return s;
}

FAKE_EXPORT long fake_log_find(const char *name, size_t from) {
  long found = -1;
  if (!name)
    return -1;
  lock();
  for (size_t i = from; i < g.log_len; i++)
    if (strcmp(g.log[i], name) == 0) {
      found = (long)i;
      break;
    }
  unlock();
  return found;
}

FAKE_EXPORT size_t fake_log_count(const char *name) {
  size_t n = 0;
  if (!name)
    return 0;
  lock();
  for (size_t i = 0; i < g.log_len; i++)
    if (strcmp(g.log[i], name) == 0)
      n++;
  unlock();
  return n;
}

FAKE_EXPORT void fake_log_clear(void) {
  lock();
  log_free();
  unlock();
}

FAKE_EXPORT size_t fake_vmm_fds(void) {
  lock();
  size_t n = 0;
  for (struct fvmm *v = g_vmms; v; v = v->next)
    n += v->fd >= 0;
  unlock();
  return n;
}

FAKE_EXPORT size_t fake_live_vmm_handles(int device) {
  lock();
  size_t n = 0;
  for (struct fvmm *v = g_vmms; v; v = v->next)
    if (!v->released && (device < 0 || v->device == device))
      n++;
  unlock();
  return n;
}

FAKE_EXPORT size_t fake_live_allocations(int device) {
  lock();
  size_t n = count_allocations(device);
  unlock();
  return n;
}

FAKE_EXPORT size_t fake_live_bytes(int device) {
  size_t n = 0;
  lock();
  for (struct falloc *a = g.live; a; a = a->next)
    if (device < 0 || a->device == device)
      n += a->size;
  unlock();
  return n;
}

FAKE_EXPORT cudaStream_t fake_foreign_stream(int device) {
  struct fstream *s = calloc(1, sizeof *s);
  if (!s)
    abort();
  lock();
  s->device = device;
  g.streams = grow(g.streams, g.nstreams, &g.cap_streams, sizeof *g.streams);
  g.streams[g.nstreams++] = s;
  unlock();
  return (cudaStream_t)s;
}

FAKE_EXPORT void fake_foreign_stream_destroy(cudaStream_t stream) {
  lock();
  struct fstream *s = find_stream(stream);
  if (!s)
    violation("fake_foreign_stream_destroy of %p, which is not a stream",
              (void *)stream);
  if (s->destroyed)
    violation("the foreign stream %p was destroyed by someone else",
              (void *)stream);
  s->destroyed = 1;
  run_stream(s);
  unlock();
}

FAKE_EXPORT size_t fake_live_streams(int device) {
  lock();
  size_t n = count_streams(device);
  unlock();
  return n;
}

FAKE_EXPORT size_t fake_live_graphs(int device) {
  lock();
  size_t n = count_graphs(device);
  unlock();
  return n;
}

FAKE_EXPORT size_t fake_live_graph_execs(int device) {
  lock();
  size_t n = count_execs(device);
  unlock();
  return n;
}

FAKE_EXPORT size_t fake_live_captures(int device) {
  lock();
  size_t n = count_captures(device);
  unlock();
  return n;
}

FAKE_EXPORT size_t fake_live_events(int device) {
  lock();
  size_t n = count_events(device);
  unlock();
  return n;
}

FAKE_EXPORT size_t fake_live_libraries(int device) {
  lock();
  size_t n = count_libraries(device);
  unlock();
  return n;
}

FAKE_EXPORT size_t fake_live_programs(void) {
  size_t n = 0;
  lock();
  for (size_t i = 0; i < g.nprograms; i++)
    if (!g.programs[i]->destroyed)
      n++;
  unlock();
  return n;
}

FAKE_EXPORT const char *fake_last_nvrtc_options(void) {
  lock();
  const char *s = g.nvrtc_options ? g.nvrtc_options : "";
  unlock();
  return s;
}

FAKE_EXPORT size_t fake_last_launch_args(void *dst, size_t capacity) {
  lock();
  size_t n = g.launch_args_size;
  if (dst && g.launch_args)
    memcpy(dst, g.launch_args, n < capacity ? n : capacity);
  unlock();
  return n;
}

FAKE_EXPORT int fake_primary_ctx_refcount(int device) {
  check_control_device("fake_primary_ctx_refcount", device);
  lock();
  int n = g.dev[device].ctx_refs;
  unlock();
  return n;
}

FAKE_EXPORT int fake_torn_down(void) {
  lock();
  int t = g.torn_down;
  unlock();
  return t;
}

FAKE_EXPORT void fake_teardown_now(void) {
  lock();
  teardown_locked();
  unlock();
}

FAKE_EXPORT void fake_reset(void) {
  lock();
  free_everything();
  free_call_records();
  set_defaults();
  g.torn_down = 0; /* the atexit registration, though, stays */
  t_device = 0;
  t_last_error = cudaSuccess;
  t_capture_mode = cudaStreamCaptureModeGlobal;
  unlock();
}
