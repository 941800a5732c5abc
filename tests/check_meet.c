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
#define _GNU_SOURCE /* pthread_timedjoin_np */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cusafe.h"
#include "testutil.h"
#ifdef CUSAFE_HAVE_DLPACK
#include "cusafe_dlpack.h"
#endif
#ifdef CUSAFE_TEST_FAKE
#include "cuda_api.h"
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

/* A capture is ended on the stream it began on: another cusafe stream
 * over the same CUDA stream (the wrapped stream, here) is told where. */
START_TEST(test_end_capture_through_other_stream) {
  cusafe_stream s = new_stream();
  cusafe_stream w = wrap_of(s);
  TU_OK(cusafe_stream_begin_capture(w));
  int on = 0;
  TU_OK(cusafe_stream_is_capturing(&on, s));
  TU_ASSERT(on == 1, "the wrapped stream does not capture");
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_stream_end_capture(&g, s), CUSAFE_ERROR_CAPTURING,
         "stream 0x%016llx shares its CUDA stream with a capture that began "
         "on stream 0x%016llx: end it there",
         TU_HX(s), TU_HX(w));
  TU_OK(cusafe_stream_end_capture(&g, w));
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_stream_release(w));
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
  /* With skew, one thread waits a little longer each round, from 0 to
   * 8191 spins, the releaser in odd rounds, the other in even ones: the
   * other thread's call meets the release at each of its steps. */
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
    for (volatile unsigned i = 0;
         r->skew && round % 2 && i < (round * 37) % 8192; i++)
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
    for (volatile unsigned i = 0; round % 2 == 0 && i < (round * 37) % 8192;
         i++)
      ;
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

#ifdef CUSAFE_TEST_FAKE
static int given_back;
static void count_back(void *user) {
  (void)user;
  given_back++;
}

/* Memory of every kind, and another owner's, last used on the legacy
 * default stream, released while a blocking stream captures (when CUDA
 * forbids any use of the legacy stream, a wait or free ordered after it
 * included): nothing is freed or given back, and the capture goes on
 * unharmed; once it ends, each is freed or given back after that work.
 * With `shut`, the shutdown comes instead of the end, and does the same. */
static void release_after_legacy_work(bool shut) {
  cusafe_stream s = CUSAFE_NULL_HANDLE, legacy = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, 0 /* blocking */, 0));
  TU_OK(cusafe_stream_wrap(&legacy, ctx, (void *)cudaStreamLegacy));
  cusafe_buffer b[4], owned = new_buffer(), c = new_buffer();
  TU_OK(cusafe_buffer_alloc(&b[0], ctx, CUSAFE_MEMORY_DEVICE, N));
  TU_OK(cusafe_buffer_alloc(&b[1], ctx, CUSAFE_MEMORY_HOST_PINNED, N));
  TU_OK(cusafe_buffer_alloc(&b[2], ctx, CUSAFE_MEMORY_MANAGED, N));
  void *mem = NULL;
  TU_OK(cusafe_buffer_interop_pointer(&mem, owned));
  given_back = 0;
  TU_OK(cusafe_buffer_wrap(&b[3], ctx, CUSAFE_MEMORY_DEVICE, mem, N, count_back,
                           NULL));
  unsigned char src[N];
  memset(src, 0x5a, sizeof src);
  for (int i = 0; i < 4; i++) /* queued, not run: the fake is paused */
    TU_OK(cusafe_buffer_write_async(b[i], 0, src, N, legacy));
  size_t before = fake_live_allocations(-1);
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_buffer_fill(c, 0, N, 3, s));
  for (int i = 0; i < 4; i++)
    TU_OK(cusafe_buffer_release(b[i]));
  TU_ASSERT(fake_live_allocations(-1) == before,
            "%zu allocations alive during the capture, expected %zu",
            fake_live_allocations(-1), before);
  TU_ASSERT(given_back == 0, "memory given back during the capture");
  if (shut) {
    TU_OK(cusafe_shutdown());
    TU_ASSERT(given_back == 1, "given back %d times, expected once",
              given_back);
    TU_NOTHING_LIVE();
    return;
  }
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, s)); /* the capture was unharmed */
  TU_ASSERT(given_back == 1, "given back %d times, expected once", given_back);
  TU_OK(cusafe_context_synchronize(ctx));
  TU_ASSERT(fake_live_allocations(-1) == before - 3,
            "%zu allocations alive after the capture, expected %zu",
            fake_live_allocations(-1), before - 3);
  TU_OK(cusafe_graph_launch(g, s));
  unsigned char got[N];
  TU_OK(cusafe_buffer_read(c, 0, got, N));
  for (int i = 0; i < N; i++)
    TU_ASSERT(got[i] == 3, "byte %d of the graph's buffer is %u", i, got[i]);
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_buffer_release(c));
  TU_OK(cusafe_buffer_release(owned));
  TU_OK(cusafe_stream_release(legacy));
  TU_OK(cusafe_stream_release(s));
}

/* What another thread does right after the library asked CUDA something
 * (the fake's call hook): a capture of s begins, or with e, e is recorded
 * on s -- given 50 ms, in which it cannot finish if it must wait for the
 * asking thread. */
struct begins {
  cusafe_stream s;
  cusafe_event e;
  pthread_t thread;
  _Atomic int started, done;
  cusafe_status st;
};

static void *begins_main(void *arg) {
  struct begins *b = arg;
  b->st = b->e ? cusafe_event_record(b->e, b->s)
               : cusafe_stream_begin_capture(b->s);
  atomic_store(&b->done, 1);
  return NULL;
}

static void begins_now(void *arg) {
  struct begins *b = arg;
  TU_ASSERT(pthread_create(&b->thread, NULL, begins_main, b) == 0,
            "pthread_create failed");
  atomic_store(&b->started, 1);
  for (int i = 0; i < 50 && !atomic_load(&b->done); i++)
    usleep(1000);
}

static void begins_join(struct begins *b) {
  TU_ASSERT(atomic_load(&b->started), "the hook did not run");
  pthread_join(b->thread, NULL);
  TU_OK(b->st);
}

/* The capture that began works on (c filled in it) and ends unharmed;
 * then the context's own stream runs first (a read there waits for it),
 * the legacy stream's work after: a free queued on the context's stream
 * without waiting for that work would come first.  Everything goes. */
static void begins_end(struct begins *bg, cusafe_stream legacy,
                       cusafe_buffer c) {
  TU_OK(cusafe_buffer_fill(c, 0, N, 3, bg->s));
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, bg->s));
  unsigned char got[N];
  TU_OK(cusafe_buffer_read(c, 0, got, N));
  TU_ASSERT(cs_cu->stream_synchronize(cudaStreamLegacy) == cudaSuccess,
            "the legacy stream's work failed");
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_buffer_release(c));
  TU_OK(cusafe_stream_release(legacy));
  TU_OK(cusafe_stream_release(bg->s));
}

/* Other code's work on two buffers' memory on the legacy stream, then
 * cusafe_stream_use_buffers() on a wrapper of it, while a capture of a
 * blocking stream begins on another thread right after the library
 * looked: the buffers follow that work, both alike, before the capture
 * (which waits) -- or after it -- and the capture stays valid; the frees
 * come after that work. */
START_TEST(test_capture_begins_while_use_buffers_looks) {
  cusafe_stream s = CUSAFE_NULL_HANDLE, legacy = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, 0 /* blocking */, 0));
  TU_OK(cusafe_stream_wrap(&legacy, ctx, (void *)cudaStreamLegacy));
  cusafe_buffer b[2] = {new_buffer(), new_buffer()}, c = new_buffer();
  for (int i = 0; i < 2; i++) {
    void *mem = NULL;
    TU_OK(cusafe_buffer_interop_pointer(&mem, b[i]));
    TU_ASSERT(cs_cu->memset_async(mem, 0x11, N, cudaStreamLegacy) ==
                  cudaSuccess,
              "other code's memset failed");
  }
  struct begins bg = {.s = s};
  fake_set_call_hook("cudaStreamIsCapturing", begins_now, &bg);
  TU_OK(cusafe_stream_use_buffers(legacy, b, 2));
  begins_join(&bg);
  for (int i = 0; i < 2; i++)
    TU_OK(cusafe_buffer_release(b[i]));
  begins_end(&bg, legacy, c);
}
END_TEST

/* The same for the release of memory last used on the legacy stream. */
START_TEST(test_capture_begins_while_a_release_looks) {
  cusafe_stream s = CUSAFE_NULL_HANDLE, legacy = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, 0 /* blocking */, 0));
  TU_OK(cusafe_stream_wrap(&legacy, ctx, (void *)cudaStreamLegacy));
  cusafe_buffer b = new_buffer(), c = new_buffer();
  TU_OK(cusafe_buffer_fill(b, 0, N, 1, legacy));
  struct begins bg = {.s = s};
  fake_set_call_hook("cudaStreamIsCapturing", begins_now, &bg);
  TU_OK(cusafe_buffer_release(b));
  begins_join(&bg);
  begins_end(&bg, legacy, c);
}
END_TEST

static void clear_faults(void *arg) {
  (void)arg;
  fake_fail_clear();
}

/* The next call of `fn` fails with err; the ones after it work. */
static void fail_once(const char *fn, cudaError_t err) {
  fake_fail_function(fn, err);
  fake_set_call_hook(fn, clear_faults, NULL);
}

/* Ends the capture on s, which must end well, and lets go of its graph. */
static void end_unharmed(cusafe_stream s) {
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, s));
  TU_OK(cusafe_graph_release(g));
}

/* A call that fails (an end of a capture whose first cudaStreamEndCapture
 * fails) and then drains a parked follow that fails too (its buffer's
 * latest work is on a stream that other code captures): the call reports
 * its own failure, not the follow's. */
START_TEST(test_drain_keeps_the_callers_error) {
  cudaStream_t raw = NULL;
  TU_ASSERT(cs_cu->stream_create(&raw, cudaStreamNonBlocking, 0) == cudaSuccess,
            "no raw stream");
  cusafe_stream s = CUSAFE_NULL_HANDLE, legacy = CUSAFE_NULL_HANDLE;
  cusafe_stream wf = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, 0 /* blocking */, 0));
  TU_OK(cusafe_stream_wrap(&legacy, ctx, (void *)cudaStreamLegacy));
  TU_OK(cusafe_stream_wrap(&wf, ctx, raw));
  cusafe_buffer b = new_buffer();
  TU_OK(cusafe_buffer_fill(b, 0, N, 1, wf));
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_stream_use_buffers(legacy, &b, 1)); /* parked */
  TU_OK(cusafe_buffer_release(b));
  TU_ASSERT(cs_cu->stream_begin_capture(raw, cudaStreamCaptureModeRelaxed) ==
                cudaSuccess,
            "other code's capture did not begin");
  fail_once("cudaStreamEndCapture", cudaErrorUnknown);
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_stream_end_capture(&g, s), CUSAFE_ERROR_CUDA,
         "cudaStreamEndCapture failed: unknown error");
  ck_assert_int_eq(cusafe_last_cuda_error(), (int)cudaErrorUnknown);
  cudaGraph_t rg = NULL;
  TU_ASSERT(cs_cu->stream_end_capture(raw, &rg) == cudaSuccess,
            "other code's capture did not end");
  cs_cu->graph_destroy(rg);
  TU_OK(cusafe_stream_release(wf));
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_stream_release(legacy));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_context_synchronize(ctx));
  TU_ASSERT(cs_cu->stream_destroy(raw) == cudaSuccess, "raw stream");
}
END_TEST

/* A buffer released while the stream of its latest work captures, the
 * hand-off of that work to the context's stream failing: the host waits
 * for the work queued before the capture instead -- never for the stream
 * itself, which would break the capture -- and the free follows it. */
START_TEST(test_free_after_failed_handoff_from_capture) {
  cusafe_stream s = new_stream();
  cusafe_buffer b = new_buffer();
  size_t before = fake_live_allocations(-1);
  TU_OK(cusafe_buffer_fill(b, 0, N, 3, s));
  TU_OK(cusafe_stream_begin_capture(s));
  fake_fail_function("cudaStreamWaitEvent", cudaErrorInvalidValue);
  TU_ERR(cusafe_buffer_release(b), CUSAFE_ERROR_CUDA,
         "cudaStreamWaitEvent failed: invalid argument");
  fake_fail_clear();
  end_unharmed(s);
  TU_OK(cusafe_context_synchronize(ctx));
  ck_assert_uint_eq(fake_live_allocations(-1), before - 1);
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* Wrapped memory given back: what its release function sees. */
struct given {
  const unsigned char *memory;
  int calls;
  unsigned char first; /* the memory's first byte then */
};

static void note_give_back(void *user) {
  struct given *g = user;
  g->calls++;
  g->first = g->memory[0];
}

/* A wrap of *owner's memory (a new buffer) whose give-backs g notes. */
static cusafe_buffer wrap_noted(cusafe_buffer *owner, struct given *g) {
  cusafe_buffer w = CUSAFE_NULL_HANDLE;
  void *ptr = NULL;
  *owner = new_buffer();
  TU_OK(cusafe_buffer_interop_pointer(&ptr, *owner));
  *g = (struct given){.memory = ptr};
  TU_OK(cusafe_buffer_wrap(&w, ctx, CUSAFE_MEMORY_DEVICE, ptr, N,
                           note_give_back, g));
  return w;
}

/* Wrapped memory released while another stream of its device captures,
 * the wait for its latest work failing once: the device's
 * synchronisation, which would break the capture, is not tried; the
 * give-back is parked and tried again, and comes after that work. */
START_TEST(test_give_back_after_failed_wait_during_capture) {
  cusafe_stream s = new_stream();
  cusafe_buffer owner;
  struct given g;
  cusafe_buffer w = wrap_noted(&owner, &g);
  TU_OK(cusafe_buffer_fill(w, 0, N, 7, CUSAFE_STREAM_DEFAULT));
  TU_OK(cusafe_stream_begin_capture(s));
  fail_once("cudaStreamSynchronize", cudaErrorMemoryAllocation);
  TU_OK(cusafe_buffer_release(w));
  ck_assert_int_eq(g.calls, 1);
  ck_assert_int_eq(g.first, 7);
  end_unharmed(s);
  TU_OK(cusafe_buffer_release(owner));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* Wrapped memory last used on a stream whose capture could not be ended
 * when the stream was released (the stream lives on: the memory holds
 * it): the give-back ends that capture first, then waits for the
 * stream's work -- not for the device, nor until a capture ends that
 * nothing else would end. */
START_TEST(test_give_back_after_capture_left_over) {
  cusafe_stream s = new_stream();
  cusafe_buffer owner;
  struct given g;
  cusafe_buffer w = wrap_noted(&owner, &g);
  TU_OK(cusafe_buffer_fill(w, 0, N, 9, s));
  TU_OK(cusafe_stream_begin_capture(s));
  fail_once("cudaStreamEndCapture", cudaErrorIllegalAddress);
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_buffer_release(w));
  ck_assert_int_eq(g.calls, 1);
  ck_assert_int_eq(g.first, 9);
  ck_assert_uint_eq(fake_live_captures(-1), 0);
  TU_OK(cusafe_buffer_release(owner));
}
END_TEST

/* A free whose cudaFreeAsync fails once while a stream captures: tried
 * again, not made synchronous (a device's synchronisation would break the
 * capture). */
START_TEST(test_free_fails_once_during_capture) {
  cusafe_stream s = new_stream();
  cusafe_buffer b = new_buffer(), c = new_buffer();
  size_t before = fake_live_allocations(-1);
  TU_OK(cusafe_buffer_fill(b, 0, N, 1, CUSAFE_STREAM_DEFAULT));
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_buffer_fill(c, 0, N, 1, s));
  fail_once("cudaFreeAsync", cudaErrorMemoryAllocation);
  size_t syncs = fake_log_count("cudaDeviceSynchronize");
  TU_OK(cusafe_buffer_release(b));
  ck_assert_uint_eq(fake_log_count("cudaDeviceSynchronize"), syncs);
  end_unharmed(s);
  TU_OK(cusafe_context_synchronize(ctx));
  ck_assert_uint_eq(fake_live_allocations(-1), before - 1);
  TU_OK(cusafe_buffer_release(c));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* Wrapped memory released while another library captures on its own
 * stream of the device, which CUDA's queries do not show: a wait that
 * fails once is tried again; the device is not synchronised (which would
 * break that capture), and the memory goes back after its work. */
START_TEST(test_give_back_fails_once_during_foreign_capture) {
  cusafe_stream s = new_stream();
  cusafe_buffer owner;
  struct given g;
  cusafe_buffer w = wrap_noted(&owner, &g);
  TU_OK(cusafe_buffer_fill(w, 0, N, 7, s));
  cudaStream_t f = fake_foreign_stream(0);
  TU_ASSERT(cs_cu->stream_begin_capture(f, cudaStreamCaptureModeRelaxed) ==
                cudaSuccess,
            "other code's capture did not begin");
  fail_once("cudaStreamSynchronize", cudaErrorMemoryAllocation);
  size_t syncs = fake_log_count("cudaDeviceSynchronize");
  TU_OK(cusafe_buffer_release(w));
  ck_assert_uint_eq(fake_log_count("cudaDeviceSynchronize"), syncs);
  ck_assert_int_eq(g.calls, 1);
  ck_assert_int_eq(g.first, 7);
  cudaGraph_t rg = NULL;
  TU_ASSERT(cs_cu->stream_end_capture(f, &rg) == cudaSuccess,
            "other code's capture was broken");
  cs_cu->graph_destroy(rg);
  fake_foreign_stream_destroy(f);
  TU_OK(cusafe_buffer_release(owner));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* Buffers used on a stream of device 1 that joined a capture, while the
 * thread's current device is 0 (cusafe_stream_use_buffers, a DLPack
 * export's consumer stream): the capture orders the stream after the
 * buffer's captured use with an event of device 1 -- one of device 0
 * could not be recorded there, and stayed in the capture past device 0's
 * primary context. */
START_TEST(test_use_on_joined_stream_of_other_device) {
  fake_set_device_count(2);
  fake_set_paused(1);
  cusafe_context c0 = CUSAFE_NULL_HANDLE, c1 = CUSAFE_NULL_HANDLE;
  cusafe_stream origin = CUSAFE_NULL_HANDLE, joined = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  cusafe_event e = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&c0, 0));
  TU_OK(cusafe_context_create(&c1, 1));
  TU_OK(cusafe_stream_create(&origin, c1, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_create(&joined, c1, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_alloc(&b, c1, CUSAFE_MEMORY_DEVICE, N));
  TU_OK(cusafe_event_create(&e, c1, 0));
  TU_OK(cusafe_stream_begin_capture(origin));
  TU_OK(cusafe_buffer_fill(b, 0, N, 1, origin));
  TU_OK(cusafe_event_record(e, origin));
  TU_OK(cusafe_stream_wait_event(joined, e)); /* joins the capture */
  TU_OK(cusafe_stream_use_buffers(joined, &b, 1));
#ifdef CUSAFE_HAVE_DLPACK
  DLManagedTensorVersioned *t = NULL;
  int64_t n = N;
  TU_OK(cusafe_buffer_fill(b, 0, N, 2, origin));
  TU_OK(cusafe_buffer_to_dlpack(&t, b, 0, (DLDataType){kDLUInt, 8, 1}, 1, &n,
                                NULL, joined));
#endif
  TU_OK(cusafe_context_release(c0)); /* the fake: no event of it alive */
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, origin));
#ifdef CUSAFE_HAVE_DLPACK
  t->deleter(t);
#endif
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_event_release(e));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(joined));
  TU_OK(cusafe_stream_release(origin));
  TU_OK(cusafe_context_release(c1));
}
END_TEST

