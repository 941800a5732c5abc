/* error.h -- what every file of the library includes first: the public
 * header, the CUDA table, and the recording of errors (error.c;
 * invariant 7: clear errors).  Internal; never installed. */
#ifndef CUSAFE_ERROR_H
#define CUSAFE_ERROR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_api.h"
#include "cusafe.h"

/* The functions of a launch: kept together (.text.hot), so that a launch
 * right after the driver's own work fetches few lines and pages of code. */
#define CS_HOT __attribute__((hot))
#define CS_LIKELY(x) __builtin_expect(!!(x), 1)
#define CS_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Records `status` with a printf-style message for the calling thread and
 * returns status; the CUDA error of the thread is set to 0.  Errors are the
 * exception: cold, so that the compiler lays the paths to them out of the
 * way of the common ones. */
cusafe_status cs_fail(cusafe_status status, const char *fmt, ...)
    __attribute__((cold, format(printf, 2, 3)));
/* cs_fail(CUSAFE_ERROR_INVALID_VALUE, "<name> is NULL"): a required
 * pointer parameter is NULL. */
cusafe_status cs_null(const char *name) __attribute__((cold));
/* Records a failed CUDA call: "<function> failed: <CUDA's words>", maps err
 * to a status and returns it. */
cusafe_status cs_fail_cuda(cudaError_t err, const char *function)
    __attribute__((cold));
/* cs_fail() for a CUDA error that cusafe words itself (a status of its
 * own, such as CUSAFE_ERROR_NOT_READY): the thread's CUDA error is err. */
cusafe_status cs_fail_as(cusafe_status status, cudaError_t err, const char *fmt,
                         ...) __attribute__((cold, format(printf, 3, 4)));
/* The thread's message and CUDA error, kept across work done on the side
 * (the drain of parked follows), whose failures are not the caller's. */
struct cs_saved_error {
  char message[1024];
  int cuda_error;
};
void cs_error_save(struct cs_saved_error *e);
void cs_error_restore(const struct cs_saved_error *e);
/* The status of a synchronisation's or query's answer: success,
 * CUSAFE_ERROR_NOT_READY ("work is still pending") for cudaErrorNotReady,
 * else the failure of `function`. */
cusafe_status cs_status_pending(cudaError_t err, const char *function);
/* The status a CUDA error maps to. */
cusafe_status cs_status_of(cudaError_t err);

/* Not a status that a caller ever sees: an operation met a stream whose
 * capture another thread is beginning or ending (graph.c), and is undone,
 * to be tried again once its thread's gate or pin is open.  No message is
 * recorded for it. */
#define CS_RETRY ((cusafe_status)0x7fff)
/* Not a status that a caller ever sees either: a stream is to join a
 * capture, once the operations that saw it outside have queued their work
 * (event.c). */
#define CS_JOIN ((cusafe_status)0x7ffe)
/* Nor this: a fast path does not apply, and has done nothing (graph.c). */
#define CS_SLOW ((cusafe_status)0x7ffd)
/* Nor this: what must follow a stream that cannot be touched now
 * (cs_queue_untouchable) is to wait, parked (buffer.c). */
#define CS_PARK ((cusafe_status)0x7ffc)

/* The first failure of several steps that all run (teardowns). */
static inline cusafe_status cs_first(cusafe_status a, cusafe_status b) {
  return a != CUSAFE_SUCCESS ? a : b;
}

#endif /* CUSAFE_ERROR_H */
