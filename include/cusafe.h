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
 * a reference on its parent (stream, event, buffer and module on their
 * context, view on its buffer, kernel on its module), so a parent's CUDA
 * object is destroyed only after all of its children's.  A handle is the
 * caller's: once the caller has released all the references it was given,
 * the handle is stale -- even while children keep the object itself alive --
 * so that a double release is caught as an error instead of stealing a
 * child's reference.  A handle counts at most 65535 references of the caller
 * (a retain beyond gets CUSAFE_ERROR_OUT_OF_MEMORY, "... has too many
 * references").  Functions such as cusafe_buffer_get_context() hand out a
 * new reference when the caller needs the parent again.  Work queued on a
 * stream keeps the buffers it uses alive: releasing the last reference of a
 * buffer while a copy still uses it is legal, and the memory is freed
 * stream-ordered after that copy.
 *
 * Errors: every function returns a cusafe_status, except the five that
 * return text or a number (cusafe_status_string(),
 * cusafe_last_error_message(), cusafe_last_cuda_error(),
 * cusafe_version_string(), cusafe_last_compile_log()).  After a failure,
 * cusafe_last_error_message() gives a sentence that says what was wrong, and
 * cusafe_last_cuda_error() the underlying cudaError_t, both kept per thread.
 *
 * Each function's comment says what it does, then, in this order:
 * Parameters (each one [in], [out] or [in,out]), Returns (what holds after
 * CUSAFE_SUCCESS), Errors (every other status it returns, when, and what its
 * outputs hold then), Ownership (what the caller owns afterwards), Handles
 * (what NULL, stale and wrong-type handles get) and Threads.  What many
 * functions share is said once, here:
 *
 * - State: every call but the few marked "works after shutdown" first checks
 *   the library's state, and returns CUSAFE_ERROR_SHUTDOWN after
 *   cusafe_shutdown() (or process exit) and CUSAFE_ERROR_FORKED in a child
 *   forked after the parent used CUDA, doing nothing else.  Releases instead
 *   return CUSAFE_SUCCESS then and do nothing, whatever their handle.
 *
 * - Handles: a NULL, forged, stale or wrong-type handle gets
 *   CUSAFE_ERROR_INVALID_HANDLE and a message that names the parameter:
 *   "context is the NULL handle", "buffer 0x... is not a cusafe handle",
 *   "stream 0x... is stale: its object was released", "buffer 0x... is a
 *   stream, not a buffer".  Nothing freed is ever read.  A handle that
 *   another thread's release makes stale during a call either completes
 *   the call (the call holds the object meanwhile) or fails as stale.
 *
 * - CUDA failures: a CUDA call that fails makes the function return the
 *   status that cusafe's table maps its cudaError_t to, with the message
 *   "<CUDA function> failed: <CUDA's words>" and the code in
 *   cusafe_last_cuda_error().  cudaErrorMemoryAllocation maps to
 *   CUSAFE_ERROR_OUT_OF_MEMORY, cudaErrorNotReady to NOT_READY,
 *   cudaErrorInsufficientDriver to NO_DRIVER, cudaErrorNoDevice to
 *   NO_DEVICE, cudaErrorInvalidDevice to INVALID_DEVICE,
 *   cudaErrorNotSupported to NOT_SUPPORTED, cudaErrorCudartUnloading to
 *   SHUTDOWN, cudaErrorInvalidConfiguration to INVALID_CONFIGURATION,
 *   cudaErrorSymbolNotFound to NOT_FOUND, the errors of a bad image
 *   (cudaErrorInvalidKernelImage, InvalidPtx, UnsupportedPtxVersion,
 *   NoKernelImageForDevice, InvalidSource, FileNotFound,
 *   JitCompilerNotFound) to INVALID_IMAGE, and every other error to
 *   CUSAFE_ERROR_CUDA.  The comments below call this "a CUDA failure
 *   (<functions>): its mapped status".  Where the process sees more than
 *   one device, any call that uses a device may also fail this way in
 *   cudaGetDevice or cudaSetDevice.  A sticky error (a kernel fault) makes
 *   the CUDA calls of its context fail from then on, most as
 *   CUSAFE_ERROR_CUDA.
 *
 * - Releases: the release of the last reference of an object destroys it,
 *   and with it any parent whose last reference it held.  If a CUDA call of
 *   that teardown fails (after a kernel fault, the device synchronisation
 *   of a context or module does), the release returns that CUDA failure's
 *   mapped status; the reference is dropped and the objects are destroyed
 *   all the same.
 *
 * Threads: unless its comment says otherwise, every function is thread-safe,
 * and any handle may be used and released from any thread.  A release that
 * drops the last reference of a kernel, stream or buffer which a launch on
 * another thread is using at that moment waits for that launch call to
 * return (launches use their handles without taking references); a launch
 * that begins after such a release gets CUSAFE_ERROR_INVALID_HANDLE.  Where
 * the process sees more than one device, a call makes the device it uses
 * current on the calling thread and restores the thread's device before it
 * returns.
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
  /* A size of zero where data is required (a module image). */
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
  CUSAFE_ERROR_NOT_FOUND = 19,
  /* The operation cannot be captured into a graph, or cannot run while
   * the stream it needs captures; refused before any CUDA call, so the
   * capture goes on unchanged (see Graphs). */
  CUSAFE_ERROR_CAPTURING = 20
} cusafe_status;

/* Returns a static, English description of a status.
 * Parameters: status [in] any value, also one that is not a cusafe_status.
 * Returns: the description; "unknown status" for an unknown value.  Never
 *   NULL.
 * Errors: none.
 * Ownership: the text is static, the library's; do not free it.
 * Handles: none taken.
 * Threads: thread-safe; works after shutdown and in a forked child. */
CUSAFE_API const char *cusafe_status_string(cusafe_status status);

/* Returns the detail message of the calling thread's last failed call, such
 * as "copy of 100 bytes at offset 0 exceeds buffer of 64 bytes".
 * Parameters: none.
 * Returns: the message; "" if no call on this thread has failed yet.  Never
 *   NULL; never allocates.
 * Errors: none.
 * Ownership: the text is the library's; it stays valid until the next
 *   cusafe call on the same thread.
 * Handles: none taken.
 * Threads: per-thread state; thread-safe; works after shutdown. */
CUSAFE_API const char *cusafe_last_error_message(void);

/* Returns the cudaError_t (as an int) behind the calling thread's last
 * failed call.
 * Parameters: none.
 * Returns: the code; 0 if that failure did not come from CUDA, or if no
 *   call on this thread has failed yet.
 * Errors: none.
 * Ownership: nothing.
 * Handles: none taken.
 * Threads: per-thread state; thread-safe; works after shutdown. */
CUSAFE_API int cusafe_last_cuda_error(void);

/* Returns the library's version as "MAJOR.MINOR.PATCH".
 * Parameters: none.
 * Returns: the version; never NULL.
 * Errors: none.
 * Ownership: the text is static, the library's.
 * Handles: none taken.
 * Threads: thread-safe; works after shutdown. */
CUSAFE_API const char *cusafe_version_string(void);

/* ------------------------------------------------------------------------ */
/* Handles                                                                    */
/* ------------------------------------------------------------------------ */

/* All handles are 64-bit integers; 0 is the NULL handle.  The typedefs below
 * document intent; the library checks each handle's type at run time.
 *
 * They stay plain integers, not one struct type per kind of object (decided
 * before 1.0 fixes the ABI), so a C compiler accepts a stream where a buffer
 * is expected.  Why: (1) every call checks each handle's type anyway and
 * names both types in its message ("buffer 0x... is a stream, not a
 * buffer"), so a mixed-up handle is always caught, at its first call, with
 * a sentence; (2) the main foreign users are FFIs -- Python's ctypes (the
 * project's binding in examples/python), and bindings for Rust or Julia
 * alike -- for which a 64-bit integer is the natural, ABI-stable type, while
 * one-member structs passed by value need a struct type declared per handle
 * in every binding, and how they are passed is an ABI detail that differs
 * between platforms; (3) the generic calls (cusafe_retain(),
 * cusafe_release(), cusafe_handle_get_type(), cusafe_handle_set_label()) and
 * cusafe_arg's buffer member take any handle, which distinct structs would
 * turn into a conversion per type; (4) handles are printed, logged and
 * compared as numbers (the leak report prints them).  Given up: detection
 * of a mixed-up handle at compile time in C.  It stays possible later
 * without an ABI change, only as an opt-in header of typed wrappers; there
 * is none now. */
typedef uint64_t cusafe_handle;
typedef cusafe_handle cusafe_context;
typedef cusafe_handle cusafe_stream;
typedef cusafe_handle cusafe_event;
typedef cusafe_handle cusafe_buffer;
typedef cusafe_handle cusafe_module;
typedef cusafe_handle cusafe_kernel;
typedef cusafe_handle cusafe_graph;

#define CUSAFE_NULL_HANDLE ((cusafe_handle)0)

/* The stream arguments of the calls that say so accept CUSAFE_STREAM_DEFAULT
 * to mean the default stream of the context of the call's first object (its
 * buffer, dst, event or kernel): a non-blocking stream that cusafe creates
 * with each context.  The calls whose subject is a stream (synchronize,
 * query, wait, get context, interop handle, retain, release) and
 * cusafe_buffer_alloc_async() need a real stream: 0 gets INVALID_HANDLE. */
#define CUSAFE_STREAM_DEFAULT ((cusafe_stream)0)

typedef enum cusafe_handle_type {
  CUSAFE_TYPE_INVALID = 0,
  CUSAFE_TYPE_CONTEXT = 1,
  CUSAFE_TYPE_STREAM = 2,
  CUSAFE_TYPE_EVENT = 3,
  CUSAFE_TYPE_BUFFER = 4,
  CUSAFE_TYPE_MODULE = 5,
  CUSAFE_TYPE_KERNEL = 6,
  CUSAFE_TYPE_GRAPH = 7
} cusafe_handle_type;

/* Adds one reference of the caller to a handle of any type: the generic
 * form of the typed *_retain functions, for bindings.
 * Parameters: handle [in] a live handle of any type.
 * Returns: CUSAFE_SUCCESS: the handle holds one more reference.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: handle is NULL, forged or stale.
 *   CUSAFE_ERROR_OUT_OF_MEMORY: it has too many references (65535 of the
 *   caller's).  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown
 *   / in a forked child.
 * Ownership: the caller owns one more reference, to release.
 * Handles: as every call (see the top of this file); NULL is an error here.
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_retain(cusafe_handle handle);
/* Drops one reference of the caller to a handle of any type: the generic
 * form of the typed *_release functions, for bindings.  The caller's last
 * reference makes the handle stale; the last reference of all (children
 * hold some) destroys the object as its typed release says.
 * Parameters: handle [in] a handle of any type; CUSAFE_NULL_HANDLE: no-op.
 * Returns: CUSAFE_SUCCESS: the reference is dropped.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: handle is forged or stale (a double
 *   release).  A CUDA failure of the teardown, where this release destroys
 *   the object: its mapped status (see Releases at the top).  After
 *   shutdown and in a forked child: CUSAFE_SUCCESS, nothing done.
 * Ownership: the caller owns one reference less.
 * Handles: NULL: CUSAFE_SUCCESS, nothing done; others as every call.
 * Threads: thread-safe; see the top for a release racing a launch. */
CUSAFE_API cusafe_status cusafe_release(cusafe_handle handle);

/* Tells what type of object a live handle stands for.
 * Parameters: out [out] the type; handle [in] a handle of any type.
 * Returns: CUSAFE_SUCCESS: *out is the handle's type.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: handle is NULL, forged or stale.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.  *out is CUSAFE_TYPE_INVALID on every failure.
 * Ownership: nothing; no reference is taken.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_handle_get_type(cusafe_handle_type *out,
                                                cusafe_handle handle);

/* Attaches a label to a live handle of any type -- where or why it was
 * created -- that the leak report prints (see cusafe_shutdown()).
 * Parameters: handle [in] a handle of any type; label [in] NUL-terminated
 *   text, of which at most 255 bytes are kept; NULL removes the label.
 * Returns: CUSAFE_SUCCESS: the object carries the label (in place of any
 *   earlier one) until it is destroyed.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: handle is NULL, forged or stale.
 *   CUSAFE_ERROR_OUT_OF_MEMORY: no host memory for the copy (the earlier
 *   label stays).  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after
 *   shutdown / in a forked child.
 * Ownership: the library keeps its own copy; label stays the caller's.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; of labels set at once on one object, one stays. */
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
 * Silent by default, and when nothing is destroyed.
 *
 * Parameters: none.
 * Returns: CUSAFE_SUCCESS, always: also when it does nothing (a later call,
 *   a call in a child forked after CUDA was initialised, calls still in
 *   progress after 5 seconds).  Before CUDA was ever used it only marks the
 *   library shut down.
 * Errors: none.
 * Ownership: the caller's references need no release: releases are
 *   no-ops from now on.
 * Handles: none taken; every handle stops working.
 * Threads: thread-safe and idempotent, but other threads' handles stop
 *   working: call it when they are done. */
CUSAFE_API cusafe_status cusafe_shutdown(void);

/* Counts the CUDA devices.  It initialises CUDA, once per process (as do
 * cusafe_device_get_properties() and cusafe_context_create()), and then
 * registers the exit handler.
 * Parameters: out [out] the number of devices.
 * Returns: CUSAFE_SUCCESS: *out is the number of devices, 1 or more.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.  CUSAFE_ERROR_NO_DRIVER:
 *   no CUDA driver, or one that lacks the entry points cusafe needs.
 *   CUSAFE_ERROR_NO_DEVICE: a driver but no device.  A CUDA failure
 *   (cudaGetDeviceCount): its mapped status.  CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: after shutdown / in a forked child.  *out is 0 on
 *   every failure.
 * Ownership: nothing.
 * Handles: none taken.
 * Threads: thread-safe. */
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

/* Fills *out with the properties of a device; needs no context.
 * Parameters: out [out] the properties; device [in] the device ordinal.
 * Returns: CUSAFE_SUCCESS: every field of *out is set.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.  CUSAFE_ERROR_NO_DRIVER,
 *   CUSAFE_ERROR_NO_DEVICE, a CUDA failure (cudaGetDeviceCount): as
 *   cusafe_device_count().  CUSAFE_ERROR_INVALID_DEVICE: device is negative
 *   or not below the device count.  A CUDA failure (cudaGetDeviceProperties,
 *   cudaDeviceGetAttribute): its mapped status.  CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: after shutdown / in a forked child.  *out is left
 *   unchanged on failure.
 * Ownership: nothing.
 * Handles: none taken.
 * Threads: thread-safe. */