/* Two devices, paused: a buffer of device 0 (dst) whose latest work is a
 * peer copy from one of device 1 (src) on a stream of device 1 (q1). */
struct peers {
  cusafe_context c0, c1;
  cusafe_stream q1;
  cusafe_buffer dst, src;
};

static void peers_make(struct peers *p) {
  fake_set_device_count(2);
  fake_set_paused(1);
  *p = (struct peers){0};
  TU_OK(cusafe_context_create(&p->c0, 0));
  TU_OK(cusafe_context_create(&p->c1, 1));
  TU_OK(cusafe_stream_create(&p->q1, p->c1, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_alloc(&p->dst, p->c0, CUSAFE_MEMORY_DEVICE, N));
  TU_OK(cusafe_buffer_alloc(&p->src, p->c1, CUSAFE_MEMORY_DEVICE, N));
  TU_OK(cusafe_buffer_copy(p->dst, 0, p->src, 0, N, p->q1));
}

/* After dst's release: everything ran (the fake: no VIOLATION), and goes. */
static void peers_finish(struct peers *p) {
  TU_OK(cusafe_context_synchronize(p->c0));
  TU_OK(cusafe_stream_synchronize(p->q1));
  TU_OK(cusafe_buffer_release(p->src));
  TU_OK(cusafe_stream_release(p->q1));
  TU_OK(cusafe_context_release(p->c1));
  TU_OK(cusafe_context_release(p->c0));
}

/* A graph with an event wait node, replayed on a wrapper of device 1's
 * legacy stream, is released while a blocking stream of device 1
 * captures: what it holds waits (parked) for that replay.  The wait, done
 * when the capture ends on a thread whose current device is 0, is for
 * device 1's legacy stream -- the event outlives the replay. */
START_TEST(test_parked_wait_on_default_wrapper_of_other_device) {
  fake_set_device_count(2);
  fake_set_paused(1);
  cusafe_context c1 = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&c1, 1));
  cusafe_stream s = CUSAFE_NULL_HANDLE, legacy = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, c1, 0 /* blocking */, 0));
  TU_OK(cusafe_stream_wrap(&legacy, c1, (void *)cudaStreamLegacy));
  cusafe_event e = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_event_create(&e, c1, 0));
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_stream_wait_event(s, e)); /* an event wait node */
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, s));
  TU_OK(cusafe_graph_launch(g, legacy));
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_graph_release(g)); /* parks what it holds */
  cusafe_graph g2 = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g2, s)); /* drains */
  TU_OK(cusafe_graph_release(g2));
  TU_OK(cusafe_event_release(e));
  TU_OK(cusafe_context_synchronize(c1)); /* the fake: no VIOLATION */
  TU_OK(cusafe_stream_release(legacy));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_context_release(c1));
}
END_TEST

/* A buffer whose latest work is a peer copy on a stream of another
 * device, its hand-off and the host's waits failing: the free follows the
 * other device's synchronisation instead, not queued unordered. */
START_TEST(test_peer_free_fails) {
  struct peers p;
  peers_make(&p);
  fake_fail_function("cudaStreamWaitEvent", cudaErrorMemoryAllocation);
  fake_fail_function("cudaStreamSynchronize", cudaErrorMemoryAllocation);
  TU_ERR(cusafe_buffer_release(p.dst), CUSAFE_ERROR_OUT_OF_MEMORY,
         "cudaStreamWaitEvent failed: out of memory");
  fake_fail_clear();
  peers_finish(&p);
}
END_TEST

/* A buffer whose latest work is a peer copy on a stream of another device
 * that now captures, its hand-off and the host's wait both failing: the
 * free is parked, not queued unordered, and follows the copy. */
START_TEST(test_peer_free_fails_during_capture) {
  struct peers p;
  peers_make(&p);
  TU_OK(cusafe_stream_begin_capture(p.q1));
  fake_fail_function("cudaStreamWaitEvent", cudaErrorMemoryAllocation);
  fake_fail_function("cudaEventSynchronize", cudaErrorMemoryAllocation);
  size_t frees = fake_log_count("cudaFreeAsync");
  TU_OK(cusafe_buffer_release(p.dst));
  fake_fail_clear();
  ck_assert_uint_eq(fake_log_count("cudaFreeAsync"), frees);
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, p.q1)); /* drains the parked free */
  TU_OK(cusafe_graph_release(g));
  ck_assert_uint_eq(fake_log_count("cudaFreeAsync"), frees + 1);
  peers_finish(&p);
}
END_TEST

/* Wrapped memory whose waits fail twice while a capture of another
 * stream of the context is left over (its end failed): the device is
 * synchronised once that capture is ended -- during it the
 * synchronisation fails -- and only then does the memory go back. */
START_TEST(test_give_back_fails_with_capture_left_over) {
  cusafe_stream s = new_stream(), s2 = new_stream();
  cusafe_buffer owner, y = new_buffer();
  struct given g;
  cusafe_buffer w = wrap_noted(&owner, &g);
  TU_OK(cusafe_buffer_fill(w, 0, N, 7, s));
  TU_OK(cusafe_stream_begin_capture(s2));
  TU_OK(cusafe_buffer_fill(y, 0, N, 1, s2));
  fake_fail_function("cudaStreamEndCapture", cudaErrorUnknown);
  cusafe_graph graph = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_stream_end_capture(&graph, s2), CUSAFE_ERROR_CUDA,
         "cudaStreamEndCapture failed: unknown error");
  fake_fail_clear();
  ck_assert_uint_eq(fake_live_captures(0), 1); /* left over */
  fake_fail_function("cudaStreamSynchronize", cudaErrorUnknown);
  TU_OK(cusafe_buffer_release(w));
  fake_fail_clear();
  ck_assert_int_eq(g.calls, 1);
  ck_assert_int_eq(g.first, 7);
  ck_assert_uint_eq(fake_live_captures(0), 0);
  TU_OK(cusafe_buffer_release(y));
  TU_OK(cusafe_buffer_release(owner));
  TU_OK(cusafe_stream_release(s2));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* A capture left over on another library's stream whose wrapper went
 * (its ends failed), the stream then ended and destroyed by its owner: a
 * free that cannot be queued, which ends the context's left-over captures
 * before it synchronises the device, leaves that stream alone. */
START_TEST(test_leftover_of_destroyed_foreign_stream) {
  cudaStream_t raw = fake_foreign_stream(0);
  cusafe_stream w = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = new_buffer(), y = new_buffer();
  TU_OK(cusafe_stream_wrap(&w, ctx, raw));
  TU_OK(cusafe_stream_begin_capture(w));
  TU_OK(cusafe_buffer_fill(y, 0, N, 1, w));
  fake_fail_function("cudaStreamEndCapture", cudaErrorUnknown);
  TU_OK(cusafe_stream_release(w)); /* the capture is left over */
  fake_fail_clear();
  ck_assert_uint_eq(fake_live_captures(0), 1);
  cudaGraph_t rg = NULL; /* the owner ends it, and destroys its stream */
  TU_ASSERT(cs_cu->stream_end_capture(raw, &rg) == cudaSuccess,
            "the owner's end failed");
  cs_cu->graph_destroy(rg);
  fake_foreign_stream_destroy(raw);
  fake_fail_function("cudaFreeAsync", cudaErrorMemoryAllocation);
  TU_OK(cusafe_buffer_release(b)); /* the fake: no call on that stream */
  fake_fail_clear();
  TU_OK(cusafe_buffer_release(y));
}
END_TEST

START_TEST(test_release_after_legacy_work_during_capture) {
  release_after_legacy_work(false);
}
END_TEST

START_TEST(test_shutdown_after_legacy_work_during_capture) {
  release_after_legacy_work(true);
}
END_TEST
#endif

#if defined(CUSAFE_HAVE_DLPACK) && defined(CUSAFE_TEST_FAKE)
static const DLDataType u8 = {kDLUInt, 8, 1};

/* A tensor deleted while a stream of the device captures, the follow of
 * the consumer's stream and the host's wait for it failing once: the
 * wait is tried again, and the device is not synchronised (which would
 * break the capture). */
START_TEST(test_deleter_fails_once_during_capture) {
  cusafe_stream consumer = new_stream(), s = new_stream();
  cusafe_buffer b = new_buffer(), c = new_buffer();
  DLManagedTensorVersioned *t = NULL;
  int64_t n = N;
  TU_OK(cusafe_buffer_to_dlpack(&t, b, 0, u8, 1, &n, NULL, consumer));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_buffer_fill(c, 0, N, 1, s));
  fake_fail_function("cudaStreamWaitEvent", cudaErrorMemoryAllocation);
  fail_once("cudaStreamSynchronize", cudaErrorMemoryAllocation);
  size_t syncs = fake_log_count("cudaDeviceSynchronize");
  t->deleter(t);
  fake_fail_clear();
  ck_assert_uint_eq(fake_log_count("cudaDeviceSynchronize"), syncs);
  end_unharmed(s);
  TU_OK(cusafe_buffer_release(c));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_stream_release(consumer));
}
END_TEST

/* The shutdown while a capture of cusafe's is left over (its end failed)
 * on a DLPack consumer's stream, whose work queued there before that
 * capture still uses the memory of a tensor never deleted: the left-over
 * capture is ended before the devices are synchronised (a
 * synchronisation fails during it), so the memory goes after that work. */
START_TEST(test_shutdown_with_capture_left_over) {
  cusafe_stream consumer = new_stream();
  cusafe_buffer b = new_buffer();
  DLManagedTensorVersioned *t = NULL;
  int64_t n = N;
  TU_OK(cusafe_buffer_to_dlpack(&t, b, 0, u8, 1, &n, NULL, consumer));
  TU_OK(cusafe_buffer_release(b));
  void *raw = NULL;
  TU_OK(cusafe_stream_interop_handle(&raw, consumer));
  TU_ASSERT(cs_cu->memset_async(t->dl_tensor.data, 1, N, raw) == cudaSuccess,
            "the consumer's memset failed");
  TU_OK(cusafe_stream_begin_capture(consumer));
  fake_fail_function("cudaStreamEndCapture", cudaErrorUnknown);
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_stream_end_capture(&g, consumer), CUSAFE_ERROR_CUDA,
         "cudaStreamEndCapture failed: unknown error");
  fake_fail_clear();
  ck_assert_uint_eq(fake_live_captures(0), 1); /* left over */
  TU_OK(cusafe_shutdown());                    /* the fake: no VIOLATION */
  ck_assert_uint_eq(fake_live_captures(0), 0);
  t->deleter(t); /* after the shutdown: frees the tensor only */
}
END_TEST

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

/* ------------------------------------------------------------------------ */
/* A capture against each other feature: one scenario per row of a table   */
/* ------------------------------------------------------------------------ */

/* Every scenario runs the same way (run_scenario): its row makes what it
 * needs, a capture begins (on s, or where the row says), the row queues
 * its captured work and releases what it releases meanwhile, the capture
 * ends (unless a release of the row ended it), the graph is replayed on
 * the streams the row names and released before any synchronisation
 * (unless the row keeps it: cusafe must order what it frees after the
 * replays), and every buffer the test still holds is compared, byte by
 * byte, with a model kept on the host: each captured operation applied
 * once per replay, each other one at once.  Then everything is released:
 * on the fake, nothing is left alive then, nor after cusafe_shutdown(),
 * and every deleter and give-back ran exactly once.  On the fake (paused,
 * so that work runs only when a synchronisation needs it) a VIOLATION is
 * the first oracle: work on freed memory, a stream or event used after its
 * destruction, a library unloaded under a graph. */

enum slot_id { SX, SY, SB, SP, SIN, SZ, SA, SH, SV, NSLOTS };
static const char *const slot_names[NSLOTS] = {
    "x",          "y", "the exported buffer",  "the producer's buffer",
    "the import", "z", "the consumer's alias", "the pinned buffer",
    "the view"};
enum { MAX_OPS = 16, IMPORT_AT = 64, IMPORT_BYTES = 128 };

/* A buffer of a scenario and the model of its bytes.  The model of a
 * buffer over another's memory (an import, an alias) is a part of that
 * one's. */
struct slot {
  cusafe_buffer h; /* the test's reference; NULL once released */
  unsigned char *want;
  size_t size;
  bool unchecked; /* its memory may be gone when the check comes */
  unsigned char own[N];
};

/* One operation of the model: a byte fill, a copy, a scale of the floats
 * (cusafe_scale_f32) or a fill of them (cusafe_fill_f32). */
struct model_op {
  char kind; /* 'f', 'c', 's', 'k' */
  int dst, src;
  size_t dst_off, src_off, len;
  unsigned char byte;
  float a;
};

struct world;
struct scenario {
  const char *name;
  int devices; /* the devices it needs (0: one) */
  /* What the row makes before the capture (it may set w->origin). */
  void (*before)(struct world *w);
  /* The captured work, and the releases during the capture. */
  void (*during)(struct world *w);
  /* Once the capture has ended, before the replays. */
  void (*ended)(struct world *w);
  /* The streams of the replays, in order: 'o' the origin of the
   * capture, 's', 't', 'u' cusafe's streams, 'd' the default stream of
   * the graph's context, 'w', 'v' the row's wrappers.  NULL: a release
   * of the row ended the capture. */
  const char *replays;
  /* After the replays, before the graph's release. */
  void (*after)(struct world *w);
  bool keep_graph; /* released after the comparison, not before */
  /* After the comparison. */
  void (*check)(struct world *w);
};

#ifdef CUSAFE_HAVE_DLPACK
static const DLDataType dl_u8 = {kDLUInt, 8, 1};
static const DLDataType dl_f32 = {kDLFloat, 32, 1};

/* A producer's tensor over bytes [IMPORT_AT, IMPORT_AT + IMPORT_BYTES) of
 * the producer's buffer, whose deleter counts its calls and keeps what the
 * memory held then. */
struct producer {
  DLManagedTensorVersioned tensor;
  int64_t shape[1];
  int deleted;
  unsigned char seen[IMPORT_BYTES];
};
#endif

struct world {
  const struct scenario *sc;
  cusafe_context ctx1; /* of device 1, for peer copies */
  cusafe_stream s1;    /* of ctx1 */
  cusafe_module mod1;  /* of ctx1 */
  cusafe_kernel kscale1;
  cusafe_stream s, t, u, wrap1, wrap2;
  cusafe_stream origin; /* where the capture begins */
  void *foreign;        /* a stream of another library, or NULL */
  cusafe_module mod;
  cusafe_kernel kfill, kscale;
  cusafe_event ev[3];
  cusafe_buffer pinned;
  cusafe_graph g;
  bool capturing;
  bool outside; /* the next operations run outside the capture */
  int replays;
  struct slot buf[NSLOTS];
  struct model_op ops[MAX_OPS];
  size_t nops;
  int given_back, given_back_want; /* of the consumer's alias */
  int *deleted, deleted_want;      /* the producer's deleter */
#ifdef CUSAFE_HAVE_DLPACK
  DLManagedTensorVersioned *tensor; /* exported, until its deleter */
  struct producer prod;
#endif
#ifdef CUSAFE_TEST_FAKE
  size_t allocations;
#endif
};

/* ---- the model ---------------------------------------------------- */

static void model_apply(struct world *w, const struct model_op *m) {
  unsigned char *d = w->buf[m->dst].want + m->dst_off;
  switch (m->kind) {
  case 'f': memset(d, m->byte, m->len); break;
  case 'c': memmove(d, w->buf[m->src].want + m->src_off, m->len); break;
  default:
    for (size_t i = 0; i + sizeof(float) <= m->len; i += sizeof(float)) {
      float f;
      memcpy(&f, d + i, sizeof f);
      f = m->kind == 's' ? f * m->a : m->a;
      memcpy(d + i, &f, sizeof f);
    }
  }
}

/* Captured: applied once per replay, later; else now. */
static void model(struct world *w, struct model_op m) {
  if (!w->capturing || w->outside) {
    model_apply(w, &m);
    return;
  }
  TU_ASSERT(w->nops < MAX_OPS, "%s: more than %d captured operations",
            w->sc->name, MAX_OPS);
  w->ops[w->nops++] = m;
}

/* ---- operations, each with its model ----------------------------- */

static void do_fill(struct world *w, int id, size_t off, size_t len,
                    unsigned char byte, cusafe_stream s) {
  TU_OK(cusafe_buffer_fill(w->buf[id].h, off, len, byte, s));
  model(w, (struct model_op){'f', id, 0, off, 0, len, byte, 0});
}

static void do_copy(struct world *w, int dst, size_t dst_off, int src,
                    size_t src_off, size_t len, cusafe_stream s) {
  TU_OK(cusafe_buffer_copy(w->buf[dst].h, dst_off, w->buf[src].h, src_off, len,
                           s));
  model(w, (struct model_op){'c', dst, src, dst_off, src_off, len, 0, 0});
}

/* A built-in kernel over all the floats of buffer id: k, of kind 's'
 * (cusafe_scale_f32) or 'k' (cusafe_fill_f32). */
static void do_kernel(struct world *w, cusafe_kernel k, char kind, int id,
                      float a, cusafe_stream s) {
  size_t n = w->buf[id].size / sizeof(float);
  cusafe_launch_config c = {{1, 1, 1}, {256, 1, 1}, 0, s};
  cusafe_arg args[] = {CUSAFE_ARG_BUF(w->buf[id].h), CUSAFE_ARG_F32V(a),
                       CUSAFE_ARG_U64V(n)};
  TU_OK(cusafe_kernel_launch(k, &c, args, 3));
  model(w, (struct model_op){kind, id, 0, 0, 0, w->buf[id].size, 0, a});
}

