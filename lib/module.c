/* module.c -- modules (built-in kernels, images, NVRTC) and kernel lookup.
 *
 * A module is a CUDA library (cudaLibrary_t) of one context: it holds a
 * reference on the context, and each kernel holds one on its module
 * (invariant 1).  A kernel's parameter layout is read once, at lookup, so
 * that launches only compare sizes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builtin.h"
#include "internal.h"

#define BUILTIN_NAME "<built-in kernels>"
#define MEMORY_NAME "<memory image>"

/* ---- the compiler's log, per thread ---------------------------------------- */

static pthread_key_t log_key;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_key_make(void) { pthread_key_create(&log_key, free); }

/* Keeps `text` (owned, may be NULL) as the calling thread's compile log. */
static void compile_log_set(char *text) {
  pthread_once(&log_once, log_key_make);
  free(pthread_getspecific(log_key));
  pthread_setspecific(log_key, text);
}

CUSAFE_API const char *cusafe_last_compile_log(void) {
  pthread_once(&log_once, log_key_make);
  const char *text = pthread_getspecific(log_key);
  return text ? text : "";
}

/* ---- loading ------------------------------------------------------------------ */

static cusafe_status load_failed(cudaError_t err, const char *what,
                                 const char *module) {
  cusafe_status st = cs_status_of(err);
  if (st == CUSAFE_ERROR_INVALID_IMAGE || err == cudaErrorInvalidValue) {
    const char *words = cs_cu->get_error_string(err);
    cs_fail(CUSAFE_ERROR_INVALID_IMAGE, "module %s cannot be loaded: %s",
            module, words ? words : "unknown error");
    cs_note_cuda_error(err);
    return CUSAFE_ERROR_INVALID_IMAGE;
  }
  return cs_fail_cuda(err, what);
}

/* Loads an image (or the file at `path`) into a new module of ctx.  On
 * success the caller's reference on ctx passes to the module. */
static cusafe_status module_new(cusafe_module *out, struct cs_context *ctx,
                                const void *image, const char *path,
                                const char *name) {
  struct cs_module *m = calloc(1, sizeof *m);
  char *copy = strdup(name);
  if (!m || !copy) {
    free(m);
    free(copy);
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  }
  int saved;
  cusafe_status st = cs_device_enter(ctx->device, &saved);
  if (st != CUSAFE_SUCCESS)
    goto fail;
  const char *fn = path ? "cudaLibraryLoadFromFile" : "cudaLibraryLoadData";
  cudaError_t err =
      path ? cs_cu->library_load_file(&m->library, path, NULL, NULL, 0, NULL,
                                      NULL, 0)
           : cs_cu->library_load_data(&m->library, image, NULL, NULL, 0, NULL,
                                      NULL, 0);
  if (err == cudaSuccess) {
    /* Binds the device's primary context to this thread, then loads the
     * code into it, so that a bad image fails here and not at first use. */
    err = cs_cu->set_device(ctx->device);
    if (err != cudaSuccess) {
      fn = "cudaSetDevice";
    } else {
      CUresult res = cs_library_load_now(m->library);
      err = (cudaError_t)res; /* the driver's codes are the runtime's */
      fn = "cuLibraryGetModule";
    }
    if (err != cudaSuccess)
      cs_library_unload(ctx, m->library);
  }
  if (err != cudaSuccess) {
    st = load_failed(err, fn, name);
    cs_device_leave(saved);
    goto fail;
  }
  m->ctx = ctx;
  m->name = copy;
  st = cs_handle_new(&m->hdr, CS_MODULE);
  if (st != CUSAFE_SUCCESS) {
    cs_library_unload(ctx, m->library);
    cs_device_leave(saved);
    goto fail;
  }
  cs_device_leave(saved);
  *out = m->hdr.handle;
  return CUSAFE_SUCCESS;
fail:
  free(copy);
  free(m);
  return st;
}

/* The common start of the loaders: checks out and acquires ctx. */
static cusafe_status loader_begin(cusafe_module *out, cusafe_context ctx,
                                  struct cs_context **c) {
  if (out)
    *out = CUSAFE_NULL_HANDLE;
  if (!out)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  return cs_acquire(ctx, CS_CONTEXT, "context", (struct cs_object **)c);
}

static cusafe_status loader_end(cusafe_status st, struct cs_context *c) {
  if (st != CUSAFE_SUCCESS)
    cs_unref(&c->hdr);
  return st;
}

