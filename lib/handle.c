/* handle.c -- the handle table (invariant 3: handles are checked, always).
 *
 * A handle is (tag << 56) | (generation << 32) | slot index.  The tag is
 * 0xC0 | type, the generation counts the slot's reuses (24 bits, never 0).
 * Each slot holds one 64-bit word: (generation << 32) | references, so a
 * lookup takes a reference with one compare-and-swap that fails once the
 * slot was retired or reused; a freed object is never read.
 *
 * Two counts per object: the slot's count is every reference (the user's,
 * children's, in-flight work's and calls in progress); `user_refs` in the
 * object counts the references handed to the caller.  A handle is stale
 * once its user references are gone, even while children keep the object
 * alive, so that a double release is an error and not a stolen reference.
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
#define REF_MASK 0xFFFFFFFFull
#define NO_SLOT UINT32_MAX

struct cs_slot {
  _Atomic uint64_t word;        /* generation << 32 | references */
  _Atomic uint32_t user_refs;   /* references held by callers */
  struct cs_object *_Atomic obj;
  uint32_t index;
  uint32_t next_free;           /* under table_lock */
};

static struct cs_slot *_Atomic chunks[MAX_CHUNKS];
static _Atomic uint32_t high_water; /* slots ever handed out */
static uint32_t free_head = NO_SLOT;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const type_articles[] = {
    "an invalid handle", "a context", "a stream", "an event",
    "a buffer",          "a module",  "a kernel"};

static struct cs_slot *slot_at(uint32_t index) {
  struct cs_slot *chunk = atomic_load_explicit(&chunks[index >> CHUNK_BITS],
                                               memory_order_acquire);
  return chunk ? &chunk[index & (CHUNK_SLOTS - 1)] : NULL;
}

cusafe_status cs_handle_new(struct cs_object *obj, enum cs_type type) {
  pthread_mutex_lock(&table_lock);
  uint32_t index = free_head;
  struct cs_slot *slot;
  if (index != NO_SLOT) {
    slot = slot_at(index);
    free_head = slot->next_free;
  } else {
    index = atomic_load_explicit(&high_water, memory_order_relaxed);
    if ((index >> CHUNK_BITS) >= MAX_CHUNKS) {
      pthread_mutex_unlock(&table_lock);
      return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY,
                     "the handle table is full (%u handles)",
                     MAX_CHUNKS * CHUNK_SLOTS);
    }
    if (!atomic_load_explicit(&chunks[index >> CHUNK_BITS],
                              memory_order_relaxed)) {
      struct cs_slot *chunk = calloc(CHUNK_SLOTS, sizeof *chunk);
      if (!chunk) {
        pthread_mutex_unlock(&table_lock);
        return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY,
                       "out of host memory growing the handle table");
      }
      for (uint32_t i = 0; i < CHUNK_SLOTS; i++) {
        chunk[i].index = index + i;
        atomic_init(&chunk[i].word, 1ull << 32); /* generation 1 */
      }
      atomic_store_explicit(&chunks[index >> CHUNK_BITS], chunk,
                            memory_order_release);
    }
    slot = slot_at(index);
    atomic_store_explicit(&high_water, index + 1, memory_order_release);
  }
  pthread_mutex_unlock(&table_lock);

  uint64_t gen = atomic_load_explicit(&slot->word, memory_order_relaxed) >> 32;
  obj->slot = slot;
  obj->type = type;
  obj->handle = ((uint64_t)(TAG_BASE | type) << 56) | (gen << 32) | index;
  atomic_store_explicit(&slot->obj, obj, memory_order_relaxed);
  atomic_store_explicit(&slot->user_refs, 1, memory_order_relaxed);
  /* Publishes obj: a lookup that sees the reference sees the object. */
  atomic_store_explicit(&slot->word, (gen << 32) | 1, memory_order_release);
  return CUSAFE_SUCCESS;
}

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

static cusafe_status forged(struct param p, cusafe_handle h) {
  char buf[64];
  return cs_fail(CUSAFE_ERROR_INVALID_HANDLE,
                 "%s 0x%016llx is not a cusafe handle", param_text(p, buf),
                 (unsigned long long)h);
}

