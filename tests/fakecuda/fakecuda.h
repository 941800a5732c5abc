/* fakecuda.h -- control of the fake CUDA that the test suite links into
 * libcusafe in place of the real runtime (see lib/cuda_api.h).
 *
 * The fake keeps "device" memory in host memory, models each stream as a
 * queue, logs every call, fails call N on request, and behaves like the real
 * runtime at exit: it registers its own teardown with atexit() at its first
 * call and answers cudaErrorCudartUnloading (4) to every call afterwards.
 *
 * It fails the test -- prints "fakecuda: VIOLATION: <what>" on stderr and
 * calls abort() -- when a lifetime rule is broken:
 *   - a device's primary context is released (by cusafe's last retain) while
 *     allocations, streams, events or libraries made on that device are
 *     still alive;
 *   - queued work touches device memory that was already freed;
 *   - a library is unloaded twice, or while a launch of one of its kernels
 *     is still queued; a kernel of an unloaded library is used; a kernel is
 *     launched on a stream of a device other than its library's;
 *   - an NVRTC program is used after nvrtcDestroyProgram;
 *   - a pointer that is not a live allocation is freed, or freed twice;
 *   - a stream or event is destroyed twice, or used after destruction;
 *   - a call other than the error-string ones arrives after the fake's
 *     teardown ran (the real runtime would answer error 4).
 * A wrong use of the functions below (a device outside 0..7, n = 0 for
 * fake_fail_after, ...) aborts too, with "fakecuda: misuse of the control
 * API: <what>".
 *
 * Devices: ordinals 0 .. fake_set_device_count()-1 (default 2).  Each call
 * acts on the calling thread's current device (cudaSetDevice), as the real
 * runtime does.  Fake pointers of device memory are real host pointers, so
 * tests may compare contents through cusafe's read functions.  Fresh memory
 * is filled with 0xA5 (never zero); freed memory is poisoned and held back
 * for a while (up to 64 MiB), so that no host buffer of the test can reuse
 * its address and be mistaken for freed device memory.
 *
 * Streams: stream 0 (also cudaStreamLegacy and cudaStreamPerThread) is the
 * current device's legacy default stream, with its implicit synchronization
 * with the device's blocking streams.  Queued work checks, when it runs,
 * every pointer it touches: inside a live allocation it must stay in bounds;
 * inside freed memory it is a VIOLATION; anything else is taken for the
 * test's host memory.  A stream destroyed with work still queued lives on
 * (and counts as alive) until that work has run.
 *
 * All functions here are for tests only and are thread-safe. */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <stddef.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Driver presence, as cudaGetDeviceCount reports it:
 *   FAKE_DRIVER_OK       -> devices as set by fake_set_device_count
 *   FAKE_DRIVER_MISSING  -> cudaErrorInsufficientDriver (35) everywhere
 *   FAKE_DRIVER_NO_DEVICE-> cudaErrorNoDevice (100) everywhere
 * ("everywhere": every call, cudaGetDriverEntryPointByVersion and the
 * primary context functions included, except, as with the real runtime,
 * cudaRuntimeGetVersion, which always works, and cudaDriverGetVersion,
 * which answers cudaSuccess with version 0 when the driver is missing.)
 * cudaGetDeviceCount sets *count = 0 whenever it fails.  A device count of
 * 0 with FAKE_DRIVER_OK behaves as FAKE_DRIVER_NO_DEVICE.
 * Must be set before the library's first call (or after fake_reset). */
enum fake_driver { FAKE_DRIVER_OK, FAKE_DRIVER_MISSING, FAKE_DRIVER_NO_DEVICE };
void fake_set_driver(enum fake_driver state);
void fake_set_device_count(int n); /* 0..8; default 2 */
/* Whether the driver's launch calls, cuLaunchKernel and cuLaunchKernelEx,
 * are offered through cudaGetDriverEntryPointByVersion (default 1).  They
 * launch as cudaLaunchKernel and cudaLaunchKernelExC do, log under their
 * own names (a kernel that runs logs "exec:cudaLaunchKernel" either way),
 * and leave cudaGetLastError's error as it was.  Must be set before the
 * library's first call (or after fake_reset). */
