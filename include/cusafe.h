/* cusafe.h -- a resource-safe interface to the CUDA runtime.
 *
 * cusafe hands out handles, never raw pointers.  A handle is a 64-bit integer
 * (a type tag, a generation and a slot index) that the library looks up in a
 * table on every call, so a NULL, forged, stale (already released, also after
 * its slot was reused) or wrong-type handle gets CUSAFE_ERROR_INVALID_HANDLE
 * and a message instead of a crash.
 *
 * Ownership follows OpenCL: a create/alloc function returns a handle holding
 * one reference; *_retain adds one, *_release drops one.  Every object holds
 * a reference on its parent (stream, event and buffer on their context, view
 * on its buffer), so a parent's CUDA object is destroyed only after all of
 * its children's.  A handle is the caller's: once the caller has released
 * all the references it was given, the handle is stale -- even while
 * children keep the object itself alive -- so that a double release is
 * caught as an error instead of stealing a child's reference.  Functions
 * such as cusafe_buffer_get_context() hand out a new reference when the
 * caller needs the parent again.  Work queued on a stream keeps the buffers it uses alive:
 * releasing the last reference of a buffer while a copy still uses it is
 * legal, and the memory is freed stream-ordered after that copy.
 *
 * Errors: every function returns a cusafe_status.  After a failure,
 * cusafe_last_error_message() gives a sentence that says what was wrong, and
 * cusafe_last_cuda_error() the underlying cudaError_t, both kept per thread.
 *
 * Threads: unless its comment says otherwise, every function is thread-safe,
 * and any handle may be used and released from any thread.
 *
 * Exit: the library destroys what is still alive, in dependency order, from
 * an atexit handler that runs before the CUDA runtime tears itself down, or
 * when cusafe_shutdown() is called.  After that every release is a no-op that
 * returns CUSAFE_SUCCESS and every other call returns CUSAFE_ERROR_SHUTDOWN.
 * In a child process forked after the parent used CUDA every call returns
 * CUSAFE_ERROR_FORKED and every release is a no-op.
 */
#ifndef CUSAFE_H
#define CUSAFE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(CUSAFE_BUILDING) && defined(__GNUC__)
#define CUSAFE_API __attribute__((visibility("default")))
#else
#define CUSAFE_API
#endif

#define CUSAFE_VERSION_MAJOR 0
#define CUSAFE_VERSION_MINOR 1
#define CUSAFE_VERSION_PATCH 0

/* ------------------------------------------------------------------------ */
/* Status codes and error reporting                                          */
/* ------------------------------------------------------------------------ */

typedef enum cusafe_status {
  CUSAFE_SUCCESS = 0,
  /* A NULL, forged, stale (released), double-released or wrong-type handle. */
  CUSAFE_ERROR_INVALID_HANDLE = 1,
  /* A bad argument: a NULL pointer where one is required, unknown flags or
   * memory kind, a priority outside the device's range. */
  CUSAFE_ERROR_INVALID_VALUE = 2,
  /* A size of zero where data is required (an allocation, a view). */
  CUSAFE_ERROR_INVALID_SIZE = 3,
  /* An offset or offset + size beyond the end of a buffer, also when the
   * sum overflows. */
  CUSAFE_ERROR_OUT_OF_RANGE = 4,
  /* A device ordinal that is negative or not below cusafe_device_count(). */
  CUSAFE_ERROR_INVALID_DEVICE = 5,
  /* Objects of different contexts (devices) mixed in one call. */
  CUSAFE_ERROR_CONTEXT_MISMATCH = 6,
  /* No CUDA driver is installed, or it is older than the runtime needs. */
  CUSAFE_ERROR_NO_DRIVER = 7,
  /* The driver works but reports no CUDA device. */
  CUSAFE_ERROR_NO_DEVICE = 8,
  /* Device or host memory is exhausted. */
  CUSAFE_ERROR_OUT_OF_MEMORY = 9,
  /* A query found work still pending; not a failure. */
  CUSAFE_ERROR_NOT_READY = 10,
  /* The device cannot do this (for instance managed memory). */
  CUSAFE_ERROR_NOT_SUPPORTED = 11,
  /* Any other CUDA failure; cusafe_last_cuda_error() gives the code.  A
   * sticky error (a kernel fault) breaks its context for good. */
  CUSAFE_ERROR_CUDA = 12,
  /* The library was shut down (cusafe_shutdown() or process exit). */
  CUSAFE_ERROR_SHUTDOWN = 13,
  /* Called in a child process forked after the parent initialised CUDA. */
  CUSAFE_ERROR_FORKED = 14
} cusafe_status;

