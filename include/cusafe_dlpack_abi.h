/* cusafe_dlpack_abi.h -- the DLPack 1.x ABI that cusafe speaks, declared by
 * cusafe itself, so that the DLPack calls build without dlpack/dlpack.h.
 *
 * What it transcribes.  DLPack 1.3, from DLPack's published specification:
 * the C API reference (https://dmlc.github.io/dlpack/latest/c_api.html:
 * DLPACK_EXTERN_C, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLPACK_DLL,
 * the DLPACK_FLAG_BITMASK_* flags, DLDeviceType, DLDataTypeCode,
 * DLPackVersion, DLDevice, DLDataType, DLTensor, DLManagedTensor,
 * DLManagedTensorVersioned) and the Python specification it serves
 * (https://dmlc.github.io/dlpack/latest/python_spec.html; the array API
 * standard's __dlpack__ / __dlpack_device__ pages give the same device
 * numbers).  Only the data structures: DLPack 1.2's C exchange API
 * (DLPackExchangeAPI, DLPackExchangeAPIHeader and the function-pointer
 * typedefs DLPackManagedTensorAllocator ... DLPackCurrentWorkStream) is
 * not transcribed -- cusafe neither uses nor offers it.  Per release:
 *   1.0  DLPackVersion, DLManagedTensorVersioned, the flags READ_ONLY and
 *        IS_COPIED; device types 1..17 (kDLCPU .. kDLMAIA); type codes 0..6.
 *   1.1  type codes 7..17 (kDLFloat8_e3m4 .. kDLFloat4_e2m1fn), the flag
 *        IS_SUBBYTE_TYPE_PADDED.
 *   1.2  device type 18 (kDLTrn).
 *   1.3  no change to what is declared here.
 * A minor release only adds enumeration values and leaves the layout alone
 * (the spec's rule for DLPackVersion), so these declarations are the ABI
 * of every 1.x: a tensor of version 1.y, y > 3, is read correctly, its
 * newer codes merely have no name here.
 *
 * Why it matches.  The layout follows from the field types the spec gives
 * (C's ordinary struct layout, no packing), and tests/dlpack_abi_check.c
 * proves it wherever an official dlpack/dlpack.h of 1.0 or newer is found:
 * it compiles a second copy of these declarations under a prefix next to
 * the official header and asserts every struct's size and alignment, every
 * field's offset, size and type, every enumeration value (for the minor
 * versions the official header has) and every macro.
 *
 * Coexisting with an official dlpack/dlpack.h in one translation unit.
 * The two cannot both declare DLTensor and kDLCPU, so only one of them
 * declares, whichever comes first:
 *   - the official header first: this header declares nothing and uses
 *     its declarations (it only refuses a major version other than 1, and
 *     a pre-1.0 header, which has no DLManagedTensorVersioned), except
 *     what a 1.0 or 1.1 header lacks: in C the typedef name
 *     DLManagedTensorVersioned (those declare only the struct tag), and
 *     the flag DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED of 1.1;
 *   - this header first (or alone): it declares everything above and
 *     defines the official header's include guard, DLPACK_DLPACK_H_, so a
 *     later #include <dlpack/dlpack.h> is empty.
 * Trade-off of the second case: a translation unit that includes cusafe's
 * header first and the official one after gets cusafe's transcription, not
 * the official header -- none of the C exchange API, and none of the
 * enumerators of minors newer than 1.3.  Code that wants those includes
 * <dlpack/dlpack.h> before any cusafe header, or defines
 * CUSAFE_DLPACK_USE_OFFICIAL, which makes this header include
 * <dlpack/dlpack.h> itself (which must then be on the include path).
 * Either way the types are identical in layout, so calls into libcusafe
 * work with both.  CUSAFE_DLPACK_ABI_OFFICIAL says which case it was: 1
 * where the official header declares, 0 where this one does.
 *
 * cusafe's own constants, whichever header declares: CUSAFE_DLPACK_ABI_MAJOR
 * and CUSAFE_DLPACK_ABI_MINOR (the version transcribed: libcusafe stamps
 * its tensors with it), CUSAFE_DLPACK_ABI_FLAG_READ_ONLY,
 * CUSAFE_DLPACK_ABI_FLAG_IS_COPIED and
 * CUSAFE_DLPACK_ABI_FLAG_IS_SUBBYTE_TYPE_PADDED.
 *
 * A second, renamed copy (for the ABI check).  The declarations are written
 * with CUSAFE_DLPACK_ABI_NAME(x) around every name.  Defining that macro
 * and CUSAFE_DLPACK_ABI_BODY, then including this header again, declares
 * them under the names the macro makes, in any translation unit, next to
 * any other DLPack header:
 *     #define CUSAFE_DLPACK_ABI_NAME(x) mine_##x
 *     #define CUSAFE_DLPACK_ABI_BODY
 *     #include "cusafe_dlpack_abi.h"     (mine_DLTensor, mine_kDLCPU, ...)
 *     #undef CUSAFE_DLPACK_ABI_BODY
 *     #undef CUSAFE_DLPACK_ABI_NAME
 * (once per prefix; macros are not renamed: the CUSAFE_DLPACK_ABI_*
 * constants above stand for them).
 *
 * C99 or newer, C++98 or newer (C++11 gives DLDeviceType its fixed
 * underlying type int32_t, as the specification does; before C++11 it is
 * a plain enum, int-sized on every ABI cusafe supports). */

