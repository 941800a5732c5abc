/* check_api.c -- behaviour of the public API.
 *
 * Built twice: with CUSAFE_TEST_FAKE against the fake CUDA (each test forked,
 * so each starts with a fresh library and a fresh fake of two devices), and
 * without it against the real runtime, where it skips without a GPU.  On a
 * GPU all tests share one process (a process that initialised CUDA cannot
 * use it in a forked child), so every test releases everything it creates
 * and none calls cusafe_shutdown().  Outside CUSAFE_TEST_FAKE only the public
 * API is used. */
#include <check.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cusafe.h"
#include "testutil.h"

#ifdef CUSAFE_TEST_FAKE
#include "cuda_api.h"
#include "fakecuda.h"
#include "fakeutil.h"
#endif

#define KIB ((size_t)1024)
#define MIB ((size_t)1024 * 1024)

static const cusafe_memory all_kinds[] = {
    CUSAFE_MEMORY_DEVICE, CUSAFE_MEMORY_HOST_PINNED, CUSAFE_MEMORY_MANAGED};
#define NKINDS 3

/* ------------------------------------------------------------------------ */
/* Fixture and helpers                                                       */
/* ------------------------------------------------------------------------ */

/* A context on device 0 for the tests of one case. */
static cusafe_context ctx;

static void ctx_setup(void) {
  ctx = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&ctx, 0));
}

/* No assertions here: in no-fork mode a failed assertion in a teardown
 * would jump back into the runner's test loop. */
static void ctx_teardown(void) {
  (void)cusafe_context_release(ctx);
  ctx = CUSAFE_NULL_HANDLE;
}

static int device_count(void) {
  int n = 0;
  TU_OK(cusafe_device_count(&n));
  return n;
}

/* Tests of two devices return early on a machine with a single GPU: there
 * is nothing to mix there.  The fake always has two. */
static int have_two_devices(const char *test) {
  int n = device_count();
#ifdef CUSAFE_TEST_FAKE
  ck_assert_int_eq(n, 2);
#endif
  if (n < 2) {
    printf("%s: only %d device: nothing to test\n", test, n);
    return 0;
  }
  return 1;
}

/* Whether `kind` can be allocated on `device`.  Where managed memory is
 * unsupported, checks the documented refusal instead. */
static int kind_usable(cusafe_context c, int device, cusafe_memory kind) {
  cusafe_device_properties p;
  if (kind != CUSAFE_MEMORY_MANAGED)
    return 1;
  TU_OK(cusafe_device_get_properties(&p, device));
  if (p.managed_memory)
    return 1;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_buffer_alloc(&b, c, kind, 64), CUSAFE_ERROR_NOT_SUPPORTED,
         "device %d does not support managed memory", device);
  ck_assert_uint_eq(b, CUSAFE_NULL_HANDLE);
  printf("device %d has no managed memory: managed cases reduced\n", device);
  return 0;
}

/* Allocates a buffer of `size` bytes filled with the pattern of `seed`;
 * the pattern is left in `host` when it is not NULL. */
static cusafe_buffer make_buffer(cusafe_context c, cusafe_memory kind,
                                 size_t size, uint32_t seed, void *host) {
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  unsigned char *data = host ? host : tu_xmalloc(size);
  TU_OK(cusafe_buffer_alloc(&b, c, kind, size));
  ck_assert_uint_ne(b, CUSAFE_NULL_HANDLE);
  tu_pattern(data, size, seed);
  TU_OK(cusafe_buffer_write(b, 0, data, size));
  if (host == NULL)
    free(data);
  return b;
}

/* Reads `size` bytes at `offset` of b and compares them with `want`. */
#define CHECK_CONTENT(b, offset, want, size)                                   \
  do {                                                                         \
    size_t cc_n_ = (size);                                                     \
    unsigned char *cc_got_ = tu_xmalloc(cc_n_);                                \
    memset(cc_got_, 0xee, cc_n_);                                              \
    TU_OK(cusafe_buffer_read((b), (offset), cc_got_, cc_n_));                  \
    TU_BYTES_EQ(cc_got_, (want), cc_n_);                                       \
    free(cc_got_);                                                             \
  } while (0)

/* ------------------------------------------------------------------------ */
/* 1. Status strings and version                                             */
/* ------------------------------------------------------------------------ */

static const cusafe_status all_statuses[] = {
    CUSAFE_SUCCESS,
    CUSAFE_ERROR_INVALID_HANDLE,
    CUSAFE_ERROR_INVALID_VALUE,
    CUSAFE_ERROR_INVALID_SIZE,
    CUSAFE_ERROR_OUT_OF_RANGE,
    CUSAFE_ERROR_INVALID_DEVICE,
    CUSAFE_ERROR_CONTEXT_MISMATCH,
    CUSAFE_ERROR_NO_DRIVER,
    CUSAFE_ERROR_NO_DEVICE,
    CUSAFE_ERROR_OUT_OF_MEMORY,
    CUSAFE_ERROR_NOT_READY,
    CUSAFE_ERROR_NOT_SUPPORTED,
    CUSAFE_ERROR_CUDA,
    CUSAFE_ERROR_SHUTDOWN,
    CUSAFE_ERROR_FORKED,
    CUSAFE_ERROR_INVALID_ARGUMENTS,
    CUSAFE_ERROR_INVALID_CONFIGURATION,
    CUSAFE_ERROR_INVALID_IMAGE,
    CUSAFE_ERROR_COMPILE,
    CUSAFE_ERROR_NOT_FOUND,
    CUSAFE_ERROR_CAPTURING,
};
#define NSTATUSES (sizeof all_statuses / sizeof all_statuses[0])

START_TEST(test_status_strings_are_distinct_and_nonempty) {
  for (size_t i = 0; i < NSTATUSES; i++) {
    const char *s = cusafe_status_string(all_statuses[i]);
    ck_assert_ptr_nonnull(s);
    ck_assert_msg(s[0] != '\0', "status %d has an empty string",
                  (int)all_statuses[i]);
    ck_assert_str_ne(s, "unknown status");
    for (size_t j = 0; j < i; j++)
      ck_assert_msg(strcmp(s, cusafe_status_string(all_statuses[j])) != 0,
                    "statuses %d and %d share the string \"%s\"",
                    (int)all_statuses[i], (int)all_statuses[j], s);
  }
}
END_TEST

START_TEST(test_status_string_of_unknown_value) {
  ck_assert_str_eq(
      cusafe_status_string((cusafe_status)(CUSAFE_ERROR_CAPTURING + 1)),
      "unknown status");
  ck_assert_str_eq(cusafe_status_string((cusafe_status)-1), "unknown status");
  ck_assert_str_eq(cusafe_status_string((cusafe_status)1000), "unknown status");
  ck_assert_str_eq(cusafe_status_string((cusafe_status)INT_MAX),
                   "unknown status");
}
END_TEST

START_TEST(test_version_string) {
  char want[32];
  ck_assert_str_eq(cusafe_version_string(), "0.1.0");
  snprintf(want, sizeof want, "%d.%d.%d", CUSAFE_VERSION_MAJOR,
           CUSAFE_VERSION_MINOR, CUSAFE_VERSION_PATCH);
  ck_assert_str_eq(cusafe_version_string(), want);
}
END_TEST

struct message_probe {
  char before[256];
  int cuda_before;
  char after[256];
  int device_count;
};

static void *probe_thread_messages(void *arg) {
  struct message_probe *p = arg;
  cusafe_context c = CUSAFE_NULL_HANDLE;
  snprintf(p->before, sizeof p->before, "%s", cusafe_last_error_message());
  p->cuda_before = cusafe_last_cuda_error();
  (void)cusafe_context_create(&c, -1);
  snprintf(p->after, sizeof p->after, "%s", cusafe_last_error_message());
  return NULL;
}

/* The message is per thread: a new thread starts with "", and a failure on
 * one thread leaves another's message alone. */
