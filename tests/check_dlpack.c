/* check_dlpack.c -- buffers as DLPack tensors, out and in (cusafe_dlpack.h),
 * and the release of Python objects (cusafe_python_release).
 *
 * Built twice, as check_api.c is: against the fake CUDA (each test forked,
 * with a fresh library; the life cycles with queued work, shutdown and exit
 * run there only) and against the real runtime, where it skips without a
 * GPU and all tests share one process. */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cusafe.h"
#include "cusafe_dlpack.h"
#include "testutil.h"

#ifdef CUSAFE_TEST_FAKE
#include "fakecuda.h"
#include "fakeutil.h"
#endif

static const cusafe_memory all_kinds[] = {
    CUSAFE_MEMORY_DEVICE, CUSAFE_MEMORY_HOST_PINNED, CUSAFE_MEMORY_MANAGED};
#define NKINDS 3

static const DLDataType f32 = {kDLFloat, 32, 1};
static const DLDataType u8 = {kDLUInt, 8, 1};

static cusafe_context ctx;

static void ctx_setup(void) {
  ctx = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&ctx, 0));
}

static void ctx_teardown(void) {
  (void)cusafe_context_release(ctx);
  ctx = CUSAFE_NULL_HANDLE;
}

/* Whether managed memory can be allocated on device 0 (not on every GPU). */
static int kind_usable(cusafe_memory kind) {
  cusafe_device_properties p;
  if (kind != CUSAFE_MEMORY_MANAGED)
    return 1;
  TU_OK(cusafe_device_get_properties(&p, 0));
  return p.managed_memory;
}

static int device_count(void) {
  int n = 0;
  TU_OK(cusafe_device_count(&n));
  return n;
}

static void *address_of(cusafe_buffer b) {
  void *p = NULL;
  TU_OK(cusafe_buffer_interop_pointer(&p, b));
  return p;
}

/* ------------------------------------------------------------------------ */
/* A producer of tensors: another library's memory (here a cusafe buffer,
 * its owner), lent as a DLPack tensor whose deleter counts its calls.     */
/* ------------------------------------------------------------------------ */

struct producer {
  DLManagedTensorVersioned versioned;
  DLManagedTensor legacy;
  int64_t shape[2], strides[2];
  cusafe_buffer owner;
  int deleted;
  int torn_down; /* whether the runtime was gone when the deleter ran */
};

static void producer_deleted(struct producer *p) {
  p->deleted++;
#ifdef CUSAFE_TEST_FAKE
  p->torn_down = fake_torn_down();
#endif
}

static void producer_delete(DLManagedTensorVersioned *t) {
  producer_deleted(t->manager_ctx);
}

static void producer_delete_legacy(DLManagedTensor *t) {
  producer_deleted(t->manager_ctx);
}

/* A tensor of 4 x 8 floats at byte 64 of a new buffer of 256 bytes of
 * `kind` (the owner), in both ABIs. */
static void producer_make(struct producer *p, cusafe_memory kind) {
  memset(p, 0, sizeof *p);
  TU_OK(cusafe_buffer_alloc(&p->owner, ctx, kind, 256));
  static const DLDeviceType types[] = {kDLCUDA, kDLCUDAHost, kDLCUDAManaged};
  p->shape[0] = 4;
  p->shape[1] = 8;
  p->strides[0] = 8;
  p->strides[1] = 1;
  DLTensor dl = {.data = address_of(p->owner),
                 .device = {types[kind], 0},
                 .ndim = 2,
                 .dtype = f32,
                 .shape = p->shape,
                 .strides = p->strides,
                 .byte_offset = 64};
  p->versioned = (DLManagedTensorVersioned){
      .version = {1, 0},
      .manager_ctx = p,
      .deleter = producer_delete,
      .flags = 0,
      .dl_tensor = dl,
  };
  p->legacy = (DLManagedTensor){
      .dl_tensor = dl, .manager_ctx = p, .deleter = producer_delete_legacy};
}

/* ------------------------------------------------------------------------ */
/* Export                                                                    */
/* ------------------------------------------------------------------------ */

/* A tensor of each kind of memory, in both ABIs: its fields describe the
 * buffer's bytes, and it keeps them valid after the buffer's handle is
 * released, until its deleter runs. */
