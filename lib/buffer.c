/* buffer.c -- device, pinned and managed memory, views, copies.
 *
 * Work in flight keeps its inputs alive (invariant 2) without host callbacks
 * or an event per operation: every operation on an allocation is chained
 * after the previous one, also across streams, and the allocation remembers
 * the stream of its latest operation.  Its memory is freed on that stream
 * (stream-ordered), so the free runs after everything queued before it.
 * Work on the same stream as the last costs one pointer comparison; moving
 * to another stream costs an event record and a stream wait. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "context.h"
#include "device.h"
#include "graph.h"
#include "init.h"

static const char *const kind_alloc_fn[] = {"cudaMallocAsync", "cudaMallocHost",
                                            "cudaMallocManaged"};

static const char *const kind_names[] = {"device", "pinned host", "managed"};

/* Checks that [offset, offset + size) lies within `limit` bytes. */
static cusafe_status check_range(const char *what, const char *which,
                                 size_t offset, size_t size, size_t limit) {
  if (CS_LIKELY(offset <= limit && size <= limit - offset))
    return CUSAFE_SUCCESS;
  return cs_fail(CUSAFE_ERROR_OUT_OF_RANGE,
                 "%s of %zu bytes at offset %zu exceeds %s%sbuffer of %zu "
                 "bytes",
                 what, size, offset, which ? which : "", which ? " " : "",
                 limit);
}

/* Whether root must hold a reference on q's owner: the stream must outlive
 * the free queued on it, but the root's own context it holds already. */
static bool holds_owner(const struct cs_buffer *root,
                        const struct cs_queue *q) {
  return q->owner != &root->ctx->hdr;
}

struct cs_queue cs_queue_moving;

cusafe_status cs_buffer_chain(struct cs_buffer *root, struct cs_queue *q,
                              struct cs_object **drop) {
  *drop = NULL;
  /* Captured work runs only when its graph is replayed: the capture holds
   * the buffer, and the chain waits for the replay (graph.c). */
  struct cs_capture *c = cs_queue_capture(q);
  if (CS_UNLIKELY(c))
    return c == CS_CAPTURE_BUSY ? CS_RETRY : cs_capture_use(c, root, q);
  /* Work captured into nothing would never run (cs_queue_leftover). */
  if (CS_UNLIKELY(cs_queue_has_leftover(q))) {
    cusafe_status st = cs_queue_leftover(q);
    if (st != CUSAFE_SUCCESS)
      return st;
  }
  if (cs_queue_default_forbidden(q))
    return cs_untouchable_refuse("queueing work", q);
  struct cs_queue *last =
      atomic_load_explicit(root->last, memory_order_relaxed);
  if (CS_LIKELY(last == q))
    return CUSAFE_SUCCESS;
  /* A launch may only have peeked at q's stream: its last reference may
   * have gone since, and then the stream is as good as released. */
  if (holds_owner(root, q) && !cs_try_ref(q->owner))
    return cs_fail(CUSAFE_ERROR_INVALID_HANDLE,
                   "stream 0x%016llx is stale: its object was released",
                   (unsigned long long)q->owner->handle);
  if (last) {
    /* The move shows before the hand-off is recorded: lib/README.md,
     * "Buffers' chains of work". */
    atomic_store(root->last, CS_QUEUE_MOVING);
    cusafe_status st = cs_queue_handoff(last, q);
    if (st != CUSAFE_SUCCESS) {
      atomic_store_explicit(root->last, last, memory_order_release);
      if (holds_owner(root, q))
        *drop = q->owner;
      return st;
    }
  }
  atomic_store_explicit(root->last, q, memory_order_release);
  if (last && holds_owner(root, last))
    *drop = last->owner;
  return CUSAFE_SUCCESS;
}

/* ---- what waits while a stream cannot be touched ------------------------ */

/* While a blocking stream of a device captures (cusafe's capture or
 * another library's), CUDA refuses any use of the device's legacy default
 * stream and invalidates that capture (cudaErrorStreamCaptureImplicit):
 * no record, wait or synchronisation there; and nothing outside a capture
 * that other code began on a stream of its own can be ordered after that
 * stream (cs_queue_untouchable).  What must follow such a stream then --
 * a follow (a DLPack deleter, cusafe_stream_use_buffers(), which the
 * Python package's finalizers call, whenever they run) or the end of
 * released memory last used there (its free or give-back) -- waits here,
 * holding what it needs, and is done once the stream can be touched
 * again: when a capture of cusafe's ends, and before each later follow or
 * end.  The memory lives meanwhile -- freed later, never earlier. */
struct memory_end;
struct parked {
  struct cs_buffer *b; /* referenced; NULL for an end */
  struct cs_queue *q;  /* its owner (a stream or context) referenced */
  /* Or the end of a released root's memory, whose latest work was queued
   * there: its context referenced. */
  struct memory_end *end;
  /* Or references to drop once q's work is done: what a released graph
   * held, its replay queued on q (objs referenced, NULL otherwise). */
  struct cs_object **objs;
  size_t nobjs;
  struct parked *next;
};
static pthread_mutex_t parked_lock = PTHREAD_MUTEX_INITIALIZER;
static struct parked *parked_head;
static _Atomic int parked_any;
/* Calls of cs_parked_drain() not yet served: one drain runs at a time, and
 * goes again while more came meanwhile (a capture ended, a park). */
static _Atomic unsigned drain_calls;
/* The entries parked, and the chances a drain let pass since the last
 * (cs_parked_drain_maybe). */
static _Atomic size_t parked_count, parked_skips;
_Atomic unsigned long cs_parked_epoch;
static _Atomic unsigned long parked_epoch_seen;

/* Before a follow or an end: the drain, where it may do something --
 * something that ends a capture of cusafe's bumped cs_parked_epoch since
 * the last one -- or once every as many chances as entries wait (a
 * capture of other code's ends unseen): each entry is looked at about
 * once per operation, not once per entry per operation. */
void cs_parked_drain_maybe(void) {
  if (CS_LIKELY(!atomic_load_explicit(&parked_any, memory_order_relaxed)))
    return;
  unsigned long epoch = atomic_load(&cs_parked_epoch);
  if (epoch == atomic_load(&parked_epoch_seen) &&
      atomic_fetch_add(&parked_skips, 1) + 1 < atomic_load(&parked_count))
    return;
  atomic_store(&parked_skips, 0);
  atomic_store(&parked_epoch_seen, epoch);
  cs_parked_drain();
}

static cusafe_status follow_or_wait(struct cs_buffer *b, struct cs_queue *q);
static cudaError_t wait_or_device(struct cs_queue *q, bool *park);
static cusafe_status device_fallback_gated(struct cs_context *ctx,
                                           bool may_park, cudaError_t *err);
static cusafe_status memory_end_run(const struct memory_end *m, bool may_park);
static void memory_end_free(struct parked *p);

static void parked_push(struct parked *first, struct parked *last, size_t n) {
  atomic_fetch_add(&parked_count, n);
  pthread_mutex_lock(&parked_lock);
  last->next = parked_head;
  parked_head = first;
  atomic_store(&parked_any, 1);
  pthread_mutex_unlock(&parked_lock);
}

/* Parks p, waiting on q's stream, and makes sure that it is seen: if the
 * stream can be touched already (the capture that forbade it ended since
 * the operation looked), by a drain now; if not, by the drain that the
 * end of that capture starts, which comes after this push. */
static void park(struct parked *p, struct cs_queue *q) {
  parked_push(p, p, 1);
  if (!cs_queue_untouchable(q))
    cs_parked_drain();
}

/* Parks the follow of b after q: the caller's references on neither are
 * taken. */
static cusafe_status park_follow(struct cs_buffer *b, struct cs_queue *q) {
  struct parked *p = malloc(sizeof *p);
  if (!p)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  cs_ref(&b->hdr);
  cs_ref(q->owner);
  *p = (struct parked){.b = b, .q = q};
  park(p, q);
  return CUSAFE_SUCCESS;
}

