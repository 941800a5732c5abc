/* handle.h -- objects, their types and the handle table (handle.c;
 * invariant 1: reference counts; invariant 3: handles are checked, always).
 * Internal; never installed. */
#ifndef CUSAFE_HANDLE_H
#define CUSAFE_HANDLE_H

#include "calls.h"

/* ---- the object types ---------------------------------------------------- */

/* Every type of object, one row each, in the order in which the ordered
 * shutdown destroys them (shutdown.c): the users of memory and code first,
 * contexts last (invariant 5).  X(TYPE, name, article, peeked):
 *
 * TYPE: CS_<TYPE>, equal to the public CUSAFE_TYPE_<TYPE>.
 *
 * name: the type's word in messages and leak reports, and the middle of
 * the names of the three functions each type defines in its own file:
 * - cs_<name>_fini(obj) frees its CUDA resources: the first step of its
 *   destruction when the last reference went, and all that the ordered
 *   shutdown does to it (whose handle is then retired, its host memory
 *   left reachable);
 * - cs_<name>_free(obj), the rest of its destruction, after fini, drops
 *   what it holds but its parent (whose reference cs_unref() drops after
 *   it) and frees its memory;
 * - cs_<name>_describe(obj, what, size) words it for the leak report
 *   ("4096 bytes of device memory on device 0").
 *
 * article: "a buffer", as in "0x... is a stream, not a buffer".
 *
 * peeked: launches use it without a reference (calls.h, pins), so its
 * destruction waits for the pins of launches in progress.
 *
 * A new type is a CUSAFE_TYPE_ in cusafe.h, a row here, and its three
 * functions (lib/README.md, "Four questions"). */
#define CS_TYPE_MAP(X)                                                         \
  X(GRAPH, graph, "a graph", true)                                             \
  X(BUFFER, buffer, "a buffer", true)                                          \
  X(EVENT, event, "an event", false)                                           \
  X(STREAM, stream, "a stream", true)                                          \
  X(KERNEL, kernel, "a kernel", true)                                          \
  X(MODULE, module, "a module", false)                                         \
  X(CONTEXT, context, "a context", false)

#define CS_TYPE_ENUM(TYPE, name, article, peeked)                              \
  CS_##TYPE = CUSAFE_TYPE_##TYPE,
enum cs_type { CS_TYPE_MAP(CS_TYPE_ENUM) };
#undef CS_TYPE_ENUM
#define CS_TYPE_ONE(TYPE, name, article, peeked) +1
/* The types are numbered 1 to CS_TYPES. */
enum { CS_TYPES = 0 CS_TYPE_MAP(CS_TYPE_ONE) };
#undef CS_TYPE_ONE

/* The header of every object.  The reference count lives in the object's
 * table slot, next to the generation, so that a lookup can take a reference
 * only while the generation still matches. */
struct cs_object {
  cusafe_handle handle; /* its slot is the handle's */
  /* The object this one depends on, referenced: every child holds one
   * reference on its parent (invariant 1), dropped after the child's own
   * destruction (cs_unref).  A stream's, event's, module's and root
   * buffer's context, a view's buffer, a kernel's module; NULL for a
   * context. */
  struct cs_object *parent;
  enum cs_type type;
  _Atomic(char *) label; /* the caller's words, for the leak report */
};

#define CS_TYPE_FUNCTIONS(TYPE, name, article, peeked)                         \
  cusafe_status cs_##name##_fini(struct cs_object *obj);                       \
  void cs_##name##_free(struct cs_object *obj);                                \
  void cs_##name##_describe(const struct cs_object *obj, char *what,           \
                            size_t size);
CS_TYPE_MAP(CS_TYPE_FUNCTIONS)
#undef CS_TYPE_FUNCTIONS

/* The type's word: "buffer".  `type` is one of 1 to CS_TYPES. */
const char *cs_type_name(enum cs_type type);

/* ---- entering objects ---------------------------------------------------- */