/* Returns a static, English description of status; never NULL.  Unknown
 * values give "unknown status".  Thread-safe; works after shutdown. */
CUSAFE_API const char *cusafe_status_string(cusafe_status status);

/* Returns the detail message of the calling thread's last failed call, such
 * as "copy of 100 bytes at offset 0 exceeds buffer of 64 bytes"; "" if no
 * call on this thread has failed yet.  The text is owned by the library and
 * stays valid until the next cusafe call on the same thread.  Never NULL,
 * never allocates.  Thread-safe (per-thread state); works after shutdown. */
CUSAFE_API const char *cusafe_last_error_message(void);

/* Returns the cudaError_t (as an int) behind the calling thread's last
 * failed call, or 0 if that failure did not come from CUDA.  Thread-safe
 * (per-thread state); works after shutdown. */
CUSAFE_API int cusafe_last_cuda_error(void);

/* Returns the library's version as "MAJOR.MINOR.PATCH"; static, never NULL. */
CUSAFE_API const char *cusafe_version_string(void);

/* ------------------------------------------------------------------------ */
/* Handles                                                                    */
/* ------------------------------------------------------------------------ */

/* All handles are 64-bit integers; 0 is the NULL handle.  The typedefs below
 * document intent; the library checks each handle's type at run time. */
typedef uint64_t cusafe_handle;
typedef cusafe_handle cusafe_context;
typedef cusafe_handle cusafe_stream;
typedef cusafe_handle cusafe_event;
typedef cusafe_handle cusafe_buffer;

#define CUSAFE_NULL_HANDLE ((cusafe_handle)0)

/* Stream arguments accept CUSAFE_STREAM_DEFAULT to mean the default stream
 * of the context of the call's (first) buffer: a non-blocking stream that
 * cusafe creates with each context. */
#define CUSAFE_STREAM_DEFAULT ((cusafe_stream)0)

typedef enum cusafe_handle_type {
  CUSAFE_TYPE_INVALID = 0,
  CUSAFE_TYPE_CONTEXT = 1,
  CUSAFE_TYPE_STREAM = 2,
  CUSAFE_TYPE_EVENT = 3,
  CUSAFE_TYPE_BUFFER = 4
} cusafe_handle_type;

/* Retains / releases a handle of any type: the generic form of the typed
 * *_retain and *_release functions, for bindings.  Releasing
 * CUSAFE_NULL_HANDLE is a no-op returning CUSAFE_SUCCESS; releasing a stale
 * handle (a double release) returns CUSAFE_ERROR_INVALID_HANDLE.  After
 * shutdown or in a forked child, release returns CUSAFE_SUCCESS and does
 * nothing; retain returns CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED. */
CUSAFE_API cusafe_status cusafe_retain(cusafe_handle handle);
CUSAFE_API cusafe_status cusafe_release(cusafe_handle handle);

/* Stores the type of a live handle in *out.  A NULL, forged or stale handle
 * gets CUSAFE_ERROR_INVALID_HANDLE and *out = CUSAFE_TYPE_INVALID. */
CUSAFE_API cusafe_status cusafe_handle_get_type(cusafe_handle_type *out,
                                                cusafe_handle handle);

/* ------------------------------------------------------------------------ */
/* Library and devices                                                        */
/* ------------------------------------------------------------------------ */

/* Destroys every object still alive, in dependency order (views and
 * buffers, events, streams, contexts), after synchronising their devices,
 * and marks the library shut down.  It runs by itself at process exit,
 * before the CUDA runtime's own teardown; call it to do the same earlier.
 * Idempotent: later calls return CUSAFE_SUCCESS, as does a call in a child
 * forked after CUDA was initialised (which does nothing).  Not to be called while
 * other threads still use cusafe handles they expect to work. */
CUSAFE_API cusafe_status cusafe_shutdown(void);

/* Stores the number of CUDA devices in *out (NULL: CUSAFE_ERROR_INVALID_VALUE).
 * With no driver: CUSAFE_ERROR_NO_DRIVER; with a driver but no device:
 * CUSAFE_ERROR_NO_DEVICE (and *out = 0 in both cases). */
CUSAFE_API cusafe_status cusafe_device_count(int *out);

