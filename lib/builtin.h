/* builtin.h -- the fat binary of cusafe's built-in kernels.
 *
 * nvcc compiles the kernels/<op>.cu files into one fat binary at build time
 * (kernels/cusafe_kernels.fatbin: SASS for each architecture of
 * ./configure --with-cuda-arch, PTX of the newest); lib/builtin_image.S
 * embeds it in the library.  The image is aligned for CUDA's loaders and
 * lives for the whole process.  Internal: not exported. */
#ifndef CUSAFE_BUILTIN_H
#define CUSAFE_BUILTIN_H

#include <stddef.h>

/* The fat binary's bytes and their number. */
extern const unsigned char cs_builtin_image[];
extern const size_t cs_builtin_image_size;

#endif /* CUSAFE_BUILTIN_H */