START_TEST(test_last_error_is_per_thread) {
  struct message_probe p;
  pthread_t t;
  char want[256];
  int n = device_count();

  TU_ERR(cusafe_device_get_properties(NULL, 0), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  memset(&p, 0, sizeof p);
  ck_assert_int_eq(pthread_create(&t, NULL, probe_thread_messages, &p), 0);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  ck_assert_str_eq(p.before, "");
  ck_assert_int_eq(p.cuda_before, 0);
  snprintf(want, sizeof want, "device -1 is out of range: %d device(s) found",
           n);
  ck_assert_str_eq(p.after, want);
  ck_assert_str_eq(cusafe_last_error_message(), "out is NULL");
  ck_assert_int_eq(cusafe_last_cuda_error(), 0);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 2. Devices                                                                */
/* ------------------------------------------------------------------------ */

START_TEST(test_device_count_is_positive) {
  int n = -1;
  TU_OK(cusafe_device_count(&n));
  ck_assert_int_ge(n, 1);
#ifdef CUSAFE_TEST_FAKE
  ck_assert_int_eq(n, 2);
#endif
  TU_ERR(cusafe_device_count(NULL), CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
}
END_TEST

START_TEST(test_device_properties_are_sane) {
  int n = device_count();
  for (int d = 0; d < n; d++) {
    cusafe_device_properties p;
    memset(&p, 0xab, sizeof p);
    TU_OK(cusafe_device_get_properties(&p, d));
    ck_assert_msg(memchr(p.name, '\0', sizeof p.name) != NULL,
                  "device %d: name is not terminated", d);
    ck_assert_msg(p.name[0] != '\0', "device %d: empty name", d);
    ck_assert_uint_gt(p.total_memory, 0);
    ck_assert_int_eq(p.warp_size, 32);
    ck_assert_int_ge(p.max_threads_per_block, 256);
    ck_assert_int_ge(p.compute_capability_major, 1);
    ck_assert_int_ge(p.multiprocessor_count, 1);
    ck_assert_int_ge(p.max_block_dim[0], 256);
    ck_assert_int_ge(p.max_grid_dim[0], 65535);
    ck_assert_uint_ge(p.shared_memory_per_block, 16 * KIB);
    ck_assert_uint_ge(p.shared_memory_per_block_optin,
                      p.shared_memory_per_block);
    ck_assert_msg(p.managed_memory == 0 || p.managed_memory == 1,
                  "device %d: managed_memory is %d", d, p.managed_memory);
    ck_assert_msg(p.memory_pools == 0 || p.memory_pools == 1,
                  "device %d: memory_pools is %d", d, p.memory_pools);
#ifdef CUSAFE_TEST_FAKE
    {
      /* The fake's documented defaults: each field must reach its place. */
      char want[32];
      snprintf(want, sizeof want, "Fake GPU %d", d);
      ck_assert_str_eq(p.name, want);
      ck_assert_uint_eq(p.total_memory, (size_t)1 << 30);
      ck_assert_int_eq(p.compute_capability_major, 9);
      ck_assert_int_eq(p.compute_capability_minor, 0);
      ck_assert_int_eq(p.multiprocessor_count, 132);
      ck_assert_int_eq(p.max_threads_per_block, 1024);
      ck_assert_int_eq(p.max_block_dim[0], 1024);
      ck_assert_int_eq(p.max_block_dim[1], 1024);
      ck_assert_int_eq(p.max_block_dim[2], 64);
      ck_assert_int_eq(p.max_grid_dim[0], INT_MAX);
      ck_assert_int_eq(p.max_grid_dim[1], 65535);
      ck_assert_int_eq(p.max_grid_dim[2], 65535);
      ck_assert_uint_eq(p.shared_memory_per_block, 48 * KIB);
      ck_assert_uint_eq(p.shared_memory_per_block_optin, 227 * KIB);
      ck_assert_int_eq(p.managed_memory, 1);
      ck_assert_int_eq(p.memory_pools, 1);
    }
#endif
  }
}
END_TEST

START_TEST(test_invalid_device_ordinals) {
  int n = device_count();
  const int bad[] = {-1, n, n + 1, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cusafe_device_properties p;
    cusafe_context c = (cusafe_context)0x1234;
    TU_ERR(cusafe_device_get_properties(&p, bad[i]),
           CUSAFE_ERROR_INVALID_DEVICE,
           "device %d is out of range: %d device(s) found", bad[i], n);
    TU_ERR(cusafe_context_create(&c, bad[i]), CUSAFE_ERROR_INVALID_DEVICE,
           "device %d is out of range: %d device(s) found", bad[i], n);
    ck_assert_uint_eq(c, CUSAFE_NULL_HANDLE);
  }
}
END_TEST

START_TEST(test_device_null_out) {
  TU_ERR(cusafe_device_count(NULL), CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  TU_ERR(cusafe_device_get_properties(NULL, 0), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  TU_ERR(cusafe_context_create(NULL, 0), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 3. Contexts                                                               */
/* ------------------------------------------------------------------------ */

START_TEST(test_context_create_gives_context_handle) {
  int dev = -1;
  ck_assert_uint_ne(ctx, CUSAFE_NULL_HANDLE);
  TU_LIVE(ctx, CUSAFE_TYPE_CONTEXT);
  TU_OK(cusafe_context_get_device(&dev, ctx));
  ck_assert_int_eq(dev, 0);
  TU_OK(cusafe_context_synchronize(ctx));
}
END_TEST

/* One context per device: a second create is the same handle with one more
 * reference, which must be released on its own. */
START_TEST(test_context_is_one_per_device) {
  cusafe_context again = CUSAFE_NULL_HANDLE;
  cusafe_context third = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&again, 0));
  ck_assert_uint_eq(again, ctx);
  TU_OK(cusafe_context_create(&third, 0));
  ck_assert_uint_eq(third, ctx);
  TU_OK(cusafe_context_release(again));
  TU_OK(cusafe_release(third));
  /* The fixture's reference is still there. */
  TU_LIVE(ctx, CUSAFE_TYPE_CONTEXT);
}
END_TEST

START_TEST(test_context_on_every_device) {
  int n = device_count();
  for (int d = 0; d < n; d++) {
    cusafe_context c = CUSAFE_NULL_HANDLE;
    int dev = -1;
    TU_OK(cusafe_context_create(&c, d));
    TU_LIVE(c, CUSAFE_TYPE_CONTEXT);
    TU_OK(cusafe_context_get_device(&dev, c));
    ck_assert_int_eq(dev, d);
    if (d == 0)
      ck_assert_uint_eq(c, ctx);
    else
      ck_assert_uint_ne(c, ctx);
    TU_OK(cusafe_context_synchronize(c));
    TU_OK(cusafe_context_release(c));
  }
}
END_TEST

START_TEST(test_context_priority_range) {
  int least = 12345, greatest = 12345;
  TU_OK(cusafe_context_stream_priority_range(&least, &greatest, ctx));
  ck_assert_int_ge(least, greatest);
#ifdef CUSAFE_TEST_FAKE
  ck_assert_int_eq(least, 0);
  ck_assert_int_eq(greatest, -5);
#endif
  TU_ERR(cusafe_context_stream_priority_range(NULL, &greatest, ctx),
         CUSAFE_ERROR_INVALID_VALUE, "least is NULL");
  TU_ERR(cusafe_context_stream_priority_range(&least, NULL, ctx),
         CUSAFE_ERROR_INVALID_VALUE, "greatest is NULL");
  TU_ERR(cusafe_context_get_device(NULL, ctx), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
}
END_TEST

START_TEST(test_context_retain_release_counts) {
  cusafe_context c = CUSAFE_NULL_HANDLE;
  int n = device_count();
  int d = n - 1;
  /* The last device has no fixture context when there are two or more. */
  TU_OK(cusafe_context_create(&c, d));
  TU_OK(cusafe_context_retain(c));
  TU_OK(cusafe_retain(c));
  TU_OK(cusafe_context_release(c));
  TU_OK(cusafe_release(c));
  TU_LIVE(c, CUSAFE_TYPE_CONTEXT);
  TU_OK(cusafe_context_release(c));
  if (d != 0) {
    TU_STALE(c);
    TU_ERR(cusafe_context_release(c), CUSAFE_ERROR_INVALID_HANDLE,
           "context 0x%016llx is stale: its object was released", TU_HX(c));
  } else {
    TU_LIVE(c, CUSAFE_TYPE_CONTEXT);
  }
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 4. Streams                                                                */
/* ------------------------------------------------------------------------ */

START_TEST(test_stream_create_with_each_flag) {
  const unsigned int flags[] = {0, CUSAFE_STREAM_NON_BLOCKING};
  for (size_t i = 0; i < 2; i++) {
    cusafe_stream s = CUSAFE_NULL_HANDLE;
    cusafe_context owner = CUSAFE_NULL_HANDLE;
    void *raw = NULL;
    TU_OK(cusafe_stream_create(&s, ctx, flags[i], 0));
    ck_assert_uint_ne(s, CUSAFE_NULL_HANDLE);
    TU_LIVE(s, CUSAFE_TYPE_STREAM);
    TU_OK(cusafe_stream_get_context(&owner, s));
    ck_assert_uint_eq(owner, ctx);
    TU_OK(cusafe_context_release(owner));
    TU_OK(cusafe_stream_interop_handle(&raw, s));
    ck_assert_ptr_nonnull(raw);
    TU_OK(cusafe_stream_synchronize(s));
    TU_OK(cusafe_stream_query(s));
    TU_OK(cusafe_stream_release(s));
    TU_STALE(s);
  }
}
END_TEST

START_TEST(test_stream_bad_flags) {
  const unsigned int bad[] = {0x2u, 0x4u, 0x80000000u, 0xfffffffeu};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cusafe_stream s = (cusafe_stream)0x1234;
    TU_ERR(cusafe_stream_create(&s, ctx, bad[i], 0), CUSAFE_ERROR_INVALID_VALUE,
           "unknown stream flags 0x%x", bad[i]);
    ck_assert_uint_eq(s, CUSAFE_NULL_HANDLE);
  }
  TU_ERR(cusafe_stream_create(NULL, ctx, 0, 0), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
}
END_TEST

START_TEST(test_stream_priorities) {
  int least = 0, greatest = 0;
  TU_OK(cusafe_context_stream_priority_range(&least, &greatest, ctx));
  const int good[3] = {least, greatest, 0 /* the default */};
  for (size_t i = 0; i < 3; i++) {
    cusafe_stream s = CUSAFE_NULL_HANDLE;
    TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, good[i]));
    TU_OK(cusafe_stream_synchronize(s));
    TU_OK(cusafe_stream_release(s));
  }
  const int bad[] = {least + 1, greatest - 1, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cusafe_stream s = (cusafe_stream)0x1234;
    TU_ERR(cusafe_stream_create(&s, ctx, 0, bad[i]), CUSAFE_ERROR_INVALID_VALUE,
           "priority %d is outside the device's range [%d, %d]", bad[i],
           greatest, least);
    ck_assert_uint_eq(s, CUSAFE_NULL_HANDLE);
  }
}
END_TEST

START_TEST(test_stream_query_after_synchronize) {
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  unsigned char *data = tu_xmalloc(MIB);
  tu_pattern(data, MIB, 1);
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, MIB));
  TU_OK(cusafe_buffer_write_async(b, 0, data, MIB, s));
  TU_OK(cusafe_buffer_fill(b, 0, MIB, 0x11, s));
  TU_OK(cusafe_stream_synchronize(s));
  TU_OK(cusafe_stream_query(s));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(s));
  free(data);
}
END_TEST

START_TEST(test_stream_interop_handles_are_distinct) {
  cusafe_stream a = CUSAFE_NULL_HANDLE, b = CUSAFE_NULL_HANDLE;
  void *ra = NULL, *rb = NULL;
  TU_OK(cusafe_stream_create(&a, ctx, 0, 0));
  TU_OK(cusafe_stream_create(&b, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  ck_assert_uint_ne(a, b);
  TU_OK(cusafe_stream_interop_handle(&ra, a));
  TU_OK(cusafe_stream_interop_handle(&rb, b));
  ck_assert_ptr_nonnull(ra);
  ck_assert_ptr_nonnull(rb);
  ck_assert_ptr_ne(ra, rb);
  TU_ERR(cusafe_stream_interop_handle(NULL, a), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  TU_ERR(cusafe_stream_get_context(NULL, a), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  TU_OK(cusafe_stream_release(a));
  TU_OK(cusafe_stream_release(b));
}
END_TEST

/* A stream of another library (here the raw stream of a cusafe stream,
 * and the device's legacy default stream) wrapped: work on the wrapper
 * goes to that stream, and releasing the wrapper leaves it alone. */
START_TEST(test_stream_wrap) {
  cusafe_stream own = CUSAFE_NULL_HANDLE, w = CUSAFE_NULL_HANDLE;
  void *raw = NULL, *back = NULL;
  unsigned char data[256], got[256];
  tu_pattern(data, sizeof data, 77);
  TU_OK(cusafe_stream_create(&own, ctx, 0, 0));
  TU_OK(cusafe_stream_interop_handle(&raw, own));
  void *const streams[] = {raw, NULL};
  for (size_t i = 0; i < 2; i++) {
    cusafe_buffer b = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 256, 3, NULL);
    cusafe_context c = CUSAFE_NULL_HANDLE;
    TU_OK(cusafe_stream_wrap(&w, ctx, streams[i]));
    ck_assert_uint_ne(w, CUSAFE_NULL_HANDLE);
    TU_OK(cusafe_stream_interop_handle(&back, w));
    ck_assert_ptr_eq(back, streams[i]);
    TU_OK(cusafe_stream_get_context(&c, w));
    ck_assert_uint_eq(c, ctx);
    TU_OK(cusafe_context_release(c));
    memset(got, 0, sizeof got);
    TU_OK(cusafe_buffer_write_async(b, 0, data, sizeof data, w));
    TU_OK(cusafe_buffer_read_async(b, 0, got, sizeof got, w));
    TU_OK(cusafe_stream_synchronize(w));
    ck_assert_mem_eq(got, data, sizeof data);
    /* The buffer's latest work is on the wrapper: it outlives the handle. */
    TU_OK(cusafe_stream_release(w));
    TU_OK(cusafe_buffer_release(b));
  }
  /* The wrapped stream was not destroyed: its owner still uses it. */
  TU_OK(cusafe_stream_synchronize(own));
  TU_OK(cusafe_stream_release(own));
  TU_ERR(cusafe_stream_wrap(NULL, ctx, NULL), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  w = 42;
  TU_ERR(cusafe_stream_wrap(&w, CUSAFE_NULL_HANDLE, NULL),
         CUSAFE_ERROR_INVALID_HANDLE, "context is the NULL handle");
  ck_assert_uint_eq(w, CUSAFE_NULL_HANDLE);
}
END_TEST

/* Copies both ways between two devices' memory, on either device's
 * stream, arrive whole.  Against the fake: the first enables peer access
 * both ways (the contexts' and the memory pools'), once, leaving no CUDA
 * error behind; a new primary context of a device gets it again. */
START_TEST(test_peer_copies) {
  if (!have_two_devices("test_peer_copies"))
    return;
  enum { SIZE = 4096, HALF = SIZE / 2 };
  unsigned char want_a[SIZE], want_b[SIZE];
  cusafe_context c0 = CUSAFE_NULL_HANDLE, c1 = CUSAFE_NULL_HANDLE;
  cusafe_stream s0 = CUSAFE_NULL_HANDLE, s1 = CUSAFE_NULL_HANDLE;
  for (int round = 0; round < 2; round++) {
    TU_OK(cusafe_context_create(&c0, 0));
    TU_OK(cusafe_context_create(&c1, 1));
    TU_OK(cusafe_stream_create(&s0, c0, 0, 0));
    TU_OK(cusafe_stream_create(&s1, c1, 0, 0));
    cusafe_buffer a = make_buffer(c0, CUSAFE_MEMORY_DEVICE, SIZE, 7, want_a);
    cusafe_buffer b = make_buffer(c1, CUSAFE_MEMORY_DEVICE, SIZE, 9, want_b);
#ifdef CUSAFE_TEST_FAKE
    ck_assert_int_eq(fake_peer_access(0, 1), 0);
    ck_assert_int_eq(fake_peer_access(1, 0), 0);
#endif
    for (int i = 0; i < 4; i++) {
      /* a's first half into b, b's second half into a */
      TU_OK(cusafe_buffer_copy(b, 0, a, 0, HALF, i % 2 ? s1 : s0));
      TU_OK(cusafe_buffer_copy(a, HALF, b, HALF, HALF, i % 2 ? s0 : s1));
    }
    memcpy(want_b, want_a, HALF);
    memcpy(want_a + HALF, want_b + HALF, HALF);
    CHECK_CONTENT(a, 0, want_a, SIZE);
    CHECK_CONTENT(b, 0, want_b, SIZE);
#ifdef CUSAFE_TEST_FAKE
    ck_assert_int_eq(fake_peer_access(0, 1), 3);
    ck_assert_int_eq(fake_peer_access(1, 0), 3);
    ck_assert_uint_eq(fake_log_count("cudaDeviceEnablePeerAccess"),
                      2 * (round + 1));
    ck_assert_uint_eq(fake_log_count("cudaMemPoolSetAccess"), 2 * (round + 1));
    ck_assert_int_eq(cs_cu->get_last_error(), cudaSuccess);
#endif
    TU_OK(cusafe_buffer_release(a));
    TU_OK(cusafe_buffer_release(b));
    TU_OK(cusafe_stream_release(s0));
    TU_OK(cusafe_stream_release(s1));
    /* The primary contexts go, and their peer access with them. */
    TU_OK(cusafe_context_release(c1));
    TU_OK(cusafe_context_release(c0));
  }
}
END_TEST

#ifdef CUSAFE_TEST_FAKE
/* A copy from device 0 to device 1 where devices cannot reach each other
 * (staged by CUDA), or after another library sharing the primary contexts
 * enabled peer access (`other_first`): right all the same, leaving no CUDA
 * error behind. */
static void peer_copy_after(int reachable, int other_first) {
  fake_set_peer_access(reachable);
  cusafe_context c0, c1;
  TU_OK(cusafe_context_create(&c0, 0));
  TU_OK(cusafe_context_create(&c1, 1));
  if (other_first) {
    ck_assert_int_eq(cs_cu->set_device(1), cudaSuccess);
    ck_assert_int_eq(cs_cu->device_enable_peer_access(0, 0), cudaSuccess);
    ck_assert_int_eq(cs_cu->set_device(0), cudaSuccess);
  }
  unsigned char want[256];
  cusafe_buffer a = make_buffer(c0, CUSAFE_MEMORY_DEVICE, 256, 3, want);
  cusafe_buffer b = make_buffer(c1, CUSAFE_MEMORY_DEVICE, 256, 4, NULL);
  TU_OK(cusafe_buffer_copy(b, 0, a, 0, 256, CUSAFE_STREAM_DEFAULT));
  CHECK_CONTENT(b, 0, want, 256);
  ck_assert_int_eq(cs_cu->get_last_error(), cudaSuccess);
  ck_assert_int_eq(fake_peer_access(0, 1), reachable ? 3 : 0);
  ck_assert_int_eq(fake_peer_access(1, 0), reachable ? 3 : 0);
  TU_OK(cusafe_buffer_release(a));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_context_release(c1));
  TU_OK(cusafe_context_release(c0));
}

/* Work that other code queues by address on every device (as NCCL does),
 * recorded with cusafe_stream_use_buffers: each stream waits for the
 * work queued before on its buffers, a peer copy on the other device's
 * stream included, and buffers released right after the foreign work is
 * queued are freed after it (the fake finds a use after free). */
START_TEST(test_foreign_work_on_every_device) {
  enum { SIZE = 4096 };
  cusafe_context c[2];
  cusafe_stream s[2];
  cusafe_buffer src[2], dst[2];
  unsigned char want[2][SIZE];
  for (int d = 0; d < 2; d++) {
    TU_OK(cusafe_context_create(&c[d], d));
    TU_OK(cusafe_stream_create(&s[d], c[d], CUSAFE_STREAM_NON_BLOCKING, 0));
    src[d] = make_buffer(c[d], CUSAFE_MEMORY_DEVICE, SIZE, 20 + d, want[d]);
    TU_OK(cusafe_buffer_alloc(&dst[d], c[d], CUSAFE_MEMORY_DEVICE, SIZE));
  }
  fake_set_paused(1);
  /* Device 1's source comes from device 0, copied on device 0's stream. */
  TU_OK(cusafe_buffer_copy(src[1], 0, src[0], 0, SIZE / 2, s[0]));
  memcpy(want[1], want[0], SIZE / 2);
  for (int d = 0; d < 2; d++) {
    void *from, *to, *stream;
    const cusafe_buffer both[] = {src[d], dst[d]};
    TU_OK(cusafe_buffer_interop_pointer(&from, src[d]));
    TU_OK(cusafe_buffer_interop_pointer(&to, dst[d]));
    TU_OK(cusafe_stream_interop_handle(&stream, s[d]));
    TU_OK(cusafe_stream_use_buffers(s[d], both, 2));
    ck_assert_int_eq(cs_cu->set_device(d), cudaSuccess);
    ck_assert_int_eq(cs_cu->memcpy_async(to, from, SIZE,
                                         cudaMemcpyDeviceToDevice,
                                         (cudaStream_t)stream),
                     cudaSuccess);
    TU_OK(cusafe_buffer_release(src[d])); /* freed after the copy */
  }
  ck_assert_int_eq(cs_cu->set_device(0), cudaSuccess);
  fake_set_paused(0);
  for (int d = 0; d < 2; d++) {
    CHECK_CONTENT(dst[d], 0, want[d], SIZE);
    TU_OK(cusafe_buffer_release(dst[d]));
    TU_OK(cusafe_stream_release(s[d]));
    TU_OK(cusafe_context_release(c[d]));
    ck_assert_uint_eq(fake_live_allocations(d), 0);
  }
}
END_TEST

START_TEST(test_peer_copy_unreachable) { peer_copy_after(0, 0); }
END_TEST

START_TEST(test_peer_copy_after_other_library) { peer_copy_after(1, 1); }
END_TEST
#endif

/* A wrapper of a cusafe stream's CUDA stream holds that stream: released
 * first, its CUDA stream lives until the wrapper goes, and work queued
 * through the wrapper meanwhile runs on it. */
START_TEST(test_wrap_holds_own_stream) {
  cusafe_stream own = CUSAFE_NULL_HANDLE, w = CUSAFE_NULL_HANDLE;
  void *raw = NULL, *back = NULL;
  unsigned char data[256], got[256];
  tu_pattern(data, sizeof data, 91);
#ifdef CUSAFE_TEST_FAKE
  size_t streams = fake_live_streams(0);
#endif
  TU_OK(cusafe_stream_create(&own, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_interop_handle(&raw, own));
  TU_OK(cusafe_stream_wrap(&w, ctx, raw));
  TU_OK(cusafe_stream_release(own));
  TU_STALE(own);
#ifdef CUSAFE_TEST_FAKE
  ck_assert_uint_eq(fake_live_streams(0), streams + 1);
#endif
  cusafe_buffer b = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 256, 5, NULL);
  memset(got, 0, sizeof got);
  TU_OK(cusafe_buffer_write_async(b, 0, data, sizeof data, w));
  TU_OK(cusafe_buffer_read_async(b, 0, got, sizeof got, w));
  TU_OK(cusafe_stream_synchronize(w));
  ck_assert_mem_eq(got, data, sizeof data);
  TU_OK(cusafe_stream_interop_handle(&back, w));
  ck_assert_ptr_eq(back, raw);
  TU_OK(cusafe_buffer_release(b)); /* freed stream-ordered on raw */
  TU_OK(cusafe_stream_release(w));
#ifdef CUSAFE_TEST_FAKE
  /* The buffer's free held the wrapper, and the wrapper the stream, until
   * the free had run. */
  TU_OK(cusafe_context_synchronize(ctx));
  ck_assert_uint_eq(fake_live_streams(0), streams);
#endif
}
END_TEST

/* A stream of device 1 cannot be wrapped on device 0's context. */
START_TEST(test_stream_wrap_other_device) {
  if (!have_two_devices("test_stream_wrap_other_device"))
    return;
  cusafe_context c1 = CUSAFE_NULL_HANDLE;
  cusafe_stream s1 = CUSAFE_NULL_HANDLE, w = 42;
  void *raw = NULL;
  TU_OK(cusafe_context_create(&c1, 1));
#ifdef CUSAFE_TEST_FAKE
  size_t streams = fake_live_streams(1);
#endif
  TU_OK(cusafe_stream_create(&s1, c1, 0, 0));
  TU_OK(cusafe_stream_interop_handle(&raw, s1));
  TU_ERR(cusafe_stream_wrap(&w, ctx, raw), CUSAFE_ERROR_CONTEXT_MISMATCH,
         "stream %p belongs to device 1 but context belongs to device 0", raw);
  ck_assert_uint_eq(w, CUSAFE_NULL_HANDLE);
  TU_OK(cusafe_stream_wrap(&w, c1, raw));
  TU_OK(cusafe_stream_release(w));
  TU_OK(cusafe_stream_release(s1));
#ifdef CUSAFE_TEST_FAKE
  /* Neither wrap kept s1: the refused one let go of it at once. */
  ck_assert_uint_eq(fake_live_streams(1), streams);
#endif
  TU_OK(cusafe_context_release(c1));
}
END_TEST

/* Work queued by other code on a stream, recorded: checks and errors. */
START_TEST(test_stream_use_buffers) {
  cusafe_stream s = CUSAFE_NULL_HANDLE, gone = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 64, 5, NULL);
  cusafe_buffer v = CUSAFE_NULL_HANDLE, dead = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, 0, 0));
  TU_OK(cusafe_buffer_view(&v, b, 8, 16));
  TU_OK(cusafe_buffer_alloc(&dead, ctx, CUSAFE_MEMORY_DEVICE, 8));
  TU_OK(cusafe_buffer_release(dead));
  TU_OK(cusafe_stream_create(&gone, ctx, 0, 0));
  TU_OK(cusafe_stream_release(gone));
  const cusafe_buffer list[] = {b, v, b, v};
  TU_OK(cusafe_stream_use_buffers(s, list, 4));
  TU_OK(cusafe_stream_use_buffers(CUSAFE_STREAM_DEFAULT, list, 2));
  TU_OK(cusafe_stream_use_buffers(CUSAFE_STREAM_DEFAULT, NULL, 0));
  TU_OK(cusafe_stream_use_buffers(s, NULL, 0));
  TU_ERR(cusafe_stream_use_buffers(s, NULL, 1), CUSAFE_ERROR_INVALID_VALUE,
         "buffers is NULL");
  const cusafe_buffer bad[] = {b, CUSAFE_NULL_HANDLE};
  TU_ERR(cusafe_stream_use_buffers(s, bad, 2), CUSAFE_ERROR_INVALID_HANDLE,
         "buffers 1 is the NULL handle");
  TU_ERR(cusafe_stream_use_buffers(s, &dead, 1), CUSAFE_ERROR_INVALID_HANDLE,
         "buffers 0 0x%016llx is stale: its object was released",
         (unsigned long long)dead);
  const cusafe_buffer typed[] = {v, s};
  TU_ERR(cusafe_stream_use_buffers(s, typed, 2), CUSAFE_ERROR_INVALID_HANDLE,
         "buffers 1 0x%016llx is a stream, not a buffer",
         (unsigned long long)s);
  TU_ERR(cusafe_stream_use_buffers(gone, NULL, 0), CUSAFE_ERROR_INVALID_HANDLE,
         "stream 0x%016llx is stale: its object was released",
         (unsigned long long)gone);
  TU_ERR(cusafe_stream_use_buffers(gone, list, 1), CUSAFE_ERROR_INVALID_HANDLE,
         "stream 0x%016llx is stale: its object was released",
         (unsigned long long)gone);
  if (have_two_devices("test_stream_use_buffers")) {
    cusafe_context c1 = CUSAFE_NULL_HANDLE;
    TU_OK(cusafe_context_create(&c1, 1));
    cusafe_buffer other = make_buffer(c1, CUSAFE_MEMORY_DEVICE, 8, 6, NULL);
    const cusafe_buffer mixed[] = {b, other};
    TU_ERR(cusafe_stream_use_buffers(s, mixed, 2),
           CUSAFE_ERROR_CONTEXT_MISMATCH,
           "buffers 1 belongs to device 1 but stream belongs to device 0");
    TU_OK(cusafe_buffer_release(other));
    TU_OK(cusafe_context_release(c1));
  }
  TU_OK(cusafe_stream_synchronize(s));
  TU_OK(cusafe_buffer_release(v));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

#ifdef CUSAFE_TEST_FAKE
/* A buffer recorded as used by another library's work on its stream:
 * that stream waits for the buffer's earlier work, and the buffer,
 * released meanwhile, is freed on that stream after the work -- and the
 * foreign stream, wrapped, is never destroyed by cusafe. */
START_TEST(test_stream_use_buffers_orders_and_keeps_alive) {
  cusafe_stream w = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 64, 7, NULL);
  cudaStream_t foreign = fake_foreign_stream(0);
  size_t live = fake_live_allocations(0);
  TU_OK(cusafe_stream_wrap(&w, ctx, foreign));
  fake_set_paused(1);
  TU_OK(cusafe_buffer_fill(b, 0, 64, 0x11, CUSAFE_STREAM_DEFAULT));
  size_t from = fake_log_length();
  TU_OK(cusafe_stream_use_buffers(w, &b, 1));
  /* The foreign stream waits for the fill on the context's stream. */
  ck_assert_int_ge(fake_log_find("cudaEventRecord", from), 0);
  ck_assert_int_ge(fake_log_find("cudaStreamWaitEvent", from), 0);
  /* The other library's work would be queued here; both handles go. */
  TU_OK(cusafe_stream_release(w));
  TU_OK(cusafe_buffer_release(b));
  ck_assert_int_ge(fake_log_find("cudaFreeAsync", from), 0);
  ck_assert_uint_eq(fake_live_allocations(0), live); /* freed not yet */
  /* The owner finishes its stream: the fill, then the free run. */
  fake_foreign_stream_destroy(foreign);
  fake_set_paused(0);
  TU_OK(cusafe_context_synchronize(ctx));
  ck_assert_uint_eq(fake_live_allocations(0), live - 1);
  long fill = fake_log_find("exec:cudaMemsetAsync", from);
  long freed = fake_log_find("exec:cudaFreeAsync", from);
  ck_assert_int_ge(fill, 0);
  ck_assert_int_gt(freed, fill);
}
END_TEST
#endif

/* ------------------------------------------------------------------------ */
/* 5. Events                                                                 */
/* ------------------------------------------------------------------------ */

START_TEST(test_event_create_with_each_flag_combination) {
  const unsigned int flags[] = {
      0, CUSAFE_EVENT_DISABLE_TIMING, CUSAFE_EVENT_BLOCKING_SYNC,
      CUSAFE_EVENT_DISABLE_TIMING | CUSAFE_EVENT_BLOCKING_SYNC};
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  for (size_t i = 0; i < 4; i++) {
    cusafe_event e = CUSAFE_NULL_HANDLE;
    TU_OK(cusafe_event_create(&e, ctx, flags[i]));
    ck_assert_uint_ne(e, CUSAFE_NULL_HANDLE);
    TU_LIVE(e, CUSAFE_TYPE_EVENT);
    TU_OK(cusafe_event_record(e, s));
    TU_OK(cusafe_event_synchronize(e));
    TU_OK(cusafe_event_query(e));
    TU_OK(cusafe_event_record(e, CUSAFE_STREAM_DEFAULT));
    TU_OK(cusafe_event_synchronize(e));
    TU_OK(cusafe_event_query(e));
    TU_OK(cusafe_event_release(e));
    TU_STALE(e);
  }
  TU_OK(cusafe_stream_release(s));
}
END_TEST

START_TEST(test_event_bad_flags) {
  const unsigned int bad[] = {0x4u, 0x8u, 0x80000000u, 0xfffffffcu};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cusafe_event e = CUSAFE_NULL_HANDLE;
    TU_ERR(cusafe_event_create(&e, ctx, bad[i]), CUSAFE_ERROR_INVALID_VALUE,
           "unknown event flags 0x%x", bad[i]);
    ck_assert_uint_eq(e, CUSAFE_NULL_HANDLE);
  }
  TU_ERR(cusafe_event_create(NULL, ctx, 0), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
}
END_TEST

START_TEST(test_event_never_recorded_completes_at_once) {
  cusafe_event e = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_event_create(&e, ctx, 0));
  TU_OK(cusafe_event_synchronize(e));
  TU_OK(cusafe_event_query(e));
  TU_OK(cusafe_event_release(e));
}
END_TEST

START_TEST(test_event_elapsed_time) {
  cusafe_event start = CUSAFE_NULL_HANDLE, end = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  float ms = -1.0f;
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_event_create(&start, ctx, 0));
  TU_OK(cusafe_event_create(&end, ctx, CUSAFE_EVENT_BLOCKING_SYNC));
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, 4 * MIB));
  TU_OK(cusafe_event_record(start, s));
  TU_OK(cusafe_buffer_fill(b, 0, 4 * MIB, 0x42, s));
  TU_OK(cusafe_event_record(end, s));
  TU_OK(cusafe_event_synchronize(end));
  TU_OK(cusafe_event_elapsed_ms(&ms, start, end));
  ck_assert_msg(ms == ms, "elapsed time is NaN");
  ck_assert_float_ge(ms, 0.0f);
  TU_ERR(cusafe_event_elapsed_ms(NULL, start, end), CUSAFE_ERROR_INVALID_VALUE,
         "ms is NULL");
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_event_release(start));
  TU_OK(cusafe_event_release(end));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

