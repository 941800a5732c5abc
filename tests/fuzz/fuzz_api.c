/* fuzz_api.c -- a libFuzzer target for the whole public API of cusafe,
 * against the fake CUDA (tests/fakecuda, two devices).
 *
 * Each input is decoded into a sequence of calls that share one pool of
 * objects, so that every operation meets every kind of object the API can
 * make (defects hide where features meet: a capture and a wrapper stream, a
 * capture and a DLPack deleter).
 *
 * What lives in the pool (struct ent), and so what every operation that
 * takes an object of its type may pick:
 *   contexts of both devices;
 *   streams of four kinds (ent.skind), all equal in every operation that
 *     takes a stream -- copies, fills, transfers, launches, event records
 *     and waits, captures, replays, DLPack consumers, use_buffers:
 *       SK_OWN      cusafe_stream_create();
 *       SK_WRAP     cusafe_stream_wrap() of the interop handle of any stream
 *                   of the pool: a wrapper of a stream of cusafe's (which
 *                   holds its owner), or a second wrapper of a foreign one;
 *       SK_FOREIGN  a wrapper of a stream of another library
 *                   (fake_foreign_stream(), see "Another library" below),
 *                   often wrapped twice;
 *       SK_DEFAULT  a wrapped default stream: NULL, cudaStreamLegacy or
 *                   cudaStreamPerThread;
 *   events, recorded anywhere (also inside captures, where a wait of
 *     another stream joins it to the capture);
 *   buffers of every kind: allocations (device, pinned, managed, stream-
 *     ordered), views, wrapped memory of another library, tensors imported
 *     through DLPack (cusafe's own exports, and memory of another library
 *     with a deleter the harness checks);
 *   modules and kernels;
 *   graphs, instantiated or not, with replays queued or not.
 * Besides the pool: DLPack tensors exported (with or without a consumer
 * stream, either ABI) whose deleters are pending (struct pending): later
 * operations queue the consumer's work on their memory and run their
 * deleters -- now, on a helper thread (joined at once, or after the next
 * operation), during captures, and after cusafe_shutdown().
 *
 * Every operation picks its objects from the pool by the input's bytes:
 * mostly held ones of the right type (any kind), sometimes NULL, stale,
 * forged or of another type, or of the other device.  Releases pick any
 * held object, so every participant goes in any order: streams while they
 * capture, wrappers before or after their owner, buffers used by captures,
 * graphs with replays queued, buffers exported or imported.  A header bit
 * runs part of the input on a second thread against the same pool.
 *
 * The operations (run_ops(): the operation byte modulo 32) and what they
 * pick, besides NULL, stale, forged and wrong-type handles:
 *   create        contexts; streams, events, allocations on any context;
 *                 views of any buffer; stream-ordered allocations on any
 *                 stream;
 *   transfers, copies, fills
 *                 any buffer, at any offset and size, on any stream or the
 *                 default one; copies between the two devices (peer);
 *   events        records and waits on any stream, queries, timing;
 *   streams       synchronize, query, wait, interop handle, begin and end
 *                 a capture, replay or instantiate any graph, on any
 *                 stream;
 *   modules, kernels, launches
 *                 any kernel with any buffers, on any stream; declarations
 *                 of any kernel's types (good, bad, the input's bytes) and
 *                 its signature read back; the readers of mangled names
 *                 and parameter lists fed the input's bytes;
 *   references    retain and release (typed, generic) of anything held;
 *                 labels, types;
 *   foreign       memory of another library wrapped; a default stream
 *                 wrapped; the CUDA stream of any stream wrapped, used and
 *                 released; exports imported back; use_buffers of any
 *                 buffers on any stream;
 *   stream_wrap   the CUDA stream of any stream (often one that captures)
 *                 or a default stream, wrapped on any context, kept or
 *                 used at once (a fill) and released;
 *   foreign_stream
 *                 the other library's streams, wrapped once or twice;
 *   export        any buffer, for any stream or none, either ABI, maybe
 *                 with the consumer's work at once;
 *   tensor        any pending export: its deleter now, on the helper
 *                 thread, or after the next operation; the consumer's work
 *                 on its memory (a memset on its CUDA stream, a fill
 *                 through its own wrapper of the memory);
 *   import        the other library's memory, as right and wrong tensors,
 *                 on any context;
 *   capture       begin and end on any stream (often one that captures);
 *                 joins between any two streams, with work on the joined
 *                 one, joined back or not; replays of any graph on any
 *                 stream, the graph released with its replays queued;
 *   release_or_shutdown
 *                 a release of a held object of a chosen type, or the
 *                 shutdown (below);
 *   control       the fake's controls: paused streams, injected failures,
 *                 sticky errors, memory limits.
 *
 * Another library.  The harness plays a library that shares the process:
 * it holds each device's primary context while it has objects there (as
 * the runtime does), makes streams (wrapped by cusafe) and allocations
 * (imported into cusafe as DLPack tensors).  Its deleter of an imported
 * tensor checks that it runs exactly once, never while the harness holds
 * the buffer, and frees the memory at once, ordered after no stream but
 * its own: work that cusafe queued on that memory and that has not run is
 * then a VIOLATION of the fake's when it runs.
 *
 * Checks.  Every call must return a valid status, with a message on
 * failure; results are checked where the harness can know them (types,
 * sizes, view addresses, a write read back, double releases, what a
 * capture refuses).  At the end of each input the harness runs the
 * pending deleters, releases everything it still holds and requires the
 * fake to report nothing alive: no allocation, stream, event, library,
 * NVRTC program, graph or capture, no primary context retained, and every
 * imported tensor's deleter run exactly once.  The fake itself aborts on
 * any lifetime violation (a free before the work queued on the memory
 * ran, among others); ASan, UBSan and LeakSanitizer catch the rest.
 *
 * Shutdown.  The library's state is process-wide and cusafe_shutdown()
 * cannot be undone, so the operation that shuts down forks first: the
 * child undoes the library's fork mark (the fake, being host memory,
 * survives a fork, which the real runtime would not), calls
 * cusafe_shutdown(), runs the rest of the input against the shut-down
 * library, runs the pending deleters (some on another thread), and
 * requires the fake to report nothing alive and every deleter of an
 * import run exactly once; the parent waits for it, fails if it failed,
 * and goes on with the input as if nothing happened.  The parent never
 * shuts down: every input leaves the library with nothing alive, after
 * which the fake is reset for the next input (fake_reset(), meant for
 * after a shutdown: the library holds no CUDA object then either, as the
 * check just before shows), so that the fake's log and its records of
 * destroyed objects do not grow without end.
 *
 * Input: a header byte (bit 0: two threads, the next byte giving the second
 * thread's share; bit 1: paused streams; bit 2: unpaused before the
 * cleanup; bit 3: cleanup in reverse order; bit 4: pending deleters run
 * after the cleanup's releases instead of before; bit 5: the operation
 * that shuts down does, instead of a release, in inputs whose length is a
 * multiple of 8 -- a fork of a sanitized process costs some thirty
 * inputs, and so only one in eight of the inputs that ask for it may
 * have one), then records of an
 * operation byte, a length byte and the operation's parameters (see
 * run_ops() and make-corpus.py, which writes the seeds).
 * CUSAFE_FUZZ_TRACE=1 prints every call and its result on stderr, =2 the
 * CUDA calls the fake saw too.
 *
 * Injected failures of the calls that destroy or free CUDA objects leave
 * those objects alive in the fake (the library cannot free what CUDA
 * refused to free).  An input where such a failure happened ends with the
 * fake's teardown instead of the leak check: see finish_tainted().  Set
 * CUSAFE_FUZZ_STRICT_FAULTS=1 to check those inputs like the others. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "calls.h" /* cs_hot: the shutdown's child undoes the fork mark */
#include "cuda_api.h"
#include "cusafe.h"
#include "signature.h" /* the readers of kernels' types, fed any bytes */
#ifdef CUSAFE_HAVE_DLPACK
#include "cusafe_dlpack.h"
#endif
#include "fakecuda.h"
#include "../abortutil.h"

/* ------------------------------------------------------------------------ */
/* Failing                                                                    */
/* ------------------------------------------------------------------------ */

#define die(...) tu_abortf("fuzz_api", __VA_ARGS__)

/* ------------------------------------------------------------------------ */
/* Input                                                                      */
/* ------------------------------------------------------------------------ */

struct rd {
  const uint8_t *p;
  size_t n;
};

static uint8_t u8(struct rd *r) {
  if (!r->n)
    return 0;
  r->n--;
  return *r->p++;
}
static uint16_t u16(struct rd *r) { return (uint16_t)(u8(r) | u8(r) << 8); }
static uint32_t u32(struct rd *r) {
  return (uint32_t)u16(r) | (uint32_t)u16(r) << 16;
}
static uint64_t u64(struct rd *r) {
  return (uint64_t)u32(r) | (uint64_t)u32(r) << 32;
}
#define PICK(r, table) ((table)[u8(r) % (sizeof(table) / sizeof((table)[0]))])

/* ------------------------------------------------------------------------ */
/* The pool of handles                                                        */
/* ------------------------------------------------------------------------ */

enum {
  T_CTX = 1,
  T_STREAM,
  T_EVENT,
  T_BUF,
  T_MOD,
  T_KER,
  T_GRAPH,
  T_LAST = T_GRAPH
};

/* The kinds of streams (see the top of this file). */
enum { SK_OWN, SK_WRAP, SK_FOREIGN, SK_DEFAULT };

#define MAXP 48 /* parameters of a kernel the harness knows */
#define MAXK 6  /* kernels of a module the harness knows */
#define MAXE 96 /* entries in the pool */

/* What the harness knows of a kernel.  op != 0: one of the built-in
 * kernels, whose pointer parameters must point at n elements (the fake
 * checks that, as a GPU would fault). */
struct kspec {
  char name[24];
  int np;
  uint32_t size[MAXP];
  uint8_t ptr[MAXP];
  int op;     /* 0, or 1 + index in builtin_specs */
  int elem;   /* built-in kernels: 4 or 8 */
  int broken; /* its layout may be wrong in the library: never launched */
};

struct ent {
  cusafe_handle h;
  int type;     /* 0: free slot */
  int refs;     /* references the harness holds */
  int pin;      /* contexts: a reference kept while faults are injected */
  int inflight; /* releases in progress (the slot is not reused) */
  int dev;      /* device of its context, -1 unknown */
  size_t size;  /* buffers */
  int skew;     /* buffers: address modulo 8 (roots are aligned) */
  int wrapped;  /* streams: a device's default stream (raw stream NULL,
                 * cudaStreamLegacy or cudaStreamPerThread) */
  int skind;    /* streams: SK_OWN, SK_WRAP, SK_FOREIGN or SK_DEFAULT */
  int nk;       /* modules: kernels in ks; kernels: 1 */
  struct kspec ks[MAXK];
};

static struct ent pool[MAXE];
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

/* The references that wrapped foreign memory holds on its device's
 * context (struct foreign), per device: the pool does not count them, so
 * a context the pool holds no more is not stale while one is left. */
static _Atomic cusafe_handle foreign_ctx[2];
static _Atomic int foreign_refs[2];

static int foreign_held(cusafe_handle h) {
  for (int d = 0; d < 2; d++)
    if (atomic_load(&foreign_refs[d]) > 0 && atomic_load(&foreign_ctx[d]) == h)
      return 1;
  return 0;
}

/* References that could not enter a full pool while failures were
 * injected (see pin()): released at the end of the input. */
static cusafe_handle deferred[512];
static int ndeferred;

static const struct {
  const char *name;
  const char *params; /* p: pointer, else bytes */
  int elem;
} builtin_specs[] = {
    {"cusafe_fill_f32", "p48", 4},    {"cusafe_fill_f64", "p88", 8},
    {"cusafe_scale_f32", "p48", 4},   {"cusafe_scale_f64", "p88", 8},
    {"cusafe_axpy_f32", "p4p8", 4},   {"cusafe_axpy_f64", "p8p8", 8},
    {"cusafe_vecadd_f32", "ppp8", 4}, {"cusafe_vecadd_f64", "ppp8", 8},
};
#define NBUILTIN (int)(sizeof builtin_specs / sizeof builtin_specs[0])

static void builtin_spec(struct kspec *k, int i) {
  memset(k, 0, sizeof *k);
  snprintf(k->name, sizeof k->name, "%s", builtin_specs[i].name);
  for (const char *p = builtin_specs[i].params; *p; p++) {
    k->ptr[k->np] = *p == 'p';
    k->size[k->np] = *p == 'p' ? 8 : (uint32_t)(*p - '0');
    k->np++;
  }
  k->op = i + 1;
  k->elem = builtin_specs[i].elem;
}

/* Under pool_lock. */
static struct ent *ent_find(cusafe_handle h) {
  if (!h)
    return NULL;
  for (int i = 0; i < MAXE; i++)
    if (pool[i].type && pool[i].h == h)
      return &pool[i];
  return NULL;
}

/* Records one more reference the harness holds on h; fills a new entry
 * from `tmpl` when h is not known yet.  Returns 0 if the pool is full (the
 * caller then releases the reference at once); never for a context. */
static int ent_add(cusafe_handle h, int type, const struct ent *tmpl) {
  pthread_mutex_lock(&pool_lock);
  struct ent *e = ent_find(h);
  if (e) {
    if (e->type != type)
      die("handle 0x%016llx came back as type %d, known as type %d",
          (unsigned long long)h, type, e->type);
    e->refs++;
    pthread_mutex_unlock(&pool_lock);
    return 1;
  }
  /* The last entries are kept for contexts, so that a context is always
   * held -- and pinned while failures are injected (see pin()). */
  int limit = type == T_CTX ? MAXE : MAXE - 4;
  for (int pass = 0; pass < 2 && !e; pass++)
    for (int i = 0; i < limit && !e; i++)
      if (pass == 0
              ? !pool[i].type
              : pool[i].refs == 0 && pool[i].pin == 0 && pool[i].inflight == 0)
        e = &pool[i];
  if (!e) {
    pthread_mutex_unlock(&pool_lock);
    return 0;
  }
  if (tmpl)
    *e = *tmpl;
  else
    memset(e, 0, sizeof *e), e->dev = -1;
  e->h = h;
  e->type = type;
  e->refs = 1;
  e->pin = 0;
  e->inflight = 0;
  pthread_mutex_unlock(&pool_lock);
  return 1;
}

/* A copy of the entry of h (type 0 if unknown). */
static struct ent ent_get(cusafe_handle h) {
  struct ent c;
  pthread_mutex_lock(&pool_lock);
  struct ent *e = ent_find(h);
  if (e)
    c = *e;
  else
    memset(&c, 0, sizeof c), c.dev = -1;
  pthread_mutex_unlock(&pool_lock);
  return c;
}

/* ------------------------------------------------------------------------ */
/* Per-input state                                                            */
/* ------------------------------------------------------------------------ */

#define HOST_BYTES (65536 + 64) /* the largest buffer, plus an odd start */
#define MAX_ALLOC 65536

#ifdef CUSAFE_HAVE_DLPACK
/* An exported tensor whose deleter has not run: its consumer (the
 * harness) may still queue work on its memory, on its stream. */
struct pending {
  void *tensor; /* DLManagedTensorVersioned *, or DLManagedTensor * */
  int legacy;
  cusafe_stream consumer; /* the harness's handle, which may go stale */
  void *raw;              /* its CUDA stream */
  int raw_known;
  int dev;             /* the buffer's device, -1 if unknown */
  int kind;            /* its memory */
  char *data;          /* the tensor's data */
  size_t reach;        /* bytes from data within the buffer (0: unknown) */
  cusafe_buffer alias; /* the consumer's wrapper of that memory, or 0 */
};
#endif

struct th {
  struct rd r;
  int strict;         /* single thread: exact answers are known */
  int may_shut_down;  /* op_shutdown() may fork (see the top) */
  int shut_down_once; /* it did */
  int control;        /* may use the fake's controls */
  unsigned char *host;
  uint32_t block, grid; /* the last suggestion */
  char image[8192];     /* module images and sources */
  char label[400];
#ifdef CUSAFE_HAVE_DLPACK
  pthread_t helper; /* a deleter on another thread (op_tensor) */
  int helper_on;
  struct pending job; /* its tensor */
#endif
};

/* Fault state, written by the controlling thread only (faults are
 * injected in single-thread runs only, so that the harness knows exactly
 * which calls failed). */
static int faults_armed; /* an injected failure may still happen */
static int faults_used;  /* one was armed during this input */
static int err4_armed;   /* cudaErrorCudartUnloading injected */
static int nfail_fn;     /* names given to fake_fail_function */
static const char *fail_fn_names[16];
static int sticky[2];     /* sticky error set on a device */
static int maybe_sticky;  /* a built-in kernel ran: may have faulted */
static int strict_faults; /* CUSAFE_FUZZ_STRICT_FAULTS */
/* CUSAFE_FUZZ_OPEN=1: also what still leads to defects that are being
 * fixed, and so stays out of make check's short run (campaigns turn it
 * on): faults that persist until cleared (fake_fail_function, persistent
 * fake_fail_after) and the runtime's unloading (cudaErrorCudartUnloading)
 * mixed with captures, wrappers and DLPack tensors (the library's failure
 * paths); the legacy default stream wrapped (NULL, cudaStreamLegacy:
 * frees and give-backs of memory last used there while a blocking stream
 * captures).  Without it a wrapped default stream is cudaStreamPerThread. */
static int open_defects;
static int in_child;      /* the child of op_shutdown() */
static int shutting;      /* in it, cusafe_shutdown() has begun */
static int child_tainted; /* in it, the runtime was torn down first */

/* Every change of the injected failures, at its place in the fake's log,
 * to tell afterwards which calls failed. */
enum { FC_AFTER, FC_FUNCTION, FC_CLEAR };
struct fchange {
  size_t log_pos; /* fake_log_length() at the change */
  int kind;
  unsigned long fail_at; /* FC_AFTER: the call that fails */
  int persistent;
  const char *name; /* FC_FUNCTION */
  cudaError_t err;
};
#define MAX_CHANGES 64
static struct fchange changes[MAX_CHANGES];
static int nchanges, changes_lost;

/* No failure injected or possible from the fake, and no capture open
 * (which refuses some calls, and, on a blocking stream, any use of the
 * legacy stream): calls that need CUDA succeed when their arguments are
 * right. */
static int quiet(void) {
  return !faults_armed && !shutting && !sticky[0] && !sticky[1] &&
         !maybe_sticky && !fake_live_captures(-1);
}

/* Runs all queued work of both devices (the streams may be paused).
 *
 * The fake CUDA drops the waits of a device with a sticky error: its queued
 * work is discarded, and a free on it happens at once, without first
 * completing the work of other devices that the discarded waits (or the
 * free) were ordered after.  An order such as "stream of device 0 ->
 * queue of device 1 -> queue of device 0" then breaks when device 1
 * faults, and a later copy touches memory already freed: a violation of the
 * fake's own, which a GPU does not have (there the chain stalls).  So a
 * device is made sticky -- by fake_set_sticky_error() or by a misaligned
 * launch of a built-in kernel -- only when nothing is queued anywhere, in
 * single-thread runs with no failure injected. */
static void check(cusafe_status st, const char *what);

/* Whether drain_all() can run everything queued: a single thread, no
 * failure injected, and no capture open (whose contexts cannot be
 * synchronised). */
static int drainable(const struct th *t) {
  return t->strict && !faults_armed && !fake_live_captures(-1);
}

static void drain_all(void) {
  for (int d = 0; d < 2; d++) {
    cusafe_context c = CUSAFE_NULL_HANDLE;
    cusafe_status st = cusafe_context_create(&c, d);
    check(st, "cusafe_context_create (drain)");
    if (st != CUSAFE_SUCCESS)
      continue;
    check(cusafe_context_synchronize(c), "cusafe_context_synchronize (drain)");
    st = cusafe_context_release(c);
    check(st, "cusafe_context_release (drain)");
    if (st != CUSAFE_SUCCESS)
      die("release of a context just created failed: %s",
          cusafe_last_error_message());
  }
}

