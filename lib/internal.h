/* internal.h -- shared definitions of the library; never installed. */
#ifndef CUSAFE_INTERNAL_H
#define CUSAFE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cusafe.h"
#include "cuda_api.h"

/* The functions of a launch: kept together (.text.hot), so that a launch
 * right after the driver's own work fetches few lines and pages of code. */
#define CS_HOT __attribute__((hot))
#define CS_LIKELY(x) __builtin_expect(!!(x), 1)
#define CS_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- errors (error.c) ---------------------------------------------------- */

/* Records `status` with a printf-style message for the calling thread and
 * returns status; the CUDA error of the thread is set to 0. */
/* Errors are the exception: cold, so that the compiler lays the paths to
 * them out of the way of the common ones. */
cusafe_status cs_fail(cusafe_status status, const char *fmt, ...)
    __attribute__((cold, format(printf, 2, 3)));
/* Records a failed CUDA call: "<function> failed: <CUDA's words>", maps err
 * to a status and returns it. */
cusafe_status cs_fail_cuda(cudaError_t err, const char *function)
    __attribute__((cold));
/* Sets the calling thread's last CUDA error (after cs_fail). */
void cs_note_cuda_error(cudaError_t err);
/* The status a CUDA error maps to. */
cusafe_status cs_status_of(cudaError_t err);

/* ---- objects and the handle table (handle.c) ------------------------------ */

enum cs_type {
  CS_CONTEXT = CUSAFE_TYPE_CONTEXT,
  CS_STREAM = CUSAFE_TYPE_STREAM,
  CS_EVENT = CUSAFE_TYPE_EVENT,
  CS_BUFFER = CUSAFE_TYPE_BUFFER,
  CS_MODULE = CUSAFE_TYPE_MODULE,
  CS_KERNEL = CUSAFE_TYPE_KERNEL
};
#define CS_TYPE_LAST CS_KERNEL

struct cs_slot;

/* The header of every object.  The reference count lives in the object's
 * table slot, next to the generation, so that a lookup can take a reference
 * only while the generation still matches (invariant 3). */
struct cs_object {
  struct cs_slot *slot;
  cusafe_handle handle;
  enum cs_type type;
  _Atomic(char *) label; /* the caller's words, for the leak report */
};

/* Enters obj into the table with one reference and sets obj->handle.
 * Returns CUSAFE_ERROR_OUT_OF_MEMORY if the table cannot grow. */
cusafe_status cs_handle_new(struct cs_object *obj, enum cs_type type);
struct cs_buffer;
struct cs_buffer_slot;
/* Enters a buffer as cs_handle_new() does, with what launches read of it
 * in its slot (struct cs_buffer_slot); a root's `last` moves there. */
cusafe_status cs_handle_new_buffer(struct cs_buffer *b);
/* Looks up `handle`, checks that it is live and of `type` (0: any type),
 * and takes a reference that the caller drops with cs_unref().  `name` is
 * the parameter's name for the message. */
cusafe_status cs_acquire(cusafe_handle handle, enum cs_type type,
                         const char *name, struct cs_object **out);
/* Checks `handle` as cs_acquire() does, for a `type` other than 0, but
 * takes no reference: for a pinned thread only (cs_pin), until cs_unpin().
 * `index` >= 0 names the index-th element of a list. */
cusafe_status cs_peek(cusafe_handle handle, enum cs_type type,
                      const char *name, long index,
                      struct cs_object **out) CS_HOT;
/* cs_peek() of a buffer that is the index-th argument of a launch: *out
 * is what the launch reads of it, in the buffer's handle slot. */
cusafe_status cs_peek_buffer(cusafe_handle handle, long index,
                             const struct cs_buffer_slot **out) CS_HOT;
/* Adds a reference to a live object the caller already holds. */
void cs_ref(struct cs_object *obj);
/* Adds a reference to an object the caller only peeked at, unless its last
 * reference has gone already. */
bool cs_try_ref(struct cs_object *obj);
/* Adds a reference handed to the caller unless the object is already being
 * destroyed. */
bool cs_try_user_ref(struct cs_object *obj);
/* Drops a reference; the last one destroys the object (cs_destroy) and
 * retires its slot.  Returns the status of the destruction. */
cusafe_status cs_unref(struct cs_object *obj);
/* Calls fn on every live object of `type`, in slot order.  Used only by the
 * shutdown, which has stopped every other caller first. */