#ifndef CUSAFE_DLPACK_ABI_BODY
/* ===================== the header proper ================================ */
#ifndef CUSAFE_DLPACK_ABI_H
#define CUSAFE_DLPACK_ABI_H

#define CUSAFE_DLPACK_ABI_MAJOR 1
#define CUSAFE_DLPACK_ABI_MINOR 3
#define CUSAFE_DLPACK_ABI_FLAG_READ_ONLY (1UL << 0UL)
#define CUSAFE_DLPACK_ABI_FLAG_IS_COPIED (1UL << 1UL)
#define CUSAFE_DLPACK_ABI_FLAG_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)

#if defined(CUSAFE_DLPACK_USE_OFFICIAL) && !defined(DLPACK_DLPACK_H_)
#include <dlpack/dlpack.h>
#endif

#ifdef DLPACK_DLPACK_H_
/* ---- an official header (or a copy keeping its guard) came first ------ */
#define CUSAFE_DLPACK_ABI_OFFICIAL 1
#if !defined(DLPACK_MAJOR_VERSION)
/* (a pre-1.0 header: no DLManagedTensorVersioned) */
#error "cusafe: dlpack/dlpack.h included first is older than DLPack 1.0"
#elif DLPACK_MAJOR_VERSION != CUSAFE_DLPACK_ABI_MAJOR
#error "cusafe: dlpack/dlpack.h included first is not of DLPack 1.x"
#endif
/* DLPack 1.0 and 1.1 declare `struct DLManagedTensorVersioned` with no
 * typedef (1.2 added it): give C the name it has in every other case.  Only
 * where missing -- C99 forbids repeating a typedef; C++ has the name. */
#if !defined(__cplusplus) && DLPACK_MINOR_VERSION < 2
typedef struct DLManagedTensorVersioned DLManagedTensorVersioned;
#endif
/* A 1.0 header lacks the 1.1 flag: give it, it is only a number. */
#ifndef DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED                             \
  CUSAFE_DLPACK_ABI_FLAG_IS_SUBBYTE_TYPE_PADDED
#endif

#else
/* ---- cusafe declares, and claims the official header's guard ----------- */
#define CUSAFE_DLPACK_ABI_OFFICIAL 0

#ifdef __cplusplus
#define DLPACK_EXTERN_C extern "C"
#else
#define DLPACK_EXTERN_C
#endif
#define DLPACK_MAJOR_VERSION CUSAFE_DLPACK_ABI_MAJOR
#define DLPACK_MINOR_VERSION CUSAFE_DLPACK_ABI_MINOR
#ifdef _WIN32
#ifdef DLPACK_EXPORTS
#define DLPACK_DLL __declspec(dllexport)
#else
#define DLPACK_DLL __declspec(dllimport)
#endif
#else
#define DLPACK_DLL
#endif
#define DLPACK_FLAG_BITMASK_READ_ONLY CUSAFE_DLPACK_ABI_FLAG_READ_ONLY
#define DLPACK_FLAG_BITMASK_IS_COPIED CUSAFE_DLPACK_ABI_FLAG_IS_COPIED
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED                             \
  CUSAFE_DLPACK_ABI_FLAG_IS_SUBBYTE_TYPE_PADDED