START_TEST(test_event_elapsed_needs_timing) {
  cusafe_event timed = CUSAFE_NULL_HANDLE, untimed = CUSAFE_NULL_HANDLE;
  float ms = 0.0f;
  TU_OK(cusafe_event_create(&timed, ctx, 0));
  TU_OK(cusafe_event_create(&untimed, ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_event_record(timed, CUSAFE_STREAM_DEFAULT));
  TU_OK(cusafe_event_record(untimed, CUSAFE_STREAM_DEFAULT));
  TU_OK(cusafe_event_synchronize(untimed));
  TU_OK(cusafe_event_synchronize(timed));
  TU_ERR(cusafe_event_elapsed_ms(&ms, untimed, timed),
         CUSAFE_ERROR_INVALID_VALUE,
         "event was created with CUSAFE_EVENT_DISABLE_TIMING");
  TU_ERR(cusafe_event_elapsed_ms(&ms, timed, untimed),
         CUSAFE_ERROR_INVALID_VALUE,
         "event was created with CUSAFE_EVENT_DISABLE_TIMING");
  TU_OK(cusafe_event_release(timed));
  TU_OK(cusafe_event_release(untimed));
}
END_TEST

START_TEST(test_event_elapsed_never_recorded_is_cuda_error) {
  cusafe_event a = CUSAFE_NULL_HANDLE, b = CUSAFE_NULL_HANDLE;
  float ms = 0.0f;
  TU_OK(cusafe_event_create(&a, ctx, 0));
  TU_OK(cusafe_event_create(&b, ctx, 0));
  TU_ERR_PREFIX(cusafe_event_elapsed_ms(&ms, a, b), CUSAFE_ERROR_CUDA,
                "cudaEventElapsedTime failed: ");
  ck_assert_int_ne(cusafe_last_cuda_error(), 0);
  TU_OK(cusafe_event_release(a));
  TU_OK(cusafe_event_release(b));
}
END_TEST

START_TEST(test_stream_wait_event) {
  cusafe_stream s1 = CUSAFE_NULL_HANDLE, s2 = CUSAFE_NULL_HANDLE;
  cusafe_event e = CUSAFE_NULL_HANDLE, never = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  unsigned char *src = tu_xmalloc(MIB), *dst = tu_xmalloc(MIB);
  tu_pattern(src, MIB, 7);
  TU_OK(cusafe_stream_create(&s1, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_create(&s2, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_event_create(&e, ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_event_create(&never, ctx, 0));
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, MIB));
  TU_OK(cusafe_buffer_write_async(b, 0, src, MIB, s1));
  TU_OK(cusafe_event_record(e, s1));
  TU_OK(cusafe_stream_wait_event(s2, e));
  /* Waiting on an event never recorded waits for nothing. */
  TU_OK(cusafe_stream_wait_event(s2, never));
  TU_OK(cusafe_buffer_read_async(b, 0, dst, MIB, s2));
  TU_OK(cusafe_stream_synchronize(s2));
  TU_BYTES_EQ(dst, src, MIB);
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_event_release(e));
  TU_OK(cusafe_event_release(never));
  TU_OK(cusafe_stream_release(s1));
  TU_OK(cusafe_stream_release(s2));
  free(src);
  free(dst);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 6. Buffers, for every memory kind (loop tests: _i is the kind)            */
/* ------------------------------------------------------------------------ */

START_TEST(test_buffer_roundtrip) {
  const cusafe_memory kind = all_kinds[_i];
  const size_t sizes[] = {1, 4097, MIB};
  if (!kind_usable(ctx, 0, kind))
    return;
  for (size_t i = 0; i < 3; i++) {
    size_t n = sizes[i], got_size = 0;
    cusafe_memory got_kind = (cusafe_memory)-1;
    cusafe_context owner = CUSAFE_NULL_HANDLE;
    unsigned char *data = tu_xmalloc(n);
    cusafe_buffer b = make_buffer(ctx, kind, n, (uint32_t)(n + _i), data);
    TU_LIVE(b, CUSAFE_TYPE_BUFFER);
    TU_OK(cusafe_buffer_get_size(&got_size, b));
    ck_assert_uint_eq(got_size, n);
    TU_OK(cusafe_buffer_get_memory(&got_kind, b));
    ck_assert_int_eq(got_kind, kind);
    TU_OK(cusafe_buffer_get_context(&owner, b));
    ck_assert_uint_eq(owner, ctx);
    TU_OK(cusafe_context_release(owner));
    CHECK_CONTENT(b, 0, data, n);
    /* A part, at an offset. */
    CHECK_CONTENT(b, n / 3, data + n / 3, n - n / 3);
    CHECK_CONTENT(b, n - 1, data + n - 1, 1);
    TU_OK(cusafe_buffer_release(b));
    TU_STALE(b);
    free(data);
  }
}
END_TEST

START_TEST(test_buffer_fill) {
  const cusafe_memory kind = all_kinds[_i];
  const size_t n = 4097;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  unsigned char *want = tu_xmalloc(n);
  if (!kind_usable(ctx, 0, kind)) {
    free(want);
    return;
  }
  cusafe_buffer b = make_buffer(ctx, kind, n, 3, want);
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_fill(b, 100, 1000, 0x5a, CUSAFE_STREAM_DEFAULT));
  memset(want + 100, 0x5a, 1000);
  CHECK_CONTENT(b, 0, want, n);
  TU_OK(cusafe_buffer_fill(b, 3, 1, 0x00, s));
  TU_OK(cusafe_buffer_fill(b, n - 7, 7, 0xff, s));
  TU_OK(cusafe_buffer_fill(b, n, 0, 0x77, s)); /* empty, at the end */
  TU_OK(cusafe_stream_synchronize(s));
  want[3] = 0x00;
  memset(want + n - 7, 0xff, 7);
  CHECK_CONTENT(b, 0, want, n);
  TU_OK(cusafe_buffer_fill(b, 0, n, 0xc3, s));
  memset(want, 0xc3, n);
  CHECK_CONTENT(b, 0, want, n);
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(s));
  free(want);
}
END_TEST

START_TEST(test_buffer_copy_between_all_kinds) {
  const size_t n = 8192;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  unsigned char *src_data = tu_xmalloc(n), *want = tu_xmalloc(n);
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  for (int i = 0; i < NKINDS; i++) {
    if (!kind_usable(ctx, 0, all_kinds[i]))
      continue;
    for (int j = 0; j < NKINDS; j++) {
      if (!kind_usable(ctx, 0, all_kinds[j]))
        continue;
      uint32_t seed = (uint32_t)(10 * i + j);
      cusafe_buffer src = make_buffer(ctx, all_kinds[i], n, seed, src_data);
      cusafe_buffer dst = make_buffer(ctx, all_kinds[j], n, seed + 100, want);
      /* Alternate the default stream and a user stream. */
      cusafe_stream on = ((i + j) % 2) ? s : CUSAFE_STREAM_DEFAULT;
      TU_OK(cusafe_buffer_copy(dst, 1001, src, 17, 5000, on));
      memcpy(want + 1001, src_data + 17, 5000);
      /* The whole destination: nothing written outside the range. */
      CHECK_CONTENT(dst, 0, want, n);
      CHECK_CONTENT(src, 0, src_data, n);
      TU_OK(cusafe_buffer_release(src));
      TU_OK(cusafe_buffer_release(dst));
    }
  }
  TU_OK(cusafe_stream_release(s));
  free(src_data);
  free(want);
}
END_TEST

START_TEST(test_buffer_view_at_odd_offset) {
  const cusafe_memory kind = all_kinds[_i];
  const size_t n = 4096;
  unsigned char *data = tu_xmalloc(n), fresh[101];
  cusafe_buffer v = CUSAFE_NULL_HANDLE;
  size_t size = 0;
  cusafe_memory got_kind = (cusafe_memory)-1;
  cusafe_context owner = CUSAFE_NULL_HANDLE;
  if (!kind_usable(ctx, 0, kind)) {
    free(data);
    return;
  }
  cusafe_buffer p = make_buffer(ctx, kind, n, 5, data);
  TU_OK(cusafe_buffer_view(&v, p, 3, 101));
  ck_assert_uint_ne(v, CUSAFE_NULL_HANDLE);
  ck_assert_uint_ne(v, p);
  TU_LIVE(v, CUSAFE_TYPE_BUFFER);
  TU_OK(cusafe_buffer_get_size(&size, v));
  ck_assert_uint_eq(size, 101);
  TU_OK(cusafe_buffer_get_memory(&got_kind, v));
  ck_assert_int_eq(got_kind, kind);
  TU_OK(cusafe_buffer_get_context(&owner, v));
  ck_assert_uint_eq(owner, ctx);
  TU_OK(cusafe_context_release(owner));
  CHECK_CONTENT(v, 0, data + 3, 101);

  /* Through the view, seen through the parent; the rest untouched. */
  tu_pattern(fresh, sizeof fresh, 55);
  TU_OK(cusafe_buffer_write(v, 0, fresh, sizeof fresh));
  memcpy(data + 3, fresh, sizeof fresh);
  CHECK_CONTENT(p, 0, data, n);

  /* Through the parent, seen through the view. */
  tu_pattern(fresh, 10, 56);
  TU_OK(cusafe_buffer_write(p, 50, fresh, 10));
  memcpy(data + 50, fresh, 10);
  CHECK_CONTENT(v, 47, data + 50, 10);
  CHECK_CONTENT(v, 0, data + 3, 101);

  /* A fill through the view stays within it. */
  TU_OK(cusafe_buffer_fill(v, 0, 101, 0x99, CUSAFE_STREAM_DEFAULT));
  memset(data + 3, 0x99, 101);
  CHECK_CONTENT(p, 0, data, n);

  TU_OK(cusafe_buffer_release(v));
  TU_STALE(v);
  TU_LIVE(p, CUSAFE_TYPE_BUFFER);
  TU_OK(cusafe_buffer_release(p));
  free(data);
}
END_TEST

START_TEST(test_buffer_view_of_view) {
  const cusafe_memory kind = all_kinds[_i];
  const size_t n = 4096;
  unsigned char *data = tu_xmalloc(n), fresh[101];
  cusafe_buffer v1 = CUSAFE_NULL_HANDLE, v2 = CUSAFE_NULL_HANDLE;
  cusafe_buffer bad = CUSAFE_NULL_HANDLE;
  size_t size = 0;
  if (!kind_usable(ctx, 0, kind)) {
    free(data);
    return;
  }
  cusafe_buffer p = make_buffer(ctx, kind, n, 6, data);
  TU_OK(cusafe_buffer_view(&v1, p, 3, 1001));
  TU_OK(cusafe_buffer_view(&v2, v1, 5, 101));
  TU_OK(cusafe_buffer_get_size(&size, v2));
  ck_assert_uint_eq(size, 101);
  CHECK_CONTENT(v2, 0, data + 8, 101);
  tu_pattern(fresh, sizeof fresh, 66);
  TU_OK(cusafe_buffer_write(v2, 0, fresh, sizeof fresh));
  memcpy(data + 8, fresh, sizeof fresh);
  CHECK_CONTENT(p, 0, data, n);
  CHECK_CONTENT(v1, 0, data + 3, 1001);
  /* Bounds are the view's own, not the parent's. */
  TU_ERR(cusafe_buffer_view(&bad, v1, 1000, 2), CUSAFE_ERROR_OUT_OF_RANGE,
         "view of 2 bytes at offset 1000 exceeds buffer of 1001 bytes");
  ck_assert_uint_eq(bad, CUSAFE_NULL_HANDLE);
  TU_OK(cusafe_buffer_release(v1));
  TU_OK(cusafe_buffer_release(p));
  /* v2 holds v1, which holds p. */
  CHECK_CONTENT(v2, 0, data + 8, 101);
  TU_OK(cusafe_buffer_release(v2));
  free(data);
}
END_TEST

START_TEST(test_buffer_view_keeps_memory_alive) {
  const cusafe_memory kind = all_kinds[_i];
  const size_t n = 4096;
  unsigned char *data = tu_xmalloc(n), fresh[101];
  cusafe_buffer v = CUSAFE_NULL_HANDLE;
  if (!kind_usable(ctx, 0, kind)) {
    free(data);
    return;
  }
  cusafe_buffer p = make_buffer(ctx, kind, n, 8, data);
  TU_OK(cusafe_buffer_view(&v, p, 3, 101));
#ifdef CUSAFE_TEST_FAKE
  size_t live = fake_live_allocations(-1);
#endif
  TU_OK(cusafe_buffer_release(p));
  TU_STALE(p);
  TU_ERR(cusafe_buffer_get_size(&(size_t){0}, p), CUSAFE_ERROR_INVALID_HANDLE,
         "buffer 0x%016llx is stale: its object was released", TU_HX(p));
#ifdef CUSAFE_TEST_FAKE
  ck_assert_uint_eq(fake_live_allocations(-1), live);
#endif
  CHECK_CONTENT(v, 0, data + 3, 101);
  tu_pattern(fresh, sizeof fresh, 88);
  TU_OK(cusafe_buffer_write(v, 0, fresh, sizeof fresh));
  CHECK_CONTENT(v, 0, fresh, sizeof fresh);
  TU_OK(cusafe_buffer_release(v));
  TU_STALE(v);
#ifdef CUSAFE_TEST_FAKE
  ck_assert_uint_eq(fake_live_allocations(-1), live - 1);
#endif
  free(data);
}
END_TEST

START_TEST(test_buffer_alloc_async_used_on_other_stream) {
  const size_t n = 65536;
  cusafe_stream a = CUSAFE_NULL_HANDLE, b = CUSAFE_NULL_HANDLE;
  cusafe_buffer buf = CUSAFE_NULL_HANDLE, copy = CUSAFE_NULL_HANDLE;
  cusafe_memory kind = (cusafe_memory)-1;
  cusafe_context owner = CUSAFE_NULL_HANDLE;
  size_t size = 0;
  unsigned char *src = tu_xmalloc(n), *dst = tu_xmalloc(n);
  tu_pattern(src, n, 9);
  TU_OK(cusafe_stream_create(&a, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_create(&b, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_alloc_async(&buf, a, n));
  TU_LIVE(buf, CUSAFE_TYPE_BUFFER);
  TU_OK(cusafe_buffer_get_memory(&kind, buf));
  ck_assert_int_eq(kind, CUSAFE_MEMORY_DEVICE);
  TU_OK(cusafe_buffer_get_context(&owner, buf));
  ck_assert_uint_eq(owner, ctx);
  TU_OK(cusafe_context_release(owner));
  TU_OK(cusafe_buffer_get_size(&size, buf));
  ck_assert_uint_eq(size, n);
  TU_OK(cusafe_buffer_write_async(buf, 0, src, n, b));
  TU_OK(cusafe_buffer_alloc_async(&copy, b, n));
  TU_OK(cusafe_buffer_copy(copy, 0, buf, 0, n, a));
  TU_OK(cusafe_buffer_read_async(copy, 0, dst, n, b));
  TU_OK(cusafe_stream_synchronize(b));
  TU_BYTES_EQ(dst, src, n);
  TU_ERR(cusafe_buffer_alloc_async(NULL, a, n), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  TU_OK(cusafe_buffer_release(buf));
  TU_OK(cusafe_buffer_release(copy));
  TU_OK(cusafe_stream_release(a));
  TU_OK(cusafe_stream_release(b));
  free(src);
  free(dst);
}
END_TEST

START_TEST(test_buffer_async_write_and_read) {
  const cusafe_memory kind = all_kinds[_i];
  const size_t n = 3 * 4096 + 5;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  unsigned char *src = tu_xmalloc(n), *dst = tu_xmalloc(n);
  if (!kind_usable(ctx, 0, kind)) {
    free(src);
    free(dst);
    return;
  }
  tu_pattern(src, n, 10);
  memset(dst, 0, n);
  TU_OK(cusafe_stream_create(&s, ctx, 0, 0));
  TU_OK(cusafe_buffer_alloc(&b, ctx, kind, n));
  TU_OK(cusafe_buffer_write_async(b, 0, src, n, s));
  TU_OK(cusafe_buffer_read_async(b, 0, dst, n, s));
  TU_OK(cusafe_stream_synchronize(s));
  TU_BYTES_EQ(dst, src, n);
  /* The default stream of the buffer's context, at an offset. */
  memset(dst, 0, n);
  TU_OK(cusafe_buffer_write_async(b, 11, src, n - 11, CUSAFE_STREAM_DEFAULT));
  TU_OK(cusafe_buffer_read_async(b, 11, dst, n - 11, CUSAFE_STREAM_DEFAULT));
  TU_OK(cusafe_context_synchronize(ctx));
  TU_BYTES_EQ(dst, src, n - 11);
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(s));
  free(src);
  free(dst);
}
END_TEST

/* Pageable host memory is staged: the source may be reused as soon as
 * write_async returns, and read_async returns with the data in place. */
START_TEST(test_buffer_async_pageable_memory_is_staged) {
  const size_t n = 256 * KIB;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  unsigned char *src = tu_xmalloc(n), *want = tu_xmalloc(n);
  unsigned char *dst = tu_xmalloc(n);
  tu_pattern(want, n, 12);
  memcpy(src, want, n);
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, n));
  TU_OK(cusafe_buffer_write_async(b, 0, src, n, s));
  memset(src, 0, n);
  memset(dst, 0, n);
  TU_OK(cusafe_buffer_read_async(b, 0, dst, n, s));
  TU_BYTES_EQ(dst, want, n);
  TU_OK(cusafe_stream_synchronize(s));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(s));
  free(src);
  free(want);
  free(dst);
}
END_TEST