void cs_handle_foreach(enum cs_type type,
                       void (*fn)(struct cs_object *obj, void *arg),
                       void *arg);
/* The references the caller holds on obj. */
uint32_t cs_user_refs(const struct cs_object *obj);
/* Retires a slot without running the destructor (shutdown). */
void cs_handle_kill(struct cs_object *obj);
/* Adds a reference handed to the caller (the handle becomes, or stays,
 * valid); used where a call returns an existing object. */
cusafe_status cs_user_ref(struct cs_object *obj);
/* Destroys an object whose last reference went: per type. */
cusafe_status cs_destroy(struct cs_object *obj);

/* ---- the library's state (runtime.c) ------------------------------------- */

enum cs_state { CS_RUNNING = 0, CS_SHUT_DOWN = 1, CS_FORKED = 2 };

/* What every call reads, in one cache line. */
struct cs_hot {
  _Atomic int state; /* enum cs_state */
  /* 1 once the shutdown can make every thread's marks visible with one
   * membarrier() call: calls then need only a compiler barrier. */
  _Atomic int light_calls;
  /* 1 when the process sees one device, which is then always current. */
  _Atomic int single_device;
  /* The handle table's slots ever handed out (handle.c). */
  _Atomic uint32_t handles;
};
extern struct cs_hot cs_hot;

/* Fails with SHUTDOWN or FORKED unless the library is running. */
cusafe_status cs_state_error(void) __attribute__((cold));

/* Every thread that calls into cusafe has a record that says whether it is
 * inside a call, so that the shutdown can wait for calls in progress on
 * other threads before it destroys what they use (a daemon thread at exit).
 * Only the owning thread writes `depth`; the shutdown reads it. */
struct cs_thread {
  /* One cache line of its own (no false sharing with other records),
   * which is all that a call and a launch touch of the record. */
  _Alignas(64) _Atomic int depth;
  _Atomic int in_use;
  bool shared; /* the record of threads that could not get their own */
  struct cs_thread *next;
  /* Launches in progress that use objects without references (cs_pin):
   * the count of pins begun and ended. */
  _Atomic unsigned long pins_begun;
  _Atomic unsigned long pins_ended;
};
_Static_assert(sizeof(struct cs_thread) == 64, "a thread's record is a line");
/* initial-exec: one pointer, read on every call without __tls_get_addr. */
extern __thread struct cs_thread *cs_tls_thread
    __attribute__((tls_model("initial-exec")));
struct cs_thread *cs_thread_register(void);

static inline struct cs_thread *cs_call_enter(void) {
  struct cs_thread *t = cs_tls_thread;
  if (CS_UNLIKELY(!t))
    t = cs_thread_register();
  atomic_store_explicit(&t->depth,
                        atomic_load_explicit(&t->depth, memory_order_relaxed) + 1,
                        memory_order_relaxed);
  /* Orders the mark before the state check, against the shutdown's store
   * of the state before its scan of the marks: a full fence, or, where the
   * shutdown issues membarrier() between the two, only a compiler barrier
   * (the scheme of liburcu's membarrier flavour). */
  if (CS_LIKELY(atomic_load_explicit(&cs_hot.light_calls, memory_order_relaxed)))
    atomic_signal_fence(memory_order_seq_cst);
  else
    atomic_thread_fence(memory_order_seq_cst);
  return t;
}

static inline void cs_call_leave(struct cs_thread **t) {
  atomic_store_explicit(&(*t)->depth,
                        atomic_load_explicit(&(*t)->depth, memory_order_relaxed) - 1,
                        memory_order_release);
}

/* Opens a public call: marks the thread busy until the function returns
 * (whatever the path), and refuses the call after shutdown or in a forked
 * child. */
#define CS_ENTER()                                                           \
  struct cs_thread *cs_call_ __attribute__((cleanup(cs_call_leave))) =      \
      cs_call_enter();                                                       \
  (void)cs_call_;                                                            \
  if (CS_UNLIKELY(atomic_load_explicit(&cs_hot.state, memory_order_relaxed)))    \
  return cs_state_error()
/* Releases are silent no-ops after shutdown and in a forked child. */
#define CS_ENTER_RELEASE()                                                   \
  struct cs_thread *cs_call_ __attribute__((cleanup(cs_call_leave))) =      \
      cs_call_enter();                                                       \
  (void)cs_call_;                                                            \
  if (CS_UNLIKELY(atomic_load_explicit(&cs_hot.state, memory_order_relaxed)))    \
  return CUSAFE_SUCCESS

