/* stream.c -- streams, and the queues through which buffers order work
 * (invariant 2: a stream-ordered free runs after everything queued before
 * it; a stream holds a reference on its context, invariant 1). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "context.h"
#include "device.h"
#include "graph.h"
#include "stream.h"

cusafe_status cs_queue_get(cusafe_stream stream, struct cs_context *dflt,
                           const char *dflt_name, struct cs_queue **out,
                           struct cs_object **held) {
  *held = NULL;
  if (stream == CUSAFE_STREAM_DEFAULT) {
    *out = &dflt->queue;
    return CUSAFE_SUCCESS;
  }
  struct cs_stream *s;
  cusafe_status st = CS_ACQUIRE(stream, CS_STREAM, "stream", &s);
  if (st != CUSAFE_SUCCESS)
    return st;
  if (dflt_name && s->queue.ctx != dflt) {
    st = cs_mismatch("stream", s->queue.ctx, dflt_name, dflt);
    cs_unref(&s->hdr);
    return st;
  }
  *held = &s->hdr;
  *out = &s->queue;
  return CUSAFE_SUCCESS;
}

/* One event per queue suffices: a wait captures the event's latest record
 * when it is queued, and a later record on the same stream only covers more
 * of it, so concurrent hand-offs from one stream stay correct. */
static cusafe_status handoff_event(struct cs_queue *q, cudaEvent_t *out) {
  cudaEvent_t ev = atomic_load_explicit(&q->handoff, memory_order_acquire);
  if (ev) {
    *out = ev;
    return CUSAFE_SUCCESS;
  }
  cudaError_t err = cs_cu->event_create(&ev, cudaEventDisableTiming);
  if (err != cudaSuccess)
    return cs_fail_cuda(err, "cudaEventCreateWithFlags");
  cudaEvent_t expected = NULL;
  if (!atomic_compare_exchange_strong(&q->handoff, &expected, ev)) {
    cs_cu->event_destroy(ev); /* another thread made one first */
    ev = expected;
  }
  *out = ev;
  return CUSAFE_SUCCESS;
}

/* The one point that stands for everything queued on q so far outside any
 * capture (invariant 9; lib/README.md, "Ordering after a stream"), the
 * thread gated: NULL in *entry if q captures nothing -- q's stream itself,
 * where a record or a synchronisation stands for it -- or, if q captures,
 * the event recorded just before q entered its capture (q's captured work
 * runs only in replays, which the graph orders by what it holds).
 * CS_RETRY while a capture begins or ends on q.  With `record`, for a
 * record on q or a synchronisation of it: a capture whose end failed
 * there is ended first (a record would be captured into nothing), or that
 * fails. */
static cusafe_status queue_point(struct cs_queue *q, bool record,
                                 cudaEvent_t *entry) {
  *entry = NULL;
  struct cs_capture *c = cs_queue_capture(q);
  if (CS_UNLIKELY(c == CS_CAPTURE_BUSY))
    return CS_RETRY;
  if (CS_UNLIKELY(c)) {
    *entry = cs_queue_entry(q);
    return CUSAFE_SUCCESS;
  }
  if (record && cs_queue_has_leftover(q)) {
    cusafe_status st = cs_queue_leftover(q);
    if (st != CUSAFE_SUCCESS)
      return st;
  }
  if (CS_UNLIKELY(q->borrowed) && cs_queue_untouchable(q))
    return CS_PARK;
  return CUSAFE_SUCCESS;
}

bool cs_queue_untouchable(struct cs_queue *q) {
  if (CS_LIKELY(!q->borrowed))
    return false;
  int saved;
  if (cs_device_enter(q->ctx->device, &saved) != CUSAFE_SUCCESS)
    return false;
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  bool no;
  if (q->wraps_default) /* (the per-thread stream taken as the legacy one) */
    no = cs_cu->stream_is_capturing(cudaStreamLegacy, &cs) ==
         cudaErrorStreamCaptureImplicit;
  else {
    /* A left-over mark may hide a capture that other code began since
     * the left-over one ended: the end (which only ends cusafe's own)
     * finds that and takes the mark away first. */
    if (cs_queue_capture(q) == NULL && cs_queue_has_leftover(q))
      (void)cs_leftover_end(q->stream, q->ctx);
    no = cs_queue_capture(q) == NULL && !cs_queue_has_leftover(q) &&
         cs_cu->stream_is_capturing(q->stream, &cs) == cudaSuccess &&
         cs != cudaStreamCaptureStatusNone;
  }
  cs_device_leave(saved);
  return no;
}