CUSAFE_API cusafe_status
cusafe_device_get_properties(cusafe_device_properties *out, int device);

/* ------------------------------------------------------------------------ */
/* Contexts                                                                   */
/* ------------------------------------------------------------------------ */

/* Creates the context of a device, or hands out its live one.  A context
 * stands for one device: it retains the device's primary context (shared
 * with the CUDA runtime and other libraries such as CuPy) and owns a
 * default stream.  There is one context per device: creating a context for a
 * device that already has a live one returns that same handle with one more
 * reference (a new context is made instead only while the live one's last
 * reference is being dropped, or when its handle already counts 65535
 * references of the caller).  The primary context is released only after
 * every buffer, stream, event and module of the context is destroyed.
 * Parameters: out [out] the context's handle; device [in] the device
 *   ordinal.
 * Returns: CUSAFE_SUCCESS: *out is the device's context, with one more
 *   reference of the caller.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.  CUSAFE_ERROR_NO_DRIVER,
 *   CUSAFE_ERROR_NO_DEVICE, a CUDA failure (cudaGetDeviceCount): as
 *   cusafe_device_count().  CUSAFE_ERROR_INVALID_DEVICE: device is negative,
 *   not below the device count, or 256 or more.
 *   CUSAFE_ERROR_OUT_OF_MEMORY: no host memory, or the handle table is full.
 *   A CUDA failure (cuDevicePrimaryCtxRetain, cudaGetDeviceProperties,
 *   cudaDeviceGetStreamPriorityRange, cudaStreamCreateWithPriority): its
 *   mapped status.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after
 *   shutdown / in a forked child.  *out is CUSAFE_NULL_HANDLE on every
 *   failure.
 * Ownership: the caller owns one reference of *out, to release with
 *   cusafe_context_release().
 * Handles: none taken.
 * Threads: thread-safe; concurrent calls for one device get one context. */
CUSAFE_API cusafe_status cusafe_context_create(cusafe_context *out, int device);
/* Adds one reference of the caller to a context: the typed cusafe_retain().
 * Parameters: ctx [in] the context.
 * Returns: CUSAFE_SUCCESS: ctx holds one more reference.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: ctx is NULL, forged, stale or not a
 *   context.  CUSAFE_ERROR_OUT_OF_MEMORY: ctx has too many references
 *   (65535 of the caller's).  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED:
 *   after shutdown / in a forked child.
 * Ownership: the caller owns one more reference, to release.
 * Handles: as every call (see the top of this file); NULL is an error here.
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_context_retain(cusafe_context ctx);
/* Drops one reference of the caller to a context.  When the caller's last
 * reference goes the handle is stale; the context itself is destroyed once
 * its last child is gone too: the device is synchronised, then the default
 * stream and the primary context reference are released.
 * Parameters: ctx [in] the context; CUSAFE_NULL_HANDLE: no-op.
 * Returns: CUSAFE_SUCCESS: the reference is dropped.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: ctx is forged, stale (a double
 *   release) or not a context.  Where this release destroys the context, a
 *   CUDA failure (cudaDeviceSynchronize, cudaStreamDestroy,
 *   cuDevicePrimaryCtxRelease): its mapped status (see Releases at the
 *   top).  After shutdown and in a forked child: CUSAFE_SUCCESS, nothing
 *   done.
 * Ownership: the caller owns one reference less; children keep the context
 *   alive (not its handle).
 * Handles: NULL: CUSAFE_SUCCESS, nothing done; others as every call.
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_context_release(cusafe_context ctx);
/* Tells which device a context stands for.
 * Parameters: out [out] the device ordinal; ctx [in] the context.
 * Returns: CUSAFE_SUCCESS: *out is the context's device ordinal.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: ctx is NULL, forged, stale or not a
 *   context.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown /
 *   in a forked child.  *out is -1 (no device) on failure.
 * Ownership: nothing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_context_get_device(int *out,
                                                   cusafe_context ctx);
/* Waits until all work on the context's device has completed, also work
 * queued by other code that shares the device's primary context.
 * Parameters: ctx [in] the context.
 * Returns: CUSAFE_SUCCESS: the device was idle when the call returned.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: ctx is NULL, forged, stale or not a
 *   context.  CUSAFE_ERROR_CAPTURING, before any wait (CUDA would break the
 *   capture): a stream of the context captures ("synchronizing the context
 *   of device 0 cannot be done while one of its streams captures"); a
 *   capture of cusafe's whose end failed may still run on one of them and
 *   cannot be ended (one that can is ended first); or
 *   nothing may touch a stream of it that other code can reach -- a
 *   wrapper, or a stream handed out by cusafe_stream_interop_handle() --
 *   because other code captures it, or because it wraps a default stream
 *   while a blocking stream of the device captures ("synchronizing the
 *   context of device 0 cannot be done: stream 0x... is being captured by
 *   other code"; see "Streams that nothing may touch for a while").  A
 *   capture of other code's on a stream that cusafe does not know is not
 *   seen: CUDA answers, and breaks it.  A CUDA failure
 *   (cudaDeviceSynchronize; after a kernel fault, CUSAFE_ERROR_CUDA): its
 *   mapped status.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after
 *   shutdown / in a forked child.
 * Ownership: nothing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; blocks the calling thread only. */
CUSAFE_API cusafe_status cusafe_context_synchronize(cusafe_context ctx);
/* Tells the range of stream priorities of the context's device.
 * Parameters: least [out] the lowest priority (usually 0); greatest [out]
 *   the highest (a negative number; lower numbers mean higher priority);
 *   ctx [in] the context.
 * Returns: CUSAFE_SUCCESS: *least and *greatest are set.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: least or greatest is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: ctx is NULL, forged, stale or not a
 *   context.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown /
 *   in a forked child.  Both outputs are left unchanged on failure.
 * Ownership: nothing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_context_stream_priority_range(
    int *least, int *greatest, cusafe_context ctx);

/* ------------------------------------------------------------------------ */
/* Streams                                                                    */
/* ------------------------------------------------------------------------ */

/* Stream creation flags. */
#define CUSAFE_STREAM_NON_BLOCKING 0x1u /* no implicit sync with stream 0 */

/* Creates a stream in ctx.
 * Parameters: out [out] the new stream; ctx [in] its context; flags [in] 0
 *   or CUSAFE_STREAM_NON_BLOCKING; priority [in] within
 *   cusafe_context_stream_priority_range() (0 is the default priority).
 * Returns: CUSAFE_SUCCESS: *out is the new stream.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL, flags has other bits, or
 *   priority is outside the device's range.  CUSAFE_ERROR_INVALID_HANDLE:
 *   ctx is NULL, forged, stale or not a context.
 *   CUSAFE_ERROR_OUT_OF_MEMORY: no host memory, or the handle table is
 *   full.  A CUDA failure (cudaStreamCreateWithPriority): its mapped
 *   status.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown /
 *   in a forked child.  *out is CUSAFE_NULL_HANDLE on every failure.
 * Ownership: the caller owns the one reference of *out, to release; the
 *   stream holds a reference on ctx.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_stream_create(cusafe_stream *out,
                                              cusafe_context ctx,
                                              unsigned int flags, int priority);
/* Adds one reference of the caller to a stream: the typed cusafe_retain().
 * Parameters: stream [in] the stream.
 * Returns: CUSAFE_SUCCESS: stream holds one more reference.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: stream is NULL (also
 *   CUSAFE_STREAM_DEFAULT), forged, stale or not a stream.
 *   CUSAFE_ERROR_OUT_OF_MEMORY: stream has too many references (65535 of
 *   the caller's).  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after
 *   shutdown / in a forked child.
 * Ownership: the caller owns one more reference, to release.
 * Handles: as every call (see the top of this file); NULL is an error here.
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_stream_retain(cusafe_stream stream);
/* Drops one reference of the caller to a stream.  Work already queued
 * still completes; the CUDA stream is destroyed once nothing needs it (a
 * buffer whose latest work was queued on it holds a reference).
 * Parameters: stream [in] the stream; CUSAFE_NULL_HANDLE: no-op.
 * Returns: CUSAFE_SUCCESS: the reference is dropped.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: stream is forged, stale (a double
 *   release) or not a stream.  Where this release destroys the stream, a
 *   CUDA failure (cudaStreamDestroy, or the teardown of the context whose
 *   last reference it held): its mapped status (see Releases at the top).
 *   After shutdown and in a forked child: CUSAFE_SUCCESS, nothing done.
 * Ownership: the caller owns one reference less.
 * Handles: NULL: CUSAFE_SUCCESS, nothing done; others as every call.
 * Threads: thread-safe; see the top for a release racing a launch. */
CUSAFE_API cusafe_status cusafe_stream_release(cusafe_stream stream);
/* Blocks until all work queued on the stream has completed.
 * Parameters: stream [in] the stream (not CUSAFE_STREAM_DEFAULT).
 * Returns: CUSAFE_SUCCESS: the stream's work has completed.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: stream is NULL, forged, stale or not
 *   a stream.  CUSAFE_ERROR_CAPTURING: it captures, or other code captures
 *   it, or it wraps a default stream while a blocking stream of the device
 *   captures (see "Streams that nothing may touch for a while").  A CUDA
 *   failure (cudaStreamSynchronize; after a kernel fault,
 *   CUSAFE_ERROR_CUDA): its mapped status.  CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: after shutdown / in a forked child.
 * Ownership: nothing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_stream_synchronize(cusafe_stream stream);
/* Tells whether all work queued on the stream has completed, without
 * waiting.
 * Parameters: stream [in] the stream (not CUSAFE_STREAM_DEFAULT).
 * Returns: CUSAFE_SUCCESS: all of it has completed.
 * Errors: CUSAFE_ERROR_NOT_READY: work is still pending (not a failure;
 *   the thread's message and CUDA error say so too).
 *   CUSAFE_ERROR_INVALID_HANDLE: stream is NULL, forged, stale or not a
 *   stream.  CUSAFE_ERROR_CAPTURING: as cusafe_stream_synchronize().  A
 *   CUDA failure (cudaStreamQuery): its mapped status.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.
 * Ownership: nothing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_stream_query(cusafe_stream stream);
/* Makes all work queued later on stream wait until the event's last record
 * (at the time of this call) has completed.
 * Parameters: stream [in] the stream that waits (not
 *   CUSAFE_STREAM_DEFAULT); event [in] the event waited for.
 * Returns: CUSAFE_SUCCESS: the wait is queued.
 *   Across captures (see Graphs): a stream outside a capture that waits
 *   for an event recorded in it joins the capture; a capturing stream's
 *   wait for an event recorded outside waits again at each replay (also
 *   a wrapper of a stream that other code captures: see "Captures of
 *   other code").
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: stream or event is NULL, forged,
 *   stale or not of its type.  CUSAFE_ERROR_CONTEXT_MISMATCH: they belong
 *   to different contexts.  CUSAFE_ERROR_CAPTURING: the event was recorded
 *   in another stream's capture than the one this stream takes part in,
 *   or in a capture of cusafe's while other code captures this stream (a
 *   wrapper), or its latest record was in a capture of other code.
 *   CUSAFE_ERROR_INVALID_VALUE: the event's latest record was in a capture
 *   that has ended.  CUSAFE_ERROR_NOT_SUPPORTED: a wrapped device default
 *   stream would join a capture (CUDA cannot capture it).
 *   CUSAFE_ERROR_OUT_OF_MEMORY: no host memory.  A CUDA failure
 *   (cudaStreamWaitEvent, cudaEventCreateWithFlags, cudaEventRecord): its
 *   mapped status.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after
 *   shutdown / in a forked child.
 * Ownership: nothing outside captures; a capture holds the event, and a
 *   stream that joins it.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; a stream that joins a capture first lets the
 *   operations other threads have in progress on it finish, outside.  The
 *   wait and another thread's record of the same event are made one after
 *   the other, never interleaved: "the last record" is the one before or
 *   the one after, never a mix of both. */
CUSAFE_API cusafe_status cusafe_stream_wait_event(cusafe_stream stream,
                                                  cusafe_event event);
/* Hands out the stream's context with a new reference, so that the context
 * handle is usable again even after the caller released its own.
 * Parameters: out [out] the context; stream [in] the stream (not
 *   CUSAFE_STREAM_DEFAULT).
 * Returns: CUSAFE_SUCCESS: *out is the stream's context.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: stream is NULL, forged, stale or not a
 *   stream.  CUSAFE_ERROR_OUT_OF_MEMORY: the context has too many
 *   references (65535 of the caller's).  CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: after shutdown / in a forked child.  *out is
 *   CUSAFE_NULL_HANDLE on every failure.
 * Ownership: the caller owns one more reference of *out, to release.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_stream_get_context(cusafe_context *out,
                                                   cusafe_stream stream);

/* ------------------------------------------------------------------------ */
/* Events                                                                     */
/* ------------------------------------------------------------------------ */

#define CUSAFE_EVENT_DISABLE_TIMING 0x1u /* cheaper; no elapsed time */
#define CUSAFE_EVENT_BLOCKING_SYNC 0x2u  /* synchronize sleeps, not spins */

