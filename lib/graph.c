/* graph.c -- stream capture and graphs (invariant 2: a graph holds what its
 * captured work uses, and its replays keep its memory alive; invariant 5:
 * the shutdown ends open captures and destroys graphs before what they
 * hold).
 *
 * Captured work does not run, so it changes no buffer's chain of work
 * (buffer.h): a capture remembers the buffers its work used, and each
 * replay chains them onto its stream as one operation.  Inside a capture,
 * a buffer's captured uses on different queues of the capture are ordered
 * by events recorded in the capture.  Every capture begins in CUDA's
 * relaxed mode, so that cusafe's own calls from any thread (queries,
 * frees, allocations on other streams) stay legal meanwhile; the calls
 * that no mode allows (synchronizing or querying a capturing stream or
 * its device, waiting for an event recorded in a capture) are refused
 * before they reach CUDA (CUSAFE_ERROR_CAPTURING). */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "context.h"
#include "device.h"
#include "event.h"
#include "graph.h"
#include "init.h"
#include "kernel.h"

/* The open captures, for the shutdown and the checks by id; the queues
 * marked joining one. */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cs_capture *open_captures;
static struct cs_queue *joining_queues;
static uint64_t last_id;

static bool marked(const struct cs_capture *raw) {
  return (uintptr_t)raw & CS_CAPTURE_MARKS;
}

static struct cs_capture *mark(struct cs_capture *c, uintptr_t how) {
  return (struct cs_capture *)((uintptr_t)c | how);
}

void cs_capture_yield(void) { sched_yield(); }

/* The queue of capture c over `stream`, or NULL (open_lock or c->lock
 * held: members join under both). */
static struct cs_queue *queue_over(struct cs_capture *c, cudaStream_t stream) {
  if (c->origin->stream == stream)
    return c->origin;
  for (size_t i = 0; i < c->nmembers; i++)
    if (c->members[i]->stream == stream)
      return c->members[i];
  return NULL;
}

/* Whether a queue over `stream` is marked joining a capture (open_lock
 * held). */
static bool joining_over(cudaStream_t stream) {
  for (struct cs_queue *q = joining_queues; q; q = q->joining_next)
    if (q->stream == stream)
      return true;
  return false;
}

/* q leaves the list of joining queues, if it is there (open_lock held). */
static void joining_leave(struct cs_queue *q) {
  if (!q->joining_listed)
    return;
  struct cs_queue **p = &joining_queues;
  while (*p != q)
    p = &(*p)->joining_next;
  *p = q->joining_next;
  q->joining_listed = false;
}

struct cs_capture *cs_capture_of_stream(cudaStream_t stream,
                                        cudaEvent_t *entry) {
  pthread_mutex_lock(&open_lock);
  struct cs_capture *found = NULL;
  for (struct cs_capture *c = open_captures; c && !found; c = c->next) {
    struct cs_queue *q = queue_over(c, stream);
    if (!q)
      continue;
    found = marked(atomic_load(&q->capture)) ? CS_CAPTURE_BUSY : c;
    if (entry)
      *entry = q->entry;
  }
  /* Another cusafe stream over it is joining a capture: as a mark. */
  if (!found && joining_over(stream))
    found = CS_CAPTURE_BUSY;
  pthread_mutex_unlock(&open_lock);
  return found;
}

/* The handle of the stream on which the open capture over `stream` began,
 * or CUSAFE_NULL_HANDLE. */
static cusafe_handle origin_over(cudaStream_t stream) {
  pthread_mutex_lock(&open_lock);
  cusafe_handle h = CUSAFE_NULL_HANDLE;
  for (struct cs_capture *c = open_captures; c && !h; c = c->next)
    if (queue_over(c, stream))
      h = c->origin->owner->handle;
  pthread_mutex_unlock(&open_lock);
  return h;
}

cudaEvent_t cs_queue_entry(struct cs_queue *q) {
  if (atomic_load(&q->capture))
    return q->entry;
  cudaEvent_t entry = NULL;
  cs_capture_of_stream(q->stream, &entry);
  return entry;
}

cusafe_status cs_capturing(const char *what, const struct cs_queue *q) {
  return cs_fail(CUSAFE_ERROR_CAPTURING,
                 "%s cannot be done while stream 0x%016llx captures", what,
                 (unsigned long long)q->owner->handle);
}

struct cs_capture *cs_capture_open_in(const struct cs_context *ctx) {
  pthread_mutex_lock(&open_lock);
  struct cs_capture *found = NULL;
  for (struct cs_capture *c = open_captures; c; c = c->next)
    if (!ctx || c->ctx == ctx) {
      if (marked(atomic_load(&c->origin->capture))) {
        found = CS_CAPTURE_BUSY;
        break;
      }
      found = c;
    }
  pthread_mutex_unlock(&open_lock);
  return found;
}

struct cs_capture *cs_capture_find(uint64_t id) {
  pthread_mutex_lock(&open_lock);
  struct cs_capture *c = open_captures;
  while (c && c->id != id)
    c = c->next;
  if (c && atomic_load(&c->ending))
    c = CS_CAPTURE_BUSY;
  pthread_mutex_unlock(&open_lock);
  return c;
}

bool cs_capture_open(uint64_t id) { return cs_capture_find(id) != NULL; }

/* Grows *arr (of *cap elements of `size`) to hold n + 1. */
static bool grow(void **arr, size_t n, size_t *cap, size_t size) {
  if (n < *cap)
    return true;
  size_t want = *cap ? 2 * *cap : 8;
  void *p = realloc(*arr, want * size);
  if (!p)
    return false;
  *arr = p;
  *cap = want;
  return true;
}

/* c->lock held. */
static cusafe_status hold_locked(struct cs_capture *c, struct cs_object *obj) {
  for (size_t i = 0; i < c->nheld; i++)
    if (c->held[i] == obj)
      return CUSAFE_SUCCESS;
  if (!grow((void **)&c->held, c->nheld, &c->cap_held, sizeof *c->held))
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  if (!cs_try_ref(obj))
    return cs_fail(CUSAFE_ERROR_INVALID_HANDLE,
                   "%s 0x%016llx is stale: its object was released",
                   cs_type_name(obj->type), (unsigned long long)obj->handle);
  c->held[c->nheld++] = obj;
  return CUSAFE_SUCCESS;
}

cusafe_status cs_capture_hold(struct cs_capture *c, struct cs_object *obj) {
  pthread_mutex_lock(&c->lock);
  cusafe_status st = hold_locked(c, obj);
  pthread_mutex_unlock(&c->lock);
  return st;
}

/* Makes `to` wait for the work captured so far on `from`, both queues of
 * capture c (c->lock held): an event recorded in the capture, an edge of
 * its graph. */
