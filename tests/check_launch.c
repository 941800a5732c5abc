/* check_launch.c -- modules, kernels and launches, against the fake CUDA.
 *
 * Each test runs in its own process with a fresh library and a fresh fake
 * (two devices, a working driver).  Modules are fake images (FAKECUBIN
 * text, see fakecuda.h), the built-in kernels (the fake runs them on host
 * memory), or sources "compiled" by the fake NVRTC.  The fake aborts the
 * process with "fakecuda: VIOLATION: ..." when a lifetime rule is broken:
 * a library unloaded while a launch of its kernel is queued, memory freed
 * before a queued kernel that uses it ran, a primary context released with
 * a library loaded. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cusafe.h"
#include "fakecuda.h"
#include "testutil.h"
#include "fakeutil.h"
#include "faultutil.h"

#define KIB ((size_t)1024)

static const char shutdown_message[] = "cusafe has been shut down";

/* A fake image; the parameters' offsets follow from their sizes:
 *   k1     (p, 4, 8)                   0, 8, 16
 *   k0     ()
 *   small  (p), at most 128 threads, 1 KiB of static shared memory
 *   two    (p, p, 8)
 *   kall   (p, 1, 1, 2, 2, 4, 4, 8, 8, 4, 8, 16)
 *          at 0, 8, 9, 10, 12, 16, 20, 24, 32, 40, 48, 56; 72 bytes */
static const char fake_image[] = "FAKECUBIN\n"
                                 "kernel k1 p 4 8\n"
                                 "kernel k0\n"
                                 "kernel small maxthreads=128 shared=1024 p\n"
                                 "kernel two p p 8\n"
                                 "\n"
                                 "# every kind of argument\n"
                                 "kernel kall p 1 1 2 2 4 4 8 8 4 8 16\n";

/* A one-block launch on the context's default stream. */
static cusafe_launch_config config1(void) {
  cusafe_launch_config c = {{1, 1, 1}, {32, 1, 1}, 0, CUSAFE_STREAM_DEFAULT};
  return c;
}

/* A launch of grid (gx, gy, gz) and block (bx, by, bz) on the context's
 * default stream. */
static cusafe_launch_config config_dims(uint32_t gx, uint32_t gy, uint32_t gz,
                                        uint32_t bx, uint32_t by, uint32_t bz) {
  cusafe_launch_config c = {
      {gx, gy, gz}, {bx, by, bz}, 0, CUSAFE_STREAM_DEFAULT};
  return c;
}

static cusafe_module load_fake_image(cusafe_context ctx) {
  cusafe_module m = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_load_data(&m, ctx, fake_image, sizeof fake_image));
  return m;
}

/* Writes `text` to a new temporary file; returns its path (malloc'd). */
static char *write_temp(const void *data, size_t size) {
  char *path = strdup("/tmp/cusafe-check-launch-XXXXXX");
  TU_ASSERT(path != NULL, "out of memory");
  int fd = mkstemp(path);
  TU_ASSERT(fd >= 0, "mkstemp failed");
  TU_ASSERT(write(fd, data, size) == (ssize_t)size, "write failed");
  close(fd);
  return path;
}

/* ------------------------------------------------------------------------ */
/* Loading                                                                    */
/* ------------------------------------------------------------------------ */

START_TEST(test_load_data) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_kernel k = CUSAFE_NULL_HANDLE;
  size_t count = 99, sizes[16];
  TU_OK(cusafe_context_create(&ctx, 0));
  /* The image may go at once: it was copied. */
  char *copy = tu_xmalloc(sizeof fake_image);
  memcpy(copy, fake_image, sizeof fake_image);
  TU_OK(cusafe_module_load_data(&m, ctx, copy, sizeof fake_image));
  memset(copy, 0, sizeof fake_image);
  free(copy);
  TU_LIVE(m, CUSAFE_TYPE_MODULE);
  ck_assert_uint_eq(fake_live_libraries(0), 1);
  ck_assert_uint_eq(fake_live_libraries(1), 0);

  k = tu_get_kernel(m, "k1");
  TU_OK(cusafe_kernel_get_params(&count, NULL, 0, k));
  ck_assert_uint_eq(count, 3);
  memset(sizes, 0, sizeof sizes);
  TU_OK(cusafe_kernel_get_params(&count, sizes, 16, k));
  ck_assert_uint_eq(count, 3);
  ck_assert_uint_eq(sizes[0], 8);
  ck_assert_uint_eq(sizes[1], 4);
  ck_assert_uint_eq(sizes[2], 8);
  ck_assert_uint_eq(sizes[3], 0);
  TU_ERR(cusafe_kernel_get_params(NULL, sizes, 16, k),
         CUSAFE_ERROR_INVALID_VALUE, "count is NULL");
  TU_OK(cusafe_kernel_release(k));

  /* Only `capacity` sizes are written. */
  k = tu_get_kernel(m, "kall");
  for (size_t i = 0; i < 16; i++)
    sizes[i] = 777;
  TU_OK(cusafe_kernel_get_params(&count, sizes, 4, k));
  ck_assert_uint_eq(count, 12);
  const size_t want[4] = {8, 1, 1, 2};
  for (size_t i = 0; i < 4; i++)
    ck_assert_uint_eq(sizes[i], want[i]);
  ck_assert_uint_eq(sizes[4], 777);
  TU_OK(cusafe_kernel_release(k));

  k = tu_get_kernel(m, "k0");
  TU_OK(cusafe_kernel_get_params(&count, sizes, 16, k));
  ck_assert_uint_eq(count, 0);

  /* Two kernels of one name are two handles. */
  cusafe_kernel k0b = tu_get_kernel(m, "k0");
  ck_assert_uint_ne(k0b, k);
  TU_OK(cusafe_kernel_release(k0b));
  TU_OK(cusafe_kernel_release(k));

  cusafe_kernel out = (cusafe_kernel)0x1234;
  TU_ERR(cusafe_module_get_kernel(&out, m, "nope"), CUSAFE_ERROR_NOT_FOUND,
         "kernel \"nope\" not found in module <memory image>");
  ck_assert_uint_eq(out, CUSAFE_NULL_HANDLE);
  ck_assert_int_eq(cusafe_last_cuda_error(), cudaErrorSymbolNotFound);
  out = (cusafe_kernel)0x1234;
  TU_ERR(cusafe_module_get_kernel(&out, m, NULL), CUSAFE_ERROR_INVALID_VALUE,
         "name is NULL");
  ck_assert_uint_eq(out, CUSAFE_NULL_HANDLE);
  TU_ERR(cusafe_module_get_kernel(NULL, m, "k1"), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  TU_ERR(cusafe_module_get_kernel(&out, ctx, "k1"), CUSAFE_ERROR_INVALID_HANDLE,
         "module 0x%016llx is a context, not a module", TU_HX(ctx));
  TU_ERR(cusafe_module_get_kernel(&out, CUSAFE_NULL_HANDLE, "k1"),
         CUSAFE_ERROR_INVALID_HANDLE, "module is the NULL handle");

  TU_OK(cusafe_module_release(m));
  TU_STALE(m);
  ck_assert_uint_eq(fake_live_libraries(-1), 0);
  TU_ERR(cusafe_module_release(m), CUSAFE_ERROR_INVALID_HANDLE,
         "module 0x%016llx is stale: its object was released", TU_HX(m));
  TU_OK(cusafe_context_release(ctx));
  TU_NOTHING_LIVE();
}
END_TEST

START_TEST(test_load_file) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  size_t count = 0;
  char *path = write_temp(fake_image, sizeof fake_image);
  TU_OK(cusafe_context_create(&ctx, 1));
  TU_OK(cusafe_module_load_file(&m, ctx, path));
  ck_assert_uint_eq(fake_live_libraries(1), 1);
  ck_assert_uint_eq(fake_live_libraries(0), 0);
  /* The file may go once loaded. */
  unlink(path);
  cusafe_kernel k = tu_get_kernel(m, "two");
  TU_OK(cusafe_kernel_get_params(&count, NULL, 0, k));
  ck_assert_uint_eq(count, 3);
  cusafe_kernel out = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_module_get_kernel(&out, m, "nope"), CUSAFE_ERROR_NOT_FOUND,
         "kernel \"nope\" not found in module %s", path);
  TU_OK(cusafe_kernel_release(k));
  TU_OK(cusafe_module_release(m));
  TU_OK(cusafe_context_release(ctx));
  TU_NOTHING_LIVE();
  free(path);
}
END_TEST

START_TEST(test_load_errors) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = (cusafe_module)0x1234;
  static const char garbage[] = "this is no image";
  static const char ptx[] = ".version 8.0\n.target sm_90\n";
  static const char ptx_comment[] = "// Generated by NVIDIA NVVM Compiler\n";
  static const char bad_line[] = "FAKECUBIN\nkernel k1 p q\n";
  static const struct {
    const char *image;
    size_t size;
    cudaError_t err;
    const char *words;
  } bad[] = {
      {garbage, sizeof garbage, cudaErrorInvalidKernelImage,
       "device kernel image is invalid"},
      {bad_line, sizeof bad_line, cudaErrorInvalidKernelImage,
       "device kernel image is invalid"},
      {ptx, sizeof ptx, cudaErrorInvalidPtx, "a PTX JIT compilation failed"},
      {ptx_comment, sizeof ptx_comment, cudaErrorInvalidPtx,
       "a PTX JIT compilation failed"},
  };
  TU_OK(cusafe_context_create(&ctx, 0));

  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    m = (cusafe_module)0x1234;
    TU_ERR(cusafe_module_load_data(&m, ctx, bad[i].image, bad[i].size),
           CUSAFE_ERROR_INVALID_IMAGE,
           "module <memory image> cannot be loaded: %s", bad[i].words);
    ck_assert_uint_eq(m, CUSAFE_NULL_HANDLE);
    ck_assert_int_eq(cusafe_last_cuda_error(), bad[i].err);
  }

  m = (cusafe_module)0x1234;
  TU_ERR(cusafe_module_load_data(&m, ctx, NULL, 100),
         CUSAFE_ERROR_INVALID_VALUE, "image is NULL");
  ck_assert_uint_eq(m, CUSAFE_NULL_HANDLE);
  m = (cusafe_module)0x1234;
  TU_ERR(cusafe_module_load_data(&m, ctx, fake_image, 0),
         CUSAFE_ERROR_INVALID_SIZE, "image of 0 bytes");
  ck_assert_uint_eq(m, CUSAFE_NULL_HANDLE);
  TU_ERR(cusafe_module_load_data(NULL, ctx, fake_image, sizeof fake_image),
         CUSAFE_ERROR_INVALID_VALUE, "out is NULL");

  m = (cusafe_module)0x1234;
  TU_ERR(cusafe_module_load_file(&m, ctx, "/nonexistent/k.cubin"),
         CUSAFE_ERROR_INVALID_IMAGE,
         "module /nonexistent/k.cubin cannot be loaded: file not found");
  ck_assert_uint_eq(m, CUSAFE_NULL_HANDLE);
  ck_assert_int_eq(cusafe_last_cuda_error(), cudaErrorFileNotFound);
  m = (cusafe_module)0x1234;
  TU_ERR(cusafe_module_load_file(&m, ctx, NULL), CUSAFE_ERROR_INVALID_VALUE,
         "path is NULL");
  ck_assert_uint_eq(m, CUSAFE_NULL_HANDLE);
  TU_ERR(cusafe_module_load_file(NULL, ctx, "/nonexistent/k.cubin"),
         CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  char *path = write_temp(garbage, sizeof garbage);
  TU_ERR(cusafe_module_load_file(&m, ctx, path), CUSAFE_ERROR_INVALID_IMAGE,
         "module %s cannot be loaded: device kernel image is invalid", path);
  unlink(path);
  free(path);

  /* Handles are checked. */
  TU_ERR(cusafe_module_load_data(&m, CUSAFE_NULL_HANDLE, fake_image,
                                 sizeof fake_image),
         CUSAFE_ERROR_INVALID_HANDLE, "context is the NULL handle");
  TU_ERR(cusafe_module_load_builtin(&m, (cusafe_context)0x7f00000012345678ULL),
         CUSAFE_ERROR_INVALID_HANDLE,
         "context 0x7f00000012345678 is not a cusafe handle");
  ck_assert_uint_eq(fake_live_libraries(-1), 0);
  TU_OK(cusafe_context_release(ctx));
  TU_ERR(cusafe_module_load_data(&m, ctx, fake_image, sizeof fake_image),
         CUSAFE_ERROR_INVALID_HANDLE,
         "context 0x%016llx is stale: its object was released", TU_HX(ctx));
  ck_assert_uint_eq(m, CUSAFE_NULL_HANDLE);
  TU_NOTHING_LIVE();
}
END_TEST

/* The module's name in messages, for each way of loading. */
START_TEST(test_not_found_names_module) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_kernel k = CUSAFE_NULL_HANDLE;
  static const char source[] =
      "extern \"C\" __global__ void twice(float *x, size_t n) {}\n";
  TU_OK(cusafe_context_create(&ctx, 0));

  TU_OK(cusafe_module_load_builtin(&m, ctx));
  TU_ERR(cusafe_module_get_kernel(&k, m, "nope"), CUSAFE_ERROR_NOT_FOUND,
         "kernel \"nope\" not found in module <built-in kernels>");
  TU_OK(cusafe_module_release(m));

  TU_OK(cusafe_module_compile(&m, ctx, source, "twice.cu", NULL, 0));
  TU_ERR(cusafe_module_get_kernel(&k, m, "nope"), CUSAFE_ERROR_NOT_FOUND,
         "kernel \"nope\" not found in module twice.cu");
  TU_OK(cusafe_module_release(m));

  TU_OK(cusafe_module_compile(&m, ctx, source, NULL, NULL, 0));
  TU_ERR(cusafe_module_get_kernel(&k, m, "nope"), CUSAFE_ERROR_NOT_FOUND,
         "kernel \"nope\" not found in module source.cu");
  ck_assert_uint_eq(k, CUSAFE_NULL_HANDLE);
  TU_OK(cusafe_module_release(m));

  TU_OK(cusafe_context_release(ctx));
  TU_NOTHING_LIVE();
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Arguments                                                                  */
/* ------------------------------------------------------------------------ */

struct fixture {
  cusafe_context ctx, ctx1;
  cusafe_module m;
  cusafe_kernel k1, k0, small, two, kall;
  cusafe_buffer buf, buf1;
  cusafe_stream s1;
};

static void fixture_make(struct fixture *f) {
  memset(f, 0, sizeof *f);
  TU_OK(cusafe_context_create(&f->ctx, 0));
  TU_OK(cusafe_context_create(&f->ctx1, 1));
  f->m = load_fake_image(f->ctx);
  f->k1 = tu_get_kernel(f->m, "k1");
  f->k0 = tu_get_kernel(f->m, "k0");
  f->small = tu_get_kernel(f->m, "small");
  f->two = tu_get_kernel(f->m, "two");
  f->kall = tu_get_kernel(f->m, "kall");
  TU_OK(cusafe_buffer_alloc(&f->buf, f->ctx, CUSAFE_MEMORY_DEVICE, 4 * KIB));
  TU_OK(cusafe_buffer_alloc(&f->buf1, f->ctx1, CUSAFE_MEMORY_DEVICE, 4 * KIB));
  TU_OK(cusafe_stream_create(&f->s1, f->ctx1, CUSAFE_STREAM_NON_BLOCKING, 0));
}

static void fixture_release(struct fixture *f) {
  /* Parents first: children keep them. */
  const cusafe_handle all[] = {f->ctx, f->ctx1,  f->m,   f->k1,
                               f->k0,  f->small, f->two, f->kall,
                               f->buf, f->buf1,  f->s1};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    TU_OK(cusafe_release(all[i]));
  TU_NOTHING_LIVE();
}