START_TEST(test_export_fields) {
  cusafe_memory kind = all_kinds[_i % NKINDS];
  int legacy = _i >= NKINDS;
  if (!kind_usable(kind))
    return;
  static const DLDeviceType types[] = {kDLCUDA, kDLCUDAHost, kDLCUDAManaged};
  unsigned char data[128], back[128];
  cusafe_buffer b = CUSAFE_NULL_HANDLE, in = CUSAFE_NULL_HANDLE;
  const int64_t shape[2] = {4, 8};
  tu_pattern(data, sizeof data, 7);
  TU_OK(cusafe_buffer_alloc(&b, ctx, kind, 256));
  TU_OK(cusafe_buffer_write(b, 32, data, sizeof data));
  char *ptr = address_of(b);
  DLManagedTensorVersioned *v = NULL;
  DLManagedTensor *l = NULL;
  DLTensor *dl;
  if (legacy) {
    TU_OK(cusafe_buffer_to_dlpack_legacy(&l, b, 32, f32, 2, shape, NULL,
                                         CUSAFE_NULL_HANDLE));
    dl = &l->dl_tensor;
    ck_assert_ptr_nonnull(l->deleter);
  } else {
    TU_OK(cusafe_buffer_to_dlpack(&v, b, 32, f32, 2, shape, NULL,
                                  CUSAFE_NULL_HANDLE));
    dl = &v->dl_tensor;
    ck_assert_uint_eq(v->version.major, 1);
    ck_assert_uint_eq(v->version.minor, DLPACK_MINOR_VERSION);
    ck_assert_uint_eq(v->flags, 0);
    ck_assert_ptr_nonnull(v->deleter);
  }
  ck_assert_ptr_eq(dl->data, ptr + 32);
  ck_assert_uint_eq(dl->byte_offset, 0);
  ck_assert_int_eq(dl->device.device_type, types[kind]);
  ck_assert_int_eq(dl->device.device_id, 0);
  ck_assert_int_eq(dl->ndim, 2);
  ck_assert_int_eq(dl->dtype.code, kDLFloat);
  ck_assert_int_eq(dl->dtype.bits, 32);
  ck_assert_int_eq(dl->dtype.lanes, 1);
  ck_assert_int_eq(dl->shape[0], 4);
  ck_assert_int_eq(dl->shape[1], 8);
  ck_assert_int_eq(dl->strides[0], 8);
  ck_assert_int_eq(dl->strides[1], 1);
  /* The tensor's reference keeps the buffer after the caller's goes; the
   * caller's handle is stale, so that a double release cannot steal the
   * tensor's reference. */
  TU_OK(cusafe_buffer_release(b));
  TU_STALE(b);
  TU_ERR(cusafe_buffer_release(b), CUSAFE_ERROR_INVALID_HANDLE,
         "buffer 0x%016llx is stale: its object was released", TU_HX(b));
  /* Back in as a buffer: the same bytes, zero-copy. */
  if (legacy)
    TU_OK(cusafe_buffer_from_dlpack_legacy(&in, ctx, l));
  else
    TU_OK(cusafe_buffer_from_dlpack(&in, ctx, v));
  ck_assert_ptr_eq(address_of(in), ptr + 32);
  size_t size = 0;
  TU_OK(cusafe_buffer_get_size(&size, in));
  ck_assert_uint_eq(size, 128);
  TU_OK(cusafe_buffer_read(in, 0, back, sizeof back));
  TU_BYTES_EQ(back, data, sizeof data);
  /* Its release calls the tensor's deleter, which drops the last
   * reference of the exported buffer. */
  TU_OK(cusafe_buffer_release(in));
  TU_STALE(in);
#ifdef CUSAFE_TEST_FAKE
  ck_assert_uint_eq(fake_live_allocations(-1), 0); /* the deleter freed it */
#endif
}
END_TEST

/* The bytes that the elements reach must lie within the buffer; an empty
 * tensor reaches none (its data is NULL), and may start at the end. */
START_TEST(test_export_range) {
  cusafe_buffer b = CUSAFE_NULL_HANDLE, z = CUSAFE_NULL_HANDLE;
  DLManagedTensorVersioned *t = NULL;
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, 256));
  char *ptr = address_of(b);
  int64_t n = 192, minus1 = -1, zero = 0;
  TU_OK(
      cusafe_buffer_to_dlpack(&t, b, 64, u8, 1, &n, NULL, CUSAFE_NULL_HANDLE));
  t->deleter(t);
  n = 193;
  TU_ERR(
      cusafe_buffer_to_dlpack(&t, b, 64, u8, 1, &n, NULL, CUSAFE_NULL_HANDLE),
      CUSAFE_ERROR_OUT_OF_RANGE,
      "tensor of bytes [0, 193) at offset 64 exceeds buffer of 256 bytes");
  ck_assert_ptr_null(t);
  /* Negative strides reach below the element of index 0. */
  n = 4;
  TU_OK(cusafe_buffer_to_dlpack(&t, b, 3, u8, 1, &n, &minus1,
                                CUSAFE_NULL_HANDLE));
  ck_assert_ptr_eq(t->dl_tensor.data, ptr + 3);
  ck_assert_int_eq(t->dl_tensor.strides[0], -1);
  t->deleter(t);
  TU_ERR(
      cusafe_buffer_to_dlpack(&t, b, 2, u8, 1, &n, &minus1, CUSAFE_NULL_HANDLE),
      CUSAFE_ERROR_OUT_OF_RANGE,
      "tensor of bytes [-3, 1) at offset 2 exceeds buffer of 256 bytes");
  /* A stride of 0 repeats one element. */
  n = 1000;
  TU_OK(cusafe_buffer_to_dlpack(&t, b, 252, f32, 1, &n, &zero,
                                CUSAFE_NULL_HANDLE));
  t->deleter(t);
  /* Empty tensors. */
  const int64_t empty[2] = {0, 5};
  TU_OK(cusafe_buffer_to_dlpack(&t, b, 256, f32, 2, empty, NULL,
                                CUSAFE_NULL_HANDLE));
  ck_assert_ptr_null(t->dl_tensor.data);
  ck_assert_int_eq(t->dl_tensor.strides[0], 5);
  ck_assert_int_eq(t->dl_tensor.strides[1], 1);
  t->deleter(t);
  TU_ERR(cusafe_buffer_to_dlpack(&t, b, 257, f32, 2, empty, NULL,
                                 CUSAFE_NULL_HANDLE),
         CUSAFE_ERROR_OUT_OF_RANGE,
         "tensor of bytes [0, 0) at offset 257 exceeds buffer of 256 bytes");
  /* A buffer of 0 bytes, as an empty tensor; a scalar (ndim 0) of 4. */
  TU_OK(cusafe_buffer_alloc(&z, ctx, CUSAFE_MEMORY_DEVICE, 0));
  TU_OK(cusafe_buffer_to_dlpack(&t, z, 0, f32, 1, &zero, NULL,
                                CUSAFE_NULL_HANDLE));
  ck_assert_ptr_null(t->dl_tensor.data);
  t->deleter(t);
  TU_ERR(
      cusafe_buffer_to_dlpack(&t, z, 0, f32, 0, NULL, NULL, CUSAFE_NULL_HANDLE),
      CUSAFE_ERROR_OUT_OF_RANGE,
      "tensor of bytes [0, 4) at offset 0 exceeds buffer of 0 bytes");
  TU_OK(cusafe_buffer_to_dlpack(&t, b, 252, f32, 0, NULL, NULL,
                                CUSAFE_NULL_HANDLE));
  ck_assert_ptr_null(t->dl_tensor.shape);
  ck_assert_ptr_null(t->dl_tensor.strides);
  ck_assert_ptr_eq(t->dl_tensor.data, ptr + 252);
  t->deleter(t);
  TU_OK(cusafe_buffer_release(z));
  TU_OK(cusafe_buffer_release(b));
}
END_TEST

