/* dlpack.c -- buffers as DLPack tensors, out (a reference on the buffer
 * travels with the tensor) and in (the producer's deleter travels with the
 * wrapped buffer): interop keeps lifetimes (invariant 2 across the border;
 * shared/DESIGN.md, "Interop").  Built in every build: the DLPack ABI is
 * cusafe's own (cusafe_dlpack_abi.h). */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "context.h"
#include "cusafe_dlpack.h"
#include "python.h"

/* ---- the bytes a tensor reaches ------------------------------------------ */

/* The extent of a tensor's elements in bytes, relative to its element of
 * index 0: [*lo, *hi), empty (0, 0) when it has no element.  Checks the
 * element type, ndim, the sizes and overflow. */
static cusafe_status tensor_extent(DLDataType dtype, int32_t ndim,
                                   const int64_t *shape, const int64_t *strides,
                                   int64_t *lo, int64_t *hi) {
  *lo = *hi = 0;
  uint32_t bits = (uint32_t)dtype.bits * dtype.lanes;
  if (bits == 0 || bits % 8)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "dtype of %u bits x %u lanes is not a whole number of "
                   "bytes",
                   (unsigned)dtype.bits, (unsigned)dtype.lanes);
  if (ndim < 0 || ndim > CUSAFE_DLPACK_MAX_NDIM)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "ndim %d is out of range (0 to %d)", (int)ndim,
                   CUSAFE_DLPACK_MAX_NDIM);
  if (ndim && !shape)
    return cs_null("shape");
  bool empty = false;
  for (int32_t i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "shape[%d] is negative (%lld)",
                     (int)i, (long long)shape[i]);
    empty |= shape[i] == 0;
  }
  if (empty)
    return CUSAFE_SUCCESS;
  /* Element offsets: row-major strides, or the given ones. */
  int64_t min = 0, max = 0, stride = 1;
  for (int32_t i = ndim - 1; i >= 0; i--) {
    int64_t s = strides ? strides[i] : stride, reach;
    if (__builtin_mul_overflow(s, shape[i] - 1, &reach) ||
        __builtin_add_overflow(reach < 0 ? min : max, reach,
                               reach < 0 ? &min : &max) ||
        (!strides && __builtin_mul_overflow(stride, shape[i], &stride)))
      return cs_fail(CUSAFE_ERROR_INVALID_SIZE,
                     "the tensor's extent overflows (dimension %d)", (int)i);
  }
  int64_t size = bits / 8;
  int64_t span;
  if (__builtin_mul_overflow(min, size, lo) ||
      __builtin_add_overflow(max, 1, &max) ||
      __builtin_mul_overflow(max, size, hi) ||
      __builtin_sub_overflow(*hi, *lo, &span))
    return cs_fail(CUSAFE_ERROR_INVALID_SIZE, "the tensor's extent overflows");
  return CUSAFE_SUCCESS;
}

/* ---- export -------------------------------------------------------------- */

/* A tensor and its shape and strides, in one allocation; `tensor` is the
 * DLPack structure of either ABI (versioned first, for the deleter). */
struct exported {
  union {
    DLManagedTensorVersioned versioned;
    DLManagedTensor legacy;
  } tensor;
  /* References of the tensor's own, not the caller's (whose handles go
   * stale when the caller releases them): dropped by the deleter. */
  struct cs_buffer *buffer;
  struct cs_stream *stream; /* the consumer's, or NULL */
  int64_t dims[];           /* shape, then strides */
};

/* The export's point on the consumer's stream: that stream waits for the
 * buffer's queued work (in a capture, the capture holds the buffer, as
 * for any captured use), and the buffer's later work and free follow the
 * consumer's, back on its context's default stream: the consumer's stream
 * is touched at the export and in the deleter only, so it need be valid
 * then only. */
static cusafe_status consumer_point(struct cs_stream *s, struct cs_buffer *b) {
  /* (The consumer's stream must wait for b's work: no park.) */
  cusafe_status st = cs_buffers_use_on(&b, 1, &s->queue, false);
  if (st == CUSAFE_SUCCESS)
    st = cs_buffer_follow(b, &s->queue);
  return st;
}

/* Drops the export's references, after everything the consumer queued on
 * its stream so far -- outside any capture that stream is in: the
 * consumer's captured work is its graph's, and no capture of the
 * consumer's holds the buffer because of a deleter.  Nothing after
 * shutdown or in a forked child (CS_ENTER_RELEASE), whose ordered teardown
 * freed everything; a failure only sets the thread's message. */
static cusafe_status exported_drop(struct exported *e) {
  CS_ENTER_RELEASE();
  if (e->stream) {
    (void)cs_buffer_follow(e->buffer, &e->stream->queue);
    (void)cs_unref(&e->stream->hdr);
  }
  return cs_unref(&e->buffer->hdr);
}

static void exported_free(struct exported *e) {
  (void)exported_drop(e);
  free(e);
}

static void delete_versioned(DLManagedTensorVersioned *t) {
  if (t)
    exported_free(t->manager_ctx);
}

