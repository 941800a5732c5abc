/* bench.c -- what cusafe costs next to the plain CUDA runtime.
 *
 * Each row runs one cusafe operation and the raw CUDA runtime calls that do
 * the same work, in the same process, on the same device and memory,
 * interleaved sample by sample (so that clock drift and warm-up hit both
 * sides alike), and prints the median and the spread (min-max) of each side
 * and the ratio cusafe/raw of the medians.  Rows with a performance target
 * say whether it is met.
 *
 *   bench/bench [--quick] [--only=GROUP[,GROUP...]] [--samples=N]
 *               [--csv[=FILE]] [--device=N]
 *
 * Groups: launch, graph, alloc, objects, copy, refcount, shutdown.  Every
 * CUDA and
 * cusafe call is checked; a failure prints what failed and exits with 2.
 * Without a CUDA driver or device it prints one line and exits with 1. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nvrtc.h>

#include "cusafe.h"

extern char **environ;

#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define MAX_SAMPLES 401
#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

/* ---- options ------------------------------------------------------------- */

static struct {
  int quick;
  int samples;      /* 0: each group's default */
  const char *only; /* comma-separated groups, NULL: all */
  const char *csv;  /* NULL: none, "-": stdout, else a file */
  int device;
} opt;

static const char *const all_groups[] = {
    "launch", "graph", "alloc", "objects", "copy", "refcount", "shutdown"};
#define NGROUPS (sizeof all_groups / sizeof *all_groups)

static int group_selected(const char *group) {
  if (!opt.only)
    return 1;
  size_t n = strlen(group);
  for (const char *p = opt.only; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && !strncmp(p, group, n))
      return 1;
    if (!e)
      break;
    p = e + 1;
  }
  return 0;
}

/* The number of timed samples of a group: --samples, else the default
 * (fewer with --quick). */
static int samples_of(int normal, int quick) {
  int n = opt.samples ? opt.samples : opt.quick ? quick : normal;
  return n > MAX_SAMPLES ? MAX_SAMPLES : n;
}

/* ---- checks -------------------------------------------------------------- */

