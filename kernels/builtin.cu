/* builtin.cu -- the kernels built into cusafe, as one translation unit.
 *
 * nvcc compiles this file alone into the fat binary that the library
 * embeds (kernels/cusafe_kernels.fatbin): one image holds every kernel.
 * Each kernels/<op>.cu also compiles on its own.  The kernels' names and
 * parameters are part of cusafe's interface (README.md, "Kernels"). */
#include "fill.cu"
#include "scale.cu"
#include "axpy.cu"
#include "vecadd.cu"
