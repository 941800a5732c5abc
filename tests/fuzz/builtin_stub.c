/* builtin_stub.c -- a stand-in for lib/builtin_image.S in the sanitizer
 * builds (tests/fuzz, tests/stress).
 *
 * Those builds link the library's sources with the fake CUDA
 * (tests/fakecuda), which never reads a real image: it recognises the fat
 * binary magic (0xBA55ED50, little-endian) and serves the built-in kernels
 * from its own table.  So the few bytes below stand for the embedded fat
 * binary, and the sanitizer builds need neither nvcc nor the assembler. */
#include <stddef.h>

#include "builtin.h"

__attribute__((aligned(64))) const unsigned char cs_builtin_image[16] = {
    0x50, 0xED, 0x55, 0xBA, /* the fat binary magic */
    0x01, 0x00, 0x10, 0x00, /* version 1, header size 16 */
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
const size_t cs_builtin_image_size = sizeof cs_builtin_image;
