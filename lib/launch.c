/* launch.c -- the launch path: cusafe_kernel_launch, the hot path of the
 * library.
 *
 * Arguments are checked against the parameter layout read at lookup
 * (kernel.c), the configuration against the kernel's and the device's
 * limits, so that a wrong launch is an error with a sentence, not a
 * corrupt kernel.  Buffers are chained onto the launch's stream like any
 * other operation on them (buffer.c), which keeps them alive until the
 * kernel has completed (invariant 2).  The kernel, the stream and the
 * buffers are used without references, on a pinned thread: lib/README.md,
 * "Pins: launches without references", says why that is safe. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "context.h"
#include "device.h"
#include "graph.h"
#include "init.h"
#include "kernel.h"

/* Arguments held on the stack; more go to the heap. */
#define STACK_ARGS 32

static inline size_t arg_size(const cusafe_arg *a) {
  return a->kind == CUSAFE_ARG_BYTES ? a->size : cs_kind_size(a->kind);
}

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
/* Stores a scalar argument's value, in its own width, in *slot. */
static void *scalar_value(const cusafe_arg *a, uint64_t *slot) {
  union {
    int8_t i8;
    uint8_t u8;
    int16_t i16;
    uint16_t u16;
    int32_t i32;
    uint32_t u32;
    float f32;
    uint64_t all;
  } v = {.all = 0};
  switch (a->kind) {
  case CUSAFE_ARG_I8: v.i8 = (int8_t)a->value.i; break;
  case CUSAFE_ARG_U8: v.u8 = (uint8_t)a->value.u; break;
  case CUSAFE_ARG_I16: v.i16 = (int16_t)a->value.i; break;
  case CUSAFE_ARG_U16: v.u16 = (uint16_t)a->value.u; break;
  case CUSAFE_ARG_I32: v.i32 = (int32_t)a->value.i; break;
  case CUSAFE_ARG_U32: v.u32 = (uint32_t)a->value.u; break;
  case CUSAFE_ARG_F32: v.f32 = a->value.f32; break;
  default: memcpy(&v.all, &a->value, 8); break; /* 64-bit kinds */
  }
  *slot = v.all;
  return slot;
}
#endif

/* The buffers of one launch: their roots, locked in order, and
 * where each root's latest queue is (lasts[i] is roots[i]'s until
 * cs_roots_chain() sorts the roots). */
struct launch_buffers {
  struct cs_buffer **roots;
  _Atomic(struct cs_queue *) **lasts;
  struct cs_object **drops; /* references to drop after the launch */
  size_t nroots, ndrops;
};

/* What an argument of kind `a` is, in words: "a 64-bit integer". */
static const char *kind_words(const cusafe_arg *a, char *buf, size_t n) {
  static const char *const words[] = {
      [CUSAFE_ARG_BUFFER] = "a buffer",
      [CUSAFE_ARG_I8] = "an 8-bit integer",
      [CUSAFE_ARG_U8] = "an unsigned 8-bit integer",
      [CUSAFE_ARG_I16] = "a 16-bit integer",
      [CUSAFE_ARG_U16] = "an unsigned 16-bit integer",
      [CUSAFE_ARG_I32] = "a 32-bit integer",
      [CUSAFE_ARG_U32] = "an unsigned 32-bit integer",
      [CUSAFE_ARG_I64] = "a 64-bit integer",
      [CUSAFE_ARG_U64] = "an unsigned 64-bit integer",
      [CUSAFE_ARG_F32] = "a float",
      [CUSAFE_ARG_F64] = "a double"};
  if (a->kind < sizeof words / sizeof words[0] && words[a->kind])
    return words[a->kind];
  snprintf(buf, n, "%u byte%s", a->size, a->size == 1 ? "" : "s");
  return buf;
}

/* Why argument i, whose kind parameter i does not accept as it is, is
 * wrong; or, for a bytes argument of the right size where the parameter
 * takes bytes (its type is a struct, or unknown), its address in *arg. */
