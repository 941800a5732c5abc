/* check_kernels.c -- modules and kernels against the real CUDA runtime.
 *
 * The built-in kernels, checked bit for bit against the same arithmetic on
 * the host; modules loaded from files and memory (tests/data/vecscale.cu,
 * which nvcc compiled at build time into CS_TEST_DATA_DIR) and compiled at
 * run time with NVRTC; a buffer released while a kernel still uses it; and
 * the launch limits that only a real device reports.
 *
 * GPU only: without a driver or a device the program exits 77 (automake's
 * SKIP).  A process that initialised CUDA cannot use it in a forked child,
 * so all tests share one process (CK_NOFORK): each releases everything it
 * creates and none calls cusafe_shutdown().  The in-flight test is meant to
 * run under compute-sanitizer too:
 *   compute-sanitizer --tool memcheck tests/check_kernels
 * (CK_RUN_CASE=inflight selects it alone).  Only the public API is used. */
#include <check.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cusafe.h"
#include "testutil.h"

#ifndef CS_TEST_DATA_DIR
#error                                                                         \
    "CS_TEST_DATA_DIR (the directory of the compiled test modules) is not defined"
#endif

/* The directory of vecscale.fatbin and vecscale.ptx; the environment
 * variable CUSAFE_TEST_DATA_DIR overrides the build directory's. */
static const char *data_dir(void) {
  const char *d = getenv("CUSAFE_TEST_DATA_DIR");
  return d && *d ? d : CS_TEST_DATA_DIR;
}

static void data_path(char *buf, size_t n, const char *file) {
  int len = snprintf(buf, n, "%s/%s", data_dir(), file);
  TU_ASSERT(len > 0 && (size_t)len < n, "path of %s too long", file);
}

/* Fails unless `text` contains `part`. */
#define TU_CONTAINS(text, part)                                                \
  do {                                                                         \
    const char *tu_text_ = (text), *tu_part_ = (part);                         \
    TU_ASSERT(strstr(tu_text_, tu_part_) != NULL,                              \
              "%s is \"%s\", which does not contain \"%s\"", #text, tu_text_,  \
              tu_part_);                                                       \
  } while (0)

/* ------------------------------------------------------------------------ */
/* Fixture                                                                   */
/* ------------------------------------------------------------------------ */

/* A context on device 0 and the built-in module, for every test. */
static cusafe_context ctx;
static cusafe_module builtin;

static void kernels_setup(void) {
  ctx = CUSAFE_NULL_HANDLE;
  builtin = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&ctx, 0));
  TU_OK(cusafe_module_load_builtin(&builtin, ctx));
  TU_LIVE(builtin, CUSAFE_TYPE_MODULE);
}

/* No assertions here: in no-fork mode a failed assertion in a teardown
 * would jump back into the runner's test loop. */
static void kernels_teardown(void) {
  (void)cusafe_module_release(builtin);
  (void)cusafe_context_release(ctx);
  builtin = CUSAFE_NULL_HANDLE;
  ctx = CUSAFE_NULL_HANDLE;
}

static TCase *with_fixture(TCase *tc) {
  tcase_add_checked_fixture(tc, kernels_setup, kernels_teardown);
  return tc;
}

static cusafe_buffer device_buffer(size_t size) {
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, size));
  return b;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static cusafe_launch_config config_1d(uint32_t grid, uint32_t block,
                                      size_t shared, cusafe_stream stream) {
  cusafe_launch_config c = {{grid, 1, 1}, {block, 1, 1}, shared, stream};
  return c;
}

/* ------------------------------------------------------------------------ */
/* The built-in kernels                                                      */
/* ------------------------------------------------------------------------ */

enum op { OP_FILL, OP_SCALE, OP_AXPY, OP_VECADD };

struct builtin_kernel {
  const char *name;
  enum op op;
  size_t elem; /* 4: float, 8: double */
  size_t nparams;
  size_t sizes[4]; /* bytes of each parameter */
};

/* Pointers and size_t are 8 bytes, float 4, double 8. */
static const struct builtin_kernel builtins[] = {
    {"cusafe_fill_f32", OP_FILL, 4, 3, {8, 4, 8}},
    {"cusafe_fill_f64", OP_FILL, 8, 3, {8, 8, 8}},
    {"cusafe_scale_f32", OP_SCALE, 4, 3, {8, 4, 8}},
    {"cusafe_scale_f64", OP_SCALE, 8, 3, {8, 8, 8}},
    {"cusafe_axpy_f32", OP_AXPY, 4, 4, {8, 4, 8, 8}},
    {"cusafe_axpy_f64", OP_AXPY, 8, 4, {8, 8, 8, 8}},
    {"cusafe_vecadd_f32", OP_VECADD, 4, 4, {8, 8, 8, 8}},
    {"cusafe_vecadd_f64", OP_VECADD, 8, 4, {8, 8, 8, 8}},
};
#define NBUILTINS (sizeof builtins / sizeof builtins[0])

/* The buffers an operation uses: its output first (x of fill and scale, y
 * of axpy, c of vecadd), then its inputs (x of axpy; a and b of vecadd). */
static size_t op_buffers(enum op op) {
  return op == OP_VECADD ? 3 : op == OP_AXPY ? 2 : 1;
}

/* Sizes around the block sizes (255, 256, 257) and a large prime. */
static const size_t sizes[] = {1, 255, 256, 257, 1000003};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* The scalars: not exactly representable, so that any difference in
 * rounding shows. */
#define FILL_F32 3.14159265f
#define FILL_F64 3.14159265358979323846
#define ALPHA_F32 (-1.7f)
#define ALPHA_F64 (-1.7)

static uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

/* Element i of input `seed`: values in [-1024, 1024) with every bit of the
 * mantissa in use, so products and sums round. */
static double value_f64(uint32_t seed, size_t i) {
  uint32_t h1 = mix32((uint32_t)i * 2u + seed * 0x9e3779b9u);
  uint32_t h2 = mix32((uint32_t)(i >> 32) ^ h1 ^ 0x85ebca6bu);
  double u = ((double)(h1 >> 6) * 67108864.0 + (double)(h2 >> 5)) /
             9007199254740992.0; /* 53 random bits in [0, 1) */
  return u * 2048.0 - 1024.0;
}

static void init_elems(void *dst, size_t elem, size_t count, uint32_t seed) {
  for (size_t i = 0; i < count; i++) {
    double v = value_f64(seed, i);
    if (elem == 4)
      ((float *)dst)[i] = (float)v;
    else
      ((double *)dst)[i] = v;
  }
}

/* The host's arithmetic, each operation rounded on its own (volatile keeps
 * the compiler from fusing the multiply and the add). */
static float axpy_f32(float a, float x, float y) {
  volatile float p = a * x;
  return p + y;
}
static double axpy_f64(double a, double x, double y) {
  volatile double p = a * x;
  return p + y;
}

/* Computes the operation on the host: out[o0 + i] from in1[o1 + i] and
 * in2[o2 + i], i < n. */
static void host_op(enum op op, size_t elem, void *out, size_t o0,
                    const void *in1, size_t o1, const void *in2, size_t o2,
                    size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (elem == 4) {
      float *y = (float *)out + o0 + i;
      const float *x = in1 ? (const float *)in1 + o1 + i : NULL;
      const float *b = in2 ? (const float *)in2 + o2 + i : NULL;
      switch (op) {
      case OP_FILL: *y = FILL_F32; break;
      case OP_SCALE: *y = *y * ALPHA_F32; break;
      case OP_AXPY: *y = axpy_f32(ALPHA_F32, *x, *y); break;
      case OP_VECADD: *y = *x + *b; break;
      }
    } else {
      double *y = (double *)out + o0 + i;
      const double *x = in1 ? (const double *)in1 + o1 + i : NULL;
      const double *b = in2 ? (const double *)in2 + o2 + i : NULL;
      switch (op) {
      case OP_FILL: *y = FILL_F64; break;
      case OP_SCALE: *y = *y * ALPHA_F64; break;
      case OP_AXPY: *y = axpy_f64(ALPHA_F64, *x, *y); break;
      case OP_VECADD: *y = *x + *b; break;
      }
    }
  }
}

