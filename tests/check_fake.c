/* check_fake.c -- lifetimes, failures, exit and fork, against the fake CUDA.
 *
 * Each test runs in its own process with a fresh library and a fresh fake
 * (two devices, a working driver).  The fake aborts the process with
 * "fakecuda: VIOLATION: ..." when a lifetime rule is broken, which fails the
 * test.  Tests that need a fresh library more than once, or a process exit,
 * fork children of their own; those report through tu_fail() in child mode
 * (see testutil.h) and their exit status. */
#include <check.h>
#include <signal.h>
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
static const char forked_message[] =
    "cusafe cannot be used in a process forked after CUDA was initialised";

#define CHECK_CHILD_EXITED_0(status)                                           \
  do {                                                                         \
    int cc_s_ = (status);                                                      \
    ck_assert_msg(!WIFSIGNALED(cc_s_), "child killed by signal %d (%s)",       \
                  WTERMSIG(cc_s_), strsignal(WTERMSIG(cc_s_)));                \
    ck_assert_msg(WIFEXITED(cc_s_) && WEXITSTATUS(cc_s_) == 0,                 \
                  "child exited with status %d", WEXITSTATUS(cc_s_));          \
  } while (0)

/* ------------------------------------------------------------------------ */
/* A bit of everything                                                       */
/* ------------------------------------------------------------------------ */

struct world {
  cusafe_context ctx, ctx1;
  cusafe_stream stream;
  cusafe_event start, end;
  cusafe_buffer dev, pinned, managed, view, async, dev1;
  unsigned char data[4096];
};

/* Objects of every type on two devices, with work done on them. */
static void world_make(struct world *w) {
  memset(w, 0, sizeof *w);
  tu_pattern(w->data, sizeof w->data, 42);
  TU_OK(cusafe_context_create(&w->ctx, 0));
  TU_OK(cusafe_context_create(&w->ctx1, 1));
  TU_OK(
      cusafe_stream_create(&w->stream, w->ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_event_create(&w->start, w->ctx, 0));
  TU_OK(cusafe_event_create(&w->end, w->ctx, CUSAFE_EVENT_BLOCKING_SYNC));
  TU_OK(cusafe_buffer_alloc(&w->dev, w->ctx, CUSAFE_MEMORY_DEVICE, 4096));
  TU_OK(
      cusafe_buffer_alloc(&w->pinned, w->ctx, CUSAFE_MEMORY_HOST_PINNED, 4096));
  TU_OK(cusafe_buffer_alloc(&w->managed, w->ctx, CUSAFE_MEMORY_MANAGED, 4096));
  TU_OK(cusafe_buffer_view(&w->view, w->dev, 16, 256));
  TU_OK(cusafe_buffer_alloc_async(&w->async, w->stream, 4096));
  TU_OK(cusafe_buffer_alloc(&w->dev1, w->ctx1, CUSAFE_MEMORY_DEVICE, 4096));
  TU_OK(cusafe_event_record(w->start, w->stream));
  TU_OK(cusafe_buffer_write(w->dev, 0, w->data, 4096));
  TU_OK(cusafe_buffer_copy(w->pinned, 0, w->dev, 0, 4096, w->stream));
  TU_OK(cusafe_buffer_copy(w->managed, 0, w->pinned, 0, 4096,
                           CUSAFE_STREAM_DEFAULT));
  TU_OK(cusafe_buffer_copy(w->async, 0, w->managed, 0, 4096, w->stream));
  TU_OK(cusafe_buffer_copy(w->dev1, 0, w->async, 0, 4096, w->stream));
  TU_OK(cusafe_event_record(w->end, w->stream));
}

/* Every handle of the world, children before their parents. */
#define WORLD_HANDLES(w)                                                       \
  {                                                                            \
    (w)->view, (w)->dev, (w)->pinned, (w)->managed, (w)->async, (w)->dev1,     \
        (w)->start, (w)->end, (w)->stream, (w)->ctx, (w)->ctx1                 \
  }
#define WORLD_NHANDLES 11

static void world_release(struct world *w) {
  const cusafe_handle all[WORLD_NHANDLES] = WORLD_HANDLES(w);
  for (int i = 0; i < WORLD_NHANDLES; i++)
    TU_OK(cusafe_release(all[i]));
}

/* Every function that is not a release refuses to work, with `want` and
 * `msg`, and without calling CUDA. */
static void check_every_call_refused(const struct world *w, cusafe_status want,
                                     const char *msg) {
  int n = 0, least = 0, greatest = 0;
  cusafe_device_properties props;
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_event e = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  cusafe_handle_type t = CUSAFE_TYPE_INVALID;
  size_t size = 0;
  cusafe_memory m = CUSAFE_MEMORY_DEVICE;
  void *ptr = NULL;
  float ms = 0.0f;
  unsigned char host[64];
  unsigned long calls = fake_call_count();
  memset(host, 0, sizeof host);

#define REFUSED(expr) TU_ERR(expr, want, "%s", msg)
  REFUSED(cusafe_device_count(&n));
  REFUSED(cusafe_device_get_properties(&props, 0));
  c = (cusafe_context)0x1234;
  REFUSED(cusafe_context_create(&c, 0));
  TU_ASSERT(c == CUSAFE_NULL_HANDLE, "refused create returned a handle");
  REFUSED(cusafe_handle_get_type(&t, w->dev));
  REFUSED(cusafe_retain(w->dev));
  REFUSED(cusafe_context_retain(w->ctx));
  REFUSED(cusafe_context_get_device(&n, w->ctx));
  REFUSED(cusafe_context_synchronize(w->ctx));
  REFUSED(cusafe_context_stream_priority_range(&least, &greatest, w->ctx));
  s = (cusafe_stream)0x1234;
  REFUSED(cusafe_stream_create(&s, w->ctx, 0, 0));
  TU_ASSERT(s == CUSAFE_NULL_HANDLE, "refused create returned a handle");
  REFUSED(cusafe_stream_retain(w->stream));
  REFUSED(cusafe_stream_synchronize(w->stream));
  REFUSED(cusafe_stream_query(w->stream));
  REFUSED(cusafe_stream_wait_event(w->stream, w->start));
  REFUSED(cusafe_stream_get_context(&c, w->stream));
  REFUSED(cusafe_stream_interop_handle(&ptr, w->stream));
  REFUSED(cusafe_event_create(&e, w->ctx, 0));
  TU_ASSERT(e == CUSAFE_NULL_HANDLE, "refused create returned a handle");
  REFUSED(cusafe_event_retain(w->start));
  REFUSED(cusafe_event_record(w->start, w->stream));
  REFUSED(cusafe_event_record(w->start, CUSAFE_STREAM_DEFAULT));
  REFUSED(cusafe_event_synchronize(w->end));
  REFUSED(cusafe_event_query(w->end));
  REFUSED(cusafe_event_elapsed_ms(&ms, w->start, w->end));
  REFUSED(cusafe_buffer_alloc(&b, w->ctx, CUSAFE_MEMORY_DEVICE, 64));
  TU_ASSERT(b == CUSAFE_NULL_HANDLE, "refused alloc returned a handle");
  REFUSED(cusafe_buffer_alloc_async(&b, w->stream, 64));
  TU_ASSERT(b == CUSAFE_NULL_HANDLE, "refused alloc returned a handle");
  REFUSED(cusafe_buffer_view(&b, w->dev, 0, 16));
  TU_ASSERT(b == CUSAFE_NULL_HANDLE, "refused view returned a handle");
  REFUSED(cusafe_buffer_retain(w->dev));
  REFUSED(cusafe_buffer_get_size(&size, w->view));
  REFUSED(cusafe_buffer_get_memory(&m, w->pinned));
  REFUSED(cusafe_buffer_get_context(&c, w->managed));
  REFUSED(cusafe_buffer_write(w->dev, 0, host, sizeof host));
  REFUSED(cusafe_buffer_read(w->dev, 0, host, sizeof host));
  REFUSED(cusafe_buffer_write_async(w->dev, 0, host, sizeof host, w->stream));
  REFUSED(cusafe_buffer_read_async(w->dev, 0, host, sizeof host,
                                   CUSAFE_STREAM_DEFAULT));
  REFUSED(cusafe_buffer_copy(w->pinned, 0, w->dev, 0, 64, w->stream));
  REFUSED(cusafe_buffer_fill(w->dev, 0, 64, 1, CUSAFE_STREAM_DEFAULT));
  REFUSED(cusafe_buffer_interop_pointer(&ptr, w->dev));
  /* Whatever the handle: the state is checked first. */
  REFUSED(cusafe_buffer_get_size(&size, (cusafe_buffer)0x7f00000012345678ULL));
#undef REFUSED
  TU_ASSERT(fake_call_count() == calls, "refused calls made %lu CUDA call(s)",
            fake_call_count() - calls);
}

/* Every release succeeds and does nothing, also a second time. */
static void check_every_release_noop(const struct world *w) {
  const cusafe_handle all[WORLD_NHANDLES] = WORLD_HANDLES(w);
  unsigned long calls = fake_call_count();
  TU_OK(cusafe_context_release(w->ctx));
  TU_OK(cusafe_context_release(w->ctx1));
  TU_OK(cusafe_stream_release(w->stream));
  TU_OK(cusafe_event_release(w->start));
  TU_OK(cusafe_event_release(w->end));
  TU_OK(cusafe_buffer_release(w->dev));
  TU_OK(cusafe_buffer_release(w->view));
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < WORLD_NHANDLES; i++)
      TU_OK(cusafe_release(all[i]));
  TU_OK(cusafe_release(CUSAFE_NULL_HANDLE));
  TU_OK(cusafe_buffer_release(CUSAFE_NULL_HANDLE));
  TU_OK(cusafe_release((cusafe_handle)0xdeadbeefcafef00dULL));
  TU_ASSERT(fake_call_count() == calls, "no-op releases made %lu CUDA call(s)",
            fake_call_count() - calls);
}

