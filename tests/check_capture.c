/* check_capture.c -- the rules of CUDA stream capture and graphs that
 * cusafe relies on, checked against the fake (check_capture_fake) and
 * against the real runtime (check_capture_gpu, skipped without a GPU).
 *
 * Both programs make the same CUDA calls through a table of the shape of
 * lib/cuda_api.h: the fake's, or lib/cuda_real.c's compiled into the GPU
 * program.  So every outcome the fake gives here is one a GPU gave too:
 * the model the library's own capture tests stand on is checked against
 * the hardware wherever there is one.  A few tests are the fake's only:
 * its live counts and the VIOLATIONs that stand for a crash on a GPU. */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builtin.h"
#include "cuda_api.h"
#ifdef CAPTURE_FAKE
#include "fakecuda.h"
#endif

#define CU(expr)                                                               \
  do {                                                                         \
    cudaError_t cu_e_ = (expr);                                                \
    ck_assert_msg(cu_e_ == cudaSuccess, "%s: %s (%d)", #expr,                  \
                  cs_cu->get_error_name(cu_e_), (int)cu_e_);                   \
  } while (0)
#define CU_IS(expr, want)                                                      \
  do {                                                                         \
    cudaError_t cu_e_ = (expr), cu_w_ = (want);                                \
    ck_assert_msg(cu_e_ == cu_w_, "%s: %s (%d), expected %s (%d)", #expr,      \
                  cs_cu->get_error_name(cu_e_), (int)cu_e_,                    \
                  cs_cu->get_error_name(cu_w_), (int)cu_w_);                   \
  } while (0)

enum { N = 16 }; /* floats in the test buffer */

/* What every test uses: a non-blocking stream s, a blocking one blk,
 * another non-blocking one t, a device buffer of N floats set to 0, an
 * event recorded outside any capture on t, one never recorded, and the
 * built-in kernels. */
static struct {
  cudaStream_t s, blk, t;
  float *buf;
  cudaEvent_t outside, never, ev;
  cudaLibrary_t lib;
  cudaKernel_t fill;
} w;

static void setup(void) {
  CU(cs_cu->set_device(0));
  CU(cs_cu->stream_create(&w.s, cudaStreamNonBlocking, 0));
  CU(cs_cu->stream_create(&w.blk, cudaStreamDefault, 0));
  CU(cs_cu->stream_create(&w.t, cudaStreamNonBlocking, 0));
  CU(cs_cu->malloc_async((void **)&w.buf, N * sizeof(float), w.t));
  CU(cs_cu->memset_async(w.buf, 0, N * sizeof(float), w.t));
  CU(cs_cu->event_create(&w.outside, cudaEventDisableTiming));
  CU(cs_cu->event_create(&w.never, cudaEventDisableTiming));
  CU(cs_cu->event_create(&w.ev, cudaEventDisableTiming));
  CU(cs_cu->event_record(w.outside, w.t));
  CU(cs_cu->stream_synchronize(w.t));
  CU(cs_cu->library_load_data(&w.lib, cs_builtin_image, NULL, NULL, 0, NULL,
                              NULL, 0));
  CU(cs_cu->library_get_kernel(&w.fill, w.lib, "cusafe_fill_f32"));
}

/* Ends a capture a test left open, then frees everything. */
static void teardown(void) {
  cudaStream_t all[] = {w.s, w.blk, w.t};
  for (int i = 0; i < 3; i++) {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cs_cu->stream_is_capturing(all[i], &st);
    if (st != cudaStreamCaptureStatusNone) {
      cudaGraph_t g = NULL;
      cs_cu->stream_end_capture(all[i], &g);
      if (g)
        cs_cu->graph_destroy(g);
    }
  }
  CU(cs_cu->device_synchronize());
  cs_cu->get_last_error();
  CU(cs_cu->free_async(w.buf, w.t));
  CU(cs_cu->stream_synchronize(w.t));
  for (int i = 0; i < 3; i++)
    CU(cs_cu->stream_destroy(all[i]));
  CU(cs_cu->event_destroy(w.outside));
  CU(cs_cu->event_destroy(w.never));
  CU(cs_cu->event_destroy(w.ev));
  CU(cs_cu->library_unload(w.lib));
  CU(cs_cu->device_synchronize());
#ifdef CAPTURE_FAKE
  ck_assert_uint_eq(fake_live_graphs(-1), 0);
  ck_assert_uint_eq(fake_live_graph_execs(-1), 0);
  ck_assert_uint_eq(fake_live_captures(-1), 0);
#endif
}

