/* module.c -- modules: built-in kernels, images and files, and CUDA
 * source compiled at run time with NVRTC.
 *
 * A module is a CUDA library (cudaLibrary_t) of one context: it holds a
 * reference on the context, and each kernel holds one on its module
 * (invariant 1).  Its code is unloaded only after the launches that use
 * it, and before its context goes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builtin.h"
#include "context.h"
#include "device.h"
#include "graph.h"
#include "init.h"
#include "module.h"

#define BUILTIN_NAME "<built-in kernels>"
#define MEMORY_NAME "<memory image>"

/* ---- the compiler's log, per thread -------------------------------------- */

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

/* ---- loading ------------------------------------------------------------- */

cusafe_status cs_module_load_failed(cudaError_t err, const char *function,
                                    const char *module) {
  cusafe_status st = cs_status_of(err);
  if (st == CUSAFE_ERROR_INVALID_IMAGE || err == cudaErrorInvalidValue) {
    const char *words = cs_cu->get_error_string(err);
    return cs_fail_as(CUSAFE_ERROR_INVALID_IMAGE, err,
                      "module %s cannot be loaded: %s", module,
                      words ? words : "unknown error");
  }
  return cs_fail_cuda(err, function);
}

/* Unloads a library of ctx; one that fails to unload is kept until ctx
 * goes (cs_context_orphan), so that no code outlives its context. */