static void fault_change(int kind, unsigned long fail_at, int persistent,
                         const char *name, cudaError_t err) {
  if (nchanges == MAX_CHANGES) {
    changes_lost = 1;
    return;
  }
  changes[nchanges++] =
      (struct fchange){fake_log_length(), kind, fail_at, persistent, name, err};
}

static unsigned char bytes_arg[65536]; /* BYTES arguments point here */

/* ------------------------------------------------------------------------ */
/* Checking statuses                                                          */
/* ------------------------------------------------------------------------ */

static int in_teardown; /* cleanup after the fake's teardown */
static int trace;       /* CUSAFE_FUZZ_TRACE=1: every call on stderr */

/* With CUSAFE_FUZZ_TRACE=2, the fake's log of CUDA calls too. */
static void trace_fake_log(void) {
  static size_t shown;
  size_t n = fake_log_length();
  if (n < shown)
    shown = 0; /* reset */
  for (; shown < n; shown++)
    fprintf(stderr, "fuzz_api:     %s\n", fake_log_entry(shown));
}

static void check(cusafe_status st, const char *what) {
  if (trace > 1)
    trace_fake_log();
  if (trace)
    fprintf(stderr, "fuzz_api: %s -> %s%s%s\n", what, cusafe_status_string(st),
            st ? ": " : "", st ? cusafe_last_error_message() : "");
  if ((unsigned)st > (unsigned)CUSAFE_ERROR_CAPTURING)
    die("%s returned %d, which is no cusafe_status", what, (int)st);
  if (!strcmp(cusafe_status_string(st), "unknown status"))
    die("%s: status %d has no string", what, (int)st);
  if (st == CUSAFE_SUCCESS)
    return;
  const char *msg = cusafe_last_error_message();
  if (!msg || !*msg)
    die("%s failed with %s and an empty message", what,
        cusafe_status_string(st));
  if (st == CUSAFE_ERROR_FORKED)
    die("%s returned FORKED in a process that never forked", what);
  if (st == CUSAFE_ERROR_SHUTDOWN && !err4_armed && !in_teardown && !shutting)
    die("%s returned SHUTDOWN but the library was never shut down (%s)", what,
        msg);
  if (st == CUSAFE_ERROR_CUDA && cusafe_last_cuda_error() == 0)
    die("%s returned CUSAFE_ERROR_CUDA with no CUDA error (%s)", what, msg);
}

/* A function with an out handle: NULL on failure, and of the right type on
 * success.  Returns the status. */
static cusafe_status check_out(cusafe_status st, cusafe_handle out, int type,
                               const char *what) {
  check(st, what);
  if (st != CUSAFE_SUCCESS) {
    if (out != CUSAFE_NULL_HANDLE)
      die("%s failed (%s) but set its out handle to 0x%016llx", what,
          cusafe_status_string(st), (unsigned long long)out);
    return st;
  }
  if (out == CUSAFE_NULL_HANDLE)
    die("%s succeeded with a NULL handle", what);
  cusafe_handle_type got;
  cusafe_status s2 = cusafe_handle_get_type(&got, out);
  check(s2, "cusafe_handle_get_type");
  if (s2 != CUSAFE_SUCCESS || (int)got != type)
    die("%s returned 0x%016llx, of type %d (%s), expected type %d", what,
        (unsigned long long)out, (int)got, cusafe_status_string(s2), type);
  return st;
}

static void expect(cusafe_status st, cusafe_status want, const char *what) {
  check(st, what);
  if (st != want && !(shutting && st == CUSAFE_ERROR_SHUTDOWN))
    die("%s returned %s, expected %s (%s)", what, cusafe_status_string(st),
        cusafe_status_string(want), cusafe_last_error_message());
}

/* ------------------------------------------------------------------------ */
/* Choosing handles                                                           */
/* ------------------------------------------------------------------------ */

/* A held handle of `type` (0: any type) on device `dev` (-1: any), copied
 * into *e; CUSAFE_NULL_HANDLE if there is none. */
static cusafe_handle pick_held(struct th *t, int type, int dev, struct ent *e) {
  uint8_t k = u8(&t->r);
  pthread_mutex_lock(&pool_lock);
  int n = 0;
  for (int i = 0; i < MAXE; i++)
    if (pool[i].type && pool[i].refs + pool[i].pin > 0 &&
        (!type || pool[i].type == type) && (dev < 0 || pool[i].dev == dev))
      n++;
  cusafe_handle h = CUSAFE_NULL_HANDLE;
  if (n) {
    int want = k % n;
    for (int i = 0; i < MAXE; i++)
      if (pool[i].type && pool[i].refs + pool[i].pin > 0 &&
          (!type || pool[i].type == type) && (dev < 0 || pool[i].dev == dev) &&
          want-- == 0) {
        if (e)
          *e = pool[i];
        h = pool[i].h;
        break;
      }
  }
  pthread_mutex_unlock(&pool_lock);
  return h;
}

/* A handle that is not in the pool: forged from the input or from a known
 * handle. */
static cusafe_handle forge(struct th *t) {
  cusafe_handle base = pick_held(t, 0, -1, NULL);
  int c = u8(&t->r) % 10;
  /* With two threads, the other one may make the next occupant of a slot
   * (gen + 1), or of a neighbouring slot at the same generation, between
   * the look-up below and the use of the forged handle, which would then
   * be live: forge only what can never be. */
  if (!t->strict && (c == 2 || c == 4))
    c++;
  cusafe_handle h;
  switch (c) {
  case 0: h = u64(&t->r); break;
  case 1: h = base ^ ((uint64_t)(1 + u8(&t->r) % 15) << 56); break; /* tag */
  case 2: h = base + (1ull << 32); break;                   /* gen + 1 */
  case 3: h = base - (1ull << 32); break;                   /* gen - 1 */
  case 4: h = base + 1 + u8(&t->r); break;                  /* slot */
  case 5: h = (base & ~0xFFFFFFFFull) | 0xFFFFFFF0u; break; /* beyond */
  case 6: h = ((uint64_t)(0xC0 | (u8(&t->r) & 0xF)) << 56) | u32(&t->r); break;
  case 7: h = base & 0x00FFFFFFFFFFFFFFull; break; /* no tag */
  case 8: h = base & ~(0xFFFFFFull << 32); break;  /* generation 0 */
  default: h = (uint64_t)-1 - u8(&t->r); break;
  }
  pthread_mutex_lock(&pool_lock);
  int live = ent_find(h) != NULL;
  for (int i = 0; i < ndeferred; i++)
    live |= deferred[i] == h;
  if (live)
    h = 0xDEAD000000000000ull | (h & 0xFFFF); /* not a live one after all */
  pthread_mutex_unlock(&pool_lock);
  return h;
}

/* A stale handle: one the harness released, unless another thread may
 * bring it back (then a forged one). */
static cusafe_handle pick_stale(struct th *t) {
  uint8_t k = u8(&t->r);
  cusafe_handle h = CUSAFE_NULL_HANDLE;
  if (t->strict) {
    pthread_mutex_lock(&pool_lock);
    int n = 0;
    for (int i = 0; i < MAXE; i++)
      if (pool[i].type && pool[i].refs == 0 && pool[i].pin == 0 &&
          pool[i].inflight == 0 && !foreign_held(pool[i].h))
        n++;
    if (n) {
      int want = k % n;
      for (int i = 0; i < MAXE; i++)
        if (pool[i].type && pool[i].refs == 0 && pool[i].pin == 0 &&
            pool[i].inflight == 0 && !foreign_held(pool[i].h) && want-- == 0) {
          h = pool[i].h;
          break;
        }
    }
    pthread_mutex_unlock(&pool_lock);
  }
  return h ? h : forge(t);
}

/* A handle argument meant to be of `type`: mostly a held one, sometimes
 * NULL, stale, forged or of another type.  *held tells whether it is one
 * the harness holds with the right type (in single-thread runs only). */
static cusafe_handle choose(struct th *t, int type, int dev, struct ent *e,
                            int *held) {
  uint8_t m = u8(&t->r);
  cusafe_handle h = CUSAFE_NULL_HANDLE;
  struct ent tmp;
  if (!e)
    e = &tmp;
  memset(e, 0, sizeof *e);
  e->dev = -1;
  *held = 0;
  switch (m % 12) {
  default: /* 0..6 */
    h = pick_held(t, type, dev, e);
    if (!h && dev >= 0)
      h = pick_held(t, type, -1, e);
    *held = h != CUSAFE_NULL_HANDLE;
    break;
  case 7:
    h = pick_held(t, 0, -1, e);
    *held = h && e->type == type;
    break;
  case 8: h = pick_stale(t); break;
  case 9: h = forge(t); break;
  case 10: h = CUSAFE_NULL_HANDLE; break;
  case 11:
    h = pick_held(t, type, dev >= 0 ? !dev : -1, e);
    *held = h != 0;
    break;
  }
  if (!*held)
    memset(e, 0, sizeof *e), e->dev = -1;
  return h;
}

/* A stream argument: the default stream, or a chosen stream handle. */
static cusafe_handle choose_stream(struct th *t, int dev) {
  int held;
  if (u8(&t->r) % 3 == 0)
    return CUSAFE_STREAM_DEFAULT;
  return choose(t, T_STREAM, dev, NULL, &held);
}

/* ------------------------------------------------------------------------ */
/* Sizes and offsets                                                          */
/* ------------------------------------------------------------------------ */

static size_t alloc_size(struct th *t) {
  static const size_t sizes[] = {64,
                                 4096,
                                 1,
                                 2,
                                 3,
                                 4,
                                 7,
                                 8,
                                 16,
                                 24,
                                 100,
                                 256,
                                 1000,
                                 65536,
                                 0,
                                 ((size_t)1 << 30) + 1,
                                 SIZE_MAX,
                                 SIZE_MAX - 63,
                                 (size_t)1 << 40};
  return PICK(&t->r, sizes);
}

/* A size or offset relative to `ref` (a buffer's size); a zero byte gives
 * `dflt`. */
static size_t rel(struct th *t, size_t ref, size_t dflt) {
  uint8_t m = u8(&t->r);
  size_t k = u8(&t->r) % 9;
  switch (m % 12) {
  case 0: return dflt;
  case 11: return 0;
  case 1: return k;
  case 2: return ref;
  case 3: return ref > k ? ref - k : 0;
  case 4: return ref + 1 + k;
  case 5: return SIZE_MAX - k;
  case 6: return (size_t)1 << (u8(&t->r) % 64);
  case 7: return (size_t)u64(&t->r);
  case 8: return ref / 2;
  case 9: return ref / 2 + k;
  default: return u16(&t->r) % (ref + 2);
  }
}

/* ------------------------------------------------------------------------ */
/* Operations: contexts, streams, events                                      */
/* ------------------------------------------------------------------------ */

static const int devices[] = {0,  1, 0, 1,   0,       1,
                              -1, 2, 8, 256, INT_MAX, INT_MIN};

/* While failures are injected, no context and no module may be destroyed:
 *   - a failure in a destroying call (see finish_tainted) leaves objects in
 *     the fake, and the context's release of its primary context would then
 *     be a violation of the fake's before the harness can tell;
 *   - a module's destruction synchronizes the device and then unloads the
 *     library; when that synchronization fails (injected: the fake then
 *     does nothing), a launch may still be queued, and unloading under it
 *     is a violation of the fake's.
 * So the harness keeps a reference (a pin) on every context, module and
 * kernel (a kernel holds its module) from the first injected failure to the
 * end of the input.  Pins add no CUDA call: retain does none. */
static int pinned_type(int type) {
  return type == T_CTX || type == T_MOD || type == T_KER;
}

static void pin(cusafe_handle h) {
  pthread_mutex_lock(&pool_lock);
  struct ent *e = ent_find(h);
  int need = e && e->pin == 0;
  pthread_mutex_unlock(&pool_lock);
  if (!need)
    return;
  expect(cusafe_retain(h), CUSAFE_SUCCESS, "cusafe_retain (pin)");
  pthread_mutex_lock(&pool_lock);
  e = ent_find(h);
  if (!e)
    die("pinned handle 0x%016llx vanished from the pool",
        (unsigned long long)h);
  e->pin++;
  pthread_mutex_unlock(&pool_lock);
}

static void keep(cusafe_handle h, int type, const struct ent *tmpl);

/* Pins every context, module and kernel there is, before the first
 * injected failure: the contexts of both devices, including one kept alive
 * by its children only (creating a context for its device returns it),
 * and the modules and kernels the harness holds (a module without a user
 * reference lives only while a kernel of it does). */
static void pin_all(void) {
  cusafe_handle held[MAXE];
  int n = 0;
  pthread_mutex_lock(&pool_lock);
  for (int i = 0; i < MAXE; i++)
    if ((pool[i].type == T_MOD || pool[i].type == T_KER) &&
        pool[i].refs + pool[i].pin > 0)
      held[n++] = pool[i].h;
  pthread_mutex_unlock(&pool_lock);
  for (int i = 0; i < n; i++)
    pin(held[i]);
  for (int d = 0; d < 2; d++) {
    cusafe_context c = CUSAFE_NULL_HANDLE;
    cusafe_status st = cusafe_context_create(&c, d);
    check(st, "cusafe_context_create (pin)");
    if (st != CUSAFE_SUCCESS)
      continue; /* a sticky error: no context on d, none to protect */
    struct ent e = {.dev = d};
    keep(c, T_CTX, &e); /* pins it, faults_used being set */
  }
}

/* Adds a new handle (or a new reference to a known one) to the pool; if the
 * pool is full, gives the reference back at once. */
static void keep(cusafe_handle h, int type, const struct ent *tmpl) {
  if (trace)
    fprintf(stderr,
            "fuzz_api: holds 0x%016llx: type %d, device %d, %zu bytes\n",
            (unsigned long long)h, type, tmpl ? tmpl->dev : -1,
            tmpl ? tmpl->size : 0);
  if (!ent_add(h, type, tmpl)) {
    if (faults_used && pinned_type(type)) {
      if (ndeferred == (int)(sizeof deferred / sizeof deferred[0]))
        die("more than %d references to defer", ndeferred);
      deferred[ndeferred++] = h;
      return;
    }
    cusafe_status st = cusafe_release(h);
    check(st, "cusafe_release (pool full)");
    if (st == CUSAFE_ERROR_INVALID_HANDLE)
      die("release of a new handle 0x%016llx failed: %s", (unsigned long long)h,
          cusafe_last_error_message());
    return;
  }
  if (faults_used && pinned_type(type))
    pin(h);
}

static void op_context_create(struct th *t) {
  int dev = PICK(&t->r, devices);
  cusafe_context c = 42;
  if (u8(&t->r) % 16 == 15) {
    expect(cusafe_context_create(NULL, dev), CUSAFE_ERROR_INVALID_VALUE,
           "cusafe_context_create(NULL)");
    return;
  }
  cusafe_status st = check_out(cusafe_context_create(&c, dev), c, T_CTX,
                               "cusafe_context_create");
  if (st == CUSAFE_SUCCESS) {
    if (dev < 0 || dev > 1)
      die("cusafe_context_create accepted device %d", dev);
    int got = -1;
    expect(cusafe_context_get_device(&got, c), CUSAFE_SUCCESS,
           "cusafe_context_get_device");
    if (got != dev)
      die("context of device %d says device %d", dev, got);
    struct ent e = {.dev = dev};
    keep(c, T_CTX, &e);
  } else if ((dev < 0 || dev > 1) && st != CUSAFE_ERROR_INVALID_DEVICE &&
             !faults_armed && !shutting) {
    die("cusafe_context_create(%d) returned %s", dev, cusafe_status_string(st));
  }
}

static void op_stream_create(struct th *t) {
  static const unsigned flags[] = {0, 1, 0, 1, 2, 0xFFFFFFFFu};
  static const int prio[] = {0, 0, -1, -5, -6, 1, INT_MIN};
  struct ent ce;
  int held;
  cusafe_context c = choose(t, T_CTX, -1, &ce, &held);
  unsigned f = PICK(&t->r, flags);
  int p = PICK(&t->r, prio);
  cusafe_stream s = 42;
  if (u8(&t->r) % 32 == 31) {
    expect(cusafe_stream_create(NULL, c, f, p), CUSAFE_ERROR_INVALID_VALUE,
           "cusafe_stream_create(NULL)");
    return;
  }
  cusafe_status st = check_out(cusafe_stream_create(&s, c, f, p), s, T_STREAM,
                               "cusafe_stream_create");
  if (st == CUSAFE_SUCCESS) {
    if (f > 1 || p < -5 || p > 0)
      die("cusafe_stream_create accepted flags %u priority %d", f, p);
    cusafe_context back = CUSAFE_NULL_HANDLE;
    st = check_out(cusafe_stream_get_context(&back, s), back, T_CTX,
                   "cusafe_stream_get_context");
    if (st == CUSAFE_SUCCESS) {
      if (back != c)
        die("stream of context 0x%016llx reports context 0x%016llx",
            (unsigned long long)c, (unsigned long long)back);
      keep(back, T_CTX, &ce);
    }
    struct ent e = {.dev = ce.dev};
    keep(s, T_STREAM, &e);
  } else if (held && t->strict && quiet() && f <= 1 && p >= -5 && p <= 0) {
    die("cusafe_stream_create failed on a held context: %s",
        cusafe_last_error_message());
  }
}

static void op_event_create(struct th *t) {
  static const unsigned flags[] = {0, 1, 2, 3, 4, 0x80000000u};
  struct ent ce;
  int held;
  cusafe_context c = choose(t, T_CTX, -1, &ce, &held);
  unsigned f = PICK(&t->r, flags);
  cusafe_event ev = 42;
  if (u8(&t->r) % 32 == 31) {
    expect(cusafe_event_create(NULL, c, f), CUSAFE_ERROR_INVALID_VALUE,
           "cusafe_event_create(NULL)");
    return;
  }
  cusafe_status st = check_out(cusafe_event_create(&ev, c, f), ev, T_EVENT,
                               "cusafe_event_create");
  if (st == CUSAFE_SUCCESS) {
    if (f > 3)
      die("cusafe_event_create accepted flags 0x%x", f);
    struct ent e = {.dev = ce.dev, .size = f};
    keep(ev, T_EVENT, &e);
  }
}

/* ------------------------------------------------------------------------ */
/* Buffers                                                                    */
/* ------------------------------------------------------------------------ */

static void check_buffer(cusafe_buffer b, size_t size, int dev) {
  size_t got = 0;
  expect(cusafe_buffer_get_size(&got, b), CUSAFE_SUCCESS,
         "cusafe_buffer_get_size");
  if (got != size)
    die("buffer of %zu bytes says %zu", size, got);
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_status st = check_out(cusafe_buffer_get_context(&c, b), c, T_CTX,
                               "cusafe_buffer_get_context");
  if (st == CUSAFE_SUCCESS) {
    struct ent e = {.dev = dev};
    keep(c, T_CTX, &e);
  }
}

static void op_alloc(struct th *t) {
  static const int kinds[] = {0, 1, 2, 0, 1, 2, 3, -1, 0x7FFFFFFF};
  struct ent ce;
  int held;
  cusafe_context c = choose(t, T_CTX, -1, &ce, &held);
  int kind = PICK(&t->r, kinds);
  size_t size = alloc_size(t);
  cusafe_buffer b = 42;
  cusafe_status st;
  if (u8(&t->r) % 16 == 15) {
    st = cusafe_buffer_alloc(NULL, c, (cusafe_memory)kind, size);
    expect(st, CUSAFE_ERROR_INVALID_VALUE, "cusafe_buffer_alloc(NULL)");
    return;
  }
  st = check_out(cusafe_buffer_alloc(&b, c, (cusafe_memory)kind, size), b,
                 T_BUF, "cusafe_buffer_alloc");
  if (st == CUSAFE_SUCCESS) {
    if (kind < 0 || kind > 2 || size > MAX_ALLOC)
      die("cusafe_buffer_alloc accepted kind %d size %zu", kind, size);
    cusafe_memory mk;
    expect(cusafe_buffer_get_memory(&mk, b), CUSAFE_SUCCESS,
           "cusafe_buffer_get_memory");
    if ((int)mk != kind)
      die("buffer of kind %d says kind %d", kind, (int)mk);
    check_buffer(b, size, ce.dev);
    struct ent e = {.dev = ce.dev, .size = size};
    keep(b, T_BUF, &e);
  } else if (size == 0 && st == CUSAFE_ERROR_INVALID_SIZE) {
    die("allocation of 0 bytes refused: %s", cusafe_last_error_message());
  }
}