START_TEST(test_argument_checks) {
  struct fixture f;
  cusafe_launch_config c = config1();
  int32_t four = 4;
  fixture_make(&f);
  fake_log_clear();

  TU_ERR(CUSAFE_LAUNCH(f.k1, &c, CUSAFE_ARG_BUF(f.buf), CUSAFE_ARG_F32V(1)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "kernel k1 takes 3 arguments, 2 given");
  TU_ERR(CUSAFE_LAUNCH(f.k1, &c, CUSAFE_ARG_BUF(f.buf), CUSAFE_ARG_F32V(1),
                       CUSAFE_ARG_U64V(1), CUSAFE_ARG_U64V(1)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "kernel k1 takes 3 arguments, 4 given");
  TU_ERR(cusafe_kernel_launch(f.k1, &c, NULL, 0),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "kernel k1 takes 3 arguments, 0 given");
  TU_ERR(CUSAFE_LAUNCH(f.k0, &c, CUSAFE_ARG_U64V(1)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "kernel k0 takes 0 arguments, 1 given");
  TU_ERR(CUSAFE_LAUNCH(f.k1, &c, CUSAFE_ARG_I32V(1), CUSAFE_ARG_F32V(1),
                       CUSAFE_ARG_U64V(1)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 0 of kernel k1 is 4 bytes, parameter 0 is 8 bytes");
  TU_ERR(CUSAFE_LAUNCH(f.k1, &c, CUSAFE_ARG_BUF(f.buf), CUSAFE_ARG_F64V(1),
                       CUSAFE_ARG_U64V(1)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 1 of kernel k1 is 8 bytes, parameter 1 is 4 bytes");
  TU_ERR(CUSAFE_LAUNCH(f.k1, &c, CUSAFE_ARG_BUF(f.buf), CUSAFE_ARG_F32V(1),
                       CUSAFE_ARG_U32V(1)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 2 of kernel k1 is 4 bytes, parameter 2 is 8 bytes");
  TU_ERR(CUSAFE_LAUNCH(f.k1, &c, CUSAFE_ARG_BUF(f.buf),
                       CUSAFE_ARG_INT(CUSAFE_ARG_I16, 1), CUSAFE_ARG_U64V(1)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 1 of kernel k1 is 2 bytes, parameter 1 is 4 bytes");
  {
    const cusafe_arg args[3] = {
        CUSAFE_ARG_BUF(f.buf), {(uint32_t)99, 0, {.u = 1}}, CUSAFE_ARG_U64V(1)};
    TU_ERR(cusafe_kernel_launch(f.k1, &c, args, 3),
           CUSAFE_ERROR_INVALID_ARGUMENTS, "argument 1 has unknown kind 99");
  }
  {
    const cusafe_arg args[3] = {
        {0, 0, {.u = 0}}, CUSAFE_ARG_F32V(1), CUSAFE_ARG_U64V(1)};
    TU_ERR(cusafe_kernel_launch(f.k1, &c, args, 3),
           CUSAFE_ERROR_INVALID_ARGUMENTS, "argument 0 has unknown kind 0");
  }
  {
    const cusafe_arg args[3] = {CUSAFE_ARG_BUF(f.buf),
                                {CUSAFE_ARG_BYTES, 4, {.bytes = NULL}},
                                CUSAFE_ARG_U64V(1)};
    TU_ERR(cusafe_kernel_launch(f.k1, &c, args, 3), CUSAFE_ERROR_INVALID_VALUE,
           "argument 1 has no bytes");
  }
  {
    const cusafe_arg args[3] = {CUSAFE_ARG_BUF(f.buf),
                                {CUSAFE_ARG_BYTES, 2, {.bytes = &four}},
                                CUSAFE_ARG_U64V(1)};
    TU_ERR(cusafe_kernel_launch(f.k1, &c, args, 3),
           CUSAFE_ERROR_INVALID_ARGUMENTS,
           "argument 1 of kernel k1 is 2 bytes, parameter 1 is 4 bytes");
  }
  TU_ERR(CUSAFE_LAUNCH(f.k1, NULL, CUSAFE_ARG_BUF(f.buf), CUSAFE_ARG_F32V(1),
                       CUSAFE_ARG_U64V(1)),
         CUSAFE_ERROR_INVALID_VALUE, "config is NULL");
  TU_ERR(cusafe_kernel_launch(f.k1, &c, NULL, 3), CUSAFE_ERROR_INVALID_VALUE,
         "args is NULL");
  ck_assert_int_eq(fake_log_find("cuLaunchKernel", 0), -1);

  /* BYTES of the right size pass; no arguments at all too. */
  {
    const cusafe_arg args[3] = {CUSAFE_ARG_BUF(f.buf),
                                {CUSAFE_ARG_BYTES, 4, {.bytes = &four}},
                                CUSAFE_ARG_U64V(1)};
    TU_OK(cusafe_kernel_launch(f.k1, &c, args, 3));
  }
  TU_OK(cusafe_kernel_launch(f.k0, &c, NULL, 0));
  ck_assert_uint_eq(fake_log_count("cuLaunchKernel"), 2);
  ck_assert_uint_eq(fake_log_count("exec:cudaLaunchKernel"), 2);
  fixture_release(&f);
}
END_TEST

/* Every kind of argument reaches the kernel with its value, at its
 * parameter's offset; a view passes its own address. */
START_TEST(test_argument_values) {
  struct fixture f;
  cusafe_launch_config c = config1();
  cusafe_buffer view = CUSAFE_NULL_HANDLE;
  struct {
    uint32_t a, b;
    double d;
  } blob = {0xdeadbeefu, 0x12345678u, -0.125};
  unsigned char got[128];
  void *addr = NULL;
  fixture_make(&f);
  TU_OK(cusafe_buffer_view(&view, f.buf, 24, 100));
  TU_OK(cusafe_buffer_interop_pointer(&addr, view));
  TU_OK(CUSAFE_LAUNCH(
      f.kall, &c, CUSAFE_ARG_BUF(view), CUSAFE_ARG_INT(CUSAFE_ARG_I8, -3),
      CUSAFE_ARG_UINT(CUSAFE_ARG_U8, 250), CUSAFE_ARG_INT(CUSAFE_ARG_I16, -300),
      CUSAFE_ARG_UINT(CUSAFE_ARG_U16, 60000), CUSAFE_ARG_I32V(-70000),
      CUSAFE_ARG_U32V(4000000000u), CUSAFE_ARG_I64V(-5000000000000LL),
      CUSAFE_ARG_U64V((uint64_t)1 << 40), CUSAFE_ARG_F32V(1.5f),
      CUSAFE_ARG_F64V(-2.25), CUSAFE_ARG_STRUCT(&blob)));
  ck_assert_uint_eq(fake_last_launch_args(got, sizeof got), 72);

  void *p;
  int8_t i8;
  uint8_t u8;
  int16_t i16;
  uint16_t u16;
  int32_t i32;
  uint32_t u32;
  int64_t i64;
  uint64_t u64;
  float f32;
  double f64;
  memcpy(&p, got + 0, 8);
  memcpy(&i8, got + 8, 1);
  memcpy(&u8, got + 9, 1);
  memcpy(&i16, got + 10, 2);
  memcpy(&u16, got + 12, 2);
  memcpy(&i32, got + 16, 4);
  memcpy(&u32, got + 20, 4);
  memcpy(&i64, got + 24, 8);
  memcpy(&u64, got + 32, 8);
  memcpy(&f32, got + 40, 4);
  memcpy(&f64, got + 48, 8);
  ck_assert_ptr_eq(p, addr);
  ck_assert_int_eq(i8, -3);
  ck_assert_uint_eq(u8, 250);
  ck_assert_int_eq(i16, -300);
  ck_assert_uint_eq(u16, 60000);
  ck_assert_int_eq(i32, -70000);
  ck_assert_uint_eq(u32, 4000000000u);
  ck_assert_int_eq(i64, -5000000000000LL);
  ck_assert_uint_eq(u64, (uint64_t)1 << 40);
  ck_assert(f32 == 1.5f);
  ck_assert(f64 == -2.25);
  TU_BYTES_EQ(got + 56, &blob, 16);

  /* The view's address is the buffer's plus its offset. */
  void *base = NULL;
  TU_OK(cusafe_buffer_interop_pointer(&base, f.buf));
  ck_assert_ptr_eq(addr, (char *)base + 24);
  TU_OK(cusafe_buffer_release(view));
  fixture_release(&f);
}
END_TEST

/* A kernel of 40 parameters, whose sizes cusafe keeps beyond the 16 it
 * holds inline and whose arguments go beyond the 32 a launch holds on its
 * stack, and kernels of 16 and 17 parameters, on either side of the first
 * limit.  wide's parameters are 8 groups of (p, 4, 8, 2, 1): a group at
 * offset o puts them at o, o + 8, o + 16, o + 24 and o + 26, and the next
 * group at o + 32, so 251 bytes in all. */
static const char wide_image[] =
    "FAKECUBIN\n"
    "kernel wide p 4 8 2 1 p 4 8 2 1 p 4 8 2 1 p 4 8 2 1"
    " p 4 8 2 1 p 4 8 2 1 p 4 8 2 1 p 4 8 2 1\n"
    "kernel k16 p 4 4 4 4 4 4 4 4 4 4 4 4 4 4 8\n"
    "kernel k17 p 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4 8\n";
#define WIDE_GROUPS 8
#define WIDE_PARAMS (5 * WIDE_GROUPS)

/* wide's arguments: group g passes bufs[g % 3] and values made from g. */
static void wide_args(cusafe_arg *a, const cusafe_buffer bufs[3]) {
  for (int g = 0; g < WIDE_GROUPS; g++) {
    a[5 * g] = CUSAFE_ARG_BUF(bufs[g % 3]);
    a[5 * g + 1] = CUSAFE_ARG_I32V(1000 + g);
    a[5 * g + 2] = CUSAFE_ARG_I64V(-(g + 1) * 1000000000000LL);
    a[5 * g + 3] = CUSAFE_ARG_UINT(CUSAFE_ARG_U16, 60000 + g);
    a[5 * g + 4] = CUSAFE_ARG_UINT(CUSAFE_ARG_U8, 200 + g);
  }
}

/* The last launch passed wide_args(bufs) at wide's offsets. */
static void check_wide_values(const cusafe_buffer bufs[3]) {
  unsigned char got[256];
  ck_assert_uint_eq(fake_last_launch_args(got, sizeof got), 251);
  for (int g = 0; g < WIDE_GROUPS; g++) {
    const unsigned char *o = got + 32 * g;
    void *p, *want;
    int32_t i32;
    int64_t i64;
    uint16_t u16;
    TU_OK(cusafe_buffer_interop_pointer(&want, bufs[g % 3]));
    memcpy(&p, o, 8);
    memcpy(&i32, o + 8, 4);
    memcpy(&i64, o + 16, 8);
    memcpy(&u16, o + 24, 2);
    ck_assert_ptr_eq(p, want);
    ck_assert_int_eq(i32, 1000 + g);
    ck_assert_int_eq(i64, -(g + 1) * 1000000000000LL);
    ck_assert_uint_eq(u16, 60000 + g);
    ck_assert_uint_eq(o[26], 200 + g);
  }
}

START_TEST(test_many_parameters) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_buffer bufs[3] = {CUSAFE_NULL_HANDLE};
  cusafe_arg a[WIDE_PARAMS + 1];
  size_t count = 0, sizes[WIDE_PARAMS + 1];
  TU_OK(cusafe_context_create(&ctx, 0));
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_module_load_data(&m, ctx, wide_image, sizeof wide_image));
  cusafe_kernel wide = tu_get_kernel(m, "wide");
  cusafe_kernel k16 = tu_get_kernel(m, "k16");
  cusafe_kernel k17 = tu_get_kernel(m, "k17");

  /* The sizes come back as read, on both sides of the inline limit. */
  TU_OK(cusafe_kernel_get_params(&count, sizes, WIDE_PARAMS + 1, wide));
  ck_assert_uint_eq(count, WIDE_PARAMS);
  for (int i = 0; i < WIDE_PARAMS; i++)
    ck_assert_uint_eq(sizes[i], ((const size_t[]){8, 4, 8, 2, 1})[i % 5]);
  TU_OK(cusafe_kernel_get_params(&count, sizes, WIDE_PARAMS + 1, k16));
  ck_assert_uint_eq(count, 16);
  ck_assert_uint_eq(sizes[0], 8);
  ck_assert_uint_eq(sizes[14], 4);
  ck_assert_uint_eq(sizes[15], 8);
  TU_OK(cusafe_kernel_get_params(&count, sizes, WIDE_PARAMS + 1, k17));
  ck_assert_uint_eq(count, 17);
  ck_assert_uint_eq(sizes[15], 4);
  ck_assert_uint_eq(sizes[16], 8);

  /* Two allocations and a view of the first: three buffers, two roots,
   * each passed several times. */
  TU_OK(cusafe_buffer_alloc(&bufs[0], ctx, CUSAFE_MEMORY_DEVICE, 1024));
  TU_OK(cusafe_buffer_alloc(&bufs[1], ctx, CUSAFE_MEMORY_DEVICE, 1024));
  TU_OK(cusafe_buffer_view(&bufs[2], bufs[0], 64, 256));
  wide_args(a, bufs);
  fake_set_paused(1);
  cusafe_launch_config c = config1();
  c.stream = s; /* the buffers move from the default stream to s */
  TU_OK(cusafe_kernel_launch(wide, &c, a, WIDE_PARAMS));
  check_wide_values(bufs);
  c.stream = CUSAFE_STREAM_DEFAULT; /* and back */
  TU_OK(cusafe_kernel_launch(wide, &c, a, WIDE_PARAMS));
  check_wide_values(bufs);
  TU_OK(cusafe_kernel_launch(wide, &c, a, WIDE_PARAMS)); /* no move */
  check_wide_values(bufs);

  /* Each argument is checked, the last ones too. */
  a[38] = CUSAFE_ARG_I32V(1);
  TU_ERR(cusafe_kernel_launch(wide, &c, a, WIDE_PARAMS),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 38 of kernel wide is 4 bytes, parameter 38 is 2 bytes");
  TU_ERR(cusafe_kernel_launch(wide, &c, a, WIDE_PARAMS - 1),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "kernel wide takes 40 arguments, 39 given");
  wide_args(a, bufs);
  cusafe_buffer gone = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_alloc(&gone, ctx, CUSAFE_MEMORY_DEVICE, 64));
  TU_OK(cusafe_buffer_release(gone));
  a[35] = CUSAFE_ARG_BUF(gone);
  TU_ERR(cusafe_kernel_launch(wide, &c, a, WIDE_PARAMS),
         CUSAFE_ERROR_INVALID_HANDLE,
         "argument 35 0x%016llx is stale: its object was released",
         TU_HX(gone));

  /* The queued kernels keep the buffers and the stream: released before
   * any kernel ran, they are freed after the last one. */
  wide_args(a, bufs);
  c.stream = s;
  TU_OK(cusafe_kernel_launch(wide, &c, a, WIDE_PARAMS));
  for (int i = 2; i >= 0; i--)
    TU_OK(cusafe_buffer_release(bufs[i]));
  TU_OK(cusafe_stream_release(s));
  fake_set_paused(0);
  TU_OK(cusafe_context_synchronize(ctx));
  ck_assert_uint_eq(fake_log_count("exec:cudaLaunchKernel"), 4);

  /* 16 and 17 parameters: the last size of each is checked. */
  c.stream = CUSAFE_STREAM_DEFAULT;
  for (int i = 1; i < 17; i++)
    a[i] = CUSAFE_ARG_I32V(i);
  TU_OK(cusafe_buffer_alloc(&bufs[0], ctx, CUSAFE_MEMORY_DEVICE, 64));
  a[0] = CUSAFE_ARG_BUF(bufs[0]);
  a[15] = CUSAFE_ARG_I64V(-15);
  TU_OK(cusafe_kernel_launch(k16, &c, a, 16));
  TU_ERR(cusafe_kernel_launch(k17, &c, a, 17), CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 15 of kernel k17 is 8 bytes, parameter 15 is 4 bytes");
  a[15] = CUSAFE_ARG_I32V(15);
  TU_ERR(cusafe_kernel_launch(k17, &c, a, 17), CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 16 of kernel k17 is 4 bytes, parameter 16 is 8 bytes");
  a[16] = CUSAFE_ARG_I64V(-16);
  TU_OK(cusafe_kernel_launch(k17, &c, a, 17));
  int64_t last = 0;
  unsigned char got[80];
  ck_assert_uint_eq(fake_last_launch_args(got, sizeof got), 80);
  memcpy(&last, got + 72, 8);
  ck_assert_int_eq(last, -16);

  TU_OK(cusafe_buffer_release(bufs[0]));
  TU_OK(cusafe_kernel_release(wide));
  TU_OK(cusafe_kernel_release(k16));
  TU_OK(cusafe_kernel_release(k17));
  TU_OK(cusafe_module_release(m));
  TU_OK(cusafe_context_release(ctx));
  TU_NOTHING_LIVE();
}
END_TEST

/* cusafe keeps a parameter's size in 16 bits: a kernel whose parameter
 * is larger, which CUDA does not allow today, is refused by name. */
START_TEST(test_parameter_size_limit) {
  static const char image[] = "FAKECUBIN\n"
                              "kernel big 4 65535\n"
                              "kernel huge 8 65536\n";
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_kernel k = CUSAFE_NULL_HANDLE;
  size_t count = 0, sizes[2] = {0, 0};
  fake_set_param_space(200000);
  TU_OK(cusafe_context_create(&ctx, 0));
  TU_OK(cusafe_module_load_data(&m, ctx, image, sizeof image));

  k = tu_get_kernel(m, "big");
  TU_OK(cusafe_kernel_get_params(&count, sizes, 2, k));
  ck_assert_uint_eq(count, 2);
  ck_assert_uint_eq(sizes[0], 4);
  ck_assert_uint_eq(sizes[1], 65535);
  unsigned char *blob = tu_xmalloc(65535), *got = tu_xmalloc(65539);
  for (size_t i = 0; i < 65535; i++)
    blob[i] = (unsigned char)(i * 7);
  cusafe_launch_config c = config1();
  TU_OK(
      CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_I32V(-9),
                    ((cusafe_arg){CUSAFE_ARG_BYTES, 65535, {.bytes = blob}})));
  ck_assert_uint_eq(fake_last_launch_args(got, 65539), 65539);
  int32_t first = 0;
  memcpy(&first, got, 4);
  ck_assert_int_eq(first, -9);
  TU_BYTES_EQ(got + 4, blob, 65535);
  TU_ERR(CUSAFE_LAUNCH(
             k, &c, CUSAFE_ARG_I32V(-9),
             ((cusafe_arg){CUSAFE_ARG_BYTES, 65536 + 4, {.bytes = blob}})),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 1 of kernel big is 65540 bytes, parameter 1 is 65535 "
         "bytes");
  free(blob);
  free(got);
  TU_OK(cusafe_kernel_release(k));

  k = (cusafe_kernel)0x1234;
  TU_ERR(cusafe_module_get_kernel(&k, m, "huge"), CUSAFE_ERROR_NOT_SUPPORTED,
         "parameter 1 of kernel huge in module <memory image> is 65536 "
         "bytes; cusafe supports 1 to 65535");
  ck_assert_uint_eq(k, CUSAFE_NULL_HANDLE);

  TU_OK(cusafe_module_release(m));
  TU_OK(cusafe_context_release(ctx));
  fake_set_param_space(32764);
  TU_NOTHING_LIVE();
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Configuration                                                              */
/* ------------------------------------------------------------------------ */

#define LAUNCH_K1(f, c)                                                        \
  CUSAFE_LAUNCH((f).k1, &(c), CUSAFE_ARG_BUF((f).buf), CUSAFE_ARG_F32V(1),     \
                CUSAFE_ARG_U64V(1))
#define LAUNCH_SMALL(f, c)                                                     \
  CUSAFE_LAUNCH((f).small, &(c), CUSAFE_ARG_BUF((f).buf))

START_TEST(test_config_checks) {
  struct fixture f;
  cusafe_launch_config c;
  /* Grids and blocks refused, on k1 or on small (at most 128 threads). */
  const struct {
    cusafe_launch_config config;
    int small;
    const char *message;
  } bad[] = {
      {config_dims(1, 0, 1, 32, 1, 1), 0, "grid dimension y is 0"},
      {config_dims(1, 1, 1, 0, 1, 1), 0, "block dimension x is 0"},
      {config_dims(1, 1, 0, 32, 1, 1), 0, "grid dimension z is 0"},
      {config_dims(1, 1, 1, 256, 1, 1), 1,
       "block of 256 threads exceeds the kernel's limit of 128"},
      {config_dims(1, 1, 1, 32, 8, 2), 1,
       "block of 512 threads exceeds the kernel's limit of 128"},
      {config_dims(1, 1, 1, 1024, 2, 1), 0,
       "block of 2048 threads exceeds the kernel's limit of 1024"},
      {config_dims(1, 1, 1, 1, 1, 65), 0,
       "block dimension z of 65 exceeds the device's limit of 64"},
      {config_dims(1, 1, 1, 2048, 1, 1), 0,
       "block dimension x of 2048 exceeds the device's limit of 1024"},
      {config_dims(1, 65536, 1, 32, 1, 1), 0,
       "grid dimension y of 65536 exceeds the device's limit of 65535"},
      {config_dims(2147483648u, 1, 1, 32, 1, 1), 0,
       "grid dimension x of 2147483648 exceeds the device's limit of "
       "2147483647"},
  };
  fixture_make(&f);
  fake_log_clear();

  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    c = bad[i].config;
    TU_ERR(bad[i].small ? LAUNCH_SMALL(f, c) : LAUNCH_K1(f, c),
           CUSAFE_ERROR_INVALID_CONFIGURATION, "%s", bad[i].message);
  }

  /* The opt-in limit less the kernel's static shared memory. */
  c = config1();
  c.shared_memory = 227 * KIB - 1024 + 1;
  TU_ERR(LAUNCH_SMALL(f, c), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "%zu bytes of shared memory exceed the device's limit of %zu",
         227 * KIB - 1024 + 1, 227 * KIB - 1024);
  c.shared_memory = 227 * KIB + 1;
  TU_ERR(LAUNCH_K1(f, c), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "%zu bytes of shared memory exceed the device's limit of %zu",
         227 * KIB + 1, 227 * KIB);
  ck_assert_int_eq(fake_log_find("cuLaunchKernel", 0), -1);
  ck_assert_int_eq(fake_log_find("cudaKernelSetAttributeForDevice", 0), -1);

  /* The limits themselves pass: the largest grid, the largest block. */
  c = config1();
  c.grid[0] = 2147483647u;
  c.grid[1] = 65535;
  c.grid[2] = 65535;
  c.block[0] = 128;
  TU_OK(LAUNCH_SMALL(f, c));
  c = config1();
  c.block[0] = 16;
  c.block[1] = 1;
  c.block[2] = 64;
  TU_OK(LAUNCH_K1(f, c));
  /* Up to the default limit, no opt-in. */
  c = config1();
  c.shared_memory = 48 * KIB - 1024;
  TU_OK(LAUNCH_SMALL(f, c));
  ck_assert_int_eq(fake_log_find("cudaKernelSetAttributeForDevice", 0), -1);
  /* Above it, once. */
  c.shared_memory = 227 * KIB - 1024;
  TU_OK(LAUNCH_SMALL(f, c));
  TU_OK(LAUNCH_SMALL(f, c));
  c.shared_memory = 100 * KIB;
  TU_OK(LAUNCH_SMALL(f, c));
  ck_assert_uint_eq(fake_log_count("cudaKernelSetAttributeForDevice"), 1);
  ck_assert_uint_eq(fake_log_count("exec:cudaLaunchKernel"), 6);
  fixture_release(&f);
}
END_TEST

START_TEST(test_suggest_config) {
  struct fixture f;
  uint32_t block = 0, grid = 0;
  fixture_make(&f);
  /* The fake's model: 2048 threads, 32 blocks, 228 KiB per multiprocessor. */
  TU_OK(cusafe_kernel_suggest_config(&block, &grid, f.small, 0, 1000));
  ck_assert_uint_eq(block, 128);
  ck_assert_uint_eq(grid, 8);
  TU_OK(cusafe_kernel_suggest_config(&block, &grid, f.k1, 0, 1));
  ck_assert_uint_eq(block, 1024);
  ck_assert_uint_eq(grid, 1);
  TU_OK(cusafe_kernel_suggest_config(&block, &grid, f.k1, 0, 0));
  ck_assert_uint_eq(grid, 1);
  TU_OK(cusafe_kernel_suggest_config(&block, &grid, f.small, 100000, 1000));
  ck_assert_uint_eq(block, 128);
  ck_assert_uint_eq(grid, 8);
  TU_ERR(cusafe_kernel_suggest_config(&block, &grid, f.small, 227 * KIB, 1000),
         CUSAFE_ERROR_INVALID_CONFIGURATION,
         "%zu bytes of shared memory exceed the device's limit of %zu",
         227 * KIB, 227 * KIB - 1024);
  TU_ERR(cusafe_kernel_suggest_config(NULL, &grid, f.small, 0, 1),
         CUSAFE_ERROR_INVALID_VALUE, "block is NULL");
  TU_ERR(cusafe_kernel_suggest_config(&block, NULL, f.small, 0, 1),
         CUSAFE_ERROR_INVALID_VALUE, "grid is NULL");
  fixture_release(&f);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Handles and contexts                                                       */
/* ------------------------------------------------------------------------ */

START_TEST(test_context_mismatch) {
  struct fixture f;
  cusafe_launch_config c = config1();
  fixture_make(&f);
  TU_ERR(CUSAFE_LAUNCH(f.two, &c, CUSAFE_ARG_BUF(f.buf), CUSAFE_ARG_BUF(f.buf1),
                       CUSAFE_ARG_U64V(1)),
         CUSAFE_ERROR_CONTEXT_MISMATCH,
         "argument 1 belongs to device 1 but kernel belongs to device 0");
  c.stream = f.s1;
  TU_ERR(CUSAFE_LAUNCH(f.two, &c, CUSAFE_ARG_BUF(f.buf), CUSAFE_ARG_BUF(f.buf),
                       CUSAFE_ARG_U64V(1)),
         CUSAFE_ERROR_CONTEXT_MISMATCH,
         "stream belongs to device 1 but kernel belongs to device 0");
  ck_assert_int_eq(fake_log_find("cuLaunchKernel", 0), -1);
  fixture_release(&f);
}
END_TEST

START_TEST(test_invalid_handles) {
  struct fixture f;
  cusafe_launch_config c = config1();
  cusafe_buffer gone = CUSAFE_NULL_HANDLE;
  fixture_make(&f);
  TU_OK(cusafe_buffer_alloc(&gone, f.ctx, CUSAFE_MEMORY_DEVICE, 64));
  TU_OK(cusafe_buffer_release(gone));

  TU_ERR(CUSAFE_LAUNCH(f.small, &c, CUSAFE_ARG_BUF(CUSAFE_NULL_HANDLE)),
         CUSAFE_ERROR_INVALID_HANDLE, "argument 0 is the NULL handle");
  TU_ERR(CUSAFE_LAUNCH(f.two, &c, CUSAFE_ARG_BUF(f.buf), CUSAFE_ARG_BUF(gone),
                       CUSAFE_ARG_U64V(1)),
         CUSAFE_ERROR_INVALID_HANDLE,
         "argument 1 0x%016llx is stale: its object was released", TU_HX(gone));
  TU_ERR(CUSAFE_LAUNCH(f.small, &c, CUSAFE_ARG_BUF(f.s1)),
         CUSAFE_ERROR_INVALID_HANDLE,
         "argument 0 0x%016llx is a stream, not a buffer", TU_HX(f.s1));
  TU_ERR(CUSAFE_LAUNCH(f.small, &c, CUSAFE_ARG_BUF(0x1234)),
         CUSAFE_ERROR_INVALID_HANDLE,
         "argument 0 0x0000000000001234 is not a cusafe handle");
  /* The kernel, and the stream. */
  TU_ERR(CUSAFE_LAUNCH(CUSAFE_NULL_HANDLE, &c, CUSAFE_ARG_BUF(f.buf)),
         CUSAFE_ERROR_INVALID_HANDLE, "kernel is the NULL handle");
  TU_ERR(CUSAFE_LAUNCH(f.m, &c, CUSAFE_ARG_BUF(f.buf)),
         CUSAFE_ERROR_INVALID_HANDLE,
         "kernel 0x%016llx is a module, not a kernel", TU_HX(f.m));
  c.stream = f.buf;
  TU_ERR(LAUNCH_SMALL(f, c), CUSAFE_ERROR_INVALID_HANDLE,
         "stream 0x%016llx is a buffer, not a stream", TU_HX(f.buf));
  c = config1();
  cusafe_kernel k = f.small;
  TU_OK(cusafe_kernel_release(k));
  f.small = CUSAFE_NULL_HANDLE;
  TU_ERR(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(f.buf)),
         CUSAFE_ERROR_INVALID_HANDLE,
         "kernel 0x%016llx is stale: its object was released", TU_HX(k));
  TU_ERR(cusafe_kernel_release(k), CUSAFE_ERROR_INVALID_HANDLE,
         "kernel 0x%016llx is stale: its object was released", TU_HX(k));
  size_t count;
  TU_ERR(cusafe_kernel_get_params(&count, NULL, 0, k),
         CUSAFE_ERROR_INVALID_HANDLE,
         "kernel 0x%016llx is stale: its object was released", TU_HX(k));
  ck_assert_int_eq(fake_log_find("cuLaunchKernel", 0), -1);
  fixture_release(&f);
}
END_TEST

/* Errors CUDA reports map to statuses, with CUDA's words. */
START_TEST(test_cuda_failures) {
  struct fixture f;
  cusafe_launch_config c = config1();
  cusafe_module m = (cusafe_module)0x1234;
  fixture_make(&f);

  /* The driver's launch fails, and so does the runtime's that the
   * library then makes: the runtime's error is the launch's. */
  fake_fail_function("cuLaunchKernel", cudaErrorInvalidConfiguration);
  fake_fail_function("cudaLaunchKernel", cudaErrorInvalidConfiguration);
  TU_ERR(LAUNCH_K1(f, c), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "cudaLaunchKernel failed: invalid configuration argument");
  ck_assert_int_eq(cusafe_last_cuda_error(), cudaErrorInvalidConfiguration);
  fake_fail_function("cudaLaunchKernel", cudaErrorLaunchOutOfResources);
  TU_ERR(LAUNCH_K1(f, c), CUSAFE_ERROR_CUDA,
         "cudaLaunchKernel failed: too many resources requested for launch");
  fake_fail_function("cuLaunchKernel", cudaSuccess);
  fake_fail_function("cudaLaunchKernel", cudaSuccess);
  ck_assert_uint_eq(fake_log_count("exec:cudaLaunchKernel"), 0);
  TU_OK(LAUNCH_K1(f, c));

  const struct {
    cudaError_t err;
    const char *words;
  } images[] = {
      {cudaErrorNoKernelImageForDevice,
       "no kernel image is available for execution on the device"},
      {cudaErrorUnsupportedPtxVersion,
       "the provided PTX was compiled with an unsupported toolchain."},
      {cudaErrorInvalidSource, "device kernel image is invalid"},
  };
  for (size_t i = 0; i < sizeof images / sizeof images[0]; i++) {
    fake_fail_function("cudaLibraryLoadData", images[i].err);
    m = (cusafe_module)0x1234;
    TU_ERR(cusafe_module_load_builtin(&m, f.ctx), CUSAFE_ERROR_INVALID_IMAGE,
           "module <built-in kernels> cannot be loaded: %s", images[i].words);
    ck_assert_uint_eq(m, CUSAFE_NULL_HANDLE);
    ck_assert_int_eq(cusafe_last_cuda_error(), images[i].err);
  }
  fake_fail_function("cudaLibraryLoadData", cudaErrorMemoryAllocation);
  TU_ERR(cusafe_module_load_builtin(&m, f.ctx), CUSAFE_ERROR_OUT_OF_MEMORY,
         "cudaLibraryLoadData failed: out of memory");
  fake_fail_function("cudaLibraryLoadData", cudaSuccess);

  fake_fail_function("nvrtcCompileProgram", cudaErrorMemoryAllocation);
  TU_ERR(cusafe_module_compile(&m, f.ctx, "", NULL, NULL, 0),
         CUSAFE_ERROR_OUT_OF_MEMORY,
         "nvrtcCompileProgram failed: NVRTC_ERROR_OUT_OF_MEMORY");
  ck_assert_uint_eq(fake_live_programs(), 0);
  fake_fail_function("nvrtcCompileProgram", cudaSuccess);

  /* The kernel's module can still be used, and nothing leaked. */
  ck_assert_uint_eq(fake_live_libraries(-1), 1);
  TU_OK(LAUNCH_K1(f, c));
  fixture_release(&f);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Run-time compilation                                                       */
/* ------------------------------------------------------------------------ */

static const char saxpy_source[] =
    "/* a kernel */\n"
    "extern \"C\" __global__ void saxpy(float *y, float a,\n"
    "                                   const float *__restrict__ x,\n"
    "                                   unsigned long long n) {\n"
    "  size_t i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) y[i] = a * x[i] + y[i];\n"
    "}\n"
    "extern \"C\" __global__ void __launch_bounds__(256)\n"
    "bytes(char c, short s, int i, double d, bool b) {}\n"
    "template <typename T> __global__ void hidden(T *x) {}\n";

START_TEST(test_compile) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  size_t count = 0, sizes[8];
  const char *const opts[] = {"-DN=4", "-std=c++17", "-I/tmp"};
  TU_OK(cusafe_context_create(&ctx, 0));

  TU_OK(cusafe_module_compile(&m, ctx, saxpy_source, "saxpy.cu", opts, 3));
  ck_assert_str_eq(fake_last_nvrtc_options(),
                   "-DN=4 -std=c++17 -I/tmp -arch=sm_90");
  ck_assert_str_eq(cusafe_last_compile_log(), "");
  ck_assert_uint_eq(fake_live_programs(), 0);
  cusafe_kernel k = tu_get_kernel(m, "saxpy");
  TU_OK(cusafe_kernel_get_params(&count, sizes, 8, k));
  ck_assert_uint_eq(count, 4);
  ck_assert_uint_eq(sizes[0], 8);
  ck_assert_uint_eq(sizes[1], 4);
  ck_assert_uint_eq(sizes[2], 8);
  ck_assert_uint_eq(sizes[3], 8);
  cusafe_kernel b = tu_get_kernel(m, "bytes");
  TU_OK(cusafe_kernel_get_params(&count, sizes, 8, b));
  ck_assert_uint_eq(count, 5);
  ck_assert_uint_eq(sizes[0], 1);
  ck_assert_uint_eq(sizes[1], 2);
  ck_assert_uint_eq(sizes[2], 4);
  ck_assert_uint_eq(sizes[3], 8);
  ck_assert_uint_eq(sizes[4], 1);
  cusafe_launch_config c = config1();
  c.block[0] = 512;
  TU_ERR(CUSAFE_LAUNCH(b, &c, CUSAFE_ARG_INT(CUSAFE_ARG_I8, 1),
                       CUSAFE_ARG_INT(CUSAFE_ARG_I16, 1), CUSAFE_ARG_I32V(1),
                       CUSAFE_ARG_F64V(1), CUSAFE_ARG_UINT(CUSAFE_ARG_U8, 1)),
         CUSAFE_ERROR_INVALID_CONFIGURATION,
         "block of 512 threads exceeds the kernel's limit of 256");
  cusafe_kernel out = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_module_get_kernel(&out, m, "hidden"), CUSAFE_ERROR_NOT_FOUND,
         "kernel \"hidden\" not found in module saxpy.cu");
  TU_OK(cusafe_kernel_release(b));
  TU_OK(cusafe_kernel_release(k));
  TU_OK(cusafe_module_release(m));

  /* An architecture of the caller's own is kept, and none is added. */
  const char *const arch[] = {"-arch=sm_80"};
  TU_OK(cusafe_module_compile(&m, ctx, saxpy_source, NULL, arch, 1));
  ck_assert_str_eq(fake_last_nvrtc_options(), "-arch=sm_80");
  TU_OK(cusafe_module_release(m));
  const char *const gpu_arch[] = {"--gpu-architecture=sm_90a", "-lineinfo"};
  TU_OK(cusafe_module_compile(&m, ctx, saxpy_source, NULL, gpu_arch, 2));
  ck_assert_str_eq(fake_last_nvrtc_options(),
                   "--gpu-architecture=sm_90a -lineinfo");
  TU_OK(cusafe_module_release(m));
  /* No options: only the architecture. */
  TU_OK(cusafe_module_compile(&m, ctx, saxpy_source, NULL, NULL, 0));
  ck_assert_str_eq(fake_last_nvrtc_options(), "-arch=sm_90");
  TU_OK(cusafe_module_release(m));

  /* A virtual architecture gives no cubin. */
  const char *const virt[] = {"-arch=compute_90"};
  m = (cusafe_module)0x1234;
  TU_ERR(cusafe_module_compile(&m, ctx, saxpy_source, "v.cu", virt, 1),
         CUSAFE_ERROR_COMPILE,
         "compilation of v.cu produced no cubin (was a virtual architecture "
         "given?)");
  ck_assert_uint_eq(m, CUSAFE_NULL_HANDLE);

  TU_ERR(cusafe_module_compile(&m, ctx, NULL, "x.cu", NULL, 0),
         CUSAFE_ERROR_INVALID_VALUE, "source is NULL");
  TU_ERR(cusafe_module_compile(&m, ctx, saxpy_source, "x.cu", NULL, 2),
         CUSAFE_ERROR_INVALID_VALUE, "options is NULL");
  TU_ERR(cusafe_module_compile(NULL, ctx, saxpy_source, "x.cu", NULL, 0),
         CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  TU_OK(cusafe_context_release(ctx));
  TU_NOTHING_LIVE();
}
END_TEST

START_TEST(test_compile_errors) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = (cusafe_module)0x1234;
  static const char bad[] = "int x;\n#error boom\n";
  TU_OK(cusafe_context_create(&ctx, 0));

  TU_ERR(cusafe_module_compile(&m, ctx, bad, "bad.cu", NULL, 0),
         CUSAFE_ERROR_COMPILE,
         "compilation of bad.cu failed: bad.cu(2): "
         "error: boom");
  ck_assert_uint_eq(m, CUSAFE_NULL_HANDLE);
  ck_assert_str_eq(cusafe_last_compile_log(), "bad.cu(2): error: boom");
  ck_assert_uint_eq(fake_live_programs(), 0);
  ck_assert_uint_eq(fake_live_libraries(-1), 0);

  /* An unknown option; the log names it. */
  const char *const opts[] = {"-DN=1", "--no-such-option"};
  TU_ERR(cusafe_module_compile(&m, ctx, saxpy_source, NULL, opts, 2),
         CUSAFE_ERROR_COMPILE,
         "compilation of source.cu failed: nvrtc: error: unrecognized option "
         "--no-such-option found");
  ck_assert_str_eq(cusafe_last_compile_log(),
                   "nvrtc: error: unrecognized option --no-such-option found");

  /* A parameter type NVRTC would not know either. */
  static const char odd[] =
      "extern \"C\" __global__ void k(float *x,\n  struct S s) {}\n";
  TU_ERR(cusafe_module_compile(&m, ctx, odd, "odd.cu", NULL, 0),
         CUSAFE_ERROR_COMPILE,
         "compilation of odd.cu failed: odd.cu(2): error: unknown type "
         "\"struct S s\"");

  /* A long log is cut in the message, and whole in the log. */
  size_t n = 3000;
  char *src = tu_xmalloc(n + 32), *log = tu_xmalloc(n + 64);
  strcpy(src, "#error ");
  for (size_t i = 0; i < n; i++)
    src[7 + i] = (char)('a' + i % 26);
  src[7 + n] = '\0';
  snprintf(log, n + 64, "long.cu(1): error: %s", src + 7);
  TU_STATUS(cusafe_module_compile(&m, ctx, src, "long.cu", NULL, 0),
            CUSAFE_ERROR_COMPILE);
  const char *msg = cusafe_last_error_message();
  const char *prefix = "compilation of long.cu failed: ";
  size_t len = strlen(msg);
  TU_ASSERT(len > 500 && len < strlen(prefix) + strlen(log),
            "message of %zu bytes for a log of %zu", len, strlen(log));
  TU_ASSERT(strncmp(msg, prefix, strlen(prefix)) == 0, "message \"%.60s...\"",
            msg);
  TU_ASSERT(strncmp(msg + strlen(prefix), log, len - strlen(prefix)) == 0,
            "the message does not hold the start of the log");
  ck_assert_str_eq(cusafe_last_compile_log(), log);
  /* Other calls leave the log alone; a successful compile clears it. */
  TU_ERR(cusafe_module_load_data(&m, ctx, NULL, 1), CUSAFE_ERROR_INVALID_VALUE,
         "image is NULL");
  ck_assert_str_eq(cusafe_last_compile_log(), log);
  TU_OK(cusafe_module_compile(&m, ctx, saxpy_source, NULL, NULL, 0));
  ck_assert_str_eq(cusafe_last_compile_log(), "");
  TU_OK(cusafe_module_release(m));
  free(src);
  free(log);
  TU_OK(cusafe_context_release(ctx));
  TU_NOTHING_LIVE();
}
END_TEST

/* ------------------------------------------------------------------------ */
/* The built-in kernels                                                       */
/* ------------------------------------------------------------------------ */

#define NELEM 1000
#define PAD 3 /* elements before the view; the view ends 5 before the end */
#define SENTINEL (-7.0)

/* Host arrays of doubles to and from buffers of float or double. */
static void put(cusafe_buffer b, const double *v, size_t n, int f64) {
  if (f64) {
    TU_OK(cusafe_buffer_write(b, 0, v, n * 8));
    return;
  }
  float *t = tu_xmalloc(n * 4);
  for (size_t i = 0; i < n; i++)
    t[i] = (float)v[i];
  TU_OK(cusafe_buffer_write(b, 0, t, n * 4));
  free(t);
}

static void get(cusafe_buffer b, double *v, size_t n, int f64) {
  if (f64) {
    TU_OK(cusafe_buffer_read(b, 0, v, n * 8));
    return;
  }
  float *t = tu_xmalloc(n * 4);
  TU_OK(cusafe_buffer_read(b, 0, t, n * 4));
  for (size_t i = 0; i < n; i++)
    v[i] = t[i];
  free(t);
}

static cusafe_arg scalar(double v, int f64) {
  return f64 ? CUSAFE_ARG_F64V(v) : CUSAFE_ARG_F32V((float)v);
}

/* A buffer of NELEM + 8 elements set to `init(i)` (the sentinel outside
 * the view), and the view of NELEM elements at element PAD. */
struct vec {
  cusafe_buffer whole, view;
  double host[NELEM + 8];
};

static void vec_make(struct vec *v, cusafe_context ctx, int f64,
                     double (*init)(size_t)) {
  size_t es = f64 ? 8 : 4;
  TU_OK(cusafe_buffer_alloc(&v->whole, ctx, CUSAFE_MEMORY_DEVICE,
                            (NELEM + 8) * es));
  for (size_t i = 0; i < NELEM + 8; i++)
    v->host[i] = i >= PAD && i < PAD + NELEM ? init(i - PAD) : SENTINEL;
  put(v->whole, v->host, NELEM + 8, f64);
  TU_OK(cusafe_buffer_view(&v->view, v->whole, PAD * es, NELEM * es));
}

/* Reads the buffer back: the view must hold want(i), the rest the
 * sentinel. */
static void vec_check(struct vec *v, int f64, double (*want)(size_t),
                      const char *what) {
  double got[NELEM + 8];
  get(v->whole, got, NELEM + 8, f64);
  for (size_t i = 0; i < NELEM + 8; i++) {
    double w = i >= PAD && i < PAD + NELEM ? want(i - PAD) : SENTINEL;
    TU_ASSERT(got[i] == w, "%s (%s): element %zu is %g, expected %g", what,
              f64 ? "f64" : "f32", i, got[i], w);
  }
}

static void vec_release(struct vec *v) {
  TU_OK(cusafe_buffer_release(v->view));
  TU_OK(cusafe_buffer_release(v->whole));
}

static double f_index(size_t i) { return (double)i; }
static double f_half(size_t i) { return 0.5 * (double)i; }
static double f_twice(size_t i) { return 2.0 * (double)i; }
static double f_thrice(size_t i) { return 3.0 * (double)i; }
static double f_fill(size_t i) {
  (void)i;
  return 2.5;
}
static double f_axpy(size_t i) { return 1.5 * (double)i; } /* 2 * i/4 + i */
static double f_quarter(size_t i) { return 0.25 * (double)i; }

START_TEST(test_builtin_kernels) {
  const int f64 = _i;
  const char *sfx = f64 ? "f64" : "f32";
  char name[64];
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_kernel k = CUSAFE_NULL_HANDLE;
  /* Fewer threads than elements: the kernels loop. */
  cusafe_launch_config c = {{2, 1, 1}, {64, 1, 1}, 0, CUSAFE_STREAM_DEFAULT};
  struct vec x, y, z;
  size_t count = 0, sizes[8];
  TU_OK(cusafe_context_create(&ctx, 0));
  TU_OK(cusafe_module_load_builtin(&m, ctx));
  ck_assert_uint_eq(fake_live_libraries(0), 1);

  snprintf(name, sizeof name, "cusafe_fill_%s", sfx);
  k = tu_get_kernel(m, name);
  TU_OK(cusafe_kernel_get_params(&count, sizes, 8, k));
  ck_assert_uint_eq(count, 3);
  ck_assert_uint_eq(sizes[1], f64 ? 8 : 4);
  vec_make(&x, ctx, f64, f_index);
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(x.view), scalar(2.5, f64),
                      CUSAFE_ARG_U64V(NELEM)));
  vec_check(&x, f64, f_fill, name);
  vec_release(&x);
  TU_OK(cusafe_kernel_release(k));

  snprintf(name, sizeof name, "cusafe_scale_%s", sfx);
  k = tu_get_kernel(m, name);
  vec_make(&x, ctx, f64, f_half);
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(x.view), scalar(4.0, f64),
                      CUSAFE_ARG_U64V(NELEM)));
  vec_check(&x, f64, f_twice, name);
  vec_release(&x);
  TU_OK(cusafe_kernel_release(k));

  snprintf(name, sizeof name, "cusafe_axpy_%s", sfx);
  k = tu_get_kernel(m, name);
  vec_make(&y, ctx, f64, f_index);
  vec_make(&x, ctx, f64, f_quarter);
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(y.view), scalar(2.0, f64),
                      CUSAFE_ARG_BUF(x.view), CUSAFE_ARG_U64V(NELEM)));
  vec_check(&y, f64, f_axpy, name);
  vec_check(&x, f64, f_quarter, name);
  vec_release(&x);
  vec_release(&y);
  TU_OK(cusafe_kernel_release(k));

  snprintf(name, sizeof name, "cusafe_vecadd_%s", sfx);
  k = tu_get_kernel(m, name);
  vec_make(&x, ctx, f64, f_index);
  vec_make(&y, ctx, f64, f_twice);
  vec_make(&z, ctx, f64, f_half);
  c.grid[0] = 1000; /* more threads than elements */
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(z.view), CUSAFE_ARG_BUF(x.view),
                      CUSAFE_ARG_BUF(y.view), CUSAFE_ARG_U64V(NELEM)));
  vec_check(&z, f64, f_thrice, name);
  /* In place, on a user stream, n = 0 touching nothing. */
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, 0, 0));
  c.stream = s;
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(z.view), CUSAFE_ARG_BUF(x.view),
                      CUSAFE_ARG_BUF(z.view), CUSAFE_ARG_U64V(0)));
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(x.view), CUSAFE_ARG_BUF(x.view),
                      CUSAFE_ARG_BUF(x.view), CUSAFE_ARG_U64V(NELEM)));
  vec_check(&x, f64, f_twice, name);
  vec_check(&z, f64, f_thrice, name);
  TU_OK(cusafe_stream_release(s));
  c.stream = CUSAFE_STREAM_DEFAULT;
  vec_release(&x);
  vec_release(&y);
  vec_release(&z);
  TU_OK(cusafe_kernel_release(k));

  /* A scalar of the other width is refused, with the types that the
   * built-in kernels declare. */
  snprintf(name, sizeof name, "cusafe_scale_%s", sfx);
  k = tu_get_kernel(m, name);
  vec_make(&x, ctx, f64, f_half);
  TU_ERR(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(x.view), scalar(4.0, !f64),
                       CUSAFE_ARG_U64V(NELEM)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 1 of kernel %s(%s*, %s, size_t) is a %s, parameter 1 is "
         "%s",
         name, f64 ? "double" : "float", f64 ? "double" : "float",
         f64 ? "float" : "double", f64 ? "double" : "float");
  vec_release(&x);
  TU_OK(cusafe_kernel_release(k));

  TU_OK(cusafe_module_release(m));
  TU_OK(cusafe_context_release(ctx));
  TU_NOTHING_LIVE();
}
END_TEST

