/* myext.h -- a user's own CUDA library on cusafe: saxpy on cusafe buffers.
 *
 * The functions take cusafe handles, so that cusafe checks them and keeps
 * the memory alive while the kernel runs; they return cusafe's status. */
#ifndef MYEXT_H
#define MYEXT_H

#include <stddef.h>

#include <cusafe.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with -fvisibility=hidden: only these are exported. */
#if defined(__GNUC__)
#define MYEXT_API __attribute__((visibility("default")))
#else
#define MYEXT_API
#endif

/* Queues y[i] = a * x[i] + y[i], for i < n, on `stream`.
 * Parameters: stream [in] a cusafe stream, or CUSAFE_STREAM_DEFAULT: the
 *   default stream of y's context; y [in,out], x [in] buffers or views of
 *   at least n floats, of the stream's context; a [in]; n [in] the number
 *   of elements (0: nothing is queued).
 * Returns: CUSAFE_SUCCESS: the kernel is queued; cusafe orders later work
 *   on y (a read, a copy) after it.
 * Errors: cusafe's status, never a crash: CUSAFE_ERROR_INVALID_HANDLE for
 *   a NULL, forged, released or wrong-type handle; CUSAFE_ERROR_OUT_OF_RANGE
 *   where y or x holds fewer than n floats; CUSAFE_ERROR_INVALID_VALUE
 *   where y or x does not start on a float (a view at an offset that is
 *   not a multiple of 4 bytes); CUSAFE_ERROR_CONTEXT_MISMATCH
 *   for handles of different contexts; those of loading the kernel and of
 *   cusafe_kernel_launch().  myext_last_error_message() says what was wrong
 *   and which argument.
 * Ownership: nothing is taken from the caller: y and x may be released as
 *   soon as the call returns, the kernel keeps their memory alive.  The
 *   first call for a context loads the kernel into it and keeps it (see
 *   myext_unload()).
 * Threads: thread-safe.  In a child forked from a process that used it,
 *   cusafe's CUSAFE_ERROR_FORKED. */
MYEXT_API cusafe_status myext_saxpy(cusafe_stream stream, cusafe_buffer y,
                                    cusafe_buffer x, float a, size_t n);

/* The message of the calling thread's last failed myext call, such as
 * "myext_saxpy: y: buffer 0x... is a stream, not a buffer"; "" before
 * any.  Never NULL; the text is the library's, valid until the thread's
 * next myext call. */
MYEXT_API const char *myext_last_error_message(void);

/* Drops the kernels that myext_saxpy() loaded, one per context.  Each keeps
 * its context alive (a cusafe kernel holds its module, the module its
 * context), so call it before releasing the last context when the device's
 * context should go with it.  Not needed at exit: cusafe's exit handler
 * (or cusafe_shutdown()) destroys them with everything else, and releases
 * after that are no-ops.
 * Returns: CUSAFE_SUCCESS, or the first failure of a release (every kernel
 *   is dropped all the same).
 * Threads: thread-safe; a myext_saxpy() running meanwhile keeps its kernel
 *   until it returns. */
MYEXT_API cusafe_status myext_unload(void);

#ifdef __cplusplus
}
#endif

#endif /* MYEXT_H */
