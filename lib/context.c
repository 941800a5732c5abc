/* context.c -- one context per device, over its retained primary context
 * (invariant 4: never cudaDeviceReset; other libraries share it). */
#include <stdlib.h>

#include "internal.h"

#define MAX_DEVICES 256

/* The live context of each device, so that a device has one context. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cs_context *registry[MAX_DEVICES];

cusafe_status cs_mismatch(const char *a, const struct cs_context *actx,
                          const char *b, const struct cs_context *bctx) {
  return cs_fail(CUSAFE_ERROR_CONTEXT_MISMATCH,
                 "%s belongs to device %d but %s belongs to device %d", a,
                 actx->device, b, bctx->device);
}

static cusafe_status primary_failed(CUresult res, const char *function) {
  return cs_fail_cuda((cudaError_t)res, function);
}

/* Creates the context of `device` (registry_lock held, device current). */
static cusafe_status context_new(struct cs_context **out, int device) {
  struct cs_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  ctx->device = device;
  pthread_mutex_init(&ctx->orphan_lock, NULL);
  cusafe_status st;
  CUresult res = cs_primary_ctx_retain(&ctx->primary, device);
  if (res != CUDA_SUCCESS) {
    st = primary_failed(res, "cuDevicePrimaryCtxRetain");
    goto fail_free;
  }
  struct cudaDeviceProp prop;
  cudaError_t err = cs_cu->get_device_properties(&prop, device);
  if (err != cudaSuccess) {
    st = cs_fail_cuda(err, "cudaGetDeviceProperties");
    goto fail_primary;
  }
  ctx->total_memory = prop.totalGlobalMem;
  ctx->managed = prop.managedMemory;
  ctx->cc_major = prop.major;
  ctx->cc_minor = prop.minor;
  ctx->warp_size = prop.warpSize > 0 ? prop.warpSize : 32;
  for (int i = 0; i < 3; i++) {
    ctx->max_block[i] = prop.maxThreadsDim[i];
    ctx->max_grid[i] = prop.maxGridSize[i];
  }
  ctx->shared_optin = prop.sharedMemPerBlockOptin > prop.sharedMemPerBlock
                          ? prop.sharedMemPerBlockOptin
                          : prop.sharedMemPerBlock;
  err = cs_cu->device_get_stream_priority_range(&ctx->priority_least,
                                                &ctx->priority_greatest);
  if (err != cudaSuccess) {
    st = cs_fail_cuda(err, "cudaDeviceGetStreamPriorityRange");
    goto fail_primary;
  }
  /* Non-blocking: the default stream of cusafe never waits for the legacy
   * stream 0 that other code in the process may be using. */
  err = cs_cu->stream_create(&ctx->queue.stream, cudaStreamNonBlocking, 0);
  if (err != cudaSuccess) {
    st = cs_fail_cuda(err, "cudaStreamCreateWithPriority");
    goto fail_primary;
  }
  ctx->queue.ctx = ctx;
  ctx->queue.owner = &ctx->hdr;
  st = cs_handle_new(&ctx->hdr, CS_CONTEXT);
  if (st != CUSAFE_SUCCESS)
    goto fail_stream;
  *out = ctx;
  return CUSAFE_SUCCESS;

fail_stream:
  cs_cu->stream_destroy(ctx->queue.stream);
fail_primary:
  cs_primary_ctx_release(device);
fail_free:
  pthread_mutex_destroy(&ctx->orphan_lock);
  free(ctx);
  return st;
}

CUSAFE_API cusafe_status cusafe_context_create(cusafe_context *out,
                                               int device) {
  if (out)
    *out = CUSAFE_NULL_HANDLE;
  CS_ENTER();
  if (!out)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  int count;
  cusafe_status st = cs_check_device(device, &count);
  if (st != CUSAFE_SUCCESS)
    return st;
  if (device >= MAX_DEVICES)
    return cs_fail(CUSAFE_ERROR_INVALID_DEVICE,
                   "device %d is beyond the %d devices cusafe supports",
                   device, MAX_DEVICES);

  pthread_mutex_lock(&registry_lock);
  struct cs_context *ctx = registry[device];
  /* A context whose last reference is going is not revived: a new one is
   * made, and the old one leaves the registry only if it is still there. */
  if (!ctx || !cs_try_user_ref(&ctx->hdr)) {
    int saved;
    st = cs_device_enter(device, &saved);
    if (st == CUSAFE_SUCCESS) {
      st = context_new(&ctx, device);
      cs_device_leave(saved);
    }
    if (st == CUSAFE_SUCCESS)
      registry[device] = ctx;
  }
  pthread_mutex_unlock(&registry_lock);
  if (st == CUSAFE_SUCCESS)
    *out = ctx->hdr.handle;
  return st;
}

