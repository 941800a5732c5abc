/* context.c -- one context per device, over its retained primary context
 * (invariant 4: never cudaDeviceReset; other libraries share it; a
 * context goes last, after every child, invariant 1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "graph.h"
#include "device.h"
#include "init.h"

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

/* Reads what launches and allocations are checked against. */
static cusafe_status read_limits(struct cs_context *ctx) {
  struct cudaDeviceProp prop;
  cudaError_t err = cs_cu->get_device_properties(&prop, ctx->device);
  if (err != cudaSuccess)
    return cs_fail_cuda(err, "cudaGetDeviceProperties");
  ctx->total_memory = prop.totalGlobalMem;
  memcpy(ctx->uuid, prop.uuid.bytes, sizeof ctx->uuid);
  ctx->managed = prop.managedMemory;
  ctx->cc_major = prop.major;
  ctx->cc_minor = prop.minor;
  ctx->warp_size = prop.warpSize > 0 ? prop.warpSize : 32;
  ctx->cluster_launch = prop.clusterLaunch;
  ctx->cooperative_launch = prop.cooperativeLaunch;
  ctx->sm_count = prop.multiProcessorCount;
  for (int i = 0; i < 3; i++) {
    ctx->max_block[i] = prop.maxThreadsDim[i];
    ctx->max_grid[i] = prop.maxGridSize[i];
  }
  ctx->shared_optin = prop.sharedMemPerBlockOptin > prop.sharedMemPerBlock
                          ? prop.sharedMemPerBlockOptin
                          : prop.sharedMemPerBlock;
  err = cs_cu->device_get_stream_priority_range(&ctx->priority_least,
                                                &ctx->priority_greatest);
  if (err != cudaSuccess)
    return cs_fail_cuda(err, "cudaDeviceGetStreamPriorityRange");
  return CUSAFE_SUCCESS;
}

/* Retains the device's primary context, reads its limits and creates the
 * default stream; undone if a step fails. */
static cusafe_status context_make(struct cs_context *ctx) {
  CUresult res = cs_primary_ctx_retain(&ctx->primary, ctx->device);
  if (res != CUDA_SUCCESS)
    return primary_failed(res, "cuDevicePrimaryCtxRetain");
  cusafe_status st = read_limits(ctx);
  if (st == CUSAFE_SUCCESS) {
    /* Non-blocking: the default stream of cusafe never waits for the
     * legacy stream 0 that other code in the process may be using. */
    cudaError_t err =
        cs_cu->stream_create(&ctx->queue.stream, cudaStreamNonBlocking, 0);
    if (err != cudaSuccess)
      st = cs_fail_cuda(err, "cudaStreamCreateWithPriority");
  }
  if (st != CUSAFE_SUCCESS)
    cs_primary_ctx_release(ctx->device);
  return st;
}

/* Creates the context of `device` (registry_lock held, device current). */
static cusafe_status context_new(struct cs_context **out, int device) {
  struct cs_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  ctx->device = device;
  ctx->queue.ctx = ctx;
  ctx->queue.owner = &ctx->hdr;
  pthread_mutex_init(&ctx->orphan_lock, NULL);
  cusafe_status st = context_make(ctx);
  if (st == CUSAFE_SUCCESS &&
      (st = cs_handle_new(&ctx->hdr, CS_CONTEXT)) != CUSAFE_SUCCESS) {
    cs_cu->stream_destroy(ctx->queue.stream);
    cs_primary_ctx_release(device);
  }
  if (st != CUSAFE_SUCCESS) {
    pthread_mutex_destroy(&ctx->orphan_lock);
    free(ctx);
    return st;
  }
  *out = ctx;
  return CUSAFE_SUCCESS;
}

