/* testutil.h -- assertions and helpers shared by the Check suites.
 *
 * The assertions compare exact statuses and exact messages.  They report
 * through tu_fail(), which fails the Check test in the test's own process
 * and, in a child the test forked itself (tu_in_child set), prints the
 * failure and exits with TU_CHILD_FAILED: Check's assertions must not run
 * in a grandchild of the runner, where they would report into the middle of
 * the test's own result. */
#ifndef CUSAFE_TESTUTIL_H
#define CUSAFE_TESTUTIL_H

#include <check.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cusafe.h"

/* The exit status of a forked child whose check failed. */
#define TU_CHILD_FAILED 3

static int tu_in_child __attribute__((unused));

static void tu_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn, unused));
static void tu_fail(const char *file, int line, const char *fmt, ...) {
  char text[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (tu_in_child) {
    fprintf(stderr, "%s:%d: (forked child) %s\n", file, line, text);
    fflush(stderr);
    _exit(TU_CHILD_FAILED);
  }
  _ck_assert_failed(file, line, "Failed", "%s", text);
}

/* The library's text is valid only until the next cusafe call. */
static inline void tu_copy_message(char *buf, size_t n) {
  snprintf(buf, n, "%s", cusafe_last_error_message());
}

/* Prints a handle as the library's messages do. */
#define TU_HX(h) ((unsigned long long)(h))

#define TU_ASSERT(cond, ...)                                                   \
  do {                                                                         \
    if (!(cond))                                                               \
      tu_fail(__FILE__, __LINE__, __VA_ARGS__);                                \
  } while (0)

#define TU_OK(expr)                                                            \
  do {                                                                         \
    cusafe_status tu_st_ = (expr);                                             \
    if (tu_st_ != CUSAFE_SUCCESS) {                                            \
      char tu_msg_[512];                                                       \
      tu_copy_message(tu_msg_, sizeof tu_msg_);                                \
      tu_fail(__FILE__, __LINE__,                                              \
              "%s returned %s (%d), expected success; message \"%s\"", #expr,  \
              cusafe_status_string(tu_st_), (int)tu_st_, tu_msg_);             \
    }                                                                          \
  } while (0)

/* Checks the status only: for results whose message is not promised. */
#define TU_STATUS(expr, want)                                                  \
  do {                                                                         \
    cusafe_status tu_st_ = (expr);                                             \
    cusafe_status tu_want_ = (want);                                           \
    if (tu_st_ != tu_want_) {                                                  \
      char tu_msg_[512];                                                       \
      tu_copy_message(tu_msg_, sizeof tu_msg_);                                \
      tu_fail(__FILE__, __LINE__,                                              \
              "%s returned %s (%d), expected %s (%d); message \"%s\"", #expr,  \
              cusafe_status_string(tu_st_), (int)tu_st_,                       \
              cusafe_status_string(tu_want_), (int)tu_want_, tu_msg_);         \
    }                                                                          \
  } while (0)

/* Checks the status and the exact message; the message is a printf format
 * and its arguments. */
#define TU_ERR(expr, want, ...)                                                \
  do {                                                                         \
    cusafe_status tu_st_ = (expr);                                             \
    cusafe_status tu_want_ = (want);                                           \
    char tu_msg_[512], tu_exp_[512];                                           \
    tu_copy_message(tu_msg_, sizeof tu_msg_);                                  \
    snprintf(tu_exp_, sizeof tu_exp_, __VA_ARGS__);                            \
    if (tu_st_ != tu_want_)                                                    \
      tu_fail(__FILE__, __LINE__,                                              \
              "%s returned %s (%d), expected %s (%d); message \"%s\"", #expr,  \
              cusafe_status_string(tu_st_), (int)tu_st_,                       \
              cusafe_status_string(tu_want_), (int)tu_want_, tu_msg_);         \
    if (strcmp(tu_msg_, tu_exp_) != 0)                                         \
      tu_fail(__FILE__, __LINE__, "%s: message \"%s\", expected \"%s\"",       \
              #expr, tu_msg_, tu_exp_);                                        \
  } while (0)

/* Checks the status and that the message starts with `prefix`: for
 * messages that end in text of the CUDA runtime. */
#define TU_ERR_PREFIX(expr, want, prefix)                                      \
  do {                                                                         \
    cusafe_status tu_st_ = (expr);                                             \
    cusafe_status tu_want_ = (want);                                           \
    const char *tu_pre_ = (prefix);                                            \
    char tu_msg_[512];                                                         \
    tu_copy_message(tu_msg_, sizeof tu_msg_);                                  \
    if (tu_st_ != tu_want_)                                                    \
      tu_fail(__FILE__, __LINE__,                                              \
              "%s returned %s (%d), expected %s (%d); message \"%s\"", #expr,  \
              cusafe_status_string(tu_st_), (int)tu_st_,                       \
              cusafe_status_string(tu_want_), (int)tu_want_, tu_msg_);         \
    if (strncmp(tu_msg_, tu_pre_, strlen(tu_pre_)) != 0 ||                     \
        strlen(tu_msg_) <= strlen(tu_pre_))                                    \
      tu_fail(__FILE__, __LINE__,                                              \
              "%s: message \"%s\", expected \"%s\" and CUDA's words", #expr,   \
              tu_msg_, tu_pre_);                                               \
  } while (0)

/* Checks that `h` is no longer a live handle (type lookup fails as stale). */
#define TU_STALE(h)                                                            \
  do {                                                                         \
    cusafe_handle tu_h_ = (h);                                                 \
    cusafe_handle_type tu_t_ = CUSAFE_TYPE_BUFFER;                             \
    TU_ERR(cusafe_handle_get_type(&tu_t_, tu_h_), CUSAFE_ERROR_INVALID_HANDLE, \
           "handle 0x%016llx is stale: its object was released",               \
           TU_HX(tu_h_));                                                      \
    TU_ASSERT(tu_t_ == CUSAFE_TYPE_INVALID,                                    \
              "type of stale handle %s is %d, expected CUSAFE_TYPE_INVALID",   \
              #h, (int)tu_t_);                                                 \
  } while (0)

/* Checks that `h` is a live handle of type `want`. */
#define TU_LIVE(h, want)                                                       \
  do {                                                                         \
    cusafe_handle_type tu_t_ = CUSAFE_TYPE_INVALID;                            \
    TU_OK(cusafe_handle_get_type(&tu_t_, (h)));                                \
    TU_ASSERT(tu_t_ == (want), "type of %s is %d, expected %d", #h,            \
              (int)tu_t_, (int)(want));                                        \
  } while (0)

/* Compares two byte ranges and names the first difference. */
#define TU_BYTES_EQ(got, want, n)                                              \
  do {                                                                         \
    const unsigned char *tu_g_ = (const unsigned char *)(got);                 \
    const unsigned char *tu_w_ = (const unsigned char *)(want);                \
    size_t tu_n_ = (n);                                                        \
    for (size_t tu_i_ = 0; tu_i_ < tu_n_; tu_i_++)                             \
      if (tu_g_[tu_i_] != tu_w_[tu_i_])                                        \
        tu_fail(__FILE__, __LINE__,                                            \
                "%s differs from %s at byte %zu of %zu: 0x%02x, "              \
                "expected 0x%02x",                                             \
                #got, #want, tu_i_, tu_n_, tu_g_[tu_i_], tu_w_[tu_i_]);        \
  } while (0)

/* A byte pattern that does not repeat every 256 bytes, so that data copied
 * to a wrong offset does not compare equal by chance. */
static inline void tu_pattern(void *dst, size_t n, uint32_t seed) {
  unsigned char *p = dst;
  uint32_t x = seed * 2654435761u + 0x9e3779b9u;
  if (x == 0)
    x = 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = (unsigned char)(x >> 24);
  }
}

static inline void *tu_xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (p == NULL) {
    fprintf(stderr, "out of host memory (%zu bytes)\n", n);
    exit(99);
  }
  return p;
}

/* The kernel `name` of `module`, checked to be a live kernel. */
static inline cusafe_kernel tu_get_kernel(cusafe_module module,
                                          const char *name) {
  cusafe_kernel k = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_module_get_kernel(&k, module, name));
  TU_LIVE(k, CUSAFE_TYPE_KERNEL);
  return k;
}

static const char *const tu_kind_names[] = {"device", "pinned", "managed"};

/* Runs the suite, each test in a process of its own (CK_FORK) or all in
 * this one (CK_NOFORK); returns the program's exit status. */
static inline int tu_run_suite(Suite *s, enum fork_status fork_mode) {
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, fork_mode);
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}

/* For the programs that need a GPU: returns when cusafe counts the
 * devices; exits 77 (automake's SKIP) without a driver or a device, and 99
 * (a hard error) when counting fails otherwise.  CUDA is initialised
 * afterwards: a forked child could not use it. */
static inline void tu_require_gpu(void) {
  int n = 0;
  cusafe_status st = cusafe_device_count(&n);
  if (st == CUSAFE_ERROR_NO_DRIVER || st == CUSAFE_ERROR_NO_DEVICE) {
    printf("no CUDA device: skipping (%s)\n", cusafe_last_error_message());
    exit(77);
  }
  if (st != CUSAFE_SUCCESS) {
    fprintf(stderr, "cusafe_device_count failed: %s: %s\n",
            cusafe_status_string(st), cusafe_last_error_message());
    exit(99);
  }
}

#endif /* CUSAFE_TESTUTIL_H */
