/* kernel.c -- kernels: lookup in a module, the parameter layout read once
 * (cudaFuncGetParamInfo), the kernel's and the device's limits, and the
 * queries of a kernel.  A kernel holds a reference on its module
 * (invariant 1); launches are in launch.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "device.h"
#include "kernel.h"
#include "module.h"

static const char dims[3] = {'x', 'y', 'z'};

/* ---- lookup -------------------------------------------------------------- */

/* The most bytes one parameter may take: kept in 16 bits, far above the
 * 32 764 bytes that CUDA allows all the parameters of a kernel together.
 * No parameter takes 0 bytes (a C++ object takes one at least), which a
 * launch relies on to tell the kinds of arguments apart. */
#define PARAM_MAX UINT16_MAX

/* The fixed-size kinds of argument that a parameter of `size` bytes
 * accepts, as a mask: bit k for kind k. */
static uint16_t kinds_of(size_t size) {
  uint16_t mask = 0;
  for (unsigned kind = 0; kind < 16; kind++)
    if (cs_kind_size(kind) == size)
      mask |= (uint16_t)(1u << kind);
  return mask;
}

/* Reads the kernel's parameter sizes, and the kinds each accepts:
 * cudaFuncGetParamInfo answers cudaErrorInvalidValue past the last
 * parameter. */
static cusafe_status read_params(struct cs_kernel *k, const char *module) {
  size_t cap = 8, n = 0;
  uint16_t *sizes = malloc(cap * sizeof *sizes);
  cusafe_status st = CUSAFE_SUCCESS;
  if (!sizes)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  for (;; n++) {
    size_t offset, size;
    cudaError_t err =
        cs_cu->func_get_param_info((const void *)k->fn, n, &offset, &size);
    if (err == cudaErrorInvalidValue) {
      cs_cu->get_last_error(); /* the end of the list is no error to others */
      break;
    }
    if (err != cudaSuccess) {
      st = cs_fail_cuda(err, "cudaFuncGetParamInfo");
      break;
    }
    if (size == 0 || size > PARAM_MAX) { /* launches rely on 1..PARAM_MAX */
      st = cs_fail(CUSAFE_ERROR_NOT_SUPPORTED,
                   "parameter %zu of kernel %s in module %s is %zu bytes; "
                   "cusafe supports 1 to %u",
                   n, k->name, module, size, (unsigned)PARAM_MAX);
      break;
    }
    if (n == cap) {
      uint16_t *grown = realloc(sizes, 2 * cap * sizeof *grown);
      if (!grown) {
        st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
        break;
      }
      sizes = grown;
      cap *= 2;
    }
    sizes[n] = (uint16_t)size;
  }
  _Atomic uint16_t *kinds = k->param_kinds.inline_;
  if (st == CUSAFE_SUCCESS && n > CS_INLINE_PARAMS &&
      !(kinds = malloc(n * sizeof *kinds)))
    st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  if (st != CUSAFE_SUCCESS) {
    free(sizes);
    return st;
  }
  for (size_t i = 0; i < n; i++)
    atomic_init(&kinds[i], kinds_of(sizes[i]));
  if (n > CS_INLINE_PARAMS)
    k->param_kinds.heap = kinds;
  k->param_size = sizes;
  k->nparams = (uint32_t)n;
  return CUSAFE_SUCCESS;
}

/* ---- types --------------------------------------------------------------- */

/* The built-in kernels' parameters (kernels/<op>.cu), declared. */
static const struct {
  const char *name, *params;
} builtin_params[] = {
    {"cusafe_fill_f32", "float *x, float value, size_t n"},
    {"cusafe_fill_f64", "double *x, double value, size_t n"},
    {"cusafe_scale_f32", "float *x, float a, size_t n"},
    {"cusafe_scale_f64", "double *x, double a, size_t n"},
    {"cusafe_axpy_f32", "float *y, float a, const float *x, size_t n"},
    {"cusafe_axpy_f64", "double *y, double a, const double *x, size_t n"},
    {"cusafe_vecadd_f32", "float *c, const float *a, const float *b, size_t n"},
    {"cusafe_vecadd_f64",
     "double *c, const double *a, const double *b, size_t n"},
};