static void delete_legacy(DLManagedTensor *t) {
  if (t)
    exported_free(t->manager_ctx);
}

/* Checks the export and makes its tensor, the DLTensor filled in *dl. */
static cusafe_status export_tensor(struct exported **out, DLTensor *dl,
                                   cusafe_buffer handle, size_t offset,
                                   DLDataType dtype, int32_t ndim,
                                   const int64_t *shape, const int64_t *strides,
                                   cusafe_stream stream) {
  CS_HOLD_OR_RETURN(cs_buffer, b, handle, CS_BUFFER, "buffer");
  struct cs_stream *s CS_HELD = NULL;
  if (stream != CUSAFE_NULL_HANDLE) {
    cusafe_status st = CS_ACQUIRE(stream, CS_STREAM, "stream", &s);
    if (st != CUSAFE_SUCCESS)
      return st;
    if (s->queue.ctx != b->ctx)
      return cs_fail(CUSAFE_ERROR_CONTEXT_MISMATCH,
                     "stream belongs to device %d but buffer belongs to "
                     "device %d",
                     s->queue.ctx->device, b->ctx->device);
  }
  int64_t lo, hi;
  cusafe_status st = tensor_extent(dtype, ndim, shape, strides, &lo, &hi);
  if (st != CUSAFE_SUCCESS)
    return st;
  /* [offset + lo, offset + hi) within [0, size); lo <= 0 < hi. */
  if (offset > b->size || (hi > lo && (0 - (uint64_t)lo > offset ||
                                       (uint64_t)hi > b->size - offset)))
    return cs_fail(CUSAFE_ERROR_OUT_OF_RANGE,
                   "tensor of bytes [%lld, %lld) at offset %zu exceeds buffer "
                   "of %zu bytes",
                   (long long)lo, (long long)hi, offset, b->size);
  /* The consumer's stream waits for the buffer's queued work. */
  if (s && (st = consumer_point(s, b)))
    return st;
  struct exported *e = malloc(sizeof *e + 2 * (size_t)ndim * sizeof(int64_t));
  if (!e)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  memset(&e->tensor, 0, sizeof e->tensor);
  int64_t *dims = e->dims, stride = 1;
  for (int32_t i = ndim - 1; i >= 0; i--) {
    dims[i] = shape[i];
    dims[ndim + i] = strides ? strides[i] : stride;
    /* Row-major strides; those of an empty tensor's larger dimensions may
     * overflow, and mean nothing. */
    if (__builtin_mul_overflow(stride, shape[i] ? shape[i] : 1, &stride))
      stride = 0;
  }
  static const DLDeviceType types[] = {kDLCUDA, kDLCUDAHost, kDLCUDAManaged};
  *dl = (DLTensor){
      .data = hi > lo ? b->ptr + offset : NULL,
      .device = {types[b->kind],
                 b->kind == CUSAFE_MEMORY_HOST_PINNED ? 0 : b->ctx->device},
      .ndim = ndim,
      .dtype = dtype,
      .shape = ndim ? dims : NULL,
      .strides = ndim ? dims + ndim : NULL,
      .byte_offset = 0,
  };
  /* The held references become the tensor's. */
  e->buffer = b;
  e->stream = s;
  b = NULL;
  s = NULL;
  *out = e;
  return CUSAFE_SUCCESS;
}

/* Fills the tensor of e in the ABI asked for. */
static void *tensor_of(struct exported *e, const DLTensor *dl, bool versioned) {
  if (versioned) {
    DLManagedTensorVersioned *t = &e->tensor.versioned;
    t->version =
        (DLPackVersion){CUSAFE_DLPACK_ABI_MAJOR, CUSAFE_DLPACK_ABI_MINOR};
    t->manager_ctx = e;
    t->deleter = delete_versioned;
    t->flags = 0;
    t->dl_tensor = *dl;
    return t;
  }
  DLManagedTensor *t = &e->tensor.legacy;
  t->dl_tensor = *dl;
  t->manager_ctx = e;
  t->deleter = delete_legacy;
  return t;
}

/* The public exports, of either ABI: *out is their tensor. */
#define CS_EXPORT(out, versioned)                                              \
  CS_ENTER_OUT(out, NULL);                                                     \
  struct exported *e;                                                          \
  DLTensor dl;                                                                 \
  cusafe_status st = export_tensor(&e, &dl, buffer, offset, dtype, ndim,       \
                                   shape, strides, stream);                    \
  if (st == CUSAFE_SUCCESS)                                                    \
    *(out) = tensor_of(e, &dl, (versioned));                                   \
  return st

CUSAFE_API cusafe_status cusafe_buffer_to_dlpack(
    DLManagedTensorVersioned **out, cusafe_buffer buffer, size_t offset,
    DLDataType dtype, int32_t ndim, const int64_t *shape,
    const int64_t *strides, cusafe_stream stream) {
  CS_EXPORT(out, true);
}

CUSAFE_API cusafe_status cusafe_buffer_to_dlpack_legacy(
    DLManagedTensor **out, cusafe_buffer buffer, size_t offset,
    DLDataType dtype, int32_t ndim, const int64_t *shape,
    const int64_t *strides, cusafe_stream stream) {
  CS_EXPORT(out, false);
}