START_TEST(test_export_errors) {
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  DLManagedTensorVersioned *t = NULL;
  DLManagedTensor *l = NULL;
  int64_t shape[2] = {4, 8};
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, 256));
  TU_ERR(cusafe_buffer_to_dlpack(NULL, b, 0, f32, 2, shape, NULL,
                                 CUSAFE_NULL_HANDLE),
         CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  TU_ERR(cusafe_buffer_to_dlpack_legacy(NULL, b, 0, f32, 2, shape, NULL,
                                        CUSAFE_NULL_HANDLE),
         CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  TU_ERR(cusafe_buffer_to_dlpack(&t, CUSAFE_NULL_HANDLE, 0, f32, 2, shape, NULL,
                                 CUSAFE_NULL_HANDLE),
         CUSAFE_ERROR_INVALID_HANDLE, "buffer is the NULL handle");
  TU_ERR(cusafe_buffer_to_dlpack(&t, ctx, 0, f32, 2, shape, NULL,
                                 CUSAFE_NULL_HANDLE),
         CUSAFE_ERROR_INVALID_HANDLE,
         "buffer 0x%016llx is a context, not a buffer", TU_HX(ctx));
  TU_ERR(cusafe_buffer_to_dlpack(&t, b, 0, f32, -1, shape, NULL,
                                 CUSAFE_NULL_HANDLE),
         CUSAFE_ERROR_INVALID_VALUE, "ndim -1 is out of range (0 to 64)");
  TU_ERR(cusafe_buffer_to_dlpack_legacy(&l, b, 0, f32, 65, shape, NULL,
                                        CUSAFE_NULL_HANDLE),
         CUSAFE_ERROR_INVALID_VALUE, "ndim 65 is out of range (0 to 64)");
  ck_assert_ptr_null(l);
  TU_ERR(
      cusafe_buffer_to_dlpack(&t, b, 0, f32, 1, NULL, NULL, CUSAFE_NULL_HANDLE),
      CUSAFE_ERROR_INVALID_VALUE, "shape is NULL");
  shape[1] = -2;
  TU_ERR(cusafe_buffer_to_dlpack(&t, b, 0, f32, 2, shape, NULL,
                                 CUSAFE_NULL_HANDLE),
         CUSAFE_ERROR_INVALID_VALUE, "shape[1] is negative (-2)");
  shape[1] = 8;
  TU_ERR(cusafe_buffer_to_dlpack(&t, b, 0, (DLDataType){kDLInt, 4, 1}, 2, shape,
                                 NULL, CUSAFE_NULL_HANDLE),
         CUSAFE_ERROR_INVALID_VALUE,
         "dtype of 4 bits x 1 lanes is not a whole number of bytes");
  TU_ERR(cusafe_buffer_to_dlpack(&t, b, 0, (DLDataType){kDLInt, 8, 0}, 2, shape,
                                 NULL, CUSAFE_NULL_HANDLE),
         CUSAFE_ERROR_INVALID_VALUE,
         "dtype of 8 bits x 0 lanes is not a whole number of bytes");
  /* Extents beyond int64_t. */
  int64_t huge[2] = {INT64_MAX / 2, 4};
  TU_ERR(
      cusafe_buffer_to_dlpack(&t, b, 0, f32, 2, huge, NULL, CUSAFE_NULL_HANDLE),
      CUSAFE_ERROR_INVALID_SIZE, "the tensor's extent overflows (dimension 0)");
  int64_t big = (int64_t)1 << 61;
  TU_ERR(cusafe_buffer_to_dlpack(&t, b, 0, (DLDataType){kDLFloat, 64, 1}, 1,
                                 &big, NULL, CUSAFE_NULL_HANDLE),
         CUSAFE_ERROR_INVALID_SIZE, "the tensor's extent overflows");
  int64_t span[2] = {-((int64_t)1 << 62), (int64_t)1 << 62};
  int64_t two[2] = {2, 2};
  TU_ERR(
      cusafe_buffer_to_dlpack(&t, b, 0, u8, 2, two, span, CUSAFE_NULL_HANDLE),
      CUSAFE_ERROR_INVALID_SIZE, "the tensor's extent overflows");
  int64_t strides[2] = {INT64_MAX, 1};
  TU_ERR(cusafe_buffer_to_dlpack(&t, b, 0, f32, 2, shape, strides,
                                 CUSAFE_NULL_HANDLE),
         CUSAFE_ERROR_INVALID_SIZE,
         "the tensor's extent overflows (dimension 0)");
  /* The consumer's stream: a stream of the buffer's context. */
  TU_ERR(cusafe_buffer_to_dlpack(&t, b, 0, f32, 2, shape, NULL, ctx),
         CUSAFE_ERROR_INVALID_HANDLE,
         "stream 0x%016llx is a context, not a stream", TU_HX(ctx));
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_release(s));
  TU_ERR(cusafe_buffer_to_dlpack(&t, b, 0, f32, 2, shape, NULL, s),
         CUSAFE_ERROR_INVALID_HANDLE,
         "stream 0x%016llx is stale: its object was released", TU_HX(s));
  if (device_count() > 1) {
    cusafe_context c1 = CUSAFE_NULL_HANDLE;
    TU_OK(cusafe_context_create(&c1, 1));
    TU_OK(cusafe_stream_create(&s, c1, CUSAFE_STREAM_NON_BLOCKING, 0));
    TU_ERR(cusafe_buffer_to_dlpack(&t, b, 0, f32, 2, shape, NULL, s),
           CUSAFE_ERROR_CONTEXT_MISMATCH,
           "stream belongs to device 1 but buffer belongs to device 0");
    TU_OK(cusafe_stream_release(s));
    TU_OK(cusafe_context_release(c1));
  }
  ck_assert_ptr_null(t);
  TU_OK(cusafe_buffer_release(b));
  TU_ERR(cusafe_buffer_to_dlpack(&t, b, 0, f32, 2, shape, NULL,
                                 CUSAFE_NULL_HANDLE),
         CUSAFE_ERROR_INVALID_HANDLE,
         "buffer 0x%016llx is stale: its object was released", TU_HX(b));
}
END_TEST

