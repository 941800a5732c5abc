/* signature.h -- the C types of a kernel's parameters: read from its
 * mangled name (the Itanium C++ ABI, as nvcc and NVRTC name kernels that
 * are not extern "C") or from a C parameter list that the user declares.
 * Both readers are pure and bounded: no recursion deeper than
 * CS_SIG_DEPTH, one allocation of bounded size for their work, and one
 * for the result.  Internal; never installed. */
#ifndef CUSAFE_SIGNATURE_H
#define CUSAFE_SIGNATURE_H

#include <stddef.h>
#include <stdint.h>

/* The most nesting of types (pointers, templates, qualifiers) read. */
#define CS_SIG_DEPTH 32
/* The most bytes of text (the spellings of every type met) and the most
 * parameters read; longer names and lists are not understood. */
#define CS_SIG_TEXT_MAX 16384
#define CS_SIG_PARAMS_MAX 1024

/* What a parameter's type says about the arguments it takes. */
enum cs_type_class {
  CS_TYPE_OTHER = 0, /* a struct, class, union, enum or unknown: by size */
  CS_TYPE_POINTER,   /* any pointer */
  CS_TYPE_INT,       /* an integer of `size` bytes, of either sign */
  CS_TYPE_BOOL,
  CS_TYPE_FLOAT,
  CS_TYPE_DOUBLE
};

/* One parameter's type. */
struct cs_param_type {
  uint8_t cls;  /* enum cs_type_class */
  uint8_t size; /* the bytes the type implies; 0 for CS_TYPE_OTHER */
  uint16_t len; /* its C spelling: len bytes at text + off */
  uint32_t off;
};

/* A kernel's signature, immutable once made, in one allocation: text is
 * "name(type, type)", NUL-terminated, name_len bytes of name first. */
struct cs_signature {
  struct cs_signature *prev; /* the one it replaced (kernel.c keeps both) */
  uint32_t nparams;
  uint32_t name_len;
  char *text; /* inside the same allocation */
  struct cs_param_type params[];
};

/* Reads the parameters' types from a mangled function name ("_Z5scalePfi"
 * -> "scale(float*, int)").  NULL where `mangled` is not a mangled name,
 * is one this reader does not understand, or no memory is left: the
 * caller then knows no types.  The result is malloc'd (free()). */
struct cs_signature *cs_signature_demangle(const char *mangled);

/* Reads a C parameter list ("float *y, const float *x, float a, size_t n";
 * names optional) as the parameters of kernel `name` (name_len bytes).  Returns
 * 0 and *out (malloc'd), 1 with `why` set where the list is not understood (the
 * words of a message: "parameter 0: unexpected \"y\""), 2 where no memory is
 * left, 3 where the text passes CS_SIG_TEXT_MAX bytes. */
int cs_signature_declare(struct cs_signature **out, const char *name,
                         size_t name_len, const char *decl, char *why,
                         size_t why_size);

#endif /* CUSAFE_SIGNATURE_H */
