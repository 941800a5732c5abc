/* cuda_real.c -- the CUDA table of the shipped library: the runtime's own
 * functions.  The test build links tests/fakecuda/fakecuda.c instead. */
#include "cuda_api.h"

static const struct cs_cuda real = {
    .get_device_count = cudaGetDeviceCount,
    .driver_get_version = cudaDriverGetVersion,
    .runtime_get_version = cudaRuntimeGetVersion,
    .get_device_properties = cudaGetDeviceProperties,
    .device_get_attribute = cudaDeviceGetAttribute,
    .get_device = cudaGetDevice,
    .set_device = cudaSetDevice,
    .device_synchronize = cudaDeviceSynchronize,
    .device_get_stream_priority_range = cudaDeviceGetStreamPriorityRange,
    .get_last_error = cudaGetLastError,
    .get_error_name = cudaGetErrorName,
    .get_error_string = cudaGetErrorString,
    .get_driver_entry_point = cudaGetDriverEntryPointByVersion,
    .stream_create = cudaStreamCreateWithPriority,
    .stream_destroy = cudaStreamDestroy,
    .stream_synchronize = cudaStreamSynchronize,
    .stream_query = cudaStreamQuery,
    .stream_wait_event = cudaStreamWaitEvent,
    .event_create = cudaEventCreateWithFlags,
    .event_destroy = cudaEventDestroy,
    .event_record = cudaEventRecord,
    .event_synchronize = cudaEventSynchronize,
    .event_query = cudaEventQuery,
    .event_elapsed_time = cudaEventElapsedTime,
    .malloc_async = cudaMallocAsync,
    .free_async = cudaFreeAsync,
    .malloc_host = cudaMallocHost,
    .free_host = cudaFreeHost,
    .malloc_managed = cudaMallocManaged,
    .free = cudaFree,
    .memcpy_async = cudaMemcpyAsync,
    .memcpy_peer_async = cudaMemcpyPeerAsync,
    .memset_async = cudaMemsetAsync,
};

const struct cs_cuda *const cs_cu = &real;