/* Pins: a launch looks its kernel, stream and buffers up without taking
 * references (two atomic operations each), which would cost more than the
 * safety checks themselves.  Instead it pins its thread first; a kernel,
 * stream or buffer whose last reference goes waits, before it is destroyed,
 * for the pins that had begun by then to end (cs_pins_wait()).  The pin is
 * a sequentially consistent store, and so is the drop of the last
 * reference: either the launch sees the handle stale, or the destructor
 * sees the pin.  A pinned thread must not drop references (its own
 * destructor would wait for it) nor wait for anything that a thread
 * dropping one may hold: it takes only the buffers' spinlocks, and drops
 * what it must after cs_unpin(). */
static inline void cs_pin(struct cs_thread *t) {
  if (CS_UNLIKELY(t->shared))
    atomic_fetch_add(&t->pins_begun, 1);
  else
    atomic_store(&t->pins_begun,
                 atomic_load_explicit(&t->pins_begun, memory_order_relaxed) +
                     1);
}
static inline void cs_unpin(struct cs_thread *t) {
  if (CS_UNLIKELY(t->shared))
    atomic_fetch_add_explicit(&t->pins_ended, 1, memory_order_release);
  else
    atomic_store_explicit(
        &t->pins_ended,
        atomic_load_explicit(&t->pins_ended, memory_order_relaxed) + 1,
        memory_order_release);
}
/* Waits until every other thread's pins begun before the call have ended. */
void cs_pins_wait(void);

/* Initialises CUDA on first use (and registers the exit handler right after
 * the first successful CUDA call); stores the device count. */
cusafe_status cs_init(int *device_count);
/* The primary context, through the driver's entry points. */
CUresult cs_primary_ctx_retain(CUcontext *ctx, int device);
CUresult cs_primary_ctx_release(int device);
/* Loads a library into the calling thread's current context now: CUDA
 * loads lazily, and accepts a corrupt image until its first use. */
CUresult cs_library_load_now(cudaLibrary_t library);

/* Makes `device` current for the calling thread; *saved receives the device
 * to restore with cs_device_leave() (-1: nothing to restore). */
cusafe_status cs_device_switch(int device, int *saved);
static inline cusafe_status cs_device_enter(int device, int *saved) {
  if (CS_LIKELY(atomic_load_explicit(&cs_hot.single_device,
                                     memory_order_relaxed))) {
    *saved = -1;
    return CUSAFE_SUCCESS;
  }
  return cs_device_switch(device, saved);
}
static inline void cs_device_leave(int saved) {
  if (CS_UNLIKELY(saved >= 0))
    cs_cu->set_device(saved);
}
/* cs_device_enter() for a teardown that must synchronise the right device
 * before it frees: a failure is tried once more. */
cusafe_status cs_device_enter_teardown(int device, int *saved);

/* Initialises, then checks that `device` exists. */
cusafe_status cs_check_device(int device, int *count);

/* Checks that [offset, offset + size) lies within `limit` bytes. */
cusafe_status cs_check_range(const char *what, const char *which,
                             size_t offset, size_t size, size_t limit);

/* ---- contexts and streams ------------------------------------------------- */

struct cs_context;

/* A CUDA stream as buffers see it: a user stream or a context's default
 * stream.  `owner` is the object that keeps it alive (the stream object or
 * the context). */
struct cs_queue {
  cudaStream_t stream;
  struct cs_context *ctx;
  struct cs_object *owner;
  /* Recorded to hand work over to another stream; created on first need. */
  _Atomic(cudaEvent_t) handoff;
};

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
  /* Libraries whose unload failed, retried before the primary context is
   * released (under orphan_lock). */
  pthread_mutex_t orphan_lock;
  cudaLibrary_t *orphans;
  size_t norphans;
};

struct cs_stream {
  struct cs_object hdr;
  struct cs_queue queue; /* queue.ctx holds a reference */
};

struct cs_event {
  struct cs_object hdr;
  struct cs_context *ctx;
  cudaEvent_t event;
  unsigned int flags;
};

/* The lock of an allocation's chain of work: held for the few
 * instructions that enqueue one operation, so a spinlock (whose release is
 * a plain store) is cheaper than a mutex; a long wait yields. */