/* Creates an event in ctx.
 * Parameters: out [out] the new event; ctx [in] its context; flags [in] 0
 *   or a combination of the CUSAFE_EVENT_ flags above.
 * Returns: CUSAFE_SUCCESS: *out is the new event, never recorded.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL, or flags has other bits.
 *   CUSAFE_ERROR_INVALID_HANDLE: ctx is NULL, forged, stale or not a
 *   context.  CUSAFE_ERROR_OUT_OF_MEMORY: no host memory, or the handle
 *   table is full.  A CUDA failure (cudaEventCreateWithFlags): its mapped
 *   status.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown /
 *   in a forked child.  *out is CUSAFE_NULL_HANDLE on every failure.
 * Ownership: the caller owns the one reference of *out, to release; the
 *   event holds a reference on ctx.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_event_create(cusafe_event *out,
                                             cusafe_context ctx,
                                             unsigned int flags);
/* Adds one reference of the caller to an event: the typed cusafe_retain().
 * Parameters: event [in] the event.
 * Returns: CUSAFE_SUCCESS: event holds one more reference.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: event is NULL, forged, stale or not
 *   an event.  CUSAFE_ERROR_OUT_OF_MEMORY: event has too many references
 *   (65535 of the caller's).  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED:
 *   after shutdown / in a forked child.
 * Ownership: the caller owns one more reference, to release.
 * Handles: as every call (see the top of this file); NULL is an error here.
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_event_retain(cusafe_event event);
/* Drops one reference of the caller to an event; the last one destroys it
 * without waiting for its pending record.
 * Parameters: event [in] the event; CUSAFE_NULL_HANDLE: no-op.
 * Returns: CUSAFE_SUCCESS: the reference is dropped.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: event is forged, stale (a double
 *   release) or not an event.  Where this release destroys the event, a
 *   CUDA failure (cudaEventDestroy, or the teardown of the context whose
 *   last reference it held): its mapped status (see Releases at the top).
 *   After shutdown and in a forked child: CUSAFE_SUCCESS, nothing done.
 * Ownership: the caller owns one reference less.
 * Handles: NULL: CUSAFE_SUCCESS, nothing done; others as every call.
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_event_release(cusafe_event event);
/* Records the event at the current end of a stream of its context.
 * Parameters: event [in] the event; stream [in] the stream, or
 *   CUSAFE_STREAM_DEFAULT: the default stream of the event's context.
 * Returns: CUSAFE_SUCCESS: the record is queued; it replaces earlier ones.
 *   On a wrapper of a stream that other code captures, the record is in
 *   that capture: until the event is recorded again, nothing of cusafe's
 *   waits for it (see cusafe_stream_wait_event()).
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: event or stream is forged, stale or
 *   not of its type, or event is NULL.  CUSAFE_ERROR_CONTEXT_MISMATCH: the
 *   stream belongs to another context.  A CUDA failure (cudaEventRecord):
 *   its mapped status.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after
 *   shutdown / in a forked child.
 * Ownership: nothing; the event takes no reference on the stream.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe.  A record into a capture waits while other threads
 *   synchronise with, query or time the same event (CUDA would fail those
 *   on an event last recorded in a capture, and invalidate the capture);
 *   it and another thread's cusafe_stream_wait_event() for the event are
 *   made one after the other. */
CUSAFE_API cusafe_status cusafe_event_record(cusafe_event event,
                                             cusafe_stream stream);
/* Blocks until the work before the event's last record has completed.  An
 * event never recorded completes at once.
 * Parameters: event [in] the event.
 * Returns: CUSAFE_SUCCESS: that work has completed.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: event is NULL, forged, stale or not
 *   an event.  CUSAFE_ERROR_CAPTURING: its latest record was in a capture
 *   still open, or in one of other code.  CUSAFE_ERROR_INVALID_VALUE: its
 *   latest record was in a capture of cusafe's that has ended (what it
 *   stands for runs only in replays).  A CUDA failure (cudaEventSynchronize;
 *   after a kernel fault, CUSAFE_ERROR_CUDA): its mapped status.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.
 * Ownership: nothing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; another thread's record of the event into a
 *   capture waits until this call returns. */
CUSAFE_API cusafe_status cusafe_event_synchronize(cusafe_event event);
/* Tells whether the work before the event's last record has completed,
 * without waiting.
 * Parameters: event [in] the event.
 * Returns: CUSAFE_SUCCESS: it has (or the event was never recorded).
 * Errors: CUSAFE_ERROR_NOT_READY: not yet (not a failure; the thread's
 *   message and CUDA error say so too).  CUSAFE_ERROR_INVALID_HANDLE: event
 *   is NULL, forged, stale or not an event.  CUSAFE_ERROR_CAPTURING /
 *   CUSAFE_ERROR_INVALID_VALUE: as cusafe_event_synchronize().  A CUDA
 *   failure (cudaEventQuery): its mapped status.  CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: after shutdown / in a forked child.
 * Ownership: nothing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_event_query(cusafe_event event);
/* Measures the time between two recorded, completed events of one context.
 * Parameters: ms [out] the time in milliseconds; start [in] the earlier
 *   event; end [in] the later one.
 * Returns: CUSAFE_SUCCESS: *ms is the time from start's last record to
 *   end's.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: ms is NULL, or either event was
 *   created with CUSAFE_EVENT_DISABLE_TIMING.  CUSAFE_ERROR_INVALID_HANDLE:
 *   start or end is NULL, forged, stale or not an event.
 *   CUSAFE_ERROR_CONTEXT_MISMATCH: they belong to different contexts.
 *   CUSAFE_ERROR_CAPTURING / CUSAFE_ERROR_INVALID_VALUE: as
 *   cusafe_event_synchronize(), for either event.
 *   CUSAFE_ERROR_NOT_READY: one of them has not completed yet.  A CUDA
 *   failure (cudaEventElapsedTime): its mapped status; an event never
 *   recorded gives CUSAFE_ERROR_CUDA.  CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: after shutdown / in a forked child.  *ms is set to
 *   0 before anything is checked.
 * Ownership: nothing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_event_elapsed_ms(float *ms, cusafe_event start,
                                                 cusafe_event end);

/* ------------------------------------------------------------------------ */
/* Buffers                                                                    */
/* ------------------------------------------------------------------------ */

/* Zero sizes.  Buffers and views of 0 bytes are legal, as NumPy's, CuPy's
 * and DLPack's empty arrays are, so that callers need not treat n = 0
 * apart.  Such a buffer has no memory behind it (no CUDA call allocates or
 * frees it; its cusafe_buffer_interop_pointer() is NULL, a view's the
 * parent's address plus its offset) but is an object like any other: it
 * holds its references, is checked, and may be passed to launches (as its
 * address).  A write, read, fill or copy of 0 bytes is checked like any
 * other -- its handles, and its offset, which may be the buffer's size
 * (the end) but not beyond -- and then does nothing: it queues no work and
 * orders nothing.  A view of 0 bytes may start at any offset up to its
 * parent's size. */

typedef enum cusafe_memory {
  CUSAFE_MEMORY_DEVICE = 0, /* device memory, from the stream-ordered pool */
  CUSAFE_MEMORY_HOST_PINNED = 1, /* page-locked host memory */
  CUSAFE_MEMORY_MANAGED = 2      /* unified (managed) memory */
} cusafe_memory;

/* Allocates `size` bytes of `kind` memory in ctx.  Device memory comes from
 * the device's stream-ordered pool (cudaMallocAsync) on the context's
 * default stream; pinned memory from cudaMallocHost, managed memory from
 * cudaMallocManaged.  Contents are undefined until written.  A buffer of 0
 * bytes is legal, as NumPy's and DLPack's empty arrays are: no memory and
 * no CUDA call behind it, its cusafe_buffer_interop_pointer() is NULL, and
 * every operation on it is a checked no-op (see "Zero sizes" below).
 * Parameters: out [out] the new buffer; ctx [in] its context; kind [in] a
 *   cusafe_memory; size [in] bytes, 0 or more.
 * Returns: CUSAFE_SUCCESS: *out is the new buffer.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL, or kind is unknown.
 *   CUSAFE_ERROR_INVALID_HANDLE: ctx is NULL, forged, stale or not a
 *   context.  CUSAFE_ERROR_OUT_OF_MEMORY: device or managed memory of more
 *   than the device's total memory, no host memory, or the handle table is
 *   full.
 *   CUSAFE_ERROR_NOT_SUPPORTED: managed memory on a device without it.  A
 *   CUDA failure (cudaMallocAsync, cudaMallocHost, cudaMallocManaged; most
 *   often CUSAFE_ERROR_OUT_OF_MEMORY): its mapped status.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.  *out is CUSAFE_NULL_HANDLE on every failure.
 * Ownership: the caller owns the one reference of *out, to release; the
 *   buffer holds a reference on ctx.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_buffer_alloc(cusafe_buffer *out,
                                             cusafe_context ctx,
                                             cusafe_memory kind, size_t size);
/* Allocates `size` bytes of device memory ordered on `stream` (from its
 * context's pool): later work on any stream that uses the buffer is ordered
 * after the allocation.
 * Parameters: out [out] the new buffer; stream [in] the stream (not
 *   CUSAFE_STREAM_DEFAULT: use cusafe_buffer_alloc() for the default
 *   stream); size [in] bytes, 0 or more (0: no memory, as
 *   cusafe_buffer_alloc()).
 * Returns: CUSAFE_SUCCESS: *out is the new buffer, of the stream's context.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: stream is NULL, forged, stale or not a
 *   stream.  CUSAFE_ERROR_OUT_OF_MEMORY: more than the device's total
 *   memory, no host memory, or the handle table is full.  A CUDA failure
 *   (cudaMallocAsync): its mapped status.  CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: after shutdown / in a forked child.  *out is
 *   CUSAFE_NULL_HANDLE on every failure.
 * Ownership: the caller owns the one reference of *out, to release; the
 *   buffer holds a reference on the stream's context, and on the stream
 *   until its work moves to another stream or its memory is freed.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_buffer_alloc_async(cusafe_buffer *out,
                                                   cusafe_stream stream,
                                                   size_t size);
/* Creates a view: a buffer handle for bytes [offset, offset + size) of
 * `parent` (a buffer or another view), usable wherever a buffer is.  The
 * memory lives as long as any view of it.
 * Parameters: out [out] the new view; parent [in] a buffer or view;
 *   offset [in] bytes into parent, at most its size; size [in] bytes, 0 or
 *   more (a view of 0 bytes, at any offset up to the parent's size, is
 *   legal: see "Zero sizes" below).
 * Returns: CUSAFE_SUCCESS: *out is the new view, of parent's memory kind
 *   and context.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: parent is NULL, forged, stale or not a
 *   buffer.  CUSAFE_ERROR_OUT_OF_RANGE: offset + size is beyond parent, or
 *   overflows.  CUSAFE_ERROR_OUT_OF_MEMORY: no host memory, or the handle
 *   table is full.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after
 *   shutdown / in a forked child.  *out is CUSAFE_NULL_HANDLE on every
 *   failure.
 * Ownership: the caller owns the one reference of *out, to release; the
 *   view holds a reference on parent, which the caller may release.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_buffer_view(cusafe_buffer *out,
                                            cusafe_buffer parent, size_t offset,
                                            size_t size);

/* The function through which cusafe gives memory it wrapped back to its
 * owner (cusafe_buffer_wrap): called once, with the user data given. */
typedef void (*cusafe_release_fn)(void *user);

/* Wraps memory that cusafe did not allocate -- device, pinned or managed
 * memory of another library, at an address -- as a buffer of ctx: views,
 * copies, fills, transfers and launches work on it as on cusafe's own.
 * When its last reference is gone (also a view's, and queued work's),
 * cusafe waits for the work queued on it and calls release(user), once:
 * the memory is its owner's to free then.  If cusafe shuts down first
 * (cusafe_shutdown(), process exit), release runs during the ordered
 * shutdown, before the CUDA runtime's teardown, and never again.
 * Before wrapping, cusafe asks CUDA what the memory is
 * (cudaPointerGetAttributes) and how far its allocation reaches
 * (cuMemGetAddressRange, where the driver has it).
 * Parameters: out [out] the new buffer; ctx [in] its context; kind [in]
 *   what the memory is: CUSAFE_MEMORY_DEVICE (of ctx's device),
 *   CUSAFE_MEMORY_HOST_PINNED or CUSAFE_MEMORY_MANAGED; ptr [in] its first
 *   byte (NULL allowed when size is 0); size [in] bytes, 0 or more;
 *   release [in] the function to call, or NULL for none (the caller then
 *   keeps the memory valid by other means until the buffer is gone);
 *   user [in] its argument.
 * Returns: CUSAFE_SUCCESS: *out is the new buffer.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL, ptr is NULL while size
 *   is not 0, kind is unknown, or the memory is of another kind ("memory at
 *   0x... is host memory unknown to CUDA, not device memory").
 *   CUSAFE_ERROR_INVALID_HANDLE: ctx is NULL, forged, stale or not a
 *   context.  CUSAFE_ERROR_CONTEXT_MISMATCH: device memory of another
 *   device.  CUSAFE_ERROR_OUT_OF_RANGE: [ptr, ptr + size) goes beyond the
 *   allocation ("wrap of 96 bytes at offset 0 exceeds the allocation of 64
 *   bytes at 0x...").  CUSAFE_ERROR_OUT_OF_MEMORY: no host memory, or the
 *   handle table is full.  A CUDA failure (cudaPointerGetAttributes,
 *   cuMemGetAddressRange, cudaSetDevice): its mapped status.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.  *out is CUSAFE_NULL_HANDLE on every failure, and then
 *   release is not called: the memory stays the caller's.
 * Ownership: the caller owns the one reference of *out, to release; the
 *   buffer holds a reference on ctx.  The memory stays its owner's, who
 *   must not free it before release is called.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe.  release runs once, on the thread that drops the
 *   last reference (in a release, or in any call whose work let go of the
 *   buffer) or that shuts cusafe down, with no lock of cusafe's held: it
 *   may call cusafe (after shutdown, calls fail and releases do nothing).
 *   The release of the last reference waits for the buffer's queued work,
 *   as that of pinned and managed memory does. */
CUSAFE_API cusafe_status cusafe_buffer_wrap(
    cusafe_buffer *out, cusafe_context ctx, cusafe_memory kind, void *ptr,
    size_t size, cusafe_release_fn release, void *user);
/* Adds one reference of the caller to a buffer or view: the typed
 * cusafe_retain().
 * Parameters: buffer [in] the buffer or view.
 * Returns: CUSAFE_SUCCESS: buffer holds one more reference.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: buffer is NULL, forged, stale or not
 *   a buffer.  CUSAFE_ERROR_OUT_OF_MEMORY: buffer has too many references
 *   (65535 of the caller's).  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED:
 *   after shutdown / in a forked child.
 * Ownership: the caller owns one more reference, to release.
 * Handles: as every call (see the top of this file); NULL is an error here.
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_buffer_retain(cusafe_buffer buffer);
/* Drops one reference of the caller to a buffer or view.  When the
 * caller's last one goes the handle is stale at once; when its views are
 * gone too, the memory is freed after all work already queued on it:
 * device memory stream-ordered, without waiting; pinned and managed memory
 * once the stream of its latest work is idle, which the release waits for.
 * Parameters: buffer [in] the buffer or view; CUSAFE_NULL_HANDLE: no-op.
 * Returns: CUSAFE_SUCCESS: the reference is dropped.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: buffer is forged, stale (a double
 *   release) or not a buffer.  Where this release destroys the buffer, a
 *   CUDA failure of the free (cudaFreeAsync, when the cudaFree tried after
 *   it fails too; cudaStreamSynchronize, cudaFreeHost or cudaFree for
 *   pinned and managed memory) or of the teardown of a parent, stream or
 *   context whose last reference it held: its mapped status (see Releases
 *   at the top).  After shutdown and in a forked child: CUSAFE_SUCCESS,
 *   nothing done.
 * Ownership: the caller owns one reference less.
 * Handles: NULL: CUSAFE_SUCCESS, nothing done; others as every call.
 * Threads: thread-safe; see the top for a release racing a launch. */