/* Key properties of a device; a plain struct, safe to mirror in ctypes. */
typedef struct cusafe_device_properties {
  char name[256];
  size_t total_memory;              /* bytes of device memory */
  int compute_capability_major;
  int compute_capability_minor;
  int multiprocessor_count;
  int max_threads_per_block;
  int max_block_dim[3];
  int max_grid_dim[3];
  size_t shared_memory_per_block;   /* bytes, without opt-in */
  size_t shared_memory_per_block_optin; /* bytes, with opt-in */
  int warp_size;
  int managed_memory;               /* 1 if managed memory is supported */
  int concurrent_managed_access;
  int memory_pools;                 /* 1 if cudaMallocAsync is supported */
  int pci_bus_id;
  int pci_device_id;
  int pci_domain_id;
} cusafe_device_properties;

/* Fills *out with the properties of device `device`.  Errors:
 * CUSAFE_ERROR_INVALID_VALUE (out NULL), CUSAFE_ERROR_INVALID_DEVICE,
 * CUSAFE_ERROR_NO_DRIVER, CUSAFE_ERROR_NO_DEVICE. */
CUSAFE_API cusafe_status cusafe_device_get_properties(
    cusafe_device_properties *out, int device);

/* ------------------------------------------------------------------------ */
/* Contexts                                                                   */
/* ------------------------------------------------------------------------ */

/* A context stands for one device: it retains the device's primary context
 * (shared with the CUDA runtime and other libraries such as CuPy) and owns a
 * default stream.  There is one context per device: creating a context for a
 * device that already has a live one returns that same handle with one more
 * reference.  The primary context is released only after every buffer,
 * stream and event of the context is destroyed.
 *
 * @param[out] out    the new reference; set to CUSAFE_NULL_HANDLE on failure
 * @param[in]  device the device ordinal
 * Errors: CUSAFE_ERROR_INVALID_VALUE (out NULL), CUSAFE_ERROR_INVALID_DEVICE,
 * CUSAFE_ERROR_NO_DRIVER, CUSAFE_ERROR_NO_DEVICE, CUSAFE_ERROR_CUDA. */
CUSAFE_API cusafe_status cusafe_context_create(cusafe_context *out,
                                               int device);
CUSAFE_API cusafe_status cusafe_context_retain(cusafe_context ctx);
/* Drops one reference.  When the caller's last reference goes the handle is
 * stale; the context itself (its default stream and primary context
 * reference) is destroyed once its last child is gone too.  NULL: no-op;
 * stale: INVALID_HANDLE. */
CUSAFE_API cusafe_status cusafe_context_release(cusafe_context ctx);
/* Stores the context's device ordinal in *out. */
CUSAFE_API cusafe_status cusafe_context_get_device(int *out,
                                                   cusafe_context ctx);
/* Waits until all work on the context's device has completed. */
CUSAFE_API cusafe_status cusafe_context_synchronize(cusafe_context ctx);
/* Stores the range of stream priorities of the context's device: *least is
 * the lowest priority (usually 0), *greatest the highest (a negative
 * number; lower numbers mean higher priority). */
CUSAFE_API cusafe_status cusafe_context_stream_priority_range(
    int *least, int *greatest, cusafe_context ctx);

/* ------------------------------------------------------------------------ */
/* Streams                                                                    */
/* ------------------------------------------------------------------------ */

/* Stream creation flags. */
#define CUSAFE_STREAM_NON_BLOCKING 0x1u /* no implicit sync with stream 0 */

/* Creates a stream in ctx.  flags: 0 or CUSAFE_STREAM_NON_BLOCKING (others:
 * CUSAFE_ERROR_INVALID_VALUE).  priority: 0 for the default, else within
 * cusafe_context_stream_priority_range() (outside: INVALID_VALUE).  The
 * stream holds a reference on ctx.  *out is set to CUSAFE_NULL_HANDLE on
 * failure. */
CUSAFE_API cusafe_status cusafe_stream_create(cusafe_stream *out,
                                              cusafe_context ctx,
                                              unsigned int flags,
                                              int priority);
CUSAFE_API cusafe_status cusafe_stream_retain(cusafe_stream stream);
/* Drops one reference.  Work already queued still completes; the CUDA
 * stream is destroyed once nothing (no buffer's pending work) needs it. */
CUSAFE_API cusafe_status cusafe_stream_release(cusafe_stream stream);
/* Blocks until all work queued on the stream has completed. */
CUSAFE_API cusafe_status cusafe_stream_synchronize(cusafe_stream stream);
/* Returns CUSAFE_SUCCESS if all work queued on the stream has completed,
 * CUSAFE_ERROR_NOT_READY if not. */
CUSAFE_API cusafe_status cusafe_stream_query(cusafe_stream stream);
/* Makes all later work on stream wait until event's last record completes.
 * Both must belong to the same context (else CONTEXT_MISMATCH). */
