/* python.h -- what cusafe knows of a Python interpreter in its process
 * (python.c).  Internal; never installed. */
#ifndef CUSAFE_PYTHON_H
#define CUSAFE_PYTHON_H

#include "error.h"

/* Whether the process runs a Python interpreter that has finalized (or is
 * finalizing): then functions of other libraries that may need Python (a
 * producer's DLPack deleter, a Python object's release) must not be
 * called -- the process is going, and its memory with it.  False in a
 * process without Python. */
bool cs_python_finalized(void);

#endif /* CUSAFE_PYTHON_H */