/* Compares `count` elements and names the first that differs, with its bit
 * pattern. */
static void check_elems(const void *got, const void *want, size_t elem,
                        size_t count, const char *what) {
  if (memcmp(got, want, elem * count) == 0)
    return;
  for (size_t i = 0; i < count; i++) {
    const unsigned char *g = (const unsigned char *)got + i * elem;
    const unsigned char *w = (const unsigned char *)want + i * elem;
    if (memcmp(g, w, elem) != 0) {
      uint64_t gb = 0, wb = 0;
      memcpy(&gb, g, elem);
      memcpy(&wb, w, elem);
      double gv = elem == 4 ? (double)*(const float *)(const void *)g
                            : *(const double *)(const void *)g;
      double wv = elem == 4 ? (double)*(const float *)(const void *)w
                            : *(const double *)(const void *)w;
      tu_fail(__FILE__, __LINE__,
              "%s: element %zu of %zu is %.17g (0x%llx), expected %.17g "
              "(0x%llx)",
              what, i, count, gv, (unsigned long long)gb, wv,
              (unsigned long long)wb);
    }
  }
}

/* Launches `args` on `k` and fails with the kernel's name on an error. */
static void launch_ok(cusafe_kernel k, const char *name,
                      const cusafe_launch_config *cfg, const cusafe_arg *args,
                      size_t nargs, const char *what) {
  cusafe_status st = cusafe_kernel_launch(k, cfg, args, nargs);
  if (st != CUSAFE_SUCCESS) {
    char msg[512];
    tu_copy_message(msg, sizeof msg);
    tu_fail(__FILE__, __LINE__,
            "%s (%s): launch of grid %ux%ux%u, block %ux%ux%u returned %s: %s",
            name, what, cfg->grid[0], cfg->grid[1], cfg->grid[2], cfg->block[0],
            cfg->block[1], cfg->block[2], cusafe_status_string(st), msg);
  }
}

/* Builds the arguments of built-in `b` from its buffers (output first). */
static size_t builtin_args(cusafe_arg *args, const struct builtin_kernel *b,
                           const cusafe_buffer *bufs, size_t n) {
  cusafe_arg scalar;
  if (b->op == OP_FILL)
    scalar =
        b->elem == 4 ? CUSAFE_ARG_F32V(FILL_F32) : CUSAFE_ARG_F64V(FILL_F64);
  else
    scalar =
        b->elem == 4 ? CUSAFE_ARG_F32V(ALPHA_F32) : CUSAFE_ARG_F64V(ALPHA_F64);
  switch (b->op) {
  case OP_FILL:
  case OP_SCALE:
    args[0] = CUSAFE_ARG_BUF(bufs[0]);
    args[1] = scalar;
    args[2] = CUSAFE_ARG_U64V(n);
    return 3;
  case OP_AXPY:
    args[0] = CUSAFE_ARG_BUF(bufs[0]);
    args[1] = scalar;
    args[2] = CUSAFE_ARG_BUF(bufs[1]);
    args[3] = CUSAFE_ARG_U64V(n);
    return 4;
  case OP_VECADD:
    args[0] = CUSAFE_ARG_BUF(bufs[0]);
    args[1] = CUSAFE_ARG_BUF(bufs[1]);
    args[2] = CUSAFE_ARG_BUF(bufs[2]);
    args[3] = CUSAFE_ARG_U64V(n);
    return 4;
  }
  return 0;
}

/* Runs built-in `b` on n elements with launch configuration `cfg` and
 * checks every byte of its buffers.  With `view` set, the kernel gets views
 * of larger buffers: the output at element 3 (float: byte 12) or 5 (double:
 * byte 40), the inputs one and two elements further, each with 7 elements
 * after it; the elements outside the views must stay as they were. */
static void run_builtin(cusafe_kernel k, const struct builtin_kernel *b,
                        size_t n, const cusafe_launch_config *cfg, int view,
                        const char *cfg_name) {
  const size_t nbuf = op_buffers(b->op);
  const size_t base = b->elem == 4 ? 3 : 5;
  size_t off[3], count[3];
  void *init[3] = {NULL, NULL, NULL}, *got = NULL, *want = NULL;
  cusafe_buffer parent[3] = {0, 0, 0}, arg[3] = {0, 0, 0};
  cusafe_arg args[4];
  char what[256];

  snprintf(what, sizeof what, "%s, n = %zu, %s config%s", b->name, n, cfg_name,
           view ? ", through views" : "");
  for (size_t j = 0; j < nbuf; j++) {
    off[j] = view ? base + j : 0;
    count[j] = off[j] + n + (view ? 7 : 0);
    init[j] = tu_xmalloc(count[j] * b->elem);
    init_elems(init[j], b->elem, count[j],
               (uint32_t)(j + 1) * 7919u + (uint32_t)n);
    parent[j] = device_buffer(count[j] * b->elem);
    TU_OK(cusafe_buffer_write(parent[j], 0, init[j], count[j] * b->elem));
    if (view)
      TU_OK(cusafe_buffer_view(&arg[j], parent[j], off[j] * b->elem,
                               n * b->elem));
    else
      arg[j] = parent[j];
  }

  size_t nargs = builtin_args(args, b, arg, n);
  launch_ok(k, b->name, cfg, args, nargs, what);

  /* The expected contents of every buffer, whole. */
  want = tu_xmalloc(count[0] * b->elem);
  memcpy(want, init[0], count[0] * b->elem);
  host_op(b->op, b->elem, want, off[0], nbuf > 1 ? init[1] : NULL,
          nbuf > 1 ? off[1] : 0, nbuf > 2 ? init[2] : NULL,
          nbuf > 2 ? off[2] : 0, n);
  for (size_t j = 0; j < nbuf; j++) {
    char part[320];
    got = tu_xmalloc(count[j] * b->elem);
    /* Synchronous: ordered after the launch (see cusafe.h, "Ordering"). */
    TU_OK(cusafe_buffer_read(parent[j], 0, got, count[j] * b->elem));
    snprintf(part, sizeof part, "%s: %s buffer", what,
             j == 0 ? "output" : "input");
    check_elems(got, j == 0 ? want : init[j], b->elem, count[j], part);
    free(got);
    got = NULL;
  }

  for (size_t j = 0; j < nbuf; j++) {
    if (view)
      TU_OK(cusafe_buffer_release(arg[j]));
    TU_OK(cusafe_buffer_release(parent[j]));
    free(init[j]);
  }
  free(want);
}

/* Every built-in kernel, every size, with the suggested configuration, a
 * tiny grid that has each thread loop (on a stream of its own), and a
 * three-dimensional grid and block; on whole buffers and through views. */
START_TEST(test_builtin_exact) {
  const struct builtin_kernel *b = &builtins[_i];
  cusafe_kernel k = tu_get_kernel(builtin, b->name);
  cusafe_stream s = CUSAFE_STREAM_DEFAULT;
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));

  for (size_t si = 0; si < NSIZES; si++) {
    size_t n = sizes[si];
    uint32_t block = 0, grid = 0;
    TU_OK(cusafe_kernel_suggest_config(&block, &grid, k, 0, n));
    TU_ASSERT(block >= 32 && block % 32 == 0 && block <= 1024,
              "%s: suggested block of %u threads", b->name, block);
    TU_ASSERT(grid >= 1 && (uint64_t)grid * block >= n,
              "%s: suggested grid of %u blocks of %u does not cover %zu",
              b->name, grid, block, n);
    cusafe_launch_config configs[3] = {
        config_1d(grid, block, 0, CUSAFE_STREAM_DEFAULT),
        config_1d(3, 64, 0, s),
        {{2, 3, 2}, {4, 8, 2}, 0, CUSAFE_STREAM_DEFAULT},
    };
    static const char *const names[3] = {"suggested", "tiny", "3-D"};
    for (int c = 0; c < 3; c++)
      for (int view = 0; view <= 1; view++)
        run_builtin(k, b, n, &configs[c], view, names[c]);
  }

  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_kernel_release(k));
}
END_TEST