#define KIND(k) ((uint16_t)(1u << CUSAFE_ARG_##k))
#define INT_KINDS                                                              \
  (KIND(I8) | KIND(U8) | KIND(I16) | KIND(U16) | KIND(I32) | KIND(U32) |       \
   KIND(I64) | KIND(U64))

/* The kinds of argument that a parameter of type t and `size` bytes
 * accepts: a pointer a buffer only, an integer the integers of its width
 * (of either sign: Python passes its ints as 64-bit signed ones to size_t
 * parameters), a float or a double itself.  A struct or an unknown type
 * takes every kind of its size (and bytes): a struct of 8 bytes may be a
 * handle passed as a 64-bit integer. */
static uint16_t kinds_of_type(const struct cs_param_type *t, size_t size) {
  uint16_t same = kinds_of(size);
  switch (t->cls) {
  case CS_TYPE_POINTER: return same & KIND(BUFFER);
  case CS_TYPE_INT: return same & INT_KINDS;
  case CS_TYPE_BOOL: return same & (KIND(I8) | KIND(U8));
  case CS_TYPE_FLOAT: return same & KIND(F32);
  case CS_TYPE_DOUBLE: return same & KIND(F64);
  default: return same;
  }
}

/* The first parameter whose type implies another size than the kernel's
 * parameter has, or nparams. */
static size_t first_misfit(const struct cs_kernel *k,
                           const struct cs_signature *sig) {
  for (size_t i = 0; i < k->nparams; i++)
    if (sig->params[i].size && sig->params[i].size != k->param_size[i])
      return i;
  return k->nparams;
}

/* Makes sig (which fits k) k's: the types first, then the masks narrowed
 * by them, so that a launch which sees a narrowed mask and not yet the
 * types still refuses what the mask refuses (launch.c, arg_unusual).  The
 * signature replaced stays until the kernel goes: a launch may read it.
 * Under sig_lock, or before k has a handle. */
static void publish(struct cs_kernel *k, struct cs_signature *sig) {
  sig->prev = atomic_load_explicit(&k->sig, memory_order_relaxed);
  atomic_store_explicit(&k->sig, sig, memory_order_release);
  _Atomic uint16_t *kinds = cs_kernel_kinds(k);
  for (size_t i = 0; i < k->nparams; i++)
    atomic_store_explicit(&kinds[i],
                          kinds_of_type(&sig->params[i], k->param_size[i]),
                          memory_order_relaxed);
}

/* Learns k's types where they can be known: the built-in kernels declare
 * theirs, a mangled name says them.  Where they cannot be read, or do not
 * fit the parameters CUDA reports, k keeps the sizes alone. */
static void learn_types(struct cs_kernel *k, const struct cs_module *m) {
  struct cs_signature *sig = NULL;
  if (m->builtin) {
    char why[128];
    for (size_t i = 0; i < sizeof builtin_params / sizeof builtin_params[0];
         i++)
      if (strcmp(k->name, builtin_params[i].name) == 0)
        (void)cs_signature_declare(&sig, k->name, strlen(k->name),
                                   builtin_params[i].params, why, sizeof why);
  } else {
    sig = cs_signature_demangle(k->name);
  }
  if (sig && sig->nparams == k->nparams && first_misfit(k, sig) == k->nparams)
    publish(k, sig);
  else
    free(sig);
}

/* Frees k, whose handle is retired or was never made. */
static void kernel_free(struct cs_kernel *k) {
  struct cs_signature *sig = atomic_load(&k->sig);
  while (sig) {
    struct cs_signature *prev = sig->prev;
    free(sig);
    sig = prev;
  }
  pthread_mutex_destroy(&k->sig_lock);
  pthread_mutex_destroy(&k->limit_lock);
  if (k->nparams > CS_INLINE_PARAMS)
    free(k->param_kinds.heap);
  free(k->param_size);
  free(k->name);
  free(k);
}

