/* event.c -- events. */
#include <stdlib.h>

#include "internal.h"

#define EVENT_FLAGS (CUSAFE_EVENT_DISABLE_TIMING | CUSAFE_EVENT_BLOCKING_SYNC)

CUSAFE_API cusafe_status cusafe_event_create(cusafe_event *out,
                                             cusafe_context ctx_handle,
                                             unsigned int flags) {
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
  if (flags & ~EVENT_FLAGS) {
    st = cs_fail(CUSAFE_ERROR_INVALID_VALUE, "unknown event flags 0x%x",
                 flags & ~EVENT_FLAGS);
    goto out_ctx;
  }
  struct cs_event *ev = calloc(1, sizeof *ev);
  if (!ev) {
    st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
    goto out_ctx;
  }
  unsigned int cuda_flags = cudaEventDefault;
  if (flags & CUSAFE_EVENT_DISABLE_TIMING)
    cuda_flags |= cudaEventDisableTiming;
  if (flags & CUSAFE_EVENT_BLOCKING_SYNC)
    cuda_flags |= cudaEventBlockingSync;
  int saved;
  st = cs_device_enter(ctx->device, &saved);
  if (st != CUSAFE_SUCCESS)
    goto out_free;
  cudaError_t err = cs_cu->event_create(&ev->event, cuda_flags);
  if (err != cudaSuccess) {
    st = cs_fail_cuda(err, "cudaEventCreateWithFlags");
    cs_device_leave(saved);
    goto out_free;
  }
  ev->ctx = ctx; /* the reference acquired above becomes the event's */
  ev->flags = flags;
  st = cs_handle_new(&ev->hdr, CS_EVENT);
  if (st != CUSAFE_SUCCESS) {
    cs_cu->event_destroy(ev->event);
    cs_device_leave(saved);
    goto out_free;
  }
  cs_device_leave(saved);
  *out = ev->hdr.handle;
  return CUSAFE_SUCCESS;

out_free:
  free(ev);
out_ctx:
  cs_unref(&ctx->hdr);
  return st;
}

/* Destroys the CUDA event, also when its device cannot be made current. */
static cusafe_status event_fini(struct cs_event *ev) {
  int saved;
  cusafe_status st = cs_device_enter(ev->ctx->device, &saved);
  cudaError_t err = cs_cu->event_destroy(ev->event);
  if (err != cudaSuccess && st == CUSAFE_SUCCESS)
    st = cs_fail_cuda(err, "cudaEventDestroy");
  cs_device_leave(saved);
  return st;
}

cusafe_status cs_event_destroy(struct cs_event *ev) {
  struct cs_context *ctx = ev->ctx;
  cusafe_status st = event_fini(ev);
  free(ev);
  cusafe_status st2 = cs_unref(&ctx->hdr);
  return st != CUSAFE_SUCCESS ? st : st2;
}

void cs_event_shutdown(struct cs_object *obj, void *arg) {
  (void)arg;
  event_fini((struct cs_event *)obj);
  cs_handle_kill(obj);
}

static cusafe_status event_get(cusafe_event h, const char *name,
                               struct cs_event **out) {
  return cs_acquire(h, CS_EVENT, name, (struct cs_object **)out);
}

static cusafe_status event_status(cudaError_t err, const char *name) {
  if (err == cudaSuccess)
    return CUSAFE_SUCCESS;
  if (err == cudaErrorNotReady) {
    cs_fail(CUSAFE_ERROR_NOT_READY, "work is still pending");
    cs_note_cuda_error(err);
    return CUSAFE_ERROR_NOT_READY;
  }
  return cs_fail_cuda(err, name);
}

CUSAFE_API cusafe_status cusafe_event_record(cusafe_event event,
                                             cusafe_stream stream) {
  CS_ENTER();
  struct cs_event *ev;
  cusafe_status st = event_get(event, "event", &ev);
  if (st != CUSAFE_SUCCESS)
    return st;
  struct cs_queue *q;
  struct cs_object *held;
  st = cs_queue_get(stream, ev->ctx, &q, &held);
  if (st != CUSAFE_SUCCESS)
    goto out;
  if (q->ctx != ev->ctx) {
    st = cs_mismatch("stream", q->ctx, "event", ev->ctx);
  } else {
    int saved;
    st = cs_device_enter(ev->ctx->device, &saved);
    if (st == CUSAFE_SUCCESS) {
      st = event_status(cs_cu->event_record(ev->event, q->stream),
                        "cudaEventRecord");
      cs_device_leave(saved);
    }
  }
  if (held)
    cs_unref(held);
out:
  cs_unref(&ev->hdr);
  return st;
}

static cusafe_status event_call(cusafe_event event,
                                cudaError_t (*fn)(cudaEvent_t),
                                const char *name) {
  struct cs_event *ev;
  cusafe_status st = event_get(event, "event", &ev);
  if (st != CUSAFE_SUCCESS)
    return st;
  int saved;
  st = cs_device_enter(ev->ctx->device, &saved);
  if (st == CUSAFE_SUCCESS) {
    st = event_status(fn(ev->event), name);
    cs_device_leave(saved);
  }
  cs_unref(&ev->hdr);
  return st;
}

CUSAFE_API cusafe_status cusafe_event_synchronize(cusafe_event event) {
  CS_ENTER();
  return event_call(event, cs_cu->event_synchronize, "cudaEventSynchronize");
}

CUSAFE_API cusafe_status cusafe_event_query(cusafe_event event) {
  CS_ENTER();
  return event_call(event, cs_cu->event_query, "cudaEventQuery");
}

CUSAFE_API cusafe_status cusafe_event_elapsed_ms(float *ms, cusafe_event start,
                                                 cusafe_event end) {
  if (ms)
    *ms = 0.0f;
  CS_ENTER();
  if (!ms)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "ms is NULL");
  struct cs_event *a, *b;
  cusafe_status st = event_get(start, "start", &a);
  if (st != CUSAFE_SUCCESS)
    return st;
  st = event_get(end, "end", &b);
  if (st != CUSAFE_SUCCESS)
    goto out_a;
  if (a->ctx != b->ctx) {
    st = cs_mismatch("start", a->ctx, "end", b->ctx);
  } else if ((a->flags | b->flags) & CUSAFE_EVENT_DISABLE_TIMING) {
    st = cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                 "event was created with CUSAFE_EVENT_DISABLE_TIMING");
  } else {
    int saved;
    st = cs_device_enter(a->ctx->device, &saved);
    if (st == CUSAFE_SUCCESS) {
      st = event_status(cs_cu->event_elapsed_time(ms, a->event, b->event),
                        "cudaEventElapsedTime");
      cs_device_leave(saved);
    }
  }
  cs_unref(&b->hdr);
out_a:
  cs_unref(&a->hdr);
  return st;
}