void fake_set_driver_launch(int offered);
/* Whether the virtual memory management calls (cuMemCreate,
 * cuMemAddressReserve, cuMemMap, cuMemSetAccess, cuMemUnmap,
 * cuMemAddressFree, cuMemRelease, cuMemGetAllocationGranularity,
 * cuMemExportToShareableHandle, cuMemImportFromShareableHandle,
 * cuMemGetAllocationPropertiesFromHandle) are offered through
 * cudaGetDriverEntryPointByVersion (default 1).  Their memory is a memfd
 * named "fakecuda-vmm-<device>", of a granularity of 2 MiB: it travels to
 * other processes as a file descriptor (POSIX handles only) and lives,
 * as on a GPU, while any process holds a handle to it or maps it; a
 * process's mappings are allocations of this fake (checked as cudaMalloc's
 * are: a queued use after cuMemUnmap is a VIOLATION), without guard bytes,
 * never poisoned.  Importing a descriptor that is no such memfd:
 * CUDA_ERROR_INVALID_VALUE.  Must be set before the library's first call
 * (or after fake_reset). */
void fake_set_vmm(int offered);
/* Whether devices can reach each other's memory (cudaDeviceCanAccessPeer;
 * default 1, for every pair).  With 0, cudaDeviceEnablePeerAccess answers
 * cudaErrorPeerAccessUnsupported and cudaMemPoolSetAccess for another
 * device cudaErrorInvalidDevice; peer copies still work (CUDA stages them
 * through the host).  cudaDeviceEnablePeerAccess enables access from the
 * current device's context (cudaErrorPeerAccessAlreadyEnabled the second
 * time); a primary context's release takes its peer access, both ways,
 * with it. */
void fake_set_peer_access(int allowed);
/* Peer access of `device` to the memory of `peer`: 1 if enabled from
 * device's context, plus 2 if peer's memory pool lets device in. */
int fake_peer_access(int device, int peer);

/* Per-device properties the fake reports (defaults: name "Fake GPU <n>",
 * 1 GiB total memory, CC 9.0, 132 SMs, 1024 threads per block, block
 * (1024,1024,64), grid (2^31-1,65535,65535), 48 KiB shared memory
 * (227 KiB opt-in), warp 32, managed memory 1, memory pools 1, stream
 * priorities least 0 / greatest -5). */
void fake_set_managed_supported(int device, int supported);
/* Total bytes one device may hold in live allocations; beyond it the
 * allocation calls answer cudaErrorMemoryAllocation.  Device, pinned and
 * managed allocations all count, against the device they were made on
 * (pinned and managed: the current device); an allocation whose stream-
 * ordered free has not run yet still counts.  The device's reported total
 * memory (totalGlobalMem) is this limit. */
void fake_set_memory_limit(int device, size_t bytes);

/* Fault injection.  Calls through the table are numbered from 1 from the
 * last fake_reset().  fake_fail_after(n, err, persistent): the n-th call
 * from now (n >= 1; 1 = the very next call) returns err without doing
 * anything; with persistent != 0, every call from then on does too, until
 * fake_fail_clear().  Calls of get_error_name/get_error_string and
 * nvrtcGetErrorString are never counted nor failed.  An NVRTC call (they
 * are counted, logged and failed like the others) returns err as an
 * nvrtcResult: cudaErrorMemoryAllocation -> NVRTC_ERROR_OUT_OF_MEMORY,
 * cudaErrorInvalidValue -> NVRTC_ERROR_INVALID_INPUT, any other error ->
 * NVRTC_ERROR_INTERNAL_ERROR. */
void fake_fail_after(unsigned long n, cudaError_t err, int persistent);
void fake_fail_clear(void);
/* Makes every call of the named table entry (the cuda function name, e.g.
 * "cudaMallocAsync", "cuDevicePrimaryCtxRetain", "nvrtcCompileProgram")
 * return err, until fake_fail_clear().  Up to 16 names at once; err 0
 * stops failing that name only.  Failures injected by either function are
 * counted and logged like any call, and do nothing else (no allocation,
 * nothing queued, outputs untouched).  For the driver functions err
 * becomes the CUresult of the same number; for NVRTC, see above. */
void fake_fail_function(const char *name, cudaError_t err);
unsigned long fake_call_count(void);