/* ------------------------------------------------------------------------ */
/* 12. No driver, no device                                                  */
/* ------------------------------------------------------------------------ */

START_TEST(test_no_driver) {
  const char *want =
      "no CUDA driver found: "
      "CUDA driver version is insufficient for CUDA runtime version";
  int n = 5;
  cusafe_context c = (cusafe_context)0x1234;
  cusafe_device_properties p;
  fake_set_driver(FAKE_DRIVER_MISSING);
  TU_ERR(cusafe_device_count(&n), CUSAFE_ERROR_NO_DRIVER, "%s", want);
  ck_assert_int_eq(n, 0);
  TU_ERR_PREFIX(cusafe_context_create(&c, 0), CUSAFE_ERROR_NO_DRIVER,
                "no CUDA driver found: ");
  ck_assert_uint_eq(c, CUSAFE_NULL_HANDLE);
  TU_ERR_PREFIX(cusafe_device_get_properties(&p, 0), CUSAFE_ERROR_NO_DRIVER,
                "no CUDA driver found: ");
  /* Asking again gives the same answer. */
  n = 5;
  TU_ERR(cusafe_device_count(&n), CUSAFE_ERROR_NO_DRIVER, "%s", want);
  ck_assert_int_eq(n, 0);
  ck_assert_int_eq(fake_primary_ctx_refcount(0), 0);
  TU_OK(cusafe_shutdown());
}
END_TEST

/* _i == 0: a driver that finds no device; 1: a driver with zero devices. */
START_TEST(test_no_device) {
  int n = 5;
  cusafe_context c = (cusafe_context)0x1234;
  cusafe_device_properties p;
  if (_i == 0)
    fake_set_driver(FAKE_DRIVER_NO_DEVICE);
  else
    fake_set_device_count(0);
  TU_ERR(cusafe_device_count(&n), CUSAFE_ERROR_NO_DEVICE,
         "no CUDA device found");
  ck_assert_int_eq(n, 0);
  TU_ERR(cusafe_context_create(&c, 0), CUSAFE_ERROR_NO_DEVICE,
         "no CUDA device found");
  ck_assert_uint_eq(c, CUSAFE_NULL_HANDLE);
  TU_ERR(cusafe_device_get_properties(&p, 0), CUSAFE_ERROR_NO_DEVICE,
         "no CUDA device found");
  ck_assert_int_eq(fake_primary_ctx_refcount(0), 0);
}
END_TEST

START_TEST(test_one_device) {
  int n = 0;
  cusafe_context c = CUSAFE_NULL_HANDLE;
  fake_set_device_count(1);
  TU_OK(cusafe_device_count(&n));
  ck_assert_int_eq(n, 1);
  TU_ERR(cusafe_context_create(&c, 1), CUSAFE_ERROR_INVALID_DEVICE,
         "device 1 is out of range: 1 device(s) found");
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_context_release(c));
  TU_NOTHING_LIVE();
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 13. Release order                                                         */
/* ------------------------------------------------------------------------ */

#define NORDER 7 /* the context and six children */

/* The k-th permutation of 0..n-1, in the factorial number system. */
static void nth_permutation(unsigned long k, int *perm, int n) {
  int pool[16];
  for (int i = 0; i < n; i++)
    pool[i] = i;
  for (int i = n; i > 0; i--) {
    unsigned long f = 1;
    for (int j = 2; j < i; j++)
      f *= (unsigned long)j;
    int idx = (int)(k / f);
    k %= f;
    perm[n - i] = pool[idx];
    for (int j = idx; j < i - 1; j++)
      pool[j] = pool[j + 1];
  }
}

static cusafe_status release_typed(cusafe_handle h, int which) {
  switch (which) {
  case 0: return cusafe_context_release(h);
  case 1: return cusafe_stream_release(h);
  case 2: return cusafe_event_release(h);
  default: return cusafe_buffer_release(h);
  }
}

/* Releases the context and its children in each of the 7! orders: the
 * primary context is released exactly when the last of them goes, and the
 * fake would abort on a child destroyed after it. */