static void die(const char *fmt, ...)
    __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...) {
  va_list ap;
  fflush(stdout);
  fputs("bench: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit(2);
}

static void cs_failed(cusafe_status st, const char *what, int line)
    __attribute__((noreturn, cold));
static void cs_failed(cusafe_status st, const char *what, int line) {
  die("line %d: %s: %s: %s", line, what, cusafe_status_string(st),
      cusafe_last_error_message());
}

static void cuda_failed(cudaError_t err, const char *what, int line)
    __attribute__((noreturn, cold));
static void cuda_failed(cudaError_t err, const char *what, int line) {
  die("line %d: %s: %s (%s)", line, what, cudaGetErrorString(err),
      cudaGetErrorName(err));
}

/* Checked calls: cusafe and the CUDA runtime. */
#define CK(call)                                                               \
  do {                                                                         \
    cusafe_status ck_st_ = (call);                                             \
    if (UNLIKELY(ck_st_ != CUSAFE_SUCCESS))                                    \
      cs_failed(ck_st_, #call, __LINE__);                                      \
  } while (0)
#define CU(call)                                                               \
  do {                                                                         \
    cudaError_t cu_err_ = (call);                                              \
    if (UNLIKELY(cu_err_ != cudaSuccess))                                      \
      cuda_failed(cu_err_, #call, __LINE__);                                   \
  } while (0)
#define NV(call)                                                               \
  do {                                                                         \
    nvrtcResult nv_res_ = (call);                                              \
    if (UNLIKELY(nv_res_ != NVRTC_SUCCESS))                                    \
      die("line %d: %s: %s", __LINE__, #call, nvrtcGetErrorString(nv_res_));   \
  } while (0)

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p)
    die("out of host memory (%zu bytes)", n);
  return p;
}

/* ---- time and statistics ------------------------------------------------- */

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

struct stats {
  int n;
  double med, min, max, p25, p75;
};

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double quantile(const double *sorted, int n, double q) {
  double pos = q * (n - 1);
  int i = (int)pos;
  if (i >= n - 1)
    return sorted[n - 1];
  return sorted[i] + (pos - i) * (sorted[i + 1] - sorted[i]);
}

static struct stats stats_of(const double *v, int n) {
  double s[MAX_SAMPLES];
  struct stats st = {0};
  if (n <= 0)
    return st;
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  st.n = n;
  st.med = quantile(s, n, 0.5);
  st.p25 = quantile(s, n, 0.25);
  st.p75 = quantile(s, n, 0.75);
  st.min = s[0];
  st.max = s[n - 1];
  return st;
}

/* Nanoseconds to microseconds, in place. */
static void to_us(double *v, int n) {
  for (int i = 0; i < n; i++)
    v[i] /= 1e3;
}

/* One timed variant of a row: fn runs one sample and returns its value
 * (nanoseconds per operation). */
typedef double (*sample_fn)(void *arg);
struct variant {
  sample_fn fn;
  void *arg;
  double v[MAX_SAMPLES];
};

/* Runs `warmups` untimed samples of every variant, then `samples` timed
 * ones, interleaved and in alternating order. */
static void measure(struct variant *vs, int nv, int samples, int warmups) {
  for (int w = 0; w < warmups; w++)
    for (int i = 0; i < nv; i++)
      vs[i].fn(vs[i].arg);
  for (int s = 0; s < samples; s++)
    for (int j = 0; j < nv; j++) {
      int i = (s & 1) ? nv - 1 - j : j;
      vs[i].v[s] = vs[i].fn(vs[i].arg);
    }
}

/* ---- the table ----------------------------------------------------------- */

enum target { T_NONE, T_RATIO_MAX, T_RATIO_MIN, T_ABS_MAX };

struct row {
  char group[16];
  char name[64];
  char unit[8];
  char raw_name[64];
  struct stats cs, raw;
  double ratio; /* paired_ratio(); 0 without raw */
  enum target tk;
  double tv;
  int met; /* -1: no target */
};

static struct row *rows;
static size_t nrows, cap_rows;
static FILE *csv_file;

static void fmt_num(char *buf, size_t size, double v) {
  double a = v < 0 ? -v : v;
  const char *f = a >= 1000  ? "%.0f"
                  : a >= 100 ? "%.1f"
                  : a >= 10  ? "%.2f"
                             : "%.3f";
  snprintf(buf, size, f, v);
}

static void fmt_stats(char *buf, size_t size, const struct stats *s) {
  char m[32], lo[32], hi[32];
  if (!s->n) {
    snprintf(buf, size, "-");
    return;
  }
  fmt_num(m, sizeof m, s->med);
  fmt_num(lo, sizeof lo, s->min);
  fmt_num(hi, sizeof hi, s->max);
  snprintf(buf, size, "%s (%s-%s)", m, lo, hi);
}

#define ROW_FORMAT "  %-54s %-24s %-24s %7s  %s\n"

static void group_header(const char *group, const char *what) {
  printf("\n[%s] %s\n", group, what);
  printf(ROW_FORMAT, "operation", "cusafe median (min-max)",
         "raw median (min-max)", "c/raw", "target");
  fflush(stdout);
}

/* Adds and prints a row.  cs and raw hold values in the row's unit (raw
 * may be NULL); the ratio is cusafe/raw of the medians, for bandwidths
 * too. */
/* The median of the ratios cs[i] / raw[i] of samples taken in turn: the
 * host's speed drifts and switches between states within seconds, and a
 * sample's ratio to the one taken next to it cancels that, where a ratio
 * of the two medians can fall on either side of a switch (the A/A rows
 * show the resolution of each). */
static double paired_ratio(const double *cs, const double *raw, int n) {
  double r[MAX_SAMPLES];
  int m = 0;
  for (int i = 0; i < n; i++)
    if (raw[i] > 0)
      r[m++] = cs[i] / raw[i];
  return m ? stats_of(r, m).med : 0;
}

static void report(const char *group, const char *name, const char *unit,
                   const double *cs, const double *raw, int n,
                   const char *raw_name, enum target tk, double tv) {
  if (nrows == cap_rows) {
    cap_rows = cap_rows ? 2 * cap_rows : 64;
    rows = realloc(rows, cap_rows * sizeof *rows);
    if (!rows)
      die("out of host memory");
  }
  struct row *r = &rows[nrows++];
  memset(r, 0, sizeof *r);
  snprintf(r->group, sizeof r->group, "%s", group);
  snprintf(r->name, sizeof r->name, "%s", name);
  snprintf(r->unit, sizeof r->unit, "%s", unit);
  snprintf(r->raw_name, sizeof r->raw_name, "%s", raw_name ? raw_name : "");
  r->cs = stats_of(cs, n);
  if (raw) {
    r->raw = stats_of(raw, n);
    r->ratio = paired_ratio(cs, raw, n);
  }
  r->tk = tk;
  r->tv = tv;
  r->met = -1;
  char target[40] = "";
  switch (tk) {
  case T_NONE: break;
  case T_RATIO_MAX:
    r->met = r->ratio <= tv;
    snprintf(target, sizeof target, "<=%.2fx %s", tv,
             r->met ? "met" : "NOT met");
    break;
  case T_RATIO_MIN:
    r->met = r->ratio >= tv;
    snprintf(target, sizeof target, ">=%.2fx %s", tv,
             r->met ? "met" : "NOT met");
    break;
  case T_ABS_MAX:
    r->met = r->cs.med <= tv;
    snprintf(target, sizeof target, "<=%g %s %s", tv, unit,
             r->met ? "met" : "NOT met");
    break;
  }
  char label[96], a[112], b[112], ratio[16] = "-";
  snprintf(label, sizeof label, "%s [%s]", name, unit);
  fmt_stats(a, sizeof a, &r->cs);
  fmt_stats(b, sizeof b, &r->raw);
  if (raw && r->ratio > 0)
    snprintf(ratio, sizeof ratio, "%.3f", r->ratio);
  printf(ROW_FORMAT, label, a, b, ratio, target);
  fflush(stdout);
}

static void write_csv(FILE *f) {
  fprintf(f, "group,operation,unit,cusafe_median,cusafe_min,cusafe_p25,"
             "cusafe_p75,cusafe_max,raw,raw_median,raw_min,raw_p25,raw_p75,"
             "raw_max,ratio,target,met,samples\n");
  for (size_t i = 0; i < nrows; i++) {
    const struct row *r = &rows[i];
    char target[32] = "";
    if (r->tk == T_RATIO_MAX)
      snprintf(target, sizeof target, "ratio<=%g", r->tv);
    else if (r->tk == T_RATIO_MIN)
      snprintf(target, sizeof target, "ratio>=%g", r->tv);
    else if (r->tk == T_ABS_MAX)
      snprintf(target, sizeof target, "cusafe<=%g", r->tv);
    fprintf(f, "%s,\"%s\",%s,%.6g,%.6g,%.6g,%.6g,%.6g,\"%s\",", r->group,
            r->name, r->unit, r->cs.med, r->cs.min, r->cs.p25, r->cs.p75,
            r->cs.max, r->raw_name);
    if (r->raw.n)
      fprintf(f, "%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,", r->raw.med, r->raw.min,
              r->raw.p25, r->raw.p75, r->raw.max, r->ratio);
    else
      fprintf(f, ",,,,,,");
    fprintf(f, "%s,%s,%d\n", target,
            r->met < 0 ? ""
            : r->met   ? "met"
                       : "NOT met",
            r->cs.n);
  }
}

/* ---- shared state -------------------------------------------------------- */

static cusafe_context ctx;
static struct cudaDeviceProp prop;
static char *cubin;
static size_t cubin_size;

/* The kernels of the launch group, compiled once with NVRTC; cusafe and the
 * raw runtime load the same cubin. */
static const char kernel_source[] =
    "extern \"C\" __global__ void empty0() {}\n"
    "extern \"C\" __global__ void empty4(int a0, int a1, int a2, int a3) {}\n"
    "extern \"C\" __global__ void empty4p(float *p0, float *p1, int a0,\n"
    "                                     int a1) {}\n"
    "extern \"C\" __global__ void empty16(int a0, int a1, int a2, int a3,\n"
    "    int a4, int a5, int a6, int a7, long long b0, long long b1,\n"
    "    long long b2, long long b3, float f0, float f1, float f2,\n"
    "    float f3) {}\n"
    "extern \"C\" __global__ void empty16p(float *p0, float *p1, float *p2,\n"
    "    float *p3, int a0, int a1, int a2, int a3, int a4, int a5, int a6,\n"
    "    int a7, long long b0, long long b1, float f0, float f1) {}\n"
    "extern \"C\" __global__ void probe(long long *out, int a, long long b,\n"
    "                                   float c, double d) {\n"
    "  if (threadIdx.x == 0 && blockIdx.x == 0) {\n"
    "    out[0] = a; out[1] = b; out[2] = (long long)c;\n"
    "    out[3] = (long long)d;\n"
    "  }\n"
    "}\n";

static void compile_kernels(void) {
  nvrtcProgram prog;
  char arch[32];
  snprintf(arch, sizeof arch, "-arch=sm_%d%d", prop.major, prop.minor);
  const char *options[] = {arch};
  NV(nvrtcCreateProgram(&prog, kernel_source, "bench.cu", 0, NULL, NULL));
  nvrtcResult res = nvrtcCompileProgram(prog, 1, options);
  if (res != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    char *log = xmalloc(n + 1);
    log[0] = 0;
    nvrtcGetProgramLog(prog, log);
    die("NVRTC (%s) failed: %s\n%s", arch, nvrtcGetErrorString(res), log);
  }
  NV(nvrtcGetCUBINSize(prog, &cubin_size));
  cubin = xmalloc(cubin_size);
  NV(nvrtcGetCUBIN(prog, cubin));
  NV(nvrtcDestroyProgram(&prog));
}

/* A pseudo-random 64-bit stream (xorshift*), for data that is never zero
 * everywhere. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1Dull;
}

static void fill_random(void *p, size_t n) {
  unsigned char *c = p;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t r = rnd();
    memcpy(c + i, &r, 8);
  }
  for (; i < n; i++)
    c[i] = (unsigned char)rnd();
}

/* ---- launch -------------------------------------------------------------- */

#define LAUNCH_BATCH 256 /* launches between two synchronisations */

struct launch_case {
  int batches;
  int use_cusafe;
  int use_driver; /* raw: cuLaunchKernel(Ex) instead of the runtime's */
  /* cusafe */
  cusafe_kernel kernel;
  cusafe_launch_config config;
  const cusafe_arg *args;
  size_t nargs;
  cusafe_stream sync_stream; /* CUSAFE_NULL_HANDLE: the context's */
  /* raw */
  cudaKernel_t raw_kernel;
  void **raw_args;
  cudaStream_t raw_stream;
  /* Attributed launches (nattrs > 0): cusafe_kernel_launch_ex against
   * cudaLaunchKernelExC of the same attributes, on grid_x blocks. */
  const cusafe_launch_attr *attrs;
  cudaLaunchAttribute *raw_attrs;
  unsigned nattrs;
  unsigned grid_x;
};

/* The driver's launch calls, which cusafe makes where the driver has them:
 * rows against them too show what cusafe itself costs. */
static CUresult (*cu_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, unsigned, CUstream, void **,
                             void **);
static CUresult (*cu_launch_ex)(const CUlaunchConfig *, CUfunction, void **,
                                void **);

static void driver_entry(const char *symbol, void **fn) {
  enum cudaDriverEntryPointQueryResult found;
  CU(cudaGetDriverEntryPointByVersion(symbol, fn, 12000, cudaEnableDefault,
                                      &found));
  if (found != cudaDriverEntryPointSuccess || !*fn)
    die("the driver lacks %s", symbol);
}

static void launch_sync(const struct launch_case *c) {
  if (c->use_cusafe) {
    if (c->sync_stream)
      CK(cusafe_stream_synchronize(c->sync_stream));
    else
      CK(cusafe_context_synchronize(ctx));
  } else {
    CU(cudaStreamSynchronize(c->raw_stream));
  }
}

/* launch_sample() of an attributed launch. */
static double launch_ex_sample(const struct launch_case *c) {
  uint64_t total = 0;
  cudaLaunchConfig_t raw = {{c->grid_x, 1, 1}, {32, 1, 1},   0,
                            c->raw_stream,     c->raw_attrs, c->nattrs};
  CUlaunchConfig drv = {c->grid_x,
                        1,
                        1,
                        32,
                        1,
                        1,
                        0,
                        (CUstream)c->raw_stream,
                        (CUlaunchAttribute *)c->raw_attrs,
                        c->nattrs};
  for (int b = 0; b < c->batches; b++) {
    uint64_t t0 = now_ns();
    if (c->use_driver) {
      for (int i = 0; i < LAUNCH_BATCH; i++) {
        CUresult res =
            cu_launch_ex(&drv, (CUfunction)c->raw_kernel, c->raw_args, NULL);
        if (UNLIKELY(res != CUDA_SUCCESS))
          die("cuLaunchKernelEx failed: %d (line %d)", (int)res, __LINE__);
      }
    } else if (c->use_cusafe) {
      for (int i = 0; i < LAUNCH_BATCH; i++) {
        cusafe_status st = cusafe_kernel_launch_ex(
            c->kernel, &c->config, c->attrs, c->nattrs, c->args, c->nargs);
        if (UNLIKELY(st != CUSAFE_SUCCESS))
          cs_failed(st, "cusafe_kernel_launch_ex", __LINE__);
      }
    } else {
      for (int i = 0; i < LAUNCH_BATCH; i++) {
        cudaError_t err =
            cudaLaunchKernelExC(&raw, (const void *)c->raw_kernel, c->raw_args);
        if (UNLIKELY(err != cudaSuccess))
          cuda_failed(err, "cudaLaunchKernelExC", __LINE__);
      }
    }
    total += now_ns() - t0;
    launch_sync(c);
  }
  return (double)total / ((double)c->batches * LAUNCH_BATCH);
}

/* Host-side cost of one launch: batches of LAUNCH_BATCH launches are timed
 * and the stream is drained between them, outside the timed region, so that
 * the launch queue never fills. */
static double launch_sample(void *arg) {
  const struct launch_case *c = arg;
  uint64_t total = 0;
  const dim3 grid = {1, 1, 1}, block = {32, 1, 1};
  if (c->nattrs)
    return launch_ex_sample(c);
  for (int b = 0; b < c->batches; b++) {
    uint64_t t0 = now_ns();
    if (c->use_driver) {
      for (int i = 0; i < LAUNCH_BATCH; i++) {
        CUresult res = cu_launch((CUfunction)c->raw_kernel, 1, 1, 1, 32, 1, 1,
                                 0, (CUstream)c->raw_stream, c->raw_args, NULL);
        if (UNLIKELY(res != CUDA_SUCCESS))
          die("cuLaunchKernel failed: %d (line %d)", (int)res, __LINE__);
      }
    } else if (c->use_cusafe) {
      for (int i = 0; i < LAUNCH_BATCH; i++) {
        cusafe_status st =
            cusafe_kernel_launch(c->kernel, &c->config, c->args, c->nargs);
        if (UNLIKELY(st != CUSAFE_SUCCESS))
          cs_failed(st, "cusafe_kernel_launch", __LINE__);
      }
    } else {
      for (int i = 0; i < LAUNCH_BATCH; i++) {
        cudaError_t err =
            cudaLaunchKernel((const void *)c->raw_kernel, grid, block,
                             c->raw_args, 0, c->raw_stream);
        if (UNLIKELY(err != cudaSuccess))
          cuda_failed(err, "cudaLaunchKernel", __LINE__);
      }
    }
    total += now_ns() - t0;
    launch_sync(c);
  }
  return (double)total / ((double)c->batches * LAUNCH_BATCH);
}

/* Launches `probe` through the three paths and checks that every argument
 * arrived: the benchmark's launches pass arguments the same way. */
static void launch_check(cusafe_module module, cudaLibrary_t library,
                         cudaStream_t stream) {
  int a = (int)(rnd() % 100000) + 1;
  long long b = (long long)(rnd() % 1000000000u) + 7;
  float c = (float)(rnd() % 1000) + 3;
  double d = (double)(rnd() % 100000) - 50000.0;
  long long want[4] = {a, b, (long long)c, (long long)d}, got[4];

  cusafe_kernel k;
  cusafe_buffer out;
  CK(cusafe_module_get_kernel(&k, module, "probe"));
  CK(cusafe_buffer_alloc(&out, ctx, CUSAFE_MEMORY_DEVICE, sizeof got));
  CK(cusafe_buffer_fill(out, 0, sizeof got, 0xA5, CUSAFE_STREAM_DEFAULT));
  cusafe_launch_config config = {
      {1, 1, 1}, {32, 1, 1}, 0, CUSAFE_STREAM_DEFAULT};
  CK(CUSAFE_LAUNCH(k, &config, CUSAFE_ARG_BUF(out), CUSAFE_ARG_I32V(a),
                   CUSAFE_ARG_I64V(b), CUSAFE_ARG_F32V(c), CUSAFE_ARG_F64V(d)));
  memset(got, 0x5A, sizeof got);
  CK(cusafe_buffer_read(out, 0, got, sizeof got));
  if (memcmp(got, want, sizeof got))
    die("check: cusafe launch of probe passed wrong arguments: got "
        "%lld %lld %lld %lld, want %lld %lld %lld %lld",
        got[0], got[1], got[2], got[3], want[0], want[1], want[2], want[3]);
  CK(cusafe_buffer_release(out));
  CK(cusafe_kernel_release(k));

  cudaKernel_t rk;
  long long *dout;
  CU(cudaLibraryGetKernel(&rk, library, "probe"));
  CU(cudaMalloc((void **)&dout, sizeof got));
  CU(cudaMemsetAsync(dout, 0xA5, sizeof got, stream));
  void *args[] = {&dout, &a, &b, &c, &d};
  CU(cudaLaunchKernel((const void *)rk, (dim3){1, 1, 1}, (dim3){32, 1, 1}, args,
                      0, stream));
  memset(got, 0x5A, sizeof got);
  CU(cudaMemcpyAsync(got, dout, sizeof got, cudaMemcpyDeviceToHost, stream));
  CU(cudaStreamSynchronize(stream));
  if (memcmp(got, want, sizeof got))
    die("check: raw launch of probe passed wrong arguments");
  /* And through the driver's call, which the rows "vs cuLaunchKernel"
   * time. */
  CU(cudaMemsetAsync(dout, 0xA5, sizeof got, stream));
  CUresult res = cu_launch((CUfunction)rk, 1, 1, 1, 32, 1, 1, 0,
                           (CUstream)stream, args, NULL);
  if (res != CUDA_SUCCESS)
    die("check: cuLaunchKernel of probe failed: %d", (int)res);
  memset(got, 0x5A, sizeof got);
  CU(cudaMemcpyAsync(got, dout, sizeof got, cudaMemcpyDeviceToHost, stream));
  CU(cudaStreamSynchronize(stream));
  if (memcmp(got, want, sizeof got))
    die("check: driver launch of probe passed wrong arguments");
  CU(cudaFree(dout));
}

static void group_launch(void) {
  /* Many short samples, alternating between the paths: the host's speed
   * drifts by a few percent within seconds, and a launch costs a few
   * microseconds, so long samples would compare different moments.  On a
   * busy host the A/A row spread over 0.979-1.007 in six runs of 101
   * samples, and over 0.996-1.005 in thirteen of 401 (a second per path). */
  int samples = samples_of(401, 21);
  int batches = opt.quick ? 1 : 2;
  char what[200];
  snprintf(what, sizeof what,
           "host-side cost per launch (%d launches per sample, drained every "
           "%d); raw: cudaLaunchKernel of the same cubin, and on the rows "
           "\"vs cuLaunchKernel\" the driver's call, which cusafe makes",
           batches * LAUNCH_BATCH, LAUNCH_BATCH);
  group_header("launch", what);
  driver_entry("cuLaunchKernel", (void **)&cu_launch);
  driver_entry("cuLaunchKernelEx", (void **)&cu_launch_ex);

  cusafe_module module;
  CK(cusafe_module_load_data(&module, ctx, cubin, cubin_size));
  cudaLibrary_t library;
  CU(cudaLibraryLoadData(&library, cubin, NULL, NULL, 0, NULL, NULL, 0));
  cudaStream_t stream;
  CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cusafe_stream cs_stream;
  CK(cusafe_stream_create(&cs_stream, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));

  launch_check(module, library, stream);

  /* Buffers for the pointer arguments: cusafe's, and raw ones of the same
   * size. */
  cusafe_buffer bufs[4];
  float *raw_ptrs[4];
  for (int i = 0; i < 4; i++) {
    CK(cusafe_buffer_alloc(&bufs[i], ctx, CUSAFE_MEMORY_DEVICE, 256));
    CU(cudaMalloc((void **)&raw_ptrs[i], 256));
  }
  CK(cusafe_context_synchronize(ctx));

  int ai[8];
  long long bi[4];
  float fi[4];
  for (int i = 0; i < 8; i++)
    ai[i] = i + 1;
  for (int i = 0; i < 4; i++) {
    bi[i] = 1000 + i;
    fi[i] = 0.5f + (float)i;
  }

  /* cusafe's arguments and the raw argument pointers of each kernel. */
  cusafe_arg a4[4], a4p[4], a16[16], a16p[16];
  void *r4[4], *r4p[4], *r16[16], *r16p[16];
  for (int i = 0; i < 4; i++) {
    a4[i] = CUSAFE_ARG_I32V(ai[i]);
    r4[i] = &ai[i];
  }
  a4p[0] = CUSAFE_ARG_BUF(bufs[0]);
  a4p[1] = CUSAFE_ARG_BUF(bufs[1]);
  a4p[2] = CUSAFE_ARG_I32V(ai[0]);
  a4p[3] = CUSAFE_ARG_I32V(ai[1]);
  r4p[0] = &raw_ptrs[0];
  r4p[1] = &raw_ptrs[1];
  r4p[2] = &ai[0];
  r4p[3] = &ai[1];
  for (int i = 0; i < 8; i++) {
    a16[i] = CUSAFE_ARG_I32V(ai[i]);
    r16[i] = &ai[i];
  }
  for (int i = 0; i < 4; i++) {
    a16[8 + i] = CUSAFE_ARG_I64V(bi[i]);
    r16[8 + i] = &bi[i];
    a16[12 + i] = CUSAFE_ARG_F32V(fi[i]);
    r16[12 + i] = &fi[i];
  }
  for (int i = 0; i < 4; i++) {
    a16p[i] = CUSAFE_ARG_BUF(bufs[i]);
    r16p[i] = &raw_ptrs[i];
  }
  for (int i = 0; i < 8; i++) {
    a16p[4 + i] = CUSAFE_ARG_I32V(ai[i]);
    r16p[4 + i] = &ai[i];
  }
  for (int i = 0; i < 2; i++) {
    a16p[12 + i] = CUSAFE_ARG_I64V(bi[i]);
    r16p[12 + i] = &bi[i];
    a16p[14 + i] = CUSAFE_ARG_F32V(fi[i]);
    r16p[14 + i] = &fi[i];
  }

  static const struct {
    const char *kernel, *label, *driver_label;
    int nargs;
  } cases[] = {
      {"empty0", "empty kernel, 0 args", "vs cuLaunchKernel: 0 args", 0},
      {"empty4", "empty kernel, 4 args: 4 scalars",
       "vs cuLaunchKernel: 4 scalars", 4},
      {"empty4p", "empty kernel, 4 args: 2 buffers + 2 scalars",
       "vs cuLaunchKernel: 2 buffers + 2 scalars", 4},
      {"empty16", "empty kernel, 16 args: 16 scalars",
       "vs cuLaunchKernel: 16 scalars", 16},
      {"empty16p", "empty kernel, 16 args: 4 buffers + 12 scalars",
       "vs cuLaunchKernel: 4 buffers + 12 scalars", 16},
  };
  const cusafe_arg *cs_args[] = {NULL, a4, a4p, a16, a16p};
  void **raw_args[] = {NULL, r4, r4p, r16, r16p};

  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    cusafe_kernel k;
    cudaKernel_t rk;
    CK(cusafe_module_get_kernel(&k, module, cases[i].kernel));
    CU(cudaLibraryGetKernel(&rk, library, cases[i].kernel));
    struct launch_case cs = {
        .batches = batches,
        .use_cusafe = 1,
        .kernel = k,
        .config = {{1, 1, 1}, {32, 1, 1}, 0, CUSAFE_STREAM_DEFAULT},
        .args = cs_args[i],
        .nargs = (size_t)cases[i].nargs};
    struct launch_case raw = {.batches = batches,
                              .raw_kernel = rk,
                              .raw_args = raw_args[i],
                              .raw_stream = stream};
    struct launch_case drv = raw;
    drv.use_driver = 1;
    if (i == 0) {
      /* The same launch on a stream of the caller's: one more handle to
       * look up per launch.  And the raw launch timed twice as if it were
       * two implementations: the ratio of that A/A row is the resolution
       * of the others. */
      struct launch_case on_stream = cs;
      on_stream.config.stream = cs_stream;
      on_stream.sync_stream = cs_stream;
      struct launch_case raw2 = raw;
      struct variant v[5] = {{launch_sample, &cs, {0}},
                             {launch_sample, &on_stream, {0}},
                             {launch_sample, &raw, {0}},
                             {launch_sample, &raw2, {0}},
                             {launch_sample, &drv, {0}}};
      measure(v, 5, samples, 10);
      for (int j = 0; j < 5; j++)
        to_us(v[j].v, samples);
      report("launch", cases[i].label, "us", v[0].v, v[2].v, samples,
             "cudaLaunchKernel", T_RATIO_MAX, 1.03);
      report("launch", "empty kernel, 0 args, on a cusafe stream", "us", v[1].v,
             v[2].v, samples, "cudaLaunchKernel", T_RATIO_MAX, 1.03);
      report("launch", "(A/A: raw launch vs itself, 0 args)", "us", v[3].v,
             v[2].v, samples, "cudaLaunchKernel", T_NONE, 0);
      report("launch", "(cuLaunchKernel vs cudaLaunchKernel, 0 args)", "us",
             v[4].v, v[2].v, samples, "cudaLaunchKernel", T_NONE, 0);
      report("launch", cases[i].driver_label, "us", v[0].v, v[4].v, samples,
             "cuLaunchKernel", T_RATIO_MAX, 1.08);
    } else {
      struct variant v[3] = {{launch_sample, &cs, {0}},
                             {launch_sample, &raw, {0}},
                             {launch_sample, &drv, {0}}};
      measure(v, 3, samples, 10);
      for (int j = 0; j < 3; j++)
        to_us(v[j].v, samples);
      report("launch", cases[i].label, "us", v[0].v, v[1].v, samples,
             "cudaLaunchKernel", T_RATIO_MAX, 1.03);
      report("launch", cases[i].driver_label, "us", v[0].v, v[2].v, samples,
             "cuLaunchKernel", T_RATIO_MAX, 1.08);
    }
    CK(cusafe_kernel_release(k));
  }
  /* Hopper's launches: a cluster of 2 (on 2 blocks) and a cooperative
   * grid, each against cudaLaunchKernelExC of the same attributes; the
   * 4-scalar kernel, as its row above. */
  if (prop.major >= 9) {
    cusafe_kernel k;
    cudaKernel_t rk;
    CK(cusafe_module_get_kernel(&k, module, "empty4"));
    CU(cudaLibraryGetKernel(&rk, library, "empty4"));
    cusafe_launch_attr cs_attr[2];
    cudaLaunchAttribute raw_attr[2];
    memset(cs_attr, 0, sizeof cs_attr);
    memset(raw_attr, 0, sizeof raw_attr);
    cs_attr[0].id = CUSAFE_LAUNCH_ATTR_CLUSTER;
    cs_attr[0].value.dim[0] = 2;
    cs_attr[0].value.dim[1] = cs_attr[0].value.dim[2] = 1;
    raw_attr[0].id = cudaLaunchAttributeClusterDimension;
    raw_attr[0].val.clusterDim.x = 2;
    raw_attr[0].val.clusterDim.y = raw_attr[0].val.clusterDim.z = 1;
    cs_attr[1].id = CUSAFE_LAUNCH_ATTR_COOPERATIVE;
    cs_attr[1].value.flag = 1;
    raw_attr[1].id = cudaLaunchAttributeCooperative;
    raw_attr[1].val.cooperative = 1;
    static const char *const labels[] = {
        "empty kernel, 4 scalars, cluster of 2 (launch_ex)",
        "empty kernel, 4 scalars, cooperative (launch_ex)"};
    static const char *const driver_labels[] = {
        "vs cuLaunchKernelEx: cluster of 2",
        "vs cuLaunchKernelEx: cooperative"};
    for (int j = 0; j < 2; j++) {
      unsigned grid_x = j == 0 ? 2 : 1;
      struct launch_case cs = {
          .batches = batches,
          .use_cusafe = 1,
          .kernel = k,
          .config = {{grid_x, 1, 1}, {32, 1, 1}, 0, CUSAFE_STREAM_DEFAULT},
          .args = a4,
          .nargs = 4,
          .attrs = &cs_attr[j],
          .nattrs = 1,
          .grid_x = grid_x};
      struct launch_case raw = {.batches = batches,
                                .raw_kernel = rk,
                                .raw_args = r4,
                                .raw_stream = stream,
                                .raw_attrs = &raw_attr[j],
                                .nattrs = 1,
                                .grid_x = grid_x};
      struct launch_case drv = raw;
      drv.use_driver = 1;
      struct variant v[3] = {{launch_sample, &cs, {0}},
                             {launch_sample, &raw, {0}},
                             {launch_sample, &drv, {0}}};
      measure(v, 3, samples, 10);
      for (int k = 0; k < 3; k++)
        to_us(v[k].v, samples);
      report("launch", labels[j], "us", v[0].v, v[1].v, samples,
             "cudaLaunchKernelExC", T_RATIO_MAX, 1.03);
      report("launch", driver_labels[j], "us", v[0].v, v[2].v, samples,
             "cuLaunchKernelEx", T_RATIO_MAX, 1.08);
    }
    CK(cusafe_kernel_release(k));
  }

  for (int i = 0; i < 4; i++) {
    CK(cusafe_buffer_release(bufs[i]));
    CU(cudaFree(raw_ptrs[i]));
  }
  CK(cusafe_stream_release(cs_stream));
  CK(cusafe_module_release(module));
  CK(cusafe_context_synchronize(ctx));
  CU(cudaStreamDestroy(stream));
  CU(cudaLibraryUnload(library));
}

/* ---- graph --------------------------------------------------------------- */

#define GRAPH_KERNELS 100 /* launches in the kernel graph */
#define GRAPH_COPIES 10   /* copies in the copy graph */
#define GRAPH_BATCH 32    /* replays between two synchronisations */

struct graph_case {
  int batches;
  cusafe_graph graph; /* cusafe's, or NULL: raw */
  cusafe_stream stream;
  cudaGraphExec_t exec;
  cudaStream_t raw_stream;
  /* 100 separate launches instead (kernel != NULL) */
  cusafe_kernel kernel;
  const cusafe_arg *args;
};

/* Host-side cost of one replay (or of GRAPH_KERNELS separate launches). */
static double graph_sample(void *arg) {
  const struct graph_case *c = arg;
  uint64_t total = 0;
  cusafe_launch_config config = {{1, 1, 1}, {32, 1, 1}, 0, c->stream};
  for (int b = 0; b < c->batches; b++) {
    uint64_t t0 = now_ns();
    for (int i = 0; i < GRAPH_BATCH; i++) {
      if (c->kernel) {
        for (int k = 0; k < GRAPH_KERNELS; k++) {
          cusafe_status st =
              cusafe_kernel_launch(c->kernel, &config, c->args, 4);
          if (UNLIKELY(st != CUSAFE_SUCCESS))
            cs_failed(st, "cusafe_kernel_launch", __LINE__);
        }
      } else if (c->graph) {
        cusafe_status st = cusafe_graph_launch(c->graph, c->stream);
        if (UNLIKELY(st != CUSAFE_SUCCESS))
          cs_failed(st, "cusafe_graph_launch", __LINE__);
      } else {
        cudaError_t err = cudaGraphLaunch(c->exec, c->raw_stream);
        if (UNLIKELY(err != cudaSuccess))
          cuda_failed(err, "cudaGraphLaunch", __LINE__);
      }
    }
    total += now_ns() - t0;
    if (c->graph || c->kernel)
      CK(cusafe_stream_synchronize(c->stream));
    else
      CU(cudaStreamSynchronize(c->raw_stream));
  }
  return (double)total / ((double)c->batches * GRAPH_BATCH);
}

/* The same work captured through cusafe and by hand with the raw runtime:
 * 100 launches of an empty kernel of 2 buffers and 2 scalars, and 10
 * copies of 64 KiB between two buffers. */
static void group_graph(void) {
  /* Many short samples, as in the launch group, for the same reason: a
   * replay costs a couple of microseconds, and the host's speed drifts. */
  int samples = samples_of(401, 21);
  int batches = opt.quick ? 1 : 2;
  char what[200];
  snprintf(what, sizeof what,
           "host-side cost per replay (%d replays per sample, drained every "
           "%d); raw: cudaGraphLaunch of the same work captured by hand",
           batches * GRAPH_BATCH, GRAPH_BATCH);
  group_header("graph", what);

  cusafe_module module;
  CK(cusafe_module_load_data(&module, ctx, cubin, cubin_size));
  cudaLibrary_t library;
  CU(cudaLibraryLoadData(&library, cubin, NULL, NULL, 0, NULL, NULL, 0));
  cusafe_kernel k;
  cudaKernel_t rk;
  CK(cusafe_module_get_kernel(&k, module, "empty4p"));
  CU(cudaLibraryGetKernel(&rk, library, "empty4p"));
  cusafe_stream s;
  CK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  cudaStream_t rs;
  CU(cudaStreamCreateWithFlags(&rs, cudaStreamNonBlocking));
  cusafe_buffer bufs[2];
  void *raw[2];
  for (int i = 0; i < 2; i++) {
    CK(cusafe_buffer_alloc(&bufs[i], ctx, CUSAFE_MEMORY_DEVICE, 64 * KiB));
    CU(cudaMalloc(&raw[i], 64 * KiB));
  }
  CK(cusafe_context_synchronize(ctx));
  int a0 = 1, a1 = 2;
  cusafe_arg args[4] = {CUSAFE_ARG_BUF(bufs[0]), CUSAFE_ARG_BUF(bufs[1]),
                        CUSAFE_ARG_I32V(a0), CUSAFE_ARG_I32V(a1)};
  void *rargs[4] = {&raw[0], &raw[1], &a0, &a1};
  const dim3 grid = {1, 1, 1}, block = {32, 1, 1};
  cusafe_launch_config config = {{1, 1, 1}, {32, 1, 1}, 0, s};

  cusafe_graph g[2];
  cudaGraph_t rg[2];
  cudaGraphExec_t rx[2];
  for (int which = 0; which < 2; which++) {
    CK(cusafe_stream_begin_capture(s));
    CU(cudaStreamBeginCapture(rs, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < (which ? GRAPH_COPIES : GRAPH_KERNELS); i++) {
      if (which) {
        CK(cusafe_buffer_copy(bufs[i % 2], 0, bufs[1 - i % 2], 0, 64 * KiB, s));
        CU(cudaMemcpyAsync(raw[i % 2], raw[1 - i % 2], 64 * KiB,
                           cudaMemcpyDeviceToDevice, rs));
      } else {
        CK(cusafe_kernel_launch(k, &config, args, 4));
        CU(cudaLaunchKernel((const void *)rk, grid, block, rargs, 0, rs));
      }
    }
    CK(cusafe_stream_end_capture(&g[which], s));
    CU(cudaStreamEndCapture(rs, &rg[which]));
    CK(cusafe_graph_instantiate(g[which]));
    CU(cudaGraphInstantiate(&rx[which], rg[which], 0));
  }

  /* The raw replays go to the CUDA stream of the cusafe replays: which
   * stream a graph is launched on moves its host cost by a few percent
   * (the hardware queue it maps to), as where memory lies moves the
   * bandwidth of copies. */
  void *handle;
  CK(cusafe_stream_interop_handle(&handle, s));
  cudaStream_t cs_rs = (cudaStream_t)handle;
  static const char *const labels[] = {
      "graph of 100 empty-kernel launches, one replay",
      "graph of 10 copies of 64 KiB, one replay"};
  for (int which = 0; which < 2; which++) {
    struct graph_case cs = {.batches = batches, .graph = g[which], .stream = s};
    struct graph_case rw = {
        .batches = batches, .exec = rx[which], .raw_stream = cs_rs};
    /* The raw replay timed twice, as in the launch group: the ratio of
     * that A/A row is the resolution of the other. */
    struct graph_case rw2 = rw;
    struct variant v[3] = {{graph_sample, &cs, {0}},
                           {graph_sample, &rw, {0}},
                           {graph_sample, &rw2, {0}}};
    int nv = which == 0 ? 3 : 2;
    measure(v, nv, samples, 10);
    for (int j = 0; j < nv; j++)
      to_us(v[j].v, samples);
    report("graph", labels[which], "us", v[0].v, v[1].v, samples,
           "cudaGraphLaunch", T_RATIO_MAX, 1.03);
    if (which == 0) {
      report("graph", "(A/A: raw replay vs itself, 100 kernels)", "us", v[2].v,
             v[1].v, samples, "cudaGraphLaunch", T_NONE, 0);
      /* Per kernel: one replay of the graph against 100 launches. */
      struct graph_case each = {
          .batches = 1, .stream = s, .kernel = k, .args = args};
      struct variant w[2] = {{graph_sample, &cs, {0}},
                             {graph_sample, &each, {0}}};
      measure(w, 2, samples_of(21, 5), 1);
      for (int i = 0; i < samples_of(21, 5); i++) {
        w[0].v[i] /= 1e3 * GRAPH_KERNELS;
        w[1].v[i] /= 1e3 * GRAPH_KERNELS;
      }
      report("graph", "per kernel: in the graph vs 100 cusafe_kernel_launch",
             "us", w[0].v, w[1].v, samples_of(21, 5), "cusafe_kernel_launch",
             T_NONE, 0);
    }
  }
  for (int which = 0; which < 2; which++) {
    CK(cusafe_graph_release(g[which]));
    CU(cudaGraphExecDestroy(rx[which]));
    CU(cudaGraphDestroy(rg[which]));
  }
  for (int i = 0; i < 2; i++) {
    CK(cusafe_buffer_release(bufs[i]));
    CU(cudaFree(raw[i]));
  }
  CK(cusafe_kernel_release(k));
  CK(cusafe_stream_release(s));
  CK(cusafe_module_release(module));
  CK(cusafe_context_synchronize(ctx));
  CU(cudaStreamDestroy(rs));
  CU(cudaLibraryUnload(library));
}

/* ---- alloc --------------------------------------------------------------- */

enum alloc_kind { A_CUSAFE, A_CUSAFE_STREAM, A_RAW_ASYNC, A_RAW_SYNC };

struct alloc_case {
  enum alloc_kind kind;
  size_t size;
  int n;
  cusafe_stream cs_stream;
  cudaStream_t stream;
};

static void alloc_drain(const struct alloc_case *c) {
  if (c->kind == A_CUSAFE)
    CK(cusafe_context_synchronize(ctx));
  else if (c->kind == A_CUSAFE_STREAM)
    CK(cusafe_stream_synchronize(c->cs_stream));
  else
    CU(cudaStreamSynchronize(c->stream));
}

/* Host-side cost of one allocation and its free, in chunks of at most 256
 * pairs; the stream is drained after each chunk, outside the timed
 * region. */
static double alloc_sample(void *arg) {
  const struct alloc_case *c = arg;
  uint64_t total = 0;
  for (int done = 0; done < c->n;) {
    int chunk = c->n - done < 256 ? c->n - done : 256;
    uint64_t t0 = now_ns();
    switch (c->kind) {
    case A_CUSAFE:
      for (int i = 0; i < chunk; i++) {
        cusafe_buffer b;
        cusafe_status st =
            cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, c->size);
        if (UNLIKELY(st != CUSAFE_SUCCESS))
          cs_failed(st, "cusafe_buffer_alloc", __LINE__);
        st = cusafe_buffer_release(b);
        if (UNLIKELY(st != CUSAFE_SUCCESS))
          cs_failed(st, "cusafe_buffer_release", __LINE__);
      }
      break;
    case A_CUSAFE_STREAM:
      for (int i = 0; i < chunk; i++) {
        cusafe_buffer b;
        cusafe_status st = cusafe_buffer_alloc_async(&b, c->cs_stream, c->size);
        if (UNLIKELY(st != CUSAFE_SUCCESS))
          cs_failed(st, "cusafe_buffer_alloc_async", __LINE__);
        st = cusafe_buffer_release(b);
        if (UNLIKELY(st != CUSAFE_SUCCESS))
          cs_failed(st, "cusafe_buffer_release", __LINE__);
      }
      break;
    case A_RAW_ASYNC:
      for (int i = 0; i < chunk; i++) {
        void *p;
        cudaError_t err = cudaMallocAsync(&p, c->size, c->stream);
        if (UNLIKELY(err != cudaSuccess))
          cuda_failed(err, "cudaMallocAsync", __LINE__);
        err = cudaFreeAsync(p, c->stream);
        if (UNLIKELY(err != cudaSuccess))
          cuda_failed(err, "cudaFreeAsync", __LINE__);
      }
      break;
    case A_RAW_SYNC:
      for (int i = 0; i < chunk; i++) {
        void *p;
        cudaError_t err = cudaMalloc(&p, c->size);
        if (UNLIKELY(err != cudaSuccess))
          cuda_failed(err, "cudaMalloc", __LINE__);
        err = cudaFree(p);
        if (UNLIKELY(err != cudaSuccess))
          cuda_failed(err, "cudaFree", __LINE__);
      }
      break;
    }
    total += now_ns() - t0;
    alloc_drain(c);
    done += chunk;
  }
  return (double)total / c->n;
}

static void group_alloc(void) {
  int samples = samples_of(21, 7);
  int n = opt.quick ? 256 : 1024;
  char what[240];
  snprintf(what, sizeof what,
           "host-side cost of one device allocation and its free (%d per "
           "sample, drained every 256); raw: cudaMallocAsync+cudaFreeAsync "
           "on a stream unless the row names another",
           n);
  group_header("alloc", what);

  cudaStream_t stream;
  CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cusafe_stream cs_stream;
  CK(cusafe_stream_create(&cs_stream, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  /* One allocation held throughout keeps the pool from handing its memory
   * back to the driver at every synchronisation (release threshold 0), so
   * that the rows measure the steady state rather than the pool's regrowth
   * after each drain. */
  void *anchor;
  CU(cudaMallocAsync(&anchor, 256, stream));
  CU(cudaStreamSynchronize(stream));

  static const size_t sizes[] = {256, 64 * KiB};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    size_t size = sizes[i];
    struct alloc_case cs = {A_CUSAFE, size, n, 0, NULL};
    struct alloc_case css = {A_CUSAFE_STREAM, size, n, cs_stream, NULL};
    struct alloc_case ra = {A_RAW_ASYNC, size, n, 0, stream};
    struct alloc_case rs = {A_RAW_SYNC, size, 32, 0, stream};
    struct variant v[4] = {{alloc_sample, &cs, {0}},
                           {alloc_sample, &css, {0}},
                           {alloc_sample, &ra, {0}},
                           {alloc_sample, &rs, {0}}};
    measure(v, 4, samples, 2);
    for (int j = 0; j < 4; j++)
      to_us(v[j].v, samples);
    char label[80];
    const char *sz = size == 256 ? "256 B" : "64 KiB";
    snprintf(label, sizeof label, "buffer_alloc+release %s", sz);
    report("alloc", label, "us", v[0].v, v[2].v, samples,
           "cudaMallocAsync+cudaFreeAsync", T_RATIO_MAX, 1.2);
    snprintf(label, sizeof label, "buffer_alloc_async+release %s, a stream",
             sz);
    report("alloc", label, "us", v[1].v, v[2].v, samples,
           "cudaMallocAsync+cudaFreeAsync", T_RATIO_MAX, 1.2);
    snprintf(label, sizeof label,
             "buffer_alloc+release %s vs cudaMalloc+cudaFree", sz);
    report("alloc", label, "us", v[0].v, v[3].v, samples, "cudaMalloc+cudaFree",
           T_NONE, 0);
  }
  CU(cudaFreeAsync(anchor, stream));
  CU(cudaStreamSynchronize(stream));
  CU(cudaStreamDestroy(stream));
  CK(cusafe_stream_release(cs_stream));
}

/* ---- objects ------------------------------------------------------------- */

enum object_kind { O_CS_STREAM, O_RAW_STREAM, O_CS_EVENT, O_RAW_EVENT };

struct object_case {
  enum object_kind kind;
  int n;
};

static double object_sample(void *arg) {
  const struct object_case *c = arg;
  uint64_t t0 = now_ns();
  for (int i = 0; i < c->n; i++) {
    switch (c->kind) {
    case O_CS_STREAM: {
      cusafe_stream s;
      CK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
      CK(cusafe_stream_release(s));
      break;
    }
    case O_RAW_STREAM: {
      cudaStream_t s;
      CU(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, 0));
      CU(cudaStreamDestroy(s));
      break;
    }
    case O_CS_EVENT: {
      cusafe_event e;
      CK(cusafe_event_create(&e, ctx, 0));
      CK(cusafe_event_release(e));
      break;
    }
    case O_RAW_EVENT: {
      cudaEvent_t e;
      CU(cudaEventCreateWithFlags(&e, cudaEventDefault));
      CU(cudaEventDestroy(e));
      break;
    }
    }
  }
  return (double)(now_ns() - t0) / c->n;
}

static void group_objects(void) {
  int samples = samples_of(21, 7);
  group_header("objects", "create+destroy, host-side cost; raw: the same "
                          "CUDA objects (non-blocking stream, default event)");
  struct object_case cs = {O_CS_STREAM, opt.quick ? 32 : 64};
  struct object_case rs = {O_RAW_STREAM, cs.n};
  struct variant v[2] = {{object_sample, &cs, {0}}, {object_sample, &rs, {0}}};
  measure(v, 2, samples, 2);
  to_us(v[0].v, samples);
  to_us(v[1].v, samples);
  report("objects", "stream_create+release", "us", v[0].v, v[1].v, samples,
         "cudaStreamCreateWithPriority+cudaStreamDestroy", T_NONE, 0);

  struct object_case ce = {O_CS_EVENT, opt.quick ? 128 : 256};
  struct object_case re = {O_RAW_EVENT, ce.n};
  struct variant w[2] = {{object_sample, &ce, {0}}, {object_sample, &re, {0}}};
  measure(w, 2, samples, 2);
  to_us(w[0].v, samples);
  to_us(w[1].v, samples);
  report("objects", "event_create+release", "us", w[0].v, w[1].v, samples,
         "cudaEventCreateWithFlags+cudaEventDestroy", T_NONE, 0);
}

/* ---- copy ---------------------------------------------------------------- */

enum dir { H2D, D2H, D2D };
enum copy_impl { C_RAW, C_CS_SYNC, C_CS_ASYNC };

struct copy_state {
  cusafe_buffer a; /* used with the synchronous forms (default stream) */
  cusafe_buffer b; /* used with the stream-ordered forms, on `s` */
  cusafe_buffer c; /* device-to-device destination, on `s` */
  cusafe_stream s;
  void *ra, *rb; /* the raw copies' device memory: b's and c's own */
  cudaStream_t rs;
  void *pinned, *pageable;
};

struct copy_case {
  const struct copy_state *st;
  enum dir dir;
  enum copy_impl impl;
  void *host;
  size_t size;
  int reps;
};

static double copy_sample(void *arg) {
  const struct copy_case *c = arg;
  const struct copy_state *s = c->st;
  uint64_t t0 = now_ns();
  for (int r = 0; r < c->reps; r++) {
    switch (c->impl) {
    case C_RAW:
      if (c->dir == H2D)
        CU(cudaMemcpyAsync(s->ra, c->host, c->size, cudaMemcpyHostToDevice,
                           s->rs));
      else if (c->dir == D2H)
        CU(cudaMemcpyAsync(c->host, s->ra, c->size, cudaMemcpyDeviceToHost,
                           s->rs));
      else
        CU(cudaMemcpyAsync(s->rb, s->ra, c->size, cudaMemcpyDeviceToDevice,
                           s->rs));
      CU(cudaStreamSynchronize(s->rs));
      break;
    case C_CS_SYNC:
      if (c->dir == H2D)
        CK(cusafe_buffer_write(s->a, 0, c->host, c->size));
      else
        CK(cusafe_buffer_read(s->a, 0, c->host, c->size));
      break;
    case C_CS_ASYNC:
      if (c->dir == H2D)
        CK(cusafe_buffer_write_async(s->b, 0, c->host, c->size, s->s));
      else if (c->dir == D2H)
        CK(cusafe_buffer_read_async(s->b, 0, c->host, c->size, s->s));
      else
        CK(cusafe_buffer_copy(s->c, 0, s->b, 0, c->size, s->s));
      CK(cusafe_stream_synchronize(s->s));
      break;
    }
  }
  return (double)(now_ns() - t0) / c->reps;
}

/* Bytes per nanosecond are GB/s. */
static void to_gbps(double *v, int n, size_t bytes) {
  for (int i = 0; i < n; i++)
    v[i] = (double)bytes / v[i];
}

static void size_text(char *buf, size_t n, size_t size) {
  if (size >= MiB)
    snprintf(buf, n, "%zu MiB", size / MiB);
  else
    snprintf(buf, n, "%zu KiB", size / KiB);
}

/* Round trips through both paths with random data: what the timed copies
 * move arrives intact. */
static void copy_check(const struct copy_state *s, size_t n) {
  unsigned char *src = s->pinned, *dst = s->pageable;
  fill_random(src, n);
  memset(dst, 0x5A, n);
  CK(cusafe_buffer_write(s->a, 0, src, n));
  CK(cusafe_buffer_copy(s->c, 0, s->a, 0, n, s->s));
  CK(cusafe_buffer_read_async(s->c, 0, dst, n, s->s));
  CK(cusafe_stream_synchronize(s->s));
  if (memcmp(src, dst, n))
    die("check: cusafe write/copy/read of %zu bytes changed the data", n);
  fill_random(src, n);
  memset(dst, 0x5A, n);
  CU(cudaMemcpyAsync(s->ra, src, n, cudaMemcpyHostToDevice, s->rs));
  CU(cudaMemcpyAsync(s->rb, s->ra, n, cudaMemcpyDeviceToDevice, s->rs));
  CU(cudaMemcpyAsync(dst, s->rb, n, cudaMemcpyDeviceToHost, s->rs));
  CU(cudaStreamSynchronize(s->rs));
  if (memcmp(src, dst, n))
    die("check: raw copies of %zu bytes changed the data", n);
}

static void group_copy(void) {
  int samples = samples_of(15, 5);
  /* A pageable copy goes through the driver's staging buffers and the
   * host's memcpy, which other work on the host slows by tens of percent
   * from one copy to the next: more copies, and more samples. */
  int page_samples = samples_of(31, 9);
  static const size_t sizes[] = {4 * KiB,  64 * KiB, 1 * MiB,
                                 16 * MiB, 64 * MiB, 256 * MiB};
  const size_t nsizes = sizeof sizes / sizeof *sizes;
  const size_t max = sizes[nsizes - 1];
  group_header("copy",
               "GB/s (bytes copied / host time of copy + synchronisation); "
               "raw: cudaMemcpyAsync + cudaStreamSynchronize; the ratio is "
               "cusafe/raw of GB/s");

  struct copy_state s;
  CK(cusafe_stream_create(&s.s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  CK(cusafe_buffer_alloc(&s.a, ctx, CUSAFE_MEMORY_DEVICE, max));
  CK(cusafe_buffer_alloc_async(&s.b, s.s, max));
  CK(cusafe_buffer_alloc_async(&s.c, s.s, max));
  CU(cudaStreamCreateWithFlags(&s.rs, cudaStreamNonBlocking));
  /* The raw copies move the same bytes of the same memory as the
   * stream-ordered cusafe ones (b and c, from cudaMallocAsync's pool):
   * where memory lies changes device-to-device bandwidth by a few
   * percent. */
  CK(cusafe_buffer_interop_pointer(&s.ra, s.b));
  CK(cusafe_buffer_interop_pointer(&s.rb, s.c));
  CU(cudaMallocHost(&s.pinned, max));
  if (posix_memalign(&s.pageable, 4096, max))
    die("out of host memory (%zu bytes)", max);
  /* Touch every page of both host buffers and every byte of the device
   * buffers once, outside the timed regions. */
  fill_random(s.pinned, max);
  fill_random(s.pageable, max);
  CK(cusafe_buffer_fill(s.a, 0, max, 1, CUSAFE_STREAM_DEFAULT));
  CK(cusafe_buffer_fill(s.b, 0, max, 2, s.s));
  CK(cusafe_buffer_fill(s.c, 0, max, 3, s.s));
  CK(cusafe_context_synchronize(ctx));
  CK(cusafe_stream_synchronize(s.s));
  CU(cudaStreamSynchronize(s.rs));

  copy_check(&s, 1 * MiB + 12345);

  static const char *const host_names[] = {"pinned", "pageable"};
  for (int d = 0; d < 3; d++) {
    for (int h = 0; h < (d == D2D ? 1 : 2); h++) {
      for (size_t i = 0; i < nsizes; i++) {
        size_t size = sizes[i];
        /* Device-to-device copies are fast: more of them per sample, so
         * that the host's jitter does not decide the ratio. */
        size_t reps = (d == D2D ? 1024 * MiB : 64 * MiB) / size;
        if (reps > (opt.quick ? 64u : 256u))
          reps = opt.quick ? 64 : 256;
        if (reps < 1)
          reps = 1;
        if (h == 1 && size >= 64 * MiB && reps < 256 * MiB / size)
          reps = 256 * MiB / size;
        int n = h == 1 ? page_samples : samples;
        void *host = h == 0 ? s.pinned : s.pageable;
        struct copy_case raw = {&s, (enum dir)d, C_RAW, host, size, (int)reps};
        struct copy_case cs = raw, ca = raw;
        cs.impl = C_CS_SYNC;
        ca.impl = C_CS_ASYNC;
        char sz[32], label[96];
        size_text(sz, sizeof sz, size);
        enum target tk = size >= 64 * MiB ? T_RATIO_MIN : T_NONE;
        if (d == D2D) {
          struct variant v[2] = {{copy_sample, &ca, {0}},
                                 {copy_sample, &raw, {0}}};
          measure(v, 2, samples, 1);
          to_gbps(v[0].v, samples, size);
          to_gbps(v[1].v, samples, size);
          snprintf(label, sizeof label, "D2D %s buffer_copy+sync", sz);
          report("copy", label, "GB/s", v[0].v, v[1].v, samples,
                 "cudaMemcpyAsync+cudaStreamSynchronize", tk, 0.97);
          continue;
        }
        struct variant v[3] = {{copy_sample, &cs, {0}},
                               {copy_sample, &ca, {0}},
                               {copy_sample, &raw, {0}}};
        measure(v, 3, n, 1);
        for (int j = 0; j < 3; j++)
          to_gbps(v[j].v, n, size);
        const char *dn = d == H2D ? "H2D" : "D2H";
        snprintf(label, sizeof label, "%s %s %s %s", dn, host_names[h], sz,
                 d == H2D ? "write" : "read");
        report("copy", label, "GB/s", v[0].v, v[2].v, n,
               "cudaMemcpyAsync+cudaStreamSynchronize", tk, 0.97);
        snprintf(label, sizeof label, "%s %s %s %s+sync", dn, host_names[h], sz,
                 d == H2D ? "write_async" : "read_async");
        report("copy", label, "GB/s", v[1].v, v[2].v, n,
               "cudaMemcpyAsync+cudaStreamSynchronize", tk, 0.97);
      }
    }
  }

  CK(cusafe_buffer_release(s.a));
  CK(cusafe_buffer_release(s.b));
  CK(cusafe_buffer_release(s.c));
  CK(cusafe_stream_release(s.s));
  CK(cusafe_context_synchronize(ctx));
  CU(cudaFreeHost(s.pinned));
  free(s.pageable);
  CU(cudaStreamDestroy(s.rs));
}

/* ---- refcount ------------------------------------------------------------ */

struct padded_counter {
  _Alignas(64) _Atomic uint64_t n;
  char pad[64 - sizeof(uint64_t)];
};

enum rc_kind { RC_CUSAFE, RC_ATOMIC, RC_LOOKUP };

struct rc_thread {
  pthread_t tid;
  pthread_barrier_t *barrier;
  enum rc_kind kind;
  cusafe_buffer handle;
  _Atomic uint64_t *counter;
  long n;
  uint64_t elapsed;
};

static void rc_loop(struct rc_thread *t) {
  switch (t->kind) {
  case RC_CUSAFE:
    for (long i = 0; i < t->n; i++) {
      cusafe_status st = cusafe_buffer_retain(t->handle);
      if (UNLIKELY(st != CUSAFE_SUCCESS))
        cs_failed(st, "cusafe_buffer_retain", __LINE__);
      st = cusafe_buffer_release(t->handle);
      if (UNLIKELY(st != CUSAFE_SUCCESS))
        cs_failed(st, "cusafe_buffer_release", __LINE__);
    }
    break;
  case RC_LOOKUP:
    for (long i = 0; i < t->n; i++) {
      cusafe_handle_type type;
      cusafe_status st = cusafe_handle_get_type(&type, t->handle);
      if (UNLIKELY(st != CUSAFE_SUCCESS || type != CUSAFE_TYPE_BUFFER))
        cs_failed(st, "cusafe_handle_get_type", __LINE__);
    }
    break;
  case RC_ATOMIC:
    for (long i = 0; i < t->n; i++) {
      atomic_fetch_add(t->counter, 1);
      atomic_fetch_sub(t->counter, 1);
    }
    break;
  }
}

static void *rc_thread_main(void *arg) {
  struct rc_thread *t = arg;
  struct rc_thread warm = *t;
  warm.n = 16; /* registers the thread with cusafe outside the timing */
  rc_loop(&warm);
  pthread_barrier_wait(t->barrier);
  uint64_t t0 = now_ns();
  rc_loop(t);
  t->elapsed = now_ns() - t0;
  return NULL;
}

struct rc_case {
  enum rc_kind kind;
  int nthreads;
  const cusafe_buffer *handles;    /* one per thread */
  struct padded_counter *counters; /* one per thread, or all the same */
  int shared;
  long n;
};

/* ns per operation pair as one thread sees it while `nthreads` run at
 * once: the slowest thread's time over its pairs. */
static double rc_sample(void *arg) {
  const struct rc_case *c = arg;
  if (c->nthreads == 1) {
    struct rc_thread t = {.kind = c->kind,
                          .handle = c->handles[0],
                          .counter = &c->counters[0].n,
                          .n = c->n};
    uint64_t t0 = now_ns();
    rc_loop(&t);
    return (double)(now_ns() - t0) / c->n;
  }
  pthread_barrier_t barrier;
  struct rc_thread t[64];
  pthread_barrier_init(&barrier, NULL, (unsigned)c->nthreads);
  for (int i = 0; i < c->nthreads; i++) {
    t[i] = (struct rc_thread){.barrier = &barrier,
                              .kind = c->kind,
                              .handle = c->handles[c->shared ? 0 : i],
                              .counter = &c->counters[c->shared ? 0 : i].n,
                              .n = c->n};
    int err = pthread_create(&t[i].tid, NULL, rc_thread_main, &t[i]);
    if (err)
      die("pthread_create: %s", strerror(err));
  }
  uint64_t worst = 0;
  for (int i = 0; i < c->nthreads; i++) {
    pthread_join(t[i].tid, NULL);
    if (t[i].elapsed > worst)
      worst = t[i].elapsed;
  }
  pthread_barrier_destroy(&barrier);
  return (double)worst / c->n;
}

static void group_refcount(void) {
  int samples = samples_of(15, 5);
  long n = opt.quick ? 100000 : 300000;
  long nthreads = sysconf(_SC_NPROCESSORS_ONLN);
  if (nthreads > 8)
    nthreads = 8;
  if (nthreads < 2)
    nthreads = 2;
  char what[200];
  snprintf(what, sizeof what,
           "ns per retain+release pair of a buffer handle (%ld pairs per "
           "thread and sample); raw: a C11 atomic increment+decrement",
           n);
  group_header("refcount", what);

  cusafe_buffer handles[8];
  for (int i = 0; i < 8; i++)
    CK(cusafe_buffer_alloc(&handles[i], ctx, CUSAFE_MEMORY_DEVICE, 256));
  struct padded_counter *counters =
      aligned_alloc(64, 8 * sizeof(struct padded_counter));
  if (!counters)
    die("out of host memory");
  memset(counters, 0, 8 * sizeof *counters);

  struct rc_case c1 = {RC_CUSAFE, 1, handles, counters, 0, n};
  struct rc_case r1 = {RC_ATOMIC, 1, handles, counters, 0, n};
  struct variant v[2] = {{rc_sample, &c1, {0}}, {rc_sample, &r1, {0}}};
  measure(v, 2, samples, 2);
  report("refcount", "retain+release, 1 thread", "ns", v[0].v, v[1].v, samples,
         "atomic inc+dec", T_ABS_MAX, 25);

  struct rc_case l1 = {RC_LOOKUP, 1, handles, counters, 0, n};
  struct variant l[2] = {{rc_sample, &l1, {0}}, {rc_sample, &r1, {0}}};
  measure(l, 2, samples, 2);
  report("refcount", "handle lookup (handle_get_type), 1 thread", "ns", l[0].v,
         l[1].v, samples, "atomic inc+dec", T_NONE, 0);

  int nt = (int)nthreads;
  char label[80];
  struct rc_case co = {RC_CUSAFE, nt, handles, counters, 0, n};
  struct rc_case ro = {RC_ATOMIC, nt, handles, counters, 0, n};
  struct variant o[2] = {{rc_sample, &co, {0}}, {rc_sample, &ro, {0}}};
  measure(o, 2, samples, 1);
  snprintf(label, sizeof label,
           "retain+release, %d threads, own handles (raw: own counters)", nt);
  report("refcount", label, "ns", o[0].v, o[1].v, samples,
         "atomic inc+dec, a counter per thread", T_NONE, 0);

  struct rc_case cs = {RC_CUSAFE, nt, handles, counters, 1, n};
  struct rc_case rsh = {RC_ATOMIC, nt, handles, counters, 1, n};
  struct variant sh[2] = {{rc_sample, &cs, {0}}, {rc_sample, &rsh, {0}}};
  measure(sh, 2, samples, 1);
  snprintf(label, sizeof label,
           "retain+release, %d threads, one handle (raw: one counter)", nt);
  report("refcount", label, "ns", sh[0].v, sh[1].v, samples,
         "atomic inc+dec, one shared counter", T_NONE, 0);

  for (int i = 0; i < 8; i++)
    CK(cusafe_buffer_release(handles[i]));
  free(counters);
}

/* ---- shutdown ------------------------------------------------------------ */

/* The child: makes `n` live buffers (or raw allocations), then times the
 * shutdown (or the raw frees) and prints nanoseconds on stdout. */
static int shutdown_child(const char *spec) {
  char mode[16];
  long n;
  if (sscanf(spec, "%15[a-z]:%ld", mode, &n) != 2 || n < 1)
    die("bad --shutdown-child=%s", spec);
  alarm(120);
  unsetenv("CUSAFE_LEAK_REPORT");
  if (!strcmp(mode, "cusafe")) {
    cusafe_context c;
    CK(cusafe_context_create(&c, opt.device));
    cusafe_buffer *b = xmalloc((size_t)n * sizeof *b);
    for (long i = 0; i < n; i++)
      CK(cusafe_buffer_alloc(&b[i], c, CUSAFE_MEMORY_DEVICE, 256));
    CK(cusafe_context_synchronize(c));
    uint64_t t0 = now_ns();
    CK(cusafe_shutdown());
    uint64_t t = now_ns() - t0;
    printf("%llu\n", (unsigned long long)t);
  } else if (!strcmp(mode, "raw")) {
    CU(cudaSetDevice(opt.device));
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void **p = xmalloc((size_t)n * sizeof *p);
    for (long i = 0; i < n; i++)
      CU(cudaMallocAsync(&p[i], 256, s));
    CU(cudaStreamSynchronize(s));
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++)
      CU(cudaFreeAsync(p[i], s));
    CU(cudaStreamSynchronize(s));
    uint64_t t = now_ns() - t0;
    printf("%llu\n", (unsigned long long)t);
  } else {
    die("bad --shutdown-child mode %s", mode);
  }
  fflush(stdout);
  return 0;
}

/* Runs this program again as a child and returns the nanoseconds it
 * printed. */
static double run_child(const char *mode, long n) {
  char spec[64], dev[32];
  snprintf(spec, sizeof spec, "--shutdown-child=%s:%ld", mode, n);
  snprintf(dev, sizeof dev, "--device=%d", opt.device);
  char *argv[] = {"bench", spec, dev, NULL};
  int fds[2];
  if (pipe(fds))
    die("pipe: %s", strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  pid_t pid;
  fflush(stdout);
  int err = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (err)
    die("posix_spawn /proc/self/exe: %s", strerror(err));
  char out[256];
  size_t len = 0;
  ssize_t r;
  while (len < sizeof out - 1 &&
         ((r = read(fds[0], out + len, sizeof out - 1 - len)) > 0 ||
          (r < 0 && errno == EINTR)))
    if (r > 0)
      len += (size_t)r;
  out[len] = 0;
  close(fds[0]);
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR)
      die("waitpid: %s", strerror(errno));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    die("the %s shutdown child with %ld buffers failed (%s %d)", mode, n,
        WIFEXITED(status) ? "exit status" : "signal",
        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  unsigned long long ns;
  if (sscanf(out, "%llu", &ns) != 1)
    die("the %s shutdown child printed no time: \"%s\"", mode, out);
  return (double)ns;
}

struct shutdown_case {
  const char *mode;
  long n;
};

static double shutdown_sample(void *arg) {
  const struct shutdown_case *c = arg;
  return run_child(c->mode, c->n);
}

static void group_shutdown(void) {
  int samples = samples_of(5, 3);
  group_header("shutdown",
               "ms for cusafe_shutdown() with N live 256-byte device "
               "buffers, each sample a fresh process; raw: N cudaFreeAsync "
               "+ cudaStreamSynchronize");
  static const long counts[] = {1000, 100000};
  for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
    struct shutdown_case cs = {"cusafe", counts[i]};
    struct shutdown_case raw = {"raw", counts[i]};
    struct variant v[2] = {{shutdown_sample, &cs, {0}},
                           {shutdown_sample, &raw, {0}}};
    measure(v, 2, samples, i == 0 ? 1 : 0);
    for (int j = 0; j < samples; j++) {
      v[0].v[j] /= 1e6;
      v[1].v[j] /= 1e6;
    }
    char label[80];
    snprintf(label, sizeof label, "shutdown, %ld live buffers", counts[i]);
    report("shutdown", label, "ms", v[0].v, v[1].v, samples,
           "cudaFreeAsync each + cudaStreamSynchronize", T_NONE, 0);
  }
}

/* ---- main ---------------------------------------------------------------- */

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "\nbench: timed out; giving up\n";
  ssize_t r = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)r;
  _exit(2);
}