cusafe_status cs_untouchable_fail(struct cs_queue *q) {
  if (q->wraps_default)
    return cs_fail(CUSAFE_ERROR_CAPTURING,
                   "stream 0x%016llx wraps a device's default stream, which "
                   "CUDA lets nothing wait for while a blocking stream of "
                   "the device captures",
                   (unsigned long long)q->owner->handle);
  return cs_fail(CUSAFE_ERROR_CAPTURING,
                 "stream 0x%016llx is being captured by other code: nothing "
                 "outside that capture can wait for its work",
                 (unsigned long long)q->owner->handle);
}

cusafe_status cs_untouchable_refuse(const char *what, struct cs_queue *q) {
  if (q->wraps_default)
    return cs_fail(CUSAFE_ERROR_CAPTURING,
                   "%s cannot be done: stream 0x%016llx wraps a device's "
                   "default stream, which CUDA lets nothing use while a "
                   "blocking stream of the device captures",
                   what, (unsigned long long)q->owner->handle);
  return cs_fail(CUSAFE_ERROR_CAPTURING,
                 "%s cannot be done: stream 0x%016llx is being captured by "
                 "other code",
                 what, (unsigned long long)q->owner->handle);
}

cusafe_status cs_queue_handoff(struct cs_queue *from, struct cs_queue *to) {
  /* Ordering never goes into a capture: work that a capture's queue
   * must follow is captured work's, which the capture orders itself
   * (cs_capture_use).  A capture beginning or ending on `to` is waited
   * for. */
  struct cs_capture *tc = cs_queue_capture(to);
  if (CS_UNLIKELY(tc))
    return tc == CS_CAPTURE_BUSY
               ? CS_RETRY
               : cs_capturing("ordering work after another stream", to);
  /* Nor into a capture of other code: a wait there for work outside
   * would break it (and on a default stream, CUDA refuses any wait). */
  if (CS_UNLIKELY(to->borrowed) && cs_queue_untouchable(to))
    return cs_untouchable_refuse("ordering work after another stream", to);
  int saved;
  cusafe_status st = cs_device_enter(from->ctx->device, &saved);
  if (st != CUSAFE_SUCCESS)
    return st;
  cudaEvent_t ev = NULL;
  /* The look at from's capture and the record are one step against the
   * capture's beginning, which records `entry` under the same lock. */
  cs_spin_lock(&from->capture_lock);
  st = queue_point(from, true, &ev);
  if (st == CS_PARK)
    st = cs_untouchable_fail(from);
  if (st == CUSAFE_SUCCESS && !ev) {
    st = handoff_event(from, &ev);
    if (st == CUSAFE_SUCCESS) {
      cudaError_t err = cs_cu->event_record(ev, from->stream);
      if (err != cudaSuccess)
        st = cs_fail_cuda(err, "cudaEventRecord");
    }
    /* Other code may have begun a capture of from's stream since
     * queue_point() looked: then the record may be in that capture, and
     * a wait for it would pull `to` in.  Looked at again. */
    if (st == CUSAFE_SUCCESS && CS_UNLIKELY(from->borrowed) &&
        cs_queue_untouchable(from))
      st = cs_untouchable_fail(from);
  }
  /* From such a stream the lock is kept until the wait is made: another
   * hand-off's record of the same event, into a capture begun since this
   * look, would else come first, and the wait would join that capture. */
  bool keep = st == CUSAFE_SUCCESS && CS_UNLIKELY(from->borrowed);
  if (!keep)
    cs_spin_unlock(&from->capture_lock);
  cs_device_leave(saved);
  if (st != CUSAFE_SUCCESS)
    return st;
  st = cs_device_enter(to->ctx->device, &saved);
  if (st == CUSAFE_SUCCESS) {
    cudaError_t err = cs_cu->stream_wait_event(to->stream, ev, 0);
    if (err != cudaSuccess)
      st = cs_fail_cuda(err, "cudaStreamWaitEvent");
    cs_device_leave(saved);
  }
  if (keep)
    cs_spin_unlock(&from->capture_lock);
  return st;
}