/* n = 0 is a valid launch that touches nothing, also over empty buffers. */
START_TEST(test_builtin_zero_elements) {
  const struct builtin_kernel *b = &builtins[_i];
  cusafe_kernel k = tu_get_kernel(builtin, b->name);
  const size_t count = 64;
  unsigned char *init = tu_xmalloc(count * b->elem);
  unsigned char *got = tu_xmalloc(count * b->elem);
  cusafe_buffer bufs[3] = {0, 0, 0};
  cusafe_arg args[4];
  init_elems(init, b->elem, count, 99);
  for (size_t j = 0; j < op_buffers(b->op); j++) {
    bufs[j] = device_buffer(count * b->elem);
    TU_OK(cusafe_buffer_write(bufs[j], 0, init, count * b->elem));
  }
  cusafe_launch_config cfg = config_1d(1, 128, 0, CUSAFE_STREAM_DEFAULT);
  launch_ok(k, b->name, &cfg, args, builtin_args(args, b, bufs, 0), "n = 0");
  for (size_t j = 0; j < op_buffers(b->op); j++) {
    TU_OK(cusafe_buffer_read(bufs[j], 0, got, count * b->elem));
    check_elems(got, init, b->elem, count, b->name);
    TU_OK(cusafe_buffer_release(bufs[j]));
  }
  /* And over buffers of 0 bytes, with no memory behind them (NULL). */
  for (size_t j = 0; j < op_buffers(b->op); j++)
    TU_OK(cusafe_buffer_alloc(&bufs[j], ctx, CUSAFE_MEMORY_DEVICE, 0));
  launch_ok(k, b->name, &cfg, args, builtin_args(args, b, bufs, 0),
            "n = 0, empty buffers");
  TU_OK(cusafe_context_synchronize(ctx));
  for (size_t j = 0; j < op_buffers(b->op); j++)
    TU_OK(cusafe_buffer_release(bufs[j]));
  free(init);
  free(got);
  TU_OK(cusafe_kernel_release(k));
}
END_TEST

/* axpy with x and y the same memory (y = a * y + y), vecadd with c the same
 * as a and b (c = c + c): the kernels allow exact aliasing. */
START_TEST(test_builtin_in_place) {
  const size_t n = 100003;
  for (size_t e = 4; e <= 8; e += 4) {
    const char *axpy = e == 4 ? "cusafe_axpy_f32" : "cusafe_axpy_f64";
    const char *vecadd = e == 4 ? "cusafe_vecadd_f32" : "cusafe_vecadd_f64";
    cusafe_kernel ka = tu_get_kernel(builtin, axpy);
    cusafe_kernel kv = tu_get_kernel(builtin, vecadd);
    void *init = tu_xmalloc(n * e), *want = tu_xmalloc(n * e);
    void *got = tu_xmalloc(n * e);
    cusafe_buffer y = device_buffer(n * e);
    uint32_t block, grid;
    init_elems(init, e, n, 4242);
    TU_OK(cusafe_kernel_suggest_config(&block, &grid, ka, 0, n));
    cusafe_launch_config cfg = config_1d(grid, block, 0, CUSAFE_STREAM_DEFAULT);

    /* y = a * y + y, then c = c + c. */
    TU_OK(cusafe_buffer_write(y, 0, init, n * e));
    memcpy(want, init, n * e);
    if (e == 4) {
      TU_OK(CUSAFE_LAUNCH(ka, &cfg, CUSAFE_ARG_BUF(y),
                          CUSAFE_ARG_F32V(ALPHA_F32), CUSAFE_ARG_BUF(y),
                          CUSAFE_ARG_U64V(n)));
      for (size_t i = 0; i < n; i++) {
        float *w = (float *)want + i;
        *w = axpy_f32(ALPHA_F32, *w, *w);
        *w = *w + *w;
      }
    } else {
      TU_OK(CUSAFE_LAUNCH(ka, &cfg, CUSAFE_ARG_BUF(y),
                          CUSAFE_ARG_F64V(ALPHA_F64), CUSAFE_ARG_BUF(y),
                          CUSAFE_ARG_U64V(n)));
      for (size_t i = 0; i < n; i++) {
        double *w = (double *)want + i;
        *w = axpy_f64(ALPHA_F64, *w, *w);
        *w = *w + *w;
      }
    }
    TU_OK(CUSAFE_LAUNCH(kv, &cfg, CUSAFE_ARG_BUF(y), CUSAFE_ARG_BUF(y),
                        CUSAFE_ARG_BUF(y), CUSAFE_ARG_U64V(n)));
    TU_OK(cusafe_buffer_read(y, 0, got, n * e));
    check_elems(got, want, e, n, "in-place axpy, then vecadd");

    TU_OK(cusafe_buffer_release(y));
    TU_OK(cusafe_kernel_release(kv));
    TU_OK(cusafe_kernel_release(ka));
    free(init);
    free(want);
    free(got);
  }
}
END_TEST

/* The parameter layout of every built-in kernel. */
START_TEST(test_builtin_params) {
  for (size_t i = 0; i < NBUILTINS; i++) {
    const struct builtin_kernel *b = &builtins[i];
    cusafe_kernel k = tu_get_kernel(builtin, b->name);
    size_t count = 0, got[8];
    for (size_t j = 0; j < 8; j++)
      got[j] = 12345;

    TU_OK(cusafe_kernel_get_params(&count, NULL, 0, k));
    TU_ASSERT(count == b->nparams, "%s: %zu parameters, expected %zu", b->name,
              count, b->nparams);
    count = 0;
    TU_OK(cusafe_kernel_get_params(&count, got, 8, k));
    TU_ASSERT(count == b->nparams, "%s: %zu parameters, expected %zu", b->name,
              count, b->nparams);
    for (size_t j = 0; j < b->nparams; j++)
      TU_ASSERT(got[j] == b->sizes[j],
                "%s: parameter %zu is %zu bytes, expected %zu", b->name, j,
                got[j], b->sizes[j]);
    TU_ASSERT(got[b->nparams] == 12345,
              "%s: sizes[%zu] written beyond the parameters", b->name,
              b->nparams);

    /* A smaller capacity: only that many sizes are written. */
    for (size_t j = 0; j < 8; j++)
      got[j] = 12345;
    TU_OK(cusafe_kernel_get_params(&count, got, 1, k));
    TU_ASSERT(count == b->nparams && got[0] == b->sizes[0] && got[1] == 12345,
              "%s with capacity 1: count %zu, sizes %zu %zu", b->name, count,
              got[0], got[1]);
    TU_OK(cusafe_kernel_release(k));
  }
}
END_TEST

START_TEST(test_builtin_unknown_name) {
  cusafe_kernel k = CUSAFE_NULL_HANDLE;
  TU_STATUS(cusafe_module_get_kernel(&k, builtin, "cusafe_fill_f16"),
            CUSAFE_ERROR_NOT_FOUND);
  TU_CONTAINS(cusafe_last_error_message(), "cusafe_fill_f16");
  TU_ASSERT(k == CUSAFE_NULL_HANDLE, "kernel handle set on failure");
}
END_TEST

/* The kernel keeps its module alive: the module's handle goes stale when
 * the caller releases it, and the kernel still runs. */
START_TEST(test_kernel_keeps_module_alive) {
  cusafe_module m = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_load_builtin(&m, ctx));
  cusafe_kernel k = tu_get_kernel(m, "cusafe_fill_f32");
  TU_OK(cusafe_module_release(m));
  TU_STALE(m);

  const size_t n = 1000;
  float got[1000], want[1000];
  cusafe_buffer x = device_buffer(n * sizeof(float));
  cusafe_launch_config cfg = config_1d(4, 256, 0, CUSAFE_STREAM_DEFAULT);
  TU_OK(CUSAFE_LAUNCH(k, &cfg, CUSAFE_ARG_BUF(x), CUSAFE_ARG_F32V(-2.5f),
                      CUSAFE_ARG_U64V(n)));
  TU_OK(cusafe_buffer_read(x, 0, got, sizeof got));
  for (size_t i = 0; i < n; i++)
    want[i] = -2.5f;
  check_elems(got, want, 4, n, "fill through a kernel of a released module");
  TU_OK(cusafe_buffer_release(x));
  TU_OK(cusafe_kernel_release(k));
}
END_TEST