static cusafe_status order_in_capture(struct cs_capture *c,
                                      struct cs_queue *from,
                                      struct cs_queue *to) {
  if (!grow((void **)&c->events, c->nevents, &c->cap_events, sizeof *c->events))
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  cudaEvent_t ev;
  cudaError_t err = cs_cu->event_create(&ev, cudaEventDisableTiming);
  if (err != cudaSuccess)
    return cs_fail_cuda(err, "cudaEventCreateWithFlags");
  c->events[c->nevents++] = ev;
  if ((err = cs_cu->event_record(ev, from->stream)) != cudaSuccess)
    return cs_fail_cuda(err, "cudaEventRecord");
  if ((err = cs_cu->stream_wait_event(to->stream, ev, 0)) != cudaSuccess)
    return cs_fail_cuda(err, "cudaStreamWaitEvent");
  return CUSAFE_SUCCESS;
}

cusafe_status cs_capture_use(struct cs_capture *c, struct cs_buffer *root,
                             struct cs_queue *q) {
  pthread_mutex_lock(&c->lock);
  /* The use is remembered on c's own queue over q's CUDA stream (q may be
   * another cusafe stream over it, a wrapper, which c does not hold): its
   * origin, which ends c before it goes, or a member, which c holds. */
  struct cs_queue *own = queue_over(c, q->stream);
  cusafe_status st = own ? CUSAFE_SUCCESS : hold_locked(c, q->owner);
  if (own)
    q = own;
  size_t i = 0;
  while (i < c->nuses && c->uses[i].root != root)
    i++;
  if (st != CUSAFE_SUCCESS) {
    /* q went meanwhile (a launch only peeked at it) */
  } else if (i == c->nuses) {
    if (!grow((void **)&c->uses, c->nuses, &c->cap_uses, sizeof *c->uses))
      st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
    else if ((st = hold_locked(c, &root->hdr)) == CUSAFE_SUCCESS)
      c->uses[c->nuses++] = (struct cs_capture_use){root, q};
  } else if (c->uses[i].q != q) {
    st = order_in_capture(c, c->uses[i].q, q);
    if (st == CUSAFE_SUCCESS)
      c->uses[i].q = q;
  }
  pthread_mutex_unlock(&c->lock);
  return st;
}

/* ---- beginning and ending ------------------------------------------------ */

/* Ends the capture that began on q, discarding its work, with q's device
 * current where it can be. */
static void discard_on_device(struct cs_queue *q) {
  int saved;
  if (cs_device_enter_teardown(q->ctx->device, &saved) == CUSAFE_SUCCESS) {
    cs_capture_discard(q);
    cs_device_leave(saved);
  } else {
    cs_capture_discard(q);
  }
}

/* The caller's last handle of the stream a capture began on goes: the
 * capture ends, discarding its work (it could not be ended any more, and
 * what it holds would keep the stream alive for ever). */
static void last_user_release(struct cs_object *obj) {
  if (obj->type != CS_STREAM)
    return;
  struct cs_queue *q = &((struct cs_stream *)obj)->queue;
  if (atomic_load(&q->capture)) {
    discard_on_device(q);
    cs_parked_drain(); /* the legacy stream may be touched again */
  }
}

/* Records q's entry event (making it at the first capture), so that work
 * outside the capture can wait for what q did before it (q's device
 * current). */
static cusafe_status record_entry(struct cs_queue *q) {
  cudaError_t err;
  if (!q->entry && (err = cs_cu->event_create(
                        &q->entry, cudaEventDisableTiming)) != cudaSuccess) {
    q->entry = NULL;
    return cs_fail_cuda(err, "cudaEventCreateWithFlags");
  }
  err = cs_cu->event_record(q->entry, q->stream);
  return err == cudaSuccess ? CUSAFE_SUCCESS
                            : cs_fail_cuda(err, "cudaEventRecord");
}

cusafe_status cs_capture_join(struct cs_capture *c, struct cs_queue *q,
                              cudaEvent_t ev) {
  pthread_mutex_lock(&c->lock);
  cusafe_status st = CUSAFE_SUCCESS;
  if (atomic_load(&c->ending)) {
    st = CS_RETRY; /* ends on another thread */
  } else {
    pthread_mutex_lock(&open_lock); /* look-ups read the members */
    if (!grow((void **)&c->members, c->nmembers, &c->cap_members,
              sizeof *c->members))
      st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
    pthread_mutex_unlock(&open_lock);
  }
  size_t held_before = c->nheld;
  if (st == CUSAFE_SUCCESS)
    st = hold_locked(c, q->owner);
  if (st == CUSAFE_SUCCESS) {
    cs_spin_lock(&q->capture_lock);
    if (atomic_load(&q->capture) != CS_CAPTURE_JOINING) {
      st = CS_RETRY; /* not marked by this thread's join: not possible */
    } else if ((st = record_entry(q)) == CUSAFE_SUCCESS) {
      cudaError_t err = cs_cu->stream_wait_event(q->stream, ev, 0);
      if (err != cudaSuccess) {
        st = cs_fail_cuda(err, "cudaStreamWaitEvent");
      } else {
        pthread_mutex_lock(&open_lock);
        c->members[c->nmembers++] = q;
        joining_leave(q);
        atomic_store(&q->capture, c);
        pthread_mutex_unlock(&open_lock);
      }
    }
    cs_spin_unlock(&q->capture_lock);
  }
  /* A join that failed midway lets go of the stream it held (not its last
   * reference: the caller holds it). */
  struct cs_object *unjoined = NULL;
  if (st != CUSAFE_SUCCESS && c->nheld > held_before)
    unjoined = c->held[--c->nheld];
  pthread_mutex_unlock(&c->lock);
  if (unjoined)
    cs_unref(unjoined);
  return st;
}

/* The mark goes into the list of joining queues at once, so that an
 * operation through another cusafe stream over q's CUDA stream meets it
 * as it would meet q's own (cs_capture_of_stream), and so does a capture
 * beginning there: else its work could be queued after the join's wait,
 * captured, with nothing of it held. */
bool cs_queue_mark_joining(struct cs_queue *q) {
  cs_spin_lock(&q->capture_lock);
  pthread_mutex_lock(&open_lock);
  bool free_to_join =
      atomic_load(&q->capture) == NULL && !joining_over(q->stream);
  for (struct cs_capture *c = open_captures; c && free_to_join; c = c->next)
    free_to_join = queue_over(c, q->stream) == NULL;
  if (free_to_join) {
    atomic_store(&q->capture, CS_CAPTURE_JOINING);
    q->joining_next = joining_queues;
    joining_queues = q;
    q->joining_listed = true;
  }
  pthread_mutex_unlock(&open_lock);
  cs_spin_unlock(&q->capture_lock);
  return free_to_join;
}

void cs_queue_unmark_joining(struct cs_queue *q) {
  cs_spin_lock(&q->capture_lock);
  pthread_mutex_lock(&open_lock);
  joining_leave(q);
  if (atomic_load(&q->capture) == CS_CAPTURE_JOINING)
    atomic_store(&q->capture, NULL);
  pthread_mutex_unlock(&open_lock);
  cs_spin_unlock(&q->capture_lock);
}