static void op_alloc_async(struct th *t) {
  struct ent se;
  int held;
  cusafe_stream s = choose(t, T_STREAM, -1, &se, &held);
  size_t size = alloc_size(t);
  cusafe_buffer b = 42;
  if (u8(&t->r) % 32 == 31) {
    expect(cusafe_buffer_alloc_async(NULL, s, size), CUSAFE_ERROR_INVALID_VALUE,
           "cusafe_buffer_alloc_async(NULL)");
    return;
  }
  if (trace)
    fprintf(stderr, "fuzz_api: alloc_async %zu bytes on stream 0x%016llx\n",
            size, (unsigned long long)s);
  cusafe_status st = check_out(cusafe_buffer_alloc_async(&b, s, size), b, T_BUF,
                               "cusafe_buffer_alloc_async");
  if (st == CUSAFE_SUCCESS) {
    if (size > MAX_ALLOC)
      die("cusafe_buffer_alloc_async accepted size %zu", size);
    check_buffer(b, size, se.dev);
    struct ent e = {.dev = se.dev, .size = size};
    keep(b, T_BUF, &e);
  }
}

static void op_view(struct th *t) {
  struct ent pe;
  int held;
  cusafe_buffer p = choose(t, T_BUF, -1, &pe, &held);
  size_t off = rel(t, pe.size, 0), size = rel(t, pe.size, pe.size);
  cusafe_buffer v = 42;
  if (u8(&t->r) % 32 == 31) {
    expect(cusafe_buffer_view(NULL, p, off, size), CUSAFE_ERROR_INVALID_VALUE,
           "cusafe_buffer_view(NULL)");
    return;
  }
  cusafe_status st = check_out(cusafe_buffer_view(&v, p, off, size), v, T_BUF,
                               "cusafe_buffer_view");
  if (st == CUSAFE_SUCCESS) {
    if (held && (off > pe.size || size > pe.size - off))
      die("view [%zu, +%zu) of a buffer of %zu bytes accepted", off, size,
          pe.size);
    check_buffer(v, size, pe.dev);
    if (held && t->strict) {
      void *a = NULL, *b = NULL;
      expect(cusafe_buffer_interop_pointer(&a, p), CUSAFE_SUCCESS,
             "cusafe_buffer_interop_pointer");
      expect(cusafe_buffer_interop_pointer(&b, v), CUSAFE_SUCCESS,
             "cusafe_buffer_interop_pointer");
      if ((uintptr_t)b != (uintptr_t)a + off)
        die("view at offset %zu is at %p, its parent at %p", off, b, a);
    }
    /* The skew of a parent the harness does not hold is unknown: odd. */
    struct ent e = {.dev = pe.dev,
                    .size = size,
                    .skew = held ? (int)((pe.skew + off) % 8) : 1};
    keep(v, T_BUF, &e);
  } else if (held && t->strict && !faults_armed) {
    cusafe_status want = (off > pe.size || size > pe.size - off)
                             ? CUSAFE_ERROR_OUT_OF_RANGE
                             : CUSAFE_SUCCESS;
    if (st != want)
      die("view [%zu, +%zu) of %zu bytes returned %s, expected %s", off, size,
          pe.size, cusafe_status_string(st), cusafe_status_string(want));
  }
}

/* A host pointer for `size` bytes: the thread's scratch memory at an odd
 * start, or NULL. */
static unsigned char *host_ptr(struct th *t, unsigned char *base) {
  uint8_t m = u8(&t->r);
  if (m % 16 == 15)
    return NULL;
  return base + m % 61;
}

/* The range a transfer may touch of the host memory: never more than the
 * largest buffer. */
static void op_transfer(struct th *t, int to_host, int async) {
  struct ent be;
  int held;
  cusafe_buffer b = choose(t, T_BUF, -1, &be, &held);
  size_t off = rel(t, be.size, 0), size = rel(t, be.size, be.size);
  unsigned char *h = host_ptr(t, t->host);
  cusafe_status st;
  const char *what;
  if (trace)
    fprintf(stderr, "fuzz_api: %s%s buffer 0x%016llx [%zu, +%zu)\n",
            to_host ? "read" : "write", async ? "_async" : "",
            (unsigned long long)b, off, size);
  if (async) {
    cusafe_stream s = choose_stream(t, be.dev);
    if (trace)
      fprintf(stderr, "fuzz_api:   on stream 0x%016llx\n",
              (unsigned long long)s);
    st = to_host ? cusafe_buffer_read_async(b, off, h, size, s)
                 : cusafe_buffer_write_async(b, off, h, size, s);
    what = to_host ? "cusafe_buffer_read_async" : "cusafe_buffer_write_async";
  } else {
    st = to_host ? cusafe_buffer_read(b, off, h, size)
                 : cusafe_buffer_write(b, off, h, size);
    what = to_host ? "cusafe_buffer_read" : "cusafe_buffer_write";
  }
  check(st, what);
  /* Whatever the handle, a success never lets the host range run past
   * MAX_ALLOC bytes: it is within some buffer. */
  if (st == CUSAFE_SUCCESS && size && (!h || size > MAX_ALLOC))
    die("%s of %zu bytes at %p accepted", what, size, (void *)h);
  if (held && t->strict && (off > be.size || size > be.size - off) &&
      st == CUSAFE_SUCCESS)
    die("%s of %zu bytes at offset %zu of a %zu-byte buffer accepted", what,
        size, off, be.size);
}

static void op_copy(struct th *t) {
  struct ent de, se;
  int dh, sh;
  cusafe_buffer d = choose(t, T_BUF, -1, &de, &dh);
  cusafe_buffer s = u8(&t->r) % 8 == 7 ? d : choose(t, T_BUF, -1, &se, &sh);
  if (s == d)
    se = de, sh = dh;
  size_t doff = rel(t, de.size, 0), soff = rel(t, se.size, 0);
  size_t size = rel(t, se.size < de.size ? se.size : de.size,
                    se.size < de.size ? se.size : de.size);
  cusafe_stream st_h = choose_stream(t, u8(&t->r) & 1 ? de.dev : se.dev);
  if (trace)
    fprintf(stderr,
            "fuzz_api: copy 0x%016llx+%zu <- 0x%016llx+%zu, %zu bytes, "
            "stream 0x%016llx\n",
            (unsigned long long)d, doff, (unsigned long long)s, soff, size,
            (unsigned long long)st_h);
  cusafe_status st = cusafe_buffer_copy(d, doff, s, soff, size, st_h);
  check(st, "cusafe_buffer_copy");
  if (st == CUSAFE_SUCCESS && dh && sh &&
      (doff > de.size || size > de.size - doff || soff > se.size ||
       size > se.size - soff))
    die("copy of %zu bytes from offset %zu (of %zu) to offset %zu (of %zu) "
        "accepted",
        size, soff, se.size, doff, de.size);
}

static void op_fill(struct th *t) {
  struct ent be;
  int held;
  cusafe_buffer b = choose(t, T_BUF, -1, &be, &held);
  size_t off = rel(t, be.size, 0), size = rel(t, be.size, be.size);
  cusafe_stream s = choose_stream(t, be.dev);
  if (trace)
    fprintf(stderr, "fuzz_api: fill 0x%016llx [%zu, +%zu) stream 0x%016llx\n",
            (unsigned long long)b, off, size, (unsigned long long)s);
  cusafe_status st = cusafe_buffer_fill(b, off, size, u8(&t->r), s);
  check(st, "cusafe_buffer_fill");
  if (st == CUSAFE_SUCCESS && held && (off > be.size || size > be.size - off))
    die("fill of %zu bytes at offset %zu of %zu bytes accepted", size, off,
        be.size);
}

/* Writes a pattern into a held buffer and reads it back: with no failure
 * injected the bytes must come back, whatever work is queued before. */
static void op_roundtrip(struct th *t) {
  struct ent be;
  cusafe_buffer b = pick_held(t, T_BUF, -1, &be);
  if (!b)
    return;
  size_t off = rel(t, be.size, 0) % (be.size + 1);
  size_t n = be.size - off;
  if (n > 512)
    n = 512;
  unsigned char seed = u8(&t->r);
  unsigned char pat[512], back[512];
  for (size_t i = 0; i < n; i++)
    pat[i] = (unsigned char)(seed + 7 * i);
  cusafe_status st = cusafe_buffer_write(b, off, pat, n);
  check(st, "cusafe_buffer_write");
  if (st != CUSAFE_SUCCESS)
    return;
  memset(back, 0, sizeof back);
  st = cusafe_buffer_read(b, off, back, n);
  check(st, "cusafe_buffer_read");
  if (st == CUSAFE_SUCCESS && memcmp(pat, back, n))
    die("%zu bytes written at offset %zu of a %zu-byte buffer read back "
        "differently",
        n, off, be.size);
}

/* ------------------------------------------------------------------------ */
/* Events and streams                                                         */
/* ------------------------------------------------------------------------ */

static void op_event(struct th *t) {
  struct ent ee;
  int held;
  cusafe_event ev = choose(t, T_EVENT, -1, &ee, &held);
  switch (u8(&t->r) % 5) {
  case 0:
  case 1:
    check(cusafe_event_record(ev, choose_stream(t, ee.dev)),
          "cusafe_event_record");
    break;
  case 2:
    check(cusafe_event_synchronize(ev), "cusafe_event_synchronize");
    break;
  case 3: check(cusafe_event_query(ev), "cusafe_event_query"); break;
  default: {
    int h2;
    cusafe_event other = choose(t, T_EVENT, ee.dev, NULL, &h2);
    float ms = -1.0f;
    cusafe_status st = u8(&t->r) % 8 == 7
                           ? cusafe_event_elapsed_ms(NULL, ev, other)
                           : cusafe_event_elapsed_ms(&ms, ev, other);
    check(st, "cusafe_event_elapsed_ms"); /* negative if end came first */
    break;
  }
  }
}

static void op_stream(struct th *t) {
  struct ent se;
  int held;
  cusafe_stream s = choose(t, T_STREAM, -1, &se, &held);
  switch (u8(&t->r) % 9) {
  case 0:
    check(cusafe_stream_synchronize(s), "cusafe_stream_synchronize");
    break;
  case 1: check(cusafe_stream_query(s), "cusafe_stream_query"); break;
  case 2: {
    int h2;
    cusafe_event ev = choose(t, T_EVENT, se.dev, NULL, &h2);
    if (trace)
      fprintf(stderr, "fuzz_api: stream 0x%016llx waits for event 0x%016llx\n",
              (unsigned long long)s, (unsigned long long)ev);
    check(cusafe_stream_wait_event(s, ev), "cusafe_stream_wait_event");
    break;
  }
  case 3: {
    void *p = NULL;
    cusafe_status st = u8(&t->r) % 8 == 7
                           ? cusafe_stream_interop_handle(NULL, s)
                           : cusafe_stream_interop_handle(&p, s);
    check(st, "cusafe_stream_interop_handle");
    if (st == CUSAFE_SUCCESS && !p && held && !se.wrapped)
      die("cusafe_stream_interop_handle gave NULL");
    break;
  }
  case 5:
    check(cusafe_stream_begin_capture(s), "cusafe_stream_begin_capture");
    break;
  case 6: {
    cusafe_graph g = 42;
    cusafe_status st = u8(&t->r) % 16 == 15
                           ? cusafe_stream_end_capture(NULL, s)
                           : check_out(cusafe_stream_end_capture(&g, s), g,
                                       T_GRAPH, "cusafe_stream_end_capture");
    check(st, "cusafe_stream_end_capture");
    if (st == CUSAFE_SUCCESS && g != 42) {
      struct ent e = {.dev = se.dev};
      keep(g, T_GRAPH, &e);
    }
    break;
  }
  case 7: {
    int h2;
    cusafe_graph g = choose(t, T_GRAPH, se.dev, NULL, &h2);
    if (u8(&t->r) % 4 == 3)
      check(cusafe_graph_instantiate(g), "cusafe_graph_instantiate");
    else
      check(cusafe_graph_launch(g,
                                u8(&t->r) % 4 == 3 ? CUSAFE_STREAM_DEFAULT : s),
            "cusafe_graph_launch");
    break;
  }
  case 8: {
    int on = -1;
    cusafe_status st = u8(&t->r) % 16 == 15
                           ? cusafe_stream_is_capturing(NULL, s)
                           : cusafe_stream_is_capturing(&on, s);
    check(st, "cusafe_stream_is_capturing");
    if (st == CUSAFE_SUCCESS && on != 0 && on != 1)
      die("cusafe_stream_is_capturing gave %d", on);
    break;
  }
  default: {
    cusafe_context c = CUSAFE_NULL_HANDLE;
    cusafe_status st = check_out(cusafe_stream_get_context(&c, s), c, T_CTX,
                                 "cusafe_stream_get_context");
    if (st == CUSAFE_SUCCESS) {
      struct ent e = {.dev = se.dev};
      keep(c, T_CTX, &e);
    }
  }
  }
}

/* Memory of another library, which op_wrap() wraps: made and freed through
 * the CUDA table, as that library would (counted and failed like cusafe's
 * own calls), on the device current on the thread. */
struct foreign {
  void *ptr;
  int kind;
  /* The other library's hold on the device's primary context while its
   * memory lives (as the runtime's own retain would be): a context of the
   * harness's, so that no thread's release of the last other reference
   * can take the primary context from under the memory. */
  cusafe_context ctx;
  int dev; /* ctx's device */
};

/* The release function: the other library frees its memory, which cusafe
 * hands back from inside one of its calls or from its shutdown. */
static void drop_foreign(struct foreign *f) {
  if (f->ctx) {
    atomic_fetch_sub(&foreign_refs[f->dev], 1);
    cusafe_context_release(f->ctx); /* a no-op after the shutdown */
  }
  free(f);
}

static void free_foreign(void *user) {
  struct foreign *f = user;
  if (f->kind == CUSAFE_MEMORY_HOST_PINNED)
    cs_cu->free_host(f->ptr);
  else
    cs_cu->free(f->ptr);
  drop_foreign(f);
}

/* Memory of another library wrapped (sometimes said to be of another
 * kind): given back, and freed, when the wrapper goes. */
static void op_wrap(struct th *t) {
  struct ent ce;
  int held;
  cusafe_context c = choose(t, T_CTX, -1, &ce, &held);
  static const size_t sizes[] = {64, 4096, 1, 0, 100};
  size_t size = PICK(&t->r, sizes);
  struct foreign *f = malloc(sizeof *f);
  if (!f)
    die("out of memory");
  f->kind = u8(&t->r) % 3;
  f->ptr = NULL;
  f->ctx = CUSAFE_NULL_HANDLE;
  int dev = 0;
  if (ce.dev >= 0)
    cs_cu->set_device(ce.dev);
  cs_cu->get_device(&dev);
  if (ce.dev >= 0 && dev != ce.dev) {
    free(f); /* not made on the context's device: the context may go first */
    return;
  }
  /* A context of unknown device (not held, or another thread's): no
   * memory, which would belong to whatever device is current -- pinned or
   * managed memory would wrap on another device's context, and the
   * current one's could go first. */
  if (ce.dev < 0)
    size = 0;
  if (size && cusafe_context_create(&f->ctx, ce.dev) != CUSAFE_SUCCESS) {
    free(f); /* the device is broken, or the library shut down */
    return;
  }
  if (f->ctx) {
    f->dev = ce.dev;
    atomic_store(&foreign_ctx[ce.dev], f->ctx);
    atomic_fetch_add(&foreign_refs[ce.dev], 1);
  }
  cudaError_t err = cudaSuccess;
  if (size) {
    if (f->kind == CUSAFE_MEMORY_DEVICE)
      err = cs_cu->malloc_async(&f->ptr, size, NULL);
    else if (f->kind == CUSAFE_MEMORY_HOST_PINNED)
      err = cs_cu->malloc_host(&f->ptr, size);
    else
      err = cs_cu->malloc_managed(&f->ptr, size, cudaMemAttachGlobal);
  }
  if (err != cudaSuccess) {
    drop_foreign(f);
    return;
  }
  int said = u8(&t->r) % 8 == 7 ? (f->kind + 1) % 3 : f->kind;
  cusafe_buffer w = 42;
  cusafe_status st =
      check_out(cusafe_buffer_wrap(&w, c, (cusafe_memory)said, f->ptr, size,
                                   free_foreign, f),
                w, T_BUF, "cusafe_buffer_wrap");
  if (st == CUSAFE_SUCCESS) {
    if (held && t->strict && size > 0 && said != f->kind)
      die("memory of kind %d wrapped as kind %d", f->kind, said);
    check_buffer(w, size, ce.dev);
    struct ent e = {.dev = ce.dev, .size = size};
    keep(w, T_BUF, &e);
    return;
  }
  if (held && t->strict && quiet() && said == f->kind && dev == ce.dev)
    die("cusafe_buffer_wrap of another library's memory failed: %s",
        cusafe_last_error_message());
  free_foreign(f); /* refused: the memory stays its owner's */
}

/* ------------------------------------------------------------------------ */
/* Another library                                                            */
/* ------------------------------------------------------------------------ */

/* The harness as another library of the process (PyTorch, CuPy): it makes
 * streams that cusafe wraps (fake_foreign_stream()) and memory that cusafe
 * imports (op_import), and, as the runtime would for it, holds a device's
 * primary context while it has objects there, so that cusafe's last
 * release of a context is not the last one.  All of it goes at the end of
 * the input, after cusafe let go of everything (other_finish()). */
#define MAXFS 4
static pthread_mutex_t other_lock = PTHREAD_MUTEX_INITIALIZER;
static int other_ctx[2];                 /* primary context retained */
static cudaStream_t other_stream[MAXFS]; /* its streams, wrapped by cusafe */
static int other_stream_dev[MAXFS];
static int nother;
static cudaStream_t other_free[2]; /* the stream of its frees, per device */
static CUresult (*prim_retain)(CUcontext *, CUdevice);
static CUresult (*prim_release)(CUdevice);

/* Retains dev's primary context for the other library (other_lock
 * held); 0 if it cannot (an injected failure). */
