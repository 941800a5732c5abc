/* check_graph.c -- stream capture and graphs through cusafe: what a graph
 * holds, replays ordered with other work, what a capture refuses, and the
 * shutdown with captures open and replays queued.  Built twice: against
 * the fake CUDA (check_graph_fake, with its live counts and VIOLATIONs)
 * and against the real runtime (check_graph_gpu, skipped without a GPU). */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cusafe.h"
#include "testutil.h"
#ifdef CUSAFE_TEST_FAKE
#include "cuda_api.h"
#include "fakeutil.h"
#endif

enum { N = 1024 }; /* floats per buffer */

struct world {
  cusafe_context ctx;
  cusafe_stream s, t;
  cusafe_module mod;
  cusafe_kernel fill, scale, axpy;
  cusafe_buffer x, y;
};

static void world_make(struct world *w) {
  memset(w, 0, sizeof *w);
  TU_OK(cusafe_context_create(&w->ctx, 0));
  TU_OK(cusafe_stream_create(&w->s, w->ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_create(&w->t, w->ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_module_load_builtin(&w->mod, w->ctx));
  w->fill = tu_get_kernel(w->mod, "cusafe_fill_f32");
  w->scale = tu_get_kernel(w->mod, "cusafe_scale_f32");
  w->axpy = tu_get_kernel(w->mod, "cusafe_axpy_f32");
  TU_OK(cusafe_buffer_alloc(&w->x, w->ctx, CUSAFE_MEMORY_DEVICE,
                            N * sizeof(float)));
  TU_OK(cusafe_buffer_alloc(&w->y, w->ctx, CUSAFE_MEMORY_DEVICE,
                            N * sizeof(float)));
}

static void world_release(struct world *w) {
  cusafe_handle all[] = {w->x,   w->y, w->fill, w->scale, w->axpy,
                         w->mod, w->s, w->t,    w->ctx};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    TU_OK(cusafe_release(all[i]));
}

/* A new event, recorded on w->t after what is queued there, and a capture
 * begun on w->s whose first node waits for it (at each replay). */
static cusafe_event begin_capture_after_outside_event(struct world *w) {
  cusafe_event ev;
  TU_OK(cusafe_event_create(&ev, w->ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_event_record(ev, w->t));
  TU_OK(cusafe_stream_begin_capture(w->s));
  TU_OK(cusafe_stream_wait_event(w->s, ev));
  return ev;
}

/* A launch of one of the built-in f32 kernels over n floats of buf. */
static cusafe_status run1(cusafe_kernel k, cusafe_stream s, cusafe_buffer buf,
                          float a, size_t n, cusafe_buffer other) {
  cusafe_launch_config c = {
      {(uint32_t)((n + 255) / 256), 1, 1}, {256, 1, 1}, 0, s};
  cusafe_arg args[4];
  size_t nargs = 0;
  args[nargs++] = CUSAFE_ARG_BUF(buf);
  args[nargs++] = CUSAFE_ARG_F32V(a);
  if (other)
    args[nargs++] = CUSAFE_ARG_BUF(other);
  args[nargs++] = CUSAFE_ARG_U64V(n);
  return cusafe_kernel_launch(k, &c, args, nargs);
}

static void read_floats(cusafe_buffer b, float *out, size_t n) {
  TU_OK(cusafe_buffer_read(b, 0, out, n * sizeof(float)));
}

static void expect_all(cusafe_buffer b, size_t n, float want) {
  float *got = tu_xmalloc(n * sizeof *got);
  read_floats(b, got, n);
  for (size_t i = 0; i < n; i++)
    TU_ASSERT(got[i] == want, "element %zu is %g, expected %g", i,
              (double)got[i], (double)want);
  free(got);
}

/* ------------------------------------------------------------------------ */

/* A chain of built-in kernels over views, captured once and replayed: the
 * buffers, kernels and module released after the capture stay valid for
 * every replay. */
START_TEST(test_replay_chain_over_views) {
  struct world w;
  world_make(&w);
  cusafe_buffer lo, hi;
  TU_OK(cusafe_buffer_view(&lo, w.x, 0, N / 2 * sizeof(float)));
  TU_OK(cusafe_buffer_view(&hi, w.x, N / 2 * sizeof(float),
                           N / 2 * sizeof(float)));
  TU_OK(cusafe_stream_begin_capture(w.s));
  int capturing = 0;
  TU_OK(cusafe_stream_is_capturing(&capturing, w.s));
  TU_ASSERT(capturing == 1, "is_capturing says %d", capturing);
  /* lo = 1, hi = 2, lo *= 3, y = 2 * lo + y (y filled with 10 first) */
  TU_OK(run1(w.fill, w.s, lo, 1.0f, N / 2, 0));
  TU_OK(run1(w.fill, w.s, hi, 2.0f, N / 2, 0));
  TU_OK(run1(w.scale, w.s, lo, 3.0f, N / 2, 0));
  TU_OK(run1(w.fill, w.s, w.y, 10.0f, N, 0));
  TU_OK(run1(w.axpy, w.s, w.y, 2.0f, N / 2, lo));
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_end_capture(&g, w.s));
  TU_LIVE(g, CUSAFE_TYPE_GRAPH);
  TU_OK(cusafe_stream_is_capturing(&capturing, w.s));
  TU_ASSERT(capturing == 0, "is_capturing says %d after the end", capturing);
  /* Nothing ran yet. */
  TU_OK(cusafe_buffer_fill(w.x, 0, N * sizeof(float), 0, w.t));
  expect_all(w.x, N, 0.0f);
  /* Everything but the graph and y goes. */
  cusafe_buffer y = w.y;
  TU_OK(cusafe_release(lo));
  TU_OK(cusafe_release(hi));
  TU_OK(cusafe_release(w.x));
  TU_OK(cusafe_release(w.fill));
  TU_OK(cusafe_release(w.scale));
  TU_OK(cusafe_release(w.axpy));
  TU_OK(cusafe_release(w.mod));
  TU_STALE(w.x);
#ifdef CUSAFE_TEST_FAKE
  int replays = 20;
#else
  int replays = 1000;
#endif
  for (int i = 0; i < replays; i++)
    TU_OK(cusafe_graph_launch(g, i % 2 ? w.s : w.t));
  float *got = tu_xmalloc(N * sizeof *got);
  read_floats(y, got, N);
  for (size_t i = 0; i < N; i++) {
    float want = i < N / 2 ? 16.0f : 10.0f; /* 10 + 2 * 3 */
    TU_ASSERT(got[i] == want, "y[%zu] is %g, expected %g", i, (double)got[i],
              (double)want);
  }
  free(got);
  TU_OK(cusafe_graph_release(g));
  TU_STALE(g);
  TU_OK(cusafe_release(y));
  TU_OK(cusafe_release(w.s));
  TU_OK(cusafe_release(w.t));
  TU_OK(cusafe_release(w.ctx));
}
END_TEST

/* Graphs of few and of many buffers (replays find up to two in the
 * graph's handle slot, up to eight in the graph, more on a longer path),
 * replayed over and over on one stream and in turn on two, with other work
 * on their buffers in between: every replay comes after that work and
 * before the next. */
START_TEST(test_replays_of_few_and_many_buffers) {
  struct world w;
  world_make(&w);
  enum { MANY = 12 };
  static const size_t counts[] = {1, 2, 3, 8, 9, MANY};
  TU_OK(run1(w.fill, w.t, w.y, 1.0f, N, 0));
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    size_t nbufs = counts[c];
    cusafe_buffer b[MANY];
    for (size_t i = 0; i < nbufs; i++) {
      TU_OK(cusafe_buffer_alloc(&b[i], w.ctx, CUSAFE_MEMORY_DEVICE,
                                N * sizeof(float)));
      TU_OK(run1(w.fill, w.t, b[i], 1.0f, N, 0));
    }
    TU_OK(cusafe_stream_begin_capture(w.s));
    for (size_t i = 0; i < nbufs; i++)
      TU_OK(run1(w.scale, w.s, b[i], 2.0f, N, 0));
    cusafe_graph g;
    TU_OK(cusafe_stream_end_capture(&g, w.s));
    /* (s synchronised after its replays: the paused fake runs its work
     * then, after the work it waits for.) */
    for (int i = 0; i < 5; i++) /* 1 -> 32, on s */
      TU_OK(cusafe_graph_launch(g, w.s));
    TU_OK(cusafe_stream_synchronize(w.s));
    for (size_t i = 0; i < nbufs; i++) /* 32 + 1 = 33, on t */
      TU_OK(run1(w.axpy, w.t, b[i], 1.0f, N, w.y));
    for (int i = 0; i < 4; i++) { /* 33 -> 528, on t and s in turn */
      TU_OK(cusafe_graph_launch(g, i % 2 ? w.s : w.t));
      if (i % 2) /* s's replay runs; t's work must run first */
        TU_OK(cusafe_stream_synchronize(w.s));
    }
    TU_OK(cusafe_graph_release(g));
    for (size_t i = 0; i < nbufs; i++) {
      expect_all(b[i], N, 528.0f);
      TU_OK(cusafe_release(b[i]));
    }
  }
  world_release(&w);
}
END_TEST

/* A replay is ordered after the work queued before it on the buffers it
 * uses, on any stream, and later work after it. */
START_TEST(test_replay_is_ordered) {
  struct world w;
  world_make(&w);
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(run1(w.scale, w.s, w.x, 2.0f, N, 0));
  cusafe_graph g;
  TU_OK(cusafe_stream_end_capture(&g, w.s));
  TU_OK(cusafe_graph_instantiate(g));        /* the replay's shortest path */
  TU_OK(run1(w.fill, w.t, w.x, 5.0f, N, 0)); /* before the replay */
  TU_OK(cusafe_graph_launch(g, w.s));
  /* (The paused fake runs s now: after the fill only if s waits for it.) */
  TU_OK(cusafe_stream_synchronize(w.s));
  TU_OK(run1(w.scale, w.t, w.x, 3.0f, N, 0)); /* after it */
  expect_all(w.x, N, 30.0f);
  TU_OK(cusafe_graph_release(g));
  world_release(&w);
}
END_TEST

/* Copies and fills between buffers, pinned memory included, and an event
 * recorded in the capture. */
START_TEST(test_copies_fills_events) {
  struct world w;
  world_make(&w);
  cusafe_buffer pinned;
  cusafe_event ev;
  TU_OK(cusafe_buffer_alloc(&pinned, w.ctx, CUSAFE_MEMORY_HOST_PINNED,
                            N * sizeof(float)));
  TU_OK(cusafe_event_create(&ev, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(cusafe_buffer_fill(w.x, 0, N * sizeof(float), 0x3f, w.s));
  TU_OK(cusafe_buffer_copy(pinned, 0, w.x, 0, N * sizeof(float), w.s));
  TU_OK(cusafe_event_record(ev, w.s));
  TU_ERR(cusafe_event_query(ev), CUSAFE_ERROR_CAPTURING,
         "querying event 0x%016llx cannot be done: it was recorded in a "
         "capture that is still open",
         TU_HX(ev));
  TU_ERR(cusafe_event_synchronize(ev), CUSAFE_ERROR_CAPTURING,
         "synchronizing with event 0x%016llx cannot be done: it was "
         "recorded in a capture that is still open",
         TU_HX(ev));
  cusafe_graph g;
  TU_OK(cusafe_stream_end_capture(&g, w.s));
  TU_ERR(cusafe_event_query(ev), CUSAFE_ERROR_INVALID_VALUE,
         "querying event 0x%016llx cannot be done: its latest record was "
         "in a capture, which has ended; record it again",
         TU_HX(ev));
  TU_OK(cusafe_release(ev)); /* the graph holds it */
  TU_OK(cusafe_graph_launch(g, CUSAFE_STREAM_DEFAULT));
  unsigned char got[64], want[64];
  memset(want, 0x3f, sizeof want);
  TU_OK(cusafe_buffer_read(pinned, 0, got, sizeof got));
  TU_BYTES_EQ(got, want, sizeof got);
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_release(pinned));
  world_release(&w);
}
END_TEST

/* What a capture refuses, before CUDA sees it: the capture goes on and
 * gives a working graph. */
START_TEST(test_refused_during_capture) {
  struct world w;
  world_make(&w);
  unsigned char host[64];
  memset(host, 0, sizeof host);
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(run1(w.fill, w.s, w.x, 4.0f, N, 0));
  TU_ERR(cusafe_stream_begin_capture(w.s), CUSAFE_ERROR_CAPTURING,
         "stream 0x%016llx captures already", TU_HX(w.s));
  TU_ERR(cusafe_stream_synchronize(w.s), CUSAFE_ERROR_CAPTURING,
         "synchronizing cannot be done while stream 0x%016llx captures",
         TU_HX(w.s));
  TU_ERR(cusafe_stream_query(w.s), CUSAFE_ERROR_CAPTURING,
         "querying cannot be done while stream 0x%016llx captures", TU_HX(w.s));
  TU_ERR(cusafe_context_synchronize(w.ctx), CUSAFE_ERROR_CAPTURING,
         "synchronizing the context of device 0 cannot be done while one of "
         "its streams captures");
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_buffer_alloc_async(&b, w.s, 64), CUSAFE_ERROR_CAPTURING,
         "an allocation (cusafe_buffer_alloc_async) cannot be done while "
         "stream 0x%016llx captures",
         TU_HX(w.s));
  TU_ASSERT(b == CUSAFE_NULL_HANDLE, "alloc_async left a handle");
  TU_ERR(cusafe_buffer_write_async(w.y, 0, host, sizeof host, w.s),
         CUSAFE_ERROR_CAPTURING,
         "a write from host memory at an address cannot be done while "
         "stream 0x%016llx captures",
         TU_HX(w.s));
  TU_ERR(cusafe_buffer_read_async(w.y, 0, host, sizeof host, w.s),
         CUSAFE_ERROR_CAPTURING,
         "a read into host memory at an address cannot be done while "
         "stream 0x%016llx captures",
         TU_HX(w.s));
  /* Other streams and synchronous transfers go on as usual. */
  TU_OK(cusafe_buffer_write(w.y, 0, host, sizeof host));
  TU_OK(cusafe_stream_synchronize(w.t));
  /* Not the origin, nor capturing. */
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_stream_end_capture(&g, w.t), CUSAFE_ERROR_CAPTURING,
         "stream 0x%016llx does not capture", TU_HX(w.t));
  TU_ASSERT(g == CUSAFE_NULL_HANDLE, "end_capture left a handle");
  TU_OK(cusafe_stream_end_capture(&g, w.s));
  TU_OK(cusafe_graph_launch(g, CUSAFE_STREAM_DEFAULT));
  expect_all(w.x, N, 4.0f);
  /* A replay onto a capturing stream. */
  TU_OK(cusafe_stream_begin_capture(w.t));
  TU_ERR(cusafe_graph_launch(g, w.t), CUSAFE_ERROR_CAPTURING,
         "a graph replay cannot be done while stream 0x%016llx captures",
         TU_HX(w.t));
  cusafe_graph empty;
  TU_OK(cusafe_stream_end_capture(&empty, w.t));
  TU_OK(cusafe_graph_launch(empty, w.t));
  TU_OK(cusafe_graph_release(empty));
  TU_OK(cusafe_graph_release(g));
  world_release(&w);
}
END_TEST