static void do_scale(struct world *w, int id, float a, cusafe_stream s) {
  do_kernel(w, w->kscale, 's', id, a, s);
}

/* Work that other code queues by address on a CUDA stream. */
static void *address(struct world *w, int id, size_t off) {
  void *p = NULL;
  TU_OK(cusafe_buffer_interop_pointer(&p, w->buf[id].h));
  return (char *)p + off;
}

static void raw_fill(struct world *w, int id, size_t off, size_t len,
                     unsigned char byte, void *stream) {
#ifdef CUSAFE_TEST_FAKE
  cudaError_t err =
      cs_cu->memset_async(address(w, id, off), byte, len, (cudaStream_t)stream);
#else
  cudaError_t err =
      cudaMemsetAsync(address(w, id, off), byte, len, (cudaStream_t)stream);
#endif
  TU_ASSERT(err == cudaSuccess, "%s: cudaMemsetAsync gave %d", w->sc->name,
            (int)err);
  model(w, (struct model_op){'f', id, 0, off, 0, len, byte, 0});
}

static void raw_copy(struct world *w, int dst, size_t dst_off, int src,
                     size_t src_off, size_t len, void *stream) {
#ifdef CUSAFE_TEST_FAKE
  cudaError_t err =
      cs_cu->memcpy_async(address(w, dst, dst_off), address(w, src, src_off),
                          len, cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
#else
  cudaError_t err =
      cudaMemcpyAsync(address(w, dst, dst_off), address(w, src, src_off), len,
                      cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
#endif
  TU_ASSERT(err == cudaSuccess, "%s: cudaMemcpyAsync gave %d", w->sc->name,
            (int)err);
  model(w, (struct model_op){'c', dst, src, dst_off, src_off, len, 0, 0});
}

/* ---- the world of a scenario -------------------------------------- */

/* A new buffer of N bytes of c in slot id, filled with `byte` on s
 * (pinned memory: written). */
static void slot_alloc_kind(struct world *w, int id, cusafe_context c,
                            cusafe_memory kind, unsigned char byte,
                            cusafe_stream s) {
  struct slot *sl = &w->buf[id];
  TU_OK(cusafe_buffer_alloc(&sl->h, c, kind, N));
  sl->want = sl->own;
  sl->size = N;
  if (kind == CUSAFE_MEMORY_DEVICE) {
    do_fill(w, id, 0, N, byte, s);
    return;
  }
  memset(sl->own, byte, N);
  TU_OK(cusafe_buffer_write(sl->h, 0, sl->own, N));
}

static void slot_alloc(struct world *w, int id, cusafe_context c,
                       unsigned char byte, cusafe_stream s) {
  slot_alloc_kind(w, id, c, CUSAFE_MEMORY_DEVICE, byte, s);
}

/* Compares buffer id with its model. */
static void check_slot(struct world *w, int id, const char *when) {
  struct slot *sl = &w->buf[id];
  unsigned char got[N];
  TU_OK(cusafe_buffer_read(sl->h, 0, got, sl->size));
  for (size_t i = 0; i < sl->size; i++)
    TU_ASSERT(got[i] == sl->want[i],
              "%s: byte %zu of %zu of %s is 0x%02x %s, expected 0x%02x",
              w->sc->name, i, sl->size, slot_names[id], got[i], when,
              sl->want[i]);
}

/* Buffer h, over bytes [off, off + size) of slot parent's memory. */
static void slot_over(struct world *w, int id, cusafe_buffer h, int parent,
                      size_t off, size_t size) {
  struct slot *sl = &w->buf[id];
  sl->h = h;
  sl->want = w->buf[parent].want + off;
  sl->size = size;
}

static void slot_release(struct world *w, int id) {
  TU_OK(cusafe_buffer_release(w->buf[id].h));
  w->buf[id].h = CUSAFE_NULL_HANDLE;
}

static void expect_capturing(struct world *w, cusafe_stream s, int want,
                             const char *which) {
  int on = -1;
  TU_OK(cusafe_stream_is_capturing(&on, s));
  TU_ASSERT(on == want, "%s: %s captures: %d, expected %d", w->sc->name, which,
            on, want);
}

static cusafe_stream wrap_raw(void *raw) {
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_wrap(&s, ctx, raw));
  return s;
}

/* A CUDA stream of another library. */
static void *foreign_stream(void) {
#ifdef CUSAFE_TEST_FAKE
  return fake_foreign_stream(0);
#else
  cudaStream_t raw = NULL;
  TU_ASSERT(cudaSetDevice(0) == cudaSuccess &&
                cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking) ==
                    cudaSuccess,
            "cudaStreamCreateWithFlags failed");
  return raw;
#endif
}

static void foreign_stream_destroy(void *raw) {
#ifdef CUSAFE_TEST_FAKE
  fake_foreign_stream_destroy(raw);
#else
  TU_ASSERT(cudaStreamDestroy(raw) == cudaSuccess, "cudaStreamDestroy failed");
#endif
}

static void world_make(struct world *w, const struct scenario *sc) {
  memset(w, 0, sizeof *w);
  w->sc = sc;
  ctx = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&ctx, 0));
  w->s = new_stream();
  w->t = new_stream();
  w->u = new_stream();
  w->origin = w->s;
  TU_OK(cusafe_module_load_builtin(&w->mod, ctx));
  w->kfill = tu_get_kernel(w->mod, "cusafe_fill_f32");
  w->kscale = tu_get_kernel(w->mod, "cusafe_scale_f32");
  /* Their latest work on t: the replays on other streams must wait. */
  slot_alloc(w, SX, ctx, 0x11, w->t);
  slot_alloc(w, SY, ctx, 0x12, w->t);
}

static cusafe_stream replay_stream(struct world *w, char role) {
  switch (role) {
  case 'o': return w->origin;
  case 's': return w->s;
  case 't': return w->t;
  case 'u': return w->u;
  case 'd': return CUSAFE_STREAM_DEFAULT; /* the graph's context's */
  case 'w': return w->wrap1;
  default: return w->wrap2;
  }
}

/* Compares every buffer the test holds with its model. */
static void check_contents(struct world *w) {
  char when[64];
  snprintf(when, sizeof when, "after %d replays", w->replays);
  for (int id = 0; id < NSLOTS; id++)
    if (w->buf[id].h && !w->buf[id].unchecked)
      check_slot(w, id, when);
}

static void world_release(struct world *w) {
  TU_OK(cusafe_graph_release(w->g));
  for (int id = 0; id < NSLOTS; id++)
    TU_OK(cusafe_buffer_release(w->buf[id].h));
  TU_OK(cusafe_buffer_release(w->pinned));
  for (int i = 0; i < 3; i++)
    TU_OK(cusafe_event_release(w->ev[i]));
  cusafe_handle rest[] = {w->kfill, w->kscale, w->mod,    w->wrap1,
                          w->wrap2, w->u,      w->t,      w->s,
                          w->s1,    w->mod1,   w->kscale1};
  for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
    TU_OK(cusafe_release(rest[i]));
  /* The other library's stream is its own, destroyed once cusafe holds
   * nothing over it, before that library lets go of the device. */
  if (w->foreign)
    foreign_stream_destroy(w->foreign);
  TU_OK(cusafe_release(w->ctx1));
  TU_OK(cusafe_release(ctx));
  ctx = CUSAFE_NULL_HANDLE;
}

static void check_deleters(struct world *w, const char *when) {
  TU_ASSERT(w->given_back == w->given_back_want,
            "%s: the consumer's alias given back %d times %s, expected %d",
            w->sc->name, w->given_back, when, w->given_back_want);
  int deleted = w->deleted ? *w->deleted : 0;
  TU_ASSERT(deleted == w->deleted_want,
            "%s: the producer's deleter ran %d times %s, expected %d",
            w->sc->name, deleted, when, w->deleted_want);
}

static void run_scenario(const struct scenario *sc) {
#ifdef CUSAFE_TEST_FAKE
  fake_set_device_count(sc->devices > 1 ? sc->devices : 1);
  fake_set_paused(1);
#endif
  int devices = 0;
  TU_OK(cusafe_device_count(&devices));
  if (devices < sc->devices) { /* only where CUDA has fewer */
    printf("%s: skipped: %d device(s), %d needed\n", sc->name, devices,
           sc->devices);
    return;
  }
  struct world w;
  world_make(&w, sc);
  if (sc->before)
    sc->before(&w);
  TU_OK(cusafe_stream_begin_capture(w.origin));
  w.capturing = true;
  sc->during(&w);
  if (sc->replays) {
    TU_OK(cusafe_stream_end_capture(&w.g, w.origin));
    w.capturing = false;
    if (sc->ended)
      sc->ended(&w);
    for (const char *r = sc->replays; *r; r++, w.replays++)
      TU_OK(cusafe_graph_launch(w.g, replay_stream(&w, *r)));
    if (sc->after)
      sc->after(&w);
    if (!sc->keep_graph) {
      TU_OK(cusafe_graph_release(w.g));
      w.g = CUSAFE_NULL_HANDLE;
    }
    cusafe_stream last =
        replay_stream(&w, sc->replays[strlen(sc->replays) - 1]);
    TU_OK(cusafe_stream_synchronize(last));
  }
  TU_ASSERT(!w.capturing, "%s: the capture did not end", sc->name);
  for (int i = 0; i < w.replays; i++)
    for (size_t k = 0; k < w.nops; k++)
      model_apply(&w, &w.ops[k]);
  check_contents(&w);
  if (sc->check)
    sc->check(&w);
  world_release(&w);
  check_deleters(&w, "after the last release");
#ifdef CUSAFE_TEST_FAKE
  char when[160];
  snprintf(when, sizeof when, "%s, after the last release", sc->name);
  TU_NOTHING_LIVE_AT(when);
  TU_OK(cusafe_shutdown());
  snprintf(when, sizeof when, "%s, after the shutdown", sc->name);
  TU_NOTHING_LIVE_AT(when);
  check_deleters(&w, "after the shutdown");
#endif
}

/* ---- the rows ---------------------------------------------------- */

/* Wrappers of cusafe's own stream: a capture begun on one of the two
 * cusafe streams over one CUDA stream takes the other's work too, and
 * cannot begin again there. */
static void wrap_s(struct world *w) {
  void *raw = NULL;
  TU_OK(cusafe_stream_interop_handle(&raw, w->s));
  w->wrap1 = wrap_raw(raw);
}

static void wrap_s_origin(struct world *w) {
  wrap_s(w);
  w->origin = w->wrap1;
}

static void captures_already(struct world *w, cusafe_stream other) {
  TU_ERR(cusafe_stream_begin_capture(other), CUSAFE_ERROR_CAPTURING,
         "stream 0x%016llx captures already", TU_HX(other));
  expect_capturing(w, other, 1, "the other stream over the CUDA stream");
}

static void during_work_through_wrapper(struct world *w) {
  captures_already(w, w->wrap1);
  do_fill(w, SX, 0, N / 2, 0x21, w->wrap1);
  do_scale(w, SX, 2.0f, w->s);
  do_fill(w, SY, N / 2, N / 2, 0x22, w->wrap1);
  do_scale(w, SY, 2.0f, w->wrap1);
}

static void during_work_through_stream(struct world *w) {
  captures_already(w, w->s);
  do_fill(w, SX, 0, N / 2, 0x23, w->s);
  do_scale(w, SX, 2.0f, w->wrap1);
  do_scale(w, SY, 2.0f, w->s);
  /* Only the wrapper, where it began, ends it. */
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_STATUS(cusafe_stream_end_capture(&g, w->s), CUSAFE_ERROR_CAPTURING);
  TU_ASSERT(g == CUSAFE_NULL_HANDLE, "%s: a failed end gave a graph",
            w->sc->name);
  do_fill(w, SY, 0, 8, 0x24, w->s);
}

/* Two wrappers of one stream of another library. */
static void two_wrappers(struct world *w) {
  w->foreign = foreign_stream();
  w->wrap1 = wrap_raw(w->foreign);
  w->wrap2 = wrap_raw(w->foreign);
  w->origin = w->wrap1;
}

static void during_two_wrappers(struct world *w) {
  captures_already(w, w->wrap2);
  do_fill(w, SX, 0, N / 2, 0x25, w->wrap2);
  do_scale(w, SX, 2.0f, w->wrap1);
  do_copy(w, SY, 0, SX, N / 2, N / 4, w->wrap2);
  do_scale(w, SY, 2.0f, w->wrap1);
}

#ifdef CUSAFE_HAVE_DLPACK
/* DLPack.  The consumer of an export works on its own stream, a wrapper
 * of another library's stream, where the capture begins. */
static void consumer_stream(struct world *w) {
  w->foreign = foreign_stream();
  w->wrap1 = wrap_raw(w->foreign);
  w->origin = w->wrap1;
}

static void count_give_back(void *user) {
  ((struct world *)user)->given_back++;
}

/* The consumer's work on a tensor's memory by address, through an alias:
 * a wrap of the tensor's data, whose give-backs are counted. */
static void make_alias(struct world *w) {
  cusafe_buffer alias = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_wrap(&alias, ctx, CUSAFE_MEMORY_DEVICE,
                           w->tensor->dl_tensor.data, N, count_give_back, w));
  slot_over(w, SA, alias, SB, 0, N);
  w->given_back_want = 1;
}

static void export_then_capture(struct world *w) {
  consumer_stream(w);
  slot_alloc(w, SB, ctx, 0x13, w->t);
  int64_t n = N;
  TU_OK(cusafe_buffer_to_dlpack(&w->tensor, w->buf[SB].h, 0, dl_u8, 1, &n, NULL,
                                w->wrap1));
  slot_release(w, SB); /* the tensor holds it */
  make_alias(w);
  w->buf[SA].unchecked = true;          /* freed during the scenario */
  do_fill(w, SA, 0, N, 0x31, w->wrap1); /* the consumer's, before */
}

/* The deleter runs while the consumer captures: the memory is freed
 * after the consumer's work before the capture, and the capture holds
 * nothing of the tensor's. */
static void during_deleter(struct world *w) {
  do_scale(w, SY, 2.0f, w->wrap1);
#ifdef CUSAFE_TEST_FAKE
  w->allocations = fake_live_allocations(-1);
#endif
  w->tensor->deleter(w->tensor);
  w->tensor = NULL;
  do_fill(w, SX, 0, N / 2, 0x32, w->wrap1);
}

static void after_deleter(struct world *w) {
  TU_OK(cusafe_context_synchronize(ctx));
#ifndef CUSAFE_TEST_FAKE
  (void)w;
#else
  TU_ASSERT(fake_live_allocations(-1) == w->allocations - 1,
            "%s: %zu allocations alive with the graph, expected %zu: the "
            "exported memory is not freed",
            w->sc->name, fake_live_allocations(-1), w->allocations - 1);
#endif
}

static void before_export_in_capture(struct world *w) {
  consumer_stream(w);
  slot_alloc(w, SB, ctx, 0x13, w->t);
}

/* The export is made while the consumer's stream captures: the graph holds
 * the buffer (the export's point on that stream is a captured use), also
 * after the caller's release and the deleter, which comes after the
 * replays. */
static void during_export(struct world *w) {
  int64_t n = N;
  TU_OK(cusafe_buffer_to_dlpack(&w->tensor, w->buf[SB].h, 0, dl_u8, 1, &n, NULL,
                                w->wrap1));
  slot_release(w, SB);
  make_alias(w);
  do_fill(w, SA, 0, N / 2, 0x33, w->wrap1);
  do_scale(w, SY, 2.0f, w->wrap1);
}

static void after_replays_delete(struct world *w) {
  w->tensor->deleter(w->tensor);
  w->tensor = NULL;
}

static void before_export_to_wrapper(struct world *w) {
  wrap_s(w);
  slot_alloc(w, SB, ctx, 0x13, w->t);
}

/* The consumer's stream is a wrapper of the capturing stream, released
 * during the capture, and the deleter runs during it too: the graph holds
 * the memory its replays use. */
static void during_export_to_wrapper(struct world *w) {
  int64_t n = N;
  TU_OK(cusafe_buffer_to_dlpack(&w->tensor, w->buf[SB].h, 0, dl_u8, 1, &n, NULL,
                                w->wrap1));
  TU_OK(cusafe_stream_release(w->wrap1)); /* the tensor holds it */
  w->wrap1 = CUSAFE_NULL_HANDLE;
  slot_release(w, SB);
  make_alias(w);
  do_fill(w, SA, N / 4, N / 2, 0x2a, w->s);
  do_scale(w, SY, 2.0f, w->s);
  w->tensor->deleter(w->tensor);
  w->tensor = NULL;
}

/* An import used in a capture and released during it: the producer's
 * deleter runs once, when the graph that holds it goes, after its
 * replays. */
static void producer_deleter(DLManagedTensorVersioned *t) {
  struct producer *p = t->manager_ctx;
  p->deleted++;
  char *data = (char *)t->dl_tensor.data + t->dl_tensor.byte_offset;
#ifdef CUSAFE_TEST_FAKE
  memcpy(p->seen, data, IMPORT_BYTES); /* the fake's memory is the host's */
#else
  if (cudaMemcpy(p->seen, data, IMPORT_BYTES, cudaMemcpyDeviceToHost) !=
      cudaSuccess)
    memset(p->seen, 0, sizeof p->seen);
#endif
}

static void before_import(struct world *w) {
  slot_alloc(w, SP, ctx, 0x14, w->t);
  TU_OK(cusafe_stream_synchronize(w->t)); /* the producer's, done */
  struct producer *p = &w->prod;
  p->shape[0] = IMPORT_BYTES / sizeof(float);
  p->tensor =
      (DLManagedTensorVersioned){.version = {1, 0},
                                 .manager_ctx = p,
                                 .deleter = producer_deleter,
                                 .dl_tensor = {.data = address(w, SP, 0),
                                               .device = {kDLCUDA, 0},
                                               .ndim = 1,
                                               .dtype = dl_f32,
                                               .shape = p->shape,
                                               .byte_offset = IMPORT_AT}};
  cusafe_buffer in = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_from_dlpack(&in, ctx, &p->tensor));
  slot_over(w, SIN, in, SP, IMPORT_AT, IMPORT_BYTES);
  w->deleted = &p->deleted;
  w->deleted_want = 1;
}

static void expect_not_deleted(struct world *w, const char *when) {
  TU_ASSERT(w->prod.deleted == 0, "%s: the producer's deleter ran %s",
            w->sc->name, when);
}