/* The buffer's floats, read on stream t. */
static void read_buf(float out[N]) {
  CU(cs_cu->memcpy_async(out, w.buf, N * sizeof(float), cudaMemcpyDefault,
                         w.t));
  CU(cs_cu->stream_synchronize(w.t));
}

static void fill_on(cudaStream_t s, float value, size_t n) {
  void *args[] = {&w.buf, &value, &n};
  CU(cs_cu->launch_kernel((const void *)w.fill, (dim3){1, 1, 1},
                          (dim3){32, 1, 1}, args, 0, s));
}

/* Ends the capture on s with `want`, checking that it gives no graph
 * unless it succeeds (whose graph it destroys). */
static void end_with(cudaStream_t s, cudaError_t want) {
  cudaGraph_t g = NULL;
  CU_IS(cs_cu->stream_end_capture(s, &g), want);
  if (want == cudaSuccess) {
    ck_assert_ptr_nonnull(g);
    CU(cs_cu->graph_destroy(g));
  } else {
    ck_assert_ptr_null(g);
  }
}

static enum cudaStreamCaptureStatus status_of(cudaStream_t s) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  CU(cs_cu->stream_is_capturing(s, &st));
  return st;
}

/* ------------------------------------------------------------------------ */

/* Captured work does not run; the graph runs it, as often as launched. */
START_TEST(test_capture_and_replay) {
  float got[N];
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
  ck_assert_int_eq(status_of(w.s), cudaStreamCaptureStatusActive);
  CU(cs_cu->memset_async(w.buf, 0xFF, N * sizeof(float), w.s));
  fill_on(w.s, 2.5f, N);
  cudaGraph_t g = NULL;
  CU(cs_cu->stream_end_capture(w.s, &g));
  ck_assert_ptr_nonnull(g);
  ck_assert_int_eq(status_of(w.s), cudaStreamCaptureStatusNone);
  read_buf(got);
  for (int i = 0; i < N; i++)
    ck_assert_float_eq(got[i], 0.0f);
  cudaGraphExec_t x = NULL;
  CU(cs_cu->graph_instantiate(&x, g, 0));
  CU(cs_cu->graph_destroy(g)); /* the executable graph lives on */
  CU(cs_cu->memset_async(w.buf, 0, N * sizeof(float), w.t));
  CU(cs_cu->stream_synchronize(w.t));
  CU(cs_cu->graph_launch(x, w.s));
  CU(cs_cu->graph_launch(x, w.t)); /* ordered after the first */
  CU(cs_cu->stream_synchronize(w.t));
  read_buf(got);
  for (int i = 0; i < N; i++)
    ck_assert_float_eq(got[i], 2.5f);
  CU(cs_cu->graph_exec_destroy(x));
}
END_TEST

START_TEST(test_begin_and_end_errors) {
  CU_IS(cs_cu->stream_begin_capture(cudaStreamLegacy,
                                    cudaStreamCaptureModeGlobal),
        cudaErrorStreamCaptureUnsupported);
  cudaGraph_t g = (cudaGraph_t)&w; /* overwritten with NULL */
  CU_IS(cs_cu->stream_end_capture(w.s, &g), cudaErrorIllegalState);
  ck_assert_ptr_null(g);
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
  CU(cs_cu->memset_async(w.buf, 0, 4, w.s));
  end_with(w.s, cudaSuccess);
  /* An empty capture gives a graph too. */
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeGlobal));
  end_with(w.s, cudaSuccess);
}
END_TEST