/* park_follow() for a thread that only peeked at b and q (pinned): their
 * references are tried, and the entry is pushed without a drain (a drain
 * may drop references, which no pinned thread does; a later call's drain
 * does it).  False, nothing parked, where q's owner is going already or
 * there is no memory; where only b is going, an entry that drops q's
 * owner after q's work is parked instead, and false. */
static bool park_follow_pinned(struct cs_buffer *b, struct cs_queue *q) {
  struct parked *p = malloc(sizeof *p);
  struct cs_object **none = malloc(sizeof *none);
  if (!p || !none || !cs_try_ref(q->owner)) {
    free(p);
    free(none);
    return false;
  }
  bool held = cs_try_ref(&b->hdr);
  if (held) {
    free(none);
    *p = (struct parked){.b = b, .q = q};
  } else {
    *p = (struct parked){.q = q, .objs = none, .nobjs = 0};
  }
  parked_push(p, p, 1);
  atomic_fetch_add(&cs_parked_epoch, 1);
  return held;
}

cusafe_status cs_park_drops(struct cs_queue *q, struct cs_object *const *objs,
                            size_t n) {
  struct parked *p = malloc(sizeof *p);
  struct cs_object **copy = malloc((n ? n : 1) * sizeof *copy);
  if (!p || !copy) {
    free(p);
    free(copy);
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  }
  for (size_t i = 0; i < n; i++)
    cs_ref(copy[i] = objs[i]);
  cs_ref(q->owner);
  *p = (struct parked){.q = q, .objs = copy, .nobjs = n};
  park(p, q);
  return CUSAFE_SUCCESS;
}

/* Does one parked entry, if its stream can be touched now: true if done
 * (and freed). */
static bool parked_do(struct parked *p) {
  struct cs_queue *q = p->q;
  if (p->objs) {
    /* In relaxed capture mode, as every teardown's wait (handle.c). */
    enum cudaStreamCaptureMode mode;
    bool relaxed = cs_relax(&mode);
    bool park = false;
    cudaError_t err = cs_queue_wait_or_park(q, &park);
    cs_unrelax(relaxed, mode);
    if (cs_queue_wait_parks(park, err))
      return false;
    /* (Another failure: the replay cannot be waited for, ever.) */
    for (size_t i = 0; i < p->nobjs; i++)
      cs_unref(p->objs[i]);
    cs_unref(q->owner);
    free(p->objs);
    free(p);
    return true;
  }
  if (p->end) {
    if (memory_end_run(p->end, true) == CS_PARK)
      return false;
    memory_end_free(p);
    return true;
  }
  /* A failure past this point leaves only the thread's message: the
   * memory's free still comes after the stream's work it could see. */
  if (follow_or_wait(p->b, q) == CS_PARK)
    return false;
  cs_unref(p->q->owner);
  cs_unref(&p->b->hdr);
  free(p);
  return true;
}

void cs_parked_drain(void) {
  /* (Not in the ordered shutdown, which does the ends first and forgets
   * the follows, nor in a forked child.) */
  if (!atomic_load(&parked_any) || atomic_load(&cs_hot.state) != CS_RUNNING)
    return;
  unsigned seen = atomic_fetch_add(&drain_calls, 1);
  if (seen) /* a drain runs: it goes again */
    return;
  seen = 1;
  /* What fails here leaves the caller's message alone: a parked entry's
   * failure is no failure of the call that drains. */
  struct cs_saved_error saved;
  cs_error_save(&saved);
  for (;;) {
    pthread_mutex_lock(&parked_lock);
    struct parked *all = parked_head;
    parked_head = NULL;
    atomic_store(&parked_any, 0);
    pthread_mutex_unlock(&parked_lock);
    struct parked *keep = NULL, *last = NULL;
    size_t kept = 0, taken = 0;
    while (all) {
      struct parked *p = all;
      all = p->next;
      taken++;
      if (!parked_do(p)) {
        p->next = keep;
        keep = p;
        kept++;
        if (!last)
          last = p;
      }
    }
    atomic_fetch_sub(&parked_count, taken);
    if (keep)
      parked_push(keep, last, kept);
    /* Calls that came meanwhile (a capture that ended, a park) are served
     * by one more round. */
    unsigned now = seen;
    if (atomic_compare_exchange_strong(&drain_calls, &now, 0))
      break;
    seen = now;
  }
  cs_error_restore(&saved);
}

void cs_parked_shutdown(void) {
  pthread_mutex_lock(&parked_lock);
  struct parked *all = parked_head;
  parked_head = NULL;
  atomic_store(&parked_any, 0);
  atomic_store(&parked_count, 0);
  pthread_mutex_unlock(&parked_lock);
  while (all) {
    struct parked *p = all;
    all = p->next;
    if (p->end) { /* ordered as well as it can be, as every release */
      (void)memory_end_run(p->end, false);
      free(p->end);
    }
    free(p->objs);
    free(p);
  }
}

/* cs_buffer_follow() once gated, root's lock held: CS_PARK where q cannot
 * be touched. */
static cusafe_status follow_locked(struct cs_buffer *root, struct cs_queue *q,
                                   struct cs_queue *to,
                                   struct cs_object **drop) {
  struct cs_capture *tc = cs_queue_capture(to);
  if (CS_UNLIKELY(tc))
    return tc == CS_CAPTURE_BUSY ? CS_RETRY
                                 : cs_capturing("ordering a buffer's free", to);
  /* Looked at under the gate: a capture of cusafe's that begins after
   * this look waits for the follow's CUDA calls. */
  if (CS_UNLIKELY(q->borrowed) && cs_queue_untouchable(q))
    return CS_PARK;
  /* Where root's latest work is on q, the chain's own hand-off from q
   * is the one needed. */
  struct cs_queue *last =
      atomic_load_explicit(root->last, memory_order_relaxed);
  cusafe_status st = cs_buffer_chain(root, to, drop);
  if (st == CUSAFE_SUCCESS && q != to && last != q)
    st = cs_queue_handoff(q, to);
  return st;
}

/* The follow (CS_PARK if q cannot be touched now). */
static cusafe_status follow_now(struct cs_buffer *b, struct cs_queue *q) {
  struct cs_buffer *root = b->root;
  struct cs_thread *self = cs_thread_self();
  for (;;) {
    struct cs_object *drop = NULL;
    cs_gate(self);
    cs_spin_lock(&root->lock);
    cusafe_status st = follow_locked(root, q, &root->ctx->queue, &drop);
    cs_spin_unlock(&root->lock);
    cs_ungate(self);
    if (drop)
      cs_unref(drop);
    if (st != CS_RETRY)
      return st;
    cs_capture_yield(); /* a capture begins or ends on q */
  }
}

/* The follow, or where it cannot be queued (a record or wait that CUDA
 * refuses), the host's wait for q's work instead: nothing later on b's
 * memory, its free included, may come before that work.  The failure is
 * returned all the same.  CS_PARK where q cannot be touched now. */
static cusafe_status follow_or_wait(struct cs_buffer *b, struct cs_queue *q) {
  cusafe_status st = follow_now(b, q);
  if (st == CUSAFE_SUCCESS || st == CS_PARK)
    return st;
  bool park = false;
  (void)wait_or_device(q, &park);
  return park ? CS_PARK : st;
}

cusafe_status cs_buffer_follow(struct cs_buffer *b, struct cs_queue *q) {
  cs_parked_drain_maybe();
  cusafe_status st = follow_or_wait(b, q);
  return st == CS_PARK ? park_follow(b, q) : st;
}

/* An operation has few buffers: an insertion sort beats qsort's calls
 * through a comparator. */