cusafe_status cs_queue_wait_gated(struct cs_queue *q, cudaError_t *err) {
  /* q's device current: a default stream's special handle names the
   * current device's (a drain may run on a thread whose device is
   * another).  Tried also where that fails, as every teardown. */
  int saved;
  bool entered =
      cs_device_enter_teardown(q->ctx->device, &saved) == CUSAFE_SUCCESS;
  cudaEvent_t entry;
  /* As a record: a synchronisation of a stream that a capture left over
   * would fail, and break it; that capture is ended first. */
  cusafe_status st = queue_point(q, true, &entry);
  if (st == CS_PARK) /* refused as CUDA would, without breaking a capture */
    *err = cudaErrorStreamCaptureImplicit;
  else if (st == CUSAFE_SUCCESS)
    *err = entry ? cs_cu->event_synchronize(entry)
                 : cs_cu->stream_synchronize(q->stream);
  else if (st == CS_RETRY)
    *err = cudaSuccess;
  else /* the left-over capture could not be ended: as CUDA would answer */
    *err = cudaErrorStreamCaptureInvalidated;
  if (entered)
    cs_device_leave(saved);
  return st;
}

cudaError_t cs_queue_wait_or_park(struct cs_queue *q, bool *park) {
  struct cs_thread *self = cs_thread_self();
  for (;;) {
    cs_gate(self);
    cudaError_t err;
    cusafe_status st = cs_queue_wait_gated(q, &err);
    if (st == CS_PARK && park) {
      *park = true;
      err = cudaSuccess;
    }
    cs_ungate(self);
    if (st != CS_RETRY)
      return err;
    cs_capture_yield(); /* a capture begins or ends on q */
  }
}

cudaError_t cs_queue_wait(struct cs_queue *q) {
  return cs_queue_wait_or_park(q, NULL);
}

cudaError_t cs_queue_fini(struct cs_queue *q, bool owned) {
  cudaEvent_t ev = atomic_load(&q->handoff);
  if (ev)
    cs_cu->event_destroy(ev);
  if (q->entry)
    cs_cu->event_destroy(q->entry);
  return owned ? cs_cu->stream_destroy(q->stream) : cudaSuccess;
}

/* ---- streams ------------------------------------------------------------- */

/* What cusafe_stream_create() asks for. */
struct stream_args {
  unsigned int flags;
  int priority;
};

static cusafe_status stream_check(const struct cs_context *ctx,
                                  const void *args) {
  const struct stream_args *a = args;
  if (a->flags & ~CUSAFE_STREAM_NON_BLOCKING)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "unknown stream flags 0x%x",
                   a->flags & ~CUSAFE_STREAM_NON_BLOCKING);
  /* CUDA clamps a priority out of range silently; say so instead. */
  if (a->priority < ctx->priority_greatest || a->priority > ctx->priority_least)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "priority %d is outside the device's range [%d, %d]",
                   a->priority, ctx->priority_greatest, ctx->priority_least);
  return CUSAFE_SUCCESS;
}

static cusafe_status stream_make(struct cs_object *obj, struct cs_context *ctx,
                                 const void *args) {
  const struct stream_args *a = args;
  struct cs_stream *s = (struct cs_stream *)obj;
  cudaError_t err = cs_cu->stream_create(&s->queue.stream,
                                         (a->flags & CUSAFE_STREAM_NON_BLOCKING)
                                             ? cudaStreamNonBlocking
                                             : cudaStreamDefault,
                                         a->priority);
  if (err != cudaSuccess)
    return cs_fail_cuda(err, "cudaStreamCreateWithPriority");
  s->queue.ctx = ctx;
  s->queue.owner = obj;
  return CUSAFE_SUCCESS;
}