/* Built-in kernels on device 1, on pinned and managed memory. */
START_TEST(test_builtin_other_memory) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_buffer a = CUSAFE_NULL_HANDLE, b = CUSAFE_NULL_HANDLE;
  cusafe_launch_config c = config1();
  float host[64], back[64];
  TU_OK(cusafe_context_create(&ctx, 1));
  TU_OK(cusafe_module_load_builtin(&m, ctx));
  ck_assert_uint_eq(fake_live_libraries(1), 1);
  cusafe_kernel k = tu_get_kernel(m, "cusafe_axpy_f32");
  TU_OK(cusafe_buffer_alloc(&a, ctx, CUSAFE_MEMORY_HOST_PINNED, sizeof host));
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_MANAGED, sizeof host));
  for (int i = 0; i < 64; i++)
    host[i] = (float)i;
  TU_OK(cusafe_buffer_write(a, 0, host, sizeof host));
  TU_OK(cusafe_buffer_write(b, 0, host, sizeof host));
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(a), CUSAFE_ARG_F32V(-1.0f),
                      CUSAFE_ARG_BUF(b), CUSAFE_ARG_U64V(64)));
  TU_OK(cusafe_buffer_read(a, 0, back, sizeof back));
  for (int i = 0; i < 64; i++)
    ck_assert(back[i] == 0.0f);
  TU_OK(cusafe_release(a));
  TU_OK(cusafe_release(b));
  TU_OK(cusafe_release(k));
  TU_OK(cusafe_release(m));
  TU_OK(cusafe_release(ctx));
  TU_NOTHING_LIVE();
}
END_TEST

