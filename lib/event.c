/* event.c -- events, their records on streams and the waits of streams for
 * them (an event holds a reference on its context, invariant 1). */
#include <stdio.h>
#include <stdlib.h>

#include "context.h"
#include "device.h"
#include "event.h"
#include "graph.h"

#define EVENT_FLAGS (CUSAFE_EVENT_DISABLE_TIMING | CUSAFE_EVENT_BLOCKING_SYNC)

static cusafe_status event_check(const struct cs_context *ctx,
                                 const void *args) {
  (void)ctx;
  unsigned int flags = *(const unsigned int *)args;
  if (flags & ~EVENT_FLAGS)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "unknown event flags 0x%x",
                   flags & ~EVENT_FLAGS);
  return CUSAFE_SUCCESS;
}

static cusafe_status event_make(struct cs_object *obj, struct cs_context *ctx,
                                const void *args) {
  struct cs_event *ev = (struct cs_event *)obj;
  unsigned int flags = *(const unsigned int *)args;
  unsigned int cuda_flags = cudaEventDefault;
  if (flags & CUSAFE_EVENT_DISABLE_TIMING)
    cuda_flags |= cudaEventDisableTiming;
  if (flags & CUSAFE_EVENT_BLOCKING_SYNC)
    cuda_flags |= cudaEventBlockingSync;
  cudaError_t err = cs_cu->event_create(&ev->event, cuda_flags);
  if (err != cudaSuccess)
    return cs_fail_cuda(err, "cudaEventCreateWithFlags");
  pthread_mutex_init(&ev->lock, NULL);
  ev->ctx = ctx;
  ev->flags = flags;
  return CUSAFE_SUCCESS;
}

static void event_unmake(struct cs_object *obj) {
  struct cs_event *ev = (struct cs_event *)obj;
  cs_cu->event_destroy(ev->event);
  pthread_mutex_destroy(&ev->lock);
}

CUSAFE_API cusafe_status cusafe_event_create(cusafe_event *out,
                                             cusafe_context ctx,
                                             unsigned int flags) {
  static const struct cs_child how = {.type = CS_EVENT,
                                      .size = sizeof(struct cs_event),
                                      .check = event_check,
                                      .make = event_make,
                                      .unmake = event_unmake};
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  return cs_context_child(out, ctx, &how, &flags);
}

/* Destroys the CUDA event, also when its device cannot be made current. */
static cudaError_t event_destroy(void *event) {
  return cs_cu->event_destroy(event);
}

cusafe_status cs_event_fini(struct cs_object *obj) {
  struct cs_event *ev = (struct cs_event *)obj;
  return cs_device_teardown(ev->ctx->device, event_destroy, ev->event,
                            "cudaEventDestroy");
}

void cs_event_free(struct cs_object *obj) {
  pthread_mutex_destroy(&((struct cs_event *)obj)->lock);
  free(obj);
}

void cs_event_describe(const struct cs_object *obj, char *what, size_t size) {
  snprintf(what, size, "device %d",
           ((const struct cs_event *)obj)->ctx->device);
}

/* ---- records and waits --------------------------------------------------- */

/* What a stream's wait for an event does depends on where the event's
 * latest record was -- in a capture (the stream joins it, or waits in
 * it) or outside (a plain wait, or a node that waits at each replay) --
 * and CUDA decides by the record it finds when the wait is made: a
 * record on another thread in between would make a stream join a capture
 * unknown to the library, or wait in a capture for work outside it,
 * which invalidates the capture.  So a record and a wait are one step
 * against each other (ev->lock).  A synchronisation, query or timing of
 * an event last recorded in a capture fails and invalidates the capture:
 * a record into a capture waits until those in progress are done
 * (host_waits); a record outside one need not. */

/* Whether other code captures q, a queue outside cusafe's captures with
 * no capture of cusafe's left over: a wrapper of a stream that other code
 * captures. */
static bool other_captures(struct cs_queue *q) {
  return CS_UNLIKELY(q->borrowed) && !q->wraps_default &&
         cs_queue_untouchable(q);
}

/* Whether q wraps a default stream that cannot be touched now (a
 * blocking stream of its device captures): CUDA refuses a record or wait
 * there, invalidating that capture. */