CUSAFE_API cusafe_status cusafe_buffer_release(cusafe_buffer buffer);
/* Tells the size of a buffer or view.
 * Parameters: out [out] the size in bytes; buffer [in] the buffer or view.
 * Returns: CUSAFE_SUCCESS: *out is its size.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: buffer is NULL, forged, stale or not a
 *   buffer.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown /
 *   in a forked child.  *out is 0 on failure.
 * Ownership: nothing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_buffer_get_size(size_t *out,
                                                cusafe_buffer buffer);
/* Tells the memory kind of a buffer or view.
 * Parameters: out [out] the kind; buffer [in] the buffer or view.
 * Returns: CUSAFE_SUCCESS: *out is its kind.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: buffer is NULL, forged, stale or not a
 *   buffer.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown /
 *   in a forked child.  *out is (cusafe_memory)-1, no kind, on failure.
 * Ownership: nothing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_buffer_get_memory(cusafe_memory *out,
                                                  cusafe_buffer buffer);
/* Hands out the context of a buffer or view with a new reference, so that
 * the context handle is usable again even after the caller released its
 * own.
 * Parameters: out [out] the context; buffer [in] the buffer or view.
 * Returns: CUSAFE_SUCCESS: *out is the buffer's context.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: buffer is NULL, forged, stale or not a
 *   buffer.  CUSAFE_ERROR_OUT_OF_MEMORY: the context has too many
 *   references (65535 of the caller's).  CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: after shutdown / in a forked child.  *out is
 *   CUSAFE_NULL_HANDLE on every failure.
 * Ownership: the caller owns one more reference of *out, to release.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_buffer_get_context(cusafe_context *out,
                                                   cusafe_buffer buffer);

/* Ordering.  cusafe orders every operation on a buffer after the previous
 * operation on the same memory, also across streams: work on the stream
 * last used costs nothing extra; moving to another stream makes it wait for
 * the previous one (an event record and a stream wait).  The synchronous
 * cusafe_buffer_write() and cusafe_buffer_read() therefore see the results
 * of all work queued before them on any stream.  Operations on one buffer
 * from several threads are ordered as they reach the buffer.
 *
 * In the transfers below, a size of 0 is checked like any other (offset may
 * equal the buffer's size) and then does nothing.  Their CUDA failures
 * include those of the event record and stream wait
 * (cudaEventCreateWithFlags, cudaEventRecord, cudaStreamWaitEvent) that
 * order a buffer's work after its previous work on another stream. */

/* Copies `size` bytes from host memory `src` to the buffer at `offset` and
 * returns when the copy is complete.  It runs on the default stream of the
 * buffer's context, after all earlier work on the buffer.
 * Parameters: buffer [in] the buffer or view written; offset [in] bytes
 *   into it; src [in] host memory, NULL allowed when size is 0; size [in]
 *   bytes.
 * Returns: CUSAFE_SUCCESS: the bytes are in the buffer.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: buffer is NULL, forged, stale or not
 *   a buffer.  CUSAFE_ERROR_INVALID_VALUE: src is NULL and size is not 0.
 *   CUSAFE_ERROR_OUT_OF_RANGE: offset + size is beyond the buffer, or
 *   overflows.  A CUDA failure (cudaMemcpyAsync, cudaStreamSynchronize;
 *   after a kernel fault, CUSAFE_ERROR_CUDA): its mapped status.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.
 * Ownership: nothing changes; src stays the caller's.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; see "Ordering" above. */
CUSAFE_API cusafe_status cusafe_buffer_write(cusafe_buffer buffer,
                                             size_t offset, const void *src,
                                             size_t size);
/* Copies `size` bytes of the buffer at `offset` into host memory `dst` and
 * returns when the copy is complete.  It runs on the default stream of the
 * buffer's context, after all earlier work on the buffer.
 * Parameters: buffer [in] the buffer or view read; offset [in] bytes into
 *   it; dst [out] host memory, NULL allowed when size is 0; size [in] bytes.
 * Returns: CUSAFE_SUCCESS: dst holds the bytes.
 * Errors: as cusafe_buffer_write(), with dst for src:
 *   CUSAFE_ERROR_INVALID_HANDLE (buffer), CUSAFE_ERROR_INVALID_VALUE (dst
 *   NULL, size not 0), CUSAFE_ERROR_OUT_OF_RANGE, a CUDA failure
 *   (cudaMemcpyAsync, cudaStreamSynchronize): its mapped status,
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED.
 * Ownership: nothing changes; dst stays the caller's.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; see "Ordering" above. */
CUSAFE_API cusafe_status cusafe_buffer_read(cusafe_buffer buffer, size_t offset,
                                            void *dst, size_t size);
/* The stream-ordered form of cusafe_buffer_write(): queues the copy of
 * `size` bytes from host memory `src` to the buffer at `offset` on
 * `stream`, after all earlier work on the buffer, and returns.  The host
 * memory must stay valid until the stream has passed the copy (pageable
 * memory is staged, so for it the call returns once `src` may be reused).
 * Parameters: buffer [in] the buffer or view; offset [in] bytes into it;
 *   src [in] host memory, NULL allowed when size is 0; size [in] bytes;
 *   stream [in] a stream of the buffer's context, or
 *   CUSAFE_STREAM_DEFAULT: that context's default stream.
 * Returns: CUSAFE_SUCCESS: the copy is queued.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: buffer is NULL, forged, stale or not
 *   a buffer; stream is forged, stale or not a stream.
 *   CUSAFE_ERROR_INVALID_VALUE: src is NULL and size is not 0.
 *   CUSAFE_ERROR_OUT_OF_RANGE: offset + size is beyond the buffer, or
 *   overflows.  CUSAFE_ERROR_CONTEXT_MISMATCH: stream belongs to another
 *   context.  A CUDA failure (cudaMemcpyAsync): its mapped status.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.
 * Ownership: the buffer's memory stays alive until the copy has run; the
 *   host memory stays the caller's, and cusafe does not keep it alive.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; see "Ordering" above. */
CUSAFE_API cusafe_status cusafe_buffer_write_async(cusafe_buffer buffer,
                                                   size_t offset,
                                                   const void *src, size_t size,
                                                   cusafe_stream stream);
/* The stream-ordered form of cusafe_buffer_read(): queues the copy of
 * `size` bytes of the buffer at `offset` into host memory `dst` on
 * `stream`, after all earlier work on the buffer, and returns.  dst must
 * stay valid until the stream has passed the copy (for pageable memory the
 * call returns once dst is filled).
 * Parameters: buffer [in] the buffer or view; offset [in] bytes into it;
 *   dst [out] host memory, NULL allowed when size is 0; size [in] bytes;
 *   stream [in] a stream of the buffer's context, or
 *   CUSAFE_STREAM_DEFAULT: that context's default stream.
 * Returns: CUSAFE_SUCCESS: the copy is queued.
 * Errors: as cusafe_buffer_write_async(), with dst for src:
 *   CUSAFE_ERROR_INVALID_HANDLE (buffer, stream), CUSAFE_ERROR_INVALID_VALUE
 *   (dst NULL, size not 0), CUSAFE_ERROR_OUT_OF_RANGE,
 *   CUSAFE_ERROR_CONTEXT_MISMATCH, a CUDA failure (cudaMemcpyAsync): its
 *   mapped status, CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED.
 * Ownership: the buffer's memory stays alive until the copy has run; dst
 *   stays the caller's, and cusafe does not keep it alive.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; see "Ordering" above. */
CUSAFE_API cusafe_status cusafe_buffer_read_async(cusafe_buffer buffer,
                                                  size_t offset, void *dst,
                                                  size_t size,
                                                  cusafe_stream stream);
/* Copies `size` bytes from src at src_offset to dst at dst_offset, ordered on
 * `stream`, after all earlier work on both buffers.  The buffers may belong
 * to different devices (a peer copy between device memory of two devices).
 * The first peer copy between two devices lets each reach the other's
 * memory where the hardware allows it (cudaDeviceEnablePeerAccess, and
 * cudaMemPoolSetAccess on the device's current memory pool, from which
 * cusafe allocates), once per pair for the life of their primary
 * contexts, so that peer copies go device to device; where it does not,
 * CUDA stages them through the host.  That access is the primary
 * context's, shared with other libraries that use it.  Where the copy has
 * to run on the other device (device memory of one device and
 * host-accessible memory of another), cusafe runs it on that device's
 * default stream, ordered after the work already on `stream` and
 * before any work queued on `stream` later.
 * Parameters: dst [in] the buffer or view written; dst_offset [in] bytes
 *   into it; src [in] the buffer or view read; src_offset [in] bytes into
 *   it; size [in] bytes; stream [in] a stream of the context of dst or of
 *   src, or CUSAFE_STREAM_DEFAULT: the default stream of dst's context.
 * Returns: CUSAFE_SUCCESS: the copy is queued.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: dst or src is NULL, forged, stale or
 *   not a buffer; stream is forged, stale or not a stream.
 *   CUSAFE_ERROR_OUT_OF_RANGE: a range is beyond its buffer, or overflows.
 *   CUSAFE_ERROR_INVALID_VALUE: the ranges overlap within one allocation.
 *   CUSAFE_ERROR_CONTEXT_MISMATCH: stream belongs to neither buffer's
 *   context.  A CUDA failure (cudaMemcpyAsync, cudaMemcpyPeerAsync,
 *   cudaGetDevice): its mapped status; a failure to enable peer access is
 *   none (the copy is staged).  CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: after shutdown / in a forked child.
 * Ownership: both buffers' memory stays alive until the copy has run.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; see "Ordering" above. */
CUSAFE_API cusafe_status cusafe_buffer_copy(cusafe_buffer dst,
                                            size_t dst_offset,
                                            cusafe_buffer src,
                                            size_t src_offset, size_t size,
                                            cusafe_stream stream);
/* Sets `size` bytes at `offset` to `value`, ordered on `stream`, after all
 * earlier work on the buffer.
 * Parameters: buffer [in] the buffer or view; offset [in] bytes into it;
 *   size [in] bytes; value [in] the byte; stream [in] a stream of the
 *   buffer's context, or CUSAFE_STREAM_DEFAULT: its default stream.
 * Returns: CUSAFE_SUCCESS: the fill is queued.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: buffer is NULL, forged, stale or not
 *   a buffer; stream is forged, stale or not a stream.
 *   CUSAFE_ERROR_OUT_OF_RANGE: offset + size is beyond the buffer, or
 *   overflows.  CUSAFE_ERROR_CONTEXT_MISMATCH: stream belongs to another
 *   context.  A CUDA failure (cudaMemsetAsync): its mapped status.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.
 * Ownership: the buffer's memory stays alive until the fill has run.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; see "Ordering" above. */
CUSAFE_API cusafe_status cusafe_buffer_fill(cusafe_buffer buffer, size_t offset,
                                            size_t size, unsigned char value,
                                            cusafe_stream stream);

/* ------------------------------------------------------------------------ */
/* Between processes                                                          */
/* ------------------------------------------------------------------------ */

/* Device memory that other processes can map: it lives while any process
 * maps it.  The exporter may release its buffer, exit or be killed while an
 * importer still reads and writes the memory, and an importer's release
 * frees nothing of anyone else's.  The memory is CUDA's virtual memory
 * management (cuMemCreate, shared as a POSIX file descriptor), mapped for
 * its device only; what travels to the other process is a descriptor,
 * cusafe_ipc_desc, and its file descriptor (over a Unix domain socket:
 * cusafe_ipc_send(), cusafe_ipc_recv()).  What does not survive: work that
 * a killed process had queued and not finished (its results are whatever
 * the GPU wrote before the kill), and the memory's contents once no
 * process maps it any more.  Being mapped for its own device only, the
 * memory is not made accessible to other devices: a copy between it and
 * another device's memory is CUDA's to do or to refuse (with its error). */

/* The version of struct cusafe_ipc_desc this header describes. */
#define CUSAFE_IPC_VERSION 1u

/* What another process needs to map a shareable buffer (or a view of
 * one): plain data, 80 bytes, safe to copy and send; fd is a file
 * descriptor of the process that holds the desc. */
typedef struct cusafe_ipc_desc {
  uint32_t version;        /* CUSAFE_IPC_VERSION */
  int32_t fd;              /* the memory's file descriptor */
  uint64_t allocation;     /* bytes of the whole shareable allocation */
  uint64_t offset;         /* where the buffer begins in it */
  uint64_t size;           /* the buffer's bytes */
  uint8_t device_uuid[16]; /* the device's UUID (cudaDeviceProp::uuid) */
  uint64_t process;        /* the exporting process, as cusafe names it */
  uint64_t reserved[3];    /* 0 */
} cusafe_ipc_desc;