/* Enters obj, its parent set, into the table with one reference and sets
 * obj->handle and obj->type.  Returns CUSAFE_ERROR_OUT_OF_MEMORY if the
 * table cannot grow. */
cusafe_status cs_handle_new(struct cs_object *obj, enum cs_type type);

/* What the hot paths read of an object, kept in its handle slot next to the
 * generation that they check, so that the object costs them one cache
 * line: set before the handle is published (cs_handle_claim) and constant
 * while it is live, except where said. */
struct cs_queue;
struct cs_context;
/* A buffer's, for launches (buffer.h). */
struct cs_buffer_slot {
  char *ptr;
  struct cs_context *ctx;
  struct cs_buffer *root;
  _Atomic(struct cs_queue *) *last;    /* the root's `last` */
  _Atomic(struct cs_queue *) own_last; /* where a root's `last` points;
                                        * changes with the root's chain */
};
/* A stream's, for replays (graph.c): its queue's. */
struct cs_stream_slot {
  struct cs_queue *queue;
  struct cs_context *ctx;
  struct CUstream_st *stream; /* the queue's cudaStream_t */
  /* The queue's `borrowed`: other code may capture the stream, so a
   * replay's fast path asks the driver first (graph.c, replay_fast). */
  _Atomic bool lent;
};
/* How many buffers a graph's slot names itself (the bench's graphs, and
 * most others, use one or two). */
#define CS_SLOT_LASTS 2
/* A graph's, for replays (graph.c): what replay_fast() needs. */
struct cs_graph_slot {
  /* Its executable graph (a cudaGraphExec_t), NULL until it is made: set
   * once, after the graph's own `exec`. */
  _Atomic(struct CUgraphExec_st *) exec;
  struct cs_context *ctx;
  /* The graph's buffers (nroots), their roots' `last` in `lasts` where
   * there are up to CS_SLOT_LASTS, else in the graph; UINT32_MAX where a
   * replay cannot take the fast path (events among what it holds). */
  uint32_t nlasts;
  _Atomic(struct cs_queue *) *lasts[CS_SLOT_LASTS];
};
union cs_slot_data {
  struct cs_buffer_slot buffer;
  struct cs_stream_slot stream;
  struct cs_graph_slot graph;
};
/* cs_handle_new() in two steps, for an object whose slot carries data:
 * claims a slot for obj (its handle set, not yet live) and returns the
 * slot's data to fill; cs_handle_publish() then makes the handle live. */
cusafe_status cs_handle_claim(struct cs_object *obj, enum cs_type type,
                              union cs_slot_data **out);
void cs_handle_publish(struct cs_object *obj);

/* ---- checked lookups ----------------------------------------------------- */

/* Looks up `handle`, checks that it is live and of `type` (0: any type),
 * and takes a reference that the caller drops with cs_unref().  `name` is
 * the parameter's name for the message. */
cusafe_status cs_acquire(cusafe_handle handle, enum cs_type type,
                         const char *name, struct cs_object **out);
/* cs_acquire() of the index-th element of a list named `name` ("buffers
 * 2" in messages). */
cusafe_status cs_acquire_at(cusafe_handle handle, enum cs_type type,
                            const char *name, long index,
                            struct cs_object **out);
/* cs_acquire() into a pointer to the object's own structure. */
#define CS_ACQUIRE(handle, type, name, out)                                    \
  cs_acquire((handle), (type), (name), (struct cs_object **)(out))

/* A variable of a call that holds a reference on the object it points to
 * (its structure starts with the header): cs_unref() when the variable
 * goes out of scope, whatever the path, unless it was set to NULL first --
 * the reference handed on (to a new child, say). */
#define CS_HELD __attribute__((cleanup(cs_drop)))
void cs_drop(void *held);
/* Declares `struct T *var` CS_HELD, holding `h` acquired as TYPE (NAME in
 * messages) for the rest of the call; returns the failure from the calling
 * function otherwise. */
