/* check_meet.c -- where features meet: a stream capture against every other
 * feature that orders or keeps memory (wrappers of one CUDA stream, DLPack
 * exports and imports, foreign work, peer copies, events, releases of each
 * participant), and the defects once found there.
 *
 * Built twice, as check_graph.c is: against the fake CUDA (check_meet_fake:
 * each test forked, the fake paused so that work runs only when a
 * synchronisation needs it, its VIOLATIONs the oracle) and against the real
 * runtime (check_meet_gpu, skipped without a GPU), where the results are
 * checked element by element. */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cusafe.h"
#include "testutil.h"
#ifdef CUSAFE_HAVE_DLPACK
#include "cusafe_dlpack.h"
#endif
#ifdef CUSAFE_TEST_FAKE
#include "fakecuda.h"
#include "fakeutil.h"
#else
#include <cuda_runtime_api.h>
#endif

enum { N = 256 }; /* bytes per buffer */

static cusafe_context ctx;

static void ctx_setup(void) {
#ifdef CUSAFE_TEST_FAKE
  fake_set_paused(1);
#endif
  ctx = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&ctx, 0));
}

static void ctx_teardown(void) {
  (void)cusafe_context_release(ctx);
  ctx = CUSAFE_NULL_HANDLE;
}

static cusafe_stream new_stream(void) {
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  return s;
}

static cusafe_buffer new_buffer(void) {
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, N));
  return b;
}

/* A wrapper of s's own CUDA stream. */
static cusafe_stream wrap_of(cusafe_stream s) {
  void *raw = NULL;
  cusafe_stream w = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_interop_handle(&raw, s));
  TU_OK(cusafe_stream_wrap(&w, ctx, raw));
  return w;
}

/* ------------------------------------------------------------------------ */
/* The defects once found at the meeting points                             */
/* ------------------------------------------------------------------------ */

/* A capture over a stream that a second cusafe stream wraps: the uses of
 * a buffer on the wrapper and then on the stream are ordered inside the
 * capture with no pointer to the wrapper left once it is released (its
 * memory, reused by the next wrapper, would name another CUDA stream). */
START_TEST(test_capture_use_through_released_wrapper) {
  cusafe_stream s = new_stream();
  cusafe_stream w = wrap_of(s);
  cusafe_buffer b = new_buffer();
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_buffer_fill(b, 0, N, 1, w));
  TU_OK(cusafe_stream_release(w));
  TU_OK(cusafe_buffer_fill(b, 0, N / 2, 2, s));
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, s));
  TU_OK(cusafe_graph_launch(g, s));
  TU_OK(cusafe_stream_synchronize(s));
  unsigned char got[N];
  TU_OK(cusafe_buffer_read(b, 0, got, N));
  for (size_t i = 0; i < N; i++)
    TU_ASSERT(got[i] == (i < N / 2 ? 2 : 1), "byte %zu is %u", i, got[i]);
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

#ifdef CUSAFE_TEST_FAKE
/* Two threads release the last two handles of a stream at once while a
 * capture that began on it holds a buffer that holds the stream: one of
 * the releases is the last, and ends the capture, every time. */
enum { RACE_TRIES = 20000, RACE_TRIES_VALGRIND = 200 };

struct race {
  _Atomic unsigned round; /* the try both threads are in */
  _Atomic unsigned arrived, finished;
  _Atomic cusafe_stream s;
  _Atomic cusafe_status st;
  /* The releaser waits a little longer each round, from 0 to 8191 spins:
   * the other thread's call meets the release at each of its steps. */
  int skew;
};

/* Both threads spin into the release together: a barrier that sleeps
 * would wake them microseconds apart. */
static void race_spin(_Atomic unsigned *count, unsigned until) {
  for (unsigned spins = 0; atomic_load(count) < until; spins++)
    if (spins > 4096) /* the other thread is not running: let it */
      sched_yield();
}

static void race_meet(_Atomic unsigned *count, unsigned round) {
  atomic_fetch_add(count, 1);
  race_spin(count, 2 * round);
}

/* The other thread of a race: releases r->s in each round, with the
 * main thread's own step. */
static void *race_releaser(void *arg) {
  struct race *r = arg;
  for (unsigned round = 1;; round++) {
    race_spin(&r->round, round);
    cusafe_stream s = atomic_load(&r->s);
    if (s == CUSAFE_NULL_HANDLE)
      return NULL;
    race_meet(&r->arrived, round);
    for (volatile unsigned i = 0; r->skew && i < (round * 37) % 8192; i++)
      ;
    atomic_store(&r->st, cusafe_stream_release(s));
    race_meet(&r->finished, round);
  }
}