/* Allocates device memory that other processes can map
 * (cusafe_buffer_export()): a buffer like any other of ctx.  Its memory
 * is rounded up to the device's granularity (2 MiB on current GPUs); the
 * buffer has the size asked for.
 * Parameters: out [out] the new buffer; ctx [in] its context; size [in]
 *   bytes, 1 or more.
 * Returns: CUSAFE_SUCCESS: *out is a new buffer of size bytes.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.
 *   CUSAFE_ERROR_INVALID_SIZE: size is 0, or too large to round up.
 *   CUSAFE_ERROR_INVALID_HANDLE: ctx is NULL, forged, stale or not a
 *   context.  CUSAFE_ERROR_NOT_SUPPORTED: the driver lacks virtual memory
 *   management.
 *   CUSAFE_ERROR_NO_DRIVER: the look-up of those calls of the driver
 *   failed ("no CUDA driver found: ...").  CUSAFE_ERROR_OUT_OF_MEMORY: no
 *   device or host memory.  A CUDA failure
 *   (cuMemGetAllocationGranularity, cuMemCreate, cuMemAddressReserve,
 *   cuMemMap, cuMemSetAccess): its mapped status; nothing is left behind.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.  *out is CUSAFE_NULL_HANDLE on every failure.
 * Ownership: the caller owns the one reference of *out; the buffer holds
 *   a reference on ctx.  The release of its last reference waits for the
 *   work queued on it, then unmaps the memory, which lives on while other
 *   processes map it.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_buffer_alloc_shareable(cusafe_buffer *out,
                                                       cusafe_context ctx,
                                                       size_t size);
/* Describes a shareable buffer (of cusafe_buffer_alloc_shareable() or
 * cusafe_buffer_import(), or a view of one) for another process, after
 * waiting for the work queued on it so far on any stream: what the
 * importer reads is what that work wrote.  An imported buffer is exported
 * again with a copy of the descriptor it came by (CUDA does not export
 * imported memory), so memory can be passed on from process to process.
 * Parameters: out [out] the description, whose fd is a new file
 *   descriptor of the calling process (close-on-exec), the caller's to
 *   close once sent; buffer [in] the buffer or view.
 * Returns: CUSAFE_SUCCESS: *out describes the buffer.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL; the buffer's memory is
 *   not shareable ("buffer 0x... is not shareable: allocate it with
 *   cusafe_buffer_alloc_shareable").  CUSAFE_ERROR_INVALID_HANDLE: buffer
 *   is NULL, forged, stale or not a buffer.  A failure of the wait (a
 *   fault of the work queued on the buffer) or of
 *   cuMemExportToShareableHandle: its mapped status.
 *   CUSAFE_ERROR_OUT_OF_MEMORY: no descriptor left for the copy of an
 *   imported buffer's ("cannot copy the descriptor of imported memory:
 *   Too many open files").  A buffer whose
 *   latest work is in a capture that other code began, on a stream that
 *   nothing may touch now: the error of cusafe_stream_use_buffers().
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.  out->fd is -1 on every failure, and no descriptor is
 *   left open.
 * Ownership: the buffer stays the caller's; the memory lives while any
 *   process maps it, whoever exported it.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; work queued on the buffer by other threads during
 *   the call may or may not be waited for. */
CUSAFE_API cusafe_status cusafe_buffer_export(cusafe_ipc_desc *out,
                                              cusafe_buffer buffer);
/* Maps the memory that another process described with
 * cusafe_buffer_export() as a buffer of ctx, of desc->size bytes.
 * Parameters: out [out] the new buffer; ctx [in] the context of the
 *   device the memory is on; desc [in] the description, whose fd is a
 *   descriptor of the calling process (received with cusafe_ipc_recv(),
 *   say); it stays the caller's to close, which it may do at once.
 * Returns: CUSAFE_SUCCESS: *out is a buffer of the shared memory.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out or desc is NULL; desc->version
 *   is not CUSAFE_IPC_VERSION; a reserved word is not 0; desc->fd is not
 *   an open descriptor, or one of no shareable CUDA memory
 *   ("cuMemImportFromShareableHandle failed: invalid argument (the fd of
 *   desc is no shareable CUDA memory)"); desc was
 *   exported by this very process ("buffer exported by this process: use
 *   the buffer itself").  CUSAFE_ERROR_OUT_OF_RANGE: offset and size reach
 *   beyond the allocation.  CUSAFE_ERROR_CONTEXT_MISMATCH: the memory is
 *   on another device than ctx's (by UUID).  CUSAFE_ERROR_INVALID_HANDLE:
 *   ctx is NULL, forged, stale or not a context.
 *   CUSAFE_ERROR_NOT_SUPPORTED, CUSAFE_ERROR_NO_DRIVER: as
 *   cusafe_buffer_alloc_shareable().
 *   CUSAFE_ERROR_OUT_OF_MEMORY: no host memory, or no descriptor left for
 *   the copy of desc->fd that the buffer keeps for its exports ("cannot
 *   keep a copy of desc's fd 5: Too many open files").  A CUDA failure
 *   (cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap,
 *   cuMemSetAccess): its mapped status; nothing is left behind.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.  *out is CUSAFE_NULL_HANDLE on every failure.
 * Ownership: the caller owns the one reference of *out; the buffer holds
 *   a reference on ctx, and a copy of desc->fd until its release, which
 *   unmaps this process's mapping only.  The copy is closed by an exec
 *   (close-on-exec) and, in a child forked without exec, by the fork: such
 *   a child cannot use the buffer, and does not keep its memory.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_buffer_import(cusafe_buffer *out,
                                              cusafe_context ctx,
                                              const cusafe_ipc_desc *desc);
/* Finds the device, among those this process sees, that holds the memory
 * a description names (by UUID): the device whose context
 * cusafe_buffer_import() takes.  Ordinals differ between processes (
 * CUDA_VISIBLE_DEVICES); UUIDs do not.
 * Parameters: out [out] the device's ordinal; desc [in] the description
 *   (its fd is not read).
 * Returns: CUSAFE_SUCCESS: *out is the device.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out or desc is NULL; desc->version
 *   is not CUSAFE_IPC_VERSION.  CUSAFE_ERROR_INVALID_DEVICE: no device of
 *   this process has the UUID ("the memory is on device GPU-..., which
 *   this process does not see").  CUSAFE_ERROR_NO_DRIVER,
 *   CUSAFE_ERROR_NO_DEVICE, a CUDA failure (cudaGetDeviceCount,
 *   cudaGetDeviceProperties): as cusafe_device_get_properties().
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.  *out is -1 on every failure.
 * Ownership: nothing is kept.
 * Handles: none.
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_ipc_device(int *out,
                                           const cusafe_ipc_desc *desc);
/* Sends a description and its file descriptor over a connected Unix
 * domain socket (SCM_RIGHTS), in one message; desc->fd stays the
 * caller's to close.
 * Parameters: socket [in] a connected AF_UNIX socket; desc [in] the
 *   description.
 * Returns: CUSAFE_SUCCESS: sent.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: desc is NULL, of another version,
 *   or its fd is negative or not open; socket is no AF_UNIX socket, or
 *   sending fails
 *   ("cannot send on socket 5: Broken pipe").  CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: after shutdown / in a forked child.
 * Ownership: nothing is kept.
 * Handles: none.
 * Threads: thread-safe; a socket shared between threads needs the
 *   caller's own ordering. */
CUSAFE_API cusafe_status cusafe_ipc_send(int socket,
                                         const cusafe_ipc_desc *desc);
/* Receives a description and its file descriptor sent with
 * cusafe_ipc_send().
 * Parameters: socket [in] a connected AF_UNIX socket; out [out] the
 *   description, whose fd is a new descriptor of the calling process
 *   (close-on-exec), the caller's to close.
 * Returns: CUSAFE_SUCCESS: *out is the description.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL; receiving fails, the
 *   peer closed the socket ("socket 5 closed by its peer"), or the message
 *   is not one of cusafe_ipc_send() (no descriptor, or a short or foreign
 *   message); any descriptor received with it is closed.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.  out->fd is -1 on every failure.
 * Ownership: the caller owns out->fd.
 * Handles: none.
 * Threads: thread-safe, as cusafe_ipc_send(). */
CUSAFE_API cusafe_status cusafe_ipc_recv(int socket, cusafe_ipc_desc *out);

/* ------------------------------------------------------------------------ */
/* Interop (NCCL, CUDA-aware MPI, other CUDA libraries)                       */
/* ------------------------------------------------------------------------ */

/* Gives the raw address of the first byte of a buffer or view: a device
 * address; for pinned memory the host address, which the device can use
 * too.
 * Parameters: out [out] the address; buffer [in] the buffer or view.
 * Returns: CUSAFE_SUCCESS: *out is the address.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: buffer is NULL, forged, stale or not a
 *   buffer.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown /
 *   in a forked child.  *out is NULL on every failure.
 * Ownership: cusafe keeps ownership: the address is valid while the caller
 *   holds a reference on the buffer, and work the caller queues through it
 *   is not tracked by cusafe -- synchronise before releasing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_buffer_interop_pointer(void **out,
                                                       cusafe_buffer buffer);
/* Gives the stream's cudaStream_t.
 * Parameters: out [out] the cudaStream_t; stream [in] the stream
 *   (CUSAFE_STREAM_DEFAULT is not a stream here).
 * Returns: CUSAFE_SUCCESS: *out is the stream's cudaStream_t.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: stream is NULL, forged, stale or not a
 *   stream.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown /
 *   in a forked child.  *out is NULL on every failure.
 * Ownership: cusafe keeps ownership: valid while the caller holds a
 *   reference on the stream; never destroy it.  Work queued through it on
 *   cusafe buffers is not tracked.  From now on cusafe looks, where it
 *   matters, whether other code captures the stream, as for a wrapper
 *   (see "Captures of other code").
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_stream_interop_handle(void **out,
                                                      cusafe_stream stream);
/* Wraps a CUDA stream that another library owns (PyTorch's current stream,
 * a stream of CuPy or of the application) as a cusafe stream of ctx, so
 * that cusafe's work orders with that library's: copies, fills, launches
 * and allocations queued on the wrapper go to that stream, the buffers
 * they use are kept alive and freed stream-ordered after it, exactly as on
 * a stream of cusafe's.  cusafe never destroys the stream.
 * Parameters: out [out] the wrapper; ctx [in] the context of the stream's
 *   device; cuda_stream [in] the cudaStream_t, or NULL, cudaStreamLegacy
 *   or cudaStreamPerThread for the device's default streams.
 * Returns: CUSAFE_SUCCESS: *out is a stream usable wherever a stream is.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: ctx is NULL, forged, stale or not a
 *   context.  CUSAFE_ERROR_CONTEXT_MISMATCH: the stream belongs to another
 *   device ("stream 0x... belongs to device 1 but context belongs to
 *   device 0").  CUSAFE_ERROR_INVALID_VALUE: cuda_stream is the CUDA
 *   stream of a cusafe stream whose last reference is being dropped
 *   ("stream 0x... is being destroyed: stream 0x..., which owns it, was
 *   released").  CUSAFE_ERROR_OUT_OF_MEMORY: no host memory, or the handle
 *   table is full.  A CUDA failure (cudaStreamGetDevice, cudaSetDevice):
 *   its mapped status.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after
 *   shutdown / in a forked child.  *out is CUSAFE_NULL_HANDLE on every
 *   failure.
 * Ownership: the caller owns the one reference of *out, to release; the
 *   wrapper holds a reference on ctx.  The stream stays its owner's, who
 *   must keep it valid while the wrapper lives -- until its last reference
 *   is gone, which buffers last used on it hold too (synchronise the
 *   wrapper, or move the buffers' work elsewhere, before destroying the
 *   stream).  Releasing the wrapper destroys only cusafe's bookkeeping.
 *   Where the owner is cusafe -- cuda_stream is the
 *   cusafe_stream_interop_handle() of a stream of cusafe_stream_create(),
 *   handed back by another library (a torch.cuda.ExternalStream over it,
 *   say) -- the wrapper holds that stream, whose CUDA stream then lives
 *   until both are released (the last release of the two destroys it).
 *   Once a stream's CUDA stream is destroyed, its pointer is dead, as
 *   above.
 * Handles: as every call (see the top of this file).  cuda_stream is not
 *   a handle: a pointer that is not a live stream is undefined behaviour,
 *   as in CUDA.
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_stream_wrap(cusafe_stream *out,
                                            cusafe_context ctx,
                                            void *cuda_stream);
/* Records that `stream` reads or writes `buffers` in work that other code
 * queues on it by address (cuBLAS, NCCL, a kernel launched by hand through
 * cusafe_buffer_interop_pointer() and cusafe_stream_interop_handle()).
 * Call it before queueing that work: the stream then waits for the work
 * queued earlier on those buffers on any stream, and from then on the
 * buffers are ordered and kept alive as if a cusafe operation had used them
 * on `stream` -- later work on them waits for the stream, and releasing
 * their last references frees them only after the stream's work.
 * Parameters: stream [in] the stream, or CUSAFE_STREAM_DEFAULT for the
 *   default stream of the first buffer's context; buffers [in] count
 *   buffers or views (repeats allowed), NULL when count is 0; count [in]
 *   their number (0: nothing to record; the stream is still checked).
 * Returns: CUSAFE_SUCCESS: the work is recorded.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: buffers is NULL and count is not.
 *   CUSAFE_ERROR_INVALID_HANDLE: an element of buffers ("buffers 2") or
 *   the stream is NULL, forged, stale or of the wrong type.
 *   CUSAFE_ERROR_CONTEXT_MISMATCH: a buffer belongs to another device than
 *   the stream ("buffers 1 belongs to device 1 but stream belongs to
 *   device 0").  CUSAFE_ERROR_OUT_OF_MEMORY: no host memory.  A CUDA
 *   failure (cudaEventCreateWithFlags, cudaEventRecord,
 *   cudaStreamWaitEvent, cudaSetDevice): its mapped status; buffers before
 *   the failing one may be recorded already.  CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: after shutdown / in a forked child.
 *   A stream that nothing may touch now -- other code captures it, or it
 *   wraps a default stream while a blocking stream of the device captures
 *   (see "Streams that nothing may touch for a while"), also where that
 *   capture begins while the call runs -- is no error: the call records
 *   the stream's work queued before that capture, and the buffers follow
 *   it once the stream can be touched, never freed before it.  Work queued
 *   there during that capture is the capture's, which cusafe does not
 *   order (see "Captures of other code").
 * Ownership: nothing changes hands; the buffers hold a reference on the
 *   stream while their latest work is on it.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_stream_use_buffers(cusafe_stream stream,
                                                   const cusafe_buffer *buffers,
                                                   size_t count);

/* Drops one reference of a Python object (Py_DecRef, with the GIL taken)
 * that a binding gave cusafe as the user data of a wrapped buffer: a
 * cusafe_release_fn for bindings through a foreign-function interface
 * (ctypes: cusafe_buffer_wrap(..., cusafe_python_release, obj) after
 * Py_IncRef(obj)), so that the object, which owns the memory, lives until
 * cusafe gives the memory back.  Python's functions are found in the
 * process; in a process whose interpreter has finalized (cusafe's own exit
 * handler runs after Python's) or that has no Python, it does nothing:
 * the object goes with the process.
 * Parameters: object [in] the PyObject *, or NULL (then nothing).
 * Returns: nothing.
 * Errors: none; never raises, never prints.
 * Ownership: takes the one reference that the binding added for cusafe.
 * Handles: none.
 * Threads: any thread; it takes the GIL itself. */
CUSAFE_API void cusafe_python_release(void *object);

