/* fill.cu -- x[i] = value for i < n. */
#include "common.cuh"

namespace cusafe_kernels {

template <typename T>
__device__ __forceinline__ void fill(T *__restrict__ x, T value, size_t n) {
  const size_t stride = global_thread_count();
  for (size_t i = global_thread_index(); i < n; i += stride)
    x[i] = value;
}

} // namespace cusafe_kernels

extern "C" __global__ void cusafe_fill_f32(float *__restrict__ x, float value,
                                           size_t n) {
  cusafe_kernels::fill(x, value, n);
}

extern "C" __global__ void cusafe_fill_f64(double *__restrict__ x,
                                           double value, size_t n) {
  cusafe_kernels::fill(x, value, n);
}