/* ------------------------------------------------------------------------ */
/* NVRTC                                                                     */
/* ------------------------------------------------------------------------ */

static const char factor_source[] =
    "extern \"C\" __global__ void times_factor(unsigned int *x,\n"
    "                                          unsigned long long n) {\n"
    "  unsigned long long i =\n"
    "      (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n)\n"
    "    x[i] *= FACTOR;\n"
    "}\n";

/* Compiles factor_source with -DFACTOR=<factor> and checks its result. */
static void check_factor(int factor) {
  char define[32];
  snprintf(define, sizeof define, "-DFACTOR=%d", factor);
  const char *const options[] = {define};
  cusafe_module m = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_compile(&m, ctx, factor_source, "factor.cu", options, 1));
  TU_LIVE(m, CUSAFE_TYPE_MODULE);
  cusafe_kernel k = tu_get_kernel(m, "times_factor");
  size_t count = 0, psizes[4] = {0};
  TU_OK(cusafe_kernel_get_params(&count, psizes, 4, k));
  TU_ASSERT(count == 2 && psizes[0] == 8 && psizes[1] == 8,
            "times_factor: %zu parameters (%zu, %zu bytes)", count, psizes[0],
            psizes[1]);

  const size_t n = 4099;
  uint32_t *init = tu_xmalloc(n * 4), *got = tu_xmalloc(n * 4);
  uint32_t *want = tu_xmalloc(n * 4);
  tu_pattern(init, n * 4, (uint32_t)factor);
  for (size_t i = 0; i < n; i++)
    want[i] = init[i] * (uint32_t)factor;
  cusafe_buffer x = device_buffer(n * 4);
  TU_OK(cusafe_buffer_write(x, 0, init, n * 4));
  uint32_t block, grid;
  TU_OK(cusafe_kernel_suggest_config(&block, &grid, k, 0, n));
  cusafe_launch_config cfg = config_1d(grid, block, 0, CUSAFE_STREAM_DEFAULT);
  TU_OK(CUSAFE_LAUNCH(k, &cfg, CUSAFE_ARG_BUF(x), CUSAFE_ARG_U64V(n)));
  TU_OK(cusafe_buffer_read(x, 0, got, n * 4));
  TU_BYTES_EQ(got, want, n * 4);

  TU_OK(cusafe_buffer_release(x));
  TU_OK(cusafe_kernel_release(k));
  TU_OK(cusafe_module_release(m));
  free(init);
  free(got);
  free(want);
}

/* Two compilations of one source with different options give different
 * kernels. */
START_TEST(test_compile_with_define) {
  check_factor(3);
  check_factor(-7);
}
END_TEST

/* The error is on line 3 of "broken.cu". */
static const char broken_source[] =
    "extern \"C\" __global__ void broken(int *x) {\n"
    "  x[0] = 1;\n"
    "  x[1] = undefined_thing;\n"
    "}\n";

START_TEST(test_compile_error_gives_log) {
  cusafe_module m = 12345;
  TU_STATUS(cusafe_module_compile(&m, ctx, broken_source, "broken.cu", NULL, 0),
            CUSAFE_ERROR_COMPILE);
  TU_ASSERT(m == CUSAFE_NULL_HANDLE, "module handle set on failure");
  char msg[2048], log[8192];
  snprintf(msg, sizeof msg, "%s", cusafe_last_error_message());
  snprintf(log, sizeof log, "%s", cusafe_last_compile_log());
  TU_CONTAINS(msg, "broken.cu");
  TU_CONTAINS(msg, "undefined_thing");
  /* NVRTC's diagnostic: 'broken.cu(3): error: identifier
   * "undefined_thing" is undefined'. */
  TU_CONTAINS(log, "broken.cu(3)");
  TU_CONTAINS(log, "error");
  TU_CONTAINS(log, "undefined_thing");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Modules from files and memory                                             */
/* ------------------------------------------------------------------------ */

/* Reads a whole file, with a NUL after it (for PTX). */
static unsigned char *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  TU_ASSERT(f != NULL, "cannot open %s (built by make check)", path);
  unsigned char *data = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      cap = cap ? cap * 2 : 65536;
      data = realloc(data, cap);
      TU_ASSERT(data != NULL, "out of host memory");
    }
    size_t r = fread(data + n, 1, cap - n - 1, f);
    n += r;
    if (r == 0)
      break;
  }
  fclose(f);
  TU_ASSERT(n > 0, "%s is empty", path);
  data[n] = 0;
  *size = n;
  return data;
}

/* Runs vecscale_u32 of module m on a buffer and checks it. */
static void check_vecscale(cusafe_module m, const char *what) {
  cusafe_kernel k = CUSAFE_NULL_HANDLE;
  cusafe_status st = cusafe_module_get_kernel(&k, m, "vecscale_u32");
  TU_ASSERT(st == CUSAFE_SUCCESS, "%s: get_kernel: %s: %s", what,
            cusafe_status_string(st), cusafe_last_error_message());
  size_t count = 0, psizes[4] = {0};
  TU_OK(cusafe_kernel_get_params(&count, psizes, 4, k));
  TU_ASSERT(count == 3 && psizes[0] == 8 && psizes[1] == 4 && psizes[2] == 8,
            "%s: vecscale_u32 has %zu parameters (%zu, %zu, %zu bytes)", what,
            count, psizes[0], psizes[1], psizes[2]);

  const size_t n = 70001;
  uint32_t *init = tu_xmalloc(n * 4), *got = tu_xmalloc(n * 4);
  uint32_t *want = tu_xmalloc(n * 4);
  tu_pattern(init, n * 4, 5);
  for (size_t i = 0; i < n; i++)
    want[i] = init[i] * 11u;
  cusafe_buffer x = device_buffer(n * 4);
  TU_OK(cusafe_buffer_write(x, 0, init, n * 4));
  cusafe_launch_config cfg = config_1d(7, 96, 0, CUSAFE_STREAM_DEFAULT);
  TU_OK(CUSAFE_LAUNCH(k, &cfg, CUSAFE_ARG_BUF(x), CUSAFE_ARG_U32V(11u),
                      CUSAFE_ARG_U64V(n)));
  TU_OK(cusafe_buffer_read(x, 0, got, n * 4));
  TU_BYTES_EQ(got, want, n * 4);
  TU_OK(cusafe_buffer_release(x));
  TU_OK(cusafe_kernel_release(k));
  free(init);
  free(got);
  free(want);
}

/* The fat binary and the PTX that nvcc built, loaded by path. */
START_TEST(test_load_file) {
  static const char *const files[] = {"vecscale.fatbin", "vecscale.ptx"};
  for (size_t i = 0; i < 2; i++) {
    char path[4096];
    data_path(path, sizeof path, files[i]);
    cusafe_module m = CUSAFE_NULL_HANDLE;
    cusafe_status st = cusafe_module_load_file(&m, ctx, path);
    TU_ASSERT(st == CUSAFE_SUCCESS, "loading %s: %s: %s", path,
              cusafe_status_string(st), cusafe_last_error_message());
    TU_LIVE(m, CUSAFE_TYPE_MODULE);
    check_vecscale(m, path);
    TU_OK(cusafe_module_release(m));
    TU_STALE(m);
  }
}
END_TEST

