/* handle.c -- the handle table (invariant 3: handles are checked, always).
 *
 * A handle is (tag << 56) | (generation << 32) | slot index.  The tag is
 * 0xC0 | type, the generation counts the slot's reuses (24 bits, never 0).
 *
 * Each slot holds one 64-bit word: the generation, the references handed
 * to the caller, and all references (the caller's, children's, in-flight
 * work's and calls in progress).  One compare-and-swap checks that the
 * handle is still the slot's and changes the counts, so a lookup, a retain
 * and a release are one atomic operation each, and a freed object is never
 * read.  A handle is stale once the caller's references are gone, even
 * while children keep the object alive, so that a double release is an
 * error and not a stolen reference.
 *
 * Slots live in chunks that are never moved or freed, so the lock-free
 * lookup may read any slot below the high-water mark.  The table's lock
 * guards only the free list and the growth, never a CUDA call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define CHUNK_BITS 12
#define CHUNK_SLOTS (1u << CHUNK_BITS)
#define MAX_CHUNKS 4096u /* 16M handles */
#define TAG_BASE 0xC0u
#define GEN_MASK 0xFFFFFFu
#define NO_SLOT UINT32_MAX

/* The word: generation (24 bits) << 40 | caller's references (16 bits)
 * << 24 | all references (24 bits). */
#define GEN_SHIFT 40
#define USER_SHIFT 24
#define USER_ONE (1ull << USER_SHIFT)
#define USER_MAX 0xFFFFull
#define ALL_MAX 0xFFFFFFull
#define GEN_OF(w) ((w) >> GEN_SHIFT)
#define USERS_OF(w) (((w) >> USER_SHIFT) & USER_MAX)
#define ALL_OF(w) ((w) & ALL_MAX)

/* One cache line each, so that threads using different handles do not
 * contend for one line.  A buffer's slot also holds what a launch needs of
 * the buffer, so that a launch reads one line per buffer argument. */
struct cs_slot {
  _Alignas(64) _Atomic uint64_t word;
  struct cs_object *_Atomic obj;
  uint32_t index;
  _Atomic uint8_t type; /* the occupant's; set before the word publishes it */
  union {
    uint32_t next_free;            /* a free slot's, under table_lock */
    struct cs_buffer_slot buffer;  /* a buffer's (cs_handle_new_buffer) */
  } u;
};
_Static_assert(sizeof(struct cs_slot) == 64, "a slot is one cache line");

/* The first chunk is static, so that finding one of the first 4096 slots
 * takes no load: a retain or release is then one load and one
 * compare-and-swap of the slot's word.  Its pages are touched only as
 * slots are handed out. */
static struct cs_slot first_chunk[CHUNK_SLOTS];
static struct cs_slot *_Atomic chunks[MAX_CHUNKS] = {first_chunk};
static uint32_t free_head = NO_SLOT;
/* A spinlock: held for a few instructions (or, once per 4096 handles, for
 * the allocation of a chunk), it costs one atomic operation where a mutex
 * costs two. */
static cs_spinlock table_lock = CS_SPINLOCK_INIT;

static const char *const type_articles[] = {
    "an invalid handle", "a context", "a stream", "an event",
    "a buffer",          "a module",  "a kernel"};

static inline struct cs_slot *slot_at(uint32_t index) {
  if (CS_LIKELY(index < CHUNK_SLOTS))
    return &first_chunk[index];
  struct cs_slot *chunk = atomic_load_explicit(&chunks[index >> CHUNK_BITS],
                                               memory_order_acquire);
  return chunk ? &chunk[index & (CHUNK_SLOTS - 1)] : NULL;
}