/* Empty arrays: a launch over buffers and views of 0 bytes (n = 0) is a
 * launch like any other, with NULL or the view's address as the argument,
 * and keeps them alive until it ends. */
START_TEST(test_builtin_zero_size) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_buffer x = CUSAFE_NULL_HANDLE, y = CUSAFE_NULL_HANDLE;
  cusafe_buffer big = CUSAFE_NULL_HANDLE, end = CUSAFE_NULL_HANDLE;
  cusafe_launch_config c = config1();
  TU_OK(cusafe_context_create(&ctx, 0));
  TU_OK(cusafe_module_load_builtin(&m, ctx));
  cusafe_kernel k = tu_get_kernel(m, "cusafe_axpy_f32");
  size_t live = fake_live_allocations(0);
  TU_OK(cusafe_buffer_alloc(&x, ctx, CUSAFE_MEMORY_DEVICE, 0));
  TU_OK(cusafe_buffer_alloc(&y, ctx, CUSAFE_MEMORY_MANAGED, 0));
  ck_assert_uint_eq(fake_live_allocations(0), live);
  TU_OK(cusafe_buffer_alloc(&big, ctx, CUSAFE_MEMORY_DEVICE, 64));
  TU_OK(cusafe_buffer_view(&end, big, 64, 0));
  size_t launches = fake_log_count("cuLaunchKernel");
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(y), CUSAFE_ARG_F32V(2.0f),
                      CUSAFE_ARG_BUF(x), CUSAFE_ARG_U64V(0)));
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(end), CUSAFE_ARG_F32V(2.0f),
                      CUSAFE_ARG_BUF(x), CUSAFE_ARG_U64V(0)));
  ck_assert_uint_eq(fake_log_count("cuLaunchKernel"), launches + 2);
  TU_OK(cusafe_release(x));
  TU_OK(cusafe_release(y));
  TU_OK(cusafe_release(end));
  TU_OK(cusafe_release(big));
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_release(k));
  TU_OK(cusafe_release(m));
  TU_OK(cusafe_release(ctx));
  TU_NOTHING_LIVE();
}
END_TEST

