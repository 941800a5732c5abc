/* check_types.c -- the types of kernels' parameters: read from mangled
 * names (lib/signature.c, against names that nvcc gave real kernels),
 * declared (cusafe_kernel_declare), and the launches they refuse.
 *
 * Built twice, as check_api.c is: against the fake CUDA (each test forked,
 * with a fresh library; its modules are fake images and sources compiled
 * by the fake NVRTC, which names C++ kernels mangled as nvcc does) and
 * against the real runtime, where it skips without a GPU and all tests
 * share one process. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cusafe.h"
#include "signature.h"
#include "testutil.h"

#ifdef CUSAFE_TEST_FAKE
#include "fakecuda.h"
#include "fakeutil.h"
#endif

static cusafe_context ctx;

static void ctx_setup(void) {
  ctx = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&ctx, 0));
}

static void ctx_teardown(void) {
  (void)cusafe_context_release(ctx);
  ctx = CUSAFE_NULL_HANDLE;
}

static cusafe_launch_config config1(void) {
  cusafe_launch_config c = {{1, 1, 1}, {32, 1, 1}, 0, CUSAFE_STREAM_DEFAULT};
  return c;
}

/* The kernel's signature, checked to fit and to say its own length. */
#define SIG_EQ(k, want)                                                        \
  do {                                                                         \
    char sig_[256];                                                            \
    size_t len_ = 0;                                                           \
    TU_OK(cusafe_kernel_get_signature(sig_, sizeof sig_, &len_, (k)));         \
    TU_ASSERT(strcmp(sig_, (want)) == 0 && len_ == strlen(want),               \
              "signature \"%s\" (%zu bytes), expected \"%s\"", sig_, len_,     \
              (want));                                                         \
  } while (0)

/* ---- names: the demangler against nvcc's names ----------------------------
 */

/* Names that nvcc 13 gave kernels of tests/data-like sources (nvcc -cubin
 * -arch=sm_90, the symbols of the cubin), with what they say.  `classes`:
 * one letter per parameter: p pointer, i integer, b bool, f float, d
 * double, o other (by size), and the integer's size after an i. */
static const struct {
  const char *mangled, *signature, *classes;
} nvcc_names[] = {
    /* __global__ void scale(float *x, int n) */
    {"_Z5scalePfi", "scale(float*, int)", "pi4"},
    /* axpy(float *y, const float *x, float a, size_t n) */
    {"_Z4axpyPfPKffm", "axpy(float*, const float*, float, unsigned long)",
     "ppfi8"},
    /* same(float *a, float *b, const float *c, const float *d) */
    {"_Z4samePfS_PKfS1_", "same(float*, float*, const float*, const float*)",
     "pppp"},
    /* every integer type and bool */
    {"_Z4intsahcstijlmxyb",
     "ints(signed char, unsigned char, char, short, unsigned short, int, "
     "unsigned int, long, unsigned long, long long, unsigned long long, "
     "bool)",
     "i1i1i1i2i2i4i4i8i8i8i8b"},
    /* fd(float, double, Params, Color (an enum), __half, const double *) */
    {"_Z2fdfd6Params5Color6__halfPKd",
     "fd(float, double, Params, Color, __half, const double*)", "fdooop"},
    /* vol(volatile int *, const volatile float *, float **,
     *     const float *const *) */
    {"_Z3volPViPVKfPPfPKPKf",
     "vol(volatile int*, const volatile float*, float**, "
     "const float* const*)",
     "pppp"},
    {"_Z4nonev", "none()", ""},
    /* template <typename T> __global__ void kernel(T *p, int n) */
    {"_Z6kernelIfEvPT_i", "kernel<float>(float*, int)", "pi4"},
    {"_Z6kernelIdEvPT_i", "kernel<double>(double*, int)", "pi4"},
    /* template <typename T, int N> tk(T *a, T b, const T *c), <float, 256> */
    {"_Z2tkIfLi256EEvPT_S0_PKS0_",
     "tk<float, 256>(float*, float, const float*)", "pfp"},
    /* boxes(Box<float>, Box<float>, Box<int> *) */
    {"_Z5boxes3BoxIfES0_PS_IiE", "boxes(Box<float>, Box<float>, Box<int>*)",
     "oop"},
    /* fnptr(void (*f)(int), int x) */
    {"_Z5fnptrPFviEi", "fnptr(void(int)*, int)", "pi4"},
    /* hal(__half *p, __half2 q) */
    {"_Z3halP6__half7__half2", "hal(__half*, __half2)", "po"},
    /* namespace ns { nsk(Inner, float *) } */
    {"_ZN2ns3nskENS_5InnerEPf", "ns::nsk(ns::Inner, float*)", "op"},
    /* a static kernel */
    {"_ZL5scalePfi", "scale(float*, int)", "pi4"},
};

