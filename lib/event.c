/* event.c -- events, their records on streams and the waits of streams for
 * them (an event holds a reference on its context, invariant 1). */
#include <stdio.h>
#include <stdlib.h>

#include "context.h"
#include "device.h"
#include "event.h"

#define EVENT_FLAGS (CUSAFE_EVENT_DISABLE_TIMING | CUSAFE_EVENT_BLOCKING_SYNC)

/* Creates the CUDA event of ev (ctx's device current). */
static cusafe_status event_make(struct cs_event *ev, struct cs_context *ctx,
                                unsigned int flags) {
  unsigned int cuda_flags = cudaEventDefault;
  if (flags & CUSAFE_EVENT_DISABLE_TIMING)
    cuda_flags |= cudaEventDisableTiming;
  if (flags & CUSAFE_EVENT_BLOCKING_SYNC)
    cuda_flags |= cudaEventBlockingSync;
  cudaError_t err = cs_cu->event_create(&ev->event, cuda_flags);
  if (err != cudaSuccess)
    return cs_fail_cuda(err, "cudaEventCreateWithFlags");
  ev->ctx = ctx;
  ev->flags = flags;
  cusafe_status st = cs_handle_new(&ev->hdr, CS_EVENT);
  if (st != CUSAFE_SUCCESS)
    cs_cu->event_destroy(ev->event);
  return st;
}

/* Checks the flags, then makes the event (its context's reference becomes
 * the event's). */
static cusafe_status event_new(cusafe_event *out, struct cs_context *ctx,
                               unsigned int flags) {
  if (flags & ~EVENT_FLAGS)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "unknown event flags 0x%x",
                   flags & ~EVENT_FLAGS);
  struct cs_event *ev = calloc(1, sizeof *ev);
  if (!ev)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  int saved;
  cusafe_status st = cs_device_enter(ctx->device, &saved);
  if (st == CUSAFE_SUCCESS) {
    st = event_make(ev, ctx, flags);
    cs_device_leave(saved);
  }
  if (st != CUSAFE_SUCCESS) {
    free(ev);
    return st;
  }
  *out = ev->hdr.handle;
  return CUSAFE_SUCCESS;
}

CUSAFE_API cusafe_status cusafe_event_create(cusafe_event *out,
                                             cusafe_context ctx_handle,
                                             unsigned int flags) {
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  struct cs_context *ctx;
  cusafe_status st = CS_ACQUIRE(ctx_handle, CS_CONTEXT, "context", &ctx);
  if (st != CUSAFE_SUCCESS)
    return st;
  st = event_new(out, ctx, flags);
  if (st != CUSAFE_SUCCESS)
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

cusafe_status cs_event_destroy(struct cs_object *obj) {
  struct cs_event *ev = (struct cs_event *)obj;
  struct cs_context *ctx = ev->ctx;
  cusafe_status st = event_fini(ev);
  free(ev);
  return cs_first(st, cs_unref(&ctx->hdr));
}

void cs_event_shutdown(struct cs_object *obj) {
  event_fini((struct cs_event *)obj);
  cs_handle_kill(obj);
}

void cs_event_describe(const struct cs_object *obj, char *what, size_t size) {
  snprintf(what, size, "device %d",
           ((const struct cs_event *)obj)->ctx->device);
}

/* ---- records and waits -------------------------------------------------------- */

CUSAFE_API cusafe_status cusafe_event_record(cusafe_event event,
                                             cusafe_stream stream) {
  CS_ENTER();
  struct cs_event *ev;
  cusafe_status st = CS_ACQUIRE(event, CS_EVENT, "event", &ev);
  if (st != CUSAFE_SUCCESS)
    return st;
  struct cs_queue *q;
  struct cs_object *held;
  st = cs_queue_get(stream, ev->ctx, "event", &q, &held);
  if (st == CUSAFE_SUCCESS) {
    int saved;
    st = cs_device_enter(ev->ctx->device, &saved);
    if (st == CUSAFE_SUCCESS) {
      st = cs_status_pending(cs_cu->event_record(ev->event, q->stream),
                             "cudaEventRecord");
      cs_device_leave(saved);
    }
    if (held)
      cs_unref(held);
  }
  cs_unref(&ev->hdr);
  return st;
}

CUSAFE_API cusafe_status cusafe_stream_wait_event(cusafe_stream stream,
                                                  cusafe_event event) {
  CS_ENTER();
  struct cs_stream *s;
  cusafe_status st = CS_ACQUIRE(stream, CS_STREAM, "stream", &s);
  if (st != CUSAFE_SUCCESS)
    return st;
  struct cs_event *ev;
  st = CS_ACQUIRE(event, CS_EVENT, "event", &ev);
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

/* ---- queries ----------------------------------------------------------------------- */

/* Runs a CUDA call on an event with its device current; `name` names the
 * CUDA function for the message. */
static cusafe_status event_call(cusafe_event event,
                                cudaError_t (*fn)(cudaEvent_t),
                                const char *name) {
  struct cs_event *ev;
  cusafe_status st = CS_ACQUIRE(event, CS_EVENT, "event", &ev);
  if (st != CUSAFE_SUCCESS)
    return st;
  int saved;
  st = cs_device_enter(ev->ctx->device, &saved);
  if (st == CUSAFE_SUCCESS) {
    st = cs_status_pending(fn(ev->event), name);
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
  CS_ENTER_OUT(ms, 0.0f);
  struct cs_event *a, *b;
  cusafe_status st = CS_ACQUIRE(start, CS_EVENT, "start", &a);
  if (st != CUSAFE_SUCCESS)
    return st;
  st = CS_ACQUIRE(end, CS_EVENT, "end", &b);
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
      st = cs_status_pending(
          cs_cu->event_elapsed_time(ms, a->event, b->event),
          "cudaEventElapsedTime");
      cs_device_leave(saved);
    }
  }
  cs_unref(&b->hdr);
out_a:
  cs_unref(&a->hdr);
  return st;
}