static void during_import(struct world *w) {
  do_fill(w, SIN, 0, IMPORT_BYTES / 2, 0x34, w->s);
  do_scale(w, SIN, 2.0f, w->s);
  do_scale(w, SX, 2.0f, w->s);
  slot_release(w, SIN);
  expect_not_deleted(w, "during the capture that uses its memory");
}

static void after_import_replays(struct world *w) {
  expect_not_deleted(w, "while the graph that holds the import lives");
}

static void check_import(struct world *w) {
  TU_ASSERT(w->prod.deleted == 1,
            "%s: the producer's deleter ran %d times once the graph went",
            w->sc->name, w->prod.deleted);
  const unsigned char *want = w->buf[SP].own + IMPORT_AT;
  for (size_t i = 0; i < IMPORT_BYTES; i++)
    TU_ASSERT(w->prod.seen[i] == want[i],
              "%s: byte %zu of the import was 0x%02x when the producer's "
              "deleter ran, expected 0x%02x after %d replays",
              w->sc->name, i, w->prod.seen[i], want[i], w->replays);
}

/* An import used in a capture that its stream's release discards: the
 * producer's deleter runs then, once, and the memory holds what it held
 * before the capture. */
static void during_import_discarded(struct world *w) {
  do_fill(w, SIN, 0, IMPORT_BYTES / 2, 0x34, w->s);
  do_scale(w, SX, 2.0f, w->s);
  slot_release(w, SIN);
  expect_not_deleted(w, "during the capture that uses its memory");
  TU_OK(cusafe_stream_release(w->s));
  w->s = w->origin = CUSAFE_NULL_HANDLE;
  w->capturing = false;
  TU_ASSERT(w->prod.deleted == 1,
            "%s: the producer's deleter ran %d times when the capture that "
            "held the import was discarded",
            w->sc->name, w->prod.deleted);
}
#endif

/* Foreign work recorded during a capture: the graph holds its buffers. */
static void during_use_buffers(struct world *w) {
  cusafe_buffer both[2] = {w->buf[SX].h, w->buf[SY].h};
  TU_OK(cusafe_stream_use_buffers(w->s, both, 2));
  void *raw = NULL;
  TU_OK(cusafe_stream_interop_handle(&raw, w->s));
  raw_fill(w, SX, 0, N / 2, 0x35, raw);
  raw_copy(w, SY, 0, SX, 0, N / 2, raw);
  slot_release(w, SX);
  do_scale(w, SY, 2.0f, w->s);
}

/* Peer copies in a capture, between device memory of two devices: CUDA
 * refuses cudaMemcpyPeerAsync in every capture (and the fake with it), so
 * cusafe queues a captured one with cudaMemcpyAsync. */
static void before_peer(struct world *w) {
  TU_OK(cusafe_context_create(&w->ctx1, 1));
  slot_alloc(w, SZ, w->ctx1, 0x15, CUSAFE_STREAM_DEFAULT);
  TU_OK(cusafe_buffer_alloc(&w->pinned, ctx, CUSAFE_MEMORY_HOST_PINNED, N));
}

static void peer_copies(struct world *w) {
  do_copy(w, SX, 0, SZ, 0, N / 2, w->s);
  do_copy(w, SZ, N / 2, SX, N / 2, N / 2, w->s);
  do_scale(w, SX, 2.0f, w->s);
}

static void during_peer(struct world *w) {
  peer_copies(w);
  /* Pinned memory from another device's memory: a copy there, which a
   * capture cannot take. */
  TU_ERR(cusafe_buffer_copy(w->pinned, 0, w->buf[SZ].h, 0, N, w->s),
         CUSAFE_ERROR_CAPTURING,
         "a copy that runs on another device's stream cannot be done while "
         "stream 0x%016llx captures",
         TU_HX(w->s));
}

static void during_peer_released(struct world *w) {
  peer_copies(w);
  slot_release(w, SZ);
  TU_OK(cusafe_context_release(w->ctx1));
  w->ctx1 = CUSAFE_NULL_HANDLE;
}

/* The capture is on device 1's stream: its graph holds device 0's
 * buffer. */
static void before_peer_on_1(struct world *w) {
  TU_OK(cusafe_context_create(&w->ctx1, 1));
  slot_alloc(w, SZ, w->ctx1, 0x15, CUSAFE_STREAM_DEFAULT);
  TU_OK(cusafe_stream_create(&w->s1, w->ctx1, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_module_load_builtin(&w->mod1, w->ctx1));
  w->kscale1 = tu_get_kernel(w->mod1, "cusafe_scale_f32");
  w->origin = w->s1;
}

static void during_peer_on_1(struct world *w) {
  do_copy(w, SZ, 0, SX, 0, N / 2, w->s1);
  do_kernel(w, w->kscale1, 's', SZ, 2.0f, w->s1);
  do_copy(w, SX, N / 2, SZ, N / 2, N / 2, w->s1);
  TU_OK(cusafe_context_release(ctx)); /* x, its buffer, holds it */
  ctx = CUSAFE_NULL_HANDLE;
}

/* Work outside the capture on buffers whose latest work was on its
 * stream before it (synchronous reads too): it follows that work, sees
 * nothing of the captured work, and pulls no stream into the capture. */
static void before_outside(struct world *w) {
  do_fill(w, SY, 0, N, 0x16, w->s);
}

static void during_outside(struct world *w) {
  do_scale(w, SX, 2.0f, w->s);
  w->outside = true;
  check_slot(w, SY, "during the capture, last filled on s before it");
  do_fill(w, SY, 0, N / 2, 0x17, w->u);
  expect_capturing(w, w->u, 0, "u, which followed s's work before the capture");
  check_slot(w, SY, "during the capture, after a fill outside it");
  check_slot(w, SX, "during the capture that scales it");
  w->outside = false;
  do_scale(w, SY, 2.0f, w->s);
}

/* Events: a stream that waits for an event recorded in the capture joins
 * it; the capture waits for an event recorded outside at each replay. */
static void make_events(struct world *w) {
  for (int i = 0; i < 3; i++)
    TU_OK(cusafe_event_create(&w->ev[i], ctx, CUSAFE_EVENT_DISABLE_TIMING));
}

/* `member` joins the capture begun on s, works there, and s waits for
 * it. */
static void fork_join(struct world *w, cusafe_stream member) {
  do_scale(w, SX, 2.0f, w->s);
  TU_OK(cusafe_event_record(w->ev[0], w->s));
  TU_OK(cusafe_stream_wait_event(member, w->ev[0]));
  expect_capturing(w, member, 1, "the stream that waited for its event");
  do_scale(w, SX, 2.0f, member);
  do_fill(w, SY, 0, N / 2, 0x36, member);
  TU_OK(cusafe_event_record(w->ev[1], member));
  TU_OK(cusafe_stream_wait_event(w->s, w->ev[1]));
}

static void during_join(struct world *w) {
  fork_join(w, w->t);
  do_scale(w, SY, 2.0f, w->s);
  TU_ERR(cusafe_event_query(w->ev[0]), CUSAFE_ERROR_CAPTURING,
         "querying event 0x%016llx cannot be done: it was recorded in a "
         "capture that is still open",
         TU_HX(w->ev[0]));
}

static void after_join(struct world *w) {
  expect_capturing(w, w->t, 0, "t, once the capture ended");
}

static void event_outside(struct world *w) {
  make_events(w);
  do_fill(w, SX, N / 2, N / 2, 0x37, w->u);
  TU_OK(cusafe_event_record(w->ev[2], w->u));
}

static void during_wait_outside(struct world *w) {
  TU_OK(cusafe_stream_wait_event(w->s, w->ev[2]));
  do_scale(w, SX, 2.0f, w->s);
  expect_capturing(w, w->u, 0, "u, whose event the capture waited for");
}

static void during_events_released(struct world *w) {
  fork_join(w, w->t);
  TU_OK(cusafe_stream_wait_event(w->s, w->ev[2]));
  do_scale(w, SY, 2.0f, w->s);
  for (int i = 0; i < 3; i++) {
    TU_OK(cusafe_event_release(w->ev[i]));
    w->ev[i] = CUSAFE_NULL_HANDLE;
  }
}

/* The stream the capture began on: the capture ends, discarded, its
 * member (t) leaves it, and what it held goes. */
static void during_origin_released(struct world *w) {
  fork_join(w, w->t);
  do_fill(w, SY, N / 2, N / 2, 0x39, w->s);
  slot_release(w, SX);
#ifdef CUSAFE_TEST_FAKE
  TU_ASSERT(fake_live_captures(-1) == 1, "%s: no capture open", w->sc->name);
#endif
  cusafe_stream s = w->s;
  TU_OK(cusafe_stream_release(s));
  w->s = w->origin = CUSAFE_NULL_HANDLE;
  w->capturing = false; /* discarded: its work never runs */
  TU_STALE(s);
#ifdef CUSAFE_TEST_FAKE
  TU_ASSERT(fake_live_captures(-1) == 0,
            "%s: the capture outlived the stream it began on", w->sc->name);
#endif
  expect_capturing(w, w->t, 0, "t, which had joined the discarded capture");
  do_fill(w, SY, N / 2, N / 4, 0x3a, w->t);
}

/* A member of the capture: u, which nothing else holds (no buffer's work
 * was chained there). */
static void during_member_released(struct world *w) {
  fork_join(w, w->u);
  TU_OK(cusafe_stream_release(w->u)); /* the capture holds it */
  w->u = CUSAFE_NULL_HANDLE;
  do_scale(w, SX, 2.0f, w->s);
  do_copy(w, SX, 0, SY, 0, N / 4, w->s);
}

/* A wrapper of the capturing stream, which the capture does not hold. */
static void during_wrapper_released(struct world *w) {
  do_fill(w, SX, 0, N, 0x3b, w->wrap1);
  TU_OK(cusafe_stream_release(w->wrap1));
  w->wrap1 = CUSAFE_NULL_HANDLE;
  do_fill(w, SX, 0, N / 2, 0x3c, w->s);
  do_scale(w, SY, 2.0f, w->s);
}

/* One of two wrappers of another library's stream, the one the capture
 * did not begin on. */
static void during_foreign_wrapper_released(struct world *w) {
  do_fill(w, SX, 0, N / 2, 0x26, w->wrap2);
  TU_OK(cusafe_stream_release(w->wrap2));
  w->wrap2 = CUSAFE_NULL_HANDLE;
  do_scale(w, SX, 2.0f, w->wrap1);
  do_fill(w, SY, 0, N / 2, 0x27, w->wrap1);
}

/* s, whose CUDA stream the capturing wrapper holds. */
static void during_wrapped_released(struct world *w) {
  do_fill(w, SX, 0, N / 2, 0x3d, w->s);
  TU_OK(cusafe_stream_release(w->s));
  w->s = CUSAFE_NULL_HANDLE;
  expect_capturing(w, w->wrap1, 1, "the wrapper");
  do_scale(w, SX, 2.0f, w->wrap1);
}

/* The stream a capturing wrapper holds, then the wrapper: the capture
 * ends, discarded, before the CUDA stream goes. */
static void during_wrapped_then_wrapper_released(struct world *w) {
  do_fill(w, SX, 0, N / 2, 0x41, w->s);
  TU_OK(cusafe_stream_release(w->s));
  w->s = CUSAFE_NULL_HANDLE;
  do_scale(w, SX, 2.0f, w->wrap1);
  TU_OK(cusafe_stream_release(w->wrap1));
  w->wrap1 = w->origin = CUSAFE_NULL_HANDLE;
  w->capturing = false;
#ifdef CUSAFE_TEST_FAKE
  TU_ASSERT(fake_live_captures(-1) == 0,
            "%s: the capture outlived its stream and wrapper", w->sc->name);
#endif
  do_fill(w, SX, N / 2, 8, 0x42, w->t);
}

/* The wrapper the capture began on: the capture ends, discarded. */
static void during_wrapper_origin_released(struct world *w) {
  do_scale(w, SX, 2.0f, w->wrap1);
  do_fill(w, SY, 0, N / 2, 0x3e, w->s);
  TU_OK(cusafe_stream_release(w->wrap1));
  w->wrap1 = w->origin = CUSAFE_NULL_HANDLE;
  w->capturing = false; /* discarded */
#ifdef CUSAFE_TEST_FAKE
  TU_ASSERT(fake_live_captures(-1) == 0,
            "%s: the capture outlived the wrapper it began on", w->sc->name);
#endif
  expect_capturing(w, w->s, 0, "s, once its wrapper's capture ended");
  do_fill(w, SY, N / 2, N / 2, 0x3f, w->s);
}

/* The last handle of the stream the capture began on goes while a wrapper
 * holds the stream: the capture ends, discarded, and the wrapper works on
 * outside it. */
static void during_origin_released_wrapper_holds(struct world *w) {
  do_scale(w, SX, 2.0f, w->wrap1);
  do_fill(w, SY, 0, N / 2, 0x28, w->s);
  TU_OK(cusafe_stream_release(w->s));
  w->s = w->origin = CUSAFE_NULL_HANDLE;
  w->capturing = false; /* discarded */
#ifdef CUSAFE_TEST_FAKE
  TU_ASSERT(fake_live_captures(-1) == 0,
            "%s: the capture outlived the last handle of its stream",
            w->sc->name);
#endif
  expect_capturing(w, w->wrap1, 0, "the wrapper, once the capture ended");
  do_fill(w, SY, N / 2, N / 2, 0x29, w->wrap1);
}

/* A buffer, a view of it and pinned memory, released during the capture
 * that uses them. */
static void before_buffers(struct world *w) {
  cusafe_buffer v = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_view(&v, w->buf[SX].h, N / 2, N / 2));
  slot_over(w, SV, v, SX, N / 2, N / 2);
  slot_alloc_kind(w, SH, ctx, CUSAFE_MEMORY_HOST_PINNED, 0x18, w->t);
}

static void during_buffer_released(struct world *w) {
  do_scale(w, SX, 2.0f, w->s);
  do_copy(w, SY, 0, SX, 0, N, w->s);
  do_copy(w, SV, 0, SH, 0, N / 2, w->s);
  do_copy(w, SH, N / 2, SY, 0, N / 2, w->s);
  slot_release(w, SX);
  slot_release(w, SV);
  slot_release(w, SH);
  do_scale(w, SY, 2.0f, w->s);
}

/* The kernels of captured launches and their module; released during
 * the capture, the module goes with the context (no device can be
 * synchronised meanwhile); released after it, at once, unless a graph
 * holds one of its kernels. */
static void during_kernels_released(struct world *w) {
  do_scale(w, SX, 2.0f, w->s);
  do_kernel(w, w->kfill, 'k', SY, 5.0f, w->s);
  TU_OK(cusafe_kernel_release(w->kscale));
  TU_OK(cusafe_kernel_release(w->kfill));
  w->kscale = w->kfill = CUSAFE_NULL_HANDLE;
}

static void release_module(struct world *w) {
  TU_OK(cusafe_module_release(w->mod));
  w->mod = CUSAFE_NULL_HANDLE;
}

static void during_kernel_released(struct world *w) {
  during_kernels_released(w);
  release_module(w);
}

/* The context's handle: its children, and the graph, hold the context. */
static void during_context_released(struct world *w) {
  do_scale(w, SX, 2.0f, w->s);
  cusafe_context c = ctx;
  TU_OK(cusafe_context_release(c)); /* its children hold it */
  ctx = CUSAFE_NULL_HANDLE;
  TU_STALE(c);
  do_scale(w, SY, 2.0f, w->s);
}

static void wrap_s_events(struct world *w) {
  wrap_s(w);
  make_events(w);
}

/* All but y, the origin s and t: the graph holds the rest for its
 * replays. */
static void during_all_but_released(struct world *w) {
  fork_join(w, w->u);
  do_copy(w, SY, N / 2, SX, 0, N / 2, w->wrap1);
  do_scale(w, SY, 2.0f, w->s);
  TU_OK(cusafe_context_release(ctx));
  ctx = CUSAFE_NULL_HANDLE;
  cusafe_handle all[] = {w->ev[0], w->ev[1], w->ev[2], w->kscale,   w->kfill,
                         w->mod,   w->wrap1, w->u,     w->buf[SX].h};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    TU_OK(cusafe_release(all[i]));
  w->ev[0] = w->ev[1] = w->ev[2] = CUSAFE_NULL_HANDLE;
  w->kscale = w->kfill = w->mod = CUSAFE_NULL_HANDLE;
  w->buf[SX].h = w->wrap1 = w->u = CUSAFE_NULL_HANDLE;
}

/* Everything the capture uses is released during it, the stream it began
 * on last: the capture ends, discarded, and with it goes all. */
static void during_all_released(struct world *w) {
  fork_join(w, w->u);
  do_fill(w, SY, N / 2, N / 2, 0x40, w->wrap1);
  do_scale(w, SY, 2.0f, w->s);
  TU_OK(cusafe_context_release(ctx));
  ctx = CUSAFE_NULL_HANDLE;
  cusafe_handle all[] = {w->ev[0], w->ev[1], w->ev[2],     w->kscale,
                         w->kfill, w->mod,   w->buf[SX].h, w->buf[SY].h,
                         w->wrap1, w->u,     w->t};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    TU_OK(cusafe_release(all[i]));
  w->ev[0] = w->ev[1] = w->ev[2] = CUSAFE_NULL_HANDLE;
  w->kscale = w->kfill = w->mod = CUSAFE_NULL_HANDLE;
  w->buf[SX].h = w->buf[SY].h = CUSAFE_NULL_HANDLE;
  w->wrap1 = w->u = w->t = CUSAFE_NULL_HANDLE;
  expect_capturing(w, w->s, 1, "s, whose capture holds what was released");
  TU_OK(cusafe_stream_release(w->s));
  w->s = w->origin = CUSAFE_NULL_HANDLE;
  w->capturing = false;
#ifdef CUSAFE_TEST_FAKE
  char when[128];
  snprintf(when, sizeof when, "%s, once the stream the capture began on went",
           w->sc->name);
  TU_NOTHING_LIVE_AT(when);
#endif
}