START_TEST(test_release_in_every_order) {
  unsigned long nperms = 1;
  unsigned char data[512];
  tu_pattern(data, sizeof data, 1);
  for (int i = 2; i <= NORDER; i++)
    nperms *= (unsigned long)i;
  for (unsigned long k = 0; k < nperms; k++) {
    cusafe_handle h[NORDER] = {0};
    int perm[NORDER];
    nth_permutation(k, perm, NORDER);
    /* 0 context, 1 stream, 2 event, 3-5 buffers, 6 a view of 3 */
    TU_OK(cusafe_context_create(&h[0], 0));
    TU_OK(cusafe_stream_create(&h[1], h[0], CUSAFE_STREAM_NON_BLOCKING, 0));
    TU_OK(cusafe_event_create(&h[2], h[0], 0));
    TU_OK(cusafe_buffer_alloc(&h[3], h[0], CUSAFE_MEMORY_DEVICE, 512));
    TU_OK(cusafe_buffer_alloc(&h[4], h[0], CUSAFE_MEMORY_HOST_PINNED, 512));
    TU_OK(cusafe_buffer_alloc(&h[5], h[0], CUSAFE_MEMORY_MANAGED, 512));
    TU_OK(cusafe_buffer_view(&h[6], h[3], 100, 200));
    TU_OK(cusafe_buffer_write(h[3], 0, data, sizeof data));
    TU_OK(cusafe_buffer_copy(h[4], 0, h[3], 0, 512, h[1]));
    TU_OK(cusafe_event_record(h[2], h[1]));
    TU_OK(cusafe_buffer_copy(h[5], 0, h[6], 0, 200, CUSAFE_STREAM_DEFAULT));
    fake_log_clear();
    for (int i = 0; i < NORDER; i++) {
      int which = perm[i];
      TU_ASSERT(fake_primary_ctx_refcount(0) > 0,
                "order %lu: primary context released after %d of %d releases",
                k, i, NORDER);
      if (k % 2)
        TU_OK(cusafe_release(h[which]));
      else
        TU_OK(release_typed(h[which], which < 3 ? which : 3));
      /* Every handle is stale once released, the context's too: its
       * children keep the context itself alive, not the caller's handle. */
      TU_STALE(h[which]);
    }
    TU_ASSERT(fake_primary_ctx_refcount(0) == 0,
              "order %lu: primary context still retained after the last "
              "release",
              k);
    TU_NOTHING_LIVE();
  }
  printf("release order: %lu orders checked\n", nperms);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 14. Work in flight keeps its inputs alive                                 */
/* ------------------------------------------------------------------------ */

/* The last exec of `name` in the log, or -1. */
static long log_last(const char *name) {
  long found = -1, i = -1;
  while ((i = fake_log_find(name, (size_t)(i + 1))) >= 0)
    found = i;
  return found;
}

/* After the release of the source of a copy still queued on `s` (the
 * fake paused, its log cleared before the release): nothing is freed and
 * the copy has not run; once `s` is synchronised, the copy ran before the
 * source (`what`) was freed. */
static void check_copy_before_free(cusafe_stream s, size_t live,
                                   const char *what) {
  ck_assert_uint_eq(fake_live_allocations(-1), live);
  ck_assert_int_eq(fake_log_find("exec:cudaFreeAsync", 0), -1);
  ck_assert_msg(fake_log_find("exec:cudaMemcpyAsync", 0) == -1,
                "the queued copy ran at the release");

  TU_OK(cusafe_stream_synchronize(s));
  long copy = log_last("exec:cudaMemcpyAsync");
  long freed = fake_log_find("exec:cudaFreeAsync", 0);
  ck_assert_msg(copy >= 0, "the copy never ran");
  ck_assert_msg(freed > copy, "%s freed at log entry %ld, its copy ran at %ld",
                what, freed, copy);
}

START_TEST(test_release_source_of_queued_copy) {
  const size_t n = 8 * KIB;
  unsigned char *data = tu_xmalloc(n), *back = tu_xmalloc(n);
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_buffer src = CUSAFE_NULL_HANDLE, dst = CUSAFE_NULL_HANDLE;
  tu_pattern(data, n, 2);
  fake_set_paused(1);
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_stream_create(&s, c, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_alloc(&src, c, CUSAFE_MEMORY_DEVICE, n));
  TU_OK(cusafe_buffer_alloc(&dst, c, CUSAFE_MEMORY_DEVICE, n));
  TU_OK(cusafe_buffer_write_async(src, 0, data, n, s));
  TU_OK(cusafe_buffer_copy(dst, 0, src, 0, n, s));
  ck_assert_int_eq(cusafe_stream_query(s), CUSAFE_ERROR_NOT_READY);
  size_t live = fake_live_allocations(-1);
  fake_log_clear();

  TU_OK(cusafe_buffer_release(src));
  TU_STALE(src);
  check_copy_before_free(s, live, "source");
  ck_assert_uint_eq(fake_live_allocations(-1), live - 1);
  TU_OK(cusafe_buffer_read(dst, 0, back, n));
  TU_BYTES_EQ(back, data, n);

  TU_OK(cusafe_buffer_release(dst));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_context_release(c));
  TU_NOTHING_LIVE();
  free(data);
  free(back);
}
END_TEST

START_TEST(test_release_view_and_parent_of_queued_copy) {
  const size_t n = 8 * KIB;
  unsigned char *data = tu_xmalloc(n), back[1000];
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_buffer p = CUSAFE_NULL_HANDLE, v = CUSAFE_NULL_HANDLE;
  cusafe_buffer dst = CUSAFE_NULL_HANDLE;
  tu_pattern(data, n, 3);
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_stream_create(&s, c, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_alloc(&p, c, CUSAFE_MEMORY_DEVICE, n));
  TU_OK(cusafe_buffer_alloc(&dst, c, CUSAFE_MEMORY_DEVICE, 1000));
  TU_OK(cusafe_buffer_write(p, 0, data, n));
  TU_OK(cusafe_buffer_view(&v, p, 100, 1000));
  fake_set_paused(1);
  TU_OK(cusafe_buffer_copy(dst, 0, v, 0, 1000, s));
  size_t live = fake_live_allocations(-1);
  fake_log_clear();

  TU_OK(cusafe_buffer_release(v));
  TU_OK(cusafe_buffer_release(p));
  TU_STALE(v);
  TU_STALE(p);
  check_copy_before_free(s, live, "parent");
  TU_OK(cusafe_buffer_read(dst, 0, back, sizeof back));
  TU_BYTES_EQ(back, data + 100, sizeof back);
  TU_OK(cusafe_buffer_release(dst));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_context_release(c));
  TU_NOTHING_LIVE();
  free(data);
}
END_TEST

/* Pinned and managed memory are freed synchronously by CUDA: the free must
 * still come after the queued copy that reads them. */
START_TEST(test_release_host_memory_of_queued_copy) {
  const cusafe_memory kind =
      _i ? CUSAFE_MEMORY_MANAGED : CUSAFE_MEMORY_HOST_PINNED;
  const size_t n = 4 * KIB;
  unsigned char data[4096], back[4096];
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_buffer src = CUSAFE_NULL_HANDLE, dst = CUSAFE_NULL_HANDLE;
  tu_pattern(data, n, 4);
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_stream_create(&s, c, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_alloc(&src, c, kind, n));
  TU_OK(cusafe_buffer_alloc(&dst, c, CUSAFE_MEMORY_DEVICE, n));
  TU_OK(cusafe_buffer_write(src, 0, data, n));
  fake_set_paused(1);
  TU_OK(cusafe_buffer_copy(dst, 0, src, 0, n, s));
  fake_log_clear();
  TU_OK(cusafe_buffer_release(src));
  /* The copy ran before (or without) the free; the fake aborts on a read
   * of freed memory. */
  TU_OK(cusafe_buffer_read(dst, 0, back, n));
  TU_BYTES_EQ(back, data, n);
  TU_OK(cusafe_buffer_release(dst));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_context_release(c));
  fake_set_paused(0);
  TU_NOTHING_LIVE();
}
END_TEST

START_TEST(test_release_stream_and_context_with_queued_work) {
  const size_t n = 16 * KIB;
  unsigned char *data = tu_xmalloc(n), *back = tu_xmalloc(n);
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_buffer a = CUSAFE_NULL_HANDLE, b = CUSAFE_NULL_HANDLE;
  tu_pattern(data, n, 5);
  fake_set_paused(1);
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_stream_create(&s, c, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_alloc_async(&a, s, n));
  TU_OK(cusafe_buffer_alloc(&b, c, CUSAFE_MEMORY_DEVICE, n));
  TU_OK(cusafe_buffer_write_async(a, 0, data, n, s));
  TU_OK(cusafe_buffer_copy(b, 0, a, 0, n, s));
  TU_OK(cusafe_buffer_fill(b, 0, 10, 0x77, s));
  /* Everything but b goes while the work is queued. */
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_buffer_release(a));
  TU_OK(cusafe_context_release(c));
  TU_STALE(s);
  TU_STALE(c);
  ck_assert_int_gt(fake_primary_ctx_refcount(0), 0);
  memset(data, 0x77, 10);
  TU_OK(cusafe_buffer_read(b, 0, back, n));
  TU_BYTES_EQ(back, data, n);
  TU_OK(cusafe_buffer_release(b));
  ck_assert_int_eq(fake_primary_ctx_refcount(0), 0);
  TU_NOTHING_LIVE();
  free(data);
  free(back);
}
END_TEST

