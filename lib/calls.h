/* calls.h -- the concurrency protocol (invariant 6: thread-safe; read
 * lib/README.md, "Concurrency", first): the library's state, the records
 * of threads inside calls, pins, light calls and spinlocks (calls.c).
 * Internal; never installed. */
#ifndef CUSAFE_CALLS_H
#define CUSAFE_CALLS_H

#include <stdatomic.h>

#include "error.h"

/* ---- the library's state ------------------------------------------------- */

enum cs_state { CS_RUNNING = 0, CS_SHUT_DOWN = 1, CS_FORKED = 2 };

/* What every call reads, in one cache line. */
struct cs_hot {
  _Atomic int state; /* enum cs_state */
  /* 1 once the shutdown can make every thread's marks visible with one
   * membarrier() call: calls then need only a compiler barrier. */
  _Atomic int light_calls;
  /* 1 when the process sees one device, which is then always current
   * (device.h). */
  _Atomic int single_device;
  /* The handle table's slots ever handed out (handle.c). */
  _Atomic uint32_t handles;
  /* Stream captures open (graph.c): while there are any, a queue's
   * capture is looked for through the CUDA
   * stream too. */
  _Atomic int captures;
};
extern struct cs_hot cs_hot;

/* Fails with SHUTDOWN or FORKED unless the library is running. */
cusafe_status cs_state_error(void) __attribute__((cold));

/* Registers what the protocol needs from the process, once, right after
 * the first successful CUDA call: the fork handler, and light calls where
 * the kernel offers membarrier(). */
void cs_calls_init(void);
/* Moves the library from running to shut down; false if it was not
 * running.  From then on every call fails (CS_ENTER). */
bool cs_calls_stop(void);
/* Waits until no other thread is inside a call; false after `seconds`. */
bool cs_calls_drain(int seconds);

/* ---- threads inside calls ------------------------------------------------ */

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
  /* Operations in progress that decided, from their queues' capture
   * state, whether their work is captured (cs_gate): the count of gates
   * begun and ended. */
  _Atomic unsigned long gates_begun;
  _Atomic unsigned long gates_ended;
};
_Static_assert(sizeof(struct cs_thread) == 64, "a thread's record is a line");
/* initial-exec: one pointer, read on every call without __tls_get_addr. */
extern __thread struct cs_thread *cs_tls_thread
    __attribute__((tls_model("initial-exec")));
struct cs_thread *cs_thread_register(void);

/* Marks the thread inside a call.  The mark is ordered before the state
 * check (CS_ENTER) against the shutdown's store of the state before its
 * scan of the marks: a full fence, or with light calls a compiler barrier
 * (the shutdown then issues membarrier() between the two). */
static inline struct cs_thread *cs_call_enter(void) {
  struct cs_thread *t = cs_tls_thread;
  if (CS_UNLIKELY(!t))
    t = cs_thread_register();
  atomic_store_explicit(
      &t->depth, atomic_load_explicit(&t->depth, memory_order_relaxed) + 1,
      memory_order_relaxed);
  if (CS_LIKELY(
          atomic_load_explicit(&cs_hot.light_calls, memory_order_relaxed)))
    atomic_signal_fence(memory_order_seq_cst);
  else
    atomic_thread_fence(memory_order_seq_cst);
  return t;
}

static inline void cs_call_leave(struct cs_thread **t) {
  atomic_store_explicit(
      &(*t)->depth,
      atomic_load_explicit(&(*t)->depth, memory_order_relaxed) - 1,
      memory_order_release);
}

/* Opens a public call: marks the thread inside a call until the function
 * returns (whatever the path), and returns `refused` after shutdown or in
 * a forked child. */
#define CS_ENTER_OR(refused)                                                   \
  struct cs_thread *cs_call_ __attribute__((cleanup(cs_call_leave))) =         \
      cs_call_enter();                                                         \
  (void)cs_call_;                                                              \
  if (CS_UNLIKELY(atomic_load_explicit(&cs_hot.state, memory_order_relaxed)))  \
  return (refused)
/* Every call but a release is refused with SHUTDOWN or FORKED. */
#define CS_ENTER() CS_ENTER_OR(cs_state_error())
/* Releases are silent no-ops after shutdown and in a forked child. */
#define CS_ENTER_RELEASE() CS_ENTER_OR(CUSAFE_SUCCESS)
/* CS_ENTER() for a call whose result goes to *out: *out is `empty` unless
 * the call succeeds, and a NULL out is refused ("out is NULL"). */
#define CS_ENTER_OUT(out, empty)                                               \
  if (out)                                                                     \
    *(out) = (empty);                                                          \
  CS_ENTER();                                                                  \
  if (CS_UNLIKELY(!(out)))                                                     \
  return cs_null(#out)

/* ---- pins ---------------------------------------------------------------- */

/* Adds 1 to a count of t's record that only t changes -- atomically where
 * t is the shared record (`order`: of the store). */
static inline void cs_count_up(const struct cs_thread *t,
                               _Atomic unsigned long *n, memory_order order) {
  if (CS_UNLIKELY(t->shared))
    atomic_fetch_add_explicit(n, 1, order);
  else
    atomic_store_explicit(n, atomic_load_explicit(n, memory_order_relaxed) + 1,
                          order);
}

/* A launch pins its thread before it uses objects without references;
 * their destruction waits for it (cs_pins_wait).  lib/README.md, "Pins:
 * launches without references". */
static inline void cs_pin(struct cs_thread *t) {
  cs_count_up(t, &t->pins_begun, memory_order_seq_cst);
}
static inline void cs_unpin(struct cs_thread *t) {
  cs_count_up(t, &t->pins_ended, memory_order_release);
}
/* Waits until every other thread's pins begun before the call have ended. */
void cs_pins_wait(void);

/* ---- gates --------------------------------------------------------------- */

/* An operation that queues work on a stream gates its thread from before
 * it reads the stream's capture state until its work is queued, so that a
 * capture cannot begin or end in between (graph.c waits for the gates
 * begun before it marks the stream, cs_gates_wait).  A launch's pin serves
 * as its gate.  lib/README.md, "Gates: captures beginning and ending". */
static inline void cs_gate(struct cs_thread *t) {
  cs_count_up(t, &t->gates_begun, memory_order_seq_cst);
}
static inline void cs_ungate(struct cs_thread *t) {
  cs_count_up(t, &t->gates_ended, memory_order_release);
}
/* Waits until every other thread's pins and gates begun before the call
 * have ended. */
void cs_gates_wait(void);
/* The calling thread's record (made if it has none). */
static inline struct cs_thread *cs_thread_self(void) {
  struct cs_thread *t = cs_tls_thread;
  return CS_LIKELY(t) ? t : cs_thread_register();
}

/* ---- spinlocks ----------------------------------------------------------- */

/* A lock held for the few instructions that enqueue one operation (a
 * buffer's chain, the handle table's free list): its release is a plain
 * store, cheaper than a mutex's; a long wait yields. */
typedef struct {
  atomic_flag held;
} cs_spinlock;
#define CS_SPINLOCK_INIT                                                       \
  { ATOMIC_FLAG_INIT }
void cs_spin_wait(cs_spinlock *l);
static inline void cs_spin_lock(cs_spinlock *l) {
  if (CS_UNLIKELY(
          atomic_flag_test_and_set_explicit(&l->held, memory_order_acquire)))
    cs_spin_wait(l);
}
static inline void cs_spin_unlock(cs_spinlock *l) {
  atomic_flag_clear_explicit(&l->held, memory_order_release);
}

#endif /* CUSAFE_CALLS_H */