/* A replay reads the queue's stream and context in the stream's slot. */
static void stream_fill(struct cs_object *obj, union cs_slot_data *data) {
  struct cs_stream *s = (struct cs_stream *)obj;
  data->stream.queue = &s->queue;
  data->stream.ctx = s->queue.ctx;
  data->stream.stream = s->queue.stream;
  atomic_init(&data->stream.lent, s->queue.borrowed);
  s->slot = data;
}

/* ---- streams that other code may capture --------------------------------- */

/* The streams whose CUDA streams other code may reach (queue.borrowed),
 * until they are destroyed: a context's synchronisation looks at them. */
static pthread_mutex_t lent_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cs_stream *lent_head;

/* From now on other code may capture s's CUDA stream: so say its queue,
 * its slot (a replay's fast path asks the driver) and the list. */
static void lend(struct cs_stream *s) {
  atomic_store(&s->queue.borrowed, true);
  atomic_store(&s->slot->stream.lent, true);
  pthread_mutex_lock(&lent_lock);
  if (!s->lent_listed) {
    s->lent_prev = NULL;
    s->lent_next = lent_head;
    if (lent_head)
      lent_head->lent_prev = s;
    lent_head = s;
    s->lent_listed = true;
  }
  pthread_mutex_unlock(&lent_lock);
}

/* s leaves the list, before its CUDA stream is destroyed. */
static void lent_leave(struct cs_stream *s) {
  pthread_mutex_lock(&lent_lock);
  if (s->lent_listed) {
    if (s->lent_prev)
      s->lent_prev->lent_next = s->lent_next;
    else
      lent_head = s->lent_next;
    if (s->lent_next)
      s->lent_next->lent_prev = s->lent_prev;
    s->lent_listed = false;
  }
  pthread_mutex_unlock(&lent_lock);
}

/* The first lent stream of ctx that nothing may touch now, or NULL
 * (lent_lock held). */
static struct cs_stream *lent_busy_locked(struct cs_context *ctx) {
  for (struct cs_stream *s = lent_head; s; s = s->lent_next)
    if (s->queue.ctx == ctx && cs_queue_untouchable(&s->queue))
      return s;
  return NULL;
}

cusafe_status cs_streams_lent_check(struct cs_context *ctx, const char *what) {
  cusafe_status st = CUSAFE_SUCCESS;
  pthread_mutex_lock(&lent_lock);
  struct cs_stream *s = lent_busy_locked(ctx);
  if (s)
    st = cs_untouchable_refuse(what, &s->queue);
  pthread_mutex_unlock(&lent_lock);
  return st;
}

bool cs_streams_lent_busy(struct cs_context *ctx) {
  pthread_mutex_lock(&lent_lock);
  bool busy = lent_busy_locked(ctx) != NULL;
  pthread_mutex_unlock(&lent_lock);
  return busy;
}

/* ---- cusafe's own CUDA streams ------------------------------------------- */

/* The streams of cusafe_stream_create() whose CUDA streams are not
 * destroyed yet: a wrapper of one of those CUDA streams holds its stream
 * (cusafe_stream_wrap), found here. */
static pthread_mutex_t owned_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cs_stream *owned_head;

/* stream_fill(), and s, just made, enters the list (before its handle is
 * published, so that no wrapper of its CUDA stream can be made first). */
static void owned_fill(struct cs_object *obj, union cs_slot_data *data) {
  struct cs_stream *s = (struct cs_stream *)obj;
  stream_fill(obj, data);
  pthread_mutex_lock(&owned_lock);
  s->owned_next = owned_head;
  if (owned_head)
    owned_head->owned_prev = s;
  owned_head = s;
  s->owned_listed = true;
  pthread_mutex_unlock(&owned_lock);
}

/* s leaves the list, before its CUDA stream is destroyed. */
static void owned_leave(struct cs_stream *s) {
  pthread_mutex_lock(&owned_lock);
  if (s->owned_listed) {
    if (s->owned_prev)
      s->owned_prev->owned_next = s->owned_next;
    else
      owned_head = s->owned_next;
    if (s->owned_next)
      s->owned_next->owned_prev = s->owned_prev;
    s->owned_listed = false;
  }
  pthread_mutex_unlock(&owned_lock);
}

