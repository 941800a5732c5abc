/* cusafe_dlpack.h -- cusafe buffers as DLPack tensors, in and out.
 *
 * DLPack is how array libraries (CuPy, PyTorch, JAX, NumPy, TVM) lend
 * each other memory without copies.  A tensor leaves cusafe with a
 * reference on its buffer, dropped by the tensor's deleter; a tensor comes
 * in as a wrapped buffer (cusafe_buffer_wrap() in cusafe.h) that calls the
 * producer's deleter once, after the last reference and the last queued
 * work are gone.
 *
 * The structures are DLPack 1.x's, as cusafe declares them itself
 * (cusafe_dlpack_abi.h, installed beside this header: DLPack 1.3, checked
 * against DLPack's own dlpack/dlpack.h wherever the build finds one), so
 * nothing else is needed.  With DLPack's own header in the same file,
 * include it first to get its declarations (cusafe_dlpack_abi.h then
 * declares nothing); included after this header, it is empty, so headers
 * that need more of it than cusafe declares (tvm-ffi's, for instance)
 * fail to compile: include <dlpack/dlpack.h> before this header.  Both ABIs
 * are served: the versioned DLManagedTensorVersioned (DLPack >= 1.0, the
 * one current consumers ask for; cusafe produces version
 * CUSAFE_DLPACK_ABI_MAJOR.CUSAFE_DLPACK_ABI_MINOR, flags 0) and the legacy
 * DLManagedTensor (the `_legacy` calls, for consumers that ask for no
 * version).  Every build of the library has the calls, unless configured
 * with --disable-dlpack.
 *
 * Data types.  A tensor's element is dtype.lanes values of dtype.bits
 * bits: its size, bits * lanes / 8 bytes, must be whole (sub-byte types are
 * refused).  The type code is passed through unchecked: cusafe moves bytes
 * and never interprets them.  Shapes and strides count elements, as in
 * DLPack; strides may be negative or 0, and the bytes that the elements
 * reach must lie within the buffer. */
#ifndef CUSAFE_DLPACK_H
#define CUSAFE_DLPACK_H

#include "cusafe_dlpack_abi.h"

#include "cusafe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most dimensions a tensor may have here (NumPy's limit). */
#define CUSAFE_DLPACK_MAX_NDIM 64