/* The same images from memory, freed right after loading. */
START_TEST(test_load_data) {
  static const char *const files[] = {"vecscale.fatbin", "vecscale.ptx"};
  for (size_t i = 0; i < 2; i++) {
    char path[4096];
    size_t size;
    data_path(path, sizeof path, files[i]);
    unsigned char *image = read_file(path, &size);
    int ptx = i == 1;
    cusafe_module m = CUSAFE_NULL_HANDLE;
    /* PTX: the size includes the NUL. */
    cusafe_status st =
        cusafe_module_load_data(&m, ctx, image, ptx ? size + 1 : size);
    TU_ASSERT(st == CUSAFE_SUCCESS, "loading %s from memory: %s: %s", path,
              cusafe_status_string(st), cusafe_last_error_message());
    memset(image, 0xee, size);
    free(image);
    check_vecscale(m, files[i]);
    TU_OK(cusafe_module_release(m));
  }
}
END_TEST

START_TEST(test_load_missing_file) {
  char path[4096];
  data_path(path, sizeof path, "no-such-module.cubin");
  cusafe_module m = 12345;
  TU_STATUS(cusafe_module_load_file(&m, ctx, path), CUSAFE_ERROR_INVALID_IMAGE);
  TU_CONTAINS(cusafe_last_error_message(), path);
  TU_ASSERT(m == CUSAFE_NULL_HANDLE, "module handle set on failure");
}
END_TEST

/* Bytes that are neither cubin, fatbin nor PTX; NUL-terminated, as PTX
 * must be, so that no loader reads beyond them. */
static unsigned char *junk(size_t n) {
  unsigned char *p = tu_xmalloc(n);
  tu_pattern(p, n, 31337);
  for (size_t i = 0; i < n; i++)
    if (p[i] == 0)
      p[i] = 0x5a;
  p[n - 1] = 0;
  return p;
}

START_TEST(test_load_corrupt_data) {
  const size_t n = 4096;
  unsigned char *bytes = junk(n);
  cusafe_module m = 12345;
  TU_STATUS(cusafe_module_load_data(&m, ctx, bytes, n),
            CUSAFE_ERROR_INVALID_IMAGE);
  TU_ASSERT(m == CUSAFE_NULL_HANDLE, "module handle set on failure");
  /* The context still works. */
  TU_OK(cusafe_context_synchronize(ctx));
  free(bytes);
}
END_TEST

START_TEST(test_load_corrupt_file) {
  const size_t n = 4096;
  char path[] = "/tmp/cusafe-corrupt-XXXXXX";
  int fd = mkstemp(path);
  TU_ASSERT(fd >= 0, "mkstemp failed");
  unsigned char *bytes = junk(n);
  ssize_t w = write(fd, bytes, n);
  close(fd);
  free(bytes);
  cusafe_module m = 12345;
  cusafe_status st = cusafe_module_load_file(&m, ctx, path);
  char msg[1024];
  tu_copy_message(msg, sizeof msg);
  unlink(path);
  TU_ASSERT(w == (ssize_t)n, "short write to %s", path);
  TU_ASSERT(st == CUSAFE_ERROR_INVALID_IMAGE,
            "loading junk from a file returned %s: %s",
            cusafe_status_string(st), msg);
  TU_CONTAINS(msg, path);
  TU_ASSERT(m == CUSAFE_NULL_HANDLE, "module handle set on failure");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* A buffer released while a kernel still uses it                            */
/* ------------------------------------------------------------------------ */

/* Spins for `ns` nanoseconds of the GPU's global timer, then writes
 * pattern ^ i to every element x[i], i < n. */
static const char spin_source[] =
    "extern \"C\" __global__ void spin_then_fill(unsigned int *x,\n"
    "                                            unsigned long long n,\n"
    "                                            unsigned int pattern,\n"
    "                                            unsigned long long ns) {\n"
    "  unsigned long long start, now;\n"
    "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(start));\n"
    "  do {\n"
    "    asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(now));\n"
    "  } while (now - start < ns);\n"
    "  unsigned long long stride = (unsigned long long)gridDim.x * "
    "blockDim.x;\n"
    "  for (unsigned long long i =\n"
    "           (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "       i < n; i += stride)\n"
    "    x[i] = pattern ^ (unsigned int)i;\n"
    "}\n";

#define SPIN_WORDS ((size_t)1 << 22) /* 16 MiB */
#define SPIN_PATTERN_B 0xb0b0b0b0u

static cusafe_module spin_module;
static cusafe_kernel spin_kernel;
static uint32_t spin_grid;

/* One block per multiprocessor, so that every block spins at once: the
 * kernel takes one spin, not one per wave of blocks. */
static void spin_setup(void) {
  kernels_setup();
  spin_module = spin_kernel = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_compile(&spin_module, ctx, spin_source, "spin.cu", NULL,
                              0));
  spin_kernel = tu_get_kernel(spin_module, "spin_then_fill");
  cusafe_device_properties p;
  TU_OK(cusafe_device_get_properties(&p, 0));
  spin_grid = (uint32_t)p.multiprocessor_count;
}

static void spin_teardown(void) {
  (void)cusafe_kernel_release(spin_kernel);
  (void)cusafe_module_release(spin_module);
  spin_kernel = spin_module = CUSAFE_NULL_HANDLE;
  kernels_teardown();
}

static void check_words(const uint32_t *got, size_t n, uint32_t pattern,
                        const char *what) {
  for (size_t i = 0; i < n; i++)
    if (got[i] != (pattern ^ (uint32_t)i))
      tu_fail(__FILE__, __LINE__,
              "%s: word %zu of %zu is 0x%08x, expected 0x%08x", what, i, n,
              got[i], pattern ^ (uint32_t)i);
}

/* The kernel does what the in-flight test relies on. */
START_TEST(test_spin_kernel_fills) {
  cusafe_buffer b = device_buffer(SPIN_WORDS * 4);
  uint32_t *got = tu_xmalloc(SPIN_WORDS * 4);
  cusafe_launch_config cfg =
      config_1d(spin_grid, 256, 0, CUSAFE_STREAM_DEFAULT);
  TU_OK(CUSAFE_LAUNCH(
      spin_kernel, &cfg, CUSAFE_ARG_BUF(b), CUSAFE_ARG_U64V(SPIN_WORDS),
      CUSAFE_ARG_U32V(SPIN_PATTERN_B), CUSAFE_ARG_U64V(1000000))); /* 1 ms */
  TU_OK(cusafe_buffer_read(b, 0, got, SPIN_WORDS * 4));
  check_words(got, SPIN_WORDS, SPIN_PATTERN_B, "spin_then_fill");
  TU_OK(cusafe_buffer_release(b));
  free(got);
}
END_TEST

/* Launches the ~200 ms kernel on B, releases B's last reference at once,
 * allocates C of the same size and writes C's own pattern.  Had B's memory
 * been freed (and handed to C) before the kernel ended, the kernel would
 * overwrite C.  Variants: 0: the launch on the default stream, C allocated
 * there too; 1: the launch on a stream of its own, C allocated on the
 * default stream; 2: the launch on a stream of its own, C allocated
 * stream-ordered on that stream. */
