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
 * guards only the free list and the growth, never a CUDA call.
 *
 * lib/README.md, "Objects and references" and "Pins", tells the whole
 * protocol: what a lookup reads, and why a launch may use a handle without
 * a reference. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "handle.h"

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
#define ALL_OF(w) ((w)&ALL_MAX)

/* One cache line each, so that threads using different handles do not
 * contend for one line.  The slot of a buffer, a stream or a graph also
 * holds what launches and replays need of it (union cs_slot_data), so that
 * they read one line per object. */
struct cs_slot {
  _Alignas(64) _Atomic uint64_t word;
  struct cs_object *_Atomic obj;
  uint32_t index;
  _Atomic uint8_t type; /* the occupant's; set before the word publishes it */
  union {
    uint32_t next_free;      /* a free slot's, under table_lock */
    union cs_slot_data data; /* a live object's (cs_handle_claim) */
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

static inline struct cs_slot *slot_at(uint32_t index);
/* The slot of an object entered into the table. */
static inline struct cs_slot *slot_of(const struct cs_object *obj) {
  return slot_at((uint32_t)obj->handle);
}

static inline struct cs_slot *slot_at(uint32_t index) {
  if (CS_LIKELY(index < CHUNK_SLOTS))
    return &first_chunk[index];
  struct cs_slot *chunk =
      atomic_load_explicit(&chunks[index >> CHUNK_BITS], memory_order_acquire);
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
  uint64_t gen =
      GEN_OF(atomic_load_explicit(&slot->word, memory_order_relaxed));
  obj->type = type;
  obj->handle = ((uint64_t)(TAG_BASE | type) << 56) | (gen << 32) | slot->index;
  atomic_store_explicit(&slot->obj, obj, memory_order_relaxed);
  atomic_store_explicit(&slot->type, (uint8_t)type, memory_order_relaxed);
  *out = slot;
  return CUSAFE_SUCCESS;
}

/* Enters the claimed slot's object with one reference: a lookup that sees
 * the references sees everything stored in the slot and the object. */
static inline void publish(struct cs_slot *slot) {
  uint64_t gen =
      GEN_OF(atomic_load_explicit(&slot->word, memory_order_relaxed));
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

cusafe_status cs_handle_claim(struct cs_object *obj, enum cs_type type,
                              union cs_slot_data **out) {
  struct cs_slot *slot;
  cusafe_status st = claim(obj, type, &slot);
  if (st == CUSAFE_SUCCESS)
    *out = &slot->u.data;
  return st;
}

void cs_handle_publish(struct cs_object *obj) { publish(slot_of(obj)); }

/* ---- the object types ---------------------------------------------------- */

#define CS_TYPE_ROW(TYPE, name, article, peeked)                               \
  [CS_##TYPE] = {#name, article, cs_##name##_fini, cs_##name##_free, peeked},
static const struct {
  const char *name, *article;
  cusafe_status (*fini)(struct cs_object *obj);
  void (*free)(struct cs_object *obj);
  bool peeked;
} types[CS_TYPES + 1] = {CS_TYPE_MAP(CS_TYPE_ROW)};
#undef CS_TYPE_ROW

const char *cs_type_name(enum cs_type type) { return types[type].name; }

/* ---- the check of a handle ----------------------------------------------- */

/* A handle is checked one way, in two forms.  The fast form, inline, is
 * three tests that answer the common case in a few instructions:
 * handle_slot() (a tag of the right type, a slot ever handed out),
 * handle_live() (the slot's word holds the handle's generation and
 * references of the caller) and handle_typed() (the slot's occupant has the
 * handle's type).  The cold form, handle_error(), runs where any of them
 * fails and says in words what is wrong. */

/* A parameter's name for messages: "buffer", or "argument 3". */
struct param {
  const char *name;
  long index; /* -1: not an element of a list */
};

static inline __attribute__((always_inline)) struct cs_slot *
handle_slot(cusafe_handle h, enum cs_type type) {
  unsigned tag = (unsigned)(h >> 56);
  uint32_t index = (uint32_t)h;
  if (CS_UNLIKELY(
          (type ? tag != (TAG_BASE | (unsigned)type)
                : (tag & 0xF0u) != TAG_BASE) ||
          index >= atomic_load_explicit(&cs_hot.handles, memory_order_acquire)))
    return NULL;
  return slot_at(index);
}

static inline __attribute__((always_inline)) bool handle_live(cusafe_handle h,
                                                              uint64_t word) {
  /* h's generation, moved to the word's and xor'ed out, leaves the
   * caller's references, 1 to USER_MAX if the generation is h's. */
  uint64_t users =
      (word ^ ((h << (GEN_SHIFT - 32)) & ~((1ull << GEN_SHIFT) - 1))) >>
      USER_SHIFT;
  return users - 1 < USER_MAX;
}

static inline __attribute__((always_inline)) bool
handle_typed(cusafe_handle h, const struct cs_slot *slot) {
  return atomic_load_explicit(&slot->type, memory_order_relaxed) ==
         ((h >> 56) & 0x0Fu);
}

static const char *param_text(struct param p, char buf[64]) {
  if (p.index < 0)
    return p.name;
  snprintf(buf, 64, "%s %ld", p.name, p.index);
  return buf;
}

/* Why h, parameter p, is no live handle of `want` (0: any type): judged by
 * *word, the word of its slot on which the fast form failed, or, where
 * handle_slot() failed, by the word read here. */
__attribute__((cold, noinline)) static cusafe_status
handle_error(cusafe_handle h, enum cs_type want, struct param p,
             const uint64_t *word) {
  char buf[64];
  const char *name = param_text(p, buf);
  unsigned long long hv = (unsigned long long)h;
  if (h == CUSAFE_NULL_HANDLE)
    return cs_fail(CUSAFE_ERROR_INVALID_HANDLE, "%s is the NULL handle", name);
  unsigned htype = (unsigned)(h >> 56) & 0x0Fu;
  uint64_t gen = (h >> 32) & GEN_MASK;
  struct cs_slot *slot = handle_slot(h, 0);
  if (htype < 1 || htype > CS_TYPES || gen == 0 || !slot)
    goto forged;
  /* Sequentially consistent: after the pin of a peek (calls.h). */
  uint64_t w = word ? *word : atomic_load(&slot->word);
  uint64_t slot_gen = GEN_OF(w);
  if (slot_gen != gen && gen > slot_gen)
    goto forged; /* a generation not reached was never handed out */
  if (slot_gen != gen || USERS_OF(w) == 0)
    return cs_fail(CUSAFE_ERROR_INVALID_HANDLE,
                   "%s 0x%016llx is stale: its object was released", name, hv);
  if (want && htype != (unsigned)want && handle_typed(h, slot))
    return cs_fail(CUSAFE_ERROR_INVALID_HANDLE, "%s 0x%016llx is %s, not %s",
                   name, hv, types[htype].article, types[want].article);
  /* The right slot and generation, a wrong tag. */
forged:
  return cs_fail(CUSAFE_ERROR_INVALID_HANDLE,
                 "%s 0x%016llx is not a cusafe handle", name, hv);
}

__attribute__((cold, noinline)) static cusafe_status too_many(const char *name,
                                                              cusafe_handle h) {
  return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY,
                 "%s 0x%016llx has too many references", name,
                 (unsigned long long)h);
}

/* update()'s answer, with `not_last`, when the change would drop the last
 * reference. */
#define LAST_REFERENCE ((cusafe_status)-1)

/* Checks `h` and adds `users` caller's references and `all` references to
 * it in one step.  A release passes -1 and -1.  *out is the object and *old
 * the word before the change.  Sequentially consistent, so that a release
 * of the last reference is ordered against pins (cs_pin). */
static inline __attribute__((always_inline)) cusafe_status
update(cusafe_handle h, enum cs_type want, struct param name, int users,
       int all, bool not_last, struct cs_object **out, uint64_t *old) {
  struct cs_slot *slot = handle_slot(h, want);
  if (CS_UNLIKELY(!slot))
    return handle_error(h, want, name, NULL);
  uint64_t delta = (uint64_t)((int64_t)users * (int64_t)USER_ONE + all);
  uint64_t word = atomic_load_explicit(&slot->word, memory_order_acquire);
  do {
    if (CS_UNLIKELY(!handle_live(h, word) || !handle_typed(h, slot)))
      return handle_error(h, want, name, &word);
    if (not_last && ALL_OF(word) == 1)
      return LAST_REFERENCE;
    if ((users > 0 && USERS_OF(word) + (uint64_t)users > USER_MAX) ||
        (all > 0 && ALL_OF(word) + (uint64_t)all > ALL_MAX)) {
      char buf[64];
      return too_many(param_text(name, buf), h);
    }
  } while (!atomic_compare_exchange_weak_explicit(
      &slot->word, &word, word + delta, memory_order_seq_cst,
      memory_order_acquire));
  *out = atomic_load_explicit(&slot->obj, memory_order_relaxed);
  if (old)
    *old = word;
  return CUSAFE_SUCCESS;
}

cusafe_status cs_acquire(cusafe_handle h, enum cs_type type, const char *name,
                         struct cs_object **out) {
  return update(h, type, (struct param){name, -1}, 0, 1, false, out, NULL);
}

cusafe_status cs_acquire_at(cusafe_handle h, enum cs_type type,
                            const char *name, long index,
                            struct cs_object **out) {
  return update(h, type, (struct param){name, index}, 0, 1, false, out, NULL);
}

/* A peek's whole check, in its fast form: the slot of h if h is a live
 * handle of `type` (never 0).  The word is read sequentially consistent:
 * after the pin (calls.h). */
static inline __attribute__((always_inline)) struct cs_slot *
peek_slot(cusafe_handle h, enum cs_type type) {
  struct cs_slot *slot = handle_slot(h, type);
  if (CS_LIKELY(slot) && CS_LIKELY(handle_live(h, atomic_load(&slot->word))) &&
      CS_LIKELY(handle_typed(h, slot)))
    return slot;
  return NULL;
}

/* A peek that failed its fast check: explained -- unless the handle was
 * revived meanwhile (cs_try_user_ref), when its object is the answer. */
__attribute__((cold, noinline)) static cusafe_status
peek_slow(cusafe_handle h, enum cs_type type, const char *name, long index,
          struct cs_object **out) {
  struct cs_slot *slot = handle_slot(h, type);
  uint64_t word = slot ? atomic_load(&slot->word) : 0;
  if (slot && handle_live(h, word) && handle_typed(h, slot)) {
    *out = atomic_load_explicit(&slot->obj, memory_order_relaxed);
    return CUSAFE_SUCCESS;
  }
  return handle_error(h, type, (struct param){name, index},
                      slot ? &word : NULL);
}

cusafe_status cs_peek(cusafe_handle h, enum cs_type type, const char *name,
                      long index, struct cs_object **out) {
  struct cs_slot *slot = peek_slot(h, type);
  if (CS_LIKELY(slot)) {
    *out = atomic_load_explicit(&slot->obj, memory_order_relaxed);
    return CUSAFE_SUCCESS;
  }
  return peek_slow(h, type, name, index, out);
}

const union cs_slot_data *cs_peek_data(cusafe_handle h, enum cs_type type,
                                       struct cs_object **obj) {
  struct cs_slot *slot = peek_slot(h, type);
  if (CS_LIKELY(slot)) {
    *obj = atomic_load_explicit(&slot->obj, memory_order_relaxed);
    return &slot->u.data;
  }
  return NULL;
}

cusafe_status cs_peek_buffer(cusafe_handle h, long index,
                             const struct cs_buffer_slot **out) {
  struct cs_slot *slot = peek_slot(h, CS_BUFFER);
  if (CS_LIKELY(slot)) {
    *out = &slot->u.data.buffer;
    return CUSAFE_SUCCESS;
  }
  struct cs_object *obj;
  cusafe_status st = peek_slow(h, CS_BUFFER, "argument", index, &obj);
  if (st == CUSAFE_SUCCESS)
    *out = &slot_of(obj)->u.data.buffer;
  return st;
}

/* ---- references ---------------------------------------------------------- */

/* Internal references are bounded by the table's size (16M handles), below
 * ALL_MAX: they need no check. */
void cs_ref(struct cs_object *obj) {
  atomic_fetch_add_explicit(&slot_of(obj)->word, 1, memory_order_relaxed);
}

/* Adds `change` to obj's word unless the object is being destroyed (no
 * references left) or, with check_users, the caller's count is full. */
static inline __attribute__((always_inline)) bool
try_add(struct cs_object *obj, uint64_t change, bool check_users) {
  struct cs_slot *slot = slot_of(obj);
  uint64_t word = atomic_load_explicit(&slot->word, memory_order_relaxed);
  do {
    if (ALL_OF(word) == 0 || (check_users && USERS_OF(word) == USER_MAX))
      return false;
  } while (!atomic_compare_exchange_weak_explicit(
      &slot->word, &word, word + change, memory_order_acquire,
      memory_order_relaxed));
  return true;
}

bool cs_try_ref(struct cs_object *obj) { return try_add(obj, 1, false); }

/* Adds a caller's reference to a live object -- which makes its handle
 * valid again if the caller had released it -- unless the object is being
 * destroyed or the caller's count is full. */
bool cs_try_user_ref(struct cs_object *obj) {
  return try_add(obj, USER_ONE + 1, true);
}

cusafe_status cs_user_ref(struct cs_object *obj) {
  /* The caller holds a reference, so the object lives: only the count of
   * the caller's references can be full. */
  if (cs_try_user_ref(obj))
    return CUSAFE_SUCCESS;
  return too_many(types[obj->type].name, obj->handle);
}

/* The word of a slot whose object is gone: the next generation (never 0),
 * no references. */
static uint64_t next_generation(uint64_t word) {
  uint64_t gen = (GEN_OF(word) + 1) & GEN_MASK;
  return (gen ? gen : 1) << GEN_SHIFT;
}

static void retire(struct cs_slot *slot, uint64_t word) {
  atomic_store_explicit(&slot->obj, NULL, memory_order_relaxed);
  atomic_store_explicit(&slot->word, next_generation(word),
                        memory_order_release);
  cs_spin_lock(&table_lock);
  slot->u.next_free = free_head;
  free_head = slot->index;
  cs_spin_unlock(&table_lock);
}

/* The last reference went (`word` held it): lookups see no references and
 * fail until the slot is reused.  The parent goes after its child. */
static cusafe_status destroy_last(struct cs_object *obj, uint64_t word) {
  struct cs_slot *slot = slot_of(obj);
  struct cs_object *parent = obj->parent;
  if (types[obj->type].peeked)
    cs_pins_wait(); /* launches may use it without a reference */
  free(atomic_exchange(&obj->label, NULL));
  /* In relaxed capture mode: the teardown's frees and waits must not break
   * a capture that other code began in global mode on another thread.
   * Buffers choose for themselves (cs_buffer_fini): a release of device
   * memory, the hot one, makes no such call. */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  bool relaxed = obj->type != CS_BUFFER && cs_relax(&mode);
  cusafe_status st = types[obj->type].fini(obj);
  cs_unrelax(relaxed, mode);
  types[obj->type].free(obj);
  retire(slot, word);
  return parent ? cs_first(st, cs_unref(parent)) : st;
}

cusafe_status cs_unref(struct cs_object *obj) {
  uint64_t word = atomic_fetch_sub(&slot_of(obj)->word, 1); /* see update() */
  if (ALL_OF(word) != 1)
    return CUSAFE_SUCCESS;
  return destroy_last(obj, word);
}

void cs_drop(void *held) {
  struct cs_object *obj; /* the pointer's bits: any structure's will do */
  memcpy(&obj, held, sizeof obj);
  if (obj)
    cs_unref(obj);
}

uint32_t cs_user_refs(const struct cs_object *obj) {
  return (uint32_t)USERS_OF(atomic_load(&slot_of(obj)->word));
}

/* ---- the shutdown -------------------------------------------------------- */

void cs_handle_kill(struct cs_object *obj) {
  struct cs_slot *slot = slot_of(obj);
  /* The object stays reachable through slot->obj: see shutdown.c. */
  atomic_store_explicit(
      &slot->word,
      next_generation(atomic_load_explicit(&slot->word, memory_order_relaxed)),
      memory_order_release);
}

void cs_handle_foreach(enum cs_type type, void (*fn)(struct cs_object *obj)) {
  uint32_t n = atomic_load_explicit(&cs_hot.handles, memory_order_acquire);
  for (uint32_t i = 0; i < n; i++) {
    struct cs_slot *slot = slot_at(i);
    if (ALL_OF(atomic_load_explicit(&slot->word, memory_order_acquire)) == 0)
      continue;
    struct cs_object *obj =
        atomic_load_explicit(&slot->obj, memory_order_relaxed);
    if (obj && obj->type == type)
      fn(obj);
  }
}
/* ---- the caller's references --------------------------------------------- */

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
  struct cs_object *obj = NULL;
  uint64_t old = 0;
  cusafe_status st =
      update(h, type, (struct param){name, -1}, -1, -1, false, &obj, &old);
  if (st != CUSAFE_SUCCESS || ALL_OF(old) != 1)
    return st;
  return destroy_last(obj, old);
}

_Atomic(cs_last_user_fn) cs_last_user_hook;

/* Whether h is a stream's handle, for a release of `type` (0: any): the
 * one type whose caller's last reference has a hook.  Told by the tag,
 * known at compile time for the typed releases. */
static inline __attribute__((always_inline)) bool
stream_handle(cusafe_handle h, enum cs_type type) {
  return type == CS_STREAM ||
         (type == 0 && (unsigned)(h >> 56) == (TAG_BASE | (unsigned)CS_STREAM));
}

/* A release of a stream's handle that may drop the caller's last
 * reference.  The caller's reference becomes this call's in one step
 * (users - 1, all unchanged), so that of two releases at once exactly one
 * sees the count of the caller's references go from 1 to 0, and shows the
 * object to the hook (graph.c: the end of a capture begun on the stream)
 * while it still holds it; then that reference goes, which may destroy.
 * Marked as a call: the hook and the destruction may destroy. */
__attribute__((noinline)) static cusafe_status
release_stream(cusafe_handle h, enum cs_type type, const char *name) {
  CS_ENTER_RELEASE();
  struct cs_object *obj = NULL;
  uint64_t old = 0;
  cusafe_status st =
      update(h, type, (struct param){name, -1}, -1, 0, false, &obj, &old);
  if (st != CUSAFE_SUCCESS)
    return atomic_load(&cs_hot.state) ? CUSAFE_SUCCESS : st;
  /* Sequentially consistent, after the update: a capture that begins
   * meanwhile either finds the hook's look at its stream or, after it
   * began, the caller's references gone (graph.c). */
  cs_last_user_fn hook = atomic_load(&cs_last_user_hook);
  if (hook && USERS_OF(old) == 1)
    hook(obj);
  return cs_unref(obj);
}

__attribute__((noinline)) static cusafe_status
release_slow(cusafe_handle h, enum cs_type type, const char *name) {
  if (atomic_load_explicit(&cs_hot.state, memory_order_relaxed) ||
      h == CUSAFE_NULL_HANDLE)
    return CUSAFE_SUCCESS; /* a no-op after the shutdown */
  if (stream_handle(h, type))
    return release_stream(h, type, name);
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
static __thread struct rc_memo rc_memo
    __attribute__((tls_model("initial-exec")));

/* The common case of a retain or release, in few instructions and no
 * call: a live handle of the right type, with room in its counts (and, for
 * a release, not its last reference, nor a stream's last of the caller),
 * while the library runs.  Anything else goes to the full path, which says
 * what is wrong. */
static inline __attribute__((always_inline)) bool
count_fast(cusafe_handle h, enum cs_type type, int delta) {
  if (CS_UNLIKELY(atomic_load_explicit(&cs_hot.state, memory_order_relaxed)))
    return false;
  struct cs_slot *slot = handle_slot(h, type);
  if (CS_UNLIKELY(!slot))
    return false;
  struct rc_memo *memo = &rc_memo;
  bool typed = memo->handle == h; /* the memo's word passed handle_typed */
  uint64_t word = typed
                      ? memo->word
                      : atomic_load_explicit(&slot->word, memory_order_relaxed);
  uint64_t change = delta > 0 ? USER_ONE + 1 : -(USER_ONE + 1);
  for (;;) {
    if (CS_UNLIKELY(
            !handle_live(h, word) ||
            (delta > 0 ? USERS_OF(word) == USER_MAX || ALL_OF(word) == ALL_MAX
                       : ALL_OF(word) == 1 ||
                             (stream_handle(h, type) && USERS_OF(word) == 1))))
      break;
    if (CS_UNLIKELY(!typed && !handle_typed(h, slot)))
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

#define CS_RETAIN_RELEASE(what, type)                                          \
  CUSAFE_API cusafe_status cusafe_##what##_retain(cusafe_##what h) {           \
    return retain_handle(h, type, #what);                                      \
  }                                                                            \
  CUSAFE_API cusafe_status cusafe_##what##_release(cusafe_##what h) {          \
    return release_handle(h, type, #what);                                     \
  }
CS_RETAIN_RELEASE(context, CS_CONTEXT)
CS_RETAIN_RELEASE(stream, CS_STREAM)
CS_RETAIN_RELEASE(event, CS_EVENT)
CS_RETAIN_RELEASE(buffer, CS_BUFFER)
CS_RETAIN_RELEASE(module, CS_MODULE)
CS_RETAIN_RELEASE(kernel, CS_KERNEL)
CS_RETAIN_RELEASE(graph, CS_GRAPH)

CUSAFE_API cusafe_status cusafe_retain(cusafe_handle handle) {
  return retain_handle(handle, 0, "handle");
}

CUSAFE_API cusafe_status cusafe_release(cusafe_handle handle) {
  return release_handle(handle, 0, "handle");
}

CS_QUERY(cusafe_handle_get_type, cusafe_handle_type, CUSAFE_TYPE_INVALID,
         cs_object, 0, "handle", *out = (cusafe_handle_type)o->type)

CUSAFE_API cusafe_status cusafe_handle_set_label(cusafe_handle handle,
                                                 const char *label) {
  CS_ENTER();
  CS_HOLD_OR_RETURN(cs_object, obj, handle, 0, "handle");
  char *copy = NULL;
  if (label && !(copy = strndup(label, 255)))
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  free(atomic_exchange(&obj->label, copy));
  return CUSAFE_SUCCESS;
}
