/* kernel.h -- kernels: a module's functions, with their parameter layout
 * and limits read once at lookup, so that a launch (launch.c) only
 * compares (kernel.c).  Internal; never installed. */
#ifndef CUSAFE_KERNEL_H
#define CUSAFE_KERNEL_H

#include <pthread.h>

#include "handle.h"
#include "signature.h"

#define CS_INLINE_PARAMS 16

struct cs_kernel {
  struct cs_object hdr;
  /* What a launch reads, in the first two cache lines (the object is
   * allocated 64-byte aligned): the context, the function, the context's
   * default stream, the kernel's and the device's limits and, for up to
   * CS_INLINE_PARAMS parameters, the kinds of argument each accepts. */
  struct cs_context *ctx;
  cudaKernel_t fn;
  cudaStream_t default_stream; /* ctx's own, which outlives the kernel */
  uint32_t nparams;
  int max_threads; /* per block, for this kernel */
  int max_block[3], max_grid[3];
  uint32_t shared_limit; /* dynamic shared memory per block, at most */
  /* The dynamic shared memory the kernel is currently allowed (raised on
   * demand by launches). */
  _Atomic uint32_t dynamic_limit;
  /* Per parameter, the fixed-size kinds of argument it accepts: bit k
   * for cusafe_arg_kind k (cs_kernel_kinds).  Those of its size, narrowed
   * by its type where the kernel's signature is known.  Atomic words: a
   * declaration (cusafe_kernel_declare) may rewrite them while other
   * threads launch; relaxed loads and stores are plain moves. */
  union {
    _Atomic uint16_t inline_[CS_INLINE_PARAMS]; /* nparams <= 16 */
    _Atomic uint16_t *heap;                     /* more: malloc'd */
  } param_kinds;
  uint16_t *param_size; /* each parameter's bytes (1 to 65 535) */
  /* The parameters' types and C spellings, NULL where unknown: read from
   * the mangled name or declared.  Immutable; a declaration publishes a
   * new one (under sig_lock) and the old ones stay, chained, until the
   * kernel goes, so that a racing launch may still read them. */
  _Atomic(struct cs_signature *) sig;
  pthread_mutex_t sig_lock;
  struct cs_module *module; /* referenced */
  char *name;
  size_t static_shared;
  pthread_mutex_t limit_lock;
  /* Attributed launches (launch.c): whether the kernel was opted into
   * non-portable cluster sizes on its device (set once, under limit_lock),
   * and the occupancy last asked of CUDA, by the shape it was asked for.
   * Each cache is written under limit_lock and read without a lock: seq
   * is odd while it is written, and a reader that sees seq change, or
   * odd, asks CUDA again.  threads 0 (no launch has it) marks it empty. */
  _Atomic bool nonportable_cluster;
  struct cs_occupancy {
    _Atomic uint32_t seq;
    _Atomic uint32_t threads, cluster[3];
    _Atomic uint64_t shared;
    _Atomic int value;
  } blocks_per_sm, active_clusters;
};
_Static_assert(offsetof(struct cs_kernel, param_size) == 128,
               "a launch reads two cache lines of a kernel");

/* The size an argument of `kind` passes, or 0 for bytes (which say their
 * size) and unknown kinds.  The sizes of kinds 1 to 11 are the nibbles of
 * one constant: no table to load. */
#define CS_KIND_SIZES                                                          \
  ((uint64_t)8 << 4 * CUSAFE_ARG_BUFFER | (uint64_t)1 << 4 * CUSAFE_ARG_I8 |   \
   (uint64_t)1 << 4 * CUSAFE_ARG_U8 | (uint64_t)2 << 4 * CUSAFE_ARG_I16 |      \
   (uint64_t)2 << 4 * CUSAFE_ARG_U16 | (uint64_t)4 << 4 * CUSAFE_ARG_I32 |     \
   (uint64_t)4 << 4 * CUSAFE_ARG_U32 | (uint64_t)8 << 4 * CUSAFE_ARG_I64 |     \
   (uint64_t)8 << 4 * CUSAFE_ARG_U64 | (uint64_t)4 << 4 * CUSAFE_ARG_F32 |     \
   (uint64_t)8 << 4 * CUSAFE_ARG_F64)
_Static_assert(sizeof(void *) == 8, "buffers pass 8-byte addresses");
_Static_assert(CUSAFE_ARG_F64 < 16 && CUSAFE_ARG_BYTES < 16,
               "kinds fit the nibbles of CS_KIND_SIZES and 16-bit masks");
static inline size_t cs_kind_size(unsigned kind) {
  return kind < 16 ? (CS_KIND_SIZES >> 4 * kind) & 0xF : 0;
}

/* The kinds of argument that each parameter of k accepts. */
static inline _Atomic uint16_t *cs_kernel_kinds(struct cs_kernel *k) {
  return k->nparams <= CS_INLINE_PARAMS ? k->param_kinds.inline_
                                        : k->param_kinds.heap;
}

/* Whether c fits k's and its device's limits: no dimension 0 or above
 * its limit (d - 1 wraps for 0), no more threads per block than the kernel
 * allows, no more shared memory than the device has.  Branch-free, over
 * the kernel's second cache line; cs_kernel_check_config() says what is
 * wrong. */
static inline bool cs_kernel_fits(const struct cs_kernel *k,
                                  const cusafe_launch_config *c) {
  bool bad = false;
  for (int d = 0; d < 3; d++)
    bad |= (c->grid[d] - 1u >= (uint32_t)k->max_grid[d]) |
           (c->block[d] - 1u >= (uint32_t)k->max_block[d]);
  uint64_t threads =
      (uint64_t)c->block[0] * c->block[1] * (uint64_t)c->block[2];
  bad |= (threads > (uint64_t)k->max_threads) |
         (c->shared_memory > k->shared_limit);
  return !bad;
}
/* CUSAFE_SUCCESS if c fits k, else why not. */
cusafe_status cs_kernel_check_config(const struct cs_kernel *k,
                                     const cusafe_launch_config *c)
    __attribute__((cold));

/* Raises k's dynamic shared memory limit to `bytes` (at most
 * shared_limit). */
cusafe_status cs_kernel_raise_shared(struct cs_kernel *k, size_t bytes);
/* Allows the kernel `bytes` of dynamic shared memory (checked against
 * shared_limit), raising its limit if needed. */
static inline cusafe_status cs_kernel_allow_shared(struct cs_kernel *k,
                                                   size_t bytes) {
  if (CS_LIKELY(bytes <=
                atomic_load_explicit(&k->dynamic_limit, memory_order_relaxed)))
    return CUSAFE_SUCCESS;
  return cs_kernel_raise_shared(k, bytes);
}

#endif /* CUSAFE_KERNEL_H */
