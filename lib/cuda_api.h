/* cuda_api.h -- the one table through which cusafe reaches CUDA.
 *
 * Every CUDA call of the library goes through `cs_cu`, the table
 * `cs_cuda_table`.  The shipped library defines it in lib/cuda_real.c with
 * the CUDA runtime's own functions; the test suite links the same library
 * sources with tests/fakecuda/fakecuda.c, which defines it with a fake.
 * Nothing in the shipped library can select the fake: it is simply not
 * compiled into it.
 *
 * Driver functions (the primary context) are not in the table: the library
 * asks for them through get_driver_entry_point, so that it loads, and
 * reports a clear error, on a machine with no driver.  Internal; never
 * installed. */
#ifndef CUSAFE_CUDA_API_H
#define CUSAFE_CUDA_API_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nvrtc.h>

struct cs_cuda {
  /* devices and runtime */
  cudaError_t (*get_device_count)(int *count);
  cudaError_t (*driver_get_version)(int *version);
  cudaError_t (*runtime_get_version)(int *version);
  cudaError_t (*get_device_properties)(struct cudaDeviceProp *prop, int device);
  cudaError_t (*device_get_attribute)(int *value, enum cudaDeviceAttr attr,
                                      int device);
  cudaError_t (*get_device)(int *device);
  cudaError_t (*set_device)(int device);
  cudaError_t (*device_synchronize)(void);
  cudaError_t (*device_get_stream_priority_range)(int *least, int *greatest);
  cudaError_t (*device_can_access_peer)(int *can, int device, int peer);
  cudaError_t (*device_enable_peer_access)(int peer, unsigned int flags);
  cudaError_t (*device_get_mem_pool)(cudaMemPool_t *pool, int device);
  cudaError_t (*mem_pool_set_access)(cudaMemPool_t pool,
                                     const struct cudaMemAccessDesc *desc,
                                     size_t count);
  cudaError_t (*get_last_error)(void);
  const char *(*get_error_name)(cudaError_t err);
  const char *(*get_error_string)(cudaError_t err);
  cudaError_t (*get_driver_entry_point)(
      const char *symbol, void **func, unsigned int cuda_version,
      unsigned long long flags, enum cudaDriverEntryPointQueryResult *status);

  /* streams */
  cudaError_t (*stream_create)(cudaStream_t *stream, unsigned int flags,
                               int priority); /* cudaStreamCreateWithPriority */
  cudaError_t (*stream_destroy)(cudaStream_t stream);
  cudaError_t (*stream_synchronize)(cudaStream_t stream);
  cudaError_t (*stream_query)(cudaStream_t stream);
  cudaError_t (*stream_get_device)(cudaStream_t stream, int *device);
  cudaError_t (*stream_wait_event)(cudaStream_t stream, cudaEvent_t event,
                                   unsigned int flags);

  /* events */
  cudaError_t (*event_create)(cudaEvent_t *event,
                              unsigned int flags); /* ...WithFlags */
  cudaError_t (*event_destroy)(cudaEvent_t event);
  cudaError_t (*event_record)(cudaEvent_t event, cudaStream_t stream);
  cudaError_t (*event_synchronize)(cudaEvent_t event);
  cudaError_t (*event_query)(cudaEvent_t event);
  cudaError_t (*event_elapsed_time)(float *ms, cudaEvent_t start,
                                    cudaEvent_t end);

  /* memory */
  cudaError_t (*malloc_async)(void **ptr, size_t size, cudaStream_t stream);
  cudaError_t (*free_async)(void *ptr, cudaStream_t stream);
  cudaError_t (*malloc_host)(void **ptr, size_t size);
  cudaError_t (*free_host)(void *ptr);
  cudaError_t (*malloc_managed)(void **ptr, size_t size, unsigned int flags);
  cudaError_t (*free)(void *ptr);
  cudaError_t (*memcpy_async)(void *dst, const void *src, size_t size,
                              enum cudaMemcpyKind kind, cudaStream_t stream);
  cudaError_t (*memcpy_peer_async)(void *dst, int dst_device, const void *src,
                                   int src_device, size_t size,
                                   cudaStream_t stream);
  cudaError_t (*memset_async)(void *ptr, int value, size_t size,
                              cudaStream_t stream);
  cudaError_t (*pointer_get_attributes)(struct cudaPointerAttributes *attr,
                                        const void *ptr);