START_TEST(test_release_while_kernel_runs) {
  const size_t size = SPIN_WORDS * 4;
  cusafe_stream s = CUSAFE_STREAM_DEFAULT;
  if (_i > 0)
    TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  uint32_t *c_data = tu_xmalloc(size), *got = tu_xmalloc(size);
  for (size_t i = 0; i < SPIN_WORDS; i++)
    c_data[i] = 0xc0c0c0c0u ^ (uint32_t)i;

  cusafe_buffer b = device_buffer(size);
  TU_OK(cusafe_buffer_fill(b, 0, size, 0x11, s));
  cusafe_launch_config cfg = config_1d(spin_grid, 256, 0, s);
  double t0 = now_ms();
  TU_OK(CUSAFE_LAUNCH(spin_kernel, &cfg, CUSAFE_ARG_BUF(b),
                      CUSAFE_ARG_U64V(SPIN_WORDS),
                      CUSAFE_ARG_U32V(SPIN_PATTERN_B),
                      CUSAFE_ARG_U64V(200000000))); /* 200 ms */
  TU_OK(cusafe_buffer_release(b));
  TU_STALE(b);

  cusafe_buffer c = CUSAFE_NULL_HANDLE;
  if (_i == 2)
    TU_OK(cusafe_buffer_alloc_async(&c, s, size));
  else
    c = device_buffer(size);
  TU_OK(cusafe_buffer_write(c, 0, c_data, size));
  double t_write = now_ms() - t0;
  TU_OK(cusafe_context_synchronize(ctx));
  double t_sync = now_ms() - t0;
  printf("in-flight variant %d: C written after %.1f ms, device idle after "
         "%.1f ms\n",
         _i, t_write, t_sync);

  TU_OK(cusafe_buffer_read(c, 0, got, size));
  check_words(got, SPIN_WORDS, 0xc0c0c0c0u, "buffer C");
  TU_OK(cusafe_buffer_release(c));
  if (_i > 0)
    TU_OK(cusafe_stream_release(s));
  free(c_data);
  free(got);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Launch limits of a real device                                            */
/* ------------------------------------------------------------------------ */

START_TEST(test_block_too_large) {
  cusafe_kernel k = tu_get_kernel(builtin, "cusafe_fill_f32");
  cusafe_buffer x = device_buffer(4096 * 4);
  static const uint32_t blocks[][3] = {
      {2048, 1, 1}, {1024, 2, 1}, {32, 32, 2}, {1, 1, 128}};
  for (size_t i = 0; i < 4; i++) {
    cusafe_launch_config cfg = {{1, 1, 1},
                                {blocks[i][0], blocks[i][1], blocks[i][2]},
                                0,
                                CUSAFE_STREAM_DEFAULT};
    TU_STATUS(CUSAFE_LAUNCH(k, &cfg, CUSAFE_ARG_BUF(x), CUSAFE_ARG_F32V(1.0f),
                            CUSAFE_ARG_U64V(4096)),
              CUSAFE_ERROR_INVALID_CONFIGURATION);
  }
  /* The context is not broken: a valid launch still works. */
  cusafe_launch_config cfg = config_1d(4, 1024, 0, CUSAFE_STREAM_DEFAULT);
  TU_OK(CUSAFE_LAUNCH(k, &cfg, CUSAFE_ARG_BUF(x), CUSAFE_ARG_F32V(1.0f),
                      CUSAFE_ARG_U64V(4096)));
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_buffer_release(x));
  TU_OK(cusafe_kernel_release(k));
}
END_TEST

/* Fills all `words` words of dynamic shared memory, then writes them back
 * reversed: out[blockIdx.x * words + j] = s[words - 1 - j]. */
static const char shared_source[] =
    "extern \"C\" __global__ void shared_reverse(unsigned int *out,\n"
    "                                            unsigned long long words) "
    "{\n"
    "  extern __shared__ unsigned int s[];\n"
    "  for (unsigned long long j = threadIdx.x; j < words; j += blockDim.x)\n"
    "    s[j] = (unsigned int)(j * 2654435761u) ^ blockIdx.x;\n"
    "  __syncthreads();\n"
    "  for (unsigned long long j = threadIdx.x; j < words; j += blockDim.x)\n"
    "    out[blockIdx.x * words + j] = s[words - 1 - j];\n"
    "}\n";

static void check_shared_launch(cusafe_kernel k, size_t shared) {
  const size_t words = shared / 4;
  const uint32_t grid = 2;
  uint32_t *got = tu_xmalloc(grid * words * 4);
  cusafe_buffer out = device_buffer(grid * words * 4);
  cusafe_launch_config cfg =
      config_1d(grid, 256, shared, CUSAFE_STREAM_DEFAULT);
  cusafe_status st =
      CUSAFE_LAUNCH(k, &cfg, CUSAFE_ARG_BUF(out), CUSAFE_ARG_U64V(words));
  TU_ASSERT(st == CUSAFE_SUCCESS,
            "launch with %zu bytes of dynamic shared memory: %s: %s", shared,
            cusafe_status_string(st), cusafe_last_error_message());
  TU_OK(cusafe_buffer_read(out, 0, got, grid * words * 4));
  for (uint32_t b = 0; b < grid; b++)
    for (size_t j = 0; j < words; j++) {
      size_t src = words - 1 - j;
      uint32_t want = (uint32_t)(src * 2654435761u) ^ b;
      TU_ASSERT(got[b * words + j] == want,
                "shared %zu bytes: block %u word %zu is 0x%08x, expected "
                "0x%08x",
                shared, b, j, got[b * words + j], want);
    }
  TU_OK(cusafe_buffer_release(out));
  free(got);
}

START_TEST(test_dynamic_shared_memory) {
  cusafe_device_properties p;
  TU_OK(cusafe_device_get_properties(&p, 0));
  const size_t optin = p.shared_memory_per_block_optin;
  const size_t dflt = 48 * 1024;
  cusafe_module m = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_compile(&m, ctx, shared_source, "shared.cu", NULL, 0));
  cusafe_kernel k = tu_get_kernel(m, "shared_reverse");
  cusafe_buffer out = device_buffer(4096);
  uint32_t block, grid;

  /* Beyond the opt-in maximum: refused before CUDA sees it. */
  static const size_t beyond[] = {1, 4, 4096, (size_t)1 << 30};
  for (size_t i = 0; i < 4; i++) {
    cusafe_launch_config cfg =
        config_1d(1, 256, optin + beyond[i], CUSAFE_STREAM_DEFAULT);
    TU_STATUS(CUSAFE_LAUNCH(k, &cfg, CUSAFE_ARG_BUF(out), CUSAFE_ARG_U64V(16)),
              CUSAFE_ERROR_INVALID_CONFIGURATION);
  }
  TU_STATUS(cusafe_kernel_suggest_config(&block, &grid, k, optin + 4096, 1000),
            CUSAFE_ERROR_INVALID_CONFIGURATION);

  /* Within the default limit, above it (opted into by cusafe) and at the
   * opt-in maximum. */
  check_shared_launch(k, 16 * 1024);
  if (optin > dflt) {
    check_shared_launch(k, dflt + 1024 <= optin ? dflt + 1024 : optin);
    check_shared_launch(k, optin & ~(size_t)3);
    TU_OK(cusafe_kernel_suggest_config(&block, &grid, k, optin, 1000));
    TU_ASSERT(block >= 32 && grid >= 1, "suggested %u x %u with %zu bytes",
              grid, block, optin);
  } else {
    printf("dynamic shared memory: opt-in maximum %zu bytes is not above "
           "48 KiB: nothing to opt into\n",
           optin);
  }

  TU_OK(cusafe_buffer_release(out));
  TU_OK(cusafe_kernel_release(k));
  TU_OK(cusafe_module_release(m));
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Hopper launches: clusters, cooperative grids, programmatic dependent     */
/* launch (compute capability 9.0; skipped below it)                         */
/* ------------------------------------------------------------------------ */

#ifndef CS_CUDA_INCLUDE
#define CS_CUDA_INCLUDE "/usr/local/cuda/include"
#endif

/* Distributed shared memory: each block reads its cluster neighbour's
 * shared memory; a cooperative two-phase sum with grid.sync(); and a pair
 * of kernels of which the second waits for the first's trigger
 * (griddepcontrol: what cudaTriggerProgrammaticLaunchCompletion() and
 * cudaGridDependencySynchronize() compile to, which NVRTC does not
 * declare).  Without -rdc: grid.sync() needs none since CUDA 11. */