static cudaError_t library_unload(struct cs_context *ctx,
                                  cudaLibrary_t library) {
  cudaError_t err = cs_cu->library_unload(library);
  if (err != cudaSuccess)
    cs_context_orphan(ctx, library);
  return err;
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
  cudaError_t err = path ? cs_cu->library_load_file(&m->library, path, NULL,
                                                    NULL, 0, NULL, NULL, 0)
                         : cs_cu->library_load_data(&m->library, image, NULL,
                                                    NULL, 0, NULL, NULL, 0);
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
      library_unload(ctx, m->library);
  }
  if (err != cudaSuccess) {
    st = cs_module_load_failed(err, fn, name);
    cs_device_leave(saved);
    goto fail;
  }
  m->hdr.parent = &ctx->hdr;
  m->ctx = ctx;
  m->name = copy;
  m->builtin = image == cs_builtin_image;
  st = cs_handle_new(&m->hdr, CS_MODULE);
  if (st != CUSAFE_SUCCESS) {
    library_unload(ctx, m->library);
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

/* ---- run-time compilation ------------------------------------------------ */

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
  nvrtcResult res =
      cs_cu->nvrtc_create_program(&prog, source, name, 0, NULL, NULL);
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

/* ---- loaders ------------------------------------------------------------- */

/* Where a module's code comes from: an image in memory, a file, or CUDA
 * source to compile. */
struct code {
  enum { FROM_IMAGE, FROM_FILE, FROM_SOURCE } from;
  const void *image; /* FROM_IMAGE: `size` bytes */
  size_t size;
  const char *path;   /* FROM_FILE */
  const char *source; /* FROM_SOURCE, with `noptions` options */
  const char *const *options;
  size_t noptions;
  const char *name; /* for messages */
};

/* The arguments that describe the code, checked. */
static cusafe_status code_check(const struct code *c) {
  switch (c->from) {
  case FROM_FILE: return c->path ? CUSAFE_SUCCESS : cs_null("path");
  case FROM_SOURCE:
    if (!c->source)
      return cs_null("source");
    return !c->options && c->noptions ? cs_null("options") : CUSAFE_SUCCESS;
  default:
    if (!c->image)
      return cs_null("image");
    if (c->size == 0)
      return cs_fail(CUSAFE_ERROR_INVALID_SIZE, "image of 0 bytes");
    return CUSAFE_SUCCESS;
  }
}

/* The one path of every loader: acquires the context, checks the code's
 * arguments, compiles source, and loads the code into a new module, which
 * takes over the reference on the context. */
static cusafe_status module_load(cusafe_module *out, cusafe_context ctx,
                                 struct code code) {
  CS_HOLD_OR_RETURN(cs_context, c, ctx, CS_CONTEXT, "context");
  char *cubin = NULL;
  cusafe_status st = code_check(&code);
  if (st == CUSAFE_SUCCESS && code.from == FROM_SOURCE) {
    st =
        compile(c, code.source, code.name, code.options, code.noptions, &cubin);
    if (st == CUSAFE_SUCCESS)
      compile_log_set(NULL);
    code.image = cubin;
  }
  if (st == CUSAFE_SUCCESS)
    st = module_new(out, c, code.image, code.path, code.name);
  free(cubin);
  if (st == CUSAFE_SUCCESS)
    c = NULL; /* the module's reference now */
  return st;
}

/* The call of a loader of an image in memory. */
static cusafe_status load_image(cusafe_module *out, cusafe_context ctx,
                                const void *image, size_t size,
                                const char *name) {
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  return module_load(
      out, ctx,
      (struct code){
          .from = FROM_IMAGE, .image = image, .size = size, .name = name});
}

CUSAFE_API cusafe_status cusafe_module_load_builtin(cusafe_module *out,
                                                    cusafe_context ctx) {
  return load_image(out, ctx, cs_builtin_image, cs_builtin_image_size,
                    BUILTIN_NAME);
}

CUSAFE_API cusafe_status cusafe_module_load_file(cusafe_module *out,
                                                 cusafe_context ctx,
                                                 const char *path) {
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  return module_load(
      out, ctx, (struct code){.from = FROM_FILE, .path = path, .name = path});
}

CUSAFE_API cusafe_status cusafe_module_load_data(cusafe_module *out,
                                                 cusafe_context ctx,
                                                 const void *image,
                                                 size_t size) {
  return load_image(out, ctx, image, size, MEMORY_NAME);
}

CUSAFE_API cusafe_status cusafe_module_compile(
    cusafe_module *out, cusafe_context ctx, const char *source,
    const char *name, const char *const *options, size_t noptions) {
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  return module_load(out, ctx,
                     (struct code){.from = FROM_SOURCE,
                                   .source = source,
                                   .options = options,
                                   .noptions = noptions,
                                   .name = name ? name : "source.cu"});
}

/* ---- lifetime ------------------------------------------------------------ */

/* Unloads the module's code once its launches are done: they may still be
 * queued on any stream, and unloading does not wait for them.  Where the
 * device cannot be synchronised, the library waits in its context's list
 * of orphans, unloaded after the context's own synchronisation. */
/* Waits until m's device is idle, unless one of its context's streams
 * captures: no mode allows a device's synchronisation then (the thread
 * gated; *capturing says). */
static cusafe_status idle_gated(struct cs_module *m, int *saved,
                                bool *capturing) {
  struct cs_capture *c = cs_capture_open_in(m->ctx);
  if (c == CS_CAPTURE_BUSY)
    return CS_RETRY;
  *capturing = c != NULL;
  if (c)
    return cs_device_enter_teardown(m->ctx->device, saved);
  return cs_device_idle(m->ctx->device, saved);
}

cusafe_status cs_module_fini(struct cs_object *obj) {
  struct cs_module *m = (struct cs_module *)obj;
  int saved;
  bool capturing = false;
  struct cs_thread *self = cs_thread_self();
  cusafe_status st;
  for (;;) {
    cs_gate(self);
    st = idle_gated(m, &saved, &capturing);
    cs_ungate(self);
    if (st != CS_RETRY)
      break;
    cs_capture_yield(); /* a capture begins or ends in its context */
  }
  /* Graphs that could not be destroyed may still launch its kernels; work
   * queued before a capture may still run them: the library goes with
   * the context then. */
  if (st == CUSAFE_SUCCESS && !capturing &&
      !cs_context_graphs_orphaned(m->ctx)) {
    cudaError_t err = library_unload(m->ctx, m->library);
    if (err != cudaSuccess)
      st = cs_fail_cuda(err, "cudaLibraryUnload");
  } else {
    cs_context_orphan(m->ctx, m->library);
  }
  cs_device_leave(saved);
  return st;
}

void cs_module_free(struct cs_object *obj) {
  free(((struct cs_module *)obj)->name);
  free(obj);
}

void cs_module_describe(const struct cs_object *obj, char *what, size_t size) {
  const struct cs_module *m = (const struct cs_module *)obj;
  snprintf(what, size, "%s on device %d", m->name, m->ctx->device);
}