cusafe_status cs_roots_chain(struct cs_buffer **roots, size_t *n,
                             struct cs_queue *q, struct cs_object **drops,
                             size_t *ndrops) {
  for (size_t i = 1; i < *n; i++) {
    struct cs_buffer *r = roots[i];
    size_t j = i;
    for (; j > 0 && cs_root_before(r, roots[j - 1]); j--)
      roots[j] = roots[j - 1];
    roots[j] = r;
  }
  size_t unique = *n ? 1 : 0;
  for (size_t i = 1; i < *n; i++)
    if (roots[i] != roots[unique - 1])
      roots[unique++] = roots[i];
  *n = unique;
  for (size_t i = 0; i < unique; i++)
    cs_spin_lock(&roots[i]->lock);
  cusafe_status st = CUSAFE_SUCCESS;
  for (size_t i = 0; i < unique && st == CUSAFE_SUCCESS; i++) {
    struct cs_object *drop;
    st = cs_buffer_chain(roots[i], q, &drop);
    if (drop)
      drops[(*ndrops)++] = drop;
  }
  return st;
}

void cs_roots_unlock(struct cs_buffer **roots, size_t n) {
  for (size_t i = n; i-- > 0;)
    cs_spin_unlock(&roots[i]->lock);
}

void cs_buffer_settle(struct cs_buffer *root, struct cs_queue *q) {
  cs_spin_lock(&root->lock);
  struct cs_queue *now = atomic_load_explicit(root->last, memory_order_relaxed);
  /* If the hand-off fails, the kernel must end before anything later --
   * unless other code captures q now (a synchronisation would break that
   * capture): then the buffer follows q once q can be touched, so that
   * at least its memory outlives the kernel (parked; synchronised where
   * that cannot be done). */
  if (now != q && cs_queue_handoff(q, now) != CUSAFE_SUCCESS &&
      !(CS_UNLIKELY(q->borrowed) && cs_queue_untouchable(q) &&
        park_follow_pinned(root, q)))
    cs_cu->stream_synchronize(q->stream);
  cs_spin_unlock(&root->lock);
}

/* A buffer object, zeroed.  Launches read its slot, not the object.  Not
 * malloc() and memset(), which compilers merge into calloc(): glibc's
 * calloc() bypasses the thread's cache of freed blocks, and costs an
 * allocation and release a third more. */
static struct cs_buffer *buffer_new(void) {
  struct cs_buffer *b = malloc(sizeof *b);
  if (b) {
    *b = (struct cs_buffer){.lock = CS_SPINLOCK_INIT};
    b->last = &b->early_last;
  }
  return b;
}

static void buffer_free(struct cs_buffer *b) { free(b); }

/* Makes b a root buffer: memory of its own, ctx its parent. */
static void root_init(struct cs_buffer *b, struct cs_context *ctx, void *ptr,
                      size_t size, cusafe_memory kind) {
  b->root = b;
  b->hdr.parent = &ctx->hdr;
  b->ctx = ctx;
  b->ptr = ptr;
  b->size = size;
  b->kind = kind;
}

/* Enters b into the handle table with what launches read of it in its
 * slot; a root's `last` moves there. */
static cusafe_status buffer_enter(struct cs_buffer *b) {
  union cs_slot_data *data;
  cusafe_status st = cs_handle_claim(&b->hdr, CS_BUFFER, &data);
  if (st != CUSAFE_SUCCESS)
    return st;
  struct cs_buffer_slot *bs = &data->buffer;
  bs->ptr = b->ptr;
  bs->ctx = b->ctx;
  bs->root = b->root;
  if (b->root == b) { /* the chain's latest queue moves into the slot */
    atomic_init(&bs->own_last,
                atomic_load_explicit(b->last, memory_order_relaxed));
    b->last = &bs->own_last;
  } else {
    atomic_init(&bs->own_last, NULL);
    b->last = b->root->last;
  }
  bs->last = b->last;
  cs_handle_publish(&b->hdr);
  return CUSAFE_SUCCESS;
}

/* ---- allocation ---------------------------------------------------------- */

/* Allocates size bytes of `kind` memory (ctx's device current). */
static cusafe_status memory_alloc(void **ptr, cusafe_memory kind, size_t size,
                                  struct cs_queue *q) {
  cudaError_t err;
  switch (kind) {
  case CUSAFE_MEMORY_DEVICE:
    err = cs_cu->malloc_async(ptr, size, q->stream);
    break;
  case CUSAFE_MEMORY_HOST_PINNED: err = cs_cu->malloc_host(ptr, size); break;
  default: err = cs_cu->malloc_managed(ptr, size, cudaMemAttachGlobal); break;
  }
  return err == cudaSuccess ? CUSAFE_SUCCESS
                            : cs_fail_cuda(err, kind_alloc_fn[kind]);
}

/* Frees memory that no work has used yet (its device current): device
 * memory on q, which does not capture. */
static void memory_free_now(void *ptr, cusafe_memory kind, struct cs_queue *q) {
  if (!ptr)
    return;
  if (kind == CUSAFE_MEMORY_HOST_PINNED) {
    cs_cu->free_host(ptr);
  } else if (kind != CUSAFE_MEMORY_DEVICE ||
             cs_cu->free_async(ptr, q->stream) != cudaSuccess) {
    /* A free that cannot be queued, after the device's work -- unless
     * that wait would break other code's capture of a stream that cusafe
     * knows (cudaFree waits for the allocation itself). */
    if (!cs_streams_lent_busy(q->ctx))
      cs_cu->device_synchronize();
    cs_cu->free(ptr);
  }
}

/* Allocates a root buffer in ctx; `q` orders device memory.  On success the
 * caller's reference on ctx passes to the buffer, and so does its reference
 * on q's owner if `owner_given` (a stream acquired for the call). */
static cusafe_status buffer_alloc(cusafe_buffer *out, struct cs_context *ctx,
                                  cusafe_memory kind, size_t size,
                                  struct cs_queue *q, bool owner_given) {
  if (kind != CUSAFE_MEMORY_DEVICE && kind != CUSAFE_MEMORY_HOST_PINNED &&
      kind != CUSAFE_MEMORY_MANAGED)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "unknown memory kind %d",
                   (int)kind);
  if (kind != CUSAFE_MEMORY_HOST_PINNED && size > ctx->total_memory)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY,
                   "allocation of %zu bytes exceeds the %zu bytes of device %d",
                   size, ctx->total_memory, ctx->device);
  if (kind == CUSAFE_MEMORY_MANAGED && !ctx->managed)
    return cs_fail(CUSAFE_ERROR_NOT_SUPPORTED,
                   "device %d does not support managed memory", ctx->device);
  struct cs_buffer *b = buffer_new();
  if (!b)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");

  int saved = -1;
  void *ptr = NULL; /* none for 0 bytes: no CUDA call at all */
  cusafe_status st = CUSAFE_SUCCESS;
  if (size) {
    st = cs_device_enter(ctx->device, &saved);
    if (st == CUSAFE_SUCCESS) {
      st = memory_alloc(&ptr, kind, size, q);
      if (st != CUSAFE_SUCCESS)
        cs_device_leave(saved);
    }
  }
  if (st != CUSAFE_SUCCESS) {
    buffer_free(b);
    return st;
  }
  root_init(b, ctx, ptr, size, kind);
  if (kind == CUSAFE_MEMORY_DEVICE) {
    /* Later work on other streams must wait for the allocation. */
    atomic_init(b->last, q);
    if (holds_owner(b, q) && !owner_given)
      cs_ref(q->owner);
  }
  st = buffer_enter(b);
  if (st != CUSAFE_SUCCESS) {
    /* Never published: its memory goes back at once -- on q, whose capture
     * state is the one the caller saw (it is gated: no teardown's wait for
     * a capture's change here), and the buffer's reference on q's owner
     * with it; the caller keeps the references it gave. */
    memory_free_now(ptr, kind, q);
    if (kind == CUSAFE_MEMORY_DEVICE && holds_owner(b, q) && !owner_given)
      cs_unref(q->owner); /* not the last: the caller holds q */
    buffer_free(b);
    cs_device_leave(saved);
    return st;
  }
  cs_device_leave(saved);
  *out = b->hdr.handle;
  return CUSAFE_SUCCESS;
}