static cusafe_status stale(struct param p, cusafe_handle h) {
  char buf[64];
  return cs_fail(CUSAFE_ERROR_INVALID_HANDLE,
                 "%s 0x%016llx is stale: its object was released",
                 param_text(p, buf), (unsigned long long)h);
}

/* Takes a reference on the slot's object if `h` is still its handle. */
static cusafe_status lookup(cusafe_handle h, struct param name,
                            struct cs_object **out) {
  if (h == CUSAFE_NULL_HANDLE) {
    char buf[64];
    return cs_fail(CUSAFE_ERROR_INVALID_HANDLE, "%s is the NULL handle",
                   param_text(name, buf));
  }
  unsigned tag = (unsigned)(h >> 56);
  uint32_t index = (uint32_t)h;
  uint64_t gen = (h >> 32) & GEN_MASK;
  if ((tag & 0xF0u) != TAG_BASE || (tag & 0x0Fu) < CS_CONTEXT ||
      (tag & 0x0Fu) > CS_TYPE_LAST || gen == 0 ||
      index >= atomic_load_explicit(&high_water, memory_order_acquire))
    return forged(name, h);
  struct cs_slot *slot = slot_at(index);
  uint64_t word = atomic_load_explicit(&slot->word, memory_order_acquire);
  do {
    uint64_t slot_gen = word >> 32;
    if (slot_gen != gen) {
      /* A generation the slot has not reached was never handed out. */
      return gen > slot_gen ? forged(name, h) : stale(name, h);
    }
    if ((word & REF_MASK) == 0)
      return stale(name, h);
  } while (!atomic_compare_exchange_weak_explicit(
      &slot->word, &word, word + 1, memory_order_acquire,
      memory_order_acquire));
  struct cs_object *obj = atomic_load_explicit(&slot->obj,
                                               memory_order_relaxed);
  if (obj->handle != h) { /* right slot and generation, wrong tag */
    cs_unref(obj);
    return forged(name, h);
  }
  *out = obj;
  return CUSAFE_SUCCESS;
}

static cusafe_status acquire(cusafe_handle h, enum cs_type type,
                             struct param name, struct cs_object **out) {
  struct cs_object *obj = NULL;
  cusafe_status st = lookup(h, name, &obj);
  if (st != CUSAFE_SUCCESS)
    return st;
  if (atomic_load_explicit(&obj->slot->user_refs, memory_order_acquire) == 0) {
    cs_unref(obj);
    return stale(name, h);
  }
  if (type && obj->type != type) {
    char buf[64];
    enum cs_type got = obj->type;
    cs_unref(obj);
    return cs_fail(CUSAFE_ERROR_INVALID_HANDLE, "%s 0x%016llx is %s, not %s",
                   param_text(name, buf), (unsigned long long)h,
                   type_articles[got], type_articles[type]);
  }
  *out = obj;
  return CUSAFE_SUCCESS;
}

cusafe_status cs_acquire(cusafe_handle h, enum cs_type type, const char *name,
                         struct cs_object **out) {
  return acquire(h, type, (struct param){name, -1}, out);
}

cusafe_status cs_acquire_nth(cusafe_handle h, enum cs_type type,
                             const char *name, size_t index,
                             struct cs_object **out) {
  return acquire(h, type, (struct param){name, (long)index}, out);
}

void cs_ref(struct cs_object *obj) {
  atomic_fetch_add_explicit(&obj->slot->word, 1, memory_order_relaxed);
}

bool cs_try_user_ref(struct cs_object *obj) {
  uint64_t word = atomic_load_explicit(&obj->slot->word, memory_order_relaxed);
  do {
    if ((word & REF_MASK) == 0)
      return false;
  } while (!atomic_compare_exchange_weak_explicit(
      &obj->slot->word, &word, word + 1, memory_order_acquire,
      memory_order_relaxed));
  atomic_fetch_add_explicit(&obj->slot->user_refs, 1, memory_order_relaxed);
  return true;
}

static void retire(struct cs_slot *slot, uint64_t gen) {
  gen = (gen + 1) & GEN_MASK;
  if (gen == 0)
    gen = 1;
  atomic_store_explicit(&slot->obj, NULL, memory_order_relaxed);
  atomic_store_explicit(&slot->word, gen << 32, memory_order_release);
  pthread_mutex_lock(&table_lock);
  slot->next_free = free_head;
  free_head = slot->index;
  pthread_mutex_unlock(&table_lock);
}

