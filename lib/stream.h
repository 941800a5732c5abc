/* stream.h -- streams, and the queues through which buffers order their
 * work (stream.c; invariant 2: work in flight keeps its inputs alive).
 * Internal; never installed. */
#ifndef CUSAFE_STREAM_H
#define CUSAFE_STREAM_H

#include "handle.h"

struct cs_context;
struct cs_capture;

/* A CUDA stream as buffers see it: a user stream or a context's default
 * stream.  `owner` is the object that keeps it alive (the stream object or
 * the context). */
struct cs_queue {
  /* What every launch and replay reads first, together. */
  cudaStream_t stream;
  struct cs_context *ctx;
  /* The capture the queue takes part in (graph.h), NULL if none.  While
   * it does, work outside the capture that must follow the queue's work
   * waits for `entry`, recorded just before the queue entered the capture,
   * instead of a record of its own (which would be captured).  The lock
   * orders a hand-off's look at `capture` and its record against the
   * capture's beginning.  While another thread begins or ends the capture,
   * the pointer carries CS_CAPTURE_BEGINNING or CS_CAPTURE_ENDING in its
   * low bits: operations that meet it are tried again (CS_RETRY). */
  _Atomic(struct cs_capture *) capture;
  /* Whether other code can reach the CUDA stream, and so capture it: a
   * wrapper's queue (cusafe_stream_wrap: of another library's stream, or
   * -- wraps_default -- of a device's default stream), or one whose
   * stream was handed out (cusafe_stream_interop_handle).  Next to
   * `capture`, which the same operations read. */
  _Atomic bool borrowed;
  bool wraps_default;
  struct cs_object *owner;
  /* Recorded to hand work over to another stream; created on first need. */
  _Atomic(cudaEvent_t) handoff;
  cudaEvent_t entry; /* created at the queue's first capture */
  cs_spinlock capture_lock;
  /* While the queue is marked joining a capture: in the list of joining
   * queues (graph.c, under its open_lock), so that other cusafe streams
   * over the same CUDA stream see the mark too. */
  struct cs_queue *joining_next;
  bool joining_listed;
};

struct cs_stream {
  struct cs_object hdr;
  struct cs_queue queue; /* queue.ctx holds a reference */
  /* A stream another library owns (cusafe_stream_wrap): cusafe never
   * destroys it. */
  bool borrowed;
  /* A wrapper of the CUDA stream of a stream of cusafe's: that stream,
   * referenced, so that its CUDA stream outlives the wrapper. */
  struct cs_stream *holds;
  /* A stream of cusafe's, in the list of those whose CUDA streams are
   * still to be destroyed (stream.c), for wrappers to find. */
  struct cs_stream *owned_prev, *owned_next;
  bool owned_listed;
  /* Its handle slot's data (stream_fill), while the handle lives. */
  union cs_slot_data *slot;
  /* A stream that other code may capture (queue.borrowed), in the list
   * of those (stream.c) that a context's synchronisation looks at. */
  struct cs_stream *lent_prev, *lent_next;
  bool lent_listed;
};

/* The open capture whose queues include the CUDA stream `stream` (another
 * cusafe stream may wrap the same one), or NULL, or CS_CAPTURE_BUSY while
 * it begins or ends; *entry, if not NULL, gets that queue's entry event. */
struct cs_capture *cs_capture_of_stream(cudaStream_t stream,
                                        cudaEvent_t *entry);
/* Whether s wraps a device's default stream, which CUDA cannot capture. */
static inline bool cs_stream_wraps_default(const struct cs_stream *s) {
  return s->queue.wraps_default;
}

/* The marks of a queue's capture pointer while it changes (cs_queue). */
#define CS_CAPTURE_BEGINNING ((uintptr_t)1)
#define CS_CAPTURE_ENDING ((uintptr_t)2)
#define CS_CAPTURE_MARKS (CS_CAPTURE_BEGINNING | CS_CAPTURE_ENDING)
/* What cs_queue_capture() gives for a queue whose capture another thread
 * is beginning or ending: the caller returns CS_RETRY. */
#define CS_CAPTURE_BUSY ((struct cs_capture *)CS_CAPTURE_BEGINNING)
/* The capture q takes part in: its own, or that of another cusafe stream
 * over the same CUDA stream; CS_CAPTURE_BUSY while one begins or ends.
 * The answer holds until the thread's gate or pin ends, which began before
 * (calls.h): a later look gives the same or CS_CAPTURE_BUSY. */
static inline struct cs_capture *cs_queue_capture(struct cs_queue *q) {
  struct cs_capture *c = atomic_load(&q->capture);
  if (CS_LIKELY(!c)) {
    if (CS_UNLIKELY(atomic_load(&cs_hot.captures)))
      c = cs_capture_of_stream(q->stream, NULL);
    return c;
  }
  return CS_UNLIKELY((uintptr_t)c & CS_CAPTURE_MARKS) ? CS_CAPTURE_BUSY : c;
}
/* How many CUDA streams a capture of cusafe's may still run on, its end
 * having failed (graph.c), and whether `stream` is one of them. */
extern _Atomic size_t cs_leftover_streams;
#define CS_LEFTOVER_ANY (~0ULL) /* CUDA could not tell the capture's id */
bool cs_stream_leftover(cudaStream_t stream);
/* Whether q's CUDA stream may still capture into nothing, a capture of
 * cusafe's there having failed to end -- also one that began through
 * another cusafe stream over it: then cs_queue_leftover() before work. */
