/* fakecuda.c -- a fake CUDA runtime for the test suite (see fakecuda.h).
 *
 * The test build links the library's sources with this file instead of
 * lib/cuda_real.c, so `cs_cu` below is the only CUDA the library sees.  It
 * includes the CUDA headers for their types only and calls no CUDA function.
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

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

enum alloc_kind { KIND_DEVICE, KIND_PINNED, KIND_MANAGED };
enum alloc_state { ALLOC_LIVE, ALLOC_FREE_PENDING, ALLOC_FREED };

struct falloc {
  struct falloc *prev, *next; /* in the live list, or the quarantine */
  unsigned char *base;
  size_t size;
  int device;
  enum alloc_kind kind;
  enum alloc_state state;
};

enum op_kind {
  OP_COPY,
  OP_PEER_COPY,
  OP_SET,
  OP_FREE,
  OP_WAIT,         /* cudaStreamWaitEvent */
  OP_IMPLICIT_WAIT /* the legacy default stream's implicit synchronization */
};

struct fstream;

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
  void *staging; /* OP_COPY from pageable memory: the bytes taken at the call */
};

struct fstream {
  int device;
  unsigned int flags;
  int priority;
  int builtin;   /* a device's legacy default stream (stream 0) */
  int destroyed; /* cudaStreamDestroy was called; may still be draining */
  int running;   /* guards against re-entering this stream's queue */
  uint64_t enqueued; /* operations ever queued: the position of the last */
  uint64_t done;     /* operations completed (run or discarded) */
  struct fop *head, *tail;
};

struct fevent {
  int device;
  unsigned int flags;
  int destroyed;
  int recorded;
  struct fstream *stream; /* where and at which position it was recorded */
  uint64_t pos;
  uint64_t stamp; /* the device's clock at the record, for elapsed time */
};

struct fdevice {
  int managed;        /* managed memory supported */
  size_t limit;       /* bytes that live allocations may hold */
  size_t bytes;       /* bytes held by live and free-pending allocations */
  cudaError_t sticky; /* 0, or the error every call on the device returns */
  int ctx_refs;       /* primary context retains */
  uint64_t clock;     /* counts queued operations and records */
  struct fstream legacy;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_initialized;

static struct {
  enum fake_driver driver;
  int ndev;
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