/* The synchronous read sees work queued before it on any stream. */
START_TEST(test_buffer_sync_read_after_work_on_streams) {
  const size_t n = MIB;
  cusafe_stream a = CUSAFE_NULL_HANDLE, b = CUSAFE_NULL_HANDLE;
  cusafe_buffer x = CUSAFE_NULL_HANDLE, y = CUSAFE_NULL_HANDLE;
  unsigned char *src = tu_xmalloc(n), *want = tu_xmalloc(n);
  tu_pattern(src, n, 13);
  TU_OK(cusafe_stream_create(&a, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_create(&b, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_alloc(&x, ctx, CUSAFE_MEMORY_DEVICE, n));
  TU_OK(cusafe_buffer_alloc(&y, ctx, CUSAFE_MEMORY_DEVICE, n));
  TU_OK(cusafe_buffer_write_async(x, 0, src, n, a));
  TU_OK(cusafe_buffer_fill(x, 0, 4096, 0x3c, b));
  TU_OK(cusafe_buffer_copy(y, 0, x, 0, n, a));
  TU_OK(cusafe_buffer_fill(y, n - 10, 10, 0xc3, b));
  memcpy(want, src, n);
  memset(want, 0x3c, 4096);
  memset(want + n - 10, 0xc3, 10);
  CHECK_CONTENT(y, 0, want, n);
  TU_OK(cusafe_buffer_release(x));
  TU_OK(cusafe_buffer_release(y));
  TU_OK(cusafe_stream_release(a));
  TU_OK(cusafe_stream_release(b));
  free(src);
  free(want);
}
END_TEST

START_TEST(test_buffer_interop_pointer) {
  const cusafe_memory kind = all_kinds[_i];
  const size_t n = 4096;
  unsigned char *data = tu_xmalloc(n);
  cusafe_buffer v = CUSAFE_NULL_HANDLE;
  void *base = NULL, *inner = NULL;
  if (!kind_usable(ctx, 0, kind)) {
    free(data);
    return;
  }
  cusafe_buffer b = make_buffer(ctx, kind, n, 14, data);
  TU_OK(cusafe_buffer_interop_pointer(&base, b));
  ck_assert_ptr_nonnull(base);
  TU_OK(cusafe_buffer_view(&v, b, 123, 77));
  TU_OK(cusafe_buffer_interop_pointer(&inner, v));
  ck_assert_ptr_eq(inner, (char *)base + 123);
  if (kind == CUSAFE_MEMORY_HOST_PINNED) {
    /* Pinned memory: the host address, readable here once written. */
    TU_BYTES_EQ(base, data, n);
  }
  TU_ERR(cusafe_buffer_interop_pointer(NULL, b), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  TU_OK(cusafe_buffer_release(v));
  TU_OK(cusafe_buffer_release(b));
  free(data);
}
END_TEST

START_TEST(test_buffer_null_outs) {
  cusafe_buffer b = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 64, 15, NULL);
  TU_ERR(cusafe_buffer_alloc(NULL, ctx, CUSAFE_MEMORY_DEVICE, 64),
         CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  TU_ERR(cusafe_buffer_view(NULL, b, 0, 4), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  TU_ERR(cusafe_buffer_get_size(NULL, b), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  TU_ERR(cusafe_buffer_get_memory(NULL, b), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  TU_ERR(cusafe_buffer_get_context(NULL, b), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  TU_ERR(cusafe_handle_get_type(NULL, b), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  TU_OK(cusafe_buffer_release(b));
}
END_TEST

START_TEST(test_buffer_unknown_memory_kind) {
  const int bad[] = {3, -1, 100};
  for (size_t i = 0; i < 3; i++) {
    cusafe_buffer b = CUSAFE_NULL_HANDLE;
    TU_ERR(cusafe_buffer_alloc(&b, ctx, (cusafe_memory)bad[i], 64),
           CUSAFE_ERROR_INVALID_VALUE, "unknown memory kind %d", bad[i]);
    ck_assert_uint_eq(b, CUSAFE_NULL_HANDLE);
  }
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 7. Bounds                                                                 */
/* ------------------------------------------------------------------------ */

enum access_op { OP_WRITE, OP_READ, OP_FILL, OP_WRITE_ASYNC, OP_READ_ASYNC };
static const char *const access_names[] = {"write", "read", "fill", "write",
                                           "read"};

static cusafe_status access_op(enum access_op op, cusafe_buffer b,
                               size_t offset, size_t size, void *host) {
  switch (op) {
  case OP_WRITE: return cusafe_buffer_write(b, offset, host, size);
  case OP_READ: return cusafe_buffer_read(b, offset, host, size);
  case OP_FILL:
    return cusafe_buffer_fill(b, offset, size, 0x21, CUSAFE_STREAM_DEFAULT);
  case OP_WRITE_ASYNC:
    return cusafe_buffer_write_async(b, offset, host, size,
                                     CUSAFE_STREAM_DEFAULT);
  case OP_READ_ASYNC:
    return cusafe_buffer_read_async(b, offset, host, size,
                                    CUSAFE_STREAM_DEFAULT);
  }
  return CUSAFE_ERROR_INVALID_VALUE;
}

/* _i is the operation; each on a 64-byte buffer and on a 101-byte view. */
START_TEST(test_access_bounds) {
  const enum access_op op = (enum access_op)_i;
  const char *what = access_names[_i];
  unsigned char host[256];
  cusafe_buffer p = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 1024, 16, NULL);
  cusafe_buffer b = CUSAFE_NULL_HANDLE, v = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, 64));
  TU_OK(cusafe_buffer_view(&v, p, 7, 101));
  memset(host, 0x5c, sizeof host);

  const struct {
    cusafe_buffer buf;
    size_t limit;
  } targets[2] = {{b, 64}, {v, 101}};
  for (int t = 0; t < 2; t++) {
    cusafe_buffer x = targets[t].buf;
    size_t lim = targets[t].limit;
    const struct {
      size_t offset, size;
    } bad[] = {{0, lim + 1},        {lim, 1},          {lim + 1, 0},
               {lim - 1, 2},        {SIZE_MAX - 1, 4}, {4, SIZE_MAX},
               {SIZE_MAX, SIZE_MAX}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
      TU_ERR(access_op(op, x, bad[i].offset, bad[i].size, host),
             CUSAFE_ERROR_OUT_OF_RANGE,
             "%s of %zu bytes at offset %zu exceeds buffer of %zu bytes", what,
             bad[i].size, bad[i].offset, lim);
    /* Exactly up to the end, and empty at the end. */
    TU_OK(access_op(op, x, lim - 4, 4, host));
    TU_OK(access_op(op, x, 0, lim, host));
    TU_OK(access_op(op, x, lim, 0, host));
    TU_OK(access_op(op, x, 0, 0, host));
  }
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_buffer_release(v));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_buffer_release(p));
}
END_TEST

/* A rejected access changes nothing. */
START_TEST(test_rejected_access_changes_nothing) {
  unsigned char data[64], junk[128];
  cusafe_buffer b = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 64, 17, data);
  memset(junk, 0xa5, sizeof junk);
  TU_STATUS(cusafe_buffer_write(b, 0, junk, 65), CUSAFE_ERROR_OUT_OF_RANGE);
  TU_STATUS(cusafe_buffer_write(b, 60, junk, 8), CUSAFE_ERROR_OUT_OF_RANGE);
  TU_STATUS(cusafe_buffer_fill(b, 1, 64, 0xa5, CUSAFE_STREAM_DEFAULT),
            CUSAFE_ERROR_OUT_OF_RANGE);
  CHECK_CONTENT(b, 0, data, 64);
  TU_STATUS(cusafe_buffer_read(b, 1, junk, 64), CUSAFE_ERROR_OUT_OF_RANGE);
  for (size_t i = 0; i < sizeof junk; i++)
    ck_assert_int_eq(junk[i], 0xa5);
  TU_OK(cusafe_buffer_release(b));
}
END_TEST

START_TEST(test_copy_bounds) {
  cusafe_buffer small = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 64, 18, NULL);
  cusafe_buffer big = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 128, 19, NULL);
  cusafe_buffer other = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 64, 20, NULL);
  const cusafe_stream on = CUSAFE_STREAM_DEFAULT;

  /* The destination is too small (the source is large enough). */
  TU_ERR(cusafe_buffer_copy(small, 0, big, 0, 65, on),
         CUSAFE_ERROR_OUT_OF_RANGE,
         "copy of 65 bytes at offset 0 exceeds destination buffer of 64 bytes");
  TU_ERR(cusafe_buffer_copy(small, 64, big, 0, 1, on),
         CUSAFE_ERROR_OUT_OF_RANGE,
         "copy of 1 bytes at offset 64 exceeds destination buffer of 64 bytes");
  TU_ERR(cusafe_buffer_copy(small, 65, big, 0, 0, on),
         CUSAFE_ERROR_OUT_OF_RANGE,
         "copy of 0 bytes at offset 65 exceeds destination buffer of 64 bytes");
  TU_ERR(cusafe_buffer_copy(small, SIZE_MAX - 1, big, 0, 4, on),
         CUSAFE_ERROR_OUT_OF_RANGE,
         "copy of 4 bytes at offset %zu exceeds destination buffer of 64 bytes",
         SIZE_MAX - 1);
  /* The source is too small (the destination is large enough). */
  TU_ERR(cusafe_buffer_copy(big, 0, small, 0, 65, on),
         CUSAFE_ERROR_OUT_OF_RANGE,
         "copy of 65 bytes at offset 0 exceeds source buffer of 64 bytes");
  TU_ERR(cusafe_buffer_copy(big, 0, small, 61, 4, on),
         CUSAFE_ERROR_OUT_OF_RANGE,
         "copy of 4 bytes at offset 61 exceeds source buffer of 64 bytes");
  TU_ERR(cusafe_buffer_copy(big, 0, small, 65, 0, on),
         CUSAFE_ERROR_OUT_OF_RANGE,
         "copy of 0 bytes at offset 65 exceeds source buffer of 64 bytes");
  TU_ERR(cusafe_buffer_copy(big, 0, small, SIZE_MAX - 1, 4, on),
         CUSAFE_ERROR_OUT_OF_RANGE,
         "copy of 4 bytes at offset %zu exceeds source buffer of 64 bytes",
         SIZE_MAX - 1);
  /* Up to the end exactly, and empty at the end. */
  TU_OK(cusafe_buffer_copy(small, 60, other, 60, 4, on));
  TU_OK(cusafe_buffer_copy(small, 0, other, 0, 64, on));
  TU_OK(cusafe_buffer_copy(small, 64, other, 64, 0, on));
  TU_OK(cusafe_buffer_copy(big, 64, small, 0, 64, on));
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_buffer_release(small));
  TU_OK(cusafe_buffer_release(big));
  TU_OK(cusafe_buffer_release(other));
}
END_TEST

START_TEST(test_view_bounds) {
  cusafe_buffer p = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 64, 21, NULL);
  const struct {
    size_t offset, size;
  } bad[] = {{60, 5}, {64, 1},           {0, 65},
             {65, 1}, {SIZE_MAX - 1, 4}, {4, SIZE_MAX}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cusafe_buffer v = CUSAFE_NULL_HANDLE;
    TU_ERR(cusafe_buffer_view(&v, p, bad[i].offset, bad[i].size),
           CUSAFE_ERROR_OUT_OF_RANGE,
           "view of %zu bytes at offset %zu exceeds buffer of 64 bytes",
           bad[i].size, bad[i].offset);
    ck_assert_uint_eq(v, CUSAFE_NULL_HANDLE);
  }
  /* Views of 0 bytes, at any offset up to the end: at the parent's
   * address plus the offset, of 0 bytes; beyond the end, out of range. */
  char *base = NULL;
  TU_OK(cusafe_buffer_interop_pointer((void **)&base, p));
  for (size_t off = 0; off <= 64; off += 32) {
    cusafe_buffer v = CUSAFE_NULL_HANDLE;
    size_t size = 99;
    char *at = NULL;
    TU_OK(cusafe_buffer_view(&v, p, off, 0));
    ck_assert_uint_ne(v, CUSAFE_NULL_HANDLE);
    TU_OK(cusafe_buffer_get_size(&size, v));
    ck_assert_uint_eq(size, 0);
    TU_OK(cusafe_buffer_interop_pointer((void **)&at, v));
    ck_assert_ptr_eq(at, base + off);
    TU_OK(cusafe_buffer_release(v));
  }
  cusafe_buffer v0 = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_buffer_view(&v0, p, 65, 0), CUSAFE_ERROR_OUT_OF_RANGE,
         "view of 0 bytes at offset 65 exceeds buffer of 64 bytes");
  ck_assert_uint_eq(v0, CUSAFE_NULL_HANDLE);
  cusafe_buffer v = CUSAFE_NULL_HANDLE, whole = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_view(&v, p, 60, 4));
  TU_OK(cusafe_buffer_view(&whole, p, 0, 64));
  TU_OK(cusafe_buffer_release(v));
  TU_OK(cusafe_buffer_release(whole));
  TU_OK(cusafe_buffer_release(p));
}
END_TEST

/* Checks a buffer of 0 bytes: its size, kind and NULL address; each
 * operation of 0 bytes at its end succeeds and does nothing, one byte or
 * one offset beyond is out of range; a view of 0 bytes of it works. */
static void check_empty_buffer(cusafe_buffer b, cusafe_memory kind,
                               cusafe_stream s) {
  size_t size = 99;
  cusafe_memory mk = (cusafe_memory)99;
  void *at = (void *)&size;
  unsigned char byte = 0x5a;
  TU_OK(cusafe_buffer_get_size(&size, b));
  ck_assert_uint_eq(size, 0);
  TU_OK(cusafe_buffer_get_memory(&mk, b));
  ck_assert_int_eq(mk, kind);
  TU_OK(cusafe_buffer_interop_pointer(&at, b));
  ck_assert_ptr_null(at);
  cusafe_buffer other = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 16, 1, NULL);
#ifdef CUSAFE_TEST_FAKE
  unsigned long calls = fake_call_count();
#endif
  TU_OK(cusafe_buffer_write(b, 0, NULL, 0));
  TU_OK(cusafe_buffer_read(b, 0, NULL, 0));
  TU_OK(cusafe_buffer_write_async(b, 0, &byte, 0, s));
  TU_OK(cusafe_buffer_read_async(b, 0, &byte, 0, s));
  TU_OK(cusafe_buffer_fill(b, 0, 0, 0xff, s));
  TU_OK(cusafe_buffer_copy(b, 0, other, 16, 0, s));
  TU_OK(cusafe_buffer_copy(other, 16, b, 0, 0, s));
#ifdef CUSAFE_TEST_FAKE
  ck_assert_uint_eq(fake_call_count(), calls); /* no work queued */
#endif
  ck_assert_int_eq(byte, 0x5a);
  TU_ERR(cusafe_buffer_write(b, 1, NULL, 0), CUSAFE_ERROR_OUT_OF_RANGE,
         "write of 0 bytes at offset 1 exceeds buffer of 0 bytes");
  TU_ERR(cusafe_buffer_read(b, 0, &byte, 1), CUSAFE_ERROR_OUT_OF_RANGE,
         "read of 1 bytes at offset 0 exceeds buffer of 0 bytes");
  TU_ERR(cusafe_buffer_fill(b, 0, 1, 0, s), CUSAFE_ERROR_OUT_OF_RANGE,
         "fill of 1 bytes at offset 0 exceeds buffer of 0 bytes");
  TU_ERR(cusafe_buffer_copy(other, 0, b, 0, 1, s), CUSAFE_ERROR_OUT_OF_RANGE,
         "copy of 1 bytes at offset 0 exceeds source buffer of 0 bytes");
  cusafe_buffer v = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_view(&v, b, 0, 0));
  TU_OK(cusafe_buffer_get_size(&size, v));
  ck_assert_uint_eq(size, 0);
  TU_OK(cusafe_buffer_release(v));
  TU_ERR(cusafe_buffer_view(&v, b, 1, 0), CUSAFE_ERROR_OUT_OF_RANGE,
         "view of 0 bytes at offset 1 exceeds buffer of 0 bytes");
  ck_assert_uint_eq(v, CUSAFE_NULL_HANDLE);
  TU_OK(cusafe_buffer_release(other));
}

START_TEST(test_alloc_zero_bytes) {
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, 0, 0));
  for (int k = 0; k < NKINDS; k++) {
    cusafe_buffer b = CUSAFE_NULL_HANDLE;
#ifdef CUSAFE_TEST_FAKE
    unsigned long calls = fake_call_count();
    size_t live = fake_live_allocations(0);
#endif
    TU_OK(cusafe_buffer_alloc(&b, ctx, all_kinds[k], 0));
    ck_assert_uint_ne(b, CUSAFE_NULL_HANDLE);
#ifdef CUSAFE_TEST_FAKE
    /* No memory behind it: no CUDA call at all. */
    ck_assert_uint_eq(fake_call_count(), calls);
    ck_assert_uint_eq(fake_live_allocations(0), live);
#endif
    check_empty_buffer(b, all_kinds[k], s);
    TU_OK(cusafe_buffer_release(b));
#ifdef CUSAFE_TEST_FAKE
    ck_assert_uint_eq(fake_live_allocations(0), live);
#endif
  }
  /* On a stream, which it keeps alive like any buffer allocated there. */
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_alloc_async(&b, s, 0));
  check_empty_buffer(b, CUSAFE_MEMORY_DEVICE, s);
#ifdef CUSAFE_TEST_FAKE
  size_t streams = fake_live_streams(0);
#endif
  TU_OK(cusafe_stream_release(s));
#ifdef CUSAFE_TEST_FAKE
  ck_assert_uint_eq(fake_live_streams(0), streams);
#endif
  TU_OK(cusafe_buffer_release(b));
#ifdef CUSAFE_TEST_FAKE
  ck_assert_uint_eq(fake_live_streams(0), streams - 1);
#endif
}
END_TEST

/* The owner of memory that cusafe wraps: here another cusafe buffer, which
 * the release function lets go of. */
struct owner {
  int calls;
  cusafe_buffer mem;
};

static void give_back_memory(void *user) {
  struct owner *o = user;
  o->calls++;
  if (cusafe_buffer_release(o->mem) != CUSAFE_SUCCESS)
    o->calls += 100; /* seen by the test as a failure */
}

/* Memory of another owner, of each kind, wrapped whole and in part: it
 * works as a buffer, and its owner gets it back once, when the last
 * reference (a view's) is gone. */
START_TEST(test_buffer_wrap) {
  const cusafe_memory kind = all_kinds[_i];
  unsigned char data[256], got[256];
  struct owner o = {0, make_buffer(ctx, kind, 256, 40, data)};
  char *ptr = NULL;
  TU_OK(cusafe_buffer_interop_pointer((void **)&ptr, o.mem));
  cusafe_buffer w = CUSAFE_NULL_HANDLE, v = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_wrap(&w, ctx, kind, ptr, 256, give_back_memory, &o));
  size_t size = 0;
  cusafe_memory mk = (cusafe_memory)-1;
  void *at = NULL;
  TU_OK(cusafe_buffer_get_size(&size, w));
  ck_assert_uint_eq(size, 256);
  TU_OK(cusafe_buffer_get_memory(&mk, w));
  ck_assert_int_eq(mk, kind);
  TU_OK(cusafe_buffer_interop_pointer(&at, w));
  ck_assert_ptr_eq(at, ptr);
  TU_OK(cusafe_buffer_read(w, 0, got, sizeof got));
  ck_assert_mem_eq(got, data, sizeof got);
  /* Written through a view of the wrapper, read through the owner's. */
  TU_OK(cusafe_buffer_view(&v, w, 64, 128));
  TU_OK(cusafe_buffer_fill(v, 0, 128, 0x3c, CUSAFE_STREAM_DEFAULT));
  TU_OK(cusafe_buffer_read(o.mem, 0, got, sizeof got));
  for (size_t i = 0; i < sizeof got; i++)
    ck_assert_int_eq(got[i], i >= 64 && i < 192 ? 0x3c : data[i]);
  TU_OK(cusafe_buffer_release(w));
  ck_assert_int_eq(o.calls, 0); /* the view holds it */
  TU_OK(cusafe_buffer_release(v));
  ck_assert_int_eq(o.calls, 1);
}
END_TEST

#ifdef CUSAFE_TEST_FAKE
/* The look-up of cuMemGetAddressRange fails once, at the first call (the
 * library's initialisation): the extent is checked all the same, the
 * look-up made again at the first wrap.  (Each test runs in a child of its
 * own: the library starts uninitialised.) */
START_TEST(test_buffer_wrap_range_lookup_fails_once) {
  unsigned long calls = fake_call_count();
  /* cudaGetDeviceCount, then the look-ups: cuDevicePrimaryCtxRetain,
   * cuDevicePrimaryCtxRelease, cuLibraryGetModule, cuMemGetAddressRange. */
  fake_fail_after(5, cudaErrorUnknown, 0);
  cusafe_context c = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&c, 0));
  TU_ASSERT(
      strcmp(tu_call_name(calls + 5), "cudaGetDriverEntryPointByVersion") == 0,
      "call %lu is %s", calls + 5, tu_call_name(calls + 5));
  cusafe_buffer b = CUSAFE_NULL_HANDLE, w = 42;
  TU_OK(cusafe_buffer_alloc(&b, c, CUSAFE_MEMORY_DEVICE, 256));
  char *ptr = NULL;
  TU_OK(cusafe_buffer_interop_pointer((void **)&ptr, b));
  TU_ERR(cusafe_buffer_wrap(&w, c, CUSAFE_MEMORY_DEVICE, ptr, 257, NULL, NULL),
         CUSAFE_ERROR_OUT_OF_RANGE,
         "wrap of 257 bytes at offset 0 exceeds the allocation of 256 bytes "
         "at %p",
         (void *)ptr);
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_context_release(c));
}
END_TEST
#endif

/* What CUDA says of the memory is checked: its kind, its device, its
 * extent; every refusal leaves the memory to its owner. */
START_TEST(test_buffer_wrap_checks) {
  unsigned char *host = tu_xmalloc(64);
  struct owner o = {0, make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 256, 41, NULL)};
  char *ptr = NULL;
  TU_OK(cusafe_buffer_interop_pointer((void **)&ptr, o.mem));
  cusafe_buffer w = 42;
  TU_ERR(cusafe_buffer_wrap(&w, ctx, CUSAFE_MEMORY_HOST_PINNED, ptr, 256,
                            give_back_memory, &o),
         CUSAFE_ERROR_INVALID_VALUE,
         "memory at %p is device memory, not pinned host memory", ptr);
  ck_assert_uint_eq(w, CUSAFE_NULL_HANDLE);
  TU_ERR(cusafe_buffer_wrap(&w, ctx, CUSAFE_MEMORY_MANAGED, ptr, 256,
                            give_back_memory, &o),
         CUSAFE_ERROR_INVALID_VALUE,
         "memory at %p is device memory, not managed memory", ptr);
  TU_ERR(cusafe_buffer_wrap(&w, ctx, CUSAFE_MEMORY_DEVICE, host, 64,
                            give_back_memory, &o),
         CUSAFE_ERROR_INVALID_VALUE,
         "memory at %p is host memory unknown to CUDA, not device memory",
         (void *)host);
  TU_ERR(cusafe_buffer_wrap(&w, ctx, (cusafe_memory)7, ptr, 256,
                            give_back_memory, &o),
         CUSAFE_ERROR_INVALID_VALUE, "unknown memory kind 7");
  TU_ERR(cusafe_buffer_wrap(&w, ctx, CUSAFE_MEMORY_DEVICE, NULL, 1,
                            give_back_memory, &o),
         CUSAFE_ERROR_INVALID_VALUE, "ptr is NULL");
  TU_ERR(cusafe_buffer_wrap(NULL, ctx, CUSAFE_MEMORY_DEVICE, ptr, 256,
                            give_back_memory, &o),
         CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  TU_ERR(cusafe_buffer_wrap(&w, CUSAFE_NULL_HANDLE, CUSAFE_MEMORY_DEVICE, ptr,
                            256, give_back_memory, &o),
         CUSAFE_ERROR_INVALID_HANDLE, "context is the NULL handle");
  /* CUDA reports the extent of the allocation (cuMemGetAddressRange). */
  TU_ERR(cusafe_buffer_wrap(&w, ctx, CUSAFE_MEMORY_DEVICE, ptr + 64, 193,
                            give_back_memory, &o),
         CUSAFE_ERROR_OUT_OF_RANGE,
         "wrap of 193 bytes at offset 64 exceeds the allocation of 256 "
         "bytes at %p",
         (void *)ptr);
#ifdef CUSAFE_TEST_FAKE
  /* A query that fails -- with cudaErrorNotSupported too -- fails the
   * wrap: it is no driver without the call, which skips the check. */
  fake_fail_function("cuMemGetAddressRange", cudaErrorNotSupported);
  TU_ERR(cusafe_buffer_wrap(&w, ctx, CUSAFE_MEMORY_DEVICE, ptr + 64, 193,
                            give_back_memory, &o),
         CUSAFE_ERROR_NOT_SUPPORTED,
         "cuMemGetAddressRange failed: operation not supported");
  fake_fail_clear();
#endif
  if (have_two_devices("test_buffer_wrap_checks")) {
    cusafe_context c1 = CUSAFE_NULL_HANDLE;
    TU_OK(cusafe_context_create(&c1, 1));
    TU_ERR(cusafe_buffer_wrap(&w, c1, CUSAFE_MEMORY_DEVICE, ptr, 256,
                              give_back_memory, &o),
           CUSAFE_ERROR_CONTEXT_MISMATCH,
           "memory at %p belongs to device 0 but context belongs to device 1",
           ptr);
    TU_OK(cusafe_context_release(c1));
  }
  ck_assert_int_eq(o.calls, 0);
  /* A part of it, and 0 bytes at no address: legal. */
  TU_OK(cusafe_buffer_wrap(&w, ctx, CUSAFE_MEMORY_DEVICE, ptr + 64, 192, NULL,
                           NULL));
  TU_OK(cusafe_buffer_release(w));
  TU_OK(cusafe_buffer_wrap(&w, ctx, CUSAFE_MEMORY_DEVICE, NULL, 0,
                           give_back_memory, &o));
  TU_OK(cusafe_buffer_release(w));
  ck_assert_int_eq(o.calls, 1);
  free(host);
}
END_TEST