__attribute__((cold, noinline)) static cusafe_status
arg_unusual(struct cs_kernel *k, const cusafe_arg *a, size_t i, void **arg) {
  size_t size = arg_size(a), param_size = k->param_size[i];
  if (size == 0 && a->kind != CUSAFE_ARG_BYTES)
    return cs_fail(CUSAFE_ERROR_INVALID_ARGUMENTS,
                   "argument %zu has unknown kind %u", i, a->kind);
  /* As many types as parameters, whichever signature is seen. */
  const struct cs_signature *sig =
      atomic_load_explicit(&k->sig, memory_order_acquire);
  const struct cs_param_type *t = sig ? &sig->params[i] : NULL;
  char buf[32];
  if (size == param_size && a->kind == CUSAFE_ARG_BYTES &&
      (!t || t->cls == CS_TYPE_OTHER)) {
    if (!a->value.bytes)
      return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "argument %zu has no bytes",
                     i);
    *arg = (void *)a->value.bytes;
    return CUSAFE_SUCCESS;
  }
  if (t) {
    char bytes[32] = "";
    if (t->cls == CS_TYPE_OTHER)
      snprintf(bytes, sizeof bytes, " (%zu bytes)", param_size);
    return cs_fail(CUSAFE_ERROR_INVALID_ARGUMENTS,
                   "argument %zu of kernel %s is %s, parameter %zu is %.*s%s",
                   i, sig->text, kind_words(a, buf, sizeof buf), i, (int)t->len,
                   sig->text + t->off, bytes);
  }
  if (size != param_size)
    return cs_fail(CUSAFE_ERROR_INVALID_ARGUMENTS,
                   "argument %zu of kernel %s is %zu bytes, parameter %zu "
                   "is %zu bytes",
                   i, k->name, size, i, param_size);
  /* A kind of the right size that the parameter's type refuses, whose
   * types this thread has not seen yet (a declaration races the launch). */
  return cs_fail(CUSAFE_ERROR_INVALID_ARGUMENTS,
                 "argument %zu of kernel %s is %s, which parameter %zu does "
                 "not take",
                 i, k->name, kind_words(a, buf, sizeof buf), i);
}

/* Resolves every argument to the pointer cudaLaunchKernel wants (the
 * thread pinned: buffers are peeked at). */
static cusafe_status resolve_args(struct cs_kernel *k,
                                  const struct cs_context *ctx,
                                  const cusafe_arg *args, size_t nargs,
                                  void **argv, uint64_t *values,
                                  struct launch_buffers *lb) {
  _Atomic uint16_t *kinds = cs_kernel_kinds(k);
  for (size_t i = 0; i < nargs; i++) {
    const cusafe_arg *a = &args[i];
    unsigned kind = a->kind;
    /* One bit test: a fixed-size kind that the parameter takes (a
     * relaxed load: a plain one). */
    if (CS_UNLIKELY(
            kind >= 16 ||
            !((atomic_load_explicit(&kinds[i], memory_order_relaxed) >> kind) &
              1))) {
      cusafe_status st = arg_unusual(k, a, i, &argv[i]);
      if (st != CUSAFE_SUCCESS)
        return st;
    } else if (kind == CUSAFE_ARG_BUFFER) {
      const struct cs_buffer_slot *b;
      cusafe_status st = cs_peek_buffer(a->value.buffer, (long)i, &b);
      if (st != CUSAFE_SUCCESS)
        return st;
      if (CS_UNLIKELY(b->ctx != ctx))
        return cs_fail(CUSAFE_ERROR_CONTEXT_MISMATCH,
                       "argument %zu belongs to device %d but kernel belongs "
                       "to device %d",
                       i, b->ctx->device, ctx->device);
      lb->roots[lb->nroots] = b->root;
      lb->lasts[lb->nroots++] = b->last;
      memcpy(&values[i], &b->ptr, sizeof b->ptr);
      argv[i] = &values[i];
    } else {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
      /* The value's own width sits at the start of the union already. */
      argv[i] = (void *)&a->value;
#else
      argv[i] = scalar_value(a, &values[i]);
#endif
    }
  }
  return CUSAFE_SUCCESS;
}

/* Whether every buffer's latest operation is on q already, as in a loop
 * of launches on one stream: then the launch takes no lock. */
static bool all_on(const struct launch_buffers *lb, const struct cs_queue *q) {
  for (size_t i = 0; i < lb->nroots; i++)
    if (atomic_load_explicit(lb->lasts[i], memory_order_acquire) != q)
      return false;
  return true;
}

/* ---- attributes (cusafe_kernel_launch_ex) ------------------------------ */

/* The most blocks of a cluster: portable everywhere, and with the kernel
 * opted into non-portable sizes (16 on compute capability 9.0 and 10.x,
 * the most of any device). */
#define CLUSTER_PORTABLE 8
#define CLUSTER_NONPORTABLE 16

/* The attributes of a launch, checked and resolved to CUDA's.  Plain
 * launches pass none (NULL), and their path folds every use away. */
struct launch_ext {
  const cusafe_launch_attr *in;
  size_t nin;
  cudaLaunchAttribute attrs[CUSAFE_LAUNCH_ATTR_PRIORITY];
  unsigned nattrs;
  int given[CUSAFE_LAUNCH_ATTR_PRIORITY + 1]; /* index + 1, 0: not given */
  uint32_t cluster[3];
  uint64_t cluster_blocks; /* 0: no cluster */
  bool nonportable, cooperative;
};

