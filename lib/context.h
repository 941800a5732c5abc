/* context.h -- contexts: one per device, over its retained primary context
 * (context.c; invariant 4).  Internal; never installed. */
#ifndef CUSAFE_CONTEXT_H
#define CUSAFE_CONTEXT_H

#include <pthread.h>

#include "stream.h"

struct cs_context {
  struct cs_object hdr;
  int device;
  CUcontext primary;
  struct cs_queue queue; /* the default stream */
  size_t total_memory;
  int managed;
  int priority_least, priority_greatest;
  /* Limits that launches are checked against. */
  int cc_major, cc_minor;
  int warp_size;
  int max_block[3], max_grid[3];
  size_t shared_optin; /* dynamic + static shared memory per block */
  /* What attributed launches are checked against (launch.c): the
   * device's support of clusters and cooperative launches, and its
   * multiprocessors. */
  int cluster_launch, cooperative_launch, sm_count;
  /* The device's identity across processes (cudaDeviceProp::uuid), which
   * shared memory names (ipc.c). */
  unsigned char uuid[16];
  /* Libraries whose unload failed, retried before the primary context is
   * released (under orphan_lock). */
  pthread_mutex_t orphan_lock;
  cudaLibrary_t *orphans;
  size_t norphans;
  /* Graphs and executable graphs whose destruction failed, retried
   * before the libraries (under orphan_lock). */
  cudaGraph_t *orphan_graphs;
  size_t norphan_graphs;
  cudaGraphExec_t *orphan_execs;
  size_t norphan_execs;
};

/* "stream belongs to device 1 but buffer belongs to device 0" */
cusafe_status cs_mismatch(const char *a, const struct cs_context *actx,
                          const char *b, const struct cs_context *bctx)
    __attribute__((cold));

/* Hands the caller a new reference on ctx (cs_user_ref): *out is its
 * handle. */
cusafe_status cs_context_hand_out(struct cs_context *ctx, cusafe_context *out);

/* How cs_context_child() makes one kind of child of a context. */
struct cs_child {
  enum cs_type type;
  size_t size; /* of its structure, allocated zeroed */
  /* Checks the caller's arguments against the context, before anything
   * is made; NULL: nothing to check. */
  cusafe_status (*check)(const struct cs_context *ctx, const void *args);
  /* Creates the child's CUDA object, with the context's device current. */
  cusafe_status (*make)(struct cs_object *obj, struct cs_context *ctx,
                        const void *args);
  /* Destroys what make() created (the handle could not be entered);
   * NULL: nothing to destroy. */
  void (*unmake)(struct cs_object *obj);
  /* Sets what the hot paths read of the child in its handle slot, before
   * the handle is published (handle.h); NULL: nothing. */
  void (*fill)(struct cs_object *obj, union cs_slot_data *data);
};
/* The one path that creates a child of the context `ctx`: acquires it,
 * checks, allocates, makes, and enters the child, whose parent the context
 * becomes; *out is the new handle, holding one reference. */
cusafe_status cs_context_child(cusafe_handle *out, cusafe_context ctx,
                               const struct cs_child *how, const void *args);

/* Keeps a library of ctx that cannot be unloaded yet (launches may still
 * be queued, or its unload failed): it is unloaded before the context's
 * primary context is released, so that no code outlives its context. */
void cs_context_orphan(struct cs_context *ctx, cudaLibrary_t library);

/* Keeps a graph or an executable graph of ctx (either may be NULL) whose
 * destruction failed: it is destroyed again before the libraries of the
 * context are unloaded. */
void cs_context_orphan_graph(struct cs_context *ctx, cudaGraph_t graph,
                             cudaGraphExec_t exec);
/* Whether ctx keeps such graphs: its libraries must wait for them. */
bool cs_context_graphs_orphaned(struct cs_context *ctx);

/* The first step of the ordered shutdown: ends the captures of cusafe's
 * left over in ctx, then synchronises its device. */
void cs_context_settle(struct cs_object *obj);

#endif /* CUSAFE_CONTEXT_H */