static int other_hold(int dev) {
  static const char *const names[2] = {"cuDevicePrimaryCtxRetain",
                                       "cuDevicePrimaryCtxRelease"};
  void **fns[2] = {(void **)&prim_retain, (void **)&prim_release};
  if (other_ctx[dev])
    return 1;
  for (int i = 0; i < 2; i++) {
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    void *fn = NULL;
    if (*fns[i])
      continue;
    if (cs_cu->get_driver_entry_point(names[i], &fn, 12000, cudaEnableDefault,
                                      &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn)
      return 0;
    *fns[i] = fn;
  }
  CUcontext c;
  if (prim_retain(&c, (CUdevice)dev) != CUDA_SUCCESS)
    return 0;
  other_ctx[dev] = 1;
  return 1;
}

/* The other library's stream number i if it has one (of either device),
 * else a new one on dev (NULL if it cannot have one); *sdev is its
 * device. */
static cudaStream_t other_stream_get(int dev, int i, int *sdev) {
  cudaStream_t s = NULL;
  pthread_mutex_lock(&other_lock);
  if (i < nother) {
    s = other_stream[i];
    *sdev = other_stream_dev[i];
  } else if (nother < MAXFS && other_hold(dev)) {
    s = fake_foreign_stream(dev);
    other_stream[nother] = s;
    other_stream_dev[nother++] = dev;
    *sdev = dev;
  }
  pthread_mutex_unlock(&other_lock);
  return s;
}

/* The other library's end: its streams destroyed, its primary contexts
 * released -- unless the fake's teardown took everything already. */
static void other_finish(int torn) {
  for (int i = 0; i < nother && !torn; i++)
    fake_foreign_stream_destroy(other_stream[i]);
  nother = 0;
  for (int d = 0; d < 2; d++) {
    if (other_free[d] && !torn && cs_cu->stream_destroy(other_free[d]))
      die("the other library's stream of device %d could not be destroyed", d);
    if (other_ctx[d] && !torn && prim_release((CUdevice)d) != CUDA_SUCCESS)
      die("the other library's primary context of device %d could not be "
          "released",
          d);
    other_free[d] = NULL;
    other_ctx[d] = 0;
  }
}

#ifdef CUSAFE_HAVE_DLPACK
/* ------------------------------------------------------------------------ */
/* DLPack                                                                     */
/* ------------------------------------------------------------------------ */

/* The stream on which the other library frees its memory of dev: its own
 * and non-blocking, so that a free there waits for no other stream
 * (other_lock held; NULL if it cannot have one). */
static cudaStream_t other_free_stream(int dev) {
  if (!other_free[dev] && other_hold(dev)) {
    cudaStream_t s = NULL;
    if (cs_cu->set_device(dev) == cudaSuccess &&
        cs_cu->stream_create(&s, cudaStreamNonBlocking, 0) == cudaSuccess)
      other_free[dev] = s;
  }
  return other_free[dev];
}

/* Memory of the other library lent to cusafe as a DLPack tensor
 * (op_import), until cusafe calls its deleter. */
struct import {
  union {
    DLManagedTensorVersioned v;
    DLManagedTensor l;
  } t;
  int64_t shape[2], strides[1];
  void *mem;
  int kind, dev;
  cudaStream_t fs;   /* other_free_stream(dev) */
  cusafe_buffer buf; /* what cusafe made of it; 0 if refused */
  _Atomic int ran;   /* calls of its deleter */
};
#define MAXIMP 16
static struct import *imports[MAXIMP]; /* under other_lock */
static int nimports;

/* The deleter: once, never while the harness still holds the buffer; the
 * memory is freed at once (stream-ordered on the other library's own
 * stream, which is then synchronised): whatever cusafe queued on it and
 * has not run yet is a VIOLATION of the fake's when it runs. */
static void import_free(struct import *m) {
  if (atomic_fetch_add(&m->ran, 1))
    die("the deleter of imported tensor %p (buffer 0x%016llx) ran twice",
        m->mem, (unsigned long long)m->buf);
  if (trace)
    fprintf(stderr, "fuzz_api: deleter of imported buffer 0x%016llx\n",
            (unsigned long long)m->buf);
  if (m->buf && !shutting) {
    pthread_mutex_lock(&pool_lock);
    struct ent *e = ent_find(m->buf);
    int held = e && e->refs + e->pin > 0;
    pthread_mutex_unlock(&pool_lock);
    if (held)
      die("the deleter of imported buffer 0x%016llx ran while the harness "
          "holds the buffer",
          (unsigned long long)m->buf);
  }
  if (!m->mem)
    return;
  if (m->kind == CUSAFE_MEMORY_DEVICE) {
    if (cs_cu->free_async(m->mem, m->fs) == cudaSuccess)
      (void)cs_cu->stream_synchronize(m->fs);
    else
      (void)cs_cu->free(m->mem);
  } else if (m->kind == CUSAFE_MEMORY_HOST_PINNED) {
    (void)cs_cu->free_host(m->mem);
  } else {
    (void)cs_cu->free(m->mem);
  }
}

static void import_deleter(DLManagedTensorVersioned *t) {
  import_free(t->manager_ctx);
}

static void import_deleter_legacy(DLManagedTensor *t) {
  import_free(t->manager_ctx);
}

/* Every import's deleter ran exactly once (`check`: once cusafe let go of
 * everything); the records go. */
static void imports_finish(int check_ran) {
  for (int i = 0; i < nimports; i++) {
    int ran = atomic_load(&imports[i]->ran);
    if (check_ran && ran != 1)
      die("the deleter of imported buffer 0x%016llx ran %d times by the end",
          (unsigned long long)imports[i]->buf, ran);
    free(imports[i]);
  }
  nimports = 0;
}

/* Memory of the other library (device memory mostly; pinned, managed),
 * imported as a buffer of a chosen context: whole, as a 2-D tensor, with
 * a negative stride, with a byte offset, and wrong ones (another device,
 * read-only, beyond the allocation); an empty tensor.  On success the pool
 * holds the buffer; refused, the harness calls the deleter itself. */
static void op_import(struct th *t) {
  static const size_t sizes[] = {64, 256, 8, 4096, 1, 24, 0};
  struct ent ce;
  int held;
  cusafe_context c = choose(t, T_CTX, -1, &ce, &held);
  size_t n = PICK(&t->r, sizes);
  uint8_t k = u8(&t->r), how = u8(&t->r) % 8, m = u8(&t->r);
  int kind = k % 8 == 6   ? CUSAFE_MEMORY_HOST_PINNED
             : k % 8 == 7 ? CUSAFE_MEMORY_MANAGED
                          : CUSAFE_MEMORY_DEVICE;
  int dev = ce.dev >= 0 ? ce.dev : (m >> 7);
  int legacy = m & 1;
  struct import *im = calloc(1, sizeof *im);
  if (!im)
    die("out of memory");
  pthread_mutex_lock(&other_lock);
  cudaStream_t fs = nimports < MAXIMP ? other_free_stream(dev) : NULL;
  if (fs)
    imports[nimports++] = im;
  pthread_mutex_unlock(&other_lock);
  if (!fs) {
    free(im);
    return;
  }
  im->kind = kind;
  im->dev = dev;
  im->fs = fs;
  cudaError_t err = cs_cu->set_device(dev);
  if (err == cudaSuccess && n) {
    if (kind == CUSAFE_MEMORY_DEVICE)
      err = cs_cu->malloc_async(&im->mem, n, fs);
    else if (kind == CUSAFE_MEMORY_HOST_PINNED)
      err = cs_cu->malloc_host(&im->mem, n);
    else
      err = cs_cu->malloc_managed(&im->mem, n, cudaMemAttachGlobal);
  }
  if (err != cudaSuccess) {
    atomic_store(&im->ran, 1); /* nothing made, nothing to delete */
    return;
  }
  static const DLDeviceType types[] = {kDLCUDA, kDLCUDAHost, kDLCUDAManaged};
  DLTensor dl = {.data = im->mem,
                 .device = {types[kind], kind ? 0 : dev},
                 .ndim = 1,
                 .dtype = {kDLUInt, 8, 1},
                 .shape = im->shape};
  im->shape[0] = (int64_t)n;
  size_t extent = n;
  int valid = 1;
  switch (how) {
  case 1:
    if (n >= 2) {
      dl.ndim = 2;
      im->shape[0] = 2;
      im->shape[1] = (int64_t)n / 2;
      extent = n / 2 * 2;
    }
    break;
  case 2:
    if (n) {
      im->strides[0] = -1;
      dl.strides = im->strides;
      dl.data = (char *)im->mem + n - 1;
    }
    break;
  case 3:
    if (n > 8) {
      dl.byte_offset = 8;
      im->shape[0] = (int64_t)n - 8;
      extent = n - 8;
    }
    break;
  case 4:
    dl.device.device_id = !dev;
    valid = kind != CUSAFE_MEMORY_DEVICE;
    break;
  case 5: valid = legacy; break; /* read-only */
  case 6:
    im->shape[0] = 0;
    dl.data = NULL;
    extent = 0;
    break;
  case 7:
    im->shape[0] = (int64_t)n + 1;
    valid = 0;
    break;
  default: break;
  }
  if (legacy) {
    im->t.l = (DLManagedTensor){dl, im, import_deleter_legacy};
  } else {
    im->t.v =
        (DLManagedTensorVersioned){{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION},
                                   im,
                                   import_deleter,
                                   how == 5 ? DLPACK_FLAG_BITMASK_READ_ONLY : 0,
                                   dl};
  }
  if (trace)
    fprintf(stderr,
            "fuzz_api: import %zu bytes of kind %d on device %d (case %d%s)\n",
            n, kind, dev, how, legacy ? ", legacy" : "");
  cusafe_buffer b = 42;
  cusafe_status st = legacy ? cusafe_buffer_from_dlpack_legacy(&b, c, &im->t.l)
                            : cusafe_buffer_from_dlpack(&b, c, &im->t.v);
  st = check_out(st, b, T_BUF, "cusafe_buffer_from_dlpack");
  if (st == CUSAFE_SUCCESS) {
    im->buf = b;
    if (held && t->strict && !valid)
      die("import of a wrong tensor (case %d, kind %d) accepted", how, kind);
    if (held && t->strict)
      check_buffer(b, extent, ce.dev);
    struct ent e = {.dev = ce.dev, .size = extent};
    keep(b, T_BUF, &e);
    return;
  }
  if (held && t->strict && quiet() && valid)
    die("import of the other library's memory failed: %s",
        cusafe_last_error_message());
  if (legacy) /* refused: the tensor is still the caller's */
    im->t.l.deleter(&im->t.l);
  else
    im->t.v.deleter(&im->t.v);
}

#define MAXPEND 16
static struct pending tensors[MAXPEND];
static int ntensors;
static pthread_mutex_t tensor_lock = PTHREAD_MUTEX_INITIALIZER;

/* The consumer drops its tensor (its deleter), then its own wrapper of
 * the memory. */
static void pending_delete(struct pending *p) {
  if (trace)
    fprintf(stderr,
            "fuzz_api: deleter of exported tensor %p (stream "
            "0x%016llx)\n",
            p->tensor, (unsigned long long)p->consumer);
  if (p->legacy)
    ((DLManagedTensor *)p->tensor)->deleter(p->tensor);
  else
    ((DLManagedTensorVersioned *)p->tensor)->deleter(p->tensor);
  if (p->alias) {
    cusafe_status st = cusafe_buffer_release(p->alias);
    check(st, "cusafe_buffer_release (the consumer's wrapper)");
    if (st == CUSAFE_ERROR_INVALID_HANDLE)
      die("release of the consumer's wrapper 0x%016llx says stale: %s",
          (unsigned long long)p->alias, cusafe_last_error_message());
  }
}

static void pending_add(const struct pending *p) {
  pthread_mutex_lock(&tensor_lock);
  int full = ntensors == MAXPEND;
  if (!full)
    tensors[ntensors++] = *p;
  pthread_mutex_unlock(&tensor_lock);
  if (full) {
    struct pending q = *p;
    pending_delete(&q);
  }
}

/* Takes pending tensor number k (modulo their count) out; 0 if none. */
static int pending_take(unsigned k, struct pending *p) {
  pthread_mutex_lock(&tensor_lock);
  int n = ntensors;
  if (n) {
    *p = tensors[k % n];
    tensors[k % n] = tensors[--ntensors];
  }
  pthread_mutex_unlock(&tensor_lock);
  return n > 0;
}

/* The helper thread: one deleter on a thread of its own, started and
 * joined by the thread whose input asked for it. */
static void *helper_main(void *arg) {
  pending_delete(arg);
  return NULL;
}

static void helper_join(struct th *t) {
  if (t->helper_on) {
    pthread_join(t->helper, NULL);
    t->helper_on = 0;
  }
}

static void helper_start(struct th *t, const struct pending *p) {
  helper_join(t);
  t->job = *p;
  if (pthread_create(&t->helper, NULL, helper_main, &t->job)) {
    pending_delete(&t->job);
    return;
  }
  t->helper_on = 1;
}

/* Every pending deleter, every other one on the helper thread. */
static void pending_delete_all(struct th *t) {
  struct pending p;
  for (int i = 0; pending_take(0, &p); i++) {
    if (i & 1) {
      helper_start(t, &p);
      helper_join(t);
    } else {
      pending_delete(&p);
    }
  }
}

/* A buffer exported as a tensor of a chosen shape (in range or not), which
 * is then deleted, kept for later, or imported back into its context as
 * a buffer that the pool holds (and whose release deletes it). */
static void op_dlpack(struct th *t) {
  struct ent be;
  int held;
  cusafe_buffer b = choose(t, T_BUF, -1, &be, &held);
  static const int64_t dims[] = {0, 1, 2, 3, 7, 16, 64, 1000, -1, INT64_MAX};
  static const int64_t steps[] = {1, -1, 0, 2, 16, -16, INT64_MAX};
  static const size_t offsets[] = {0, 1, 4, 64, 4096, 100};
  int64_t shape[3], strides[3];
  uint8_t m = u8(&t->r);
  DLDataType dt = {kDLUInt, (uint8_t)(m % 16 == 15 ? 4 : 8 << (m % 4)), 1};
  int32_t ndim = (int32_t)(u8(&t->r) % 4);
  for (int i = 0; i < 3; i++) {
    shape[i] = PICK(&t->r, dims);
    strides[i] = PICK(&t->r, steps);
  }
  size_t offset = PICK(&t->r, offsets);
  DLManagedTensorVersioned *d = NULL;
  cusafe_status st =
      cusafe_buffer_to_dlpack(&d, b, offset, dt, ndim, shape,
                              m & 16 ? strides : NULL, CUSAFE_NULL_HANDLE);
  check(st, "cusafe_buffer_to_dlpack");
  if (st != CUSAFE_SUCCESS) {
    if (d)
      die("a refused export gave a tensor");
    return;
  }
  if (d->dl_tensor.ndim != ndim || d->dl_tensor.byte_offset != 0 ||
      (ndim && !d->dl_tensor.strides))
    die("exported tensor of ndim %d: ndim %d, byte_offset %llu", ndim,
        d->dl_tensor.ndim, (unsigned long long)d->dl_tensor.byte_offset);
  for (int i = 0; i < ndim; i++)
    if (d->dl_tensor.shape[i] != shape[i] ||
        (m & 16 && d->dl_tensor.strides[i] != strides[i]))
      die("exported tensor's dimension %d differs", i);
  switch (u8(&t->r) % 3) {
  case 0: d->deleter(d); break;
  case 1: {
    struct pending p = {.tensor = d, .dev = -1};
    pending_add(&p);
    break;
  }
  default: {
    cusafe_context c = CUSAFE_NULL_HANDLE;
    cusafe_buffer in = 42;
    if (cusafe_buffer_get_context(&c, b) != CUSAFE_SUCCESS) {
      d->deleter(d);
      break;
    }
    st = check_out(cusafe_buffer_from_dlpack(&in, c, d), in, T_BUF,
                   "cusafe_buffer_from_dlpack");
    check(cusafe_context_release(c), "cusafe_context_release");
    if (st != CUSAFE_SUCCESS) {
      d->deleter(d); /* refused: still ours */
      break;
    }
    size_t size = 0;
    check(cusafe_buffer_get_size(&size, in), "cusafe_buffer_get_size");
    struct ent e = {.dev = be.dev, .size = size};
    keep(in, T_BUF, &e);
  }
  }
  if (u8(&t->r) % 4 == 0) {
    struct pending p;
    if (pending_take(0, &p))
      pending_delete(&p);
  }
}

static void consumer_work(struct th *t, struct pending *p, int how);

/* A buffer of the pool exported for a consumer that works on a stream of
 * the pool (any kind: cusafe's, a wrapper, another library's, a default
 * stream) or on none, in either ABI, maybe worked on by the consumer at
 * once; its deleter stays pending (see op_tensor). */
static void op_export(struct th *t) {
  struct ent be, se;
  int held, sheld = 0;
  cusafe_buffer b = choose(t, T_BUF, -1, &be, &held);
  uint8_t m = u8(&t->r);
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  memset(&se, 0, sizeof se);
  se.dev = -1;
  if (m % 4 != 3)
    s = choose(t, T_STREAM, be.dev, &se, &sheld);
  int legacy = m >> 2 & 1;
  size_t off = rel(t, be.size, 0);
  size_t room = off <= be.size ? be.size - off : 0;
  size_t len = rel(t, room, room);
  int64_t shape[1] = {len > (size_t)INT64_MAX ? -1 : (int64_t)len};
  DLDataType dt = {kDLUInt, 8, 1};
  DLManagedTensorVersioned *v = NULL;
  DLManagedTensor *l = NULL;
  if (trace)
    fprintf(stderr,
            "fuzz_api: export 0x%016llx [%zu, +%zu) for stream 0x%016llx%s\n",
            (unsigned long long)b, off, len, (unsigned long long)s,
            legacy ? " (legacy)" : "");
  cusafe_status st =
      legacy ? cusafe_buffer_to_dlpack_legacy(&l, b, off, dt, 1, shape, NULL, s)
             : cusafe_buffer_to_dlpack(&v, b, off, dt, 1, shape, NULL, s);
  check(st,
        legacy ? "cusafe_buffer_to_dlpack_legacy" : "cusafe_buffer_to_dlpack");
  int fits = off <= be.size && len <= room;
  if (st != CUSAFE_SUCCESS) {
    if (v || l)
      die("a refused export gave a tensor");
    if (held && (sheld || !s) && t->strict && quiet() && fits &&
        (!s || se.dev == be.dev))
      die("export of %zu bytes at offset %zu of %zu bytes failed: %s", len, off,
          be.size, cusafe_last_error_message());
    return;
  }
  if (held && t->strict && !fits)
    die("export of %zu bytes at offset %zu of %zu bytes accepted", len, off,
        be.size);
  if (held && sheld && t->strict && se.dev != be.dev)
    die("export for a stream of device %d of a buffer of device %d accepted",
        se.dev, be.dev);
  DLTensor *dl = legacy ? &l->dl_tensor : &v->dl_tensor;
  if (held && t->strict && len) {
    void *a = NULL;
    expect(cusafe_buffer_interop_pointer(&a, b), CUSAFE_SUCCESS,
           "cusafe_buffer_interop_pointer");
    if (dl->data != (char *)a + off)
      die("tensor exported at offset %zu is at %p, its buffer at %p", off,
          dl->data, a);
  }
  struct pending p = {
      .tensor = legacy ? (void *)l : (void *)v,
      .legacy = legacy,
      .consumer = s,
      .dev = held    ? be.dev
             : sheld ? se.dev
                     : -1,
      .kind = dl->device.device_type == kDLCUDAHost ? CUSAFE_MEMORY_HOST_PINNED
              : dl->device.device_type == kDLCUDAManaged ? CUSAFE_MEMORY_MANAGED
                                                         : CUSAFE_MEMORY_DEVICE,
      .data = dl->data,
      .reach = held && dl->data ? len : 0};
  if (s && cusafe_stream_interop_handle(&p.raw, s) == CUSAFE_SUCCESS)
    p.raw_known = 1;
  if (!(m & 0x10)) /* the consumer works on the tensor at once */
    consumer_work(t, &p, (m >> 5) % 3);
  pending_add(&p);
}

/* Whether work queued on the consumer's CUDA stream now runs now (1), or
 * would be captured (0): captured work would outlive the tensor, which is
 * the consumer's mistake, not cusafe's. */
static int consumer_free_to_work(const struct pending *p) {
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  return p->raw_known && p->dev >= 0 && p->data && p->reach &&
         cs_cu->set_device(p->dev) == cudaSuccess &&
         cs_cu->stream_is_capturing(p->raw, &cs) == cudaSuccess &&
         cs == cudaStreamCaptureStatusNone;
}

/* The consumer's work on a tensor's memory, on its stream, before it drops
 * the tensor: a memset of its own on the CUDA stream, or a fill through
 * its own wrapper of the memory (kept until the deleter runs) on the
 * stream or on a new wrapper of the CUDA stream. */
static void consumer_work(struct th *t, struct pending *p, int how) {
  size_t n = p->reach < 256 ? p->reach : 256;
  uint8_t v = u8(&t->r);
  if (!t->strict || !consumer_free_to_work(p))
    return; /* another thread may begin a capture meanwhile */
  if (how == 0) {
    cudaError_t err = cs_cu->memset_async(p->data, v, n, p->raw);
    if (trace)
      fprintf(stderr,
              "fuzz_api: the consumer's memset of %zu bytes at %p on "
              "CUDA stream %p: %d\n",
              n, (void *)p->data, p->raw, (int)err);
    return;
  }
  if (p->alias || !p->consumer)
    return;
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream s = p->consumer, w = CUSAFE_NULL_HANDLE;
  if (cusafe_stream_get_context(&c, s) != CUSAFE_SUCCESS)
    return; /* its handle went stale */
  if (how == 2) {
    cusafe_status st = check_out(cusafe_stream_wrap(&w, c, p->raw), w, T_STREAM,
                                 "cusafe_stream_wrap (consumer)");
    if (st != CUSAFE_SUCCESS) {
      check(cusafe_context_release(c), "cusafe_context_release");
      return;
    }
    s = w;
  }
  cusafe_buffer a = 42;
  cusafe_status st = check_out(
      cusafe_buffer_wrap(&a, c, (cusafe_memory)p->kind, p->data, n, NULL, NULL),
      a, T_BUF, "cusafe_buffer_wrap (consumer)");
  if (st == CUSAFE_SUCCESS) {
    p->alias = a;
    if (trace)
      fprintf(stderr,
              "fuzz_api: the consumer's fill of %zu bytes through "
              "0x%016llx on stream 0x%016llx\n",
              n, (unsigned long long)a, (unsigned long long)s);
    check(cusafe_buffer_fill(a, 0, n, v, s), "cusafe_buffer_fill (consumer)");
  }
  if (w)
    check(cusafe_stream_release(w), "cusafe_stream_release (consumer)");
  check(cusafe_context_release(c), "cusafe_context_release");
}

/* A pending tensor: its deleter now, on the helper thread (joined at once,
 * or after the next operation), or the consumer's work on its memory. */
static void op_tensor(struct th *t) {
  uint8_t k = u8(&t->r), mode = u8(&t->r) % 8;
  struct pending p;
  if (!pending_take(k, &p))
    return;
  switch (mode) {
  case 1:
    helper_start(t, &p);
    helper_join(t);
    break;
  case 2: helper_start(t, &p); break; /* joined by run_ops() */
  case 4:
  case 5:
  case 6:
  case 7:
    consumer_work(t, &p, mode == 7 ? 2 : mode == 6);
    pending_add(&p);
    break;
  default: pending_delete(&p); break;
  }
}
#else
static void op_import(struct th *t) { (void)t; }
static void op_export(struct th *t) { (void)t; }
static void op_tensor(struct th *t) { (void)t; }
static void helper_join(struct th *t) { (void)t; }
#endif

/* Memory shared between processes: a new shareable buffer joins the pool,
 * and is exported at once, or a buffer of the pool is (refused unless it
 * is shareable); the description is imported as another process would
 * (its process renamed), and the imported buffer joins the pool too. */
static void op_shareable(struct th *t) {
  struct ent ce, be;
  int held, bheld;
  int how = u8(&t->r) % 3;
  cusafe_buffer b = 42;
  if (how < 2) {
    cusafe_context c = choose(t, T_CTX, -1, &ce, &held);
    size_t size = alloc_size(t);
    cusafe_status st = check_out(cusafe_buffer_alloc_shareable(&b, c, size), b,
                                 T_BUF, "cusafe_buffer_alloc_shareable");
    if (st != CUSAFE_SUCCESS) {
      if (size == 0 && st != CUSAFE_ERROR_INVALID_SIZE && held)
        die("a shareable buffer of 0 bytes: %s", cusafe_status_string(st));
      return;
    }
    if (size == 0 || size > MAX_ALLOC)
      die("cusafe_buffer_alloc_shareable accepted size %zu", size);
    check_buffer(b, size, ce.dev);
    be = (struct ent){.dev = ce.dev, .size = size};
    bheld = held;
    keep(b, T_BUF, &be);
    if (how == 0)
      return;
  } else {
    b = choose(t, T_BUF, -1, &be, &bheld);
  }
  cusafe_ipc_desc d;
  cusafe_status st = cusafe_buffer_export(&d, b);
  if (st != CUSAFE_SUCCESS) {
    if (d.fd != -1)
      die("a failed cusafe_buffer_export left fd %d", (int)d.fd);
    return;
  }
  d.process ^= 0x5a5a5a5a5a5a5a5aull;
  cusafe_context c = choose(t, T_CTX, -1, &ce, &held);
  cusafe_buffer in = 42;
  st = check_out(cusafe_buffer_import(&in, c, &d), in, T_BUF,
                 "cusafe_buffer_import");
  close(d.fd);
  if (st == CUSAFE_SUCCESS) {
    if (held && bheld && t->strict && ce.dev != be.dev)
      die("memory of device %d imported on device %d", be.dev, ce.dev);
    check_buffer(in, (size_t)d.size, ce.dev);
    struct ent e = {.dev = ce.dev, .size = (size_t)d.size};
    keep(in, T_BUF, &e);
  }
}

static int is_default_stream(const void *raw) {
  return !raw || raw == cudaStreamLegacy || raw == cudaStreamPerThread;
}

/* Other libraries' streams and work: a device's default stream wrapped
 * (which lives for ever, so the wrapper joins the pool), a held stream's
 * raw stream wrapped and used while the stream is held, and buffers
 * recorded as used by work on a stream. */
static void op_foreign(struct th *t) {
  struct ent ce, se;
  int held, sheld;
  switch (u8(&t->r) % 6) {
  case 5: op_shareable(t); break;
  case 3: op_wrap(t); break;
  case 4:
#ifdef CUSAFE_HAVE_DLPACK
    op_dlpack(t);
#endif
    break;
  case 0: {
    cusafe_context c = choose(t, T_CTX, -1, &ce, &held);
    cusafe_stream w = 42;
    void *dflt = open_defects ? NULL : (void *)cudaStreamPerThread;
    cusafe_status st = check_out(cusafe_stream_wrap(&w, c, dflt), w, T_STREAM,
                                 "cusafe_stream_wrap");
    if (st == CUSAFE_SUCCESS) {
      struct ent e = {.dev = ce.dev, .wrapped = 1, .skind = SK_DEFAULT};
      keep(w, T_STREAM, &e);
    } else if (held && t->strict && quiet()) {
      die("cusafe_stream_wrap of the default stream failed: %s",
          cusafe_last_error_message());
    }
    break;
  }
  case 1: {
    cusafe_context c = choose(t, T_CTX, -1, &ce, &held);
    cusafe_stream s = choose(t, T_STREAM, -1, &se, &sheld);
    void *raw = NULL;
    /* Only a stream kept alive meanwhile: its owner must. */
    if (cusafe_stream_retain(s) != CUSAFE_SUCCESS)
      break;
    if (cusafe_stream_interop_handle(&raw, s) != CUSAFE_SUCCESS) {
      check(cusafe_stream_release(s), "cusafe_stream_release");
      break;
    }
    cusafe_stream w = 42;
    /* The raw stream of a wrapped default stream (NULL, cudaStreamLegacy,
     * cudaStreamPerThread) is any device's. */
    int same = is_default_stream(raw) || ce.dev == se.dev;
    cusafe_status st = check_out(cusafe_stream_wrap(&w, c, raw), w, T_STREAM,
                                 "cusafe_stream_wrap");
    if (st == CUSAFE_SUCCESS) {
      if (held && sheld && t->strict && !same)
        die("a stream of device %d wrapped on device %d", se.dev, ce.dev);
      check(cusafe_stream_synchronize(w), "cusafe_stream_synchronize");
      check(cusafe_stream_release(w), "cusafe_stream_release");
    } else if (held && sheld && t->strict && quiet() && same) {
      die("cusafe_stream_wrap failed: %s", cusafe_last_error_message());
    } else if (held && sheld && t->strict && !faults_armed && !same &&
               st != CUSAFE_ERROR_CONTEXT_MISMATCH) {
      die("a stream of device %d wrapped on device %d returned %s", se.dev,
          ce.dev, cusafe_status_string(st));
    }
    check(cusafe_stream_release(s), "cusafe_stream_release");
    break;
  }
  default: {
    cusafe_buffer list[3];
    size_t n = u8(&t->r) % 4;
    cusafe_stream s = choose_stream(t, -1);
    for (size_t i = 0; i < n; i++)
      list[i] = choose(t, T_BUF, -1, NULL, &held);
    cusafe_status st = u8(&t->r) % 16 == 15
                           ? cusafe_stream_use_buffers(s, NULL, n)
                           : cusafe_stream_use_buffers(s, list, n);
    check(st, "cusafe_stream_use_buffers");
  }
  }
}

static void op_context(struct th *t) {
  struct ent ce;
  int held;
  cusafe_context c = choose(t, T_CTX, -1, &ce, &held);
  switch (u8(&t->r) % 5) {
  case 0:
    check(cusafe_context_synchronize(c), "cusafe_context_synchronize");
    break;
  case 1: {
    int least = 7, greatest = 7;
    cusafe_status st =
        u8(&t->r) % 4 == 3
            ? cusafe_context_stream_priority_range(NULL, &greatest, c)
        : u8(&t->r) % 4 == 3
            ? cusafe_context_stream_priority_range(&least, NULL, c)
            : cusafe_context_stream_priority_range(&least, &greatest, c);
    check(st, "cusafe_context_stream_priority_range");
    break;
  }
  case 2: {
    int dev = -7;
    cusafe_status st = cusafe_context_get_device(&dev, c);
    check(st, "cusafe_context_get_device");
    if (held && t->strict && (st != CUSAFE_SUCCESS || dev != ce.dev))
      die("cusafe_context_get_device of a held context: %s, device %d of %d",
          cusafe_status_string(st), dev, ce.dev);
    break;
  }
  case 3: {
    int n = -1;
    cusafe_status st = cusafe_device_count(&n);
    check(st, "cusafe_device_count");
    if (st == CUSAFE_SUCCESS && n != 2)
      die("cusafe_device_count gave %d", n);
    break;
  }
  default: {
    cusafe_device_properties props;
    int dev = PICK(&t->r, devices);
    cusafe_status st = u8(&t->r) % 8 == 7
                           ? cusafe_device_get_properties(NULL, dev)
                           : cusafe_device_get_properties(&props, dev);
    check(st, "cusafe_device_get_properties");
  }
  }
}

/* ------------------------------------------------------------------------ */
/* Modules and kernels                                                        */
/* ------------------------------------------------------------------------ */

/* Builds a FAKECUBIN image from the input into buf (NUL-terminated), with
 * the specs of its kernels in m (nk = -1: the image is malformed on
 * purpose). */
static void gen_image(struct th *t, char *buf, size_t cap, struct ent *m) {
  static const char *const maxthreads[] = {"",
                                           "",
                                           " maxthreads=32",
                                           " maxthreads=256",
                                           " maxthreads=1024",
                                           " maxthreads=0",
                                           " maxthreads=1025"};
  static const char *const shared[] = {"", "", " shared=1024", " shared=49152",
                                       " shared=49153"};
  static const unsigned psizes[] = {0, 0,  0, 4,  4,  8,   8,     1,
                                    2, 16, 3, 12, 24, 100, 32764, 40000};
  size_t len = (size_t)snprintf(buf, cap, "FAKECUBIN\n");
  int nk = 1 + u8(&t->r) % 4, bad = 0;
  m->nk = 0;
  for (int k = 0; k < nk && len < cap - 512; k++) {
    struct kspec *ks = &m->ks[m->nk];
    memset(ks, 0, sizeof *ks);
    uint8_t nm = u8(&t->r);
    snprintf(ks->name, sizeof ks->name, "k%d", nm % 8 == 7 ? 0 : k);
    const char *mt = PICK(&t->r, maxthreads), *sh = PICK(&t->r, shared);
    bad |= !strcmp(mt, " maxthreads=0") || !strcmp(mt, " maxthreads=1025") ||
           !strcmp(sh, " shared=49153") || (nm % 8 == 7 && k > 0);
    len += (size_t)snprintf(buf + len, cap - len, "%skernel %s%s%s",
                            u8(&t->r) % 8 == 7 ? "# a comment\n\n" : "",
                            ks->name, mt, sh);
    int np = u8(&t->r) % 41;
    size_t space = 0;
    for (int i = 0; i < np && len < cap - 16; i++) {
      unsigned s = PICK(&t->r, psizes);
      if (s == 0) {
        len += (size_t)snprintf(buf + len, cap - len, " p");
        ks->ptr[ks->np] = 1;
        s = 8;
      } else {
        len += (size_t)snprintf(buf + len, cap - len, " %u", s);
      }
      space += s + 8;
      ks->size[ks->np++] = s;
    }
    bad |= space > 32764 - 8 * MAXP;
    len += (size_t)snprintf(buf + len, cap - len, "\n");
    m->nk++;
  }
  /* Damage: a stray byte or line after the first line, or a cut. */
  switch (u8(&t->r) % 8) {
  case 5:
    if (len > 12) {
      buf[10 + u8(&t->r) % (len - 11)] = (char)u8(&t->r);
      buf[len] = '\0';
      len = strlen(buf);
      bad = 1;
    }
    break;
  case 6:
    len += (size_t)snprintf(buf + len, cap - len, "bogus line\n");
    bad = 1;
    break;
  case 7:
    if (len > 12) {
      len = 10 + u8(&t->r) % (len - 10);
      buf[len] = '\0';
      bad = 1;
    }
    break;
  default: break;
  }
  if (bad)
    m->nk = 0; /* whatever loads, the harness does not rely on its layout */
}

/* An extern "C" kernel source for the fake NVRTC, with the specs. */
static void gen_source(struct th *t, char *buf, size_t cap, struct ent *m) {
  static const struct {
    const char *decl;
    unsigned size;
    int ptr;
  } types[] = {
      {"float *", 8, 1},  {"const double *__restrict__", 8, 1},
      {"int", 4, 0},      {"double", 8, 0},
      {"char", 1, 0},     {"unsigned short", 2, 0},
      {"size_t", 8, 0},   {"bool", 1, 0},
      {"uint64_t", 8, 0}, {"struct foo", 0, 0},
  };
  size_t len = 0;
  int nk = 1 + u8(&t->r) % 3, bad = 0;
  m->nk = 0;
  if (u8(&t->r) % 8 == 7) {
    len += (size_t)snprintf(buf + len, cap - len, "#error no such luck\n");
    bad = 1;
  }
  for (int k = 0; k < nk && len < cap - 512; k++) {
    struct kspec *ks = &m->ks[m->nk];
    memset(ks, 0, sizeof *ks);
    snprintf(ks->name, sizeof ks->name, "rt%d", k);
    uint8_t lb = u8(&t->r);
    len += (size_t)snprintf(
        buf + len, cap - len, "extern \"C\" __global__ void %s%s(",
        lb % 4 == 0 ? "__launch_bounds__(128) " : "", ks->name);
    int np = u8(&t->r) % 6;
    for (int i = 0; i < np; i++) {
      int ty = u8(&t->r) % (int)(sizeof types / sizeof types[0]);
      bad |= types[ty].size == 0;
      len += (size_t)snprintf(buf + len, cap - len, "%s%s a%d", i ? ", " : "",
                              types[ty].decl, i);
      ks->size[ks->np] = types[ty].size;
      ks->ptr[ks->np++] = (uint8_t)types[ty].ptr;
    }
    len += (size_t)snprintf(buf + len, cap - len, ") { /* body */ }\n");
    m->nk++;
  }
  if (bad)
    m->nk = 0;
}

static void module_loaded(cusafe_status st, cusafe_module mod,
                          const struct ent *ce, struct ent *m,
                          const char *what) {
  st = check_out(st, mod, T_MOD, what);
  if (st != CUSAFE_SUCCESS)
    return;
  m->dev = ce->dev;
  keep(mod, T_MOD, m);
}

static void op_module(struct th *t) {
  char *image = t->image;
  struct ent ce;
  int held;
  cusafe_context c = choose(t, T_CTX, -1, &ce, &held);
  struct ent m;
  memset(&m, 0, sizeof m);
  cusafe_module mod = 42;
  uint8_t what = u8(&t->r);
  switch (what % 8) {
  case 0:
  case 1: /* built-in */
    for (int i = 0; i < NBUILTIN && i < MAXK; i++)
      builtin_spec(&m.ks[i], (i + (what >> 3)) % NBUILTIN);
    m.nk = MAXK;
    if (u8(&t->r) % 16 == 15) {
      expect(cusafe_module_load_builtin(NULL, c), CUSAFE_ERROR_INVALID_VALUE,
             "cusafe_module_load_builtin(NULL)");
      break;
    }
    module_loaded(cusafe_module_load_builtin(&mod, c), mod, &ce, &m,
                  "cusafe_module_load_builtin");
    break;
  case 2:
  case 3: { /* FAKECUBIN from memory */
    gen_image(t, image, sizeof t->image, &m);
    size_t size = u8(&t->r) % 8 == 7 ? 0 : strlen(image) + 1;
    if (u8(&t->r) % 32 == 31) {
      expect(cusafe_module_load_data(NULL, c, image, size),
             CUSAFE_ERROR_INVALID_VALUE, "cusafe_module_load_data(NULL)");
      break;
    }
    module_loaded(cusafe_module_load_data(&mod, c, image, size), mod, &ce, &m,
                  "cusafe_module_load_data");
    break;
  }
  case 4: { /* other images from memory */
    static const char *const texts[] = {"\x50\xED\x55\xBA"
                                        "fatbin",
                                        "\x7f"
                                        "ELF\x02\x01",
                                        ".version 8.0\n",
                                        "// PTX\n",
                                        "garbage",
                                        "",
                                        "FAKECUBIN",
                                        "FAKECUBIN x\n",
                                        "\x50\xED\x55"};
    uint8_t k = u8(&t->r);
    if (k % 8 == 7) {
      size_t n = u8(&t->r) % 64;
      for (size_t i = 0; i < n; i++)
        image[i] = (char)(u8(&t->r) | 1);
      image[n] = '\0';
    } else {
      snprintf(image, sizeof t->image, "%s",
               texts[k % (sizeof texts / sizeof texts[0])]);
    }
    if (!strncmp(image, "\x50\xED\x55\xBA", 4) || !strncmp(image,
                                                           "\x7f"
                                                           "ELF",
                                                           4)) {
      for (int i = 0; i < NBUILTIN && i < MAXK; i++)
        builtin_spec(&m.ks[i], (i + k) % NBUILTIN);
      m.nk = MAXK;
    }
    module_loaded(
        u8(&t->r) % 16 == 15
            ? cusafe_module_load_data(&mod, c, NULL, 10)
            : cusafe_module_load_data(&mod, c, image, strlen(image) + 1),
        mod, &ce, &m, "cusafe_module_load_data");
    break;
  }
  case 5: { /* files */
    static const char *const paths[] = {"/nonexistent/cusafe-fuzz.cubin",
                                        "/dev/null", "/", NULL};
    const char *path = PICK(&t->r, paths);
    module_loaded(cusafe_module_load_file(&mod, c, path), mod, &ce, &m,
                  "cusafe_module_load_file");
    break;
  }
  default: { /* NVRTC */
    static const char *const opts[] = {"-DN=4",
                                       "-I/tmp",
                                       "-std=c++17",
                                       "-arch=sm_90",
                                       "-arch=compute_90",
                                       "--gpu-architecture=sm_80",
                                       "--bogus",
                                       "-G",
                                       "-lineinfo",
                                       "--use_fast_math",
                                       "-default-device",
                                       "-arch=sm_x",
                                       NULL};
    const char *o[6];
    size_t no = u8(&t->r) % 7;
    for (size_t i = 0; i < no; i++)
      o[i] = PICK(&t->r, opts);
    gen_source(t, image, sizeof t->image, &m);
    uint8_t k = u8(&t->r);
    const char *name = k % 4 == 0 ? NULL : "fuzz.cu";
    cusafe_status st = cusafe_module_compile(
        &mod, c, k % 16 == 1 ? NULL : image, name, k % 16 == 2 ? NULL : o, no);
    if (st == CUSAFE_ERROR_COMPILE && !*cusafe_last_compile_log() &&
        k % 16 != 1 && k % 16 != 2)
      ; /* a compile that failed before NVRTC's log existed */
    module_loaded(st, mod, &ce, &m, "cusafe_module_compile");
    break;
  }
  }
}

static void op_get_kernel(struct th *t) {
  struct ent me;
  int held;
  cusafe_module mod = choose(t, T_MOD, -1, &me, &held);
  uint8_t k = u8(&t->r);
  const char *name;
  static const char *const bogus[] = {"", "nope", "k0 ", "cusafe_fill_f16",
                                      "k9"};
  struct kspec ks;
  memset(&ks, 0, sizeof ks);
  int known = 0;
  if (k % 8 < 6 && me.nk > 0) {
    ks = me.ks[k % me.nk];
    name = ks.name;
    known = 1;
  } else if (k % 8 == 6) {
    name = NULL;
  } else {
    name = bogus[k % (sizeof bogus / sizeof bogus[0])];
  }
  cusafe_kernel kern = 42;
  if (k % 64 == 63) {
    expect(cusafe_module_get_kernel(NULL, mod, name),
           CUSAFE_ERROR_INVALID_VALUE, "cusafe_module_get_kernel(NULL)");
    return;
  }
  cusafe_status st = check_out(cusafe_module_get_kernel(&kern, mod, name), kern,
                               T_KER, "cusafe_module_get_kernel");
  if (st != CUSAFE_SUCCESS) {
    if (known && held && t->strict && quiet())
      die("kernel %s of a held module not found: %s", name,
          cusafe_last_error_message());
    return;
  }
  /* The library's own view of the parameters wins; pointer parameters are
   * known from the spec only when it matches. */
  size_t count = 0, sizes[MAXP + 8];
  cusafe_status s2 = cusafe_kernel_get_params(&count, sizes, MAXP + 8, kern);
  check(s2, "cusafe_kernel_get_params");
  if (s2 == CUSAFE_SUCCESS) {
    int match = known && (size_t)ks.np == count;
    for (size_t i = 0; match && i < count; i++)
      match = sizes[i] == ks.size[i];
    /* An injected cudaErrorInvalidValue from cudaFuncGetParamInfo reads
     * as the end of the list (that is how the runtime says it): the
     * library then holds a short layout, and a launch that matches it
     * would pass too few arguments to the kernel.  Such a kernel is never
     * launched. */
    if (known && !match && !faults_armed)
      die("kernel %s: the library reports %zu parameters, the image has %d",
          name, count, ks.np);
    int broken = faults_armed && !match;
    if (!match) {
      memset(&ks, 0, sizeof ks);
      snprintf(ks.name, sizeof ks.name, "%s", name ? name : "");
      ks.np = count > MAXP ? MAXP : (int)count;
      for (int i = 0; i < ks.np; i++)
        ks.size[i] = (uint32_t)sizes[i];
    }
    ks.broken = broken;
  } else {
    ks.broken = 1;
  }
  struct ent e;
  memset(&e, 0, sizeof e);
  e.dev = me.dev;
  e.nk = 1;
  e.ks[0] = ks;
  keep(kern, T_KER, &e);
}

/* The size one argument passes, as the library counts it. */
static size_t arg_bytes(const cusafe_arg *a) {
  switch (a->kind) {
  case CUSAFE_ARG_BUFFER: return 8;
  case CUSAFE_ARG_I8:
  case CUSAFE_ARG_U8: return 1;
  case CUSAFE_ARG_I16:
  case CUSAFE_ARG_U16: return 2;
  case CUSAFE_ARG_I32:
  case CUSAFE_ARG_U32:
  case CUSAFE_ARG_F32: return 4;
  case CUSAFE_ARG_I64:
  case CUSAFE_ARG_U64:
  case CUSAFE_ARG_F64: return 8;
  case CUSAFE_ARG_BYTES: return a->size;
  default: return 0;
  }
}

/* A scalar argument of `size` bytes with a small value. */
static cusafe_arg scalar_arg(struct th *t, uint32_t size) {
  static const double f64s[] = {0.0, 1.0, -2.5, 1e300, NAN, INFINITY};
  static const float f32s[] = {0.0f, 1.0f, -2.5f, 3e38f, NAN, INFINITY};
  uint8_t m = u8(&t->r);
  cusafe_arg a = {0};
  switch (size) {
  case 1:
    a.kind = m & 1 ? CUSAFE_ARG_I8 : CUSAFE_ARG_U8;
    a.value.i = (int8_t)u8(&t->r);
    break;
  case 2:
    a.kind = m & 1 ? CUSAFE_ARG_I16 : CUSAFE_ARG_U16;
    a.value.i = (int16_t)u16(&t->r);
    break;
  case 4:
    a.kind = m % 3 == 0   ? CUSAFE_ARG_I32
             : m % 3 == 1 ? CUSAFE_ARG_U32
                          : CUSAFE_ARG_F32;
    if (a.kind == CUSAFE_ARG_F32)
      a.value.f32 = PICK(&t->r, f32s);
    else
      a.value.u = u32(&t->r);
    break;
  case 8:
    a.kind = m % 3 == 0   ? CUSAFE_ARG_I64
             : m % 3 == 1 ? CUSAFE_ARG_U64
                          : CUSAFE_ARG_F64;
    if (a.kind == CUSAFE_ARG_F64)
      a.value.f64 = PICK(&t->r, f64s);
    else
      a.value.u = u16(&t->r); /* never a heap address */
    break;
  default:
    a.kind = CUSAFE_ARG_BYTES;
    a.size = size;
    a.value.bytes = bytes_arg;
    break;
  }
  return a;
}

/* An argument of no particular fit. */
static cusafe_arg wild_arg(struct th *t, int dev) {
  static const uint32_t kinds[] = {0, 1, 2,  3,  4,  5,  6,   7,
                                   8, 9, 10, 11, 12, 13, 255, 0x80000001u};
  cusafe_arg a = {0};
  a.kind = PICK(&t->r, kinds);
  if (a.kind == CUSAFE_ARG_BUFFER) {
    int held;
    a.value.buffer = choose(t, T_BUF, dev, NULL, &held);
  } else if (a.kind == CUSAFE_ARG_BYTES) {
    static const uint32_t sizes[] = {0,  1,   3,     8,     16,
                                     24, 100, 32764, 32765, 0xFFFFFFFFu};
    a.size = PICK(&t->r, sizes);
    a.value.bytes = u8(&t->r) % 8 ? bytes_arg : NULL;
  } else if (a.kind == CUSAFE_ARG_I64 || a.kind == CUSAFE_ARG_U64) {
    a.value.u = u16(&t->r);
  } else if (a.kind == CUSAFE_ARG_F64) {
    a.value.f64 = 0.5;
  } else {
    a.value.u = u32(&t->r);
  }
  return a;
}

#define MAXARGS 80

static void op_launch(struct th *t) {
  static const uint32_t dims[] = {
      1, 1,    1,     2,     32,          128,         1024,
      0, 1025, 65535, 65536, 2147483647u, 2147483648u, 0xFFFFFFFFu};
  static const size_t shm[] = {0,     0,      0,      1,       49152,
                               49153, 232448, 232449, SIZE_MAX};
  struct ent ke;
  int held;
  cusafe_kernel k = choose(t, T_KER, -1, &ke, &held);
  struct kspec *ks = ke.nk ? &ke.ks[0] : NULL;
  if (ks && ks->broken)
    return;
  int np = ks ? ks->np : u8(&t->r) % 4;
  int dev = ke.dev;

  cusafe_launch_config cfg;
  memset(&cfg, 0, sizeof cfg);
  uint8_t shape = u8(&t->r);
  if (shape % 4 == 0 && t->block) {
    cfg.grid[0] = t->grid;
    cfg.block[0] = t->block;
    cfg.grid[1] = cfg.grid[2] = cfg.block[1] = cfg.block[2] = 1;
  } else {
    for (int d = 0; d < 3; d++) {
      cfg.grid[d] = shape % 4 == 1 ? PICK(&t->r, dims) : 1 + u8(&t->r) % 4;
      cfg.block[d] = shape % 4 == 1 ? PICK(&t->r, dims) : 1 << (u8(&t->r) % 4);
    }
  }
  cfg.shared_memory = PICK(&t->r, shm);
  cfg.stream = choose_stream(t, dev);

  size_t nargs;
  uint8_t nm = u8(&t->r);
  switch (nm % 10) {
  case 6: nargs = (size_t)np + 1 + nm / 64; break;
  case 7: nargs = np ? (size_t)(u8(&t->r) % np) : 1; break;
  case 8: nargs = 0; break;
  case 9: nargs = 33 + u8(&t->r) % 40; break;
  default: nargs = (size_t)np; break;
  }
  if (nargs > MAXARGS)
    nargs = MAXARGS;
  cusafe_arg args[MAXARGS];
  uint64_t nval = 0; /* a built-in kernel's n passed as BYTES */
  for (size_t i = 0; i < nargs; i++) {
    uint8_t m = u8(&t->r);
    if (!ks || i >= (size_t)ks->np || m % 5 == 4) {
      args[i] = wild_arg(t, dev);
    } else if (ks->ptr[i]) {
      args[i] = (cusafe_arg){CUSAFE_ARG_BUFFER, 0, {.buffer = 0}};
      int h2;
      args[i].value.buffer = choose(t, T_BUF, dev, NULL, &h2);
    } else {
      args[i] = scalar_arg(t, ks->size[i]);
    }
  }

  /* A built-in kernel touches n elements through each pointer: the caller
   * must make them exist (the library cannot know n's meaning).  So its
   * pointers are buffers or of the wrong size, and n fits every buffer
   * that may be live among them. */
  int faults = 0; /* a misaligned pointer: the kernel will fault */
  if (ks && ks->op && nargs == (size_t)ks->np) {
    uint64_t nmax = UINT64_MAX;
    for (int i = 0; i < ks->np - 1; i++) {
      if (!ks->ptr[i])
        continue;
      if (args[i].kind != CUSAFE_ARG_BUFFER) {
        if (arg_bytes(&args[i]) == 8)
          args[i] = (cusafe_arg){CUSAFE_ARG_U32, 0, {.u = 0}};
        continue;
      }
      pthread_mutex_lock(&pool_lock);
      struct ent *b = ent_find(args[i].value.buffer);
      int odd = 0;
      if (b && b->type == T_BUF) {
        uint64_t fit = b->size / (uint64_t)ks->elem;
        if (fit < nmax)
          nmax = fit;
        odd = b->skew % ks->elem != 0;
      }
      pthread_mutex_unlock(&pool_lock);
      if (odd && !drainable(t)) /* see drain_all() */
        args[i] = (cusafe_arg){CUSAFE_ARG_U32, 0, {.u = 0}};
      else
        faults |= odd;
    }
    if (nmax == UINT64_MAX)
      nmax = 0;
    uint8_t nn = u8(&t->r);
    uint64_t n = nn % 4 == 0 ? nmax : nn % 4 == 1 ? 0 : nmax / (1 + nn % 7);
    cusafe_arg *a = &args[ks->np - 1];
    if (a->kind == CUSAFE_ARG_BUFFER)
      *a = (cusafe_arg){CUSAFE_ARG_U32, 0, {.u = 1}};
    else if (arg_bytes(a) == 8 && a->kind == CUSAFE_ARG_BYTES)
      nval = n, a->value.bytes = &nval;
    else if (arg_bytes(a) == 8)
      a->kind = CUSAFE_ARG_U64, a->value.u = n;
  }

  uint8_t how = u8(&t->r);
  /* One launch in four with attributes (cusafe_kernel_launch_ex): known
   * and unknown ids, flags and reserved words of any value, clusters that
   * fit or do not, priorities in and out of range, repeats. */
  cusafe_launch_attr attrs[4];
  size_t nattrs = how & 0xC0 ? 0 : 1 + u8(&t->r) % 4 % 3;
  for (size_t i = 0; i < nattrs; i++) {
    uint8_t a = u8(&t->r), v = u8(&t->r);
    memset(&attrs[i], 0, sizeof attrs[i]);
    /* mostly known ids; 0 and 6 unknown */
    attrs[i].id = a % 32 < 30 ? 1 + a % 5 : a % 32 == 30 ? 0 : 6;
    attrs[i].reserved = a / 32 == 7 && v % 4 == 0;
    if (attrs[i].id == CUSAFE_LAUNCH_ATTR_CLUSTER) {
      for (int d = 0; d < 3; d++)
        attrs[i].value.dim[d] =
            v % 4 == 0 ? PICK(&t->r, dims) : 1u << (u8(&t->r) % 4);
    } else if (attrs[i].id == CUSAFE_LAUNCH_ATTR_PRIORITY) {
      attrs[i].value.priority = (int32_t)(v % 10) - 7;
    } else {
      attrs[i].value.flag = v % 8 == 0 ? (int32_t)v - 128 : v % 2;
    }
  }
  if (faults) {
    helper_join(t);
    drain_all();
  }
  const cusafe_launch_config *pc = how % 32 == 31 ? NULL : &cfg;
  const cusafe_arg *pa = how % 32 == 30 ? NULL : args;
  cusafe_status st =
      nattrs ? cusafe_kernel_launch_ex(k, pc, how % 32 == 29 ? NULL : attrs,
                                       nattrs, pa, nargs)
             : cusafe_kernel_launch(k, pc, pa, nargs);
  check(st, nattrs ? "cusafe_kernel_launch_ex" : "cusafe_kernel_launch");
  if (st == CUSAFE_SUCCESS && faults) {
    maybe_sticky = 1; /* a misaligned pointer faults, as on a GPU */
    drain_all();      /* now, while nothing else is queued */
  }
  if (st == CUSAFE_SUCCESS && ks && nargs != (size_t)ks->np)
    die("launch of kernel %s (%d parameters) with %zu arguments accepted",
        ks->name, ks->np, nargs);
}

/* Checks that a signature the readers made is well formed: every
 * parameter's spelling inside its text, the text as long as it says. */
static void sig_check(const struct cs_signature *sig, const char *what) {
  size_t len = strlen(sig->text);
  if (sig->name_len > len || sig->nparams > CS_SIG_PARAMS_MAX)
    die("%s: signature \"%s\" is malformed", what, sig->text);
  for (uint32_t i = 0; i < sig->nparams; i++)
    if (sig->params[i].off + (size_t)sig->params[i].len > len ||
        sig->params[i].cls > CS_TYPE_DOUBLE)
      die("%s: parameter %u of \"%s\" is malformed", what, i, sig->text);
}

/* Kernels' types: the input's bytes as a mangled name and as a parameter
 * list to the readers, and as a declaration of any kernel; the signature
 * read back. */
static void op_types(struct th *t, cusafe_kernel k) {
  static const char *const good[] = {"float*, int",
                                     "",
                                     "void",
                                     "float *x, float v, size_t n",
                                     "struct S, int8_t, unsigned long long, "
                                     "double, bool, const char *const *p",
                                     "float**x y",
                                     "int, float",
                                     "p q r"};
  char text[128];
  size_t n = u8(&t->r) % (sizeof text - 3), i;
  text[0] = '_';
  text[1] = 'Z';
  for (i = 2; i < n + 2; i++)
    text[i] = (char)u8(&t->r);
  text[i] = '\0';
  uint8_t m = u8(&t->r);
  struct cs_signature *sig = cs_signature_demangle(m & 1 ? text : text + 2);
  if (sig)
    sig_check(sig, "cs_signature_demangle");
  free(sig);
  char why[128];
  int r = cs_signature_declare(&sig, "k", 1, text + 2, why, sizeof why);
  if (r == 0)
    sig_check(sig, "cs_signature_declare");
  else if (r == 1 && !*why)
    die("cs_signature_declare refused \"%s\" without words", text + 2);
  free(sig);
  const char *decl = m & 2 ? text + 2 : m & 4 ? NULL : PICK(&t->r, good);
  check(cusafe_kernel_declare(k, decl), "cusafe_kernel_declare");
  size_t length = 0, cap = PICK(&t->r, ((const size_t[]){0, 1, 8, 64}));
  char out[64];
  cusafe_status st = cusafe_kernel_get_signature(m & 8 && cap ? NULL : out, cap,
                                                 m & 16 ? NULL : &length, k);
  check(st, "cusafe_kernel_get_signature");
  if (st == CUSAFE_SUCCESS && cap &&
      strlen(out) != (length < cap ? length : cap - 1))
    die("cusafe_kernel_get_signature: \"%s\" is not %zu bytes cut at %zu", out,
        length, cap);
}

static void op_kernel_query(struct th *t) {
  static const size_t shm[] = {0,     0,      1,      4096,    49152,
                               49153, 232448, 232449, SIZE_MAX};
  static const size_t ns[] = {0, 1, 100, 1u << 20, SIZE_MAX};
  struct ent ke;
  int held;
  cusafe_kernel k = choose(t, T_KER, -1, &ke, &held);
  uint8_t m = u8(&t->r);
  if (m % 2) {
    uint32_t block = 0, grid = 0;
    size_t s = PICK(&t->r, shm), n = PICK(&t->r, ns);
    cusafe_status st = cusafe_kernel_suggest_config(
        m % 16 == 1 ? NULL : &block, m % 16 == 3 ? NULL : &grid, k, s, n);
    check(st, "cusafe_kernel_suggest_config");
    if (st == CUSAFE_SUCCESS) {
      if (!block || !grid || block > 1024 || block % 32)
        die("cusafe_kernel_suggest_config gave block %u grid %u", block, grid);
      t->block = block;
      t->grid = grid;
    }
  } else if (m % 8 == 4) {
    op_types(t, k);
  } else {
    size_t count = 0, sizes[4];
    cusafe_status st =
        cusafe_kernel_get_params(m % 16 == 14 ? NULL : &count,
                                 m % 8 == 2 ? NULL : sizes, (m >> 4) % 5, k);
    check(st, "cusafe_kernel_get_params");
    if (st == CUSAFE_SUCCESS && held && ke.nk && t->strict &&
        count != (size_t)ke.ks[0].np && ke.ks[0].np < MAXP)
      die("kernel %s has %d parameters, get_params says %zu", ke.ks[0].name,
          ke.ks[0].np, count);
  }
}

/* ------------------------------------------------------------------------ */
/* References, labels, types                                                  */
/* ------------------------------------------------------------------------ */

static cusafe_status (*const typed_retain[])(cusafe_handle) = {
    cusafe_retain,        cusafe_context_retain, cusafe_stream_retain,
    cusafe_event_retain,  cusafe_buffer_retain,  cusafe_module_retain,
    cusafe_kernel_retain, cusafe_graph_retain};
static cusafe_status (*const typed_release[])(cusafe_handle) = {
    cusafe_release,        cusafe_context_release, cusafe_stream_release,
    cusafe_event_release,  cusafe_buffer_release,  cusafe_module_release,
    cusafe_kernel_release, cusafe_graph_release};

/* Releases one of the harness's references to h, if it holds one. */
static void release_one(cusafe_handle h, int generic) {
  int type = 0;
  pthread_mutex_lock(&pool_lock);
  struct ent *e = ent_find(h);
  if (e && e->refs > 0) {
    e->refs--;
    e->inflight++;
    type = e->type;
  }
  pthread_mutex_unlock(&pool_lock);
  if (!type)
    return;
  if (trace)
    fprintf(stderr, "fuzz_api: release 0x%016llx\n", (unsigned long long)h);
  cusafe_status st = typed_release[generic ? 0 : type](h);
  check(st, "release");
  if (st == CUSAFE_ERROR_INVALID_HANDLE || st == CUSAFE_ERROR_INVALID_VALUE)
    die("release of held handle 0x%016llx (type %d) returned %s: %s",
        (unsigned long long)h, type, cusafe_status_string(st),
        cusafe_last_error_message());
  pthread_mutex_lock(&pool_lock);
  e = ent_find(h);
  if (e)
    e->inflight--;
  pthread_mutex_unlock(&pool_lock);
}

/* Releases one of the harness's references to a held handle. */
static void release_held(struct th *t, int generic) {
  uint8_t k = u8(&t->r);
  cusafe_handle h = CUSAFE_NULL_HANDLE;
  pthread_mutex_lock(&pool_lock);
  int n = 0;
  for (int i = 0; i < MAXE; i++)
    n += pool[i].type && pool[i].refs > 0;
  if (n) {
    int want = k % n;
    for (int i = 0; i < MAXE; i++)
      if (pool[i].type && pool[i].refs > 0 && want-- == 0) {
        h = pool[i].h;
        break;
      }
  }
  pthread_mutex_unlock(&pool_lock);
  if (h)
    release_one(h, generic);
}

static void op_refs(struct th *t) {
  uint8_t m = u8(&t->r);
  switch (m % 6) {
  case 0:
  case 1: /* release a held reference, typed or generic */
    release_held(t, m % 6 == 1);
    break;
  case 2: { /* retain, typed (of any type) or generic */
    int type = u8(&t->r) % (T_LAST + 1);
    struct ent e;
    int held;
    cusafe_handle h =
        choose(t, type ? type : u8(&t->r) % T_LAST + 1, -1, &e, &held);
    struct ent any = ent_get(h);
    cusafe_status st = typed_retain[type](h);
    check(st, "retain");
    if (st == CUSAFE_SUCCESS) {
      if (any.type && type && any.type != type)
        die("retain (type %d) of 0x%016llx, of another type, succeeded", type,
            (unsigned long long)h);
      pthread_mutex_lock(&pool_lock);
      struct ent *pe = ent_find(h);
      if (pe)
        pe->refs++;
      pthread_mutex_unlock(&pool_lock);
      if (!pe && any.type)
        die("retained handle 0x%016llx vanished from the pool",
            (unsigned long long)h);
      if (!pe && t->strict)
        die("retain (type %d) of 0x%016llx, not held, succeeded", type,
            (unsigned long long)h);
      if (!pe) {
        /* Two threads: the other one made h (a forged "next generation"
         * of one of its handles, say) after the look-up above and has not
         * added it to the pool yet.  The reference is ours to give back. */
        st = cusafe_release(h);
        check(st, "cusafe_release (of a handle made meanwhile)");
        if (st != CUSAFE_SUCCESS)
          die("release of 0x%016llx, just retained, returned %s: %s",
              (unsigned long long)h, cusafe_status_string(st),
              cusafe_last_error_message());
      }
    } else if (t->strict && held && (!type || type == any.type)) {
      die("retain of held handle 0x%016llx failed: %s", (unsigned long long)h,
          cusafe_last_error_message());
    }
    break;
  }
  case 3: { /* release of a handle that is not one of ours to release */
    int type = u8(&t->r) % (T_LAST + 1);
    uint8_t how = u8(&t->r);
    cusafe_handle h;
    struct ent e;
    memset(&e, 0, sizeof e);
    if (how % 3 == 0) {
      /* a held handle, released through another type's function */
      h = pick_held(t, 0, -1, &e);
      if (!h || !type || e.type == type)
        return;
    } else if (how % 3 == 1) {
      h = pick_stale(t);
    } else {
      h = how % 2 ? CUSAFE_NULL_HANDLE : forge(t);
    }
    cusafe_status st = typed_release[type](h);
    check(st, "release (not held)");
    cusafe_status want = h ? CUSAFE_ERROR_INVALID_HANDLE : CUSAFE_SUCCESS;
    if (st != want && (t->strict || !h))
      die("release (type %d) of %s handle 0x%016llx returned %s: %s", type,
          how % 3 == 0 ? "a wrong-type" : "a stale or forged",
          (unsigned long long)h, cusafe_status_string(st),
          cusafe_last_error_message());
    if (st == CUSAFE_SUCCESS && h && !shutting) /* then a no-op */
      die("release of a handle the harness does not hold succeeded: a "
          "stolen reference");
    break;
  }
  case 4: { /* labels */
    char *label = t->label;
    int held;
    cusafe_handle h = choose(t, u8(&t->r) % T_LAST + 1, -1, NULL, &held);
    uint8_t l = u8(&t->r);
    const char *text;
    if (l % 4 == 0) {
      text = NULL;
    } else {
      size_t n = l % 4 == 1 ? 399 : l % 32;
      for (size_t i = 0; i < n; i++)
        label[i] = (char)('a' + (i + l) % 26);
      label[n] = '\0';
      text = label;
    }
    cusafe_status st = cusafe_handle_set_label(h, text);
    check(st, "cusafe_handle_set_label");
    if (held && t->strict && st != CUSAFE_SUCCESS)
      die("label of a held handle failed: %s", cusafe_last_error_message());
    break;
  }
  default: { /* types */
    int held;
    int want = u8(&t->r) % T_LAST + 1;
    struct ent e;
    cusafe_handle h = choose(t, want, -1, &e, &held);
    cusafe_handle_type got = (cusafe_handle_type)99;
    cusafe_status st = u8(&t->r) % 16 == 15 ? cusafe_handle_get_type(NULL, h)
                                            : cusafe_handle_get_type(&got, h);
    check(st, "cusafe_handle_get_type");
    if (held && t->strict && (st != CUSAFE_SUCCESS || (int)got != want) &&
        got != (cusafe_handle_type)99)
      die("held handle 0x%016llx of type %d: get_type says %s, type %d",
          (unsigned long long)h, want, cusafe_status_string(st), (int)got);
    if (st != CUSAFE_SUCCESS && got != CUSAFE_TYPE_INVALID &&
        got != (cusafe_handle_type)99)
      die("cusafe_handle_get_type failed but stored type %d", (int)got);
    if (!held && t->strict && h && st == CUSAFE_SUCCESS && !ent_get(h).type)
      die("cusafe_handle_get_type accepted 0x%016llx, which is not live",
          (unsigned long long)h);
  }
  }
}

static void op_buffer_query(struct th *t) {
  struct ent be;
  int held;
  cusafe_buffer b = choose(t, T_BUF, -1, &be, &held);
  uint8_t m = u8(&t->r);
  cusafe_status st;
  switch (m % 4) {
  case 0: {
    size_t s = 0;
    st = m % 32 == 28 ? cusafe_buffer_get_size(NULL, b)
                      : cusafe_buffer_get_size(&s, b);
    check(st, "cusafe_buffer_get_size");
    if (held && t->strict && m % 32 != 28 &&
        (st != CUSAFE_SUCCESS || s != be.size))
      die("buffer of %zu bytes: get_size %s, %zu", be.size,
          cusafe_status_string(st), s);
    break;
  }
  case 1: {
    cusafe_memory k;
    st = m % 32 == 1 ? cusafe_buffer_get_memory(NULL, b)
                     : cusafe_buffer_get_memory(&k, b);
    check(st, "cusafe_buffer_get_memory");
    break;
  }
  case 2: {
    void *p = NULL;
    st = m % 32 == 2 ? cusafe_buffer_interop_pointer(NULL, b)
                     : cusafe_buffer_interop_pointer(&p, b);
    check(st, "cusafe_buffer_interop_pointer");
    /* NULL is the address of a buffer of 0 bytes (and of its views). */
    if (st == CUSAFE_SUCCESS && !p && held && t->strict && be.size > 0)
      die("cusafe_buffer_interop_pointer gave NULL");
    break;
  }
  default: {
    cusafe_context c = 42;
    if (m % 32 == 3) {
      check(cusafe_buffer_get_context(NULL, b), "cusafe_buffer_get_context");
      break;
    }
    st = check_out(cusafe_buffer_get_context(&c, b), c, T_CTX,
                   "cusafe_buffer_get_context");
    if (st == CUSAFE_SUCCESS) {
      struct ent e = {.dev = be.dev};
      keep(c, T_CTX, &e);
    }
  }
  }
}

/* ------------------------------------------------------------------------ */
/* The fake's controls                                                        */
/* ------------------------------------------------------------------------ */

static const cudaError_t fault_errs[] = {cudaErrorMemoryAllocation,
                                         cudaErrorInvalidValue,
                                         cudaErrorLaunchFailure,
                                         cudaErrorIllegalAddress,
                                         cudaErrorUnknown,
                                         cudaErrorNotSupported,
                                         cudaErrorInvalidResourceHandle,
                                         cudaErrorNotReady,
                                         cudaErrorCudartUnloading};

static const char *const fault_fns[] = {
    "cudaMallocAsync", "cudaMallocHost", "cudaMallocManaged", "cudaMemcpyAsync",
    "cudaMemcpyPeerAsync", "cudaMemsetAsync", "cudaStreamCreateWithPriority",
    "cudaEventCreateWithFlags", "cudaEventRecord", "cudaStreamWaitEvent",
    "cudaStreamSynchronize", "cudaStreamQuery", "cudaEventSynchronize",
    "cudaEventQuery", "cudaEventElapsedTime", "cudaDeviceSynchronize",
    "cudaGetDeviceProperties", "cudaDeviceGetStreamPriorityRange",
    "cuDevicePrimaryCtxRetain", "cudaLibraryLoadData",
    "cudaLibraryLoadFromFile", "cuLibraryGetModule", "cudaLibraryGetKernel",
    "cudaFuncGetParamInfo", "cudaFuncGetAttributes",
    "cudaKernelSetAttributeForDevice",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessor", "cudaLaunchKernel",
    "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC",
    "nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog", "nvrtcGetCUBINSize", "nvrtcGetCUBIN", "cudaGetDevice",
    "cudaSetDevice", "cudaDeviceGetAttribute", "cudaStreamBeginCapture",
    "cudaStreamEndCapture", "cudaStreamIsCapturing", "cudaStreamGetCaptureInfo",
    "cudaGraphInstantiate", "cudaGraphLaunch",
    /* the calls that destroy or free (see finish_tainted) */
    "cudaStreamDestroy", "cudaEventDestroy", "cudaFreeAsync", "cudaFree",
    "cudaFreeHost", "cudaLibraryUnload", "cuDevicePrimaryCtxRelease",
    "nvrtcDestroyProgram"};

static void faults_clear(void) {
  if (faults_armed)
    fault_change(FC_CLEAR, 0, 0, NULL, cudaSuccess);
  fake_fail_clear();
  faults_armed = 0;
  err4_armed = 0;
  nfail_fn = 0;
}

static void op_control(struct th *t) {
  uint8_t m = u8(&t->r);
  helper_join(t); /* a deleter running meanwhile would make calls too */
  if (trace)
    fprintf(stderr, "fuzz_api: control %d (call %lu)\n", m % 8,
            fake_call_count());
  switch (m % 8) {
  case 0: fake_set_paused(u8(&t->r) & 1); break;
  case 1: {
    unsigned long n = 1 + u8(&t->r) % 48;
    cudaError_t err = PICK(&t->r, fault_errs);
    int persistent = u8(&t->r) % 4 == 3;
    if (!t->strict)
      break; /* one thread only: see faults_armed */
    if (!open_defects && err == cudaErrorCudartUnloading)
      err = cudaErrorUnknown;
    persistent &= open_defects;
    if (!faults_used) {
      faults_used = 1;
      pin_all();
    }
    fault_change(FC_AFTER, fake_call_count() + n, persistent, NULL, err);
    fake_fail_after(n, err, persistent);
    faults_armed = 1;
    err4_armed |= err == cudaErrorCudartUnloading;
    break;
  }
  case 2: {
    const char *name = PICK(&t->r, fault_fns);
    cudaError_t err = PICK(&t->r, fault_errs);
    int known = 0;
    for (int i = 0; i < nfail_fn; i++)
      known |= fail_fn_names[i] == name;
    if ((!known && nfail_fn == 16) || !t->strict || !open_defects)
      break;
    if (!known)
      fail_fn_names[nfail_fn++] = name;
    if (!faults_used) {
      faults_used = 1;
      pin_all();
    }
    fault_change(FC_FUNCTION, 0, 0, name, err);
    fake_fail_function(name, err);
    faults_armed = 1;
    err4_armed |= err == cudaErrorCudartUnloading;
    break;
  }
  case 3: faults_clear(); break;
  case 4: {
    static const cudaError_t stick[] = {
        cudaErrorIllegalAddress, cudaErrorLaunchFailure,
        cudaErrorMisalignedAddress, cudaSuccess};
    int dev = u8(&t->r) & 1;
    cudaError_t err = PICK(&t->r, stick);
    if (err != cudaSuccess && !drainable(t))
      break; /* see drain_all() */
    if (err != cudaSuccess)
      drain_all();
    if (trace)
      fprintf(stderr, "fuzz_api: sticky error %d on device %d\n", (int)err,
              dev);
    fake_set_sticky_error(dev, err);
    sticky[dev] = err != cudaSuccess;
    break;
  }
  case 5: {
    static const size_t limits[] = {0, 100, 4096, 65536, 1u << 20};
    fake_set_memory_limit(u8(&t->r) & 1, PICK(&t->r, limits));
    break;
  }
  case 6: fake_set_managed_supported(u8(&t->r) & 1, u8(&t->r) & 1); break;
  default: {
    char v[16];
    snprintf(v, sizeof v, "%s", cusafe_version_string());
    (void)cusafe_status_string((cusafe_status)u8(&t->r));
    break;
  }
  }
}

/* ------------------------------------------------------------------------ */
/* Where features meet: wrappers, captures, graphs, the shutdown              */
/* ------------------------------------------------------------------------ */

/* A stream of the pool that captures now (it began a capture or joined
 * one), if there is one, else any stream. */
static cusafe_stream choose_capturing(struct th *t, struct ent *e, int *held) {
  uint8_t k = u8(&t->r);
  cusafe_handle hs[MAXE];
  int n = 0, nc = 0;
  pthread_mutex_lock(&pool_lock);
  for (int i = 0; i < MAXE; i++)
    if (pool[i].type == T_STREAM && pool[i].refs + pool[i].pin > 0)
      hs[n++] = pool[i].h;
  pthread_mutex_unlock(&pool_lock);
  for (int i = 0; i < n; i++) {
    int on = 0;
    if (cusafe_stream_is_capturing(&on, hs[i]) == CUSAFE_SUCCESS && on)
      hs[nc++] = hs[i];
  }
  if (!nc)
    return choose(t, T_STREAM, -1, e, held);
  *e = ent_get(hs[k % nc]);
  *held = e->type == T_STREAM;
  if (!*held)
    memset(e, 0, sizeof *e), e->dev = -1;
  return hs[k % nc];
}

/* A wrapper of the CUDA stream of a stream of the pool -- of cusafe's own
 * (the wrapper holds it), of a wrapper (one more wrapper of the same CUDA
 * stream), of another library -- often of one that captures, or of a
 * device's default stream (NULL, cudaStreamLegacy, cudaStreamPerThread):
 * kept in the pool, or used at once and released, as another library
 * that hands cusafe its current stream for one call would. */
static void op_stream_wrap(struct th *t) {
  static void *const defaults[] = {NULL, cudaStreamLegacy, cudaStreamPerThread};
  struct ent ce, se;
  int held, sheld = 0;
  cusafe_context c = choose(t, T_CTX, -1, &ce, &held);
  uint8_t m = u8(&t->r);
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  void *raw = NULL;
  memset(&se, 0, sizeof se);
  se.dev = -1;
  if (m % 4 == 3) {
    raw = open_defects ? defaults[(m >> 2) % 3] : cudaStreamPerThread;
  } else {
    s = m & 0x10 ? choose_capturing(t, &se, &sheld)
                 : choose(t, T_STREAM, ce.dev, &se, &sheld);
    /* Only a stream kept alive meanwhile: its owner must. */
    if (cusafe_stream_retain(s) != CUSAFE_SUCCESS)
      return;
    if (cusafe_stream_interop_handle(&raw, s) != CUSAFE_SUCCESS) {
      check(cusafe_stream_release(s), "cusafe_stream_release");
      return;
    }
  }
  int def = is_default_stream(raw);
  int same = def || (sheld && se.dev == ce.dev);
  cusafe_stream w = 42;
  if (trace)
    fprintf(stderr, "fuzz_api: wrap CUDA stream %p of stream 0x%016llx\n", raw,
            (unsigned long long)s);
  cusafe_status st = check_out(cusafe_stream_wrap(&w, c, raw), w, T_STREAM,
                               "cusafe_stream_wrap");
  if (st == CUSAFE_SUCCESS) {
    if (held && sheld && t->strict && !same)
      die("a stream of device %d wrapped on device %d", se.dev, ce.dev);
    struct ent e = {.dev = ce.dev,
                    .wrapped = def,
                    .skind = def                      ? SK_DEFAULT
                             : se.skind == SK_FOREIGN ? SK_FOREIGN
                                                      : SK_WRAP};
    if (m & 0x40) { /* used at once, as another library would */
      struct ent be;
      int h2;
      cusafe_buffer b = choose(t, T_BUF, ce.dev, &be, &h2);
      if (trace)
        fprintf(stderr, "fuzz_api: fill 0x%016llx on the wrapper\n",
                (unsigned long long)b);
      check(cusafe_buffer_fill(b, 0, be.size, m, w), "cusafe_buffer_fill");
    }
    if (m & 0x20) { /* and let go of at once */
      if (m & 0x80)
        check(cusafe_stream_synchronize(w), "cusafe_stream_synchronize");
      check(cusafe_stream_release(w), "cusafe_stream_release");
    } else {
      keep(w, T_STREAM, &e);
    }
  } else if (held && (sheld || !s) && t->strict && quiet() && same) {
    die("cusafe_stream_wrap of CUDA stream %p failed: %s", raw,
        cusafe_last_error_message());
  } else if (held && sheld && t->strict && !faults_armed && !same &&
             st != CUSAFE_ERROR_CONTEXT_MISMATCH) {
    die("a stream of device %d wrapped on device %d returned %s", se.dev,
        ce.dev, cusafe_status_string(st));
  }
  if (s)
    check(cusafe_stream_release(s), "cusafe_stream_release");
}

/* A stream of the other library (a new one, or one it has already, which
 * cusafe may wrap already), wrapped once or twice, kept in the pool. */
static void op_foreign_stream(struct th *t) {
  struct ent ce;
  int held;
  cusafe_context c = choose(t, T_CTX, -1, &ce, &held);
  uint8_t which = u8(&t->r), m = u8(&t->r);
  int dev = ce.dev >= 0 ? ce.dev : m & 1;
  if (m % 16 == 15)
    dev = !dev;
  int sdev = -1;
  cudaStream_t fs = other_stream_get(dev, which % (2 * MAXFS), &sdev);
  if (!fs)
    return;
  for (int k = 0; k < 1 + (m >> 4 & 1); k++) {
    cusafe_stream w = 42;
    cusafe_status st =
        check_out(cusafe_stream_wrap(&w, c, fs), w, T_STREAM,
                  "cusafe_stream_wrap (another library's stream)");
    if (st == CUSAFE_SUCCESS) {
      if (held && t->strict && sdev != ce.dev)
        die("a stream of device %d wrapped on device %d", sdev, ce.dev);
      struct ent e = {.dev = ce.dev, .skind = SK_FOREIGN};
      keep(w, T_STREAM, &e);
    } else if (held && t->strict && quiet() && sdev == ce.dev) {
      die("cusafe_stream_wrap of another library's stream failed: %s",
          cusafe_last_error_message());
    } else if (held && t->strict && !faults_armed && sdev != ce.dev &&
               st != CUSAFE_ERROR_CONTEXT_MISMATCH) {
      die("a stream of device %d wrapped on device %d returned %s", sdev,
          ce.dev, cusafe_status_string(st));
    }
  }
}

/* Captures on any stream of the pool: begin, end, a join (an event
 * recorded on a stream -- often one that captures -- waited for by another
 * stream, which works and is maybe joined back), and replays of a graph,
 * maybe released with its replays queued. */
static void op_capture(struct th *t) {
  uint8_t m = u8(&t->r);
  struct ent se;
  int held, h2;
  cusafe_stream s = m & 0x10 ? choose_capturing(t, &se, &held)
                             : choose(t, T_STREAM, -1, &se, &held);
  switch (m % 4) {
  case 0: {
    cusafe_status st = cusafe_stream_begin_capture(s);
    check(st, "cusafe_stream_begin_capture");
    if (st == CUSAFE_SUCCESS && held && t->strict && se.wrapped)
      die("a wrapped default stream began a capture");
    break;
  }
  case 1: {
    cusafe_graph g = 42;
    cusafe_status st = check_out(cusafe_stream_end_capture(&g, s), g, T_GRAPH,
                                 "cusafe_stream_end_capture");
    if (st == CUSAFE_SUCCESS) {
      struct ent e = {.dev = se.dev};
      keep(g, T_GRAPH, &e);
    }
    break;
  }
  case 2: {
    cusafe_event ev = choose(t, T_EVENT, se.dev, NULL, &h2);
    struct ent we;
    check(cusafe_event_record(ev, s), "cusafe_event_record");
    cusafe_stream w = choose(t, T_STREAM, se.dev, &we, &h2);
    if (trace)
      fprintf(stderr, "fuzz_api: stream 0x%016llx joins 0x%016llx\n",
              (unsigned long long)w, (unsigned long long)s);
    check(cusafe_stream_wait_event(w, ev), "cusafe_stream_wait_event");
    uint8_t k = u8(&t->r);
    if (k & 1) {
      struct ent be;
      cusafe_buffer b = choose(t, T_BUF, we.dev, &be, &h2);
      check(cusafe_buffer_fill(b, 0, be.size, k, w), "cusafe_buffer_fill");
    }
    if (!(k & 2)) {
      cusafe_event back = choose(t, T_EVENT, se.dev, NULL, &h2);
      check(cusafe_event_record(back, w), "cusafe_event_record");
      check(cusafe_stream_wait_event(s, back), "cusafe_stream_wait_event");
    }
    break;
  }
  default: {
    cusafe_graph g = choose(t, T_GRAPH, se.dev, NULL, &h2);
    uint8_t k = u8(&t->r);
    if (k % 4 == 0)
      check(cusafe_graph_instantiate(g), "cusafe_graph_instantiate");
    for (int i = 0; i < 1 + (k >> 2) % 3; i++)
      check(cusafe_graph_launch(g, k & 0x20 ? CUSAFE_STREAM_DEFAULT : s),
            "cusafe_graph_launch");
    if (k & 0x40)
      release_one(g, 0); /* with its replays queued */
    break;
  }
  }
}

/* A release of one held object of a chosen type. */
static void op_release_kind(struct th *t) {
  static const int types[] = {T_STREAM, T_BUF,    T_GRAPH, T_EVENT,
                              T_CTX,    T_STREAM, T_BUF,   T_KER};
  int type = PICK(&t->r, types);
  cusafe_handle h = pick_held(t, type, -1, NULL);
  if (h)
    release_one(h, u8(&t->r) & 1);
}

/* The shutdown, in a child (see the top of this file): the child shuts
 * the library down and goes on with the rest of the input against it; the
 * parent waits for the child and goes on as if nothing happened.  In
 * single-thread runs only: a fork leaves no other thread in the child,
 * and no lock that one holds could be taken there. */
static int destroying_call_failed(void);

/* The parent's side of the shutdown gives the fuzzer no coverage to chase:
 * what the child covers is not seen, and a fork of a sanitized process
 * costs some thirty inputs, so that inputs that shut down must not crowd
 * the corpus for the few lines they reach here. */
#if defined(__clang__) && __clang_major__ >= 13
#define NO_COVERAGE __attribute__((no_sanitize("coverage"), noinline))
#else
#define NO_COVERAGE __attribute__((noinline))
#endif

NO_COVERAGE static void op_shutdown(struct th *t) {
  if (!t->strict || in_child || t->shut_down_once)
    return;
  t->shut_down_once = 1; /* one fork per input is enough */
  helper_join(t);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0)
    return;
  if (pid == 0) {
    in_child = 1;
    alarm(60); /* libFuzzer's timer did not come with the fork */
    /* The fake survives a fork; the real runtime would not, and the
     * library says so after one: undone here, as if this were the
     * parent. */
    atomic_store(&cs_hot.state, CS_RUNNING);
    faults_clear();
    /* After a failure to destroy (see finish_tainted()), the shutdown
     * runs after the runtime's teardown, as at exit. */
    child_tainted = faults_used && !strict_faults && destroying_call_failed();
    if (trace)
      fprintf(stderr, "fuzz_api: child %d: shutdown%s\n", (int)getpid(),
              child_tainted ? " after the runtime's teardown" : "");
    if (child_tainted) {
      fake_set_strict_teardown(0);
      fake_teardown_now();
    }
    shutting = 1;
    expect(cusafe_shutdown(), CUSAFE_SUCCESS, "cusafe_shutdown");
    t->strict = 0;
    t->control = 0;
    return;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR)
      die("waitpid: %s", strerror(errno));
  if (!WIFEXITED(status) || WEXITSTATUS(status))
    die("the child that shut the library down failed (%s %d)",
        WIFSIGNALED(status) ? "signal" : "exit status",
        WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}

/* A release of a chosen type, or the shutdown. */
NO_COVERAGE static void op_release_or_shutdown(struct th *t) {
  if (u8(&t->r) % 8 == 7 && t->may_shut_down)
    op_shutdown(t);
  else
    op_release_kind(t);
}

/* ------------------------------------------------------------------------ */
/* Driving                                                                    */
/* ------------------------------------------------------------------------ */

#define MAX_OPS 400

/* The input is a sequence of records: an operation byte, a length byte and
 * that many bytes of parameters, which the operation reads through t->r
 * (zeros past their end).  A zero parameter byte chooses the ordinary,
 * valid case: a held handle, the first entry of a table, the default
 * stream, a whole buffer.  A deleter started on the helper thread by one
 * operation runs while the next one does, and is joined after it. */
static void run_ops(struct th *t) {
  for (int n = 0; n < MAX_OPS && t->r.n; n++) {
    uint8_t op = u8(&t->r);
    size_t len = u8(&t->r);
    if (len > t->r.n)
      len = t->r.n;
    struct rd rest = {t->r.p + len, t->r.n - len};
    t->r.n = len;
#ifdef CUSAFE_HAVE_DLPACK
    int helper_was_on = t->helper_on;
#endif
    switch (op % 32) {
    case 0: op_context_create(t); break;
    case 1: op_stream_create(t); break;
    case 2: op_event_create(t); break;
    case 3:
    case 4: op_alloc(t); break;
    case 5: op_alloc_async(t); break;
    case 6: op_view(t); break;
    case 7: op_transfer(t, 0, 0); break;
    case 8: op_transfer(t, 1, 0); break;
    case 9: op_transfer(t, op & 32 ? 1 : 0, 1); break;
    case 10: op_copy(t); break;
    case 11: op_fill(t); break;
    case 12: op_event(t); break;
    case 13: op_stream(t); break;
    case 14: op_context(t); break;
    case 15: op_module(t); break;
    case 16: op_get_kernel(t); break;
    case 17:
    case 18: op_launch(t); break;
    case 19: op_kernel_query(t); break;
    case 20: op_refs(t); break;
    case 21: op_foreign(t); break;
    case 22: op_buffer_query(t); break;
    case 23:
      if (t->control && !(op & 0x80))
        op_control(t);
      else if (t->strict)
        op_roundtrip(t);
      break;
    case 24: op_stream_wrap(t); break;
    case 25: op_foreign_stream(t); break;
    case 26: op_export(t); break;
    case 27: op_tensor(t); break;
    case 28: op_import(t); break;
    case 29:
    case 30: op_capture(t); break;
    default: op_release_or_shutdown(t); break;
    }
    t->r = rest;
#ifdef CUSAFE_HAVE_DLPACK
    if (helper_was_on)
      helper_join(t);
#endif
  }
  helper_join(t);
}

/* The second thread: one for the whole run, given the work of each input
 * (a thread per input costs the sanitizers' run-time some memory each). */
static pthread_mutex_t worker_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t worker_cond = PTHREAD_COND_INITIALIZER;
static struct th *worker_job;
static int worker_busy, worker_started;

static void *worker_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&worker_lock);
  for (;;) {
    while (!worker_job)
      pthread_cond_wait(&worker_cond, &worker_lock);
    struct th *t = worker_job;
    pthread_mutex_unlock(&worker_lock);
    run_ops(t);
    pthread_mutex_lock(&worker_lock);
    worker_job = NULL;
    worker_busy = 0;
    pthread_cond_broadcast(&worker_cond);
  }
  return NULL;
}