/* Releases what the context holds once its device is idle: stream-ordered
 * frees of its memory may still be queued.  Each step is attempted even if
 * an earlier one failed, so that nothing outlives the primary context. */
static cusafe_status context_fini(struct cs_context *ctx) {
  int saved;
  cusafe_status st = cs_device_enter_teardown(ctx->device, &saved);
  if (st == CUSAFE_SUCCESS) {
    cudaError_t err = cs_cu->device_synchronize();
    if (err != cudaSuccess)
      st = cs_fail_cuda(err, "cudaDeviceSynchronize");
  }
  cs_context_unload_orphans(ctx);
  cs_queue_fini(&ctx->queue);
  cudaError_t err = cs_cu->stream_destroy(ctx->queue.stream);
  if (err != cudaSuccess && st == CUSAFE_SUCCESS)
    st = cs_fail_cuda(err, "cudaStreamDestroy");
  CUresult res = cs_primary_ctx_release(ctx->device);
  if (res != CUDA_SUCCESS && st == CUSAFE_SUCCESS)
    st = primary_failed(res, "cuDevicePrimaryCtxRelease");
  cs_device_leave(saved);
  return st;
}

/* The last reference went: every child is gone (they hold references). */
cusafe_status cs_context_destroy(struct cs_context *ctx) {
  pthread_mutex_lock(&registry_lock);
  if (registry[ctx->device] == ctx)
    registry[ctx->device] = NULL;
  pthread_mutex_unlock(&registry_lock);

  cusafe_status st = context_fini(ctx);
  pthread_mutex_destroy(&ctx->orphan_lock);
  free(ctx->orphans);
  free(ctx);
  return st;
}

void cs_context_shutdown_sync(struct cs_object *obj, void *arg) {
  (void)arg;
  struct cs_context *ctx = (struct cs_context *)obj;
  int saved;
  if (cs_device_enter_teardown(ctx->device, &saved) != CUSAFE_SUCCESS)
    return;
  /* A sticky error makes this fail; shutdown goes on regardless. */
  cs_cu->device_synchronize();
  cs_device_leave(saved);
}

void cs_context_shutdown(struct cs_object *obj, void *arg) {
  (void)arg;
  context_fini((struct cs_context *)obj);
  cs_handle_kill(obj);
}

/* Acquires a context handle for a call. */
static cusafe_status context_get(cusafe_context h, struct cs_context **out) {
  return cs_acquire(h, CS_CONTEXT, "context", (struct cs_object **)out);
}

CUSAFE_API cusafe_status cusafe_context_get_device(int *out,
                                                   cusafe_context h) {
  CS_ENTER();
  if (!out)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  struct cs_context *ctx;
  cusafe_status st = context_get(h, &ctx);
  if (st != CUSAFE_SUCCESS)
    return st;
  *out = ctx->device;
  cs_unref(&ctx->hdr);
  return CUSAFE_SUCCESS;
}

CUSAFE_API cusafe_status cusafe_context_synchronize(cusafe_context h) {
  CS_ENTER();
  struct cs_context *ctx;
  cusafe_status st = context_get(h, &ctx);
  if (st != CUSAFE_SUCCESS)
    return st;
  int saved;
  st = cs_device_enter(ctx->device, &saved);
  if (st == CUSAFE_SUCCESS) {
    cudaError_t err = cs_cu->device_synchronize();
    if (err != cudaSuccess)
      st = cs_fail_cuda(err, "cudaDeviceSynchronize");
    cs_device_leave(saved);
  }
  cs_unref(&ctx->hdr);
  return st;
}

CUSAFE_API cusafe_status cusafe_context_stream_priority_range(
    int *least, int *greatest, cusafe_context h) {
  CS_ENTER();
  if (!least)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "least is NULL");
  if (!greatest)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "greatest is NULL");
  struct cs_context *ctx;
  cusafe_status st = context_get(h, &ctx);
  if (st != CUSAFE_SUCCESS)
    return st;
  *least = ctx->priority_least;
  *greatest = ctx->priority_greatest;
  cs_unref(&ctx->hdr);
  return CUSAFE_SUCCESS;
}