/* Reads the kernel's limits, and the device's from its context. */
static cusafe_status read_limits(struct cs_kernel *k, struct cs_module *m) {
  struct cudaFuncAttributes attr;
  cudaError_t err = cs_cu->func_get_attributes(&attr, (const void *)k->fn);
  if (err != cudaSuccess)
    return cs_module_load_failed(err, "cudaFuncGetAttributes", m->name);
  k->max_threads = attr.maxThreadsPerBlock;
  k->static_shared = attr.sharedSizeBytes;
  struct cs_context *ctx = m->ctx;
  k->ctx = ctx;
  k->default_stream = ctx->queue.stream;
  for (int d = 0; d < 3; d++) {
    k->max_block[d] = ctx->max_block[d];
    k->max_grid[d] = ctx->max_grid[d];
  }
  /* Both fit 32 bits: a device has kilobytes of shared memory. */
  k->shared_limit = ctx->shared_optin > k->static_shared
                        ? (uint32_t)(ctx->shared_optin - k->static_shared)
                        : 0;
  atomic_store(&k->dynamic_limit, (uint32_t)attr.maxDynamicSharedSizeBytes);
  return CUSAFE_SUCCESS;
}

/* Looks the kernel up in m and reads its layout and limits. */
static cusafe_status kernel_new(cusafe_kernel *out, struct cs_module *m,
                                const char *name) {
  /* 64-byte aligned: a launch reads the first two lines only. */
  size_t bytes = (sizeof(struct cs_kernel) + 63) & ~(size_t)63;
  struct cs_kernel *k = aligned_alloc(64, bytes);
  if (k)
    memset(k, 0, bytes);
  if (!k || !(k->name = strdup(name))) {
    free(k);
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  }
  pthread_mutex_init(&k->limit_lock, NULL);
  pthread_mutex_init(&k->sig_lock, NULL);
  int saved;
  cusafe_status st = cs_device_enter(m->ctx->device, &saved);
  if (st != CUSAFE_SUCCESS)
    goto fail;
  cudaError_t err = cs_cu->library_get_kernel(&k->fn, m->library, name);
  if (err == cudaErrorSymbolNotFound || err == cudaErrorInvalidDeviceFunction) {
    cs_cu->get_last_error();
    st = cs_fail_as(CUSAFE_ERROR_NOT_FOUND, err,
                    "kernel \"%s\" not found in module %s", name, m->name);
  } else if (err != cudaSuccess) {
    st = cs_module_load_failed(err, "cudaLibraryGetKernel", m->name);
  }
  if (st == CUSAFE_SUCCESS)
    st = read_params(k, m->name);
  if (st == CUSAFE_SUCCESS)
    st = read_limits(k, m);
  cs_device_leave(saved);
  if (st == CUSAFE_SUCCESS)
    learn_types(k, m);
  if (st != CUSAFE_SUCCESS)
    goto fail;
  k->module = m;
  k->hdr.parent = &m->hdr;
  st = cs_handle_new(&k->hdr, CS_KERNEL);
  if (st != CUSAFE_SUCCESS)
    goto fail;
  *out = k->hdr.handle;
  return CUSAFE_SUCCESS;
fail:
  kernel_free(k);
  return st;
}

CUSAFE_API cusafe_status cusafe_module_get_kernel(cusafe_kernel *out,
                                                  cusafe_module module,
                                                  const char *name) {
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  CS_HOLD_OR_RETURN(cs_module, m, module, CS_MODULE, "module");
  if (!name)
    return cs_null("name");
  cusafe_status st = kernel_new(out, m, name);
  if (st == CUSAFE_SUCCESS)
    m = NULL; /* the kernel's reference now */
  return st;
}

/* A kernel holds nothing of CUDA's: its module unloads the code. */
cusafe_status cs_kernel_fini(struct cs_object *obj) {
  (void)obj;
  return CUSAFE_SUCCESS;
}

void cs_kernel_free(struct cs_object *obj) {
  kernel_free((struct cs_kernel *)obj);
}

void cs_kernel_describe(const struct cs_object *obj, char *what, size_t size) {
  const struct cs_kernel *k = (const struct cs_kernel *)obj;
  snprintf(what, size, "%s on device %d", k->name, k->ctx->device);
}

CUSAFE_API cusafe_status cusafe_kernel_get_params(size_t *count, size_t *sizes,
                                                  size_t capacity,
                                                  cusafe_kernel kernel) {
  CS_ENTER_OUT(count, 0);
  CS_HOLD_OR_RETURN(cs_kernel, k, kernel, CS_KERNEL, "kernel");
  *count = k->nparams;
  if (sizes)
    for (size_t i = 0; i < k->nparams && i < capacity; i++)
      sizes[i] = k->param_size[i];
  return CUSAFE_SUCCESS;
}