/* Takes a free slot, growing the table if needed (table_lock held). */
static cusafe_status slot_take(struct cs_slot **out) {
  uint32_t index = free_head;
  if (index != NO_SLOT) {
    *out = slot_at(index);
    free_head = (*out)->u.next_free;
    return CUSAFE_SUCCESS;
  }
  index = atomic_load_explicit(&cs_hot.handles, memory_order_relaxed);
  if ((index >> CHUNK_BITS) >= MAX_CHUNKS)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY,
                   "the handle table is full (%u handles)",
                   MAX_CHUNKS * CHUNK_SLOTS);
  if (!atomic_load_explicit(&chunks[index >> CHUNK_BITS],
                            memory_order_relaxed)) {
    struct cs_slot *chunk = aligned_alloc(64, CHUNK_SLOTS * sizeof *chunk);
    if (!chunk)
      return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY,
                     "out of host memory growing the handle table");
    memset(chunk, 0, CHUNK_SLOTS * sizeof *chunk);
    for (uint32_t i = 0; i < CHUNK_SLOTS; i++) {
      chunk[i].index = index + i;
      atomic_init(&chunk[i].word, 1ull << GEN_SHIFT); /* generation 1 */
    }
    atomic_store_explicit(&chunks[index >> CHUNK_BITS], chunk,
                          memory_order_release);
  }
  *out = slot_at(index);
  if (index < CHUNK_SLOTS) { /* the static chunk: a slot's first use */
    (*out)->index = index;
    atomic_store_explicit(&(*out)->word, 1ull << GEN_SHIFT,
                          memory_order_relaxed); /* generation 1 */
  }
  atomic_store_explicit(&cs_hot.handles, index + 1, memory_order_release);
  return CUSAFE_SUCCESS;
}

/* Takes a slot for obj and sets obj's slot, type and handle; the caller
 * publishes it with publish() once the slot holds what lookups read. */
static inline __attribute__((always_inline)) cusafe_status
claim(struct cs_object *obj, enum cs_type type, struct cs_slot **out) {
  struct cs_slot *slot = NULL;
  cs_spin_lock(&table_lock);
  cusafe_status st = slot_take(&slot);
  cs_spin_unlock(&table_lock);
  if (st != CUSAFE_SUCCESS)
    return st;
  uint64_t gen = GEN_OF(atomic_load_explicit(&slot->word,
                                             memory_order_relaxed));
  obj->slot = slot;
  obj->type = type;
  obj->handle = ((uint64_t)(TAG_BASE | type) << 56) | (gen << 32) |
                slot->index;
  atomic_store_explicit(&slot->obj, obj, memory_order_relaxed);
  atomic_store_explicit(&slot->type, (uint8_t)type, memory_order_relaxed);
  *out = slot;
  return CUSAFE_SUCCESS;
}

/* Enters the claimed slot's object with one reference: a lookup that sees
 * the references sees everything stored in the slot and the object. */
static inline void publish(struct cs_slot *slot) {
  uint64_t gen = GEN_OF(atomic_load_explicit(&slot->word,
                                             memory_order_relaxed));
  atomic_store_explicit(&slot->word, (gen << GEN_SHIFT) | USER_ONE | 1,
                        memory_order_release);
}

cusafe_status cs_handle_new(struct cs_object *obj, enum cs_type type) {
  struct cs_slot *slot;
  cusafe_status st = claim(obj, type, &slot);
  if (st == CUSAFE_SUCCESS)
    publish(slot);
  return st;
}

cusafe_status cs_handle_new_buffer(struct cs_buffer *b) {
  struct cs_slot *slot;
  cusafe_status st = claim(&b->hdr, CS_BUFFER, &slot);
  if (st != CUSAFE_SUCCESS)
    return st;
  struct cs_buffer_slot *bs = &slot->u.buffer;
  bs->ptr = b->ptr;
  bs->ctx = b->ctx;
  bs->root = b->root;
  if (b->root == b) { /* the chain's latest queue moves into the slot */
    atomic_init(&bs->own_last, atomic_load_explicit(b->last,
                                                    memory_order_relaxed));
    b->last = &bs->own_last;
  } else {
    atomic_init(&bs->own_last, NULL);
    b->last = b->root->last;
  }
  bs->last = b->last;
  publish(slot);
  return CUSAFE_SUCCESS;
}

/* ---- checked lookups ---------------------------------------------------- */

/* A parameter's name for messages: "buffer", or "argument 3". */
struct param {
  const char *name;
  long index; /* -1: not an element of a list */
};

static const char *param_text(struct param p, char buf[64]) {
  if (p.index < 0)
    return p.name;
  snprintf(buf, 64, "%s %ld", p.name, p.index);
  return buf;
}