static void classes_check(const struct cs_signature *sig, const char *want,
                          const char *what) {
  static const char letters[] = "opibfd"; /* in enum cs_type_class's order */
  const char *c = want;
  for (uint32_t i = 0; i < sig->nparams; i++) {
    const struct cs_param_type *t = &sig->params[i];
    TU_ASSERT(*c && *c == letters[t->cls],
              "%s: parameter %u is of class %d, expected '%c'", what, i, t->cls,
              *c ? *c : '-');
    c++;
    if (t->cls == CS_TYPE_INT) {
      TU_ASSERT(*c - '0' == t->size, "%s: parameter %u is %d bytes, not %c",
                what, i, t->size, *c);
      c++;
    }
  }
  TU_ASSERT(*c == '\0', "%s: %u parameters, expected more (%s)", what,
            sig->nparams, c);
}

START_TEST(test_demangle_nvcc_names) {
  for (size_t i = 0; i < sizeof nvcc_names / sizeof nvcc_names[0]; i++) {
    struct cs_signature *sig = cs_signature_demangle(nvcc_names[i].mangled);
    TU_ASSERT(sig != NULL, "%s not understood", nvcc_names[i].mangled);
    TU_ASSERT(strcmp(sig->text, nvcc_names[i].signature) == 0,
              "%s read as \"%s\", expected \"%s\"", nvcc_names[i].mangled,
              sig->text, nvcc_names[i].signature);
    classes_check(sig, nvcc_names[i].classes, nvcc_names[i].mangled);
    free(sig);
  }
}
END_TEST

/* Names that are not mangled, or not understood: the kernel then checks
 * sizes only. */
START_TEST(test_demangle_refuses) {
  static const char *const names[] = {
      "scale",   "",        "_Z",          "_Z1f",        "_Z5scale",
      "_Z1fz",   "_Z1fRi",  "_Z1fS_",      "_Z1fT_",      "_Z5scalePfi.isra.0",
      "_Z1fPfv", "_Z0Pf",   "_Z99999999f", "_Z1fIiEvS5_", "_ZZ1fvE1gv",
      "_Z1fA",   "_Z1fLi1E"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    struct cs_signature *sig = cs_signature_demangle(names[i]);
    TU_ASSERT(sig == NULL, "\"%s\" read as \"%s\"", names[i],
              sig ? sig->text : "");
  }
  /* Nesting is bounded: 30 pointers are read, 40 are not; a long name of
   * many substitutions costs no more than its length. */
  char deep[128] = "_Z1f";
  memset(deep + 4, 'P', 30);
  strcpy(deep + 34, "i");
  struct cs_signature *sig = cs_signature_demangle(deep);
  TU_ASSERT(sig && sig->nparams == 1 && sig->params[0].cls == CS_TYPE_POINTER,
            "30 pointers not read");
  free(sig);
  memset(deep + 4, 'P', 40);
  strcpy(deep + 44, "i");
  TU_ASSERT(cs_signature_demangle(deep) == NULL, "40 pointers read");
  char *many = tu_xmalloc(CS_SIG_TEXT_MAX + 8);
  strcpy(many, "_Z1fPf");
  for (size_t n = strlen(many); n + 3 < CS_SIG_TEXT_MAX; n += 2)
    strcpy(many + n, "S_");
  TU_ASSERT(cs_signature_demangle(many) == NULL,
            "a name of more than %d parameters read", CS_SIG_PARAMS_MAX);
  free(many);
}
END_TEST