  /* modules and kernels (a cudaKernel_t is passed as `const void *func`) */
  cudaError_t (*library_load_data)(cudaLibrary_t *library, const void *code,
                                   enum cudaJitOption *jit_options,
                                   void **jit_values, unsigned int njit,
                                   enum cudaLibraryOption *options,
                                   void **values, unsigned int noptions);
  cudaError_t (*library_load_file)(cudaLibrary_t *library, const char *path,
                                   enum cudaJitOption *jit_options,
                                   void **jit_values, unsigned int njit,
                                   enum cudaLibraryOption *options,
                                   void **values, unsigned int noptions);
  cudaError_t (*library_unload)(cudaLibrary_t library);
  cudaError_t (*library_get_kernel)(cudaKernel_t *kernel, cudaLibrary_t library,
                                    const char *name);
  cudaError_t (*func_get_param_info)(const void *func, size_t index,
                                     size_t *offset, size_t *size);
  cudaError_t (*func_get_attributes)(struct cudaFuncAttributes *attr,
                                     const void *func);
  cudaError_t (*kernel_set_attribute_for_device)(cudaKernel_t kernel,
                                                 enum cudaFuncAttribute attr,
                                                 int value, int device);
  cudaError_t (*occupancy_max_active_blocks)(int *blocks, const void *func,
                                             int block_size,
                                             size_t dynamic_shared);
  cudaError_t (*launch_kernel)(const void *func, dim3 grid, dim3 block,
                               void **args, size_t shared_memory,
                               cudaStream_t stream);
  /* launches with attributes (clusters, cooperative grids, ...) */
  cudaError_t (*occupancy_max_active_clusters)(
      int *clusters, const void *func, const cudaLaunchConfig_t *config);
  cudaError_t (*launch_kernel_ex)(const cudaLaunchConfig_t *config,
                                  const void *func, void **args);

  /* stream capture and graphs */
  cudaError_t (*stream_begin_capture)(cudaStream_t stream,
                                      enum cudaStreamCaptureMode mode);
  cudaError_t (*stream_end_capture)(cudaStream_t stream, cudaGraph_t *graph);
  cudaError_t (*stream_is_capturing)(cudaStream_t stream,
                                     enum cudaStreamCaptureStatus *status);
  cudaError_t (*stream_get_capture_info)(cudaStream_t stream,
                                         enum cudaStreamCaptureStatus *status,
                                         unsigned long long *id,
                                         cudaGraph_t *graph,
                                         const cudaGraphNode_t **dependencies,
                                         const cudaGraphEdgeData **edge_data,
                                         size_t *ndependencies);
  cudaError_t (*thread_exchange_stream_capture_mode)(
      enum cudaStreamCaptureMode *mode);
  cudaError_t (*graph_instantiate)(cudaGraphExec_t *exec, cudaGraph_t graph,
                                   unsigned long long flags);
  cudaError_t (*graph_launch)(cudaGraphExec_t exec, cudaStream_t stream);
  cudaError_t (*graph_exec_destroy)(cudaGraphExec_t exec);
  cudaError_t (*graph_destroy)(cudaGraph_t graph);

  /* NVRTC */
  nvrtcResult (*nvrtc_create_program)(nvrtcProgram *prog, const char *source,
                                      const char *name, int nheaders,
                                      const char *const *headers,
                                      const char *const *include_names);
  nvrtcResult (*nvrtc_compile_program)(nvrtcProgram prog, int noptions,
                                       const char *const *options);
  nvrtcResult (*nvrtc_get_program_log_size)(nvrtcProgram prog, size_t *size);
  nvrtcResult (*nvrtc_get_program_log)(nvrtcProgram prog, char *log);
  nvrtcResult (*nvrtc_get_cubin_size)(nvrtcProgram prog, size_t *size);
  nvrtcResult (*nvrtc_get_cubin)(nvrtcProgram prog, char *cubin);
  nvrtcResult (*nvrtc_destroy_program)(nvrtcProgram *prog);
  const char *(*nvrtc_get_error_string)(nvrtcResult result);
};

/* The table in use: the real runtime's, or in the test build the fake's.
 * An object, not a pointer to one, so that a call through it loads the
 * function's address and nothing before it. */
extern const struct cs_cuda cs_cuda_table;
#define cs_cu (&cs_cuda_table)

#endif /* CUSAFE_CUDA_API_H */