static bool default_untouchable(struct cs_queue *q) {
  return CS_UNLIKELY(q->borrowed) && q->wraps_default &&
         cs_queue_untouchable(q);
}

/* Records ev on q (the thread gated and ev's lock held): in a capture,
 * the graph holds it; in one of other code, nothing does, and nothing of
 * cusafe's may wait for it. */
static cusafe_status record_locked(struct cs_event *ev, struct cs_queue *q,
                                   struct cs_capture *c) {
  cusafe_status st;
  /* A record captured into nothing would pull its waiters in. */
  if (!c && cs_queue_has_leftover(q) &&
      (st = cs_queue_leftover(q)) != CUSAFE_SUCCESS)
    return st;
  if (!c && default_untouchable(q))
    return cs_untouchable_refuse("recording an event", q);
  bool other = !c && other_captures(q);
  if ((c || other) && ev->host_waits)
    return CS_RETRY; /* another thread's synchronisation or query of ev */
  if (c && (st = cs_capture_hold(c, &ev->hdr)) != CUSAFE_SUCCESS)
    return st;
  int saved;
  st = cs_device_enter(ev->ctx->device, &saved);
  if (st == CUSAFE_SUCCESS) {
    st = cs_status_pending(cs_cu->event_record(ev->event, q->stream),
                           "cudaEventRecord");
    if (st == CUSAFE_SUCCESS)
      atomic_store(&ev->capture_id, c       ? c->id
                                    : other ? CS_EVENT_OTHER_CAPTURE
                                            : 0);
    cs_device_leave(saved);
  }
  return st;
}

/* Records ev on q (the thread gated). */
static cusafe_status record_gated(struct cs_event *ev, struct cs_queue *q) {
  struct cs_capture *c = cs_queue_capture(q);
  if (c == CS_CAPTURE_BUSY)
    return CS_RETRY;
  pthread_mutex_lock(&ev->lock);
  cusafe_status st = record_locked(ev, q, c);
  pthread_mutex_unlock(&ev->lock);
  return st;
}

CUSAFE_API cusafe_status cusafe_event_record(cusafe_event event,
                                             cusafe_stream stream) {
  CS_ENTER();
  CS_HOLD_OR_RETURN(cs_event, ev, event, CS_EVENT, "event");
  struct cs_queue *q;
  struct cs_object *held CS_HELD = NULL;
  cusafe_status st = cs_queue_get(stream, ev->ctx, "event", &q, &held);
  if (st != CUSAFE_SUCCESS)
    return st;
  for (;;) {
    cs_gate(cs_call_);
    st = record_gated(ev, q);
    cs_ungate(cs_call_);
    if (CS_LIKELY(st != CS_RETRY))
      return st;
    cs_capture_yield(); /* a capture begins or ends on q, or another
                           thread synchronises with ev */
  }
}

/* Refuses to wait for, query or time an event whose latest record was in
 * a capture: what it stands for runs only in replays. */
static cusafe_status check_not_captured(const struct cs_event *ev,
                                        const char *what) {
  uint64_t id = atomic_load(&ev->capture_id);
  if (CS_LIKELY(!id))
    return CUSAFE_SUCCESS;
  if (id == CS_EVENT_OTHER_CAPTURE)
    return cs_fail(CUSAFE_ERROR_CAPTURING,
                   "%s event 0x%016llx cannot be done: its latest record was "
                   "in a capture of other code; record it again outside",
                   what, (unsigned long long)ev->hdr.handle);
  if (cs_capture_open(id))
    return cs_fail(CUSAFE_ERROR_CAPTURING,
                   "%s event 0x%016llx cannot be done: it was recorded in a "
                   "capture that is still open",
                   what, (unsigned long long)ev->hdr.handle);
  return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                 "%s event 0x%016llx cannot be done: its latest record was "
                 "in a capture, which has ended; record it again",
                 what, (unsigned long long)ev->hdr.handle);
}

/* s waits for ev, whose context is s's.  Across a capture: a wait for an
 * event recorded in the capture is an edge of its graph, and a stream
 * outside that waits for one joins the capture (CUDA's rule), its work
 * before recorded first for whoever waits for it from outside; a
 * capturing stream's wait for an event recorded outside becomes a node
 * that waits at each replay (cudaEventWaitExternal), and the graph holds
 * the event -- in a capture of other code, nothing holds it. */