/* Streams execute queued work immediately (the default) or, while paused,
 * only when a synchronize (stream, event or device) reaches it; while paused
 * a query of unfinished work answers cudaErrorNotReady and runs nothing.
 * cudaFree and cudaFreeHost synchronize every device, as the real ones do.
 * fake_set_paused(0) does not run the queues by itself; work left over runs
 * at the next call that queues on, queries or synchronizes its stream. */
void fake_set_paused(int paused);

/* Launches with attributes.  Devices support thread block clusters and
 * cooperative launches (cudaDevAttrClusterLaunch, cudaDevAttrCooperative-
 * Launch, the properties clusterLaunch and cooperativeLaunch) unless
 * fake_set_launch_support says otherwise; their compute capability is 9.0
 * unless fake_set_compute_capability says otherwise (before the context is
 * made: the library reads it then).
 *
 * cudaLaunchKernelExC checks what cudaLaunchKernel checks (below), then
 * each attribute as the real runtime does: a cluster
 * (cudaLaunchAttributeClusterDimension) on a device without clusters:
 * cudaErrorNotSupported; a cluster dimension of 0, one that does not
 * divide the grid's, a cluster above 8 blocks (16 once
 * cudaKernelSetAttributeForDevice set
 * cudaFuncAttributeNonPortableClusterSizeAllowed to 1 for the device):
 * cudaErrorInvalidClusterSize; cudaLaunchAttributeCooperative 1 on a
 * device without cooperative launches: cudaErrorNotSupported, with more
 * blocks than can be resident (blocks per multiprocessor, as
 * cudaOccupancyMaxActiveBlocksPerMultiprocessor says, times 132
 * multiprocessors; with a cluster, the active clusters times their
 * blocks): cudaErrorCooperativeLaunchTooLarge;
 * cudaLaunchAttributeProgrammaticStreamSerialization 1 below compute
 * capability 9.0: cudaErrorNotSupported; cudaLaunchAttributePriority:
 * any value (the runtime clamps it); any other attribute:
 * cudaErrorInvalidValue.  It then queues (or captures) the launch as
 * cudaLaunchKernel does; when it runs the log says
 * "exec:cudaLaunchKernel" too.
 *
 * cudaOccupancyMaxActiveClusters(n, func, config) wants the cluster among
 * config's attributes (else cudaErrorInvalidClusterSize), checks it as the
 * launch does, and models clusters as living on one GPC of
 * fake_set_cluster_sms multiprocessors (default 16; 132 / that many GPCs):
 * per GPC, blocks per multiprocessor times its multiprocessors, divided
 * by the cluster's blocks, rounded down. */
void fake_set_launch_support(int device, int cluster, int cooperative);
void fake_set_compute_capability(int device, int major, int minor);
void fake_set_cluster_sms(int device, int sms); /* 1..132 */
/* The attributes of the last launch that succeeded (0 after a
 * cudaLaunchKernel or before any launch): copies min(n, capacity) of them
 * to dst (unless NULL) and returns n. */
size_t fake_last_launch_attrs(cudaLaunchAttribute *dst, size_t capacity);
/* The grid, block and dynamic shared memory of the last launch that was
 * queued, through any of the four launch calls (zeros before any). */
void fake_last_launch_config(dim3 *grid, dim3 *block, size_t *shared);

/* The bytes of parameters one kernel of a fake image may take (default
 * 32764, CUDA's limit since 12.1): what a later CUDA might allow. */
void fake_set_param_space(size_t bytes);

/* Every launch call (cudaLaunchKernel, cudaLaunchKernelExC,
 * cuLaunchKernel, cuLaunchKernelEx) sleeps `microseconds` (default 0)
 * before it does
 * anything, holding no lock of the fake's: a caller's launch in progress
 * then lasts long enough for other threads to release what it uses. */
void fake_set_launch_delay(unsigned microseconds);

/* The next launch call (any of the four) calls fn(arg) first, once, on
 * the launching
 * thread and holding no lock of the fake's: what another thread might do
 * while a launch is in progress.  NULL cancels. */
void fake_set_launch_hook(void (*fn)(void *arg), void *arg);

/* The next call of the runtime function `name` (such as
 * "cudaStreamIsCapturing"), or of the driver's "cuLaunchKernel" or
 * "cuLaunchKernelEx", calls fn(arg) once, after it has answered, on
 * the calling thread and holding no lock of the fake's: what another
 * thread might do right after that answer.  NULL cancels. */