/* A process that exits with work queued: the exit synchronises first. */
START_TEST(test_shutdown_with_queued_work) {
  struct world w;
  world_make(&w);
  fake_set_paused(1);
  TU_OK(cusafe_buffer_copy(w.dev1, 0, w.dev, 0, 4096, w.stream));
  TU_OK(cusafe_buffer_fill(w.dev, 0, 4096, 0, w.stream));
  TU_OK(cusafe_buffer_release(w.dev));
  TU_OK(cusafe_buffer_release(w.view));
  fake_log_clear();
  TU_OK(cusafe_shutdown());
  long last_work = log_last("exec:cudaMemsetAsync");
  ck_assert_msg(last_work >= 0, "queued work never ran");
  long first_free = fake_log_find("exec:cudaFreeAsync", 0);
  ck_assert_msg(first_free > last_work,
                "memory freed at log entry %ld, queued work ran at %ld",
                first_free, last_work);
  TU_NOTHING_LIVE();
}
END_TEST

/* Memory of another owner, wrapped: its release function, once, after the
 * work queued on it -- at the last release, or in the shutdown. */
struct wrapped {
  int calls;
  long work_ran; /* the log entry of the queued fill, when release ran */
  int torn_down; /* whether the runtime was torn down when release ran */
};

static void wrapped_release(void *user) {
  struct wrapped *w = user;
  w->calls++;
  w->work_ran = fake_log_find("exec:cudaMemsetAsync", 0);
  w->torn_down = fake_torn_down();
}

/* Wraps the memory of a new buffer of 4096 bytes, which *mem keeps. */
static cusafe_buffer wrap_memory(cusafe_context ctx, cusafe_buffer *mem,
                                 struct wrapped *w) {
  void *ptr = NULL;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_alloc(mem, ctx, CUSAFE_MEMORY_DEVICE, 4096));
  TU_OK(cusafe_buffer_interop_pointer(&ptr, *mem));
  TU_OK(cusafe_buffer_wrap(&b, ctx, CUSAFE_MEMORY_DEVICE, ptr, 4096,
                           wrapped_release, w));
  return b;
}

/* A world, and wrapped memory with a fill queued on it, paused. */
static cusafe_buffer wrap_with_work(struct world *w, cusafe_buffer *mem,
                                    struct wrapped *o) {
  world_make(w);
  cusafe_buffer b = wrap_memory(w->ctx, mem, o);
  fake_set_paused(1);
  fake_log_clear();
  TU_OK(cusafe_buffer_fill(b, 0, 4096, 7, w->stream));
  return b;
}

START_TEST(test_wrapped_release_waits_for_work) {
  struct world w;
  struct wrapped o = {0, -1, 0};
  cusafe_buffer mem = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = wrap_with_work(&w, &mem, &o);
  TU_OK(cusafe_buffer_release(b));
  ck_assert_int_eq(o.calls, 1);
  ck_assert_msg(o.work_ran >= 0, "released before the queued fill ran");
  ck_assert_int_eq(fake_log_count("cudaFreeAsync"), 0); /* not cusafe's */
  fake_set_paused(0);
  TU_OK(cusafe_buffer_release(mem));
  world_release(&w);
  TU_NOTHING_LIVE();
}
END_TEST

START_TEST(test_wrapped_release_in_shutdown) {
  struct world w;
  struct wrapped o = {0, -1, 0};
  cusafe_buffer mem = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = wrap_with_work(&w, &mem, &o);
  TU_OK(cusafe_shutdown());
  ck_assert_int_eq(o.calls, 1);
  ck_assert_msg(o.work_ran >= 0, "released before the queued fill ran");
  ck_assert_int_eq(o.torn_down, 0);
  TU_OK(cusafe_buffer_release(b)); /* a no-op now: never twice */
  ck_assert_int_eq(o.calls, 1);
  TU_NOTHING_LIVE();
}
END_TEST

static struct wrapped exit_wrapped;

/* Registered before CUDA's first call: runs after cusafe's exit handler
 * and the runtime's teardown. */
static void check_wrapped_at_exit(void) {
  if (exit_wrapped.calls != 1 || exit_wrapped.torn_down) {
    fprintf(stderr, "release ran %d times, %s the runtime's teardown\n",
            exit_wrapped.calls, exit_wrapped.torn_down ? "after" : "before");
    _exit(TU_CHILD_FAILED);
  }
}

static void exit_with_wrapped(void *arg) {
  (void)arg;
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_buffer mem = CUSAFE_NULL_HANDLE;
  atexit(check_wrapped_at_exit);
  TU_OK(cusafe_context_create(&ctx, 0));
  (void)wrap_memory(ctx, &mem, &exit_wrapped);
  exit(0);
}

/* A program that exits with wrapped memory: its owner gets it back from
 * the ordered shutdown, before the runtime's teardown, once. */
START_TEST(test_wrapped_release_at_exit) {
  CHECK_CHILD_EXITED_0(tu_run_in_child(exit_with_wrapped, NULL, NULL, 0));
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 15. Ordering across streams                                               */
/* ------------------------------------------------------------------------ */

/* b was last used on A, c on B: copying b into c on B must make B wait for
 * A, with an event record and a stream wait between the two calls. */
START_TEST(test_moving_to_another_stream_waits) {
  const size_t n = 4 * KIB;
  unsigned char back[4096], want[4096];
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream sa = CUSAFE_NULL_HANDLE, sb = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE, d = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_stream_create(&sa, c, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_create(&sb, c, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_alloc(&b, c, CUSAFE_MEMORY_DEVICE, n));
  TU_OK(cusafe_buffer_alloc(&d, c, CUSAFE_MEMORY_DEVICE, n));
  TU_OK(cusafe_buffer_fill(b, 0, n, 0x01, sa));
  TU_OK(cusafe_buffer_fill(d, 0, n, 0x02, sb));
  TU_OK(cusafe_stream_synchronize(sa));
  TU_OK(cusafe_stream_synchronize(sb));

  fake_set_paused(1);
  fake_log_clear();
  TU_OK(cusafe_buffer_fill(b, 0, n, 0x5e, sa));
  TU_OK(cusafe_buffer_copy(d, 0, b, 0, n, sb));
  long set = fake_log_find("cudaMemsetAsync", 0);
  long copy = fake_log_find("cudaMemcpyAsync", 0);
  ck_assert_msg(set >= 0 && copy > set, "calls: memset %ld, memcpy %ld", set,
                copy);
  long record = fake_log_find("cudaEventRecord", (size_t)set);
  long wait = fake_log_find("cudaStreamWaitEvent", (size_t)set);
  ck_assert_msg(record > set && record < copy,
                "no cudaEventRecord between the fill on A (%ld) and the copy "
                "on B (%ld): %ld",
                set, copy, record);
  ck_assert_msg(wait > record && wait < copy,
                "no cudaStreamWaitEvent after the record (%ld) and before the "
                "copy on B (%ld): %ld",
                record, copy, wait);
  /* B alone is synchronised: it must run A's fill first. */
  TU_OK(cusafe_stream_synchronize(sb));
  fake_set_paused(0);
  memset(want, 0x5e, sizeof want);
  TU_OK(cusafe_buffer_read(d, 0, back, n));
  TU_BYTES_EQ(back, want, n);
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_buffer_release(d));
  TU_OK(cusafe_stream_release(sa));
  TU_OK(cusafe_stream_release(sb));
  TU_OK(cusafe_context_release(c));
  TU_NOTHING_LIVE();
}
END_TEST

START_TEST(test_same_stream_adds_no_synchronisation) {
  const size_t n = 4 * KIB;
  unsigned char back[4096], want[4096];
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream sa = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE, d = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_stream_create(&sa, c, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_alloc_async(&b, sa, n));
  TU_OK(cusafe_buffer_alloc_async(&d, sa, n));
  TU_OK(cusafe_buffer_fill(d, 0, n, 0x00, sa));

  fake_set_paused(1);
  fake_log_clear();
  TU_OK(cusafe_buffer_fill(b, 0, n, 0x10, sa));
  TU_OK(cusafe_buffer_fill(b, 0, n / 2, 0x20, sa));
  TU_OK(cusafe_buffer_copy(b, n / 2, b, 0, n / 4, sa));
  TU_OK(cusafe_buffer_copy(d, 0, b, 0, n, sa));
  TU_OK(cusafe_buffer_fill(d, n - 1, 1, 0x30, sa));
  ck_assert_uint_eq(fake_log_count("cudaEventRecord"), 0);
  ck_assert_uint_eq(fake_log_count("cudaStreamWaitEvent"), 0);
  ck_assert_uint_eq(fake_log_count("cudaMemsetAsync"), 3);
  ck_assert_uint_eq(fake_log_count("cudaMemcpyAsync"), 2);
  TU_OK(cusafe_stream_synchronize(sa));
  fake_set_paused(0);
  memset(want, 0x20, n / 2);
  memset(want + n / 2, 0x20, n / 4);
  memset(want + 3 * n / 4, 0x10, n / 4);
  want[n - 1] = 0x30;
  TU_OK(cusafe_buffer_read(d, 0, back, n));
  TU_BYTES_EQ(back, want, n);
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_buffer_release(d));
  TU_OK(cusafe_stream_release(sa));
  TU_OK(cusafe_context_release(c));
  TU_NOTHING_LIVE();
}
END_TEST