/* The declared lists, read alone. */
START_TEST(test_declare_reader) {
  static const struct {
    const char *decl, *signature, *classes;
  } good[] = {
      {"float *y, const float *x, float a, size_t n",
       "k(float*, const float*, float, size_t)", "ppfi8"},
      {"float*, const float*, float, unsigned long",
       "k(float*, const float*, float, unsigned long)", "ppfi8"},
      {"", "k()", ""},
      {" void ", "k()", ""},
      {"struct Params p, Params, unsigned, long long n, int8_t q",
       "k(struct Params, Params, unsigned int, long long, int8_t)", "ooi4i8i1"},
      {"const float * const * const p, volatile int *v, void *w",
       "k(const float* const*, volatile int*, void*)", "ppp"},
      {"bool b, _Bool c, double d, long double e, ns::T t",
       "k(bool, bool, double, long double, ns::T)", "bbdoo"},
      {"unsigned char, signed char c, short, unsigned short int s",
       "k(unsigned char, signed char, short, unsigned short)", "i1i1i2i2"},
      {"ptrdiff_t, int64_t, uint32_t, __grid_constant__ const Params p",
       "k(ptrdiff_t, int64_t, uint32_t, Params)", "i8i8i4o"},
      {"float * __restrict__ x, int n", "k(float*, int)", "pi4"},
  };
  static const struct {
    const char *decl, *why;
  } bad[] = {
      {"float**x y", "parameter 0: unexpected \"y\""},
      {"int float", "parameter 0: \"int float\" is not a type"},
      {"float *x,", "parameter 1: no type"},
      {"void, int", "parameter 0: a parameter cannot be void"},
      {"*x", "parameter 0: unexpected \"*\""},
      {"int n[4]", "parameter 0: unexpected \"[\""},
      {"int a b c", "parameter 0: \"int a b c\" is not a type"},
      {"long long long", "parameter 0: \"long long long\" is not a type"},
      {"float, int\x01", "parameter 1: unexpected \"\\x01\""},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    struct cs_signature *sig = NULL;
    char why[128] = "";
    TU_ASSERT(
        cs_signature_declare(&sig, "k", 1, good[i].decl, why, sizeof why) == 0,
        "\"%s\" refused: %s", good[i].decl, why);
    TU_ASSERT(strcmp(sig->text, good[i].signature) == 0,
              "\"%s\" read as \"%s\", expected \"%s\"", good[i].decl, sig->text,
              good[i].signature);
    classes_check(sig, good[i].classes, good[i].decl);
    free(sig);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    struct cs_signature *sig = NULL;
    char why[128] = "";
    TU_ASSERT(
        cs_signature_declare(&sig, "k", 1, bad[i].decl, why, sizeof why) == 1 &&
            sig == NULL,
        "\"%s\" not refused", bad[i].decl);
    TU_ASSERT(strcmp(why, bad[i].why) == 0, "\"%s\": \"%s\", expected \"%s\"",
              bad[i].decl, why, bad[i].why);
  }
}
END_TEST

/* ---- the built-in kernels declare their types -----------------------------
 */