/* Exports bytes of a buffer, from `offset` on, as a DLPack tensor of
 * `dtype` and `shape`: device memory as kDLCUDA of the context's device,
 * pinned memory as kDLCUDAHost (device 0), managed memory as
 * kDLCUDAManaged.  The tensor's data points at the buffer's byte `offset`
 * (NULL if it has no elements), its byte_offset is 0, and its strides are
 * always set (the given ones, or those of row-major order).
 *
 * The consumer's stream.  A consumer drops a tensor (and so calls its
 * deleter) as soon as it has queued its last work on it, not when that
 * work is done.  Given the stream on which the consumer works (its own,
 * wrapped with cusafe_stream_wrap()), the export makes that stream wait
 * for the buffer's queued work, and the deleter orders the buffer's later
 * work and free after everything queued on that stream so far before it
 * drops its reference: the memory is freed only after the work the
 * consumer queued on that stream before deleting the tensor.  Where that
 * stream captures when the deleter runs, "so far" is the work queued
 * before its capture began: the captured work runs only when its graph is
 * replayed, and the capture gets nothing of the buffer's (a consumer that
 * captured work on the tensor keeps the tensor alive as long as its graph,
 * as with any memory it lends to a graph).  Each time the buffer's work
 * then goes back to its context's default stream: cusafe touches the
 * consumer's stream at
 * the export and in the deleter only, and it must be valid then (DLPack's
 * consumers use the stream they name until they delete the tensor).
 * Without a stream, the consumer synchronises both ways itself.
 * Parameters: out [out] the new tensor; buffer [in] a buffer or view;
 *   offset [in] bytes into buffer of the element of index 0; dtype [in]
 *   the element type; ndim [in] 0 to CUSAFE_DLPACK_MAX_NDIM; shape [in]
 *   ndim sizes, each 0 or more (NULL when ndim is 0); strides [in] ndim
 *   strides in elements, or NULL for row-major order; stream [in] the
 *   consumer's stream (of buffer's context), or CUSAFE_NULL_HANDLE for
 *   none (see above).
 * Returns: CUSAFE_SUCCESS: *out is the tensor, of version
 *   {CUSAFE_DLPACK_ABI_MAJOR, CUSAFE_DLPACK_ABI_MINOR}, flags 0.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out is NULL, shape is NULL while ndim
 *   is not 0, ndim is out of range, a size is negative, or the element is
 *   not a whole number of bytes ("dtype of 4 bits x 1 lanes is not a whole
 *   number of bytes").  CUSAFE_ERROR_INVALID_HANDLE: buffer is NULL,
 *   forged, stale or not a buffer, or stream is forged, stale or not a
 *   stream.  CUSAFE_ERROR_CONTEXT_MISMATCH: the stream belongs to another
 *   device ("stream belongs to device 1 but buffer belongs to device 0").
 *   A CUDA failure of the stream's wait (as cusafe_stream_use_buffers()):
 *   its mapped status.  CUSAFE_ERROR_CAPTURING: the stream is one that
 *   nothing may touch now (a wrapped default stream while a blocking
 *   stream captures, a wrapped stream that other code captures: see
 *   cusafe.h), which could not wait for the buffer's work; nothing is
 *   queued.  CUSAFE_ERROR_INVALID_SIZE: the
 *   tensor's extent overflows.  CUSAFE_ERROR_OUT_OF_RANGE: the elements
 *   reach beyond the buffer ("tensor of bytes [0, 80) at offset 0 exceeds
 *   buffer of 64 bytes").  CUSAFE_ERROR_OUT_OF_MEMORY: no host memory.
 *   CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: after shutdown / in a forked child.  *out is NULL
 *   on every failure.
 * Ownership: the caller owns the tensor and hands it to one consumer, who
 *   calls its deleter once.  The tensor holds one reference on the buffer
 *   and one on the stream, of its own (the caller may release its own at
 *   once; its handles then go stale, as when a view holds the buffer): the
 *   memory stays valid until the deleter runs, and the stream's work
 *   before it.  The consumer's CUDA stream must be valid until the deleter
 *   has run.  The deleter may run on any thread, at any time -- after the
 *   buffer's handle was released, after cusafe_shutdown(), during exit --
 *   and then only frees the tensor and drops the reference (a no-op after
 *   shutdown, whose ordered teardown freed the memory); it never prints.
 * Handles: as every call (see the top of cusafe.h).
 * Threads: thread-safe. */
CUSAFE_API cusafe_status cusafe_buffer_to_dlpack(
    DLManagedTensorVersioned **out, cusafe_buffer buffer, size_t offset,
    DLDataType dtype, int32_t ndim, const int64_t *shape,
    const int64_t *strides, cusafe_stream stream);
/* cusafe_buffer_to_dlpack() for consumers of the legacy ABI: the same
 * tensor as a DLManagedTensor (no version, no flags).
 * Parameters, Returns, Errors, Ownership, Handles, Threads: as
 *   cusafe_buffer_to_dlpack(). */
CUSAFE_API cusafe_status cusafe_buffer_to_dlpack_legacy(
    DLManagedTensor **out, cusafe_buffer buffer, size_t offset,
    DLDataType dtype, int32_t ndim, const int64_t *shape,
    const int64_t *strides, cusafe_stream stream);