/* The synchronous read waits for work queued on any stream. */
START_TEST(test_sync_read_waits_for_other_streams) {
  const size_t n = 4 * KIB;
  unsigned char data[4096], back[4096];
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream sa = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  tu_pattern(data, n, 6);
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_stream_create(&sa, c, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_alloc(&b, c, CUSAFE_MEMORY_DEVICE, n));
  fake_set_paused(1);
  TU_OK(cusafe_buffer_write_async(b, 0, data, n, sa));
  TU_OK(cusafe_buffer_fill(b, 0, 100, 0xab, sa));
  TU_OK(cusafe_buffer_read(b, 0, back, n));
  memset(data, 0xab, 100);
  TU_BYTES_EQ(back, data, n);
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(sa));
  TU_OK(cusafe_context_release(c));
  TU_NOTHING_LIVE();
}
END_TEST

/* Pageable host memory: write_async's source is reusable at return, and
 * read_async's destination is filled at return, even with the GPU stalled
 * and the work queued on another stream. */
START_TEST(test_async_pageable_copies_are_staged) {
  const size_t n = 4 * KIB;
  unsigned char data[4096], src[4096], back[4096];
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream sa = CUSAFE_NULL_HANDLE, sb = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  tu_pattern(data, n, 7);
  memcpy(src, data, n);
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_stream_create(&sa, c, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_create(&sb, c, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_alloc(&b, c, CUSAFE_MEMORY_DEVICE, n));
  fake_set_paused(1);
  TU_OK(cusafe_buffer_write_async(b, 0, src, n, sa));
  memset(src, 0, n);
  TU_OK(cusafe_buffer_fill(b, n - 8, 8, 0xcd, sa));
  memset(back, 0, n);
  TU_OK(cusafe_buffer_read_async(b, 0, back, n, sb));
  memset(data + n - 8, 0xcd, 8);
  TU_BYTES_EQ(back, data, n);
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(sa));
  TU_OK(cusafe_stream_release(sb));
  TU_OK(cusafe_context_release(c));
  TU_NOTHING_LIVE();
}
END_TEST

START_TEST(test_queries_report_pending_work) {
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_event e1 = CUSAFE_NULL_HANDLE, e2 = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  float ms = -1.0f;
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_stream_create(&s, c, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_event_create(&e1, c, 0));
  TU_OK(cusafe_event_create(&e2, c, 0));
  TU_OK(cusafe_buffer_alloc_async(&b, s, 4096));
  TU_OK(cusafe_stream_synchronize(s));
  fake_set_paused(1);
  TU_OK(cusafe_event_record(e1, s));
  TU_OK(cusafe_buffer_fill(b, 0, 4096, 1, s));
  TU_OK(cusafe_event_record(e2, s));
  TU_ERR(cusafe_stream_query(s), CUSAFE_ERROR_NOT_READY,
         "work is still pending");
  TU_ERR(cusafe_event_query(e2), CUSAFE_ERROR_NOT_READY,
         "work is still pending");
  TU_ERR(cusafe_event_elapsed_ms(&ms, e1, e2), CUSAFE_ERROR_NOT_READY,
         "work is still pending");
  TU_OK(cusafe_event_synchronize(e2));
  TU_OK(cusafe_event_query(e2));
  TU_OK(cusafe_stream_query(s));
  TU_OK(cusafe_event_elapsed_ms(&ms, e1, e2));
  ck_assert_float_gt(ms, 0.0f);
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_event_release(e1));
  TU_OK(cusafe_event_release(e2));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_context_release(c));
  TU_NOTHING_LIVE();
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 16. CUDA failures                                                         */
/* ------------------------------------------------------------------------ */

START_TEST(test_allocation_failure_is_out_of_memory) {
  static const struct {
    const char *function;
    cusafe_memory kind;
  } cases[] = {{"cudaMallocAsync", CUSAFE_MEMORY_DEVICE},
               {"cudaMallocHost", CUSAFE_MEMORY_HOST_PINNED},
               {"cudaMallocManaged", CUSAFE_MEMORY_MANAGED}};
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_stream_create(&s, c, 0, 0));
  for (size_t i = 0; i < 3; i++) {
    cusafe_buffer b = (cusafe_buffer)0x1234;
    fake_fail_function(cases[i].function, cudaErrorMemoryAllocation);
    TU_ERR(cusafe_buffer_alloc(&b, c, cases[i].kind, 4096),
           CUSAFE_ERROR_OUT_OF_MEMORY, "%s failed: out of memory",
           cases[i].function);
    ck_assert_int_eq(cusafe_last_cuda_error(), cudaErrorMemoryAllocation);
    ck_assert_uint_eq(b, CUSAFE_NULL_HANDLE);
    if (cases[i].kind == CUSAFE_MEMORY_DEVICE) {
      b = (cusafe_buffer)0x1234;
      TU_ERR(cusafe_buffer_alloc_async(&b, s, 4096), CUSAFE_ERROR_OUT_OF_MEMORY,
             "cudaMallocAsync failed: out of memory");
      ck_assert_int_eq(cusafe_last_cuda_error(), cudaErrorMemoryAllocation);
      ck_assert_uint_eq(b, CUSAFE_NULL_HANDLE);
    }
    fake_fail_clear();
    ck_assert_uint_eq(fake_live_allocations(-1), 0);
    TU_OK(cusafe_buffer_alloc(&b, c, cases[i].kind, 4096));
    TU_OK(cusafe_buffer_release(b));
  }
  /* A failure that is not CUDA's resets the CUDA error. */
  TU_ERR(cusafe_buffer_alloc(NULL, c, CUSAFE_MEMORY_DEVICE, 1),
         CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  ck_assert_int_eq(cusafe_last_cuda_error(), 0);
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_context_release(c));
  TU_NOTHING_LIVE();
}
END_TEST