/* A float pointer at an odd byte address faults the device, as on a GPU:
 * the error is sticky, and everything can still be released. */
START_TEST(test_builtin_misaligned_faults) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_buffer a = CUSAFE_NULL_HANDLE, v = CUSAFE_NULL_HANDLE;
  cusafe_launch_config c = config1();
  TU_OK(cusafe_context_create(&ctx, 0));
  TU_OK(cusafe_module_load_builtin(&m, ctx));
  cusafe_kernel k = tu_get_kernel(m, "cusafe_fill_f32");
  TU_OK(cusafe_buffer_alloc(&a, ctx, CUSAFE_MEMORY_DEVICE, 1024));
  TU_OK(cusafe_buffer_view(&v, a, 2, 512));
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(v), CUSAFE_ARG_F32V(1.0f),
                      CUSAFE_ARG_U64V(16)));
  TU_ERR_PREFIX(cusafe_context_synchronize(ctx), CUSAFE_ERROR_CUDA,
                "cudaDeviceSynchronize failed: ");
  ck_assert_int_eq(cusafe_last_cuda_error(), cudaErrorMisalignedAddress);
  cusafe_release(v);
  cusafe_release(a);
  cusafe_release(k);
  cusafe_release(m);
  cusafe_release(ctx);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Work in flight and ownership                                               */
/* ------------------------------------------------------------------------ */

/* A queued kernel keeps its buffers, kernel, module and context alive: all
 * are released before it runs, and it runs before any of them goes.
 * _i == 1 keeps the output buffer and reads it. */
START_TEST(test_release_all_while_launch_queued) {
  const int keep_output = _i;
  const size_t n = 512;
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_buffer a = CUSAFE_NULL_HANDLE, b = CUSAFE_NULL_HANDLE,
                out = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  float ha[512], hb[512], back[512];
  for (size_t i = 0; i < n; i++) {
    ha[i] = (float)i;
    hb[i] = (float)(1000 - i);
  }
  TU_OK(cusafe_context_create(&ctx, 0));
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_module_load_builtin(&m, ctx));
  cusafe_kernel k = tu_get_kernel(m, "cusafe_vecadd_f32");
  TU_OK(cusafe_buffer_alloc(&a, ctx, CUSAFE_MEMORY_DEVICE, n * 4));
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, n * 4));
  TU_OK(cusafe_buffer_alloc(&out, ctx, CUSAFE_MEMORY_DEVICE, n * 4));
  TU_OK(cusafe_buffer_write(a, 0, ha, sizeof ha));
  TU_OK(cusafe_buffer_write(b, 0, hb, sizeof hb));

  fake_set_paused(1);
  cusafe_launch_config c = {{4, 1, 1}, {128, 1, 1}, 0, s};
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(out), CUSAFE_ARG_BUF(a),
                      CUSAFE_ARG_BUF(b), CUSAFE_ARG_U64V(n)));
  ck_assert_int_eq(cusafe_stream_query(s), CUSAFE_ERROR_NOT_READY);
  fake_log_clear();
  TU_OK(cusafe_buffer_release(a));
  TU_OK(cusafe_buffer_release(b));
  if (!keep_output)
    TU_OK(cusafe_buffer_release(out));
  TU_OK(cusafe_kernel_release(k));
  TU_OK(cusafe_module_release(m));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_context_release(ctx));
  TU_STALE(k);
  TU_STALE(m);
  TU_STALE(ctx);
  if (keep_output) {
    TU_OK(cusafe_buffer_read(out, 0, back, sizeof back));
    for (size_t i = 0; i < n; i++)
      TU_ASSERT(back[i] == 1000.0f, "element %zu is %g", i, back[i]);
    TU_OK(cusafe_buffer_release(out));
  }
  long ran = fake_log_find("exec:cudaLaunchKernel", 0);
  long freed = fake_log_find("exec:cudaFreeAsync", 0);
  long unloaded = fake_log_find("cudaLibraryUnload", 0);
  ck_assert_msg(ran >= 0, "the queued kernel never ran");
  ck_assert_msg(freed > ran,
                "a buffer freed at log entry %ld, the kernel ran "
                "at %ld",
                freed, ran);
  ck_assert_msg(unloaded > ran,
                "module unloaded at log entry %ld, the "
                "kernel ran at %ld",
                unloaded, ran);
  fake_set_paused(0);
  TU_NOTHING_LIVE();
}
END_TEST

/* A launch whose buffer is already on its stream takes no lock; if the
 * buffer moves to another stream while the launch is in progress (here:
 * a fill on another stream, from inside the launch call), the launch
 * must order that stream after its kernel.  Otherwise the release queues
 * the free on the other stream, where it runs before the kernel. */
struct move_arg {
  cusafe_buffer b;
  cusafe_stream s;
  cusafe_status st;
};

static void move_buffer(void *p) {
  struct move_arg *m = p;
  m->st = cusafe_buffer_fill(m->b, 0, 64, 7, m->s);
}

START_TEST(test_buffer_moves_during_launch) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_stream s1 = CUSAFE_NULL_HANDLE, s2 = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&ctx, 0));
  TU_OK(cusafe_stream_create(&s1, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_create(&s2, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  cusafe_module m = load_fake_image(ctx);
  cusafe_kernel k = tu_get_kernel(m, "k1");
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, 64));
  fake_set_paused(1);
  cusafe_launch_config c = config1();
  c.stream = s1;
  /* The first launch moves b to s1, the second finds it there. */
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(b), CUSAFE_ARG_I32V(1),
                      CUSAFE_ARG_I64V(2)));
  struct move_arg move = {b, s2, CUSAFE_ERROR_INVALID_VALUE};
  fake_set_launch_hook(move_buffer, &move);
  fake_log_clear();
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(b), CUSAFE_ARG_I32V(3),
                      CUSAFE_ARG_I64V(4)));
  TU_OK(move.st);
  TU_OK(cusafe_buffer_release(b));
  /* s2 runs first: before its free it must wait for the second kernel. */
  TU_OK(cusafe_stream_synchronize(s2));
  long memset_at = fake_log_find("exec:cudaMemsetAsync", 0);
  long second = fake_log_find("exec:cudaLaunchKernel", 0);
  long freed = fake_log_find("exec:cudaFreeAsync", 0);
  ck_assert_msg(memset_at >= 0 && second >= 0 && freed >= 0,
                "fill at %ld, kernel at %ld, free at %ld", memset_at, second,
                freed);
  ck_assert_msg(freed > second,
                "b freed at log entry %ld, the kernel ran at "
                "%ld",
                freed, second);
  fake_set_paused(0);
  TU_OK(cusafe_stream_release(s1));
  TU_OK(cusafe_stream_release(s2));
  TU_OK(cusafe_kernel_release(k));
  TU_OK(cusafe_module_release(m));
  TU_OK(cusafe_context_release(ctx));
  TU_NOTHING_LIVE();
}
END_TEST

/* A CUDA stream cannot be wrapped while the cusafe stream that owns it is
 * being destroyed -- here released while a launch on it is in progress on
 * another thread, whose pin its destruction waits for: the wrap says so,
 * and the stream goes once the launch is done. */
struct dying_arg {
  cusafe_kernel k;
  cusafe_stream s;
  atomic_int in_launch, go;
  cusafe_status launched, released;
};

static void hold_launch(void *p) {
  struct dying_arg *d = p;
  atomic_store(&d->in_launch, 1);
  while (!atomic_load(&d->go))
    sched_yield();
}

static void *launch_on_dying(void *p) {
  struct dying_arg *d = p;
  cusafe_launch_config c = config1();
  c.stream = d->s;
  d->launched = cusafe_kernel_launch(d->k, &c, NULL, 0);
  return NULL;
}

static void *release_dying(void *p) {
  struct dying_arg *d = p;
  d->released = cusafe_stream_release(d->s);
  return NULL;
}

START_TEST(test_wrap_of_stream_being_destroyed) {
  struct dying_arg d = {.launched = CUSAFE_ERROR_INVALID_VALUE,
                        .released = CUSAFE_ERROR_INVALID_VALUE};
  cusafe_context ctx;
  TU_OK(cusafe_context_create(&ctx, 0));
  cusafe_module m = load_fake_image(ctx);
  d.k = tu_get_kernel(m, "k0"); /* no buffer holds the stream */
  size_t streams = fake_live_streams(0);
  TU_OK(cusafe_stream_create(&d.s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  void *raw;
  TU_OK(cusafe_stream_interop_handle(&raw, d.s));
  fake_set_launch_hook(hold_launch, &d);
  pthread_t launcher, releaser;
  TU_ASSERT(pthread_create(&launcher, NULL, launch_on_dying, &d) == 0,
            "pthread_create failed");
  while (!atomic_load(&d.in_launch))
    sched_yield();
  TU_ASSERT(pthread_create(&releaser, NULL, release_dying, &d) == 0,
            "pthread_create failed");
  /* Until the release has dropped the last reference: launches take no
   * reference, so that this thread cannot become the last holder. */
  cusafe_launch_config c = config1();
  c.stream = d.s;
  cusafe_status st;
  while ((st = cusafe_kernel_launch(d.k, &c, NULL, 0)) == CUSAFE_SUCCESS)
    sched_yield();
  TU_ASSERT(st == CUSAFE_ERROR_INVALID_HANDLE, "the launch gave %d (%s)",
            (int)st, cusafe_last_error_message());
  cusafe_stream w = 42;
  char want[256];
  snprintf(want, sizeof want,
           "stream %p is being destroyed: stream 0x%016llx, which owns it, "
           "was released",
           raw, (unsigned long long)d.s);
  TU_ERR(cusafe_stream_wrap(&w, ctx, raw), CUSAFE_ERROR_INVALID_VALUE, "%s",
         want);
  ck_assert_uint_eq(w, CUSAFE_NULL_HANDLE);
  atomic_store(&d.go, 1);
  TU_ASSERT(pthread_join(launcher, NULL) == 0, "pthread_join failed");
  TU_ASSERT(pthread_join(releaser, NULL) == 0, "pthread_join failed");
  TU_OK(d.launched);
  TU_OK(d.released);
  ck_assert_uint_eq(fake_live_streams(0), streams);
  TU_OK(cusafe_kernel_release(d.k));
  TU_OK(cusafe_module_release(m));
  TU_OK(cusafe_context_release(ctx));
  TU_NOTHING_LIVE();
}
END_TEST

/* Shutdown with a launch queued: it runs before anything is freed. */
START_TEST(test_shutdown_with_launch_queued) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_buffer a = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&ctx, 0));
  TU_OK(cusafe_module_load_builtin(&m, ctx));
  cusafe_kernel k = tu_get_kernel(m, "cusafe_fill_f64");
  TU_OK(cusafe_buffer_alloc(&a, ctx, CUSAFE_MEMORY_DEVICE, 8000));
  fake_set_paused(1);
  cusafe_launch_config c = config1();
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(a), CUSAFE_ARG_F64V(1.0),
                      CUSAFE_ARG_U64V(1000)));
  TU_OK(cusafe_kernel_retain(k)); /* extra references change nothing */
  TU_OK(cusafe_module_retain(m));
  fake_log_clear();
  TU_OK(cusafe_shutdown());
  long ran = fake_log_find("exec:cudaLaunchKernel", 0);
  ck_assert_msg(ran >= 0, "the queued kernel never ran");
  ck_assert_msg(fake_log_find("exec:cudaFreeAsync", 0) > ran,
                "memory freed before the kernel ran");
  ck_assert_msg(fake_log_find("cudaLibraryUnload", 0) > ran,
                "module unloaded before the kernel ran");
  TU_NOTHING_LIVE();
}
END_TEST

/* The caller's handle of a module goes with its last reference; its
 * kernels keep the module itself. */
