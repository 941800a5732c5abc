/* vecscale.cu -- a module for tests/check_kernels: nvcc compiles it at
 * build time into tests/data/vecscale.fatbin and tests/data/vecscale.ptx,
 * which the tests load by path and from memory. */
#include <stddef.h>

/* x[i] *= factor for i < n; a grid-stride loop over the x dimension. */
extern "C" __global__ void vecscale_u32(unsigned int *x, unsigned int factor,
                                        size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    x[i] *= factor;
}