START_TEST(test_creation_failure_is_cuda_error) {
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_stream s = (cusafe_stream)0x1234;
  cusafe_event e = (cusafe_event)0x1234;
  TU_OK(cusafe_context_create(&c, 0));
  size_t streams = fake_live_streams(-1);
  fake_fail_function("cudaStreamCreateWithPriority", cudaErrorUnknown);
  TU_ERR(cusafe_stream_create(&s, c, 0, 0), CUSAFE_ERROR_CUDA,
         "cudaStreamCreateWithPriority failed: unknown error");
  ck_assert_int_eq(cusafe_last_cuda_error(), cudaErrorUnknown);
  ck_assert_uint_eq(s, CUSAFE_NULL_HANDLE);
  ck_assert_uint_eq(fake_live_streams(-1), streams);
  fake_fail_clear();
  fake_fail_function("cudaEventCreateWithFlags", cudaErrorInvalidValue);
  TU_ERR(cusafe_event_create(&e, c, 0), CUSAFE_ERROR_CUDA,
         "cudaEventCreateWithFlags failed: invalid argument");
  ck_assert_int_eq(cusafe_last_cuda_error(), cudaErrorInvalidValue);
  ck_assert_uint_eq(e, CUSAFE_NULL_HANDLE);
  fake_fail_clear();
  TU_OK(cusafe_stream_create(&s, c, 0, 0));
  TU_OK(cusafe_event_create(&e, c, 0));
  TU_OK(cusafe_event_release(e));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_context_release(c));
  TU_NOTHING_LIVE();
}
END_TEST

/* A context that cannot be completed gives its primary context back. */
START_TEST(test_context_creation_failure_leaks_nothing) {
  static const char *const fail[] = {"cudaStreamCreateWithPriority",
                                     "cuDevicePrimaryCtxRetain"};
  for (size_t i = 0; i < 2; i++) {
    cusafe_context c = (cusafe_context)0x1234;
    fake_fail_function(fail[i], cudaErrorUnknown);
    cusafe_status st = cusafe_context_create(&c, 0);
    char msg[512];
    tu_copy_message(msg, sizeof msg);
    ck_assert_msg(st == CUSAFE_ERROR_CUDA,
                  "context_create with %s failing returned %d: %s", fail[i],
                  (int)st, msg);
    ck_assert_msg(strncmp(msg, fail[i], strlen(fail[i])) == 0,
                  "message \"%s\" does not name %s", msg, fail[i]);
    ck_assert_uint_eq(c, CUSAFE_NULL_HANDLE);
    TU_NOTHING_LIVE();
    fake_fail_clear();
  }
  cusafe_context c = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_context_release(c));
  TU_NOTHING_LIVE();
}
END_TEST

START_TEST(test_managed_memory_unsupported) {
  cusafe_context c0 = CUSAFE_NULL_HANDLE, c1 = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = (cusafe_buffer)0x1234;
  cusafe_device_properties p;
  fake_set_managed_supported(0, 0);
  TU_OK(cusafe_device_get_properties(&p, 0));
  ck_assert_int_eq(p.managed_memory, 0);
  TU_OK(cusafe_context_create(&c0, 0));
  TU_ERR(cusafe_buffer_alloc(&b, c0, CUSAFE_MEMORY_MANAGED, 4096),
         CUSAFE_ERROR_NOT_SUPPORTED,
         "device 0 does not support managed memory");
  ck_assert_uint_eq(b, CUSAFE_NULL_HANDLE);
  /* Device 1 still has it. */
  TU_OK(cusafe_context_create(&c1, 1));
  TU_OK(cusafe_buffer_alloc(&b, c1, CUSAFE_MEMORY_MANAGED, 4096));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_context_release(c0));
  TU_OK(cusafe_context_release(c1));
  TU_NOTHING_LIVE();
}
END_TEST

START_TEST(test_memory_limit) {
  const size_t limit = 64 * KIB;
  cusafe_context c = CUSAFE_NULL_HANDLE;
  cusafe_buffer a = CUSAFE_NULL_HANDLE, b = (cusafe_buffer)0x1234;
  cusafe_device_properties p;
  fake_set_memory_limit(0, limit);
  TU_OK(cusafe_device_get_properties(&p, 0));
  ck_assert_uint_eq(p.total_memory, limit);
  TU_OK(cusafe_context_create(&c, 0));
  TU_ERR(cusafe_buffer_alloc(&b, c, CUSAFE_MEMORY_DEVICE, limit + 1),
         CUSAFE_ERROR_OUT_OF_MEMORY,
         "allocation of %zu bytes exceeds the %zu bytes of device 0", limit + 1,
         limit);
  ck_assert_int_eq(cusafe_last_cuda_error(), 0);
  ck_assert_uint_eq(b, CUSAFE_NULL_HANDLE);
  TU_OK(cusafe_buffer_alloc(&a, c, CUSAFE_MEMORY_DEVICE, 40 * KIB));
  TU_ERR(cusafe_buffer_alloc(&b, c, CUSAFE_MEMORY_DEVICE, 40 * KIB),
         CUSAFE_ERROR_OUT_OF_MEMORY, "cudaMallocAsync failed: out of memory");
  ck_assert_int_eq(cusafe_last_cuda_error(), cudaErrorMemoryAllocation);
  ck_assert_uint_eq(b, CUSAFE_NULL_HANDLE);
  TU_ERR(cusafe_buffer_alloc(&b, c, CUSAFE_MEMORY_HOST_PINNED, 40 * KIB),
         CUSAFE_ERROR_OUT_OF_MEMORY, "cudaMallocHost failed: out of memory");
  /* The memory comes back with the release. */
  TU_OK(cusafe_buffer_release(a));
  TU_OK(cusafe_buffer_alloc(&b, c, CUSAFE_MEMORY_DEVICE, 40 * KIB));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_context_release(c));
  TU_NOTHING_LIVE();
}
END_TEST

START_TEST(test_sticky_error) {
  struct world w;
  world_make(&w);
  TU_OK(cusafe_stream_synchronize(w.stream));
  fake_set_sticky_error(0, cudaErrorIllegalAddress);
  TU_ERR(cusafe_stream_synchronize(w.stream), CUSAFE_ERROR_CUDA,
         "cudaStreamSynchronize failed: "
         "an illegal memory access was encountered");
  ck_assert_int_eq(cusafe_last_cuda_error(), cudaErrorIllegalAddress);
  TU_STATUS(cusafe_context_synchronize(w.ctx), CUSAFE_ERROR_CUDA);
  ck_assert_int_eq(cusafe_last_cuda_error(), cudaErrorIllegalAddress);
  TU_STATUS(cusafe_event_synchronize(w.end), CUSAFE_ERROR_CUDA);
  ck_assert_int_eq(cusafe_last_cuda_error(), cudaErrorIllegalAddress);
  /* Device 1 is unaffected. */
  TU_OK(cusafe_context_synchronize(w.ctx1));
  /* Releases may report the broken context but must free everything. */
  const cusafe_handle all[WORLD_NHANDLES] = WORLD_HANDLES(&w);
  for (int i = 0; i < WORLD_NHANDLES; i++) {
    cusafe_status st = cusafe_release(all[i]);
    ck_assert_msg(st == CUSAFE_SUCCESS || st == CUSAFE_ERROR_CUDA,
                  "release %d returned %d: %s", i, (int)st,
                  cusafe_last_error_message());
    TU_STALE(all[i]);
  }
  cusafe_status st = cusafe_shutdown();
  ck_assert_msg(st == CUSAFE_SUCCESS || st == CUSAFE_ERROR_CUDA,
                "shutdown returned %d", (int)st);
  TU_NOTHING_LIVE();
}
END_TEST