/* Global and ThreadLocal: the capturing thread's potentially unsafe calls
 * fail and invalidate the capture.  Relaxed: they work. */
START_TEST(test_unsafe_calls_by_mode) {
  static const enum cudaStreamCaptureMode modes[] = {
      cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
      cudaStreamCaptureModeRelaxed};
  for (int m = 0; m < 3; m++) {
    int relaxed = modes[m] == cudaStreamCaptureModeRelaxed;
    cudaError_t want =
        relaxed ? cudaSuccess : cudaErrorStreamCaptureUnsupported;
    for (int call = 0; call < 5; call++) {
      CU(cs_cu->stream_begin_capture(w.s, modes[m]));
      CU(cs_cu->memset_async(w.buf, 0, 4, w.s));
      void *p = NULL;
      switch (call) {
      case 0: CU_IS(cs_cu->event_query(w.outside), want); break;
      case 1: CU_IS(cs_cu->stream_synchronize(w.t), want); break;
      case 2: CU_IS(cs_cu->stream_query(w.t), want); break;
      case 3:
        CU_IS(cs_cu->malloc_host(&p, 64), want);
        if (p)
          CU(cs_cu->free_host(p));
        break;
      case 4:
        CU_IS(cs_cu->malloc_async(&p, 64, w.t), want);
        if (p)
          CU(cs_cu->free_async(p, w.t));
        break;
      }
      cs_cu->get_last_error();
      ck_assert_int_eq(status_of(w.s),
                       relaxed ? cudaStreamCaptureStatusActive
                               : cudaStreamCaptureStatusInvalidated);
      if (!relaxed) /* every operation fails from then on */
        CU_IS(cs_cu->memset_async(w.buf, 0, 4, w.s),
              cudaErrorStreamCaptureInvalidated);
      end_with(w.s, relaxed ? cudaSuccess : cudaErrorStreamCaptureInvalidated);
      cs_cu->get_last_error();
    }
  }
}
END_TEST

/* In every mode: the capturing stream cannot be queried or synchronized,
 * nor the device, nor an event recorded in the capture. */
START_TEST(test_conflicting_calls) {
  for (int call = 0; call < 5; call++) {
    CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
    CU(cs_cu->memset_async(w.buf, 0, 4, w.s));
    CU(cs_cu->event_record(w.ev, w.s));
    switch (call) {
    case 0:
      CU_IS(cs_cu->stream_query(w.s), cudaErrorStreamCaptureUnsupported);
      break;
    case 1:
      CU_IS(cs_cu->stream_synchronize(w.s), cudaErrorStreamCaptureUnsupported);
      break;
    case 2:
      CU_IS(cs_cu->device_synchronize(), cudaErrorStreamCaptureUnsupported);
      break;
    case 3: CU_IS(cs_cu->event_query(w.ev), cudaErrorCapturedEvent); break;
    case 4:
      CU_IS(cs_cu->event_synchronize(w.ev), cudaErrorCapturedEvent);
      break;
    }
    cs_cu->get_last_error();
    ck_assert_int_eq(status_of(w.s), cudaStreamCaptureStatusInvalidated);
    end_with(w.s, cudaErrorStreamCaptureInvalidated);
    cs_cu->get_last_error();
  }
  /* After the capture an event recorded in it is no event to wait for,
   * until recorded again. */
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
  CU(cs_cu->event_record(w.ev, w.s));
  end_with(w.s, cudaSuccess);
  CU_IS(cs_cu->event_query(w.ev), cudaErrorInvalidValue);
  cs_cu->get_last_error();
  CU(cs_cu->event_record(w.ev, w.t));
  CU(cs_cu->event_synchronize(w.ev));
}
END_TEST

/* A capture depends on other streams only through events recorded in it:
 * a stream that waits for one joins the capture and must be joined back. */
/* Each capture has its own id, which a stream that joined it reports too;
 * an invalidated capture has none (0), and is ended by its failed end:
 * what a failed end's leftover mark relies on (lib/graph.c). */