static const char hopper_source[] =
    "#include <cooperative_groups.h>\n"
    "namespace cg = cooperative_groups;\n"
    "extern \"C\" __global__ void cluster_exchange(int *out) {\n"
    "  __shared__ int mine;\n"
    "  cg::cluster_group cluster = cg::this_cluster();\n"
    "  unsigned rank = cluster.block_rank();\n"
    "  if (threadIdx.x == 0)\n"
    "    mine = (int)(blockIdx.x * 1000 + rank);\n"
    "  cluster.sync();\n"
    "  unsigned peer = (rank + 1) % cluster.num_blocks();\n"
    "  int *theirs = cluster.map_shared_rank(&mine, peer);\n"
    "  if (threadIdx.x == 0)\n"
    "    out[blockIdx.x] = *theirs;\n"
    "  cluster.sync();\n"
    "}\n"
    "extern \"C\" __global__ void coop_sum(const int *in, int *partial, int "
    "*out,\n"
    "                                    int n) {\n"
    "  cg::grid_group grid = cg::this_grid();\n"
    "  __shared__ int s;\n"
    "  if (threadIdx.x == 0)\n"
    "    s = 0;\n"
    "  __syncthreads();\n"
    "  int acc = 0;\n"
    "  for (unsigned long long i = grid.thread_rank(); i < (unsigned long "
    "long)n;\n"
    "       i += grid.size())\n"
    "    acc += in[i];\n"
    "  atomicAdd(&s, acc);\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x == 0)\n"
    "    partial[blockIdx.x] = s;\n"
    "  grid.sync();\n"
    "  if (threadIdx.x == 0) {\n"
    "    int t = 0;\n"
    "    for (unsigned b = 0; b < gridDim.x; b++)\n"
    "      t += partial[b];\n"
    "    out[blockIdx.x] = t;\n"
    "  }\n"
    "}\n"
    /* After its trigger, block 0 of the first kernel waits (up to 2^30
     * cycles) for the second kernel to start: it can only where the launch
     * was programmatic, and *overlap says whether it did. */
    "extern \"C\" __global__ void pdl_first(int *data, int n, int *started,\n"
    "                                     int *overlap) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n)\n"
    "    data[i] = i * 3 + 1;\n"
    "  asm volatile(\"griddepcontrol.launch_dependents;\" ::: \"memory\");\n"
    "  if (blockIdx.x == 0 && threadIdx.x == 0) {\n"
    "    long long t0 = clock64();\n"
    "    while (atomicAdd(started, 0) == 0 && clock64() - t0 < (1LL << 30))\n"
    "      ;\n"
    "    *overlap = atomicAdd(started, 0);\n"
    "  }\n"
    "}\n"
    "extern \"C\" __global__ void pdl_second(const int *data, int *out, int "
    "n,\n"
    "                                      int *started) {\n"
    "  if (blockIdx.x == 0 && threadIdx.x == 0)\n"
    "    atomicExch(started, 1);\n"
    "  asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n)\n"
    "    out[i] = data[i] + 5;\n"
    "}\n";

static cusafe_module hopper;

/* Whether device 0 can run the Hopper tests; compiles them if so. */
static bool hopper_ready(void) {
  cusafe_device_properties props;
  TU_OK(cusafe_device_get_properties(&props, 0));
  if (props.compute_capability_major < 9) {
    fprintf(stderr, "hopper: compute capability %d.%d, skipped\n",
            props.compute_capability_major, props.compute_capability_minor);
    return false;
  }
  if (!hopper) {
    const char *const options[] = {"-I" CS_CUDA_INCLUDE,
                                   "-I" CS_CUDA_INCLUDE "/cccl"};
    TU_OK(cusafe_module_compile(&hopper, ctx, hopper_source, "hopper.cu",
                                options, 2));
  }
  return true;
}

static void hopper_teardown(void) {
  (void)cusafe_module_release(hopper);
  hopper = CUSAFE_NULL_HANDLE;
  kernels_teardown();
}

static cusafe_launch_attr hopper_attr(uint32_t id, uint32_t x) {
  cusafe_launch_attr a;
  memset(&a, 0, sizeof a);
  a.id = id;
  if (id == CUSAFE_LAUNCH_ATTR_CLUSTER) {
    a.value.dim[0] = x;
    a.value.dim[1] = a.value.dim[2] = 1;
  } else {
    a.value.flag = (int32_t)x;
  }
  return a;
}

/* Clusters of 2 and 8 (loop index 0, 1) and of 16 (2, non-portable:
 * skipped where the kernel cannot run with it), element by element. */
START_TEST(test_cluster_shared_memory) {
  if (!hopper_ready())
    return;
  static const uint32_t sizes[] = {2, 8, 16};
  uint32_t c = sizes[_i];
  enum { GRID = 64 };
  cusafe_kernel k = tu_get_kernel(hopper, "cluster_exchange");
  cusafe_buffer out = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_alloc(&out, ctx, CUSAFE_MEMORY_DEVICE, GRID * 4));
  TU_OK(cusafe_buffer_fill(out, 0, GRID * 4, 0xFF, CUSAFE_STREAM_DEFAULT));
  cusafe_launch_attr a[2] = {
      hopper_attr(CUSAFE_LAUNCH_ATTR_CLUSTER, c),
      hopper_attr(CUSAFE_LAUNCH_ATTR_NON_PORTABLE_CLUSTER, c > 8)};
  cusafe_launch_config cfg = {
      {GRID, 1, 1}, {128, 1, 1}, 0, CUSAFE_STREAM_DEFAULT};
  const cusafe_arg args[] = {CUSAFE_ARG_BUF(out)};
  cusafe_status st = cusafe_kernel_launch_ex(k, &cfg, a, 2, args, 1);
  if (st == CUSAFE_ERROR_NOT_SUPPORTED) {
    /* A partition or virtual GPU without clusters. */
    fprintf(stderr, "hopper: skipped: %s\n", cusafe_last_error_message());
  } else if (c > 8 && st != CUSAFE_SUCCESS) {
    fprintf(stderr, "hopper: clusters of %u: %s\n", c,
            cusafe_last_error_message());
  } else {
    TU_OK(st);
    int got[GRID];
    TU_OK(cusafe_buffer_read(out, 0, got, sizeof got));
    for (int b = 0; b < GRID; b++) {
      int rank = b % (int)c, peer = (rank + 1) % (int)c;
      int want = (b - rank + peer) * 1000 + peer;
      ck_assert_msg(got[b] == want, "clusters of %u: block %d read %d, not %d",
                    c, b, got[b], want);
    }
  }
  TU_OK(cusafe_buffer_release(out));
  TU_OK(cusafe_kernel_release(k));
}
END_TEST

/* A cooperative two-phase sum over as many blocks as can be resident: every
 * block sees every block's partial sum after grid.sync(); one block more is
 * refused before CUDA sees it. */
START_TEST(test_cooperative_grid_sync) {
  if (!hopper_ready())
    return;
  enum { N = 1 << 20, THREADS = 256 };
  cusafe_device_properties props;
  TU_OK(cusafe_device_get_properties(&props, 0));
  cusafe_kernel k = tu_get_kernel(hopper, "coop_sum");
  cusafe_launch_attr a[1] = {hopper_attr(CUSAFE_LAUNCH_ATTR_COOPERATIVE, 1)};
  cusafe_buffer in = CUSAFE_NULL_HANDLE, partial = CUSAFE_NULL_HANDLE,
                out = CUSAFE_NULL_HANDLE;
  int *host = malloc(N * sizeof *host);
  ck_assert_ptr_nonnull(host);
  long long sum = 0;
  for (int i = 0; i < N; i++) {
    host[i] = (i % 7) - 3;
    sum += host[i];
  }
  uint32_t blocks = 2 * (uint32_t)props.multiprocessor_count;
  TU_OK(cusafe_buffer_alloc(&in, ctx, CUSAFE_MEMORY_DEVICE, N * 4));
  TU_OK(cusafe_buffer_alloc(&partial, ctx, CUSAFE_MEMORY_DEVICE, 65536 * 4));
  TU_OK(cusafe_buffer_alloc(&out, ctx, CUSAFE_MEMORY_DEVICE, 65536 * 4));
  TU_OK(cusafe_buffer_write(in, 0, host, N * 4));
  const cusafe_arg args[] = {CUSAFE_ARG_BUF(in), CUSAFE_ARG_BUF(partial),
                             CUSAFE_ARG_BUF(out), CUSAFE_ARG_I32V(N)};
  cusafe_launch_config cfg = {
      {blocks, 1, 1}, {THREADS, 1, 1}, 0, CUSAFE_STREAM_DEFAULT};
  cusafe_status st = cusafe_kernel_launch_ex(k, &cfg, a, 1, args, 4);
  if (st == CUSAFE_ERROR_NOT_SUPPORTED) {
    fprintf(stderr, "hopper: skipped: %s\n", cusafe_last_error_message());
    TU_OK(cusafe_buffer_release(in));
    TU_OK(cusafe_buffer_release(partial));
    TU_OK(cusafe_buffer_release(out));
    TU_OK(cusafe_kernel_release(k));
    free(host);
    return;
  }
  TU_OK(st);
  int got[512];
  ck_assert_uint_le(blocks, 512);
  TU_OK(cusafe_buffer_read(out, 0, got, blocks * 4));
  for (uint32_t b = 0; b < blocks; b++)
    ck_assert_msg(got[b] == (int)sum, "block %u: sum %d, not %lld", b, got[b],
                  sum);
  /* Far more blocks than can be resident: refused. */
  cfg.grid[0] = 64 * (uint32_t)props.multiprocessor_count;
  ck_assert_int_eq(cusafe_kernel_launch_ex(k, &cfg, a, 1, args, 4),
                   CUSAFE_ERROR_INVALID_CONFIGURATION);
  fprintf(stderr, "hopper: %s\n", cusafe_last_error_message());
  TU_OK(cusafe_context_synchronize(ctx));
  TU_OK(cusafe_buffer_release(in));
  TU_OK(cusafe_buffer_release(partial));
  TU_OK(cusafe_buffer_release(out));
  TU_OK(cusafe_kernel_release(k));
  free(host);
}
END_TEST