START_TEST(test_alloc_too_large) {
  cusafe_device_properties p;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_device_get_properties(&p, 0));
  const size_t big[] = {SIZE_MAX, p.total_memory + 1, SIZE_MAX / 2 + 1};
  TU_OK(cusafe_stream_create(&s, ctx, 0, 0));
  for (size_t i = 0; i < 3; i++) {
    TU_ERR(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, big[i]),
           CUSAFE_ERROR_OUT_OF_MEMORY,
           "allocation of %zu bytes exceeds the %zu bytes of device 0", big[i],
           p.total_memory);
    ck_assert_uint_eq(b, CUSAFE_NULL_HANDLE);
    TU_ERR(cusafe_buffer_alloc_async(&b, s, big[i]), CUSAFE_ERROR_OUT_OF_MEMORY,
           "allocation of %zu bytes exceeds the %zu bytes of device 0", big[i],
           p.total_memory);
    ck_assert_uint_eq(b, CUSAFE_NULL_HANDLE);
  }
  /* Host and managed memory may fail in CUDA or before it; the status is
   * promised either way. */
  TU_STATUS(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_HOST_PINNED, SIZE_MAX),
            CUSAFE_ERROR_OUT_OF_MEMORY);
  ck_assert_uint_eq(b, CUSAFE_NULL_HANDLE);
  if (p.managed_memory) {
    TU_STATUS(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_MANAGED, SIZE_MAX),
              CUSAFE_ERROR_OUT_OF_MEMORY);
    ck_assert_uint_eq(b, CUSAFE_NULL_HANDLE);
  }
  /* The context still works after the refusals. */
  b = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 64, 22, NULL);
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

START_TEST(test_null_host_pointers) {
  cusafe_buffer b = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 64, 23, NULL);
  TU_ERR(cusafe_buffer_write(b, 0, NULL, 4), CUSAFE_ERROR_INVALID_VALUE,
         "src is NULL");
  TU_ERR(cusafe_buffer_read(b, 0, NULL, 4), CUSAFE_ERROR_INVALID_VALUE,
         "dst is NULL");
  TU_ERR(cusafe_buffer_write_async(b, 0, NULL, 4, CUSAFE_STREAM_DEFAULT),
         CUSAFE_ERROR_INVALID_VALUE, "src is NULL");
  TU_ERR(cusafe_buffer_read_async(b, 0, NULL, 4, CUSAFE_STREAM_DEFAULT),
         CUSAFE_ERROR_INVALID_VALUE, "dst is NULL");
  /* Nothing to copy: no pointer needed. */
  TU_OK(cusafe_buffer_write(b, 0, NULL, 0));
  TU_OK(cusafe_buffer_read(b, 64, NULL, 0));
  TU_OK(cusafe_buffer_write_async(b, 3, NULL, 0, CUSAFE_STREAM_DEFAULT));
  TU_OK(cusafe_buffer_read_async(b, 3, NULL, 0, CUSAFE_STREAM_DEFAULT));
  TU_OK(cusafe_buffer_release(b));
}
END_TEST

START_TEST(test_overlapping_copy_rejected) {
  unsigned char data[256];
  cusafe_buffer b = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 256, 24, data);
  cusafe_buffer v1 = CUSAFE_NULL_HANDLE, v2 = CUSAFE_NULL_HANDLE;
  const struct {
    size_t dst, src, size;
  } bad[] = {{10, 0, 20}, {0, 10, 20}, {0, 0, 1}, {100, 100, 156}, {0, 19, 20}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    TU_ERR(cusafe_buffer_copy(b, bad[i].dst, b, bad[i].src, bad[i].size,
                              CUSAFE_STREAM_DEFAULT),
           CUSAFE_ERROR_INVALID_VALUE, "source and destination ranges overlap");
  /* Two views of one allocation overlap in the parent, not in themselves. */
  TU_OK(cusafe_buffer_view(&v1, b, 0, 64));
  TU_OK(cusafe_buffer_view(&v2, b, 32, 64));
  TU_ERR(cusafe_buffer_copy(v2, 0, v1, 0, 64, CUSAFE_STREAM_DEFAULT),
         CUSAFE_ERROR_INVALID_VALUE, "source and destination ranges overlap");
  TU_ERR(cusafe_buffer_copy(b, 4, v1, 0, 8, CUSAFE_STREAM_DEFAULT),
         CUSAFE_ERROR_INVALID_VALUE, "source and destination ranges overlap");
  CHECK_CONTENT(b, 0, data, 256);
  TU_OK(cusafe_buffer_release(v1));
  TU_OK(cusafe_buffer_release(v2));
  TU_OK(cusafe_buffer_release(b));
}
END_TEST

START_TEST(test_copy_within_one_buffer) {
  unsigned char data[256];
  cusafe_buffer b = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 256, 25, data);
  cusafe_buffer v1 = CUSAFE_NULL_HANDLE, v2 = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_copy(b, 128, b, 0, 128, CUSAFE_STREAM_DEFAULT));
  memcpy(data + 128, data, 128);
  CHECK_CONTENT(b, 0, data, 256);
  /* Adjacent ranges touch but do not overlap. */
  TU_OK(cusafe_buffer_copy(b, 0, b, 56, 56, CUSAFE_STREAM_DEFAULT));
  memmove(data, data + 56, 56);
  CHECK_CONTENT(b, 0, data, 256);
  TU_OK(cusafe_buffer_view(&v1, b, 0, 64));
  TU_OK(cusafe_buffer_view(&v2, b, 64, 64));
  TU_OK(cusafe_buffer_copy(v2, 0, v1, 0, 64, CUSAFE_STREAM_DEFAULT));
  memcpy(data + 64, data, 64);
  CHECK_CONTENT(b, 0, data, 256);
  TU_OK(cusafe_buffer_release(v1));
  TU_OK(cusafe_buffer_release(v2));
  TU_OK(cusafe_buffer_release(b));
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 8. Bad handles on every function that takes one                           */
/* ------------------------------------------------------------------------ */

/* Live objects that the calls use for their other arguments, and stale
 * handles of every type.  The kernel is the built-in cusafe_fill_f32(float
 * *x, float value, size_t n), which the launches run on buf. */
#define BAD_TYPE_LAST CUSAFE_TYPE_KERNEL
static struct {
  cusafe_context ctx;
  cusafe_stream stream;
  cusafe_event start, end;
  cusafe_buffer buf, buf2;
  cusafe_module module;
  cusafe_kernel kernel;
  cusafe_handle stale[BAD_TYPE_LAST + 1]; /* by cusafe_handle_type */
  cusafe_handle created; /* by the last call that creates an object */
  unsigned char host[64];
} L;

static void bad_handles_setup(void) {
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_event e = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_kernel k = CUSAFE_NULL_HANDLE;
  memset(&L, 0, sizeof L);
  /* A context with no children dies with its last reference. */
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_context_release(c));
  L.stale[CUSAFE_TYPE_CONTEXT] = c;
  TU_OK(cusafe_context_create(&L.ctx, 0));
  /* Released, then likely reused by the objects made after them. */
  TU_OK(cusafe_stream_create(&s, L.ctx, 0, 0));
  TU_OK(cusafe_stream_release(s));
  L.stale[CUSAFE_TYPE_STREAM] = s;
  TU_OK(cusafe_event_create(&e, L.ctx, 0));
  TU_OK(cusafe_event_release(e));
  L.stale[CUSAFE_TYPE_EVENT] = e;
  TU_OK(cusafe_buffer_alloc(&b, L.ctx, CUSAFE_MEMORY_DEVICE, 64));
  TU_OK(cusafe_buffer_release(b));
  L.stale[CUSAFE_TYPE_BUFFER] = b;
  TU_OK(cusafe_module_load_builtin(&m, L.ctx));
  TU_OK(cusafe_module_release(m));
  L.stale[CUSAFE_TYPE_MODULE] = m;
  TU_OK(cusafe_module_load_builtin(&L.module, L.ctx));
  TU_OK(cusafe_module_get_kernel(&k, L.module, "cusafe_fill_f32"));
  TU_OK(cusafe_kernel_release(k));
  L.stale[CUSAFE_TYPE_KERNEL] = k;
  TU_OK(cusafe_module_get_kernel(&L.kernel, L.module, "cusafe_fill_f32"));
  TU_OK(cusafe_stream_create(&L.stream, L.ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_event_create(&L.start, L.ctx, 0));
  TU_OK(cusafe_event_create(&L.end, L.ctx, 0));
  TU_OK(cusafe_buffer_alloc(&L.buf, L.ctx, CUSAFE_MEMORY_DEVICE, 64));
  TU_OK(cusafe_buffer_alloc(&L.buf2, L.ctx, CUSAFE_MEMORY_DEVICE, 64));
  TU_OK(cusafe_event_record(L.start, L.stream));
  TU_OK(cusafe_event_record(L.end, L.stream));
  TU_OK(cusafe_stream_synchronize(L.stream));
  /* A stale handle that is still live means an earlier test (or the
   * library) leaked a reference: say so here rather than in every call. */
  for (int t = CUSAFE_TYPE_CONTEXT; t <= BAD_TYPE_LAST; t++)
    TU_STALE(L.stale[t]);
}

/* No assertions (see ctx_teardown). */
static void bad_handles_teardown(void) {
  (void)cusafe_kernel_release(L.kernel);
  (void)cusafe_module_release(L.module);
  (void)cusafe_buffer_release(L.buf);
  (void)cusafe_buffer_release(L.buf2);
  (void)cusafe_event_release(L.start);
  (void)cusafe_event_release(L.end);
  (void)cusafe_stream_release(L.stream);
  (void)cusafe_context_release(L.ctx);
  memset(&L, 0, sizeof L);
}

/* The calls of the functions that take more than the handle; those that
 * create an object store its handle in L.created. */
static cusafe_status c_get_type(cusafe_handle h) {
  cusafe_handle_type t = CUSAFE_TYPE_BUFFER;
  cusafe_status st = cusafe_handle_get_type(&t, h);
  if (st != CUSAFE_SUCCESS)
    TU_ASSERT(t == CUSAFE_TYPE_INVALID, "type of a bad handle is %d", (int)t);
  return st;
}
static cusafe_status c_context_get_device(cusafe_handle h) {
  int d;
  return cusafe_context_get_device(&d, h);
}
static cusafe_status c_context_priority_range(cusafe_handle h) {
  int l, g;
  return cusafe_context_stream_priority_range(&l, &g, h);
}
static cusafe_status c_stream_create(cusafe_handle h) {
  return cusafe_stream_create(&L.created, h, 0, 0);
}
static cusafe_status c_event_create(cusafe_handle h) {
  return cusafe_event_create(&L.created, h, 0);
}
static cusafe_status c_buffer_alloc(cusafe_handle h) {
  return cusafe_buffer_alloc(&L.created, h, CUSAFE_MEMORY_DEVICE, 64);
}
static cusafe_status c_stream_wait_event_stream(cusafe_handle h) {
  return cusafe_stream_wait_event(h, L.start);
}
static cusafe_status c_stream_wait_event_event(cusafe_handle h) {
  return cusafe_stream_wait_event(L.stream, h);
}
static cusafe_status c_stream_get_context(cusafe_handle h) {
  cusafe_context c;
  return cusafe_stream_get_context(&c, h);
}
static cusafe_status c_stream_interop(cusafe_handle h) {
  void *p;
  return cusafe_stream_interop_handle(&p, h);
}
static cusafe_status c_event_record_event(cusafe_handle h) {
  return cusafe_event_record(h, L.stream);
}
static cusafe_status c_event_record_stream(cusafe_handle h) {
  return cusafe_event_record(L.end, h);
}
static cusafe_status c_elapsed_start(cusafe_handle h) {
  float ms;
  return cusafe_event_elapsed_ms(&ms, h, L.end);
}
static cusafe_status c_elapsed_end(cusafe_handle h) {
  float ms;
  return cusafe_event_elapsed_ms(&ms, L.start, h);
}
static cusafe_status c_alloc_async(cusafe_handle h) {
  return cusafe_buffer_alloc_async(&L.created, h, 64);
}
static cusafe_status c_view(cusafe_handle h) {
  return cusafe_buffer_view(&L.created, h, 0, 16);
}
static cusafe_status c_get_size(cusafe_handle h) {
  size_t n;
  return cusafe_buffer_get_size(&n, h);
}
static cusafe_status c_get_memory(cusafe_handle h) {
  cusafe_memory m;
  return cusafe_buffer_get_memory(&m, h);
}
static cusafe_status c_get_context(cusafe_handle h) {
  cusafe_context c;
  return cusafe_buffer_get_context(&c, h);
}
static cusafe_status c_write(cusafe_handle h) {
  return cusafe_buffer_write(h, 0, L.host, 16);
}
static cusafe_status c_read(cusafe_handle h) {
  return cusafe_buffer_read(h, 0, L.host, 16);
}
static cusafe_status c_write_async_buffer(cusafe_handle h) {
  return cusafe_buffer_write_async(h, 0, L.host, 16, L.stream);
}
static cusafe_status c_write_async_stream(cusafe_handle h) {
  return cusafe_buffer_write_async(L.buf, 0, L.host, 16, h);
}
static cusafe_status c_read_async_buffer(cusafe_handle h) {
  return cusafe_buffer_read_async(h, 0, L.host, 16, L.stream);
}
static cusafe_status c_read_async_stream(cusafe_handle h) {
  return cusafe_buffer_read_async(L.buf, 0, L.host, 16, h);
}
static cusafe_status c_copy_dst(cusafe_handle h) {
  return cusafe_buffer_copy(h, 0, L.buf2, 0, 16, L.stream);
}
static cusafe_status c_copy_src(cusafe_handle h) {
  return cusafe_buffer_copy(L.buf, 0, h, 0, 16, L.stream);
}
static cusafe_status c_copy_stream(cusafe_handle h) {
  return cusafe_buffer_copy(L.buf, 0, L.buf2, 0, 16, h);
}
static cusafe_status c_fill_buffer(cusafe_handle h) {
  return cusafe_buffer_fill(h, 0, 16, 7, L.stream);
}
static cusafe_status c_fill_stream(cusafe_handle h) {
  return cusafe_buffer_fill(L.buf, 0, 16, 7, h);
}
static cusafe_status c_buffer_interop(cusafe_handle h) {
  void *p;
  return cusafe_buffer_interop_pointer(&p, h);
}
static cusafe_status c_set_label(cusafe_handle h) {
  return cusafe_handle_set_label(h, "bad handle test");
}
static cusafe_status c_load_builtin(cusafe_handle h) {
  return cusafe_module_load_builtin(&L.created, h);
}
static cusafe_status c_load_file(cusafe_handle h) {
  return cusafe_module_load_file(&L.created, h, "/nonexistent.cubin");
}
static cusafe_status c_load_data(cusafe_handle h) {
  static const char image[] = "not an image";
  return cusafe_module_load_data(&L.created, h, image, sizeof image);
}
static cusafe_status c_compile(cusafe_handle h) {
  return cusafe_module_compile(&L.created, h,
                               "extern \"C\" __global__ void k(int *x) {}\n",
                               "k.cu", NULL, 0);
}
static cusafe_status c_get_kernel(cusafe_handle h) {
  return cusafe_module_get_kernel(&L.created, h, "cusafe_fill_f32");
}
static cusafe_status c_kernel_get_params(cusafe_handle h) {
  size_t count, sizes[4];
  return cusafe_kernel_get_params(&count, sizes, 4, h);
}
/* cusafe_fill_f32 on the 16 floats of buf, on `stream`. */
static cusafe_status fill_launch(cusafe_kernel k, cusafe_stream stream,
                                 cusafe_buffer x) {
  cusafe_launch_config c = {{1, 1, 1}, {32, 1, 1}, 0, stream};
  return CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(x), CUSAFE_ARG_F32V(1.0f),
                       CUSAFE_ARG_U64V(16));
}
static cusafe_status c_launch_kernel(cusafe_handle h) {
  return fill_launch(h, L.stream, L.buf);
}
static cusafe_status c_launch_stream(cusafe_handle h) {
  return fill_launch(L.kernel, h, L.buf);
}
static cusafe_status c_launch_argument(cusafe_handle h) {
  return fill_launch(L.kernel, L.stream, h);
}
static cusafe_status c_suggest_config(cusafe_handle h) {
  uint32_t block = 0, grid = 0;
  return cusafe_kernel_suggest_config(&block, &grid, h, 0, 1000);
}

/* What the NULL handle means for a parameter. */
enum null_rule {
  NULL_IS_ERROR,   /* INVALID_HANDLE, "<name> is the NULL handle" */
  NULL_IS_NOOP,    /* a release: SUCCESS, nothing done */
  NULL_IS_DEFAULT, /* a stream argument: the default stream, SUCCESS */
};