/* The stream of cusafe's whose CUDA stream is `stream`, referenced, or
 * NULL if there is none; refused if its last reference is being dropped. */
static cusafe_status owned_hold(cudaStream_t stream, struct cs_stream **out) {
  cusafe_status st = CUSAFE_SUCCESS;
  *out = NULL;
  pthread_mutex_lock(&owned_lock);
  for (struct cs_stream *o = owned_head; o; o = o->owned_next) {
    if (o->queue.stream != stream)
      continue;
    if (cs_try_ref(&o->hdr))
      *out = o;
    else
      st = cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "stream %p is being destroyed: stream 0x%016llx, which "
                   "owns it, was released",
                   (void *)stream, (unsigned long long)o->hdr.handle);
    break;
  }
  pthread_mutex_unlock(&owned_lock);
  return st;
}

static void stream_unmake(struct cs_object *obj) {
  cs_cu->stream_destroy(((struct cs_stream *)obj)->queue.stream);
}

CUSAFE_API cusafe_status cusafe_stream_create(cusafe_stream *out,
                                              cusafe_context ctx,
                                              unsigned int flags,
                                              int priority) {
  static const struct cs_child how = {.type = CS_STREAM,
                                      .size = sizeof(struct cs_stream),
                                      .check = stream_check,
                                      .make = stream_make,
                                      .unmake = stream_unmake,
                                      .fill = owned_fill};
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  return cs_context_child(out, ctx, &how,
                          &(struct stream_args){flags, priority});
}

/* ---- streams of other libraries ------------------------------------------ */

/* Checks that the stream is one of ctx's device (which is current: the
 * special handles of the default streams mean that device's); one of
 * cusafe's own is held. */
static cusafe_status wrap_make(struct cs_object *obj, struct cs_context *ctx,
                               const void *args) {
  cudaStream_t stream = *(const cudaStream_t *)args;
  struct cs_stream *s = (struct cs_stream *)obj;
  struct cs_stream *held;
  cusafe_status st = owned_hold(stream, &held);
  if (st != CUSAFE_SUCCESS)
    return st;
  int device = held ? held->queue.ctx->device : -1;
  bool dflt = stream == NULL || stream == cudaStreamLegacy ||
              stream == cudaStreamPerThread;
  if (dflt) {
    /* The current device's, without asking CUDA: a query of a default
     * stream would invalidate a blocking stream's capture. */
    device = ctx->device;
  } else if (!held) {
    cudaError_t err = cs_cu->stream_get_device(stream, &device);
    if (err != cudaSuccess)
      return cs_fail_cuda(err, "cudaStreamGetDevice");
  }
  if (device != ctx->device) {
    st = cs_fail(CUSAFE_ERROR_CONTEXT_MISMATCH,
                 "stream %p belongs to device %d but context belongs to "
                 "device %d",
                 (void *)stream, device, ctx->device);
    if (held)
      cs_unref(&held->hdr);
    return st;
  }
  s->holds = held;
  s->queue.stream = stream;
  s->queue.ctx = ctx;
  s->queue.owner = obj;
  s->queue.wraps_default = dflt;
  s->borrowed = true;
  return CUSAFE_SUCCESS;
}

/* stream_fill(), and the wrapper, just made, is lent (before its handle is
 * published: another library owns its stream). */
static void wrap_fill(struct cs_object *obj, union cs_slot_data *data) {
  stream_fill(obj, data);
  lend((struct cs_stream *)obj);
}

/* A wrapper that could not be entered lets go of the stream it held. */
static void wrap_unmake(struct cs_object *obj) {
  struct cs_stream *s = (struct cs_stream *)obj;
  if (s->holds)
    cs_unref(&s->holds->hdr);
}

CUSAFE_API cusafe_status cusafe_stream_wrap(cusafe_stream *out,
                                            cusafe_context ctx,
                                            void *cuda_stream) {
  static const struct cs_child how = {.type = CS_STREAM,
                                      .size = sizeof(struct cs_stream),
                                      .make = wrap_make,
                                      .unmake = wrap_unmake,
                                      .fill = wrap_fill};
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  cudaStream_t stream = (cudaStream_t)cuda_stream;
  return cs_context_child(out, ctx, &how, &stream);
}