CUSAFE_API cusafe_status cusafe_module_load_builtin(cusafe_module *out,
                                                    cusafe_context ctx) {
  CS_ENTER();
  struct cs_context *c;
  cusafe_status st = loader_begin(out, ctx, &c);
  if (st != CUSAFE_SUCCESS)
    return st;
  return loader_end(module_new(out, c, cs_builtin_image, NULL, BUILTIN_NAME),
                    c);
}

CUSAFE_API cusafe_status cusafe_module_load_file(cusafe_module *out,
                                                 cusafe_context ctx,
                                                 const char *path) {
  CS_ENTER();
  struct cs_context *c;
  cusafe_status st = loader_begin(out, ctx, &c);
  if (st != CUSAFE_SUCCESS)
    return st;
  if (!path)
    st = cs_fail(CUSAFE_ERROR_INVALID_VALUE, "path is NULL");
  else
    st = module_new(out, c, NULL, path, path);
  return loader_end(st, c);
}

CUSAFE_API cusafe_status cusafe_module_load_data(cusafe_module *out,
                                                 cusafe_context ctx,
                                                 const void *image,
                                                 size_t size) {
  CS_ENTER();
  struct cs_context *c;
  cusafe_status st = loader_begin(out, ctx, &c);
  if (st != CUSAFE_SUCCESS)
    return st;
  if (!image)
    st = cs_fail(CUSAFE_ERROR_INVALID_VALUE, "image is NULL");
  else if (size == 0)
    st = cs_fail(CUSAFE_ERROR_INVALID_SIZE, "image of 0 bytes");
  else
    st = module_new(out, c, image, NULL, MEMORY_NAME);
  return loader_end(st, c);
}

/* ---- run-time compilation ------------------------------------------------------ */

static cusafe_status nvrtc_failed(nvrtcResult res, const char *what) {
  const char *words = cs_cu->nvrtc_get_error_string(res);
  return cs_fail(res == NVRTC_ERROR_OUT_OF_MEMORY ? CUSAFE_ERROR_OUT_OF_MEMORY
                                                  : CUSAFE_ERROR_COMPILE,
                 "%s failed: %s", what, words ? words : "unknown error");
}

/* Whether the caller chose an architecture already. */
static bool names_arch(const char *const *options, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (options[i] && (!strncmp(options[i], "-arch", 5) ||
                       !strncmp(options[i], "--gpu-architecture", 18)))
      return true;
  return false;
}

/* Reads the program's log; NULL if there is none. */
static char *program_log(nvrtcProgram prog) {
  size_t size = 0;
  if (cs_cu->nvrtc_get_program_log_size(prog, &size) != NVRTC_SUCCESS ||
      size == 0)
    return NULL;
  char *text = malloc(size);
  if (text && cs_cu->nvrtc_get_program_log(prog, text) != NVRTC_SUCCESS) {
    free(text);
    return NULL;
  }
  if (text)
    text[size - 1] = '\0';
  return text;
}

/* Compiles source to a cubin for ctx's architecture (*cubin malloc'd). */
static cusafe_status compile(struct cs_context *ctx, const char *source,
                             const char *name, const char *const *options,
                             size_t noptions, char **cubin) {
  const char **opts = malloc((noptions + 1) * sizeof *opts);
  if (!opts)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  for (size_t i = 0; i < noptions; i++)
    opts[i] = options[i];
  char arch[32];
  size_t n = noptions;
  if (!names_arch(options, noptions)) {
    snprintf(arch, sizeof arch, "-arch=sm_%d%d", ctx->cc_major, ctx->cc_minor);
    opts[n++] = arch;
  }
  nvrtcProgram prog;
  cusafe_status st = CUSAFE_SUCCESS;
  nvrtcResult res = cs_cu->nvrtc_create_program(&prog, source, name, 0, NULL,
                                                NULL);
  if (res != NVRTC_SUCCESS) {
    free(opts);
    return nvrtc_failed(res, "nvrtcCreateProgram");
  }
  res = cs_cu->nvrtc_compile_program(prog, (int)n, opts);
  if (res != NVRTC_SUCCESS) {
    char *text = program_log(prog);
    if (res == NVRTC_ERROR_COMPILATION || res == NVRTC_ERROR_INVALID_OPTION) {
      st = cs_fail(CUSAFE_ERROR_COMPILE, "compilation of %s failed: %s", name,
                   text && *text ? text : cs_cu->nvrtc_get_error_string(res));
    } else {
      st = nvrtc_failed(res, "nvrtcCompileProgram");
    }
    compile_log_set(text);
    goto out;
  }
  size_t size = 0;
  res = cs_cu->nvrtc_get_cubin_size(prog, &size);
  if (res != NVRTC_SUCCESS || size == 0) {
    st = res != NVRTC_SUCCESS ? nvrtc_failed(res, "nvrtcGetCUBINSize")
                              : cs_fail(CUSAFE_ERROR_COMPILE,
                                        "compilation of %s produced no cubin "
                                        "(was a virtual architecture given?)",
                                        name);
    goto out;
  }
  *cubin = malloc(size);
  if (!*cubin) {
    st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
    goto out;
  }
  res = cs_cu->nvrtc_get_cubin(prog, *cubin);
  if (res != NVRTC_SUCCESS) {
    free(*cubin);
    *cubin = NULL;
    st = nvrtc_failed(res, "nvrtcGetCUBIN");
  }
out:
  cs_cu->nvrtc_destroy_program(&prog);
  free(opts);
  return st;
}