static const struct handle_param {
  const char *function;
  const char *name;
  cusafe_handle_type type; /* CUSAFE_TYPE_INVALID: any type */
  enum null_rule on_null;
  cusafe_status (*call)(cusafe_handle h);
} handle_params[] = {
    {"cusafe_retain", "handle", CUSAFE_TYPE_INVALID, NULL_IS_ERROR,
     cusafe_retain},
    {"cusafe_release", "handle", CUSAFE_TYPE_INVALID, NULL_IS_NOOP,
     cusafe_release},
    {"cusafe_handle_get_type", "handle", CUSAFE_TYPE_INVALID, NULL_IS_ERROR,
     c_get_type},
    {"cusafe_context_retain", "context", CUSAFE_TYPE_CONTEXT, NULL_IS_ERROR,
     cusafe_context_retain},
    {"cusafe_context_release", "context", CUSAFE_TYPE_CONTEXT, NULL_IS_NOOP,
     cusafe_context_release},
    {"cusafe_context_get_device", "context", CUSAFE_TYPE_CONTEXT, NULL_IS_ERROR,
     c_context_get_device},
    {"cusafe_context_synchronize", "context", CUSAFE_TYPE_CONTEXT,
     NULL_IS_ERROR, cusafe_context_synchronize},
    {"cusafe_context_stream_priority_range", "context", CUSAFE_TYPE_CONTEXT,
     NULL_IS_ERROR, c_context_priority_range},
    {"cusafe_stream_create", "context", CUSAFE_TYPE_CONTEXT, NULL_IS_ERROR,
     c_stream_create},
    {"cusafe_event_create", "context", CUSAFE_TYPE_CONTEXT, NULL_IS_ERROR,
     c_event_create},
    {"cusafe_buffer_alloc", "context", CUSAFE_TYPE_CONTEXT, NULL_IS_ERROR,
     c_buffer_alloc},
    {"cusafe_stream_retain", "stream", CUSAFE_TYPE_STREAM, NULL_IS_ERROR,
     cusafe_stream_retain},
    {"cusafe_stream_release", "stream", CUSAFE_TYPE_STREAM, NULL_IS_NOOP,
     cusafe_stream_release},
    {"cusafe_stream_synchronize", "stream", CUSAFE_TYPE_STREAM, NULL_IS_ERROR,
     cusafe_stream_synchronize},
    {"cusafe_stream_query", "stream", CUSAFE_TYPE_STREAM, NULL_IS_ERROR,
     cusafe_stream_query},
    {"cusafe_stream_wait_event(stream)", "stream", CUSAFE_TYPE_STREAM,
     NULL_IS_ERROR, c_stream_wait_event_stream},
    {"cusafe_stream_wait_event(event)", "event", CUSAFE_TYPE_EVENT,
     NULL_IS_ERROR, c_stream_wait_event_event},
    {"cusafe_stream_get_context", "stream", CUSAFE_TYPE_STREAM, NULL_IS_ERROR,
     c_stream_get_context},
    {"cusafe_stream_interop_handle", "stream", CUSAFE_TYPE_STREAM,
     NULL_IS_ERROR, c_stream_interop},
    {"cusafe_event_retain", "event", CUSAFE_TYPE_EVENT, NULL_IS_ERROR,
     cusafe_event_retain},
    {"cusafe_event_release", "event", CUSAFE_TYPE_EVENT, NULL_IS_NOOP,
     cusafe_event_release},
    {"cusafe_event_record(event)", "event", CUSAFE_TYPE_EVENT, NULL_IS_ERROR,
     c_event_record_event},
    {"cusafe_event_record(stream)", "stream", CUSAFE_TYPE_STREAM,
     NULL_IS_DEFAULT, c_event_record_stream},
    {"cusafe_event_synchronize", "event", CUSAFE_TYPE_EVENT, NULL_IS_ERROR,
     cusafe_event_synchronize},
    {"cusafe_event_query", "event", CUSAFE_TYPE_EVENT, NULL_IS_ERROR,
     cusafe_event_query},
    {"cusafe_event_elapsed_ms(start)", "start", CUSAFE_TYPE_EVENT,
     NULL_IS_ERROR, c_elapsed_start},
    {"cusafe_event_elapsed_ms(end)", "end", CUSAFE_TYPE_EVENT, NULL_IS_ERROR,
     c_elapsed_end},
    /* No buffer to take a default stream from: NULL is an error. */
    {"cusafe_buffer_alloc_async", "stream", CUSAFE_TYPE_STREAM, NULL_IS_ERROR,
     c_alloc_async},
    {"cusafe_buffer_view", "parent", CUSAFE_TYPE_BUFFER, NULL_IS_ERROR, c_view},
    {"cusafe_buffer_retain", "buffer", CUSAFE_TYPE_BUFFER, NULL_IS_ERROR,
     cusafe_buffer_retain},
    {"cusafe_buffer_release", "buffer", CUSAFE_TYPE_BUFFER, NULL_IS_NOOP,
     cusafe_buffer_release},
    {"cusafe_buffer_get_size", "buffer", CUSAFE_TYPE_BUFFER, NULL_IS_ERROR,
     c_get_size},
    {"cusafe_buffer_get_memory", "buffer", CUSAFE_TYPE_BUFFER, NULL_IS_ERROR,
     c_get_memory},
    {"cusafe_buffer_get_context", "buffer", CUSAFE_TYPE_BUFFER, NULL_IS_ERROR,
     c_get_context},
    {"cusafe_buffer_write", "buffer", CUSAFE_TYPE_BUFFER, NULL_IS_ERROR,
     c_write},
    {"cusafe_buffer_read", "buffer", CUSAFE_TYPE_BUFFER, NULL_IS_ERROR, c_read},
    {"cusafe_buffer_write_async(buffer)", "buffer", CUSAFE_TYPE_BUFFER,
     NULL_IS_ERROR, c_write_async_buffer},
    {"cusafe_buffer_write_async(stream)", "stream", CUSAFE_TYPE_STREAM,
     NULL_IS_DEFAULT, c_write_async_stream},
    {"cusafe_buffer_read_async(buffer)", "buffer", CUSAFE_TYPE_BUFFER,
     NULL_IS_ERROR, c_read_async_buffer},
    {"cusafe_buffer_read_async(stream)", "stream", CUSAFE_TYPE_STREAM,
     NULL_IS_DEFAULT, c_read_async_stream},
    {"cusafe_buffer_copy(dst)", "dst", CUSAFE_TYPE_BUFFER, NULL_IS_ERROR,
     c_copy_dst},
    {"cusafe_buffer_copy(src)", "src", CUSAFE_TYPE_BUFFER, NULL_IS_ERROR,
     c_copy_src},
    {"cusafe_buffer_copy(stream)", "stream", CUSAFE_TYPE_STREAM,
     NULL_IS_DEFAULT, c_copy_stream},
    {"cusafe_buffer_fill(buffer)", "buffer", CUSAFE_TYPE_BUFFER, NULL_IS_ERROR,
     c_fill_buffer},
    {"cusafe_buffer_fill(stream)", "stream", CUSAFE_TYPE_STREAM,
     NULL_IS_DEFAULT, c_fill_stream},
    {"cusafe_buffer_interop_pointer", "buffer", CUSAFE_TYPE_BUFFER,
     NULL_IS_ERROR, c_buffer_interop},
    {"cusafe_handle_set_label", "handle", CUSAFE_TYPE_INVALID, NULL_IS_ERROR,
     c_set_label},
    {"cusafe_module_load_builtin", "context", CUSAFE_TYPE_CONTEXT,
     NULL_IS_ERROR, c_load_builtin},
    {"cusafe_module_load_file", "context", CUSAFE_TYPE_CONTEXT, NULL_IS_ERROR,
     c_load_file},
    {"cusafe_module_load_data", "context", CUSAFE_TYPE_CONTEXT, NULL_IS_ERROR,
     c_load_data},
    {"cusafe_module_compile", "context", CUSAFE_TYPE_CONTEXT, NULL_IS_ERROR,
     c_compile},
    {"cusafe_module_get_kernel", "module", CUSAFE_TYPE_MODULE, NULL_IS_ERROR,
     c_get_kernel},
    {"cusafe_module_retain", "module", CUSAFE_TYPE_MODULE, NULL_IS_ERROR,
     cusafe_module_retain},
    {"cusafe_module_release", "module", CUSAFE_TYPE_MODULE, NULL_IS_NOOP,
     cusafe_module_release},
    {"cusafe_kernel_retain", "kernel", CUSAFE_TYPE_KERNEL, NULL_IS_ERROR,
     cusafe_kernel_retain},
    {"cusafe_kernel_release", "kernel", CUSAFE_TYPE_KERNEL, NULL_IS_NOOP,
     cusafe_kernel_release},
    {"cusafe_kernel_get_params", "kernel", CUSAFE_TYPE_KERNEL, NULL_IS_ERROR,
     c_kernel_get_params},
    {"cusafe_kernel_launch(kernel)", "kernel", CUSAFE_TYPE_KERNEL,
     NULL_IS_ERROR, c_launch_kernel},
    {"cusafe_kernel_launch(config->stream)", "stream", CUSAFE_TYPE_STREAM,
     NULL_IS_DEFAULT, c_launch_stream},
    /* Buffer arguments are named by their index. */
    {"cusafe_kernel_launch(args[0])", "argument 0", CUSAFE_TYPE_BUFFER,
     NULL_IS_ERROR, c_launch_argument},
    {"cusafe_kernel_suggest_config", "kernel", CUSAFE_TYPE_KERNEL,
     NULL_IS_ERROR, c_suggest_config},
};
#define NHANDLE_PARAMS (sizeof handle_params / sizeof handle_params[0])

static const char *const type_names[] = {
    "an invalid handle", "a context", "a stream", "an event",
    "a buffer",          "a module",  "a kernel"};

static const cusafe_handle forged_handles[] = {
    0x7f00000012345678ULL, 0xdeadbeefcafef00dULL, 0xffffffffffffffffULL};

/* Calls p's function with h.  A create that failed must not hand out a
 * handle; one that succeeded (a default stream accepted) is released
 * again. */
static cusafe_status call_param(const struct handle_param *p, cusafe_handle h) {
  L.created = CUSAFE_NULL_HANDLE;
  cusafe_status st = p->call(h);
  if (st != CUSAFE_SUCCESS)
    TU_ASSERT(L.created == CUSAFE_NULL_HANDLE,
              "failed call returned handle 0x%016llx", TU_HX(L.created));
  else if (L.created != CUSAFE_NULL_HANDLE)
    (void)cusafe_release(L.created);
  return st;
}

/* Runs one call with a bad handle and checks status and message. */
#define BAD_CALL(p, h, ...)                                                    \
  do {                                                                         \
    cusafe_status bc_st_ = call_param((p), (h));                               \
    char bc_msg_[512], bc_exp_[512];                                           \
    tu_copy_message(bc_msg_, sizeof bc_msg_);                                  \
    snprintf(bc_exp_, sizeof bc_exp_, __VA_ARGS__);                            \
    TU_ASSERT(bc_st_ == CUSAFE_ERROR_INVALID_HANDLE,                           \
              "%s with 0x%016llx returned %d (%s), expected "                  \
              "INVALID_HANDLE; message \"%s\"",                                \
              (p)->function, TU_HX(h), (int)bc_st_,                            \
              cusafe_status_string(bc_st_), bc_msg_);                          \
    TU_ASSERT(strcmp(bc_msg_, bc_exp_) == 0,                                   \
              "%s with 0x%016llx: message \"%s\", expected \"%s\"",            \
              (p)->function, TU_HX(h), bc_msg_, bc_exp_);                      \
  } while (0)

/* _i indexes handle_params. */
START_TEST(test_bad_handle) {
  const struct handle_param *p = &handle_params[_i];
  const cusafe_handle live[BAD_TYPE_LAST + 1] = {
      0, L.ctx, L.stream, L.start, L.buf, L.module, L.kernel};

  switch (p->on_null) {
  case NULL_IS_ERROR:
    BAD_CALL(p, CUSAFE_NULL_HANDLE, "%s is the NULL handle", p->name);
    break;
  case NULL_IS_NOOP:
  case NULL_IS_DEFAULT:
    TU_ASSERT(call_param(p, CUSAFE_NULL_HANDLE) == CUSAFE_SUCCESS,
              "%s with the NULL handle failed: %s", p->function,
              cusafe_last_error_message());
    break;
  }
  for (size_t i = 0; i < sizeof forged_handles / sizeof forged_handles[0]; i++)
    BAD_CALL(p, forged_handles[i], "%s 0x%016llx is not a cusafe handle",
             p->name, TU_HX(forged_handles[i]));
  for (int t = CUSAFE_TYPE_CONTEXT; t <= BAD_TYPE_LAST; t++) {
    if (p->type != CUSAFE_TYPE_INVALID && p->type != (cusafe_handle_type)t)
      continue;
    BAD_CALL(p, L.stale[t], "%s 0x%016llx is stale: its object was released",
             p->name, TU_HX(L.stale[t]));
  }
  if (p->type != CUSAFE_TYPE_INVALID) {
    for (int t = CUSAFE_TYPE_CONTEXT; t <= BAD_TYPE_LAST; t++) {
      if ((cusafe_handle_type)t == p->type)
        continue;
      BAD_CALL(p, live[t], "%s 0x%016llx is %s, not %s", p->name,
               TU_HX(live[t]), type_names[t], type_names[p->type]);
    }
  }

  /* None of the bad calls retained or released a live object: each dies
   * with exactly one release now, children before their context. */
  TU_OK(cusafe_stream_synchronize(L.stream)); /* launches done */
  const cusafe_handle order[] = {L.kernel, L.module, L.buf,    L.buf2,
                                 L.start,  L.end,    L.stream, L.ctx};
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    TU_OK(cusafe_release(order[i]));
    TU_STALE(order[i]);
  }
  memset(&L, 0, sizeof L);
}
END_TEST

/* More handles than the table's first, static chunk holds (4096): those
 * beyond it live in chunks allocated on demand and behave the same. */
START_TEST(test_many_handles) {
  enum { N = 10000 };
  cusafe_buffer a = CUSAFE_NULL_HANDLE;
  cusafe_buffer *views = tu_xmalloc(N * sizeof *views);
  size_t size = 0;
  TU_OK(cusafe_buffer_alloc(&a, ctx, CUSAFE_MEMORY_DEVICE, N));
  for (size_t i = 0; i < N; i++)
    TU_OK(cusafe_buffer_view(&views[i], a, i, N - i));
  TU_OK(cusafe_buffer_release(a));
  for (size_t i = 0; i < N; i++) {
    TU_OK(cusafe_buffer_retain(views[i]));
    TU_OK(cusafe_buffer_get_size(&size, views[i]));
    ck_assert_uint_eq(size, N - i);
    TU_OK(cusafe_buffer_release(views[i]));
  }
  for (size_t i = 0; i < N; i++)
    TU_OK(cusafe_buffer_release(views[i]));
  for (size_t i = 0; i < N; i += 997) {
    TU_STALE(views[i]);
    TU_ERR(cusafe_buffer_release(views[i]), CUSAFE_ERROR_INVALID_HANDLE,
           "buffer 0x%016llx is stale: its object was released",
           TU_HX(views[i]));
  }
  free(views);
}
END_TEST

START_TEST(test_stale_after_slot_reuse) {
  cusafe_buffer a = CUSAFE_NULL_HANDLE;
  cusafe_buffer later[64];
  unsigned char data[32];
  size_t size = 0;
  TU_OK(cusafe_buffer_alloc(&a, ctx, CUSAFE_MEMORY_DEVICE, 32));
  TU_OK(cusafe_buffer_release(a));
  /* Enough new objects that one of them takes a's slot. */
  for (size_t i = 0; i < 64; i++) {
    later[i] = make_buffer(ctx, CUSAFE_MEMORY_DEVICE, 32, (uint32_t)i, NULL);
    ck_assert_uint_ne(later[i], a);
  }
  TU_STALE(a);
  TU_ERR(cusafe_buffer_get_size(&size, a), CUSAFE_ERROR_INVALID_HANDLE,
         "buffer 0x%016llx is stale: its object was released", TU_HX(a));
  TU_ERR(cusafe_buffer_write(a, 0, data, 32), CUSAFE_ERROR_INVALID_HANDLE,
         "buffer 0x%016llx is stale: its object was released", TU_HX(a));
  TU_ERR(cusafe_buffer_release(a), CUSAFE_ERROR_INVALID_HANDLE,
         "buffer 0x%016llx is stale: its object was released", TU_HX(a));
  for (size_t i = 0; i < 64; i++) {
    tu_pattern(data, 32, (uint32_t)i);
    CHECK_CONTENT(later[i], 0, data, 32);
    TU_OK(cusafe_buffer_get_size(&size, later[i]));
    ck_assert_uint_eq(size, 32);
    TU_OK(cusafe_buffer_release(later[i]));
  }

  /* The same for streams and events, one slot at a time. */
  for (int round = 0; round < 8; round++) {
    cusafe_stream s1 = CUSAFE_NULL_HANDLE, s2 = CUSAFE_NULL_HANDLE;
    cusafe_event e1 = CUSAFE_NULL_HANDLE, e2 = CUSAFE_NULL_HANDLE;
    TU_OK(cusafe_stream_create(&s1, ctx, 0, 0));
    TU_OK(cusafe_stream_release(s1));
    TU_OK(cusafe_stream_create(&s2, ctx, 0, 0));
    ck_assert_uint_ne(s1, s2);
    TU_ERR(cusafe_stream_synchronize(s1), CUSAFE_ERROR_INVALID_HANDLE,
           "stream 0x%016llx is stale: its object was released", TU_HX(s1));
    TU_OK(cusafe_stream_synchronize(s2));
    TU_OK(cusafe_event_create(&e1, ctx, 0));
    TU_OK(cusafe_event_release(e1));
    TU_OK(cusafe_event_create(&e2, ctx, 0));
    ck_assert_uint_ne(e1, e2);
    TU_ERR(cusafe_event_query(e1), CUSAFE_ERROR_INVALID_HANDLE,
           "event 0x%016llx is stale: its object was released", TU_HX(e1));
    TU_OK(cusafe_event_query(e2));
    TU_OK(cusafe_stream_release(s2));
    TU_OK(cusafe_event_release(e2));
  }
}
END_TEST

/* Retains and releases of `h` on a thread of their own. */
struct counts_job {
  cusafe_handle h;
  int retains, releases;
  cusafe_status st;
};

static void *counts_main(void *arg) {
  struct counts_job *j = arg;
  j->st = CUSAFE_SUCCESS;
  for (int i = 0; i < j->retains && j->st == CUSAFE_SUCCESS; i++)
    j->st = cusafe_retain(j->h);
  for (int i = 0; i < j->releases && j->st == CUSAFE_SUCCESS; i++)
    j->st = cusafe_release(j->h);
  return NULL;
}

static cusafe_status counts_elsewhere(cusafe_handle h, int retains,
                                      int releases) {
  struct counts_job j = {h, retains, releases, CUSAFE_SUCCESS};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, counts_main, &j), 0);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  return j.st;
}

/* A thread's retain or release offers the slot the word that its last one
 * left there; other threads' changes in between must count all the same,
 * and a handle released and reused elsewhere must still be stale here. */
START_TEST(test_counts_changed_by_other_threads) {
  cusafe_buffer b = CUSAFE_NULL_HANDLE, a = CUSAFE_NULL_HANDLE;
  cusafe_buffer later[64];
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, 16));
  TU_OK(cusafe_buffer_retain(b));   /* 2 */
  TU_OK(counts_elsewhere(b, 2, 0)); /* 4 */
  TU_OK(cusafe_buffer_release(b));  /* 3 */
  TU_OK(counts_elsewhere(b, 0, 2)); /* 1 */
  TU_OK(cusafe_buffer_retain(b));   /* 2 */
  TU_OK(counts_elsewhere(b, 1, 1)); /* 2 */
  TU_OK(cusafe_buffer_release(b));  /* 1 */
  TU_LIVE(b, CUSAFE_TYPE_BUFFER);
  TU_OK(cusafe_buffer_release(b)); /* 0: destroyed */
  TU_STALE(b);
  TU_ERR(cusafe_buffer_retain(b), CUSAFE_ERROR_INVALID_HANDLE,
         "buffer 0x%016llx is stale: its object was released", TU_HX(b));

  /* Released elsewhere, its slot taken by a new buffer. */
  TU_OK(cusafe_buffer_alloc(&a, ctx, CUSAFE_MEMORY_DEVICE, 16));
  TU_OK(cusafe_buffer_retain(a));
  TU_OK(cusafe_buffer_release(a));
  TU_OK(counts_elsewhere(a, 0, 1));
  TU_STALE(a);
  int reused = 0;
  for (size_t i = 0; i < 64; i++) {
    TU_OK(cusafe_buffer_alloc(&later[i], ctx, CUSAFE_MEMORY_DEVICE, 16));
    reused += (uint32_t)later[i] == (uint32_t)a; /* the slot index */
  }
  ck_assert_int_eq(reused, 1);
  TU_ERR(cusafe_buffer_retain(a), CUSAFE_ERROR_INVALID_HANDLE,
         "buffer 0x%016llx is stale: its object was released", TU_HX(a));
  TU_ERR(cusafe_buffer_release(a), CUSAFE_ERROR_INVALID_HANDLE,
         "buffer 0x%016llx is stale: its object was released", TU_HX(a));
  /* The new buffers' counts are untouched: one release ends each. */
  for (size_t i = 0; i < 64; i++) {
    TU_OK(cusafe_buffer_release(later[i]));
    TU_STALE(later[i]);
  }

  /* A handle of another type in the memo's place: still checked. */
  TU_OK(cusafe_buffer_alloc(&a, ctx, CUSAFE_MEMORY_DEVICE, 16));
  TU_OK(cusafe_buffer_retain(a));
  TU_ERR(cusafe_stream_release(a), CUSAFE_ERROR_INVALID_HANDLE,
         "stream 0x%016llx is a buffer, not a stream", TU_HX(a));
  TU_OK(cusafe_buffer_release(a));
  TU_OK(cusafe_buffer_release(a));
  TU_STALE(a);
}
END_TEST

START_TEST(test_double_release) {
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_event e = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE, b2 = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, 0, 0));
  TU_OK(cusafe_event_create(&e, ctx, 0));
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, 16));
  TU_OK(cusafe_buffer_alloc(&b2, ctx, CUSAFE_MEMORY_HOST_PINNED, 16));
  TU_OK(cusafe_stream_release(s));
  TU_ERR(cusafe_stream_release(s), CUSAFE_ERROR_INVALID_HANDLE,
         "stream 0x%016llx is stale: its object was released", TU_HX(s));
  TU_OK(cusafe_event_release(e));
  TU_ERR(cusafe_event_release(e), CUSAFE_ERROR_INVALID_HANDLE,
         "event 0x%016llx is stale: its object was released", TU_HX(e));
  TU_OK(cusafe_buffer_release(b));
  TU_ERR(cusafe_buffer_release(b), CUSAFE_ERROR_INVALID_HANDLE,
         "buffer 0x%016llx is stale: its object was released", TU_HX(b));
  TU_OK(cusafe_release(b2));
  TU_ERR(cusafe_release(b2), CUSAFE_ERROR_INVALID_HANDLE,
         "handle 0x%016llx is stale: its object was released", TU_HX(b2));
  TU_ERR(cusafe_buffer_release(b2), CUSAFE_ERROR_INVALID_HANDLE,
         "buffer 0x%016llx is stale: its object was released", TU_HX(b2));
  /* The fixture's context is untouched by all this. */
  TU_LIVE(ctx, CUSAFE_TYPE_CONTEXT);
}
END_TEST

