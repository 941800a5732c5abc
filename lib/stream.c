/* stream.c -- streams, and the queues through which buffers order work. */
#include <stdlib.h>

#include "internal.h"

cusafe_status cs_queue_get(cusafe_stream stream, struct cs_context *dflt,
                           struct cs_queue **out, struct cs_object **held) {
  *held = NULL;
  if (stream == CUSAFE_STREAM_DEFAULT) {
    *out = &dflt->queue;
    return CUSAFE_SUCCESS;
  }
  struct cs_object *obj;
  cusafe_status st = cs_acquire(stream, CS_STREAM, "stream", &obj);
  if (st != CUSAFE_SUCCESS)
    return st;
  *held = obj;
  *out = &((struct cs_stream *)obj)->queue;
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

cusafe_status cs_queue_handoff(struct cs_queue *from, struct cs_queue *to) {
  int saved;
  cusafe_status st = cs_device_enter(from->ctx->device, &saved);
  if (st != CUSAFE_SUCCESS)
    return st;
  cudaEvent_t ev = NULL;
  st = handoff_event(from, &ev);
  if (st == CUSAFE_SUCCESS) {
    cudaError_t err = cs_cu->event_record(ev, from->stream);
    if (err != cudaSuccess)
      st = cs_fail_cuda(err, "cudaEventRecord");
  }
  cs_device_leave(saved);
  if (st != CUSAFE_SUCCESS)
    return st;
  st = cs_device_enter(to->ctx->device, &saved);
  if (st != CUSAFE_SUCCESS)
    return st;
  cudaError_t err = cs_cu->stream_wait_event(to->stream, ev, 0);
  if (err != cudaSuccess)
    st = cs_fail_cuda(err, "cudaStreamWaitEvent");
  cs_device_leave(saved);
  return st;
}

void cs_queue_fini(struct cs_queue *q) {
  cudaEvent_t ev = atomic_load(&q->handoff);
  if (ev)
    cs_cu->event_destroy(ev);
}

CUSAFE_API cusafe_status cusafe_stream_create(cusafe_stream *out,
                                              cusafe_context ctx_handle,
                                              unsigned int flags,
                                              int priority) {
  if (out)
    *out = CUSAFE_NULL_HANDLE;
  CS_ENTER();
  if (!out)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  struct cs_context *ctx;
  cusafe_status st = cs_acquire(ctx_handle, CS_CONTEXT, "context",
                                (struct cs_object **)&ctx);
  if (st != CUSAFE_SUCCESS)
    return st;
  if (flags & ~CUSAFE_STREAM_NON_BLOCKING) {
    st = cs_fail(CUSAFE_ERROR_INVALID_VALUE, "unknown stream flags 0x%x",
                 flags & ~CUSAFE_STREAM_NON_BLOCKING);
    goto out_ctx;
  }
  /* CUDA clamps a priority out of range silently; say so instead. */
  if (priority < ctx->priority_greatest || priority > ctx->priority_least) {
    st = cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                 "priority %d is outside the device's range [%d, %d]",
                 priority, ctx->priority_greatest, ctx->priority_least);
    goto out_ctx;
  }
  struct cs_stream *s = calloc(1, sizeof *s);
  if (!s) {
    st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
    goto out_ctx;
  }
  int saved;
  st = cs_device_enter(ctx->device, &saved);
  if (st != CUSAFE_SUCCESS)
    goto out_free;
  cudaError_t err = cs_cu->stream_create(
      &s->queue.stream,
      (flags & CUSAFE_STREAM_NON_BLOCKING) ? cudaStreamNonBlocking
                                           : cudaStreamDefault,
      priority);
  if (err != cudaSuccess) {
    st = cs_fail_cuda(err, "cudaStreamCreateWithPriority");
    cs_device_leave(saved);
    goto out_free;
  }
  s->queue.ctx = ctx; /* the reference acquired above becomes the stream's */
  s->queue.owner = &s->hdr;
  st = cs_handle_new(&s->hdr, CS_STREAM);
  if (st != CUSAFE_SUCCESS) {
    cs_cu->stream_destroy(s->queue.stream);
    cs_device_leave(saved);
    goto out_free;
  }
  cs_device_leave(saved);
  *out = s->hdr.handle;
  return CUSAFE_SUCCESS;

out_free:
  free(s);
out_ctx:
  cs_unref(&ctx->hdr);
  return st;
}

/* Queued work still runs: CUDA defers the destruction until it is done. */
/* Destroys the CUDA stream -- also when its device cannot be made current,
 * since a stream left behind would outlive its context. */