static const struct scenario scenarios[] = {
    /* A wrapper of cusafe's own stream; two wrappers of another's. */
    {.name = "wrapper_capture_on_stream",
     .before = wrap_s,
     .during = during_work_through_wrapper,
     .replays = "owt"},
    {.name = "wrapper_capture_on_wrapper",
     .before = wrap_s_origin,
     .during = during_work_through_stream,
     .replays = "ost"},
    {.name = "foreign_stream_wrapped_twice",
     .before = two_wrappers,
     .during = during_two_wrappers,
     .replays = "ovt"},
#ifdef CUSAFE_HAVE_DLPACK
    /* DLPack exports and imports. */
    {.name = "export_deleted_during_capture",
     .before = export_then_capture,
     .during = during_deleter,
     .replays = "oto",
     .after = after_deleter},
    {.name = "export_made_during_capture",
     .before = before_export_in_capture,
     .during = during_export,
     .replays = "oto",
     .after = after_replays_delete,
     .keep_graph = true},
    {.name = "export_to_wrapper_of_capturing_stream",
     .before = before_export_to_wrapper,
     .during = during_export_to_wrapper,
     .replays = "oto",
     .keep_graph = true},
    {.name = "import_released_during_capture",
     .before = before_import,
     .during = during_import,
     .replays = "oto",
     .after = after_import_replays,
     .check = check_import},
    {.name = "import_released_capture_discarded",
     .before = before_import,
     .during = during_import_discarded,
     .check = check_import},
#endif
    /* Foreign work; peer copies; work outside the capture. */
    {.name = "use_buffers_during_capture",
     .during = during_use_buffers,
     .replays = "oto"},
    {.name = "peer_copy_during_capture",
     .devices = 2,
     .before = before_peer,
     .during = during_peer,
     .replays = "oto"},
    {.name = "peer_copy_released_during_capture",
     .devices = 2,
     .before = before_peer,
     .during = during_peer_released,
     .replays = "oto"},
    {.name = "peer_copy_captured_on_device_1",
     .devices = 2,
     .before = before_peer_on_1,
     .during = during_peer_on_1,
     .replays = "odo"},
    {.name = "work_outside_during_capture",
     .before = before_outside,
     .during = during_outside,
     .replays = "oto"},
    /* Events. */
    {.name = "event_joins_capture",
     .before = make_events,
     .during = during_join,
     .ended = after_join,
     .replays = "oto"},
    {.name = "event_recorded_outside",
     .before = event_outside,
     .during = during_wait_outside,
     .replays = "oto"},
    {.name = "events_released_during_capture",
     .before = event_outside,
     .during = during_events_released,
     .replays = "oto"},
    /* Releases of each participant during the capture. */
    {.name = "origin_released_during_capture",
     .before = make_events,
     .during = during_origin_released},
    {.name = "member_released_during_capture",
     .before = make_events,
     .during = during_member_released,
     .replays = "oto"},
    {.name = "wrapper_released_during_capture",
     .before = wrap_s,
     .during = during_wrapper_released,
     .replays = "oto"},
    {.name = "foreign_wrapper_released_during_capture",
     .before = two_wrappers,
     .during = during_foreign_wrapper_released,
     .replays = "oto"},
    {.name = "wrapped_stream_released_during_capture",
     .before = wrap_s_origin,
     .during = during_wrapped_released,
     .replays = "oto"},
    {.name = "wrapper_origin_released_during_capture",
     .before = wrap_s_origin,
     .during = during_wrapper_origin_released},
    {.name = "origin_released_wrapper_holds_it",
     .before = wrap_s,
     .during = during_origin_released_wrapper_holds},
    {.name = "buffers_released_during_capture",
     .before = before_buffers,
     .during = during_buffer_released,
     .replays = "oto"},
    {.name = "wrapped_stream_then_wrapper_released_during_capture",
     .before = wrap_s_origin,
     .during = during_wrapped_then_wrapper_released},
    {.name = "all_but_origin_released_during_capture",
     .before = wrap_s_events,
     .during = during_all_but_released,
     .replays = "oto"},
    {.name = "all_released_during_capture",
     .before = wrap_s_events,
     .during = during_all_released},
    {.name = "kernel_and_module_released_during_capture",
     .during = during_kernel_released,
     .replays = "oto"},
    {.name = "kernels_released_during_capture_module_after",
     .during = during_kernels_released,
     .ended = release_module,
     .replays = "oto"},
    {.name = "context_handle_released_during_capture",
     .during = during_context_released,
     .replays = "oto"},
};
enum { NSCENARIOS = sizeof scenarios / sizeof scenarios[0] };

START_TEST(test_scenario) { run_scenario(&scenarios[_i]); }
END_TEST

#ifdef CUSAFE_TEST_FAKE
/* ---- records of an event against what depends on them ------------------- */

/* Two devices, so that the library asks CUDA for the current device
 * before each call on a stream or event: the hook's place.  A context of
 * device 0, two streams and an event of it. */
struct evtwo {
  cusafe_context c;
  cusafe_stream origin, s;
  cusafe_event e;
};

static void evtwo_make(struct evtwo *t) {
  fake_set_device_count(2);
  *t = (struct evtwo){0};
  TU_OK(cusafe_context_create(&t->c, 0));
  TU_OK(cusafe_stream_create(&t->origin, t->c, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_create(&t->s, t->c, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_event_create(&t->e, t->c, 0));
}

static void evtwo_finish(struct evtwo *t) {
  TU_OK(cusafe_context_synchronize(t->c));
  TU_OK(cusafe_event_release(t->e));
  TU_OK(cusafe_stream_release(t->s));
  TU_OK(cusafe_stream_release(t->origin));
  TU_OK(cusafe_context_release(t->c));
}

/* A stream's wait for an event last recorded outside a capture, while
 * another thread records the event in a capture right after the library
 * looked: the wait is for the earlier record, made before the other one
 * -- made after it, CUDA would take the stream into the capture unknown
 * to the library, and the capture could not end (a stream left
 * unjoined). */
START_TEST(test_record_into_capture_while_a_wait_looks) {
  struct evtwo t;
  evtwo_make(&t);
  TU_OK(cusafe_event_record(t.e, t.s));
  TU_OK(cusafe_stream_begin_capture(t.origin));
  struct begins bg = {.s = t.origin, .e = t.e};
  fake_set_call_hook("cudaGetDevice", begins_now, &bg);
  TU_OK(cusafe_stream_wait_event(t.s, t.e));
  begins_join(&bg);
  TU_OK(cusafe_stream_synchronize(t.s)); /* it captures nothing */
  end_unharmed(t.origin);
  evtwo_finish(&t);
}
END_TEST

/* A capturing stream's wait for an event recorded in its capture, while
 * another thread records the event outside right after the library
 * looked: the wait is an edge of the graph, made before the other record
 * -- made after it, it would wait in the capture for work outside, which
 * CUDA refuses, invalidating the capture. */
START_TEST(test_record_outside_while_a_captured_wait_looks) {
  struct evtwo t;
  evtwo_make(&t);
  TU_OK(cusafe_stream_begin_capture(t.origin));
  TU_OK(cusafe_event_record(t.e, t.origin));
  struct begins bg = {.s = t.s, .e = t.e};
  fake_set_call_hook("cudaGetDevice", begins_now, &bg);
  TU_OK(cusafe_stream_wait_event(t.origin, t.e));
  begins_join(&bg);
  end_unharmed(t.origin);
  TU_OK(cusafe_event_synchronize(t.e)); /* the record outside is its latest */
  evtwo_finish(&t);
}
END_TEST

/* A synchronisation (_i 0), query (1) or timing (2) of an event last
 * recorded outside a capture, while another thread records it in a
 * capture right after the library looked: the record waits until it is
 * done -- CUDA fails each of them on an event last recorded in a capture,
 * and invalidates the capture. */
START_TEST(test_record_into_capture_while_the_host_waits) {
  struct evtwo t;
  evtwo_make(&t);
  cusafe_event start = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_event_create(&start, t.c, 0));
  TU_OK(cusafe_event_record(start, t.s));
  TU_OK(cusafe_event_record(t.e, t.s));
  TU_OK(cusafe_stream_begin_capture(t.origin));
  struct begins bg = {.s = t.origin, .e = t.e};
  fake_set_call_hook("cudaGetDevice", begins_now, &bg);
  float ms = -1.0f;
  switch (_i) {
  case 0: TU_OK(cusafe_event_synchronize(t.e)); break;
  case 1: TU_OK(cusafe_event_query(t.e)); break;
  default:
    TU_OK(cusafe_event_elapsed_ms(&ms, start, t.e));
    TU_ASSERT(ms == 0.001f, "elapsed %g ms, not the fake's 0.001", (double)ms);
  }
  begins_join(&bg);
  TU_ERR(cusafe_event_synchronize(t.e), CUSAFE_ERROR_CAPTURING,
         "synchronizing with event 0x%016llx cannot be done: it was recorded "
         "in a capture that is still open",
         (unsigned long long)t.e);
  end_unharmed(t.origin);
  TU_OK(cusafe_event_release(start));
  evtwo_finish(&t);
}
END_TEST
/* A stream's join of a capture, while another thread records the event
 * outside right after the library looked again: the join waits for the
 * captured record, made before the other one -- made after it, the
 * stream would not join, and its work captured later would wait in the
 * capture for work outside it. */
START_TEST(test_record_outside_while_a_join_looks) {
  struct evtwo t;
  evtwo_make(&t);
  cusafe_event back = CUSAFE_NULL_HANDLE;
  cusafe_stream other = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_event_create(&back, t.c, 0));
  TU_OK(cusafe_stream_create(&other, t.c, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_begin_capture(t.origin));
  TU_OK(cusafe_event_record(t.e, t.origin));
  struct begins bg = {.s = other, .e = t.e};
  fake_set_call_hook("cudaGetDevice", begins_now, &bg); /* in join_finish */
  TU_OK(cusafe_stream_wait_event(t.s, t.e));            /* t.s joins */
  begins_join(&bg);
  TU_OK(cusafe_event_record(back, t.s));
  TU_OK(cusafe_stream_wait_event(t.origin, back));
  end_unharmed(t.origin);
  TU_OK(cusafe_stream_synchronize(t.s));
  TU_OK(cusafe_event_release(back));
  TU_OK(cusafe_stream_release(other));
  evtwo_finish(&t);
}
END_TEST

/* A stream where a capture of cusafe's was left over (its end failed)
 * joins another capture: the left-over one is ended first -- else the
 * join's record would be captured into it, and CUDA would merge the two
 * captures, breaking both. */
START_TEST(test_join_from_leftover) {
  cusafe_stream origin = new_stream(), s2 = new_stream();
  cusafe_buffer y = new_buffer();
  cusafe_event e = CUSAFE_NULL_HANDLE, e2 = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_event_create(&e, ctx, 0));
  TU_OK(cusafe_event_create(&e2, ctx, 0));
  TU_OK(cusafe_stream_begin_capture(s2));
  TU_OK(cusafe_buffer_fill(y, 0, N, 1, s2));
  fake_fail_function("cudaStreamEndCapture", cudaErrorUnknown);
  cusafe_graph graph = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_stream_end_capture(&graph, s2), CUSAFE_ERROR_CUDA,
         "cudaStreamEndCapture failed: unknown error");
  fake_fail_clear();
  ck_assert_uint_eq(fake_live_captures(0), 1); /* left over on s2 */
  TU_OK(cusafe_stream_begin_capture(origin));
  TU_OK(cusafe_event_record(e, origin));
  TU_OK(cusafe_stream_wait_event(s2, e));      /* s2 joins */
  ck_assert_uint_eq(fake_live_captures(0), 1); /* origin's only */
  TU_OK(cusafe_event_record(e2, s2));
  TU_OK(cusafe_stream_wait_event(origin, e2)); /* joined back */
  end_unharmed(origin);
  TU_OK(cusafe_event_release(e2));
  TU_OK(cusafe_event_release(e));
  TU_OK(cusafe_buffer_release(y));
  TU_OK(cusafe_stream_release(s2));
  TU_OK(cusafe_stream_release(origin));
}
END_TEST

/* Other code's capture on a stream of its own, and a wrapper of it. */
static cudaStream_t other_capture_begin(cusafe_stream *w) {
  cudaStream_t raw = fake_foreign_stream(0);
  TU_OK(cusafe_stream_wrap(w, ctx, raw));
  TU_ASSERT(cs_cu->stream_begin_capture(raw, cudaStreamCaptureModeRelaxed) ==
                cudaSuccess,
            "other code's capture did not begin");
  return raw;
}

/* Ends other code's capture on the CUDA stream arg, which must end well
 * (also as a call hook). */
static void end_raw_capture(void *arg) {
  cudaGraph_t rg = NULL;
  TU_ASSERT(cs_cu->stream_end_capture((cudaStream_t)arg, &rg) == cudaSuccess,
            "other code's capture was broken");
  cs_cu->graph_destroy(rg);
}

/* Ends other code's capture, which must end well, and lets go of it all. */
static void other_capture_end(cudaStream_t raw, cusafe_stream w) {
  end_raw_capture(raw);
  TU_OK(cusafe_stream_release(w));
  fake_foreign_stream_destroy(raw);
}

/* A wrapper of a stream that other code captures cannot join a capture of
 * cusafe's (CUDA would merge the two, breaking both); its wait for an
 * event recorded outside is a node of the other code's graph, as its
 * other work is (a plain wait would break that capture).  Both end
 * unharmed. */
START_TEST(test_wait_on_wrapper_that_other_code_captures) {
  cusafe_stream w = CUSAFE_NULL_HANDLE, origin = new_stream(),
                s2 = new_stream();
  cusafe_event e = CUSAFE_NULL_HANDLE, outside = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_event_create(&e, ctx, 0));
  TU_OK(cusafe_event_create(&outside, ctx, 0));
  TU_OK(cusafe_event_record(outside, s2));
  cudaStream_t raw = other_capture_begin(&w);
  TU_OK(cusafe_stream_begin_capture(origin));
  TU_OK(cusafe_event_record(e, origin));
  TU_ERR(cusafe_stream_wait_event(w, e), CUSAFE_ERROR_CAPTURING,
         "stream 0x%016llx is being captured by other code: it cannot join "
         "the capture that event 0x%016llx was recorded in",
         (unsigned long long)w, (unsigned long long)e);
  TU_OK(cusafe_stream_wait_event(w, outside));
  end_unharmed(origin);
  other_capture_end(raw, w);
  TU_OK(cusafe_event_release(outside));
  TU_OK(cusafe_event_release(e));
  TU_OK(cusafe_stream_release(s2));
  TU_OK(cusafe_stream_release(origin));
}
END_TEST

/* An event recorded on a wrapper of a stream that other code captures is
 * in that capture: no stream of cusafe's waits for it (CUDA would pull the
 * stream into the other code's capture, unknown to cusafe), nor does the
 * host (CUDA would break that capture); recorded again outside, it is
 * waited for as usual. */
START_TEST(test_record_in_capture_of_other_code) {
  cusafe_stream w = CUSAFE_NULL_HANDLE, s2 = new_stream();
  cusafe_event e = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_event_create(&e, ctx, 0));
  cudaStream_t raw = other_capture_begin(&w);
  TU_OK(cusafe_event_record(e, w));
  TU_ERR(cusafe_stream_wait_event(s2, e), CUSAFE_ERROR_CAPTURING,
         "waiting for event 0x%016llx cannot be done: its latest record was "
         "in a capture of other code; record it again outside",
         (unsigned long long)e);
  TU_ERR(cusafe_event_query(e), CUSAFE_ERROR_CAPTURING,
         "querying event 0x%016llx cannot be done: its latest record was "
         "in a capture of other code; record it again outside",
         (unsigned long long)e);
  TU_OK(cusafe_stream_synchronize(s2)); /* s2 captures nothing */
  other_capture_end(raw, w);
  TU_OK(cusafe_event_record(e, s2));
  TU_OK(cusafe_stream_wait_event(s2, e));
  TU_OK(cusafe_event_synchronize(e));
  TU_OK(cusafe_event_release(e));
  TU_OK(cusafe_stream_release(s2));
}
END_TEST
/* A graph released while a blocking stream captures, its replay queued on
 * a wrapper of the legacy stream, which CUDA lets nothing wait for
 * meanwhile: what it holds (an event its replays wait for) is kept until
 * the replay is done, not dropped with the graph, and the release
 * succeeds. */
START_TEST(test_graph_released_while_blocking_stream_captures) {
  fake_set_paused(1);
  cusafe_stream s = CUSAFE_NULL_HANDLE, blocking = CUSAFE_NULL_HANDLE;
  cusafe_stream legacy = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_create(&blocking, ctx, 0 /* blocking */, 0));
  TU_OK(cusafe_stream_wrap(&legacy, ctx, (void *)cudaStreamLegacy));
  cusafe_event e = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_event_create(&e, ctx, 0));
  TU_OK(cusafe_event_record(e, s));
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_stream_wait_event(s, e)); /* a node that waits for e */
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, s));
  TU_OK(cusafe_graph_launch(g, legacy));
  TU_OK(cusafe_stream_begin_capture(blocking));
  size_t live = fake_live_events(0);
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_event_release(e));
  ck_assert_uint_eq(fake_live_events(0), live); /* e kept for the replay */
  end_unharmed(blocking);
  TU_OK(cusafe_context_synchronize(ctx)); /* the replay ran; e went */
  ck_assert_uint_eq(fake_live_events(0), live - 1);
  TU_OK(cusafe_stream_release(legacy));
  TU_OK(cusafe_stream_release(blocking));
  TU_OK(cusafe_stream_release(s));
}
END_TEST
/* A stream of cusafe's whose CUDA stream other code captures, through
 * cusafe_stream_interop_handle(), is taken as a wrapper of it would be:
 * an event recorded there is in that capture, and no other stream waits
 * for it; the stream joins no capture of cusafe's, and its waits for
 * events recorded outside are nodes of the other code's graph. */