CUSAFE_API cusafe_status cusafe_buffer_alloc(cusafe_buffer *out,
                                             cusafe_context ctx_handle,
                                             cusafe_memory kind, size_t size) {
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  CS_HOLD_OR_RETURN(cs_context, ctx, ctx_handle, CS_CONTEXT, "context");
  cusafe_status st = buffer_alloc(out, ctx, kind, size, &ctx->queue, false);
  if (st == CUSAFE_SUCCESS)
    ctx = NULL; /* the buffer's reference now */
  return st;
}

CUSAFE_API cusafe_status cusafe_buffer_alloc_async(cusafe_buffer *out,
                                                   cusafe_stream stream,
                                                   size_t size) {
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  CS_HOLD_OR_RETURN(cs_stream, s, stream, CS_STREAM, "stream");
  /* Gated, so that a capture beginning on another thread cannot turn the
   * allocation into one of its graph's. */
  struct cs_context *ctx = s->queue.ctx;
  cusafe_status st;
  for (;;) {
    cs_gate(cs_call_);
    struct cs_capture *c = cs_queue_capture(&s->queue);
    if (c == CS_CAPTURE_BUSY) {
      cs_ungate(cs_call_);
      cs_capture_yield();
      continue;
    }
    if (c) {
      cs_ungate(cs_call_);
      return cs_capturing("an allocation (cusafe_buffer_alloc_async)",
                          &s->queue);
    }
    if (cs_queue_has_leftover(&s->queue) &&
        (st = cs_queue_leftover(&s->queue)) != CUSAFE_SUCCESS) {
      cs_ungate(cs_call_);
      return st;
    }
    if (cs_queue_default_forbidden(&s->queue)) {
      cs_ungate(cs_call_);
      return cs_untouchable_refuse("an allocation (cusafe_buffer_alloc_async)",
                                   &s->queue);
    }
    cs_ref(&ctx->hdr);
    st = buffer_alloc(out, ctx, CUSAFE_MEMORY_DEVICE, size, &s->queue, true);
    cs_ungate(cs_call_);
    break;
  }
  if (st == CUSAFE_SUCCESS)
    s = NULL; /* the buffer's, on the stream of its latest operation */
  else
    cs_unref(&ctx->hdr);
  return st;
}

/* Makes a view of [offset, offset + size) of p, whose reference (the
 * caller's) becomes the view's. */
static cusafe_status view_new(cusafe_buffer *out, struct cs_buffer *p,
                              size_t offset, size_t size) {
  cusafe_status st = check_range("view", NULL, offset, size, p->size);
  if (st != CUSAFE_SUCCESS)
    return st;
  struct cs_buffer *v = buffer_new();
  if (!v)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  v->root = p->root;
  v->hdr.parent = &p->hdr;
  v->ctx = p->ctx;
  v->ptr = p->ptr ? p->ptr + offset : NULL; /* NULL: a root of 0 bytes */
  v->size = size;
  v->kind = p->kind;
  st = buffer_enter(v);
  if (st != CUSAFE_SUCCESS) {
    buffer_free(v);
    return st;
  }
  *out = v->hdr.handle;
  return CUSAFE_SUCCESS;
}

CUSAFE_API cusafe_status cusafe_buffer_view(cusafe_buffer *out,
                                            cusafe_buffer parent, size_t offset,
                                            size_t size) {
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  CS_HOLD_OR_RETURN(cs_buffer, p, parent, CS_BUFFER, "parent");
  cusafe_status st = view_new(out, p, offset, size);
  if (st == CUSAFE_SUCCESS)
    p = NULL; /* the view's reference now */
  return st;
}

/* ---- memory of other owners --------------------------------------------- */

/* The memory that cudaPointerGetAttributes found, in words. */
static const char *memory_words(enum cudaMemoryType type) {
  switch (type) {
  case cudaMemoryTypeDevice: return "device memory";
  case cudaMemoryTypeHost: return "pinned host memory";
  case cudaMemoryTypeManaged: return "managed memory";
  default: return "host memory unknown to CUDA";
  }
}

/* Checks that [ptr, ptr + size) is memory of `kind` that ctx may use, as
 * CUDA reports it (ctx's device current). */
static cusafe_status check_foreign(struct cs_context *ctx, cusafe_memory kind,
                                   const void *ptr, size_t size) {
  static const enum cudaMemoryType want[] = {
      cudaMemoryTypeDevice, cudaMemoryTypeHost, cudaMemoryTypeManaged};
  struct cudaPointerAttributes attr;
  cudaError_t err = cs_cu->pointer_get_attributes(&attr, ptr);
  if (err != cudaSuccess)
    return cs_fail_cuda(err, "cudaPointerGetAttributes");
  if (attr.type != want[kind])
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "memory at %p is %s, not %s memory", ptr,
                   memory_words(attr.type), kind_names[kind]);
  if (kind == CUSAFE_MEMORY_DEVICE && attr.device != ctx->device)
    return cs_fail(CUSAFE_ERROR_CONTEXT_MISMATCH,
                   "memory at %p belongs to device %d but context belongs "
                   "to device %d",
                   ptr, attr.device, ctx->device);
  char *base = NULL;
  size_t bytes = 0;
  bool have = false;
  CUresult res = cs_mem_range(ptr, &base, &bytes, &have);
  if (!have)
    return CUSAFE_SUCCESS; /* a driver without the call: no size to check */
  if (res != CUDA_SUCCESS)
    return cs_fail_cuda((cudaError_t)res, "cuMemGetAddressRange");
  size_t offset = (size_t)((uintptr_t)ptr - (uintptr_t)base);
  if (size > bytes - offset)
    return cs_fail(CUSAFE_ERROR_OUT_OF_RANGE,
                   "wrap of %zu bytes at offset %zu exceeds the allocation "
                   "of %zu bytes at %p",
                   size, offset, bytes, (void *)base);
  return CUSAFE_SUCCESS;
}

cusafe_status cs_buffer_wrap_new(cusafe_buffer *out, struct cs_context *ctx,
                                 cusafe_memory kind, void *ptr, size_t size,
                                 cusafe_release_fn release, void *user) {
  if (kind != CUSAFE_MEMORY_DEVICE && kind != CUSAFE_MEMORY_HOST_PINNED &&
      kind != CUSAFE_MEMORY_MANAGED)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "unknown memory kind %d",
                   (int)kind);
  if (!ptr && size)
    return cs_null("ptr");
  int saved = -1;
  cusafe_status st = CUSAFE_SUCCESS;
  if (size) { /* 0 bytes: nothing to ask CUDA about */
    st = cs_device_enter(ctx->device, &saved);
    if (st == CUSAFE_SUCCESS) {
      st = check_foreign(ctx, kind, ptr, size);
      cs_device_leave(saved);
    }
    if (st != CUSAFE_SUCCESS)
      return st;
  }
  struct cs_buffer *b = buffer_new();
  if (!b)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  root_init(b, ctx, ptr, size, kind);
  b->wrapped = true;
  b->release = release;
  b->user = user;
  st = buffer_enter(b);
  if (st != CUSAFE_SUCCESS) {
    buffer_free(b); /* the memory stays the caller's: no release */
    return st;
  }
  *out = b->hdr.handle;
  return CUSAFE_SUCCESS;
}