__attribute__((cold, noinline)) static cusafe_status
forged(struct param p, cusafe_handle h) {
  char buf[64];
  return cs_fail(CUSAFE_ERROR_INVALID_HANDLE,
                 "%s 0x%016llx is not a cusafe handle", param_text(p, buf),
                 (unsigned long long)h);
}

__attribute__((cold, noinline)) static cusafe_status
stale(struct param p, cusafe_handle h) {
  char buf[64];
  return cs_fail(CUSAFE_ERROR_INVALID_HANDLE,
                 "%s 0x%016llx is stale: its object was released",
                 param_text(p, buf), (unsigned long long)h);
}

/* The slot of `h`; fails for a handle that was never handed out. */
static inline __attribute__((always_inline)) cusafe_status
locate(cusafe_handle h, struct param name, struct cs_slot **slot) {
  if (h == CUSAFE_NULL_HANDLE) {
    char buf[64];
    return cs_fail(CUSAFE_ERROR_INVALID_HANDLE, "%s is the NULL handle",
                   param_text(name, buf));
  }
  unsigned tag = (unsigned)(h >> 56);
  unsigned htype = tag & 0x0Fu;
  uint32_t index = (uint32_t)h;
  if ((tag & 0xF0u) != TAG_BASE || htype < CS_CONTEXT ||
      htype > CS_TYPE_LAST || ((h >> 32) & GEN_MASK) == 0 ||
      index >= atomic_load_explicit(&cs_hot.handles, memory_order_acquire))
    return forged(name, h);
  *slot = slot_at(index);
  return CUSAFE_SUCCESS;
}

/* Checks that the slot's `word` holds `h` live (the caller holds a
 * reference) and of type `want` (0: any). */
static inline __attribute__((always_inline)) cusafe_status
check(cusafe_handle h, enum cs_type want, struct param name,
      const struct cs_slot *slot, uint64_t word) {
  unsigned htype = (unsigned)(h >> 56) & 0x0Fu;
  uint64_t gen = (h >> 32) & GEN_MASK;
  uint64_t slot_gen = GEN_OF(word);
  if (slot_gen != gen) /* a generation not reached was never handed out */
    return gen > slot_gen ? forged(name, h) : stale(name, h);
  if (USERS_OF(word) == 0)
    return stale(name, h);
  if (atomic_load_explicit(&slot->type, memory_order_relaxed) != htype)
    return forged(name, h); /* the right slot and generation, a wrong tag */
  if (want && htype != (unsigned)want) {
    char buf[64];
    return cs_fail(CUSAFE_ERROR_INVALID_HANDLE, "%s 0x%016llx is %s, not %s",
                   param_text(name, buf), (unsigned long long)h,
                   type_articles[htype], type_articles[want]);
  }
  return CUSAFE_SUCCESS;
}

/* Checks `h` and adds `users` caller's references and `all` references to
 * it in one step.  A release passes -1 and -1.  *out is the object and *old
 * the word before the change.  Sequentially consistent, so that a release
 * of the last reference is ordered against pins (cs_pin). */
/* update()'s answer, with `not_last`, when the change would drop the last
 * reference. */
#define LAST_REFERENCE ((cusafe_status)-1)

static inline __attribute__((always_inline)) cusafe_status
update(cusafe_handle h, enum cs_type want, struct param name, int users,
       int all, bool not_last, struct cs_object **out, uint64_t *old) {
  struct cs_slot *slot;
  cusafe_status st = locate(h, name, &slot);
  if (st != CUSAFE_SUCCESS)
    return st;
  uint64_t delta = (uint64_t)((int64_t)users * (int64_t)USER_ONE + all);
  uint64_t word = atomic_load_explicit(&slot->word, memory_order_acquire);
  do {
    st = check(h, want, name, slot, word);
    if (st != CUSAFE_SUCCESS)
      return st;
    if (not_last && ALL_OF(word) == 1)
      return LAST_REFERENCE;
    if ((users > 0 && USERS_OF(word) + (uint64_t)users > USER_MAX) ||
        (all > 0 && ALL_OF(word) + (uint64_t)all > ALL_MAX)) {
      char buf[64];
      return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY,
                     "%s 0x%016llx has too many references",
                     param_text(name, buf), (unsigned long long)h);
    }
  } while (!atomic_compare_exchange_weak_explicit(
      &slot->word, &word, word + delta, memory_order_seq_cst,
      memory_order_acquire));
  *out = atomic_load_explicit(&slot->obj, memory_order_relaxed);
  if (old)
    *old = word;
  return CUSAFE_SUCCESS;
}