static inline bool cs_queue_has_leftover(struct cs_queue *q) {
  return CS_UNLIKELY(atomic_load_explicit(&cs_leftover_streams,
                                          memory_order_relaxed)) &&
         cs_stream_leftover(q->stream);
}
/* Yields to a capture that begins or ends on another thread, before an
 * operation that met it is tried again (its gate or pin ended). */
void cs_capture_yield(void);
/* What work outside q's capture waits for instead of q's captured work:
 * the entry event of q, or of the queue of the capture over q's stream. */
cudaEvent_t cs_queue_entry(struct cs_queue *q);

/* Resolves a stream argument: CUSAFE_STREAM_DEFAULT gives the default queue
 * of `dflt` (no reference taken), else the stream is acquired into *held
 * (drop with cs_unref when not NULL).  A stream of another context than
 * dflt's is CUSAFE_ERROR_CONTEXT_MISMATCH ("stream belongs to device 1 but
 * <dflt_name> belongs to device 0") -- unless dflt_name is NULL: the caller
 * checks. */
cusafe_status cs_queue_get(cusafe_stream stream, struct cs_context *dflt,
                           const char *dflt_name, struct cs_queue **out,
                           struct cs_object **held);
/* The one way to order after a stream (invariant 9; lib/README.md,
 * "Ordering after a stream"): everything queued on a queue so far, outside
 * any capture -- for a queue that captures, the work queued before its
 * capture, since its captured work runs only in replays.  Frees,
 * give-backs, DLPack deleters, buffers' chains and foreign work all order
 * through these two.
 *
 * cs_queue_handoff() makes later work on `to` wait for it (the thread
 * gated).  `to` must capture nothing: ordering is never routed into a
 * capture (CUSAFE_ERROR_CAPTURING; what a capture's work must follow it
 * orders itself, cs_capture_use).  CS_RETRY while a capture begins or ends
 * on either queue. */
cusafe_status cs_queue_handoff(struct cs_queue *from, struct cs_queue *to);
/* cs_queue_wait() waits for it on the host (the thread not gated).  With
 * `park` (cs_queue_wait_or_park), where q cannot be touched now, it waits
 * for nothing and sets *park; without, it fails then, touching nothing. */
cudaError_t cs_queue_wait(struct cs_queue *q);
cudaError_t cs_queue_wait_or_park(struct cs_queue *q, bool *park);
/* Whether such a wait found that q cannot be waited for now: *park set, or
 * q is a device's legacy default stream while a blocking stream of the
 * device captures (CUDA's cudaErrorStreamCaptureImplicit). */
static inline bool cs_queue_wait_parks(bool park, cudaError_t err) {
  return park || err == cudaErrorStreamCaptureImplicit;
}
/* cs_queue_wait_gated() is one try of it, the thread gated: CS_RETRY
 * while a capture begins or ends on q (nothing waited for), CS_PARK where
 * q cannot be touched now (*err cudaErrorStreamCaptureImplicit, nothing
 * touched); a failure where a capture left over on q cannot be ended
 * (*err cudaErrorStreamCaptureInvalidated); else the wait's result in
 * *err.  Both wait for q's stream only once such a capture is ended. */
cusafe_status cs_queue_wait_gated(struct cs_queue *q, cudaError_t *err);
/* Whether q is a wrapper's queue that nothing may touch now (a record,
 * wait or synchronisation there would break a capture or join one): the
 * legacy default stream -- which a wrapped default stream stands for --
 * while a blocking stream of its device captures, or a stream that other
 * code reaches (`borrowed`) while it captures, other than in a capture of
 * cusafe's.  The
 * thread gated where the answer must hold until its CUDA calls: a capture
 * of cusafe's that begins meanwhile waits for the gate. */
bool cs_queue_untouchable(struct cs_queue *q);
/* What an ordering after q, which cannot be touched now, fails with:
 * CUSAFE_ERROR_CAPTURING, saying why. */
cusafe_status cs_untouchable_fail(struct cs_queue *q);
/* CUSAFE_ERROR_CAPTURING for `what` (a call's work on q, or the host's
 * wait for it), where q cannot be touched now: CUDA would refuse it, and
 * break the capture that forbids it. */
cusafe_status cs_untouchable_refuse(const char *what, struct cs_queue *q);
/* cs_untouchable_refuse(what, q) for the first stream q of ctx that other
 * code may capture (a wrapper, or a stream handed out) and that nothing
 * may touch now, else CUSAFE_SUCCESS: a wait for ctx's device would break
 * that capture.  The thread gated. */
cusafe_status cs_streams_lent_check(struct cs_context *ctx, const char *what);
/* The same as a question, with no error set: whether a wait for ctx's
 * device would break other code's capture of a stream that cusafe knows
 * (every fallback that synchronises a device asks it first). */
bool cs_streams_lent_busy(struct cs_context *ctx);
/* Whether q wraps a default stream that CUDA lets nothing use now: while
 * a capture of cusafe's on a blocking stream of its device is open, or
 * left over there (its end failed) -- a capture of other code's, which
 * cusafe does not count, is left to CUDA's answer.  Costs a load where no
 * capture of cusafe's is open. */
static inline bool cs_queue_default_forbidden(struct cs_queue *q) {
  return CS_UNLIKELY(q->wraps_default) &&
         (atomic_load_explicit(&cs_hot.captures, memory_order_relaxed) ||
          atomic_load_explicit(&cs_leftover_streams, memory_order_relaxed)) &&
         cs_queue_untouchable(q);
}
/* Destroys a queue's hand-off event, if it was made, and, if `owned`, its
 * CUDA stream: returns the stream's cudaStreamDestroy answer. */
cudaError_t cs_queue_fini(struct cs_queue *q, bool owned);

#endif /* CUSAFE_STREAM_H */