CUSAFE_API cusafe_status cusafe_buffer_wrap(
    cusafe_buffer *out, cusafe_context ctx_handle, cusafe_memory kind,
    void *ptr, size_t size, cusafe_release_fn release, void *user) {
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  CS_HOLD_OR_RETURN(cs_context, ctx, ctx_handle, CS_CONTEXT, "context");
  cusafe_status st =
      cs_buffer_wrap_new(out, ctx, kind, ptr, size, release, user);
  if (st == CUSAFE_SUCCESS)
    ctx = NULL; /* the buffer's reference now */
  return st;
}

/* ---- release ------------------------------------------------------------- */

/* What the end of a root's memory needs -- its free, or its give-back to
 * its owner -- taken from the root at its release, so that the end can
 * wait (parked) after the buffer object is gone. */
struct memory_end {
  struct cs_context *ctx;
  struct cs_queue *q; /* of the memory's latest work, or NULL */
  char *ptr;
  cusafe_memory kind;
  bool wrapped;
  cusafe_release_fn release;
  void *user;
};

/* Queues the free of m's device memory after the work on fq, the latest
 * queue it was used on (the thread gated): CS_PARK, with `may_park`,
 * where fq cannot be touched now. */
static cusafe_status free_device_gated(const struct memory_end *m,
                                       struct cs_queue *fq, bool may_park,
                                       cudaError_t *err) {
  struct cs_context *ctx = m->ctx;
  if (may_park && CS_UNLIKELY(fq->borrowed) && cs_queue_untouchable(fq))
    return CS_PARK;
  /* Last used by a peer copy on another device, or on a stream that now
   * captures (where a free cannot be queued): freed on the context's own
   * stream after that work. */
  struct cs_capture *c = cs_queue_capture(fq);
  if (c == CS_CAPTURE_BUSY)
    return CS_RETRY;
  cusafe_status st = CUSAFE_SUCCESS;
  if (fq->ctx != ctx || c) {
    st = cs_queue_handoff(fq, &ctx->queue);
    if (st == CS_RETRY)
      return st;
    if (st != CUSAFE_SUCCESS) {
      /* Else the host waits for the same point (a failure that passes is
       * tried once more): never for fq's stream itself, which a capture
       * may hold.  If that fails too while fq captures (when nothing may
       * wait for its device), the free is parked, to be tried again. */
      cudaError_t werr;
      for (int i = 0; i < 2; i++)
        if (cs_queue_wait_gated(fq, &werr) == CS_RETRY)
          return CS_RETRY;
        else if (werr == cudaSuccess)
          break;
      if (werr != cudaSuccess && werr != cudaErrorCudartUnloading && c &&
          may_park)
        return CS_PARK;
      if (werr != cudaSuccess && !c) { /* then fq's device's work */
        cusafe_status fst = device_fallback_gated(fq->ctx, may_park, &werr);
        if (fst == CS_RETRY || fst == CS_PARK)
          return fst;
      }
    }
    fq = &ctx->queue;
  }
  for (int i = 0; i < 2; i++) /* a failure that passes: once more */
    if ((*err = cs_cu->free_async(m->ptr, fq->stream)) == cudaSuccess)
      return st;
  if (*err == cudaErrorCudartUnloading)
    return st;
  /* A free that cannot be queued is done synchronously instead, after
   * the device's work (device_fallback_gated: parked while a capture of
   * the context is open, to be tried again). */
  cudaError_t derr = *err;
  cusafe_status fst = device_fallback_gated(ctx, may_park, &derr);
  if (fst == CS_RETRY || fst == CS_PARK)
    return fst;
  if (cs_cu->free(m->ptr) == cudaSuccess)
    *err = cudaSuccess;
  return st;
}

/* Frees root memory after the work queued on it: device memory on the
 * stream of its latest operation (in its own context), pinned and managed
 * memory, which CUDA frees synchronously, once that stream is idle. */
static cusafe_status free_memory(const struct memory_end *m, bool may_park) {
  struct cs_queue *q = m->q;
  cudaError_t err = cudaSuccess;
  const char *fn = NULL;
  cusafe_status st = CUSAFE_SUCCESS;
  if (m->kind == CUSAFE_MEMORY_DEVICE) {
    struct cs_thread *self = cs_thread_self();
    do {
      cs_gate(self);
      st = free_device_gated(m, q ? q : &m->ctx->queue, may_park, &err);
      cs_ungate(self);
      if (st == CS_RETRY)
        cs_capture_yield();
    } while (st == CS_RETRY);
    if (st == CS_PARK)
      return st;
    fn = "cudaFreeAsync";
  } else {
    if (q) {
      bool park = false;
      err = cs_queue_wait_or_park(q, may_park ? &park : NULL);
      if (park)
        return CS_PARK;
      fn = "cudaStreamSynchronize";
    }
    cudaError_t ferr = m->kind == CUSAFE_MEMORY_HOST_PINNED
                           ? cs_cu->free_host(m->ptr)
                           : cs_cu->free(m->ptr);
    if (ferr != cudaSuccess && err == cudaSuccess) {
      err = ferr;
      fn = m->kind == CUSAFE_MEMORY_HOST_PINNED ? "cudaFreeHost" : "cudaFree";
    }
  }
  if (err != cudaSuccess && st == CUSAFE_SUCCESS)
    st = cs_fail_cuda(err, fn);
  return st;
}

/* Where the waits for work on one of ctx's queues failed: the device's
 * synchronisation instead (the thread gated), once what a capture of ctx
 * left over is ended (a synchronisation fails during any capture).
 * CS_RETRY while a capture of ctx begins or ends; CS_PARK, with
 * `may_park`, while one is open, which no mode allows a device's
 * synchronisation and which it would break, or while other code captures
 * a stream of ctx that cusafe knows (cs_streams_lent_busy): nothing done
 * then (nor without `may_park`).  Nothing
 * is waited for where the device cannot be made current (CUDA unloads or
 * is broken: nothing would run, nor end).  Else *err is the
 * synchronisation's result, or stays. */
static cusafe_status device_fallback_gated(struct cs_context *ctx,
                                           bool may_park, cudaError_t *err) {
  if (*err == cudaErrorCudartUnloading)
    return CUSAFE_SUCCESS;
  struct cs_capture *c = cs_capture_open_in(ctx);
  if (c == CS_CAPTURE_BUSY)
    return CS_RETRY;
  int saved;
  if (cs_device_enter_teardown(ctx->device, &saved) != CUSAFE_SUCCESS)
    return CUSAFE_SUCCESS;
  /* Other code's capture of a stream that cusafe knows would break too:
   * the same as one of cusafe's -- looked at once cusafe's left-over
   * captures are ended (a wrapper of the legacy stream cannot be touched
   * while one runs on a blocking stream). */
  bool busy = c != NULL;
  bool ended = !busy && cs_context_try_leftovers(ctx);
  if (!busy && cs_streams_lent_busy(ctx))
    busy = true; /* also where a left-over could not be ended */
  bool sync = ended && !busy;
  cusafe_status st = CUSAFE_SUCCESS;
  /* (Also where a left-over capture cannot be ended: the memory waits,
   * rather than go before its work; each drain tries the end again.) */
  if ((busy || !ended) && may_park)
    st = CS_PARK;
  else if (sync)
    *err = cs_cu->device_synchronize();
  cs_device_leave(saved);
  return st;
}

/* The host's wait for the work queued on q so far (cs_queue_wait_or_park;
 * a failure that passes is tried once more); where that fails, for q's
 * device instead (device_fallback_gated) -- or, with `park`, *park while
 * a capture of the context is open (the caller parks and tries again once
 * the capture ends).  cudaSuccess if q's work or the device's is done;
 * else the first wait's error. */