#define CUSAFE_DLPACK_ABI_NAME(x) x
#define CUSAFE_DLPACK_ABI_BODY
#include "cusafe_dlpack_abi.h"
#undef CUSAFE_DLPACK_ABI_BODY
#undef CUSAFE_DLPACK_ABI_NAME

/* A later #include <dlpack/dlpack.h> is now empty (see the trade-off). */
#define DLPACK_DLPACK_H_
#endif /* DLPACK_DLPACK_H_ */

#endif /* CUSAFE_DLPACK_ABI_H */

#else
/* ===================== the declarations ================================= */
/* Included with CUSAFE_DLPACK_ABI_NAME(x) defined; no include guard. */
#ifndef CUSAFE_DLPACK_ABI_NAME
#error                                                                         \
    "cusafe_dlpack_abi.h: CUSAFE_DLPACK_ABI_BODY needs CUSAFE_DLPACK_ABI_NAME"
#endif
#define CUSAFE_DL_ CUSAFE_DLPACK_ABI_NAME

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of a DLPack ABI.  The major changes with the layout of
 * DLManagedTensorVersioned (a consumer must then call the deleter and touch
 * nothing else); the minor with additions (new enumeration values) that
 * keep the layout. */
typedef struct {
  uint32_t major;
  uint32_t minor;
} CUSAFE_DL_(DLPackVersion);

/* The kind of memory (device) a tensor lives in. */
#if defined(__cplusplus) && __cplusplus >= 201103L
typedef enum : int32_t {
#else
typedef enum {
#endif
  CUSAFE_DL_(kDLCPU) = 1,       /* host memory */
  CUSAFE_DL_(kDLCUDA) = 2,      /* CUDA device memory */
  CUSAFE_DL_(kDLCUDAHost) = 3,  /* CUDA pinned host memory (cudaMallocHost) */
  CUSAFE_DL_(kDLOpenCL) = 4,    /* OpenCL */
  CUSAFE_DL_(kDLVulkan) = 7,    /* Vulkan buffer */
  CUSAFE_DL_(kDLMetal) = 8,     /* Apple Metal */
  CUSAFE_DL_(kDLVPI) = 9,       /* Verilog simulator buffer */
  CUSAFE_DL_(kDLROCM) = 10,     /* ROCm (AMD) device memory */
  CUSAFE_DL_(kDLROCMHost) = 11, /* ROCm pinned host memory (hipMallocHost) */
  CUSAFE_DL_(kDLExtDev) = 12,   /* reserved for trying out new devices */
  CUSAFE_DL_(kDLCUDAManaged) = 13, /* CUDA managed memory (cudaMallocManaged) */
  CUSAFE_DL_(kDLOneAPI) = 14,      /* oneAPI unified shared memory */
  CUSAFE_DL_(kDLWebGPU) = 15,      /* WebGPU */
  CUSAFE_DL_(kDLHexagon) = 16,     /* Qualcomm Hexagon DSP */
  CUSAFE_DL_(kDLMAIA) = 17,        /* Microsoft MAIA */
  CUSAFE_DL_(kDLTrn) = 18          /* AWS Trainium (DLPack 1.2) */
} CUSAFE_DL_(DLDeviceType);

/* A device: its kind, and its index among those of that kind (0 for
 * kDLCPU and pinned host memory). */
typedef struct {
  CUSAFE_DL_(DLDeviceType) device_type;
  int32_t device_id;
} CUSAFE_DL_(DLDevice);

/* What DLDataType.code holds.  The specification writes the values
 * unsigned; the enumeration's own type is left to C, as it is there (the
 * field that carries a code is a uint8_t). */
typedef enum {
  CUSAFE_DL_(kDLInt) = 0U,          /* signed integer */
  CUSAFE_DL_(kDLUInt) = 1U,         /* unsigned integer */
  CUSAFE_DL_(kDLFloat) = 2U,        /* IEEE floating point */
  CUSAFE_DL_(kDLOpaqueHandle) = 3U, /* opaque handles, by agreement only */
  CUSAFE_DL_(kDLBfloat) = 4U,       /* bfloat16 */
  CUSAFE_DL_(kDLComplex) = 5U,      /* complex: real and imaginary parts */
  CUSAFE_DL_(kDLBool) = 6U,         /* boolean */
  /* DLPack 1.1: 8-bit floating point formats */
  CUSAFE_DL_(kDLFloat8_e3m4) = 7U,
  CUSAFE_DL_(kDLFloat8_e4m3) = 8U,
  CUSAFE_DL_(kDLFloat8_e4m3b11fnuz) = 9U,
  CUSAFE_DL_(kDLFloat8_e4m3fn) = 10U,
  CUSAFE_DL_(kDLFloat8_e4m3fnuz) = 11U,
  CUSAFE_DL_(kDLFloat8_e5m2) = 12U,
  CUSAFE_DL_(kDLFloat8_e5m2fnuz) = 13U,
  CUSAFE_DL_(kDLFloat8_e8m0fnu) = 14U,
  /* DLPack 1.1: 6- and 4-bit floating point formats (sub-byte: packed
   * unless the tensor's flags say IS_SUBBYTE_TYPE_PADDED) */
  CUSAFE_DL_(kDLFloat6_e2m3fn) = 15U,
  CUSAFE_DL_(kDLFloat6_e3m2fn) = 16U,
  CUSAFE_DL_(kDLFloat4_e2m1fn) = 17U
} CUSAFE_DL_(DLDataTypeCode);

/* An element type: `lanes` values (vector lanes, 1 for scalars) of `bits`
 * bits each, of kind `code` (a DLDataTypeCode), in native byte order. */
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} CUSAFE_DL_(DLDataType);

