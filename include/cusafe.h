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
 * caught as an error instead of stealing a child's reference.  A handle
 * counts at most 65535 references of the caller (a retain beyond gets
 * CUSAFE_ERROR_OUT_OF_MEMORY, "... has too many references").  Functions
 * such as cusafe_buffer_get_context() hand out a new reference when the
 * caller needs the parent again.  Work queued on a stream keeps the buffers it
 * uses alive: releasing the last reference of a buffer while a copy still uses
 * it is legal, and the memory is freed stream-ordered after that copy.
 *
 * Errors: every function returns a cusafe_status.  After a failure,
 * cusafe_last_error_message() gives a sentence that says what was wrong, and
 * cusafe_last_cuda_error() the underlying cudaError_t, both kept per thread.
 *
 * Threads: unless its comment says otherwise, every function is thread-safe,
 * and any handle may be used and released from any thread.  A release that
 * drops the last reference of a kernel, stream or buffer which a launch on
 * another thread is using at that moment waits for that launch call to
 * return (launches use their handles without taking references); a launch
 * that begins after such a release gets CUSAFE_ERROR_INVALID_HANDLE.
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
  CUSAFE_ERROR_FORKED = 14,
  /* A kernel's arguments do not match its parameters (count or size). */
  CUSAFE_ERROR_INVALID_ARGUMENTS = 15,
  /* A grid, block or shared memory size beyond the kernel's or device's
   * limits. */
  CUSAFE_ERROR_INVALID_CONFIGURATION = 16,
  /* A module image that CUDA cannot load (corrupt, or for another
   * architecture), or a file that cannot be read. */
  CUSAFE_ERROR_INVALID_IMAGE = 17,
  /* Run-time compilation failed; the message holds the compiler's log. */
  CUSAFE_ERROR_COMPILE = 18,
  /* A kernel name that the module does not contain. */
  CUSAFE_ERROR_NOT_FOUND = 19
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
typedef cusafe_handle cusafe_module;
typedef cusafe_handle cusafe_kernel;

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
  CUSAFE_TYPE_BUFFER = 4,
  CUSAFE_TYPE_MODULE = 5,
  CUSAFE_TYPE_KERNEL = 6
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

/* Attaches a label to a live handle of any type -- where or why it was
 * created -- that the leak report prints (see cusafe_shutdown()).  The
 * text is copied (at most 255 bytes kept); NULL removes the label.  Errors:
 * INVALID_HANDLE, OUT_OF_MEMORY. */
CUSAFE_API cusafe_status cusafe_handle_set_label(cusafe_handle handle,
                                                 const char *label);

/* ------------------------------------------------------------------------ */
/* Library and devices                                                        */
/* ------------------------------------------------------------------------ */

/* Destroys every object still alive, in dependency order (views and
 * buffers, events, streams, kernels, modules, contexts), after
 * synchronising their devices, and marks the library shut down.  It runs by
 * itself at process exit, before the CUDA runtime's own teardown; call it
 * to do the same earlier.  Calls in progress on other threads are waited
 * for (up to 5 seconds; past that nothing is destroyed, so that no thread
 * is pulled out from under -- the process is then left to the runtime's own
 * teardown), and new calls get CUSAFE_ERROR_SHUTDOWN.  A context broken by
 * a sticky error (a kernel fault) still shuts down, silently.
 *
 * Leak report: with CUSAFE_LEAK_REPORT=1 in the environment, it first
 * prints one line on stderr for each handle the program still holds, such
 * as `cusafe: leak: buffer 0xc400000100000003 (4096 bytes of device memory
 * on device 0) "weights"` (the label from cusafe_handle_set_label()).
 * Silent by default.
 *
 * Idempotent: later calls return CUSAFE_SUCCESS, as does a call in a child
 * forked after CUDA was initialised (which does nothing).  Thread-safe, but
 * other threads' handles stop working: call it when they are done. */
CUSAFE_API cusafe_status cusafe_shutdown(void);

/* Stores the number of CUDA devices in *out (NULL: CUSAFE_ERROR_INVALID_VALUE).
 * With no driver: CUSAFE_ERROR_NO_DRIVER; with a driver but no device:
 * CUSAFE_ERROR_NO_DEVICE (and *out = 0 in both cases). */
CUSAFE_API cusafe_status cusafe_device_count(int *out);