/* Destroys the CUDA stream -- also when its device cannot be made current,
 * since a stream left behind would outlive its context.  Queued work still
 * runs: CUDA defers the destruction until it is done. */
static cudaError_t queue_fini(void *obj) {
  struct cs_stream *s = obj;
  lent_leave(s);
  if (!s->borrowed)
    owned_leave(s);
  cs_capture_discard(&s->queue); /* a capture that began on it ends */
  /* So does one of cusafe's whose end failed, also on a stream of another
   * library's: its owner could not end it, nor begin one of its own. */
  if (cs_queue_has_leftover(&s->queue) &&
      !cs_leftover_end(s->queue.stream, s->queue.ctx))
    (void)cs_leftover_end(s->queue.stream, s->queue.ctx); /* once more */
  /* No mark names the stream once it is destroyed (its handle may name
   * another stream later), nor this queue. */
  cs_queue_forget_leftover(&s->queue, !s->borrowed);
  cudaError_t err = cs_queue_fini(&s->queue, !s->borrowed);
  /* A capture that ended here may have been what kept the legacy stream
   * untouchable: the follows parked meanwhile are done now. */
  cs_parked_drain();
  return err;
}

cusafe_status cs_stream_fini(struct cs_object *obj) {
  struct cs_stream *s = (struct cs_stream *)obj;
  return cs_device_teardown(s->queue.ctx->device, queue_fini, s,
                            "cudaStreamDestroy");
}

void cs_stream_free(struct cs_object *obj) {
  struct cs_stream *s = (struct cs_stream *)obj;
  struct cs_stream *holds = s->holds;
  free(obj);
  if (holds)
    cs_unref(&holds->hdr);
}

void cs_stream_describe(const struct cs_object *obj, char *what, size_t size) {
  const struct cs_stream *s = (const struct cs_stream *)obj;
  snprintf(what, size, "device %d%s", s->queue.ctx->device,
           s->borrowed ? ", wrapped" : "");
}

/* ---- work ---------------------------------------------------------------- */

/* Waits for the work on s, or with `query` asks whether it is done,
 * unless s captures (`what` names the operation), the thread gated. */
static cusafe_status stream_wait(struct cs_stream *s, bool query,
                                 const char *what) {
  struct cs_thread *self = cs_thread_self();
  for (;;) {
    cs_gate(self);
    struct cs_queue *q = &s->queue;
    struct cs_capture *c = cs_queue_capture(q);
    cusafe_status st =
        c == CS_CAPTURE_BUSY ? CS_RETRY
        : c                  ? cs_capturing(what, q)
        : CS_UNLIKELY(q->borrowed) && cs_queue_untouchable(q)
            ? cs_untouchable_refuse(what, q)
            : cs_device_wait(q->ctx->device, q->stream, NULL, query);
    cs_ungate(self);
    if (CS_LIKELY(st != CS_RETRY))
      return st;
    cs_capture_yield(); /* a capture begins or ends on s */
  }
}

CUSAFE_API cusafe_status cusafe_stream_synchronize(cusafe_stream stream) {
  CS_ENTER();
  CS_HOLD_OR_RETURN(cs_stream, s, stream, CS_STREAM, "stream");
  cs_parked_drain_maybe(); /* what waits for a stream, queued if it can be */
  return stream_wait(s, false, "synchronizing");
}

CUSAFE_API cusafe_status cusafe_stream_query(cusafe_stream stream) {
  CS_ENTER();
  CS_HOLD_OR_RETURN(cs_stream, s, stream, CS_STREAM, "stream");
  return stream_wait(s, true, "querying");
}

/* ---- queries ------------------------------------------------------------- */

CS_QUERY(cusafe_stream_get_context, cusafe_context, CUSAFE_NULL_HANDLE,
         cs_stream, CS_STREAM, "stream",
         st = cs_context_hand_out(o->queue.ctx, out))
/* Other code may capture the stream from now on (see cs_queue.borrowed). */
CS_QUERY(cusafe_stream_interop_handle, void *, NULL, cs_stream, CS_STREAM,
         "stream", lend(o);
         *out = (void *)o->queue.stream)