START_TEST(test_own_stream_that_other_code_captures) {
  cusafe_stream s = new_stream(), s2 = new_stream(), origin = new_stream();
  cusafe_event e = CUSAFE_NULL_HANDLE, mine = CUSAFE_NULL_HANDLE,
               outside = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_event_create(&e, ctx, 0));
  TU_OK(cusafe_event_create(&mine, ctx, 0));
  TU_OK(cusafe_event_create(&outside, ctx, 0));
  TU_OK(cusafe_event_record(outside, s2));
  void *raw = NULL;
  TU_OK(cusafe_stream_interop_handle(&raw, s));
  TU_ASSERT(cs_cu->stream_begin_capture(raw, cudaStreamCaptureModeRelaxed) ==
                cudaSuccess,
            "other code's capture did not begin");
  TU_OK(cusafe_event_record(e, s)); /* in other code's capture */
  TU_ERR(cusafe_stream_wait_event(s2, e), CUSAFE_ERROR_CAPTURING,
         "waiting for event 0x%016llx cannot be done: its latest record was "
         "in a capture of other code; record it again outside",
         (unsigned long long)e);
  TU_OK(cusafe_stream_synchronize(s2)); /* s2 captures nothing */
  TU_OK(cusafe_stream_begin_capture(origin));
  TU_OK(cusafe_event_record(mine, origin));
  TU_ERR(cusafe_stream_wait_event(s, mine), CUSAFE_ERROR_CAPTURING,
         "stream 0x%016llx is being captured by other code: it cannot join "
         "the capture that event 0x%016llx was recorded in",
         (unsigned long long)s, (unsigned long long)mine);
  TU_OK(cusafe_stream_wait_event(s, outside));
  end_unharmed(origin);
  end_raw_capture(raw);
  TU_OK(cusafe_event_release(outside));
  TU_OK(cusafe_event_release(mine));
  TU_OK(cusafe_event_release(e));
  TU_OK(cusafe_stream_release(origin));
  TU_OK(cusafe_stream_release(s2));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* Work on a wrapper of a stream that other code captures that must be
 * ordered after work outside that capture (a buffer's earlier work on the
 * context's stream) is refused, and the capture goes on unharmed: a wait
 * there for work outside would break it.  A replay there is refused too,
 * and so are the host's waits for the stream. */
START_TEST(test_work_on_wrapper_that_other_code_captures) {
  cusafe_stream w = CUSAFE_NULL_HANDLE, s = new_stream();
  cusafe_buffer b = new_buffer();
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_buffer_fill(b, 0, N, 2, s));
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, s));
  TU_OK(cusafe_graph_instantiate(g));
  cudaStream_t raw = other_capture_begin(&w);
  TU_ERR(cusafe_buffer_fill(b, 0, N, 2, w), CUSAFE_ERROR_CAPTURING,
         "ordering work after another stream cannot be done: stream "
         "0x%016llx is being captured by other code",
         (unsigned long long)w);
  TU_ERR(cusafe_graph_launch(g, w), CUSAFE_ERROR_CAPTURING,
         "a graph replay cannot be done: stream 0x%016llx is being captured "
         "by other code",
         (unsigned long long)w);
  TU_ERR(cusafe_stream_synchronize(w), CUSAFE_ERROR_CAPTURING,
         "synchronizing cannot be done: stream 0x%016llx is being captured "
         "by other code",
         (unsigned long long)w);
  TU_ERR(cusafe_stream_query(w), CUSAFE_ERROR_CAPTURING,
         "querying cannot be done: stream 0x%016llx is being captured by "
         "other code",
         (unsigned long long)w);
  end_raw_capture(raw);
  TU_OK(cusafe_buffer_fill(b, 0, N, 3, w)); /* ended: ordered as usual */
  TU_OK(cusafe_graph_launch(g, w));
  TU_OK(cusafe_stream_synchronize(w));
  unsigned char got[N];
  TU_OK(cusafe_buffer_read(b, 0, got, N));
  ck_assert_uint_eq(got[0], 2); /* the replay's fill came last */
  TU_OK(cusafe_stream_release(w));
  fake_foreign_stream_destroy(raw);
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* Begins other code's capture on the CUDA stream arg, in relaxed mode
 * (also as a call hook). */
static void begin_raw_capture(void *arg) {
  TU_ASSERT(cs_cu->stream_begin_capture(
                (cudaStream_t)arg, cudaStreamCaptureModeRelaxed) == cudaSuccess,
            "other code's capture did not begin");
}

/* Replays that would take the fast path (the executable graph made, the
 * buffer's latest work on the stream already) onto a wrapper, and onto a
 * stream handed out, that other code captures are refused as the others
 * are; both captures end unharmed, and the replays after them run. */
START_TEST(test_replay_on_stream_that_other_code_captures) {
  cusafe_stream s = new_stream(), mine = new_stream(), w = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = new_buffer();
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_buffer_fill(b, 0, N, 2, s));
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, s));
  cudaStream_t raw = fake_foreign_stream(0);
  TU_OK(cusafe_stream_wrap(&w, ctx, raw));
  void *handed = NULL;
  TU_OK(cusafe_stream_interop_handle(&handed, mine));
  const cusafe_stream on[2] = {w, mine};
  cudaStream_t raws[2] = {raw, (cudaStream_t)handed};
  for (int i = 0; i < 2; i++) {
    TU_OK(cusafe_graph_launch(g, on[i]));
    TU_OK(cusafe_graph_launch(g, on[i]));
    begin_raw_capture(raws[i]);
    TU_ERR(cusafe_graph_launch(g, on[i]), CUSAFE_ERROR_CAPTURING,
           "a graph replay cannot be done: stream 0x%016llx is being "
           "captured by other code",
           (unsigned long long)on[i]);
    end_raw_capture(raws[i]);
    TU_OK(cusafe_graph_launch(g, on[i]));
    /* Where the driver cannot say, the slow path looks. */
    fail_once("cuStreamIsCapturing", cudaErrorUnknown);
    TU_OK(cusafe_graph_launch(g, on[i]));
  }
  TU_OK(cusafe_context_synchronize(ctx));
  unsigned char got[N];
  TU_OK(cusafe_buffer_read(b, 0, got, N));
  ck_assert_uint_eq(got[N - 1], 2);
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(w));
  fake_foreign_stream_destroy(raw);
  TU_OK(cusafe_stream_release(mine));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* The synchronisation of a context while other code captures a stream
 * that cusafe knows -- a wrapper, a stream handed out, or, as a blocking
 * stream, what a wrapper of the default stream stands for -- is refused,
 * as the stream's own is (CUDA would break that capture); each capture
 * ends unharmed. */
START_TEST(test_context_synchronize_while_other_code_captures) {
  cusafe_stream mine = new_stream(), w = CUSAFE_NULL_HANDLE,
                legacy = CUSAFE_NULL_HANDLE;
  void *handed = NULL;
  TU_OK(cusafe_stream_interop_handle(&handed, mine));
  cudaStream_t raw = other_capture_begin(&w);
  TU_ERR(cusafe_context_synchronize(ctx), CUSAFE_ERROR_CAPTURING,
         "synchronizing the context of device 0 cannot be done: stream "
         "0x%016llx is being captured by other code",
         (unsigned long long)w);
  end_raw_capture(raw);
  begin_raw_capture(handed);
  TU_ERR(cusafe_context_synchronize(ctx), CUSAFE_ERROR_CAPTURING,
         "synchronizing the context of device 0 cannot be done: stream "
         "0x%016llx is being captured by other code",
         (unsigned long long)mine);
  end_raw_capture(handed);
  TU_OK(cusafe_stream_wrap(&legacy, ctx, (void *)cudaStreamLegacy));
  cudaStream_t blocking = NULL;
  TU_ASSERT(cs_cu->stream_create(&blocking, 0, 0) == cudaSuccess,
            "no blocking stream");
  begin_raw_capture(blocking);
  TU_ERR(cusafe_context_synchronize(ctx), CUSAFE_ERROR_CAPTURING,
         "synchronizing the context of device 0 cannot be done: stream "
         "0x%016llx wraps a device's default stream, which CUDA lets "
         "nothing use while a blocking stream of the device captures",
         (unsigned long long)legacy);
  end_raw_capture(blocking);
  TU_OK(cusafe_context_synchronize(ctx));
  TU_ASSERT(cs_cu->stream_destroy(blocking) == cudaSuccess,
            "blocking stream not destroyed");
  TU_OK(cusafe_stream_release(legacy));
  TU_OK(cusafe_stream_release(w));
  fake_foreign_stream_destroy(raw);
  TU_OK(cusafe_stream_release(mine));
}
END_TEST

static void end_raw_capture_hook(void *arg) { end_raw_capture(arg); }
static void begin_then_end(void *arg) {
  begin_raw_capture(arg);
  fake_set_call_hook("cudaStreamIsCapturing", end_raw_capture_hook, arg);
}

/* Other code begins a capture of a wrapper's stream right after
 * cusafe_stream_use_buffers() looked at it: the buffer follows the
 * stream's work queued before that capture once it ends, as where the
 * capture began before the look.  With _i 1 the capture also ends again
 * after the hand-off into the stream was refused: the buffer is chained
 * again.  Either way the call succeeds, and the free comes after other
 * code's work on the buffer's memory. */
START_TEST(test_other_capture_begins_while_use_buffers_looks) {
  cusafe_stream s = new_stream(), w = CUSAFE_NULL_HANDLE;
  cudaStream_t raw = fake_foreign_stream(0);
  TU_OK(cusafe_stream_wrap(&w, ctx, raw));
  cusafe_buffer b = new_buffer();
  TU_OK(cusafe_buffer_fill(b, 0, N, 1, s));
  void *mem = NULL;
  TU_OK(cusafe_buffer_interop_pointer(&mem, b));
  TU_ASSERT(cs_cu->memset_async(mem, 0x11, N, raw) == cudaSuccess,
            "other code's memset failed");
  fake_set_call_hook("cudaStreamIsCapturing",
                     _i ? begin_then_end : begin_raw_capture, raw);
  TU_OK(cusafe_stream_use_buffers(w, &b, 1));
  TU_OK(cusafe_buffer_release(b));
  if (!_i)
    end_raw_capture(raw);
  TU_OK(cusafe_context_synchronize(ctx));
  ck_assert_uint_eq(fake_live_allocations(0), 0);
  TU_OK(cusafe_stream_release(w));
  fake_foreign_stream_destroy(raw);
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* A record on, or a wait of, a wrapper of the legacy stream while a
 * blocking stream captures is refused: CUDA would refuse it and break
 * the capture, which ends unharmed. */
START_TEST(test_event_on_default_while_a_blocking_stream_captures) {
  cusafe_stream s = CUSAFE_NULL_HANDLE, legacy = CUSAFE_NULL_HANDLE,
                s2 = new_stream();
  TU_OK(cusafe_stream_create(&s, ctx, 0 /* blocking */, 0));
  TU_OK(cusafe_stream_wrap(&legacy, ctx, (void *)cudaStreamLegacy));
  cusafe_event e = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_event_create(&e, ctx, 0));
  TU_OK(cusafe_event_record(e, s2));
  TU_OK(cusafe_stream_begin_capture(s));
  TU_ERR(cusafe_event_record(e, legacy), CUSAFE_ERROR_CAPTURING,
         "recording an event cannot be done: stream 0x%016llx wraps a "
         "device's default stream, which CUDA lets nothing use while a "
         "blocking stream of the device captures",
         (unsigned long long)legacy);
  TU_ERR(cusafe_stream_wait_event(legacy, e), CUSAFE_ERROR_CAPTURING,
         "waiting for an event cannot be done: stream 0x%016llx wraps a "
         "device's default stream, which CUDA lets nothing use while a "
         "blocking stream of the device captures",
         (unsigned long long)legacy);
  end_unharmed(s);
  TU_OK(cusafe_stream_wait_event(legacy, e));
  TU_OK(cusafe_event_record(e, legacy));
  TU_OK(cusafe_event_synchronize(e));
  TU_OK(cusafe_event_release(e));
  TU_OK(cusafe_stream_release(s2));
  TU_OK(cusafe_stream_release(legacy));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* A record into a capture of other code waits, as one into a capture of
 * cusafe's, while another thread synchronises with the event (CUDA would
 * fail that and break the capture). */
START_TEST(test_record_in_capture_of_other_code_while_the_host_waits) {
  struct evtwo t;
  evtwo_make(&t);
  cusafe_stream w = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_event_record(t.e, t.s));
  cudaStream_t raw = fake_foreign_stream(0);
  TU_OK(cusafe_stream_wrap(&w, t.c, raw));
  TU_ASSERT(cs_cu->stream_begin_capture(raw, cudaStreamCaptureModeRelaxed) ==
                cudaSuccess,
            "other code's capture did not begin");
  struct begins bg = {.s = w, .e = t.e};
  fake_set_call_hook("cudaGetDevice", begins_now, &bg);
  TU_OK(cusafe_event_synchronize(t.e));
  begins_join(&bg);
  TU_ERR(cusafe_event_query(t.e), CUSAFE_ERROR_CAPTURING,
         "querying event 0x%016llx cannot be done: its latest record was "
         "in a capture of other code; record it again outside",
         (unsigned long long)t.e);
  end_raw_capture(raw);
  TU_OK(cusafe_stream_release(w));
  fake_foreign_stream_destroy(raw);
  evtwo_finish(&t);
}
END_TEST
/* Other code's capture in CUDA's global mode, on a thread of its own,
 * begun and then ended when told. */
struct global_capture {
  cudaStream_t raw;
  cudaError_t begun, ended;
  _Atomic int go, started;
  pthread_t thread;
};

static void *global_capture_main(void *arg) {
  struct global_capture *r = arg;
  r->begun = cs_cu->stream_begin_capture(r->raw, cudaStreamCaptureModeGlobal);
  atomic_store(&r->started, 1);
  while (!atomic_load(&r->go))
    usleep(1000);
  cudaGraph_t rg = NULL;
  r->ended = cs_cu->stream_end_capture(r->raw, &rg);
  if (rg)
    cs_cu->graph_destroy(rg);
  return NULL;
}

/* A graph's held references parked (its replay's stream, a wrapper of the
 * legacy one, cannot be waited for while a blocking stream captures) are
 * dropped when that capture ends, waiting for the replay in relaxed
 * capture mode: a global-mode capture of other code on another thread
 * goes on unharmed. */
START_TEST(test_parked_drops_drained_in_relaxed_mode) {
  cusafe_stream s = new_stream(), blocking = CUSAFE_NULL_HANDLE,
                legacy = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&blocking, ctx, 0 /* blocking */, 0));
  TU_OK(cusafe_stream_wrap(&legacy, ctx, (void *)cudaStreamLegacy));
  cusafe_event e = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_event_create(&e, ctx, 0));
  TU_OK(cusafe_event_record(e, s));
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_stream_wait_event(s, e));
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, s));
  TU_OK(cusafe_graph_launch(g, legacy));
  TU_OK(cusafe_stream_begin_capture(blocking));
  TU_OK(cusafe_graph_release(g)); /* parked */
  TU_OK(cusafe_event_release(e));
  struct global_capture r = {0};
  TU_ASSERT(cs_cu->stream_create(&r.raw, cudaStreamNonBlocking, 0) ==
                cudaSuccess,
            "no raw stream");
  TU_ASSERT(pthread_create(&r.thread, NULL, global_capture_main, &r) == 0,
            "pthread_create failed");
  while (!atomic_load(&r.started))
    usleep(1000);
  TU_ASSERT(r.begun == cudaSuccess, "other code's capture did not begin");
  end_unharmed(blocking); /* drains */
  atomic_store(&r.go, 1);
  pthread_join(r.thread, NULL);
  TU_ASSERT(r.ended == cudaSuccess,
            "other code's global capture on another thread was broken "
            "(cudaStreamEndCapture: %d)",
            (int)r.ended);
  cs_cu->stream_destroy(r.raw);
  TU_OK(cusafe_stream_release(legacy));
  TU_OK(cusafe_stream_release(blocking));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* A graph released while its replay's stream cannot be waited for (a
 * wrapper of the legacy stream, other code's capture of a blocking stream
 * open), that capture ending right after the library looked: the parked
 * references look again once pushed, and go at once. */
START_TEST(test_parked_drops_looked_at_again) {
  cusafe_stream s = new_stream(), legacy = CUSAFE_NULL_HANDLE,
                w = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_wrap(&legacy, ctx, (void *)cudaStreamLegacy));
  cusafe_event e = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_event_create(&e, ctx, 0));
  TU_OK(cusafe_event_record(e, s));
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_stream_wait_event(s, e));
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, s));
  TU_OK(cusafe_graph_launch(g, legacy));
  TU_OK(cusafe_event_release(e));
  cudaStream_t raw = other_capture_begin(&w);
  size_t live = fake_live_events(0);
  fake_set_call_hook("cudaStreamIsCapturing", end_raw_capture, raw);
  TU_OK(cusafe_graph_release(g));
  ck_assert_uint_eq(fake_live_events(0), live - 1);
  TU_OK(cusafe_stream_release(w));
  fake_foreign_stream_destroy(raw);
  TU_OK(cusafe_stream_release(legacy));
  TU_OK(cusafe_stream_release(s));
}
END_TEST
/* Work on a wrapper of the legacy stream while a blocking stream's capture
 * of cusafe's is open -- a fill, a launch, an allocation, on a buffer
 * whose latest work is there already (no hand-off to refuse) -- is
 * refused: CUDA would refuse it and break the capture, which ends
 * unharmed. */
START_TEST(test_work_on_default_while_a_blocking_stream_captures) {
  cusafe_stream s = CUSAFE_NULL_HANDLE, legacy = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, 0 /* blocking */, 0));
  TU_OK(cusafe_stream_wrap(&legacy, ctx, (void *)cudaStreamLegacy));
  cusafe_buffer b = new_buffer(), a = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_fill(b, 0, N, 1, legacy));
  TU_OK(cusafe_stream_begin_capture(s));
  const char *why = "stream 0x%016llx wraps a device's default stream, "
                    "which CUDA lets nothing use while a blocking stream of "
                    "the device captures";
  char want[256];
  snprintf(want, sizeof want, "queueing work cannot be done: %s", why);
  TU_ERR(cusafe_buffer_fill(b, 0, N, 2, legacy), CUSAFE_ERROR_CAPTURING, want,
         (unsigned long long)legacy);
  cusafe_module mod = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_load_builtin(&mod, ctx));
  cusafe_kernel fill = tu_get_kernel(mod, "cusafe_fill_f32");
  cusafe_launch_config cfg = {{1, 1, 1}, {32, 1, 1}, 0, legacy};
  snprintf(want, sizeof want, "a launch cannot be done: %s", why);
  TU_ERR(CUSAFE_LAUNCH(fill, &cfg, CUSAFE_ARG_BUF(b), CUSAFE_ARG_F32V(1.0f),
                       CUSAFE_ARG_U64V(N / 4)),
         CUSAFE_ERROR_CAPTURING, want, (unsigned long long)legacy);
  snprintf(want, sizeof want,
           "an allocation (cusafe_buffer_alloc_async) cannot be done: %s", why);
  TU_ERR(cusafe_buffer_alloc_async(&a, legacy, N), CUSAFE_ERROR_CAPTURING, want,
         (unsigned long long)legacy);
  end_unharmed(s);
  /* The same while such a capture is left over (its end failed). */
  TU_OK(cusafe_stream_begin_capture(s));
  fake_fail_function("cudaStreamEndCapture", cudaErrorUnknown);
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_stream_end_capture(&g, s), CUSAFE_ERROR_CUDA,
         "cudaStreamEndCapture failed: unknown error");
  fake_fail_clear();
  ck_assert_uint_eq(fake_live_captures(0), 1);
  snprintf(want, sizeof want, "queueing work cannot be done: %s", why);
  TU_ERR(cusafe_buffer_fill(b, 0, N, 2, legacy), CUSAFE_ERROR_CAPTURING, want,
         (unsigned long long)legacy);
  TU_OK(cusafe_buffer_fill(b, 0, N, 4, s)); /* ends the left-over capture */
  ck_assert_uint_eq(fake_live_captures(0), 0);
  TU_OK(cusafe_buffer_fill(b, 0, N, 3, legacy));
  unsigned char got[N];
  TU_OK(cusafe_buffer_read(b, 0, got, N));
  ck_assert_uint_eq(got[N - 1], 3);
  TU_OK(cusafe_kernel_release(fill));
  TU_OK(cusafe_module_release(mod));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(legacy));
  TU_OK(cusafe_stream_release(s));
}
END_TEST
#endif

