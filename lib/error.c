/* error.c -- status strings and the per-thread detail message (invariant
 * 7: clear errors). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

/* Per-thread state, written with vsnprintf into a fixed buffer so that an
 * out-of-memory failure can be reported without allocating. */
static __thread char tls_message[1024];
static __thread int tls_cuda_error;

void cs_error_save(struct cs_saved_error *e) {
  memcpy(e->message, tls_message, sizeof e->message);
  e->cuda_error = tls_cuda_error;
}

void cs_error_restore(const struct cs_saved_error *e) {
  memcpy(tls_message, e->message, sizeof tls_message);
  tls_cuda_error = e->cuda_error;
}

CUSAFE_API const char *cusafe_status_string(cusafe_status status) {
  switch (status) {
  case CUSAFE_SUCCESS: return "success";
  case CUSAFE_ERROR_INVALID_HANDLE: return "invalid handle";
  case CUSAFE_ERROR_INVALID_VALUE: return "invalid value";
  case CUSAFE_ERROR_INVALID_SIZE: return "invalid size";
  case CUSAFE_ERROR_OUT_OF_RANGE: return "out of range";
  case CUSAFE_ERROR_INVALID_DEVICE: return "invalid device";
  case CUSAFE_ERROR_CONTEXT_MISMATCH: return "objects of different contexts";
  case CUSAFE_ERROR_NO_DRIVER: return "no CUDA driver";
  case CUSAFE_ERROR_NO_DEVICE: return "no CUDA device";
  case CUSAFE_ERROR_OUT_OF_MEMORY: return "out of memory";
  case CUSAFE_ERROR_NOT_READY: return "not ready";
  case CUSAFE_ERROR_NOT_SUPPORTED: return "not supported";
  case CUSAFE_ERROR_CUDA: return "CUDA error";
  case CUSAFE_ERROR_SHUTDOWN: return "library shut down";
  case CUSAFE_ERROR_FORKED: return "used in a forked child";
  case CUSAFE_ERROR_INVALID_ARGUMENTS: return "invalid kernel arguments";
  case CUSAFE_ERROR_INVALID_CONFIGURATION:
    return "invalid launch configuration";
  case CUSAFE_ERROR_INVALID_IMAGE: return "invalid module image";
  case CUSAFE_ERROR_COMPILE: return "compilation failed";
  case CUSAFE_ERROR_NOT_FOUND: return "not found";
  case CUSAFE_ERROR_CAPTURING: return "stream capturing";
  }
  return "unknown status";
}

CUSAFE_API const char *cusafe_last_error_message(void) { return tls_message; }

CUSAFE_API int cusafe_last_cuda_error(void) { return tls_cuda_error; }

CUSAFE_API const char *cusafe_version_string(void) {
#define CS_STR2(x) #x
#define CS_STR(x) CS_STR2(x)
  return CS_STR(CUSAFE_VERSION_MAJOR) "." CS_STR(
      CUSAFE_VERSION_MINOR) "." CS_STR(CUSAFE_VERSION_PATCH);
}

static cusafe_status record(cusafe_status status, cudaError_t err,
                            const char *fmt, va_list ap) {
  vsnprintf(tls_message, sizeof tls_message, fmt, ap);
  tls_cuda_error = (int)err;
  return status;
}

cusafe_status cs_fail(cusafe_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  record(status, cudaSuccess, fmt, ap);
  va_end(ap);
  return status;
}

cusafe_status cs_null(const char *name) {
  return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "%s is NULL", name);
}

cusafe_status cs_fail_as(cusafe_status status, cudaError_t err, const char *fmt,
                         ...) {
  va_list ap;
  va_start(ap, fmt);
  record(status, err, fmt, ap);
  va_end(ap);
  return status;
}

cusafe_status cs_status_pending(cudaError_t err, const char *function) {
  if (err == cudaSuccess)
    return CUSAFE_SUCCESS;
  if (err == cudaErrorNotReady)
    return cs_fail_as(CUSAFE_ERROR_NOT_READY, err, "work is still pending");
  return cs_fail_cuda(err, function);
}

cusafe_status cs_status_of(cudaError_t err) {
  switch (err) {
  case cudaSuccess: return CUSAFE_SUCCESS;
  case cudaErrorMemoryAllocation: return CUSAFE_ERROR_OUT_OF_MEMORY;
  case cudaErrorNotReady: return CUSAFE_ERROR_NOT_READY;
  case cudaErrorInsufficientDriver: return CUSAFE_ERROR_NO_DRIVER;
  case cudaErrorNoDevice: return CUSAFE_ERROR_NO_DEVICE;
  case cudaErrorInvalidDevice: return CUSAFE_ERROR_INVALID_DEVICE;
  case cudaErrorNotSupported: return CUSAFE_ERROR_NOT_SUPPORTED;
  case cudaErrorCudartUnloading: return CUSAFE_ERROR_SHUTDOWN;
  case cudaErrorInvalidConfiguration: return CUSAFE_ERROR_INVALID_CONFIGURATION;
  case cudaErrorInvalidKernelImage:
  case cudaErrorInvalidPtx:
  case cudaErrorUnsupportedPtxVersion:
  case cudaErrorNoKernelImageForDevice:
  case cudaErrorInvalidSource:
  case cudaErrorFileNotFound:
  case cudaErrorJitCompilerNotFound: return CUSAFE_ERROR_INVALID_IMAGE;
  case cudaErrorSymbolNotFound: return CUSAFE_ERROR_NOT_FOUND;
  default: return CUSAFE_ERROR_CUDA;
  }
}

cusafe_status cs_fail_cuda(cudaError_t err, const char *function) {
  cusafe_status st = cs_status_of(err);
  const char *words = cs_cu->get_error_string(err);
  snprintf(tls_message, sizeof tls_message, "%s failed: %s", function,
           words ? words : "unknown error");
  tls_cuda_error = (int)err;
  return st;
}