START_TEST(test_generic_retain_release_on_each_type) {
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_event e = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE, v = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, 0, 0));
  TU_OK(cusafe_event_create(&e, ctx, 0));
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, 16));
  TU_OK(cusafe_buffer_view(&v, b, 4, 4));
  const struct {
    cusafe_handle h;
    cusafe_handle_type type;
  } objs[] = {{s, CUSAFE_TYPE_STREAM},
              {e, CUSAFE_TYPE_EVENT},
              {b, CUSAFE_TYPE_BUFFER},
              {v, CUSAFE_TYPE_BUFFER}};
  TU_LIVE(ctx, CUSAFE_TYPE_CONTEXT);
  TU_OK(cusafe_retain(ctx));
  TU_OK(cusafe_context_release(ctx)); /* the fixture's reference remains */
  TU_LIVE(ctx, CUSAFE_TYPE_CONTEXT);
  for (size_t i = 0; i < 4; i++) {
    TU_LIVE(objs[i].h, objs[i].type);
    TU_OK(cusafe_retain(objs[i].h));
    TU_OK(cusafe_retain(objs[i].h));
    TU_OK(cusafe_release(objs[i].h));
    TU_OK(cusafe_release(objs[i].h));
    TU_LIVE(objs[i].h, objs[i].type);
  }
  /* Typed retain, generic release, and the other way round. */
  TU_OK(cusafe_stream_retain(s));
  TU_OK(cusafe_release(s));
  TU_OK(cusafe_retain(e));
  TU_OK(cusafe_event_release(e));
  TU_OK(cusafe_buffer_retain(v));
  TU_OK(cusafe_release(v));
  for (size_t i = 0; i < 4; i++) {
    TU_OK(cusafe_release(objs[i].h));
    TU_STALE(objs[i].h);
  }
}
END_TEST

/* A label can be set, replaced and removed on a live handle of every type;
 * it changes no reference count, and a released handle refuses it. */
START_TEST(test_set_label_on_each_type) {
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_event e = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE, v = CUSAFE_NULL_HANDLE;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_kernel k = CUSAFE_NULL_HANDLE;
  char long_label[400];
  memset(long_label, 'x', sizeof long_label - 1);
  long_label[sizeof long_label - 1] = '\0';
  TU_OK(cusafe_stream_create(&s, ctx, 0, 0));
  TU_OK(cusafe_event_create(&e, ctx, 0));
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, 64));
  TU_OK(cusafe_buffer_view(&v, b, 8, 16));
  TU_OK(cusafe_module_load_builtin(&m, ctx));
  TU_OK(cusafe_module_get_kernel(&k, m, "cusafe_fill_f32"));
  /* Children before their parents; the fixture's context last. */
  const struct {
    cusafe_handle h;
    cusafe_handle_type type;
  } objs[] = {{k, CUSAFE_TYPE_KERNEL},   {m, CUSAFE_TYPE_MODULE},
              {v, CUSAFE_TYPE_BUFFER},   {b, CUSAFE_TYPE_BUFFER},
              {e, CUSAFE_TYPE_EVENT},    {s, CUSAFE_TYPE_STREAM},
              {ctx, CUSAFE_TYPE_CONTEXT}};
  const size_t n = sizeof objs / sizeof objs[0];
  for (size_t i = 0; i < n; i++) {
    cusafe_handle h = objs[i].h;
    TU_OK(cusafe_handle_set_label(h, "first"));
    TU_OK(cusafe_handle_set_label(h, "second"));
    TU_OK(cusafe_handle_set_label(h, "")); /* an empty label is a label */
    TU_OK(cusafe_handle_set_label(h, long_label)); /* kept cut, not refused */
    TU_OK(cusafe_handle_set_label(h, NULL));
    TU_OK(cusafe_handle_set_label(h, NULL)); /* none to remove: fine */
    TU_OK(cusafe_handle_set_label(h, "kept until the release"));
    TU_LIVE(h, objs[i].type);
  }
  /* One release each still ends every object, label and all. */
  for (size_t i = 0; i + 1 < n; i++) {
    cusafe_handle h = objs[i].h;
    TU_OK(cusafe_release(h));
    TU_STALE(h);
    TU_ERR(cusafe_handle_set_label(h, "late"), CUSAFE_ERROR_INVALID_HANDLE,
           "handle 0x%016llx is stale: its object was released", TU_HX(h));
    TU_ERR(cusafe_handle_set_label(h, NULL), CUSAFE_ERROR_INVALID_HANDLE,
           "handle 0x%016llx is stale: its object was released", TU_HX(h));
  }
  TU_LIVE(ctx, CUSAFE_TYPE_CONTEXT);
}
END_TEST

START_TEST(test_release_null_is_noop) {
  TU_OK(cusafe_release(CUSAFE_NULL_HANDLE));
  TU_OK(cusafe_context_release(CUSAFE_NULL_HANDLE));
  TU_OK(cusafe_stream_release(CUSAFE_NULL_HANDLE));
  TU_OK(cusafe_event_release(CUSAFE_NULL_HANDLE));
  TU_OK(cusafe_buffer_release(CUSAFE_NULL_HANDLE));
  TU_LIVE(ctx, CUSAFE_TYPE_CONTEXT);
}
END_TEST

START_TEST(test_default_stream_is_not_a_stream_object) {
  cusafe_handle_type t = CUSAFE_TYPE_BUFFER;
  void *raw = (void *)1;
  TU_ERR(cusafe_handle_get_type(&t, CUSAFE_STREAM_DEFAULT),
         CUSAFE_ERROR_INVALID_HANDLE, "handle is the NULL handle");
  ck_assert_int_eq(t, CUSAFE_TYPE_INVALID);
  TU_ERR(cusafe_stream_interop_handle(&raw, CUSAFE_STREAM_DEFAULT),
         CUSAFE_ERROR_INVALID_HANDLE, "stream is the NULL handle");
  TU_ERR(cusafe_stream_synchronize(CUSAFE_STREAM_DEFAULT),
         CUSAFE_ERROR_INVALID_HANDLE, "stream is the NULL handle");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 9. Ownership: children keep their context                                 */
/* The context of a child is alive: the child hands out a new reference to
 * it (same handle), and on the fake its primary context is still held. */
#ifdef CUSAFE_TEST_FAKE
#define CONTEXT_ALIVE_FAKE() ck_assert_int_gt(fake_primary_ctx_refcount(0), 0)
#else
#define CONTEXT_ALIVE_FAKE() ((void)0)
#endif
#define CONTEXT_ALIVE(child, c)                                                \
  do {                                                                         \
    cusafe_context alive_ = CUSAFE_NULL_HANDLE;                                \
    CONTEXT_ALIVE_FAKE();                                                      \
    TU_OK(cusafe_buffer_get_context(&alive_, (child)));                        \
    ck_assert_uint_eq(alive_, (c));                                            \
    TU_OK(cusafe_context_release(alive_));                                     \
  } while (0)

/* ------------------------------------------------------------------------ */

START_TEST(test_context_released_before_children) {
  cusafe_context c = CUSAFE_NULL_HANDLE, owner = CUSAFE_NULL_HANDLE;
  cusafe_context again = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_event e = CUSAFE_NULL_HANDLE;
  cusafe_buffer bufs[NKINDS] = {0}, v = CUSAFE_NULL_HANDLE;
  unsigned char data[512], back[512];
  int dev = -1;

  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_stream_create(&s, c, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_event_create(&e, c, 0));
  for (int k = 0; k < NKINDS; k++)
    if (kind_usable(c, 0, all_kinds[k]))
      bufs[k] = make_buffer(c, all_kinds[k], 512, (uint32_t)k, NULL);
  TU_OK(cusafe_buffer_view(&v, bufs[0], 10, 100));

  TU_OK(cusafe_context_release(c));
  /* The caller's handle is stale (a second release is caught), but the
   * children hold a reference on their context: it lives on, and a child
   * hands out a new reference to it under the same handle. */
  TU_STALE(c);
  TU_ERR(cusafe_context_release(c), CUSAFE_ERROR_INVALID_HANDLE,
         "context 0x%016llx is stale: its object was released", TU_HX(c));
#ifdef CUSAFE_TEST_FAKE
  ck_assert_int_gt(fake_primary_ctx_refcount(0), 0);
#endif
  TU_OK(cusafe_stream_get_context(&owner, s));
  ck_assert_uint_eq(owner, c);
  TU_LIVE(c, CUSAFE_TYPE_CONTEXT);
  TU_OK(cusafe_context_get_device(&dev, c));
  ck_assert_int_eq(dev, 0);
  TU_OK(cusafe_context_release(owner));
  TU_STALE(c);
  TU_OK(cusafe_buffer_get_context(&owner, v));
  ck_assert_uint_eq(owner, c);
  TU_OK(cusafe_context_release(owner));
  /* Creating the device's context again gives the living one. */
  TU_OK(cusafe_context_create(&again, 0));
  ck_assert_uint_eq(again, c);
  TU_OK(cusafe_context_release(again));
  TU_STALE(c);

  /* Everything still works. */
  tu_pattern(data, sizeof data, 77);
  for (int k = 0; k < NKINDS; k++) {
    if (!bufs[k])
      continue;
    TU_OK(cusafe_buffer_write_async(bufs[k], 0, data, sizeof data, s));
    TU_OK(cusafe_buffer_read(bufs[k], 0, back, sizeof back));
    TU_BYTES_EQ(back, data, sizeof data);
  }
  TU_OK(cusafe_event_record(e, s));
  TU_OK(cusafe_event_synchronize(e));
  TU_OK(cusafe_buffer_copy(v, 0, bufs[1] ? bufs[1] : bufs[0], 200, 100, s));
  TU_OK(cusafe_stream_synchronize(s));
  CHECK_CONTENT(v, 0, data + 200, 100);

  /* The context dies with its last child, not before. */
  TU_OK(cusafe_stream_release(s));
  CONTEXT_ALIVE(v, c);
  TU_OK(cusafe_event_release(e));
  CONTEXT_ALIVE(v, c);
  for (int k = 0; k < NKINDS; k++) {
    TU_OK(cusafe_buffer_release(bufs[k]));
    CONTEXT_ALIVE(v, c);
  }
  /* The view holds the device buffer, which holds the context. */
  TU_OK(cusafe_buffer_release(v));
  TU_STALE(c);
  TU_ERR(cusafe_context_release(c), CUSAFE_ERROR_INVALID_HANDLE,
         "context 0x%016llx is stale: its object was released", TU_HX(c));
#ifdef CUSAFE_TEST_FAKE
  ck_assert_int_eq(fake_primary_ctx_refcount(0), 0);
  ck_assert_uint_eq(fake_live_allocations(-1), 0);
  ck_assert_uint_eq(fake_live_streams(-1), 0);
  ck_assert_uint_eq(fake_live_events(-1), 0);
#endif
}
END_TEST

/* A context whose last reference went is made anew by the next create. */
START_TEST(test_context_recreated_after_release) {
  cusafe_context a = CUSAFE_NULL_HANDLE, b = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&a, 0));
  TU_OK(cusafe_context_release(a));
  TU_STALE(a);
  TU_OK(cusafe_context_create(&b, 0));
  ck_assert_uint_ne(a, b);
  TU_LIVE(b, CUSAFE_TYPE_CONTEXT);
  cusafe_buffer buf = make_buffer(b, CUSAFE_MEMORY_DEVICE, 64, 31, NULL);
  TU_OK(cusafe_buffer_release(buf));
  TU_OK(cusafe_context_release(b));
  TU_STALE(b);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 10. Two devices                                                           */
/* ------------------------------------------------------------------------ */

/* Checks a CONTEXT_MISMATCH whose message names `a` and `b` in either
 * order: the catalogue fixes the words, not which object comes first. */