  struct fdevice dev[MAX_DEVICES];
} g;

static _Thread_local int t_device;            /* cudaSetDevice */
static _Thread_local cudaError_t t_last_error; /* cudaGetLastError */

/* A distinct non-NULL address per device to hand out as its CUcontext. */
static char g_ctx_token[MAX_DEVICES];

/* ------------------------------------------------------------------------ */
/* Failing the test                                                           */
/* ------------------------------------------------------------------------ */

static void violation(const char *fmt, ...)
    __attribute__((noreturn, format(printf, 1, 2)));
static void violation(const char *fmt, ...)
{
  va_list ap;
  fputs("fakecuda: VIOLATION: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
  abort();
}

/* A test used the control API wrongly: as fatal, but not the library's
 * fault, so it says so. */
static void misuse(const char *fmt, ...)
    __attribute__((noreturn, format(printf, 1, 2)));
static void misuse(const char *fmt, ...)
{
  va_list ap;
  fputs("fakecuda: misuse of the control API: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
  abort();
}

static void *xrealloc(void *p, size_t n)
{
  void *q = realloc(p, n);
  if (!q) {
    fputs("fakecuda: out of host memory\n", stderr);
    abort();
  }
  return q;
}

static const char *plural(size_t n) { return n == 1 ? "" : "s"; }

/* ------------------------------------------------------------------------ */
/* Defaults, locking                                                          */
/* ------------------------------------------------------------------------ */

static void set_defaults(void)
{
  g.driver = FAKE_DRIVER_OK;
  g.ndev = DEFAULT_DEVICES;
  g.paused = 0;
  g.strict = 1;
  g.calls = 0;
  g.fail_at = 0;
  g.fail_err = cudaSuccess;
  g.fail_persistent = 0;
  g.nfail_fn = 0;
  for (int i = 0; i < MAX_DEVICES; i++) {
    struct fdevice *d = &g.dev[i];
    memset(d, 0, sizeof *d);
    d->managed = 1;
    d->limit = DEFAULT_MEMORY_LIMIT;
    d->legacy.device = i;
    d->legacy.builtin = 1;
  }
  g_initialized = 1;
}

static void lock(void)
{
  pthread_mutex_lock(&g_lock);
  if (!g_initialized)
    set_defaults();
}

static void unlock(void) { pthread_mutex_unlock(&g_lock); }

static int valid_device(int d) { return d >= 0 && d < g.ndev; }

static void check_control_device(const char *fn, int device)
{
  if (device < 0 || device >= MAX_DEVICES)
    misuse("%s: device %d is not in 0..%d", fn, device, MAX_DEVICES - 1);
}

/* ------------------------------------------------------------------------ */
/* Log                                                                        */
/* ------------------------------------------------------------------------ */

static void log_add(const char *entry)
{
  if (g.log_len == g.log_cap) {
    g.log_cap = g.log_cap ? 2 * g.log_cap : 256;
    g.log = xrealloc(g.log, g.log_cap * sizeof *g.log);
  }
  g.log[g.log_len++] = entry;
}

static void log_free(void)
{
  free(g.log);
  g.log = NULL;
  g.log_len = g.log_cap = 0;
}

/* ------------------------------------------------------------------------ */
/* Teardown and the common prologue of every call                            */
/* ------------------------------------------------------------------------ */

static void free_op(struct fop *o)
{
  free(o->staging);
  free(o);
}

static void free_ops(struct fstream *s)
{
  struct fop *o = s->head;
  while (o) {
    struct fop *next = o->next;
    free_op(o);
    o = next;
  }
  s->head = s->tail = NULL;
}

/* Drops every object and allocation without any check: what the real
 * runtime does at its teardown, and what fake_reset() promises.  Settings
 * (device count, limits, faults, ...) and the log are left alone. */
static void free_everything(void)
{
  struct falloc *a = g.live;
  while (a) {
    struct falloc *next = a->next;
    free(a->base);
    free(a);
    a = next;
  }
  g.live = NULL;
  a = g.quar_head;
  while (a) {
    struct falloc *next = a->next;
    free(a->base);
    free(a);
    a = next;
  }
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

  for (int i = 0; i < MAX_DEVICES; i++) {
    struct fdevice *d = &g.dev[i];
    free_ops(&d->legacy);
    d->legacy.enqueued = d->legacy.done = 0;
    d->legacy.running = 0;
    d->bytes = 0;
    d->ctx_refs = 0;
    d->clock = 0;
  }
}

static void teardown_locked(void)
{
  if (g.torn_down)
    return;
  free_everything();
  g.torn_down = 1;
}

/* Registered with atexit() at the first call, as the real runtime does, so
 * that handlers registered after that call run before it and handlers
 * registered before it run after it. */
static void teardown_atexit(void) { fake_teardown_now(); }

/* The log survives the teardown (tests of the behaviour after it read it),
 * so it is freed last, after every atexit handler has run: ELF destructors
 * run after them. */
__attribute__((destructor)) static void fake_fini(void)
{
  pthread_mutex_lock(&g_lock);
  log_free();
  pthread_mutex_unlock(&g_lock);
}

enum { NO_DRIVER_CHECK = 0, DRIVER_CHECK = 1 };

static cudaError_t driver_error(void)
{
  if (g.driver == FAKE_DRIVER_MISSING)
    return cudaErrorInsufficientDriver;
  if (g.driver == FAKE_DRIVER_NO_DEVICE || g.ndev == 0)
    return cudaErrorNoDevice;
  return cudaSuccess;
}

static cudaError_t injected_fault(const char *name)
{
  if (g.fail_at != 0 &&
      (g.calls == g.fail_at || (g.fail_persistent && g.calls > g.fail_at)))
    return g.fail_err;
  for (int i = 0; i < g.nfail_fn; i++)
    if (strcmp(g.fail_fn[i].name, name) == 0)
      return g.fail_fn[i].err;
  return cudaSuccess;
}

/* Locks, counts and logs the call, then applies the teardown, fault
 * injection and (with DRIVER_CHECK) the driver state.  Whatever it returns,
 * the caller must end through leave() or leave_driver(). */
static cudaError_t begin(const char *name, int flags)
{
  lock();
  if (!g.atexit_registered) {
    g.atexit_registered = 1;
    atexit(teardown_atexit);
  }
  g.calls++;
  log_add(name);
  if (g.torn_down) {
    if (g.strict)
      violation("%s called after the CUDA runtime was torn down", name);
    return cudaErrorCudartUnloading;
  }
  cudaError_t e = injected_fault(name);
  if (e != cudaSuccess)
    return e;
  if (flags & DRIVER_CHECK)
    return driver_error();
  return cudaSuccess;
}

/* Runtime calls remember their last error per thread, as the runtime does
 * for cudaGetLastError; cudaErrorNotReady is not an error there. */
static cudaError_t leave(cudaError_t e)
{
  if (e != cudaSuccess && e != cudaErrorNotReady)
    t_last_error = e;
  unlock();
  return e;
}

/* Driver calls have no "last error".  Runtime codes (an injected fault,
 * the driver state, error 4 after teardown) become CUresults of the same
 * number: the common ones coincide. */
static CUresult leave_driver(int e)
{
  unlock();
  return (CUresult)e;
}

/* The current device, or cudaErrorInvalidDevice if the device count was
 * lowered below it. */
static cudaError_t current_device(int *out)
{
  if (!valid_device(t_device))
    return cudaErrorInvalidDevice;
  *out = t_device;
  return cudaSuccess;
}

static cudaError_t sticky(int device) { return g.dev[device].sticky; }

/* ------------------------------------------------------------------------ */
/* Allocations                                                                */
/* ------------------------------------------------------------------------ */

static const char *kind_name(enum alloc_kind k)
{
  switch (k) {
  case KIND_DEVICE:
    return "device";
  case KIND_PINNED:
    return "pinned host";
  case KIND_MANAGED:
    return "managed";
  }
  return "?";
}

static cudaError_t allocate(void **out, size_t size, int device,
                            enum alloc_kind kind)
{
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
static struct falloc *find_live_base(const void *p)
{
  for (struct falloc *a = g.live; a; a = a->next)
    if (a->base == p)
      return a;
  return NULL;
}

/* Whether [p, p + n) and a's memory, guard zone included, intersect. */
static int overlaps(const struct falloc *a, uintptr_t p, size_t n)
{
  uintptr_t b = (uintptr_t)a->base;
  uintptr_t e = b + a->size + GUARD_BYTES;
  return p < e && p + (n ? n : 1) > b;
}

static void quarantine_evict_oldest(void)
{
  struct falloc *a = g.quar_head;
  g.quar_head = a->next;
  if (g.quar_head)
    g.quar_head->prev = NULL;
  else
    g.quar_tail = NULL;
  g.quar_bytes -= a->size;
  g.quar_count--;
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
static void free_now(struct falloc *a)
{
  for (size_t i = 0; i < GUARD_BYTES; i++)
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
  g.dev[a->device].bytes -= a->size;

  a->state = ALLOC_FREED;
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
static void check_access(const char *op, const void *ptr, size_t n)
{
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

/* ------------------------------------------------------------------------ */
/* Streams and their queues                                                   */
/* ------------------------------------------------------------------------ */

static int stream_pending(const struct fstream *s)
{
  return s->done < s->enqueued;
}

/* A stream counts as alive until it is destroyed and its queue drained. */
static int stream_alive(const struct fstream *s)
{
  return !s->destroyed || stream_pending(s);
}

static void run_stream_to(struct fstream *s, uint64_t pos);

static void exec_op(struct fop *o)
{
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
  }
}

/* A dead (sticky) device does not run its queued work.  The memory of a
 * queued free is released all the same, as when the driver tears down the
 * broken context; it is logged as executed since the free did happen. */
static void discard_op(struct fop *o)
{
  if (o->kind == OP_FREE) {
    free_now(o->alloc);
    log_add("exec:cudaFreeAsync");
  }
}

/* Runs (or, on a sticky device, discards) s's queue up to position pos.
 * Waits are captured positions in the past, so no cycle can arise; the
 * `running` guard is only a safety net against re-entering a queue. */
static void run_stream_to(struct fstream *s, uint64_t pos)
{
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
static void run_device(int device)
{
  run_stream(&g.dev[device].legacy);
  for (size_t i = 0; i < g.nstreams; i++)
    if (g.streams[i]->device == device)
      run_stream(g.streams[i]);
}

static void run_all_devices(void)
{
  for (int d = 0; d < MAX_DEVICES; d++)
    run_device(d);
}

static struct fop *new_op(enum op_kind kind)
{
  struct fop *o = calloc(1, sizeof *o);
  if (!o) {
    fputs("fakecuda: out of host memory\n", stderr);
    abort();
  }
  o->kind = kind;
  return o;
}

static void push_op(struct fstream *s, struct fop *o)
{
  o->next = NULL;
  if (s->tail)
    s->tail->next = o;
  else
    s->head = o;
  s->tail = o;
  s->enqueued++;
  g.dev[s->device].clock++;
}

static void push_wait(struct fstream *s, enum op_kind kind,
                      struct fstream *on, uint64_t pos)
{
  struct fop *o = new_op(kind);
  o->wait_on = on;
  o->wait_pos = pos;
  push_op(s, o);
}

/* The legacy default stream's implicit synchronization: work on it waits
 * for all earlier work of the device's blocking streams, and work on a
 * blocking stream waits for earlier work on it.  Modelled as wait
 * operations that are not logged. */
static void implicit_deps(struct fstream *s)
{
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

/* Queues o on s, after the implicit dependencies, and runs it at once
 * unless the fake is paused. */
static void enqueue(struct fstream *s, struct fop *o)
{
  implicit_deps(s);
  push_op(s, o);
  if (!g.paused)
    run_stream(s);
}

static struct fstream *find_stream(cudaStream_t h)
{
  for (size_t i = 0; i < g.nstreams; i++)
    if (g.streams[i] == (struct fstream *)h)
      return g.streams[i];
  return NULL;
}

static int is_default_stream(cudaStream_t h)
{
  /* Both special handles mean the current device's built-in stream here;
   * the fake does not model a separate per-thread default stream. */
  return h == NULL || h == cudaStreamLegacy || h == cudaStreamPerThread;
}

/* Resolves a stream argument; an unknown or destroyed stream is a
 * VIOLATION. */
static cudaError_t resolve_stream(const char *fn, cudaStream_t h,
                                  struct fstream **out)
{
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

static struct fevent *find_event(cudaEvent_t h)
{
  for (size_t i = 0; i < g.nevents; i++)
    if (g.events[i] == (struct fevent *)h)
      return g.events[i];
  return NULL;
}

static struct fevent *resolve_event(const char *fn, cudaEvent_t h)
{
  struct fevent *ev = find_event(h);
  if (!ev)
    violation("%s on event %p, which is not an event", fn, (void *)h);
  if (ev->destroyed)
    violation("%s on event %p after it was destroyed", fn, (void *)h);
  return ev;
}

/* Whether ev's record has been reached; an event never recorded has. */
static int event_complete(const struct fevent *ev)
{
  return !ev->recorded || ev->stream->done >= ev->pos;
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
    {301, "cudaErrorFileNotFound", "file not found"},
    {400, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {500, "cudaErrorSymbolNotFound", "named symbol not found"},
    {600, "cudaErrorNotReady", "device not ready"},
    {700, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {701, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {702, "cudaErrorLaunchTimeout",
     "the launch timed out and was terminated"},
    {709, "cudaErrorContextIsDestroyed", "context is destroyed"},
    {710, "cudaErrorAssert", "device-side assert triggered"},
    {714, "cudaErrorHardwareStackError", "hardware stack error"},
    {715, "cudaErrorIllegalInstruction",
     "an illegal instruction was encountered"},
    {716, "cudaErrorMisalignedAddress", "misaligned address"},
    {719, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {800, "cudaErrorNotPermitted", "operation not permitted"},
    {801, "cudaErrorNotSupported", "operation not supported"},
    {999, "cudaErrorUnknown", "unknown error"},
};

static const char *fk_get_error_name(cudaError_t err)
{
  for (size_t i = 0; i < sizeof error_table / sizeof *error_table; i++)
    if (error_table[i].code == (int)err)
      return error_table[i].name;
  return "unrecognized error code";
}

static const char *fk_get_error_string(cudaError_t err)
{
  for (size_t i = 0; i < sizeof error_table / sizeof *error_table; i++)
    if (error_table[i].code == (int)err)
      return error_table[i].text;
  return "unrecognized error code";
}

/* ------------------------------------------------------------------------ */
/* Devices and runtime                                                        */
/* ------------------------------------------------------------------------ */

static cudaError_t fk_get_device_count(int *count)
{
  cudaError_t e = begin("cudaGetDeviceCount", DRIVER_CHECK);
  if (e == cudaSuccess && !count)
    e = cudaErrorInvalidValue;
  if (count)
    *count = e == cudaSuccess ? g.ndev : 0;
  return leave(e);
}

/* Unlike the rest, the two version queries work without a driver, as the
 * real ones do: the driver version is then 0. */
static cudaError_t fk_driver_get_version(int *version)
{
  cudaError_t e = begin("cudaDriverGetVersion", NO_DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave(e);
  if (!version)
    return leave(cudaErrorInvalidValue);
  *version = g.driver == FAKE_DRIVER_MISSING ? 0 : FAKE_DRIVER_VERSION;
  return leave(cudaSuccess);
}

static cudaError_t fk_runtime_get_version(int *version)
{
  cudaError_t e = begin("cudaRuntimeGetVersion", NO_DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave(e);
  if (!version)
    return leave(cudaErrorInvalidValue);
  *version = FAKE_RUNTIME_VERSION;
  return leave(cudaSuccess);
}

/* The one description of a fake device, for both properties and
 * attributes.  Its total memory follows the device's memory limit, so that
 * the library's own size checks and the fake agree. */
static void fill_properties(struct cudaDeviceProp *p, int dev)
{
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
  p->major = 9;
  p->minor = 0;
  p->textureAlignment = 512;
  p->multiProcessorCount = 132;
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
  p->cooperativeLaunch = 1;
  p->sharedMemPerBlockOptin = 227 * 1024;
  p->maxBlocksPerMultiProcessor = 32;
  p->memoryPoolsSupported = 1;
}

static cudaError_t fk_get_device_properties(struct cudaDeviceProp *prop,
                                            int device)
{
  cudaError_t e = begin("cudaGetDeviceProperties", DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave(e);
  if (!prop)
    return leave(cudaErrorInvalidValue);
  if (!valid_device(device))
    return leave(cudaErrorInvalidDevice);
  fill_properties(prop, device);
  return leave(cudaSuccess);
}

static cudaError_t fk_device_get_attribute(int *value,
                                           enum cudaDeviceAttr attr,
                                           int device)
{
  cudaError_t e = begin("cudaDeviceGetAttribute", DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave(e);
  if (!value)
    return leave(cudaErrorInvalidValue);
  if (!valid_device(device))
    return leave(cudaErrorInvalidDevice);
  struct cudaDeviceProp p;
  fill_properties(&p, device);
  int v;
  switch (attr) {
  case cudaDevAttrMaxThreadsPerBlock:
    v = p.maxThreadsPerBlock;
    break;
  case cudaDevAttrMaxBlockDimX:
    v = p.maxThreadsDim[0];
    break;
  case cudaDevAttrMaxBlockDimY:
    v = p.maxThreadsDim[1];
    break;
  case cudaDevAttrMaxBlockDimZ:
    v = p.maxThreadsDim[2];
    break;
  case cudaDevAttrMaxGridDimX:
    v = p.maxGridSize[0];
    break;
  case cudaDevAttrMaxGridDimY:
    v = p.maxGridSize[1];
    break;
  case cudaDevAttrMaxGridDimZ:
    v = p.maxGridSize[2];
    break;
  case cudaDevAttrMaxSharedMemoryPerBlock:
    v = (int)p.sharedMemPerBlock;
    break;
  case cudaDevAttrTotalConstantMemory:
    v = (int)p.totalConstMem;
    break;
  case cudaDevAttrWarpSize:
    v = p.warpSize;
    break;
  case cudaDevAttrMaxRegistersPerBlock:
    v = p.regsPerBlock;
    break;
  case cudaDevAttrMultiProcessorCount:
    v = p.multiProcessorCount;
    break;
  case cudaDevAttrIntegrated:
    v = p.integrated;
    break;
  case cudaDevAttrCanMapHostMemory:
    v = p.canMapHostMemory;
    break;
  case cudaDevAttrConcurrentKernels:
    v = p.concurrentKernels;
    break;
  case cudaDevAttrPciBusId:
    v = p.pciBusID;
    break;
  case cudaDevAttrPciDeviceId:
    v = p.pciDeviceID;
    break;
  case cudaDevAttrPciDomainId:
    v = p.pciDomainID;
    break;
  case cudaDevAttrMaxThreadsPerMultiProcessor:
    v = p.maxThreadsPerMultiProcessor;
    break;
  case cudaDevAttrAsyncEngineCount:
    v = p.asyncEngineCount;
    break;
  case cudaDevAttrUnifiedAddressing:
    v = p.unifiedAddressing;
    break;
  case cudaDevAttrComputeCapabilityMajor:
    v = p.major;
    break;
  case cudaDevAttrComputeCapabilityMinor:
    v = p.minor;
    break;
  case cudaDevAttrStreamPrioritiesSupported:
    v = p.streamPrioritiesSupported;
    break;
  case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
    v = (int)p.sharedMemPerMultiprocessor;
    break;
  case cudaDevAttrMaxRegistersPerMultiprocessor:
    v = p.regsPerMultiprocessor;
    break;
  case cudaDevAttrManagedMemory:
    v = p.managedMemory;
    break;
  case cudaDevAttrConcurrentManagedAccess:
    v = p.concurrentManagedAccess;
    break;
  case cudaDevAttrCooperativeLaunch:
    v = p.cooperativeLaunch;
    break;
  case cudaDevAttrMaxSharedMemoryPerBlockOptin:
    v = (int)p.sharedMemPerBlockOptin;
    break;
  case cudaDevAttrMaxBlocksPerMultiprocessor:
    v = p.maxBlocksPerMultiProcessor;
    break;
  case cudaDevAttrMemoryPoolsSupported:
    v = p.memoryPoolsSupported;
    break;
  default:
    return leave(cudaErrorInvalidValue);
  }
  *value = v;
  return leave(cudaSuccess);
}

static cudaError_t fk_get_device(int *device)
{
  cudaError_t e = begin("cudaGetDevice", DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave(e);
  if (!device)
    return leave(cudaErrorInvalidValue);
  *device = t_device;
  return leave(cudaSuccess);
}

static cudaError_t fk_set_device(int device)
{
  cudaError_t e = begin("cudaSetDevice", DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave(e);
  if (!valid_device(device))
    return leave(cudaErrorInvalidDevice);
  t_device = device;
  return leave(cudaSuccess);
}

static cudaError_t fk_device_synchronize(void)
{
  int dev;
  cudaError_t e = begin("cudaDeviceSynchronize", DRIVER_CHECK);
  if (e == cudaSuccess)
    e = current_device(&dev);
  if (e != cudaSuccess)
    return leave(e);
  run_device(dev); /* discards instead, on a sticky device */
  return leave(sticky(dev));
}

static cudaError_t fk_device_get_stream_priority_range(int *least,
                                                       int *greatest)
{
  int dev;
  cudaError_t e = begin("cudaDeviceGetStreamPriorityRange", DRIVER_CHECK);
  if (e == cudaSuccess)
    e = current_device(&dev);
  if (e != cudaSuccess)
    return leave(e);
  if (least)
    *least = PRIORITY_LEAST;
  if (greatest)
    *greatest = PRIORITY_GREATEST;
  return leave(cudaSuccess);
}

/* Returns and clears the calling thread's last error; a sticky error of the
 * current device is returned and never cleared. */
static cudaError_t fk_get_last_error(void)
{
  int dev;
  cudaError_t e = begin("cudaGetLastError", DRIVER_CHECK);
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

static CUresult CUDAAPI fk_primary_ctx_retain(CUcontext *pctx, CUdevice dev)
{
  cudaError_t e = begin("cuDevicePrimaryCtxRetain", DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave_driver(e);
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

static CUresult CUDAAPI fk_primary_ctx_release(CUdevice dev)
{
  cudaError_t e = begin("cuDevicePrimaryCtxRelease", DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave_driver(e);
  if (!valid_device(dev))
    return leave_driver(CUDA_ERROR_INVALID_DEVICE);
  struct fdevice *d = &g.dev[dev];
  if (d->ctx_refs <= 0)
    violation("cuDevicePrimaryCtxRelease of device %d, whose primary "
              "context is not retained",
              dev);
  if (--d->ctx_refs == 0) {
    size_t na = count_allocations(dev), ns = count_streams(dev),
           ne = count_events(dev);
    if (na || ns || ne)
      violation("primary context of device %d released with %zu "
                "allocation%s, %zu stream%s, %zu event%s alive",
                dev, na, plural(na), ns, plural(ns), ne, plural(ne));
  }
  return leave_driver(cudaSuccess);
}

static cudaError_t fk_get_driver_entry_point(
    const char *symbol, void **func, unsigned int cuda_version,
    unsigned long long flags, enum cudaDriverEntryPointQueryResult *status)
{
  (void)flags; /* no per-thread variants among the fake's functions */
  cudaError_t e = begin("cudaGetDriverEntryPointByVersion", DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave(e);
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
  if (is_retain || is_release) {
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
                                    int priority)
{
  int dev;
  cudaError_t e = begin("cudaStreamCreateWithPriority", DRIVER_CHECK);
  if (e == cudaSuccess)
    e = current_device(&dev);
  if (e == cudaSuccess)
    e = sticky(dev);
  if (e != cudaSuccess)
    return leave(e);
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
  if (g.nstreams == g.cap_streams) {
    g.cap_streams = g.cap_streams ? 2 * g.cap_streams : 16;
    g.streams = xrealloc(g.streams, g.cap_streams * sizeof *g.streams);
  }
  g.streams[g.nstreams++] = s;
  *stream = (cudaStream_t)s;
  return leave(cudaSuccess);
}

/* Destroying a stream with queued work is legal: the work still completes.
 * Paused, the stream becomes a zombie whose queue runs at the next device
 * synchronize or when something that waits on it runs; it counts as alive
 * until then.  On a sticky device the queue is dead and is discarded now. */
static cudaError_t fk_stream_destroy(cudaStream_t stream)
{
  cudaError_t e = begin("cudaStreamDestroy", DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave(e);
  if (is_default_stream(stream))
    return leave(cudaErrorInvalidResourceHandle);
  struct fstream *s = find_stream(stream);
  if (!s)
    violation("cudaStreamDestroy of %p, which is not a stream",
              (void *)stream);
  if (s->destroyed)
    violation("cudaStreamDestroy of stream %p, which was already destroyed",
              (void *)stream);
  s->destroyed = 1;
  if (!g.paused || sticky(s->device))
    run_stream(s);
  return leave(cudaSuccess);
}

static cudaError_t fk_stream_synchronize(cudaStream_t stream)
{
  struct fstream *s;
  cudaError_t e = begin("cudaStreamSynchronize", DRIVER_CHECK);
  if (e == cudaSuccess)
    e = resolve_stream("cudaStreamSynchronize", stream, &s);
  if (e != cudaSuccess)
    return leave(e);
  run_stream(s); /* discards instead, on a sticky device */
  return leave(sticky(s->device));
}

/* Paused, a query only looks; unpaused, the infinitely fast GPU has
 * finished whatever was left over from a paused period. */
static cudaError_t fk_stream_query(cudaStream_t stream)
{
  struct fstream *s;
  cudaError_t e = begin("cudaStreamQuery", DRIVER_CHECK);
  if (e == cudaSuccess)
    e = resolve_stream("cudaStreamQuery", stream, &s);
  if (e == cudaSuccess)
    e = sticky(s->device);
  if (e != cudaSuccess)
    return leave(e);
  if (g.paused)
    return leave(stream_pending(s) ? cudaErrorNotReady : cudaSuccess);
  run_stream(s);
  return leave(cudaSuccess);
}

static cudaError_t fk_stream_wait_event(cudaStream_t stream,
                                        cudaEvent_t event,
                                        unsigned int flags)
{
  struct fstream *s;
  cudaError_t e = begin("cudaStreamWaitEvent", DRIVER_CHECK);
  if (e == cudaSuccess)
    e = resolve_stream("cudaStreamWaitEvent", stream, &s);
  if (e != cudaSuccess)
    return leave(e);
  struct fevent *ev = resolve_event("cudaStreamWaitEvent", event);
  if (flags & ~(unsigned int)cudaEventWaitExternal)
    return leave(cudaErrorInvalidValue);
  if ((e = sticky(s->device)) != cudaSuccess ||
      (e = sticky(ev->device)) != cudaSuccess)
    return leave(e);
  if (!ev->recorded) /* waiting for a never-recorded event is a no-op */
    return leave(cudaSuccess);
  struct fop *o = new_op(OP_WAIT);
  o->wait_on = ev->stream; /* the record as it is now, not as it will be */
  o->wait_pos = ev->pos;
  enqueue(s, o);
  return leave(cudaSuccess);
}

/* ------------------------------------------------------------------------ */
/* Events                                                                     */
/* ------------------------------------------------------------------------ */

static cudaError_t fk_event_create(cudaEvent_t *event, unsigned int flags)
{
  int dev;
  cudaError_t e = begin("cudaEventCreateWithFlags", DRIVER_CHECK);
  if (e == cudaSuccess)
    e = current_device(&dev);
  if (e == cudaSuccess)
    e = sticky(dev);
  if (e != cudaSuccess)
    return leave(e);
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
  if (g.nevents == g.cap_events) {
    g.cap_events = g.cap_events ? 2 * g.cap_events : 16;
    g.events = xrealloc(g.events, g.cap_events * sizeof *g.events);
  }
  g.events[g.nevents++] = ev;
  *event = (cudaEvent_t)ev;
  return leave(cudaSuccess);
}

static cudaError_t fk_event_destroy(cudaEvent_t event)
{
  cudaError_t e = begin("cudaEventDestroy", DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave(e);
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

static cudaError_t fk_event_record(cudaEvent_t event, cudaStream_t stream)
{
  struct fstream *s;
  cudaError_t e = begin("cudaEventRecord", DRIVER_CHECK);
  if (e == cudaSuccess)
    e = resolve_stream("cudaEventRecord", stream, &s);
  if (e != cudaSuccess)
    return leave(e);
  struct fevent *ev = resolve_event("cudaEventRecord", event);
  if (ev->device != s->device)
    return leave(cudaErrorInvalidResourceHandle);
  if ((e = sticky(s->device)) != cudaSuccess)
    return leave(e);
  implicit_deps(s); /* on stream 0 the record waits for blocking streams */
  ev->recorded = 1;
  ev->stream = s;
  ev->pos = s->enqueued;
  ev->stamp = ++g.dev[s->device].clock;
  if (!g.paused)
    run_stream(s);
  return leave(cudaSuccess);
}

static cudaError_t fk_event_synchronize(cudaEvent_t event)
{
  cudaError_t e = begin("cudaEventSynchronize", DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave(e);
  struct fevent *ev = resolve_event("cudaEventSynchronize", event);
  if (ev->recorded)
    run_stream_to(ev->stream, ev->pos); /* discards, if sticky */
  return leave(sticky(ev->device));
}

static cudaError_t fk_event_query(cudaEvent_t event)
{
  cudaError_t e = begin("cudaEventQuery", DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave(e);
  struct fevent *ev = resolve_event("cudaEventQuery", event);
  if ((e = sticky(ev->device)) != cudaSuccess)
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
                                         cudaEvent_t end)
{
  cudaError_t e = begin("cudaEventElapsedTime", DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave(e);
  struct fevent *a = resolve_event("cudaEventElapsedTime", start);
  struct fevent *b = resolve_event("cudaEventElapsedTime", end);
  if (!ms)
    return leave(cudaErrorInvalidValue);
  if (a->device != b->device)
    return leave(cudaErrorInvalidResourceHandle);
  if ((e = sticky(a->device)) != cudaSuccess)
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
                                   cudaStream_t stream)
{
  struct fstream *s;
  cudaError_t e = begin("cudaMallocAsync", DRIVER_CHECK);
  if (e == cudaSuccess)
    e = resolve_stream("cudaMallocAsync", stream, &s);
  if (e == cudaSuccess)
    e = sticky(s->device);
  if (e != cudaSuccess)
    return leave(e);
  if (!ptr)
    return leave(cudaErrorInvalidValue);
  if (size == 0) { /* what the real runtime does */
    *ptr = NULL;
    return leave(cudaSuccess);
  }
  return leave(allocate(ptr, size, s->device, KIND_DEVICE));
}

static void not_live(const char *fn, const void *ptr)
    __attribute__((noreturn));
static void not_live(const char *fn, const void *ptr)
{
  violation("%s of pointer %p that is not a live allocation", fn, ptr);
}

/* The memory stays valid (free-pending) until the free runs in the stream;
 * only then do accesses count as use after free.  On a sticky device the
 * queue is dead, so the memory is released at once, as the driver releases
 * everything of a broken context. */
static cudaError_t fk_free_async(void *ptr, cudaStream_t stream)
{
  struct fstream *s;
  cudaError_t e = begin("cudaFreeAsync", DRIVER_CHECK);
  if (e == cudaSuccess)
    e = resolve_stream("cudaFreeAsync", stream, &s);
  if (e != cudaSuccess)
    return leave(e);
  if (!ptr)
    return leave(cudaSuccess);
  struct falloc *a = find_live_base(ptr);
  if (!a || a->state != ALLOC_LIVE)
    not_live("cudaFreeAsync", ptr);
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
  enqueue(s, o);
  return leave(cudaSuccess);
}

static cudaError_t fk_malloc_host(void **ptr, size_t size)
{
  int dev;
  cudaError_t e = begin("cudaMallocHost", DRIVER_CHECK);
  if (e == cudaSuccess)
    e = current_device(&dev);
  if (e == cudaSuccess)
    e = sticky(dev);
  if (e != cudaSuccess)
    return leave(e);
  if (!ptr)
    return leave(cudaErrorInvalidValue);
  if (size == 0) {
    *ptr = NULL;
    return leave(cudaSuccess);
  }
  /* Pinned memory belongs to the context it was allocated in: it counts
   * against the current device, and its limit. */
  return leave(allocate(ptr, size, dev, KIND_PINNED));
}

/* cudaFreeHost and cudaFree synchronize implicitly: all queued work of all
 * devices runs first (or is discarded, on a sticky device). */
static cudaError_t fk_free_host(void *ptr)
{
  cudaError_t e = begin("cudaFreeHost", DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave(e);
  if (!ptr)
    return leave(cudaSuccess);
  run_all_devices();
  struct falloc *a = find_live_base(ptr);
  if (!a || a->state != ALLOC_LIVE)
    not_live("cudaFreeHost", ptr);
  if (a->kind != KIND_PINNED)
    violation("cudaFreeHost of pointer %p, which is %s memory, not pinned "
              "host memory",
              ptr, kind_name(a->kind));
  free_now(a);
  return leave(cudaSuccess);
}

static cudaError_t fk_malloc_managed(void **ptr, size_t size,
                                     unsigned int flags)
{
  int dev;
  cudaError_t e = begin("cudaMallocManaged", DRIVER_CHECK);
  if (e == cudaSuccess)
    e = current_device(&dev);
  if (e == cudaSuccess)
    e = sticky(dev);
  if (e != cudaSuccess)
    return leave(e);
  if (!ptr || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
    return leave(cudaErrorInvalidValue);
  if (!g.dev[dev].managed)
    return leave(cudaErrorNotSupported);
  if (size == 0) {
    *ptr = NULL;
    return leave(cudaSuccess);
  }
  return leave(allocate(ptr, size, dev, KIND_MANAGED));
}

/* cudaFree takes managed memory and, as the real one does, stream-ordered
 * device memory too; pinned memory needs cudaFreeHost. */
static cudaError_t fk_free(void *ptr)
{
  cudaError_t e = begin("cudaFree", DRIVER_CHECK);
  if (e != cudaSuccess)
    return leave(e);
  if (!ptr)
    return leave(cudaSuccess);
  run_all_devices();
  struct falloc *a = find_live_base(ptr);
  if (!a || a->state != ALLOC_LIVE)
    not_live("cudaFree", ptr);
  if (a->kind == KIND_PINNED)
    violation("cudaFree of pointer %p, which is pinned host memory "
              "(cudaFreeHost frees that)",
              ptr);
  free_now(a);
  return leave(cudaSuccess);
}

/* Checks common to the queued memory operations at call time. */
static cudaError_t check_range_arg(const void *p, size_t size)
{
  if (!p || (uintptr_t)p > UINTPTR_MAX - size)
    return cudaErrorInvalidValue;
  return cudaSuccess;
}

/* Whether ptr is host memory that the fake did not allocate: pageable, as
 * far as CUDA knows.  Freed memory in quarantine is not: copies touching it
 * are reported when they run. */
static int is_pageable(const void *ptr)
{
  uintptr_t p = (uintptr_t)ptr;
  for (struct falloc *a = g.live; a; a = a->next)
    if (p >= (uintptr_t)a->base && p < (uintptr_t)a->base + a->size + GUARD_BYTES)
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
                                   cudaStream_t stream)
{
  struct fstream *s;
  cudaError_t e = begin("cudaMemcpyAsync", DRIVER_CHECK);
  if (e == cudaSuccess)
    e = resolve_stream("cudaMemcpyAsync", stream, &s);
  if (e == cudaSuccess)
    e = sticky(s->device);
  if (e != cudaSuccess)
    return leave(e);
  if ((int)kind < (int)cudaMemcpyHostToHost ||
      (int)kind > (int)cudaMemcpyDefault)
    return leave(cudaErrorInvalidMemcpyDirection);
  if (size == 0)
    return leave(cudaSuccess);
  if ((e = check_range_arg(dst, size)) != cudaSuccess ||
      (e = check_range_arg(src, size)) != cudaSuccess)
    return leave(e);
  struct fop *o = new_op(OP_COPY);
  o->dst = dst;
  o->src = src;
  o->size = size;
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
                                        size_t size, cudaStream_t stream)
{
  struct fstream *s;
  cudaError_t e = begin("cudaMemcpyPeerAsync", DRIVER_CHECK);
  if (e == cudaSuccess)
    e = resolve_stream("cudaMemcpyPeerAsync", stream, &s);
  if (e != cudaSuccess)
    return leave(e);
  if (!valid_device(dst_device) || !valid_device(src_device))
    return leave(cudaErrorInvalidDevice);
  if ((e = sticky(s->device)) != cudaSuccess ||
      (e = sticky(dst_device)) != cudaSuccess ||
      (e = sticky(src_device)) != cudaSuccess)
    return leave(e);
  if (size == 0)
    return leave(cudaSuccess);
  if ((e = check_range_arg(dst, size)) != cudaSuccess ||
      (e = check_range_arg(src, size)) != cudaSuccess)
    return leave(e);
  struct fop *o = new_op(OP_PEER_COPY);
  o->dst = dst;
  o->src = src;
  o->size = size;
  enqueue(s, o);
  return leave(cudaSuccess);
}

static cudaError_t fk_memset_async(void *ptr, int value, size_t size,
                                   cudaStream_t stream)
{
  struct fstream *s;
  cudaError_t e = begin("cudaMemsetAsync", DRIVER_CHECK);
  if (e == cudaSuccess)
    e = resolve_stream("cudaMemsetAsync", stream, &s);
  if (e == cudaSuccess)
    e = sticky(s->device);
  if (e != cudaSuccess)
    return leave(e);
  if (size == 0)
    return leave(cudaSuccess);
  if ((e = check_range_arg(ptr, size)) != cudaSuccess)
    return leave(e);
  struct fop *o = new_op(OP_SET);
  o->dst = ptr;
  o->value = (unsigned char)value;
  o->size = size;
  enqueue(s, o);
  return leave(cudaSuccess);
}

/* ------------------------------------------------------------------------ */
/* The table                                                                  */
/* ------------------------------------------------------------------------ */

static const struct cs_cuda fake_table = {
    .get_device_count = fk_get_device_count,
    .driver_get_version = fk_driver_get_version,
    .runtime_get_version = fk_runtime_get_version,
    .get_device_properties = fk_get_device_properties,
    .device_get_attribute = fk_device_get_attribute,
    .get_device = fk_get_device,
    .set_device = fk_set_device,
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
};

FAKE_EXPORT const struct cs_cuda *const cs_cu = &fake_table;

/* ------------------------------------------------------------------------ */
/* Control API (fakecuda.h)                                                   */
/* ------------------------------------------------------------------------ */

static size_t count_allocations(int device)
{
  size_t n = 0;
  for (struct falloc *a = g.live; a; a = a->next)
    if (device < 0 || a->device == device)
      n++;
  return n;
}

static size_t count_streams(int device)
{
  size_t n = 0;
  for (size_t i = 0; i < g.nstreams; i++)
    if ((device < 0 || g.streams[i]->device == device) &&
        stream_alive(g.streams[i]))
      n++;
  return n;
}

static size_t count_events(int device)
{
  size_t n = 0;
  for (size_t i = 0; i < g.nevents; i++)
    if ((device < 0 || g.events[i]->device == device) &&
        !g.events[i]->destroyed)
      n++;
  return n;
}

FAKE_EXPORT void fake_set_driver(enum fake_driver state)
{
  if (state != FAKE_DRIVER_OK && state != FAKE_DRIVER_MISSING &&
      state != FAKE_DRIVER_NO_DEVICE)
    misuse("fake_set_driver(%d): unknown state", (int)state);
  lock();
  g.driver = state;
  unlock();
}

FAKE_EXPORT void fake_set_device_count(int n)
{
  if (n < 0 || n > MAX_DEVICES)
    misuse("fake_set_device_count(%d): not in 0..%d", n, MAX_DEVICES);
  lock();
  g.ndev = n;
  unlock();
}

FAKE_EXPORT void fake_set_managed_supported(int device, int supported)
{
  check_control_device("fake_set_managed_supported", device);
  lock();
  g.dev[device].managed = supported != 0;
  unlock();
}

FAKE_EXPORT void fake_set_memory_limit(int device, size_t bytes)
{
  check_control_device("fake_set_memory_limit", device);
  lock();
  g.dev[device].limit = bytes;
  unlock();
}

FAKE_EXPORT void fake_fail_after(unsigned long n, cudaError_t err, int persistent)
{
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

FAKE_EXPORT void fake_fail_clear(void)
{
  lock();
  g.fail_at = 0;
  g.fail_err = cudaSuccess;
  g.fail_persistent = 0;
  g.nfail_fn = 0;
  unlock();
}

FAKE_EXPORT void fake_fail_function(const char *name, cudaError_t err)
{
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

FAKE_EXPORT unsigned long fake_call_count(void)
{
  lock();
  unsigned long n = g.calls;
  unlock();
  return n;
}

FAKE_EXPORT void fake_set_paused(int paused)
{
  lock();
  g.paused = paused != 0;
  unlock();
}

FAKE_EXPORT void fake_set_sticky_error(int device, cudaError_t err)
{
  check_control_device("fake_set_sticky_error", device);
  lock();
  g.dev[device].sticky = err;
  unlock();
}

FAKE_EXPORT void fake_set_strict_teardown(int strict)
{
  lock();
  g.strict = strict != 0;
  unlock();
}

FAKE_EXPORT size_t fake_log_length(void)
{
  lock();
  size_t n = g.log_len;
  unlock();
  return n;
}

FAKE_EXPORT const char *fake_log_entry(size_t i)
{
  lock();
  const char *s = i < g.log_len ? g.log[i] : NULL;
  unlock();
  return s;
}

FAKE_EXPORT long fake_log_find(const char *name, size_t from)
{
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

FAKE_EXPORT size_t fake_log_count(const char *name)
{
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

FAKE_EXPORT void fake_log_clear(void)
{
  lock();
  log_free();
  unlock();
}

FAKE_EXPORT size_t fake_live_allocations(int device)
{
  lock();
  size_t n = count_allocations(device);
  unlock();
  return n;
}

FAKE_EXPORT size_t fake_live_bytes(int device)
{
  size_t n = 0;
  lock();
  for (struct falloc *a = g.live; a; a = a->next)
    if (device < 0 || a->device == device)
      n += a->size;
  unlock();
  return n;
}

FAKE_EXPORT size_t fake_live_streams(int device)
{
  lock();
  size_t n = count_streams(device);
  unlock();
  return n;
}

FAKE_EXPORT size_t fake_live_events(int device)
{
  lock();
  size_t n = count_events(device);
  unlock();
  return n;
}

FAKE_EXPORT int fake_primary_ctx_refcount(int device)
{
  check_control_device("fake_primary_ctx_refcount", device);
  lock();
  int n = g.dev[device].ctx_refs;
  unlock();
  return n;
}

FAKE_EXPORT int fake_torn_down(void)
{
  lock();
  int t = g.torn_down;
  unlock();
  return t;
}

FAKE_EXPORT void fake_teardown_now(void)
{
  lock();
  teardown_locked();
  unlock();
}

FAKE_EXPORT void fake_reset(void)
{
  lock();
  free_everything();
  log_free();
  set_defaults();
  g.torn_down = 0; /* the atexit registration, though, stays */
  t_device = 0;
  t_last_error = cudaSuccess;
  unlock();
}