/* Streams fork from and join back into a capture through events; one that
 * is not joined back makes the end fail, and the capture is over. */
START_TEST(test_fork_and_join) {
  struct world w;
  world_make(&w);
  cusafe_event fork_ev, join_ev;
  TU_OK(cusafe_event_create(&fork_ev, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_event_create(&join_ev, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(run1(w.fill, w.s, w.x, 1.0f, N, 0));
  TU_OK(cusafe_event_record(fork_ev, w.s));
  TU_OK(cusafe_stream_wait_event(w.t, fork_ev));
  int capturing = 0;
  TU_OK(cusafe_stream_is_capturing(&capturing, w.t));
  TU_ASSERT(capturing == 1, "the forked stream does not capture");
  /* x moves to t inside the capture: ordered after the fill. */
  TU_OK(run1(w.scale, w.t, w.x, 7.0f, N, 0));
  TU_OK(cusafe_event_record(join_ev, w.t));
  TU_OK(cusafe_stream_wait_event(w.s, join_ev));
  cusafe_graph g;
  TU_ERR(cusafe_stream_end_capture(&g, w.t), CUSAFE_ERROR_CAPTURING,
         "stream 0x%016llx joined a capture that began on stream 0x%016llx: "
         "end it there",
         TU_HX(w.t), TU_HX(w.s));
  TU_OK(cusafe_stream_end_capture(&g, w.s));
  TU_OK(cusafe_stream_is_capturing(&capturing, w.t));
  TU_ASSERT(capturing == 0, "the joined stream still captures");
  TU_OK(cusafe_graph_launch(g, w.s));
  expect_all(w.x, N, 7.0f);
  TU_OK(cusafe_graph_release(g));
  /* Not joined back. */
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(cusafe_event_record(fork_ev, w.s));
  TU_OK(cusafe_stream_wait_event(w.t, fork_ev));
  TU_OK(run1(w.fill, w.t, w.y, 2.0f, N, 0));
  g = CUSAFE_NULL_HANDLE;
  TU_ERR_PREFIX(cusafe_stream_end_capture(&g, w.s), CUSAFE_ERROR_CUDA,
                "cudaStreamEndCapture failed: ");
  TU_ASSERT(g == CUSAFE_NULL_HANDLE, "a failed end gave a graph");
  TU_OK(cusafe_stream_is_capturing(&capturing, w.t));
  TU_ASSERT(capturing == 0, "the forked stream still captures");
  TU_OK(cusafe_release(fork_ev));
  TU_OK(cusafe_release(join_ev));
  world_release(&w);
}
END_TEST

/* A capturing stream's wait for an event recorded outside is a node that
 * waits at each replay; the graph holds the event. */
START_TEST(test_wait_for_outside_event) {
  struct world w;
  world_make(&w);
  TU_OK(run1(w.fill, w.t, w.x, 3.0f, N, 0));
  cusafe_event ev = begin_capture_after_outside_event(&w);
  TU_OK(run1(w.fill, w.s, w.y, 1.0f, N, 0));
  cusafe_graph g;
  TU_OK(cusafe_stream_end_capture(&g, w.s));
  TU_OK(cusafe_release(ev));
  TU_OK(cusafe_graph_launch(g, w.s));
  expect_all(w.y, N, 1.0f);
  TU_OK(cusafe_graph_release(g));
  world_release(&w);
}
END_TEST

/* A replay's wait for an outside event waits for the event's record before
 * the replay: one made later, after work that follows the replay, is not
 * the replay's.  Neither is the free of memory that this work used last,
 * queued before that record: the replay's work, and what follows it on
 * its stream, run before it, also where the graph's release waits for
 * the replay. */
START_TEST(test_outside_event_recorded_again_after_replay) {
  struct world w;
  world_make(&w);
  cusafe_event ev = begin_capture_after_outside_event(&w);
  cusafe_graph g;
  TU_OK(cusafe_stream_end_capture(&g, w.s));
#ifdef CUSAFE_TEST_FAKE
  fake_set_paused(1);
#endif
  TU_OK(cusafe_graph_launch(g, w.s));
  TU_OK(cusafe_buffer_fill(w.x, 0, N * sizeof(float), 1, w.s));
  TU_OK(cusafe_buffer_fill(w.x, 0, N * sizeof(float), 2, w.t));
  TU_OK(cusafe_event_record(ev, w.t));
  TU_OK(cusafe_stream_synchronize(w.s));
  unsigned char *got = tu_xmalloc(N * sizeof(float));
  TU_OK(cusafe_buffer_read(w.x, 0, got, N * sizeof(float)));
  for (size_t i = 0; i < N * sizeof(float); i++)
    TU_ASSERT(got[i] == 2, "byte %zu is %u, expected 2", i, got[i]);
  free(got);
  /* The same with x's memory freed after its last work, on t. */
  cusafe_buffer x = w.x;
  w.x = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_graph_launch(g, w.s));
  TU_OK(cusafe_buffer_fill(x, 0, N * sizeof(float), 3, w.s));
  TU_OK(cusafe_buffer_fill(x, 0, N * sizeof(float), 4, w.t));
  TU_OK(cusafe_release(x));
  TU_OK(cusafe_event_record(ev, w.t));
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_release(ev));
#ifdef CUSAFE_TEST_FAKE
  fake_set_paused(0);
#endif
  TU_OK(cusafe_context_synchronize(w.ctx));
  world_release(&w);
}
END_TEST

/* A graph replays on any stream of its context -- its own stream, one
 * that wraps another's CUDA stream -- and on none of another context: the
 * error names both devices, before the executable graph is made and
 * after. */
START_TEST(test_replay_streams) {
  struct world w;
  world_make(&w);
  TU_OK(run1(w.fill, w.t, w.x, 1.0f, N, 0));
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(run1(w.scale, w.s, w.x, 2.0f, N, 0));
  cusafe_graph g;
  TU_OK(cusafe_stream_end_capture(&g, w.s));
  int devices = 0;
  TU_OK(cusafe_device_count(&devices));
  if (devices >= 2) {
    cusafe_context c1;
    cusafe_stream s1;
    TU_OK(cusafe_context_create(&c1, 1));
    TU_OK(cusafe_stream_create(&s1, c1, CUSAFE_STREAM_NON_BLOCKING, 0));
    for (int i = 0; i < 2; i++) {
      TU_ERR(cusafe_graph_launch(g, s1), CUSAFE_ERROR_CONTEXT_MISMATCH,
             "stream belongs to device 1 but graph belongs to device 0");
      TU_OK(cusafe_graph_instantiate(g));
    }
    TU_OK(cusafe_release(s1));
    TU_OK(cusafe_release(c1));
  }
  void *cuda_stream;
  TU_OK(cusafe_stream_interop_handle(&cuda_stream, w.t));
  cusafe_stream wrapped;
  TU_OK(cusafe_stream_wrap(&wrapped, w.ctx, cuda_stream));
  TU_OK(cusafe_graph_launch(g, wrapped));               /* 2 */
  TU_OK(cusafe_graph_launch(g, wrapped));               /* 4 */
  TU_OK(cusafe_graph_launch(g, CUSAFE_STREAM_DEFAULT)); /* 8 */
  TU_OK(cusafe_graph_launch(g, w.s));                   /* 16 */
  TU_OK(cusafe_graph_launch(g, wrapped));               /* 32 */
  expect_all(w.x, N, 32.0f);
  TU_OK(cusafe_release(wrapped));
  TU_OK(cusafe_graph_release(g));
  world_release(&w);
}
END_TEST

/* Handles: a graph is a handle like the others. */
START_TEST(test_graph_handles) {
  struct world w;
  world_make(&w);
  TU_OK(cusafe_stream_begin_capture(w.s));
  cusafe_graph g;
  TU_OK(cusafe_stream_end_capture(&g, w.s));
  TU_OK(cusafe_graph_retain(g));
  TU_OK(cusafe_graph_instantiate(g));
  TU_OK(cusafe_graph_instantiate(g));
  TU_OK(cusafe_graph_release(g));
  TU_LIVE(g, CUSAFE_TYPE_GRAPH);
  TU_ERR(cusafe_graph_launch(w.s, w.s), CUSAFE_ERROR_INVALID_HANDLE,
         "graph 0x%016llx is a stream, not a graph", TU_HX(w.s));
  TU_ERR(cusafe_graph_release(w.s), CUSAFE_ERROR_INVALID_HANDLE,
         "graph 0x%016llx is a stream, not a graph", TU_HX(w.s));
  TU_OK(cusafe_graph_release(g));
  TU_STALE(g);
  TU_ERR(cusafe_graph_launch(g, w.s), CUSAFE_ERROR_INVALID_HANDLE,
         "graph 0x%016llx is stale: its object was released", TU_HX(g));
  TU_OK(cusafe_graph_release(CUSAFE_NULL_HANDLE));
  world_release(&w);
}
END_TEST

#ifdef CUSAFE_TEST_FAKE
/* The graph holds its memory until its last replay has run, also when it
 * is released with replays queued. */
START_TEST(test_release_with_replays_queued) {
  struct world w;
  world_make(&w);
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(run1(w.fill, w.s, w.x, 9.0f, N, 0));
  cusafe_graph g;
  TU_OK(cusafe_stream_end_capture(&g, w.s));
  size_t before = fake_live_allocations(-1);
  fake_set_paused(1);
  TU_OK(cusafe_graph_launch(g, w.s));
  TU_OK(cusafe_graph_launch(g, w.t));
  TU_OK(cusafe_release(w.x));
  TU_OK(cusafe_graph_release(g));
  TU_ASSERT(fake_live_allocations(-1) == before,
            "memory freed with replays queued");
  TU_ASSERT(fake_live_graph_execs(-1) == 1,
            "%zu executable graphs alive, expected 1 until its replays ran",
            fake_live_graph_execs(-1));
  fake_set_paused(0);
  TU_OK(cusafe_stream_synchronize(w.t));
  TU_OK(cusafe_context_synchronize(w.ctx));
  TU_ASSERT(fake_live_allocations(-1) == before - 1,
            "%zu allocations alive, expected %zu", fake_live_allocations(-1),
            before - 1);
  TU_ASSERT(fake_live_graph_execs(-1) == 0 && fake_live_graphs(-1) == 0,
            "graphs alive after release");
  w.x = CUSAFE_NULL_HANDLE;
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

/* The shutdown ends open captures and destroys graphs with replays queued
 * before the buffers and modules they hold. */
START_TEST(test_shutdown_with_capture_and_replays) {
  struct world w;
  world_make(&w);
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(run1(w.fill, w.s, w.x, 1.0f, N, 0));
  cusafe_graph g;
  TU_OK(cusafe_stream_end_capture(&g, w.s));
  fake_set_paused(1);
  TU_OK(cusafe_graph_launch(g, w.t));
  TU_OK(cusafe_stream_begin_capture(w.s)); /* left open */
  TU_OK(run1(w.scale, w.s, w.y, 2.0f, N, 0));
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

/* The last release of the stream a capture began on ends the capture,
 * discarding it: what it held goes, buffers last used on the stream
 * included (which hold the stream in turn). */
START_TEST(test_release_of_capturing_stream_ends_capture) {
  struct world w;
  world_make(&w);
  TU_OK(cusafe_buffer_fill(w.x, 0, 64, 1, w.s)); /* x holds s */
  size_t before = fake_live_allocations(-1);
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(run1(w.fill, w.s, w.x, 2.0f, N, 0)); /* the capture holds x */
  TU_OK(cusafe_release(w.x));
  TU_ASSERT(fake_live_captures(-1) == 1, "no capture open");
  TU_OK(cusafe_release(w.s));
  TU_ASSERT(fake_live_captures(-1) == 0, "the capture outlived its stream");
  TU_OK(cusafe_context_synchronize(w.ctx));
  TU_ASSERT(fake_live_allocations(-1) == before - 1,
            "%zu allocations alive, expected %zu", fake_live_allocations(-1),
            before - 1);
  w.x = w.s = CUSAFE_NULL_HANDLE;
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

/* What the capture held is dropped when its end fails. */
START_TEST(test_failed_end_drops_what_it_held) {
  struct world w;
  world_make(&w);
  cusafe_event fork_ev;
  TU_OK(cusafe_event_create(&fork_ev, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(cusafe_event_record(fork_ev, w.s));
  TU_OK(cusafe_stream_wait_event(w.t, fork_ev));
  TU_OK(run1(w.fill, w.t, w.y, 2.0f, N, 0));
  size_t before = fake_live_allocations(-1);
  TU_OK(cusafe_release(w.y));
  TU_ASSERT(fake_live_allocations(-1) == before, "held memory freed");
  cusafe_graph g;
  TU_STATUS(cusafe_stream_end_capture(&g, w.s), CUSAFE_ERROR_CUDA);
  TU_OK(cusafe_context_synchronize(w.ctx));
  TU_ASSERT(fake_live_allocations(-1) == before - 1,
            "memory of a failed capture not freed");
  w.y = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_release(fork_ev));
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST
/* A capture whose end fails twice (its streams may still capture, into
 * nothing) is ended again when its streams go; the shutdown destroys the
 * stream it began on before a stream that joined it (in slot order),
 * whose end then touches nothing of the one already gone. */
START_TEST(test_shutdown_after_failed_ends_with_joined_stream) {
  struct world w;
  world_make(&w);
  cusafe_event fork_ev;
  TU_OK(cusafe_event_create(&fork_ev, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(cusafe_event_record(fork_ev, w.s));
  TU_OK(cusafe_stream_wait_event(w.t, fork_ev)); /* t joins */
  fake_fail_function("cudaStreamEndCapture", cudaErrorUnknown);
  cusafe_graph g;
  TU_STATUS(cusafe_stream_end_capture(&g, w.s), CUSAFE_ERROR_CUDA);
  fake_fail_clear();
  TU_ASSERT(fake_live_captures(-1) == 1, "the capture did not outlive its end");
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

/* The same on a stream of another library, wrapped: the capture is
 * cusafe's, and ends when the wrapper goes, before the context. */
START_TEST(test_failed_ends_on_wrapped_stream) {
  struct world w;
  world_make(&w);
  cudaStream_t raw = fake_foreign_stream(0);
  cusafe_stream wr;
  TU_OK(cusafe_stream_wrap(&wr, w.ctx, raw));
  TU_OK(cusafe_stream_begin_capture(wr));
  TU_OK(cusafe_buffer_fill(w.x, 0, 64, 1, wr));
  fake_fail_function("cudaStreamEndCapture", cudaErrorUnknown);
  cusafe_graph g;
  TU_STATUS(cusafe_stream_end_capture(&g, wr), CUSAFE_ERROR_CUDA);
  fake_fail_clear();
  TU_ASSERT(fake_live_captures(-1) == 1, "the capture did not outlive its end");
  TU_OK(cusafe_release(wr));
  TU_ASSERT(fake_live_captures(-1) == 0,
            "the capture outlived the wrapper it began on");
  fake_foreign_stream_destroy(raw);
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

/* A capture whose end failed leaves its CUDA stream capturing; another
 * cusafe stream over it (a wrapper that holds the stream it began on,
 * whose last handle went) ends it before it queues work there. */
START_TEST(test_failed_discard_seen_through_wrapper) {
  struct world w;
  world_make(&w);
  cusafe_stream s, wr;
  void *raw = NULL;
  TU_OK(cusafe_stream_create(&s, w.ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_stream_interop_handle(&raw, s));
  TU_OK(cusafe_stream_wrap(&wr, w.ctx, raw)); /* holds s */
  fake_fail_function("cudaStreamEndCapture", cudaErrorUnknown);
  TU_OK(cusafe_release(s)); /* the capture is discarded, and fails to end */
  fake_fail_clear();
  TU_ASSERT(fake_live_captures(-1) == 1, "the capture did not outlive its end");
  cusafe_buffer b;
  TU_OK(cusafe_buffer_alloc_async(&b, wr, 256));
  TU_ASSERT(fake_live_captures(-1) == 0,
            "work was queued on a stream still capturing");
  TU_OK(cusafe_buffer_fill(b, 0, 256, 3, wr));
  unsigned char got[256];
  TU_OK(cusafe_buffer_read(b, 0, got, 256));
  TU_ASSERT(got[0] == 3 && got[255] == 3, "the fill did not run");
  TU_OK(cusafe_release(b));
  TU_OK(cusafe_release(wr));
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

/* A capture that CUDA ended although its end failed (invalidated by other
 * code's use of the legacy stream) is marked as left over; a capture that
 * begins there later, through a wrapper, is another one: the release of a
 * second wrapper of that CUDA stream leaves it running, and its graph
 * holds the work queued through either wrapper. */
START_TEST(test_leftover_mark_spares_later_capture) {
  struct world w;
  world_make(&w);
  cusafe_stream s, wr, wr2;
  void *raw = NULL;
  TU_OK(cusafe_stream_create(&s, w.ctx, 0, 0)); /* blocking */
  TU_OK(cusafe_stream_interop_handle(&raw, s));
  TU_OK(cusafe_stream_wrap(&wr, w.ctx, raw)); /* holds s */
  TU_OK(cusafe_stream_begin_capture(s));
  void *mem = NULL;
  TU_OK(cusafe_buffer_interop_pointer(&mem, w.x));
  /* Other code's use of the legacy stream invalidates the capture. */
  TU_ASSERT(cs_cu->memset_async(mem, 0, 4, cudaStreamLegacy) ==
                cudaErrorStreamCaptureImplicit,
            "the legacy stream's use was not refused");
  TU_OK(cusafe_release(s)); /* its end fails: the capture was invalidated */
  TU_ASSERT(fake_live_captures(-1) == 0, "the invalidated capture runs");
  TU_OK(cusafe_stream_begin_capture(wr));
  TU_OK(cusafe_stream_wrap(&wr2, w.ctx, raw));
  TU_OK(cusafe_buffer_fill(w.x, 0, 8, 5, wr2));
  TU_OK(cusafe_release(wr2));
  TU_ASSERT(fake_live_captures(-1) == 1,
            "a wrapper's release ended the capture of another wrapper");
  TU_OK(cusafe_buffer_fill(w.x, 8, 8, 6, wr));
  cusafe_graph g;
  TU_OK(cusafe_stream_end_capture(&g, wr));
  TU_OK(cusafe_graph_launch(g, wr));
  unsigned char got[16];
  TU_OK(cusafe_buffer_read(w.x, 0, got, sizeof got));
  for (size_t i = 0; i < sizeof got; i++)
    TU_ASSERT(got[i] == (i < 8 ? 5 : 6), "byte %zu is %u", i, got[i]);
  TU_OK(cusafe_release(g));
  TU_OK(cusafe_release(wr));
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

/* Fails the next two ends of the capture on s: it may still run. */
static void end_fails_twice(cusafe_stream s) {
  fake_fail_function("cudaStreamEndCapture", cudaErrorUnknown);
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_STATUS(cusafe_stream_end_capture(&g, s), CUSAFE_ERROR_CUDA);
  fake_fail_clear();
}

/* A stream whose capture's end failed: work queued there -- a fill, a
 * launch, a wait -- ends that capture first, and runs. */
START_TEST(test_work_on_leftover_stream_runs) {
  struct world w;
  world_make(&w);
  cusafe_event ev;
  TU_OK(cusafe_event_create(&ev, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_event_record(ev, w.t));
  for (int round = 0; round < 3; round++) {
    TU_OK(cusafe_stream_begin_capture(w.s));
    end_fails_twice(w.s);
    TU_ASSERT(fake_live_captures(-1) == 1, "the capture ended");
    if (round == 0)
      TU_OK(cusafe_buffer_fill(w.x, 0, 16, 9, w.s));
    else if (round == 1)
      TU_OK(run1(w.fill, w.s, w.x, 4.0f, N, CUSAFE_NULL_HANDLE));
    else
      TU_OK(cusafe_stream_wait_event(w.s, ev));
    TU_ASSERT(fake_live_captures(-1) == 0,
              "round %d: work went into the "
              "capture whose end failed",
              round);
  }
  float got[N];
  TU_OK(cusafe_buffer_read(w.x, 0, got, sizeof got));
  for (int i = 0; i < N; i++)
    TU_ASSERT(got[i] == 4.0f, "float %d is %g", i, (double)got[i]);
  TU_OK(cusafe_release(ev));
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

/* Two captures whose ends failed, one after the other, on one CUDA stream
 * through two cusafe streams over it (s, and a wrapper of it): a record on
 * s ends the second, which runs there now -- not only the first, which
 * s's own mark named. */
START_TEST(test_newer_leftover_through_wrapper) {
  struct world w;
  world_make(&w);
  cusafe_stream wr;
  cusafe_event ev;
  void *raw = NULL;
  TU_OK(cusafe_stream_interop_handle(&raw, w.s));
  TU_OK(cusafe_stream_wrap(&wr, w.ctx, raw));
  TU_OK(cusafe_event_create(&ev, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_stream_begin_capture(w.s));
  end_fails_twice(w.s);
  TU_OK(cusafe_stream_begin_capture(wr)); /* ends the first */
  end_fails_twice(wr);
  TU_ASSERT(fake_live_captures(-1) == 1, "the second capture ended");
  TU_OK(cusafe_event_record(ev, w.s));
  TU_ASSERT(fake_live_captures(-1) == 0, "a record went into a capture");
  TU_OK(cusafe_stream_wait_event(w.t, ev));
  TU_OK(cusafe_stream_synchronize(w.t));
  TU_OK(cusafe_release(ev));
  TU_OK(cusafe_release(wr));
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

/* A stream joins two captures, each begun on another stream, whose ends
 * fail: a record on it ends the second, where it began (the first one's
 * origin is long done). */
START_TEST(test_member_of_two_failed_captures) {
  struct world w;
  world_make(&w);
  cusafe_stream o2;
  cusafe_event ev1, ev2, evx;
  TU_OK(cusafe_stream_create(&o2, w.ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_event_create(&ev1, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_event_create(&ev2, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_event_create(&evx, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(cusafe_event_record(ev1, w.s));
  TU_OK(cusafe_stream_wait_event(w.t, ev1)); /* t joins */
  end_fails_twice(w.s);
  TU_OK(cusafe_event_record(evx, w.t)); /* ends it */
  TU_ASSERT(fake_live_captures(-1) == 0, "the first capture runs");
  TU_OK(cusafe_stream_begin_capture(o2));
  TU_OK(cusafe_event_record(ev2, o2));
  TU_OK(cusafe_stream_wait_event(w.t, ev2)); /* t joins again */
  end_fails_twice(o2);
  TU_OK(cusafe_event_record(evx, w.t));
  TU_ASSERT(fake_live_captures(-1) == 0, "the second capture runs");
  TU_OK(cusafe_release(w.t)); /* destroyed outside any capture */
  w.t = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&w.t, w.ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  cusafe_handle all[] = {ev1, ev2, evx, o2};
  for (size_t i = 0; i < 4; i++)
    TU_OK(cusafe_release(all[i]));
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

/* A wrapper of one stream joins a capture begun on another, whose ends
 * fail; the shutdown destroys the wrapped stream before the wrapper: the
 * capture ends where it began first, and no stream is destroyed in it. */
START_TEST(test_shutdown_with_leftover_through_joined_wrapper) {
  struct world w;
  world_make(&w);
  cusafe_stream wr;
  cusafe_event ev;
  void *raw = NULL;
  TU_OK(cusafe_stream_interop_handle(&raw, w.t));
  TU_OK(cusafe_stream_wrap(&wr, w.ctx, raw));
  TU_OK(cusafe_event_create(&ev, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(cusafe_event_record(ev, w.s));
  TU_OK(cusafe_stream_wait_event(wr, ev)); /* wr, over t's stream, joins */
  end_fails_twice(w.s);
  TU_ASSERT(fake_live_captures(-1) == 1, "the capture ended");
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

/* A wrap of a default stream does not query it: a query would invalidate
 * the capture of a blocking stream of the device. */
START_TEST(test_wrap_default_during_blocking_capture) {
  struct world w;
  world_make(&w);
  cusafe_stream s;
  TU_OK(cusafe_stream_create(&s, w.ctx, 0, 0)); /* blocking */
  TU_OK(cusafe_stream_begin_capture(s));
  void *const defaults[] = {NULL, cudaStreamLegacy, cudaStreamPerThread};
  for (size_t i = 0; i < 3; i++) {
    cusafe_stream d;
    TU_OK(cusafe_stream_wrap(&d, w.ctx, defaults[i]));
    TU_OK(cusafe_release(d));
  }
  TU_OK(cusafe_buffer_fill(w.x, 0, 8, 7, s));
  cusafe_graph g;
  TU_OK(cusafe_stream_end_capture(&g, s));
  TU_OK(cusafe_graph_launch(g, s));
  unsigned char got[8];
  TU_OK(cusafe_buffer_read(w.x, 0, got, sizeof got));
  for (size_t i = 0; i < sizeof got; i++)
    TU_ASSERT(got[i] == 7, "byte %zu is %u", i, got[i]);
  TU_OK(cusafe_release(g));
  TU_OK(cusafe_release(s));
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

/* A capture that another thread begins or ends while a launch on its
 * stream is in progress (the fake's launch hook: inside the launch call,
 * before the kernel is queued) waits for the launch: the kernel is
 * captured exactly when the launch saw the stream capture. */

/* What another thread does from inside the next launch: fn(arg), on a new
 * thread, given 50 ms to finish while the launch waits. */
struct during_launch {
  cusafe_status (*fn)(void *arg);
  void *arg;
  pthread_t thread;
  atomic_int done;
  cusafe_status st;
  int done_in_hook; /* fn returned before the launch went on */
};

static void *during_thread(void *p) {
  struct during_launch *d = p;
  d->st = d->fn(d->arg);
  atomic_store(&d->done, 1);
  return NULL;
}

static void during_hook(void *p) {
  struct during_launch *d = p;
  TU_ASSERT(pthread_create(&d->thread, NULL, during_thread, d) == 0,
            "pthread_create failed");
  nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
  d->done_in_hook = atomic_load(&d->done);
}

/* Runs launch(w) with fn(w) started on another thread from inside it: fn
 * must succeed, and not before the launch has. */
static void while_launching(cusafe_status (*fn)(void *),
                            cusafe_status (*launch)(void *), struct world *w,
                            const char *what) {
  struct during_launch d = {.fn = fn, .arg = w};
  fake_set_launch_hook(during_hook, &d);
  TU_OK(launch(w));
  TU_ASSERT(pthread_join(d.thread, NULL) == 0, "pthread_join failed");
  TU_OK(d.st);
  TU_ASSERT(!d.done_in_hook, "%s while a launch on its stream was queueing",
            what);
}

static cusafe_status begin_s(void *w) {
  return cusafe_stream_begin_capture(((struct world *)w)->s);
}

static cusafe_graph ended;
static cusafe_status end_s(void *w) {
  return cusafe_stream_end_capture(&ended, ((struct world *)w)->s);
}

static float fill_value;
static cusafe_status fill_x_on_s(void *p) {
  struct world *w = p;
  return run1(w->fill, w->s, w->x, fill_value, N, 0);
}

static cusafe_status fill_x_on_t(void *p) {
  struct world *w = p;
  return run1(w->fill, w->t, w->x, fill_value, N, 0);
}

START_TEST(test_capture_begins_during_launch) {
  struct world w;
  world_make(&w);
  fill_value = 3.0f;
  while_launching(begin_s, fill_x_on_s, &w, "the capture began");
  int on = 0;
  TU_OK(cusafe_stream_is_capturing(&on, w.s));
  TU_ASSERT(on == 1, "the stream does not capture");
  cusafe_graph g;
  TU_OK(cusafe_stream_end_capture(&g, w.s));
  expect_all(w.x, N, 3.0f); /* the kernel ran: it was not captured */
  TU_OK(cusafe_graph_release(g));
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

START_TEST(test_capture_ends_during_launch) {
  struct world w;
  world_make(&w);
  TU_OK(run1(w.fill, w.s, w.x, 1.0f, N, 0));
  TU_OK(cusafe_stream_begin_capture(w.s));
  fill_value = 5.0f;
  while_launching(end_s, fill_x_on_s, &w, "the capture ended");
  expect_all(w.x, N, 1.0f); /* the kernel was captured, not run */
  TU_OK(cusafe_graph_launch(ended, w.t));
  TU_OK(cusafe_stream_synchronize(w.t));
  expect_all(w.x, N, 5.0f);
  TU_OK(cusafe_graph_release(ended));
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST
/* A capture that other code began in CUDA's global mode is not broken by
 * the frees and waits of cusafe's releases on another thread: teardowns
 * run in relaxed mode.  (The release of device memory is the exception:
 * its cudaFreeAsync is made in the thread's own mode, as the program's
 * own free would be.) */
enum { RELEASED = 4 };
struct release_arg {
  cusafe_handle h[RELEASED];
  cusafe_status st[RELEASED];
};

static void *release_them(void *p) {
  struct release_arg *a = p;
  for (int i = 0; i < RELEASED; i++)
    a->st[i] = cusafe_release(a->h[i]);
  return NULL;
}

static int gave_back;
static void give_back_counted(void *user) {
  (void)user;
  gave_back++;
}

START_TEST(test_foreign_global_capture_survives_releases) {
  struct world w;
  world_make(&w);
  cusafe_buffer pinned;
  TU_OK(cusafe_buffer_alloc(&pinned, w.ctx, CUSAFE_MEMORY_HOST_PINNED, 64));
  cusafe_event ev;
  TU_OK(cusafe_event_create(&ev, w.ctx, 0));
  void *ptr = NULL;
  TU_OK(cusafe_buffer_interop_pointer(&ptr, w.y));
  cusafe_buffer wrapped;
  TU_OK(cusafe_buffer_wrap(&wrapped, w.ctx, CUSAFE_MEMORY_DEVICE, ptr, 64,
                           give_back_counted, NULL));
  gave_back = 0;
  TU_OK(cusafe_buffer_fill(wrapped, 0, 64, 1, w.t));
  TU_OK(cusafe_buffer_copy(pinned, 0, wrapped, 0, 64, w.t));
  cudaStream_t raw = fake_foreign_stream(0);
  TU_ASSERT(cs_cu->stream_begin_capture(raw, cudaStreamCaptureModeGlobal) ==
                cudaSuccess,
            "cudaStreamBeginCapture failed");
  struct release_arg a = {{pinned, wrapped, ev, w.t}, {0}};
  pthread_t th;
  TU_ASSERT(pthread_create(&th, NULL, release_them, &a) == 0,
            "pthread_create failed");
  TU_ASSERT(pthread_join(th, NULL) == 0, "pthread_join failed");
  for (int i = 0; i < RELEASED; i++)
    TU_ASSERT(a.st[i] == CUSAFE_SUCCESS, "release %d of %d failed: %s", i,
              RELEASED, cusafe_status_string(a.st[i]));
  TU_ASSERT(gave_back == 1, "wrapped memory given back %d times", gave_back);
  cudaGraph_t g = NULL;
  cudaError_t err = cs_cu->stream_end_capture(raw, &g);
  TU_ASSERT(err == cudaSuccess && g,
            "the other code's capture was broken: cudaStreamEndCapture "
            "gave %d",
            (int)err);
  TU_ASSERT(cs_cu->graph_destroy(g) == cudaSuccess, "cudaGraphDestroy failed");
  fake_foreign_stream_destroy(raw);
  w.t = CUSAFE_NULL_HANDLE;
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST
/* A module released while a stream of its context captures is unloaded
 * with the context, not after a synchronisation of the device, which no
 * capture mode allows: the capture goes on. */
START_TEST(test_module_released_during_capture) {
  struct world w;
  world_make(&w);
  cusafe_module other;
  TU_OK(cusafe_module_load_builtin(&other, w.ctx));
  size_t libraries = fake_live_libraries(0);
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(run1(w.fill, w.s, w.x, 4.0f, N, 0));
  TU_OK(cusafe_module_release(other));
  TU_ASSERT(fake_live_libraries(0) == libraries,
            "%zu libraries alive, expected %zu until the context goes",
            fake_live_libraries(0), libraries);
  cusafe_graph g;
  TU_OK(cusafe_stream_end_capture(&g, w.s));
  TU_OK(cusafe_graph_launch(g, w.s));
  expect_all(w.x, N, 4.0f);
  TU_OK(cusafe_graph_release(g));
  world_release(&w);
  TU_ASSERT(fake_live_libraries(0) == 0, "%zu libraries outlived the context",
            fake_live_libraries(0));
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST
/* A graph that waits for an event recorded outside holds the event, which
 * its queued replays use: releasing both with replays queued is legal, and
 * the event goes after them. */
START_TEST(test_release_graph_and_event_with_replays_queued) {
  struct world w;
  world_make(&w);
  cusafe_event ev = begin_capture_after_outside_event(&w);
  TU_OK(run1(w.fill, w.s, w.x, 6.0f, N, 0));
  cusafe_graph g;
  TU_OK(cusafe_stream_end_capture(&g, w.s));
  fake_set_paused(1);
  TU_OK(cusafe_graph_launch(g, w.t));
  /* x's latest work moves to s: the next replay finds it there */
  TU_OK(run1(w.scale, w.s, w.x, 1.0f, N, 0));
  TU_OK(cusafe_graph_launch(g, w.s));
  size_t events = fake_live_events(0);
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_event_release(ev));
  TU_ASSERT(fake_live_events(0) == events - 1,
            "%zu events alive after the release, expected %zu",
            fake_live_events(0), events - 1);
  fake_set_paused(0);
  TU_OK(cusafe_context_synchronize(w.ctx));
  expect_all(w.x, N, 6.0f);
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST
/* A stream that joins a capture (it waits for an event recorded in it)
 * while a launch on it is in progress on another thread waits for that
 * launch, which runs outside the capture. */
static cusafe_event join_ev_of;
static cusafe_status t_joins(void *w) {
  return cusafe_stream_wait_event(((struct world *)w)->t, join_ev_of);
}

START_TEST(test_join_during_launch) {
  struct world w;
  world_make(&w);
  cusafe_event fork_ev, join_ev;
  TU_OK(cusafe_event_create(&fork_ev, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_event_create(&join_ev, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(cusafe_event_record(fork_ev, w.s));
  join_ev_of = fork_ev;
  fill_value = 7.0f;
  while_launching(t_joins, fill_x_on_t, &w, "the stream joined a capture");
  int on = 0;
  TU_OK(cusafe_stream_is_capturing(&on, w.t));
  TU_ASSERT(on == 1, "the stream did not join the capture");
  TU_OK(cusafe_event_record(join_ev, w.t));
  TU_OK(cusafe_stream_wait_event(w.s, join_ev));
  cusafe_graph g;
  TU_OK(cusafe_stream_end_capture(&g, w.s));
  expect_all(w.x, N, 7.0f); /* the kernel ran: it was not captured */
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_release(fork_ev));
  TU_OK(cusafe_release(join_ev));
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST
/* A stream joins a capture while another thread launches on another
 * cusafe stream over the same CUDA stream (two wraps of one foreign
 * stream): the launch is either outside the capture (queued before the
 * join) or captured and held by it -- never captured unawares, its buffer
 * then freed before the graph's replay touches it.  Each try starts the
 * launch a little later (the fake's launches last 300 us). */
enum { JOIN_RACE_TRIES = 6000 };
struct join_race {
  cusafe_kernel fill;
  cusafe_stream on;
  _Atomic cusafe_buffer b;
  _Atomic int go, done, stop, skew;
  cusafe_status st;
};

static void *join_race_launcher(void *p) {
  struct join_race *r = p;
  for (;;) {
    while (!atomic_load(&r->go))
      if (atomic_load(&r->stop))
        return NULL;
    atomic_store(&r->go, 0);
    for (volatile int i = 0; i < atomic_load(&r->skew); i++)
      ;
    cusafe_buffer b = atomic_load(&r->b);
    r->st = run1(r->fill, r->on, b, 1.0f, N, 0);
    if (r->st == CUSAFE_SUCCESS)
      r->st = cusafe_buffer_release(b);
    atomic_store(&r->done, 1);
  }
}

START_TEST(test_join_races_launch_through_another_wrapper) {
  struct world w;
  world_make(&w);
  cudaStream_t raw = fake_foreign_stream(0);
  cusafe_stream w1, w2;
  TU_OK(cusafe_stream_wrap(&w1, w.ctx, raw));
  TU_OK(cusafe_stream_wrap(&w2, w.ctx, raw));
  cusafe_event fork_ev, join_ev;
  TU_OK(cusafe_event_create(&fork_ev, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_event_create(&join_ev, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  fake_set_launch_delay(300);
  struct join_race r = {.fill = w.fill, .on = w2};
  pthread_t th;
  TU_ASSERT(pthread_create(&th, NULL, join_race_launcher, &r) == 0,
            "pthread_create failed");
  for (int i = 0; i < JOIN_RACE_TRIES; i++) {
    cusafe_buffer b;
    TU_OK(cusafe_buffer_alloc(&b, w.ctx, CUSAFE_MEMORY_DEVICE,
                              N * sizeof(float)));
    TU_OK(cusafe_buffer_fill(b, 0, N * sizeof(float), 0, w2));
    TU_OK(cusafe_stream_synchronize(w2));
    atomic_store(&r.b, b);
    atomic_store(&r.skew, (i * 37) % 3000);
    TU_OK(cusafe_stream_begin_capture(w.s));
    TU_OK(cusafe_event_record(fork_ev, w.s));
    atomic_store(&r.go, 1);
    TU_OK(cusafe_stream_wait_event(w1, fork_ev)); /* w1 joins */
    while (!atomic_load(&r.done))
      sched_yield();
    atomic_store(&r.done, 0);
    TU_OK(r.st);
    TU_OK(cusafe_event_record(join_ev, w1));
    TU_OK(cusafe_stream_wait_event(w.s, join_ev));
    cusafe_graph g;
    TU_OK(cusafe_stream_end_capture(&g, w.s));
    TU_OK(cusafe_graph_launch(g, w.s)); /* the fake checks what it touches */
    TU_OK(cusafe_stream_synchronize(w.s));
    TU_OK(cusafe_graph_release(g));
  }
  atomic_store(&r.stop, 1);
  pthread_join(th, NULL);
  fake_set_launch_delay(0);
  TU_OK(cusafe_release(fork_ev));
  TU_OK(cusafe_release(join_ev));
  TU_OK(cusafe_release(w1));
  TU_OK(cusafe_release(w2));
  fake_foreign_stream_destroy(raw);
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST

/* A wrapped device default stream cannot join a capture: refused before
 * CUDA sees it, and the capture goes on. */
START_TEST(test_default_stream_cannot_join) {
  struct world w;
  world_make(&w);
  cusafe_stream dflt;
  TU_OK(cusafe_stream_wrap(&dflt, w.ctx, NULL));
  cusafe_event ev;
  TU_OK(cusafe_event_create(&ev, w.ctx, CUSAFE_EVENT_DISABLE_TIMING));
  TU_OK(cusafe_stream_begin_capture(w.s));
  TU_OK(cusafe_event_record(ev, w.s));
  TU_STATUS(cusafe_stream_wait_event(dflt, ev), CUSAFE_ERROR_NOT_SUPPORTED);
  int on = 1;
  TU_OK(cusafe_stream_is_capturing(&on, dflt));
  TU_ASSERT(on == 0, "the default stream joined the capture");
  TU_OK(run1(w.fill, w.s, w.x, 8.0f, N, 0));
  cusafe_graph g;
  TU_OK(cusafe_stream_end_capture(&g, w.s));
  TU_OK(cusafe_graph_launch(g, w.s));
  expect_all(w.x, N, 8.0f);
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_release(ev));
  TU_OK(cusafe_release(dflt));
  world_release(&w);
  TU_OK(cusafe_shutdown());
  TU_NOTHING_LIVE();
}
END_TEST
#endif

#ifdef CUSAFE_TEST_FAKE
static void one_device(void) {
  fake_set_device_count(1);
  fake_set_paused(1); /* work waits for what it must wait for */
}
#endif

static Suite *graph_suite(void) {
  Suite *s = suite_create("graph");
  TCase *tc = tcase_create("graphs");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_replay_chain_over_views);
  tcase_add_test(tc, test_replay_is_ordered);
  tcase_add_test(tc, test_replays_of_few_and_many_buffers);
  tcase_add_test(tc, test_replay_streams);
  tcase_add_test(tc, test_copies_fills_events);
  tcase_add_test(tc, test_refused_during_capture);
  tcase_add_test(tc, test_fork_and_join);
  tcase_add_test(tc, test_wait_for_outside_event);
  tcase_add_test(tc, test_outside_event_recorded_again_after_replay);
  tcase_add_test(tc, test_graph_handles);
#ifdef CUSAFE_TEST_FAKE
  tcase_add_test(tc, test_release_with_replays_queued);
  tcase_add_test(tc, test_shutdown_with_capture_and_replays);
  tcase_add_test(tc, test_failed_end_drops_what_it_held);
  tcase_add_test(tc, test_shutdown_after_failed_ends_with_joined_stream);
  tcase_add_test(tc, test_failed_ends_on_wrapped_stream);
  tcase_add_test(tc, test_failed_discard_seen_through_wrapper);
  tcase_add_test(tc, test_leftover_mark_spares_later_capture);
  tcase_add_test(tc, test_wrap_default_during_blocking_capture);
  tcase_add_test(tc, test_work_on_leftover_stream_runs);
  tcase_add_test(tc, test_newer_leftover_through_wrapper);
  tcase_add_test(tc, test_member_of_two_failed_captures);
  tcase_add_test(tc, test_shutdown_with_leftover_through_joined_wrapper);
  tcase_add_test(tc, test_release_of_capturing_stream_ends_capture);
  tcase_add_test(tc, test_capture_begins_during_launch);
  tcase_add_test(tc, test_capture_ends_during_launch);
  tcase_add_test(tc, test_foreign_global_capture_survives_releases);
  tcase_add_test(tc, test_module_released_during_capture);
  tcase_add_test(tc, test_release_graph_and_event_with_replays_queued);
  tcase_add_test(tc, test_join_during_launch);
  tcase_add_test(tc, test_join_races_launch_through_another_wrapper);
  tcase_add_test(tc, test_default_stream_cannot_join);
#endif
  suite_add_tcase(s, tc);
#ifdef CUSAFE_TEST_FAKE
  /* With one device, which is then always current, replays take their
   * shortest path (lib/graph.c, replay_fast): the same tests again, the
   * fake paused, so that work runs only when a synchronisation needs it,
   * after the work it was ordered after and nothing else. */
  tc = tcase_create("one_device");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, one_device, NULL);
  tcase_add_test(tc, test_replay_chain_over_views);
  tcase_add_test(tc, test_replay_is_ordered);
  tcase_add_test(tc, test_replays_of_few_and_many_buffers);
  tcase_add_test(tc, test_replay_streams);
  tcase_add_test(tc, test_copies_fills_events);
  tcase_add_test(tc, test_outside_event_recorded_again_after_replay);
  tcase_add_test(tc, test_release_with_replays_queued);
  tcase_add_test(tc, test_shutdown_with_capture_and_replays);
  tcase_add_test(tc, test_release_graph_and_event_with_replays_queued);
  suite_add_tcase(s, tc);
#endif
  return s;
}

int main(void) {
#ifdef CUSAFE_TEST_FAKE
  return tu_run_suite(graph_suite(), CK_FORK);
#else
  tu_require_gpu();
  return tu_run_suite(graph_suite(), CK_NOFORK);
#endif
}
