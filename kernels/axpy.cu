/* axpy.cu -- y[i] = a * x[i] + y[i] for i < n.
 *
 * The product and the sum are each rounded (no fused multiply-add), so the
 * result equals the host's a * x + y exactly.  x and y may be the same
 * memory (y = a * y + y): each element is read and written by one thread
 * only, so the pointers are not declared __restrict__.  Partly overlapping
 * ranges are a data race. */
#include "common.cuh"

namespace cusafe_kernels {

template <typename T>
__device__ __forceinline__ void axpy(T *y, T a, const T *x, size_t n) {
  const size_t stride = global_thread_count();
  for (size_t i = global_thread_index(); i < n; i += stride)
    y[i] = add_rn(mul_rn(a, x[i]), y[i]);
}

} // namespace cusafe_kernels

extern "C" __global__ void cusafe_axpy_f32(float *y, float a, const float *x,
                                           size_t n) {
  cusafe_kernels::axpy(y, a, x, n);
}

extern "C" __global__ void cusafe_axpy_f64(double *y, double a,
                                           const double *x, size_t n) {
  cusafe_kernels::axpy(y, a, x, n);
}