START_TEST(test_kernel_keeps_module) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_buffer a = CUSAFE_NULL_HANDLE;
  cusafe_launch_config c = config1();
  float back[4];
  TU_OK(cusafe_context_create(&ctx, 0));
  TU_OK(cusafe_module_load_builtin(&m, ctx));
  cusafe_kernel k = tu_get_kernel(m, "cusafe_fill_f32");
  TU_OK(cusafe_module_release(m));
  TU_STALE(m);
  ck_assert_uint_eq(fake_live_libraries(0), 1);
  cusafe_kernel k2 = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_module_get_kernel(&k2, m, "cusafe_fill_f64"),
         CUSAFE_ERROR_INVALID_HANDLE,
         "module 0x%016llx is stale: its object was released", TU_HX(m));
  TU_ERR(cusafe_module_release(m), CUSAFE_ERROR_INVALID_HANDLE,
         "module 0x%016llx is stale: its object was released", TU_HX(m));
  TU_OK(cusafe_buffer_alloc(&a, ctx, CUSAFE_MEMORY_DEVICE, sizeof back));
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(a), CUSAFE_ARG_F32V(7.0f),
                      CUSAFE_ARG_U64V(4)));
  TU_OK(cusafe_buffer_read(a, 0, back, sizeof back));
  for (int i = 0; i < 4; i++)
    ck_assert(back[i] == 7.0f);
  /* Retained and released, the kernel lives on to its last reference. */
  TU_OK(cusafe_kernel_retain(k));
  TU_OK(cusafe_kernel_release(k));
  TU_LIVE(k, CUSAFE_TYPE_KERNEL);
  TU_OK(cusafe_kernel_release(k));
  TU_STALE(k);
  ck_assert_uint_eq(fake_live_libraries(0), 0);
  TU_OK(cusafe_buffer_release(a));
  TU_OK(cusafe_context_release(ctx));
  TU_NOTHING_LIVE();
}
END_TEST

START_TEST(test_module_keeps_context) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_launch_config c = config1();
  TU_OK(cusafe_context_create(&ctx, 1));
  m = load_fake_image(ctx);
  TU_OK(cusafe_context_release(ctx));
  TU_STALE(ctx);
  ck_assert_int_gt(fake_primary_ctx_refcount(1), 0);
  cusafe_kernel k = tu_get_kernel(m, "k0");
  /* The context's default stream still works. */
  TU_OK(cusafe_kernel_launch(k, &c, NULL, 0));
  ck_assert_uint_eq(fake_log_count("exec:cudaLaunchKernel"), 1);
  TU_OK(cusafe_module_release(m));
  ck_assert_int_gt(fake_primary_ctx_refcount(1), 0);
  ck_assert_uint_eq(fake_live_libraries(1), 1);
  TU_OK(cusafe_kernel_release(k));
  /* The kernel went last: with it the module, then the context. */
  ck_assert_uint_eq(fake_live_libraries(1), 0);
  TU_NOTHING_LIVE();
}
END_TEST

