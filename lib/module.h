/* module.h -- modules: code loaded into a context (module.c).  Internal;
 * never installed. */
#ifndef CUSAFE_MODULE_H
#define CUSAFE_MODULE_H

#include "handle.h"

/* A CUDA library (cudaLibrary_t) of one context. */
struct cs_module {
  struct cs_object hdr;
  struct cs_context *ctx; /* referenced */
  cudaLibrary_t library;
  char *name;   /* for messages: a path, a program, "<...>" */
  bool builtin; /* cusafe's own kernels, whose types are known */
};

/* Words a failure to load or look up code of `module`: an image CUDA
 * rejects is CUSAFE_ERROR_INVALID_IMAGE, "module <module> cannot be loaded:
 * ...", other errors name `function`. */
cusafe_status cs_module_load_failed(cudaError_t err, const char *function,
                                    const char *module);

#endif /* CUSAFE_MODULE_H */