/* Key properties of a device; a plain struct, safe to mirror in ctypes. */
typedef struct cusafe_device_properties {
  char name[256];
  size_t total_memory; /* bytes of device memory */
  int compute_capability_major;
  int compute_capability_minor;
  int multiprocessor_count;
  int max_threads_per_block;
  int max_block_dim[3];
  int max_grid_dim[3];
  size_t shared_memory_per_block;       /* bytes, without opt-in */
  size_t shared_memory_per_block_optin; /* bytes, with opt-in */
  int warp_size;
  int managed_memory; /* 1 if managed memory is supported */
  int concurrent_managed_access;
  int memory_pools; /* 1 if cudaMallocAsync is supported */
  int pci_bus_id;
  int pci_device_id;
  int pci_domain_id;
} cusafe_device_properties;

/* Fills *out with the properties of device `device`.  Errors:
 * CUSAFE_ERROR_INVALID_VALUE (out NULL), CUSAFE_ERROR_INVALID_DEVICE,
 * CUSAFE_ERROR_NO_DRIVER, CUSAFE_ERROR_NO_DEVICE. */
CUSAFE_API cusafe_status
cusafe_device_get_properties(cusafe_device_properties *out, int device);

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
CUSAFE_API cusafe_status cusafe_context_create(cusafe_context *out, int device);
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
                                              unsigned int flags, int priority);
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
CUSAFE_API cusafe_status cusafe_event_elapsed_ms(float *ms, cusafe_event start,
                                                 cusafe_event end);

/* ------------------------------------------------------------------------ */
/* Buffers                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum cusafe_memory {
  CUSAFE_MEMORY_DEVICE = 0, /* device memory, from the stream-ordered pool */
  CUSAFE_MEMORY_HOST_PINNED = 1, /* page-locked host memory */
  CUSAFE_MEMORY_MANAGED = 2      /* unified (managed) memory */
} cusafe_memory;

/* Allocates `size` bytes of `kind` memory in ctx.  Device memory comes from
 * the device's stream-ordered pool (cudaMallocAsync) on the context's
 * default stream.  The buffer holds a reference on ctx.  Contents are
 * undefined until written.
 * Errors: INVALID_VALUE (out NULL, unknown kind), INVALID_SIZE (size 0),
 * OUT_OF_MEMORY (also a size above the device's total memory), NOT_SUPPORTED
 * (managed memory on a device without it), INVALID_HANDLE (ctx). */
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
                                            cusafe_buffer parent, size_t offset,
                                            size_t size);
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
CUSAFE_API cusafe_status cusafe_buffer_read(cusafe_buffer buffer, size_t offset,
                                            void *dst, size_t size);
/* Stream-ordered forms of write and read.  The host memory must stay valid
 * until the stream has passed the copy (pageable memory is staged, so for
 * it the call returns once `src` may be reused / `dst` is filled). */