START_TEST(test_concurrent_last_releases_end_capture) {
  int tries = getenv("VALGRIND") && *getenv("VALGRIND") ? RACE_TRIES_VALGRIND
                                                        : RACE_TRIES;
  fake_set_paused(0);
  struct race r = {.st = CUSAFE_SUCCESS};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, race_releaser, &r), 0);
  for (unsigned round = 1; round <= (unsigned)tries; round++) {
    cusafe_stream s = new_stream();
    cusafe_buffer b = CUSAFE_NULL_HANDLE;
    TU_OK(cusafe_buffer_alloc_async(&b, s, N)); /* b holds s */
    TU_OK(cusafe_stream_begin_capture(s));
    TU_OK(cusafe_buffer_fill(b, 0, N, 1, s)); /* the capture holds b */
    TU_OK(cusafe_buffer_release(b));
    TU_OK(cusafe_stream_retain(s));
    atomic_store(&r.s, s);
    atomic_store(&r.round, round);
    race_meet(&r.arrived, round);
    cusafe_status mine = cusafe_stream_release(s);
    race_meet(&r.finished, round);
    TU_OK(mine);
    TU_OK(atomic_load(&r.st));
    TU_ASSERT(fake_live_captures(-1) == 0,
              "try %u: the capture outlived the last handle of its stream",
              round);
    TU_ASSERT(fake_live_streams(-1) == 1,
              "try %u: %zu streams alive, expected the context's only", round,
              fake_live_streams(-1));
  }
  atomic_store(&r.s, CUSAFE_NULL_HANDLE);
  atomic_store(&r.round, (unsigned)tries + 1);
  pthread_join(th, NULL);
  TU_OK(cusafe_context_synchronize(ctx));
  TU_ASSERT(fake_live_allocations(-1) == 0, "%zu allocations alive",
            fake_live_allocations(-1));
}
END_TEST

/* A capture begins on a stream while another thread releases the
 * stream's last handle (a buffer allocated on it keeps it alive): either
 * the beginning fails, or the capture ends with the last handle -- never
 * an open capture that no handle can end. */
START_TEST(test_capture_begins_during_last_release) {
  int tries = getenv("VALGRIND") && *getenv("VALGRIND") ? RACE_TRIES_VALGRIND
                                                        : RACE_TRIES;
  fake_set_paused(0);
  struct race r = {.st = CUSAFE_SUCCESS, .skew = 1};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, race_releaser, &r), 0);
  unsigned began = 0, during = 0;
  for (unsigned round = 1; round <= (unsigned)tries; round++) {
    cusafe_stream s = new_stream();
    cusafe_buffer b = CUSAFE_NULL_HANDLE;
    TU_OK(cusafe_buffer_alloc_async(&b, s, N)); /* b holds s */
    atomic_store(&r.s, s);
    atomic_store(&r.round, round);
    race_meet(&r.arrived, round);
    cusafe_status st = cusafe_stream_begin_capture(s);
    race_meet(&r.finished, round);
    TU_OK(atomic_load(&r.st));
    if (st == CUSAFE_SUCCESS)
      began++;
    else if (strstr(cusafe_last_error_message(), "while its capture began"))
      during++;
    else
      TU_ERR(st, CUSAFE_ERROR_INVALID_HANDLE,
             "stream 0x%016llx is stale: its object was released", TU_HX(s));
    TU_ASSERT(fake_live_captures(-1) == 0,
              "try %u: a capture is open on a stream with no handle left "
              "(the beginning returned %s)",
              round, cusafe_status_string(st));
    TU_OK(cusafe_buffer_release(b));
    TU_ASSERT(fake_live_streams(-1) == 1,
              "try %u: %zu streams alive, expected the context's only", round,
              fake_live_streams(-1));
  }
  atomic_store(&r.s, CUSAFE_NULL_HANDLE);
  atomic_store(&r.round, (unsigned)tries + 1);
  pthread_join(th, NULL);
  printf("%d tries: the capture began before the last release in %u, "
         "during it in %u, after it in %u\n",
         tries, began, during, (unsigned)tries - began - during);
}
END_TEST
#endif

#ifdef CUSAFE_TEST_FAKE
/* A stream whose join of a capture fails midway (its wait for the
 * capture's event) is not kept by the capture: its last release destroys
 * it while the capture goes on. */