#ifdef CUSAFE_TEST_FAKE
/* A free whose cudaFreeAsync fails falls back to the device's
 * synchronisation, which would break other code's capture of a wrapper
 * of the context: the free waits (parked) until that capture has ended,
 * unharmed, and is done then. */
START_TEST(test_free_falls_back_while_other_code_captures) {
  cusafe_stream s = new_stream(), w = CUSAFE_NULL_HANDLE;
  cusafe_buffer b = new_buffer();
  TU_OK(cusafe_buffer_fill(b, 0, N, 1, s));
  cudaStream_t raw = other_capture_begin(&w);
  fake_fail_function("cudaFreeAsync", cudaErrorUnknown);
  TU_OK(cusafe_buffer_release(b)); /* the free cannot be queued */
  fake_fail_clear();
  ck_assert_uint_eq(fake_live_allocations(0), 1);
  other_capture_end(raw, w);
  TU_OK(cusafe_context_synchronize(ctx));
  ck_assert_uint_eq(fake_live_allocations(0), 0);
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* Ends a capture begun on s, whose ends fail twice: left over. */
static void leave_capture_over(cusafe_stream s) {
  TU_OK(cusafe_stream_begin_capture(s));
  fake_fail_function("cudaStreamEndCapture", cudaErrorUnknown);
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_stream_end_capture(&g, s), CUSAFE_ERROR_CUDA,
         "cudaStreamEndCapture failed: unknown error");
  fake_fail_clear();
  ck_assert_uint_eq(fake_live_captures(0), 1);
}

/* A replay (one that would take the fast path) on a stream where a
 * capture of cusafe's is left over ends that capture first, as a fill or
 * a launch there does, and runs. */
START_TEST(test_replay_on_stream_with_leftover) {
  cusafe_stream s = new_stream(), t = new_stream();
  cusafe_buffer b = new_buffer();
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_buffer_fill(b, 0, N, 2, s));
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, s));
  TU_OK(cusafe_graph_launch(g, t)); /* the executable graph; b's work on t */
  TU_OK(cusafe_buffer_fill(b, 0, N, 1, t));
  leave_capture_over(t);
  TU_OK(cusafe_graph_launch(g, t));
  ck_assert_uint_eq(fake_live_captures(0), 0);
  TU_OK(cusafe_stream_synchronize(t));
  unsigned char got[N];
  TU_OK(cusafe_buffer_read(b, 0, got, N));
  ck_assert_uint_eq(got[0], 2);
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(t));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* The free of memory last used on a blocking stream where a capture of
 * cusafe's is left over, with a wrapper of the legacy stream alive: the
 * free's fallback ends that capture before it looks whether a wrapper
 * cannot be touched (the legacy one could not, during it), and frees. */
START_TEST(test_free_falls_back_with_leftover_and_legacy_wrapper) {
  cusafe_stream s = CUSAFE_NULL_HANDLE, legacy = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, 0 /* blocking */, 0));
  TU_OK(cusafe_stream_wrap(&legacy, ctx, (void *)cudaStreamLegacy));
  cusafe_buffer b = new_buffer();
  TU_OK(cusafe_buffer_fill(b, 0, N, 1, s));
  leave_capture_over(s);
  TU_OK(cusafe_buffer_release(b));
  ck_assert_uint_eq(fake_live_captures(0), 0);
  TU_OK(cusafe_context_synchronize(ctx));
  ck_assert_uint_eq(fake_live_allocations(0), 0);
  TU_OK(cusafe_stream_release(legacy));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* A context's synchronisation while a capture of cusafe's is left over
 * in it ends that capture first (the wait fails during any capture). */
START_TEST(test_context_synchronize_with_leftover) {
  cusafe_stream t = new_stream();
  cusafe_buffer b = new_buffer();
  TU_OK(cusafe_buffer_fill(b, 0, N, 1, t));
  leave_capture_over(t);
  TU_OK(cusafe_context_synchronize(ctx));
  ck_assert_uint_eq(fake_live_captures(0), 0);
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(t));
}
END_TEST

static void rehook_clear(void *arg) {
  fake_set_call_hook((const char *)arg, clear_faults, NULL);
}

/* The next two calls of `fn` fail with err; the ones after them work. */
static void fail_twice(const char *fn, cudaError_t err) {
  fake_fail_function(fn, err);
  fake_set_call_hook(fn, rehook_clear, (void *)fn);
}

/* Other code's capture of a wrapper's stream begins right after a
 * hand-off from that wrapper looked at it: the hand-off's record may be
 * in that capture, so nothing waits for it -- the work fails, and the
 * capture ends unharmed, with no stream of cusafe's in it. */
START_TEST(test_other_capture_begins_while_a_handoff_looks) {
  cusafe_stream s = new_stream(), w = CUSAFE_NULL_HANDLE;
  cudaStream_t raw = fake_foreign_stream(0);
  TU_OK(cusafe_stream_wrap(&w, ctx, raw));
  cusafe_buffer b = new_buffer();
  TU_OK(cusafe_buffer_fill(b, 0, N, 1, w));
  fake_set_call_hook("cudaStreamIsCapturing", begin_raw_capture, raw);
  TU_ERR(cusafe_buffer_fill(b, 0, N, 2, s), CUSAFE_ERROR_CAPTURING,
         "stream 0x%016llx is being captured by other code: nothing outside "
         "that capture can wait for its work",
         (unsigned long long)w);
  end_raw_capture(raw);
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(w));
  fake_foreign_stream_destroy(raw);
  TU_OK(cusafe_stream_release(s));
}
END_TEST
#endif

#if defined(CUSAFE_HAVE_DLPACK) && defined(CUSAFE_TEST_FAKE)
/* The same where the capture is still open at the shutdown, whose end of
 * it fails once (_i 1: it is tried again) or twice (_i 2: the capture is
 * left over, and the contexts' settling ends it before their devices'
 * synchronisation): no stream is destroyed while it captures, and the
 * memory goes after the consumer's work queued ahead. */
START_TEST(test_shutdown_end_of_capture_fails) {
  cusafe_stream consumer = new_stream();
  cusafe_buffer b = new_buffer();
  DLManagedTensorVersioned *t = NULL;
  int64_t n = N;
  TU_OK(cusafe_buffer_to_dlpack(&t, b, 0, u8, 1, &n, NULL, consumer));
  TU_OK(cusafe_buffer_release(b));
  void *raw = NULL;
  TU_OK(cusafe_stream_interop_handle(&raw, consumer));
  TU_ASSERT(cs_cu->memset_async(t->dl_tensor.data, 1, N, raw) == cudaSuccess,
            "the consumer's memset failed");
  TU_OK(cusafe_stream_begin_capture(consumer));
  if (_i == 1)
    fail_once("cudaStreamEndCapture", cudaErrorUnknown);
  else
    fail_twice("cudaStreamEndCapture", cudaErrorUnknown);
  TU_OK(cusafe_shutdown()); /* the fake: no VIOLATION */
  ck_assert_uint_eq(fake_live_captures(0), 0);
  t->deleter(t);
}
END_TEST
#endif

#ifdef CUSAFE_TEST_FAKE
/* Two hand-offs from one wrapper share its hand-off event.  A's record is
 * made outside any capture and its second look passes; before A's wait,
 * other code begins a capture of the wrapper's stream, and B hands off
 * from the wrapper too.  B waits until A's wait is made (else it would
 * record the same event into that capture first, and A's stream would
 * join it); B's record then is in the capture, and B is refused. */
struct handoffs {
  cudaStream_t raw;
  cusafe_buffer b2;
  cusafe_stream s3;
  cusafe_status b_status;
  pthread_t b;
  bool b_done;
};
static void *handoff_b(void *arg) {
  struct handoffs *r = arg;
  r->b_status = cusafe_buffer_fill(r->b2, 0, N, 6, r->s3);
  return NULL;
}
static void handoffs_h3(void *arg) { /* after A's cudaGetDevice for `to` */
  struct handoffs *r = arg;
  fake_set_call_hook("cudaStreamIsCapturing", begin_raw_capture, r->raw);
  pthread_create(&r->b, NULL, handoff_b, r);
  /* B finishes only if nothing holds it back until A's wait. */
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 1;
  r->b_done = pthread_timedjoin_np(r->b, NULL, &until) == 0;
}
static void handoffs_h2(void *arg) { /* after A's second look */
  fake_set_call_hook("cudaGetDevice", handoffs_h3, arg);
}
static void handoffs_h1(void *arg) { /* after A's record */
  fake_set_call_hook("cudaStreamIsCapturing", handoffs_h2, arg);
}
START_TEST(test_handoffs_from_wrapper_while_other_code_begins_a_capture) {
  /* Two devices: the library asks for the current device between the
   * hand-off's unlock and its wait (the hook's place). */
  fake_set_device_count(2);
  fake_set_paused(1);
  TU_OK(cusafe_context_create(&ctx, 0));
  cusafe_stream s2 = new_stream(), w = CUSAFE_NULL_HANDLE;
  struct handoffs r = {.s3 = new_stream()};
  r.raw = fake_foreign_stream(0);
  TU_OK(cusafe_stream_wrap(&w, ctx, r.raw));
  cusafe_buffer b1 = new_buffer();
  r.b2 = new_buffer();
  TU_OK(cusafe_buffer_fill(b1, 0, N, 1, w));
  TU_OK(cusafe_buffer_fill(r.b2, 0, N, 1, w));
  fake_set_call_hook("cudaEventRecord", handoffs_h1, &r);
  cusafe_status a = cusafe_buffer_fill(b1, 0, N, 5, s2); /* thread A */
  if (!r.b_done)
    pthread_join(r.b, NULL);
  ck_assert_int_eq(r.b_status, CUSAFE_ERROR_CAPTURING); /* B refused */
  ck_assert_int_eq(a, CUSAFE_SUCCESS);
  void *s2raw = NULL;
  TU_OK(cusafe_stream_interop_handle(&s2raw, s2));
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  (void)cs_cu->stream_is_capturing((cudaStream_t)s2raw, &cs);
  ck_assert_msg(cs == cudaStreamCaptureStatusNone,
                "s2 was pulled into other code's capture (status %d)", cs);
  end_raw_capture(r.raw);
  unsigned char got[N];
  TU_OK(cusafe_buffer_read(b1, 0, got, N));
  ck_assert_uint_eq(got[0], 5);
  TU_OK(cusafe_buffer_release(b1));
  TU_OK(cusafe_buffer_release(r.b2));
  TU_OK(cusafe_stream_release(w));
  fake_foreign_stream_destroy(r.raw);
  TU_OK(cusafe_stream_release(r.s3));
  TU_OK(cusafe_stream_release(s2));
  TU_OK(cusafe_context_release(ctx));
}
END_TEST

/* A capture of cusafe's left over on a stream handed out; other code
 * ends it (the stream is its too) and begins its own.  The mark hides
 * that capture from the replay's first look; once the left-over's end
 * finds the mark over, the replay looks again, and is refused. */
START_TEST(test_replay_after_leftover_ended_by_other_code) {
  cusafe_stream s = new_stream(), mine = new_stream();
  cusafe_buffer b = new_buffer();
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_buffer_fill(b, 0, N, 2, s));
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, s));
  void *handed = NULL;
  TU_OK(cusafe_stream_interop_handle(&handed, mine));
  TU_OK(cusafe_graph_launch(g, mine));
  leave_capture_over(mine);
  end_raw_capture(handed);   /* other code ends the left-over capture */
  begin_raw_capture(handed); /* and begins its own */
  TU_ERR(cusafe_graph_launch(g, mine), CUSAFE_ERROR_CAPTURING,
         "a graph replay cannot be done: stream 0x%016llx is being "
         "captured by other code",
         (unsigned long long)mine);
  end_raw_capture(handed);
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(mine));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* The same for a free's fallback: it looks at the streams that other code
 * may capture once the left-over marks are ended, and parks instead of
 * synchronising the device. */
START_TEST(test_fallback_after_leftover_ended_by_other_code) {
  cusafe_stream s = new_stream(), mine = new_stream();
  cusafe_buffer b = new_buffer();
  TU_OK(cusafe_buffer_fill(b, 0, N, 1, s));
  void *handed = NULL;
  TU_OK(cusafe_stream_interop_handle(&handed, mine));
  leave_capture_over(mine);
  end_raw_capture(handed);
  begin_raw_capture(handed);
  size_t syncs = fake_log_count("cudaDeviceSynchronize");
  fake_fail_function("cudaFreeAsync", cudaErrorUnknown);
  TU_OK(cusafe_buffer_release(b)); /* parks, as without the leftover */
  fake_fail_clear();
  ck_assert_msg(fake_log_count("cudaDeviceSynchronize") == syncs,
                "the fallback synchronised the device while other code "
                "captures a stream handed out");
  end_raw_capture(handed);
  TU_OK(cusafe_context_synchronize(ctx));
  ck_assert_uint_eq(fake_live_allocations(0), 0);
  TU_OK(cusafe_stream_release(mine));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* A launch on a wrapper (all its buffers there: no lock) meets a buffer
 * moved meanwhile and settles it; other code's capture of the wrapper's
 * stream begins after the settle's look, so the hand-off's second look
 * refuses.  The settle does not synchronise that stream (which would
 * break the capture): the buffer follows it once the capture ends. */
struct r4 {
  cudaStream_t raw;
  cusafe_buffer b;
  cusafe_stream s2;
};
static void *r4_mover(void *arg) {
  struct r4 *r = arg;
  TU_OK(cusafe_buffer_fill(r->b, 0, N, 7, r->s2));
  return NULL;
}
static void r4_after_launch(void *arg) {
  struct r4 *r = arg;
  pthread_t t;
  pthread_create(&t, NULL, r4_mover, r);
  pthread_join(t, NULL);
  fake_set_call_hook("cudaStreamIsCapturing", begin_raw_capture, r->raw);
}
START_TEST(test_settle_while_other_code_begins_a_capture) {
  struct r4 r = {.s2 = new_stream(), .b = new_buffer()};
  cusafe_stream w = CUSAFE_NULL_HANDLE;
  r.raw = fake_foreign_stream(0);
  TU_OK(cusafe_stream_wrap(&w, ctx, r.raw));
  TU_OK(cusafe_buffer_fill(r.b, 0, N, 1, w));
  cusafe_module mod = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_load_builtin(&mod, ctx));
  cusafe_kernel fill = tu_get_kernel(mod, "cusafe_fill_f32");
  cusafe_launch_config cfg = {{1, 1, 1}, {32, 1, 1}, 0, w};
  size_t records = fake_log_count("cudaEventRecord");
  size_t syncs = fake_log_count("cudaStreamSynchronize");
  fake_set_call_hook("cuLaunchKernel", r4_after_launch, &r);
  (void)CUSAFE_LAUNCH(fill, &cfg, CUSAFE_ARG_BUF(r.b), CUSAFE_ARG_F32V(1.0f),
                      CUSAFE_ARG_U64V(N / 4));
  /* The mover's hand-off and the settle's, recorded into the capture. */
  ck_assert_uint_eq(fake_log_count("cudaEventRecord"), records + 2);
  ck_assert_msg(fake_log_count("cudaStreamSynchronize") == syncs,
                "cs_buffer_settle synchronised a stream that other code "
                "captures");
  end_raw_capture(r.raw);
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_kernel_release(fill));
  TU_OK(cusafe_module_release(mod));
  TU_OK(cusafe_buffer_release(r.b));
  TU_OK(cusafe_stream_release(w));
  fake_foreign_stream_destroy(r.raw);
  TU_OK(cusafe_stream_release(r.s2));
}
END_TEST
#endif

#ifdef CUSAFE_TEST_FAKE
/* A left-over mark on a stream handed out, whose capture other code
 * ended before it began its own there: the mark no longer hides that
 * capture from the looks at the stream (cs_queue_untouchable ends it
 * first).  The free of pinned memory last used there parks instead of
 * synchronising the stream. */
static void *handed_with_stale_mark(cusafe_stream mine) {
  void *handed = NULL;
  TU_OK(cusafe_stream_interop_handle(&handed, mine));
  leave_capture_over(mine);
  end_raw_capture(handed);   /* other code ends the left-over capture */
  begin_raw_capture(handed); /* and begins its own */
  return handed;
}
START_TEST(test_pinned_free_after_leftover_ended_by_other_code) {
  cusafe_stream mine = new_stream();
  cusafe_buffer p = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_alloc(&p, ctx, CUSAFE_MEMORY_HOST_PINNED, N));
  TU_OK(cusafe_stream_use_buffers(mine, &p, 1)); /* latest work on mine */
  void *handed = handed_with_stale_mark(mine);
  size_t syncs = fake_log_count("cudaStreamSynchronize");
  TU_OK(cusafe_buffer_release(p)); /* must park, not synchronise */
  ck_assert_msg(fake_log_count("cudaStreamSynchronize") == syncs,
                "the free of pinned memory synchronised a stream that "
                "other code captures");
  end_raw_capture(handed);
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_stream_release(mine));
}
END_TEST

/* The same for device memory: the free parks instead of being queued
 * into other code's capture. */
START_TEST(test_device_free_after_leftover_ended_by_other_code) {
  cusafe_stream mine = new_stream();
  cusafe_buffer b = new_buffer();
  TU_OK(cusafe_buffer_fill(b, 0, N, 1, mine)); /* latest work on mine */
  void *handed = handed_with_stale_mark(mine);
  size_t frees = fake_log_count("cudaFreeAsync");
  TU_OK(cusafe_buffer_release(b)); /* must park */
  ck_assert_msg(fake_log_count("cudaFreeAsync") == frees,
                "the free was queued on a stream that other code captures");
  end_raw_capture(handed);
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_stream_synchronize(mine));
  ck_assert_uint_eq(fake_live_allocations(0), 0);
  TU_OK(cusafe_stream_release(mine));
}
END_TEST