static cusafe_status stream_fini(struct cs_stream *s) {
  int saved;
  cusafe_status st = cs_device_enter(s->queue.ctx->device, &saved);
  cs_queue_fini(&s->queue);
  cudaError_t err = cs_cu->stream_destroy(s->queue.stream);
  if (err != cudaSuccess && st == CUSAFE_SUCCESS)
    st = cs_fail_cuda(err, "cudaStreamDestroy");
  cs_device_leave(saved);
  return st;
}

cusafe_status cs_stream_destroy(struct cs_stream *s) {
  struct cs_context *ctx = s->queue.ctx;
  cusafe_status st = stream_fini(s);
  free(s);
  cusafe_status st2 = cs_unref(&ctx->hdr);
  return st != CUSAFE_SUCCESS ? st : st2;
}

void cs_stream_shutdown(struct cs_object *obj, void *arg) {
  (void)arg;
  stream_fini((struct cs_stream *)obj);
  cs_handle_kill(obj);
}

static cusafe_status stream_get(cusafe_stream h, struct cs_stream **out) {
  return cs_acquire(h, CS_STREAM, "stream", (struct cs_object **)out);
}

/* Runs a CUDA call on a stream with its device current; `name` names the
 * CUDA function for the message. */
static cusafe_status stream_call(cusafe_stream h,
                                 cudaError_t (*fn)(cudaStream_t),
                                 const char *name) {
  struct cs_stream *s;
  cusafe_status st = stream_get(h, &s);
  if (st != CUSAFE_SUCCESS)
    return st;
  int saved;
  st = cs_device_enter(s->queue.ctx->device, &saved);
  if (st == CUSAFE_SUCCESS) {
    cudaError_t err = fn(s->queue.stream);
    if (err == cudaErrorNotReady) {
      st = cs_fail(CUSAFE_ERROR_NOT_READY, "work is still pending");
      cs_note_cuda_error(err);
    } else if (err != cudaSuccess) {
      st = cs_fail_cuda(err, name);
    }
    cs_device_leave(saved);
  }
  cs_unref(&s->hdr);
  return st;
}

CUSAFE_API cusafe_status cusafe_stream_synchronize(cusafe_stream stream) {
  CS_ENTER();
  return stream_call(stream, cs_cu->stream_synchronize,
                     "cudaStreamSynchronize");
}

CUSAFE_API cusafe_status cusafe_stream_query(cusafe_stream stream) {
  CS_ENTER();
  return stream_call(stream, cs_cu->stream_query, "cudaStreamQuery");
}

CUSAFE_API cusafe_status cusafe_stream_wait_event(cusafe_stream stream,
                                                  cusafe_event event) {
  CS_ENTER();
  struct cs_stream *s;
  cusafe_status st = stream_get(stream, &s);
  if (st != CUSAFE_SUCCESS)
    return st;
  struct cs_event *ev;
  st = cs_acquire(event, CS_EVENT, "event", (struct cs_object **)&ev);
  if (st != CUSAFE_SUCCESS)
    goto out;
  if (ev->ctx != s->queue.ctx) {
    st = cs_mismatch("event", ev->ctx, "stream", s->queue.ctx);
  } else {
    int saved;
    st = cs_device_enter(s->queue.ctx->device, &saved);
    if (st == CUSAFE_SUCCESS) {
      cudaError_t err = cs_cu->stream_wait_event(s->queue.stream, ev->event, 0);
      if (err != cudaSuccess)
        st = cs_fail_cuda(err, "cudaStreamWaitEvent");
      cs_device_leave(saved);
    }
  }
  cs_unref(&ev->hdr);
out:
  cs_unref(&s->hdr);
  return st;
}

CUSAFE_API cusafe_status cusafe_stream_get_context(cusafe_context *out,
                                                   cusafe_stream stream) {
  if (out)
    *out = CUSAFE_NULL_HANDLE;
  CS_ENTER();
  if (!out)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  struct cs_stream *s;
  cusafe_status st = stream_get(stream, &s);
  if (st != CUSAFE_SUCCESS)
    return st;
  st = cs_user_ref(&s->queue.ctx->hdr);
  if (st == CUSAFE_SUCCESS)
    *out = s->queue.ctx->hdr.handle;
  cs_unref(&s->hdr);
  return st;
}

CUSAFE_API cusafe_status cusafe_stream_interop_handle(void **out,
                                                      cusafe_stream stream) {
  if (out)
    *out = NULL;
  CS_ENTER();
  if (!out)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  struct cs_stream *s;
  cusafe_status st = stream_get(stream, &s);
  if (st != CUSAFE_SUCCESS)
    return st;
  *out = (void *)s->queue.stream;
  cs_unref(&s->hdr);
  return CUSAFE_SUCCESS;
}