static void usage(FILE *f) {
  fprintf(f, "usage: bench [--quick] [--only=GROUP[,GROUP...]] [--samples=N]\n"
             "             [--csv[=FILE]] [--device=N]\n"
             "groups: launch alloc objects copy refcount shutdown\n");
}

static const char *cuda_version_text(int v, char *buf, size_t n) {
  snprintf(buf, n, "%d.%d", v / 1000, (v % 1000) / 10);
  return buf;
}

/* The kernel module's version, such as "580.95.05": the first word of
 * digits and dots on the first line of /proc/driver/nvidia/version. */
static void driver_release(char *buf, size_t n) {
  buf[0] = 0;
  FILE *f = fopen("/proc/driver/nvidia/version", "r");
  if (!f)
    return;
  char line[512];
  if (fgets(line, sizeof line, f)) {
    for (char *w = strtok(line, " \t\n"); w; w = strtok(NULL, " \t\n")) {
      if (strspn(w, "0123456789.") == strlen(w) && strchr(w, '.') &&
          w[0] != '.') {
        snprintf(buf, n, "NVIDIA %s", w);
        break;
      }
    }
  }
  fclose(f);
}

static void print_header(void) {
  int driver = 0, runtime = 0, nv_major = 0, nv_minor = 0;
  char a[16], b[16], rel[64];
  CU(cudaDriverGetVersion(&driver));
  CU(cudaRuntimeGetVersion(&runtime));
  NV(nvrtcVersion(&nv_major, &nv_minor));
  driver_release(rel, sizeof rel);
  struct utsname u;
  if (uname(&u))
    memset(&u, 0, sizeof u);
  printf("cusafe benchmark: cusafe %s against the CUDA runtime\n",
         cusafe_version_string());
  printf("  GPU %d:      %s, compute capability %d.%d, %d SMs, %.1f GiB, "
         "PCI %04x:%02x:%02x\n",
         opt.device, prop.name, prop.major, prop.minor,
         prop.multiProcessorCount,
         (double)prop.totalGlobalMem / (1024.0 * 1024 * 1024), prop.pciDomainID,
         prop.pciBusID, prop.pciDeviceID);
  printf("  driver:     %s%s(supports CUDA %s)\n", rel, *rel ? " " : "",
         cuda_version_text(driver, a, sizeof a));
  printf("  runtime:    CUDA %s, NVRTC %d.%d\n",
         cuda_version_text(runtime, b, sizeof b), nv_major, nv_minor);
  printf("  host:       %ld CPUs online, %s %s\n",
         sysconf(_SC_NPROCESSORS_ONLN), u.sysname, u.release);
  printf("  method:     medians of interleaved samples with min-max; "
         "c/raw = median of the ratios of samples taken in turn%s\n",
         opt.quick ? " (--quick: fewer samples)" : "");
}

