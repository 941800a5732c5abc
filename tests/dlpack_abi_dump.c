/* dlpack_abi_dump.c -- prints the DLPack ABI that one header declares, one
 * fact a line, so that tests/dlpack-abi.sh can diff cusafe's own
 * declarations against an official dlpack/dlpack.h.
 *
 * Built twice from this one file: with -DDUMP_OFFICIAL it includes the
 * official <dlpack/dlpack.h>; without, cusafe_dlpack_abi.h alone, which
 * then declares everything itself (the branch that no official header
 * replaces).  Each prints, for every struct, its size and alignment; for
 * every field its offset, size and type; for every enumeration its size,
 * alignment and integer type (in C++ the underlying type); for
 * every enumerator its value (in C++ its enumeration); for every macro its
 * value and type, or its tokens.  The enumerators and macros are those of
 * dlpack_abi_names.h, which the script makes from the names both headers
 * declare (it reports those only one of them declares), as lines
 * ENUMERATOR(kDLCPU), MACRO(DLPACK_FLAG_BITMASK_READ_ONLY),
 * TOKENS(DLPACK_EXTERN_C).  The structs and fields are DLPack's own: a
 * field more or less shows in the sizes and offsets.
 *
 * C11 (_Generic) or C++11 (decltype); a type that neither expects does not
 * compile, rather than print alike in both. */

#ifdef DUMP_OFFICIAL
#include <dlpack/dlpack.h>
#if !defined(__cplusplus) && DLPACK_MINOR_VERSION < 2
/* (1.0 and 1.1 declare the struct tag only) */
typedef struct DLManagedTensorVersioned DLManagedTensorVersioned;
#endif
#else
#include "cusafe_dlpack_abi.h"
#if CUSAFE_DLPACK_ABI_OFFICIAL
#error "cusafe_dlpack_abi.h adopted an official header: it must declare alone"
#endif
#endif

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
#include <type_traits>
template <class T> struct type_name; /* undefined: unexpected types fail */
#define TYPE_NAME(T, s)                                                        \
  template <> struct type_name<T> {                                            \
    static const char *get() { return s; }                                     \
  };
TYPE_NAME(char, "char")
TYPE_NAME(signed char, "signed char")
TYPE_NAME(unsigned char, "unsigned char")
TYPE_NAME(short, "short")
TYPE_NAME(unsigned short, "unsigned short")
TYPE_NAME(int, "int")
TYPE_NAME(unsigned, "unsigned int")
TYPE_NAME(long, "long")
TYPE_NAME(unsigned long, "unsigned long")
TYPE_NAME(long long, "long long")
TYPE_NAME(unsigned long long, "unsigned long long")
TYPE_NAME(void *, "void *")
TYPE_NAME(long *, "long *")
TYPE_NAME(long long *, "long long *")
TYPE_NAME(DLPackVersion, "DLPackVersion")
TYPE_NAME(DLDeviceType, "DLDeviceType")
TYPE_NAME(DLDevice, "DLDevice")
TYPE_NAME(DLDataTypeCode, "DLDataTypeCode")
TYPE_NAME(DLDataType, "DLDataType")
TYPE_NAME(DLTensor, "DLTensor")
TYPE_NAME(void (*)(DLManagedTensor *), "void (*)(DLManagedTensor *)")
TYPE_NAME(void (*)(DLManagedTensorVersioned *),
          "void (*)(DLManagedTensorVersioned *)")
/* The type of an expression, or (unparenthesised member access) the
 * declared type of a field. */
#define TYPE_OF(x)                                                             \
  type_name<                                                                   \
      std::remove_cv<std::remove_reference<decltype(x)>::type>::type>::get()
#define ALIGN_OF(T) alignof(T)
#define ENUM_INT_TYPE(T) type_name<std::underlying_type<T>::type>::get()
#else
/* An enumeration type is compatible with an integer type: that is its name
 * here (C has no name of its own for it). */
#define TYPE_OF(x)                                                             \
  _Generic((x), char                                                           \
           : "char", signed char                                               \
           : "signed char", unsigned char                                      \
           : "unsigned char", short                                            \
           : "short", unsigned short                                           \
           : "unsigned short", int                                             \
           : "int", unsigned                                                   \
           : "unsigned int", long                                              \
           : "long", unsigned long                                             \
           : "unsigned long", long long                                        \
           : "long long", unsigned long long                                   \
           : "unsigned long long", void *                                      \
           : "void *", long *                                                  \
           : "long *", long long *                                             \
           : "long long *", DLPackVersion                                      \
           : "DLPackVersion", DLDevice                                         \
           : "DLDevice", DLDataType                                            \
           : "DLDataType", DLTensor                                            \
           : "DLTensor", void (*)(DLManagedTensor *)                           \
           : "void (*)(DLManagedTensor *)",                                    \
             void (*)(DLManagedTensorVersioned *)                              \
           : "void (*)(DLManagedTensorVersioned *)")
#define ALIGN_OF(T) _Alignof(T)
#define ENUM_INT_TYPE(T) TYPE_OF((T)0)
#endif

#define STRUCT(T)                                                              \
  printf("struct %s: size %u, align %u\n", #T, (unsigned)sizeof(T),            \
         (unsigned)ALIGN_OF(T))
#define FIELD(T, f)                                                            \
  printf("field %s.%s: offset %u, size %u, type %s\n", #T, #f,                 \
         (unsigned)offsetof(T, f), (unsigned)sizeof(((T *)0)->f),              \
         TYPE_OF(((T *)0)->f))
#define ENUM(T)                                                                \
  printf("enum %s: size %u, align %u, integer type %s\n", #T,                  \
         (unsigned)sizeof(T), (unsigned)ALIGN_OF(T), ENUM_INT_TYPE(T))
#define ENUMERATOR(e)                                                          \
  printf("enumerator %s = %lld, type %s\n", #e, (long long)(e), TYPE_OF(e));
#define MACRO(m)                                                               \
  printf("macro %s = %lld, type %s\n", #m, (long long)(m), TYPE_OF(m));
#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)
#define TOKENS(m) printf("macro %s -> [%s]\n", #m, STRINGIFY(m));

int main(void) {
  STRUCT(DLPackVersion);
  FIELD(DLPackVersion, major);
  FIELD(DLPackVersion, minor);
  ENUM(DLDeviceType);
  STRUCT(DLDevice);
  FIELD(DLDevice, device_type);
  FIELD(DLDevice, device_id);
  ENUM(DLDataTypeCode);
  STRUCT(DLDataType);
  FIELD(DLDataType, code);
  FIELD(DLDataType, bits);
  FIELD(DLDataType, lanes);
  STRUCT(DLTensor);
  FIELD(DLTensor, data);
  FIELD(DLTensor, device);
  FIELD(DLTensor, ndim);
  FIELD(DLTensor, dtype);
  FIELD(DLTensor, shape);
  FIELD(DLTensor, strides);
  FIELD(DLTensor, byte_offset);
  STRUCT(DLManagedTensor);
  FIELD(DLManagedTensor, dl_tensor);
  FIELD(DLManagedTensor, manager_ctx);
  FIELD(DLManagedTensor, deleter);
  STRUCT(DLManagedTensorVersioned);
  FIELD(DLManagedTensorVersioned, version);
  FIELD(DLManagedTensorVersioned, manager_ctx);
  FIELD(DLManagedTensorVersioned, deleter);
  FIELD(DLManagedTensorVersioned, flags);
  FIELD(DLManagedTensorVersioned, dl_tensor);
#include "dlpack_abi_names.h"
  return 0;
}