CUSAFE_API cusafe_status cusafe_kernel_declare(cusafe_kernel kernel,
                                               const char *signature) {
  CS_ENTER();
  CS_HOLD_OR_RETURN(cs_kernel, k, kernel, CS_KERNEL, "kernel");
  if (!signature)
    return cs_null("signature");
  pthread_mutex_lock(&k->sig_lock);
  /* The name stays the one known: a mangled name's, demangled. */
  const struct cs_signature *old =
      atomic_load_explicit(&k->sig, memory_order_relaxed);
  const char *name = old ? old->text : k->name;
  /* A name's first 1024 bytes are enough for messages. */
  size_t full = old ? old->name_len : strlen(k->name);
  int name_len = (int)(full < 1024 ? full : 1024);
  struct cs_signature *sig = NULL;
  char why[160];
  size_t i;
  cusafe_status st = CUSAFE_SUCCESS;
  switch (cs_signature_declare(&sig, name, (size_t)name_len, signature, why,
                               sizeof why)) {
  case 0: break;
  case 1:
    st = cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                 "cannot read the declaration \"%.200s\": %s", signature, why);
    break;
  case 3:
    st = cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                 "the declaration is too long: its types take more than %d "
                 "bytes",
                 CS_SIG_TEXT_MAX);
    break;
  default: st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  }
  if (st != CUSAFE_SUCCESS) {
    /* refused */
  } else if (sig->nparams != k->nparams) {
    st = cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                 "the declaration has %u parameters, kernel %.*s has %u",
                 (unsigned)sig->nparams, name_len, name, (unsigned)k->nparams);
  } else if ((i = first_misfit(k, sig)) < k->nparams) {
    const struct cs_param_type *t = &sig->params[i];
    st = cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                 "parameter %zu is declared %.*s (%u byte%s), the kernel's "
                 "is %u byte%s",
                 i, (int)t->len, sig->text + t->off, (unsigned)t->size,
                 t->size == 1 ? "" : "s", (unsigned)k->param_size[i],
                 k->param_size[i] == 1 ? "" : "s");
  } else if (old && strcmp(old->text, sig->text) == 0) {
    /* The types the kernel has (the same text, the same types): nothing
     * to publish, and no block kept. */
  } else {
    publish(k, sig);
    sig = NULL;
  }
  pthread_mutex_unlock(&k->sig_lock);
  free(sig);
  return st;
}

CUSAFE_API cusafe_status cusafe_kernel_get_signature(char *out, size_t capacity,
                                                     size_t *length,
                                                     cusafe_kernel kernel) {
  CS_ENTER_OUT(length, 0);
  if (!out && capacity)
    return cs_null("out");
  CS_HOLD_OR_RETURN(cs_kernel, k, kernel, CS_KERNEL, "kernel");
  const struct cs_signature *sig =
      atomic_load_explicit(&k->sig, memory_order_acquire);
  int n = sig ? snprintf(out, capacity, "%s", sig->text)
              : snprintf(out, capacity, "%s(?)", k->name);
  *length = n > 0 ? (size_t)n : 0;
  return CUSAFE_SUCCESS;
}

/* ---- limits -------------------------------------------------------------- */

/* The first of the three dimensions of a grid or block (`what`) that is
 * above its limit, in words. */
static cusafe_status check_dims(const char *what, const uint32_t dim[3],
                                const int limit[3]) {
  for (int d = 0; d < 3; d++)
    if (dim[d] > (uint32_t)limit[d])
      return cs_fail(CUSAFE_ERROR_INVALID_CONFIGURATION,
                     "%s dimension %c of %u exceeds the device's limit of %d",
                     what, dims[d], dim[d], limit[d]);
  return CUSAFE_SUCCESS;
}