typedef struct {
  atomic_flag held;
} cs_spinlock;
#define CS_SPINLOCK_INIT {ATOMIC_FLAG_INIT}
void cs_spin_wait(cs_spinlock *l);
static inline void cs_spin_lock(cs_spinlock *l) {
  if (CS_UNLIKELY(atomic_flag_test_and_set_explicit(&l->held,
                                                    memory_order_acquire)))
    cs_spin_wait(l);
}
static inline void cs_spin_unlock(cs_spinlock *l) {
  atomic_flag_clear_explicit(&l->held, memory_order_release);
}

struct cs_buffer {
  struct cs_object hdr;
  struct cs_buffer *root;   /* the allocation (itself for a root buffer) */
  struct cs_context *ctx;   /* referenced by the root only */
  char *ptr;                /* first byte of this buffer or view */
  /* Root only: work on the memory is chained across streams; `*last` is
   * the queue of the latest operation (its owner referenced).  It changes
   * under `lock` only, and is CS_QUEUE_MOVING while a change is recorded;
   * launches read it without the lock (kernel.c).  It lives in the root's
   * handle slot (cs_handle_new_buffer), or in `early_last` until then. */
  _Atomic(struct cs_queue *) *last;
  cs_spinlock lock;
  cusafe_memory kind;
  struct cs_buffer *parent; /* a view's parent, referenced; NULL for a root */
  size_t size;
  _Atomic(struct cs_queue *) early_last;
};

/* What a launch reads of a buffer, in the buffer's handle slot next to the
 * generation that the launch checks, so that a buffer argument costs one
 * cache line: set before the handle is published and constant while it is
 * live, except a root's `own_last`. */
struct cs_buffer_slot {
  char *ptr;
  struct cs_context *ctx;
  struct cs_buffer *root;
  _Atomic(struct cs_queue *) *last;   /* the root's `last` */
  _Atomic(struct cs_queue *) own_last; /* where a root's `last` points */
};

/* The order in which buffers' roots are locked, the same for every
 * caller: by their handles' slots, which, unlike the objects' addresses,
 * a program's runs assign alike, so that a launch or copy that locks
 * several roots makes its CUDA calls in the same order every time. */
static inline bool cs_root_before(const struct cs_buffer *a,
                                  const struct cs_buffer *b) {
  return (uintptr_t)a->hdr.slot < (uintptr_t)b->hdr.slot;
}

/* The value of a root's `last` while it changes. */
extern struct cs_queue cs_queue_moving;
#define CS_QUEUE_MOVING (&cs_queue_moving)

struct cs_module {
  struct cs_object hdr;
  struct cs_context *ctx; /* referenced */
  cudaLibrary_t library;
  char *name;             /* for messages: a path, a program, "<...>" */
};

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
  int max_threads;          /* per block, for this kernel */
  int max_block[3], max_grid[3];
  uint32_t shared_limit;    /* dynamic shared memory per block, at most */
  /* The dynamic shared memory the kernel is currently allowed (raised on
   * demand by launches). */
  _Atomic uint32_t dynamic_limit;
  /* Per parameter, the fixed-size kinds of argument of its size: bit k
   * for cusafe_arg_kind k (cs_kernel_kinds). */
  union {
    uint16_t inline_[CS_INLINE_PARAMS]; /* nparams <= CS_INLINE_PARAMS */
    uint16_t *heap;                     /* more: malloc'd */
  } param_kinds;
  uint16_t *param_size;     /* each parameter's bytes (1 to 65 535) */
  struct cs_module *module; /* referenced */
  char *name;
  size_t static_shared;
  pthread_mutex_t limit_lock;
};
_Static_assert(offsetof(struct cs_kernel, param_size) == 128,
               "a launch reads two cache lines of a kernel");

/* The size an argument of `kind` passes, or 0 for bytes (which say their
 * size) and unknown kinds.  The sizes of kinds 1 to 11 are the nibbles of
 * one constant: no table to load. */