static cudaError_t wait_or_device(struct cs_queue *q, bool *park) {
  cudaError_t err = cudaSuccess;
  for (int i = 0; i < 2; i++) {
    cudaError_t e = cs_queue_wait_or_park(q, park);
    if (e == cudaSuccess || (park && *park))
      return cudaSuccess;
    if (i == 0)
      err = e;
  }
  struct cs_thread *self = cs_thread_self();
  for (;;) {
    cudaError_t derr = err;
    cs_gate(self);
    cusafe_status st = device_fallback_gated(q->ctx, park != NULL, &derr);
    cs_ungate(self);
    if (st == CS_RETRY) {
      cs_capture_yield(); /* a capture begins or ends in the context */
      continue;
    }
    if (st == CS_PARK) {
      *park = true;
      return cudaSuccess;
    }
    return derr == cudaSuccess ? cudaSuccess : err;
  }
}

/* Gives wrapped memory back to its owner once the work queued on it is
 * done (waited for: CUDA has no stream-ordered callback as cheap as a
 * free), then calls its release function -- with no lock held, so that it
 * may call cusafe.  Where the stream cannot be waited for, the device is;
 * where a capture forbids that, the give-back is parked (with `may_park`)
 * and tried again; where neither can be waited for, the device is broken
 * and its work will not run: the memory goes back all the same. */
static cusafe_status give_back(const struct memory_end *m, bool may_park) {
  struct cs_queue *q = m->q;
  cusafe_status st = CUSAFE_SUCCESS;
  if (q) {
    int saved;
    st = cs_device_enter_teardown(q->ctx->device, &saved);
    bool park = false;
    cudaError_t err = wait_or_device(q, may_park ? &park : NULL);
    if (!park && err != cudaSuccess && st == CUSAFE_SUCCESS)
      st = cs_fail_cuda(err, "cudaStreamSynchronize");
    cs_device_leave(saved);
    if (park)
      return CS_PARK;
  }
  if (m->release)
    m->release(m->user);
  return st;
}

/* The end of m, also when its device cannot be made current (memory left
 * behind would outlive its context); CS_PARK, with `may_park`, where the
 * stream of its latest work cannot be touched now: nothing done.  In
 * relaxed capture mode where it waits or frees synchronously (the
 * give-back, pinned and managed memory), as every teardown (handle.c);
 * device memory's cudaFreeAsync is the program's free, made in its own
 * mode, as the call it stands for would be. */
static cusafe_status memory_end_run(const struct memory_end *m, bool may_park) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  bool relaxed =
      (m->wrapped || m->kind != CUSAFE_MEMORY_DEVICE) && cs_relax(&mode);
  cusafe_status st;
  if (m->wrapped) {
    st = give_back(m, may_park);
  } else {
    int saved;
    st = cs_device_enter_teardown(m->ctx->device, &saved);
    cusafe_status fst = free_memory(m, may_park && st == CUSAFE_SUCCESS);
    st = fst == CS_PARK ? fst : cs_first(st, fst);
    cs_device_leave(saved);
  }
  cs_unrelax(relaxed, mode);
  return st;
}

/* A parked end, done: what it held let go.  A failure leaves only the
 * thread's message, as a release of the buffer itself would have. */
static void memory_end_free(struct parked *p) {
  struct memory_end *m = p->end;
  cs_unref(p->q->owner);
  cs_unref(&m->ctx->hdr);
  free(m);
  free(p);
}

/* Parks m's end: its latest work is on a stream that cannot be touched
 * now (a legacy default stream while a blocking stream of its device
 * captures; a stream that other code captures), so that no free, wait or
 * give-back can be ordered after that work, which may still be queued;
 * or its ordering failed where only the device's synchronisation, which
 * a capture of the context forbids, was left.  Without host memory it is
 * done now, as well as it can be. */
static cusafe_status park_end(const struct memory_end *m) {
  struct cs_queue *q = m->q ? m->q : &m->ctx->queue;
  struct parked *p = malloc(sizeof *p);
  struct memory_end *copy = malloc(sizeof *copy);
  if (!p || !copy) {
    free(p);
    free(copy);
    return memory_end_run(m, false);
  }
  *copy = *m;
  cs_ref(&m->ctx->hdr);
  cs_ref(q->owner);
  *p = (struct parked){.q = q, .end = copy};
  park(p, q);
  return CUSAFE_SUCCESS;
}

/* Frees root memory, or gives it back, after the work queued on it (see
 * memory_end_run), also in the ordered shutdown, in case the
 * synchronisation of the devices that came first failed.  A view holds no
 * memory of its own, nor does a root of 0 bytes. */
cusafe_status cs_buffer_fini(struct cs_object *obj) {
  struct cs_buffer *b = (struct cs_buffer *)obj;
  if (b->root != b || (b->size == 0 && !b->wrapped))
    return CUSAFE_SUCCESS;
  struct memory_end m = {
      .ctx = b->ctx,
      .q = atomic_load_explicit(b->last, memory_order_relaxed),
      .ptr = b->ptr,
      .kind = b->kind,
      .wrapped = b->wrapped,
      .release = b->release,
      .user = b->user};
  bool running =
      atomic_load_explicit(&cs_hot.state, memory_order_relaxed) == CS_RUNNING;
  if (running)
    cs_parked_drain_maybe(); /* ends parked before come first */
  cusafe_status st = memory_end_run(&m, running);
  return st == CS_PARK ? park_end(&m) : st;
}

/* A root lets go of the stream of its latest operation. */
void cs_buffer_free(struct cs_object *obj) {
  struct cs_buffer *b = (struct cs_buffer *)obj;
  struct cs_queue *last =
      b->root == b ? atomic_load_explicit(b->last, memory_order_relaxed) : NULL;
  if (last && holds_owner(b, last))
    cs_unref(last->owner);
  buffer_free(b);
}

void cs_buffer_describe(const struct cs_object *obj, char *what, size_t size) {
  const struct cs_buffer *b = (const struct cs_buffer *)obj;
  snprintf(what, size, "%s%zu bytes of %s memory on device %d",
           b->root != b ? "view of " : "", b->size, kind_names[b->kind],
           b->ctx->device);
}

/* ---- queries ------------------------------------------------------------- */

CS_QUERY(cusafe_buffer_get_size, size_t, 0, cs_buffer, CS_BUFFER, "buffer",
         *out = o->size)
CS_QUERY(cusafe_buffer_get_memory, cusafe_memory, (cusafe_memory)-1, cs_buffer,
         CS_BUFFER, "buffer", *out = o->kind)
CS_QUERY(cusafe_buffer_get_context, cusafe_context, CUSAFE_NULL_HANDLE,
         cs_buffer, CS_BUFFER, "buffer", st = cs_context_hand_out(o->ctx, out))
CS_QUERY(cusafe_buffer_interop_pointer, void *, NULL, cs_buffer, CS_BUFFER,
         "buffer", *out = o->ptr)

/* ---- work on one buffer -------------------------------------------------- */

/* What is done to one buffer: a write from or a read into host memory, or
 * a fill. */
enum op_kind { OP_WRITE, OP_READ, OP_FILL };
struct op {
  enum op_kind kind;
  void *host;          /* OP_WRITE, OP_READ */
  unsigned char value; /* OP_FILL */
  bool sync;           /* waited for (on the context's default stream) */
};
static const char *const op_names[] = {"write", "read", "fill"};

/* Queues op on [offset, offset + size) of b on q (b's device current,
 * root's lock held). */
static cusafe_status op_queue(const struct cs_buffer *b, size_t offset,
                              size_t size, struct op op, struct cs_queue *q) {
  char *dev = b->ptr + offset;
  cudaError_t err;
  if (op.kind == OP_FILL)
    err = cs_cu->memset_async(dev, op.value, size, q->stream);
  else
    err = cs_cu->memcpy_async(op.kind == OP_READ ? op.host : dev,
                              op.kind == OP_READ ? dev : op.host, size,
                              cudaMemcpyDefault, q->stream);
  if (err == cudaSuccess)
    return CUSAFE_SUCCESS;
  return cs_fail_cuda(err, op.kind == OP_FILL ? "cudaMemsetAsync"
                                              : "cudaMemcpyAsync");
}