/* The slot of `h`, a handle of type `type` (0: any) below the high-water
 * mark, or NULL: the first checks of a retain's or release's fast path
 * (count_fast), whose failures the full path explains.  Peeks, whose type
 * is never 0, check more at once (live_slot). */
static inline __attribute__((always_inline)) struct cs_slot *
slot_of(cusafe_handle h, enum cs_type type) {
  unsigned tag = (unsigned)(h >> 56);
  uint32_t index = (uint32_t)h;
  if (CS_UNLIKELY((tag & 0xF0u) != TAG_BASE ||
                  (type && (tag & 0x0Fu) != (unsigned)type) ||
                  index >= atomic_load_explicit(&cs_hot.handles,
                                                memory_order_acquire)))
    return NULL;
  return slot_at(index);
}

__attribute__((cold, noinline)) static cusafe_status
peek_slow(cusafe_handle h, enum cs_type type, const char *name, long index,
          struct cs_object **out) {
  struct param p = {name, index};
  struct cs_slot *slot;
  cusafe_status st = locate(h, p, &slot);
  if (st != CUSAFE_SUCCESS)
    return st;
  /* Sequentially consistent: after the pin (see cs_pin). */
  st = check(h, type, p, slot, atomic_load(&slot->word));
  if (st == CUSAFE_SUCCESS)
    *out = atomic_load_explicit(&slot->obj, memory_order_relaxed);
  return st;
}

/* The slot of `h` if it is a live handle of `type` (not 0), else NULL:
 * the whole check of a peek, in few instructions, whose failures
 * peek_slow() explains.  Sequentially consistent: after the pin (see
 * cs_pin). */
static inline __attribute__((always_inline)) struct cs_slot *
live_slot(cusafe_handle h, enum cs_type type) {
  uint32_t index = (uint32_t)h;
  if (CS_UNLIKELY((unsigned)(h >> 56) != (TAG_BASE | (unsigned)type) ||
                  index >= atomic_load_explicit(&cs_hot.handles,
                                                memory_order_acquire)))
    return NULL;
  struct cs_slot *slot = slot_at(index);
  if (CS_UNLIKELY(!slot))
    return NULL;
  uint64_t word = atomic_load(&slot->word);
  /* h's generation, moved to the word's and xor'ed out, leaves the
   * caller's references, 1 to USER_MAX if the generation is h's. */
  uint64_t users =
      (word ^ ((h << (GEN_SHIFT - 32)) & ~((1ull << GEN_SHIFT) - 1))) >>
      USER_SHIFT;
  if (CS_UNLIKELY(users - 1 >= USER_MAX ||
                  atomic_load_explicit(&slot->type, memory_order_relaxed) !=
                      (uint8_t)type))
    return NULL;
  return slot;
}

cusafe_status cs_peek(cusafe_handle h, enum cs_type type, const char *name,
                      long index, struct cs_object **out) {
  struct cs_slot *slot = live_slot(h, type);
  if (CS_LIKELY(slot)) {
    *out = atomic_load_explicit(&slot->obj, memory_order_relaxed);
    return CUSAFE_SUCCESS;
  }
  return peek_slow(h, type, name, index, out);
}

cusafe_status cs_peek_buffer(cusafe_handle h, long index,
                             const struct cs_buffer_slot **out) {
  struct cs_slot *slot = live_slot(h, CS_BUFFER);
  if (CS_LIKELY(slot)) {
    *out = &slot->u.buffer;
    return CUSAFE_SUCCESS;
  }
  struct cs_object *obj;
  cusafe_status st = peek_slow(h, CS_BUFFER, "argument", index, &obj);
  if (st == CUSAFE_SUCCESS) /* revived meanwhile (cs_try_user_ref) */
    *out = &obj->slot->u.buffer;
  return st;
}

