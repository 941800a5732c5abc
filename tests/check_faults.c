/* check_faults.c -- a failure of every CUDA call of every public operation,
 * against the fake CUDA.
 *
 * SQLite's fault-injection loop, one operation at a time: each operation of
 * cusafe.h that calls CUDA is set up (without failures), then for N = 1, 2,
 * ... the N-th CUDA call of the operation fails, until the operation
 * completes without reaching the failure.  The loop runs once failing that
 * one call and once failing every call from N on (persistent).  Each
 * (operation, N) runs in a forked child, with a fresh library and a fresh
 * fake.
 *
 * The error injected is the one the call returns in real life, chosen by
 * the function's name (`injections` below, with the status and message each
 * one must give): allocations run out of memory, a launch runs out of
 * resources, a synchronisation or query finds the device broken by a kernel
 * fault, a query finds work pending, the device count finds no driver or no
 * device, NVRTC fails inside.  Which function the N-th call is comes from
 * the log of a clean run of the operation.  A kernel fault is a sticky
 * error: the device stays broken.  Where no earlier call of the operation
 * would notice it, the fake's device is made sticky before the operation,
 * so that call N is the first to see the fault, as after a fault just
 * before it; otherwise call N fails by number and the device is made
 * sticky right after the operation.
 *
 * Every failure must return exactly the status and message of the failed
 * call (failing persistently: of one of the failed calls), hand out no
 * handle, leak nothing once the test released what it set up, and leave the
 * library usable: the same operation succeeds afterwards, on the same
 * objects and on new ones.  Leaks are excused only where a failed call was
 * itself a free, a destroy or a release of the primary context that the
 * library does not retry (`cleanup_calls`), or, failing persistently, where
 * the clean run made such a call from call N on; those runs are counted
 * apart.  A failure that the operation absorbs (it succeeds all the same)
 * is allowed only for the calls whose failure the library documents as
 * harmless (`absorbable`).  The shutdown succeeds whatever fails, and must
 * still destroy everything.
 *
 * Each operation prints a line of counts, and the program a total at the
 * end.  A run that goes wrong is listed with the first line of what its
 * child printed; the child's whole output follows on stderr. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cusafe.h"
#ifdef CUSAFE_HAVE_DLPACK
#include "cusafe_dlpack.h"
#endif
#include "fakecuda.h"
#include "testutil.h"
#include "fakeutil.h"

#define KIB ((size_t)1024)
#define SIZE 4096 /* bytes of every buffer */
#define NFLOATS (SIZE / sizeof(float))
#define SENTINEL ((cusafe_handle)0x1234)
#define MAX_CALLS 512 /* CUDA calls of one operation, at most */
#define NAME_MAX_LEN 64

/* A fake image (see fakecuda.h): k1 (p, 4, 8), small (p; at most 128
 * threads, 1 KiB of static shared memory). */
static const char fake_image[] = "FAKECUBIN\n"
                                 "kernel k1 p 4 8\n"
                                 "kernel small maxthreads=128 shared=1024 p\n";

static const char compile_source[] =
    "extern \"C\" __global__ void ax(float *y, const float *x, float a,\n"
    "                                size_t n) {}\n";

static unsigned char host_in[SIZE], host_out[SIZE];

/* ------------------------------------------------------------------------ */
/* What each failure must give                                                */
/* ------------------------------------------------------------------------ */

/* The words of the fake (and of the CUDA runtime) for each injected
 * error. */
static const char *cuda_words(cudaError_t err) {
  switch (err) {
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInsufficientDriver:
    return "CUDA driver version is insufficient for CUDA runtime version";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorIllegalAddress:
    return "an illegal memory access was encountered";
  case cudaErrorLaunchOutOfResources:
    return "too many resources requested for launch";
  case cudaErrorUnknown: return "unknown error";
  default: return "?";
  }
}

/* One row: what `function` failing with `err` must return.  `message` is
 * a printf format whose first argument is the function's name and whose
 * second is CUDA's words for err.  `cuda_error`: what
 * cusafe_last_cuda_error() must give (-1: err itself).  Rows with `inject`
 * set are the errors the loop injects into calls of that function, each in
 * a run of its own; the others say what a function gives when it fails
 * with another function's error (failing persistently).  A function with
 * no row of its own fails with cudaErrorUnknown: CUSAFE_ERROR_CUDA.
 * "nvrtc*" matches every NVRTC function, which the fake fails with the
 * nvrtcResult of err (out of memory, or an internal error). */
struct expectation {
  const char *function; /* NULL: any function */
  cudaError_t err;
  int inject;
  int sticky; /* a sticky error: the device is broken after it */
  cusafe_status status;
  const char *message;
  int cuda_error;
};

#define FAILED_MSG "{fn} failed: {cuda}"
#define NO_DRIVER_MSG "no CUDA driver found: {cuda}"

static const struct expectation injections[] = {
    /* Initialisation: no driver, no device. */
    {"cudaGetDeviceCount", cudaErrorInsufficientDriver, 1, 0,
     CUSAFE_ERROR_NO_DRIVER, NO_DRIVER_MSG, -1},
    {"cudaGetDeviceCount", cudaErrorNoDevice, 1, 0, CUSAFE_ERROR_NO_DEVICE,
     "no CUDA device found", -1},
    /* The driver's entry points: without them there is no usable driver. */
    {"cudaGetDriverEntryPointByVersion", cudaErrorUnknown, 1, 0,
     CUSAFE_ERROR_NO_DRIVER, NO_DRIVER_MSG, -1},
    /* Allocations run out of memory. */
    {"cudaMallocAsync", cudaErrorMemoryAllocation, 1, 0,
     CUSAFE_ERROR_OUT_OF_MEMORY, FAILED_MSG, -1},
    {"cudaMallocHost", cudaErrorMemoryAllocation, 1, 0,
     CUSAFE_ERROR_OUT_OF_MEMORY, FAILED_MSG, -1},
    {"cudaMallocManaged", cudaErrorMemoryAllocation, 1, 0,
     CUSAFE_ERROR_OUT_OF_MEMORY, FAILED_MSG, -1},
    /* A launch asks for more registers or threads than there are: the
     * driver's call refuses it, and so does the runtime's that the
     * library then makes (failing persistently), whose error is the
     * launch's.  Failing once, the driver's refusal is absorbed. */
    {"cuLaunchKernel", cudaErrorLaunchOutOfResources, 1, 0, CUSAFE_ERROR_CUDA,
     FAILED_MSG, -1},
    {"cuLaunchKernelEx", cudaErrorLaunchOutOfResources, 1, 0, CUSAFE_ERROR_CUDA,
     FAILED_MSG, -1},
    {"cudaLaunchKernel", cudaErrorLaunchOutOfResources, 0, 0, CUSAFE_ERROR_CUDA,
     FAILED_MSG, -1},
    {"cudaLaunchKernelExC", cudaErrorLaunchOutOfResources, 0, 0,
     CUSAFE_ERROR_CUDA, FAILED_MSG, -1},
    /* A descriptor that the driver does not take as shareable memory. */
    {"cuMemImportFromShareableHandle", cudaErrorUnknown, 1, 0,
     CUSAFE_ERROR_INVALID_VALUE,
     "{fn} failed: {cuda} (the fd of desc is no shareable CUDA memory)", -1},
    /* Synchronisations report a kernel fault, which breaks the device. */
    {"cudaStreamSynchronize", cudaErrorIllegalAddress, 1, 1, CUSAFE_ERROR_CUDA,
     FAILED_MSG, -1},
    {"cudaEventSynchronize", cudaErrorIllegalAddress, 1, 1, CUSAFE_ERROR_CUDA,
     FAILED_MSG, -1},
    {"cudaDeviceSynchronize", cudaErrorIllegalAddress, 1, 1, CUSAFE_ERROR_CUDA,
     FAILED_MSG, -1},
    /* Queries find work pending, or the fault. */
    {"cudaStreamQuery", cudaErrorNotReady, 1, 0, CUSAFE_ERROR_NOT_READY,
     "work is still pending", -1},
    {"cudaStreamQuery", cudaErrorIllegalAddress, 1, 1, CUSAFE_ERROR_CUDA,
     FAILED_MSG, -1},
    {"cudaEventQuery", cudaErrorNotReady, 1, 0, CUSAFE_ERROR_NOT_READY,
     "work is still pending", -1},
    {"cudaEventQuery", cudaErrorIllegalAddress, 1, 1, CUSAFE_ERROR_CUDA,
     FAILED_MSG, -1},
    {"cudaEventElapsedTime", cudaErrorNotReady, 1, 0, CUSAFE_ERROR_NOT_READY,
     "work is still pending", -1},
    {"cudaEventElapsedTime", cudaErrorIllegalAddress, 1, 1, CUSAFE_ERROR_CUDA,
     FAILED_MSG, -1},
    /* NVRTC: out of memory, or an internal error of the compiler. */
    {"nvrtcCreateProgram", cudaErrorMemoryAllocation, 1, 0,
     CUSAFE_ERROR_OUT_OF_MEMORY, "{fn} failed: NVRTC_ERROR_OUT_OF_MEMORY", 0},
    {"nvrtcCompileProgram", cudaErrorUnknown, 1, 0, CUSAFE_ERROR_COMPILE,
     "{fn} failed: NVRTC_ERROR_INTERNAL_ERROR", 0},
    {"nvrtcCompileProgram", cudaErrorMemoryAllocation, 1, 0,
     CUSAFE_ERROR_OUT_OF_MEMORY, "{fn} failed: NVRTC_ERROR_OUT_OF_MEMORY", 0},
    {"nvrtc*", cudaErrorMemoryAllocation, 0, 0, CUSAFE_ERROR_OUT_OF_MEMORY,
     "{fn} failed: NVRTC_ERROR_OUT_OF_MEMORY", 0},
    {"nvrtc*", cudaErrorUnknown, 1, 0, CUSAFE_ERROR_COMPILE,
     "{fn} failed: NVRTC_ERROR_INTERNAL_ERROR", 0},
    /* Any other function failing with any of the errors above. */
    {NULL, cudaErrorUnknown, 1, 0, CUSAFE_ERROR_CUDA, FAILED_MSG, -1},
    {NULL, cudaErrorMemoryAllocation, 0, 0, CUSAFE_ERROR_OUT_OF_MEMORY,
     FAILED_MSG, -1},
    {NULL, cudaErrorIllegalAddress, 0, 0, CUSAFE_ERROR_CUDA, FAILED_MSG, -1},
    {NULL, cudaErrorLaunchOutOfResources, 0, 0, CUSAFE_ERROR_CUDA, FAILED_MSG,
     -1},
    {NULL, cudaErrorNotReady, 0, 0, CUSAFE_ERROR_NOT_READY, FAILED_MSG, -1},
};
#define NINJECTIONS (sizeof injections / sizeof injections[0])