/* Imports a DLPack tensor of another library as a buffer of ctx, without
 * a copy: the buffer spans the bytes that the tensor's elements reach
 * (with negative strides, from the lowest one), so that the element of
 * index 0 is at byte (first element's address - buffer's address).  The
 * memory is checked as cusafe_buffer_wrap() checks it: kDLCUDA is device
 * memory of ctx's device, kDLCUDAHost pinned memory, kDLCUDAManaged
 * managed memory.  The producer's queued work is not waited for: ask the
 * producer for the tensor on the stream that will use it (DLPack's
 * `stream` argument), or synchronise.
 * Of the flags, READ_ONLY is refused (cusafe buffers are writable); IS_COPIED
 * changes nothing (the tensor is cusafe's either way); with
 * IS_SUBBYTE_TYPE_PADDED or without, an element must be whole bytes.  Bits
 * that DLPack 1.3 does not define (those of a newer 1.x producer) are
 * ignored, not refused: DLPack's minor versions only add, its
 * specification asks no consumer to refuse unknown flags and the
 * consumers of other libraries ignore them, so a flag that forbade what
 * an older consumer does (writing, say) would need a new major version,
 * which is refused.
 * Parameters: out [out] the new buffer; ctx [in] its context; tensor [in]
 *   the tensor (version 1.x, not read-only).
 * Returns: CUSAFE_SUCCESS: *out is the buffer, and cusafe owns the tensor.
 * Errors: CUSAFE_ERROR_INVALID_VALUE: out or tensor is NULL, the tensor is
 *   read-only, its shape is NULL while ndim is not 0, ndim is out of range,
 *   a size is negative, the element is not a whole number of bytes, its
 *   data is NULL while it has elements ("tensor's data is NULL"), the
 *   device type is not CUDA memory ("tensor on DLPack device type 1 (CPU)
 *   is not CUDA memory"), or the memory is of another kind than its device
 *   type says.  CUSAFE_ERROR_NOT_SUPPORTED: a major version other than 1.
 *   CUSAFE_ERROR_INVALID_HANDLE: ctx is NULL, forged, stale or not a
 *   context.  CUSAFE_ERROR_CONTEXT_MISMATCH: memory of another device.
 *   CUSAFE_ERROR_INVALID_SIZE: the extent overflows, or wraps around the
 *   address space.
 *   CUSAFE_ERROR_OUT_OF_RANGE: the elements reach beyond the allocation.
 *   CUSAFE_ERROR_OUT_OF_MEMORY, a CUDA failure, CUSAFE_ERROR_SHUTDOWN /
 *   CUSAFE_ERROR_FORKED: as cusafe_buffer_wrap().  *out is
 *   CUSAFE_NULL_HANDLE on every failure, and the tensor stays the
 *   caller's (who calls its deleter; DLPack asks this of a consumer that
 *   cannot read the version too).
 * Ownership: the caller owns the one reference of *out, to release; the
 *   buffer holds a reference on ctx.  The tensor is cusafe's: its deleter
 *   is called once, when the buffer's last reference and queued work are
 *   gone, or during the ordered shutdown (before the CUDA runtime's
 *   teardown) -- except in a process whose Python interpreter has
 *   finalized, where deleters that may need Python are not called (the
 *   memory goes with the process).
 * Handles: as every call (see the top of cusafe.h).
 * Threads: thread-safe; the deleter runs as cusafe_buffer_wrap()'s release
 *   does. */
CUSAFE_API cusafe_status cusafe_buffer_from_dlpack(
    cusafe_buffer *out, cusafe_context ctx, DLManagedTensorVersioned *tensor);
/* cusafe_buffer_from_dlpack() of a legacy DLManagedTensor (no version, no
 * flags).
 * Parameters, Returns, Errors, Ownership, Handles, Threads: as
 *   cusafe_buffer_from_dlpack(), less the version and read-only checks. */
CUSAFE_API cusafe_status cusafe_buffer_from_dlpack_legacy(
    cusafe_buffer *out, cusafe_context ctx, DLManagedTensor *tensor);

/* A PyCapsule destructor, for bindings that make DLPack capsules through a
 * foreign-function interface (ctypes: pythonapi.PyCapsule_New with this
 * function's address): if the capsule was never consumed (its name is
 * still "dltensor_versioned" or "dltensor"), calls the tensor's deleter;
 * otherwise does nothing.  It finds Python's functions in the process (it
 * does nothing outside a Python process).
 * Parameters: capsule [in] the PyObject * of the capsule being destroyed.
 * Returns: nothing.
 * Errors: none; never raises, never prints.
 * Ownership: the capsule's tensor, if unconsumed, is deleted.
 * Handles: none.
 * Threads: called by Python, with the GIL held. */
CUSAFE_API void cusafe_dlpack_capsule_destructor(void *capsule);

#ifdef __cplusplus
}
#endif

#endif /* CUSAFE_DLPACK_H */