static const char *const attr_names[] = {NULL,
                                         "CLUSTER",
                                         "NON_PORTABLE_CLUSTER",
                                         "COOPERATIVE",
                                         "PROGRAMMATIC_SERIALIZATION",
                                         "PRIORITY"};

/* Checks the attributes one by one (ids, reserved words, duplicates,
 * flags) and resolves them to CUDA's, before anything else is looked at
 * but the kernel and its configuration. */
__attribute__((noinline)) static cusafe_status
ext_parse(struct launch_ext *x, const struct cs_kernel *k,
          const cusafe_launch_config *c) {
  const struct cs_context *ctx = k->ctx;
  if (!x->in)
    return cs_null("attrs");
  memset(x->given, 0, sizeof x->given);
  x->nattrs = 0;
  x->cluster_blocks = 0;
  x->nonportable = x->cooperative = false;
  for (size_t i = 0; i < x->nin; i++) {
    const cusafe_launch_attr *a = &x->in[i];
    if (a->id < CUSAFE_LAUNCH_ATTR_CLUSTER ||
        a->id > CUSAFE_LAUNCH_ATTR_PRIORITY)
      return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                     "launch attribute %zu has unknown id %u", i, a->id);
    const char *name = attr_names[a->id];
    if (a->reserved != 0)
      return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                     "launch attribute %zu (%s) has reserved %u; it must be 0",
                     i, name, a->reserved);
    if (x->given[a->id])
      return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                     "launch attribute %zu (%s) repeats launch attribute %d", i,
                     name, x->given[a->id] - 1);
    x->given[a->id] = (int)i + 1;
    if (a->id != CUSAFE_LAUNCH_ATTR_CLUSTER &&
        a->id != CUSAFE_LAUNCH_ATTR_PRIORITY && a->value.flag != 0 &&
        a->value.flag != 1)
      return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                     "launch attribute %zu (%s) has flag %d; 0 or 1", i, name,
                     (int)a->value.flag);
    cudaLaunchAttribute *out = &x->attrs[x->nattrs];
    memset(out, 0, sizeof *out);
    switch (a->id) {
    case CUSAFE_LAUNCH_ATTR_CLUSTER:
      for (int d = 0; d < 3; d++) {
        if (a->value.dim[d] == 0)
          return cs_fail(CUSAFE_ERROR_INVALID_CONFIGURATION,
                         "cluster dimension %c is 0", "xyz"[d]);
        x->cluster[d] = a->value.dim[d];
      }
      x->cluster_blocks =
          (uint64_t)x->cluster[0] * x->cluster[1] * (uint64_t)x->cluster[2];
      out->id = cudaLaunchAttributeClusterDimension;
      out->val.clusterDim.x = x->cluster[0];
      out->val.clusterDim.y = x->cluster[1];
      out->val.clusterDim.z = x->cluster[2];
      x->nattrs++;
      break;
    case CUSAFE_LAUNCH_ATTR_NON_PORTABLE_CLUSTER:
      x->nonportable = a->value.flag == 1; /* a kernel attribute, not CUDA's */
      break;
    case CUSAFE_LAUNCH_ATTR_COOPERATIVE:
      x->cooperative = a->value.flag == 1;
      out->id = cudaLaunchAttributeCooperative;
      out->val.cooperative = a->value.flag;
      x->nattrs++;
      break;
    case CUSAFE_LAUNCH_ATTR_PROGRAMMATIC_SERIALIZATION:
      if (a->value.flag == 1 && ctx->cc_major < 9)
        return cs_fail(CUSAFE_ERROR_NOT_SUPPORTED,
                       "programmatic serialization needs compute capability "
                       "9.0; device %d has %d.%d",
                       ctx->device, ctx->cc_major, ctx->cc_minor);
      out->id = cudaLaunchAttributeProgrammaticStreamSerialization;
      out->val.programmaticStreamSerializationAllowed = a->value.flag;
      x->nattrs++;
      break;
    case CUSAFE_LAUNCH_ATTR_PRIORITY:
      /* Greatest is the numerically lowest (-5 for 0). */
      if (a->value.priority > ctx->priority_least ||
          a->value.priority < ctx->priority_greatest)
        return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                       "launch attribute %zu (PRIORITY) of %d is outside the "
                       "device's stream priority range %d (least) to %d "
                       "(greatest)",
                       i, (int)a->value.priority, ctx->priority_least,
                       ctx->priority_greatest);
      out->id = cudaLaunchAttributePriority;
      out->val.priority = a->value.priority;
      x->nattrs++;
      break;
    }
  }
  if (x->given[CUSAFE_LAUNCH_ATTR_NON_PORTABLE_CLUSTER] && !x->cluster_blocks)
    return cs_fail(CUSAFE_ERROR_INVALID_CONFIGURATION,
                   "NON_PORTABLE_CLUSTER without a CLUSTER attribute");
  if (x->cluster_blocks) {
    if (!ctx->cluster_launch)
      return cs_fail(CUSAFE_ERROR_NOT_SUPPORTED,
                     "device %d does not support thread block clusters "
                     "(cudaDevAttrClusterLaunch is 0)",
                     ctx->device);
    for (int d = 0; d < 3; d++)
      if (c->grid[d] % x->cluster[d])
        return cs_fail(CUSAFE_ERROR_INVALID_CONFIGURATION,
                       "grid dimension %c of %u is not a multiple of cluster "
                       "dimension %c of %u",
                       "xyz"[d], c -> grid[d], "xyz"[d], x -> cluster[d]);
    unsigned limit = x->nonportable ? CLUSTER_NONPORTABLE : CLUSTER_PORTABLE;
    if (x->cluster_blocks > limit)
      return cs_fail(CUSAFE_ERROR_INVALID_CONFIGURATION,
                     x->nonportable
                         ? "a cluster of %llu blocks exceeds the limit of %u"
                         : "a cluster of %llu blocks exceeds the portable "
                           "limit of %u (NON_PORTABLE_CLUSTER allows 16)",
                     (unsigned long long)x->cluster_blocks, limit);
  }
  if (x->cooperative && !ctx->cooperative_launch)
    return cs_fail(CUSAFE_ERROR_NOT_SUPPORTED,
                   "device %d does not support cooperative launches "
                   "(cudaDevAttrCooperativeLaunch is 0)",
                   ctx->device);
  return CUSAFE_SUCCESS;
}