/* ---- import -------------------------------------------------------------- */

/* The producer's deleter, as the wrapped buffer's release; not once Python
 * has finalized, as it may need Python (python.h). */
static void release_versioned(void *user) {
  DLManagedTensorVersioned *t = user;
  if (t->deleter && !cs_python_finalized())
    t->deleter(t);
}

static void release_legacy(void *user) {
  DLManagedTensor *t = user;
  if (t->deleter && !cs_python_finalized())
    t->deleter(t);
}

/* Wraps the memory of `dl` as a buffer of ctx, released by release(t). */
static cusafe_status import_tensor(cusafe_buffer *out,
                                   cusafe_context ctx_handle,
                                   const DLTensor *dl,
                                   cusafe_release_fn release, void *t) {
  CS_HOLD_OR_RETURN(cs_context, ctx, ctx_handle, CS_CONTEXT, "context");
  cusafe_memory kind;
  switch (dl->device.device_type) {
  case kDLCUDA: kind = CUSAFE_MEMORY_DEVICE; break;
  case kDLCUDAHost: kind = CUSAFE_MEMORY_HOST_PINNED; break;
  case kDLCUDAManaged: kind = CUSAFE_MEMORY_MANAGED; break;
  default:
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "tensor on DLPack device type %d%s is not CUDA memory",
                   (int)dl->device.device_type,
                   dl->device.device_type == kDLCPU ? " (CPU)" : "");
  }
  if (kind == CUSAFE_MEMORY_DEVICE && dl->device.device_id != ctx->device)
    return cs_fail(CUSAFE_ERROR_CONTEXT_MISMATCH,
                   "tensor belongs to device %d but context belongs to "
                   "device %d",
                   (int)dl->device.device_id, ctx->device);
  int64_t lo, hi;
  cusafe_status st =
      tensor_extent(dl->dtype, dl->ndim, dl->shape, dl->strides, &lo, &hi);
  if (st != CUSAFE_SUCCESS)
    return st;
  char *start = NULL; /* an empty tensor's buffer has no memory */
  if (hi > lo) {
    if (!dl->data)
      return cs_null("tensor's data");
    uintptr_t first;
    /* The extent must not wrap around the address space. */
    if (__builtin_add_overflow((uintptr_t)dl->data, dl->byte_offset, &first) ||
        0 - (uint64_t)lo > first || (uint64_t)hi > UINTPTR_MAX - first)
      return cs_fail(CUSAFE_ERROR_INVALID_SIZE,
                     "the tensor's extent wraps around the address space");
    start = (char *)(first - (0 - (uint64_t)lo));
  }
  st = cs_buffer_wrap_new(out, ctx, kind, start, (size_t)(hi - lo), release, t);
  if (st == CUSAFE_SUCCESS)
    ctx = NULL; /* the buffer's reference now */
  return st;
}

CUSAFE_API cusafe_status cusafe_buffer_from_dlpack(
    cusafe_buffer *out, cusafe_context ctx, DLManagedTensorVersioned *tensor) {
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  if (!tensor)
    return cs_null("tensor");
  if (tensor->version.major != 1)
    return cs_fail(CUSAFE_ERROR_NOT_SUPPORTED,
                   "DLPack tensor of version %u.%u: cusafe reads version 1",
                   (unsigned)tensor->version.major,
                   (unsigned)tensor->version.minor);
  if (tensor->flags & DLPACK_FLAG_BITMASK_READ_ONLY)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "the tensor is read-only; cusafe buffers are writable");
  return import_tensor(out, ctx, &tensor->dl_tensor, release_versioned, tensor);
}

CUSAFE_API cusafe_status cusafe_buffer_from_dlpack_legacy(
    cusafe_buffer *out, cusafe_context ctx, DLManagedTensor *tensor) {
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  if (!tensor)
    return cs_null("tensor");
  return import_tensor(out, ctx, &tensor->dl_tensor, release_legacy, tensor);
}

/* ---- capsules ------------------------------------------------------------ */

CUSAFE_API void cusafe_dlpack_capsule_destructor(void *capsule) {
  const char *(*get_name)(void *) =
      (const char *(*)(void *))dlsym(RTLD_DEFAULT, "PyCapsule_GetName");
  void *(*get_pointer)(void *, const char *) =
      (void *(*)(void *, const char *))dlsym(RTLD_DEFAULT,
                                             "PyCapsule_GetPointer");
  if (!capsule || !get_name || !get_pointer)
    return;
  const char *name = get_name(capsule);
  if (!name)
    return;
  if (!strcmp(name, "dltensor_versioned")) {
    DLManagedTensorVersioned *t = get_pointer(capsule, name);
    if (t && t->deleter)
      t->deleter(t);
  } else if (!strcmp(name, "dltensor")) {
    DLManagedTensor *t = get_pointer(capsule, name);
    if (t && t->deleter)
      t->deleter(t);
  }
}
