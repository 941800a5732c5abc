/* graph.h -- stream capture and graphs (graph.c): captured work keeps
 * everything it uses alive for as long as the graph and its replays need
 * it (invariant 2), and cusafe's own bookkeeping stays out of captures.
 * Internal; never installed. */
#ifndef CUSAFE_GRAPH_H
#define CUSAFE_GRAPH_H

#include <pthread.h>

#include "buffer.h"

/* One capture, from cusafe_stream_begin_capture() to its end.  Its queues
 * (the origin and the streams that joined) point at it (cs_queue.capture)
 * while it lasts. */
struct cs_capture {
  uint64_t id; /* unique, never 0: what an event recorded in it keeps */
  /* CUDA's id of it (cudaStreamGetCaptureInfo), 0 if CUDA could not tell:
   * what a failed end marks as left over (cs_queue_leftover). */
  unsigned long long cuda_id;
  /* Set (under `lock`) once a thread has claimed its end: no queue joins
   * it any more. */
  _Atomic bool ending;
  struct cs_queue *origin;
  struct cs_context *ctx;
  pthread_mutex_t lock; /* guards everything below */
  /* What the captured work used, each referenced once (cs_ref). */
  struct cs_object **held;
  size_t nheld, cap_held;
  /* Each buffer's root and the queue of its latest captured use. */
  struct cs_capture_use {
    struct cs_buffer *root;
    struct cs_queue *q;
  } * uses;
  size_t nuses, cap_uses;
  /* Events cusafe recorded in the capture to order its queues; destroyed
   * when it ends. */
  cudaEvent_t *events;
  size_t nevents, cap_events;
  /* The queues that joined (not the origin); grown under the list's lock
   * too, which look-ups by CUDA stream hold. */
  struct cs_queue **members;
  size_t nmembers, cap_members;
  struct cs_capture *next; /* in the list of open captures */
};

/* What a replay reads comes first, in the object's first cache line (the
 * object is aligned to two): between two replays the driver's own work
 * evicts much of what the last one read. */
#define CS_GRAPH_LASTS 8
struct cs_graph {
  struct cs_object hdr; /* parent: the context */
  _Atomic(cudaGraphExec_t) exec;
  struct cs_context *ctx;
  /* The buffers among `held`, for replays: their roots' `last`, in their
   * handle slots. */
  _Atomic(struct cs_queue *) **lasts;
  uint32_t nroots;
  /* Events among `held`: their destruction does not wait for replays, so
   * the queues the graph was replayed on are remembered (their owners
   * referenced, under `lock`) and waited for before the events go. */
  bool has_events;
  /* ---- the first line ends here ---- */
  /* `lasts` of a graph of up to CS_GRAPH_LASTS buffers (most): the line
   * next to the first, which the processor fetches with it. */
  _Alignas(64) _Atomic(struct cs_queue *) *lasts_here[CS_GRAPH_LASTS];
  struct cs_buffer **roots; /* in lock order */
  cudaGraph_t graph;
  /* What the common replay reads of it, in its handle slot (handle.h). */
  struct cs_graph_slot *slot;
  pthread_mutex_t lock;    /* guards the instantiation and `replayed` */
  struct cs_object **held; /* referenced */
  size_t nheld;
  struct cs_queue **replayed;
  size_t nreplayed, cap_replayed;
};
_Static_assert(offsetof(struct cs_graph, has_events) < 64,
               "what a replay reads of a graph is in one line");

/* Chains root's next captured operation on q, a queue of capture c
 * (root's lock held; the thread may be pinned): c holds root from now on,
 * and the operation comes after root's previous captured one. */
cusafe_status cs_capture_use(struct cs_capture *c, struct cs_buffer *root,
                             struct cs_queue *q);
/* Makes capture c hold obj (a live object: the caller holds or peeked at
 * it), once. */
cusafe_status cs_capture_hold(struct cs_capture *c, struct cs_object *obj);
/* q, marked joining (cs_queue_mark_joining) and waited for by the gates,
 * joins capture c by waiting for ev, recorded in it (q's device current):
 * its work so far is recorded first (entry), for work outside to wait
 * for.  CS_RETRY if c ends meanwhile. */
cusafe_status cs_capture_join(struct cs_capture *c, struct cs_queue *q,
                              cudaEvent_t ev);
/* A queue's capture pointer while the queue is about to join a capture:
 * marked, with no capture (cs_queue_capture() gives CS_CAPTURE_BUSY). */
#define CS_CAPTURE_JOINING ((struct cs_capture *)CS_CAPTURE_BEGINNING)
/* Marks q, which captures nothing, as about to join a capture (the thread
 * gated): false if another thread changes q's capture meanwhile. */
bool cs_queue_mark_joining(struct cs_queue *q);
/* Takes the mark back unless the join happened. */
void cs_queue_unmark_joining(struct cs_queue *q);
/* An open capture of ctx (NULL: any), CS_CAPTURE_BUSY if one of them
 * begins or ends meanwhile, or NULL. */
struct cs_capture *cs_capture_open_in(const struct cs_context *ctx);
/* Whether the capture of that id is open (or ending). */
bool cs_capture_open(uint64_t id);
/* The open capture of that id, CS_CAPTURE_BUSY if it is ending, or NULL.
 * The capture stays valid until the thread's gate ends. */
struct cs_capture *cs_capture_find(uint64_t id);
/* Ends the capture that began on q, if one did, discarding its work and
 * releasing what it held: the last release of that stream (q's device
 * current; the thread neither gated nor pinned).  A capture beginning on
 * another thread meanwhile is waited for. */
void cs_capture_discard(struct cs_queue *q);
/* Ends the capture of cusafe's that may still run on `stream`, its end
 * having failed (cs_queue_has_leftover), discarding it (ctx: the stream's,
 * for the graph), where it began; true if it runs there no more.  A
 * capture that began there since is left alone. */
bool cs_leftover_end(cudaStream_t stream, struct cs_context *ctx);
/* The same for q, or fails with CUSAFE_ERROR_CAPTURING -- work recorded
 * on it would be captured into nothing, and a stream that waited for it
 * would join that capture. */
cusafe_status cs_queue_leftover(struct cs_queue *q);
/* Ends what may still capture in ctx, its ends having failed, where it
 * can: false if something may still capture (no lock held, or only those
 * cs_queue_leftover may be called under).  Captures left over on streams
 * of other libraries that no wrapper holds any more are not touched: their
 * owners may have destroyed them. */
bool cs_context_try_leftovers(struct cs_context *ctx);
/* ctx goes (its streams are gone): what may still capture in it, its
 * ends having failed, is ended if it can be, and forgotten. */
void cs_context_end_leftovers(struct cs_context *ctx);
/* q goes: the holds of the leftover entries it made go with it, and, if
 * its CUDA stream was `destroyed`, every entry of that stream. */
void cs_queue_forget_leftover(struct cs_queue *q, bool destroyed);
/* Ends every open capture, discarding its work: the first step of the
 * ordered shutdown. */
void cs_captures_abort_all(void);
/* CUSAFE_ERROR_CAPTURING: "<what> cannot ... : stream 0x... is capturing". */
cusafe_status cs_capturing(const char *what, const struct cs_queue *q)
    __attribute__((cold));

#endif /* CUSAFE_GRAPH_H */