CUSAFE_API cusafe_status cusafe_stream_wait_event(cusafe_stream stream,
                                                  cusafe_event event);
/* Stores the stream's context in *out with a new reference, which the
 * caller releases (so the handle stays usable even after the caller
 * released its own reference to the context). */
CUSAFE_API cusafe_status cusafe_stream_get_context(cusafe_context *out,
                                                   cusafe_stream stream);

/* ------------------------------------------------------------------------ */
/* Events                                                                     */
/* ------------------------------------------------------------------------ */

#define CUSAFE_EVENT_DISABLE_TIMING 0x1u /* cheaper; no elapsed time */
#define CUSAFE_EVENT_BLOCKING_SYNC 0x2u  /* synchronize sleeps, not spins */

/* Creates an event in ctx; flags: a combination of the CUSAFE_EVENT_*
 * flags (others: INVALID_VALUE).  The event holds a reference on ctx. */
CUSAFE_API cusafe_status cusafe_event_create(cusafe_event *out,
                                             cusafe_context ctx,
                                             unsigned int flags);
CUSAFE_API cusafe_status cusafe_event_retain(cusafe_event event);
CUSAFE_API cusafe_status cusafe_event_release(cusafe_event event);
/* Records the event at the current end of stream (CUSAFE_STREAM_DEFAULT:
 * the context's default stream); same context required. */
CUSAFE_API cusafe_status cusafe_event_record(cusafe_event event,
                                             cusafe_stream stream);
/* Blocks until the work before the event's last record has completed.  An
 * event never recorded completes at once. */
CUSAFE_API cusafe_status cusafe_event_synchronize(cusafe_event event);
/* CUSAFE_SUCCESS if complete, CUSAFE_ERROR_NOT_READY if not. */
CUSAFE_API cusafe_status cusafe_event_query(cusafe_event event);
/* Stores in *ms the time in milliseconds between two recorded, completed
 * events of one context.  Errors: INVALID_VALUE (ms NULL, or an event
 * created with CUSAFE_EVENT_DISABLE_TIMING), NOT_READY (not yet complete),
 * CONTEXT_MISMATCH, CUSAFE_ERROR_CUDA (an event never recorded). */
CUSAFE_API cusafe_status cusafe_event_elapsed_ms(float *ms,
                                                 cusafe_event start,
                                                 cusafe_event end);

/* ------------------------------------------------------------------------ */
/* Buffers                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum cusafe_memory {
  CUSAFE_MEMORY_DEVICE = 0,      /* device memory, from the stream-ordered pool */
  CUSAFE_MEMORY_HOST_PINNED = 1, /* page-locked host memory */
  CUSAFE_MEMORY_MANAGED = 2      /* unified (managed) memory */
} cusafe_memory;

/* Allocates `size` bytes of `kind` memory in ctx.  Device memory comes from
 * the device's stream-ordered pool (cudaMallocAsync) on the context's
 * default stream.  The buffer holds a reference on ctx.  Contents are
 * undefined until written.
 * Errors: INVALID_VALUE (out NULL, unknown kind), INVALID_SIZE (size 0),
 * OUT_OF_MEMORY (also a size above the device's total memory), NOT_SUPPORTED (managed memory on a device without it),
 * INVALID_HANDLE (ctx). */
CUSAFE_API cusafe_status cusafe_buffer_alloc(cusafe_buffer *out,
                                             cusafe_context ctx,
                                             cusafe_memory kind, size_t size);
/* Allocates `size` bytes of device memory ordered on `stream` (its context's
 * pool): later work on any stream that uses the buffer is ordered after the
 * allocation. */
CUSAFE_API cusafe_status cusafe_buffer_alloc_async(cusafe_buffer *out,
                                                   cusafe_stream stream,
                                                   size_t size);
/* Creates a view: a buffer handle for bytes [offset, offset + size) of
 * `parent` (a buffer or another view).  The view holds a reference on its
 * parent, so the memory lives as long as any view of it.  Errors:
 * INVALID_SIZE (size 0), OUT_OF_RANGE (beyond the parent). */
CUSAFE_API cusafe_status cusafe_buffer_view(cusafe_buffer *out,
                                            cusafe_buffer parent,
                                            size_t offset, size_t size);
CUSAFE_API cusafe_status cusafe_buffer_retain(cusafe_buffer buffer);
/* Drops one reference.  When the last one goes, the memory is freed after
 * all work already queued on it, stream-ordered; the handle is stale at
 * once. */