void fake_set_call_hook(const char *name, void (*fn)(void *arg), void *arg);

/* Sticky error: from now on every call acting on `device` (and every
 * synchronize or query of its streams and events) returns err, as after a
 * kernel fault; cuDevicePrimaryCtxRelease, cudaStreamDestroy,
 * cudaEventDestroy and the frees still work (and still free).  err 0 clears.
 * "Acting on": the stream's or event's device, else the current device for
 * cudaDeviceSynchronize, cudaGetLastError (which then keeps returning err),
 * the allocations and stream/event creation.  Device queries (count,
 * properties, attributes, cudaGet/SetDevice) are unaffected.  The device's
 * queued work never runs: a synchronize discards it, and a free, queued or
 * new, releases its memory at once. */
void fake_set_sticky_error(int device, cudaError_t err);

/* Modules and kernels.
 *
 * cudaLibraryLoadData and cudaLibraryLoadFromFile (the file's bytes are
 * taken as the image) accept:
 *
 *   (a) A fake image: NUL-terminated text whose first line is FAKECUBIN,
 *       then one line per kernel (blank lines and lines starting with '#'
 *       are ignored):
 *
 *         FAKECUBIN
 *         kernel NAME [maxthreads=N] [shared=BYTES] PARAM...
 *
 *       NAME is a C identifier, unique in the image.  Each PARAM is `p` (a
 *       pointer: 8 bytes, checked when the launch runs, see below) or a
 *       decimal size in bytes (`4`, `8`, `1`, `16`, ...).  maxthreads
 *       (1..1024, default 1024) is the kernel's maxThreadsPerBlock; shared
 *       (0..49152, default 0) its static shared memory per block.  Example:
 *         "FAKECUBIN\nkernel scale2 maxthreads=256 p 4 8\n"
 *       Anything malformed: cudaErrorInvalidKernelImage.
 *   (b) A real image: anything starting with the fatbin magic 0xBA55ED50
 *       (little-endian) or with "\x7f" "ELF" (a cubin).  Its contents are
 *       not read: it holds the kernels built into cusafe, with these
 *       layouts and semantics, which the fake performs on the memory when
 *       the launch runs (over all n elements, whatever the grid):
 *         cusafe_fill_f32(float *x, float value, size_t n)   x[i] = value
 *         cusafe_scale_f32(float *x, float a, size_t n)      x[i] *= a
 *         cusafe_axpy_f32(float *y, float a, const float *x, size_t n)
 *                                                     y[i] = a * x[i] + y[i]
 *         cusafe_vecadd_f32(float *c, const float *a, const float *b,
 *                           size_t n)                 c[i] = a[i] + b[i]
 *       and the same with double for _f64; and the kernel of the example
 *       examples/extension (its library embeds a fat binary of its own):
 *         myext_saxpy_f32(float *y, const float *x, float a, size_t n)
 *                                                     y[i] = a * x[i] + y[i]
 *       Their pointers must point at n elements of memory allocated
 *       through the fake (else a VIOLATION); a pointer not aligned to
 *       the element size faults as on a GPU: the device gets the sticky
 *       error cudaErrorMisalignedAddress.
 *   (c) Anything else: cudaErrorInvalidKernelImage, or cudaErrorInvalidPtx
 *       for a text starting with ".version" or "//" (PTX).  A NULL image
 *       or path: cudaErrorInvalidValue; a file that cannot be read:
 *       cudaErrorFileNotFound.
 *
 * A library belongs to the device current at its load, and counts as alive
 * on it until unloaded.  A cudaKernel_t points into its library, valid
 * until the library is unloaded.  cudaLibraryGetKernel of an unknown name:
 * cudaErrorSymbolNotFound.  cudaFuncGetParamInfo: parameters at increasing
 * offsets, each aligned to the largest power of two (at most 8) dividing
 * its size; an index past the last: cudaErrorInvalidValue.
 * cudaFuncGetAttributes (for the current device): maxThreadsPerBlock,
 * sharedSizeBytes (static), maxDynamicSharedSizeBytes (the device's
 * setting; default 48 KiB minus the static size), numRegs 32, ptxVersion
 * and binaryVersion 90, the rest 0.  cudaKernelSetAttributeForDevice takes
 * cudaFuncAttributeMaxDynamicSharedMemorySize up to 227 KiB minus the
 * static size (more: cudaErrorInvalidValue) and
 * cudaFuncAttributePreferredSharedMemoryCarveout (ignored) and
 * cudaFuncAttributeNonPortableClusterSizeAllowed (0 or 1; on a device
 * without clusters cudaErrorNotSupported); other attributes:
 * cudaErrorInvalidValue.
 * cudaOccupancyMaxActiveBlocksPerMultiprocessor models a multiprocessor of
 * 2048 threads (counted in whole warps of 32), 32 blocks and 228 KiB of
 * shared memory (static + dynamic per block); a block above the kernel's
 * maxThreadsPerBlock, or dynamic shared memory above its limit, gives 0.
 *
 * cudaLaunchKernel checks what the real one checks: a grid or block
 * dimension of 0, a block of more threads than the kernel's or the
 * device's limit (1024; dimensions 1024, 1024, 64), a grid beyond
 * (2^31-1, 65535, 65535): cudaErrorInvalidConfiguration; dynamic shared
 * memory above the kernel's limit for the device: cudaErrorInvalidValue.
 * It copies the argument values at the call (args[i] points at a value of
 * parameter i's size) and queues the launch on the stream.  When it runs
 * ("exec:cudaLaunchKernel" in the log), every non-NULL pointer argument is
 * checked like the pointers of a queued copy (one byte, or, for the
 * built-in kernels, the n elements they touch): one into freed memory is a
 * VIOLATION ("queued kernel NAME touches freed memory ...").  A pointer
 * just past the end of a live allocation (a buffer of 0 bytes there) is
 * no access for a kernel of a fake image.  On a device
 * with a sticky error queued launches never run.  The sticky error of the
 * device applies to loading (the current device), launching (the
 * stream's), occupancy (the current device) and setting an attribute (the
 * device given); the other queries and unloading always work.
 *
 * NVRTC.  nvrtcCreateProgram keeps the source and name (NULL:
 * "default_program").  nvrtcCompileProgram accepts the options -D..., -I...,
 * -std=..., --std=..., -arch=... and --gpu-architecture=... (sm_NN[a|f] or
 * compute_NN[a|f]), -G, -lineinfo, --use_fast_math and -default-device;
 * any other gives NVRTC_ERROR_INVALID_OPTION with the log
 * "nvrtc: error: unrecognized option OPTION found" (a bad -arch value:
 * "nvrtc: error: invalid value for --gpu-architecture (-arch)").  A source
 * with a line `#error TEXT` (no preprocessing: wherever it stands) gives
 * NVRTC_ERROR_COMPILATION with the log "NAME(LINE): error: TEXT".
 * Otherwise the "compilation" finds every
 *   extern "C" __global__ void [__launch_bounds__(N)] KERNEL(PARAMS)
 * (comments ignored) and makes a FAKECUBIN image of them: a parameter
 * whose type contains '*' is `p`; char, signed char, unsigned char, int8_t,
 * uint8_t, bool: 1; short, unsigned short, int16_t, uint16_t: 2; int,
 * unsigned, unsigned int, float, int32_t, uint32_t: 4; long, long long,
 * unsigned long, unsigned long long, size_t, double, int64_t, uint64_t: 8
 * (const, volatile, __restrict__ ignored); any other type is a compile
 * error with the log "NAME(LINE): error: unknown type \"DECLARATION\"".
 * __launch_bounds__(N) becomes maxthreads=N.  A kernel not declared
 * extern "C" is in the image under its mangled name, as nvcc and NVRTC
 * mangle it (the Itanium C++ ABI): __global__ void scale(float *x, int n)
 * is _Z5scalePfi, (float *y, const float *x, const float *z, float a,
 * size_t n) is _Z4axpyPfPKfS1_fm (a type met again is a substitution,
 * S_, S0_, ...); its parameters are the builtin types above and pointers
 * to them or to a class named by one identifier; a C++ kernel with any
 * other parameter (a struct by value, a template's) is not in the image.
 * Logs carry no final newline; the log
 * size counts the NUL.  nvrtcGetCUBINSize / nvrtcGetCUBIN give the image
 * (the size counts its NUL), or 0 bytes when there is none (not compiled,
 * failed, or an -arch=compute_NN).  Programs count as alive until
 * nvrtcDestroyProgram. */

