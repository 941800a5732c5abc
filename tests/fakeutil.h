/* fakeutil.h -- helpers shared by the Check suites that run against the
 * fake CUDA (tests/fakecuda/fakecuda.h): what is left alive, children of
 * a test, and the fake's call log. */
#ifndef CUSAFE_FAKEUTIL_H
#define CUSAFE_FAKEUTIL_H

#include <errno.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fakecuda.h"
#include "testutil.h"

/* Nothing of CUDA is left: no memory, stream, event, library or NVRTC
 * program, and the primary contexts of both devices are released.
 * TU_NOTHING_LIVE_AT names the moment in the failure's message. */
#define TU_NOTHING_LIVE() tu_nothing_live(__FILE__, __LINE__, NULL)
#define TU_NOTHING_LIVE_AT(what) tu_nothing_live(__FILE__, __LINE__, (what))

static inline void tu_nothing_live(const char *file, int line,
                                   const char *what) {
  const struct {
    size_t n;
    const char *name;
  } live[] = {{fake_live_allocations(-1), "allocations"},
              {fake_live_streams(-1), "streams"},
              {fake_live_events(-1), "events"},
              {fake_live_libraries(-1), "libraries"},
              {fake_live_programs(), "NVRTC programs"},
              {fake_live_graphs(-1), "graphs"},
              {fake_live_graph_execs(-1), "executable graphs"},
              {fake_live_captures(-1), "captures"},
              {fake_live_vmm_handles(-1), "shareable memory handles"}};
  const char *sep = what ? ": " : "";
  if (!what)
    what = "";
  for (size_t i = 0; i < sizeof live / sizeof live[0]; i++)
    if (live[i].n != 0)
      tu_fail(file, line, "%s%s%zu %s alive", what, sep, live[i].n,
              live[i].name);
  for (int d = 0; d < 2; d++)
    if (fake_primary_ctx_refcount(d) != 0)
      tu_fail(file, line,
              "%s%sprimary context of device %d still retained %d time(s)",
              what, sep, d, fake_primary_ctx_refcount(d));
}

/* Runs fn(arg) in a forked child and returns its wait status.  The child
 * starts as the test process is (in a forked test: no cusafe call has been
 * made there) and reports failures through tu_fail() in child mode.  With
 * `err`, the child's stderr goes there (NUL-terminated, cut at n bytes). */
static inline int tu_run_in_child(void (*fn)(void *), void *arg, char *err,
                                  size_t n) {
  int fds[2] = {-1, -1};
  if (err)
    ck_assert_int_eq(pipe(fds), 0);
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ne(pid, -1);
  if (pid == 0) {
    tu_in_child = 1;
    if (err) {
      close(fds[0]);
      dup2(fds[1], STDERR_FILENO);
      close(fds[1]);
    }
    fn(arg);
    exit(0);
  }
  if (err) {
    close(fds[1]);
    size_t len = 0;
    for (;;) {
      char buf[4096];
      ssize_t got = read(fds[0], buf, sizeof buf);
      if (got < 0 && errno == EINTR)
        continue;
      if (got <= 0)
        break;
      size_t take = (size_t)got < n - 1 - len ? (size_t)got : n - 1 - len;
      memcpy(err + len, buf, take);
      len += take;
    }
    err[len] = '\0';
    close(fds[0]);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  return status;
}

/* The name of call number n (from 1) of this process in the fake's log,
 * or "?". */
static inline const char *tu_call_name(unsigned long n) {
  unsigned long call = 0;
  const char *name;
  for (size_t i = 0; (name = fake_log_entry(i)) != NULL; i++)
    if (strncmp(name, "exec:", 5) != 0 && ++call == n)
      return name;
  return "?";
}

/* How a child of a fault-injection loop ends. */
enum tu_fault_result {
  TU_FAULT_COMPLETED = 0,    /* the injected failure was never reached */
  TU_FAULT_FAILED = 10,      /* the operation failed, cleanly */
  TU_FAULT_ABSORBED = 11,    /* reached, yet the operation succeeded */
  TU_FAULT_EXCUSED = 12,     /* a free failed: its leak not counted */
  TU_FAULT_NOT_REUSABLE = 13 /* the library failed again with CUDA healthy */
};

#endif /* CUSAFE_FAKEUTIL_H */