START_TEST(test_builtin_types) {
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_buffer x = CUSAFE_NULL_HANDLE, y = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_load_builtin(&m, ctx));
  TU_OK(cusafe_buffer_alloc(&x, ctx, CUSAFE_MEMORY_DEVICE, 64 * sizeof(float)));
  TU_OK(cusafe_buffer_alloc(&y, ctx, CUSAFE_MEMORY_DEVICE, 64 * sizeof(float)));
  static const char *const sigs[][2] = {
      {"cusafe_fill_f32", "cusafe_fill_f32(float*, float, size_t)"},
      {"cusafe_fill_f64", "cusafe_fill_f64(double*, double, size_t)"},
      {"cusafe_scale_f32", "cusafe_scale_f32(float*, float, size_t)"},
      {"cusafe_scale_f64", "cusafe_scale_f64(double*, double, size_t)"},
      {"cusafe_axpy_f32",
       "cusafe_axpy_f32(float*, float, const float*, size_t)"},
      {"cusafe_axpy_f64",
       "cusafe_axpy_f64(double*, double, const double*, size_t)"},
      {"cusafe_vecadd_f32",
       "cusafe_vecadd_f32(float*, const float*, const float*, size_t)"},
      {"cusafe_vecadd_f64",
       "cusafe_vecadd_f64(double*, const double*, const double*, size_t)"},
  };
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    cusafe_kernel k = tu_get_kernel(m, sigs[i][0]);
    SIG_EQ(k, sigs[i][1]);
    TU_OK(cusafe_kernel_release(k));
  }
  cusafe_kernel k = tu_get_kernel(m, "cusafe_axpy_f32");
  cusafe_launch_config c = config1();
  /* size_t takes either sign of 64 bits: Python passes its ints as I64 */
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(y), CUSAFE_ARG_F32V(2.0f),
                      CUSAFE_ARG_BUF(x), CUSAFE_ARG_U64V(64)));
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(y), CUSAFE_ARG_F32V(2.0f),
                      CUSAFE_ARG_BUF(x), CUSAFE_ARG_I64V(64)));
  TU_ERR(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(y), CUSAFE_ARG_F32V(2.0f),
                       CUSAFE_ARG_U64V(0), CUSAFE_ARG_U64V(64)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 2 of kernel cusafe_axpy_f32(float*, float, const float*, "
         "size_t) is an unsigned 64-bit integer, parameter 2 is const float*");
  TU_ERR(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(y), CUSAFE_ARG_I32V(2),
                       CUSAFE_ARG_BUF(x), CUSAFE_ARG_U64V(64)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 1 of kernel cusafe_axpy_f32(float*, float, const float*, "
         "size_t) is a 32-bit integer, parameter 1 is float");
  TU_ERR(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(y), CUSAFE_ARG_F32V(2.0f),
                       CUSAFE_ARG_BUF(x), CUSAFE_ARG_F64V(64.0)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 3 of kernel cusafe_axpy_f32(float*, float, const float*, "
         "size_t) is a double, parameter 3 is size_t");
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_kernel_release(k));
  TU_OK(cusafe_buffer_release(x));
  TU_OK(cusafe_buffer_release(y));
  TU_OK(cusafe_module_release(m));
}
END_TEST

/* ---- kernels compiled with NVRTC ------------------------------------------
 */

static const char typed_source[] =
    "extern \"C\" __global__ void k(float *x, int n) {\n"
    "  if (threadIdx.x == 0 && x && n > 0) x[0] = 1.0f;\n"
    "}\n"
    "__global__ void scale(float *x, int n) {\n"
    "  if (threadIdx.x == 0 && x && n > 0) x[0] *= 2.0f;\n"
    "}\n"
    "__global__ void axpy(float *y, const float *x, const float *z, float a,\n"
    "                     unsigned long n) {\n"
    "  if (threadIdx.x == 0 && n > 0) y[0] = a * x[0] + z[0];\n"
    "}\n";

START_TEST(test_compiled_types) {
  cusafe_module m = CUSAFE_NULL_HANDLE;
  cusafe_buffer x = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_compile(&m, ctx, typed_source, "typed.cu", NULL, 0));
  TU_OK(cusafe_buffer_alloc(&x, ctx, CUSAFE_MEMORY_DEVICE, 64));
  cusafe_kernel k = tu_get_kernel(m, "k");
  cusafe_kernel scale = tu_get_kernel(m, "_Z5scalePfi");
  cusafe_kernel axpy = tu_get_kernel(m, "_Z4axpyPfPKfS1_fm");
  cusafe_launch_config c = config1();
  /* extern "C": its name says nothing, the sizes are checked */
  SIG_EQ(k, "k(?)");
  TU_ERR(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(x), CUSAFE_ARG_I64V(1)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 1 of kernel k is 8 bytes, parameter 1 is 4 bytes");
  TU_OK(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(x), CUSAFE_ARG_F32V(1.0f)));
  /* C++: the types are read from the mangled names */
  SIG_EQ(scale, "scale(float*, int)");
  SIG_EQ(axpy,
         "axpy(float*, const float*, const float*, float, unsigned long)");
  TU_ERR(CUSAFE_LAUNCH(scale, &c, CUSAFE_ARG_U64V(0), CUSAFE_ARG_I32V(1)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 0 of kernel scale(float*, int) is an unsigned 64-bit "
         "integer, parameter 0 is float*");
  TU_ERR(CUSAFE_LAUNCH(scale, &c, CUSAFE_ARG_BUF(x), CUSAFE_ARG_F32V(1.0f)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 1 of kernel scale(float*, int) is a float, parameter 1 is "
         "int");
  TU_ERR(CUSAFE_LAUNCH(scale, &c, CUSAFE_ARG_BUF(x), CUSAFE_ARG_I64V(1)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 1 of kernel scale(float*, int) is a 64-bit integer, "
         "parameter 1 is int");
  TU_OK(CUSAFE_LAUNCH(scale, &c, CUSAFE_ARG_BUF(x), CUSAFE_ARG_U32V(1)));
  TU_ERR(CUSAFE_LAUNCH(axpy, &c, CUSAFE_ARG_BUF(x), CUSAFE_ARG_BUF(x),
                       CUSAFE_ARG_BUF(x), CUSAFE_ARG_F32V(1.0f),
                       CUSAFE_ARG_BUF(x)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 4 of kernel axpy(float*, const float*, const float*, "
         "float, unsigned long) is a buffer, parameter 4 is unsigned long");
  TU_OK(CUSAFE_LAUNCH(axpy, &c, CUSAFE_ARG_BUF(x), CUSAFE_ARG_BUF(x),
                      CUSAFE_ARG_BUF(x), CUSAFE_ARG_F32V(1.0f),
                      CUSAFE_ARG_I64V(1)));
  /* A declaration gives the extern "C" kernel its types */
  TU_OK(cusafe_kernel_declare(k, "float *x, int n"));
  SIG_EQ(k, "k(float*, int)");
  TU_ERR(CUSAFE_LAUNCH(k, &c, CUSAFE_ARG_BUF(x), CUSAFE_ARG_F32V(1.0f)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 1 of kernel k(float*, int) is a float, parameter 1 is int");
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_kernel_release(k));
  TU_OK(cusafe_kernel_release(scale));
  TU_OK(cusafe_kernel_release(axpy));
  TU_OK(cusafe_buffer_release(x));
  TU_OK(cusafe_module_release(m));
}
END_TEST

/* ---- declarations ---------------------------------------------------------
 */

START_TEST(test_get_signature_args) {
  cusafe_module m = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_load_builtin(&m, ctx));
  cusafe_kernel k = tu_get_kernel(m, "cusafe_fill_f32");
  const char *full = "cusafe_fill_f32(float*, float, size_t)";
  char out[16];
  size_t len = 99;
  /* the length alone; then cut as snprintf() cuts */
  TU_OK(cusafe_kernel_get_signature(NULL, 0, &len, k));
  TU_ASSERT(len == strlen(full), "length %zu", len);
  memset(out, 'x', sizeof out);
  TU_OK(cusafe_kernel_get_signature(out, 1, &len, k));
  TU_ASSERT(out[0] == '\0' && out[1] == 'x' && len == strlen(full),
            "capacity 1: \"%s\" %zu", out, len);
  TU_OK(cusafe_kernel_get_signature(out, sizeof out, &len, k));
  TU_ASSERT(strcmp(out, "cusafe_fill_f32") == 0 && len == strlen(full),
            "capacity 16: \"%s\" %zu", out, len);
  TU_ERR(cusafe_kernel_get_signature(out, 4, NULL, k),
         CUSAFE_ERROR_INVALID_VALUE, "length is NULL");
  len = 99;
  TU_ERR(cusafe_kernel_get_signature(NULL, 4, &len, k),
         CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  TU_ASSERT(len == 0, "length %zu after a failure", len);
  TU_ERR(cusafe_kernel_get_signature(out, sizeof out, &len, CUSAFE_NULL_HANDLE),
         CUSAFE_ERROR_INVALID_HANDLE, "kernel is the NULL handle");
  TU_ERR(cusafe_kernel_declare(k, NULL), CUSAFE_ERROR_INVALID_VALUE,
         "signature is NULL");
  TU_ERR(cusafe_kernel_declare(CUSAFE_NULL_HANDLE, "int"),
         CUSAFE_ERROR_INVALID_HANDLE, "kernel is the NULL handle");
  TU_OK(cusafe_kernel_release(k));
  TU_OK(cusafe_module_release(m));
}
END_TEST

#ifdef CUSAFE_TEST_FAKE

/* kt: float *, int, double, float, size_t, struct Params (16 bytes),
 * Handle (8 bytes), bool. */
static const char typed_image[] = "FAKECUBIN\n"
                                  "kernel kt p 4 8 4 8 16 8 1\n"
                                  "kernel _Z5scalePfi p 4\n"
                                  "kernel _Z5wrongPfi p 8\n"
                                  "kernel _Z4someXi p\n";

static cusafe_module load_typed(void) {
  cusafe_module m = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_load_data(&m, ctx, typed_image, sizeof typed_image));
  return m;
}

#define KT_SIG                                                                 \
  "kt(float*, int, double, float, size_t, struct Params, Handle, bool)"

START_TEST(test_declared_refusals) {
  cusafe_module m = load_typed();
  cusafe_kernel k = tu_get_kernel(m, "kt");
  cusafe_buffer x = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_alloc(&x, ctx, CUSAFE_MEMORY_DEVICE, 64));
  unsigned char params[16] = {0}, twelve[12] = {0};
  cusafe_launch_config c = config1();
  TU_OK(cusafe_kernel_declare(
      k, "float *x, int n, double d, float f, size_t m, struct Params p, "
         "Handle h, bool b"));
  SIG_EQ(k, KT_SIG);
  cusafe_arg good[] = {CUSAFE_ARG_BUF(x),    CUSAFE_ARG_I32V(1),
                       CUSAFE_ARG_F64V(1.0), CUSAFE_ARG_F32V(1),
                       CUSAFE_ARG_I64V(1),   CUSAFE_ARG_STRUCT(&params),
                       CUSAFE_ARG_U64V(7),   CUSAFE_ARG_INT(CUSAFE_ARG_I8, 1)};
  cusafe_arg args[8];
  fake_log_clear();
  /* Each refusal: one argument replaced, nothing queued. */
  const struct {
    size_t i;
    cusafe_arg a;
    const char *is;
  } wrong[] = {
      {0, CUSAFE_ARG_I64V(0), "a 64-bit integer, parameter 0 is float*"},
      {0, CUSAFE_ARG_F64V(0.0), "a double, parameter 0 is float*"},
      {0,
       {CUSAFE_ARG_BYTES, 8, {.bytes = params}},
       "8 bytes, parameter 0 is float*"},
      {1, CUSAFE_ARG_F32V(1.0f), "a float, parameter 1 is int"},
      {1, CUSAFE_ARG_I64V(1), "a 64-bit integer, parameter 1 is int"},
      {1,
       {CUSAFE_ARG_BYTES, 4, {.bytes = params}},
       "4 bytes, parameter 1 is int"},
      {2, CUSAFE_ARG_F32V(1.0f), "a float, parameter 2 is double"},
      {2, CUSAFE_ARG_U64V(1),
       "an unsigned 64-bit integer, parameter 2 is "
       "double"},
      {3, CUSAFE_ARG_F64V(1.0), "a double, parameter 3 is float"},
      {3, CUSAFE_ARG_U32V(1),
       "an unsigned 32-bit integer, parameter 3 is "
       "float"},
      {4, CUSAFE_ARG_BUF(x), "a buffer, parameter 4 is size_t"},
      {4, CUSAFE_ARG_F64V(1.0), "a double, parameter 4 is size_t"},
      {5, CUSAFE_ARG_STRUCT(&twelve),
       "12 bytes, parameter 5 is struct Params (16 bytes)"},
      {6, CUSAFE_ARG_I32V(1),
       "a 32-bit integer, parameter 6 is Handle (8 "
       "bytes)"},
      {7, CUSAFE_ARG_I32V(1), "a 32-bit integer, parameter 7 is bool"},
  };
  for (size_t w = 0; w < sizeof wrong / sizeof wrong[0]; w++) {
    memcpy(args, good, sizeof args);
    args[wrong[w].i] = wrong[w].a;
    TU_ERR(cusafe_kernel_launch(k, &c, args, 8), CUSAFE_ERROR_INVALID_ARGUMENTS,
           "argument %zu of kernel %s is %s", wrong[w].i, KT_SIG, wrong[w].is);
  }
  TU_ASSERT(fake_log_find("cuLaunchKernel", 0) == -1,
            "a refused launch was queued");
  /* What the types take: either sign of the width, a struct's bytes and
   * the scalars of its size (a handle passed as U64). */
  TU_OK(cusafe_kernel_launch(k, &c, good, 8));
  memcpy(args, good, sizeof args);
  args[1] = CUSAFE_ARG_U32V(1);
  args[4] = CUSAFE_ARG_U64V(1);
  args[6] = (cusafe_arg){CUSAFE_ARG_BYTES, 8, {.bytes = params}};
  args[7] = CUSAFE_ARG_UINT(CUSAFE_ARG_U8, 1);
  TU_OK(cusafe_kernel_launch(k, &c, args, 8));
  args[6] = CUSAFE_ARG_F64V(1.0);
  TU_OK(cusafe_kernel_launch(k, &c, args, 8));
  TU_ASSERT(fake_log_count("cuLaunchKernel") == 3, "%zu launches queued",
            fake_log_count("cuLaunchKernel"));
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_kernel_release(k));
  TU_OK(cusafe_buffer_release(x));
  TU_OK(cusafe_module_release(m));
}
END_TEST

START_TEST(test_declare_refused) {
  cusafe_module m = load_typed();
  cusafe_kernel k = tu_get_kernel(m, "kt");
  cusafe_kernel s = tu_get_kernel(m, "_Z5scalePfi");
  TU_OK(cusafe_kernel_declare(k, "float*, int, double, float, size_t, "
                                 "struct Params, Handle, bool"));
  TU_ERR(cusafe_kernel_declare(k, "float**x y"), CUSAFE_ERROR_INVALID_VALUE,
         "cannot read the declaration \"float**x y\": parameter 0: "
         "unexpected \"y\"");
  TU_ERR(cusafe_kernel_declare(k, "float*, int, double"),
         CUSAFE_ERROR_INVALID_VALUE,
         "the declaration has 3 parameters, kernel kt has 8");
  TU_ERR(cusafe_kernel_declare(k, "float*, int, float, float, size_t, "
                                  "struct Params, Handle, bool"),
         CUSAFE_ERROR_INVALID_VALUE,
         "parameter 2 is declared float (4 bytes), the kernel's is 8 bytes");
  TU_ERR(cusafe_kernel_declare(k, "float*, double, double, float, size_t, "
                                  "struct Params, Handle, bool"),
         CUSAFE_ERROR_INVALID_VALUE,
         "parameter 1 is declared double (8 bytes), the kernel's is 4 bytes");
  TU_ERR(cusafe_kernel_declare(k, "float*, int, double, float, size_t, "
                                  "struct Params, Handle, int"),
         CUSAFE_ERROR_INVALID_VALUE,
         "parameter 7 is declared int (4 bytes), the kernel's is 1 byte");
  /* A declaration whose types pass 16384 bytes. */
  size_t n = 20000;
  char *huge = malloc(n + 64);
  ck_assert_ptr_nonnull(huge);
  memcpy(huge, "float*, int, double, float, size_t, ", 36);
  memset(huge + 36, 'P', n);
  strcpy(huge + 36 + n, ", Handle, bool");
  TU_ERR(cusafe_kernel_declare(k, huge), CUSAFE_ERROR_INVALID_VALUE,
         "the declaration is too long: its types take more than 16384 "
         "bytes");
  free(huge);
  /* the kernel keeps its types after every refusal */
  SIG_EQ(k, "kt(float*, int, double, float, size_t, struct Params, Handle, "
            "bool)");
  /* A declaration replaces the types of a mangled name (and keeps the
   * name it read). */
  SIG_EQ(s, "scale(float*, int)");
  TU_ERR(cusafe_kernel_declare(s, "float*"), CUSAFE_ERROR_INVALID_VALUE,
         "the declaration has 1 parameters, kernel scale has 2");
  TU_OK(cusafe_kernel_declare(s, "struct Handle h, unsigned n"));
  SIG_EQ(s, "scale(struct Handle, unsigned int)");
  cusafe_launch_config c = config1();
  fake_log_clear();
  TU_ERR(CUSAFE_LAUNCH(s, &c, CUSAFE_ARG_U64V(0), CUSAFE_ARG_F32V(1.0f)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 1 of kernel scale(struct Handle, unsigned int) is a float, "
         "parameter 1 is unsigned int");
  TU_OK(CUSAFE_LAUNCH(s, &c, CUSAFE_ARG_U64V(0), CUSAFE_ARG_I32V(1)));
  TU_ASSERT(fake_log_count("cuLaunchKernel") == 1, "%zu launches",
            fake_log_count("cuLaunchKernel"));
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_kernel_release(k));
  TU_OK(cusafe_kernel_release(s));
  TU_OK(cusafe_module_release(m));
}
END_TEST

/* A mangled name whose types do not fit what CUDA reports, or which is not
 * understood, leaves the kernel with its sizes: no error. */
START_TEST(test_mangled_misfits) {
  cusafe_module m = load_typed();
  cusafe_kernel wrong = tu_get_kernel(m, "_Z5wrongPfi");
  cusafe_kernel some = tu_get_kernel(m, "_Z4someXi");
  SIG_EQ(wrong, "_Z5wrongPfi(?)");
  SIG_EQ(some, "_Z4someXi(?)");
  cusafe_launch_config c = config1();
  TU_ERR(CUSAFE_LAUNCH(wrong, &c, CUSAFE_ARG_U64V(0), CUSAFE_ARG_I32V(1)),
         CUSAFE_ERROR_INVALID_ARGUMENTS,
         "argument 1 of kernel _Z5wrongPfi is 4 bytes, parameter 1 is 8 "
         "bytes");
  TU_OK(CUSAFE_LAUNCH(wrong, &c, CUSAFE_ARG_U64V(0), CUSAFE_ARG_F64V(1.0)));
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_kernel_release(wrong));
  TU_OK(cusafe_kernel_release(some));
  TU_OK(cusafe_module_release(m));
}
END_TEST

/* Declarations race launches and reads of the signature: every launch
 * with arguments that both declarations take succeeds, every launch that
 * neither takes is refused, every signature read is one of the two. */
struct race {
  cusafe_kernel k;
  cusafe_buffer x;
  _Atomic int stop;
  int failures;
};

static void *race_launcher(void *arg) {
  struct race *r = arg;
  cusafe_launch_config c = config1();
  char sig[96];
  size_t len;
  for (int i = 0; !atomic_load(&r->stop) && i < 20000; i++) {
    if (CUSAFE_LAUNCH(r->k, &c, CUSAFE_ARG_BUF(r->x), CUSAFE_ARG_F32V(1.0f),
                      CUSAFE_ARG_I64V(16)) != CUSAFE_SUCCESS ||
        CUSAFE_LAUNCH(r->k, &c, CUSAFE_ARG_I64V(0), CUSAFE_ARG_F32V(1.0f),
                      CUSAFE_ARG_I64V(16)) != CUSAFE_ERROR_INVALID_ARGUMENTS ||
        cusafe_kernel_get_signature(sig, sizeof sig, &len, r->k) !=
            CUSAFE_SUCCESS ||
        (strcmp(sig, "cusafe_fill_f32(float*, float, size_t)") != 0 &&
         strcmp(sig, "cusafe_fill_f32(const float*, float, unsigned long)") !=
             0))
      r->failures++;
  }
  return NULL;
}

START_TEST(test_declare_races_launches) {
  cusafe_module m = CUSAFE_NULL_HANDLE;
  struct race r = {.failures = 0};
  TU_OK(cusafe_module_load_builtin(&m, ctx));
  r.k = tu_get_kernel(m, "cusafe_fill_f32");
  TU_OK(cusafe_buffer_alloc(&r.x, ctx, CUSAFE_MEMORY_DEVICE, 64));
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    ck_assert_int_eq(pthread_create(&th[i], NULL, race_launcher, &r), 0);
  for (int i = 0; i < 2000; i++)
    TU_OK(cusafe_kernel_declare(r.k, i % 2 ? "float *x, float v, size_t n"
                                           : "const float*, float, unsigned "
                                             "long"));
  atomic_store(&r.stop, 1);
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  TU_ASSERT(r.failures == 0, "%d launches or reads went wrong", r.failures);
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_kernel_release(r.k));
  TU_OK(cusafe_buffer_release(r.x));
  TU_OK(cusafe_module_release(m));
}
END_TEST

#endif /* CUSAFE_TEST_FAKE */

static Suite *types_suite(void) {
  Suite *s = suite_create("types");
  TCase *tc = tcase_create("names");
  tcase_add_test(tc, test_demangle_nvcc_names);
  tcase_add_test(tc, test_demangle_refuses);
  tcase_add_test(tc, test_declare_reader);
  suite_add_tcase(s, tc);

  tc = tcase_create("kernels");
  tcase_add_checked_fixture(tc, ctx_setup, ctx_teardown);
  tcase_add_test(tc, test_builtin_types);
  tcase_add_test(tc, test_compiled_types);
  tcase_add_test(tc, test_get_signature_args);
#ifdef CUSAFE_TEST_FAKE
  tcase_add_test(tc, test_declared_refusals);
  tcase_add_test(tc, test_declare_refused);
  tcase_add_test(tc, test_mangled_misfits);
  tcase_add_test(tc, test_declare_races_launches);
#endif
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
#ifdef CUSAFE_TEST_FAKE
  return tu_run_suite(types_suite(), CK_FORK);
#else
  tu_require_gpu();
  return tu_run_suite(types_suite(), CK_NOFORK);
#endif
}