/* Stream capture and graphs, as measured on an H100 (CUDA 13.0, driver
 * 580).
 *
 * cudaStreamBeginCapture(s, mode) makes s capture: work queued on it
 * (copies, memsets, launches) becomes nodes of a graph instead of running;
 * a record of an event there is "captured", and a stream outside the
 * capture that waits for such an event joins it.  The legacy stream
 * cannot capture (cudaErrorStreamCaptureUnsupported); beginning twice:
 * cudaErrorIllegalState.  cudaStreamEndCapture on the origin stream gives
 * the graph, or none and:
 *   cudaErrorStreamCaptureWrongThread  from another thread than the one
 *                                      that began it (not Relaxed);
 *   cudaErrorStreamCaptureInvalidated  after an illegal call (below);
 *   cudaErrorStreamCaptureUnjoined     a joined stream has nodes that no
 *                                      stream of the capture waited for;
 *   cudaErrorStreamCaptureUnmatched    on a joined stream, not the origin
 *                                      (the capture goes on);
 *   cudaErrorIllegalState              on a stream that does not capture.
 * Every outcome but the last ends the capture for all its streams.
 * Illegal calls fail with the error named and invalidate the capture (it
 * then fails every further operation with
 * cudaErrorStreamCaptureInvalidated until it ends):
 *   - "potentially unsafe" calls -- cudaMallocHost, cudaFreeHost,
 *     cudaMallocManaged, cudaFree, cudaEventQuery, cudaEventSynchronize,
 *     cudaEventElapsedTime, cudaStreamQuery, cudaStreamSynchronize, and
 *     cudaMallocAsync / cudaFreeAsync on a stream that does not capture,
 *     cudaGraphExecDestroy, cudaLibraryLoad*, cudaLibraryUnload -- answer
 *     cudaErrorStreamCaptureUnsupported for a thread whose mode
 *     (cudaThreadExchangeStreamCaptureMode; Global by default) is not
 *     Relaxed while it has a capture of its own that did not begin
 *     Relaxed, or, in Global mode, while another thread has one that
 *     began Global;
 *   - in any mode, a query or synchronization of a capturing stream and
 *     cudaDeviceSynchronize during a capture on the device:
 *     cudaErrorStreamCaptureUnsupported; a query or synchronization of an
 *     event recorded in the capture: cudaErrorCapturedEvent (after the
 *     capture ended: cudaErrorInvalidValue, until recorded again);
 *   - a capturing stream waiting for an event recorded outside it:
 *     cudaErrorStreamCaptureIsolation (cudaEventWaitExternal makes an
 *     event wait node instead; outside a capture that flag is
 *     cudaErrorIllegalState); for an event of another capture:
 *     cudaErrorStreamCaptureMerge (both invalidated);
 *   - any use of the legacy stream while a blocking stream of the device
 *     captures: cudaErrorStreamCaptureImplicit (cudaStreamIsCapturing of
 *     the legacy stream answers it without invalidating);
 *   - cudaGraphLaunch onto a capturing stream, and cudaMemcpyPeerAsync on
 *     one (cudaMemcpyAsync of the same memory is captured):
 *     cudaErrorStreamCaptureUnsupported.
 * cudaFreeAsync on a capturing stream of memory allocated outside the
 * graph answers cudaErrorInvalidValue and the capture goes on;
 * cudaMallocAsync on a capturing stream (graph allocation nodes) is not
 * modelled: a misuse.  A captured copy from pageable memory reads it when
 * the graph runs.  cudaStreamDestroy of a stream in a capture is a
 * VIOLATION.
 *
 * cudaGraphInstantiate copies the graph's nodes; graph and executable
 * graph are independent from then on.  cudaGraphLaunch queues a launch of
 * all the nodes, in capture order, after the executable graph's earlier
 * launches on any stream; they are checked when they run, as the same
 * work queued on a stream would be (freed memory is a VIOLATION, so is an
 * event wait node whose event was destroyed).  An event wait node waits
 * for the record its event had at cudaGraphLaunch, as cudaStreamWaitEvent
 * waits for the one at its call; a later record is not the launch's
 * (measured on an H200).  cudaGraphExecDestroy with
 * launches queued is legal: it is freed after the last.  A library cannot
 * be unloaded while a capture, graph or executable graph has a launch of
 * one of its kernels (a VIOLATION), and a primary context cannot be
 * released while its device has graphs, executable graphs or captures
 * (a VIOLATION). */