CUSAFE_API cusafe_status cusafe_module_compile(cusafe_module *out,
                                               cusafe_context ctx,
                                               const char *source,
                                               const char *name,
                                               const char *const *options,
                                               size_t noptions) {
  CS_ENTER();
  struct cs_context *c;
  cusafe_status st = loader_begin(out, ctx, &c);
  if (st != CUSAFE_SUCCESS)
    return st;
  if (!name)
    name = "source.cu";
  char *cubin = NULL;
  if (!source)
    st = cs_fail(CUSAFE_ERROR_INVALID_VALUE, "source is NULL");
  else if (!options && noptions)
    st = cs_fail(CUSAFE_ERROR_INVALID_VALUE, "options is NULL");
  else
    st = compile(c, source, name, options, noptions, &cubin);
  if (st == CUSAFE_SUCCESS) {
    compile_log_set(NULL);
    st = module_new(out, c, cubin, NULL, name);
  }
  free(cubin);
  return loader_end(st, c);
}

/* ---- lifetime ---------------------------------------------------------------------- */

cudaError_t cs_library_unload(struct cs_context *ctx, cudaLibrary_t library) {
  cudaError_t err = cs_cu->library_unload(library);
  if (err == cudaSuccess)
    return err;
  cs_library_orphan(ctx, library);
  return err;
}

cudaError_t cs_library_orphan(struct cs_context *ctx, cudaLibrary_t library) {
  pthread_mutex_lock(&ctx->orphan_lock);
  cudaLibrary_t *grown =
      realloc(ctx->orphans, (ctx->norphans + 1) * sizeof *grown);
  if (grown) {
    ctx->orphans = grown;
    ctx->orphans[ctx->norphans++] = library;
  }
  pthread_mutex_unlock(&ctx->orphan_lock);
  return cudaSuccess;
}

void cs_context_unload_orphans(struct cs_context *ctx) {
  pthread_mutex_lock(&ctx->orphan_lock);
  for (size_t i = 0; i < ctx->norphans; i++)
    cs_cu->library_unload(ctx->orphans[i]);
  free(ctx->orphans);
  ctx->orphans = NULL;
  ctx->norphans = 0;
  pthread_mutex_unlock(&ctx->orphan_lock);
}

/* Unloads the module's code once its launches are done: they may still be
 * queued on any stream, and unloading does not wait for them.  A library
 * that fails to unload is retried before its context goes. */
static cusafe_status module_fini(struct cs_module *m) {
  int saved;
  cusafe_status st = cs_device_enter_teardown(m->ctx->device, &saved);
  if (st == CUSAFE_SUCCESS) {
    cudaError_t err = cs_cu->device_synchronize();
    if (err != cudaSuccess)
      st = cs_fail_cuda(err, "cudaDeviceSynchronize");
  }
  /* Unsynchronised, launches may still be queued: the library waits on
   * the orphan list, unloaded before the context goes, after its sync. */
  cudaError_t err = st == CUSAFE_SUCCESS
                        ? cs_library_unload(m->ctx, m->library)
                        : cs_library_orphan(m->ctx, m->library);
  if (err != cudaSuccess && st == CUSAFE_SUCCESS)
    st = cs_fail_cuda(err, "cudaLibraryUnload");
  cs_device_leave(saved);
  return st;
}

cusafe_status cs_module_destroy(struct cs_module *m) {
  struct cs_context *ctx = m->ctx;
  cusafe_status st = module_fini(m);
  free(m->name);
  free(m);
  cusafe_status st2 = cs_unref(&ctx->hdr);
  return st != CUSAFE_SUCCESS ? st : st2;
}

void cs_module_shutdown(struct cs_object *obj, void *arg) {
  (void)arg;
  module_fini((struct cs_module *)obj);
  cs_handle_kill(obj);
}