#define CS_KIND_SIZES                                                        \
  ((uint64_t)8 << 4 * CUSAFE_ARG_BUFFER | (uint64_t)1 << 4 * CUSAFE_ARG_I8 |  \
   (uint64_t)1 << 4 * CUSAFE_ARG_U8 | (uint64_t)2 << 4 * CUSAFE_ARG_I16 |     \
   (uint64_t)2 << 4 * CUSAFE_ARG_U16 | (uint64_t)4 << 4 * CUSAFE_ARG_I32 |    \
   (uint64_t)4 << 4 * CUSAFE_ARG_U32 | (uint64_t)8 << 4 * CUSAFE_ARG_I64 |    \
   (uint64_t)8 << 4 * CUSAFE_ARG_U64 | (uint64_t)4 << 4 * CUSAFE_ARG_F32 |    \
   (uint64_t)8 << 4 * CUSAFE_ARG_F64)
_Static_assert(sizeof(void *) == 8, "buffers pass 8-byte addresses");
_Static_assert(CUSAFE_ARG_F64 < 16 && CUSAFE_ARG_BYTES < 16,
               "kinds fit the nibbles of CS_KIND_SIZES and 16-bit masks");
static inline size_t cs_kind_size(unsigned kind) {
  return kind < 16 ? (CS_KIND_SIZES >> 4 * kind) & 0xF : 0;
}

/* The kinds of argument that each parameter of k accepts. */
static inline const uint16_t *cs_kernel_kinds(const struct cs_kernel *k) {
  return k->nparams <= CS_INLINE_PARAMS ? k->param_kinds.inline_
                                        : k->param_kinds.heap;
}

cusafe_status cs_context_destroy(struct cs_context *ctx);
cusafe_status cs_module_destroy(struct cs_module *module);
/* Unloads a library of ctx; one that fails to unload is kept and retried by
 * cs_context_unload_orphans(), so that no code outlives its context. */
cudaError_t cs_library_unload(struct cs_context *ctx, cudaLibrary_t library);
void cs_context_unload_orphans(struct cs_context *ctx);
/* Keeps a library for cs_context_unload_orphans() without unloading it. */
cudaError_t cs_library_orphan(struct cs_context *ctx, cudaLibrary_t library);
cusafe_status cs_kernel_destroy(struct cs_kernel *kernel);
/* Settles a launch queued on q without root's lock, which found that
 * root's operations moved to another queue meanwhile: orders that queue
 * after q. */
void cs_buffer_settle(struct cs_buffer *root, struct cs_queue *q);
/* Chains root's next operation on queue q after its previous one (root's
 * lock held): buffer.c.  The reference that root held on the queue of its
 * previous operation, if any, is handed to the caller in *drop, to be
 * dropped (cs_unref) once the lock is released.  Fails if q is a stream
 * whose last reference went meanwhile (peeked by a pinned launch). */
cusafe_status cs_buffer_chain(struct cs_buffer *root, struct cs_queue *q,
                              struct cs_object **drop);
cusafe_status cs_stream_destroy(struct cs_stream *stream);
cusafe_status cs_event_destroy(struct cs_event *event);
cusafe_status cs_buffer_destroy(struct cs_buffer *buffer);

/* Resolves a stream argument: CUSAFE_STREAM_DEFAULT gives the default queue
 * of `dflt` (no reference taken), else the stream is acquired into *held
 * (drop with cs_unref when not NULL). */
cusafe_status cs_queue_get(cusafe_stream stream, struct cs_context *dflt,
                           struct cs_queue **out, struct cs_object **held);
/* Makes later work on `to` wait for the work queued so far on `from`. */
cusafe_status cs_queue_handoff(struct cs_queue *from, struct cs_queue *to);
/* Destroys a queue's hand-off event, if it was made. */
void cs_queue_fini(struct cs_queue *q);

/* "stream belongs to device 1 but buffer belongs to device 0" */
cusafe_status cs_mismatch(const char *a, const struct cs_context *actx,
                          const char *b, const struct cs_context *bctx)
    __attribute__((cold));

/* Shutdown: each frees the CUDA resources of one live object, whatever its
 * references, and retires its handle.  cs_buffer_shutdown takes views
 * (arg != NULL) or root buffers (arg == NULL). */
void cs_context_shutdown_sync(struct cs_object *obj, void *arg);
void cs_buffer_shutdown(struct cs_object *obj, void *arg);
void cs_event_shutdown(struct cs_object *obj, void *arg);
void cs_stream_shutdown(struct cs_object *obj, void *arg);
void cs_context_shutdown(struct cs_object *obj, void *arg);
void cs_kernel_shutdown(struct cs_object *obj, void *arg);
void cs_module_shutdown(struct cs_object *obj, void *arg);

#endif /* CUSAFE_INTERNAL_H */