/* Graphs not destroyed, executable graphs not destroyed or with launches
 * queued, and captures not ended, of a device (all devices: -1). */
size_t fake_live_graphs(int device);
size_t fake_live_graph_execs(int device);
size_t fake_live_captures(int device);

/* Strict teardown (the default, 1): a call after the fake's teardown is a
 * VIOLATION.  With 0 it answers cudaErrorCudartUnloading (4) silently, as
 * the real runtime does, so that tests can check how cusafe copes. */
void fake_set_strict_teardown(int strict);

/* Call log: one entry per call, the CUDA function's name, such as
 * "cudaMemcpyAsync" (failed calls and calls after the teardown included;
 * the error-string functions excepted).  Execution of queued work is logged
 * as well, as "exec:cudaMemcpyAsync", "exec:cudaMemcpyPeerAsync",
 * "exec:cudaMemsetAsync", "exec:cudaFreeAsync", "exec:cudaLaunchKernel"
 * and "exec:cudaStreamWaitEvent", at the moment it runs.  Entries are static
 * strings, valid for ever.  The log survives the teardown. */
size_t fake_log_length(void);
const char *fake_log_entry(size_t i); /* NULL past the end */
/* Index of the first entry equal to name at or after `from`, or -1. */
long fake_log_find(const char *name, size_t from);
size_t fake_log_count(const char *name);
void fake_log_clear(void);