/* The deleter may run on any thread. */
static void *delete_tensor(void *arg) {
  DLManagedTensorVersioned *t = arg;
  t->deleter(t);
  return NULL;
}

START_TEST(test_export_deleter_on_another_thread) {
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  DLManagedTensorVersioned *t = NULL;
  int64_t n = 64;
  pthread_t thread;
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, 256));
  TU_OK(
      cusafe_buffer_to_dlpack(&t, b, 0, f32, 1, &n, NULL, CUSAFE_NULL_HANDLE));
  TU_OK(cusafe_buffer_release(b));
  ck_assert_int_eq(pthread_create(&thread, NULL, delete_tensor, t), 0);
  ck_assert_int_eq(pthread_join(thread, NULL), 0);
  TU_STALE(b);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Import                                                                    */
/* ------------------------------------------------------------------------ */

/* Another library's tensor of each kind, in both ABIs: the buffer spans
 * its elements, and its last release calls the deleter once. */
START_TEST(test_import) {
  cusafe_memory kind = all_kinds[_i % NKINDS];
  int legacy = _i >= NKINDS;
  if (!kind_usable(kind))
    return;
  struct producer p;
  cusafe_buffer b = CUSAFE_NULL_HANDLE, view = CUSAFE_NULL_HANDLE;
  unsigned char data[128], back[128];
  tu_pattern(data, sizeof data, 9);
  producer_make(&p, kind);
  if (legacy)
    TU_OK(cusafe_buffer_from_dlpack_legacy(&b, ctx, &p.legacy));
  else
    TU_OK(cusafe_buffer_from_dlpack(&b, ctx, &p.versioned));
  ck_assert_ptr_eq(address_of(b), (char *)address_of(p.owner) + 64);
  size_t size = 0;
  cusafe_memory got = (cusafe_memory)-1;
  TU_OK(cusafe_buffer_get_size(&size, b));
  TU_OK(cusafe_buffer_get_memory(&got, b));
  ck_assert_uint_eq(size, 128);
  ck_assert_int_eq(got, kind);
  /* Written through a view of the import, read through the owner. */
  TU_OK(cusafe_buffer_view(&view, b, 0, 128));
  TU_OK(cusafe_buffer_write(view, 0, data, sizeof data));
  TU_OK(cusafe_buffer_read(p.owner, 64, back, sizeof back));
  TU_BYTES_EQ(back, data, sizeof data);
  TU_OK(cusafe_buffer_release(b));
  ck_assert_int_eq(p.deleted, 0); /* the view holds it */
  TU_OK(cusafe_buffer_release(view));
  ck_assert_int_eq(p.deleted, 1);
  TU_OK(cusafe_buffer_release(p.owner));
}
END_TEST

