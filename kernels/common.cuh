/* common.cuh -- shared helpers of cusafe's built-in kernels.
 *
 * Every built-in kernel is element-wise and walks its elements with a
 * grid-stride loop over the whole launch, flattened over all three
 * dimensions of the grid and of the block: any grid and block shape is
 * correct, each element is handled by exactly one thread, and a grid
 * smaller than the data simply loops. */
#ifndef CUSAFE_KERNELS_COMMON_CUH
#define CUSAFE_KERNELS_COMMON_CUH

#include <stddef.h>

namespace cusafe_kernels {

/* The index of the calling thread among all threads of the launch. */
__device__ __forceinline__ size_t global_thread_index() {
  size_t block = ((size_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x +
                 blockIdx.x;
  size_t thread = ((size_t)threadIdx.z * blockDim.y + threadIdx.y) *
                      blockDim.x + threadIdx.x;
  return block * ((size_t)blockDim.x * blockDim.y * blockDim.z) + thread;
}

/* The number of threads of the launch: the stride of the loops. */
__device__ __forceinline__ size_t global_thread_count() {
  return (size_t)gridDim.x * gridDim.y * gridDim.z *
         ((size_t)blockDim.x * blockDim.y * blockDim.z);
}

/* Arithmetic rounded once per operation (round to nearest even), never
 * contracted into a fused multiply-add, whatever the compiler's flags: the
 * results equal the host's (C's, NumPy's) `a * x + y` bit for bit. */
__device__ __forceinline__ float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double mul_rn(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ __forceinline__ float add_rn(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ double add_rn(double a, double b) {
  return __dadd_rn(a, b);
}

} // namespace cusafe_kernels

#endif /* CUSAFE_KERNELS_COMMON_CUH */