/* Starts t on the second thread; 0 if there is none. */
static int worker_start(struct th *t) {
  pthread_mutex_lock(&worker_lock);
  if (!worker_started) {
    pthread_t tid;
    worker_started = pthread_create(&tid, NULL, worker_main, NULL) == 0;
  }
  if (worker_started) {
    worker_job = t;
    worker_busy = 1;
    pthread_cond_broadcast(&worker_cond);
  }
  pthread_mutex_unlock(&worker_lock);
  return worker_started;
}

static void worker_wait(void) {
  pthread_mutex_lock(&worker_lock);
  while (worker_busy)
    pthread_cond_wait(&worker_cond, &worker_lock);
  pthread_mutex_unlock(&worker_lock);
}

/* Whether an injected failure hit a call that destroys or frees (or one
 * that their paths depend on), from the fake's log: calls are numbered from
 * 1 at fake_reset(), one log entry each ("exec:" entries are queued work,
 * not calls), and the changes of the injected failures are known by their
 * place in the log. */
static int destroying_call_failed(void) {
  /* Not here, because the library copes: cudaLibraryUnload (retried
   * before the primary context goes), cudaFreeAsync (it falls back to
   * cudaFree), the synchronizations, and cudaGetDevice / cudaSetDevice
   * (a destroy path still destroys). */
  static const char *const destroying[] = {
      "cudaStreamDestroy", "cudaEventDestroy",          "cudaFree",
      "cudaFreeHost",      "cuDevicePrimaryCtxRelease", "nvrtcDestroyProgram"};
  if (changes_lost)
    return 1;
  size_t len = fake_log_length();
  unsigned long call = 0, fail_at = 0;
  int persistent = 0, nnames = 0, c = 0;
  const char *names[16];
  cudaError_t after_err = cudaSuccess, name_err[16];
  for (size_t i = 0; i < len; i++) {
    for (; c < nchanges && changes[c].log_pos <= i; c++) {
      switch (changes[c].kind) {
      case FC_AFTER:
        fail_at = changes[c].fail_at;
        persistent = changes[c].persistent;
        after_err = changes[c].err;
        break;
      case FC_FUNCTION: {
        int k = 0;
        while (k < nnames && names[k] != changes[c].name)
          k++;
        if (k == nnames && nnames < 16)
          names[nnames++] = changes[c].name;
        if (k < 16)
          name_err[k] = changes[c].err;
        break;
      }
      default:
        fail_at = 0;
        nnames = 0;
        break;
      }
    }
    const char *e = fake_log_entry(i);
    if (!e || !strncmp(e, "exec:", 5))
      continue;
    call++;
    int failed = fail_at && (call == fail_at || (persistent && call > fail_at));
    cudaError_t err = after_err;
    for (int j = 0; j < nnames && !failed; j++)
      if ((failed = !strcmp(e, names[j])))
        err = name_err[j];
    if (!failed)
      continue;
    if (trace)
      fprintf(stderr, "fuzz_api: injected failure of call %lu, %s: %d\n", call,
              e, (int)err);
    /* Error 4 says the runtime is gone: the library rightly frees nothing
     * more after it. */
    if (err == cudaErrorCudartUnloading)
      return 1;
    for (size_t j = 0; j < sizeof destroying / sizeof destroying[0]; j++)
      if (!strcmp(e, destroying[j]))
        return 1;
  }
  return 0;
}