/* With negative strides the buffer starts at the lowest element. */
START_TEST(test_import_negative_strides) {
  struct producer p;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  producer_make(&p, CUSAFE_MEMORY_DEVICE);
  p.strides[0] = -8; /* rows backwards: row 0 is the last in memory */
  p.versioned.dl_tensor.byte_offset = 64 + 3 * 8 * 4;
  TU_OK(cusafe_buffer_from_dlpack(&b, ctx, &p.versioned));
  ck_assert_ptr_eq(address_of(b), (char *)address_of(p.owner) + 64);
  size_t size = 0;
  TU_OK(cusafe_buffer_get_size(&size, b));
  ck_assert_uint_eq(size, 128);
  TU_OK(cusafe_buffer_release(b));
  ck_assert_int_eq(p.deleted, 1);
  /* An empty tensor: a buffer of 0 bytes, whose release still deletes. */
  producer_make(&p, CUSAFE_MEMORY_DEVICE);
  p.shape[0] = 0;
  TU_OK(cusafe_buffer_from_dlpack(&b, ctx, &p.versioned));
  TU_OK(cusafe_buffer_get_size(&size, b));
  ck_assert_uint_eq(size, 0);
  ck_assert_ptr_null(address_of(b));
  TU_OK(cusafe_buffer_release(b));
  ck_assert_int_eq(p.deleted, 1);
  TU_OK(cusafe_buffer_release(p.owner));
}
END_TEST

/* Every refusal leaves the tensor the caller's: its deleter not called. */
START_TEST(test_import_errors) {
  struct producer p;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  producer_make(&p, CUSAFE_MEMORY_DEVICE);
  DLManagedTensorVersioned *t = &p.versioned;
  char *ptr = address_of(p.owner);
  TU_ERR(cusafe_buffer_from_dlpack(NULL, ctx, t), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  TU_ERR(cusafe_buffer_from_dlpack(&b, ctx, NULL), CUSAFE_ERROR_INVALID_VALUE,
         "tensor is NULL");
  TU_ERR(cusafe_buffer_from_dlpack_legacy(&b, ctx, NULL),
         CUSAFE_ERROR_INVALID_VALUE, "tensor is NULL");
  TU_ERR(cusafe_buffer_from_dlpack(&b, CUSAFE_NULL_HANDLE, t),
         CUSAFE_ERROR_INVALID_HANDLE, "context is the NULL handle");
  t->version.major = 2;
  TU_ERR(cusafe_buffer_from_dlpack(&b, ctx, t), CUSAFE_ERROR_NOT_SUPPORTED,
         "DLPack tensor of version 2.0: cusafe reads version 1");
  t->version.major = 1;
  t->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  TU_ERR(cusafe_buffer_from_dlpack(&b, ctx, t), CUSAFE_ERROR_INVALID_VALUE,
         "the tensor is read-only; cusafe buffers are writable");
  t->flags = 0;
  t->dl_tensor.device.device_type = kDLCPU;
  TU_ERR(cusafe_buffer_from_dlpack(&b, ctx, t), CUSAFE_ERROR_INVALID_VALUE,
         "tensor on DLPack device type 1 (CPU) is not CUDA memory");
  t->dl_tensor.device.device_type = kDLCUDA;
  t->dl_tensor.device.device_id = 1;
  TU_ERR(cusafe_buffer_from_dlpack(&b, ctx, t), CUSAFE_ERROR_CONTEXT_MISMATCH,
         "tensor belongs to device 1 but context belongs to device 0");
  t->dl_tensor.device.device_id = 0;
  t->dl_tensor.device.device_type = kDLCUDAHost;
  TU_ERR(cusafe_buffer_from_dlpack(&b, ctx, t), CUSAFE_ERROR_INVALID_VALUE,
         "memory at %p is device memory, not pinned host memory", ptr + 64);
  t->dl_tensor.device.device_type = kDLCUDA;
  p.shape[0] = 7; /* 224 bytes from byte 64 of 256 */
  TU_ERR(cusafe_buffer_from_dlpack(&b, ctx, t), CUSAFE_ERROR_OUT_OF_RANGE,
         "wrap of 224 bytes at offset 64 exceeds the allocation of 256 bytes "
         "at %p",
         ptr);
  p.shape[0] = -1;
  TU_ERR(cusafe_buffer_from_dlpack(&b, ctx, t), CUSAFE_ERROR_INVALID_VALUE,
         "shape[0] is negative (-1)");
  p.shape[0] = 4;
  t->dl_tensor.dtype.bits = 12;
  TU_ERR(cusafe_buffer_from_dlpack(&b, ctx, t), CUSAFE_ERROR_INVALID_VALUE,
         "dtype of 12 bits x 1 lanes is not a whole number of bytes");
  t->dl_tensor.dtype.bits = 32;
  t->dl_tensor.ndim = 65;
  TU_ERR(cusafe_buffer_from_dlpack(&b, ctx, t), CUSAFE_ERROR_INVALID_VALUE,
         "ndim 65 is out of range (0 to 64)");
  t->dl_tensor.ndim = 2;
  t->dl_tensor.data = NULL;
  t->dl_tensor.byte_offset = 0;
  TU_ERR(cusafe_buffer_from_dlpack(&b, ctx, t), CUSAFE_ERROR_INVALID_VALUE,
         "tensor's data is NULL");
  t->dl_tensor.data = (void *)(uintptr_t)4;
  p.strides[0] = -8;
  TU_ERR(cusafe_buffer_from_dlpack(&b, ctx, t), CUSAFE_ERROR_INVALID_SIZE,
         "the tensor's extent wraps around the address space");
  /* Extents whose span, or whose start, overflows. */
  p.strides[0] = -((int64_t)1 << 62);
  p.strides[1] = (int64_t)1 << 62;
  p.shape[0] = p.shape[1] = 2;
  t->dl_tensor.dtype = u8;
  t->dl_tensor.data = (void *)((uintptr_t)1 << 62);
  TU_ERR(cusafe_buffer_from_dlpack(&b, ctx, t), CUSAFE_ERROR_INVALID_SIZE,
         "the tensor's extent overflows");
  p.strides[0] = 1;
  p.strides[1] = 2;
  t->dl_tensor.data = (void *)(UINTPTR_MAX - 10);
  t->dl_tensor.byte_offset = 100;
  TU_ERR(cusafe_buffer_from_dlpack(&b, ctx, t), CUSAFE_ERROR_INVALID_SIZE,
         "the tensor's extent wraps around the address space");
  ck_assert_int_eq(p.deleted, 0);
  TU_OK(cusafe_buffer_release(p.owner));
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Life cycles with queued work, shutdown and exit (the fake only)          */
/* ------------------------------------------------------------------------ */

#ifdef CUSAFE_TEST_FAKE

/* The producer's deleter runs after the work queued on the import. */
START_TEST(test_import_release_waits_for_work) {
  struct producer p;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  producer_make(&p, CUSAFE_MEMORY_DEVICE);
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_from_dlpack(&b, ctx, &p.versioned));
  fake_set_paused(1);
  fake_log_clear();
  TU_OK(cusafe_buffer_fill(b, 0, 128, 3, s));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_buffer_release(b));
  ck_assert_int_eq(p.deleted, 1);
  ck_assert_msg(fake_log_find("exec:cudaMemsetAsync", 0) >= 0,
                "the deleter ran before the queued fill");
  fake_set_paused(0);
  TU_OK(cusafe_buffer_release(p.owner));
}
END_TEST