static cusafe_status wait_locked(struct cs_stream *s, struct cs_event *ev) {
  /* (The thread gated and ev's lock held: CS_RETRY while a capture begins
   * or ends.) */
  struct cs_queue *q = &s->queue;
  uint64_t id = atomic_load(&ev->capture_id);
  struct cs_capture *mine = cs_queue_capture(q);
  struct cs_capture *theirs =
      id && id != CS_EVENT_OTHER_CAPTURE ? cs_capture_find(id) : NULL;
  if (mine == CS_CAPTURE_BUSY || theirs == CS_CAPTURE_BUSY)
    return CS_RETRY; /* a capture begins or ends meanwhile */
  if (id && !theirs)
    return check_not_captured(ev, "waiting for");
  if (theirs && mine && theirs != mine)
    return cs_fail(CUSAFE_ERROR_CAPTURING,
                   "stream 0x%016llx cannot wait for event 0x%016llx: it "
                   "was recorded in another stream's capture",
                   (unsigned long long)s->hdr.handle,
                   (unsigned long long)ev->hdr.handle);
  if (theirs && !mine && cs_stream_wraps_default(s))
    return cs_fail(CUSAFE_ERROR_NOT_SUPPORTED,
                   "stream 0x%016llx wraps a device's default stream, which "
                   "CUDA cannot capture: it cannot wait for event 0x%016llx, "
                   "recorded in a capture",
                   (unsigned long long)s->hdr.handle,
                   (unsigned long long)ev->hdr.handle);
  /* A wait captured into nothing would be lost, and pull later work in;
   * a join's record of q's work would be captured there, and CUDA would
   * merge that capture with the one joined. */
  if (!mine && cs_queue_has_leftover(q)) {
    cusafe_status st = cs_queue_leftover(q);
    if (st != CUSAFE_SUCCESS)
      return st;
  }
  if (!mine && default_untouchable(q))
    return cs_untouchable_refuse("waiting for an event", q);
  bool other = !mine && other_captures(q);
  if (other && theirs)
    return cs_fail(CUSAFE_ERROR_CAPTURING,
                   "stream 0x%016llx is being captured by other code: it "
                   "cannot join the capture that event 0x%016llx was "
                   "recorded in",
                   (unsigned long long)s->hdr.handle,
                   (unsigned long long)ev->hdr.handle);
  /* q joins the capture (join_finish), once the operations that saw it
   * outside have queued their work. */
  if (theirs && !mine)
    return cs_queue_mark_joining(q) ? CS_JOIN : CS_RETRY;
  unsigned int flags = 0;
  if (mine && !theirs) {
    cusafe_status st = cs_capture_hold(mine, &ev->hdr);
    if (st != CUSAFE_SUCCESS)
      return st;
    flags = cudaEventWaitExternal;
  } else if (other) {
    flags = cudaEventWaitExternal; /* a plain wait would break it */
  }
  int saved;
  cusafe_status st = cs_device_enter(q->ctx->device, &saved);
  if (st != CUSAFE_SUCCESS)
    return st;
  cudaError_t err = cs_cu->stream_wait_event(q->stream, ev->event, flags);
  if (err != cudaSuccess)
    st = cs_fail_cuda(err, "cudaStreamWaitEvent");
  cs_device_leave(saved);
  return st;
}

static cusafe_status cs_stream_wait(struct cs_stream *s, struct cs_event *ev) {
  pthread_mutex_lock(&ev->lock);
  cusafe_status st = wait_locked(s, ev);
  pthread_mutex_unlock(&ev->lock);
  return st;
}

/* s, marked joining, joins the capture ev was recorded in (the thread
 * gated again, after the gates of the operations that saw s outside it):
 * CS_RETRY, the mark taken back, if that capture ended meanwhile. */
static cusafe_status join_finish(struct cs_stream *s, struct cs_event *ev) {
  struct cs_queue *q = &s->queue;
  pthread_mutex_lock(&ev->lock);
  uint64_t id = atomic_load(&ev->capture_id);
  struct cs_capture *c = id ? cs_capture_find(id) : NULL;
  cusafe_status st = CS_RETRY;
  if (c && c != CS_CAPTURE_BUSY) {
    int saved;
    st = cs_device_enter(q->ctx->device, &saved);
    if (st == CUSAFE_SUCCESS) {
      st = cs_capture_join(c, q, ev->event);
      cs_device_leave(saved);
    }
  }
  pthread_mutex_unlock(&ev->lock);
  cs_queue_unmark_joining(q); /* unless it joined */
  return st;
}

