/* dlpack_abi_check.c -- proves at compile time that cusafe's own DLPack
 * declarations (include/cusafe_dlpack_abi.h) are the ABI of an official
 * dlpack/dlpack.h (1.0 or newer): it compiles, or the check fails.
 *
 * It includes the official header, then a second copy of cusafe's
 * declarations with every name prefixed (cusafe_abi_DLTensor,
 * cusafe_abi_kDLCPU, ...), and asserts for each struct its size and
 * alignment, for each field its offset, size and type, for each enumeration
 * its size, signedness (and, in C++, underlying type) and each enumerator's
 * value, and the value and type of each macro.  What the official header
 * has depends on its minor version (1.1 added the sub-byte float codes and a
 * flag, 1.2 kDLTrn): those are compared where it has them.
 *
 * Build: cc -std=c11 -Wall -Wextra -I<dir of dlpack/> -I<dir of
 * cusafe_dlpack_abi.h> -c dlpack_abi_check.c; also as C++11 (c++ -x c++
 * -std=c++11), where the enumeration with a fixed underlying type differs.
 * Only compiling matters; the object is empty of code but main(). */

#include <dlpack/dlpack.h>

#if !defined(DLPACK_MAJOR_VERSION)
#error "dlpack/dlpack.h is older than DLPack 1.0 (no DLPACK_MAJOR_VERSION)"
#endif

#include <stddef.h>

/* cusafe's declarations, second copy, under a prefix. */
#define CUSAFE_DLPACK_ABI_NAME(x) cusafe_abi_##x
#define CUSAFE_DLPACK_ABI_BODY
#include "cusafe_dlpack_abi.h"
#undef CUSAFE_DLPACK_ABI_BODY
#undef CUSAFE_DLPACK_ABI_NAME
/* And the header proper, for its constants: after the official header, it
 * adopts it and declares nothing (that it compiles here checks that path). */
#include "cusafe_dlpack_abi.h"

#if !CUSAFE_DLPACK_ABI_OFFICIAL
#error "cusafe_dlpack_abi.h did not adopt the official header included first"
#endif

/* ---- the assertion tools, C11 and C++11 ---------------------------------- */
#ifdef __cplusplus
#include <type_traits>
#define ABI_ASSERT(cond, what) static_assert(cond, what)
#define ALIGN_OF(T) alignof(T)
/* Same type, by the type of an expression (decltype of a parenthesised
 * member access is a reference: dropped). */
#define SAME_TYPE(a, b)                                                        \
  (std::is_same<std::remove_reference<decltype(a)>::type,                      \
                std::remove_reference<decltype(b)>::type>::value)
#define HAVE_SAME_TYPE 1
#else
#define ABI_ASSERT(cond, what) _Static_assert(cond, what)
#define ALIGN_OF(T) _Alignof(T)
#if defined(__GNUC__) || defined(__clang__)
/* _Generic on a field: lvalue conversion drops qualifiers, which neither
 * header uses on fields. */
#define SAME_TYPE(a, b) _Generic((a), __typeof__(b) : 1, default : 0)
#define HAVE_SAME_TYPE 1
#else
#define HAVE_SAME_TYPE 0
#endif
#endif

#define OFF_T(T) cusafe_abi_##T
#define FIELD(T, f) (((T *)0)->f)