/* An export given the consumer's stream: that stream waits for the
 * buffer's queued work, and the memory is freed only after the work the
 * consumer queued there by address before deleting the tensor (the fake
 * aborts on work that touches freed memory). */
START_TEST(test_export_orders_consumer_stream) {
  cusafe_buffer b = CUSAFE_NULL_HANDLE, alias = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE, w = CUSAFE_NULL_HANDLE;
  cusafe_stream w2 = CUSAFE_NULL_HANDLE;
  DLManagedTensorVersioned *t = NULL;
  int64_t n = 64;
  cudaStream_t raw = fake_foreign_stream(0);
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, 256));
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_wrap(&w, ctx, raw));
  fake_set_paused(1);
  TU_OK(cusafe_buffer_fill(b, 0, 256, 1, s));
  fake_log_clear();
  TU_OK(cusafe_buffer_to_dlpack(&t, b, 0, f32, 1, &n, NULL, w));
  /* The consumer waits for the fill; cusafe's default stream, where the
   * buffer's work goes back, for the consumer's stream. */
  ck_assert_int_eq(fake_log_count("cudaStreamWaitEvent"), 2);
  TU_OK(cusafe_stream_release(w)); /* the tensor holds it */
  /* cusafe's own work after the export moves the buffer to s. */
  TU_OK(cusafe_buffer_fill(b, 0, 256, 3, s));
  TU_OK(cusafe_buffer_release(b));
  /* The consumer's work by address, on its stream. */
  TU_OK(cusafe_buffer_wrap(&alias, ctx, CUSAFE_MEMORY_DEVICE, t->dl_tensor.data,
                           256, NULL, NULL));
  TU_OK(cusafe_stream_wrap(&w2, ctx, raw));
  TU_OK(cusafe_buffer_fill(alias, 0, 256, 2, w2));
  t->deleter(t);
  TU_STALE(b);
  /* The free went to the consumer's stream, after its fill. */
  fake_set_paused(0);
  TU_OK(cusafe_stream_synchronize(s));
  TU_OK(cusafe_stream_synchronize(w2));
  TU_OK(cusafe_buffer_release(alias));
  TU_OK(cusafe_stream_release(w2));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_context_synchronize(ctx));
  fake_foreign_stream_destroy(raw);
}
END_TEST

/* After the deleter, nothing of cusafe's touches the consumer's stream:
 * it may be destroyed then (the fake aborts on a use of a destroyed
 * stream). */
START_TEST(test_export_leaves_consumer_stream) {
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE, w = CUSAFE_NULL_HANDLE;
  DLManagedTensorVersioned *t = NULL;
  int64_t n = 64;
  cudaStream_t raw = fake_foreign_stream(0);
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, 256));
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_wrap(&w, ctx, raw));
  TU_OK(cusafe_buffer_to_dlpack(&t, b, 0, f32, 1, &n, NULL, w));
  TU_OK(cusafe_stream_release(w));
  t->deleter(t);
  TU_STALE(w);
  fake_foreign_stream_destroy(raw);
  TU_OK(cusafe_buffer_fill(b, 0, 256, 1, s));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_context_synchronize(ctx));
}
END_TEST

/* A tensor whose consumer's stream is the legacy default stream, deleted
 * while a blocking stream captures (when CUDA forbids any use of the
 * legacy stream): the capture goes on unharmed, and the memory is freed
 * once the capture has ended, after the consumer's work on the legacy
 * stream.  cusafe_stream_use_buffers() on the legacy stream meanwhile
 * (what the Python package's finalizers call) waits the same way. */
