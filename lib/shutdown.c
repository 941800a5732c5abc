/* shutdown.c -- the ordered shutdown and the leak report (invariant 5:
 * exit is ordered and safe).  It runs from the exit handler (init.c), or
 * when the program calls cusafe_shutdown(). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "device.h"
#include "graph.h"
#include "handle.h"
#include "init.h"

#define CS_TYPE_DESCRIBE(TYPE, name, article, peeked)                          \
  [CS_##TYPE] = cs_##name##_describe,
static void (*const describe[CS_TYPES + 1])(const struct cs_object *obj,
                                            char *what, size_t size) = {
    CS_TYPE_MAP(CS_TYPE_DESCRIBE)};
#undef CS_TYPE_DESCRIBE

/* shut_<name>(obj): frees obj's CUDA resources and retires its handle;
 * the object stays reachable through its slot. */
#define CS_TYPE_SHUT(TYPE, name, article, peeked)                              \
  static void shut_##name(struct cs_object *obj) {                             \
    cs_##name##_fini(obj);                                                     \
    cs_handle_kill(obj);                                                       \
  }
CS_TYPE_MAP(CS_TYPE_SHUT)
#undef CS_TYPE_SHUT

/* One line per handle the program still holds. */
static void report_leak(struct cs_object *obj) {
  if (cs_user_refs(obj) == 0)
    return; /* kept alive by its children only: they are reported */
  char what[160];
  describe[obj->type](obj, what, sizeof what);
  const char *label = atomic_load(&obj->label);
  fprintf(stderr, "cusafe: leak: %s 0x%016llx (%s)%s%s%s\n",
          cs_type_name(obj->type), (unsigned long long)obj->handle, what,
          label ? " \"" : "", label ? label : "", label ? "\"" : "");
}

/* The ordered shutdown: every device synchronised, then each type's
 * objects in the order of CS_TYPE_MAP (handle.h): buffers and views,
 * events, streams, kernels, modules, contexts last.  Objects are retired
 * but their host memory stays reachable, so that a late caller reads valid
 * memory and gets an error, never a crash. */
CUSAFE_API cusafe_status cusafe_shutdown(void) {
  if (!cs_calls_stop())
    return CUSAFE_SUCCESS; /* done already, or a forked child */
  if (!cs_initialised())
    return CUSAFE_SUCCESS;
  /* New calls now fail; those in progress finish before anything goes. */
  if (!cs_calls_drain(5))
    return CUSAFE_SUCCESS;
  const char *report = getenv("CUSAFE_LEAK_REPORT");
  if (report && !strcmp(report, "1"))
    for (int t = 1; t <= CS_TYPES; t++)
      cs_handle_foreach((enum cs_type)t, report_leak);
  /* In relaxed capture mode, as every teardown (handle.c). */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  bool relaxed = cs_relax(&mode);
  /* Open captures end first: no device can be synchronised during one. */
  cs_captures_abort_all();
  cs_handle_foreach(CS_CONTEXT, cs_context_settle);
  cs_parked_shutdown(); /* the ends of memory first; the follows' objects go
                           with the rest */
#define CS_TYPE_SHUTDOWN(TYPE, name, article, peeked)                          \
  cs_handle_foreach(CS_##TYPE, shut_##name);
  CS_TYPE_MAP(CS_TYPE_SHUTDOWN)
#undef CS_TYPE_SHUTDOWN
  cs_unrelax(relaxed, mode);
  return CUSAFE_SUCCESS;
}