/* A struct: size and alignment. */
#define CHECK_STRUCT(T)                                                        \
  ABI_ASSERT(sizeof(T) == sizeof(OFF_T(T)), "sizeof(" #T ") differs");         \
  ABI_ASSERT(ALIGN_OF(T) == ALIGN_OF(OFF_T(T)), "alignof(" #T ") differs")

/* A field: offset and size (of any type, including cusafe's own structs,
 * whose layout is checked on their own). */
#define CHECK_FIELD_LAYOUT(T, f)                                               \
  ABI_ASSERT(offsetof(T, f) == offsetof(OFF_T(T), f),                          \
             "offsetof(" #T ", " #f ") differs");                              \
  ABI_ASSERT(sizeof(FIELD(T, f)) == sizeof(FIELD(OFF_T(T), f)),                \
             "sizeof(" #T "." #f ") differs")

/* A field of a type both headers spell alike (integers, void *, int64_t *):
 * layout and the very type (int32_t is not uint32_t). */
#if HAVE_SAME_TYPE
#define CHECK_FIELD(T, f)                                                      \
  CHECK_FIELD_LAYOUT(T, f);                                                    \
  ABI_ASSERT(SAME_TYPE(FIELD(T, f), FIELD(OFF_T(T), f)),                       \
             "type of " #T "." #f " differs")
#else
#define CHECK_FIELD(T, f) CHECK_FIELD_LAYOUT(T, f)
#endif

/* An enumeration: size, alignment, signedness; in C++ the underlying
 * type (DLDeviceType's is int32_t). */
#ifdef __cplusplus
#define CHECK_ENUM_TYPE(T)                                                     \
  ABI_ASSERT(sizeof(T) == sizeof(OFF_T(T)), "sizeof(" #T ") differs");         \
  ABI_ASSERT(ALIGN_OF(T) == ALIGN_OF(OFF_T(T)), "alignof(" #T ") differs");    \
  ABI_ASSERT((std::is_same<std::underlying_type<T>::type,                      \
                           std::underlying_type<OFF_T(T)>::type>::value),      \
             "underlying type of " #T " differs")
#else
#define CHECK_ENUM_TYPE(T)                                                     \
  ABI_ASSERT(sizeof(T) == sizeof(OFF_T(T)), "sizeof(" #T ") differs");         \
  ABI_ASSERT(ALIGN_OF(T) == ALIGN_OF(OFF_T(T)), "alignof(" #T ") differs");    \
  ABI_ASSERT(((T)-1 > (T)0) == ((OFF_T(T)) - 1 > (OFF_T(T))0),                 \
             "signedness of " #T " differs")
#endif

/* An enumerator: its value (as long long: the two are of distinct
 * enumeration types, which C++ would warn about comparing). */
#define CHECK_ENUM(e)                                                          \
  ABI_ASSERT((long long)(e) == (long long)(cusafe_abi_##e), #e " differs")

/* A macro: its value and the size of its type (1UL is not 1U or 1ULL). */
#define CHECK_MACRO(official, ours)                                            \
  ABI_ASSERT((official) == (ours), #official " differs from " #ours);          \
  ABI_ASSERT(sizeof(official) == sizeof(ours),                                 \
             "type of " #official " differs from " #ours)

/* ---- versions ------------------------------------------------------------ */
ABI_ASSERT(DLPACK_MAJOR_VERSION == CUSAFE_DLPACK_ABI_MAJOR,
           "official dlpack.h is of another major version than cusafe's");
/* cusafe transcribes 1.3; an older official header has less to compare
 * (below), a newer one adds enumerators cusafe need not name. */

/* ---- DLPackVersion ------------------------------------------------------- */
CHECK_STRUCT(DLPackVersion);
CHECK_FIELD(DLPackVersion, major);
CHECK_FIELD(DLPackVersion, minor);

/* ---- DLDeviceType -------------------------------------------------------- */
CHECK_ENUM_TYPE(DLDeviceType);
CHECK_ENUM(kDLCPU);
CHECK_ENUM(kDLCUDA);
CHECK_ENUM(kDLCUDAHost);
CHECK_ENUM(kDLOpenCL);
CHECK_ENUM(kDLVulkan);
CHECK_ENUM(kDLMetal);
CHECK_ENUM(kDLVPI);
CHECK_ENUM(kDLROCM);
CHECK_ENUM(kDLROCMHost);
CHECK_ENUM(kDLExtDev);
CHECK_ENUM(kDLCUDAManaged);
CHECK_ENUM(kDLOneAPI);
CHECK_ENUM(kDLWebGPU);
CHECK_ENUM(kDLHexagon);
CHECK_ENUM(kDLMAIA);
#if DLPACK_MINOR_VERSION >= 2
CHECK_ENUM(kDLTrn);
#endif

/* ---- DLDevice ------------------------------------------------------------ */
CHECK_STRUCT(DLDevice);
CHECK_FIELD_LAYOUT(DLDevice, device_type); /* its enum: checked above */
CHECK_FIELD(DLDevice, device_id);

/* ---- DLDataTypeCode ------------------------------------------------------ */
CHECK_ENUM_TYPE(DLDataTypeCode);
CHECK_ENUM(kDLInt);
CHECK_ENUM(kDLUInt);
CHECK_ENUM(kDLFloat);
CHECK_ENUM(kDLOpaqueHandle);
CHECK_ENUM(kDLBfloat);
CHECK_ENUM(kDLComplex);
CHECK_ENUM(kDLBool);
#if DLPACK_MINOR_VERSION >= 1
CHECK_ENUM(kDLFloat8_e3m4);
CHECK_ENUM(kDLFloat8_e4m3);
CHECK_ENUM(kDLFloat8_e4m3b11fnuz);
CHECK_ENUM(kDLFloat8_e4m3fn);
CHECK_ENUM(kDLFloat8_e4m3fnuz);
CHECK_ENUM(kDLFloat8_e5m2);
CHECK_ENUM(kDLFloat8_e5m2fnuz);
CHECK_ENUM(kDLFloat8_e8m0fnu);
CHECK_ENUM(kDLFloat6_e2m3fn);
CHECK_ENUM(kDLFloat6_e3m2fn);
CHECK_ENUM(kDLFloat4_e2m1fn);
#endif

/* ---- DLDataType ---------------------------------------------------------- */
CHECK_STRUCT(DLDataType);
CHECK_FIELD(DLDataType, code);
CHECK_FIELD(DLDataType, bits);
CHECK_FIELD(DLDataType, lanes);

/* ---- DLTensor ------------------------------------------------------------ */
CHECK_STRUCT(DLTensor);
CHECK_FIELD(DLTensor, data);
CHECK_FIELD_LAYOUT(DLTensor, device);
CHECK_FIELD(DLTensor, ndim);
CHECK_FIELD_LAYOUT(DLTensor, dtype);
CHECK_FIELD(DLTensor, shape);
CHECK_FIELD(DLTensor, strides);
CHECK_FIELD(DLTensor, byte_offset);

/* ---- DLManagedTensor ----------------------------------------------------- */
CHECK_STRUCT(DLManagedTensor);
CHECK_FIELD_LAYOUT(DLManagedTensor, dl_tensor);
CHECK_FIELD(DLManagedTensor, manager_ctx);
CHECK_FIELD_LAYOUT(DLManagedTensor, deleter);
#if HAVE_SAME_TYPE
/* The deleter takes its own struct: each header's, by pointer. */
ABI_ASSERT(SAME_TYPE(FIELD(DLManagedTensor, deleter),
                     (void (*)(DLManagedTensor *))0),
           "type of DLManagedTensor.deleter (official) unexpected");
ABI_ASSERT(SAME_TYPE(FIELD(cusafe_abi_DLManagedTensor, deleter),
                     (void (*)(cusafe_abi_DLManagedTensor *))0),
           "type of DLManagedTensor.deleter (cusafe) unexpected");
#endif

/* ---- flags --------------------------------------------------------------- */
CHECK_MACRO(DLPACK_FLAG_BITMASK_READ_ONLY, CUSAFE_DLPACK_ABI_FLAG_READ_ONLY);
CHECK_MACRO(DLPACK_FLAG_BITMASK_IS_COPIED, CUSAFE_DLPACK_ABI_FLAG_IS_COPIED);
#if DLPACK_MINOR_VERSION >= 1
CHECK_MACRO(DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED,
            CUSAFE_DLPACK_ABI_FLAG_IS_SUBBYTE_TYPE_PADDED);
#endif

/* ---- DLManagedTensorVersioned -------------------------------------------- */
CHECK_STRUCT(DLManagedTensorVersioned);
CHECK_FIELD_LAYOUT(DLManagedTensorVersioned, version);
CHECK_FIELD(DLManagedTensorVersioned, manager_ctx);
CHECK_FIELD_LAYOUT(DLManagedTensorVersioned, deleter);
CHECK_FIELD(DLManagedTensorVersioned, flags);
CHECK_FIELD_LAYOUT(DLManagedTensorVersioned, dl_tensor);
#if HAVE_SAME_TYPE
ABI_ASSERT(SAME_TYPE(FIELD(DLManagedTensorVersioned, deleter),
                     (void (*)(DLManagedTensorVersioned *))0),
           "type of DLManagedTensorVersioned.deleter (official) unexpected");
ABI_ASSERT(SAME_TYPE(FIELD(cusafe_abi_DLManagedTensorVersioned, deleter),
                     (void (*)(cusafe_abi_DLManagedTensorVersioned *))0),
           "type of DLManagedTensorVersioned.deleter (cusafe) unexpected");
#endif

/* So that it links and runs as a test program too (make check). */
int main(void) { return 0; }