START_TEST(test_failed_join_lets_go_of_stream) {
  cusafe_stream s = new_stream(), t = new_stream();
  cusafe_event ev = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_event_create(&ev, ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_event_record(ev, s));
  fake_fail_function("cudaStreamWaitEvent", cudaErrorInvalidValue);
  TU_STATUS(cusafe_stream_wait_event(t, ev), CUSAFE_ERROR_CUDA);
  fake_fail_clear();
  size_t streams = fake_live_streams(-1);
  TU_OK(cusafe_stream_release(t));
  TU_ASSERT(fake_live_streams(-1) == streams - 1,
            "%zu streams alive after the release, expected %zu",
            fake_live_streams(-1), streams - 1);
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, s));
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_event_release(ev));
  TU_OK(cusafe_stream_release(s));
}
END_TEST
#endif

#if defined(CUSAFE_HAVE_DLPACK) && defined(CUSAFE_TEST_FAKE)
static const DLDataType u8 = {kDLUInt, 8, 1};

/* A tensor deleted while its consumer's stream captures: the memory is
 * freed after the consumer's work queued on that stream before the
 * capture, and the capture holds nothing of the tensor's. */
START_TEST(test_export_deleted_while_consumer_captures) {
  cusafe_stream s = new_stream();
  cusafe_buffer b = new_buffer(), alias = CUSAFE_NULL_HANDLE;
  DLManagedTensorVersioned *t = NULL;
  int64_t n = N;
  TU_OK(cusafe_buffer_to_dlpack(&t, b, 0, u8, 1, &n, NULL, s));
  TU_OK(cusafe_buffer_release(b));
  /* The consumer's work on the tensor's memory, on its stream. */
  TU_OK(cusafe_buffer_wrap(&alias, ctx, CUSAFE_MEMORY_DEVICE, t->dl_tensor.data,
                           N, NULL, NULL));
  TU_OK(cusafe_buffer_fill(alias, 0, N, 7, s));
  TU_OK(cusafe_stream_begin_capture(s));
  size_t before = fake_live_allocations(-1);
  t->deleter(t);
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, s));
  char what[128] = "";
  TU_OK(cusafe_graph_release(g));
  /* The free is queued, after the consumer's fill. */
  TU_OK(cusafe_context_synchronize(ctx));
  TU_ASSERT(fake_live_allocations(-1) == before - 1,
            "%zu allocations alive, expected %zu: %s",
            fake_live_allocations(-1), before - 1, what);
  TU_OK(cusafe_buffer_release(alias));
  TU_OK(cusafe_stream_release(s));
}
END_TEST
#endif

static Suite *meet_suite(void) {
  Suite *s = suite_create("meet");
  TCase *tc = tcase_create("defects");
  tcase_set_timeout(tc, 300);
  tcase_add_checked_fixture(tc, ctx_setup, ctx_teardown);
  tcase_add_test(tc, test_capture_use_through_released_wrapper);
#ifdef CUSAFE_TEST_FAKE
  tcase_add_test(tc, test_concurrent_last_releases_end_capture);
  tcase_add_test(tc, test_capture_begins_during_last_release);
  tcase_add_test(tc, test_failed_join_lets_go_of_stream);
#endif
#if defined(CUSAFE_HAVE_DLPACK) && defined(CUSAFE_TEST_FAKE)
  tcase_add_test(tc, test_export_deleted_while_consumer_captures);
#endif
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  (void)argc;
#ifdef CUSAFE_TEST_FAKE
  /* A pointer kept to a released object must not find its old contents
   * there: glibc's malloc fills what is freed (MALLOC_PERTURB_), with no
   * thread cache to skip that, set before the program starts, so once
   * again.  (Valgrind and the sanitizers see such reads on their own.) */
  const char *vg = getenv("VALGRIND");
  if ((!vg || !*vg) && !getenv("CUSAFE_MEET_PERTURBED")) {
    setenv("CUSAFE_MEET_PERTURBED", "1", 1);
    setenv("MALLOC_PERTURB_", "165", 1);
    setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0", 1);
    execv("/proc/self/exe", argv);
    perror("check_meet: execv /proc/self/exe");
    return 99;
  }
  fake_set_device_count(1);
  return tu_run_suite(meet_suite(), CK_FORK);
#else
  tu_require_gpu();
  return tu_run_suite(meet_suite(), CK_NOFORK);
#endif
}