cusafe_status cs_kernel_check_config(const struct cs_kernel *k,
                                     const cusafe_launch_config *c) {
  for (int d = 0; d < 3; d++) {
    if (c->grid[d] == 0)
      return cs_fail(CUSAFE_ERROR_INVALID_CONFIGURATION,
                     "grid dimension %c is 0", dims[d]);
    if (c->block[d] == 0)
      return cs_fail(CUSAFE_ERROR_INVALID_CONFIGURATION,
                     "block dimension %c is 0", dims[d]);
  }
  cusafe_status st = check_dims("block", c->block, k->max_block);
  if (st != CUSAFE_SUCCESS)
    return st;
  uint64_t threads =
      (uint64_t)c->block[0] * c->block[1] * (uint64_t)c->block[2];
  if (threads > (uint64_t)k->max_threads)
    return cs_fail(CUSAFE_ERROR_INVALID_CONFIGURATION,
                   "block of %llu threads exceeds the kernel's limit of %d",
                   (unsigned long long)threads, k->max_threads);
  st = check_dims("grid", c->grid, k->max_grid);
  if (st != CUSAFE_SUCCESS)
    return st;
  if (c->shared_memory > k->shared_limit)
    return cs_fail(CUSAFE_ERROR_INVALID_CONFIGURATION,
                   "%zu bytes of shared memory exceed the device's limit of "
                   "%zu",
                   c->shared_memory, (size_t)k->shared_limit);
  return CUSAFE_SUCCESS;
}

cusafe_status cs_kernel_raise_shared(struct cs_kernel *k, size_t bytes) {
  cusafe_status st = CUSAFE_SUCCESS;
  pthread_mutex_lock(&k->limit_lock);
  if (bytes > atomic_load(&k->dynamic_limit)) {
    cudaError_t err = cs_cu->kernel_set_attribute_for_device(
        k->fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes,
        k->ctx->device);
    if (err != cudaSuccess)
      st = cs_fail_cuda(err, "cudaKernelSetAttributeForDevice");
    else
      atomic_store(&k->dynamic_limit, (uint32_t)bytes); /* <= shared_limit */
  }
  pthread_mutex_unlock(&k->limit_lock);
  return st;
}

/* ---- queries ------------------------------------------------------------- */

/* The largest block size that reaches the highest occupancy, as the
 * runtime's own cudaOccupancyMaxPotentialBlockSize chooses (the kernel's
 * device current). */
static cusafe_status best_block(int *out, const struct cs_kernel *k,
                                size_t shared_memory) {
  int best_threads = 0, warp = k->ctx->warp_size;
  *out = 0;
  for (int size = warp; size <= k->max_threads; size += warp) {
    int blocks = 0;
    cudaError_t err = cs_cu->occupancy_max_active_blocks(
        &blocks, (const void *)k->fn, size, shared_memory);
    if (err != cudaSuccess)
      return cs_fail_cuda(err, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    if (blocks * size >= best_threads && blocks > 0) {
      best_threads = blocks * size;
      *out = size;
    }
  }
  if (*out == 0)
    return cs_fail(CUSAFE_ERROR_INVALID_CONFIGURATION,
                   "kernel %s cannot run with %zu bytes of shared memory",
                   k->name, shared_memory);
  return CUSAFE_SUCCESS;
}

CUSAFE_API cusafe_status cusafe_kernel_suggest_config(uint32_t *block,
                                                      uint32_t *grid,
                                                      cusafe_kernel kernel,
                                                      size_t shared_memory,
                                                      size_t n) {
  CS_ENTER();
  if (!block || !grid)
    return cs_null(block ? "grid" : "block");
  CS_HOLD_OR_RETURN(cs_kernel, k, kernel, CS_KERNEL, "kernel");
  cusafe_launch_config probe = {{1, 1, 1}, {1, 1, 1}, shared_memory, 0};
  cusafe_status st = cs_kernel_check_config(k, &probe);
  if (st == CUSAFE_SUCCESS)
    st = cs_kernel_allow_shared(k, shared_memory);
  int saved, size = 0;
  if (st == CUSAFE_SUCCESS &&
      (st = cs_device_enter(k->ctx->device, &saved)) == CUSAFE_SUCCESS) {
    st = best_block(&size, k, shared_memory);
    cs_device_leave(saved);
  }
  if (st != CUSAFE_SUCCESS)
    return st;
  size_t blocks = n / (size_t)size + (n % (size_t)size != 0);
  if (blocks == 0)
    blocks = 1;
  if (blocks > (size_t)k->max_grid[0])
    blocks = (size_t)k->max_grid[0];
  *block = (uint32_t)size;
  *grid = (uint32_t)blocks;
  return CUSAFE_SUCCESS;
}
