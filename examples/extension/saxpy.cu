/* saxpy.cu -- the user's kernel: y[i] = a * x[i] + y[i] for i < n.
 *
 * nvcc compiles it into a fat binary (saxpy.fatbin), which bin2c turns into
 * a C array that libmyext embeds and loads through cusafe.  extern "C"
 * keeps the name plain for cusafe_module_get_kernel().  A grid-stride
 * loop: any grid covers all n elements.  Built with --fmad=false, so that
 * the product is rounded before the sum, as on the host. */
#include <stddef.h>

extern "C" __global__ void myext_saxpy_f32(float *y, const float *x, float a,
                                           size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    y[i] = a * x[i] + y[i];
}