cusafe_status cs_acquire(cusafe_handle h, enum cs_type type, const char *name,
                         struct cs_object **out) {
  return update(h, type, (struct param){name, -1}, 0, 1, false, out, NULL);
}

/* ---- references ----------------------------------------------------------- */

/* Internal references are bounded by the table's size (16M handles), below
 * ALL_MAX: they need no check. */
void cs_ref(struct cs_object *obj) {
  atomic_fetch_add_explicit(&obj->slot->word, 1, memory_order_relaxed);
}

bool cs_try_ref(struct cs_object *obj) {
  struct cs_slot *slot = obj->slot;
  uint64_t word = atomic_load_explicit(&slot->word, memory_order_relaxed);
  do {
    if (ALL_OF(word) == 0)
      return false;
  } while (!atomic_compare_exchange_weak_explicit(
      &slot->word, &word, word + 1, memory_order_acquire,
      memory_order_relaxed));
  return true;
}

/* Adds a caller's reference to a live object -- which makes its handle
 * valid again if the caller had released it -- unless the object is being
 * destroyed or the caller's count is full. */
bool cs_try_user_ref(struct cs_object *obj) {
  struct cs_slot *slot = obj->slot;
  uint64_t word = atomic_load_explicit(&slot->word, memory_order_relaxed);
  do {
    if (ALL_OF(word) == 0 || USERS_OF(word) == USER_MAX)
      return false;
  } while (!atomic_compare_exchange_weak_explicit(
      &slot->word, &word, word + USER_ONE + 1, memory_order_acquire,
      memory_order_relaxed));
  return true;
}

cusafe_status cs_user_ref(struct cs_object *obj) {
  /* The caller holds a reference, so the object lives: only the count of
   * the caller's references can be full. */
  static const char *const names[] = {"", "context", "stream", "event",
                                      "buffer", "module", "kernel"};
  if (cs_try_user_ref(obj))
    return CUSAFE_SUCCESS;
  return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY,
                 "%s 0x%016llx has too many references", names[obj->type],
                 (unsigned long long)obj->handle);
}

static void retire(struct cs_slot *slot, uint64_t gen) {
  gen = (gen + 1) & GEN_MASK;
  if (gen == 0)
    gen = 1;
  atomic_store_explicit(&slot->obj, NULL, memory_order_relaxed);
  atomic_store_explicit(&slot->word, gen << GEN_SHIFT, memory_order_release);
  cs_spin_lock(&table_lock);
  slot->u.next_free = free_head;
  free_head = slot->index;
  cs_spin_unlock(&table_lock);
}

/* The last reference went (`word` held it): lookups see no references and
 * fail until the slot is reused. */
static cusafe_status destroy_last(struct cs_object *obj, uint64_t word) {
  struct cs_slot *slot = obj->slot;
  if (obj->type == CS_KERNEL || obj->type == CS_STREAM ||
      obj->type == CS_BUFFER)
    cs_pins_wait(); /* launches may use it without a reference */
  free(atomic_exchange(&obj->label, NULL));
  cusafe_status st = cs_destroy(obj);
  retire(slot, GEN_OF(word));
  return st;
}

cusafe_status cs_unref(struct cs_object *obj) {
  uint64_t word = atomic_fetch_sub(&obj->slot->word, 1); /* see update() */
  if (ALL_OF(word) != 1)
    return CUSAFE_SUCCESS;
  return destroy_last(obj, word);
}

void cs_handle_kill(struct cs_object *obj) {
  struct cs_slot *slot = obj->slot;
  uint64_t gen = GEN_OF(atomic_load_explicit(&slot->word,
                                             memory_order_relaxed));
  gen = (gen + 1) & GEN_MASK;
  /* The object stays reachable through slot->obj: see cusafe_shutdown(). */
  atomic_store_explicit(&slot->word, (gen ? gen : 1) << GEN_SHIFT,
                        memory_order_release);
}

uint32_t cs_user_refs(const struct cs_object *obj) {
  return (uint32_t)USERS_OF(
      atomic_load_explicit(&obj->slot->word, memory_order_acquire));
}