static unsigned long long capture_id(cudaStream_t s,
                                     enum cudaStreamCaptureStatus want) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  CU(cs_cu->stream_get_capture_info(s, &st, &id, NULL, NULL, NULL, NULL));
  ck_assert_int_eq(st, want);
  return id;
}

START_TEST(test_capture_ids) {
  capture_id(w.s, cudaStreamCaptureStatusNone);
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
  unsigned long long first = capture_id(w.s, cudaStreamCaptureStatusActive);
  ck_assert_uint_ne(first, 0);
  CU(cs_cu->event_record(w.ev, w.s));
  CU(cs_cu->stream_wait_event(w.t, w.ev, 0));
  ck_assert_uint_eq(capture_id(w.t, cudaStreamCaptureStatusActive), first);
  CU(cs_cu->event_record(w.ev, w.t));
  CU(cs_cu->stream_wait_event(w.s, w.ev, 0));
  end_with(w.s, cudaSuccess);
  capture_id(w.t, cudaStreamCaptureStatusNone);
  CU(cs_cu->stream_begin_capture(w.t, cudaStreamCaptureModeRelaxed));
  unsigned long long second = capture_id(w.t, cudaStreamCaptureStatusActive);
  ck_assert_uint_ne(second, 0);
  ck_assert_uint_ne(second, first);
  CU_IS(cs_cu->stream_wait_event(w.t, w.outside, 0),
        cudaErrorStreamCaptureIsolation);
  cs_cu->get_last_error();
  ck_assert_uint_eq(capture_id(w.t, cudaStreamCaptureStatusInvalidated), 0);
  end_with(w.t, cudaErrorStreamCaptureInvalidated);
  cs_cu->get_last_error();
  capture_id(w.t, cudaStreamCaptureStatusNone);
}
END_TEST

START_TEST(test_waits) {
  /* On work outside the capture: isolation, unless it is an event wait
   * node; on an event never recorded: nothing. */
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
  CU_IS(cs_cu->stream_wait_event(w.s, w.outside, 0),
        cudaErrorStreamCaptureIsolation);
  cs_cu->get_last_error();
  end_with(w.s, cudaErrorStreamCaptureInvalidated);
  cs_cu->get_last_error();
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
  CU(cs_cu->stream_wait_event(w.s, w.never, 0));
  CU(cs_cu->stream_wait_event(w.s, w.outside, cudaEventWaitExternal));
  end_with(w.s, cudaSuccess);
  CU_IS(cs_cu->stream_wait_event(w.s, w.outside, cudaEventWaitExternal),
        cudaErrorIllegalState);
  cs_cu->get_last_error();
  /* Fork and join. */
  float got[N];
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
  CU(cs_cu->event_record(w.ev, w.s));
  CU(cs_cu->stream_wait_event(w.t, w.ev, 0));
  ck_assert_int_eq(status_of(w.t), cudaStreamCaptureStatusActive);
  fill_on(w.t, 7.0f, N);
  CU(cs_cu->event_record(w.ev, w.t));
  CU(cs_cu->stream_wait_event(w.s, w.ev, 0));
  cudaGraph_t g = NULL;
  CU(cs_cu->stream_end_capture(w.s, &g));
  ck_assert_int_eq(status_of(w.t), cudaStreamCaptureStatusNone);
  cudaGraphExec_t x = NULL;
  CU(cs_cu->graph_instantiate(&x, g, 0));
  CU(cs_cu->graph_launch(x, w.s));
  CU(cs_cu->stream_synchronize(w.s));
  read_buf(got);
  ck_assert_float_eq(got[N - 1], 7.0f);
  CU(cs_cu->graph_exec_destroy(x));
  CU(cs_cu->graph_destroy(g));
  /* Fork without a join. */
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
  CU(cs_cu->event_record(w.ev, w.s));
  CU(cs_cu->stream_wait_event(w.t, w.ev, 0));
  fill_on(w.t, 1.0f, N);
  end_with(w.s, cudaErrorStreamCaptureUnjoined);
  cs_cu->get_last_error();
  ck_assert_int_eq(status_of(w.t), cudaStreamCaptureStatusNone);
}
END_TEST