START_TEST(test_sticky_error_then_shutdown) {
  struct world w;
  world_make(&w);
  fake_set_paused(1);
  TU_OK(cusafe_buffer_fill(w.dev, 0, 4096, 3, w.stream));
  fake_set_sticky_error(0, cudaErrorIllegalAddress);
  fake_set_sticky_error(1, cudaErrorLaunchFailure);
  cusafe_status st = cusafe_shutdown();
  ck_assert_msg(st == CUSAFE_SUCCESS || st == CUSAFE_ERROR_CUDA,
                "shutdown returned %d", (int)st);
  TU_NOTHING_LIVE();
  check_every_release_noop(&w);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 17. Fault injection                                                       */
/* ------------------------------------------------------------------------ */

struct composite {
  cusafe_context ctx;
  cusafe_stream s;
  cusafe_event e;
  cusafe_buffer dev, pinned, managed, view, async, dev1;
  cusafe_context ctx1;
};

/* Runs the steps of a typical use until one fails; returns its status and
 * counts the steps started in *step. */
static cusafe_status composite_run(void *state, int *step) {
  struct composite *c = state;
  unsigned char data[3000], back[3000];
  tu_pattern(data, sizeof data, 9);
  TU_STEP_NEW(step, c->ctx, cusafe_context_create(&c->ctx, 0));
  TU_STEP_NEW(
      step, c->s,
      cusafe_stream_create(&c->s, c->ctx, CUSAFE_STREAM_NON_BLOCKING, -1));
  TU_STEP_NEW(step, c->e, cusafe_event_create(&c->e, c->ctx, 0));
  TU_STEP_NEW(step, c->dev,
              cusafe_buffer_alloc(&c->dev, c->ctx, CUSAFE_MEMORY_DEVICE, 4096));
  TU_STEP_NEW(
      step, c->pinned,
      cusafe_buffer_alloc(&c->pinned, c->ctx, CUSAFE_MEMORY_HOST_PINNED, 4096));
  TU_STEP_NEW(
      step, c->managed,
      cusafe_buffer_alloc(&c->managed, c->ctx, CUSAFE_MEMORY_MANAGED, 4096));
  TU_STEP_NEW(step, c->view, cusafe_buffer_view(&c->view, c->dev, 100, 3000));
  TU_STEP_NEW(step, c->async, cusafe_buffer_alloc_async(&c->async, c->s, 4096));
  TU_STEP_NEW(step, c->ctx1, cusafe_context_create(&c->ctx1, 1));
  TU_STEP_NEW(
      step, c->dev1,
      cusafe_buffer_alloc(&c->dev1, c->ctx1, CUSAFE_MEMORY_DEVICE, 4096));
  TU_STEP(step, cusafe_buffer_write(c->view, 0, data, sizeof data));
  TU_STEP(step, cusafe_buffer_copy(c->pinned, 0, c->dev, 100, 3000, c->s));
  TU_STEP(step, cusafe_buffer_copy(c->managed, 0, c->pinned, 0, 3000,
                                   CUSAFE_STREAM_DEFAULT));
  TU_STEP(step, cusafe_buffer_copy(c->async, 0, c->managed, 0, 3000, c->s));
  TU_STEP(step, cusafe_buffer_fill(c->async, 3000, 1096, 0x11, c->s));
  TU_STEP(step, cusafe_buffer_copy(c->dev1, 0, c->async, 0, 4096, c->s));
  TU_STEP(step, cusafe_event_record(c->e, c->s));
  TU_STEP(step, cusafe_event_synchronize(c->e));
  TU_STEP(step, cusafe_buffer_read(c->dev1, 0, back, sizeof back));
  TU_ASSERT(memcmp(back, data, sizeof back) == 0,
            "every step succeeded but the data arrived corrupted");
  TU_STEP(step, cusafe_stream_synchronize(c->s));
  return CUSAFE_SUCCESS;
}

/* The context first: children keep it. */
static void composite_release(void *state) {
  struct composite *c = state;
  const cusafe_handle all[] = {c->ctx,     c->ctx1,  c->view, c->dev, c->pinned,
                               c->managed, c->async, c->dev1, c->e,   c->s};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    TU_OK(cusafe_release(all[i]));
}

static const struct tu_composite composite = {sizeof(struct composite),
                                              composite_run, composite_release};

START_TEST(test_fault_injection_single) { tu_fault_loop(&composite, 0); }
END_TEST

START_TEST(test_fault_injection_persistent) { tu_fault_loop(&composite, 1); }
END_TEST

/* ------------------------------------------------------------------------ */
/* 18. Shutdown and exit                                                     */
/* ------------------------------------------------------------------------ */

START_TEST(test_shutdown_destroys_everything) {
  struct world w;
  world_make(&w);
  /* Extra references do not keep anything past the shutdown. */
  TU_OK(cusafe_retain(w.dev));
  TU_OK(cusafe_retain(w.ctx));
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
  check_every_call_refused(&w, CUSAFE_ERROR_SHUTDOWN, shutdown_message);
  check_every_release_noop(&w);
  TU_OK(cusafe_shutdown());
  /* The stateless functions still work. */
  ck_assert_str_eq(cusafe_version_string(), "0.1.0");
  ck_assert_str_eq(cusafe_status_string((cusafe_status)999), "unknown status");
  TU_ERR(cusafe_buffer_read(w.dev, 0, w.data, 1), CUSAFE_ERROR_SHUTDOWN, "%s",
         shutdown_message);
  ck_assert_str_eq(cusafe_last_error_message(), shutdown_message);
  ck_assert_int_eq(cusafe_last_cuda_error(), 0);
}
END_TEST

START_TEST(test_shutdown_twice) {
  cusafe_context c = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&c, 0));
  TU_OK(cusafe_shutdown());
  TU_OK(cusafe_shutdown());
  TU_OK(cusafe_context_release(c));
  TU_NOTHING_LIVE();
}
END_TEST

START_TEST(test_shutdown_before_first_use) {
  int n = 7;
  TU_OK(cusafe_shutdown());
  TU_ERR(cusafe_device_count(&n), CUSAFE_ERROR_SHUTDOWN, "%s",
         shutdown_message);
  ck_assert_uint_eq(fake_call_count(), 0);
  TU_OK(cusafe_shutdown());
}
END_TEST

/* Counts from the fake's log that every CUDA object made was destroyed.
 * Runs after the fake's teardown, which the log survives; any CUDA call
 * after the teardown would have aborted the process. */
static void check_balanced_at_exit(void) {
  const struct {
    const char *made[3];
    const char *gone[3];
  } pairs[] = {
      {{"cuDevicePrimaryCtxRetain"}, {"cuDevicePrimaryCtxRelease"}},
      {{"cudaStreamCreateWithPriority"}, {"cudaStreamDestroy"}},
      {{"cudaEventCreateWithFlags"}, {"cudaEventDestroy"}},
      {{"cudaMallocAsync", "cudaMallocHost", "cudaMallocManaged"},
       {"cudaFreeAsync", "cudaFreeHost", "cudaFree"}},
  };
  if (!fake_torn_down()) {
    fprintf(stderr, "exit handler ran before the runtime's teardown\n");
    _exit(TU_CHILD_FAILED);
  }
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    size_t made = 0, gone = 0;
    for (int j = 0; j < 3; j++) {
      if (pairs[i].made[j])
        made += fake_log_count(pairs[i].made[j]);
      if (pairs[i].gone[j])
        gone += fake_log_count(pairs[i].gone[j]);
    }
    if (made == 0 || made != gone) {
      fprintf(stderr, "at exit: %zu made by %s..., %zu destroyed by %s...\n",
              made, pairs[i].made[0], gone, pairs[i].gone[0]);
      _exit(TU_CHILD_FAILED);
    }
  }
}

static void exit_with_live_objects(void *arg) {
  struct world w;
  (void)arg;
  /* Registered before CUDA's first call: runs after its teardown. */
  atexit(check_balanced_at_exit);
  world_make(&w);
  TU_OK(cusafe_retain(w.view));
  fake_set_paused(1);
  TU_OK(cusafe_buffer_copy(w.dev1, 0, w.dev, 0, 4096, w.stream));
  TU_OK(cusafe_buffer_release(w.dev));
  exit(0);
}