void cs_handle_foreach(enum cs_type type,
                       void (*fn)(struct cs_object *obj, void *arg),
                       void *arg) {
  uint32_t n = atomic_load_explicit(&cs_hot.handles, memory_order_acquire);
  for (uint32_t i = 0; i < n; i++) {
    struct cs_slot *slot = slot_at(i);
    if (ALL_OF(atomic_load_explicit(&slot->word, memory_order_acquire)) == 0)
      continue;
    struct cs_object *obj = atomic_load_explicit(&slot->obj,
                                                 memory_order_relaxed);
    if (obj && obj->type == type)
      fn(obj, arg);
  }
}

cusafe_status cs_destroy(struct cs_object *obj) {
  switch (obj->type) {
  case CS_CONTEXT: return cs_context_destroy((struct cs_context *)obj);
  case CS_STREAM: return cs_stream_destroy((struct cs_stream *)obj);
  case CS_EVENT: return cs_event_destroy((struct cs_event *)obj);
  case CS_BUFFER: return cs_buffer_destroy((struct cs_buffer *)obj);
  case CS_MODULE: return cs_module_destroy((struct cs_module *)obj);
  case CS_KERNEL: return cs_kernel_destroy((struct cs_kernel *)obj);
  }
  return CUSAFE_SUCCESS;
}

/* ---- the caller's references ------------------------------------------------ */

/* Retains and releases mark no call in progress (CS_ENTER): the shutdown
 * need not wait for them, since a retain and a release that is not the
 * last destroy nothing.  One that meets the shutdown's retirement of its
 * handle fails as stale: it reports the shutdown instead. */
__attribute__((noinline)) static cusafe_status
retain_slow(cusafe_handle h, enum cs_type type, const char *name) {
  if (atomic_load_explicit(&cs_hot.state, memory_order_relaxed))
    return cs_state_error();
  struct cs_object *obj;
  cusafe_status st =
      update(h, type, (struct param){name, -1}, 1, 1, false, &obj, NULL);
  if (st != CUSAFE_SUCCESS && atomic_load(&cs_hot.state))
    return cs_state_error();
  return st;
}

/* A release that may drop the last reference, which destroys: marked. */
__attribute__((noinline)) static cusafe_status
release_last(cusafe_handle h, enum cs_type type, const char *name) {
  CS_ENTER_RELEASE();
  struct cs_object *obj;
  uint64_t old;
  cusafe_status st =
      update(h, type, (struct param){name, -1}, -1, -1, false, &obj, &old);
  if (st != CUSAFE_SUCCESS || ALL_OF(old) != 1)
    return st;
  return destroy_last(obj, old);
}

__attribute__((noinline)) static cusafe_status
release_slow(cusafe_handle h, enum cs_type type, const char *name) {
  if (atomic_load_explicit(&cs_hot.state, memory_order_relaxed) ||
      h == CUSAFE_NULL_HANDLE)
    return CUSAFE_SUCCESS; /* a no-op after the shutdown */
  struct cs_object *obj;
  uint64_t old;
  cusafe_status st =
      update(h, type, (struct param){name, -1}, -1, -1, true, &obj, &old);
  if (st == LAST_REFERENCE)
    return release_last(h, type, name);
  if (st != CUSAFE_SUCCESS && atomic_load(&cs_hot.state))
    return CUSAFE_SUCCESS;
  return st;
}

/* The word this thread's last retain or release of `handle` left in its
 * slot.  On the Xeon of the benchmark, a load of a slot just after a
 * locked update of it costs a third of a retain: a loop of retains and
 * releases of one handle offers the compare-and-swap the word it left
 * instead, and the swap fails harmlessly where another thread has changed
 * the word since.  The word is checked as a loaded one is, except for the
 * slot's type, which was checked when the memo was made and cannot change
 * while the slot's generation is the handle's. */
struct rc_memo {
  cusafe_handle handle;
  uint64_t word;
};
static __thread struct rc_memo rc_memo __attribute__((tls_model("initial-exec")));

/* The common case of a retain or release, in few instructions and no
 * call: a live handle of the right type, with room in its counts (and, for
 * a release, not its last reference), while the library runs.  Anything
 * else goes to the full path, which says what is wrong. */
