/* faultutil.h -- fault injection into a composite operation, against the
 * fake CUDA.
 *
 * SQLite's malloc test: fail CUDA call N, for N = 1, 2, ... until the
 * operation completes without reaching the failure, each N in a fresh
 * process; once failing that one call and once failing every call from N
 * on (persistent).  Every failure must return the status and message of a
 * failed call, hand out no handle and leak nothing, and the library must
 * work again from scratch once CUDA does. */
#ifndef CUSAFE_FAULTUTIL_H
#define CUSAFE_FAULTUTIL_H

#include "fakeutil.h"

/* A step of a composite operation, counted in *step: returns the status
 * of expr from the enclosing function unless it succeeded. */
#define TU_STEP(step, expr)                                                    \
  do {                                                                         \
    ++*(step);                                                                 \
    cusafe_status tu_step_st_ = (expr);                                        \
    if (tu_step_st_ != CUSAFE_SUCCESS)                                         \
      return tu_step_st_;                                                      \
  } while (0)

/* A step that creates `out`: a failure must leave it NULL. */
#define TU_STEP_NEW(step, out, expr)                                           \
  do {                                                                         \
    ++*(step);                                                                 \
    (out) = (cusafe_handle)0x1234;                                             \
    cusafe_status tu_step_st_ = (expr);                                        \
    if (tu_step_st_ != CUSAFE_SUCCESS) {                                       \
      TU_ASSERT((out) == CUSAFE_NULL_HANDLE,                                   \
                "step %d (%s) failed but left handle 0x%016llx", *(step),      \
                #expr, TU_HX(out));                                            \
      return tu_step_st_;                                                      \
    }                                                                          \
  } while (0)

/* An operation of several steps on the handles of a `size`-byte state.
 * run() starts from a zeroed state and stops at the first step that
 * fails, returning its status; release() releases every handle of the
 * state, made or NULL. */
struct tu_composite {
  size_t size;
  cusafe_status (*run)(void *state, int *step);
  void (*release)(void *state);
};

/* Without failures the operation succeeds and leaves nothing behind. */
static inline void tu_composite_succeeds(const struct tu_composite *op) {
  void *state = tu_xmalloc(op->size);
  int step = 0;
  memset(state, 0, op->size);
  TU_OK(op->run(state, &step));
  op->release(state);
  free(state);
  TU_NOTHING_LIVE();
}

static inline int tu_is_init_call(const char *name) {
  static const char *const init[] = {
      "cudaGetDeviceCount", "cudaDriverGetVersion", "cudaRuntimeGetVersion",
      "cudaGetDriverEntryPointByVersion"};
  for (size_t i = 0; i < sizeof init / sizeof init[0]; i++)
    if (strcmp(name, init[i]) == 0)
      return 1;
  return 0;
}

static inline int tu_is_cleanup_call(const char *name) {
  static const char *const cleanup[] = {
      "cudaFreeAsync",     "cudaFreeHost",       "cudaFree",
      "cudaStreamDestroy", "cudaEventDestroy",   "cuDevicePrimaryCtxRelease",
      "cudaLibraryUnload", "nvrtcDestroyProgram"};
  for (size_t i = 0; i < sizeof cleanup / sizeof cleanup[0]; i++)
    if (strcmp(name, cleanup[i]) == 0)
      return 1;
  return 0;
}

/* Whether an injected failure hit a call that frees something, among the
 * calls numbered first..last: what it held cannot be freed any more, so it
 * is not counted as a leak. */
static inline int tu_failure_hit_cleanup(unsigned long first,
                                         unsigned long last) {
  for (unsigned long k = first; k <= last; k++)
    if (tu_is_cleanup_call(tu_call_name(k)))
      return 1;
  return 0;
}

/* Whether `msg` is the message of a failure of call number k for some k in
 * first..last (just `first` unless persistent). */
static inline int tu_names_failed_call(const char *msg, unsigned long first,
                                       unsigned long last) {
  char want[160];
  for (unsigned long k = first; k <= last; k++) {
    const char *name = tu_call_name(k);
    if (strncmp(name, "nvrtc", 5) == 0)
      snprintf(want, sizeof want, "%s failed: NVRTC_ERROR_INTERNAL_ERROR",
               name);
    else
      snprintf(want, sizeof want, "%s failed: unknown error", name);
    if (strcmp(msg, want) == 0)
      return 1;
  }
  return 0;
}

struct tu_fault_args {
  const struct tu_composite *op;
  unsigned long n;
  int persistent;
};

/* Runs the operation with call n failing; exits with its enum
 * tu_fault_result. */
static inline void tu_fault_child(void *arg) {
  const struct tu_fault_args *a = arg;
  const struct tu_composite *op = a->op;
  void *state = tu_xmalloc(op->size);
  int step = 0;
  memset(state, 0, op->size);
  unsigned long start = fake_call_count();
  fake_fail_after(a->n, cudaErrorUnknown, a->persistent);
  cusafe_status st = op->run(state, &step);
  unsigned long end = fake_call_count();
  const unsigned long first = start + a->n;
  const unsigned long last = a->persistent ? end : first;
  int reached = end >= first;
  char msg[1024];
  tu_copy_message(msg, sizeof msg);
  int cuda_err = cusafe_last_cuda_error();
  fake_fail_clear();
  const char *failed_call = tu_call_name(first);
  if (st != CUSAFE_SUCCESS) {
    TU_ASSERT(reached, "step %d failed with %d (\"%s\") before call %lu", step,
              (int)st, msg, first);
    if (st == CUSAFE_ERROR_NO_DRIVER) {
      /* Initialisation that fails leaves no usable driver. */
      TU_ASSERT(cuda_err == cudaErrorUnknown,
                "step %d, %s failing: last CUDA error %d, expected %d", step,
                failed_call, cuda_err, (int)cudaErrorUnknown);
      TU_ASSERT(tu_is_init_call(failed_call),
                "step %d: %s failing gave NO_DRIVER (\"%s\")", step,
                failed_call, msg);
      TU_ASSERT(strcmp(msg, "no CUDA driver found: unknown error") == 0,
                "step %d, %s failing: message \"%s\"", step, failed_call, msg);
    } else {
      /* cudaErrorUnknown is no device or memory problem; in NVRTC, an
       * internal error of the compiler.  Failing persistently, an absorbed
       * failure (restoring the current device, say) can precede the one
       * reported: any failed call will do, but it must be named. */
      int nvrtc = strncmp(msg, "nvrtc", 5) == 0;
      cusafe_status want = nvrtc ? CUSAFE_ERROR_COMPILE : CUSAFE_ERROR_CUDA;
      TU_ASSERT(st == want,
                "step %d, %s failing: status %s (%d), expected %s; \"%s\"",
                step, failed_call, cusafe_status_string(st), (int)st,
                cusafe_status_string(want), msg);
      TU_ASSERT(nvrtc || cuda_err == cudaErrorUnknown,
                "step %d, %s failing: last CUDA error %d, expected %d", step,
                failed_call, cuda_err, (int)cudaErrorUnknown);
      TU_ASSERT(tu_names_failed_call(msg, first, last),
                "step %d, %s failing: message \"%s\" names no failed call",
                step, failed_call, msg);
    }
  } else if (reached && !a->persistent) {
    printf("fault %lu: %s failed, and the operation still succeeded\n", a->n,
           failed_call);
  }
  int excused = reached && tu_failure_hit_cleanup(first, last);
  op->release(state);
  if (!excused)
    TU_NOTHING_LIVE();

  /* CUDA works again: so must the library, from scratch. */
  int reusable = 1;
  if (st != CUSAFE_SUCCESS) {
    int again_step = 0;
    memset(state, 0, op->size);
    cusafe_status st2 = op->run(state, &again_step);
    if (st2 != CUSAFE_SUCCESS) {
      fprintf(stderr,
              "fault %lu (%s): after the failure at step %d, a clean run "
              "failed at step %d: %s\n",
              a->n, a->persistent ? "persistent" : "single", step, again_step,
              cusafe_last_error_message());
      reusable = 0;
    }
    op->release(state);
    if (!excused)
      TU_NOTHING_LIVE();
  }
  TU_OK(cusafe_shutdown());
  if (!excused)
    TU_NOTHING_LIVE();
  free(state);
  if (st != CUSAFE_SUCCESS)
    exit(!reusable ? TU_FAULT_NOT_REUSABLE
         : excused ? TU_FAULT_EXCUSED
                   : TU_FAULT_FAILED);
  exit(reached ? TU_FAULT_ABSORBED : TU_FAULT_COMPLETED);
}

/* The loop: call N fails, for N = 1, 2, ... until the operation completes
 * without reaching the failure. */
static inline void tu_fault_loop(const struct tu_composite *op,
                                 int persistent) {
  const unsigned long max_n = 10000;
  unsigned long n, failed = 0, absorbed = 0, excused = 0, not_reusable = 0;
  char bad[1024] = "";
  size_t bad_len = 0;
  for (n = 1; n <= max_n; n++) {
    struct tu_fault_args a = {op, n, persistent};
    int status = tu_run_in_child(tu_fault_child, &a, NULL, 0);
    ck_assert_msg(!WIFSIGNALED(status),
                  "failing call %lu%s: child killed by signal %d (%s)", n,
                  persistent ? " and after" : "", WTERMSIG(status),
                  strsignal(WTERMSIG(status)));
    ck_assert_msg(WIFEXITED(status), "failing call %lu: child did not exit", n);
    int code = WEXITSTATUS(status);
    if (code == TU_FAULT_COMPLETED)
      break;
    switch (code) {
    case TU_FAULT_FAILED: failed++; break;
    case TU_FAULT_ABSORBED: absorbed++; break;
    case TU_FAULT_EXCUSED: excused++; break;
    case TU_FAULT_NOT_REUSABLE:
      not_reusable++;
      if (bad_len < sizeof bad - 16)
        bad_len +=
            (size_t)snprintf(bad + bad_len, sizeof bad - bad_len, " %lu", n);
      break;
    default:
      ck_abort_msg("failing call %lu%s: check failed in the child (exit %d, "
                   "its message is above)",
                   n, persistent ? " and after" : "", code);
    }
  }
  ck_assert_msg(n <= max_n, "the operation never completed");
  printf("fault injection (%s): %lu calls failed in turn: %lu failed cleanly, "
         "%lu absorbed, %lu failed in a free, %lu left the library unusable\n",
         persistent ? "persistent" : "single", n - 1, failed, absorbed, excused,
         not_reusable);
  ck_assert_msg(failed > 0, "no failure was ever reported");
  ck_assert_msg(not_reusable == 0,
                "the library stayed broken after a transient failure of "
                "call(s)%s",
                bad);
}

#endif /* CUSAFE_FAULTUTIL_H */