int main(int argc, char **argv) {
  const char *child = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--quick"))
      opt.quick = 1;
    else if (!strncmp(a, "--only=", 7))
      opt.only = a + 7;
    else if (!strncmp(a, "--samples=", 10))
      opt.samples = atoi(a + 10);
    else if (!strcmp(a, "--csv"))
      opt.csv = "-";
    else if (!strncmp(a, "--csv=", 6))
      opt.csv = a + 6;
    else if (!strncmp(a, "--device=", 9))
      opt.device = atoi(a + 9);
    else if (!strncmp(a, "--shutdown-child=", 17))
      child = a + 17;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "bench: unknown option %s\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (opt.samples < 0 || opt.samples > MAX_SAMPLES) {
    fprintf(stderr, "bench: --samples must be 1 to %d\n", MAX_SAMPLES);
    return 2;
  }
  if (opt.only) {
    for (const char *p = opt.only; *p;) {
      const char *e = strchr(p, ',');
      size_t len = e ? (size_t)(e - p) : strlen(p);
      int known = 0;
      for (size_t g = 0; g < NGROUPS; g++)
        known |=
            strlen(all_groups[g]) == len && !strncmp(p, all_groups[g], len);
      if (!known) {
        fprintf(stderr, "bench: unknown group \"%.*s\"\n", (int)len, p);
        usage(stderr);
        return 2;
      }
      if (!e)
        break;
      p = e + 1;
    }
  }
  if (child)
    return shutdown_child(child);

  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    fprintf(stderr, "bench: no CUDA device found (%s)\n",
            err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 1;
  }
  if (opt.device < 0 || opt.device >= count) {
    fprintf(stderr, "bench: device %d does not exist (%d found)\n", opt.device,
            count);
    return 2;
  }
  /* A hung GPU or driver must not hang the run. */
  signal(SIGALRM, on_alarm);
  alarm(opt.quick ? 600 : 1200);

  CU(cudaSetDevice(opt.device));
  CU(cudaGetDeviceProperties(&prop, opt.device));
  CK(cusafe_context_create(&ctx, opt.device));
  print_header();
  compile_kernels();

  if (opt.csv && strcmp(opt.csv, "-")) {
    csv_file = fopen(opt.csv, "w");
    if (!csv_file)
      die("cannot write %s: %s", opt.csv, strerror(errno));
  }

  static void (*const runs[])(void) = {
      group_launch, group_graph,    group_alloc,   group_objects,
      group_copy,   group_refcount, group_shutdown};
  uint64_t start = now_ns();
  for (size_t g = 0; g < NGROUPS; g++) {
    if (!group_selected(all_groups[g]))
      continue;
    uint64_t t0 = now_ns();
    runs[g]();
    printf("  (%s: %.1f s)\n", all_groups[g], (double)(now_ns() - t0) / 1e9);
  }

  int met = 0, missed = 0;
  for (size_t i = 0; i < nrows; i++) {
    if (rows[i].met == 1)
      met++;
    else if (rows[i].met == 0)
      missed++;
  }
  printf("\ntargets: %d met, %d NOT met", met, missed);
  if (missed) {
    printf(":\n");
    for (size_t i = 0; i < nrows; i++)
      if (rows[i].met == 0)
        printf("  NOT met: [%s] %s (ratio %.3f, cusafe %.4g %s)\n",
               rows[i].group, rows[i].name, rows[i].ratio, rows[i].cs.med,
               rows[i].unit);
  } else {
    printf("\n");
  }
  printf("total: %.1f s\n", (double)(now_ns() - start) / 1e9);

  if (opt.csv) {
    if (csv_file) {
      write_csv(csv_file);
      if (fclose(csv_file))
        die("cannot write %s", opt.csv);
    } else {
      printf("\n");
      write_csv(stdout);
    }
  }
  CK(cusafe_context_release(ctx));
  free(cubin);
  free(rows);
  return 0;
}