static inline __attribute__((always_inline)) bool
count_fast(cusafe_handle h, enum cs_type type, int delta) {
  if (CS_UNLIKELY(atomic_load_explicit(&cs_hot.state, memory_order_relaxed)))
    return false;
  struct cs_slot *slot = slot_of(h, type);
  if (CS_UNLIKELY(!slot))
    return false;
  struct rc_memo *memo = &rc_memo;
  bool typed = memo->handle == h; /* the memo's word passed the type check */
  uint64_t word = typed ? memo->word
                        : atomic_load_explicit(&slot->word,
                                               memory_order_relaxed);
  uint64_t change = delta > 0 ? USER_ONE + 1 : -(USER_ONE + 1);
  for (;;) {
    uint64_t users = USERS_OF(word), all = ALL_OF(word);
    if (CS_UNLIKELY(GEN_OF(word) != ((h >> 32) & GEN_MASK) || users == 0 ||
                    (delta > 0 ? users == USER_MAX || all == ALL_MAX
                               : all == 1)))
      break;
    if (CS_UNLIKELY(!typed &&
                    atomic_load_explicit(&slot->type, memory_order_relaxed) !=
                        ((h >> 56) & 0x0Fu)))
      break;
    if (CS_LIKELY(atomic_compare_exchange_strong_explicit(
            &slot->word, &word, word + change, memory_order_seq_cst,
            memory_order_relaxed))) {
      memo->handle = h;
      memo->word = word + change;
      return true;
    }
    typed = false; /* `word` is now the slot's: check it all */
  }
  memo->handle = CUSAFE_NULL_HANDLE;
  return false;
}

static inline __attribute__((always_inline)) cusafe_status
retain_handle(cusafe_handle h, enum cs_type type, const char *name) {
  if (CS_LIKELY(count_fast(h, type, 1)))
    return CUSAFE_SUCCESS;
  return retain_slow(h, type, name);
}

static inline __attribute__((always_inline)) cusafe_status
release_handle(cusafe_handle h, enum cs_type type, const char *name) {
  if (CS_LIKELY(count_fast(h, type, -1)))
    return CUSAFE_SUCCESS;
  return release_slow(h, type, name);
}

#define CS_RETAIN_RELEASE(what, type)                                        \
  CUSAFE_API cusafe_status cusafe_##what##_retain(cusafe_##what h) {         \
    return retain_handle(h, type, #what);                                    \
  }                                                                          \
  CUSAFE_API cusafe_status cusafe_##what##_release(cusafe_##what h) {        \
    return release_handle(h, type, #what);                                   \
  }
CS_RETAIN_RELEASE(context, CS_CONTEXT)
CS_RETAIN_RELEASE(stream, CS_STREAM)
CS_RETAIN_RELEASE(event, CS_EVENT)
CS_RETAIN_RELEASE(buffer, CS_BUFFER)
CS_RETAIN_RELEASE(module, CS_MODULE)
CS_RETAIN_RELEASE(kernel, CS_KERNEL)

CUSAFE_API cusafe_status cusafe_retain(cusafe_handle handle) {
  return retain_handle(handle, 0, "handle");
}

CUSAFE_API cusafe_status cusafe_release(cusafe_handle handle) {
  return release_handle(handle, 0, "handle");
}

CUSAFE_API cusafe_status cusafe_handle_get_type(cusafe_handle_type *out,
                                                cusafe_handle handle) {
  if (out)
    *out = CUSAFE_TYPE_INVALID;
  CS_ENTER();
  if (!out)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  struct cs_object *obj;
  cusafe_status st = cs_acquire(handle, 0, "handle", &obj);
  if (st != CUSAFE_SUCCESS)
    return st;
  *out = (cusafe_handle_type)obj->type;
  cs_unref(obj);
  return CUSAFE_SUCCESS;
}

CUSAFE_API cusafe_status cusafe_handle_set_label(cusafe_handle handle,
                                                 const char *label) {
  CS_ENTER();
  struct cs_object *obj;
  cusafe_status st = cs_acquire(handle, 0, "handle", &obj);
  if (st != CUSAFE_SUCCESS)
    return st;
  char *copy = NULL;
  if (label && !(copy = strndup(label, 255)))
    st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  else
    free(atomic_exchange(&obj->label, copy));
  cs_unref(obj);
  return st;
}
