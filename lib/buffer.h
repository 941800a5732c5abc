/* buffer.h -- memory: buffers, views and the chains of work on them
 * (buffer.c; invariant 2: work in flight keeps its inputs alive).
 * Internal; never installed. */
#ifndef CUSAFE_BUFFER_H
#define CUSAFE_BUFFER_H

#include "stream.h"

/* A root buffer is an allocation, whose parent is its context; a view is a
 * range of a buffer (a root or a view), its parent. */
struct cs_buffer {
  struct cs_object hdr;
  struct cs_buffer *root; /* the allocation (itself for a root buffer) */
  struct cs_context *ctx; /* the root's parent (hdr.parent) */
  char *ptr;              /* first byte of this buffer or view */
  /* Root only: work on the memory is chained across streams; `*last` is
   * the queue of the latest operation (its owner referenced).  It changes
   * under `lock` only, and is CS_QUEUE_MOVING while a change is recorded;
   * launches read it without the lock (launch.c).  It lives in the root's
   * handle slot (struct cs_buffer_slot, handle.h), or in `early_last`
   * until then. */
  _Atomic(struct cs_queue *) *last;
  cs_spinlock lock;
  cusafe_memory kind;
  size_t size;
  _Atomic(struct cs_queue *) early_last;
  /* Root only: memory of another owner (cusafe_buffer_wrap), given back
   * by release(user) (if not NULL), once, instead of freed. */
  bool wrapped;
  cusafe_release_fn release;
  void *user;
};

/* The order in which buffers' roots are locked, the same for every
 * caller: by their handles' slots, which, unlike the objects' addresses,
 * a program's runs assign alike, so that a launch or copy that locks
 * several roots makes its CUDA calls in the same order every time. */
static inline bool cs_root_before(const struct cs_buffer *a,
                                  const struct cs_buffer *b) {
  return (uint32_t)a->hdr.handle < (uint32_t)b->hdr.handle;
}

/* The value of a root's `last` while it changes. */
extern struct cs_queue cs_queue_moving;
#define CS_QUEUE_MOVING (&cs_queue_moving)

/* Chains root's next operation on queue q after its previous one (root's
 * lock held, q's device current: in a capture, the ordering between two of
 * its queues is an event made and recorded on that device).  The reference
 * that root held on the queue of its previous operation, if any, is handed
 * to the caller in *drop, to be dropped
 * (cs_unref) once the lock is released.  Fails if q is a stream whose last
 * reference went meanwhile (peeked by a pinned launch). */
cusafe_status cs_buffer_chain(struct cs_buffer *root, struct cs_queue *q,
                              struct cs_object **drop);
/* Sorts the roots[0..*n) of an operation's buffers in lock order
 * (cs_root_before), drops repeats, locks them all, and chains each one's
 * next operation on q (cs_buffer_chain) until one fails; the references
 * let go of are appended to drops[*ndrops], to be dropped once the roots
 * are unlocked (cs_roots_unlock), which the caller does in any case. */
cusafe_status cs_roots_chain(struct cs_buffer **roots, size_t *n,
                             struct cs_queue *q, struct cs_object **drops,
                             size_t *ndrops);
void cs_roots_unlock(struct cs_buffer **roots, size_t n);
/* Wraps memory of another owner in a new root buffer of ctx, whose parent
 * ctx becomes (the caller's reference, on success only): the work of
 * cusafe_buffer_wrap() (and of the DLPack imports) once ctx is held. */
cusafe_status cs_buffer_wrap_new(cusafe_buffer *out, struct cs_context *ctx,
                                 cusafe_memory kind, void *ptr, size_t size,
                                 cusafe_release_fn release, void *user);
/* Chains the next operation of each of the held buffers bufs[0..n) onto
 * q (of their context): q waits for their earlier work, and their later
 * work and frees for q's -- cusafe_stream_use_buffers() once the handles
 * are held.  Where q cannot be touched now (cs_queue_untouchable), with
 * `may_park` the buffers only follow q once it can be (parked); without,
 * it fails, touching nothing (q could not wait for their work). */
cusafe_status cs_buffers_use_on(struct cs_buffer **bufs, size_t n,
                                struct cs_queue *q, bool may_park);
/* Orders the later work on b's memory, and its free, after everything
 * queued on q so far outside any capture (cs_queue_handoff), and hands the
 * memory's chain to its context's default stream, which never captures:
 * q is not touched again.  A queue that captures gets nothing of b's: its
 * capture neither holds b nor orders anything after it.  The DLPack
 * deleters' "the consumer is done with it" (the thread neither gated nor
 * pinned). */
cusafe_status cs_buffer_follow(struct cs_buffer *b, struct cs_queue *q);
/* Follows of a device's legacy default stream, and the ends (frees,
 * give-backs) of released memory last used there, wait while CUDA forbids
 * touching it (a blocking stream of the device captures): done once it
 * can be touched, checked when a capture ends, before each follow and
 * each end (the thread neither gated nor pinned).  The shutdown does the
 * ends, as well as it can, before any object goes, and forgets the
 * follows, with the objects they hold. */
void cs_parked_drain(void);
void cs_parked_shutdown(void);
/* Keeps a new reference on each of objs[0..n) until the work queued on q
 * so far is done, where q cannot be waited for now (a wait for it parks:
 * cs_queue_wait_or_park, or cudaErrorStreamCaptureImplicit): what a
 * released graph held, a replay of it queued on q.  Drained as above;
 * forgotten by the shutdown, which frees every object. */
cusafe_status cs_park_drops(struct cs_queue *q, struct cs_object *const *objs,
                            size_t n);
/* Bumped where a stream may have become touchable without a drain: where
 * a leftover capture ended under a lock; the next follow, end or
 * synchronisation drains (cs_parked_drain_maybe: where it may do
 * something, or once every as many calls as entries wait). */
extern _Atomic unsigned long cs_parked_epoch;
void cs_parked_drain_maybe(void);
/* Settles a launch queued on q without root's lock, which found that
 * root's operations moved to another queue meanwhile: orders that queue
 * after q. */
void cs_buffer_settle(struct cs_buffer *root, struct cs_queue *q);

#endif /* CUSAFE_BUFFER_H */