static int function_matches(const char *pattern, const char *name) {
  if (!pattern)
    return 1;
  size_t n = strlen(pattern);
  if (n > 0 && pattern[n - 1] == '*')
    return strncmp(pattern, name, n - 1) == 0;
  return strcmp(pattern, name) == 0;
}

/* Whether a row names this function itself (not through a wildcard). */
static int row_names(const struct expectation *e, const char *name) {
  return e->function && function_matches(e->function, name);
}

/* The row for `function` failing with err: the function's own (or its
 * family's), else the one for any function. */
static const struct expectation *expectation_of(const char *function,
                                                cudaError_t err) {
  for (size_t i = 0; i < NINJECTIONS; i++)
    if (injections[i].err == err && row_names(&injections[i], function))
      return &injections[i];
  for (size_t i = 0; i < NINJECTIONS; i++)
    if (injections[i].err == err && !injections[i].function)
      return &injections[i];
  return NULL;
}

/* The errors injected into calls of `function`, in order; returns how many
 * (at most max). */
static size_t injections_of(const char *function,
                            const struct expectation **out, size_t max) {
  size_t n = 0;
  for (size_t i = 0; i < NINJECTIONS && n < max; i++)
    if (injections[i].inject && row_names(&injections[i], function))
      out[n++] = &injections[i];
  if (n == 0)
    out[n++] = expectation_of(function, cudaErrorUnknown);
  return n;
}

/* Whether `msg`, status `st` and CUDA error `cuda_err` are what `function`
 * failing with err gives. */
/* Writes `format` with "{fn}" replaced by the failed function's name and
 * "{cuda}" by CUDA's words for the error. */
static void expand(char *out, size_t n, const char *format, const char *fn,
                   const char *cuda) {
  size_t len = 0;
  out[0] = '\0';
  while (*format && len + 1 < n) {
    const char *sub = NULL;
    if (!strncmp(format, "{fn}", 4))
      sub = fn;
    else if (!strncmp(format, "{cuda}", 6))
      sub = cuda;
    if (sub) {
      len += (size_t)snprintf(out + len, n - len, "%s", sub);
      if (len >= n)
        len = n - 1;
      format += sub == fn ? 4 : 6;
    } else {
      out[len++] = *format++;
      out[len] = '\0';
    }
  }
}

static int is_failure_of(const char *function, cudaError_t err,
                         cusafe_status st, const char *msg, int cuda_err,
                         char *want, size_t nwant) {
  const struct expectation *e = expectation_of(function, err);
  if (!e) {
    snprintf(want, nwant, "(no expectation for %s failing with %d)", function,
             (int)err);
    return 0;
  }
  expand(want, nwant, e->message, function, cuda_words(err));
  int want_cuda = e->cuda_error < 0 ? (int)err : e->cuda_error;
  return st == e->status && strcmp(msg, want) == 0 && cuda_err == want_cuda;
}

/* Failures the library absorbs by design: the operation still succeeds.
 * Restoring the caller's device is best effort; cudaGetLastError only
 * clears the error the end of a parameter list leaves; the third entry
 * point (cuLibraryGetModule) is optional; a stream-ordered free that
 * cannot be queued is done synchronously.  Frees and destroys are
 * counted as "failed in a free" instead. */
static const char *const absorbable[] = {
    "cudaSetDevice", "cudaGetLastError", "cudaGetDriverEntryPointByVersion",
    "cudaFreeAsync",
    /* The driver's launch calls: a launch that fails there is made again
     * through the runtime, whose answer is the launch's. */
    "cuLaunchKernel", "cuLaunchKernelEx",
    /* Peer access, set up before the first copy between two devices:
     * without it CUDA stages the copy through the host. */
    "cudaDeviceCanAccessPeer", "cudaDeviceEnablePeerAccess",
    "cudaDeviceGetMemPool", "cudaMemPoolSetAccess",
    /* A graph destroyed in the thread's own capture mode: the destruction
     * is retried before its context goes if that makes it fail. */
    "cudaThreadExchangeStreamCaptureMode",
    /* CUDA's id of a capture, asked when it begins, for a failed end's
     * mark: that end asks again. */
    "cudaStreamGetCaptureInfo"};

static int is_absorbable(const char *name) {
  for (size_t i = 0; i < sizeof absorbable / sizeof absorbable[0]; i++)
    if (strcmp(name, absorbable[i]) == 0)
      return 1;
  return 0;
}

/* A teardown (a last release) must synchronise the right device before it
 * frees, so it tries to make the device current once more when that
 * fails: a single failure of cudaGetDevice is absorbed there too. */
static int is_absorbable_in(const char *name, int teardown) {
  return is_absorbable(name) ||
         (teardown && strcmp(name, "cudaGetDevice") == 0);
}

/* Calls whose failure leaves a CUDA object that nothing can free any more:
 * what they held is not counted as a leak.  The library retries a failed
 * cudaFreeAsync as cudaFree, and a failed cudaLibraryUnload before the
 * primary context goes, so those two excuse a leak only where the retry
 * fails too: failing persistently. */
static const char *const cleanup_calls[] = {
    "cudaGraphExecDestroy",
    "cudaGraphDestroy",
    "cudaFree",
    "cudaFreeHost",
    "cudaStreamDestroy",
    "cudaEventDestroy",
    "cuDevicePrimaryCtxRelease",
    "nvrtcDestroyProgram",
    "cuMemUnmap",
    "cuMemAddressFree",
    "cuMemRelease",
    "cudaFreeAsync",
    "cudaLibraryUnload",
};
#define NCLEANUP_RETRIED 2 /* the last two */

static int is_cleanup_call(const char *name, int retried_too) {
  size_t n = sizeof cleanup_calls / sizeof cleanup_calls[0];
  if (!retried_too)
    n -= NCLEANUP_RETRIED;
  for (size_t i = 0; i < n; i++)
    if (strcmp(name, cleanup_calls[i]) == 0)
      return 1;
  return 0;
}

/* Calls that a sticky error leaves working (fakecuda.h): device queries,
 * the current device, the thread's capture mode, and everything that frees
 * or destroys. */
static const char *const sticky_immune[] = {
    "cudaGetDevice",
    "cudaThreadExchangeStreamCaptureMode",
    "cudaSetDevice",
    "cudaGetDeviceCount",
    "cudaGetDeviceProperties",
    "cudaDeviceGetAttribute",
    "cudaGetDriverEntryPointByVersion",
    "cuDevicePrimaryCtxRelease",
    "cudaFree",
    "cudaFreeAsync",
    "cudaFreeHost",
    "cudaStreamDestroy",
    "cudaEventDestroy",
    "cudaLibraryUnload"};