#define TU_MISMATCH(expr, a, da, b, db)                                        \
  do {                                                                         \
    cusafe_status mm_st_ = (expr);                                             \
    char mm_msg_[512], mm_1_[256], mm_2_[256];                                 \
    tu_copy_message(mm_msg_, sizeof mm_msg_);                                  \
    snprintf(mm_1_, sizeof mm_1_,                                              \
             "%s belongs to device %d but %s "                                 \
             "belongs to device %d",                                           \
             (a), (da), (b), (db));                                            \
    snprintf(mm_2_, sizeof mm_2_,                                              \
             "%s belongs to device %d but %s "                                 \
             "belongs to device %d",                                           \
             (b), (db), (a), (da));                                            \
    TU_ASSERT(mm_st_ == CUSAFE_ERROR_CONTEXT_MISMATCH,                         \
              "%s returned %d (%s), expected CONTEXT_MISMATCH; \"%s\"", #expr, \
              (int)mm_st_, cusafe_status_string(mm_st_), mm_msg_);             \
    TU_ASSERT(strcmp(mm_msg_, mm_1_) == 0 || strcmp(mm_msg_, mm_2_) == 0,      \
              "%s: message \"%s\", expected \"%s\"", #expr, mm_msg_, mm_1_);   \
  } while (0)

START_TEST(test_context_per_device) {
  cusafe_context c0 = CUSAFE_NULL_HANDLE, c1 = CUSAFE_NULL_HANDLE;
  int d0 = -1, d1 = -1;
  if (!have_two_devices("test_context_per_device"))
    return;
  TU_OK(cusafe_context_create(&c0, 0));
  TU_OK(cusafe_context_create(&c1, 1));
  ck_assert_uint_ne(c0, c1);
  TU_OK(cusafe_context_get_device(&d0, c0));
  TU_OK(cusafe_context_get_device(&d1, c1));
  ck_assert_int_eq(d0, 0);
  ck_assert_int_eq(d1, 1);
  TU_OK(cusafe_context_release(c0));
  TU_STALE(c0);
  TU_LIVE(c1, CUSAFE_TYPE_CONTEXT);
  TU_OK(cusafe_context_release(c1));
  TU_STALE(c1);
}
END_TEST

START_TEST(test_peer_copy_between_devices) {
  cusafe_context c[2] = {0, 0};
  cusafe_stream s[2] = {0, 0};
  const size_t n = 64 * KIB + 3;
  unsigned char *src_data = NULL, *want = NULL;
  char failures[8192] = "";
  size_t failures_len = 0;
  int nfailed = 0, ntried = 0;
  if (!have_two_devices("test_peer_copy_between_devices"))
    return;
  src_data = tu_xmalloc(n);
  want = tu_xmalloc(n);
  for (int d = 0; d < 2; d++) {
    TU_OK(cusafe_context_create(&c[d], d));
    TU_OK(cusafe_stream_create(&s[d], c[d], CUSAFE_STREAM_NON_BLOCKING, 0));
  }
  for (int from = 0; from < 2; from++) {
    int to = 1 - from;
    for (int i = 0; i < NKINDS; i++) {
      if (!kind_usable(c[from], from, all_kinds[i]))
        continue;
      for (int j = 0; j < NKINDS; j++) {
        if (!kind_usable(c[to], to, all_kinds[j]))
          continue;
        uint32_t seed = (uint32_t)(100 * from + 10 * i + j);
        cusafe_buffer src =
            make_buffer(c[from], all_kinds[i], n, seed, src_data);
        cusafe_buffer dst = make_buffer(c[to], all_kinds[j], n, seed + 1, want);
        memcpy(want + 5, src_data + 9, n - 20);
        for (int k = 0; k < 3; k++) {
          /* The stream may be of either buffer's context, or dst's
           * default. */
          static const char *const on_names[3] = {"the default stream",
                                                  "a stream of dst's device",
                                                  "a stream of src's device"};
          const cusafe_stream ons[3] = {CUSAFE_STREAM_DEFAULT, s[to], s[from]};
          cusafe_status st = cusafe_buffer_copy(dst, 5, src, 9, n - 20, ons[k]);
          ntried++;
          if (st != CUSAFE_SUCCESS) {
            char line[512], msg[256];
            tu_copy_message(msg, sizeof msg);
            int len = snprintf(line, sizeof line,
                               "\n  %s on device %d -> %s on device %d, on "
                               "%s: %s: %s",
                               tu_kind_names[i], from, tu_kind_names[j], to,
                               on_names[k], cusafe_status_string(st), msg);
            if (len > 0 && failures_len + (size_t)len < sizeof failures) {
              memcpy(failures + failures_len, line, (size_t)len + 1);
              failures_len += (size_t)len;
            }
            nfailed++;
            continue;
          }
          CHECK_CONTENT(dst, 0, want, n);
          CHECK_CONTENT(src, 0, src_data, n);
          /* Undo, so that the next stream's copy is seen to arrive. */
          TU_OK(cusafe_buffer_fill(dst, 5, n - 20, 0, CUSAFE_STREAM_DEFAULT));
          memset(want + 5, 0, n - 20);
          CHECK_CONTENT(dst, 0, want, n);
          memcpy(want + 5, src_data + 9, n - 20);
        }
        TU_OK(cusafe_buffer_release(src));
        TU_OK(cusafe_buffer_release(dst));
      }
    }
  }
  for (int d = 0; d < 2; d++) {
    TU_OK(cusafe_stream_release(s[d]));
    TU_OK(cusafe_context_release(c[d]));
    TU_STALE(c[d]);
  }
  free(src_data);
  free(want);
  ck_assert_msg(nfailed == 0, "%d of %d copies between devices failed:%s",
                nfailed, ntried, failures);
}
END_TEST

START_TEST(test_objects_of_two_devices_do_not_mix) {
  cusafe_context c[2] = {0, 0};
  cusafe_stream s[2] = {0, 0};
  cusafe_event e[2] = {0, 0};
  cusafe_buffer b[2] = {0, 0}, b0b = CUSAFE_NULL_HANDLE;
  unsigned char host[64];
  float ms = 0.0f;
  if (!have_two_devices("test_objects_of_two_devices_do_not_mix"))
    return;
  memset(host, 1, sizeof host);
  for (int d = 0; d < 2; d++) {
    TU_OK(cusafe_context_create(&c[d], d));
    TU_OK(cusafe_stream_create(&s[d], c[d], 0, 0));
    TU_OK(cusafe_event_create(&e[d], c[d], 0));
    TU_OK(cusafe_buffer_alloc(&b[d], c[d], CUSAFE_MEMORY_DEVICE, 64));
    TU_OK(cusafe_event_record(e[d], s[d]));
    TU_OK(cusafe_event_synchronize(e[d]));
  }
  TU_OK(cusafe_buffer_alloc(&b0b, c[0], CUSAFE_MEMORY_DEVICE, 64));

  TU_MISMATCH(cusafe_event_record(e[0], s[1]), "stream", 1, "event", 0);
  TU_MISMATCH(cusafe_stream_wait_event(s[1], e[0]), "event", 0, "stream", 1);
  TU_MISMATCH(cusafe_event_elapsed_ms(&ms, e[0], e[1]), "start", 0, "end", 1);
  TU_ERR(cusafe_buffer_write_async(b[0], 0, host, 64, s[1]),
         CUSAFE_ERROR_CONTEXT_MISMATCH,
         "stream belongs to device 1 but buffer belongs to device 0");
  TU_ERR(cusafe_buffer_read_async(b[0], 0, host, 64, s[1]),
         CUSAFE_ERROR_CONTEXT_MISMATCH,
         "stream belongs to device 1 but buffer belongs to device 0");
  TU_ERR(cusafe_buffer_fill(b[1], 0, 64, 0, s[0]),
         CUSAFE_ERROR_CONTEXT_MISMATCH,
         "stream belongs to device 0 but buffer belongs to device 1");
  {
    /* A stream of neither buffer's context. */
    cusafe_status st = cusafe_buffer_copy(b0b, 0, b[0], 0, 64, s[1]);
    char msg[512];
    tu_copy_message(msg, sizeof msg);
    ck_assert_int_eq(st, CUSAFE_ERROR_CONTEXT_MISMATCH);
    ck_assert_msg(
        strcmp(msg, "stream belongs to device 1 but dst belongs to device 0") ==
                0 ||
            strcmp(msg,
                   "stream belongs to device 1 but src belongs to device 0") ==
                0 ||
            strcmp(msg,
                   "dst belongs to device 0 but stream belongs to device 1") ==
                0 ||
            strcmp(msg,
                   "src belongs to device 0 but stream belongs to device 1") ==
                0,
        "copy with a foreign stream: message \"%s\"", msg);
  }
  /* Streams of the right device work: buffers on device 1 made by
   * alloc_async on its stream belong to its context. */
  {
    cusafe_buffer a = CUSAFE_NULL_HANDLE;
    cusafe_context owner = CUSAFE_NULL_HANDLE;
    unsigned char back[64];
    TU_OK(cusafe_buffer_alloc_async(&a, s[1], 64));
    TU_OK(cusafe_buffer_get_context(&owner, a));
    ck_assert_uint_eq(owner, c[1]);
    TU_OK(cusafe_context_release(owner));
    TU_OK(cusafe_buffer_write_async(a, 0, host, 64, s[1]));
    TU_OK(cusafe_buffer_copy(b0b, 0, a, 0, 64, s[1]));
    TU_OK(cusafe_buffer_read(b0b, 0, back, 64));
    TU_BYTES_EQ(back, host, 64);
    TU_MISMATCH(cusafe_buffer_fill(a, 0, 64, 0, s[0]), "stream", 0, "buffer",
                1);
    TU_OK(cusafe_buffer_release(a));
  }
  TU_OK(cusafe_buffer_release(b0b));
  for (int d = 0; d < 2; d++) {
    TU_OK(cusafe_buffer_release(b[d]));
    TU_OK(cusafe_event_release(e[d]));
    TU_OK(cusafe_stream_release(s[d]));
    TU_OK(cusafe_context_release(c[d]));
    TU_STALE(c[d]);
  }
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 11. Threads                                                               */
/* ------------------------------------------------------------------------ */

#define NTHREADS 8
#define STORM_ITERATIONS 10000

/* Check's assertions belong to the test's thread; workers record the first
 * failure here and the test reports it after joining. */
struct worker {
  pthread_t thread;
  int index;
  pthread_barrier_t *start;
  cusafe_handle handles[4];
  int managed;
  cusafe_handle result;
  char error[512];
};

#define WK_CHECK(w, cond, ...)                                                 \
  do {                                                                         \
    if (!(cond)) {                                                             \
      if ((w)->error[0] == '\0')                                               \
        snprintf((w)->error, sizeof(w)->error, __VA_ARGS__);                   \
      return NULL;                                                             \
    }                                                                          \
  } while (0)

#define WK_OK(w, expr)                                                         \
  do {                                                                         \
    cusafe_status w_st_ = (expr);                                              \
    WK_CHECK(w, w_st_ == CUSAFE_SUCCESS, "thread %d: %s returned %d: %s",      \
             (w)->index, #expr, (int)w_st_, cusafe_last_error_message());      \
  } while (0)

static void join_workers(struct worker *w, int n) {
  for (int i = 0; i < n; i++)
    ck_assert_int_eq(pthread_join(w[i].thread, NULL), 0);
  for (int i = 0; i < n; i++)
    ck_assert_msg(w[i].error[0] == '\0', "%s", w[i].error);
}

static cusafe_status typed_retain(cusafe_handle h, int type) {
  switch (type) {
  case CUSAFE_TYPE_CONTEXT: return cusafe_context_retain(h);
  case CUSAFE_TYPE_STREAM: return cusafe_stream_retain(h);
  case CUSAFE_TYPE_EVENT: return cusafe_event_retain(h);
  default: return cusafe_buffer_retain(h);
  }
}

static cusafe_status typed_release(cusafe_handle h, int type) {
  switch (type) {
  case CUSAFE_TYPE_CONTEXT: return cusafe_context_release(h);
  case CUSAFE_TYPE_STREAM: return cusafe_stream_release(h);
  case CUSAFE_TYPE_EVENT: return cusafe_event_release(h);
  default: return cusafe_buffer_release(h);
  }
}

/* handles[] is context, stream, event, buffer (type - 1). */
static void *storm_worker(void *arg) {
  struct worker *w = arg;
  const int generic = w->index % 2;
  pthread_barrier_wait(w->start);
  /* Some references held across the storm, so counts go well above one. */
  for (int t = 0; t < 4; t++)
    for (int k = 0; k < 100; k++)
      WK_OK(w, cusafe_retain(w->handles[t]));
  for (int i = 0; i < STORM_ITERATIONS; i++) {
    for (int t = 0; t < 4; t++) {
      cusafe_handle h = w->handles[t];
      if (generic) {
        WK_OK(w, cusafe_retain(h));
        WK_OK(w, cusafe_release(h));
      } else {
        WK_OK(w, typed_retain(h, t + 1));
        WK_OK(w, typed_release(h, t + 1));
      }
    }
  }
  for (int t = 0; t < 4; t++)
    for (int k = 0; k < 100; k++)
      WK_OK(w, typed_release(w->handles[t], t + 1));
  return NULL;
}

START_TEST(test_threads_retain_release_storm) {
  struct worker w[NTHREADS];
  pthread_barrier_t start;
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_event e = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_stream_create(&s, c, 0, 0));
  TU_OK(cusafe_event_create(&e, c, 0));
  TU_OK(cusafe_buffer_alloc(&b, c, CUSAFE_MEMORY_DEVICE, 256));
  ck_assert_int_eq(pthread_barrier_init(&start, NULL, NTHREADS), 0);
  memset(w, 0, sizeof w);
  for (int i = 0; i < NTHREADS; i++) {
    w[i].index = i;
    w[i].start = &start;
    w[i].handles[0] = c;
    w[i].handles[1] = s;
    w[i].handles[2] = e;
    w[i].handles[3] = b;
    ck_assert_int_eq(pthread_create(&w[i].thread, NULL, storm_worker, &w[i]),
                     0);
  }
  join_workers(w, NTHREADS);
  pthread_barrier_destroy(&start);
  /* Back to one reference each: one release ends every object. */
  TU_OK(cusafe_buffer_release(b));
  TU_STALE(b);
  TU_OK(cusafe_event_release(e));
  TU_STALE(e);
  TU_OK(cusafe_stream_release(s));
  TU_STALE(s);
  TU_OK(cusafe_context_release(c));
  TU_STALE(c);
}
END_TEST

/* Each thread makes, uses and releases objects of its own; they share only
 * the context. */
static void *own_objects_worker(void *arg) {
  struct worker *w = arg;
  const size_t n = 4096 + (size_t)w->index;
  unsigned char *data = tu_xmalloc(n), *back = tu_xmalloc(n);
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  const int managed = w->managed;
  pthread_barrier_wait(w->start);
  WK_OK(w, cusafe_context_create(&c, 0));
  WK_OK(w, cusafe_stream_create(&s, c, CUSAFE_STREAM_NON_BLOCKING, 0));
  for (int it = 0; it < 40; it++) {
    cusafe_memory kind = all_kinds[(it + w->index) % (managed ? 3 : 2)];
    cusafe_buffer a = CUSAFE_NULL_HANDLE, b = CUSAFE_NULL_HANDLE;
    cusafe_buffer v = CUSAFE_NULL_HANDLE;
    tu_pattern(data, n, (uint32_t)(w->index * 1000 + it));
    WK_OK(w, cusafe_buffer_alloc(&a, c, kind, n));
    WK_OK(w, cusafe_buffer_alloc_async(&b, s, n));
    WK_OK(w, cusafe_buffer_write(a, 0, data, n));
    WK_OK(w, cusafe_buffer_view(&v, a, 1, n - 1));
    WK_OK(w, cusafe_buffer_copy(b, 1, v, 0, n - 1, s));
    WK_OK(w, cusafe_buffer_fill(b, 0, 1, data[0], s));
    WK_OK(w, cusafe_buffer_release(v));
    WK_OK(w, cusafe_buffer_release(a));
    memset(back, 0, n);
    WK_OK(w, cusafe_buffer_read_async(b, 0, back, n, s));
    WK_OK(w, cusafe_stream_synchronize(s));
    WK_CHECK(w, memcmp(back, data, n) == 0,
             "thread %d iteration %d: data differ", w->index, it);
    WK_OK(w, cusafe_buffer_release(b));
  }
  WK_OK(w, cusafe_stream_release(s));
  WK_OK(w, cusafe_context_release(c));
  free(data);
  free(back);
  return NULL;
}

START_TEST(test_threads_with_own_objects) {
  struct worker w[NTHREADS];
  pthread_barrier_t start;
  cusafe_device_properties p;
  TU_OK(cusafe_device_get_properties(&p, 0));
  ck_assert_int_eq(pthread_barrier_init(&start, NULL, NTHREADS), 0);
  memset(w, 0, sizeof w);
  for (int i = 0; i < NTHREADS; i++) {
    w[i].index = i;
    w[i].start = &start;
    w[i].managed = p.managed_memory;
    ck_assert_int_eq(
        pthread_create(&w[i].thread, NULL, own_objects_worker, &w[i]), 0);
  }
  join_workers(w, NTHREADS);
  pthread_barrier_destroy(&start);
}
END_TEST

static void *create_context_worker(void *arg) {
  struct worker *w = arg;
  pthread_barrier_wait(w->start);
  WK_OK(w, cusafe_context_create(&w->result, 0));
  return NULL;
}

/* Threads racing to create the device's first context get one context. */
START_TEST(test_threads_create_one_context) {
  struct worker w[NTHREADS];
  pthread_barrier_t start;
  ck_assert_int_eq(pthread_barrier_init(&start, NULL, NTHREADS), 0);
  memset(w, 0, sizeof w);
  for (int i = 0; i < NTHREADS; i++) {
    w[i].index = i;
    w[i].start = &start;
    ck_assert_int_eq(
        pthread_create(&w[i].thread, NULL, create_context_worker, &w[i]), 0);
  }
  join_workers(w, NTHREADS);
  pthread_barrier_destroy(&start);
  for (int i = 1; i < NTHREADS; i++)
    ck_assert_uint_eq(w[i].result, w[0].result);
  for (int i = 0; i < NTHREADS; i++) {
    TU_LIVE(w[0].result, CUSAFE_TYPE_CONTEXT);
    TU_OK(cusafe_context_release(w[i].result));
  }
  TU_STALE(w[0].result);
}
END_TEST

/* Workers each own one reference of a shared buffer and write their own
 * slice; the last of them releases after joining the others. */
#define SHARED_SLICE 4096

static void *shared_slice_worker(void *arg) {
  struct worker *w = arg;
  cusafe_buffer b = w->handles[0];
  unsigned char data[SHARED_SLICE], back[SHARED_SLICE];
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_context c = CUSAFE_NULL_HANDLE;
  tu_pattern(data, sizeof data, (uint32_t)(500 + w->index));
  WK_OK(w, cusafe_buffer_get_context(&c, b));
  WK_OK(w, cusafe_stream_create(&s, c, CUSAFE_STREAM_NON_BLOCKING, 0));
  pthread_barrier_wait(w->start);
  for (int it = 0; it < 20; it++) {
    size_t off = (size_t)w->index * SHARED_SLICE;
    WK_OK(w, cusafe_buffer_write_async(b, off, data, sizeof data, s));
    WK_OK(w, cusafe_buffer_read(b, off, back, sizeof back));
    WK_CHECK(w, memcmp(back, data, sizeof data) == 0,
             "thread %d: slice differs", w->index);
  }
  WK_OK(w, cusafe_stream_release(s));
  WK_OK(w, cusafe_context_release(c));
  WK_OK(w, cusafe_buffer_release(b));
  return NULL;
}

struct last_owner {
  struct worker *others;
  int nothers;
  struct worker self;
};

static void *last_owner_worker(void *arg) {
  struct last_owner *lo = arg;
  struct worker *w = &lo->self;
  cusafe_buffer b = w->handles[0];
  unsigned char want[SHARED_SLICE], back[SHARED_SLICE];
  for (int i = 0; i < lo->nothers; i++)
    WK_CHECK(w, pthread_join(lo->others[i].thread, NULL) == 0, "join failed");
  for (int i = 0; i < lo->nothers; i++) {
    tu_pattern(want, sizeof want, (uint32_t)(500 + i));
    WK_OK(w,
          cusafe_buffer_read(b, (size_t)i * SHARED_SLICE, back, sizeof back));
    WK_CHECK(w, memcmp(back, want, sizeof want) == 0, "slice %d differs", i);
  }
  WK_OK(w, cusafe_buffer_release(b));
  return NULL;
}

START_TEST(test_threads_share_buffer_last_release_elsewhere) {
  struct worker w[NTHREADS - 1];
  struct last_owner lo;
  pthread_barrier_t start;
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  const int nworkers = NTHREADS - 1;
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_buffer_alloc(&b, c, CUSAFE_MEMORY_DEVICE,
                            (size_t)nworkers * SHARED_SLICE));
  /* One reference per worker and one for the last owner. */
  for (int i = 0; i < nworkers + 1; i++)
    TU_OK(cusafe_buffer_retain(b));
  TU_OK(cusafe_buffer_release(b));  /* the test's own */
  TU_OK(cusafe_context_release(c)); /* the buffer keeps the context */
  ck_assert_int_eq(pthread_barrier_init(&start, NULL, (unsigned)nworkers), 0);
  memset(w, 0, sizeof w);
  memset(&lo, 0, sizeof lo);
  for (int i = 0; i < nworkers; i++) {
    w[i].index = i;
    w[i].start = &start;
    w[i].handles[0] = b;
    ck_assert_int_eq(
        pthread_create(&w[i].thread, NULL, shared_slice_worker, &w[i]), 0);
  }
  lo.others = w;
  lo.nothers = nworkers;
  lo.self.index = nworkers;
  lo.self.handles[0] = b;
  ck_assert_int_eq(
      pthread_create(&lo.self.thread, NULL, last_owner_worker, &lo), 0);
  ck_assert_int_eq(pthread_join(lo.self.thread, NULL), 0);
  pthread_barrier_destroy(&start);
  for (int i = 0; i < nworkers; i++)
    ck_assert_msg(w[i].error[0] == '\0', "%s", w[i].error);
  ck_assert_msg(lo.self.error[0] == '\0', "%s", lo.self.error);
  TU_STALE(b);
  TU_STALE(c);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Suite                                                                     */
/* ------------------------------------------------------------------------ */

static TCase *with_context(TCase *tc) {
  tcase_add_checked_fixture(tc, ctx_setup, ctx_teardown);
  return tc;
}

static Suite *api_suite(void) {
  Suite *s = suite_create("api");
  TCase *tc;

  tc = tcase_create("status");
  tcase_add_test(tc, test_status_strings_are_distinct_and_nonempty);
  tcase_add_test(tc, test_status_string_of_unknown_value);
  tcase_add_test(tc, test_version_string);
  tcase_add_test(tc, test_last_error_is_per_thread);
  suite_add_tcase(s, tc);

  tc = tcase_create("devices");
  tcase_add_test(tc, test_device_count_is_positive);
  tcase_add_test(tc, test_device_properties_are_sane);
  tcase_add_test(tc, test_invalid_device_ordinals);
  tcase_add_test(tc, test_device_null_out);
#ifdef CUSAFE_TEST_FAKE
  tcase_add_test(tc, test_buffer_wrap_range_lookup_fails_once);
#endif
  suite_add_tcase(s, tc);

  tc = with_context(tcase_create("contexts"));
  tcase_add_test(tc, test_context_create_gives_context_handle);
  tcase_add_test(tc, test_context_is_one_per_device);
  tcase_add_test(tc, test_context_on_every_device);
  tcase_add_test(tc, test_context_priority_range);
  tcase_add_test(tc, test_context_retain_release_counts);
  suite_add_tcase(s, tc);

  tc = with_context(tcase_create("streams"));
  tcase_add_test(tc, test_stream_create_with_each_flag);
  tcase_add_test(tc, test_stream_bad_flags);
  tcase_add_test(tc, test_stream_priorities);
  tcase_add_test(tc, test_stream_query_after_synchronize);
  tcase_add_test(tc, test_stream_interop_handles_are_distinct);
  tcase_add_test(tc, test_stream_wrap);
  tcase_add_test(tc, test_wrap_holds_own_stream);
  tcase_add_test(tc, test_stream_wrap_other_device);
  tcase_add_test(tc, test_stream_use_buffers);
#ifdef CUSAFE_TEST_FAKE
  tcase_add_test(tc, test_stream_use_buffers_orders_and_keeps_alive);
#endif
  suite_add_tcase(s, tc);

  tc = with_context(tcase_create("events"));
  tcase_add_test(tc, test_event_create_with_each_flag_combination);
  tcase_add_test(tc, test_event_bad_flags);
  tcase_add_test(tc, test_event_never_recorded_completes_at_once);
  tcase_add_test(tc, test_event_elapsed_time);
  tcase_add_test(tc, test_event_elapsed_needs_timing);
  tcase_add_test(tc, test_event_elapsed_never_recorded_is_cuda_error);
  tcase_add_test(tc, test_stream_wait_event);
  suite_add_tcase(s, tc);

  tc = with_context(tcase_create("buffers"));
  tcase_add_loop_test(tc, test_buffer_roundtrip, 0, NKINDS);
  tcase_add_loop_test(tc, test_buffer_fill, 0, NKINDS);
  tcase_add_test(tc, test_buffer_copy_between_all_kinds);
  tcase_add_loop_test(tc, test_buffer_view_at_odd_offset, 0, NKINDS);
  tcase_add_loop_test(tc, test_buffer_view_of_view, 0, NKINDS);
  tcase_add_loop_test(tc, test_buffer_view_keeps_memory_alive, 0, NKINDS);
  tcase_add_test(tc, test_buffer_alloc_async_used_on_other_stream);
  tcase_add_loop_test(tc, test_buffer_async_write_and_read, 0, NKINDS);
  tcase_add_test(tc, test_buffer_async_pageable_memory_is_staged);
  tcase_add_test(tc, test_buffer_sync_read_after_work_on_streams);
  tcase_add_loop_test(tc, test_buffer_interop_pointer, 0, NKINDS);
  tcase_add_test(tc, test_buffer_null_outs);
  tcase_add_test(tc, test_buffer_unknown_memory_kind);
  suite_add_tcase(s, tc);

  tc = with_context(tcase_create("bounds"));
  tcase_add_loop_test(tc, test_access_bounds, OP_WRITE, OP_READ_ASYNC + 1);
  tcase_add_test(tc, test_rejected_access_changes_nothing);
  tcase_add_test(tc, test_copy_bounds);
  tcase_add_test(tc, test_view_bounds);
  tcase_add_test(tc, test_alloc_zero_bytes);
  tcase_add_loop_test(tc, test_buffer_wrap, 0, NKINDS);
  tcase_add_test(tc, test_buffer_wrap_checks);
  tcase_add_test(tc, test_alloc_too_large);
  tcase_add_test(tc, test_null_host_pointers);
  tcase_add_test(tc, test_overlapping_copy_rejected);
  tcase_add_test(tc, test_copy_within_one_buffer);
  suite_add_tcase(s, tc);

  tc = tcase_create("bad_handles");
  tcase_add_checked_fixture(tc, bad_handles_setup, bad_handles_teardown);
  tcase_add_loop_test(tc, test_bad_handle, 0, (int)NHANDLE_PARAMS);
  suite_add_tcase(s, tc);

  tc = with_context(tcase_create("handles"));
  tcase_add_test(tc, test_stale_after_slot_reuse);
  tcase_add_test(tc, test_many_handles);
  tcase_add_test(tc, test_double_release);
  tcase_add_test(tc, test_counts_changed_by_other_threads);
  tcase_add_test(tc, test_generic_retain_release_on_each_type);
  tcase_add_test(tc, test_set_label_on_each_type);
  tcase_add_test(tc, test_release_null_is_noop);
  tcase_add_test(tc, test_default_stream_is_not_a_stream_object);
  suite_add_tcase(s, tc);

  tc = tcase_create("ownership");
  tcase_add_test(tc, test_context_released_before_children);
  tcase_add_test(tc, test_context_recreated_after_release);
  suite_add_tcase(s, tc);

  tc = tcase_create("devices2");
  tcase_add_test(tc, test_context_per_device);
  tcase_add_test(tc, test_peer_copy_between_devices);
  tcase_add_test(tc, test_peer_copies);
#ifdef CUSAFE_TEST_FAKE
  tcase_add_test(tc, test_foreign_work_on_every_device);
  tcase_add_test(tc, test_peer_copy_unreachable);
  tcase_add_test(tc, test_peer_copy_after_other_library);
#endif
  tcase_add_test(tc, test_objects_of_two_devices_do_not_mix);
  suite_add_tcase(s, tc);

  tc = tcase_create("threads");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_threads_retain_release_storm);
  tcase_add_test(tc, test_threads_with_own_objects);
  tcase_add_test(tc, test_threads_create_one_context);
  tcase_add_test(tc, test_threads_share_buffer_last_release_elsewhere);
  suite_add_tcase(s, tc);

  return s;
}

int main(void) {
#ifdef CUSAFE_TEST_FAKE
  /* Every test needs a fresh library and a fresh fake, so each runs in its
   * own process whatever CK_FORK says; no cusafe call may happen here. */
  return tu_run_suite(api_suite(), CK_FORK);
#else
  tu_require_gpu();
  /* CUDA is initialised now: a forked child could not use it. */
  return tu_run_suite(api_suite(), CK_NOFORK);
#endif
}