/* Releases every reference the harness still holds; a release must not
 * call any of them stale. */
/* Ends the captures left open on the harness's streams (a capture holds
 * its streams), releasing their graphs. */
static void end_captures(void) {
  for (int i = 0; i < MAXE; i++) {
    if (pool[i].type != T_STREAM || pool[i].refs + pool[i].pin == 0)
      continue;
    cusafe_graph g = CUSAFE_NULL_HANDLE;
    cusafe_status st = cusafe_stream_end_capture(&g, pool[i].h);
    check(st, "cusafe_stream_end_capture (cleanup)");
    if (g)
      check(cusafe_graph_release(g), "cusafe_graph_release (cleanup)");
  }
}

static void release_all(int reverse) {
  if (!in_teardown)
    end_captures();
  for (int i = 0; i < ndeferred; i++) {
    cusafe_status st = cusafe_release(deferred[i]);
    check(st, "release (cleanup, deferred)");
    if (st == CUSAFE_ERROR_INVALID_HANDLE)
      die("cleanup: release of held handle 0x%016llx says stale: %s",
          (unsigned long long)deferred[i], cusafe_last_error_message());
  }
  ndeferred = 0;
  for (int pass = 0; pass < MAXE; pass++) {
    int any = 0;
    for (int j = 0; j < MAXE; j++) {
      struct ent *e = &pool[reverse ? MAXE - 1 - j : j];
      while (e->type && e->refs + e->pin > 0) {
        any = 1;
        if (e->refs)
          e->refs--;
        else
          e->pin--;
        if (trace)
          fprintf(stderr, "fuzz_api: release 0x%016llx\n",
                  (unsigned long long)e->h);
        cusafe_status st = typed_release[(j + pass) % 3 ? e->type : 0](e->h);
        check(st, "release (cleanup)");
        if (st == CUSAFE_ERROR_INVALID_HANDLE)
          die("cleanup: release of held handle 0x%016llx (type %d) says "
              "stale: %s",
              (unsigned long long)e->h, e->type, cusafe_last_error_message());
      }
    }
    if (!any)
      break;
  }
}