static int is_sticky_immune(const char *name) {
  for (size_t i = 0; i < sizeof sticky_immune / sizeof sticky_immune[0]; i++)
    if (strcmp(name, sticky_immune[i]) == 0)
      return 1;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The fake's log                                                             */
/* ------------------------------------------------------------------------ */

/* Whether one of the calls numbered first..last was a cleanup call that
 * is not retried. */
static int failure_hit_cleanup(unsigned long first, unsigned long last) {
  for (unsigned long k = first; k <= last; k++)
    if (is_cleanup_call(tu_call_name(k), 0))
      return 1;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The operations                                                             */
/* ------------------------------------------------------------------------ */

/* Everything an operation may need; a handle is 0 when not made. */
struct world {
  cusafe_context ctx, ctx1;
  cusafe_stream s1, s2, s3, s11; /* s11: a stream of ctx1 */
  cusafe_event e1, e2, e11;
  cusafe_buffer a, b, c, pinned, managed, view, async, d1, tmp;
  cusafe_module m, m1;
  cusafe_kernel k, k1;
  cusafe_graph g;
  /* A compound operation's first failure, kept across the cleanup calls
   * that follow it (a capture ended after a step failed). */
  char failure[1024];
  int failure_cuda;
  cusafe_handle out;  /* what the operation made */
  cusafe_handle gone; /* what the operation released */
  int n;
  uint32_t block, grid;
  float ms;
  cusafe_device_properties props;
  char path[64];
};

/* Children before parents, so that a failure to release names the first
 * object that would not go. */
#define WORLD_HANDLES(w)                                                       \
  {                                                                            \
    &(w)->out, &(w)->g, &(w)->k, &(w)->k1, &(w)->m, &(w)->m1, &(w)->view,      \
        &(w)->a, &(w)->b, &(w)->c, &(w)->pinned, &(w)->managed, &(w)->async,   \
        &(w)->d1, &(w)->tmp, &(w)->e1, &(w)->e2, &(w)->e11, &(w)->s1,          \
        &(w)->s2, &(w)->s3, &(w)->s11, &(w)->ctx, &(w)->ctx1                   \
  }
#define WORLD_NHANDLES 24

/* Releases what the world holds.  Strictly (every release must succeed),
 * or on a broken device (CUSAFE_ERROR_CUDA allowed, the handle stale all
 * the same), or all but the contexts (after an excused leak, whose CUDA
 * object would make the fake abort at the primary context's release), or
 * after the shutdown (every release a no-op that succeeds). */
enum release_mode {
  RELEASE_STRICT,
  RELEASE_BROKEN,
  RELEASE_CHILDREN,
  RELEASE_SHUT_DOWN
};

static void world_release(struct world *w, enum release_mode mode) {
  cusafe_handle *all[WORLD_NHANDLES] = WORLD_HANDLES(w);
  for (int i = 0; i < WORLD_NHANDLES; i++) {
    cusafe_handle h = *all[i];
    if (h == CUSAFE_NULL_HANDLE)
      continue;
    if (mode == RELEASE_CHILDREN && (all[i] == &w->ctx || all[i] == &w->ctx1))
      continue;
    /* A context is one per device: another world may hold it too. */
    cusafe_handle_type type = CUSAFE_TYPE_INVALID;
    if (mode == RELEASE_STRICT || mode == RELEASE_BROKEN)
      TU_OK(cusafe_handle_get_type(&type, h));
    cusafe_status st = cusafe_release(h);
    if (mode == RELEASE_STRICT || mode == RELEASE_SHUT_DOWN)
      TU_ASSERT(st == CUSAFE_SUCCESS, "release of handle %d failed: %s", i,
                cusafe_last_error_message());
    else if (mode == RELEASE_BROKEN)
      TU_ASSERT(st == CUSAFE_SUCCESS || st == CUSAFE_ERROR_CUDA,
                "release of handle %d on a broken device returned %s: %s", i,
                cusafe_status_string(st), cusafe_last_error_message());
    if ((mode == RELEASE_STRICT || mode == RELEASE_BROKEN) &&
        type != CUSAFE_TYPE_CONTEXT)
      TU_STALE(h);
    *all[i] = CUSAFE_NULL_HANDLE;
  }
  if (w->path[0]) {
    unlink(w->path);
    w->path[0] = '\0';
  }
}

#define OK(expr) TU_OK(expr)

static void su_init(struct world *w) { OK(cusafe_device_count(&w->n)); }

static void su_ctx(struct world *w) { OK(cusafe_context_create(&w->ctx, 0)); }

static void su_ctx_s1(struct world *w) {
  su_ctx(w);
  OK(cusafe_stream_create(&w->s1, w->ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
}

/* Buffer a, last used on stream s1: the next use elsewhere hands over. */
static void su_handoff(struct world *w) {
  su_ctx_s1(w);
  OK(cusafe_buffer_alloc(&w->a, w->ctx, CUSAFE_MEMORY_DEVICE, SIZE));
  OK(cusafe_buffer_fill(w->a, 0, SIZE, 1, w->s1));
}

static void su_handoff_s2(struct world *w) {
  su_handoff(w);
  OK(cusafe_stream_create(&w->s2, w->ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
}

static void su_two_devices(struct world *w) {
  su_ctx_s1(w);
  OK(cusafe_context_create(&w->ctx1, 1));
  OK(cusafe_buffer_alloc(&w->d1, w->ctx1, CUSAFE_MEMORY_DEVICE, SIZE));
}

static void su_fake_module(struct world *w) {
  su_ctx(w);
  OK(cusafe_module_load_data(&w->m, w->ctx, fake_image, sizeof fake_image));
}

static cusafe_status op_device_count(struct world *w) {
  w->n = 5;
  cusafe_status st = cusafe_device_count(&w->n);
  if (st != CUSAFE_SUCCESS)
    TU_ASSERT(w->n == 0, "failed device count stored %d", w->n);
  return st;
}

static cusafe_status op_context_create0(struct world *w) {
  w->out = SENTINEL;
  return cusafe_context_create(&w->out, 0);
}

static cusafe_status op_context_create1(struct world *w) {
  w->out = SENTINEL;
  return cusafe_context_create(&w->out, 1);
}

static cusafe_status op_properties(struct world *w) {
  return cusafe_device_get_properties(&w->props, 1);
}

static void su_context_synchronize(struct world *w) {
  su_ctx(w);
  OK(cusafe_buffer_alloc(&w->a, w->ctx, CUSAFE_MEMORY_DEVICE, SIZE));
  fake_set_paused(1);
  OK(cusafe_buffer_fill(w->a, 0, SIZE, 2, CUSAFE_STREAM_DEFAULT));
}

static cusafe_status op_context_synchronize(struct world *w) {
  return cusafe_context_synchronize(w->ctx);
}

/* The context's default stream has a hand-off event, and a free and a
 * stream still have work queued when the last reference goes. */
static void su_context_release(struct world *w) {
  su_handoff(w);
  fake_set_paused(1);
  OK(cusafe_buffer_release(w->a));
  w->a = CUSAFE_NULL_HANDLE;
  OK(cusafe_stream_release(w->s1));
  w->s1 = CUSAFE_NULL_HANDLE;
}

static cusafe_status op_context_release(struct world *w) {
  w->gone = w->ctx;
  w->ctx = CUSAFE_NULL_HANDLE;
  return cusafe_context_release(w->gone);
}

static cusafe_status op_stream_create(struct world *w) {
  w->out = SENTINEL;
  return cusafe_stream_create(&w->out, w->ctx, CUSAFE_STREAM_NON_BLOCKING, -1);
}

static void su_stream_synchronize(struct world *w) {
  su_handoff(w);
  fake_set_paused(1);
  OK(cusafe_buffer_fill(w->a, 0, SIZE, 3, w->s1));
}

static cusafe_status op_stream_synchronize(struct world *w) {
  return cusafe_stream_synchronize(w->s1);
}

static cusafe_status op_stream_query(struct world *w) {
  return cusafe_stream_query(w->s1);
}

static void su_stream_wait_event(struct world *w) {
  su_ctx_s1(w);
  OK(cusafe_stream_create(&w->s2, w->ctx, 0, 0));
  OK(cusafe_event_create(&w->e1, w->ctx, 0));
  OK(cusafe_event_record(w->e1, w->s1));
}

static cusafe_status op_stream_wait_event(struct world *w) {
  return cusafe_stream_wait_event(w->s2, w->e1);
}

/* A stream with a hand-off event and a record still queued. */
static void su_stream_release(struct world *w) {
  su_ctx_s1(w);
  OK(cusafe_buffer_alloc_async(&w->async, w->s1, SIZE));
  OK(cusafe_buffer_fill(w->async, 0, SIZE, 4, CUSAFE_STREAM_DEFAULT));
  OK(cusafe_event_create(&w->e1, w->ctx, 0));
  fake_set_paused(1);
  OK(cusafe_event_record(w->e1, w->s1));
}

static cusafe_status op_stream_release(struct world *w) {
  w->gone = w->s1;
  w->s1 = CUSAFE_NULL_HANDLE;
  return cusafe_stream_release(w->gone);
}

/* Another library's stream: here the raw stream of s1. */
static cusafe_status op_stream_wrap(struct world *w) {
  void *raw = NULL;
  OK(cusafe_stream_interop_handle(&raw, w->s1));
  w->out = SENTINEL;
  return cusafe_stream_wrap(&w->out, w->ctx, raw);
}

/* s3 wraps s1's raw stream and has a hand-off event: buffer a's work moved
 * from it to the context's stream. */
static void su_wrap_release(struct world *w) {
  void *raw = NULL;
  su_ctx_s1(w);
  OK(cusafe_stream_interop_handle(&raw, w->s1));
  OK(cusafe_stream_wrap(&w->s3, w->ctx, raw));
  OK(cusafe_buffer_alloc(&w->a, w->ctx, CUSAFE_MEMORY_DEVICE, SIZE));
  OK(cusafe_buffer_fill(w->a, 0, SIZE, 5, w->s3));
  OK(cusafe_buffer_fill(w->a, 0, SIZE, 6, CUSAFE_STREAM_DEFAULT));
}

static cusafe_status op_wrap_release(struct world *w) {
  w->gone = w->s3;
  w->s3 = CUSAFE_NULL_HANDLE;
  return cusafe_stream_release(w->gone);
}

/* Buffer a, last used on s1, recorded as used by work on s2. */
static cusafe_status op_use_buffers(struct world *w) {
  const cusafe_buffer list[] = {w->a, w->a};
  return cusafe_stream_use_buffers(w->s2, list, 2);
}

static cusafe_status op_event_create(struct world *w) {
  w->out = SENTINEL;
  return cusafe_event_create(&w->out, w->ctx, CUSAFE_EVENT_BLOCKING_SYNC);
}

static void su_event(struct world *w) {
  su_ctx_s1(w);
  OK(cusafe_event_create(&w->e1, w->ctx, 0));
}

static cusafe_status op_event_record(struct world *w) {
  return cusafe_event_record(w->e1, w->s1);
}

static void su_event_synchronize(struct world *w) {
  su_handoff(w);
  OK(cusafe_event_create(&w->e1, w->ctx, 0));
  fake_set_paused(1);
  OK(cusafe_buffer_fill(w->a, 0, SIZE, 5, w->s1));
  OK(cusafe_event_record(w->e1, w->s1));
}

static cusafe_status op_event_synchronize(struct world *w) {
  return cusafe_event_synchronize(w->e1);
}

static void su_event_recorded(struct world *w) {
  su_event(w);
  OK(cusafe_event_record(w->e1, w->s1));
}

static cusafe_status op_event_query(struct world *w) {
  return cusafe_event_query(w->e1);
}

static void su_event_elapsed(struct world *w) {
  su_handoff(w);
  OK(cusafe_event_create(&w->e1, w->ctx, 0));
  OK(cusafe_event_create(&w->e2, w->ctx, 0));
  OK(cusafe_event_record(w->e1, w->s1));
  OK(cusafe_buffer_fill(w->a, 0, SIZE, 6, w->s1));
  OK(cusafe_event_record(w->e2, w->s1));
  OK(cusafe_stream_synchronize(w->s1));
}

static cusafe_status op_event_elapsed(struct world *w) {
  w->ms = -1.0f;
  cusafe_status st = cusafe_event_elapsed_ms(&w->ms, w->e1, w->e2);
  if (st != CUSAFE_SUCCESS)
    TU_ASSERT(w->ms == 0.0f, "failed elapsed_ms stored %g", (double)w->ms);
  return st;
}

static cusafe_status op_event_release(struct world *w) {
  w->gone = w->e1;
  w->e1 = CUSAFE_NULL_HANDLE;
  return cusafe_event_release(w->gone);
}

static cusafe_status op_alloc_device(struct world *w) {
  w->out = SENTINEL;
  return cusafe_buffer_alloc(&w->out, w->ctx, CUSAFE_MEMORY_DEVICE, SIZE);
}

static cusafe_status op_alloc_pinned(struct world *w) {
  w->out = SENTINEL;
  return cusafe_buffer_alloc(&w->out, w->ctx, CUSAFE_MEMORY_HOST_PINNED, SIZE);
}

static cusafe_status op_alloc_managed(struct world *w) {
  w->out = SENTINEL;
  return cusafe_buffer_alloc(&w->out, w->ctx, CUSAFE_MEMORY_MANAGED, SIZE);
}

static cusafe_status op_alloc_async(struct world *w) {
  w->out = SENTINEL;
  return cusafe_buffer_alloc_async(&w->out, w->s1, SIZE);
}

static void su_buffer(struct world *w) {
  su_ctx(w);
  OK(cusafe_buffer_alloc(&w->a, w->ctx, CUSAFE_MEMORY_DEVICE, SIZE));
}

/* Shareable memory: a buffer of it (tmp), last used on s1, and its
 * description as another process would receive it. */
static cusafe_ipc_desc shared_desc;

static void su_shareable(struct world *w) {
  su_ctx_s1(w);
  OK(cusafe_buffer_alloc_shareable(&w->tmp, w->ctx, SIZE));
  OK(cusafe_buffer_fill(w->tmp, 0, SIZE, 2, w->s1));
}

static void su_shared_desc(struct world *w) {
  su_shareable(w);
  OK(cusafe_buffer_export(&shared_desc, w->tmp));
  shared_desc.process ^= 0x5a5a5a5a5a5a5a5aull;
}

static cusafe_status op_alloc_shareable(struct world *w) {
  w->out = SENTINEL;
  return cusafe_buffer_alloc_shareable(&w->out, w->ctx, SIZE);
}

static cusafe_status op_export(struct world *w) {
  cusafe_ipc_desc d;
  cusafe_status st = cusafe_buffer_export(&d, w->tmp);
  if (st == CUSAFE_SUCCESS)
    close(d.fd);
  else
    TU_ASSERT(d.fd == -1, "a failed export left fd %d", (int)d.fd);
  return st;
}

static cusafe_status op_import(struct world *w) {
  w->out = SENTINEL;
  return cusafe_buffer_import(&w->out, w->ctx, &shared_desc);
}

static cusafe_status op_ipc_device(struct world *w) {
  (void)w;
  int dev = 7;
  cusafe_status st = cusafe_ipc_device(&dev, &shared_desc);
  TU_ASSERT(st == CUSAFE_SUCCESS ? dev == 0 : dev == -1,
            "status %d left device %d", (int)st, dev);
  return st;
}

static cusafe_status op_release_shareable(struct world *w) {
  w->gone = w->tmp;
  w->tmp = CUSAFE_NULL_HANDLE;
  return cusafe_buffer_release(w->gone);
}

/* Wrapped memory: a refused wrap leaves it to its owner (never released). */
static int wrap_releases;

static void count_release(void *user) {
  (void)user;
  wrap_releases++;
}

static cusafe_status op_wrap(struct world *w) {
  void *ptr = NULL;
  OK(cusafe_buffer_interop_pointer(&ptr, w->a));
  w->out = SENTINEL;
  wrap_releases = 0;
  cusafe_status st = cusafe_buffer_wrap(&w->out, w->ctx, CUSAFE_MEMORY_DEVICE,
                                        ptr, SIZE, count_release, NULL);
  if (st != CUSAFE_SUCCESS)
    TU_ASSERT(wrap_releases == 0, "a refused wrap gave the memory back");
  return st;
}

/* Wrapped memory whose last reference goes with work queued: its owner
 * (a buffer of the world's, which it no longer holds) gets it back once,
 * and frees it then, whatever fails meanwhile. */
static cusafe_buffer wrapped_owner;

static void free_owner(void *user) {
  (void)user;
  wrap_releases++;
  (void)cusafe_buffer_release(wrapped_owner);
}

static void su_release_wrapped(struct world *w) {
  void *ptr = NULL;
  su_ctx_s1(w);
  OK(cusafe_buffer_alloc(&wrapped_owner, w->ctx, CUSAFE_MEMORY_DEVICE, SIZE));
  OK(cusafe_buffer_interop_pointer(&ptr, wrapped_owner));
  OK(cusafe_buffer_wrap(&w->tmp, w->ctx, CUSAFE_MEMORY_DEVICE, ptr, SIZE,
                        free_owner, NULL));
  fake_set_paused(1);
  OK(cusafe_buffer_fill(w->tmp, 0, SIZE, 8, w->s1));
  wrap_releases = 0;
}

static cusafe_status op_release_wrapped(struct world *w) {
  w->gone = w->tmp;
  w->tmp = CUSAFE_NULL_HANDLE;
  cusafe_status st = cusafe_buffer_release(w->gone);
  TU_ASSERT(wrap_releases == 1, "wrapped memory given back %d times",
            wrap_releases);
  return st;
}

#ifdef CUSAFE_HAVE_DLPACK
/* A DLPack tensor of another library over buffer a's memory, whose
 * deleter counts: a refused import leaves it to its producer. */
static DLManagedTensorVersioned import_tensor;
static int64_t import_shape[1] = {SIZE};

static void count_delete(DLManagedTensorVersioned *t) {
  (void)t;
  wrap_releases++;
}

static void tensor_over(cusafe_buffer b) {
  void *ptr = NULL;
  OK(cusafe_buffer_interop_pointer(&ptr, b));
  import_tensor =
      (DLManagedTensorVersioned){.version = {1, 0},
                                 .deleter = count_delete,
                                 .dl_tensor = {.data = ptr,
                                               .device = {kDLCUDA, 0},
                                               .ndim = 1,
                                               .dtype = {kDLUInt, 8, 1},
                                               .shape = import_shape}};
}

static cusafe_status op_from_dlpack(struct world *w) {
  tensor_over(w->a);
  w->out = SENTINEL;
  wrap_releases = 0;
  cusafe_status st = cusafe_buffer_from_dlpack(&w->out, w->ctx, &import_tensor);
  if (st != CUSAFE_SUCCESS)
    TU_ASSERT(wrap_releases == 0, "a refused import called the deleter");
  return st;
}

/* An import whose last reference goes with work queued: the deleter runs
 * once, whatever fails meanwhile, and its producer (a buffer of the
 * world's, which it no longer holds) frees the memory then. */
static void delete_owner(DLManagedTensorVersioned *t) {
  (void)t;
  free_owner(NULL);
}

static void su_release_import(struct world *w) {
  su_ctx_s1(w);
  OK(cusafe_buffer_alloc(&wrapped_owner, w->ctx, CUSAFE_MEMORY_DEVICE, SIZE));
  tensor_over(wrapped_owner);
  import_tensor.deleter = delete_owner;
  OK(cusafe_buffer_from_dlpack(&w->tmp, w->ctx, &import_tensor));
  fake_set_paused(1);
  OK(cusafe_buffer_fill(w->tmp, 0, SIZE, 8, w->s1));
  wrap_releases = 0;
}

static cusafe_status op_release_import(struct world *w) {
  w->gone = w->tmp;
  w->tmp = CUSAFE_NULL_HANDLE;
  cusafe_status st = cusafe_buffer_release(w->gone);
  TU_ASSERT(wrap_releases == 1, "the tensor deleted %d times", wrap_releases);
  return st;
}

/* An export, deleted after a fault: the buffer goes with its deleter. */
static cusafe_status op_to_dlpack(struct world *w) {
  DLManagedTensorVersioned *t = NULL;
  int64_t n = SIZE / 4;
  cusafe_status st =
      cusafe_buffer_to_dlpack(&t, w->a, 0, (DLDataType){kDLFloat, 32, 1}, 1, &n,
                              NULL, CUSAFE_NULL_HANDLE);
  if (st == CUSAFE_SUCCESS)
    t->deleter(t);
  else
    TU_ASSERT(t == NULL, "a refused export gave a tensor");
  return st;
}
#endif

static cusafe_status op_view(struct world *w) {
  w->out = SENTINEL;
  return cusafe_buffer_view(&w->out, w->a, 16, 256);
}

static cusafe_status op_write(struct world *w) {
  return cusafe_buffer_write(w->a, 0, host_in, SIZE);
}

static cusafe_status op_read(struct world *w) {
  return cusafe_buffer_read(w->a, 0, host_out, SIZE);
}

static cusafe_status op_write_async(struct world *w) {
  return cusafe_buffer_write_async(w->a, 0, host_in, SIZE, w->s2);
}

static cusafe_status op_read_async(struct world *w) {
  return cusafe_buffer_read_async(w->a, 0, host_out, SIZE, w->s2);
}

/* a last used on s1, b on s2, the copy on s3: two hand-offs. */
static void su_copy(struct world *w) {
  su_handoff_s2(w);
  OK(cusafe_stream_create(&w->s3, w->ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  OK(cusafe_buffer_alloc(&w->b, w->ctx, CUSAFE_MEMORY_DEVICE, SIZE));
  OK(cusafe_buffer_fill(w->b, 0, SIZE, 7, w->s2));
}

static cusafe_status op_copy(struct world *w) {
  return cusafe_buffer_copy(w->b, 0, w->a, 0, SIZE, w->s3);
}

/* A peer copy from device 0 to device 1, on a stream of device 0. */
static void su_copy_peer(struct world *w) {
  su_two_devices(w);
  OK(cusafe_buffer_alloc(&w->a, w->ctx, CUSAFE_MEMORY_DEVICE, SIZE));
}

static cusafe_status op_copy_peer(struct world *w) {
  return cusafe_buffer_copy(w->d1, 0, w->a, 0, SIZE, w->s1);
}

/* Pinned memory of device 0 into device memory of device 1, queued on a
 * stream of device 0: it runs on device 1. */
static void su_copy_pinned_other(struct world *w) {
  su_two_devices(w);
  OK(cusafe_buffer_alloc(&w->pinned, w->ctx, CUSAFE_MEMORY_HOST_PINNED, SIZE));
}

static cusafe_status op_copy_pinned_other(struct world *w) {
  return cusafe_buffer_copy(w->d1, 0, w->pinned, 0, SIZE, w->s1);
}

static cusafe_status op_fill(struct world *w) {
  return cusafe_buffer_fill(w->a, 0, SIZE, 8, w->s2);
}

static void su_release_device(struct world *w) {
  su_handoff(w);
  fake_set_paused(1);
  OK(cusafe_buffer_fill(w->a, 0, SIZE, 9, w->s1));
}

static cusafe_status op_release_a(struct world *w) {
  w->gone = w->a;
  w->a = CUSAFE_NULL_HANDLE;
  return cusafe_buffer_release(w->gone);
}

/* Host-accessible memory read by a copy still queued. */
static void su_release_host(struct world *w, cusafe_memory kind) {
  su_ctx_s1(w);
  OK(cusafe_buffer_alloc(&w->a, w->ctx, CUSAFE_MEMORY_DEVICE, SIZE));
  OK(cusafe_buffer_alloc(&w->tmp, w->ctx, kind, SIZE));
  OK(cusafe_buffer_write(w->tmp, 0, host_in, SIZE));
  fake_set_paused(1);
  OK(cusafe_buffer_copy(w->a, 0, w->tmp, 0, SIZE, w->s1));
}

static void su_release_pinned(struct world *w) {
  su_release_host(w, CUSAFE_MEMORY_HOST_PINNED);
}

static void su_release_managed(struct world *w) {
  su_release_host(w, CUSAFE_MEMORY_MANAGED);
}

static cusafe_status op_release_tmp(struct world *w) {
  w->gone = w->tmp;
  w->tmp = CUSAFE_NULL_HANDLE;
  return cusafe_buffer_release(w->gone);
}

/* Device memory of device 1 last written by a peer copy on a stream of
 * device 0: its free hands over to device 1. */
static void su_release_after_peer(struct world *w) {
  su_copy_peer(w);
  OK(cusafe_buffer_copy(w->d1, 0, w->a, 0, SIZE, w->s1));
}

static cusafe_status op_release_d1(struct world *w) {
  w->gone = w->d1;
  w->d1 = CUSAFE_NULL_HANDLE;
  return cusafe_buffer_release(w->gone);
}

static cusafe_status op_load_builtin(struct world *w) {
  w->out = SENTINEL;
  return cusafe_module_load_builtin(&w->out, w->ctx);
}

static cusafe_status op_load_data(struct world *w) {
  w->out = SENTINEL;
  return cusafe_module_load_data(&w->out, w->ctx, fake_image,
                                 sizeof fake_image);
}

static void su_module_file(struct world *w) {
  su_ctx(w);
  snprintf(w->path, sizeof w->path, "/tmp/cusafe-check-faults-XXXXXX");
  int fd = mkstemp(w->path);
  TU_ASSERT(fd >= 0, "mkstemp failed: %s", strerror(errno));
  TU_ASSERT(write(fd, fake_image, sizeof fake_image) ==
                (ssize_t)sizeof fake_image,
            "write failed");
  close(fd);
}

static cusafe_status op_load_file(struct world *w) {
  w->out = SENTINEL;
  return cusafe_module_load_file(&w->out, w->ctx, w->path);
}

static cusafe_status op_compile(struct world *w) {
  const char *const opts[] = {"-DM=3"};
  w->out = SENTINEL;
  return cusafe_module_compile(&w->out, w->ctx, compile_source, "ax.cu", opts,
                               1);
}

static cusafe_status op_get_kernel(struct world *w) {
  w->out = SENTINEL;
  return cusafe_module_get_kernel(&w->out, w->m, "k1");
}

/* c = a + b with the built-in kernel on s2: a was last used on s1, b and
 * c on the default stream; 64 KiB of shared memory needs the opt-in. */
static void su_launch(struct world *w) {
  su_handoff_s2(w);
  OK(cusafe_buffer_alloc(&w->b, w->ctx, CUSAFE_MEMORY_DEVICE, SIZE));
  OK(cusafe_buffer_alloc(&w->c, w->ctx, CUSAFE_MEMORY_DEVICE, SIZE));
  OK(cusafe_module_load_builtin(&w->m, w->ctx));
  OK(cusafe_module_get_kernel(&w->k, w->m, "cusafe_vecadd_f32"));
}

static cusafe_status op_launch(struct world *w) {
  cusafe_launch_config cfg = {{8, 1, 1}, {128, 1, 1}, 64 * KIB, w->s2};
  return CUSAFE_LAUNCH(w->k, &cfg, CUSAFE_ARG_BUF(w->c), CUSAFE_ARG_BUF(w->a),
                       CUSAFE_ARG_BUF(w->b), CUSAFE_ARG_U64V(NFLOATS));
}

/* The same launch with attributes: a cooperative grid of clusters of 16
 * (non-portable: the kernel is opted in), at a priority. */
static cusafe_status op_launch_cluster(struct world *w) {
  cusafe_launch_config cfg = {{16, 1, 1}, {128, 1, 1}, 64 * KIB, w->s2};
  cusafe_launch_attr attrs[4];
  memset(attrs, 0, sizeof attrs);
  attrs[0].id = CUSAFE_LAUNCH_ATTR_CLUSTER;
  attrs[0].value.dim[0] = 16;
  attrs[0].value.dim[1] = attrs[0].value.dim[2] = 1;
  attrs[1].id = CUSAFE_LAUNCH_ATTR_NON_PORTABLE_CLUSTER;
  attrs[1].value.flag = 1;
  attrs[2].id = CUSAFE_LAUNCH_ATTR_COOPERATIVE;
  attrs[2].value.flag = 1;
  attrs[3].id = CUSAFE_LAUNCH_ATTR_PRIORITY;
  attrs[3].value.priority = -1;
  const cusafe_arg args[] = {CUSAFE_ARG_BUF(w->c), CUSAFE_ARG_BUF(w->a),
                             CUSAFE_ARG_BUF(w->b), CUSAFE_ARG_U64V(NFLOATS)};
  return cusafe_kernel_launch_ex(w->k, &cfg, attrs, 4, args, 4);
}

/* A cooperative grid without clusters, then a programmatic dependent
 * launch after it. */
static cusafe_status op_launch_cooperative(struct world *w) {
  cusafe_launch_config cfg = {{8, 1, 1}, {128, 1, 1}, 0, w->s2};
  cusafe_launch_attr attrs[1];
  memset(attrs, 0, sizeof attrs);
  attrs[0].id = CUSAFE_LAUNCH_ATTR_COOPERATIVE;
  attrs[0].value.flag = 1;
  const cusafe_arg args[] = {CUSAFE_ARG_BUF(w->c), CUSAFE_ARG_BUF(w->a),
                             CUSAFE_ARG_BUF(w->b), CUSAFE_ARG_U64V(NFLOATS)};
  cusafe_status st = cusafe_kernel_launch_ex(w->k, &cfg, attrs, 1, args, 4);
  if (st != CUSAFE_SUCCESS)
    return st;
  attrs[0].id = CUSAFE_LAUNCH_ATTR_PROGRAMMATIC_SERIALIZATION;
  return cusafe_kernel_launch_ex(w->k, &cfg, attrs, 1, args, 4);
}

/* ---- graphs ---- */

/* Ends the capture on s after the captured operation's status st: the
 * graph goes to w->out on success; the first failure is returned. */
static cusafe_status capture_end(struct world *w, cusafe_stream s,
                                 cusafe_status st) {
  if (st != CUSAFE_SUCCESS) {
    snprintf(w->failure, sizeof w->failure, "%s", cusafe_last_error_message());
    w->failure_cuda = cusafe_last_cuda_error();
  }
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  cusafe_status end = cusafe_stream_end_capture(&g, s);
  if (st != CUSAFE_SUCCESS) {
    if (g)
      cusafe_release(g);
    return st;
  }
  w->out = g;
  return end;
}

/* A capture of a launch: begin, the launch, end. */
static cusafe_status op_capture_launch(struct world *w) {
  cusafe_status st = cusafe_stream_begin_capture(w->s2);
  if (st != CUSAFE_SUCCESS)
    return st;
  return capture_end(w, w->s2, op_launch(w));
}

/* A capture of attributed launches: begin, a cluster launch, a
 * cooperative and a programmatic dependent launch, end. */
static cusafe_status op_capture_launch_ex(struct world *w) {
  cusafe_status st = cusafe_stream_begin_capture(w->s2);
  if (st != CUSAFE_SUCCESS)
    return st;
  st = op_launch_cluster(w);
  if (st == CUSAFE_SUCCESS)
    st = op_launch_cooperative(w);
  return capture_end(w, w->s2, st);
}

/* A capture that another stream joins and leaves: a copy on s3 between
 * fills on s2, ordered by events recorded in the capture. */
static void su_capture_join(struct world *w) {
  su_launch(w);
  OK(cusafe_stream_create(&w->s3, w->ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  OK(cusafe_event_create(&w->e1, w->ctx, CUSAFE_EVENT_DISABLE_TIMING));
  OK(cusafe_event_create(&w->e2, w->ctx, CUSAFE_EVENT_DISABLE_TIMING));
}

static cusafe_status op_capture_join(struct world *w) {
  cusafe_status st = cusafe_stream_begin_capture(w->s2);
  if (st != CUSAFE_SUCCESS)
    return st;
  if ((st = cusafe_buffer_fill(w->a, 0, SIZE, 3, w->s2)) == CUSAFE_SUCCESS &&
      (st = cusafe_event_record(w->e1, w->s2)) == CUSAFE_SUCCESS &&
      (st = cusafe_stream_wait_event(w->s3, w->e1)) == CUSAFE_SUCCESS &&
      (st = cusafe_buffer_copy(w->b, 0, w->a, 0, SIZE, w->s3)) ==
          CUSAFE_SUCCESS &&
      (st = cusafe_event_record(w->e2, w->s3)) == CUSAFE_SUCCESS)
    st = cusafe_stream_wait_event(w->s2, w->e2);
  return capture_end(w, w->s2, st);
}

/* A graph of a launch, not yet instantiated. */
static void su_graph(struct world *w) {
  su_launch(w);
  OK(op_capture_launch(w));
  w->g = w->out;
  w->out = CUSAFE_NULL_HANDLE;
}

static cusafe_status op_graph_launch(struct world *w) {
  return cusafe_graph_launch(w->g, w->s1);
}

/* Its last reference released with two replays queued. */
static void su_graph_replays(struct world *w) {
  su_graph(w);
  fake_set_paused(1);
  OK(cusafe_graph_launch(w->g, w->s1));
  OK(cusafe_graph_launch(w->g, w->s2));
  OK(cusafe_release(w->a));
  w->a = CUSAFE_NULL_HANDLE;
}

static cusafe_status op_graph_release(struct world *w) {
  w->gone = w->g;
  w->g = CUSAFE_NULL_HANDLE;
  return cusafe_graph_release(w->gone);
}

static void su_suggest(struct world *w) {
  su_fake_module(w);
  OK(cusafe_module_get_kernel(&w->k, w->m, "small"));
}

static cusafe_status op_suggest(struct world *w) {
  w->block = w->grid = 0;
  return cusafe_kernel_suggest_config(&w->block, &w->grid, w->k, 60 * KIB,
                                      1000);
}

static cusafe_status op_module_release(struct world *w) {
  w->gone = w->m;
  w->m = CUSAFE_NULL_HANDLE;
  return cusafe_module_release(w->gone);
}

/* The kernel holds its module's last reference, and a launch of it is
 * still queued. */
static void su_kernel_release(struct world *w) {
  su_buffer(w);
  OK(cusafe_module_load_builtin(&w->m, w->ctx));
  OK(cusafe_module_get_kernel(&w->k, w->m, "cusafe_fill_f32"));
  OK(cusafe_module_release(w->m));
  w->m = CUSAFE_NULL_HANDLE;
  fake_set_paused(1);
  cusafe_launch_config cfg = {{1, 1, 1}, {256, 1, 1}, 0, CUSAFE_STREAM_DEFAULT};
  OK(CUSAFE_LAUNCH(w->k, &cfg, CUSAFE_ARG_BUF(w->a), CUSAFE_ARG_F32V(1.5f),
                   CUSAFE_ARG_U64V(NFLOATS)));
}

static cusafe_status op_kernel_release(struct world *w) {
  w->gone = w->k;
  w->k = CUSAFE_NULL_HANDLE;
  return cusafe_kernel_release(w->gone);
}

/* Objects of every type on both devices, hand-off events, a buffer
 * released with its free still queued, and work still queued. */
static void su_shutdown(struct world *w) {
  su_two_devices(w);
  OK(cusafe_stream_create(&w->s2, w->ctx, 0, -2));
  OK(cusafe_stream_create(&w->s11, w->ctx1, CUSAFE_STREAM_NON_BLOCKING, 0));
  OK(cusafe_event_create(&w->e1, w->ctx, 0));
  OK(cusafe_event_create(&w->e2, w->ctx, CUSAFE_EVENT_DISABLE_TIMING));
  OK(cusafe_event_create(&w->e11, w->ctx1, 0));
  OK(cusafe_buffer_alloc(&w->a, w->ctx, CUSAFE_MEMORY_DEVICE, SIZE));
  OK(cusafe_buffer_alloc(&w->pinned, w->ctx, CUSAFE_MEMORY_HOST_PINNED, SIZE));
  OK(cusafe_buffer_alloc(&w->managed, w->ctx, CUSAFE_MEMORY_MANAGED, SIZE));
  OK(cusafe_buffer_alloc_async(&w->async, w->s1, SIZE));
  OK(cusafe_buffer_view(&w->view, w->a, 64, 1024));
  OK(cusafe_module_load_builtin(&w->m, w->ctx));
  OK(cusafe_module_get_kernel(&w->k, w->m, "cusafe_vecadd_f32"));
  OK(cusafe_module_load_data(&w->m1, w->ctx1, fake_image, sizeof fake_image));
  OK(cusafe_module_get_kernel(&w->k1, w->m1, "k1"));
  OK(cusafe_module_release(w->m1)); /* the kernel keeps it */
  w->m1 = CUSAFE_NULL_HANDLE;
  OK(cusafe_buffer_write(w->a, 0, host_in, SIZE));
  OK(cusafe_event_record(w->e1, w->s1));
  OK(cusafe_buffer_copy(w->pinned, 0, w->a, 0, SIZE, w->s1));
  OK(cusafe_buffer_copy(w->managed, 0, w->pinned, 0, SIZE, w->s2));
  OK(cusafe_event_record(w->e11, w->s11));
  fake_set_paused(1);
  OK(cusafe_buffer_copy(w->d1, 0, w->a, 0, SIZE, w->s1));
  cusafe_launch_config cfg = {{4, 1, 1}, {256, 1, 1}, 0, w->s2};
  OK(CUSAFE_LAUNCH(w->k, &cfg, CUSAFE_ARG_BUF(w->async), CUSAFE_ARG_BUF(w->a),
                   CUSAFE_ARG_BUF(w->managed), CUSAFE_ARG_U64V(NFLOATS)));
  OK(cusafe_buffer_alloc(&w->tmp, w->ctx, CUSAFE_MEMORY_DEVICE, SIZE));
  OK(cusafe_buffer_fill(w->tmp, 0, SIZE, 10, w->s2));
  OK(cusafe_buffer_release(w->tmp));
  w->tmp = CUSAFE_NULL_HANDLE;
  OK(cusafe_event_record(w->e2, w->s2));
  OK(cusafe_buffer_fill(w->d1, 0, 16, 11, w->s11));
}

static cusafe_status op_shutdown(struct world *w) {
  (void)w;
  return cusafe_shutdown();
}

enum op_flags {
  OP_CREATES = 1,  /* stores a new handle in w->out */
  OP_CONSUMES = 2, /* releases w->gone: cannot run again on the same setup */
  OP_SHUTDOWN = 4, /* the library is shut down afterwards */
  /* Its calls act on devices 0 and 1 in turn, one cudaDeviceSynchronize
   * each (the shutdown, context by context); others act on device 0, as
   * far as their synchronisations go. */
  OP_ALTERNATE = 8,
  /* It ends a capture, which, like a teardown, tries once more to make
   * the device current. */
  OP_ENDS = 16
};

struct op {
  const char *name;
  void (*setup)(struct world *w); /* NULL: nothing, not even CUDA's init */
  cusafe_status (*run)(struct world *w);
  unsigned flags;
};

static const struct op ops[] = {
    {"cusafe_device_count (initialisation)", NULL, op_device_count, 0},
    {"cusafe_context_create (initialisation)", NULL, op_context_create0,
     OP_CREATES},
    {"cusafe_context_create (a second device)", su_ctx, op_context_create1,
     OP_CREATES},
    {"cusafe_device_get_properties", su_init, op_properties, 0},
    {"cusafe_context_synchronize", su_context_synchronize,
     op_context_synchronize, 0},
    {"cusafe_context_release (last reference)", su_context_release,
     op_context_release, OP_CONSUMES},
    {"cusafe_stream_create", su_ctx, op_stream_create, OP_CREATES},
    {"cusafe_stream_synchronize", su_stream_synchronize, op_stream_synchronize,
     0},
    {"cusafe_stream_query", su_handoff, op_stream_query, 0},
    {"cusafe_stream_wait_event", su_stream_wait_event, op_stream_wait_event, 0},
    {"cusafe_stream_release (last reference, work queued)", su_stream_release,
     op_stream_release, OP_CONSUMES},
    {"cusafe_stream_wrap", su_ctx_s1, op_stream_wrap, OP_CREATES},
    {"cusafe_stream_release (a wrapped stream)", su_wrap_release,
     op_wrap_release, OP_CONSUMES},
    {"cusafe_stream_use_buffers (work on another stream)", su_handoff_s2,
     op_use_buffers, 0},
    {"cusafe_event_create", su_ctx, op_event_create, OP_CREATES},
    {"cusafe_event_record", su_event, op_event_record, 0},
    {"cusafe_event_synchronize", su_event_synchronize, op_event_synchronize, 0},
    {"cusafe_event_query", su_event_recorded, op_event_query, 0},
    {"cusafe_event_elapsed_ms", su_event_elapsed, op_event_elapsed, 0},
    {"cusafe_event_release (last reference)", su_event_recorded,
     op_event_release, OP_CONSUMES},
    {"cusafe_buffer_alloc (device)", su_ctx, op_alloc_device, OP_CREATES},
    {"cusafe_buffer_alloc (pinned)", su_ctx, op_alloc_pinned, OP_CREATES},
    {"cusafe_buffer_alloc (managed)", su_ctx, op_alloc_managed, OP_CREATES},
    {"cusafe_buffer_alloc_async", su_ctx_s1, op_alloc_async, OP_CREATES},
    {"cusafe_buffer_view", su_buffer, op_view, OP_CREATES},
    {"cusafe_buffer_wrap", su_buffer, op_wrap, OP_CREATES},
    {"cusafe_buffer_release (wrapped memory, work queued)", su_release_wrapped,
     op_release_wrapped, OP_CONSUMES},
    {"cusafe_buffer_alloc_shareable", su_ctx, op_alloc_shareable, OP_CREATES},
    {"cusafe_buffer_export (work queued)", su_shareable, op_export, 0},
    {"cusafe_buffer_import", su_shared_desc, op_import, OP_CREATES},
    {"cusafe_ipc_device", su_shared_desc, op_ipc_device, 0},
    {"cusafe_buffer_release (shareable memory, work queued)", su_shareable,
     op_release_shareable, OP_CONSUMES},
#ifdef CUSAFE_HAVE_DLPACK
    {"cusafe_buffer_from_dlpack", su_buffer, op_from_dlpack, OP_CREATES},
    {"cusafe_buffer_release (DLPack import, work queued)", su_release_import,
     op_release_import, OP_CONSUMES},
    {"cusafe_buffer_to_dlpack", su_buffer, op_to_dlpack, 0},
#endif
    {"cusafe_buffer_write", su_handoff, op_write, 0},
    {"cusafe_buffer_read", su_handoff, op_read, 0},
    {"cusafe_buffer_write_async", su_handoff_s2, op_write_async, 0},
    {"cusafe_buffer_read_async", su_handoff_s2, op_read_async, 0},
    {"cusafe_buffer_copy (same device)", su_copy, op_copy, 0},
    {"cusafe_buffer_copy (device 0 to device 1)", su_copy_peer, op_copy_peer,
     0},
    {"cusafe_buffer_copy (pinned memory of device 0 to device 1)",
     su_copy_pinned_other, op_copy_pinned_other, 0},
    {"cusafe_buffer_fill", su_handoff_s2, op_fill, 0},
    {"cusafe_buffer_release (device memory, work queued)", su_release_device,
     op_release_a, OP_CONSUMES},
    {"cusafe_buffer_release (pinned memory, work queued)", su_release_pinned,
     op_release_tmp, OP_CONSUMES},
    {"cusafe_buffer_release (managed memory, work queued)", su_release_managed,
     op_release_tmp, OP_CONSUMES},
    {"cusafe_buffer_release (last used by a peer copy)", su_release_after_peer,
     op_release_d1, OP_CONSUMES},
    {"cusafe_module_load_builtin", su_ctx, op_load_builtin, OP_CREATES},
    {"cusafe_module_load_data", su_ctx, op_load_data, OP_CREATES},
    {"cusafe_module_load_file", su_module_file, op_load_file, OP_CREATES},
    {"cusafe_module_compile", su_ctx, op_compile, OP_CREATES},
    {"cusafe_module_get_kernel", su_fake_module, op_get_kernel, OP_CREATES},
    {"cusafe_kernel_launch (built-in kernel, three buffers)", su_launch,
     op_launch, 0},
    {"cusafe_kernel_launch_ex (cooperative clusters of 16, priority)",
     su_launch, op_launch_cluster, 0},
    {"cusafe_kernel_launch_ex (cooperative, then programmatic serialization)",
     su_launch, op_launch_cooperative, 0},
    {"cusafe_stream_begin_capture, launches with attributes, "
     "cusafe_stream_end_capture",
     su_launch, op_capture_launch_ex, OP_CREATES | OP_ENDS},
    {"cusafe_kernel_suggest_config", su_suggest, op_suggest, 0},
    {"cusafe_stream_begin_capture, a launch, cusafe_stream_end_capture",
     su_launch, op_capture_launch, OP_CREATES | OP_ENDS},
    {"a capture that another stream joins (event records and waits)",
     su_capture_join, op_capture_join, OP_CREATES | OP_ENDS},
    {"cusafe_graph_launch (the first: instantiation)", su_graph,
     op_graph_launch, 0},
    {"cusafe_graph_release (last reference, replays queued)", su_graph_replays,
     op_graph_release, OP_CONSUMES},
    {"cusafe_module_release (last reference)", su_fake_module,
     op_module_release, OP_CONSUMES},
    {"cusafe_kernel_release (last reference of its module, launch queued)",
     su_kernel_release, op_kernel_release, OP_CONSUMES},
    {"cusafe_shutdown (objects of every type, work queued)", su_shutdown,
     op_shutdown, OP_SHUTDOWN | OP_ALTERNATE},
};
#define NOPS ((int)(sizeof ops / sizeof ops[0]))

/* Sets up a new world and runs the operation without failures. */
static void run_clean(const struct op *op, struct world *w, const char *when) {
  memset(w, 0, sizeof *w);
  fake_set_paused(0);
  if (op->setup)
    op->setup(w);
  cusafe_status st = op->run(w);
  TU_ASSERT(st == CUSAFE_SUCCESS, "%s: %s %s returned %s: %s", op->name, when,
            "without failures", cusafe_status_string(st),
            cusafe_last_error_message());
  if (op->flags & OP_CREATES)
    TU_ASSERT(w->out != CUSAFE_NULL_HANDLE && w->out != SENTINEL,
              "%s: no handle made", op->name);
}

/* ------------------------------------------------------------------------ */
/* Children                                                                   */
/* ------------------------------------------------------------------------ */

/* The clean run: the names of the operation's calls, written to a pipe. */
struct clean_args {
  const struct op *op;
  int fd;
};

static void clean_child(void *arg) {
  const struct clean_args *a = arg;
  struct world w;
  memset(&w, 0, sizeof w);
  if (a->op->setup)
    a->op->setup(&w);
  unsigned long start = fake_call_count();
  cusafe_status st = a->op->run(&w);
  unsigned long end = fake_call_count();
  TU_ASSERT(st == CUSAFE_SUCCESS, "%s without failures returned %s: %s",
            a->op->name, cusafe_status_string(st), cusafe_last_error_message());
  FILE *f = fdopen(a->fd, "w");
  TU_ASSERT(f != NULL, "fdopen failed");
  for (unsigned long k = start + 1; k <= end; k++)
    fprintf(f, "%s\n", tu_call_name(k));
  fclose(f);
  world_release(&w, (a->op->flags & OP_SHUTDOWN) ? RELEASE_SHUT_DOWN
                                                 : RELEASE_STRICT);
  TU_NOTHING_LIVE_AT("after a clean run");
  TU_OK(cusafe_shutdown());
}

/* The calls of one clean run of op. */
struct clean_log {
  size_t ncalls;
  char names[MAX_CALLS][NAME_MAX_LEN];
};

static void record_clean(const struct op *op, struct clean_log *log) {
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ne(pid, -1);
  if (pid == 0) {
    struct clean_args a = {op, fds[1]};
    close(fds[0]);
    tu_in_child = 1;
    clean_child(&a);
    exit(0);
  }
  close(fds[1]);
  FILE *f = fdopen(fds[0], "r");
  ck_assert_ptr_nonnull(f);
  log->ncalls = 0;
  char line[256];
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    ck_assert_msg(log->ncalls < MAX_CALLS, "%s: more than %d calls", op->name,
                  MAX_CALLS);
    snprintf(log->names[log->ncalls++], NAME_MAX_LEN, "%.*s", NAME_MAX_LEN - 1,
             line);
  }
  fclose(f);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "%s: the clean run failed (its message is above)", op->name);
}

struct fault_args {
  const struct op *op;
  unsigned long n;
  int persistent;
  const struct expectation *inj; /* what call n fails with */
  const char *name;              /* call n in the clean run; NULL past it */
  const struct clean_log *log;   /* the clean run */
  /* A sticky error: the device it breaks, and whether it is put in place
   * before the operation (no earlier call of the operation would notice
   * it, so call n is the first to fail, as after a fault just before it)
   * or after call n failed by number (an earlier call would notice it). */
  int sticky_device, sticky_before;
};

/* Where a sticky error injected at call n of the clean run lands: see
 * struct fault_args. */
static void place_sticky(const struct op *op, const struct clean_log *log,
                         unsigned long n, int *device, int *before) {
  const int alternate = (op->flags & OP_ALTERNATE) != 0;
  int syncs = 0;
  for (unsigned long k = 1; k < n; k++)
    syncs += strcmp(log->names[k - 1], "cudaDeviceSynchronize") == 0;
  *device = alternate ? syncs % 2 : 0;
  *before = 1;
  for (unsigned long k = 1, j = 0; k < n; k++) {
    const char *name = log->names[k - 1];
    int other_device = 0;
    if (strcmp(name, "cudaDeviceSynchronize") == 0)
      other_device = alternate && (int)(j++ % 2) != *device;
    if (!is_sticky_immune(name) && !other_device)
      *before = 0;
  }
}

/* After the failure, with CUDA healthy again: the operation works on new
 * objects, also while the old ones are still alive. */
static void check_usable(const struct op *op, const char *when) {
  struct world w2;
  run_clean(op, &w2, when);
  world_release(&w2, RELEASE_STRICT);
}

static void fault_child(void *arg) {
  const struct fault_args *a = arg;
  const struct op *op = a->op;
  const cudaError_t err = a->inj->err;
  struct world w;
  memset(&w, 0, sizeof w);
  if (op->setup)
    op->setup(&w);
  unsigned long start = fake_call_count();
  const int sticky = a->inj->sticky;
  if (sticky && a->sticky_before) {
    fake_set_sticky_error(a->sticky_device, err);
    if (a->persistent)
      fake_fail_after(a->n + 1, err, 1);
  } else {
    fake_fail_after(a->n, err, a->persistent);
  }
  cusafe_status st = op->run(&w);
  unsigned long end = fake_call_count();
  char msg[1024], want[1024];
  tu_copy_message(msg, sizeof msg);
  int cuda_err = cusafe_last_cuda_error();
  if (w.failure[0]) {
    snprintf(msg, sizeof msg, "%s", w.failure);
    cuda_err = w.failure_cuda;
  }
  fake_fail_clear();
  const unsigned long first = start + a->n;
  const unsigned long last = a->persistent ? end : first;
  const int reached = end >= first;

  if (!reached) {
    TU_ASSERT(a->name == NULL,
              "failing call %lu (%s): the operation made only %lu calls", a->n,
              a->name, end - start);
    TU_ASSERT(st == CUSAFE_SUCCESS, "the operation returned %s: %s",
              cusafe_status_string(st), msg);
    world_release(&w, (op->flags & OP_SHUTDOWN) ? RELEASE_SHUT_DOWN
                                                : RELEASE_STRICT);
    TU_NOTHING_LIVE_AT("after the operation");
    TU_OK(cusafe_shutdown());
    exit(TU_FAULT_COMPLETED);
  }
  const char *failed = tu_call_name(first);
  TU_ASSERT(a->name != NULL && strcmp(failed, a->name) == 0,
            "call %lu of the operation is %s, in the clean run %s", a->n,
            failed, a->name ? a->name : "(none)");
  /* A free that failed and is not retried excuses a leak; failing
   * persistently, so does one the clean run made from call n on, which
   * would have failed too, also after its retry. */
  int excused = failure_hit_cleanup(first, last);
  for (size_t k = a->n; a->persistent && k <= a->log->ncalls; k++)
    excused |= is_cleanup_call(a->log->names[k - 1], 1);

  if (op->flags & OP_SHUTDOWN) {
    /* Whatever fails, the shutdown completes and says so. */
    TU_ASSERT(st == CUSAFE_SUCCESS, "%s failing: shutdown returned %s: %s",
              failed, cusafe_status_string(st), msg);
  } else if (st != CUSAFE_SUCCESS) {
    int named = 0;
    for (unsigned long k = first; k <= last && !named; k++)
      named = is_failure_of(tu_call_name(k), err, st, msg, cuda_err, want,
                            sizeof want);
    if (!named)
      is_failure_of(failed, err, st, msg, cuda_err, want, sizeof want);
    TU_ASSERT(named,
              "%s failing: returned %s (%d), message \"%s\", CUDA error %d; "
              "expected %s, \"%s\"%s",
              failed, cusafe_status_string(st), (int)st, msg, cuda_err,
              cusafe_status_string(expectation_of(failed, err)->status), want,
              a->persistent ? " (or the same of a later failed call)" : "");
    if (op->flags & OP_CREATES)
      TU_ASSERT(w.out == CUSAFE_NULL_HANDLE,
                "%s failing: the failed operation handed out 0x%016llx", failed,
                TU_HX(w.out));
  } else if (op->flags & OP_CREATES) {
    cusafe_handle_type type = CUSAFE_TYPE_INVALID;
    TU_ASSERT(cusafe_handle_get_type(&type, w.out) == CUSAFE_SUCCESS,
              "%s failing: the operation succeeded, but its handle 0x%016llx "
              "is not live: %s",
              failed, TU_HX(w.out), cusafe_last_error_message());
  }
  if (op->flags & OP_CONSUMES)
    TU_STALE(w.gone); /* released, whatever CUDA said */

  if (sticky) /* the fault broke the device for good */
    fake_set_sticky_error(a->sticky_device, err);

  if (op->flags & OP_SHUTDOWN) {
    /* Every call is refused, every release is a no-op. */
    int n = 5;
    unsigned long calls = fake_call_count();
    TU_ERR(cusafe_device_count(&n), CUSAFE_ERROR_SHUTDOWN,
           "cusafe has been shut down");
    world_release(&w, RELEASE_SHUT_DOWN);
    TU_ASSERT(fake_call_count() == calls, "calls after the shutdown");
    if (!excused)
      TU_NOTHING_LIVE_AT("after the shutdown");
    exit(excused                ? TU_FAULT_EXCUSED
         : st == CUSAFE_SUCCESS ? TU_FAULT_ABSORBED
                                : TU_FAULT_FAILED);
  }

  if (!sticky) {
    /* The same operation works on the same objects ... */
    if (!(op->flags & OP_CONSUMES)) {
      cusafe_handle made = w.out;
      if (st == CUSAFE_SUCCESS && (op->flags & OP_CREATES))
        TU_OK(cusafe_release(made));
      cusafe_status again = op->run(&w);
      TU_ASSERT(again == CUSAFE_SUCCESS,
                "%s failing: running the operation again returned %s: %s",
                failed, cusafe_status_string(again),
                cusafe_last_error_message());
    }
    /* ... and on new ones (unless an object whose free failed is still
     * alive: releasing its primary context would abort). */
    if (!excused)
      check_usable(op, "after the failure");
  }

  if (excused) {
    /* The object whose free failed is alive: the fake would abort at the
     * release of its primary context.  Release the rest and leave. */
    world_release(&w, RELEASE_CHILDREN);
    fake_set_strict_teardown(0);
    fake_teardown_now();
    exit(TU_FAULT_EXCUSED);
  }
  world_release(&w, sticky ? RELEASE_BROKEN : RELEASE_STRICT);
  TU_NOTHING_LIVE_AT("after releasing everything");
  if (sticky) {
    /* The broken primary context went with its last reference; a new one
     * works. */
    fake_set_sticky_error(a->sticky_device, cudaSuccess);
    check_usable(op, "after the device was broken and everything released");
    TU_NOTHING_LIVE_AT("after releasing everything again");
  }
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE_AT("after the shutdown");
  exit(st == CUSAFE_SUCCESS ? TU_FAULT_ABSORBED : TU_FAULT_FAILED);
}

/* ------------------------------------------------------------------------ */
/* The loop                                                                   */
/* ------------------------------------------------------------------------ */

/* Totals over all tests, shared with the processes Check forks. */
struct totals {
  unsigned long pairs[2]; /* (operation, call), single / persistent */
  unsigned long runs[2];  /* one per injected error */
  unsigned long excused[2], absorbed[2], bad[2];
  int ops_done;
};
static struct totals *totals;

/* Appends a printf-formatted line to a fixed buffer, cut if full. */
static void append(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t size, const char *fmt, ...) {
  size_t len = strlen(buf);
  if (len + 1 >= size)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + len, size - len, fmt, ap);
  va_end(ap);
}

/* The first line of a child's stderr that is not Valgrind's. */
static void first_line(const char *text, char *out, size_t n) {
  while (strncmp(text, "==", 2) == 0 && strchr(text, '\n'))
    text = strchr(text, '\n') + 1;
  size_t len = strcspn(text, "\n");
  snprintf(out, n, "%.*s", (int)(len < n ? len : n - 1), text);
}

static void fault_loop(const struct op *op, int persistent) {
  static struct clean_log log;
  static char problems[16384];
  const char *mode = persistent ? "persistent" : "single";
  unsigned long failed = 0, absorbed = 0, excused = 0, runs = 0, bad = 0;
  unsigned long not_modelled = 0;
  char absorbed_names[512] = "";
  record_clean(op, &log);
  problems[0] = '\0';
  for (unsigned long n = 1; n <= log.ncalls + 1; n++) {
    const char *name = n <= log.ncalls ? log.names[n - 1] : NULL;
    const struct expectation *inj[4];
    size_t ninj = name ? injections_of(name, inj, 4) : 1;
    if (!name)
      inj[0] = expectation_of("", cudaErrorUnknown);
    for (size_t i = 0; i < ninj; i++) {
      struct fault_args a = {op, n, persistent, inj[i], name, &log, 0, 0};
      if (name && inj[i]->sticky)
        place_sticky(op, &log, n, &a.sticky_device, &a.sticky_before);
      char err[16384], line[600], what[800] = "";
      int status = tu_run_in_child(fault_child, &a, err, sizeof err);
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      int aborted = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
      first_line(err, line, sizeof line);
      if (name)
        runs++;
      if (aborted && name && !persistent && is_cleanup_call(name, 0) &&
          strstr(err, "VIOLATION: primary context of device")) {
        /* A free that failed leaves its object alive; where the operation
         * itself then releases the primary context, the fake aborts. */
        code = TU_FAULT_EXCUSED;
      } else if (aborted && name && inj[i]->sticky && !a.sticky_before &&
                 strstr(err, "fakecuda: VIOLATION: ")) {
        /* A sync that fails by number leaves its work queued in the fake,
         * where a real fault would have discarded it (and a healthy
         * device would have run it): what the operation then frees
         * around that work is the fake's doing, not cusafe's. */
        not_modelled++;
        printf("  not modelled: call %lu (%s) failing: %s\n", n, name, line);
        continue;
      } else if (WIFSIGNALED(status)) {
        snprintf(what, sizeof what, "killed by signal %d: %s", WTERMSIG(status),
                 line);
      }
      if (!what[0] && !name && code != TU_FAULT_COMPLETED)
        snprintf(what, sizeof what,
                 "past the %zu calls of the clean run: "
                 "exit %d: %s",
                 log.ncalls, code, line);
      if (!what[0] && name) {
        switch (code) {
        case TU_FAULT_FAILED: failed++; break;
        case TU_FAULT_EXCUSED: excused++; break;
        case TU_FAULT_ABSORBED:
          absorbed++;
          if (!strstr(absorbed_names, name))
            append(absorbed_names, sizeof absorbed_names, "%s%s",
                   absorbed_names[0] ? ", " : "", name);
          if (!(op->flags & OP_SHUTDOWN) &&
              !is_absorbable_in(name,
                                (op->flags & (OP_CONSUMES | OP_ENDS)) != 0) &&
              !is_cleanup_call(name, 1))
            snprintf(what, sizeof what,
                     "the operation succeeded all the "
                     "same");
          break;
        case TU_FAULT_COMPLETED:
          snprintf(what, sizeof what, "never reached");
          break;
        default: snprintf(what, sizeof what, "exit %d: %s", code, line);
        }
      }
      if (what[0]) {
        bad++;
        append(problems, sizeof problems,
               "  call %lu (%s) failing with %d: "
               "%s\n",
               n, name ? name : "-", (int)inj[i]->err, what);
        fprintf(stderr, "[%s (%s), call %lu (%s) failing with %d]\n%s",
                op->name, mode, n, name ? name : "-", (int)inj[i]->err, err);
      }
    }
  }
  printf("%s (%s): %zu calls, %lu runs: %lu failed as they should, %lu "
         "absorbed%s%s%s, %lu failed in a free, %lu not modelled, %lu "
         "wrong\n",
         op->name, mode, log.ncalls, runs, failed, absorbed,
         absorbed ? " (" : "", absorbed_names, absorbed ? ")" : "", excused,
         not_modelled, bad);
  if (totals) {
    totals->pairs[persistent] += log.ncalls;
    totals->runs[persistent] += runs;
    totals->excused[persistent] += excused;
    totals->absorbed[persistent] += absorbed;
    totals->bad[persistent] += bad;
    if (persistent)
      totals->ops_done++;
  }
  if (bad)
    fprintf(stderr, "%s (%s): %lu wrong run(s):\n%s", op->name, mode, bad,
            problems);
  ck_assert_msg(bad == 0,
                "%s (%s): %lu of %lu runs went wrong (listed on "
                "stderr)",
                op->name, mode, bad, runs);
}

/* _i: the operation, twice: failing one call, then persistently. */
START_TEST(test_faults_single) { fault_loop(&ops[_i], 0); }
END_TEST

START_TEST(test_faults_persistent) { fault_loop(&ops[_i], 1); }
END_TEST

/* The setups and operations themselves work, and leave nothing behind. */
static void clean_all(void *arg) {
  (void)arg;
  for (int i = 0; i < NOPS; i++) {
    struct world w;
    if (ops[i].flags & OP_SHUTDOWN)
      continue;
    run_clean(&ops[i], &w, "run");
    world_release(&w, RELEASE_STRICT);
    TU_NOTHING_LIVE_AT(ops[i].name);
  }
  TU_OK(cusafe_shutdown());
}

START_TEST(test_operations_succeed) {
  char err[16384];
  int status = tu_run_in_child(clean_all, NULL, err, sizeof err);
  fputs(err, stderr);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "a clean run failed; its message is above");
}
END_TEST

static Suite *faults_suite(void) {
  Suite *s = suite_create("faults");
  TCase *tc = tcase_create("operations");
  tcase_add_test(tc, test_operations_succeed);
  suite_add_tcase(s, tc);

  tc = tcase_create("single");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, test_faults_single, 0, NOPS);
  suite_add_tcase(s, tc);

  tc = tcase_create("persistent");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, test_faults_persistent, 0, NOPS);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  totals = mmap(NULL, sizeof *totals, PROT_READ | PROT_WRITE,
                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (totals == MAP_FAILED)
    totals = NULL;
  else
    memset(totals, 0, sizeof *totals);
  tu_pattern(host_in, sizeof host_in, 77);
  /* Every test forks its own children, each with a fresh library and a
   * fresh fake; the test process itself never calls cusafe. */
  int status = tu_run_suite(faults_suite(), CK_FORK);
  if (totals)
    printf("fault injection: %lu (operation, call) pairs over %d operations "
           "(%lu single, %lu persistent), %lu runs with each injected "
           "error; %lu absorbed, %lu failed in a free, %lu wrong\n",
           totals->pairs[0] + totals->pairs[1], totals->ops_done,
           totals->pairs[0], totals->pairs[1],
           totals->runs[0] + totals->runs[1],
           totals->absorbed[0] + totals->absorbed[1],
           totals->excused[0] + totals->excused[1],
           totals->bad[0] + totals->bad[1]);
  return status;
}
