/* python.c -- Python in the process: whether it can still be called, and
 * the release of Python objects that cusafe holds for a binding
 * (cusafe_python_release).  Python's functions are looked up in the
 * process, not linked: the library does not depend on Python, and outside
 * a Python process these functions do nothing. */
#include <dlfcn.h>

#include "python.h"

/* Python's own lookups, by name, of the stable ABI. */
static void *python_symbol(const char *name) {
  return dlsym(RTLD_DEFAULT, name);
}

bool cs_python_finalized(void) {
  int (*initialized)(void) = (int (*)(void))python_symbol("Py_IsInitialized");
  return initialized && !initialized();
}

CUSAFE_API void cusafe_python_release(void *object) {
  if (!object || cs_python_finalized())
    return;
  int (*ensure)(void) = (int (*)(void))python_symbol("PyGILState_Ensure");
  void (*release)(int) = (void (*)(int))python_symbol("PyGILState_Release");
  void (*decref)(void *) = (void (*)(void *))python_symbol("Py_DecRef");
  if (!ensure || !release || !decref)
    return;
  int gil = ensure();
  decref(object);
  release(gil);
}