/* The legacy stream while a blocking stream captures. */
START_TEST(test_legacy_stream) {
  CU(cs_cu->stream_begin_capture(w.blk, cudaStreamCaptureModeRelaxed));
  enum cudaStreamCaptureStatus st;
  CU_IS(cs_cu->stream_is_capturing(cudaStreamLegacy, &st),
        cudaErrorStreamCaptureImplicit);
  cs_cu->get_last_error();
  ck_assert_int_eq(status_of(w.blk), cudaStreamCaptureStatusActive);
  CU_IS(cs_cu->memset_async(w.buf, 0, 4, cudaStreamLegacy),
        cudaErrorStreamCaptureImplicit);
  cs_cu->get_last_error();
  ck_assert_int_eq(status_of(w.blk), cudaStreamCaptureStatusInvalidated);
  end_with(w.blk, cudaErrorStreamCaptureInvalidated);
  cs_cu->get_last_error();
  /* A non-blocking capture leaves the legacy stream alone. */
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeGlobal));
  CU(cs_cu->memset_async(w.buf, 0, 4, cudaStreamLegacy));
  CU(cs_cu->memset_async(w.buf, 0, 4, w.blk));
  end_with(w.s, cudaSuccess);
}
END_TEST

/* A free node frees only the graph's own allocations: memory from outside
 * is refused, and the capture goes on. */
START_TEST(test_free_of_outside_memory) {
  void *p = NULL;
  CU(cs_cu->malloc_async(&p, 256, w.t));
  CU(cs_cu->stream_synchronize(w.t));
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeGlobal));
  CU_IS(cs_cu->free_async(p, w.s), cudaErrorInvalidValue);
  cs_cu->get_last_error();
  ck_assert_int_eq(status_of(w.s), cudaStreamCaptureStatusActive);
  end_with(w.s, cudaSuccess);
  CU(cs_cu->free_async(p, w.t));
  CU(cs_cu->stream_synchronize(w.t));
}
END_TEST

/* A captured copy from pageable memory reads it when the graph runs. */
START_TEST(test_pageable_copy_reads_at_replay) {
  static float host[N];
  float got[N];
  for (int i = 0; i < N; i++)
    host[i] = 1.0f;
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
  CU(cs_cu->memcpy_async(w.buf, host, sizeof host, cudaMemcpyHostToDevice,
                         w.s));
  cudaGraph_t g = NULL;
  CU(cs_cu->stream_end_capture(w.s, &g));
  cudaGraphExec_t x = NULL;
  CU(cs_cu->graph_instantiate(&x, g, 0));
  for (int i = 0; i < N; i++)
    host[i] = 42.0f;
  CU(cs_cu->graph_launch(x, w.s));
  CU(cs_cu->stream_synchronize(w.s));
  read_buf(got);
  ck_assert_float_eq(got[0], 42.0f);
  CU(cs_cu->graph_exec_destroy(x));
  CU(cs_cu->graph_destroy(g));
}
END_TEST

/* An executable graph destroyed right after its launch: the launch runs. */
START_TEST(test_exec_destroyed_in_flight) {
  float got[N];
#ifdef CAPTURE_FAKE
  fake_set_paused(1);
#endif
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
  fill_on(w.s, 3.0f, N);
  cudaGraph_t g = NULL;
  CU(cs_cu->stream_end_capture(w.s, &g));
  cudaGraphExec_t x = NULL;
  CU(cs_cu->graph_instantiate(&x, g, 0));
  CU(cs_cu->graph_destroy(g));
  CU(cs_cu->graph_launch(x, w.s));
  CU(cs_cu->graph_exec_destroy(x));
#ifdef CAPTURE_FAKE
  ck_assert_uint_eq(fake_live_graph_execs(0), 1); /* until its launch ran */
#endif
  CU(cs_cu->stream_synchronize(w.s));
#ifdef CAPTURE_FAKE
  ck_assert_uint_eq(fake_live_graph_execs(0), 0);
  fake_set_paused(0);
#endif
  read_buf(got);
  ck_assert_float_eq(got[0], 3.0f);
}
END_TEST