CUSAFE_API cusafe_status cusafe_context_create(cusafe_context *out,
                                               int device) {
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  int count;
  cusafe_status st = cs_check_device(device, &count);
  if (st != CUSAFE_SUCCESS)
    return st;
  if (device >= MAX_DEVICES)
    return cs_fail(CUSAFE_ERROR_INVALID_DEVICE,
                   "device %d is beyond the %d devices cusafe supports", device,
                   MAX_DEVICES);

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

/* ---- children ------------------------------------------------------------ */

/* Enters the made child obj into the handle table, its slot filled. */
static cusafe_status enter(struct cs_object *obj, const struct cs_child *how) {
  if (!how->fill)
    return cs_handle_new(obj, how->type);
  union cs_slot_data *data;
  cusafe_status st = cs_handle_claim(obj, how->type, &data);
  if (st == CUSAFE_SUCCESS) {
    how->fill(obj, data);
    cs_handle_publish(obj);
  }
  return st;
}

/* Makes the child in obj (ctx acquired, arguments checked). */
static cusafe_status child_new(cusafe_handle *out, struct cs_context *ctx,
                               const struct cs_child *how, const void *args) {
  struct cs_object *obj = calloc(1, how->size);
  if (!obj)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  int saved;
  cusafe_status st = cs_device_enter(ctx->device, &saved);
  if (st == CUSAFE_SUCCESS) {
    st = how->make(obj, ctx, args);
    obj->parent = &ctx->hdr; /* the caller's reference */
    if (st == CUSAFE_SUCCESS && (st = enter(obj, how)) != CUSAFE_SUCCESS)
      if (how->unmake)
        how->unmake(obj);
    cs_device_leave(saved);
  }
  if (st != CUSAFE_SUCCESS) {
    free(obj);
    return st;
  }
  *out = obj->handle;
  return CUSAFE_SUCCESS;
}

cusafe_status cs_context_child(cusafe_handle *out, cusafe_context ctx_handle,
                               const struct cs_child *how, const void *args) {
  CS_HOLD_OR_RETURN(cs_context, ctx, ctx_handle, CS_CONTEXT, "context");
  cusafe_status st = how->check ? how->check(ctx, args) : CUSAFE_SUCCESS;
  if (st == CUSAFE_SUCCESS)
    st = child_new(out, ctx, how, args);
  if (st == CUSAFE_SUCCESS)
    ctx = NULL; /* the child's reference now */
  return st;
}

/* ---- libraries that outlive their module --------------------------------- */

/* Appends the `size` bytes at item to the array *arr of *n items
 * (orphan_lock held); without host memory the item is not kept. */
static void orphan_append(void **arr, size_t *n, size_t size,
                          const void *item) {
  char *grown = realloc(*arr, (*n + 1) * size);
  if (grown) {
    memcpy(grown + *n * size, item, size);
    *arr = grown;
    ++*n;
  }
}

void cs_context_orphan(struct cs_context *ctx, cudaLibrary_t library) {
  pthread_mutex_lock(&ctx->orphan_lock);
  orphan_append((void **)&ctx->orphans, &ctx->norphans, sizeof library,
                &library);
  pthread_mutex_unlock(&ctx->orphan_lock);
}

void cs_context_orphan_graph(struct cs_context *ctx, cudaGraph_t graph,
                             cudaGraphExec_t exec) {
  pthread_mutex_lock(&ctx->orphan_lock);
  if (graph)
    orphan_append((void **)&ctx->orphan_graphs, &ctx->norphan_graphs,
                  sizeof graph, &graph);
  if (exec)
    orphan_append((void **)&ctx->orphan_execs, &ctx->norphan_execs, sizeof exec,
                  &exec);
  pthread_mutex_unlock(&ctx->orphan_lock);
}

bool cs_context_graphs_orphaned(struct cs_context *ctx) {
  pthread_mutex_lock(&ctx->orphan_lock);
  bool any = ctx->norphan_graphs || ctx->norphan_execs;
  pthread_mutex_unlock(&ctx->orphan_lock);
  return any;
}

static void unload_orphans(struct cs_context *ctx) {
  pthread_mutex_lock(&ctx->orphan_lock);
  for (size_t i = 0; i < ctx->norphan_execs; i++)
    cs_cu->graph_exec_destroy(ctx->orphan_execs[i]);
  for (size_t i = 0; i < ctx->norphan_graphs; i++)
    cs_cu->graph_destroy(ctx->orphan_graphs[i]);
  free(ctx->orphan_execs);
  free(ctx->orphan_graphs);
  ctx->orphan_execs = NULL;
  ctx->orphan_graphs = NULL;
  ctx->norphan_execs = ctx->norphan_graphs = 0;
  for (size_t i = 0; i < ctx->norphans; i++)
    cs_cu->library_unload(ctx->orphans[i]);
  free(ctx->orphans);
  ctx->orphans = NULL;
  ctx->norphans = 0;
  pthread_mutex_unlock(&ctx->orphan_lock);
}

/* ---- teardown ------------------------------------------------------------ */

/* Releases what the context holds once its device is idle: stream-ordered
 * frees of its memory may still be queued.  Each step is attempted even if
 * an earlier one failed, so that nothing outlives the primary context. */
cusafe_status cs_context_fini(struct cs_object *obj) {
  struct cs_context *ctx = (struct cs_context *)obj;
  int saved;
  /* (No device can be synchronised while a capture runs in it.) */
  cs_context_end_leftovers(ctx);
  cusafe_status st = cs_device_idle(ctx->device, &saved);
  unload_orphans(ctx);
  cudaError_t err = cs_queue_fini(&ctx->queue, true);
  if (err != cudaSuccess && st == CUSAFE_SUCCESS)
    st = cs_fail_cuda(err, "cudaStreamDestroy");
  CUresult res = cs_primary_ctx_release(ctx->device);
  if (res != CUDA_SUCCESS && st == CUSAFE_SUCCESS)
    st = primary_failed(res, "cuDevicePrimaryCtxRelease");
  cs_peer_forget(ctx->device);
  cs_device_leave(saved);
  return st;
}

/* The last reference went: every child is gone (they hold references). */
void cs_context_free(struct cs_object *obj) {
  struct cs_context *ctx = (struct cs_context *)obj;
  pthread_mutex_lock(&registry_lock);
  if (registry[ctx->device] == ctx)
    registry[ctx->device] = NULL;
  pthread_mutex_unlock(&registry_lock);
  pthread_mutex_destroy(&ctx->orphan_lock);
  free(ctx->orphans);
  free(ctx);
}

void cs_context_settle(struct cs_object *obj) {
  struct cs_context *ctx = (struct cs_context *)obj;
  int saved;
  if (cs_device_enter_teardown(ctx->device, &saved) != CUSAFE_SUCCESS)
    return;
  /* No device can be synchronised while a capture runs in it: those of
   * cusafe's whose end failed are ended first (the open ones are ended
   * already, cs_captures_abort_all). */
  (void)cs_context_try_leftovers(ctx);
  /* A sticky error makes this fail; shutdown goes on regardless. */
  cs_cu->device_synchronize();
  cs_device_leave(saved);
}

void cs_context_describe(const struct cs_object *obj, char *what, size_t size) {
  snprintf(what, size, "device %d", ((const struct cs_context *)obj)->device);
}

cusafe_status cs_context_hand_out(struct cs_context *ctx, cusafe_context *out) {
  cusafe_status st = cs_user_ref(&ctx->hdr);
  if (st == CUSAFE_SUCCESS)
    *out = ctx->hdr.handle;
  return st;
}

/* ---- queries ------------------------------------------------------------- */

CS_QUERY(cusafe_context_get_device, int, -1, cs_context, CS_CONTEXT, "context",
         *out = o->device)

/* Waits for the device's work unless one of ctx's streams captures, or
 * nothing may touch one of them (the thread gated). */
static cusafe_status context_wait_gated(struct cs_context *ctx) {
  struct cs_capture *c = cs_capture_open_in(ctx);
  if (c == CS_CAPTURE_BUSY)
    return CS_RETRY;
  if (c)
    return cs_fail(CUSAFE_ERROR_CAPTURING,
                   "synchronizing the context of device %d cannot be done "
                   "while one of its streams captures",
                   ctx->device);
  int saved;
  cusafe_status st = cs_device_enter(ctx->device, &saved);
  if (st != CUSAFE_SUCCESS)
    return st;
  char what[64];
  snprintf(what, sizeof what, "synchronizing the context of device %d",
           ctx->device);
  /* Captures of cusafe's whose ends failed are ended first (the wait
   * fails during any capture); nor does it wait while other code
   * captures a stream that cusafe knows: the wait would break that
   * capture (cusafe_stream_synchronize of the stream is refused too). */
  if (!cs_context_try_leftovers(ctx)) {
    st = cs_fail(CUSAFE_ERROR_CAPTURING,
                 "%s cannot be done: a capture whose end failed may still run "
                 "on one of its streams",
                 what);
  } else if ((st = cs_streams_lent_check(ctx, what)) == CUSAFE_SUCCESS) {
    cudaError_t err = cs_cu->device_synchronize();
    if (err != cudaSuccess)
      st = cs_fail_cuda(err, "cudaDeviceSynchronize");
  }
  cs_device_leave(saved);
  return st;
}

CUSAFE_API cusafe_status cusafe_context_synchronize(cusafe_context h) {
  CS_ENTER();
  CS_HOLD_OR_RETURN(cs_context, ctx, h, CS_CONTEXT, "context");
  cs_parked_drain_maybe(); /* what waits for a stream, queued if it can be */
  for (;;) {
    cs_gate(cs_call_);
    cusafe_status st = context_wait_gated(ctx);
    cs_ungate(cs_call_);
    if (CS_LIKELY(st != CS_RETRY))
      return st;
    cs_capture_yield(); /* a capture begins or ends in ctx */
  }
}

CUSAFE_API cusafe_status cusafe_context_stream_priority_range(
    int *least, int *greatest, cusafe_context h) {
  CS_ENTER();
  if (!least || !greatest)
    return cs_null(least ? "greatest" : "least");
  CS_HOLD_OR_RETURN(cs_context, ctx, h, CS_CONTEXT, "context");
  *least = ctx->priority_least;
  *greatest = ctx->priority_greatest;
  return CUSAFE_SUCCESS;
}