START_TEST(test_deleter_on_legacy_stream_during_capture) {
  cusafe_buffer b = CUSAFE_NULL_HANDLE, alias = CUSAFE_NULL_HANDLE;
  cusafe_buffer c = CUSAFE_NULL_HANDLE, d = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE, legacy = CUSAFE_NULL_HANDLE;
  DLManagedTensorVersioned *t = NULL;
  int64_t n = 256;
  TU_OK(cusafe_stream_create(&s, ctx, 0 /* blocking */, 0));
  TU_OK(cusafe_stream_wrap(&legacy, ctx, (void *)cudaStreamLegacy));
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, 256));
  TU_OK(cusafe_buffer_alloc(&c, ctx, CUSAFE_MEMORY_DEVICE, 256));
  TU_OK(cusafe_buffer_alloc(&d, ctx, CUSAFE_MEMORY_DEVICE, 256));
  TU_OK(cusafe_buffer_to_dlpack(&t, b, 0, u8, 1, &n, NULL, legacy));
  TU_OK(cusafe_buffer_release(b));
  fake_set_paused(1);
  /* The consumer's work by address, on the legacy stream. */
  TU_OK(cusafe_buffer_wrap(&alias, ctx, CUSAFE_MEMORY_DEVICE, t->dl_tensor.data,
                           256, NULL, NULL));
  TU_OK(cusafe_buffer_fill(alias, 0, 256, 9, legacy));
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_buffer_fill(c, 0, 256, 2, s));
  size_t before = fake_live_allocations(-1);
  t->deleter(t);
  TU_OK(cusafe_stream_use_buffers(legacy, &d, 1));
  TU_OK(cusafe_buffer_release(d));
  TU_ASSERT(fake_live_allocations(-1) == before,
            "%zu allocations alive during the capture, expected %zu",
            fake_live_allocations(-1), before);
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, s));
  TU_OK(cusafe_graph_launch(g, s));
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_context_synchronize(ctx));
  TU_ASSERT(fake_live_allocations(-1) == before - 2,
            "%zu allocations alive after the capture, expected %zu",
            fake_live_allocations(-1), before - 2);
  unsigned char got[256];
  TU_OK(cusafe_buffer_read(c, 0, got, 256));
  for (int i = 0; i < 256; i++)
    TU_ASSERT(got[i] == 2, "byte %d of the graph's buffer is %u", i, got[i]);
  fake_set_paused(0);
  TU_OK(cusafe_buffer_release(alias));
  TU_OK(cusafe_buffer_release(c));
  TU_OK(cusafe_stream_release(legacy));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* An export whose consumer names the legacy default stream while a
 * blocking stream captures: that stream cannot wait for the buffer's work
 * now, so the export fails, touching nothing, and the capture goes on. */
START_TEST(test_export_to_legacy_stream_during_capture) {
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE, legacy = CUSAFE_NULL_HANDLE;
  DLManagedTensorVersioned *t = NULL;
  int64_t n = 256;
  TU_OK(cusafe_stream_create(&s, ctx, 0 /* blocking */, 0));
  TU_OK(cusafe_stream_wrap(&legacy, ctx, (void *)cudaStreamLegacy));
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, 256));
  TU_OK(cusafe_buffer_fill(b, 0, 256, 4, CUSAFE_STREAM_DEFAULT));
  TU_OK(cusafe_stream_begin_capture(s));
  TU_ERR(cusafe_buffer_to_dlpack(&t, b, 0, u8, 1, &n, NULL, legacy),
         CUSAFE_ERROR_CAPTURING,
         "stream 0x%016llx wraps a device's default stream, which CUDA lets "
         "nothing wait for while a blocking stream of the device captures",
         TU_HX(legacy));
  ck_assert_ptr_null(t);
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, s)); /* unharmed */
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_buffer_to_dlpack(&t, b, 0, u8, 1, &n, NULL, legacy));
  t->deleter(t);
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(legacy));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_context_synchronize(ctx));
}
END_TEST

/* cusafe_shutdown() with an import alive calls its deleter, once, before
 * the runtime's teardown; an export's deleter afterwards does nothing but
 * free the tensor. */
START_TEST(test_shutdown_with_tensors) {
  struct producer p;
  cusafe_buffer in = CUSAFE_NULL_HANDLE, out = CUSAFE_NULL_HANDLE;
  DLManagedTensorVersioned *t = NULL;
  int64_t n = 16;
  producer_make(&p, CUSAFE_MEMORY_DEVICE);
  TU_OK(cusafe_buffer_from_dlpack(&in, ctx, &p.versioned));
  TU_OK(cusafe_buffer_alloc(&out, ctx, CUSAFE_MEMORY_DEVICE, 64));
  TU_OK(cusafe_buffer_to_dlpack(&t, out, 0, f32, 1, &n, NULL,
                                CUSAFE_NULL_HANDLE));
  TU_OK(cusafe_shutdown());
  ck_assert_int_eq(p.deleted, 1);
  ck_assert_int_eq(p.torn_down, 0);
  TU_OK(cusafe_buffer_release(in)); /* a no-op now: never twice */
  ck_assert_int_eq(p.deleted, 1);
  t->deleter(t);
  TU_NOTHING_LIVE();
}
END_TEST

static struct producer exit_producer;
static DLManagedTensorVersioned *exit_tensor;

/* Registered before cusafe's first call: runs after its exit handler and
 * the runtime's teardown, as a consumer's late deleter would. */