/* An event wait node waits for the record its event had when the graph was
 * launched, as cudaStreamWaitEvent waits for the one it had at its call: a
 * record made after the launch is not the launch's (measured on an H200,
 * CUDA 13.0: a node behind 0.3 s of work ran at 0.3 s, though the event
 * was recorded again at once behind 1.5 s of work).  Here that record
 * follows work that waits for the launch, which a wait for it would turn
 * into a cycle. */
START_TEST(test_wait_node_takes_record_at_launch) {
  float got[N];
#ifdef CAPTURE_FAKE
  fake_set_paused(1);
#endif
  CU(cs_cu->event_record(w.ev, w.t));
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
  CU(cs_cu->stream_wait_event(w.s, w.ev, cudaEventWaitExternal));
  fill_on(w.s, 1.0f, N);
  cudaGraph_t g = NULL;
  CU(cs_cu->stream_end_capture(w.s, &g));
  cudaGraphExec_t x = NULL;
  CU(cs_cu->graph_instantiate(&x, g, 0));
  CU(cs_cu->graph_launch(x, w.s));
  /* t: after the launch, then 2.0, then ev again */
  cudaEvent_t launched = NULL;
  CU(cs_cu->event_create(&launched, cudaEventDisableTiming));
  CU(cs_cu->event_record(launched, w.s));
  CU(cs_cu->stream_wait_event(w.t, launched, 0));
  fill_on(w.t, 2.0f, N);
  CU(cs_cu->event_record(w.ev, w.t));
  CU(cs_cu->stream_synchronize(w.s));
  CU(cs_cu->stream_synchronize(w.t));
#ifdef CAPTURE_FAKE
  fake_set_paused(0);
#endif
  read_buf(got);
  for (int i = 0; i < N; i++)
    ck_assert_msg(got[i] == 2.0f,
                  "element %d is %g, expected 2: the launch's node waited "
                  "for a record made after the launch",
                  i, (double)got[i]);
  CU(cs_cu->event_destroy(launched));
  CU(cs_cu->graph_exec_destroy(x));
  CU(cs_cu->graph_destroy(g));
}
END_TEST

/* Other threads. */
struct other {
  int what;
  cudaStream_t s;
  cudaError_t result;
};

static void *other_main(void *arg) {
  struct other *o = arg;
  cs_cu->set_device(0);
  switch (o->what) {
  case 0: o->result = cs_cu->event_query(w.outside); break;
  case 1: {
    cudaGraph_t g = NULL;
    o->result = cs_cu->stream_end_capture(o->s, &g);
    if (g)
      cs_cu->graph_destroy(g);
    break;
  }
  }
  return NULL;
}

static cudaError_t on_other_thread(int what, cudaStream_t s) {
  struct other o = {what, s, cudaSuccess};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, other_main, &o), 0);
  ck_assert_int_eq(pthread_join(th, NULL), 0);
  return o.result;
}

START_TEST(test_other_threads) {
  /* A Global capture forbids every thread's unsafe calls. */
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeGlobal));
  CU_IS(on_other_thread(0, NULL), cudaErrorStreamCaptureUnsupported);
  end_with(w.s, cudaErrorStreamCaptureInvalidated);
  cs_cu->get_last_error();
  /* ThreadLocal and Relaxed ones only their own thread's, if that. */
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeThreadLocal));
  CU(on_other_thread(0, NULL));
  end_with(w.s, cudaSuccess);
  /* A thread in Relaxed mode may make unsafe calls during its own Global
   * capture. */
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeGlobal));
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  CU(cs_cu->thread_exchange_stream_capture_mode(&mode));
  ck_assert_int_eq(mode, cudaStreamCaptureModeGlobal);
  CU(cs_cu->event_query(w.outside));
  CU(cs_cu->thread_exchange_stream_capture_mode(&mode));
  ck_assert_int_eq(mode, cudaStreamCaptureModeRelaxed);
  end_with(w.s, cudaSuccess);
  /* Ending from another thread: refused unless Relaxed, and either way
   * the capture is over. */
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeGlobal));
  CU_IS(on_other_thread(1, w.s), cudaErrorStreamCaptureWrongThread);
  ck_assert_int_eq(status_of(w.s), cudaStreamCaptureStatusNone);
  end_with(w.s, cudaErrorIllegalState);
  cs_cu->get_last_error();
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
  CU(on_other_thread(1, w.s));
  end_with(w.s, cudaErrorIllegalState);
  cs_cu->get_last_error();
}
END_TEST