static void capture_free(struct cs_capture *c) {
  for (size_t i = 0; i < c->nevents; i++)
    cs_cu->event_destroy(c->events[i]);
  free(c->events);
  free(c->uses);
  free(c->members);
  free(c->held);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

/* Destroys a graph that no cs_graph owns (a discarded capture's); one that
 * cannot be destroyed now is retried before ctx goes. */
static void discard_graph(struct cs_context *ctx, cudaGraph_t g) {
  if (g && cs_cu->graph_destroy(g) != cudaSuccess)
    cs_context_orphan_graph(ctx, g, NULL);
}

/* CUDA's id of the capture running on `stream` (cudaStreamGetCaptureInfo):
 * 0 if none; CS_LEFTOVER_ANY for one whose id CUDA gives as 0. */
static cudaError_t cuda_capture_id(cudaStream_t stream,
                                   unsigned long long *id) {
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  unsigned long long v = 0;
  cudaError_t err =
      cs_cu->stream_get_capture_info(stream, &cs, &v, NULL, NULL, NULL, NULL);
  *id = err != cudaSuccess || cs == cudaStreamCaptureStatusNone ? 0
        : v                                                     ? v
            : CS_LEFTOVER_ANY;
  return err;
}

/* The CUDA streams on which a capture of cusafe's may still run, CUDA
 * having failed to end it (mark_leftover): each with CUDA's id of that
 * capture and the stream it began on, whose end alone ends it; so that
 * every cusafe stream over one of them -- a wrapper too -- ends it before
 * it queues work there (cs_queue_has_leftover), and ends nothing else: not
 * a capture that began there since, through another cusafe stream or by
 * other code.  Under open_lock, which an end holds from its look at CUDA
 * to its cudaStreamEndCapture, so that no other end comes between.
 *
 * An entry that ends stays, `over`, until its queue goes
 * (cs_queue_forget_leftover): what it holds is let go there, where no
 * lock is held -- the ends happen under locks (a root's, a queue's
 * capture_lock), where a last reference must not go. */
static struct leftover {
  cudaStream_t stream;
  unsigned long long id;
  cudaStream_t origin; /* the stream the capture began on */
  /* For a stream that joined: the owner of the origin's queue, referenced
   * until `by` goes, so that the origin's CUDA stream outlives the entry
   * (NULL if the origin was going: its teardown ends the capture). */
  struct cs_object *holds;
  /* The queue that took part in the capture over `stream` (not referenced:
   * its teardown takes its entries out). */
  struct cs_queue *by;
  /* The capture's context (not referenced: its teardown ends the capture,
   * if it can, and takes the entries out). */
  struct cs_context *ctx;
  bool over; /* the capture runs no more */
} * leftovers;
static size_t nleftover, cap_leftover;
/* Entries not over (read without the lock: a hint, then looked up), and
 * all entries. */
_Atomic size_t cs_leftover_streams;
static _Atomic size_t leftover_entries;

/* The live entry of `stream` (open_lock held).  Entries go once over and
 * their queue is gone, or once their stream is destroyed. */
static struct leftover *leftover_find(cudaStream_t stream) {
  for (size_t i = 0; i < nleftover; i++)
    if (leftovers[i].stream == stream && !leftovers[i].over)
      return &leftovers[i];
  return NULL;
}

static void leftover_over_mark(struct leftover *l) {
  if (!l->over) {
    l->over = true;
    atomic_fetch_sub(&cs_leftover_streams, 1);
  }
}

bool cs_stream_leftover(cudaStream_t stream) {
  pthread_mutex_lock(&open_lock);
  bool found = leftover_find(stream) != NULL;
  pthread_mutex_unlock(&open_lock);
  return found;
}

/* (open_lock held) false without host memory: then the stream goes
 * unmarked, and the caller lets go of what the entry would hold. */
static bool leftover_add(const struct leftover *l) {
  struct leftover *e = leftover_find(l->stream);
  if (e) /* an older one's: CUDA began this one there since */
    leftover_over_mark(e);
  if (!grow((void **)&leftovers, nleftover, &cap_leftover, sizeof *leftovers))
    return false;
  leftovers[nleftover++] = *l;
  atomic_fetch_add(&cs_leftover_streams, 1);
  atomic_store(&leftover_entries, nleftover);
  return true;
}

/* The capture of id `id` that began on `origin` runs no more (open_lock
 * held): its entries are over; or only `stream`'s, if `id` is 0. */
static void leftover_settle(cudaStream_t stream, unsigned long long id) {
  for (size_t i = 0; i < nleftover; i++) {
    struct leftover *l = &leftovers[i];
    if (id ? l->id == id && l->origin == stream : l->stream == stream)
      leftover_over_mark(l);
  }
}

/* Lets go of what taken entries held: never in the ordered shutdown,
 * which destroys every object whatever holds it, and frees none. */
static void leftover_drop(struct cs_object **drops, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (atomic_load(&cs_hot.state) == CS_RUNNING)
      cs_unref(drops[i]);
}

void cs_queue_forget_leftover(struct cs_queue *q, bool destroyed) {
  if (!atomic_load(&leftover_entries))
    return;
  struct cs_object *stack[8], **drops = stack;
  size_t n = 0;
  pthread_mutex_lock(&open_lock);
  if (nleftover > 8 && !(drops = malloc(nleftover * sizeof *drops)))
    drops = stack; /* then what does not fit stays held */
  size_t room = drops == stack ? 8 : nleftover;
  for (size_t i = nleftover; i-- > 0;) {
    struct leftover *l = &leftovers[i];
    if (l->over && !l->by && !l->holds) { /* done with */
      *l = leftovers[--nleftover];
      continue;
    }
    /* Once its CUDA stream is destroyed, its handle may name another
     * stream: no entry may name it. */
    bool gone = destroyed && (l->stream == q->stream || l->origin == q->stream);
    if ((l->by != q && !gone) || (l->holds && n == room))
      continue;
    if (l->holds)
      drops[n++] = l->holds;
    l->holds = NULL;
    l->by = NULL;
    /* A capture that may still run on a stream that lives on (another
     * library's) stays marked: a cusafe stream over it later ends it. */
    if (gone || l->over) {
      leftover_over_mark(l);
      *l = leftovers[--nleftover];
    }
  }
  atomic_store(&leftover_entries, nleftover);
  pthread_mutex_unlock(&open_lock);
  leftover_drop(drops, n);
  if (drops != stack)
    free(drops);
}

/* Whether the leftover capture of id `id` no longer runs on a stream that
 * runs the capture of id `now` (0: none).  CUDA tells no id of an
 * invalidated capture (CS_LEFTOVER_ANY): it is taken as the leftover,
 * which nothing can use any more. */
static bool leftover_over(unsigned long long now, unsigned long long id) {
  return now == 0 ||
         (now != id && now != CS_LEFTOVER_ANY && id != CS_LEFTOVER_ANY);
}

bool cs_leftover_end(cudaStream_t stream, struct cs_context *ctx) {
  /* (Only after an end that failed: a destroy costs no query otherwise.) */
  pthread_mutex_lock(&open_lock);
  struct leftover *e = leftover_find(stream);
  if (!e) {
    pthread_mutex_unlock(&open_lock);
    return true;
  }
  struct leftover l = *e;
  unsigned long long now = 0, at_origin = 0;
  bool ended = false;
  if (cuda_capture_id(stream, &now) == cudaSuccess) {
    ended = leftover_over(now, l.id);
    /* The origin ends it, if it still runs there (not a capture begun
     * there since); where that fails, the stream's own end is tried.  An
     * end that fails may end the capture all the same (an unjoined
     * stream, an invalidated capture): CUDA is asked again. */
    if (!ended && l.origin != stream &&
        cuda_capture_id(l.origin, &at_origin) == cudaSuccess &&
        leftover_over(at_origin, l.id))
      ended = true; /* over where it began: over everywhere */
    cudaStream_t at[2] = {l.origin, stream};
    for (int i = 0; i < 2 && !ended; i++) {
      if (i == 1 && l.origin == stream)
        break;
      cudaGraph_t g = NULL;
      ended = cs_cu->stream_end_capture(at[i], &g) == cudaSuccess;
      discard_graph(ctx, g);
      ended = ended || (cuda_capture_id(stream, &now) == cudaSuccess &&
                        leftover_over(now, l.id));
    }
  }
  if (ended)
    leftover_settle(l.origin, l.id);
  pthread_mutex_unlock(&open_lock);
  if (ended) /* (no drain here: locks may be held) */
    atomic_fetch_add(&cs_parked_epoch, 1);
  return ended;
}

bool cs_context_try_leftovers(struct cs_context *ctx) {
  if (!atomic_load(&cs_leftover_streams))
    return true;
  for (;;) { /* one at a time: an end takes the lock itself */
    cudaStream_t stream = NULL;
    pthread_mutex_lock(&open_lock);
    /* (Not another library's stream that no wrapper holds any more: its
     * owner may have destroyed it.) */
    for (size_t i = 0; i < nleftover && !stream; i++)
      if (leftovers[i].ctx == ctx && !leftovers[i].over && leftovers[i].by)
        stream = leftovers[i].stream;
    pthread_mutex_unlock(&open_lock);
    if (!stream)
      return true;
    if (!cs_leftover_end(stream, ctx))
      return false;
  }
}

void cs_context_end_leftovers(struct cs_context *ctx) {
  if (!atomic_load(&leftover_entries))
    return;
  (void)cs_context_try_leftovers(ctx);
  /* What could not be ended is forgotten: the context goes. */
  pthread_mutex_lock(&open_lock);
  for (size_t i = nleftover; i-- > 0;)
    if (leftovers[i].ctx == ctx) {
      leftover_over_mark(&leftovers[i]);
      leftovers[i] = leftovers[--nleftover];
    }
  atomic_store(&leftover_entries, nleftover);
  pthread_mutex_unlock(&open_lock);
}

cusafe_status cs_queue_leftover(struct cs_queue *q) {
  if (cs_leftover_end(q->stream, q->ctx))
    return CUSAFE_SUCCESS;
  return cs_fail(CUSAFE_ERROR_CAPTURING,
                 "stream 0x%016llx may still capture: ending its capture "
                 "failed, and so does ending it again",
                 (unsigned long long)q->owner->handle);
}

/* Before a capture begins on s: a capture that CUDA runs there although
 * cusafe began none on it is one of its own whose end failed (a
 * leftover), ended now, discarding -- or one that other code began, which
 * is left alone. */
static cusafe_status leftover_capture(struct cs_stream *s) {
  struct cs_queue *q = &s->queue;
  unsigned long long now;
  cudaError_t err = cuda_capture_id(q->stream, &now);
  if (err != cudaSuccess)
    return cs_fail_cuda(err, "cudaStreamGetCaptureInfo");
  if (now == 0) { /* any leftover there is over */
    if (cs_queue_has_leftover(q)) {
      pthread_mutex_lock(&open_lock);
      leftover_settle(q->stream, 0);
      pthread_mutex_unlock(&open_lock);
    }
    return CUSAFE_SUCCESS;
  }
  if (!cs_queue_has_leftover(q))
    return cs_fail(CUSAFE_ERROR_CAPTURING,
                   "stream 0x%016llx is being captured by other code",
                   (unsigned long long)s->hdr.handle);
  cusafe_status st = cs_queue_leftover(q);
  if (st == CUSAFE_SUCCESS && cs_queue_has_leftover(q))
    st = cs_fail(CUSAFE_ERROR_CAPTURING,
                 "stream 0x%016llx is being captured by other code",
                 (unsigned long long)s->hdr.handle);
  return st;
}

static void capture_close(struct cs_capture *c);

/* A capture changes in three steps, so that every operation's work is
 * captured exactly when the operation saw its stream capture
 * (lib/README.md, "Gates: captures beginning and ending"): the stream's
 * capture pointer is marked, beginning or ending; the gates and pins of
 * the operations that looked at it before are waited for; then CUDA's
 * capture begins or ends and the pointer takes its new value.  An
 * operation that meets a marked pointer is undone and tried again
 * (CS_RETRY). */
CUSAFE_API cusafe_status cusafe_stream_begin_capture(cusafe_stream stream) {
  CS_ENTER();
  CS_HOLD_OR_RETURN(cs_stream, s, stream, CS_STREAM, "stream");
  struct cs_queue *q = &s->queue;
  if (cs_stream_wraps_default(s))
    return cs_fail(CUSAFE_ERROR_NOT_SUPPORTED,
                   "stream 0x%016llx wraps a device's default stream, which "
                   "CUDA cannot capture",
                   (unsigned long long)stream);
  struct cs_capture *c = calloc(1, sizeof *c);
  if (!c)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  pthread_mutex_init(&c->lock, NULL);
  c->origin = q;
  c->ctx = q->ctx;
  /* The origin is not held: its last release ends the capture
   * (cs_capture_discard). */
  cs_spin_lock(&q->capture_lock);
  pthread_mutex_lock(&open_lock);
  /* Also through another cusafe stream over q's CUDA stream, one that is
   * joining a capture included (as if the join came first). */
  bool taken = atomic_load(&q->capture) != NULL || joining_over(q->stream);
  for (struct cs_capture *o = open_captures; o && !taken; o = o->next)
    taken = queue_over(o, q->stream) != NULL;
  if (!taken) {
    c->id = ++last_id;
    c->next = open_captures;
    open_captures = c;
    atomic_fetch_add(&cs_hot.captures, 1);
    atomic_store(&cs_last_user_hook, last_user_release);
    atomic_store(&q->capture, mark(c, CS_CAPTURE_BEGINNING));
  }
  pthread_mutex_unlock(&open_lock);
  cs_spin_unlock(&q->capture_lock);
  if (taken) {
    capture_free(c);
    return cs_fail(CUSAFE_ERROR_CAPTURING, "stream 0x%016llx captures already",
                   (unsigned long long)stream);
  }
  cs_gates_wait(); /* work queued before stays out of the capture */
  int saved;
  cusafe_status st = cs_device_enter(q->ctx->device, &saved);
  cs_spin_lock(&q->capture_lock); /* hand-offs from q wait */
  if (st == CUSAFE_SUCCESS)
    st = leftover_capture(s);
  if (st == CUSAFE_SUCCESS)
    st = record_entry(q);
  if (st == CUSAFE_SUCCESS) {
    cudaError_t err =
        cs_cu->stream_begin_capture(q->stream, cudaStreamCaptureModeRelaxed);
    if (err != cudaSuccess)
      st = cs_fail_cuda(err, "cudaStreamBeginCapture");
    else /* (if CUDA cannot tell it now, a failed end asks again) */
      cuda_capture_id(q->stream, &c->cuda_id);
  }
  if (st == CUSAFE_SUCCESS)
    atomic_store(&q->capture, c);
  cs_spin_unlock(&q->capture_lock);
  cs_device_leave(saved);
  if (st == CUSAFE_SUCCESS && cs_user_refs(&s->hdr) == 0) {
    /* The stream's last handle went meanwhile, on another thread, whose
     * release may have looked at the stream before it was marked: no
     * handle is left to end the capture with (its held objects could keep
     * the stream alive for ever).  Sequentially consistent: either that
     * release's hook sees the mark, or this sees its count. */
    cs_capture_discard(q);
    return cs_fail(CUSAFE_ERROR_INVALID_HANDLE,
                   "stream 0x%016llx was released while its capture began",
                   (unsigned long long)stream);
  }
  if (st == CUSAFE_SUCCESS)
    return CUSAFE_SUCCESS;
  capture_close(c);
  cs_gates_wait(); /* look-ups that found it are done with it */
  capture_free(c);
  return st;
}

/* Takes c off the list of open captures and its queues out of it. */
static void capture_close(struct cs_capture *c) {
  pthread_mutex_lock(&open_lock);
  struct cs_capture **p = &open_captures;
  while (*p && *p != c)
    p = &(*p)->next;
  if (*p) {
    *p = c->next;
    atomic_fetch_sub(&cs_hot.captures, 1);
  }
  pthread_mutex_unlock(&open_lock);
  for (size_t i = 0; i <= c->nmembers; i++) {
    struct cs_queue *q = i == 0 ? c->origin : c->members[i - 1];
    cs_spin_lock(&q->capture_lock);
    atomic_store(&q->capture, NULL);
    cs_spin_unlock(&q->capture_lock);
  }
}

/* Claims the end of the capture that began on q (the thread neither gated
 * nor pinned): marks its queues ending, then waits until the operations
 * that saw them capture have queued their work.  *out: the capture, or NULL
 * if q's capture did not begin on q (*origin: the stream it began on) or
 * q captures nothing that another thread is not beginning or ending. */
static void claim_end(struct cs_queue *q, struct cs_capture **out,
                      cusafe_handle *origin) {
  *out = NULL;
  *origin = CUSAFE_NULL_HANDLE;
  cs_spin_lock(&q->capture_lock);
  struct cs_capture *c = atomic_load(&q->capture);
  if (c && !marked(c) && c->origin != q)
    *origin = c->origin->owner->handle;
  else if (c && !marked(c))
    atomic_store(&q->capture, mark(c, CS_CAPTURE_ENDING));
  else
    c = NULL;
  cs_spin_unlock(&q->capture_lock);
  if (!c || *origin)
    return;
  pthread_mutex_lock(&c->lock); /* no queue joins from now on */
  atomic_store(&c->ending, true);
  for (size_t i = 0; i < c->nmembers; i++) {
    struct cs_queue *m = c->members[i];
    cs_spin_lock(&m->capture_lock);
    atomic_store(&m->capture, mark(c, CS_CAPTURE_ENDING));
    cs_spin_unlock(&m->capture_lock);
  }
  pthread_mutex_unlock(&c->lock);
  cs_gates_wait();
  *out = c;
}

/* CUDA could not end c (twice): its queues may all still capture, into
 * nothing (see cs_queue_leftover). */
static void mark_leftover(struct cs_capture *c) {
  unsigned long long id = c->cuda_id;
  if (!id) /* not known since the beginning: asked now */
    cuda_capture_id(c->origin->stream, &id);
  if (!id) /* CUDA cannot tell: whatever captures there is taken as it */
    id = CS_LEFTOVER_ANY;
  struct cs_object *origin = c->origin->owner;
  pthread_mutex_lock(&open_lock);
  leftover_add(&(struct leftover){c->origin->stream, id, c->origin->stream,
                                  NULL, c->origin, c->ctx, false});
  for (size_t i = 0; i < c->nmembers; i++) {
    struct cs_queue *m = c->members[i];
    struct leftover l = {m->stream,
                         id,
                         c->origin->stream,
                         cs_try_ref(origin) ? origin : NULL,
                         m,
                         c->ctx,
                         false};
    if (!leftover_add(&l) && l.holds)
      cs_unref(origin); /* not the last: the end holds it */
  }
  pthread_mutex_unlock(&open_lock);
}

/* After CUDA's capture has ended: c's queues leave it, and once the
 * threads that found it are done with it, it can be freed. */
static void capture_ended(struct cs_capture *c) {
  capture_close(c);
  cs_gates_wait();
}

/* Drops what a capture (or a graph) holds. */
static void drop_held(struct cs_object **held, size_t n) {
  for (size_t i = 0; i < n; i++)
    cs_unref(held[i]);
}

/* Sets what replays read of g in its handle slot, gs. */
static void graph_fill(struct cs_graph *g, struct cs_graph_slot *gs) {
  g->slot = gs;
  atomic_init(&gs->exec, NULL);
  gs->ctx = g->ctx;
  gs->nlasts = g->has_events ? UINT32_MAX : g->nroots;
  for (uint32_t i = 0; i < CS_SLOT_LASTS; i++)
    gs->lasts[i] = i < g->nroots ? g->lasts[i] : NULL;
}

/* A graph of the captured work, taking over what c holds; c is freed. */
static cusafe_status graph_new(cusafe_graph *out, struct cs_capture *c,
                               cudaGraph_t g) {
  struct cs_graph *gr = aligned_alloc(128, (sizeof *gr + 127) / 128 * 128);
  if (gr)
    memset(gr, 0, sizeof *gr);
  struct cs_buffer **roots = c->nuses ? malloc(c->nuses * sizeof *roots) : NULL;
  _Atomic(struct cs_queue *) **lasts = NULL;
  if (gr && c->nuses <= CS_GRAPH_LASTS)
    lasts = gr->lasts_here;
  else if (c->nuses)
    lasts = malloc(c->nuses * sizeof *lasts);
  cusafe_status st = CUSAFE_SUCCESS;
  if (!gr || (c->nuses && (!roots || !lasts))) {
    st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  } else {
    pthread_mutex_init(&gr->lock, NULL);
    gr->ctx = c->ctx;
    gr->graph = g;
    /* In lock order once, so that each replay's sort finds them sorted. */
    for (size_t i = 0; i < c->nuses; i++) {
      struct cs_buffer *r = c->uses[i].root;
      size_t j = i;
      for (; j > 0 && cs_root_before(r, roots[j - 1]); j--)
        roots[j] = roots[j - 1];
      roots[j] = r;
    }
    for (size_t i = 0; i < c->nuses; i++)
      lasts[i] = roots[i]->last;
    gr->roots = roots;
    gr->lasts = lasts;
    gr->nroots = (uint32_t)c->nuses;
    gr->held = c->held;
    gr->nheld = c->nheld;
    for (size_t i = 0; i < c->nheld; i++)
      gr->has_events |= c->held[i]->type == CS_EVENT;
    cs_ref(&c->ctx->hdr);
    gr->hdr.parent = &c->ctx->hdr;
    union cs_slot_data *data;
    st = cs_handle_claim(&gr->hdr, CS_GRAPH, &data);
    if (st == CUSAFE_SUCCESS) {
      graph_fill(gr, &data->graph);
      cs_handle_publish(&gr->hdr);
    } else {
      cs_unref(&c->ctx->hdr);
      pthread_mutex_destroy(&gr->lock);
    }
  }
  if (st != CUSAFE_SUCCESS) {
    if (!gr || lasts != gr->lasts_here)
      free(lasts);
    free(gr);
    free(roots);
    discard_graph(c->ctx, g);
    drop_held(c->held, c->nheld);
  } else {
    c->held = NULL; /* the graph's now */
    *out = gr->hdr.handle;
  }
  c->nheld = 0;
  capture_free(c);
  return st;
}

CUSAFE_API cusafe_status cusafe_stream_end_capture(cusafe_graph *out,
                                                   cusafe_stream stream) {
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  CS_HOLD_OR_RETURN(cs_stream, s, stream, CS_STREAM, "stream");
  struct cs_queue *q = &s->queue;
  struct cs_capture *c;
  cusafe_handle origin;
  claim_end(q, &c, &origin);
  if (origin)
    return cs_fail(CUSAFE_ERROR_CAPTURING,
                   "stream 0x%016llx joined a capture that began on stream "
                   "0x%016llx: end it there",
                   (unsigned long long)stream, (unsigned long long)origin);
  if (!c && (origin = origin_over(q->stream)) != CUSAFE_NULL_HANDLE)
    return cs_fail(CUSAFE_ERROR_CAPTURING,
                   "stream 0x%016llx shares its CUDA stream with a capture "
                   "that began on stream 0x%016llx: end it there",
                   (unsigned long long)stream, (unsigned long long)origin);
  if (!c)
    return cs_fail(CUSAFE_ERROR_CAPTURING, "stream 0x%016llx does not capture",
                   (unsigned long long)stream);
  /* The capture ends whatever fails: a failure discards its work. */
  int saved;
  cusafe_status st = cs_device_enter_teardown(q->ctx->device, &saved);
  cudaGraph_t g = NULL;
  cudaError_t err = cs_cu->stream_end_capture(q->stream, &g);
  if (err != cudaSuccess) {
    /* A stream that still captures would capture whatever comes next:
     * once more, discarding. */
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaGraph_t again = NULL;
    if ((cs_cu->stream_is_capturing(q->stream, &cs) != cudaSuccess ||
         cs != cudaStreamCaptureStatusNone) &&
        cs_cu->stream_end_capture(q->stream, &again) != cudaSuccess)
      mark_leftover(c);
    discard_graph(q->ctx, again);
  }
  cs_device_leave(saved);
  capture_ended(c);
  if (err != cudaSuccess)
    st = cs_fail_cuda(err, "cudaStreamEndCapture");
  if (st == CUSAFE_SUCCESS) /* the graph holds the stream it began on too */
    st = hold_locked(c, &s->hdr);
  if (st != CUSAFE_SUCCESS) {
    discard_graph(q->ctx, g);
    drop_held(c->held, c->nheld);
    capture_free(c);
  } else {
    st = graph_new(out, c, g);
  }
  cs_parked_drain(); /* the legacy stream may be touched again */
  return st;
}

CUSAFE_API cusafe_status cusafe_stream_is_capturing(int *out,
                                                    cusafe_stream stream) {
  CS_ENTER_OUT(out, 0);
  CS_HOLD_OR_RETURN(cs_stream, s, stream, CS_STREAM, "stream");
  struct cs_capture *c;
  while ((c = cs_queue_capture(&s->queue)) == CS_CAPTURE_BUSY)
    cs_capture_yield(); /* the answer once the change is done */
  *out = c != NULL;
  return CUSAFE_SUCCESS;
}

void cs_capture_discard(struct cs_queue *q) {
  /* A capture that another thread begins on q is waited for. */
  while ((uintptr_t)atomic_load(&q->capture) & CS_CAPTURE_BEGINNING)
    cs_capture_yield();
  struct cs_capture *c;
  cusafe_handle origin;
  claim_end(q, &c, &origin);
  if (!c)
    return;
  cudaGraph_t g = NULL;
  if (cs_cu->stream_end_capture(q->stream, &g) != cudaSuccess)
    mark_leftover(c);
  discard_graph(q->ctx, g);
  capture_ended(c);
  drop_held(c->held, c->nheld);
  capture_free(c);
}

void cs_captures_abort_all(void) {
  for (;;) {
    pthread_mutex_lock(&open_lock);
    struct cs_capture *c = open_captures;
    pthread_mutex_unlock(&open_lock);
    if (!c)
      return;
    int saved;
    cudaGraph_t g = NULL;
    if (cs_device_enter_teardown(c->ctx->device, &saved) == CUSAFE_SUCCESS) {
      /* Tried twice, as every end: one that stays would break the
       * devices' synchronisation and the streams' destruction. */
      if (cs_cu->stream_end_capture(c->origin->stream, &g) != cudaSuccess) {
        g = NULL;
        /* Left over where it fails again: the contexts' settling ends it
         * before their devices' synchronisation (cs_context_settle). */
        if (cs_cu->stream_end_capture(c->origin->stream, &g) != cudaSuccess)
          mark_leftover(c);
      }
      discard_graph(c->ctx, g);
      cs_device_leave(saved);
    }
    capture_close(c);
    /* The objects stay: the shutdown destroys them in order next. */
    capture_free(c);
  }
}

/* ---- graphs -------------------------------------------------------------- */

/* The executable graph, made at the first need (g's device current). */
static cusafe_status graph_exec(struct cs_graph *g, cudaGraphExec_t *out) {
  cudaGraphExec_t x = atomic_load_explicit(&g->exec, memory_order_acquire);
  if (CS_LIKELY(x)) {
    *out = x;
    return CUSAFE_SUCCESS;
  }
  pthread_mutex_lock(&g->lock);
  cusafe_status st = CUSAFE_SUCCESS;
  x = atomic_load(&g->exec);
  if (!x) {
    cudaError_t err = cs_cu->graph_instantiate(&x, g->graph, 0);
    if (err != cudaSuccess)
      st = cs_fail_cuda(err, "cudaGraphInstantiate");
    else {
      atomic_store_explicit(&g->exec, x, memory_order_release);
      atomic_store_explicit(&g->slot->exec, x, memory_order_release);
    }
  }
  pthread_mutex_unlock(&g->lock);
  *out = x;
  return st;
}

CUSAFE_API cusafe_status cusafe_graph_instantiate(cusafe_graph graph) {
  CS_ENTER();
  CS_HOLD_OR_RETURN(cs_graph, g, graph, CS_GRAPH, "graph");
  int saved;
  cusafe_status st = cs_device_enter(g->ctx->device, &saved);
  if (st == CUSAFE_SUCCESS) {
    cudaGraphExec_t x;
    st = graph_exec(g, &x);
    cs_device_leave(saved);
  }
  return st;
}

/* Remembers q among the queues g was replayed on, for a graph that holds
 * events (the thread pinned: q's owner may be as good as released, and
 * then the replay is refused). */
static cusafe_status remember_queue(struct cs_graph *g, struct cs_queue *q) {
  cusafe_status st = CUSAFE_SUCCESS;
  pthread_mutex_lock(&g->lock);
  size_t i = 0;
  while (i < g->nreplayed && g->replayed[i] != q)
    i++;
  if (i == g->nreplayed) {
    if (!grow((void **)&g->replayed, g->nreplayed, &g->cap_replayed,
              sizeof *g->replayed))
      st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
    else if (!cs_try_ref(q->owner))
      st = cs_fail(CUSAFE_ERROR_INVALID_HANDLE,
                   "stream 0x%016llx is stale: its object was released",
                   (unsigned long long)q->owner->handle);
    else
      g->replayed[g->nreplayed++] = q;
  }
  pthread_mutex_unlock(&g->lock);
  return st;
}

/* Room for a replay's buffers: on the stack for a graph of up to 16 (most),
 * else on the heap. */
struct replay_space {
  struct cs_buffer **roots;
  struct cs_object **drops;
  size_t ndrops;
  struct cs_buffer *roots_stack[16];
  struct cs_object *drops_stack[16];
};

/* Whether every buffer's latest operation is on q already (lasts: n
 * roots' `last`), as in a loop of replays on one stream: then a replay
 * takes no lock, as a launch (launch.c). */
static inline bool all_on(_Atomic(struct cs_queue *) *const *lasts, uint32_t n,
                          const struct cs_queue *q) {
  for (uint32_t i = 0; i < n; i++)
    if (atomic_load_explicit(lasts[i], memory_order_acquire) != q)
      return false;
  return true;
}

/* Replays x, g's executable graph, on q (whose CUDA stream is `stream`)
 * where all_on(lasts, g->nroots, q) (q's device current, the thread
 * pinned).  `lasts` is g's or its slot's. */
static inline cusafe_status
replay_unlocked(struct cs_graph *g, cudaGraphExec_t x, struct cs_queue *q,
                cudaStream_t stream, _Atomic(struct cs_queue *) *const *lasts,
                uint32_t n) {
  cudaError_t err = cs_cu->graph_launch(x, stream);
  if (CS_UNLIKELY(err != cudaSuccess))
    return cs_fail_cuda(err, "cudaGraphLaunch");
  if (n) {
    /* A buffer moved to another stream meanwhile is settled:
     * lib/README.md, "Buffers' chains of work". */
    atomic_thread_fence(memory_order_seq_cst);
    for (uint32_t i = 0; i < n; i++)
      if (CS_UNLIKELY(atomic_load_explicit(lasts[i], memory_order_relaxed) !=
                      q))
        cs_buffer_settle(g->roots[i], q);
  }
  return CUSAFE_SUCCESS;
}

/* Replays x, g's executable graph, on q (q's device current, the thread
 * pinned): its buffers' work chained onto q, all locked across the launch
 * unless it is there already, as a kernel launch does (launch.c).  What the
 * chains let go of is left in sp, to be dropped unpinned. */
static cusafe_status replay(struct cs_graph *g, cudaGraphExec_t x,
                            struct cs_queue *q, struct replay_space *sp) {
  if (CS_UNLIKELY(g->has_events)) {
    cusafe_status st = remember_queue(g, q);
    if (st != CUSAFE_SUCCESS)
      return st;
  }
  if (CS_LIKELY(all_on(g->lasts, g->nroots, q)))
    return replay_unlocked(g, x, q, q->stream, g->lasts, g->nroots);
  if (g->nroots > 16) {
    sp->roots = malloc(g->nroots * sizeof *sp->roots);
    sp->drops = malloc(g->nroots * sizeof *sp->drops);
    if (!sp->roots || !sp->drops)
      return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  }
  if (g->nroots)
    memcpy(sp->roots, g->roots, g->nroots * sizeof *sp->roots);
  size_t n = g->nroots;
  cusafe_status st = cs_roots_chain(sp->roots, &n, q, sp->drops, &sp->ndrops);
  if (st == CUSAFE_SUCCESS) {
    cudaError_t err = cs_cu->graph_launch(x, q->stream);
    if (err != cudaSuccess)
      st = cs_fail_cuda(err, "cudaGraphLaunch");
  }
  cs_roots_unlock(sp->roots, n);
  return st;
}

/* The replay without references: the graph and the stream are peeked at
 * (graphs, like streams, wait for the pins of replays in progress before
 * they go).  *cold: the graph has no executable form yet, nothing done. */
static cusafe_status launch_pinned(cusafe_graph graph, cusafe_stream stream,
                                   struct replay_space *sp, bool *cold) {
  struct cs_graph *g;
  cusafe_status st =
      cs_peek(graph, CS_GRAPH, "graph", -1, (struct cs_object **)&g);
  if (st != CUSAFE_SUCCESS)
    return st;
  cudaGraphExec_t x = atomic_load_explicit(&g->exec, memory_order_acquire);
  if (!x) {
    *cold = true;
    return CUSAFE_SUCCESS;
  }
  struct cs_queue *q = &g->ctx->queue;
  if (stream != CUSAFE_STREAM_DEFAULT) {
    struct cs_object *s;
    st = cs_peek(stream, CS_STREAM, "stream", -1, &s);
    if (st != CUSAFE_SUCCESS)
      return st;
    q = &((struct cs_stream *)s)->queue;
    if (q->ctx != g->ctx)
      return cs_mismatch("stream", q->ctx, "graph", g->ctx);
  }
  struct cs_capture *c = cs_queue_capture(q);
  if (c == CS_CAPTURE_BUSY)
    return CS_RETRY;
  if (c)
    return cs_capturing("a graph replay", q);
  if (CS_UNLIKELY(q->borrowed) && cs_queue_untouchable(q))
    return cs_untouchable_refuse("a graph replay", q);
  int saved;
  st = cs_device_enter(g->ctx->device, &saved);
  if (st == CUSAFE_SUCCESS) {
    /* A capture of cusafe's left over on q is ended first: the replay
     * would break it (cs_queue_leftover), as other work would. */
    if (cs_queue_has_leftover(q) &&
        (st = cs_queue_leftover(q)) == CUSAFE_SUCCESS &&
        CS_UNLIKELY(q->borrowed) && cs_queue_untouchable(q))
      /* the mark hid a capture of other code's, begun since its end */
      st = cs_untouchable_refuse("a graph replay", q);
    else if (st == CUSAFE_SUCCESS)
      st = replay(g, x, q, sp);
    cs_device_leave(saved);
  }
  return st;
}

/* The common replay, in few instructions and cache lines (between two
 * replays the driver's own work evicts much of what the last one read):
 * an executable graph of no events and up to CS_GRAPH_LASTS buffers,
 * replayed on a stream of one device while no capture is open (for a
 * stream that other code can reach -- a wrapper, or one handed out -- the
 * driver is asked whether it captures), whose
 * buffers' latest work is on that stream already.  It reads the graph and
 * the stream in their handle slots only (handle.h), and the graph's
 * buffers' `last` in theirs.  No capture open (cs_hot.captures, counted
 * from before a capture begins in CUDA to after it ends there) means that
 * the stream captures nothing either.
 * What launch_pinned() and replay() would do; CS_SLOW, with nothing done,
 * where anything else is needed. */
static inline cusafe_status replay_fast(cusafe_graph graph,
                                        cusafe_stream stream) {
  struct cs_object *g, *s;
  const union cs_slot_data *gd = cs_peek_data(graph, CS_GRAPH, &g);
  if (!gd || stream == CUSAFE_STREAM_DEFAULT)
    return CS_SLOW;
  const union cs_slot_data *sd = cs_peek_data(stream, CS_STREAM, &s);
  if (!sd)
    return CS_SLOW;
  cudaGraphExec_t x =
      atomic_load_explicit(&gd->graph.exec, memory_order_acquire);
  uint32_t n = gd->graph.nlasts;
  struct cs_queue *q = sd->stream.queue;
  if (!x || n > CS_GRAPH_LASTS || sd->stream.ctx != gd->graph.ctx ||
      !atomic_load_explicit(&cs_hot.single_device, memory_order_relaxed) ||
      atomic_load(&cs_hot.captures) ||
      atomic_load_explicit(&cs_leftover_streams, memory_order_relaxed))
    return CS_SLOW;
  /* A stream that other code may capture: unless the driver says, in one
   * call, that it captures nothing now, the slow path looks (a replay
   * into other code's capture breaks it).  A default stream's special
   * handle always goes there. */
  if (CS_UNLIKELY(
          atomic_load_explicit(&sd->stream.lent, memory_order_relaxed)) &&
      ((uintptr_t)sd->stream.stream <= (uintptr_t)cudaStreamPerThread ||
       !cs_stream_surely_free(sd->stream.stream)))
    return CS_SLOW;
  _Atomic(struct cs_queue *) *const *lasts =
      n <= CS_SLOT_LASTS ? gd->graph.lasts : ((struct cs_graph *)g)->lasts;
  if (!all_on(lasts, n, q))
    return CS_SLOW;
  return replay_unlocked((struct cs_graph *)g, x, q, sd->stream.stream, lasts,
                         n);
}

/* Every other replay: the first (which makes the executable graph), one
 * that meets a capture beginning or ending, and the rest of replay(). */
__attribute__((noinline, cold)) static cusafe_status
graph_launch_slow(cusafe_graph graph, cusafe_stream stream,
                  struct cs_thread *t) {
  for (bool made = false;;) {
    struct replay_space sp;
    sp.roots = sp.roots_stack;
    sp.drops = sp.drops_stack;
    sp.ndrops = 0;
    bool cold = false;
    cs_pin(t);
    cusafe_status st = launch_pinned(graph, stream, &sp, &cold);
    cs_unpin(t);
    for (size_t i = 0; i < sp.ndrops; i++)
      cs_unref(sp.drops[i]);
    if (sp.roots != sp.roots_stack)
      free(sp.roots);
    if (sp.drops != sp.drops_stack)
      free(sp.drops);
    if (CS_UNLIKELY(st == CS_RETRY)) { /* a capture begins or ends */
      cs_capture_yield();
      continue;
    }
    if (!cold || made)
      return st;
    /* The first replay makes the executable graph, holding the graph. */
    CS_HOLD_OR_RETURN(cs_graph, g, graph, CS_GRAPH, "graph");
    int saved;
    st = cs_device_enter(g->ctx->device, &saved);
    if (st == CUSAFE_SUCCESS) {
      cudaGraphExec_t x;
      st = graph_exec(g, &x);
      cs_device_leave(saved);
    }
    if (st != CUSAFE_SUCCESS)
      return st;
    made = true;
  }
}

CUSAFE_API CS_HOT cusafe_status cusafe_graph_launch(cusafe_graph graph,
                                                    cusafe_stream stream) {
  CS_ENTER();
  cs_pin(cs_call_);
  cusafe_status st = replay_fast(graph, stream);
  cs_unpin(cs_call_);
  if (CS_LIKELY(st != CS_SLOW))
    return st;
  return graph_launch_slow(graph, stream, cs_call_);
}

/* Destroys the executable graph (legal with replays queued: CUDA frees it
 * after them) and the graph (in relaxed capture mode, as every teardown:
 * handle.c, shutdown.c) -- also when the device cannot be made current.  One
 * that cannot be destroyed now is retried before the context goes, ahead of the
 * libraries whose kernels it launches. */
cusafe_status cs_graph_fini(struct cs_object *obj) {
  struct cs_graph *g = (struct cs_graph *)obj;
  int saved;
  cusafe_status st = cs_device_enter_teardown(g->ctx->device, &saved);
  cudaGraphExec_t x = atomic_load(&g->exec);
  cudaError_t err;
  if (x && (err = cs_cu->graph_exec_destroy(x)) != cudaSuccess) {
    cs_context_orphan_graph(g->ctx, NULL, x);
    if (st == CUSAFE_SUCCESS)
      st = cs_fail_cuda(err, "cudaGraphExecDestroy");
  }
  if ((err = cs_cu->graph_destroy(g->graph)) != cudaSuccess) {
    cs_context_orphan_graph(g->ctx, g->graph, NULL);
    if (st == CUSAFE_SUCCESS)
      st = cs_fail_cuda(err, "cudaGraphDestroy");
  }
  /* Its events go next: its replays, which wait for or record them, must
   * be done.  Where a replay's stream cannot be waited for now (a
   * capture forbids it), what the graph holds is kept until it can be. */
  for (size_t i = 0; i < g->nreplayed; i++) {
    bool park = false;
    err = cs_queue_wait_or_park(g->replayed[i], &park);
    if (cs_queue_wait_parks(park, err)) {
      cusafe_status pst = cs_park_drops(g->replayed[i], g->held, g->nheld);
      if (pst != CUSAFE_SUCCESS && st == CUSAFE_SUCCESS)
        st = pst;
    } else if (err != cudaSuccess && st == CUSAFE_SUCCESS) {
      st = cs_fail_cuda(err, "cudaStreamSynchronize");
    }
  }
  cs_device_leave(saved);
  return st;
}

/* What the graph held goes after it: its buffers' frees are ordered after
 * its replays (their chains end on the replays' streams). */
void cs_graph_free(struct cs_object *obj) {
  struct cs_graph *g = (struct cs_graph *)obj;
  drop_held(g->held, g->nheld);
  for (size_t i = 0; i < g->nreplayed; i++)
    cs_unref(g->replayed[i]->owner);
  free(g->replayed);
  free(g->held);
  free(g->roots);
  if (g->lasts != g->lasts_here)
    free(g->lasts);
  pthread_mutex_destroy(&g->lock);
  free(g);
}

void cs_graph_describe(const struct cs_object *obj, char *what, size_t size) {
  const struct cs_graph *g = (const struct cs_graph *)obj;
  snprintf(what, size, "device %d, %zu object%s held", g->ctx->device, g->nheld,
           g->nheld == 1 ? "" : "s");
}