CUSAFE_API cusafe_status cusafe_buffer_release(cusafe_buffer buffer);
/* Stores the buffer's (or view's) size in bytes in *out. */
CUSAFE_API cusafe_status cusafe_buffer_get_size(size_t *out,
                                                cusafe_buffer buffer);
/* Stores the buffer's memory kind in *out. */
CUSAFE_API cusafe_status cusafe_buffer_get_memory(cusafe_memory *out,
                                                  cusafe_buffer buffer);
/* Stores the buffer's context in *out with a new reference, which the
 * caller releases. */
CUSAFE_API cusafe_status cusafe_buffer_get_context(cusafe_context *out,
                                                   cusafe_buffer buffer);

/* Ordering.  cusafe orders every operation on a buffer after the previous
 * operation on the same memory, also across streams: work on the stream
 * last used costs nothing extra; moving to another stream makes it wait for
 * the previous one (an event record and a stream wait).  The synchronous
 * cusafe_buffer_write() and cusafe_buffer_read() therefore see the results
 * of all work queued before them on any stream. */

/* Copies `size` bytes from host memory `src` to the buffer at `offset` and
 * returns when the copy is complete.  size 0 is a no-op (offset must still
 * be within the buffer).  Errors: INVALID_VALUE (src NULL with size > 0),
 * OUT_OF_RANGE (offset + size beyond the buffer or overflowing). */
CUSAFE_API cusafe_status cusafe_buffer_write(cusafe_buffer buffer,
                                             size_t offset, const void *src,
                                             size_t size);
/* Copies `size` bytes of the buffer at `offset` into host memory `dst` and
 * returns when the copy is complete; errors as cusafe_buffer_write(). */
CUSAFE_API cusafe_status cusafe_buffer_read(cusafe_buffer buffer,
                                            size_t offset, void *dst,
                                            size_t size);
/* Stream-ordered forms of write and read.  The host memory must stay valid
 * until the stream has passed the copy (pageable memory is staged, so for
 * it the call returns once `src` may be reused / `dst` is filled). */
CUSAFE_API cusafe_status cusafe_buffer_write_async(cusafe_buffer buffer,
                                                   size_t offset,
                                                   const void *src,
                                                   size_t size,
                                                   cusafe_stream stream);
CUSAFE_API cusafe_status cusafe_buffer_read_async(cusafe_buffer buffer,
                                                  size_t offset, void *dst,
                                                  size_t size,
                                                  cusafe_stream stream);
/* Copies `size` bytes from src at src_offset to dst at dst_offset, ordered on
 * `stream` (CUSAFE_STREAM_DEFAULT: dst's context's default stream).  The
 * buffers may belong to different devices (a peer copy); the stream must
 * belong to the context of one of them (else CONTEXT_MISMATCH).  Where the
 * copy has to run on the other device (device memory of one device and
 * host-accessible memory of another), cusafe runs it on that device's
 * default stream, ordered after the work already on `stream` and before
 * any work queued on `stream` later.  Ranges that overlap within one
 * allocation: INVALID_VALUE. */
CUSAFE_API cusafe_status cusafe_buffer_copy(cusafe_buffer dst,
                                            size_t dst_offset,
                                            cusafe_buffer src,
                                            size_t src_offset, size_t size,
                                            cusafe_stream stream);
/* Sets `size` bytes at `offset` to `value`, ordered on `stream`. */
CUSAFE_API cusafe_status cusafe_buffer_fill(cusafe_buffer buffer,
                                            size_t offset, size_t size,
                                            unsigned char value,
                                            cusafe_stream stream);

/* ------------------------------------------------------------------------ */
/* Interop (NCCL, CUDA-aware MPI, other CUDA libraries)                       */
/* ------------------------------------------------------------------------ */

/* Stores the raw address of the buffer's first byte (a device address; for
 * pinned memory the host address, which the device can use too) in *out.
 * cusafe keeps ownership: the address is valid while the caller holds a
 * reference on the buffer, and work the caller queues through it is not
 * tracked by cusafe -- synchronise before releasing. */
CUSAFE_API cusafe_status cusafe_buffer_interop_pointer(void **out,
                                                       cusafe_buffer buffer);
/* Stores the stream's cudaStream_t in *out (CUSAFE_STREAM_DEFAULT is not a
 * stream here: INVALID_HANDLE).  cusafe keeps ownership: valid while the
 * caller holds a reference on the stream; never destroy it. */
CUSAFE_API cusafe_status cusafe_stream_interop_handle(void **out,
                                                      cusafe_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* CUSAFE_H */