#ifdef CAPTURE_FAKE
/* The fake's VIOLATIONs, which stand for what would crash a GPU. */

/* Memory freed while an executable graph uses it. */
START_TEST(test_replay_of_freed_memory_aborts) {
  void *p = NULL;
  CU(cs_cu->malloc_async(&p, 64, w.t));
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
  CU(cs_cu->memset_async(p, 0, 64, w.s));
  cudaGraph_t g = NULL;
  CU(cs_cu->stream_end_capture(w.s, &g));
  cudaGraphExec_t x = NULL;
  CU(cs_cu->graph_instantiate(&x, g, 0));
  CU(cs_cu->free_async(p, w.t));
  CU(cs_cu->stream_synchronize(w.t));
  cs_cu->graph_launch(x, w.s); /* a VIOLATION when it runs */
}
END_TEST

/* A library unloaded while a graph launches one of its kernels. */
START_TEST(test_unload_under_a_graph_aborts) {
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
  fill_on(w.s, 1.0f, N);
  cudaGraph_t g = NULL;
  CU(cs_cu->stream_end_capture(w.s, &g));
  cs_cu->library_unload(w.lib); /* a VIOLATION */
}
END_TEST

/* A stream destroyed while it captures. */
START_TEST(test_destroy_capturing_stream_aborts) {
  CU(cs_cu->stream_begin_capture(w.s, cudaStreamCaptureModeRelaxed));
  cs_cu->stream_destroy(w.s); /* a VIOLATION */
}
END_TEST
#endif

static Suite *capture_suite(void) {
  Suite *s = suite_create("capture");
  TCase *tc = tcase_create("rules");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_capture_and_replay);
  tcase_add_test(tc, test_begin_and_end_errors);
  tcase_add_test(tc, test_unsafe_calls_by_mode);
  tcase_add_test(tc, test_conflicting_calls);
  tcase_add_test(tc, test_capture_ids);
  tcase_add_test(tc, test_waits);
  tcase_add_test(tc, test_legacy_stream);
  tcase_add_test(tc, test_free_of_outside_memory);
  tcase_add_test(tc, test_pageable_copy_reads_at_replay);
  tcase_add_test(tc, test_exec_destroyed_in_flight);
  tcase_add_test(tc, test_wait_node_takes_record_at_launch);
  tcase_add_test(tc, test_other_threads);
  suite_add_tcase(s, tc);
#ifdef CAPTURE_FAKE
  TCase *v = tcase_create("violations");
  tcase_add_checked_fixture(v, setup, NULL);
  tcase_add_test_raise_signal(v, test_replay_of_freed_memory_aborts, SIGABRT);
  tcase_add_test_raise_signal(v, test_unload_under_a_graph_aborts, SIGABRT);
  tcase_add_test_raise_signal(v, test_destroy_capturing_stream_aborts, SIGABRT);
  suite_add_tcase(s, v);
#endif
  return s;
}

int main(void) {
  Suite *s = capture_suite();
  SRunner *sr = srunner_create(s);
#ifdef CAPTURE_FAKE
  srunner_set_fork_status(sr, CK_FORK);
#else
  /* One process: CUDA, once initialised, is no use in a forked child. */
  int n = 0;
  cudaError_t e = cs_cu->get_device_count(&n);
  if (e != cudaSuccess || n == 0) {
    printf("no CUDA device: skipping (%s)\n", cs_cu->get_error_string(e));
    srunner_free(sr);
    return 77;
  }
  srunner_set_fork_status(sr, CK_NOFORK);
#endif
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
