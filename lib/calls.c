/* calls.c -- the concurrency protocol (invariant 6: thread-safe): the
 * library's state, thread records, pins, light calls, spinlocks and the
 * waits of the shutdown and of releases.  lib/README.md, "Concurrency",
 * states the rules these functions keep. */
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "calls.h"

_Alignas(64) struct cs_hot cs_hot = {.state = CS_RUNNING};

cusafe_status cs_state_error(void) {
  if (atomic_load(&cs_hot.state) == CS_FORKED)
    return cs_fail(CUSAFE_ERROR_FORKED, "cusafe cannot be used in a process "
                                        "forked after CUDA was initialised");
  return cs_fail(CUSAFE_ERROR_SHUTDOWN, "cusafe has been shut down");
}

/* A child forked after CUDA was initialised cannot use CUDA (the runtime
 * answers cudaErrorInitializationError), and its exit must touch nothing of
 * the parent's: from here on every call fails and releases do nothing. */
static void at_fork_child(void) { atomic_store(&cs_hot.state, CS_FORKED); }

/* ---- light calls --------------------------------------------------------- */

/* Registers for expedited membarrier(), which makes cheap calls possible;
 * where the kernel, a seccomp filter or Valgrind refuses it, calls keep
 * their full fence. */
void cs_calls_init(void) {
  pthread_atfork(NULL, NULL, at_fork_child);
#ifdef __NR_membarrier
  if (syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0,
              0) == 0)
    atomic_store(&cs_hot.light_calls, 1);
#endif
}

/* A full memory barrier on every thread of the process.  Should
 * membarrier() fail after its registration (a seccomp filter installed
 * since), calls go back to full fences, and the marks of calls entered
 * with a compiler barrier only get a millisecond to leave their store
 * buffers: lib/README.md, "Light calls". */
static void heavy_barrier(void) {
  if (!atomic_load(&cs_hot.light_calls)) {
    atomic_thread_fence(memory_order_seq_cst);
    return;
  }
#ifdef __NR_membarrier
  if (syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0)
    return;
#endif
  atomic_store(&cs_hot.light_calls, 0);
  atomic_thread_fence(memory_order_seq_cst);
  nanosleep(&(struct timespec){0, 1000000}, NULL);
}

/* ---- thread records ------------------------------------------------------ */

__thread struct cs_thread *cs_tls_thread
    __attribute__((tls_model("initial-exec")));

static _Atomic(struct cs_thread *) threads;
static pthread_key_t thread_key;
static pthread_once_t thread_once = PTHREAD_ONCE_INIT;
/* For a thread whose record could not be allocated: shared, so its depth
 * counts calls of several threads; it is updated atomically all the same. */
static struct cs_thread overflow_thread = {.in_use = 1, .shared = true};

static void thread_gone(void *p) {
  struct cs_thread *t = p;
  atomic_store(&t->in_use, 0); /* the record is reused by a later thread */
}

static void thread_key_make(void) {
  pthread_key_create(&thread_key, thread_gone);
}

struct cs_thread *cs_thread_register(void) {
  pthread_once(&thread_once, thread_key_make);
  struct cs_thread *t;
  for (t = atomic_load(&threads); t; t = t->next) {
    int idle = 0;
    if (atomic_compare_exchange_strong(&t->in_use, &idle, 1))
      break;
  }
  if (!t) {
    t = aligned_alloc(_Alignof(struct cs_thread), sizeof *t);
    if (!t)
      return &overflow_thread;
    memset(t, 0, sizeof *t);
    atomic_init(&t->in_use, 1);
    t->next = atomic_load(&threads);
    while (!atomic_compare_exchange_weak(&threads, &t->next, t))
      ;
  }
  pthread_setspecific(thread_key, t);
  cs_tls_thread = t;
  return t;
}

/* ---- the waits ----------------------------------------------------------- */

/* Waits until the counts of `begun` and `ended` (members of the thread
 * records, at these offsets) of every other thread have caught up with
 * what was begun by the call. */
static void counts_wait(size_t begun_at, size_t ended_at) {
#define COUNT(t, at) ((_Atomic unsigned long *)((char *)(t) + (at)))
  struct cs_thread *self = cs_tls_thread;
  for (struct cs_thread *t = atomic_load(&threads); t; t = t->next) {
    if (t == self && !t->shared)
      continue; /* the caller is not pinned */
    unsigned long begun = atomic_load(COUNT(t, begun_at));
    for (unsigned spins = 0;
         (long)(atomic_load_explicit(COUNT(t, ended_at), memory_order_acquire) -
                begun) < 0;
         spins++)
      if (spins >= 64)
        sched_yield(); /* the launch may be waiting for the GPU's queue */
  }
  /* The shared record counts the pins of several threads: wait for a
   * moment with none in progress (ended read first, so that equal counts
   * prove it). */
  struct cs_thread *o = &overflow_thread;
  for (;;) {
    unsigned long ended =
        atomic_load_explicit(COUNT(o, ended_at), memory_order_acquire);
    if (atomic_load(COUNT(o, begun_at)) == ended)
      break;
    sched_yield();
  }
#undef COUNT
}

void cs_pins_wait(void) {
  counts_wait(offsetof(struct cs_thread, pins_begun),
              offsetof(struct cs_thread, pins_ended));
}

void cs_gates_wait(void) {
  cs_pins_wait();
  counts_wait(offsetof(struct cs_thread, gates_begun),
              offsetof(struct cs_thread, gates_ended));
}

bool cs_calls_stop(void) {
  int expected = CS_RUNNING;
  return atomic_compare_exchange_strong(&cs_hot.state, &expected, CS_SHUT_DOWN);
}

bool cs_calls_drain(int seconds) {
  struct cs_thread *self = cs_tls_thread;
  heavy_barrier(); /* calls that missed the new state are marked now */
  struct timespec nap = {0, 1000000};
  for (long waited = 0; waited < seconds * 1000L; waited++) {
    bool busy = false;
    for (struct cs_thread *t = atomic_load(&threads); t && !busy; t = t->next)
      busy = t != self && atomic_load(&t->depth) > 0;
    if (!busy &&
        (self == &overflow_thread || atomic_load(&overflow_thread.depth) == 0))
      return true;
    nanosleep(&nap, NULL);
  }
  return false;
}

/* ---- spinlocks ----------------------------------------------------------- */

void cs_spin_wait(cs_spinlock *l) {
  for (unsigned spins = 0;
       atomic_flag_test_and_set_explicit(&l->held, memory_order_acquire);
       spins++)
    if (spins >= 64)
      sched_yield(); /* the holder may be inside a CUDA call */
}