/* ------------------------------------------------------------------------ */
/* Graphs                                                                     */
/* ------------------------------------------------------------------------ */

/* A graph is work captured from streams, replayed by one call.
 * cusafe_stream_begin_capture() makes a stream capture: the cusafe work
 * queued on it -- copies and fills of buffers, transfers from and to pinned
 * memory, kernel launches, event records, waits -- is recorded instead of
 * run; another stream that waits for an event recorded there joins the
 * capture (and must be joined back: the origin waits for an event recorded
 * on it).  cusafe_stream_end_capture() gives a graph, which
 * cusafe_graph_launch() replays on any stream of its context, as often as
 * wanted, each replay ordered after the earlier work on the buffers it
 * uses and before later work on them, like any cusafe operation.
 *
 * Ownership.  A graph holds a reference on every buffer (so its memory,
 * parent and context), kernel (so its module), event and stream its
 * captured work used: releasing any of them, during or after the capture,
 * is legal, and the memory stays valid for every later replay.  Releasing
 * the graph with replays queued is legal: the memory it held is freed
 * stream-ordered after the last replay.  The ordered shutdown ends open
 * captures and destroys graphs after the work that uses them and before
 * the buffers and modules they hold.
 *
 * What a capture refuses, with CUSAFE_ERROR_CAPTURING and a message that
 * names the operation, before any CUDA call (the stream and its capture go
 * on unchanged): synchronizing or querying a capturing stream, or the
 * context of one; an allocation on it (cusafe_buffer_alloc_async); a
 * transfer between it and pageable host memory (a replay would read or
 * write that memory again, long after the call); a copy that runs on
 * another stream than the capturing one; a graph replay onto it; waiting
 * for, querying or timing an event recorded in a capture still open.  Work
 * of other streams and threads goes on as usual meanwhile: cusafe captures
 * in CUDA's relaxed mode and keeps its own bookkeeping out of captures.
 * Work outside the capture on a buffer whose latest work was queued on the
 * capturing stream before the capture (a synchronous read, a fill on
 * another stream) comes after that work and sees the buffer as it left
 * it: the captured work runs only in replays.
 *
 * Captures of other code.  A capture that other code begins (on a stream
 * of cusafe_stream_interop_handle(), or on its own) is not cusafe's:
 * cusafe work queued on its stream meanwhile is captured with nothing to
 * hold what it uses, so keep those buffers, kernels and events alive until
 * that graph is gone.  A stream of cusafe's whose CUDA stream was handed
 * out (cusafe_stream_interop_handle) counts as such a stream from then
 * on.  Work there that must wait for work outside that capture (a
 * buffer's earlier work on another stream), a replay there that must, and
 * a synchronisation or query of the stream fail with
 * CUSAFE_ERROR_CAPTURING, the capture unharmed.  A wait of such a stream
 * for an event recorded outside is captured as a wait at each replay; it
 * cannot join a capture of cusafe's (CUSAFE_ERROR_CAPTURING: CUDA would
 * merge the two).  An
 * event recorded there is in that capture: nothing of cusafe's waits for
 * it, nor is it synchronised with, queried or timed
 * (CUSAFE_ERROR_CAPTURING), until it is recorded again.  Use
 * cusafe_stream_begin_capture() instead wherever you can.
 *
 * Streams that nothing may touch for a while.  While a blocking stream of
 * a device captures, CUDA refuses any use of its legacy default stream
 * (and invalidates that capture); while other code captures a stream, a
 * wait for it would pull the waiting stream into that capture.  So for a
 * wrapper of a default stream then, or of a stream that other code
 * captures (cusafe_stream_wrap), cusafe touches nothing: the release of a
 * buffer last used there, a DLPack deleter whose consumer named it, and
 * cusafe_stream_use_buffers() on it wait, holding what they need, and are
 * done once the stream can be touched -- when a capture of cusafe's ends,
 * or at a later release, DLPack deleter, use_buffers or synchronisation
 * (memory is freed later, never earlier); work on another stream that
 * would have to wait for it, and a DLPack export to it, fail with
 * CUSAFE_ERROR_CAPTURING ("stream 0x... wraps a device's default stream,
 * which CUDA lets nothing wait for while a blocking stream of the device
 * captures", "stream 0x... is being captured by other code: nothing
 * outside that capture can wait for its work"), and the capture goes on
 * unharmed; so do a synchronisation or query of the stream, and on a
 * wrapper of a default stream, an event's record and a wait for an event,
 * and -- while the blocking stream's capture is cusafe's -- any work
 * queued there (a fill, copy, launch, replay or allocation).
 * The frees and waits of a release or of the shutdown run in CUDA's
 * relaxed mode, so they do not break a capture of other code on another
 * stream, also one begun in CUDA's global mode (the default of
 * cudaStreamBeginCapture and of torch.cuda.graph) on another thread --
 * with two exceptions.  The free
 * of device memory is a cudaFreeAsync made in the thread's own mode, as
 * the program's own free would be.  The last release of a module waits
 * for its device to be idle (its kernels may still run), which CUDA allows
 * in no mode while a stream of the device captures: during a capture of
 * cusafe's own, the module's library is unloaded with its context instead;
 * during one of other code, release modules after it ends.  The calls
 * the program makes that CUDA counts as potentially unsafe (allocations,
 * synchronizations, queries, synchronous reads and writes) follow CUDA's
 * rule: made on another thread whose mode is global while a global-mode
 * capture is open, they fail with CUSAFE_ERROR_CUDA
 * (cudaErrorStreamCaptureUnsupported) and invalidate that capture, as the
 * raw calls would.  Such a thread calls
 * cudaThreadExchangeStreamCaptureMode() for cudaStreamCaptureModeRelaxed
 * first, or the other code captures in relaxed or thread-local mode. */

/* Makes a stream capture the cusafe work queued on it, until
 * cusafe_stream_end_capture().
 * Parameters: stream [in] a stream of cusafe_stream_create() or
 *   cusafe_stream_wrap() (not CUSAFE_STREAM_DEFAULT, the context's own).
 * Returns: CUSAFE_SUCCESS: the stream captures.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: stream is NULL, forged, stale or not
 *   a stream, or its last handle was released on another thread while the
 *   capture began ("stream 0x... was released while its capture began":
 *   the capture has ended again, since no handle is left to end it with).
 *   CUSAFE_ERROR_CAPTURING: the stream captures already (also as
 *   a stream that joined another's capture).  CUSAFE_ERROR_NOT_SUPPORTED: a
 *   wrapped device default stream (CUDA cannot capture it).
 *   CUSAFE_ERROR_OUT_OF_MEMORY: no host memory.  A CUDA failure
 *   (cudaEventCreateWithFlags, cudaEventRecord, cudaStreamBeginCapture): its
 *   mapped status; the stream does not capture then.  CUSAFE_ERROR_SHUTDOWN
 *   / CUSAFE_ERROR_FORKED: after shutdown / in a forked child.
 * Ownership: the stream's last release ends the capture, discarding its
 *   work and releasing what it held; the capture holds the streams that
 *   joined it.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; work queued on the stream by any thread is
 *   captured from the moment the call returns.  An operation on the stream
 *   that other threads have in progress when the call begins is finished
 *   first, outside the capture; one that starts meanwhile waits and is
 *   captured.  No operation is ever half captured. */
CUSAFE_API cusafe_status cusafe_stream_begin_capture(cusafe_stream stream);
/* Ends the capture that began on a stream and gives its graph.
 * Parameters: out [out] the new graph; stream [in] the stream the capture
 *   began on.
 * Returns: CUSAFE_SUCCESS: *out is a graph of the captured work (empty if
 *   none was queued); no stream captures any more.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: stream is NULL, forged, stale or not a
 *   stream.  CUSAFE_ERROR_CAPTURING: the stream does not capture, or joined
 *   a capture that began on another stream (which goes on).  A CUDA failure
 *   (cudaStreamEndCapture; cudaErrorStreamCaptureUnjoined when a stream
 *   that joined has work its origin never waited for): its mapped status,
 *   and the capture is over, its work discarded and what it held released.
 *   (Should CUDA fail to end it a second time too, a broken device, say,
 *   its streams may still capture: a record on one of them (an event's,
 *   or one that orders other streams after it) and an allocation on one
 *   end that capture first, or fail with CUSAFE_ERROR_CAPTURING.)
 *   CUSAFE_ERROR_OUT_OF_MEMORY: no host memory (the capture is over).
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.  *out is CUSAFE_NULL_HANDLE on every failure.
 * Ownership: the caller owns the one reference of *out, to release; the
 *   graph holds what the captured work used (see Graphs) and its context.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; any thread may end a capture.  An operation on
 *   the capture's streams that other threads have in progress when the
 *   call begins is finished first and is part of the graph; one that
 *   starts meanwhile waits and runs outside the capture.  Of two threads
 *   that end the same capture, one gets the graph and the other
 *   CUSAFE_ERROR_CAPTURING. */
CUSAFE_API cusafe_status cusafe_stream_end_capture(cusafe_graph *out,
                                                   cusafe_stream stream);
/* Tells whether a stream captures (it began a capture, or joined one).
 * Parameters: out [out] 1 if it captures, else 0; stream [in] the stream.
 * Returns: CUSAFE_SUCCESS: *out says.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: stream is NULL, forged, stale or not a
 *   stream.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown /
 *   in a forked child.  *out is 0 on every failure.
 * Ownership: nothing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; a capture that another thread is beginning or
 *   ending is waited for, but the answer may be out of date at once if
 *   another thread begins or ends one after. */
CUSAFE_API cusafe_status cusafe_stream_is_capturing(int *out,
                                                    cusafe_stream stream);
/* Makes the graph's executable form now, instead of at its first replay.
 * Parameters: graph [in] the graph.
 * Returns: CUSAFE_SUCCESS: the graph is ready to replay (also if it was).
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: graph is NULL, forged, stale or not
 *   a graph.  A CUDA failure (cudaGraphInstantiate): its mapped status.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.
 * Ownership: nothing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_graph_instantiate(cusafe_graph graph);
/* Replays a graph on a stream: its work runs after the earlier work on
 * the buffers it uses, and later work on them runs after it.
 * Parameters: graph [in] the graph; stream [in] a stream of the graph's
 *   context, or CUSAFE_STREAM_DEFAULT for the context's default stream.
 * Returns: CUSAFE_SUCCESS: the replay is queued.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: graph or stream is NULL, forged,
 *   stale or not of its type.  CUSAFE_ERROR_CONTEXT_MISMATCH: the stream
 *   belongs to another context.  CUSAFE_ERROR_CAPTURING: the stream
 *   captures; or other code captures it (a wrapper, or a stream handed
 *   out by cusafe_stream_interop_handle()), or it wraps a default stream
 *   while a blocking stream of the device captures; or a capture of
 *   cusafe's whose end failed may still run there and cannot be ended (one
 *   that can is ended first, as before any work).  A CUDA
 *   failure (cudaGraphInstantiate at the first replay,
 *   cudaEventRecord, cudaStreamWaitEvent, cudaGraphLaunch): its mapped
 *   status.  CUSAFE_ERROR_OUT_OF_MEMORY: no host memory.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.
 * Ownership: the replay keeps the graph's memory alive until it completes,
 *   also if the graph is released first.  A graph whose work records or
 *   waits for events holds each stream it was replayed on until it goes
 *   (see cusafe_graph_release()).
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; replays of one graph run one after another, in the
 *   order they were queued, whatever their streams (CUDA serialises
 *   them). */
CUSAFE_API cusafe_status cusafe_graph_launch(cusafe_graph graph,
                                             cusafe_stream stream);
/* Adds one reference of the caller to a graph.
 * Parameters: graph [in] the graph.
 * Returns: CUSAFE_SUCCESS: the graph holds one more reference.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: graph is NULL, forged, stale or not
 *   a graph.  CUSAFE_ERROR_OUT_OF_MEMORY: too many references (65535 of the
 *   caller's).  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown
 *   / in a forked child.
 * Ownership: the caller owns one more reference, to release.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_graph_retain(cusafe_graph graph);
/* Drops one reference of the caller to a graph; the last destroys it and
 * releases what it held, stream-ordered after its queued replays.  A
 * graph whose work records or waits for events first waits on the host
 * for the replays it queued (an event's destruction is not
 * stream-ordered).
 * Parameters: graph [in] the graph; CUSAFE_NULL_HANDLE: no-op.
 * Returns: CUSAFE_SUCCESS: the reference is dropped.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: graph is forged, stale (a double
 *   release) or not a graph.  A CUDA failure of the teardown
 *   (cudaGraphExecDestroy, cudaGraphDestroy, cudaStreamSynchronize): its
 *   mapped status; the graph is gone all the same.  After shutdown and in
 *   a forked child: CUSAFE_SUCCESS, nothing done.
 * Ownership: the caller owns one reference less.
 * Handles: NULL: CUSAFE_SUCCESS, nothing done; others as every call.
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_graph_release(cusafe_graph graph);

/* ------------------------------------------------------------------------ */
/* Modules and kernels                                                        */
/* ------------------------------------------------------------------------ */

/* A module is loaded code of one context: the kernels built into cusafe, a
 * cubin / fatbin / PTX image from a file or memory, or CUDA C++ compiled at
 * run time with NVRTC.  It holds a reference on its context; a kernel holds
 * a reference on its module, so a module lives while any kernel of it does.
 * Modules and kernels are released like every other handle.
 *
 * The four loaders set *out to CUSAFE_NULL_HANDLE on every failure.
 * They fail with CUSAFE_ERROR_INVALID_IMAGE, "module <name> cannot be
 * loaded: <CUDA's words>", where CUDA rejects the image (also with
 * cudaErrorInvalidValue).  With drivers of CUDA 12.0 and later the image is
 * loaded into the device at once, so that a bad one fails here and not at
 * its first launch. */

/* Loads the kernels built into cusafe (from kernels/: fill, scale, axpy
 * and vector add for float and double, named cusafe_<op>_f32 / _f64; see
 * docs/guide.md, "Kernels", for their parameters).
 * Parameters: out [out] the new module; ctx [in] its context.
 * Returns: CUSAFE_SUCCESS: *out is the new module.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: ctx is NULL, forged, stale or not a
 *   context.  CUSAFE_ERROR_INVALID_IMAGE: the library holds no code for this
 *   device's architecture (rebuild with ./configure --with-cuda-arch).
 *   CUSAFE_ERROR_OUT_OF_MEMORY: no host memory, or the handle table is
 *   full.  A CUDA failure (cudaLibraryLoadData, cudaSetDevice,
 *   cuLibraryGetModule): its mapped status.  CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: after shutdown / in a forked child.
 * Ownership: the caller owns the one reference of *out, to release; the
 *   module holds a reference on ctx.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; each call loads a new module. */
