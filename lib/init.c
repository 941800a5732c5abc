/* init.c -- initialisation on first use, the driver's entry points, and
 * the exit handler (invariant 4: the primary context, through the driver
 * reached at run time, so that the library loads without one; invariant 5:
 * the exit handler registered right after the first CUDA call). */
#include <pthread.h>
#include <stdlib.h>

#include "calls.h"
#include "init.h"

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int initialised;
static int handlers_registered;
static int device_count;

typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*release_fn)(CUdevice);
typedef CUresult (*get_module_fn)(CUmodule *, CUlibrary);
typedef CUresult (*range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*capturing_fn)(CUstream, CUstreamCaptureStatus *);
_Atomic(cs_drv_launch_fn) cs_drv_launch;       /* NULL where missing */
_Atomic(cs_drv_launch_ex_fn) cs_drv_launch_ex; /* NULL where missing */
static retain_fn primary_retain;
static release_fn primary_release;
static get_module_fn library_get_module; /* NULL on drivers before 12.0 */
static range_fn mem_get_address_range;   /* NULL where missing */
static capturing_fn stream_is_capturing; /* NULL where missing */
/* Optional functions whose look-up failed (an error, not an answer that
 * the driver lacks them): looked up again at their next use, so that one
 * failed call does not turn their checks off for good. */
static _Atomic bool retry_get_module, retry_range, retry_capturing;
static _Atomic bool retry_launch, retry_launch_ex;

static void at_exit(void) { cusafe_shutdown(); }

static cusafe_status driver_missing(cudaError_t err) {
  const char *words = cs_cu->get_error_string(err);
  return cs_fail_as(CUSAFE_ERROR_NO_DRIVER, err, "no CUDA driver found: %s",
                    words ? words : "unknown error");
}

/* Finds a driver function: CUSAFE_SUCCESS, or with `required` an error
 * that says which is missing (without, *fn is NULL then, and *retry tells
 * whether the look-up itself failed). */
static cusafe_status driver_entry(const char *symbol, void **fn, bool required,
                                  _Atomic bool *retry) {
  enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSuccess;
  void *got = NULL;
  cudaError_t err = cs_cu->get_driver_entry_point(symbol, &got, 12000,
                                                  cudaEnableDefault, &found);
  if (retry)
    atomic_store(retry, err != cudaSuccess);
  if (err == cudaSuccess && found == cudaDriverEntryPointSuccess && got) {
    atomic_store((_Atomic(void *) *)fn, got);
    return CUSAFE_SUCCESS;
  }
  if (!required)
    return CUSAFE_SUCCESS;
  if (err != cudaSuccess)
    return driver_missing(err);
  return cs_fail(CUSAFE_ERROR_NO_DRIVER,
                 "no CUDA driver found: the driver lacks %s", symbol);
}

cusafe_status cs_driver_lookup(const char *symbol, void **fn) {
  _Atomic bool failed = false;
  *fn = NULL;
  (void)driver_entry(symbol, fn, false, &failed);
  if (*fn)
    return CUSAFE_SUCCESS;
  if (atomic_load(&failed)) /* the look-up itself failed: say why */
    return driver_entry(symbol, fn, true, NULL);
  return CUSAFE_ERROR_NOT_FOUND;
}

/* The first successful CUDA call was made: registers the handlers and
 * finds the driver's functions (init_lock held). */
static cusafe_status init_driver(int n) {
  /* The runtime registered its teardown with atexit at that first call;
   * ours, registered after it, runs before it (DESIGN.md, "Exit"). */
  if (!handlers_registered) {
    atexit(at_exit);
    cs_calls_init();
    handlers_registered = 1;
  }
  cusafe_status st = driver_entry("cuDevicePrimaryCtxRetain",
                                  (void **)&primary_retain, true, NULL);
  if (st == CUSAFE_SUCCESS)
    st = driver_entry("cuDevicePrimaryCtxRelease", (void **)&primary_release,
                      true, NULL);
  if (st == CUSAFE_SUCCESS)
    st = driver_entry("cuLibraryGetModule", (void **)&library_get_module, false,
                      &retry_get_module);
  if (st == CUSAFE_SUCCESS)
    st = driver_entry("cuMemGetAddressRange", (void **)&mem_get_address_range,
                      false, &retry_range);
  if (st == CUSAFE_SUCCESS)
    st = driver_entry("cuStreamIsCapturing", (void **)&stream_is_capturing,
                      false, &retry_capturing);
  if (st == CUSAFE_SUCCESS)
    st = driver_entry("cuLaunchKernel", (void **)&cs_drv_launch, false,
                      &retry_launch);
  if (st == CUSAFE_SUCCESS)
    st = driver_entry("cuLaunchKernelEx", (void **)&cs_drv_launch_ex, false,
                      &retry_launch_ex);
  if (st != CUSAFE_SUCCESS)
    return st;
  device_count = n;
  atomic_store(&cs_hot.single_device, n == 1);
  atomic_store_explicit(&initialised, 1, memory_order_release);
  return CUSAFE_SUCCESS;
}

