/* vecadd.cu -- c[i] = a[i] + b[i] for i < n.
 *
 * c may be the same memory as a or b (in-place addition): each element is
 * read and written by one thread only, so the pointers are not declared
 * __restrict__.  Partly overlapping ranges are a data race. */
#include "common.cuh"

namespace cusafe_kernels {

template <typename T>
__device__ __forceinline__ void vecadd(T *c, const T *a, const T *b,
                                       size_t n) {
  const size_t stride = global_thread_count();
  for (size_t i = global_thread_index(); i < n; i += stride)
    c[i] = add_rn(a[i], b[i]);
}

} // namespace cusafe_kernels

extern "C" __global__ void cusafe_vecadd_f32(float *c, const float *a,
                                             const float *b, size_t n) {
  cusafe_kernels::vecadd(c, a, b, n);
}

extern "C" __global__ void cusafe_vecadd_f64(double *c, const double *a,
                                             const double *b, size_t n) {
  cusafe_kernels::vecadd(c, a, b, n);
}