CUSAFE_API cusafe_status cusafe_module_load_builtin(cusafe_module *out,
                                                    cusafe_context ctx);
/* Loads a cubin, fatbin or PTX file.
 * Parameters: out [out] the new module; ctx [in] its context; path [in]
 *   the file's path, NUL-terminated.
 * Returns: CUSAFE_SUCCESS: *out is the new module.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out or path is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: ctx is NULL, forged, stale or not a
 *   context.  CUSAFE_ERROR_INVALID_IMAGE: the file cannot be read, or is not
 *   loadable (the message names the file and says why).
 *   CUSAFE_ERROR_OUT_OF_MEMORY: no host memory, or the handle table is
 *   full.  A CUDA failure (cudaLibraryLoadFromFile, cudaSetDevice,
 *   cuLibraryGetModule): its mapped status.  CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: after shutdown / in a forked child.
 * Ownership: the caller owns the one reference of *out, to release; the
 *   module holds a reference on ctx.  path stays the caller's.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_module_load_file(cusafe_module *out,
                                                 cusafe_context ctx,
                                                 const char *path);
/* Loads a cubin, fatbin or NUL-terminated PTX image from memory; cusafe
 * copies what it needs, so `image` may be freed afterwards.
 * Parameters: out [out] the new module; ctx [in] its context; image [in]
 *   the image; size [in] its size in bytes (for PTX, including the NUL).
 *   cusafe only checks that size is not 0: CUDA reads the image as far as
 *   its own headers (or PTX's NUL) say.
 * Returns: CUSAFE_SUCCESS: *out is the new module.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out or image is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: ctx is NULL, forged, stale or not a
 *   context.  CUSAFE_ERROR_INVALID_SIZE: size is 0.
 *   CUSAFE_ERROR_INVALID_IMAGE: CUDA cannot load the image.
 *   CUSAFE_ERROR_OUT_OF_MEMORY: no host memory, or the handle table is
 *   full.  A CUDA failure (cudaLibraryLoadData, cudaSetDevice,
 *   cuLibraryGetModule): its mapped status.  CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: after shutdown / in a forked child.
 * Ownership: the caller owns the one reference of *out, to release; the
 *   module holds a reference on ctx.  image stays the caller's.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_module_load_data(cusafe_module *out,
                                                 cusafe_context ctx,
                                                 const void *image,
                                                 size_t size);
/* Compiles CUDA C++ `source` with NVRTC for the context's device (cubin
 * for its exact architecture) and loads it.  Kernels should be declared
 * extern "C" to be found by their plain names; otherwise pass the mangled
 * name to cusafe_module_get_kernel().
 * Parameters: out [out] the new module; ctx [in] its context; source [in]
 *   NUL-terminated CUDA C++; name [in] the program's name in messages and
 *   the compiler's diagnostics, NULL: "source.cu"; options [in] noptions
 *   NVRTC options such as "-DN=4", "-I/path", "-std=c++17" (cusafe adds the
 *   architecture option unless one is given), NULL allowed when noptions
 *   is 0; noptions [in] their number.
 * Returns: CUSAFE_SUCCESS: *out is the new module; the thread's compile log
 *   is "".
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out or source is NULL, or options is
 *   NULL with noptions > 0.  CUSAFE_ERROR_INVALID_HANDLE: ctx is NULL,
 *   forged, stale or not a context.  CUSAFE_ERROR_COMPILE: NVRTC failed:
 *   the source or an option is wrong (the message holds the log, cut to
 *   what the message can hold; cusafe_last_compile_log() gives all of it),
 *   the compilation gave no cubin (a virtual architecture was given), or
 *   another NVRTC call failed.  CUSAFE_ERROR_OUT_OF_MEMORY: no host memory,
 *   NVRTC ran out of memory, or the handle table is full.
 *   CUSAFE_ERROR_INVALID_IMAGE and the CUDA failures of loading, as
 *   cusafe_module_load_data().  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED:
 *   after shutdown / in a forked child.
 * Ownership: the caller owns the one reference of *out, to release; the
 *   module holds a reference on ctx.  source, name and options stay the
 *   caller's.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; the compile log is per thread. */
CUSAFE_API cusafe_status cusafe_module_compile(
    cusafe_module *out, cusafe_context ctx, const char *source,
    const char *name, const char *const *options, size_t noptions);
/* Returns the full NVRTC log of the calling thread's last
 * cusafe_module_compile() whose compilation failed.
 * Parameters: none.
 * Returns: the log; "" before any such failure, after a compile that made
 *   a cubin (whether CUDA then loaded it or not), or when NVRTC wrote no
 *   log.  A compile that fails before compiling (a bad argument or handle,
 *   nvrtcCreateProgram) or that compiles but gets no cubin leaves the log
 *   as it was.  Never NULL.
 * Errors: none.
 * Ownership: the text is the library's; it stays valid until the next
 *   cusafe_module_compile() on this thread that fails to compile or makes
 *   a cubin, or until the thread exits.
 * Handles: none taken.
 * Threads: per-thread state; thread-safe; works after shutdown. */
CUSAFE_API const char *cusafe_last_compile_log(void);
/* Adds one reference of the caller to a module: the typed cusafe_retain().
 * Parameters: module [in] the module.
 * Returns: CUSAFE_SUCCESS: module holds one more reference.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: module is NULL, forged, stale or not
 *   a module.  CUSAFE_ERROR_OUT_OF_MEMORY: module has too many references
 *   (65535 of the caller's).  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED:
 *   after shutdown / in a forked child.
 * Ownership: the caller owns one more reference, to release.
 * Handles: as every call (see the top of this file); NULL is an error here.
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_module_retain(cusafe_module module);
/* Drops one reference of the caller to a module.  When the caller's last
 * one goes the handle is stale; once its kernels are gone too, the module
 * waits for its device to be idle (launches of its code may be queued) and
 * unloads the code -- or, while a stream of its context captures (see
 * Graphs), leaves the code to be unloaded with the context.
 * Parameters: module [in] the module; CUSAFE_NULL_HANDLE: no-op.
 * Returns: CUSAFE_SUCCESS: the reference is dropped.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: module is forged, stale (a double
 *   release) or not a module.  Where this release destroys the module, a
 *   CUDA failure (cudaDeviceSynchronize, cudaLibraryUnload, or the teardown
 *   of the context whose last reference it held): its mapped status (see
 *   Releases at the top).  After shutdown and in a forked child:
 *   CUSAFE_SUCCESS, nothing done.
 * Ownership: the caller owns one reference less.
 * Handles: NULL: CUSAFE_SUCCESS, nothing done; others as every call.
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_module_release(cusafe_module module);

/* Looks up a kernel of the module by name and reads its parameter layout.
 * Each call makes a new kernel handle.
 * Parameters: out [out] the new kernel; module [in] the module; name [in]
 *   the kernel's name, NUL-terminated (mangled unless extern "C").
 * Returns: CUSAFE_SUCCESS: *out is the new kernel.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out or name is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: module is NULL, forged, stale or not a
 *   module.  CUSAFE_ERROR_NOT_FOUND: "kernel \"<name>\" not found in module
 *   <module>".  CUSAFE_ERROR_NOT_SUPPORTED: a parameter of 0 or of more
 *   than 65 535 bytes (CUDA allows 32 764 bytes for all the parameters
 *   together today).  CUSAFE_ERROR_INVALID_IMAGE: CUDA cannot load the
 *   kernel's code.  CUSAFE_ERROR_OUT_OF_MEMORY: no host memory, or the
 *   handle table is full.  A CUDA failure (cudaLibraryGetKernel,
 *   cudaFuncGetParamInfo, cudaFuncGetAttributes): its mapped status.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.  *out is CUSAFE_NULL_HANDLE on every failure.
 * Ownership: the caller owns the one reference of *out, to release; the
 *   kernel holds a reference on module, which the caller may release.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_module_get_kernel(cusafe_kernel *out,
                                                  cusafe_module module,
                                                  const char *name);
/* Adds one reference of the caller to a kernel: the typed cusafe_retain().
 * Parameters: kernel [in] the kernel.
 * Returns: CUSAFE_SUCCESS: kernel holds one more reference.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: kernel is NULL, forged, stale or not
 *   a kernel.  CUSAFE_ERROR_OUT_OF_MEMORY: kernel has too many references
 *   (65535 of the caller's).  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED:
 *   after shutdown / in a forked child.
 * Ownership: the caller owns one more reference, to release.
 * Handles: as every call (see the top of this file); NULL is an error here.
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_kernel_retain(cusafe_kernel kernel);
/* Drops one reference of the caller to a kernel; the last one destroys it
 * and drops its reference on the module.  Launches already queued still
 * run (see cusafe_module_release()).
 * Parameters: kernel [in] the kernel; CUSAFE_NULL_HANDLE: no-op.
 * Returns: CUSAFE_SUCCESS: the reference is dropped.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: kernel is forged, stale (a double
 *   release) or not a kernel.  Where this release destroys the kernel and
 *   it held the module's last reference, a CUDA failure of the module's
 *   teardown (as cusafe_module_release()): its mapped status.  After
 *   shutdown and in a forked child: CUSAFE_SUCCESS, nothing done.
 * Ownership: the caller owns one reference less.
 * Handles: NULL: CUSAFE_SUCCESS, nothing done; others as every call.
 * Threads: thread-safe; see the top for a release racing a launch. */
CUSAFE_API cusafe_status cusafe_kernel_release(cusafe_kernel kernel);
/* Tells the number of parameters of the kernel and their sizes.
 * Parameters: count [out] the number of parameters; sizes [out] NULL, or
 *   an array of capacity elements; capacity [in] the elements of sizes;
 *   kernel [in] the kernel.
 * Returns: CUSAFE_SUCCESS: *count is set and, if sizes is not NULL, the
 *   first min(*count, capacity) elements of sizes[] hold the parameters'
 *   sizes in bytes; the others are left unchanged.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: count is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: kernel is NULL, forged, stale or not a
 *   kernel.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown /
 *   in a forked child.  *count is 0 and sizes[] unchanged on failure.
 * Ownership: nothing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_kernel_get_params(size_t *count, size_t *sizes,
                                                  size_t capacity,
                                                  cusafe_kernel kernel);
/* Declares the C types of the kernel's parameters, so that each launch
 * checks every argument's kind against its parameter's type, not only its
 * size: a pointer takes a buffer only (CUSAFE_ARG_BUFFER), an integer the
 * integers of its width of either sign, float CUSAFE_ARG_F32 only, double
 * CUSAFE_ARG_F64 only, bool CUSAFE_ARG_I8 or _U8; a struct, union, enum
 * or any unknown type name takes bytes (CUSAFE_ARG_BYTES) and every other
 * kind of its size.  For extern "C" kernels, whose names carry no types.
 * A kernel whose name is mangled (C++, "_Z5scalePfi") has its types read
 * from the name by cusafe_module_get_kernel(), and the built-in kernels
 * have theirs; a declaration replaces those.  Where the types of a
 * mangled name cannot be read or do not fit the parameters that CUDA
 * reports, a kernel checks sizes only, as before.
 * Parameters: kernel [in] the kernel; signature [in] a C parameter list,
 *   NUL-terminated: "float *y, const float *x, float a, size_t n", names
 *   optional ("float*, const float*, float, unsigned long"); "" or "void"
 *   for none.  Types: the C integer types (char, short, int, long, long
 *   long, signed, unsigned), bool, _Bool, float, double, size_t, ssize_t,
 *   ptrdiff_t, intptr_t, uintptr_t, int8_t .. uint64_t, char16_t,
 *   char32_t, wchar_t; "struct NAME", "union NAME", "enum NAME" and any
 *   other identifier (ns::Name too) as a type of the kernel's size;
 *   pointers to any of these, with any qualifiers (const, volatile,
 *   restrict, __restrict__, __grid_constant__).
 * Returns: CUSAFE_SUCCESS: the kernel's types are the declared ones, for
 *   launches that start afterwards.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: signature is NULL; it cannot be
 *   read ("cannot read the declaration \"float**x y\": parameter 0:
 *   unexpected \"y\""); it has another number of parameters than the
 *   kernel ("the declaration has 3 parameters, kernel k has 4"); or a
 *   type's size is not its parameter's ("parameter 2 is declared double
 *   (8 bytes), the kernel's is 4 bytes"); its types take more than 16384
 *   bytes ("the declaration is too long: ...").  The kernel keeps its
 *   types on failure.  CUSAFE_ERROR_INVALID_HANDLE: kernel is NULL,
 *   forged, stale or not a kernel.  CUSAFE_ERROR_OUT_OF_MEMORY: no host memory.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.
 * Ownership: signature stays the caller's; the kernel keeps a copy.  Each
 *   declaration that changes the kernel's types keeps the replaced types
 *   (a block of about the declaration's length) until the kernel is
 *   destroyed, since a launch on another thread may be reading them;
 *   declaring the types the kernel already has keeps nothing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; a launch on another thread during the call checks
 *   each argument against its parameter's old type or its new one (one
 *   launch may meet old types for some parameters and new ones for
 *   others). */
CUSAFE_API cusafe_status cusafe_kernel_declare(cusafe_kernel kernel,
                                               const char *signature);
/* Tells the kernel's signature as C: "scale(float*, int)", the name
 * demangled where it was mangled ("kernel<float>(float*, int)"); where
 * its types are unknown, its name and "(?)" ("my_kernel(?)").
 * Parameters: out [out] NULL, or room for capacity bytes; capacity [in]
 *   the bytes of out; length [out] the signature's length in bytes,
 *   without its NUL; kernel [in] the kernel.
 * Returns: CUSAFE_SUCCESS: *length is set and, if capacity > 0, out holds
 *   the first min(*length, capacity - 1) bytes of the signature and a NUL
 *   (truncated where *length >= capacity, as snprintf() does: call with
 *   capacity 0 for the length, then with *length + 1).
 * Errors: CUSAFE_ERROR_INVALID_VALUE: length is NULL, or out is NULL with
 *   capacity > 0.  CUSAFE_ERROR_INVALID_HANDLE: kernel is NULL, forged,
 *   stale or not a kernel.  CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED:
 *   after shutdown / in a forked child.  *length is 0 and out unchanged on
 *   failure.
 * Ownership: out stays the caller's.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe; during a cusafe_kernel_declare() on another
 *   thread it tells the old signature or the new one. */