START_TEST(test_shutdown_unloads_everything) {
  struct fixture f;
  cusafe_module b = CUSAFE_NULL_HANDLE, comp = CUSAFE_NULL_HANDLE;
  fixture_make(&f);
  TU_OK(cusafe_module_load_builtin(&b, f.ctx1));
  cusafe_kernel kb = tu_get_kernel(b, "cusafe_scale_f64");
  TU_OK(cusafe_module_compile(&comp, f.ctx, saxpy_source, NULL, NULL, 0));
  cusafe_kernel kc = tu_get_kernel(comp, "saxpy");
  TU_OK(cusafe_module_release(b)); /* the kernel keeps it */
  TU_OK(cusafe_kernel_retain(f.k1));
  ck_assert_uint_eq(fake_live_libraries(-1), 3);
  unsigned long calls = fake_call_count();
  TU_OK(cusafe_shutdown());
  ck_assert_uint_gt(fake_call_count(), calls);
  TU_NOTHING_LIVE();

  /* Afterwards every call is refused without calling CUDA, and every
   * release is a silent no-op. */
  calls = fake_call_count();
  cusafe_module m = (cusafe_module)0x1234;
  cusafe_kernel k = (cusafe_kernel)0x1234;
  cusafe_launch_config c = config1();
  size_t count;
  uint32_t block, grid;
  TU_ERR(cusafe_module_load_builtin(&m, f.ctx), CUSAFE_ERROR_SHUTDOWN, "%s",
         shutdown_message);
  TU_ERR(cusafe_module_load_data(&m, f.ctx, fake_image, sizeof fake_image),
         CUSAFE_ERROR_SHUTDOWN, "%s", shutdown_message);
  TU_ERR(cusafe_module_load_file(&m, f.ctx, "/tmp/x"), CUSAFE_ERROR_SHUTDOWN,
         "%s", shutdown_message);
  TU_ERR(cusafe_module_compile(&m, f.ctx, saxpy_source, NULL, NULL, 0),
         CUSAFE_ERROR_SHUTDOWN, "%s", shutdown_message);
  TU_ERR(cusafe_module_get_kernel(&k, f.m, "k1"), CUSAFE_ERROR_SHUTDOWN, "%s",
         shutdown_message);
  ck_assert_uint_eq(k, CUSAFE_NULL_HANDLE);
  TU_ERR(cusafe_module_retain(f.m), CUSAFE_ERROR_SHUTDOWN, "%s",
         shutdown_message);
  TU_ERR(cusafe_kernel_retain(f.k1), CUSAFE_ERROR_SHUTDOWN, "%s",
         shutdown_message);
  TU_ERR(cusafe_kernel_get_params(&count, NULL, 0, f.k1), CUSAFE_ERROR_SHUTDOWN,
         "%s", shutdown_message);
  TU_ERR(LAUNCH_K1(f, c), CUSAFE_ERROR_SHUTDOWN, "%s", shutdown_message);
  TU_ERR(cusafe_kernel_suggest_config(&block, &grid, f.k1, 0, 10),
         CUSAFE_ERROR_SHUTDOWN, "%s", shutdown_message);
  TU_OK(cusafe_kernel_release(kb));
  TU_OK(cusafe_kernel_release(kc));
  TU_OK(cusafe_module_release(comp));
  fixture_release(&f);
  TU_OK(cusafe_release(f.k1));
  ck_assert_uint_eq(fake_call_count(), calls);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Fault injection                                                            */
/* ------------------------------------------------------------------------ */

struct composite {
  cusafe_context ctx;
  cusafe_module m;
  cusafe_kernel k;
  cusafe_buffer a, b, out;
  cusafe_stream s;
};

/* Runs the module's kernel on a and b into out and checks the result. */
static cusafe_status composite_work(struct composite *c, int *step,
                                    int builtin) {
  float ha[300], hb[300], back[300];
  for (int i = 0; i < 300; i++) {
    ha[i] = (float)i;
    hb[i] = 0.5f * (float)i;
  }
  TU_STEP_NEW(
      step, c->s,
      cusafe_stream_create(&c->s, c->ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_STEP_NEW(
      step, c->a,
      cusafe_buffer_alloc(&c->a, c->ctx, CUSAFE_MEMORY_DEVICE, sizeof ha));
  TU_STEP_NEW(
      step, c->b,
      cusafe_buffer_alloc(&c->b, c->ctx, CUSAFE_MEMORY_DEVICE, sizeof hb));
  TU_STEP_NEW(
      step, c->out,
      cusafe_buffer_alloc(&c->out, c->ctx, CUSAFE_MEMORY_DEVICE, sizeof back));
  TU_STEP(step, cusafe_buffer_write(c->a, 0, ha, sizeof ha));
  TU_STEP(step, cusafe_buffer_write(c->b, 0, hb, sizeof hb));
  cusafe_launch_config cfg = {{2, 1, 1}, {128, 1, 1}, 64 * KIB, c->s};
  if (builtin) {
    TU_STEP(step, CUSAFE_LAUNCH(c->k, &cfg, CUSAFE_ARG_BUF(c->out),
                                CUSAFE_ARG_BUF(c->a), CUSAFE_ARG_BUF(c->b),
                                CUSAFE_ARG_U64V(300)));
  } else {
    TU_STEP(step, CUSAFE_LAUNCH(c->k, &cfg, CUSAFE_ARG_BUF(c->out),
                                CUSAFE_ARG_BUF(c->a), CUSAFE_ARG_F32V(2.0f),
                                CUSAFE_ARG_U64V(300)));
  }
  TU_STEP(step, cusafe_stream_synchronize(c->s));
  TU_STEP(step, cusafe_buffer_read(c->out, 0, back, sizeof back));
  if (builtin)
    for (int i = 0; i < 300; i++)
      TU_ASSERT(back[i] == 1.5f * (float)i,
                "every step succeeded but element %d is %g", i, back[i]);
  return CUSAFE_SUCCESS;
}

static cusafe_status composite_builtin(void *state, int *step) {
  struct composite *c = state;
  TU_STEP_NEW(step, c->ctx, cusafe_context_create(&c->ctx, 0));
  TU_STEP_NEW(step, c->m, cusafe_module_load_builtin(&c->m, c->ctx));
  TU_STEP_NEW(step, c->k,
              cusafe_module_get_kernel(&c->k, c->m, "cusafe_vecadd_f32"));
  return composite_work(c, step, 1);
}

static cusafe_status composite_compiled(void *state, int *step) {
  static const char source[] =
      "extern \"C\" __global__ void ax(float *y, const float *x, float a,\n"
      "                                size_t n) {}\n";
  const char *const opts[] = {"-DM=3"};
  struct composite *c = state;
  TU_STEP_NEW(step, c->ctx, cusafe_context_create(&c->ctx, 0));
  TU_STEP_NEW(step, c->m,
              cusafe_module_compile(&c->m, c->ctx, source, "ax.cu", opts, 1));
  TU_STEP_NEW(step, c->k, cusafe_module_get_kernel(&c->k, c->m, "ax"));
  return composite_work(c, step, 0);
}

/* The context and module first: their children keep them. */
static void composite_release(void *state) {
  struct composite *c = state;
  const cusafe_handle all[] = {c->ctx, c->m, c->k, c->a, c->b, c->out, c->s};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    TU_OK(cusafe_release(all[i]));
}

static const struct tu_composite builtin_composite = {
    sizeof(struct composite), composite_builtin, composite_release};
static const struct tu_composite compiled_composite = {
    sizeof(struct composite), composite_compiled, composite_release};

START_TEST(test_fault_injection_builtin) {
  tu_fault_loop(&builtin_composite, _i);
}
END_TEST

START_TEST(test_fault_injection_compiled) {
  tu_fault_loop(&compiled_composite, _i);
}
END_TEST

/* Without fault injection the composite operations succeed and leave
 * nothing behind. */
START_TEST(test_composites_succeed) {
  tu_composite_succeeds(&builtin_composite);
  tu_composite_succeeds(&compiled_composite);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Launches with attributes                                                   */
/* ------------------------------------------------------------------------ */

static cusafe_launch_attr attr_cluster(uint32_t x, uint32_t y, uint32_t z) {
  cusafe_launch_attr a;
  memset(&a, 0, sizeof a);
  a.id = CUSAFE_LAUNCH_ATTR_CLUSTER;
  a.value.dim[0] = x;
  a.value.dim[1] = y;
  a.value.dim[2] = z;
  return a;
}

static cusafe_launch_attr attr_flag(uint32_t id, int32_t flag) {
  cusafe_launch_attr a;
  memset(&a, 0, sizeof a);
  a.id = id;
  a.value.flag = flag;
  return a;
}

static cusafe_launch_attr attr_priority(int32_t priority) {
  cusafe_launch_attr a;
  memset(&a, 0, sizeof a);
  a.id = CUSAFE_LAUNCH_ATTR_PRIORITY;
  a.value.priority = priority;
  return a;
}

/* A launch of k0 (no parameters) on grid gx of blocks of bx threads. */
static cusafe_status launch_k0(cusafe_kernel k, uint32_t gx, uint32_t bx,
                               const cusafe_launch_attr *attrs, size_t n) {
  cusafe_launch_config c = config_dims(gx, 1, 1, bx, 1, 1);
  return cusafe_kernel_launch_ex(k, &c, attrs, n, NULL, 0);
}

/* Nothing reached CUDA's launch calls. */
static void assert_no_launch(void) {
  ck_assert_uint_eq(fake_log_count("cuLaunchKernelEx"), 0);
  ck_assert_uint_eq(fake_log_count("cuLaunchKernel"), 0);
  ck_assert_uint_eq(fake_log_count("cudaLaunchKernelExC"), 0);
  ck_assert_uint_eq(fake_log_count("cudaLaunchKernel"), 0);
  ck_assert_uint_eq(fake_log_count("exec:cudaLaunchKernel"), 0);
}

START_TEST(test_ex_layout) {
  ck_assert_uint_eq(sizeof(cusafe_launch_attr), 24);
  ck_assert_uint_eq(offsetof(cusafe_launch_attr, value), 8);
  ck_assert_uint_eq(sizeof(cusafe_launch_config), 40);
}
END_TEST

/* Without attributes the call is cusafe_kernel_launch: cuLaunchKernel. */
START_TEST(test_ex_without_attributes) {
  struct fixture f;
  cusafe_launch_config c = config1();
  int32_t four = 4;
  fixture_make(&f);
  fake_log_clear();
  const cusafe_arg args[] = {CUSAFE_ARG_BUF(f.buf), CUSAFE_ARG_I32V(four),
                             CUSAFE_ARG_U64V(8)};
  TU_OK(cusafe_kernel_launch_ex(f.k1, &c, NULL, 0, args, 3));
  TU_ERR(cusafe_kernel_launch_ex(f.k1, &c, NULL, 0, args, 2),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "kernel k1 takes 3 arguments, 2 given");
  ck_assert_uint_eq(fake_log_count("cuLaunchKernel"), 1);
  ck_assert_uint_eq(fake_log_count("cuLaunchKernelEx"), 0);
  ck_assert_uint_eq(fake_last_launch_attrs(NULL, 0), 0);
  fixture_release(&f);
}
END_TEST

/* The attributes reach cuLaunchKernelEx exactly. */
START_TEST(test_ex_attributes_reach_cuda) {
  struct fixture f;
  cudaLaunchAttribute got[8];
  fixture_make(&f);
  fake_log_clear();
  const cusafe_launch_attr a[] = {
      attr_cluster(2, 1, 1),
      attr_flag(CUSAFE_LAUNCH_ATTR_PROGRAMMATIC_SERIALIZATION, 1),
      attr_priority(-3)};
  cusafe_launch_config c = config_dims(4, 2, 1, 64, 1, 1);
  int32_t four = 4;
  const cusafe_arg args[] = {CUSAFE_ARG_BUF(f.buf), CUSAFE_ARG_I32V(four),
                             CUSAFE_ARG_U64V(8)};
  TU_OK(cusafe_kernel_launch_ex(f.k1, &c, a, 3, args, 3));
  ck_assert_uint_eq(fake_log_count("cuLaunchKernelEx"), 1);
  ck_assert_uint_eq(fake_log_count("cuLaunchKernel"), 0);
  ck_assert_uint_eq(fake_log_count("exec:cudaLaunchKernel"), 1);
  ck_assert_uint_eq(fake_last_launch_attrs(got, 8), 3);
  ck_assert_int_eq(got[0].id, cudaLaunchAttributeClusterDimension);
  ck_assert_uint_eq(got[0].val.clusterDim.x, 2);
  ck_assert_uint_eq(got[0].val.clusterDim.y, 1);
  ck_assert_uint_eq(got[0].val.clusterDim.z, 1);
  ck_assert_int_eq(got[1].id,
                   cudaLaunchAttributeProgrammaticStreamSerialization);
  ck_assert_int_eq(got[1].val.programmaticStreamSerializationAllowed, 1);
  ck_assert_int_eq(got[2].id, cudaLaunchAttributePriority);
  ck_assert_int_eq(got[2].val.priority, -3);
  /* The arguments as a plain launch passes them. */
  unsigned char v[24];
  ck_assert_uint_eq(fake_last_launch_args(v, sizeof v), 24);
  int32_t i32;
  memcpy(&i32, v + 8, 4);
  ck_assert_int_eq(i32, 4);

  /* Cooperative; flags of 0 pass through as 0; non-portable clusters are
   * the kernel's attribute, set once, not the launch's. */
  const cusafe_launch_attr b[] = {
      attr_flag(CUSAFE_LAUNCH_ATTR_COOPERATIVE, 1),
      attr_flag(CUSAFE_LAUNCH_ATTR_PROGRAMMATIC_SERIALIZATION, 0)};
  TU_OK(launch_k0(f.k0, 8, 256, b, 2));
  ck_assert_uint_eq(fake_last_launch_attrs(got, 8), 2);
  ck_assert_int_eq(got[0].id, cudaLaunchAttributeCooperative);
  ck_assert_int_eq(got[0].val.cooperative, 1);
  ck_assert_int_eq(got[1].val.programmaticStreamSerializationAllowed, 0);
  const cusafe_launch_attr np[] = {
      attr_flag(CUSAFE_LAUNCH_ATTR_NON_PORTABLE_CLUSTER, 1),
      attr_cluster(4, 4, 1)};
  fake_log_clear();
  cusafe_launch_config c2 = config_dims(16, 4, 1, 128, 1, 1);
  TU_OK(cusafe_kernel_launch_ex(f.k0, &c2, np, 2, NULL, 0));
  TU_OK(cusafe_kernel_launch_ex(f.k0, &c2, np, 2, NULL, 0));
  ck_assert_uint_eq(fake_log_count("cudaKernelSetAttributeForDevice"), 1);
  ck_assert_uint_eq(fake_log_count("cuLaunchKernelEx"), 2);
  ck_assert_uint_eq(fake_last_launch_attrs(got, 8), 1);
  ck_assert_int_eq(got[0].id, cudaLaunchAttributeClusterDimension);
  ck_assert_uint_eq(got[0].val.clusterDim.x, 4);
  ck_assert_uint_eq(got[0].val.clusterDim.y, 4);
  fixture_release(&f);
}
END_TEST

/* Occupancy is asked once per shape and kernel. */
START_TEST(test_ex_occupancy_cached) {
  struct fixture f;
  fixture_make(&f);
  const cusafe_launch_attr coop[] = {
      attr_flag(CUSAFE_LAUNCH_ATTR_COOPERATIVE, 1)};
  const cusafe_launch_attr cl[] = {attr_cluster(2, 1, 1)};
  fake_log_clear();
  for (int i = 0; i < 3; i++) {
    TU_OK(launch_k0(f.k0, 264, 1024, coop, 1));
    TU_OK(launch_k0(f.k0, 4, 1024, cl, 1));
  }
  ck_assert_uint_eq(
      fake_log_count("cudaOccupancyMaxActiveBlocksPerMultiprocessor"), 1);
  ck_assert_uint_eq(fake_log_count("cudaOccupancyMaxActiveClusters"), 1);
  TU_OK(launch_k0(f.k0, 256, 512, coop, 1)); /* another shape: asked */
  ck_assert_uint_eq(
      fake_log_count("cudaOccupancyMaxActiveBlocksPerMultiprocessor"), 2);
  ck_assert_uint_eq(fake_log_count("cuLaunchKernelEx"), 7);
  fixture_release(&f);
}
END_TEST

/* Each refusal, with its status and message; nothing reaches CUDA. */
START_TEST(test_ex_refusals) {
  struct fixture f;
  fixture_make(&f);
  fake_log_clear();
  cusafe_kernel k = f.k0;
  cusafe_launch_attr a[2];

  TU_ERR(launch_k0(k, 4, 32, NULL, 1), CUSAFE_ERROR_INVALID_VALUE,
         "attrs is NULL");
  a[0] = attr_flag(9, 1);
  TU_ERR(launch_k0(k, 4, 32, a, 1), CUSAFE_ERROR_INVALID_VALUE,
         "launch attribute 0 has unknown id 9");
  a[0] = attr_flag(0, 1);
  TU_ERR(launch_k0(k, 4, 32, a, 1), CUSAFE_ERROR_INVALID_VALUE,
         "launch attribute 0 has unknown id 0");
  a[0] = attr_priority(0);
  a[1] = attr_flag(6, 0);
  TU_ERR(launch_k0(k, 4, 32, a, 2), CUSAFE_ERROR_INVALID_VALUE,
         "launch attribute 1 has unknown id 6");
  a[0] = attr_flag(CUSAFE_LAUNCH_ATTR_COOPERATIVE, 1);
  a[0].reserved = 1;
  TU_ERR(launch_k0(k, 4, 32, a, 1), CUSAFE_ERROR_INVALID_VALUE,
         "launch attribute 0 (COOPERATIVE) has reserved 1; it must be 0");
  a[0] = attr_priority(0);
  a[1] = attr_priority(-1);
  TU_ERR(launch_k0(k, 4, 32, a, 2), CUSAFE_ERROR_INVALID_VALUE,
         "launch attribute 1 (PRIORITY) repeats launch attribute 0");
  a[0] = attr_cluster(2, 1, 1);
  a[1] = attr_flag(CUSAFE_LAUNCH_ATTR_COOPERATIVE, 2);
  TU_ERR(launch_k0(k, 4, 32, a, 2), CUSAFE_ERROR_INVALID_VALUE,
         "launch attribute 1 (COOPERATIVE) has flag 2; 0 or 1");
  a[0] = attr_flag(CUSAFE_LAUNCH_ATTR_NON_PORTABLE_CLUSTER, -1);
  TU_ERR(launch_k0(k, 4, 32, a, 1), CUSAFE_ERROR_INVALID_VALUE,
         "launch attribute 0 (NON_PORTABLE_CLUSTER) has flag -1; 0 or 1");
  a[0] = attr_flag(CUSAFE_LAUNCH_ATTR_PROGRAMMATIC_SERIALIZATION, 3);
  TU_ERR(launch_k0(k, 4, 32, a, 1), CUSAFE_ERROR_INVALID_VALUE,
         "launch attribute 0 (PROGRAMMATIC_SERIALIZATION) has flag 3; 0 or 1");
  a[0] = attr_priority(-6);
  TU_ERR(launch_k0(k, 4, 32, a, 1), CUSAFE_ERROR_INVALID_VALUE,
         "launch attribute 0 (PRIORITY) of -6 is outside the device's stream "
         "priority range 0 (least) to -5 (greatest)");
  a[0] = attr_priority(1);
  TU_ERR(launch_k0(k, 4, 32, a, 1), CUSAFE_ERROR_INVALID_VALUE,
         "launch attribute 0 (PRIORITY) of 1 is outside the device's stream "
         "priority range 0 (least) to -5 (greatest)");

  a[0] = attr_cluster(2, 0, 1);
  TU_ERR(launch_k0(k, 4, 32, a, 1), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "cluster dimension y is 0");
  a[0] = attr_cluster(2, 1, 1);
  TU_ERR(launch_k0(k, 5, 32, a, 1), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "grid dimension x of 5 is not a multiple of cluster dimension x of 2");
  a[0] = attr_cluster(1, 1, 2);
  TU_ERR(launch_k0(k, 4, 32, a, 1), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "grid dimension z of 1 is not a multiple of cluster dimension z of 2");
  a[0] = attr_cluster(16, 1, 1);
  TU_ERR(launch_k0(k, 16, 32, a, 1), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "a cluster of 16 blocks exceeds the portable limit of 8 "
         "(NON_PORTABLE_CLUSTER allows 16)");
  a[1] = attr_flag(CUSAFE_LAUNCH_ATTR_NON_PORTABLE_CLUSTER, 0);
  TU_ERR(launch_k0(k, 16, 32, a, 2), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "a cluster of 16 blocks exceeds the portable limit of 8 "
         "(NON_PORTABLE_CLUSTER allows 16)");
  a[0] = attr_cluster(32, 1, 1);
  a[1] = attr_flag(CUSAFE_LAUNCH_ATTR_NON_PORTABLE_CLUSTER, 1);
  TU_ERR(launch_k0(k, 32, 32, a, 2), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "a cluster of 32 blocks exceeds the limit of 16");
  a[0] = attr_flag(CUSAFE_LAUNCH_ATTR_NON_PORTABLE_CLUSTER, 1);
  TU_ERR(launch_k0(k, 4, 32, a, 1), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "NON_PORTABLE_CLUSTER without a CLUSTER attribute");
  /* Given with flag 0 too. */
  a[0] = attr_flag(CUSAFE_LAUNCH_ATTR_NON_PORTABLE_CLUSTER, 0);
  TU_ERR(launch_k0(k, 4, 32, a, 1), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "NON_PORTABLE_CLUSTER without a CLUSTER attribute");

  /* The configuration's own checks come first. */
  a[0] = attr_cluster(2, 1, 1);
  TU_ERR(launch_k0(k, 0, 32, a, 1), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "grid dimension x is 0");
  TU_ERR(launch_k0(CUSAFE_NULL_HANDLE, 4, 32, a, 1),
         CUSAFE_ERROR_INVALID_HANDLE, "kernel is the NULL handle");
  assert_no_launch();
  ck_assert_uint_eq(fake_log_count("cudaOccupancyMaxActiveClusters"), 0);

  /* A cooperative grid larger than can be co-resident: blocks of 1024
   * threads, 2 per multiprocessor of the fake's 132. */
  a[0] = attr_flag(CUSAFE_LAUNCH_ATTR_COOPERATIVE, 1);
  TU_ERR(launch_k0(k, 265, 1024, a, 1), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "a cooperative grid of 265 blocks exceeds the 264 that can be "
         "co-resident (2 per SM x 132 SMs)");
  TU_ERR(launch_k0(k, 300, 1024, a, 1), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "a cooperative grid of 300 blocks exceeds the 264 that can be "
         "co-resident (2 per SM x 132 SMs)");
  /* With clusters of 2: 16 per GPC of 16 multiprocessors, 8 GPCs. */
  a[1] = attr_cluster(2, 1, 1);
  TU_ERR(launch_k0(k, 258, 1024, a, 2), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "a cooperative grid of 258 blocks exceeds the 256 that can be "
         "co-resident (128 clusters of 2 blocks)");
  assert_no_launch();
  TU_OK(launch_k0(k, 264, 1024, a, 1));
  TU_OK(launch_k0(k, 256, 1024, a, 2));
  ck_assert_uint_eq(fake_log_count("cuLaunchKernelEx"), 2);

  /* A cluster that fits no GPC: GPCs of one multiprocessor, which holds 2
   * blocks of 1024 threads (a kernel handle of its own: occupancy is
   * cached per kernel). */
  cusafe_kernel k2 = tu_get_kernel(f.m, "k0");
  fake_set_cluster_sms(0, 1);
  fake_log_clear();
  a[0] = attr_cluster(4, 1, 1);
  TU_ERR(launch_k0(k2, 4, 1024, a, 1), CUSAFE_ERROR_INVALID_CONFIGURATION,
         "kernel k0 cannot run with clusters of 4 blocks of 1024 threads: no "
         "cluster fits an SM group (cudaOccupancyMaxActiveClusters is 0)");
  assert_no_launch();
  TU_OK(launch_k0(k2, 4, 512, a, 1)); /* 4 blocks of 512 fit one SM */
  TU_OK(cusafe_kernel_release(k2));
  fixture_release(&f);
}
END_TEST

/* Devices that cannot: no clusters, no cooperative launches, compute
 * capability 8.0. */
START_TEST(test_ex_device_cannot) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  fake_set_launch_support(0, 0, 0);
  fake_set_compute_capability(0, 8, 0);
  TU_OK(cusafe_context_create(&ctx, 0));
  cusafe_module m = load_fake_image(ctx);
  cusafe_kernel k = tu_get_kernel(m, "k0");
  fake_log_clear();
  cusafe_launch_attr a[1];
  a[0] = attr_cluster(2, 1, 1);
  TU_ERR(launch_k0(k, 4, 32, a, 1), CUSAFE_ERROR_NOT_SUPPORTED,
         "device 0 does not support thread block clusters "
         "(cudaDevAttrClusterLaunch is 0)");
  a[0] = attr_flag(CUSAFE_LAUNCH_ATTR_COOPERATIVE, 1);
  TU_ERR(launch_k0(k, 4, 32, a, 1), CUSAFE_ERROR_NOT_SUPPORTED,
         "device 0 does not support cooperative launches "
         "(cudaDevAttrCooperativeLaunch is 0)");
  a[0] = attr_flag(CUSAFE_LAUNCH_ATTR_PROGRAMMATIC_SERIALIZATION, 1);
  TU_ERR(launch_k0(k, 4, 32, a, 1), CUSAFE_ERROR_NOT_SUPPORTED,
         "programmatic serialization needs compute capability 9.0; device 0 "
         "has 8.0");
  assert_no_launch();
  /* Flags of 0 ask for nothing the device lacks. */
  a[0] = attr_flag(CUSAFE_LAUNCH_ATTR_COOPERATIVE, 0);
  TU_OK(launch_k0(k, 4, 32, a, 1));
  a[0] = attr_flag(CUSAFE_LAUNCH_ATTR_PROGRAMMATIC_SERIALIZATION, 0);
  TU_OK(launch_k0(k, 4, 32, a, 1));
  TU_OK(cusafe_kernel_release(k));
  TU_OK(cusafe_module_release(m));
  TU_OK(cusafe_context_release(ctx));
  TU_NOTHING_LIVE();
}
END_TEST

/* Each CUDA call of an attributed launch failing: its mapped status and
 * message, nothing queued, and the launch works once CUDA does. */
START_TEST(test_ex_cuda_failures) {
  struct fixture f;
  fixture_make(&f);
  const cusafe_launch_attr np[] = {
      attr_cluster(16, 1, 1),
      attr_flag(CUSAFE_LAUNCH_ATTR_NON_PORTABLE_CLUSTER, 1),
      attr_flag(CUSAFE_LAUNCH_ATTR_COOPERATIVE, 1)};
  const cusafe_launch_attr coop[] = {
      attr_flag(CUSAFE_LAUNCH_ATTR_COOPERATIVE, 1)};
  /* The launch itself fails where both the driver's call and the
   * runtime's, made after it, fail. */
  static const char *const calls[] = {"cudaKernelSetAttributeForDevice",
                                      "cudaOccupancyMaxActiveClusters",
                                      "cudaLaunchKernelExC"};
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
    int launch = i == 2;
    fake_log_clear();
    fake_fail_function(calls[i], cudaErrorLaunchOutOfResources);
    if (launch)
      fake_fail_function("cuLaunchKernelEx", cudaErrorLaunchOutOfResources);
    TU_ERR(launch_k0(f.k0, 32, 128, np, 3), CUSAFE_ERROR_CUDA,
           "%s failed: too many resources requested for launch", calls[i]);
    ck_assert_int_eq(cusafe_last_cuda_error(), cudaErrorLaunchOutOfResources);
    fake_fail_function(calls[i], cudaErrorMemoryAllocation);
    TU_ERR(launch_k0(f.k0, 32, 128, np, 3), CUSAFE_ERROR_OUT_OF_MEMORY,
           "%s failed: out of memory", calls[i]);
    fake_fail_function(calls[i], cudaSuccess);
    fake_fail_function("cuLaunchKernelEx", cudaSuccess);
    ck_assert_uint_eq(fake_log_count("cuLaunchKernelEx"), launch ? 2 : 0);
    ck_assert_uint_eq(fake_log_count("exec:cudaLaunchKernel"), 0);
  }
  fake_log_clear();
  fake_fail_function("cudaOccupancyMaxActiveBlocksPerMultiprocessor",
                     cudaErrorUnknown);
  TU_ERR(launch_k0(f.k0, 8, 128, coop, 1), CUSAFE_ERROR_CUDA,
         "cudaOccupancyMaxActiveBlocksPerMultiprocessor failed: unknown "
         "error");
  fake_fail_clear();
  assert_no_launch();
  TU_OK(launch_k0(f.k0, 32, 128, np, 3));
  TU_OK(launch_k0(f.k0, 8, 128, coop, 1));
  ck_assert_uint_eq(fake_log_count("exec:cudaLaunchKernel"), 2);
  fixture_release(&f);
}
END_TEST

/* A launch that the driver's call refuses is made through the runtime,
 * whose answer is the launch's: it succeeds here, once, with its
 * arguments, and leaves no error behind. */
START_TEST(test_driver_launch_falls_back) {
  struct fixture f;
  fixture_make(&f);
  cusafe_launch_config c = config1();
  int32_t four = 4;
  const cusafe_arg args[] = {CUSAFE_ARG_BUF(f.buf), CUSAFE_ARG_I32V(four),
                             CUSAFE_ARG_U64V(8)};
  fake_log_clear();
  fake_fail_function("cuLaunchKernel", cudaErrorInvalidValue);
  TU_OK(cusafe_kernel_launch(f.k1, &c, args, 3));
  long drv = fake_log_find("cuLaunchKernel", 0);
  long rt = fake_log_find("cudaLaunchKernel", 0);
  ck_assert_int_ge(drv, 0);
  ck_assert_int_gt(rt, drv);
  ck_assert_uint_eq(fake_log_count("cuLaunchKernel"), 1);
  ck_assert_uint_eq(fake_log_count("cudaLaunchKernel"), 1);
  unsigned char got[24];
  ck_assert_uint_eq(fake_last_launch_args(got, sizeof got), 24);
  int32_t four_got;
  uint64_t eight_got;
  memcpy(&four_got, got + 8, 4);
  memcpy(&eight_got, got + 16, 8);
  ck_assert_int_eq(four_got, 4);
  ck_assert_uint_eq(eight_got, 8);

  /* The same with attributes: cuLaunchKernelEx, then cudaLaunchKernelExC
   * with the same attributes. */
  cudaLaunchAttribute attrs[4];
  const cusafe_launch_attr a[] = {attr_priority(-2)};
  fake_fail_function("cuLaunchKernelEx", cudaErrorInvalidValue);
  TU_OK(cusafe_kernel_launch_ex(f.k1, &c, a, 1, args, 3));
  ck_assert_uint_eq(fake_log_count("cuLaunchKernelEx"), 1);
  ck_assert_uint_eq(fake_log_count("cudaLaunchKernelExC"), 1);
  ck_assert_uint_eq(fake_last_launch_attrs(attrs, 4), 1);
  ck_assert_int_eq(attrs[0].id, cudaLaunchAttributePriority);
  ck_assert_int_eq(attrs[0].val.priority, -2);
  fake_fail_clear();
  TU_OK(cusafe_context_synchronize(f.ctx));
  ck_assert_uint_eq(fake_log_count("exec:cudaLaunchKernel"), 2);
  ck_assert_int_eq(cusafe_last_cuda_error(), 0);
  fixture_release(&f);
}
END_TEST

/* Where the driver lacks its launch calls, the runtime's make every
 * launch, with the same arguments and attributes. */
START_TEST(test_without_driver_launch) {
  fake_set_driver_launch(0);
  struct fixture f;
  fixture_make(&f);
  cusafe_launch_config c = config_dims(2, 1, 1, 32, 1, 1);
  int32_t four = 4;
  const cusafe_arg args[] = {CUSAFE_ARG_BUF(f.buf), CUSAFE_ARG_I32V(four),
                             CUSAFE_ARG_U64V(8)};
  fake_log_clear();
  TU_OK(cusafe_kernel_launch(f.k1, &c, args, 3));
  const cusafe_launch_attr a[] = {attr_cluster(2, 1, 1)};
  TU_OK(cusafe_kernel_launch_ex(f.k1, &c, a, 1, args, 3));
  ck_assert_uint_eq(fake_log_count("cudaLaunchKernel"), 1);
  ck_assert_uint_eq(fake_log_count("cudaLaunchKernelExC"), 1);
  ck_assert_uint_eq(fake_log_count("cuLaunchKernel"), 0);
  ck_assert_uint_eq(fake_log_count("cuLaunchKernelEx"), 0);
  cudaLaunchAttribute attrs[4];
  ck_assert_uint_eq(fake_last_launch_attrs(attrs, 4), 1);
  ck_assert_int_eq(attrs[0].id, cudaLaunchAttributeClusterDimension);
  ck_assert_uint_eq(attrs[0].val.clusterDim.x, 2);
  TU_OK(cusafe_context_synchronize(f.ctx));
  ck_assert_uint_eq(fake_log_count("exec:cudaLaunchKernel"), 2);
  fixture_release(&f);
}
END_TEST

/* The grid, block and dynamic shared memory of a launch reach CUDA
 * unchanged, through each of the four launch calls. */
static void expect_config(const char *call, uint32_t gx, uint32_t gy,
                          uint32_t gz, uint32_t bx, uint32_t by, uint32_t bz,
                          size_t shared) {
  dim3 grid, block;
  size_t got_shared;
  fake_last_launch_config(&grid, &block, &got_shared);
  TU_ASSERT(grid.x == gx && grid.y == gy && grid.z == gz,
            "%s: grid (%u, %u, %u) reached CUDA, (%u, %u, %u) launched", call,
            grid.x, grid.y, grid.z, gx, gy, gz);
  TU_ASSERT(block.x == bx && block.y == by && block.z == bz,
            "%s: block (%u, %u, %u) reached CUDA, (%u, %u, %u) launched", call,
            block.x, block.y, block.z, bx, by, bz);
  TU_ASSERT(got_shared == shared,
            "%s: %zu bytes of dynamic shared memory reached CUDA, %zu "
            "launched",
            call, got_shared, shared);
}

START_TEST(test_geometry_reaches_cuda) {
  struct fixture f;
  fixture_make(&f);
  cusafe_launch_config c = config_dims(6, 3, 2, 8, 4, 2);
  c.shared_memory = 1000;
  int32_t four = 4;
  const cusafe_arg args[] = {CUSAFE_ARG_BUF(f.buf), CUSAFE_ARG_I32V(four),
                             CUSAFE_ARG_U64V(8)};
  const cusafe_launch_attr a[] = {attr_priority(-1)};
  /* The driver's calls; then the runtime's, after the driver's refused. */
  static const char *const calls[2][2] = {
      {"cuLaunchKernel", "cuLaunchKernelEx"},
      {"cudaLaunchKernel", "cudaLaunchKernelExC"}};
  fake_log_clear();
  for (int round = 0; round < 2; round++) {
    if (round == 1) {
      fake_fail_function("cuLaunchKernel", cudaErrorInvalidValue);
      fake_fail_function("cuLaunchKernelEx", cudaErrorInvalidValue);
    }
    TU_OK(cusafe_kernel_launch(f.k1, &c, args, 3));
    ck_assert_uint_eq(fake_log_count(calls[round][0]), 1);
    expect_config(calls[round][0], 6, 3, 2, 8, 4, 2, 1000);
    TU_OK(cusafe_kernel_launch_ex(f.k1, &c, a, 1, args, 3));
    ck_assert_uint_eq(fake_log_count(calls[round][1]), 1);
    expect_config(calls[round][1], 6, 3, 2, 8, 4, 2, 1000);
  }
  fake_fail_clear();
  TU_OK(cusafe_context_synchronize(f.ctx));
  fixture_release(&f);
}
END_TEST

/* A look-up of the driver's launch calls that failed at initialisation
 * (an error, not an answer that the driver lacks them) is made again at
 * the next launch, which then goes through the driver as every later one
 * does. */
static int lookups;
static void on_lookup(void *arg) {
  int fail_at = *(const int *)arg;
  /* cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease,
   * cuLibraryGetModule, cuMemGetAddressRange, cuStreamIsCapturing, then
   * cuLaunchKernel and cuLaunchKernelEx. */
  if (++lookups == fail_at - 1)
    fake_fail_after(1, cudaErrorUnknown, 0);
  else
    fake_set_call_hook("cudaGetDriverEntryPointByVersion", on_lookup, arg);
}

START_TEST(test_failed_lookup_tried_again) {
  static const int fail_at[2] = {6, 7}; /* the two launch calls */
  fake_set_call_hook("cudaGetDriverEntryPointByVersion", on_lookup,
                     (void *)&fail_at[_i]);
  struct fixture f;
  fixture_make(&f);
  ck_assert_int_eq(lookups, fail_at[_i] - 1);
  fake_set_call_hook("cudaGetDriverEntryPointByVersion", NULL, NULL);
  cusafe_launch_config c = config_dims(2, 1, 1, 32, 1, 1);
  int32_t four = 4;
  const cusafe_arg args[] = {CUSAFE_ARG_BUF(f.buf), CUSAFE_ARG_I32V(four),
                             CUSAFE_ARG_U64V(8)};
  const cusafe_launch_attr a[] = {attr_cluster(2, 1, 1)};
  fake_log_clear();
  for (int i = 0; i < 3; i++) {
    TU_OK(cusafe_kernel_launch(f.k1, &c, args, 3));
    TU_OK(cusafe_kernel_launch_ex(f.k1, &c, a, 1, args, 3));
  }
  ck_assert_uint_eq(fake_log_count("cuLaunchKernel"), 3);
  ck_assert_uint_eq(fake_log_count("cuLaunchKernelEx"), 3);
  ck_assert_uint_eq(fake_log_count("cudaLaunchKernel"), 0);
  ck_assert_uint_eq(fake_log_count("cudaLaunchKernelExC"), 0);
  ck_assert_uint_eq(fake_log_count("cudaGetDriverEntryPointByVersion"), 1);
  TU_OK(cusafe_context_synchronize(f.ctx));
  fixture_release(&f);
}
END_TEST

/* The buffers of an attributed launch stay alive until it has run, as
 * every launch's do. */
START_TEST(test_ex_keeps_buffers) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_buffer x = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&ctx, 0));
  cusafe_module m = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_load_builtin(&m, ctx));
  cusafe_kernel fill = tu_get_kernel(m, "cusafe_fill_f32");
  TU_OK(cusafe_buffer_alloc(&x, ctx, CUSAFE_MEMORY_DEVICE, 64 * sizeof(float)));
  fake_set_paused(1);
  const cusafe_launch_attr a[] = {
      attr_cluster(2, 1, 1),
      attr_flag(CUSAFE_LAUNCH_ATTR_PROGRAMMATIC_SERIALIZATION, 1)};
  cusafe_launch_config c = config_dims(2, 1, 1, 32, 1, 1);
  const cusafe_arg args[] = {CUSAFE_ARG_BUF(x), CUSAFE_ARG_F32V(2.5f),
                             CUSAFE_ARG_U64V(64)};
  TU_OK(cusafe_kernel_launch_ex(fill, &c, a, 2, args, 3));
  TU_OK(cusafe_buffer_release(x)); /* the queued kernel still uses it */
  /* Had the memory gone, the fake would abort when the kernel runs. */
  ck_assert_uint_eq(fake_log_count("exec:cudaLaunchKernel"), 0);
  fake_set_paused(0);
  TU_OK(cusafe_context_synchronize(ctx));
  ck_assert_uint_eq(fake_log_count("exec:cudaLaunchKernel"), 1);
  TU_OK(cusafe_kernel_release(fill));
  TU_OK(cusafe_module_release(m));
  TU_OK(cusafe_context_release(ctx));
  TU_NOTHING_LIVE();
}
END_TEST