#define RELAXED memory_order_relaxed

/* The occupancy `o` holds for this shape, if it holds one: read without a
 * lock, against o's sequence count (kernel.h). */
static bool occupancy_cached(const struct cs_occupancy *o, uint32_t threads,
                             const uint32_t cluster[3], size_t shared,
                             int *value) {
  uint32_t seq = atomic_load_explicit(&o->seq, memory_order_acquire);
  bool hit = !(seq & 1) &&
             atomic_load_explicit(&o->threads, RELAXED) == threads &&
             atomic_load_explicit(&o->shared, RELAXED) == shared;
  for (int d = 0; d < 3; d++)
    hit &= atomic_load_explicit(&o->cluster[d], RELAXED) == cluster[d];
  int v = atomic_load_explicit(&o->value, RELAXED);
  atomic_thread_fence(memory_order_acquire);
  if (!hit || atomic_load_explicit(&o->seq, RELAXED) != seq)
    return false;
  *value = v;
  return true;
}

/* Writes o, under k's limit_lock; threads 0 empties it. */
static void occupancy_write(struct cs_occupancy *o, uint32_t threads,
                            const uint32_t cluster[3], size_t shared,
                            int value) {
  uint32_t seq = atomic_load_explicit(&o->seq, RELAXED);
  atomic_store_explicit(&o->seq, seq + 1, RELAXED);
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&o->threads, threads, RELAXED);
  for (int d = 0; d < 3; d++)
    atomic_store_explicit(&o->cluster[d], cluster[d], RELAXED);
  atomic_store_explicit(&o->shared, shared, RELAXED);
  atomic_store_explicit(&o->value, value, RELAXED);
  atomic_store_explicit(&o->seq, seq + 2, memory_order_release);
}

static void occupancy_store(struct cs_kernel *k, struct cs_occupancy *o,
                            uint32_t threads, const uint32_t cluster[3],
                            size_t shared, int value) {
  pthread_mutex_lock(&k->limit_lock);
  occupancy_write(o, threads, cluster, shared, value);
  pthread_mutex_unlock(&k->limit_lock);
}

/* The checks that ask CUDA (the kernel's device current): the opt-in to
 * non-portable clusters, whether a cluster fits at all, and how many
 * blocks of a cooperative grid can be resident at once.  Nothing is
 * queued. */
