/* abortutil.h -- how the programs that run outside Check (the fuzzer and
 * the stress test) fail: "<program>: FAILED: <message>" on stderr, then
 * abort(), which their sanitizers and Valgrind report with a stack. */
#ifndef CUSAFE_ABORTUTIL_H
#define CUSAFE_ABORTUTIL_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static void tu_abortf(const char *program, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 2, 3), unused));
static void tu_abortf(const char *program, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "%s: FAILED: ", program);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
  abort();
}

#endif /* CUSAFE_ABORTUTIL_H */
