/* init.h -- initialisation and the driver's entry points (init.c;
 * invariant 4: the device's primary context, reached through the driver at
 * run time; invariant 5: the exit handler registered after CUDA's own).
 * Internal; never installed. */
#ifndef CUSAFE_INIT_H
#define CUSAFE_INIT_H

#include <stdbool.h>
#include "error.h"

/* Initialises CUDA on first use (and registers the exit handler right after
 * the first successful CUDA call); stores the device count. */
cusafe_status cs_init(int *device_count);
/* Whether cs_init() has succeeded once. */
bool cs_initialised(void);
/* Initialises, then checks that `device` exists. */
cusafe_status cs_check_device(int device, int *count);

/* The primary context, through the driver's entry points. */
CUresult cs_primary_ctx_retain(CUcontext *ctx, int device);
CUresult cs_primary_ctx_release(int device);
/* The allocation that contains ptr (cuMemGetAddressRange): its first byte
 * and size.  *have is false where the driver lacks the call (then nothing
 * is asked); otherwise the call's answer -- a CUDA_ERROR_NOT_SUPPORTED
 * among them, which is an error like any other. */
CUresult cs_mem_range(const void *ptr, char **base, size_t *size, bool *have);
/* Whether the driver says that `stream` (not a default stream's special
 * handle) captures nothing, in one driver call (cuStreamIsCapturing,
 * cheaper than the runtime's): false where it says otherwise, fails, or
 * lacks the function.  For a replay's fast path on a stream that other
 * code may capture. */
bool cs_stream_surely_free(cudaStream_t stream);
/* The driver's launch calls, cuLaunchKernel and cuLaunchKernelEx, NULL
 * where the driver lacks them: a launch through them skips the runtime's
 * own work around the same call (lib/launch.c says how a failure is
 * reported).  Looked up at initialisation, and where that look-up failed
 * (an error, not an answer that the driver lacks them), again by
 * cs_drv_launch_again() and cs_drv_launch_ex_again(), which the launches
 * that found them NULL call; read relaxed. */
typedef CUresult (*cs_drv_launch_fn)(CUfunction f, unsigned gx, unsigned gy,
                                     unsigned gz, unsigned bx, unsigned by,
                                     unsigned bz, unsigned shared,
                                     CUstream stream, void **params,
                                     void **extra);
typedef CUresult (*cs_drv_launch_ex_fn)(const CUlaunchConfig *config,
                                        CUfunction f, void **params,
                                        void **extra);
extern _Atomic(cs_drv_launch_fn) cs_drv_launch;
extern _Atomic(cs_drv_launch_ex_fn) cs_drv_launch_ex;
cs_drv_launch_fn cs_drv_launch_again(void);
cs_drv_launch_ex_fn cs_drv_launch_ex_again(void);
/* Looks a driver function up by name (cudaGetDriverEntryPointByVersion,
 * for CUDA 12.0), for functions looked up at their first use: success and
 * *fn set if the driver has it; CUSAFE_ERROR_NOT_FOUND, with no message,
 * if it lacks it; the failure of the look-up itself otherwise (the look-up
 * is made once more for its words).  *fn is NULL on every failure. */
cusafe_status cs_driver_lookup(const char *symbol, void **fn);
/* Loads a library into the calling thread's current context now: CUDA
 * loads lazily, and accepts a corrupt image until its first use. */
CUresult cs_library_load_now(cudaLibrary_t library);

#endif /* CUSAFE_INIT_H */