/* ---- kernels ----------------------------------------------------------------------- */

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
    cudaError_t err = cs_cu->func_get_param_info((const void *)k->fn, n,
                                                 &offset, &size);
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
  uint16_t *kinds = k->param_kinds.inline_;
  if (st == CUSAFE_SUCCESS && n > CS_INLINE_PARAMS &&
      !(kinds = malloc(n * sizeof *kinds)))
    st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  if (st != CUSAFE_SUCCESS) {
    free(sizes);
    return st;
  }
  for (size_t i = 0; i < n; i++)
    kinds[i] = kinds_of(sizes[i]);
  if (n > CS_INLINE_PARAMS)
    k->param_kinds.heap = kinds;
  k->param_size = sizes;
  k->nparams = (uint32_t)n;
  return CUSAFE_SUCCESS;
}

/* Frees what read_params() allocated. */
static void params_free(struct cs_kernel *k) {
  if (k->nparams > CS_INLINE_PARAMS)
    free(k->param_kinds.heap);
  free(k->param_size);
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
  int saved;
  cusafe_status st = cs_device_enter(m->ctx->device, &saved);
  if (st != CUSAFE_SUCCESS)
    goto fail;
  cudaError_t err = cs_cu->library_get_kernel(&k->fn, m->library, name);
  if (err == cudaErrorSymbolNotFound || err == cudaErrorInvalidDeviceFunction) {
    cs_cu->get_last_error();
    st = cs_fail(CUSAFE_ERROR_NOT_FOUND, "kernel \"%s\" not found in module %s",
                 name, m->name);
    cs_note_cuda_error(err);
  } else if (err != cudaSuccess) {
    st = load_failed(err, "cudaLibraryGetKernel", m->name);
  }
  if (st == CUSAFE_SUCCESS)
    st = read_params(k, m->name);
  if (st == CUSAFE_SUCCESS) {
    struct cudaFuncAttributes attr;
    err = cs_cu->func_get_attributes(&attr, (const void *)k->fn);
    if (err != cudaSuccess) {
      st = load_failed(err, "cudaFuncGetAttributes", m->name);
    } else {
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
      atomic_store(&k->dynamic_limit,
                   (uint32_t)attr.maxDynamicSharedSizeBytes);
    }
  }
  cs_device_leave(saved);
  if (st != CUSAFE_SUCCESS)
    goto fail;
  k->module = m;
  st = cs_handle_new(&k->hdr, CS_KERNEL);
  if (st != CUSAFE_SUCCESS)
    goto fail;
  *out = k->hdr.handle;
  return CUSAFE_SUCCESS;
fail:
  pthread_mutex_destroy(&k->limit_lock);
  params_free(k);
  free(k->name);
  free(k);
  return st;
}

CUSAFE_API cusafe_status cusafe_module_get_kernel(cusafe_kernel *out,
                                                  cusafe_module module,
                                                  const char *name) {
  if (out)
    *out = CUSAFE_NULL_HANDLE;
  CS_ENTER();
  if (!out)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  struct cs_module *m;
  cusafe_status st = cs_acquire(module, CS_MODULE, "module",
                                (struct cs_object **)&m);
  if (st != CUSAFE_SUCCESS)
    return st;
  if (!name)
    st = cs_fail(CUSAFE_ERROR_INVALID_VALUE, "name is NULL");
  else
    st = kernel_new(out, m, name); /* our reference becomes the kernel's */
  if (st != CUSAFE_SUCCESS)
    cs_unref(&m->hdr);
  return st;
}

cusafe_status cs_kernel_destroy(struct cs_kernel *k) {
  struct cs_module *m = k->module;
  pthread_mutex_destroy(&k->limit_lock);
  params_free(k);
  free(k->name);
  free(k);
  return cs_unref(&m->hdr);
}

void cs_kernel_shutdown(struct cs_object *obj, void *arg) {
  (void)arg;
  cs_handle_kill(obj);
}

CUSAFE_API cusafe_status cusafe_kernel_get_params(size_t *count,
                                                  size_t *sizes,
                                                  size_t capacity,
                                                  cusafe_kernel kernel) {
  CS_ENTER();
  if (!count)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "count is NULL");
  struct cs_kernel *k;
  cusafe_status st = cs_acquire(kernel, CS_KERNEL, "kernel",
                                (struct cs_object **)&k);
  if (st != CUSAFE_SUCCESS)
    return st;
  *count = k->nparams;
  if (sizes)
    for (size_t i = 0; i < k->nparams && i < capacity; i++)
      sizes[i] = k->param_size[i];
  cs_unref(&k->hdr);
  return CUSAFE_SUCCESS;
}