/* A programmatic dependent launch: the second kernel starts while the first
 * still runs (the first sees it start: without the attribute it would wait
 * for the first to end), waits for the first's trigger, and reads what it
 * wrote, element by element; also inside a capture, replayed. */
START_TEST(test_programmatic_dependent_launch) {
  if (!hopper_ready())
    return;
  enum { N = 1 << 16, THREADS = 256 };
  cusafe_kernel first = tu_get_kernel(hopper, "pdl_first");
  cusafe_kernel second = tu_get_kernel(hopper, "pdl_second");
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_buffer data = CUSAFE_NULL_HANDLE, out = CUSAFE_NULL_HANDLE;
  cusafe_buffer flags = CUSAFE_NULL_HANDLE; /* started, overlap */
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_buffer_alloc(&flags, ctx, CUSAFE_MEMORY_DEVICE, 8));
  cusafe_buffer started = CUSAFE_NULL_HANDLE, overlap = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_view(&started, flags, 0, 4));
  TU_OK(cusafe_buffer_view(&overlap, flags, 4, 4));
  TU_OK(cusafe_buffer_alloc(&data, ctx, CUSAFE_MEMORY_DEVICE, N * 4));
  TU_OK(cusafe_buffer_alloc(&out, ctx, CUSAFE_MEMORY_DEVICE, N * 4));
  int *got = malloc(N * sizeof *got);
  ck_assert_ptr_nonnull(got);
  cusafe_launch_config cfg = {{N / THREADS, 1, 1}, {THREADS, 1, 1}, 0, s};
  cusafe_launch_attr a[1] = {
      hopper_attr(CUSAFE_LAUNCH_ATTR_PROGRAMMATIC_SERIALIZATION, 1)};
  const cusafe_arg a1[] = {CUSAFE_ARG_BUF(data), CUSAFE_ARG_I32V(N),
                           CUSAFE_ARG_BUF(started), CUSAFE_ARG_BUF(overlap)};
  const cusafe_arg a2[] = {CUSAFE_ARG_BUF(data), CUSAFE_ARG_BUF(out),
                           CUSAFE_ARG_I32V(N), CUSAFE_ARG_BUF(started)};
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  for (int round = 0; round < 3; round++) {
    TU_OK(cusafe_buffer_fill(data, 0, N * 4, 0, s));
    TU_OK(cusafe_buffer_fill(out, 0, N * 4, 0, s));
    TU_OK(cusafe_buffer_fill(flags, 0, 8, 0, s));
    if (round == 0) {
      TU_OK(cusafe_kernel_launch(first, &cfg, a1, 4));
      TU_OK(cusafe_kernel_launch_ex(second, &cfg, a, 1, a2, 4));
    } else {
      if (round == 1) {
        TU_OK(cusafe_stream_begin_capture(s));
        TU_OK(cusafe_kernel_launch(first, &cfg, a1, 4));
        TU_OK(cusafe_kernel_launch_ex(second, &cfg, a, 1, a2, 4));
        TU_OK(cusafe_stream_end_capture(&g, s));
      }
      TU_OK(cusafe_graph_launch(g, s));
    }
    TU_OK(cusafe_stream_synchronize(s));
    TU_OK(cusafe_buffer_read(out, 0, got, N * 4));
    for (int i = 0; i < N; i++)
      ck_assert_msg(got[i] == i * 3 + 1 + 5, "round %d: out[%d] = %d", round, i,
                    got[i]);
    int32_t overlapped = 0;
    TU_OK(cusafe_buffer_read(overlap, 0, &overlapped, 4));
    fprintf(stderr, "hopper: programmatic launch, %s: the second kernel %s\n",
            round == 0 ? "on a stream" : "replayed",
            overlapped ? "started while the first ran"
                       : "waited for the first to end");
    /* On a stream the overlap is the attribute's whole effect. */
    if (round == 0)
      ck_assert_msg(overlapped == 1,
                    "the second kernel did not start before the first ended");
  }
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_buffer_release(started));
  TU_OK(cusafe_buffer_release(overlap));
  TU_OK(cusafe_buffer_release(flags));
  TU_OK(cusafe_buffer_release(data));
  TU_OK(cusafe_buffer_release(out));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_kernel_release(first));
  TU_OK(cusafe_kernel_release(second));
  free(got);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Suite                                                                     */
/* ------------------------------------------------------------------------ */

static Suite *kernels_suite(void) {
  Suite *s = suite_create("kernels");
  TCase *tc;

  tc = with_fixture(tcase_create("builtin"));
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, test_builtin_exact, 0, (int)NBUILTINS);
  tcase_add_loop_test(tc, test_builtin_zero_elements, 0, (int)NBUILTINS);
  tcase_add_test(tc, test_builtin_in_place);
  tcase_add_test(tc, test_builtin_params);
  tcase_add_test(tc, test_builtin_unknown_name);
  tcase_add_test(tc, test_kernel_keeps_module_alive);
  suite_add_tcase(s, tc);

  tc = with_fixture(tcase_create("nvrtc"));
  tcase_add_test(tc, test_compile_with_define);
  tcase_add_test(tc, test_compile_error_gives_log);
  suite_add_tcase(s, tc);

  tc = with_fixture(tcase_create("modules"));
  tcase_add_test(tc, test_load_file);
  tcase_add_test(tc, test_load_data);
  tcase_add_test(tc, test_load_missing_file);
  tcase_add_test(tc, test_load_corrupt_data);
  tcase_add_test(tc, test_load_corrupt_file);
  suite_add_tcase(s, tc);

  tc = tcase_create("inflight");
  tcase_add_checked_fixture(tc, spin_setup, spin_teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_spin_kernel_fills);
  tcase_add_loop_test(tc, test_release_while_kernel_runs, 0, 3);
  suite_add_tcase(s, tc);

  tc = tcase_create("hopper");
  tcase_add_checked_fixture(tc, kernels_setup, hopper_teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_cluster_shared_memory, 0, 3);
  tcase_add_test(tc, test_cooperative_grid_sync);
  tcase_add_test(tc, test_programmatic_dependent_launch);
  suite_add_tcase(s, tc);

  tc = with_fixture(tcase_create("limits"));
  tcase_add_test(tc, test_block_too_large);
  tcase_add_test(tc, test_dynamic_shared_memory);
  suite_add_tcase(s, tc);

  return s;
}

int main(void) {
  tu_require_gpu();
  /* CUDA is initialised now: a forked child could not use it. */
  return tu_run_suite(kernels_suite(), CK_NOFORK);
}