static void delete_at_exit(void) {
  exit_tensor->deleter(exit_tensor);
  if (exit_producer.deleted != 1 || exit_producer.torn_down) {
    fprintf(stderr, "deleter ran %d times, %s the runtime's teardown\n",
            exit_producer.deleted,
            exit_producer.torn_down ? "after" : "before");
    _exit(TU_CHILD_FAILED);
  }
}

static void exit_with_tensors(void *arg) {
  (void)arg;
  cusafe_buffer in = CUSAFE_NULL_HANDLE, out = CUSAFE_NULL_HANDLE;
  int64_t n = 16;
  atexit(delete_at_exit);
  ctx_setup();
  producer_make(&exit_producer, CUSAFE_MEMORY_DEVICE);
  TU_OK(cusafe_buffer_from_dlpack(&in, ctx, &exit_producer.versioned));
  TU_OK(cusafe_buffer_alloc(&out, ctx, CUSAFE_MEMORY_DEVICE, 64));
  TU_OK(cusafe_buffer_to_dlpack(&exit_tensor, out, 0, f32, 1, &n, NULL,
                                CUSAFE_NULL_HANDLE));
  exit(0);
}

/* A program that exits with an import and an export alive: the import's
 * deleter runs in the ordered shutdown, the export's after it, silently. */
START_TEST(test_exit_with_tensors) {
  char err[4096];
  int status = tu_run_in_child(exit_with_tensors, NULL, err, sizeof err);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "child ended with status 0x%x: %s", status, err);
  ck_assert_str_eq(err, "");
}
END_TEST

/* A stand-in for Python's C API, found by cusafe in this executable
 * (linked with --export-dynamic): an interpreter that is initialized or
 * not, and objects that count their references. */
static int py_initialized = 1, py_gil_held, py_refs;

int Py_IsInitialized(void);
int PyGILState_Ensure(void);
void PyGILState_Release(int state);
void Py_DecRef(void *object);

int Py_IsInitialized(void) { return py_initialized; }
int PyGILState_Ensure(void) { return py_gil_held++; }
void PyGILState_Release(int state) {
  py_gil_held--;
  ck_assert_int_eq(state, py_gil_held);
}
void Py_DecRef(void *object) {
  ck_assert_ptr_eq(object, &py_refs);
  ck_assert_int_eq(py_gil_held, 1);
  py_refs--;
}

/* cusafe_python_release drops the reference with the GIL, and does
 * nothing once the interpreter has finalized; nor does the deleter of an
 * import then run, as it may need Python. */
START_TEST(test_python_finalized) {
  struct producer p;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  py_refs = 2;
  cusafe_python_release(&py_refs);
  ck_assert_int_eq(py_refs, 1);
  ck_assert_int_eq(py_gil_held, 0);
  cusafe_python_release(NULL);
  producer_make(&p, CUSAFE_MEMORY_DEVICE);
  TU_OK(cusafe_buffer_from_dlpack(&b, ctx, &p.versioned));
  py_initialized = 0;
  cusafe_python_release(&py_refs);
  ck_assert_int_eq(py_refs, 1);
  TU_OK(cusafe_buffer_release(b));
  ck_assert_int_eq(p.deleted, 0);
  py_initialized = 1;
  TU_OK(cusafe_buffer_release(p.owner));
}
END_TEST

#endif /* CUSAFE_TEST_FAKE */

/* ------------------------------------------------------------------------ */
/* Suite                                                                     */
/* ------------------------------------------------------------------------ */

static Suite *dlpack_suite(void) {
  Suite *s = suite_create("dlpack");
  TCase *tc = tcase_create("export");
  tcase_add_checked_fixture(tc, ctx_setup, ctx_teardown);
  tcase_add_loop_test(tc, test_export_fields, 0, 2 * NKINDS);
  tcase_add_test(tc, test_export_range);
  tcase_add_test(tc, test_export_errors);
  tcase_add_test(tc, test_export_deleter_on_another_thread);
  suite_add_tcase(s, tc);

  tc = tcase_create("import");
  tcase_add_checked_fixture(tc, ctx_setup, ctx_teardown);
  tcase_add_loop_test(tc, test_import, 0, 2 * NKINDS);
  tcase_add_test(tc, test_import_negative_strides);
  tcase_add_test(tc, test_import_errors);
  suite_add_tcase(s, tc);

#ifdef CUSAFE_TEST_FAKE
  tc = tcase_create("lifecycle");
  tcase_add_checked_fixture(tc, ctx_setup, ctx_teardown);
  tcase_add_test(tc, test_import_release_waits_for_work);
  tcase_add_test(tc, test_deleter_on_legacy_stream_during_capture);
  tcase_add_test(tc, test_export_to_legacy_stream_during_capture);
  tcase_add_test(tc, test_export_orders_consumer_stream);
  tcase_add_test(tc, test_export_leaves_consumer_stream);
  tcase_add_test(tc, test_shutdown_with_tensors);
  tcase_add_test(tc, test_python_finalized);
  suite_add_tcase(s, tc);
  tc = tcase_create("exit");
  tcase_add_test(tc, test_exit_with_tensors);
  suite_add_tcase(s, tc);
#endif
  return s;
}

int main(void) {
#ifdef CUSAFE_TEST_FAKE
  return tu_run_suite(dlpack_suite(), CK_FORK);
#else
  tu_require_gpu();
  return tu_run_suite(dlpack_suite(), CK_NOFORK);
#endif
}