CUSAFE_API cusafe_status cusafe_stream_wait_event(cusafe_stream stream,
                                                  cusafe_event event) {
  CS_ENTER();
  CS_HOLD_OR_RETURN(cs_stream, s, stream, CS_STREAM, "stream");
  CS_HOLD_OR_RETURN(cs_event, ev, event, CS_EVENT, "event");
  if (ev->ctx != s->queue.ctx)
    return cs_mismatch("event", ev->ctx, "stream", s->queue.ctx);
  for (;;) {
    cs_gate(cs_call_);
    cusafe_status st = cs_stream_wait(s, ev);
    cs_ungate(cs_call_);
    if (st == CS_JOIN) {
      cs_gates_wait(); /* as a capture's beginning does (graph.c) */
      cs_gate(cs_call_);
      st = join_finish(s, ev);
      cs_ungate(cs_call_);
    }
    if (CS_LIKELY(st != CS_RETRY))
      return st;
    cs_capture_yield(); /* a capture begins or ends meanwhile */
  }
}

/* ---- queries ------------------------------------------------------------- */

/* A synchronisation, query or timing (`what`) of ev begins: refused if
 * ev's latest record was in a capture; until host_wait_end(), no record
 * of ev goes into a capture. */
static cusafe_status host_wait_begin(struct cs_event *ev, const char *what) {
  pthread_mutex_lock(&ev->lock);
  cusafe_status st = check_not_captured(ev, what);
  if (st == CUSAFE_SUCCESS)
    ev->host_waits++;
  pthread_mutex_unlock(&ev->lock);
  return st;
}

static void host_wait_end(struct cs_event *ev) {
  pthread_mutex_lock(&ev->lock);
  ev->host_waits--;
  pthread_mutex_unlock(&ev->lock);
}

CUSAFE_API cusafe_status cusafe_event_synchronize(cusafe_event event) {
  CS_ENTER();
  CS_HOLD_OR_RETURN(cs_event, ev, event, CS_EVENT, "event");
  cusafe_status st = host_wait_begin(ev, "synchronizing with");
  if (st != CUSAFE_SUCCESS)
    return st;
  st = cs_device_wait(ev->ctx->device, NULL, ev->event, false);
  host_wait_end(ev);
  return st;
}

CUSAFE_API cusafe_status cusafe_event_query(cusafe_event event) {
  CS_ENTER();
  CS_HOLD_OR_RETURN(cs_event, ev, event, CS_EVENT, "event");
  cusafe_status st = host_wait_begin(ev, "querying");
  if (st != CUSAFE_SUCCESS)
    return st;
  st = cs_device_wait(ev->ctx->device, NULL, ev->event, true);
  host_wait_end(ev);
  return st;
}

CUSAFE_API cusafe_status cusafe_event_elapsed_ms(float *ms, cusafe_event start,
                                                 cusafe_event end) {
  CS_ENTER_OUT(ms, 0.0f);
  CS_HOLD_OR_RETURN(cs_event, a, start, CS_EVENT, "start");
  CS_HOLD_OR_RETURN(cs_event, b, end, CS_EVENT, "end");
  if (a->ctx != b->ctx)
    return cs_mismatch("start", a->ctx, "end", b->ctx);
  if ((a->flags | b->flags) & CUSAFE_EVENT_DISABLE_TIMING)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "event was created with CUSAFE_EVENT_DISABLE_TIMING");
  cusafe_status st = host_wait_begin(a, "timing");
  if (st != CUSAFE_SUCCESS)
    return st;
  st = host_wait_begin(b, "timing");
  if (st != CUSAFE_SUCCESS) {
    host_wait_end(a);
    return st;
  }
  int saved;
  st = cs_device_enter(a->ctx->device, &saved);
  if (st == CUSAFE_SUCCESS) {
    st = cs_status_pending(cs_cu->event_elapsed_time(ms, a->event, b->event),
                           "cudaEventElapsedTime");
    cs_device_leave(saved);
  }
  host_wait_end(b);
  host_wait_end(a);
  return st;
}