/* A tensor, not owning its memory.  Element i (a multi-index) is at byte
 * (char *)data + byte_offset + sum(i[k] * strides[k]) * element size;
 * strides count elements.  Before DLPack 1.2, strides NULL meant compact
 * row-major order; from 1.2 on they must be set wherever ndim != 0 (cusafe
 * always sets them, and still reads NULL as row-major). */
typedef struct {
  void *data; /* base address (device address for GPUs) */
  CUSAFE_DL_(DLDevice) device;
  int32_t ndim; /* number of dimensions */
  CUSAFE_DL_(DLDataType) dtype;
  int64_t *shape;       /* ndim sizes */
  int64_t *strides;     /* ndim strides in elements, or NULL */
  uint64_t byte_offset; /* bytes from data to the element of index 0 */
} CUSAFE_DL_(DLTensor);

/* The legacy (unversioned) managed tensor: a DLTensor lent by its producer,
 * who frees it when the consumer calls deleter(self) once (deleter may be
 * NULL). */
typedef struct CUSAFE_DL_(DLManagedTensor) {
  CUSAFE_DL_(DLTensor) dl_tensor;
  void *manager_ctx; /* the producer's */
  void (*deleter)(struct CUSAFE_DL_(DLManagedTensor) * self);
} CUSAFE_DL_(DLManagedTensor);

/* The versioned managed tensor of DLPack 1.x.  Everything up to `flags` is
 * stable across major versions, so that a consumer can always read the
 * version and call the deleter. */
typedef struct CUSAFE_DL_(DLManagedTensorVersioned) {
  CUSAFE_DL_(DLPackVersion) version;
  void *manager_ctx; /* the producer's */
  void (*deleter)(struct CUSAFE_DL_(DLManagedTensorVersioned) * self);
  uint64_t flags; /* DLPACK_FLAG_BITMASK_*; 0 by default */
  CUSAFE_DL_(DLTensor) dl_tensor;
} CUSAFE_DL_(DLManagedTensorVersioned);

#ifdef __cplusplus
}
#endif

#undef CUSAFE_DL_
#endif /* CUSAFE_DLPACK_ABI_BODY */
