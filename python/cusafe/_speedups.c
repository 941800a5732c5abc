/* cusafe._speedups: the hot paths of the Python package in C.
 *
 * The module links nothing of libcusafe: the package gives it the
 * addresses of the library's functions (init()), from the ctypes.CDLL it
 * loaded, so the extension calls whichever library the package chose -- the
 * installed one, $CUSAFE_LIBRARY, the fake of the test suite.  The pure
 * ctypes code stays the fallback (and the reference of the behaviour):
 * the package uses this module only when it imports and init() accepted
 * the library.
 *
 * The functions here never block (a retain or a release takes the
 * library's handle table lock only), so they run with the GIL held:
 * releasing it would cost more than the call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

/* The C types of include/cusafe.h (cusafe_handle, cusafe_status),
 * restated: pip builds the extension from python/ alone, without the
 * library's headers. */
typedef uint64_t speedups_handle;
typedef int (*speedups_handle_fn)(speedups_handle);

/* One process, one cusafe (cusafe.load() refuses a second library), so
 * the addresses are process-wide; NULL until init(). */
static speedups_handle_fn fn_retain;
static speedups_handle_fn fn_release;

/* An address from init()'s dict: a Python int in 1..UINTPTR_MAX. */
static int
address_of(PyObject *addresses, const char *name, void **out)
{
	PyObject *v = PyDict_GetItemString(addresses, name); /* borrowed */
	if (v == NULL) {
		PyErr_Format(PyExc_KeyError,
		             "init(): no address for %s", name);
		return -1;
	}
	if (!PyLong_Check(v)) {
		PyErr_Format(PyExc_TypeError,
		             "init(): the address of %s must be an int, not %.200s",
		             name, Py_TYPE(v)->tp_name);
		return -1;
	}
	void *p = PyLong_AsVoidPtr(v);
	if (p == NULL) {
		if (!PyErr_Occurred())
			PyErr_Format(PyExc_ValueError,
			             "init(): the address of %s is NULL", name);
		return -1;
	}
	*out = p;
	return 0;
}

static PyObject *
speedups_init(PyObject *module, PyObject *addresses)
{
	(void)module;
	if (!PyDict_Check(addresses)) {
		PyErr_Format(PyExc_TypeError,
		             "init() takes a dict of addresses, not %.200s",
		             Py_TYPE(addresses)->tp_name);
		return NULL;
	}
	void *retain, *release;
	/* All or nothing: a failed init() leaves the previous addresses. */
	if (address_of(addresses, "cusafe_retain", &retain) < 0 ||
	    address_of(addresses, "cusafe_release", &release) < 0)
		return NULL;
	/* ISO C has no function pointer from void *; POSIX (dlsym) does. */
	fn_retain = (speedups_handle_fn)(uintptr_t)retain;
	fn_release = (speedups_handle_fn)(uintptr_t)release;
	Py_RETURN_NONE;
}

/* A handle from Python: an int (bool and other subclasses included, as
 * ctypes takes them) in 0..2**64-1, never cut down to 64 bits. */
static int
handle_of(PyObject *arg, speedups_handle *out)
{
	if (!PyLong_Check(arg)) {
		PyErr_Format(PyExc_TypeError,
		             "handle must be an int, not %.200s",
		             Py_TYPE(arg)->tp_name);
		return -1;
	}
	unsigned long long v = PyLong_AsUnsignedLongLong(arg);
	if (v == (unsigned long long)-1 && PyErr_Occurred()) {
		if (!PyErr_ExceptionMatches(PyExc_OverflowError))
			return -1;
		PyErr_Clear();
		PyObject *zero = PyLong_FromLong(0);
		if (zero == NULL)
			return -1;
		int negative = PyObject_RichCompareBool(arg, zero, Py_LT);
		Py_DECREF(zero);
		if (negative < 0)
			return -1;
		if (negative)
			PyErr_Format(PyExc_OverflowError,
			             "handle must not be negative: %R", arg);
		else
			PyErr_Format(PyExc_OverflowError,
			             "handle %R does not fit 64 bits", arg);
		return -1;
	}
	*out = (speedups_handle)v;
	return 0;
}

static PyObject *
call_handle_fn(speedups_handle_fn fn, PyObject *arg)
{
	speedups_handle h;
	if (handle_of(arg, &h) < 0)
		return NULL;
	if (fn == NULL) {
		PyErr_SetString(PyExc_RuntimeError,
		                "cusafe._speedups.init() has not been called");
		return NULL;
	}
	return PyLong_FromLong(fn(h));
}

static PyObject *
speedups_retain(PyObject *module, PyObject *arg)
{
	(void)module;
	return call_handle_fn(fn_retain, arg);
}

static PyObject *
speedups_release(PyObject *module, PyObject *arg)
{
	(void)module;
	return call_handle_fn(fn_release, arg);
}

static PyMethodDef speedups_methods[] = {
	{"init", speedups_init, METH_O,
	 "init(addresses, /)\n--\n\n"
	 "Takes the library's function addresses, a dict of name to int\n"
	 "(ctypes.cast(cdll[name], ctypes.c_void_p).value); needs\n"
	 "cusafe_retain and cusafe_release.  KeyError for a missing name,\n"
	 "TypeError or ValueError for an address that is not a non-null int;\n"
	 "on error the previous addresses stay."},
	{"retain", speedups_retain, METH_O,
	 "retain(handle, /)\n--\n\n"
	 "cusafe_retain(handle); returns its status (0: success).  TypeError\n"
	 "for a handle that is not an int, OverflowError for one outside\n"
	 "0..2**64-1, RuntimeError before init()."},
	{"release", speedups_release, METH_O,
	 "release(handle, /)\n--\n\n"
	 "cusafe_release(handle); returns its status (0: success).  TypeError\n"
	 "for a handle that is not an int, OverflowError for one outside\n"
	 "0..2**64-1, RuntimeError before init()."},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
	PyModuleDef_HEAD_INIT,
	"cusafe._speedups",
	"The hot paths of cusafe in C; the package gives it the library's\n"
	"function addresses (init()) and falls back to ctypes without it.",
	-1, /* process-wide state: see fn_retain */
	speedups_methods,
	NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
	return PyModule_Create(&speedups_module);
}