__attribute__((noinline)) static cusafe_status
ext_prepare(const struct launch_ext *x, struct cs_kernel *k,
            const cusafe_launch_config *c, cudaStream_t stream) {
  const struct cs_context *ctx = k->ctx;
  uint32_t threads = c->block[0] * c->block[1] * c->block[2]; /* <= 1024 */
  uint64_t blocks = (uint64_t)c->grid[0] * c->grid[1] * (uint64_t)c->grid[2];
  static const uint32_t no_cluster[3] = {0, 0, 0};
  if (x->nonportable &&
      !atomic_load_explicit(&k->nonportable_cluster, memory_order_acquire)) {
    cusafe_status st = CUSAFE_SUCCESS;
    pthread_mutex_lock(&k->limit_lock);
    if (!atomic_load_explicit(&k->nonportable_cluster, RELAXED)) {
      cudaError_t err = cs_cu->kernel_set_attribute_for_device(
          k->fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1,
          ctx->device);
      if (err == cudaSuccess) {
        /* Larger clusters may fit now: the cache is emptied before the
         * opt-in shows. */
        occupancy_write(&k->active_clusters, 0, no_cluster, 0, 0);
        atomic_store_explicit(&k->nonportable_cluster, true,
                              memory_order_release);
      } else {
        st = cs_fail_cuda(err, "cudaKernelSetAttributeForDevice");
      }
    }
    pthread_mutex_unlock(&k->limit_lock);
    if (st != CUSAFE_SUCCESS)
      return st;
  }
  int clusters = 0;
  if (x->cluster_blocks &&
      !occupancy_cached(&k->active_clusters, threads, x->cluster,
                        c->shared_memory, &clusters)) {
    cudaLaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = x->cluster[0];
    attr.val.clusterDim.y = x->cluster[1];
    attr.val.clusterDim.z = x->cluster[2];
    cudaLaunchConfig_t cfg = {{c->grid[0], c->grid[1], c->grid[2]},
                              {c->block[0], c->block[1], c->block[2]},
                              c->shared_memory,
                              stream,
                              &attr,
                              1};
    cudaError_t err = cs_cu->occupancy_max_active_clusters(
        &clusters, (const void *)k->fn, &cfg);
    if (err != cudaSuccess)
      return cs_fail_cuda(err, "cudaOccupancyMaxActiveClusters");
    occupancy_store(k, &k->active_clusters, threads, x->cluster,
                    c->shared_memory, clusters);
  }
  if (x->cluster_blocks && clusters <= 0)
    return cs_fail(CUSAFE_ERROR_INVALID_CONFIGURATION,
                   "kernel %s cannot run with clusters of %llu blocks of %u "
                   "threads: no cluster fits an SM group "
                   "(cudaOccupancyMaxActiveClusters is 0)",
                   k->name, (unsigned long long)x->cluster_blocks, threads);
  if (!x->cooperative)
    return CUSAFE_SUCCESS;
  if (x->cluster_blocks) {
    /* A cooperative grid of clusters: its clusters must all be resident. */
    uint64_t most = (uint64_t)clusters * x->cluster_blocks;
    if (blocks > most)
      return cs_fail(CUSAFE_ERROR_INVALID_CONFIGURATION,
                     "a cooperative grid of %llu blocks exceeds the %llu that "
                     "can be co-resident (%d clusters of %llu blocks)",
                     (unsigned long long)blocks, (unsigned long long)most,
                     clusters, (unsigned long long)x->cluster_blocks);
    return CUSAFE_SUCCESS;
  }
  int per_sm = 0;
  if (!occupancy_cached(&k->blocks_per_sm, threads, no_cluster,
                        c->shared_memory, &per_sm)) {
    cudaError_t err = cs_cu->occupancy_max_active_blocks(
        &per_sm, (const void *)k->fn, (int)threads, c->shared_memory);
    if (err != cudaSuccess)
      return cs_fail_cuda(err, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    occupancy_store(k, &k->blocks_per_sm, threads, no_cluster, c->shared_memory,
                    per_sm);
  }
  uint64_t most = (uint64_t)(per_sm > 0 ? per_sm : 0) * (uint64_t)ctx->sm_count;
  if (blocks > most)
    return cs_fail(CUSAFE_ERROR_INVALID_CONFIGURATION,
                   "a cooperative grid of %llu blocks exceeds the %llu that "
                   "can be co-resident (%d per SM x %d SMs)",
                   (unsigned long long)blocks, (unsigned long long)most, per_sm,
                   ctx->sm_count);
  return CUSAFE_SUCCESS;
}

/* The kernel is queued through the driver's own launch calls where the
 * driver has them: the runtime's cudaLaunchKernel adds its own work around
 * the same call (about 0.2 us per launch on an H100's host), and the
 * context is the stream's either way (a CUkernel launches in its stream's
 * context, or on a default stream in the thread's current one).  Any
 * failure is the runtime's to report: the same launch is made through it,
 * which either succeeds (the driver's call queued nothing) or fails with
 * the runtime's own error -- a thread with no current context on a
 * default stream among them, which the runtime binds first. */

/* CUDA's two attribute types are one layout, of the same numbers. */
_Static_assert(sizeof(cudaLaunchAttribute) == sizeof(CUlaunchAttribute) &&
                   offsetof(cudaLaunchAttribute, val) ==
                       offsetof(CUlaunchAttribute, value),
               "cudaLaunchAttribute is CUlaunchAttribute");
_Static_assert(
    (int)cudaLaunchAttributeClusterDimension ==
            (int)CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION &&
        (int)cudaLaunchAttributeCooperative ==
            (int)CU_LAUNCH_ATTRIBUTE_COOPERATIVE &&
        (int)cudaLaunchAttributeProgrammaticStreamSerialization ==
            (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION &&
        (int)cudaLaunchAttributePriority == (int)CU_LAUNCH_ATTRIBUTE_PRIORITY,
    "the attributes' ids are the driver's");
_Static_assert(offsetof(cudaLaunchAttributeValue, clusterDim) ==
                       offsetof(CUlaunchAttributeValue, clusterDim) &&
                   offsetof(cudaLaunchAttributeValue, cooperative) ==
                       offsetof(CUlaunchAttributeValue, cooperative) &&
                   offsetof(cudaLaunchAttributeValue,
                            programmaticStreamSerializationAllowed) ==
                       offsetof(CUlaunchAttributeValue,
                                programmaticStreamSerializationAllowed) &&
                   offsetof(cudaLaunchAttributeValue, priority) ==
                       offsetof(CUlaunchAttributeValue, priority),
               "the attributes' values are the driver's");

/* Queues the kernel with its attributes: cuLaunchKernelEx, or
 * cudaLaunchKernelExC. */
__attribute__((noinline)) static cusafe_status
queue_kernel_ex(const struct cs_kernel *k, const cusafe_launch_config *c,
                void **argv, cudaStream_t stream, const struct launch_ext *x) {
  cs_drv_launch_ex_fn drv =
      atomic_load_explicit(&cs_drv_launch_ex, memory_order_relaxed);
  if (CS_UNLIKELY(!drv))
    drv = cs_drv_launch_ex_again(); /* its look-up may have failed */
  if (CS_LIKELY(drv != NULL)) {
    CUlaunchConfig dc = {c->grid[0],
                         c->grid[1],
                         c->grid[2],
                         c->block[0],
                         c->block[1],
                         c->block[2],
                         (unsigned)c->shared_memory, /* <= the kernel's limit */
                         (CUstream)stream,
                         (CUlaunchAttribute *)x->attrs,
                         x->nattrs};
    if (drv(&dc, (CUfunction)k->fn, argv, NULL) == CUDA_SUCCESS)
      return CUSAFE_SUCCESS;
  }
  cudaLaunchConfig_t cfg = {{c->grid[0], c->grid[1], c->grid[2]},
                            {c->block[0], c->block[1], c->block[2]},
                            c->shared_memory,
                            stream,
                            (cudaLaunchAttribute *)x->attrs,
                            x->nattrs};
  cudaError_t err = cs_cu->launch_kernel_ex(&cfg, (const void *)k->fn, argv);
  return err == cudaSuccess ? CUSAFE_SUCCESS
                            : cs_fail_cuda(err, "cudaLaunchKernelExC");
}

static inline cusafe_status drv_launch(cs_drv_launch_fn drv,
                                       const struct cs_kernel *k,
                                       const cusafe_launch_config *c,
                                       void **argv, cudaStream_t stream) {
  return drv((CUfunction)k->fn, c->grid[0], c->grid[1], c->grid[2], c->block[0],
             c->block[1], c->block[2],
             (unsigned)c->shared_memory, /* <= the kernel's limit */
             (CUstream)stream, argv, NULL) == CUDA_SUCCESS
             ? CUSAFE_SUCCESS
             : CS_SLOW;
}

/* The launch where the driver's call refused it (`tried`) or is missing:
 * the driver's looked up again if its look-up failed, else
 * cudaLaunchKernel. */
__attribute__((noinline)) static cusafe_status
queue_kernel_runtime(const struct cs_kernel *k, const cusafe_launch_config *c,
                     void **argv, cudaStream_t stream, bool tried) {
  cs_drv_launch_fn drv;
  if (!tried && (drv = cs_drv_launch_again()) != NULL &&
      drv_launch(drv, k, c, argv, stream) == CUSAFE_SUCCESS)
    return CUSAFE_SUCCESS;
  dim3 grid = {c->grid[0], c->grid[1], c->grid[2]};
  dim3 block = {c->block[0], c->block[1], c->block[2]};
  cudaError_t err = cs_cu->launch_kernel((const void *)k->fn, grid, block, argv,
                                         c->shared_memory, stream);
  return err == cudaSuccess ? CUSAFE_SUCCESS
                            : cs_fail_cuda(err, "cudaLaunchKernel");
}

/* ---- the launch ------------------------------------------------------------
 */

/* Queues the kernel: the one launch call of every path (x: the
 * attributes, NULL for a plain launch). */
static inline __attribute__((always_inline)) cusafe_status
queue_kernel(const struct cs_kernel *k, const cusafe_launch_config *c,
             void **argv, cudaStream_t stream, const struct launch_ext *x) {
  if (x)
    return queue_kernel_ex(k, c, argv, stream, x);
  cs_drv_launch_fn drv =
      atomic_load_explicit(&cs_drv_launch, memory_order_relaxed);
  if (CS_LIKELY(drv != NULL) &&
      CS_LIKELY(drv_launch(drv, k, c, argv, stream) == CUSAFE_SUCCESS))
    return CUSAFE_SUCCESS;
  return queue_kernel_runtime(k, c, argv, stream, drv != NULL);
}

/* A launch whose buffers' latest work is on other streams: the buffers
 * locked, their work chained to q, then the kernel queued.  Out of line,
 * so that the common path stays short. */
__attribute__((noinline)) static cusafe_status
launch_locked(struct cs_kernel *k, struct cs_queue *q, cudaStream_t stream,
              const cusafe_launch_config *c, void **argv,
              struct launch_buffers *lb, const struct launch_ext *x) {
  cusafe_status st =
      cs_roots_chain(lb->roots, &lb->nroots, q, lb->drops, &lb->ndrops);
  if (st == CUSAFE_SUCCESS)
    st = queue_kernel(k, c, argv, stream, x);
  cs_roots_unlock(lb->roots, lb->nroots);
  return st;
}

static inline __attribute__((always_inline)) cusafe_status
launch(struct cs_kernel *k, struct cs_queue *q, cudaStream_t stream,
       const cusafe_launch_config *c, void **argv, struct launch_buffers *lb,
       const struct launch_ext *x) {
  struct cs_context *ctx = k->ctx;
  cusafe_status st = cs_kernel_allow_shared(k, c->shared_memory);
  if (st != CUSAFE_SUCCESS)
    return st;
  int saved;
  st = cs_device_enter(ctx->device, &saved);
  if (st != CUSAFE_SUCCESS)
    return st;
  struct cs_capture *cap = cs_queue_capture(q);
  if (x && (st = ext_prepare(x, k, c, stream)) != CUSAFE_SUCCESS) {
    /* refused, or a query failed: nothing queued */
  } else if (CS_UNLIKELY(cap)) {
    /* A captured launch: the capture holds the kernel and the buffers.
     * While a capture begins or ends on q, the launch is tried again. */
    st = cap == CS_CAPTURE_BUSY ? CS_RETRY : cs_capture_hold(cap, &k->hdr);
    if (st == CUSAFE_SUCCESS)
      st = launch_locked(k, q, stream, c, argv, lb, x);
  } else if (CS_UNLIKELY(cs_queue_has_leftover(q)) &&
             (st = cs_queue_leftover(q)) != CUSAFE_SUCCESS) {
    /* a kernel captured into nothing would never run: nothing queued */
  } else if (cs_queue_default_forbidden(q)) {
    st = cs_untouchable_refuse("a launch", q);
  } else if (CS_UNLIKELY(!all_on(lb, q))) {
    st = launch_locked(k, q, stream, c, argv, lb, x);
  } else {
    st = queue_kernel(k, c, argv, stream, x);
    if (st == CUSAFE_SUCCESS && lb->nroots) {
      /* A buffer moved to another stream meanwhile is settled:
       * lib/README.md, "Buffers' chains of work". */
      atomic_thread_fence(memory_order_seq_cst);
      for (size_t i = 0; i < lb->nroots; i++)
        if (CS_UNLIKELY(
                atomic_load_explicit(lb->lasts[i], memory_order_relaxed) != q))
          cs_buffer_settle(lb->roots[i], q);
    }
  }
  cs_device_leave(saved);
  return st;
}

/* Room for the arguments of one launch: on the stack, or for many
 * arguments on the heap. */
struct launch_space {
  void **argv; /* what every launch reads first, then the arrays */
  uint64_t *values;
  struct launch_buffers lb;
  void *argv_stack[STACK_ARGS];
  uint64_t values_stack[STACK_ARGS];
  struct cs_buffer *roots_stack[STACK_ARGS];
  _Atomic(struct cs_queue *) *lasts_stack[STACK_ARGS];
  struct cs_object *drops_stack[STACK_ARGS];
};

static bool space_make(struct launch_space *sp, size_t nargs) {
  if (nargs <= STACK_ARGS)
    return true;
  sp->argv = malloc(nargs * sizeof *sp->argv);
  sp->values = malloc(nargs * sizeof *sp->values);
  sp->lb.roots = malloc(nargs * sizeof *sp->lb.roots);
  sp->lb.lasts = malloc(nargs * sizeof *sp->lb.lasts);
  sp->lb.drops = malloc(nargs * sizeof *sp->lb.drops);
  return sp->argv && sp->values && sp->lb.roots && sp->lb.lasts && sp->lb.drops;
}

static void space_free(struct launch_space *sp) {
  if (sp->argv == sp->argv_stack)
    return;
  free(sp->argv);
  free(sp->values);
  free(sp->lb.roots);
  free(sp->lb.lasts);
  free(sp->lb.drops);
}

/* The launch proper, on a pinned thread: the kernel, the stream and the
 * buffers are peeked at, not referenced (calls.h, pins). */
static inline __attribute__((always_inline)) cusafe_status
launch_pinned(cusafe_kernel kernel, const cusafe_launch_config *config,
              const cusafe_arg *args, size_t nargs, struct launch_space *sp,
              struct launch_ext *x) {
  struct cs_kernel *k;
  cusafe_status st =
      cs_peek(kernel, CS_KERNEL, "kernel", -1, (struct cs_object **)&k);
  if (st != CUSAFE_SUCCESS)
    return st;
  struct cs_context *ctx = k->ctx;
  if (!config)
    return cs_null("config");
  if (!args && nargs)
    return cs_null("args");
  if (nargs != k->nparams)
    return cs_fail(CUSAFE_ERROR_INVALID_ARGUMENTS,
                   "kernel %s takes %zu arguments, %zu given", k->name,
                   (size_t)k->nparams, nargs);
  if (CS_UNLIKELY(!cs_kernel_fits(k, config)))
    return cs_kernel_check_config(k, config);
  if (x && (st = ext_parse(x, k, config)) != CUSAFE_SUCCESS)
    return st;
  /* The context's own stream needs no look-up, nor any line of the
   * context: the kernel keeps a copy of its cudaStream_t. */
  struct cs_queue *q = &ctx->queue;
  cudaStream_t stream = k->default_stream;
  if (config->stream != CUSAFE_STREAM_DEFAULT) {
    struct cs_object *s;
    st = cs_peek(config->stream, CS_STREAM, "stream", -1, &s);
    if (st != CUSAFE_SUCCESS)
      return st;
    q = &((struct cs_stream *)s)->queue;
    if (q->ctx != ctx)
      return cs_mismatch("stream", q->ctx, "kernel", ctx);
    stream = q->stream;
  }
  if (!space_make(sp, nargs))
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  st = resolve_args(k, ctx, args, nargs, sp->argv, sp->values, &sp->lb);
  if (st != CUSAFE_SUCCESS)
    return st;
  return launch(k, q, stream, config, sp->argv, &sp->lb, x);
}

/* A public launch call: the pinned launch, tried again while a capture
 * begins or ends on its stream. */
static inline __attribute__((always_inline)) cusafe_status
launch_call(struct cs_thread *call, cusafe_kernel kernel,
            const cusafe_launch_config *config, const cusafe_arg *args,
            size_t nargs, struct launch_ext *x) {
  struct launch_space sp;
  for (;;) {
    sp.argv = sp.argv_stack;
    sp.values = sp.values_stack;
    sp.lb = (struct launch_buffers){sp.roots_stack, sp.lasts_stack,
                                    sp.drops_stack, 0, 0};
    cs_pin(call);
    cusafe_status st = launch_pinned(kernel, config, args, nargs, &sp, x);
    cs_unpin(call);
    /* What the buffers' chains let go of, dropped unpinned. */
    for (size_t i = 0; i < sp.lb.ndrops; i++)
      cs_unref(sp.lb.drops[i]);
    space_free(&sp);
    if (CS_LIKELY(st != CS_RETRY))
      return st;
    cs_capture_yield(); /* a capture begins or ends on the stream */
  }
}

CUSAFE_API CS_HOT cusafe_status
cusafe_kernel_launch(cusafe_kernel kernel, const cusafe_launch_config *config,
                     const cusafe_arg *args, size_t nargs) {
  CS_ENTER();
  return launch_call(cs_call_, kernel, config, args, nargs, NULL);
}

/* The same launch path, with the attributes checked and resolved to
 * CUDA's on the way (launch_ext); without attributes, a plain launch. */
CUSAFE_API cusafe_status cusafe_kernel_launch_ex(
    cusafe_kernel kernel, const cusafe_launch_config *config,
    const cusafe_launch_attr *attrs, size_t nattrs, const cusafe_arg *args,
    size_t nargs) {
  CS_ENTER();
  if (nattrs == 0)
    return launch_call(cs_call_, kernel, config, args, nargs, NULL);
  struct launch_ext x;
  x.in = attrs;
  x.nin = nattrs;
  return launch_call(cs_call_, kernel, config, args, nargs, &x);
}