/* And cusafe_stream_synchronize() is refused, as without the mark. */
START_TEST(test_stream_sync_after_leftover_ended_by_other_code) {
  cusafe_stream mine = new_stream();
  void *handed = handed_with_stale_mark(mine);
  TU_ERR(cusafe_stream_synchronize(mine), CUSAFE_ERROR_CAPTURING,
         "synchronizing cannot be done: stream 0x%016llx is being captured "
         "by other code",
         (unsigned long long)mine);
  end_raw_capture(handed);
  TU_OK(cusafe_stream_release(mine));
}
END_TEST
#endif

#ifdef CUSAFE_TEST_FAKE
/* The settle of test_settle_while_other_code_begins_a_capture parks a
 * follow of the buffer, pushed without a drain.  Other code's capture
 * ends; the program releases the buffer and goes on launching.  Launches
 * drain nothing (a drain may free, or wait on the host); the next
 * synchronisation does, and the memory goes then. */
START_TEST(test_settle_park_drained_by_synchronisation) {
  size_t live0 = fake_live_allocations(0);
  struct r4 r = {.s2 = new_stream(), .b = new_buffer()};
  cusafe_stream w = CUSAFE_NULL_HANDLE;
  r.raw = fake_foreign_stream(0);
  TU_OK(cusafe_stream_wrap(&w, ctx, r.raw));
  TU_OK(cusafe_buffer_fill(r.b, 0, N, 1, w));
  cusafe_module mod = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_load_builtin(&mod, ctx));
  cusafe_kernel fill = tu_get_kernel(mod, "cusafe_fill_f32");
  cusafe_launch_config cfg = {{1, 1, 1}, {32, 1, 1}, 0, w};
  fake_set_call_hook("cuLaunchKernel", r4_after_launch, &r);
  (void)CUSAFE_LAUNCH(fill, &cfg, CUSAFE_ARG_BUF(r.b), CUSAFE_ARG_F32V(1.0f),
                      CUSAFE_ARG_U64V(N / 4));
  end_raw_capture(r.raw);
  TU_OK(cusafe_buffer_release(r.b));
  cusafe_buffer other = new_buffer();
  for (int i = 0; i < 100; i++)
    TU_OK(CUSAFE_LAUNCH(fill, &cfg, CUSAFE_ARG_BUF(other),
                        CUSAFE_ARG_F32V(2.0f), CUSAFE_ARG_U64V(N / 4)));
  ck_assert_uint_eq(fake_live_allocations(0), live0 + 2);
  TU_OK(cusafe_context_synchronize(ctx));
  ck_assert_msg(fake_live_allocations(0) == live0 + 1,
                "%zu allocations live, %zu expected: the released buffer's "
                "parked follow was not drained",
                fake_live_allocations(0), live0 + 1);
  TU_OK(cusafe_buffer_release(other));
  TU_OK(cusafe_kernel_release(fill));
  TU_OK(cusafe_module_release(mod));
  TU_OK(cusafe_stream_release(w));
  fake_foreign_stream_destroy(r.raw);
  TU_OK(cusafe_stream_release(r.s2));
}
END_TEST
#endif

#ifdef CUSAFE_TEST_FAKE
/* A free parked while other code captured w1's stream; that capture ends
 * (nothing of cusafe's sees it).  Other code then captures its stream raw2
 * in global mode on this thread (as PyTorch's graphs do) and launches a
 * cusafe kernel into it, which is legal.  The launch drains follows only:
 * the parked free, a cudaFreeAsync that global mode forbids, waits for a
 * later call, and other code's capture ends unharmed. */
START_TEST(test_launch_into_global_capture_frees_nothing) {
  cusafe_stream w1 = CUSAFE_NULL_HANDLE, w2 = CUSAFE_NULL_HANDLE;
  cudaStream_t raw1 = fake_foreign_stream(0), raw2 = fake_foreign_stream(0);
  TU_OK(cusafe_stream_wrap(&w1, ctx, raw1));
  TU_OK(cusafe_stream_wrap(&w2, ctx, raw2));
  cusafe_buffer b = new_buffer(), y = new_buffer();
  TU_OK(cusafe_buffer_fill(y, 0, N, 1, w2)); /* y's latest work on w2 */
  TU_OK(cusafe_buffer_fill(b, 0, N, 1, w1));
  cusafe_module mod = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_load_builtin(&mod, ctx));
  cusafe_kernel fill = tu_get_kernel(mod, "cusafe_fill_f32");
  begin_raw_capture(raw1);
  TU_OK(cusafe_buffer_release(b)); /* parks: other code captures raw1 */
  end_raw_capture(raw1);           /* unseen by cusafe */
  TU_ASSERT(cs_cu->stream_begin_capture(raw2, cudaStreamCaptureModeGlobal) ==
                cudaSuccess,
            "other code's capture did not begin");
  cusafe_launch_config cfg = {{1, 1, 1}, {32, 1, 1}, 0, w2};
  size_t frees = fake_log_count("cudaFreeAsync");
  TU_OK(CUSAFE_LAUNCH(fill, &cfg, CUSAFE_ARG_BUF(y), CUSAFE_ARG_F32V(1.0f),
                      CUSAFE_ARG_U64V(N / 4)));
  size_t frees_in_launch = fake_log_count("cudaFreeAsync") - frees;
  end_raw_capture(raw2); /* must end well */
  ck_assert_msg(frees_in_launch == 0, "the launch queued %zu frees",
                frees_in_launch);
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_kernel_release(fill));
  TU_OK(cusafe_module_release(mod));
  TU_OK(cusafe_buffer_release(y));
  TU_OK(cusafe_stream_release(w1));
  TU_OK(cusafe_stream_release(w2));
  fake_foreign_stream_destroy(raw1);
  fake_foreign_stream_destroy(raw2);
}
END_TEST

/* A pinned buffer's free parked while other code captured the stream of
 * its latest work; that capture ends unseen.  The next launch, on another
 * stream, does not wait on the host for that stream (the parked free's
 * wait): it drains follows only. */
START_TEST(test_launch_does_not_wait_for_parked_free) {
  cusafe_stream w1 = CUSAFE_NULL_HANDLE, s = new_stream();
  cudaStream_t raw1 = fake_foreign_stream(0);
  TU_OK(cusafe_stream_wrap(&w1, ctx, raw1));
  cusafe_buffer p = CUSAFE_NULL_HANDLE, y = new_buffer();
  TU_OK(cusafe_buffer_alloc(&p, ctx, CUSAFE_MEMORY_HOST_PINNED, N));
  TU_OK(cusafe_stream_use_buffers(w1, &p, 1));
  TU_OK(cusafe_buffer_fill(y, 0, N, 1, s));
  cusafe_module mod = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_load_builtin(&mod, ctx));
  cusafe_kernel fill = tu_get_kernel(mod, "cusafe_fill_f32");
  begin_raw_capture(raw1);
  TU_OK(cusafe_buffer_release(p)); /* parks */
  end_raw_capture(raw1);
  cusafe_launch_config cfg = {{1, 1, 1}, {32, 1, 1}, 0, s};
  size_t syncs = fake_log_count("cudaStreamSynchronize");
  TU_OK(CUSAFE_LAUNCH(fill, &cfg, CUSAFE_ARG_BUF(y), CUSAFE_ARG_F32V(1.0f),
                      CUSAFE_ARG_U64V(N / 4)));
  ck_assert_msg(fake_log_count("cudaStreamSynchronize") == syncs,
                "a launch synchronised another stream on the host (%zu)",
                fake_log_count("cudaStreamSynchronize") - syncs);
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_kernel_release(fill));
  TU_OK(cusafe_module_release(mod));
  TU_OK(cusafe_buffer_release(y));
  TU_OK(cusafe_stream_release(w1));
  TU_OK(cusafe_stream_release(s));
  fake_foreign_stream_destroy(raw1);
}
END_TEST
#endif

#ifdef CUSAFE_TEST_FAKE
/* The waits for a wrapped buffer's latest work fail, a capture of
 * cusafe's is left over that cannot be ended, and other code captures a
 * wrapper: the give-back's fallback parks -- it can neither synchronise
 * the device nor give the memory back while its fill is queued.  With _i
 * 1 the failures last past other code's capture: once that capture ends,
 * the next drain still cannot end the left-over capture, nor wait for the
 * memory's work, and keeps the give-back parked. */
START_TEST(test_give_back_parked_while_leftover_stuck) {
  fake_set_paused(1);
  cusafe_stream s = new_stream(), s2 = new_stream(), wf = CUSAFE_NULL_HANDLE;
  cusafe_buffer owner, y = new_buffer();
  struct given g;
  cusafe_buffer w = wrap_noted(&owner, &g);
  TU_OK(cusafe_buffer_fill(w, 0, N, 7, s)); /* queued, not run (paused) */
  TU_OK(cusafe_stream_begin_capture(s2));
  TU_OK(cusafe_buffer_fill(y, 0, N, 1, s2));
  fake_fail_function("cudaStreamEndCapture", cudaErrorUnknown);
  cusafe_graph graph = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_stream_end_capture(&graph, s2), CUSAFE_ERROR_CUDA,
         "cudaStreamEndCapture failed: unknown error");
  cudaStream_t raw = other_capture_begin(&wf);
  fake_fail_function("cudaStreamSynchronize", cudaErrorUnknown);
  (void)cusafe_buffer_release(w);
  int calls = g.calls;
  fake_fail_clear();
  end_raw_capture(raw); /* other code's capture ends (CUDA lets it) */
  if (_i == 1 && calls == 0) {
    fake_fail_function("cudaStreamEndCapture", cudaErrorUnknown);
    fake_fail_function("cudaStreamSynchronize", cudaErrorUnknown);
    cusafe_buffer z = new_buffer();
    (void)cusafe_buffer_release(z); /* a call that drains */
    calls = g.calls;
    fake_fail_clear();
  }
  ck_assert_msg(calls == 0,
                "wrapped memory was given back (first byte %d, the fill "
                "of 7 still queued) while nothing waited for its work",
                g.first);
  TU_OK(cusafe_stream_release(wf));
  fake_foreign_stream_destroy(raw);
  fake_set_paused(0);
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_buffer_release(y));
  TU_OK(cusafe_buffer_release(owner));
  TU_OK(cusafe_stream_release(s2));
  TU_OK(cusafe_stream_release(s));
}
END_TEST
#endif

/* A launch on a wrapped default stream from a thread that has made no CUDA
 * call, where no context need be current: the driver's launch call takes
 * a default stream's context from the thread, and where it refuses, the
 * launch is made through the runtime, which binds the device's primary
 * context first.  Each kernel runs once, in order. */
struct fresh_launch {
  cusafe_kernel fill;
  cusafe_stream stream;
  cusafe_buffer b;
  float value;
  cusafe_status st[2];
};

static void *launch_from_fresh_thread(void *arg) {
  struct fresh_launch *l = arg;
  cusafe_launch_config c = {{1, 1, 1}, {64, 1, 1}, 0, l->stream};
  for (int i = 0; i < 2; i++) {
    float v = l->value + (float)i;
    const cusafe_arg a[] = {CUSAFE_ARG_BUF(l->b), CUSAFE_ARG_F32V(v),
                            CUSAFE_ARG_U64V(N / sizeof(float))};
    l->st[i] = cusafe_kernel_launch(l->fill, &c, a, 3);
  }
  return NULL;
}

START_TEST(test_launch_on_default_stream_from_fresh_thread) {
  cusafe_module m = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_load_builtin(&m, ctx));
  struct fresh_launch l = {.fill = tu_get_kernel(m, "cusafe_fill_f32"),
                           .b = new_buffer(),
                           .value = 2.5f};
  TU_OK(cusafe_stream_wrap(&l.stream, ctx, (void *)cudaStreamLegacy));
  pthread_t t;
  TU_ASSERT(pthread_create(&t, NULL, launch_from_fresh_thread, &l) == 0,
            "pthread_create failed");
  pthread_join(t, NULL);
  TU_OK(l.st[0]);
  TU_OK(l.st[1]);
  float got[N / sizeof(float)];
  TU_OK(cusafe_buffer_read(l.b, 0, got, sizeof got));
  for (size_t i = 0; i < N / sizeof(float); i++)
    TU_ASSERT(got[i] == 3.5f, "element %zu is %g, expected 3.5", i,
              (double)got[i]);
#ifdef CUSAFE_TEST_FAKE
  /* The fake has no current contexts: both launches are the driver's. */
  ck_assert_uint_eq(fake_log_count("cuLaunchKernel"), 2);
  ck_assert_uint_eq(fake_log_count("cudaLaunchKernel"), 0);
#endif
  TU_OK(cusafe_stream_release(l.stream));
  TU_OK(cusafe_buffer_release(l.b));
  TU_OK(cusafe_kernel_release(l.fill));
  TU_OK(cusafe_module_release(m));
}
END_TEST

static Suite *meet_suite(void) {
  Suite *s = suite_create("meet");
  TCase *tc = tcase_create("defects");
  tcase_set_timeout(tc, 300);
  tcase_add_checked_fixture(tc, ctx_setup, ctx_teardown);
  tcase_add_test(tc, test_capture_use_through_released_wrapper);
  tcase_add_test(tc, test_end_capture_through_other_stream);
  tcase_add_test(tc, test_launch_on_default_stream_from_fresh_thread);
#ifdef CUSAFE_TEST_FAKE
  tcase_add_test(tc, test_concurrent_last_releases_end_capture);
  tcase_add_test(tc, test_capture_begins_during_last_release);
  tcase_add_test(tc, test_failed_join_lets_go_of_stream);
  tcase_add_test(tc, test_free_after_failed_handoff_from_capture);
  tcase_add_test(tc, test_give_back_after_failed_wait_during_capture);
  tcase_add_test(tc, test_give_back_after_capture_left_over);
  tcase_add_test(tc, test_free_fails_once_during_capture);
  tcase_add_test(tc, test_give_back_fails_once_during_foreign_capture);
  tcase_add_test(tc, test_give_back_fails_with_capture_left_over);
  tcase_add_test(tc, test_leftover_of_destroyed_foreign_stream);
  tcase_add_test(tc, test_release_after_legacy_work_during_capture);
  tcase_add_test(tc, test_shutdown_after_legacy_work_during_capture);
  tcase_add_test(tc, test_capture_begins_while_use_buffers_looks);
  tcase_add_test(tc, test_capture_begins_while_a_release_looks);
  tcase_add_test(tc, test_drain_keeps_the_callers_error);
  tcase_add_test(tc, test_join_from_leftover);
  tcase_add_test(tc, test_wait_on_wrapper_that_other_code_captures);
  tcase_add_test(tc, test_record_in_capture_of_other_code);
  tcase_add_test(tc, test_graph_released_while_blocking_stream_captures);
  tcase_add_test(tc, test_own_stream_that_other_code_captures);
  tcase_add_test(tc, test_work_on_wrapper_that_other_code_captures);
  tcase_add_test(tc, test_replay_on_stream_that_other_code_captures);
  tcase_add_test(tc, test_context_synchronize_while_other_code_captures);
  tcase_add_loop_test(tc, test_other_capture_begins_while_use_buffers_looks, 0,
                      2);
  tcase_add_test(tc, test_other_capture_begins_while_a_handoff_looks);
  tcase_add_test(tc, test_free_falls_back_while_other_code_captures);
  tcase_add_test(tc, test_replay_on_stream_with_leftover);
  tcase_add_test(tc, test_context_synchronize_with_leftover);
  tcase_add_test(tc, test_free_falls_back_with_leftover_and_legacy_wrapper);
  tcase_add_test(tc, test_replay_after_leftover_ended_by_other_code);
  tcase_add_test(tc, test_fallback_after_leftover_ended_by_other_code);
  tcase_add_test(tc, test_settle_while_other_code_begins_a_capture);
  tcase_add_test(tc, test_pinned_free_after_leftover_ended_by_other_code);
  tcase_add_test(tc, test_device_free_after_leftover_ended_by_other_code);
  tcase_add_test(tc, test_stream_sync_after_leftover_ended_by_other_code);
  tcase_add_test(tc, test_settle_park_drained_by_synchronisation);
  tcase_add_test(tc, test_launch_into_global_capture_frees_nothing);
  tcase_add_test(tc, test_launch_does_not_wait_for_parked_free);
  tcase_add_loop_test(tc, test_give_back_parked_while_leftover_stuck, 0, 2);
  tcase_add_test(tc, test_event_on_default_while_a_blocking_stream_captures);
  tcase_add_test(tc, test_parked_drops_drained_in_relaxed_mode);
  tcase_add_test(tc, test_parked_drops_looked_at_again);
  tcase_add_test(tc, test_work_on_default_while_a_blocking_stream_captures);
#endif
#if defined(CUSAFE_HAVE_DLPACK) && defined(CUSAFE_TEST_FAKE)
  tcase_add_test(tc, test_export_deleted_while_consumer_captures);
  tcase_add_test(tc, test_deleter_fails_once_during_capture);
  tcase_add_test(tc, test_shutdown_with_capture_left_over);
  tcase_add_loop_test(tc, test_shutdown_end_of_capture_fails, 1, 3);
#endif
  suite_add_tcase(s, tc);
#ifdef CUSAFE_TEST_FAKE
  tc = tcase_create("peers"); /* two devices: no context of the fixture's */
  tcase_add_test(tc, test_peer_free_fails);
  tcase_add_test(tc, test_use_on_joined_stream_of_other_device);
  tcase_add_test(tc, test_peer_free_fails_during_capture);
  tcase_add_test(tc, test_parked_wait_on_default_wrapper_of_other_device);
  tcase_add_test(tc,
                 test_handoffs_from_wrapper_while_other_code_begins_a_capture);
  suite_add_tcase(s, tc);
  tc = tcase_create("event_records"); /* two devices, as above */
  tcase_add_test(tc, test_record_into_capture_while_a_wait_looks);
  tcase_add_test(tc, test_record_outside_while_a_captured_wait_looks);
  tcase_add_loop_test(tc, test_record_into_capture_while_the_host_waits, 0, 3);
  tcase_add_test(tc, test_record_outside_while_a_join_looks);
  tcase_add_test(tc, test_record_in_capture_of_other_code_while_the_host_waits);
  suite_add_tcase(s, tc);
#endif
  /* One case per scenario, named after it (CK_RUN_CASE=<name>). */
  for (int i = 0; i < NSCENARIOS; i++) {
    tc = tcase_create(scenarios[i].name);
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_scenario, i, i + 1);
    suite_add_tcase(s, tc);
  }
  return s;
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
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