CUSAFE_API cusafe_status cusafe_kernel_get_signature(char *out, size_t capacity,
                                                     size_t *length,
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
 * CUSAFE_ARG_ macros below) and from ctypes. */
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

/* Build one cusafe_arg each, as a compound literal (C99; in C++ only where
 * the compiler accepts compound literals as an extension, as GCC and Clang
 * do).
 * Parameters: CUSAFE_ARG_BUF(h): h [in] a buffer or view handle, passed as
 *   its device address (a view at its offset).  CUSAFE_ARG_INT(k, v):
 *   k [in] CUSAFE_ARG_I8, _I16, _I32 or _I64; CUSAFE_ARG_UINT(k, v): k [in]
 *   CUSAFE_ARG_U8, _U16, _U32 or _U64; v [in] the value, passed in the
 *   width of k.  CUSAFE_ARG_I32V, _U32V, _I64V, _U64V, _F32V, _F64V (v):
 *   v [in] the value, of that type.  CUSAFE_ARG_STRUCT(p): p [in] a pointer
 *   to an object whose sizeof(*p) bytes are passed by value.
 * Returns: the cusafe_arg.
 * Errors: none here; cusafe_kernel_launch() checks each argument (its kind
 *   and size against the parameter, the buffer's handle, a NULL p).
 * Ownership: nothing is taken: the caller holds its reference on a buffer
 *   until the launch call returns, and the launch keeps the memory alive
 *   until the kernel has completed; *p is read during the launch call
 *   only.
 * Handles: h is not checked until the launch.
 * Threads: plain expressions. */
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
 * and a message: the handles, the number of arguments and each one's size
 * (and kind, where the kernel's types are known: see
 * cusafe_kernel_declare()) against the kernel's parameters, grid, block and
 * shared memory against the kernel's and the device's limits, and that every
 * buffer and the stream belong to the kernel's context.  Buffers are passed as
 * their device address (a view at its offset) and stay alive until the kernel
 * has completed, like every other operation on them (see "Ordering"
 * above).  Dynamic shared memory above the default limit is opted into
 * automatically.  The kernel is queued through the driver's cuLaunchKernel
 * where the driver has it (it costs less than the runtime's
 * cudaLaunchKernel); a launch that it refuses is made again through
 * cudaLaunchKernel, whose error is the one reported.
 * Parameters: kernel [in] the kernel; config [in] grid, block, dynamic
 *   shared memory and stream (CUSAFE_STREAM_DEFAULT: the default stream of
 *   the kernel's context); args [in] nargs arguments, NULL allowed when
 *   nargs is 0; nargs [in] their number.
 * Returns: CUSAFE_SUCCESS: the kernel is queued.
 * Errors: CUSAFE_ERROR_INVALID_HANDLE: kernel is NULL, forged, stale or not
 *   a kernel; config->stream or a buffer argument is forged, stale or not
 *   of its type ("argument 2 0x... is stale: ..."), or a NULL buffer.
 *   CUSAFE_ERROR_INVALID_VALUE: config is NULL; args is NULL with nargs >
 *   0; a CUSAFE_ARG_BYTES argument of the right size with value.bytes
 *   NULL.  CUSAFE_ERROR_INVALID_ARGUMENTS: nargs is not the kernel's
 *   parameter count ("kernel cusafe_axpy_f32 takes 4 arguments, 3 given");
 *   an argument of unknown kind, or whose size is not its parameter's
 *   ("argument 2 of kernel k is 4 bytes, parameter 2 is 8 bytes"); where
 *   the kernel's types are known (see cusafe_kernel_declare()), one whose
 *   kind its parameter's type does not take ("argument 0 of kernel
 *   scale(float*, int) is a 64-bit integer, parameter 0 is float*",
 *   "argument 1 of kernel k(float*, Params) is 12 bytes, parameter 1 is
 *   Params (16 bytes)").
 *   CUSAFE_ERROR_INVALID_CONFIGURATION: a grid or block dimension that is
 *   0 or above the device's limit, more threads per block than the kernel
 *   allows, or more dynamic shared memory than the device allows it.
 *   CUSAFE_ERROR_CONTEXT_MISMATCH: the stream or a buffer argument belongs
 *   to another context.  CUSAFE_ERROR_OUT_OF_MEMORY: more than 32
 *   arguments, and no host memory for them.  A CUDA failure
 *   (cudaKernelSetAttributeForDevice for the shared memory opt-in, the
 *   event record and stream wait that order a buffer's earlier work on
 *   another stream, cudaLaunchKernel after cuLaunchKernel): its mapped
 *   status.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.  The kernel is not queued on failure.
 * Ownership: no reference is handed to the caller; the buffers' memory and
 *   the kernel's code stay alive until the kernel has completed.  args and
 *   the memory its CUSAFE_ARG_BYTES arguments point to are read during the
 *   call only.
 * Handles: as every call (see the top of this file); CUSAFE_STREAM_DEFAULT
 *   as above.
 * Threads: thread-safe; a kernel, stream or buffer released by another
 *   thread during the call either launches (its release waits for the
 *   call) or fails as stale. */
CUSAFE_API cusafe_status
cusafe_kernel_launch(cusafe_kernel kernel, const cusafe_launch_config *config,
                     const cusafe_arg *args, size_t nargs);

/* The C convenience form of cusafe_kernel_launch(), which counts the
 * arguments: CUSAFE_LAUNCH(k, &config, CUSAFE_ARG_BUF(x),
 * CUSAFE_ARG_F32V(2.0f), CUSAFE_ARG_U64V(n)).  C only (C++ rejects the
 * address of its temporary array); ISO C wants at least one argument, so a
 * kernel without parameters is launched with cusafe_kernel_launch(k,
 * &config, NULL, 0).
 * Parameters: kernel [in], config [in] as cusafe_kernel_launch(); then the
 *   arguments [in], each a cusafe_arg (the CUSAFE_ARG_ macros above).
 * Returns: cusafe_kernel_launch()'s status.
 * Errors: those of cusafe_kernel_launch().
 * Ownership: as cusafe_kernel_launch().
 * Handles: as cusafe_kernel_launch().
 * Threads: as cusafe_kernel_launch(). */
#define CUSAFE_LAUNCH(kernel, config, ...)                                     \
  cusafe_kernel_launch((kernel), (config), (const cusafe_arg[]){__VA_ARGS__},  \
                       sizeof((const cusafe_arg[]){__VA_ARGS__}) /             \
                           sizeof(cusafe_arg))

/* The attributes of a launch that cusafe_kernel_launch_ex() takes: one
 * tagged value each, so that later attributes need no new call. */
typedef enum cusafe_launch_attr_id {
  /* value.dim: the thread block cluster, in blocks per dimension. */
  CUSAFE_LAUNCH_ATTR_CLUSTER = 1,
  /* value.flag 1: clusters of more than the portable 8 blocks (up to 16),
   * which opts the kernel into them
   * (cudaFuncAttributeNonPortableClusterSizeAllowed). */
  CUSAFE_LAUNCH_ATTR_NON_PORTABLE_CLUSTER = 2,
  /* value.flag 1: a cooperative grid, whose blocks may all wait for each
   * other (cooperative_groups::this_grid().sync()). */
  CUSAFE_LAUNCH_ATTR_COOPERATIVE = 3,
  /* value.flag 1: programmatic dependent launch: the kernel may start
   * before the previous kernel of its stream has completed, and waits for
   * it with cudaGridDependencySynchronize(). */
  CUSAFE_LAUNCH_ATTR_PROGRAMMATIC_SERIALIZATION = 4,
  /* value.priority: the kernel's priority, within
   * cusafe_context_stream_priority_range(). */
  CUSAFE_LAUNCH_ATTR_PRIORITY = 5
} cusafe_launch_attr_id;

/* One attribute of a launch: 24 bytes, plain, easy to build from C and
 * ctypes. */
typedef struct cusafe_launch_attr {
  uint32_t id;       /* a cusafe_launch_attr_id */
  uint32_t reserved; /* 0 */
  union {
    uint32_t dim[3];  /* CLUSTER: blocks in x, y, z; each >= 1 */
    int32_t flag;     /* NON_PORTABLE_CLUSTER, COOPERATIVE,
                         PROGRAMMATIC_SERIALIZATION: 0 or 1 */
    int32_t priority; /* PRIORITY */
    uint64_t pad[2];
  } value;
} cusafe_launch_attr;

/* Launches `kernel` as cusafe_kernel_launch() does, with attributes: a
 * thread block cluster, a cooperative grid, programmatic dependent launch
 * or a priority.  With nattrs 0 it is cusafe_kernel_launch().  Every rule
 * is checked before CUDA sees the launch, each with a message that names
 * it:
 *   - CLUSTER: the device supports clusters (cudaDevAttrClusterLaunch,
 *     read with the device's properties when the context is made);
 *     each cluster dimension is at least 1 and divides the grid's; the
 *     cluster has at most 8 blocks, or 16 with NON_PORTABLE_CLUSTER 1
 *     (the most any device allows); and the kernel can run with such
 *     clusters at all (cudaOccupancyMaxActiveClusters is above 0).
 *     NON_PORTABLE_CLUSTER without CLUSTER is refused.
 *   - COOPERATIVE: the device supports it (cudaDevAttrCooperativeLaunch,
 *     read likewise),
 *     and the grid's blocks can all be resident at once: at most
 *     cudaOccupancyMaxActiveBlocksPerMultiprocessor for the block and
 *     shared memory times the device's multiprocessors.  With a cluster,
 *     at most cudaOccupancyMaxActiveClusters times the cluster's blocks.
 *   - PROGRAMMATIC_SERIALIZATION: compute capability 9.0 or above.
 *   - PRIORITY: within cusafe_context_stream_priority_range() (CUDA would
 *     clamp it silently).
 * The checks of a kernel's occupancy are cached per kernel for the last
 * shape asked.  Attributed launches may be captured into graphs like any
 * other (CUDA keeps a programmatic dependency as a programmatic edge).
 * Parameters: kernel [in], config [in] as cusafe_kernel_launch(); attrs
 *   [in] nattrs attributes, each id at most once, NULL allowed when nattrs
 *   is 0; nattrs [in] their number; args [in], nargs [in] as
 *   cusafe_kernel_launch().
 * Returns: CUSAFE_SUCCESS: the kernel is queued.
 * Errors: those of cusafe_kernel_launch(), and: CUSAFE_ERROR_INVALID_VALUE:
 *   attrs is NULL with nattrs > 0; an attribute of unknown id ("launch
 *   attribute 0 has unknown id 9"), with reserved not 0, given twice, or a
 *   flag other than 0 or 1 ("launch attribute 1 (COOPERATIVE) has flag 2;
 *   0 or 1"); a priority outside the context's range ("launch attribute
 *   0 (PRIORITY) of -7 is outside the device's stream priority range 0
 *   (least) to -5 (greatest)").  CUSAFE_ERROR_INVALID_CONFIGURATION: a
 *   cluster dimension of 0, one that does not divide the grid's, a cluster
 *   above 8 blocks (16 with NON_PORTABLE_CLUSTER), NON_PORTABLE_CLUSTER
 *   without CLUSTER, a kernel that cannot run with the cluster ("kernel k
 *   cannot run with clusters of 16 blocks of 1024 threads: no cluster fits
 *   an SM group (cudaOccupancyMaxActiveClusters is 0)"), a cooperative grid
 *   larger than can be co-resident ("a cooperative grid of 300 blocks
 *   exceeds the 264 that can be co-resident (2 per SM x 132 SMs)").
 *   CUSAFE_ERROR_NOT_SUPPORTED: a device without cluster or cooperative
 *   launch, programmatic serialization below compute capability 9.0.  A
 *   CUDA failure (cudaKernelSetAttributeForDevice for the opt-in to
 *   non-portable clusters, cudaOccupancyMaxActiveClusters,
 *   cudaOccupancyMaxActiveBlocksPerMultiprocessor, cudaLaunchKernelExC
 *   after cuLaunchKernelEx, as cusafe_kernel_launch() does):
 *   its mapped status.  The kernel is not queued on failure.
 * Ownership: as cusafe_kernel_launch(); attrs is read during the call
 *   only.
 * Handles: as cusafe_kernel_launch().
 * Threads: as cusafe_kernel_launch(). */
CUSAFE_API cusafe_status cusafe_kernel_launch_ex(
    cusafe_kernel kernel, const cusafe_launch_config *config,
    const cusafe_launch_attr *attrs, size_t nattrs, const cusafe_arg *args,
    size_t nargs);

/* Suggests a block size (threads, a multiple of the warp size) that gives
 * the kernel the highest occupancy with `shared_memory` bytes of dynamic
 * shared memory per block (the largest such size), and the grid that covers
 * `n` threads with it.  Like a launch, it opts the kernel into that much
 * dynamic shared memory if needed.
 * Parameters: block [out] threads per block, for config.block[0]; grid
 *   [out] blocks, for config.grid[0]; kernel [in] the kernel;
 *   shared_memory [in] dynamic shared memory per block in bytes; n [in] the
 *   number of threads wanted.
 * Returns: CUSAFE_SUCCESS: *block is set, and *grid is n / *block rounded
 *   up, at least 1 and at most the device's grid limit in x.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: block or grid is NULL.
 *   CUSAFE_ERROR_INVALID_HANDLE: kernel is NULL, forged, stale or not a
 *   kernel.  CUSAFE_ERROR_INVALID_CONFIGURATION: shared_memory is more than
 *   the device allows the kernel, or no block size can run with it.  A CUDA
 *   failure (cudaKernelSetAttributeForDevice,
 *   cudaOccupancyMaxActiveBlocksPerMultiprocessor): its mapped status.
 *   CUSAFE_ERROR_SHUTDOWN / CUSAFE_ERROR_FORKED: after shutdown / in a
 *   forked child.  *block and *grid are left unchanged on failure.
 * Ownership: nothing.
 * Handles: as every call (see the top of this file).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_kernel_suggest_config(uint32_t *block,
                                                      uint32_t *grid,
                                                      cusafe_kernel kernel,
                                                      size_t shared_memory,
                                                      size_t n);

#ifdef __cplusplus
}
#endif

#endif /* CUSAFE_H */
