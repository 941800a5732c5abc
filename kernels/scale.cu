/* scale.cu -- x[i] *= a for i < n. */
#include "common.cuh"

namespace cusafe_kernels {

template <typename T>
__device__ __forceinline__ void scale(T *__restrict__ x, T a, size_t n) {
  const size_t stride = global_thread_count();
  for (size_t i = global_thread_index(); i < n; i += stride)
    x[i] = mul_rn(x[i], a);
}

} // namespace cusafe_kernels

extern "C" __global__ void cusafe_scale_f32(float *__restrict__ x, float a,
                                            size_t n) {
  cusafe_kernels::scale(x, a, n);
}

extern "C" __global__ void cusafe_scale_f64(double *__restrict__ x, double a,
                                            size_t n) {
  cusafe_kernels::scale(x, a, n);
}