/* Live objects made through the table on a device (all devices: -1):
 * allocations not yet freed (a stream-ordered free that has not run yet
 * leaves them counted), streams not destroyed or not yet drained, events
 * not destroyed.  All 0 after the teardown. */
size_t fake_live_allocations(int device); /* device, pinned and managed */
/* Handles of cuMemCreate and cuMemImportFromShareableHandle not released
 * yet (device -1: of every device). */
size_t fake_live_vmm_handles(int device);
/* The descriptors the fake holds for its shareable memory (a memfd for each
 * handle whose memory is not gone): a real driver's handles are no
 * descriptors of the process, so that what a process holds beyond these is
 * the code's own. */
size_t fake_vmm_fds(void);
size_t fake_live_bytes(int device);
size_t fake_live_streams(int device);
/* A stream of `device` made by another library in the process, made and
 * destroyed here without a counted call; destroying it twice (cusafe
 * destroyed it first) is a VIOLATION. */
cudaStream_t fake_foreign_stream(int device);
void fake_foreign_stream_destroy(cudaStream_t stream);
size_t fake_live_events(int device);
/* Libraries loaded on a device (all devices: -1) and not unloaded. */
size_t fake_live_libraries(int device);
/* NVRTC programs created and not destroyed. */
size_t fake_live_programs(void);
/* The options of the last nvrtcCompileProgram, joined by single spaces
 * ("" if none yet).  Valid until the next compile or fake_reset(). */
const char *fake_last_nvrtc_options(void);
/* The argument values of the last cudaLaunchKernel that succeeded, as
 * the kernel receives them: each parameter at its offset (see
 * cudaFuncGetParamInfo above), padding zeroed.  Copies the first
 * min(size, capacity) bytes to dst (unless NULL) and returns the size (0
 * before any launch). */
size_t fake_last_launch_args(void *dst, size_t capacity);
/* cusafe's current retain count of a device's primary context. */
int fake_primary_ctx_refcount(int device);
/* Whether the fake's exit teardown has run. */
int fake_torn_down(void);

/* Runs the fake's teardown now, as the real runtime's atexit handler would:
 * everything still alive is freed without complaint.  Idempotent; the
 * atexit handler does nothing after it.  Only for tests of behaviour after
 * the runtime unloaded. */
void fake_teardown_now(void);

/* Forgets everything (live objects are dropped without checks, the log and
 * fault settings cleared, the driver set OK, 2 devices, every setting back
 * to its default, the teardown undone) and restarts the call count.  The
 * calling thread's current device and last error go back to 0; other
 * threads keep theirs.  The atexit registration stays.  Only between
 * tests, after cusafe_shutdown(). */
void fake_reset(void);

#ifdef __cplusplus
}
#endif

#endif /* FAKECUDA_H */