CUSAFE_API cusafe_status cusafe_buffer_write_async(cusafe_buffer buffer,
                                                   size_t offset,
                                                   const void *src, size_t size,
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
CUSAFE_API cusafe_status cusafe_buffer_fill(cusafe_buffer buffer, size_t offset,
                                            size_t size, unsigned char value,
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

/* ------------------------------------------------------------------------ */
/* Modules and kernels                                                        */
/* ------------------------------------------------------------------------ */

/* A module is loaded code of one context: the kernels built into cusafe, a
 * cubin / fatbin / PTX image from a file or memory, or CUDA C++ compiled at
 * run time with NVRTC.  It holds a reference on its context; a kernel holds
 * a reference on its module, so a module lives while any kernel of it does.
 * Modules and kernels are released like every other handle. */

/* Loads the kernels built into cusafe (from kernels/: fill, scale, axpy
 * and vector add for float and double, named cusafe_<op>_f32 / _f64; see
 * the README for their parameters).  Errors: INVALID_HANDLE (ctx),
 * INVALID_IMAGE (the library holds no code for this device's architecture;
 * rebuild with ./configure --with-cuda-arch). */
CUSAFE_API cusafe_status cusafe_module_load_builtin(cusafe_module *out,
                                                    cusafe_context ctx);
/* Loads a cubin, fatbin or PTX file.  Errors: INVALID_VALUE (path NULL),
 * INVALID_IMAGE (cannot be read, or not loadable: the message names the
 * file and says why). */
CUSAFE_API cusafe_status cusafe_module_load_file(cusafe_module *out,
                                                 cusafe_context ctx,
                                                 const char *path);
/* Loads a cubin, fatbin or NUL-terminated PTX image from memory; cusafe
 * copies what it needs, so `image` may be freed afterwards.  `size` is the
 * image's size in bytes (for PTX, including the NUL).  Errors: INVALID_VALUE
 * (image NULL), INVALID_SIZE (size 0), INVALID_IMAGE. */
CUSAFE_API cusafe_status cusafe_module_load_data(cusafe_module *out,
                                                 cusafe_context ctx,
                                                 const void *image,
                                                 size_t size);
/* Compiles CUDA C++ `source` with NVRTC for the context's device (cubin
 * for its exact architecture) and loads it.  `name` names the program in
 * messages and the compiler's diagnostics (NULL: "source.cu").  `options`
 * are NVRTC options such as "-DN=4", "-I/path", "-std=c++17"; cusafe adds
 * the architecture option unless one is given.  Kernels should be declared
 * extern "C" to be found by their plain names; otherwise pass the mangled
 * name to cusafe_module_get_kernel().  Errors: INVALID_VALUE (source NULL,
 * options NULL with noptions > 0), COMPILE (the message holds the log;
 * cusafe_last_compile_log() the whole of it). */
CUSAFE_API cusafe_status cusafe_module_compile(
    cusafe_module *out, cusafe_context ctx, const char *source,
    const char *name, const char *const *options, size_t noptions);
/* Returns the full log of the calling thread's last failed
 * cusafe_module_compile(), or "".  Owned by the library, valid until the
 * next compile on this thread; never NULL.  Thread-safe (per thread). */
CUSAFE_API const char *cusafe_last_compile_log(void);
CUSAFE_API cusafe_status cusafe_module_retain(cusafe_module module);
CUSAFE_API cusafe_status cusafe_module_release(cusafe_module module);

/* Looks up a kernel of the module by name and reads its parameter layout.
 * The kernel holds a reference on the module.  Errors: INVALID_VALUE (name
 * NULL), NOT_FOUND ("kernel \"<name>\" not found in module <module>"),
 * NOT_SUPPORTED (a parameter of more than 65 535 bytes, which CUDA does not
 * allow today: it allows 32 764 bytes for all the parameters together). */
CUSAFE_API cusafe_status cusafe_module_get_kernel(cusafe_kernel *out,
                                                  cusafe_module module,
                                                  const char *name);
CUSAFE_API cusafe_status cusafe_kernel_retain(cusafe_kernel kernel);
CUSAFE_API cusafe_status cusafe_kernel_release(cusafe_kernel kernel);
/* Stores the number of parameters of the kernel in *count and, if sizes is
 * not NULL, the size in bytes of the first min(*count, capacity) of them in
 * sizes[]. */
CUSAFE_API cusafe_status cusafe_kernel_get_params(size_t *count, size_t *sizes,
                                                  size_t capacity,
                                                  cusafe_kernel kernel);

/* The kind of one kernel argument. */
typedef enum cusafe_arg_kind {
  CUSAFE_ARG_BUFFER = 1, /* a buffer or view, passed as its device address */
  CUSAFE_ARG_I8 = 2,
  CUSAFE_ARG_U8 = 3,
  CUSAFE_ARG_I16 = 4,
  CUSAFE_ARG_U16 = 5,
  CUSAFE_ARG_I32 = 6,
  CUSAFE_ARG_U32 = 7,
  CUSAFE_ARG_I64 = 8,
  CUSAFE_ARG_U64 = 9,
  CUSAFE_ARG_F32 = 10,
  CUSAFE_ARG_F64 = 11,
  CUSAFE_ARG_BYTES = 12 /* `size` bytes at value.bytes, passed by value */
} cusafe_arg_kind;

/* One kernel argument: a tagged value, 16 bytes, easy to build from C (the
 * CUSAFE_ARG_* macros below) and from ctypes. */
typedef struct cusafe_arg {
  uint32_t kind; /* a cusafe_arg_kind */
  uint32_t size; /* CUSAFE_ARG_BYTES only: the byte count */
  union {
    cusafe_buffer buffer;
    int64_t i;  /* I8 .. I64 */
    uint64_t u; /* U8 .. U64 */
    float f32;
    double f64;
    const void *bytes;
  } value;
} cusafe_arg;

#define CUSAFE_ARG_BUF(h) ((cusafe_arg){CUSAFE_ARG_BUFFER, 0, {.buffer = (h)}})
#define CUSAFE_ARG_INT(k, v) ((cusafe_arg){(k), 0, {.i = (int64_t)(v)}})
#define CUSAFE_ARG_UINT(k, v) ((cusafe_arg){(k), 0, {.u = (uint64_t)(v)}})
#define CUSAFE_ARG_I32V(v) CUSAFE_ARG_INT(CUSAFE_ARG_I32, v)
#define CUSAFE_ARG_U32V(v) CUSAFE_ARG_UINT(CUSAFE_ARG_U32, v)
#define CUSAFE_ARG_I64V(v) CUSAFE_ARG_INT(CUSAFE_ARG_I64, v)
#define CUSAFE_ARG_U64V(v) CUSAFE_ARG_UINT(CUSAFE_ARG_U64, v)
#define CUSAFE_ARG_F32V(v) ((cusafe_arg){CUSAFE_ARG_F32, 0, {.f32 = (v)}})
#define CUSAFE_ARG_F64V(v) ((cusafe_arg){CUSAFE_ARG_F64, 0, {.f64 = (v)}})
#define CUSAFE_ARG_STRUCT(p)                                                   \
  ((cusafe_arg){CUSAFE_ARG_BYTES, (uint32_t)sizeof(*(p)), {.bytes = (p)}})

/* Where and how a kernel runs. */
typedef struct cusafe_launch_config {
  uint32_t grid[3];     /* blocks in x, y, z; each >= 1 */
  uint32_t block[3];    /* threads per block in x, y, z; each >= 1 */
  size_t shared_memory; /* dynamic shared memory in bytes */
  cusafe_stream stream; /* CUSAFE_STREAM_DEFAULT: the context's own */
} cusafe_launch_config;

/* Launches `kernel`.  Before launching it checks, each with its own status
 * and a message: the number of arguments and each one's size against the
 * kernel's parameters (INVALID_ARGUMENTS: "kernel cusafe_axpy_f32 takes 4
 * arguments, 3 given", "argument 2 of kernel k is 4 bytes, parameter 2 is
 * 8 bytes"); grid, block and shared memory against the kernel's and the
 * device's limits (INVALID_CONFIGURATION); every buffer and the stream in
 * the kernel's context (CONTEXT_MISMATCH); handles (INVALID_HANDLE).
 * Buffers are passed as their device address (a view at its offset) and
 * stay alive until the kernel has completed, like every other operation on
 * them (see "Ordering" above).  Dynamic shared memory above the default
 * limit is opted into automatically.  `args` may be NULL when nargs is 0.
 * Thread-safe; a handle released by another thread during the call either
 * launches (its release waits for the call) or fails as stale. */
CUSAFE_API cusafe_status
cusafe_kernel_launch(cusafe_kernel kernel, const cusafe_launch_config *config,
                     const cusafe_arg *args, size_t nargs);

/* The C convenience form: CUSAFE_LAUNCH(k, &config, CUSAFE_ARG_BUF(x),
 * CUSAFE_ARG_F32V(2.0f), CUSAFE_ARG_U64V(n)). */
#define CUSAFE_LAUNCH(kernel, config, ...)                                     \
  cusafe_kernel_launch((kernel), (config), (const cusafe_arg[]){__VA_ARGS__},  \
                       sizeof((const cusafe_arg[]){__VA_ARGS__}) /             \
                           sizeof(cusafe_arg))

/* Suggests a block size (threads, a multiple of the warp size) that gives
 * the kernel the highest occupancy with `shared_memory` bytes of dynamic
 * shared memory per block, and the grid that covers `n` threads with it
 * (at least 1; capped at the device's grid limit).  Errors: INVALID_VALUE
 * (block or grid NULL), INVALID_CONFIGURATION (shared_memory too large). */
CUSAFE_API cusafe_status cusafe_kernel_suggest_config(uint32_t *block,
                                                      uint32_t *grid,
                                                      cusafe_kernel kernel,
                                                      size_t shared_memory,
                                                      size_t n);

#ifdef __cplusplus
}
#endif

#endif /* CUSAFE_H */