/* A capture of a cluster launch and a programmatic dependent launch: the
 * graph holds their buffers and kernels, and each replay does the work. */
START_TEST(test_ex_capture) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_buffer x = CUSAFE_NULL_HANDLE;
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  enum { N = 256 };
  float host[N];
  TU_OK(cusafe_context_create(&ctx, 0));
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_module_load_builtin(&m, ctx));
  cusafe_kernel fill = tu_get_kernel(m, "cusafe_fill_f32");
  cusafe_kernel scale = tu_get_kernel(m, "cusafe_scale_f32");
  TU_OK(cusafe_buffer_alloc(&x, ctx, CUSAFE_MEMORY_DEVICE, sizeof host));
  const cusafe_launch_attr cl[] = {attr_cluster(2, 1, 1), attr_priority(-2)};
  const cusafe_launch_attr pdl[] = {
      attr_flag(CUSAFE_LAUNCH_ATTR_PROGRAMMATIC_SERIALIZATION, 1)};
  cusafe_launch_config c = config_dims(4, 1, 1, 64, 1, 1);
  c.stream = s;
  const cusafe_arg fill_args[] = {CUSAFE_ARG_BUF(x), CUSAFE_ARG_F32V(1.5f),
                                  CUSAFE_ARG_U64V(N)};
  const cusafe_arg scale_args[] = {CUSAFE_ARG_BUF(x), CUSAFE_ARG_F32V(4.0f),
                                   CUSAFE_ARG_U64V(N)};
  fake_log_clear();
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_kernel_launch_ex(fill, &c, cl, 2, fill_args, 3));
  TU_OK(cusafe_kernel_launch_ex(scale, &c, pdl, 1, scale_args, 3));
  TU_OK(cusafe_stream_end_capture(&g, s));
  ck_assert_uint_eq(fake_log_count("cuLaunchKernelEx"), 2);
  ck_assert_uint_eq(fake_log_count("exec:cudaLaunchKernel"), 0);
  /* The graph keeps the buffer and the kernels. */
  TU_OK(cusafe_buffer_retain(x));
  TU_OK(cusafe_kernel_release(fill));
  TU_OK(cusafe_kernel_release(scale));
  TU_OK(cusafe_module_release(m));
  for (int replay = 0; replay < 2; replay++) {
    TU_OK(cusafe_graph_launch(g, s));
    TU_OK(cusafe_stream_synchronize(s));
    memset(host, 0, sizeof host);
    TU_OK(cusafe_buffer_read(x, 0, host, sizeof host));
    for (int i = 0; i < N; i++)
      ck_assert_float_eq(host[i], 6.0f);
  }
  ck_assert_uint_eq(fake_log_count("exec:cudaLaunchKernel"), 4);
  TU_OK(cusafe_buffer_release(x));
  TU_OK(cusafe_buffer_release(x)); /* the graph still holds it */
  TU_OK(cusafe_graph_launch(g, s));
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_context_release(ctx));
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Suite                                                                      */
/* ------------------------------------------------------------------------ */

static Suite *launch_suite(void) {
  Suite *s = suite_create("launch");
  TCase *tc;

  tc = tcase_create("load");
  tcase_add_test(tc, test_load_data);
  tcase_add_test(tc, test_load_file);
  tcase_add_test(tc, test_load_errors);
  tcase_add_test(tc, test_not_found_names_module);
  suite_add_tcase(s, tc);

  tc = tcase_create("arguments");
  tcase_add_test(tc, test_argument_checks);
  tcase_add_test(tc, test_argument_values);
  tcase_add_test(tc, test_many_parameters);
  tcase_add_test(tc, test_parameter_size_limit);
  tcase_add_test(tc, test_config_checks);
  tcase_add_test(tc, test_suggest_config);
  tcase_add_test(tc, test_context_mismatch);
  tcase_add_test(tc, test_invalid_handles);
  tcase_add_test(tc, test_cuda_failures);
  suite_add_tcase(s, tc);

  tc = tcase_create("attributes");
  tcase_add_test(tc, test_ex_layout);
  tcase_add_test(tc, test_ex_without_attributes);
  tcase_add_test(tc, test_ex_attributes_reach_cuda);
  tcase_add_test(tc, test_ex_occupancy_cached);
  tcase_add_test(tc, test_ex_refusals);
  tcase_add_test(tc, test_ex_device_cannot);
  tcase_add_test(tc, test_ex_cuda_failures);
  tcase_add_test(tc, test_driver_launch_falls_back);
  tcase_add_test(tc, test_without_driver_launch);
  tcase_add_test(tc, test_geometry_reaches_cuda);
  tcase_add_loop_test(tc, test_failed_lookup_tried_again, 0, 2);
  tcase_add_test(tc, test_ex_keeps_buffers);
  tcase_add_test(tc, test_ex_capture);
  suite_add_tcase(s, tc);

  tc = tcase_create("compile");
  tcase_add_test(tc, test_compile);
  tcase_add_test(tc, test_compile_errors);
  suite_add_tcase(s, tc);

  tc = tcase_create("builtin");
  tcase_add_loop_test(tc, test_builtin_kernels, 0, 2);
  tcase_add_test(tc, test_builtin_other_memory);
  tcase_add_test(tc, test_builtin_zero_size);
  tcase_add_test(tc, test_builtin_misaligned_faults);
  suite_add_tcase(s, tc);

  tc = tcase_create("lifetime");
  tcase_add_loop_test(tc, test_release_all_while_launch_queued, 0, 2);
  tcase_add_test(tc, test_shutdown_with_launch_queued);
  tcase_add_test(tc, test_buffer_moves_during_launch);
  tcase_add_test(tc, test_wrap_of_stream_being_destroyed);
  tcase_add_test(tc, test_kernel_keeps_module);
  tcase_add_test(tc, test_module_keeps_context);
  tcase_add_test(tc, test_shutdown_unloads_everything);
  suite_add_tcase(s, tc);

  tc = tcase_create("fault_injection");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_composites_succeed);
  tcase_add_loop_test(tc, test_fault_injection_builtin, 0, 2);
  tcase_add_loop_test(tc, test_fault_injection_compiled, 0, 2);
  suite_add_tcase(s, tc);

  return s;
}

int main(void) {
  /* Every test needs a fresh library and a fresh fake. */
  return tu_run_suite(launch_suite(), CK_FORK);
}