/* Chains op after the work on b's memory and queues it on q (b's device
 * current, the thread gated); with op.sync, waits for it.  *drop: what
 * the chain let go of, for the caller to drop ungated. */
static cusafe_status op_run(struct cs_buffer *b, size_t offset, size_t size,
                            struct op op, struct cs_queue *q,
                            struct cs_object **drop) {
  /* A replay would read or write that host memory again, after the call,
   * when the caller may have freed it: copy from or to a pinned buffer
   * instead (cusafe_buffer_copy), which the graph holds. */
  struct cs_capture *c = cs_queue_capture(q);
  if (c == CS_CAPTURE_BUSY)
    return CS_RETRY;
  if (c && op.kind != OP_FILL)
    return cs_capturing(op.kind == OP_READ
                            ? "a read into host memory at an address"
                            : "a write from host memory at an address",
                        q);
  int saved;
  cusafe_status st = cs_device_enter(b->ctx->device, &saved);
  if (st != CUSAFE_SUCCESS)
    return st;
  struct cs_buffer *root = b->root;
  cs_spin_lock(&root->lock);
  st = cs_buffer_chain(root, q, drop);
  if (st == CUSAFE_SUCCESS)
    st = op_queue(b, offset, size, op, q);
  cs_spin_unlock(&root->lock);
  if (st == CUSAFE_SUCCESS && op.sync) {
    cudaError_t err = cs_cu->stream_synchronize(q->stream);
    if (err != cudaSuccess)
      st = cs_fail_cuda(err, "cudaStreamSynchronize");
  }
  cs_device_leave(saved);
  return st;
}

/* The call of an operation on one buffer: checks and queues op on
 * `buffer` on `stream` (CUSAFE_STREAM_DEFAULT: the default stream of the
 * buffer's context). */
static cusafe_status buffer_op(cusafe_buffer buffer, size_t offset, size_t size,
                               cusafe_stream stream, struct op op) {
  CS_ENTER();
  CS_HOLD_OR_RETURN(cs_buffer, b, buffer, CS_BUFFER, "buffer");
  struct cs_context *ctx = b->root->ctx;
  if (op.kind != OP_FILL && !op.host && size)
    return cs_null(op.kind == OP_READ ? "dst" : "src");
  cusafe_status st =
      check_range(op_names[op.kind], NULL, offset, size, b->size);
  if (st != CUSAFE_SUCCESS)
    return st;
  struct cs_queue *q;
  struct cs_object *held CS_HELD = NULL;
  st = cs_queue_get(stream, ctx, "buffer", &q, &held);
  if (st != CUSAFE_SUCCESS || size == 0)
    return st;
  for (;;) {
    struct cs_object *drop = NULL;
    cs_gate(cs_call_);
    st = op_run(b, offset, size, op, q, &drop);
    cs_ungate(cs_call_);
    if (drop)
      cs_unref(drop);
    if (CS_LIKELY(st != CS_RETRY))
      return st;
    cs_capture_yield(); /* a capture begins or ends on q */
  }
}

CUSAFE_API cusafe_status cusafe_buffer_write(cusafe_buffer buffer,
                                             size_t offset, const void *src,
                                             size_t size) {
  struct op op = {OP_WRITE, (void *)src, 0, true};
  return buffer_op(buffer, offset, size, CUSAFE_STREAM_DEFAULT, op);
}

CUSAFE_API cusafe_status cusafe_buffer_read(cusafe_buffer buffer, size_t offset,
                                            void *dst, size_t size) {
  return buffer_op(buffer, offset, size, CUSAFE_STREAM_DEFAULT,
                   (struct op){OP_READ, dst, 0, true});
}

CUSAFE_API cusafe_status cusafe_buffer_write_async(cusafe_buffer buffer,
                                                   size_t offset,
                                                   const void *src, size_t size,
                                                   cusafe_stream stream) {
  struct op op = {OP_WRITE, (void *)src, 0, false};
  return buffer_op(buffer, offset, size, stream, op);
}

CUSAFE_API cusafe_status cusafe_buffer_read_async(cusafe_buffer buffer,
                                                  size_t offset, void *dst,
                                                  size_t size,
                                                  cusafe_stream stream) {
  return buffer_op(buffer, offset, size, stream,
                   (struct op){OP_READ, dst, 0, false});
}

CUSAFE_API cusafe_status cusafe_buffer_fill(cusafe_buffer buffer, size_t offset,
                                            size_t size, unsigned char value,
                                            cusafe_stream stream) {
  return buffer_op(buffer, offset, size, stream,
                   (struct op){OP_FILL, NULL, value, false});
}

/* ---- copies between buffers ---------------------------------------------- */
/* Locks the roots of two buffers in order (cs_root_before; once if the
 * same). */
static void lock_pair(struct cs_buffer *a, struct cs_buffer *b) {
  if (a == b) {
    cs_spin_lock(&a->lock);
    return;
  }
  if (cs_root_before(b, a)) {
    struct cs_buffer *t = a;
    a = b;
    b = t;
  }
  cs_spin_lock(&a->lock);
  cs_spin_lock(&b->lock);
}

static void unlock_pair(struct cs_buffer *a, struct cs_buffer *b) {
  cs_spin_unlock(&a->lock);
  if (a != b)
    cs_spin_unlock(&b->lock);
}

/* Chains a copy of `size` bytes from s in src to d in dst after the work
 * on both, and queues it on `run` (run's device current, the thread
 * gated).  drops[0..1]: what the chains let go of, to drop ungated. */
static cusafe_status copy_run(struct cs_buffer *dst, char *d,
                              struct cs_buffer *src, const char *s, size_t size,
                              struct cs_queue *run, bool peer,
                              struct cs_object **drops) {
  struct cs_buffer *dr = dst->root, *sr = src->root;
  lock_pair(dr, sr);
  cusafe_status st = cs_buffer_chain(sr, run, &drops[0]);
  if (st == CUSAFE_SUCCESS)
    st = cs_buffer_chain(dr, run, &drops[1]);
  if (st == CUSAFE_SUCCESS) {
    cudaError_t err =
        peer ? cs_cu->memcpy_peer_async(d, dst->ctx->device, s,
                                        src->ctx->device, size, run->stream)
             : cs_cu->memcpy_async(d, s, size, cudaMemcpyDefault, run->stream);
    if (err != cudaSuccess)
      st = cs_fail_cuda(err, peer ? "cudaMemcpyPeerAsync" : "cudaMemcpyAsync");
  }
  unlock_pair(dr, sr);
  return st;
}

/* The copy of cusafe_buffer_copy() on q, run on `run` (q, or the default
 * stream of the device that owns the device memory), the thread gated. */
static cusafe_status copy_gated(struct cs_buffer *dst, char *d,
                                struct cs_buffer *src, const char *s,
                                size_t size, struct cs_queue *q,
                                struct cs_queue *run, bool peer,
                                struct cs_object **drops) {
  struct cs_capture *c = cs_queue_capture(q);
  if (c == CS_CAPTURE_BUSY)
    return CS_RETRY;
  if (run != q && c)
    return cs_capturing("a copy that runs on another device's stream", q);
  int saved;
  cusafe_status st = cs_device_enter(run->ctx->device, &saved);
  if (st != CUSAFE_SUCCESS)
    return st;
  if (run != q)
    st = cs_queue_handoff(q, run);
  /* CUDA captures no cudaMemcpyPeerAsync, in any mode (it invalidates the
   * capture), but captures a cudaMemcpyAsync of the same memory. */
  if (st == CUSAFE_SUCCESS)
    st = copy_run(dst, d, src, s, size, run, peer && !c, drops);
  /* Later work on the caller's stream comes after the copy. */
  if (st == CUSAFE_SUCCESS && run != q)
    st = cs_queue_handoff(run, q);
  cs_device_leave(saved);
  return st;
}