/* The library's exit handler runs before the runtime's teardown, destroys
 * everything, and touches nothing after it. */
START_TEST(test_exit_with_live_handles) {
  CHECK_CHILD_EXITED_0(tu_run_in_child(exit_with_live_objects, NULL, NULL, 0));
}
END_TEST

static struct world exit_world;

/* Registered before CUDA's first call: runs after the library's exit
 * handler and after the runtime's teardown. */
static void release_late_at_exit(void) {
  const cusafe_handle all[WORLD_NHANDLES] = WORLD_HANDLES(&exit_world);
  for (int i = 0; i < WORLD_NHANDLES; i++)
    if (cusafe_release(all[i]) != CUSAFE_SUCCESS) {
      fprintf(stderr, "release at exit failed: %s\n",
              cusafe_last_error_message());
      _exit(TU_CHILD_FAILED);
    }
  int n = 0;
  if (cusafe_device_count(&n) != CUSAFE_ERROR_SHUTDOWN) {
    fprintf(stderr, "device_count at exit: \"%s\"\n",
            cusafe_last_error_message());
    _exit(TU_CHILD_FAILED);
  }
}

static void exit_then_release(void *arg) {
  (void)arg;
  atexit(release_late_at_exit);
  world_make(&exit_world);
  exit(0);
}

/* A release from a late exit handler (a binding's finaliser) is a silent
 * no-op: it must not call the runtime after its teardown. */
START_TEST(test_release_after_exit_is_noop) {
  CHECK_CHILD_EXITED_0(tu_run_in_child(exit_then_release, NULL, NULL, 0));
}
END_TEST

static void exit_after_shutdown(void *arg) {
  struct world w;
  (void)arg;
  atexit(check_balanced_at_exit);
  world_make(&w);
  TU_OK(cusafe_shutdown());
  exit(0);
}

START_TEST(test_exit_after_shutdown) {
  CHECK_CHILD_EXITED_0(tu_run_in_child(exit_after_shutdown, NULL, NULL, 0));
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 19. Fork                                                                  */
/* ------------------------------------------------------------------------ */

static struct world fork_world;

static void forked_child_is_refused(void *arg) {
  (void)arg;
  unsigned long calls = fake_call_count();
  check_every_call_refused(&fork_world, CUSAFE_ERROR_FORKED, forked_message);
  check_every_release_noop(&fork_world);
  TU_ASSERT(fake_call_count() == calls, "the child called CUDA");
  /* The runtime is unusable here: any CUDA call from the library's exit
   * handler now aborts the child. */
  fake_teardown_now();
}

START_TEST(test_fork_after_init) {
  unsigned char back[4096];
  world_make(&fork_world);
  TU_OK(cusafe_stream_synchronize(fork_world.stream));
  CHECK_CHILD_EXITED_0(tu_run_in_child(forked_child_is_refused, NULL, NULL, 0));
  /* The parent goes on as if nothing happened. */
  TU_OK(cusafe_buffer_read(fork_world.dev1, 0, back, sizeof back));
  TU_BYTES_EQ(back, fork_world.data, sizeof back);
  TU_OK(cusafe_buffer_write(fork_world.view, 0, back, 256));
  world_release(&fork_world);
  TU_NOTHING_LIVE();
}
END_TEST

static void forked_child_device_count(void *arg) {
  int n = 5;
  (void)arg;
  TU_ERR(cusafe_device_count(&n), CUSAFE_ERROR_FORKED, "%s", forked_message);
  TU_OK(cusafe_release(CUSAFE_NULL_HANDLE));
  fake_teardown_now();
}

/* Counting devices initialises CUDA: a child after that is refused too. */
START_TEST(test_fork_after_device_count) {
  int n = 0;
  TU_OK(cusafe_device_count(&n));
  CHECK_CHILD_EXITED_0(
      tu_run_in_child(forked_child_device_count, NULL, NULL, 0));
  TU_OK(cusafe_device_count(&n));
  ck_assert_int_eq(n, 2);
}
END_TEST

static void use_library(void *arg) {
  (void)arg;
  tu_composite_succeeds(&composite);
}

/* A child forked before CUDA was initialised is an ordinary process. */
START_TEST(test_fork_before_init) {
  /* Stateless calls do not initialise CUDA. */
  ck_assert_str_eq(cusafe_version_string(), "0.1.0");
  (void)cusafe_status_string(CUSAFE_SUCCESS);
  CHECK_CHILD_EXITED_0(tu_run_in_child(use_library, NULL, NULL, 0));
  use_library(NULL);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Suite                                                                     */
/* ------------------------------------------------------------------------ */

static Suite *fake_suite(void) {
  Suite *s = suite_create("fake");
  TCase *tc;

  tc = tcase_create("driver");
  tcase_add_test(tc, test_no_driver);
  tcase_add_loop_test(tc, test_no_device, 0, 2);
  tcase_add_test(tc, test_one_device);
  suite_add_tcase(s, tc);

  tc = tcase_create("release_order");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_release_in_every_order);
  suite_add_tcase(s, tc);

  tc = tcase_create("in_flight");
  tcase_add_test(tc, test_release_source_of_queued_copy);
  tcase_add_test(tc, test_release_view_and_parent_of_queued_copy);
  tcase_add_loop_test(tc, test_release_host_memory_of_queued_copy, 0, 2);
  tcase_add_test(tc, test_release_stream_and_context_with_queued_work);
  tcase_add_test(tc, test_shutdown_with_queued_work);
  tcase_add_test(tc, test_wrapped_release_waits_for_work);
  tcase_add_test(tc, test_wrapped_release_in_shutdown);
  tcase_add_test(tc, test_wrapped_release_at_exit);
  suite_add_tcase(s, tc);

  tc = tcase_create("ordering");
  tcase_add_test(tc, test_moving_to_another_stream_waits);
  tcase_add_test(tc, test_same_stream_adds_no_synchronisation);
  tcase_add_test(tc, test_sync_read_waits_for_other_streams);
  tcase_add_test(tc, test_async_pageable_copies_are_staged);
  tcase_add_test(tc, test_queries_report_pending_work);
  suite_add_tcase(s, tc);

  tc = tcase_create("cuda_failures");
  tcase_add_test(tc, test_allocation_failure_is_out_of_memory);
  tcase_add_test(tc, test_creation_failure_is_cuda_error);
  tcase_add_test(tc, test_context_creation_failure_leaks_nothing);
  tcase_add_test(tc, test_managed_memory_unsupported);
  tcase_add_test(tc, test_memory_limit);
  tcase_add_test(tc, test_sticky_error);
  tcase_add_test(tc, test_sticky_error_then_shutdown);
  suite_add_tcase(s, tc);

  tc = tcase_create("fault_injection");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_fault_injection_single);
  tcase_add_test(tc, test_fault_injection_persistent);
  suite_add_tcase(s, tc);

  tc = tcase_create("shutdown");
  tcase_add_test(tc, test_shutdown_destroys_everything);
  tcase_add_test(tc, test_shutdown_twice);
  tcase_add_test(tc, test_shutdown_before_first_use);
  tcase_add_test(tc, test_exit_with_live_handles);
  tcase_add_test(tc, test_release_after_exit_is_noop);
  tcase_add_test(tc, test_exit_after_shutdown);
  suite_add_tcase(s, tc);

  tc = tcase_create("fork");
  tcase_add_test(tc, test_fork_after_init);
  tcase_add_test(tc, test_fork_after_device_count);
  tcase_add_test(tc, test_fork_before_init);
  suite_add_tcase(s, tc);

  return s;
}

int main(void) {
  /* Every test needs a fresh library and a fresh fake. */
  return tu_run_suite(fake_suite(), CK_FORK);
}