/* The last reference went (`word` held it): lookups now see zero
 * references and fail until the slot is reused. */
static cusafe_status destroy_last(struct cs_object *obj, uint64_t word) {
  struct cs_slot *slot = obj->slot;
  free(atomic_exchange(&obj->label, NULL));
  cusafe_status st = cs_destroy(obj);
  retire(slot, word >> 32);
  return st;
}

cusafe_status cs_unref(struct cs_object *obj) {
  uint64_t word =
      atomic_fetch_sub_explicit(&obj->slot->word, 1, memory_order_acq_rel);
  if ((word & REF_MASK) != 1)
    return CUSAFE_SUCCESS;
  return destroy_last(obj, word);
}

void cs_handle_kill(struct cs_object *obj) {
  struct cs_slot *slot = obj->slot;
  uint64_t gen = atomic_load_explicit(&slot->word, memory_order_relaxed) >> 32;
  gen = (gen + 1) & GEN_MASK;
  atomic_store_explicit(&slot->user_refs, 0, memory_order_relaxed);
  /* The object stays reachable through slot->obj: see cusafe_shutdown(). */
  atomic_store_explicit(&slot->word, (gen ? gen : 1) << 32,
                        memory_order_release);
}

uint32_t cs_user_refs(const struct cs_object *obj) {
  return atomic_load_explicit(&obj->slot->user_refs, memory_order_acquire);
}

void cs_handle_foreach(enum cs_type type,
                       void (*fn)(struct cs_object *obj, void *arg),
                       void *arg) {
  uint32_t n = atomic_load_explicit(&high_water, memory_order_acquire);
  for (uint32_t i = 0; i < n; i++) {
    struct cs_slot *slot = slot_at(i);
    if ((atomic_load_explicit(&slot->word, memory_order_acquire) & REF_MASK) ==
        0)
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

/* ---- user references ------------------------------------------------------ */

void cs_user_ref(struct cs_object *obj) {
  atomic_fetch_add_explicit(&obj->slot->user_refs, 1, memory_order_relaxed);
  cs_ref(obj);
}

cusafe_status cs_retain_handle(cusafe_handle h, enum cs_type type,
                               const char *name) {
  CS_ENTER();
  struct cs_object *obj;
  cusafe_status st = cs_acquire(h, type, name, &obj);
  if (st != CUSAFE_SUCCESS)
    return st;
  /* The reference the lookup took becomes the caller's. */
  atomic_fetch_add_explicit(&obj->slot->user_refs, 1, memory_order_relaxed);
  return CUSAFE_SUCCESS;
}

cusafe_status cs_release_handle(cusafe_handle h, enum cs_type type,
                                const char *name) {
  CS_ENTER_RELEASE();
  if (h == CUSAFE_NULL_HANDLE)
    return CUSAFE_SUCCESS;
  struct cs_object *obj;
  cusafe_status st = cs_acquire(h, type, name, &obj);
  if (st != CUSAFE_SUCCESS)
    return st;
  uint32_t users =
      atomic_load_explicit(&obj->slot->user_refs, memory_order_relaxed);
  do {
    if (users == 0) { /* another thread released the last one meanwhile */
      cs_unref(obj);
      return stale((struct param){name, -1}, h);
    }
  } while (!atomic_compare_exchange_weak_explicit(
      &obj->slot->user_refs, &users, users - 1, memory_order_acq_rel,
      memory_order_relaxed));
  /* The caller's reference and ours, in one step. */
  uint64_t word =
      atomic_fetch_sub_explicit(&obj->slot->word, 2, memory_order_acq_rel);
  if ((word & REF_MASK) != 2)
    return CUSAFE_SUCCESS;
  return destroy_last(obj, word);
}

CUSAFE_API cusafe_status cusafe_retain(cusafe_handle handle) {
  return cs_retain_handle(handle, 0, "handle");
}

CUSAFE_API cusafe_status cusafe_release(cusafe_handle handle) {
  return cs_release_handle(handle, 0, "handle");
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