CUSAFE_API cusafe_status cusafe_buffer_copy(cusafe_buffer dst_handle,
                                            size_t dst_offset,
                                            cusafe_buffer src_handle,
                                            size_t src_offset, size_t size,
                                            cusafe_stream stream) {
  CS_ENTER();
  CS_HOLD_OR_RETURN(cs_buffer, dst, dst_handle, CS_BUFFER, "dst");
  CS_HOLD_OR_RETURN(cs_buffer, src, src_handle, CS_BUFFER, "src");
  cusafe_status st = check_range("copy", "source", src_offset, size, src->size);
  if (st == CUSAFE_SUCCESS)
    st = check_range("copy", "destination", dst_offset, size, dst->size);
  if (st != CUSAFE_SUCCESS)
    return st;
  /* Addresses as integers: a buffer of 0 bytes has none. */
  uintptr_t d = (uintptr_t)dst->ptr + dst_offset,
            s = (uintptr_t)src->ptr + src_offset;
  if (dst->root == src->root && size && d < s + size && s < d + size)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "source and destination ranges overlap");
  struct cs_queue *q;
  struct cs_object *held CS_HELD = NULL;
  st = cs_queue_get(stream, dst->ctx, NULL, &q, &held);
  if (st != CUSAFE_SUCCESS)
    return st;
  if (q->ctx != dst->ctx && q->ctx != src->ctx)
    return cs_mismatch("stream", q->ctx, "dst", dst->ctx);
  if (size == 0)
    return CUSAFE_SUCCESS;
  /* Device memory of two devices takes a peer copy on `q`.  Device memory
   * and host-accessible memory are copied by the device memory's own
   * device: on another device's stream CUDA rejects the copy. */
  bool peer = dst->ctx != src->ctx && dst->kind == CUSAFE_MEMORY_DEVICE &&
              src->kind == CUSAFE_MEMORY_DEVICE;
  struct cs_context *owner = dst->kind == CUSAFE_MEMORY_DEVICE   ? dst->ctx
                             : src->kind == CUSAFE_MEMORY_DEVICE ? src->ctx
                                                                 : q->ctx;
  struct cs_queue *run = peer || owner == q->ctx ? q : &owner->queue;
  if (peer && (st = cs_peer_enable(src->ctx->device, dst->ctx->device)) !=
                  CUSAFE_SUCCESS)
    return st;
  for (;;) {
    struct cs_object *drops[2] = {NULL, NULL};
    cs_gate(cs_call_);
    st = copy_gated(dst, (char *)d, src, (const char *)s, size, q, run, peer,
                    drops);
    cs_ungate(cs_call_);
    for (int i = 0; i < 2; i++)
      if (drops[i])
        cs_unref(drops[i]);
    if (CS_LIKELY(st != CS_RETRY))
      return st;
    cs_capture_yield(); /* a capture begins or ends on q */
  }
}

/* ---- work of other libraries ----------------------------------------------
 */

/* Buffers held on the stack; more go to the heap. */
#define STACK_BUFFERS 16

cusafe_status cs_buffers_use_on(struct cs_buffer **bufs, size_t n,
                                struct cs_queue *q, bool may_park) {
  struct cs_buffer *roots_stack[STACK_BUFFERS], **roots = roots_stack;
  struct cs_object *drops_stack[STACK_BUFFERS], **drops = drops_stack;
  if (n > STACK_BUFFERS) {
    roots = malloc(n * sizeof *roots);
    drops = malloc(n * sizeof *drops);
  }
  cusafe_status st = CUSAFE_SUCCESS;
  if (!roots || !drops) {
    st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    if (bufs[i]->ctx != q->ctx) {
      char name[32];
      snprintf(name, sizeof name, "buffers %zu", i);
      st = cs_mismatch(name, bufs[i]->ctx, "stream", q->ctx);
      goto out;
    }
    roots[i] = bufs[i]->root;
  }
  cs_parked_drain_maybe();
  struct cs_thread *self = cs_thread_self();
  int again = 0;
  do {
    size_t nroots = n, ndrops = 0;
    cs_gate(self);
    /* Work that other code queued on a stream that cannot be touched now
     * was queued before the capture that forbids it: every buffer follows
     * it once it can be (see "parked" above).  Looked at under the gate:
     * a capture of cusafe's that begins after this look waits for the
     * chains' CUDA calls. */
    if (CS_UNLIKELY(q->borrowed) && cs_queue_untouchable(q)) {
      cs_ungate(self);
      goto untouchable;
    }
    /* q's device current: a chain into a capture records an event of
     * the capture's (cs_capture_use), which must be of q's device -- one
     * of the caller's device could not be recorded there, and would stay
     * in the capture until it ends, possibly after the caller's device's
     * primary context went. */
    int saved;
    st = cs_device_enter(q->ctx->device, &saved);
    if (st == CUSAFE_SUCCESS) {
      st = cs_roots_chain(roots, &nroots, q, drops, &ndrops);
      cs_roots_unlock(roots, nroots);
      cs_device_leave(saved);
    }
    cs_ungate(self);
    for (size_t i = 0; i < ndrops; i++)
      cs_unref(drops[i]);
    /* Other code began a capture of q after the look: its hand-off into
     * q was refused, and the buffers not chained yet follow as above --
     * or, where that capture has ended already, are chained again (a
     * follow done now would miss the work that the caller queues next). */
    if (st == CUSAFE_ERROR_CAPTURING && CS_UNLIKELY(q->borrowed)) {
      if (cs_queue_untouchable(q))
        goto untouchable;
      if (again++ < 4)
        st = CS_RETRY;
    }
    if (st == CS_RETRY) {
      cs_capture_yield();            /* a capture begins or ends on q */
      for (size_t i = 0; i < n; i++) /* the sort made them unique */
        roots[i] = bufs[i]->root;
    }
  } while (st == CS_RETRY);
  goto out;
untouchable:
  if (!may_park) {
    st = cs_untouchable_fail(q);
  } else {
    st = CUSAFE_SUCCESS;
    for (size_t i = 0; i < n && st == CUSAFE_SUCCESS; i++)
      st = park_follow(bufs[i], q);
  }
out:
  if (roots != roots_stack) {
    free(roots);
    free(drops);
  }
  return st;
}

CUSAFE_API cusafe_status cusafe_stream_use_buffers(cusafe_stream stream,
                                                   const cusafe_buffer *buffers,
                                                   size_t count) {
  CS_ENTER();
  if (!buffers && count)
    return cs_null("buffers");
  struct cs_buffer *stack[STACK_BUFFERS], **bufs = stack;
  if (count > STACK_BUFFERS && !(bufs = calloc(count, sizeof *bufs)))
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  size_t held_bufs = 0;
  cusafe_status st = CUSAFE_SUCCESS;
  for (; held_bufs < count && st == CUSAFE_SUCCESS; held_bufs++)
    st = cs_acquire_at(buffers[held_bufs], CS_BUFFER, "buffers",
                       (long)held_bufs, (struct cs_object **)&bufs[held_bufs]);
  if (st != CUSAFE_SUCCESS) {
    held_bufs--; /* the one that failed holds nothing */
  } else if (count > 0 || stream != CUSAFE_STREAM_DEFAULT) {
    /* With no buffers, only the stream's handle is checked. */
    struct cs_queue *q;
    struct cs_object *held CS_HELD = NULL;
    st = cs_queue_get(stream, count ? bufs[0]->ctx : NULL, NULL, &q, &held);
    if (st == CUSAFE_SUCCESS && count > 0)
      st = cs_buffers_use_on(bufs, count, q, true);
  }
  for (size_t i = 0; i < held_bufs; i++)
    cs_unref(&bufs[i]->hdr);
  if (bufs != stack)
    free(bufs);
  return st;
}