/* Nothing alive in the fake; with `handles`, every handle the harness
 * ever saw is stale too. */
static void check_nothing_alive(int handles) {
  size_t a = fake_live_allocations(-1), s = fake_live_streams(-1),
         e = fake_live_events(-1), l = fake_live_libraries(-1),
         p = fake_live_programs();
  int r0 = fake_primary_ctx_refcount(0), r1 = fake_primary_ctx_refcount(1);
  size_t gr =
      fake_live_graphs(-1) + fake_live_graph_execs(-1) + fake_live_captures(-1);
  if (gr)
    die("leak after releasing everything: %zu graph(s), executable graph(s) "
        "and capture(s)",
        gr);
  if (a || s || e || l || p || r0 || r1)
    die("leak after releasing everything: %zu allocation(s), %zu stream(s), "
        "%zu event(s), %zu librar(ies), %zu NVRTC program(s), primary "
        "context references %d and %d",
        a, s, e, l, p, r0, r1);
  /* And every handle the harness ever saw is stale now. */
  for (int i = 0; i < MAXE && handles; i++) {
    if (!pool[i].type)
      continue;
    cusafe_handle_type ty;
    cusafe_status st = cusafe_handle_get_type(&ty, pool[i].h);
    if (st != CUSAFE_ERROR_INVALID_HANDLE)
      die("handle 0x%016llx is still live after its release (%s)",
          (unsigned long long)pool[i].h, cusafe_status_string(st));
  }
}