cusafe_status cs_init(int *count) {
  if (CS_LIKELY(atomic_load_explicit(&initialised, memory_order_acquire))) {
    *count = device_count;
    return CUSAFE_SUCCESS;
  }
  cusafe_status st = CUSAFE_SUCCESS;
  pthread_mutex_lock(&init_lock);
  if (!atomic_load_explicit(&initialised, memory_order_relaxed)) {
    int n = 0;
    cudaError_t err = cs_cu->get_device_count(&n);
    if (err == cudaErrorInsufficientDriver || err == cudaErrorStubLibrary)
      st = driver_missing(err);
    else if (err == cudaErrorNoDevice)
      st = cs_fail_as(CUSAFE_ERROR_NO_DEVICE, err, "no CUDA device found");
    else if (err != cudaSuccess)
      st = cs_fail_cuda(err, "cudaGetDeviceCount");
    else if (n == 0)
      st = cs_fail(CUSAFE_ERROR_NO_DEVICE, "no CUDA device found");
    else
      st = init_driver(n);
  }
  pthread_mutex_unlock(&init_lock);
  *count = st == CUSAFE_SUCCESS ? device_count : 0;
  return st;
}

bool cs_initialised(void) { return atomic_load(&initialised); }

cusafe_status cs_check_device(int device, int *count) {
  cusafe_status st = cs_init(count);
  if (st != CUSAFE_SUCCESS)
    return st;
  if (device < 0 || device >= *count)
    return cs_fail(CUSAFE_ERROR_INVALID_DEVICE,
                   "device %d is out of range: %d device(s) found", device,
                   *count);
  return CUSAFE_SUCCESS;
}

CUresult cs_primary_ctx_retain(CUcontext *ctx, int device) {
  return primary_retain(ctx, (CUdevice)device);
}

CUresult cs_primary_ctx_release(int device) {
  return primary_release((CUdevice)device);
}

/* An optional function whose look-up failed, looked up again. */
static void entry_again(const char *symbol, void **fn, _Atomic bool *retry) {
  if (CS_LIKELY(!atomic_load_explicit(retry, memory_order_relaxed)))
    return;
  pthread_mutex_lock(&init_lock);
  if (atomic_load(retry))
    (void)driver_entry(symbol, fn, false, retry);
  pthread_mutex_unlock(&init_lock);
}

CUresult cs_mem_range(const void *ptr, char **base, size_t *size, bool *have) {
  entry_again("cuMemGetAddressRange", (void **)&mem_get_address_range,
              &retry_range);
  range_fn range = atomic_load((_Atomic(range_fn) *)&mem_get_address_range);
  *have = range != NULL;
  if (!range)
    return CUDA_ERROR_NOT_SUPPORTED;
  CUdeviceptr b = 0;
  CUresult res = range(&b, size, (CUdeviceptr)(uintptr_t)ptr);
  *base = (char *)(uintptr_t)b;
  return res;
}

bool cs_stream_surely_free(cudaStream_t stream) {
  entry_again("cuStreamIsCapturing", (void **)&stream_is_capturing,
              &retry_capturing);
  capturing_fn capturing = atomic_load_explicit(
      (_Atomic(capturing_fn) *)&stream_is_capturing, memory_order_relaxed);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return capturing && capturing((CUstream)stream, &status) == CUDA_SUCCESS &&
         status == CU_STREAM_CAPTURE_STATUS_NONE;
}

cs_drv_launch_fn cs_drv_launch_again(void) {
  entry_again("cuLaunchKernel", (void **)&cs_drv_launch, &retry_launch);
  return atomic_load_explicit(&cs_drv_launch, memory_order_relaxed);
}

cs_drv_launch_ex_fn cs_drv_launch_ex_again(void) {
  entry_again("cuLaunchKernelEx", (void **)&cs_drv_launch_ex, &retry_launch_ex);
  return atomic_load_explicit(&cs_drv_launch_ex, memory_order_relaxed);
}

CUresult cs_library_load_now(cudaLibrary_t library) {
  entry_again("cuLibraryGetModule", (void **)&library_get_module,
              &retry_get_module);
  get_module_fn get =
      atomic_load((_Atomic(get_module_fn) *)&library_get_module);
  CUmodule module;
  return get ? get(&module, (CUlibrary)library) : CUDA_SUCCESS;
}