#define CS_HOLD_OR_RETURN(T, var, h, TYPE, NAME)                               \
  struct T *var CS_HELD = NULL;                                                \
  do {                                                                         \
    cusafe_status cs_held_ = CS_ACQUIRE(h, TYPE, NAME, &var);                  \
    if (CS_UNLIKELY(cs_held_ != CUSAFE_SUCCESS))                               \
      return cs_held_;                                                         \
  } while (0)
/* Checks `handle` as cs_acquire() does, for a `type` other than 0, but
 * takes no reference: for a pinned thread only (cs_pin), until cs_unpin().
 * `index` >= 0 names the index-th element of a list. */
cusafe_status cs_peek(cusafe_handle handle, enum cs_type type, const char *name,
                      long index, struct cs_object **out) CS_HOT;
/* The fast form of cs_peek(), for the hot paths: the data in the slot of
 * `handle` (and *obj, its object) if the handle is live and of `type`,
 * else NULL, with no message: the caller then takes the path that
 * explains.  For a pinned thread only. */
const union cs_slot_data *cs_peek_data(cusafe_handle handle, enum cs_type type,
                                       struct cs_object **obj) CS_HOT;
/* cs_peek() of a buffer that is the index-th argument of a launch: *out
 * is what the launch reads of it, in the buffer's handle slot. */
cusafe_status cs_peek_buffer(cusafe_handle handle, long index,
                             const struct cs_buffer_slot **out) CS_HOT;

/* Defines the public query `fn`: it opens the call (*out = `empty` unless
 * it succeeds), holds the handle `h` as a `struct T *o` of type TYPE
 * (named NAME in messages), and runs the statements `...`, which read o,
 * set *out and may set the status `st`. */
#define CS_QUERY(fn, out_type, empty, T, TYPE, NAME, ...)                      \
  CUSAFE_API cusafe_status fn(out_type *out, cusafe_handle h) {                \
    CS_ENTER_OUT(out, empty);                                                  \
    CS_HOLD_OR_RETURN(T, o, h, TYPE, NAME);                                    \
    cusafe_status st = CUSAFE_SUCCESS;                                         \
    __VA_ARGS__;                                                               \
    return st;                                                                 \
  }

/* ---- references ---------------------------------------------------------- */

/* Adds a reference to a live object the caller already holds. */
void cs_ref(struct cs_object *obj);
/* Adds a reference to an object the caller only peeked at, unless its last
 * reference has gone already. */
bool cs_try_ref(struct cs_object *obj);
/* Adds a reference handed to the caller unless the object is already being
 * destroyed. */
bool cs_try_user_ref(struct cs_object *obj);
/* Adds a reference handed to the caller (the handle becomes, or stays,
 * valid); used where a call returns an existing object. */
cusafe_status cs_user_ref(struct cs_object *obj);
/* Drops a reference; the last one destroys the object (cs_<name>_fini,
 * cs_<name>_free), retires its slot and drops its reference on its parent.
 * Returns the status of the destruction. */
cusafe_status cs_unref(struct cs_object *obj);
/* The references the caller holds on obj (a sequentially consistent
 * load). */
uint32_t cs_user_refs(const struct cs_object *obj);
/* Called, when set, with a stream whose caller's last reference has just
 * been released, by the release that released it (the object held by that
 * release meanwhile; exactly one release sees the caller's count reach 0):
 * set at the first capture (graph.c), which ends when the last handle of
 * its stream goes. */
typedef void (*cs_last_user_fn)(struct cs_object *obj);
extern _Atomic(cs_last_user_fn) cs_last_user_hook;

/* ---- the shutdown -------------------------------------------------------- */

/* Calls fn on every live object of `type`, in slot order.  Used only by the
 * shutdown, which has stopped every other caller first. */
void cs_handle_foreach(enum cs_type type, void (*fn)(struct cs_object *obj));
/* Retires obj's handle without running the destructor (shutdown). */
void cs_handle_kill(struct cs_object *obj);

#endif /* CUSAFE_HANDLE_H */