/* After an injected failure of a call that destroys or frees, the fake may
 * hold objects the library could not free; releasing the last context
 * would then be a lifetime violation of the fake's.  Such an input ends as
 * the process would: the CUDA runtime is torn down first (everything it
 * held goes), then every handle is released -- the library must cope with
 * CUDA answering cudaErrorCudartUnloading -- and the fake starts afresh. */
static void finish_tainted(struct th *t, int reverse, int deleters_last) {
  /* Captures end first, while CUDA works: what waits for their end (a
   * follow of a legacy stream parked during one) would otherwise outlive
   * the fake's reset into the next input. */
  end_captures();
  fake_set_strict_teardown(0);
  fake_teardown_now();
  in_teardown = 1;
  release_all(reverse);
#ifdef CUSAFE_HAVE_DLPACK
  if (deleters_last)
    pending_delete_all(t);
#else
  (void)t;
  (void)deleters_last;
#endif
  in_teardown = 0;
}

/* The end of the input in the child of op_shutdown(): the pending
 * deleters run after the shutdown (every other one on another thread),
 * the releases are no-ops, the other library lets go of its objects, and
 * then nothing may be left: everything the library held went with its
 * ordered shutdown, every memory of another library was given back, and
 * every imported tensor's deleter ran exactly once. */
static void child_finish(struct th *t, uint8_t header) {
  helper_join(t);
#ifdef CUSAFE_HAVE_DLPACK
  pending_delete_all(t);
#endif
  release_all(header & 8);
  other_finish(child_tainted);
  if (!child_tainted) {
#ifdef CUSAFE_HAVE_DLPACK
    for (int i = 0; i < nimports; i++)
      if (atomic_load(&imports[i]->ran) != 1)
        die("after cusafe_shutdown(), the deleter of imported buffer "
            "0x%016llx ran %d times",
            (unsigned long long)imports[i]->buf, atomic_load(&imports[i]->ran));
#endif
    for (int d = 0; d < 2; d++)
      if (atomic_load(&foreign_refs[d]))
        die("after cusafe_shutdown(), %d wrapped memory(ies) of device %d "
            "not given back",
            atomic_load(&foreign_refs[d]), d);
    check_nothing_alive(0);
  }
  if (trace)
    fprintf(stderr, "fuzz_api: child %d: done\n", (int)getpid());
  fflush(stderr);
  _exit(0);
}

static unsigned char host_a[HOST_BYTES], host_b[HOST_BYTES];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  memset(bytes_arg, 0x11, sizeof bytes_arg); /* never a heap address */
  const char *s = getenv("CUSAFE_FUZZ_STRICT_FAULTS");
  strict_faults = s && !strcmp(s, "1");
  s = getenv("CUSAFE_FUZZ_OPEN");
  open_defects = s && !strcmp(s, "1");
  s = getenv("CUSAFE_FUZZ_TRACE");
  trace = s ? atoi(s) : 0;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t header = data[0];
  static struct th a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  a.r = (struct rd){data + 1, size - 1};
  a.strict = a.control = 1;
  a.may_shut_down = header & 32 && size % 8 == 0;
  a.host = host_a;
  b.host = host_b;
  int two = header & 1;
  if (two && size > 2) {
    size_t nb = data[1];
    if (nb > size - 2)
      nb = size - 2;
    b.r.p = data + 2;
    b.r.n = nb;
    a.r.p = data + 2 + nb;
    a.r.n = size - 2 - nb;
    a.strict = 0;
  }
  memset(pool, 0, sizeof pool);
  faults_armed = faults_used = err4_armed = nfail_fn = 0;
  nchanges = changes_lost = ndeferred = 0;
  sticky[0] = sticky[1] = maybe_sticky = 0;
  if (header & 2)
    fake_set_paused(1);

  int started = two && worker_start(&b);
  run_ops(&a);
  if (in_child)
    child_finish(&a, header);
  if (started)
    worker_wait();

  faults_clear();
  int deleters_last = header & 16;
#ifdef CUSAFE_HAVE_DLPACK
  if (!deleters_last)
    pending_delete_all(&a);
#endif
  int tainted = faults_used && !strict_faults && destroying_call_failed();
  if (header & 4)
    fake_set_paused(0);
  if (tainted) {
    finish_tainted(&a, header & 8, deleters_last);
  } else {
    release_all(header & 8);
#ifdef CUSAFE_HAVE_DLPACK
    if (deleters_last)
      pending_delete_all(&a);
#endif
  }
  other_finish(tainted);
#ifdef CUSAFE_HAVE_DLPACK
  imports_finish(!tainted);
#endif
  if (!tainted)
    check_nothing_alive(1);
  memset(pool, 0, sizeof pool);
  fake_reset();
  return 0;
}
