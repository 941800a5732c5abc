/* cusafe._speedups: the hot paths of the Python package in C.
 *
 * The module links nothing of libcusafe: the package gives it the
 * addresses of the library's functions (init()), from the ctypes.CDLL it
 * loaded, so the extension calls whichever library the package chose -- the
 * installed one, $CUSAFE_LIBRARY, the fake of the test suite.  The pure
 * ctypes code stays the fallback (and the reference of the behaviour):
 * the package uses this module only when it imports and
 * CUSAFE_PURE_PYTHON is not 1.
 *
 * What it holds: the owning objects' handle (Object, the base of the
 * package's Context, Stream, Event, Buffer, Module, Kernel and Graph), so
 * that close() and the collector's release cost one C call;
 * Context.alloc; retain and release of a bare handle.
 *
 * The GIL: a release may be the last, which destroys, and a destruction may
 * wait for queued work (pinned and wrapped memory are freed after it) or
 * call back into Python (cusafe_python_release takes the GIL): releases
 * run without the GIL, as ctypes ran them.  Retains never block and hold
 * it.  An allocation of device memory comes from the stream-ordered pool
 * and holds it; pinned and managed allocations (milliseconds, page
 * locking) do not.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#if PY_VERSION_HEX < 0x03090000 /* public from 3.9 on */
#define PyObject_Vectorcall _PyObject_Vectorcall
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The C types of include/cusafe.h (cusafe_handle, cusafe_status),
 * restated: pip builds the extension from python/ alone, without the
 * library's headers. */
typedef uint64_t speedups_handle;
typedef int (*speedups_handle_fn)(speedups_handle);
typedef int (*speedups_alloc_fn)(speedups_handle *, speedups_handle, int,
                                 size_t);

/* cusafe_arg and cusafe_launch_config, restated (see above). */
typedef struct {
	uint32_t kind;
	uint32_t size;
	union {
		speedups_handle buffer;
		int64_t i;
		uint64_t u;
		float f32;
		double f64;
		const void *bytes;
	} value;
} speedups_arg;
typedef struct {
	uint32_t grid[3];
	uint32_t block[3];
	size_t shared_memory;
	speedups_handle stream;
} speedups_config;
typedef int (*speedups_launch_fn)(speedups_handle, const speedups_config *,
                                  const speedups_arg *, size_t);
/* cusafe_launch_attr, restated (see above): 24 bytes. */
typedef struct {
	uint32_t id;
	uint32_t reserved;
	union {
		uint32_t dim[3];
		int32_t flag;
		int32_t priority;
		uint64_t pad[2];
	} value;
} speedups_attr;
typedef int (*speedups_launch_ex_fn)(speedups_handle,
                                     const speedups_config *,
                                     const speedups_attr *, size_t,
                                     const speedups_arg *, size_t);

_Static_assert(sizeof(speedups_attr) == 24, "cusafe_launch_attr's size");

/* cusafe_launch_attr_id */
enum {
	ATTR_CLUSTER = 1, ATTR_NON_PORTABLE_CLUSTER, ATTR_COOPERATIVE,
	ATTR_PROGRAMMATIC_SERIALIZATION, ATTR_PRIORITY, ATTR_MAX = 5
};

/* cusafe_arg_kind */
enum {
	ARG_BUFFER = 1, ARG_I8, ARG_U8, ARG_I16, ARG_U16, ARG_I32, ARG_U32,
	ARG_I64, ARG_U64, ARG_F32, ARG_F64, ARG_BYTES
};

/* CUSAFE_MEMORY_DEVICE: the one kind allocated with the GIL held. */
#define MEMORY_DEVICE 0

/* The release functions, by the HandleType of what they release (0: any,
 * cusafe_release); an Object releases through its type's function, as the
 * ctypes classes do (the name is the class's _release_name). */
enum { KIND_ANY, KIND_COUNT = 8 };
static const char *const release_names[KIND_COUNT] = {
	"cusafe_release",        "cusafe_context_release",
	"cusafe_stream_release", "cusafe_event_release",
	"cusafe_buffer_release", "cusafe_module_release",
	"cusafe_kernel_release", "cusafe_graph_release",
};
#define KIND_BUFFER 4

/* One process, one cusafe (cusafe.load() refuses a second library), so
 * the addresses are process-wide; NULL until init(). */
static speedups_handle_fn fn_retain;
static speedups_handle_fn fn_releases[KIND_COUNT];
static speedups_alloc_fn fn_alloc;
static speedups_launch_fn fn_launch;
static speedups_launch_ex_fn fn_launch_ex;

/* What the package registers (setup()): Python code for the cold paths,
 * so that both implementations raise the same errors. */
static PyTypeObject speedups_object_type;
static PyTypeObject speedups_buffer_type;
static PyObject *py_check;   /* check(status): raises the library's error */
static PyObject *py_count;   /* _count(value, what): an int or the error */
static PyObject *py_kinds;   /* {memory kind: int}: what alloc() takes */
static PyTypeObject *py_buffer_type; /* the package's Buffer */
static PyTypeObject *py_stream_type; /* the package's Stream */
static PyTypeObject *py_bytes_type;  /* the package's Bytes (launches) */
/* The typed scalars I8 ... F64, by ArgKind - ARG_I8. */
static PyTypeObject *py_scalar_types[ARG_F64 - ARG_I8 + 1];
/* The ctypes path of Kernel.launch: where an argument, a grid or a
 * keyword is anything but the common cases, it runs the whole launch,
 * checks and errors included. */
static PyObject *py_launch;
/* Arrays of other libraries as launch arguments: foreign(a) says whether
 * `a` is one (it has __dlpack__ or __cuda_array_interface__, found
 * without reading it); wrap(a, stream) makes the Buffer of the launch. */
static PyObject *py_foreign, *py_wrap;

/* Set by the package's exit hook (at_exit()), which Python runs before it
 * tears its modules down: from then on a collected object releases
 * nothing, and the library's own exit handler destroys what is left, in
 * dependency order -- daemon threads may still use it. */
static int exiting;

/* An address from init()'s dict: a Python int in 1..UINTPTR_MAX; with
 * `optional`, a missing name leaves *out NULL. */
static int
address_of(PyObject *addresses, const char *name, void **out, int optional)
{
	PyObject *v = PyDict_GetItemString(addresses, name); /* borrowed */
	*out = NULL;
	if (v == NULL) {
		if (optional)
			return 0;
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
	void *retain, *alloc, *releases[KIND_COUNT];
	/* All or nothing: a failed init() leaves the previous addresses. */
	if (address_of(addresses, "cusafe_retain", &retain, 0) < 0)
		return NULL;
	for (int k = 0; k < KIND_COUNT; k++)
		if (address_of(addresses, release_names[k], &releases[k],
		               k != KIND_ANY) < 0)
			return NULL;
	void *launch, *launch_ex;
	if (address_of(addresses, "cusafe_buffer_alloc", &alloc, 1) < 0 ||
	    address_of(addresses, "cusafe_kernel_launch", &launch, 1) < 0 ||
	    address_of(addresses, "cusafe_kernel_launch_ex", &launch_ex, 1) < 0)
		return NULL;
	/* ISO C has no function pointer from void *; POSIX (dlsym) does. */
	fn_retain = (speedups_handle_fn)(uintptr_t)retain;
	for (int k = 0; k < KIND_COUNT; k++)
		/* A type's own release where the library has it, else the
		 * generic one, which releases every type. */
		fn_releases[k] = (speedups_handle_fn)(uintptr_t)(
			releases[k] ? releases[k] : releases[KIND_ANY]);
	fn_alloc = (speedups_alloc_fn)(uintptr_t)alloc;
	fn_launch = (speedups_launch_fn)(uintptr_t)launch;
	fn_launch_ex = (speedups_launch_ex_fn)(uintptr_t)launch_ex;
	Py_RETURN_NONE;
}

static int
set_type(PyObject *v, PyTypeObject *base, const char *what,
         PyTypeObject **slot)
{
	if (!PyType_Check(v) ||
	    (base != NULL && !PyType_IsSubtype((PyTypeObject *)v, base))) {
		PyErr_Format(PyExc_TypeError, "setup(): %s must be a %s", what,
		             base != NULL ? base->tp_name : "type");
		return -1;
	}
	Py_INCREF(v);
	Py_XSETREF(*slot, (PyTypeObject *)v);
	return 0;
}

/* setup(check=, count=, kinds=, buffer=, stream=, scalars=, bytes=,
 * launch=, foreign=, wrap=): what the package gives once its classes
 * exist; see py_check. */
static PyObject *
speedups_setup(PyObject *module, PyObject *args, PyObject *kwargs)
{
	(void)module;
	static char *names[] = {"check", "count", "kinds", "buffer", "stream",
	                        "scalars", "bytes", "launch", "foreign",
	                        "wrap", NULL};
	PyObject *check, *count, *kinds, *buffer, *stream, *scalars, *bytes,
		*launch, *foreign, *wrap;
	if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OOO!OOO!OOOO:setup",
	                                 names, &check, &count, &PyDict_Type,
	                                 &kinds, &buffer, &stream,
	                                 &PyTuple_Type, &scalars, &bytes,
	                                 &launch, &foreign, &wrap))
		return NULL;
	if (!PyCallable_Check(check) || !PyCallable_Check(count) ||
	    !PyCallable_Check(launch) || !PyCallable_Check(foreign) ||
	    !PyCallable_Check(wrap)) {
		PyErr_SetString(PyExc_TypeError, "setup(): check, count, "
		                "launch, foreign and wrap must be callable");
		return NULL;
	}
	if (PyTuple_GET_SIZE(scalars) != ARG_F64 - ARG_I8 + 1) {
		PyErr_Format(PyExc_TypeError, "setup(): scalars must be the %d "
		             "types I8 ... F64", ARG_F64 - ARG_I8 + 1);
		return NULL;
	}
	for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(scalars); i++)
		if (!PyType_Check(PyTuple_GET_ITEM(scalars, i))) {
			PyErr_SetString(PyExc_TypeError,
			                "setup(): scalars must be types");
			return NULL;
		}
	if (set_type(buffer, &speedups_buffer_type, "buffer",
	             &py_buffer_type) < 0 ||
	    set_type(stream, &speedups_object_type, "stream",
	             &py_stream_type) < 0 ||
	    set_type(bytes, NULL, "bytes", &py_bytes_type) < 0)
		return NULL;
	for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(scalars); i++) {
		PyObject *t = PyTuple_GET_ITEM(scalars, i);
		Py_INCREF(t);
		Py_XSETREF(py_scalar_types[i], (PyTypeObject *)t);
	}
	Py_INCREF(check);
	Py_XSETREF(py_check, check);
	Py_INCREF(count);
	Py_XSETREF(py_count, count);
	Py_INCREF(kinds);
	Py_XSETREF(py_kinds, kinds);
	Py_INCREF(launch);
	Py_XSETREF(py_launch, launch);
	Py_INCREF(foreign);
	Py_XSETREF(py_foreign, foreign);
	Py_INCREF(wrap);
	Py_XSETREF(py_wrap, wrap);
	Py_RETURN_NONE;
}

static PyObject *
speedups_at_exit(PyObject *module, PyObject *unused)
{
	(void)module;
	(void)unused;
	exiting = 1;
	Py_RETURN_NONE;
}

/* Raises the library's error for a failed call (py_check), on the calling
 * thread, right after the call: the message is the thread's. */
static PyObject *
raise_status(int status)
{
	if (py_check == NULL) {
		PyErr_Format(PyExc_RuntimeError,
		             "cusafe._speedups.setup() has not been called "
		             "(status %d)", status);
		return NULL;
	}
	PyObject *fn = py_check; /* held: the call may run setup() */
	Py_INCREF(fn);
	PyObject *r = PyObject_CallFunction(fn, "i", status);
	Py_DECREF(fn);
	if (r == NULL)
		return NULL;
	Py_DECREF(r);
	PyErr_Format(PyExc_SystemError, "cusafe: status %d raised nothing",
	             status);
	return NULL;
}

/* An unsigned value from Python: an int (bool and other subclasses
 * included, as ctypes takes them) in 0..2**64-1, never cut down to 64
 * bits.  `what` names it in the errors. */
static int
unsigned_of(PyObject *arg, const char *what, unsigned long long *out)
{
	if (!PyLong_Check(arg)) {
		PyErr_Format(PyExc_TypeError, "%s must be an int, not %.200s",
		             what, Py_TYPE(arg)->tp_name);
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
			             "%s must not be negative: %R", what, arg);
		else
			PyErr_Format(PyExc_OverflowError,
			             "%s %R does not fit 64 bits", what, arg);
		return -1;
	}
	*out = v;
	return 0;
}

static int
handle_of(PyObject *arg, speedups_handle *out)
{
	unsigned long long v;
	if (unsigned_of(arg, "handle", &v) < 0)
		return -1;
	*out = (speedups_handle)v;
	return 0;
}

static PyObject *
speedups_retain(PyObject *module, PyObject *arg)
{
	(void)module;
	speedups_handle h;
	if (handle_of(arg, &h) < 0)
		return NULL;
	if (fn_retain == NULL) {
		PyErr_SetString(PyExc_RuntimeError,
		                "cusafe._speedups.init() has not been called");
		return NULL;
	}
	return PyLong_FromLong(fn_retain(h));
}

/* A release without the GIL: it may be the last, whose destruction may
 * wait for queued work or take the GIL (see the top of this file).  -1
 * before init(). */
static int
release_now(int kind, speedups_handle h)
{
	speedups_handle_fn fn = fn_releases[kind];
	int st;
	if (fn == NULL)
		return -1;
	Py_BEGIN_ALLOW_THREADS
	st = fn(h);
	Py_END_ALLOW_THREADS
	return st;
}

static PyObject *
no_init(void)
{
	PyErr_SetString(PyExc_RuntimeError,
	                "cusafe._speedups.init() has not been called");
	return NULL;
}

static PyObject *
speedups_release(PyObject *module, PyObject *arg)
{
	(void)module;
	speedups_handle h;
	if (handle_of(arg, &h) < 0)
		return NULL;
	int st = release_now(KIND_ANY, h);
	return st < 0 ? no_init() : PyLong_FromLong(st);
}

/* The package's retain_handle and release_handle, whose ctypes twins
 * (set by handle_functions()) run every call this one does not make
 * itself: a handle that is not an exact int of 64 bits (they convert or
 * explain it), and any call before init().  A failed status raises the
 * library's error (py_check), as the twins do. */
static PyObject *py_retain_handle, *py_release_handle;

static PyObject *
handle_by_python(PyObject *fn, PyObject *const *args, Py_ssize_t nargs,
                 PyObject *kwnames)
{
	if (fn == NULL) {
		PyErr_SetString(PyExc_RuntimeError,
		                "cusafe._speedups.handle_functions() has not "
		                "been called");
		return NULL;
	}
	/* Held through the call, which may run handle_functions(). */
	Py_INCREF(fn);
	PyObject *r = PyObject_Vectorcall(fn, args, (size_t)nargs, kwnames);
	Py_DECREF(fn);
	return r;
}

/* The value of an exact int in 0..2**64-1, the one positional argument
 * of a call; 0 (no error set) where the ctypes twin must take the call. */
static int
exact_handle(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
             speedups_handle *out)
{
	if (nargs != 1 || kwnames != NULL ||
	    !PyLong_CheckExact(args[0]))
		return 0;
	unsigned long long v = PyLong_AsUnsignedLongLong(args[0]);
	if (v == (unsigned long long)-1 && PyErr_Occurred()) {
		PyErr_Clear(); /* negative or too big: the twin explains */
		return 0;
	}
	*out = (speedups_handle)v;
	return 1;
}

static PyObject *
speedups_retain_handle(PyObject *module, PyObject *const *args,
                       Py_ssize_t nargs, PyObject *kwnames)
{
	(void)module;
	speedups_handle h;
	if (fn_retain == NULL || !exact_handle(args, nargs, kwnames, &h))
		return handle_by_python(py_retain_handle, args, nargs,
		                        kwnames);
	int st = fn_retain(h);
	if (st != 0)
		return raise_status(st);
	Py_RETURN_NONE;
}

static PyObject *
speedups_release_handle(PyObject *module, PyObject *const *args,
                        Py_ssize_t nargs, PyObject *kwnames)
{
	(void)module;
	speedups_handle h;
	if (fn_releases[KIND_ANY] == NULL ||
	    !exact_handle(args, nargs, kwnames, &h))
		return handle_by_python(py_release_handle, args, nargs,
		                        kwnames);
	int st = release_now(KIND_ANY, h);
	if (st != 0)
		return raise_status(st);
	Py_RETURN_NONE;
}

static PyObject *
speedups_handle_functions(PyObject *module, PyObject *const *args,
                          Py_ssize_t nargs)
{
	(void)module;
	if (nargs != 2 || !PyCallable_Check(args[0]) ||
	    !PyCallable_Check(args[1])) {
		PyErr_SetString(PyExc_TypeError,
		                "handle_functions() takes two callables: "
		                "retain_handle and release_handle");
		return NULL;
	}
	Py_INCREF(args[0]);
	Py_XSETREF(py_retain_handle, args[0]);
	Py_INCREF(args[1]);
	Py_XSETREF(py_release_handle, args[1]);
	Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------
 * Object: one owned reference on a handle
 * ------------------------------------------------------------------------
 *
 * The base of the package's owning classes.  `live` holds the handle while
 * the object owns its reference; taking it out (one atomic exchange) is
 * what releases it, once, whichever of close(), detach() and the
 * collector comes first.  `handle` stays, for repr and equality.  The
 * package's classes add no finalizer: this type's deallocation releases.
 */
typedef struct {
	PyObject_HEAD
	speedups_handle handle;
	speedups_handle live;
	int kind;
	PyObject *weakrefs;
} speedups_object;

/* A Buffer's size and memory kind, which Context.alloc sets. */
typedef struct {
	speedups_object base;
	unsigned long long size;
	int memory;
} speedups_buffer;

static speedups_handle
take(speedups_object *self)
{
	return __atomic_exchange_n(&self->live, 0, __ATOMIC_ACQ_REL);
}

/* The class's name as Python shows it (type(self).__name__). */
static const char *
type_name(PyObject *self)
{
	const char *name = Py_TYPE(self)->tp_name;
	const char *dot = strrchr(name, '.');
	return dot ? dot + 1 : name;
}

static PyObject *
closed_error(PyObject *self)
{
	PyErr_Format(PyExc_ValueError, "this cusafe.%s is closed",
	             type_name(self));
	return NULL;
}

static void
object_dealloc(PyObject *op)
{
	speedups_object *self = (speedups_object *)op;
	speedups_handle h = take(self);
	if (h && !exiting) {
		/* A failure is ignored: after shutdown, or in a forked child,
		 * a release is a no-op anyway.  Whatever exception is being
		 * raised waits: a give-back may run Python code. */
		PyObject *type, *value, *tb;
		PyErr_Fetch(&type, &value, &tb);
		(void)release_now(self->kind, h);
		PyErr_Restore(type, value, tb);
	}
	if (self->weakrefs != NULL)
		PyObject_ClearWeakRefs(op);
	Py_TYPE(op)->tp_free(op);
}

static PyObject *
object_close(PyObject *op, PyObject *unused)
{
	(void)unused;
	speedups_object *self = (speedups_object *)op;
	speedups_handle h = take(self);
	if (!h)
		Py_RETURN_NONE;
	int st = release_now(self->kind, h);
	if (st < 0)
		return no_init();
	if (st)
		return raise_status(st);
	Py_RETURN_NONE;
}

static PyObject *
object_detach(PyObject *op, PyObject *unused)
{
	(void)unused;
	speedups_handle h = take((speedups_object *)op);
	if (!h)
		return closed_error(op);
	return PyLong_FromUnsignedLongLong(h);
}

static PyObject *
object_enter(PyObject *op, PyObject *unused)
{
	(void)unused;
	Py_INCREF(op);
	return op;
}

static PyObject *
object_exit(PyObject *op, PyObject *const *args, Py_ssize_t nargs)
{
	(void)args;
	(void)nargs;
	return object_close(op, NULL);
}

/* _own(handle): takes over one reference on `handle` (an int, or a ctypes
 * c_uint64 of it), released by the class's _release_name. */
static PyObject *
object_own(PyObject *op, PyObject *arg)
{
	speedups_object *self = (speedups_object *)op;
	speedups_handle h;
	PyObject *value = NULL;
	if (!PyLong_Check(arg)) { /* a ctypes value */
		value = PyObject_GetAttrString(arg, "value");
		if (value == NULL)
			return NULL;
		arg = value;
	}
	int bad = handle_of(arg, &h);
	Py_XDECREF(value);
	if (bad)
		return NULL;
	PyObject *name = PyObject_GetAttrString((PyObject *)Py_TYPE(op),
	                                        "_release_name");
	if (name == NULL)
		return NULL;
	const char *text = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name)
	                                         : NULL;
	int kind = -1;
	for (int k = 0; text != NULL && k < KIND_COUNT; k++)
		if (strcmp(text, release_names[k]) == 0)
			kind = k;
	if (kind < 0) {
		if (!PyErr_Occurred())
			PyErr_Format(PyExc_ValueError,
			             "%s._release_name %R is no release function "
			             "of cusafe", type_name(op), name);
		Py_DECREF(name);
		return NULL;
	}
	Py_DECREF(name);
	self->kind = kind;
	self->handle = h;
	self->live = h;
	Py_RETURN_NONE;
}

static PyObject *
object_get_handle(PyObject *op, void *closure)
{
	(void)closure;
	speedups_handle h = ((speedups_object *)op)->live;
	if (!h)
		return closed_error(op);
	return PyLong_FromUnsignedLongLong(h);
}

static PyObject *
object_get_closed(PyObject *op, void *closure)
{
	(void)closure;
	return PyBool_FromLong(((speedups_object *)op)->live == 0);
}

static PyMethodDef object_methods[] = {
	{"close", object_close, METH_NOARGS,
	 "close()\n--\n\n"
	 "Releases the object's reference now (the handle goes stale if it\n"
	 "was the last; parents and queued work keep what they need).\n"
	 "Closing twice is a no-op.  Raises CusafeError only if the library\n"
	 "refuses the release (never after shutdown: releases are no-ops)."},
	{"detach", object_detach, METH_NOARGS,
	 "detach()\n--\n\n"
	 "Gives up ownership: returns the handle, which the caller must\n"
	 "release (release_handle()); the object is closed.  Raises\n"
	 "ValueError if it is closed already."},
	{"__enter__", object_enter, METH_NOARGS,
	 "The object itself: `with` closes it at the end of the block."},
	{"__exit__", (PyCFunction)(void (*)(void))object_exit, METH_FASTCALL,
	 "close(); exceptions of the block propagate."},
	{"_own", object_own, METH_O,
	 "Takes over one reference on a handle (an int or a c_uint64)."},
	{NULL, NULL, 0, NULL},
};

static PyMemberDef object_members[] = {
	{"_handle", T_ULONGLONG, offsetof(speedups_object, handle), READONLY,
	 "The handle owned (kept after close(), for repr and equality)."},
	{"_live", T_ULONGLONG, offsetof(speedups_object, live), READONLY,
	 "The handle while owned, 0 once closed."},
	{NULL, 0, 0, 0, NULL},
};

static PyGetSetDef object_getset[] = {
	{"handle", object_get_handle, NULL,
	 "The handle, an int.  Raises ValueError once closed.", NULL},
	{"closed", object_get_closed, NULL,
	 "Whether this object has given up its reference (close(),\n"
	 "detach(), the end of a `with` block).", NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject speedups_object_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "cusafe._speedups.Object",
	.tp_basicsize = sizeof(speedups_object),
	.tp_dealloc = object_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "An owned reference on one library handle: the base of the\n"
	          "package's Context, Stream, Event, Buffer, Module, Kernel\n"
	          "and Graph.",
	.tp_weaklistoffset = offsetof(speedups_object, weakrefs),
	.tp_methods = object_methods,
	.tp_members = object_members,
	.tp_getset = object_getset,
};

static PyMemberDef buffer_members[] = {
	{"_size", T_ULONGLONG, offsetof(speedups_buffer, size), 0,
	 "The size in bytes."},
	{"_memory", T_INT, offsetof(speedups_buffer, memory), 0,
	 "The kind of memory (a cusafe_memory)."},
	{NULL, 0, 0, 0, NULL},
};

static PyTypeObject speedups_buffer_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "cusafe._speedups.BufferObject",
	.tp_basicsize = sizeof(speedups_buffer),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "The base of the package's Buffer: an Object with a size\n"
	          "and a memory kind.",
	.tp_members = buffer_members,
};

/* ------------------------------------------------------------------------
 * ContextObject: Context.alloc
 * ------------------------------------------------------------------------ */

/* The memory kind alloc() takes: what the package's kinds dict maps
 * (Memory members, their ints; an exact int of 0..2 is looked up
 * without it).  ValueError for anything else, as the ctypes path. */
static int
memory_kind_of(PyObject *memory, int *out)
{
	if (PyLong_CheckExact(memory)) {
		long v = PyLong_AsLong(memory);
		if (v >= 0 && v <= 2) {
			*out = (int)v;
			return 0;
		}
		PyErr_Clear();
	}
	if (py_kinds == NULL) {
		PyErr_SetString(PyExc_RuntimeError,
		                "cusafe._speedups.setup() has not been called");
		return -1;
	}
	PyObject *kind = PyDict_GetItemWithError(py_kinds, memory);
	if (kind == NULL) {
		if (!PyErr_Occurred())
			PyErr_Format(PyExc_ValueError, "unknown memory kind %R",
			             memory);
		return -1;
	}
	*out = (int)PyLong_AsLong(kind);
	return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* A size: an exact int in 0..2**64-1 here; anything else goes through
 * the package's _count, which converts (__index__) or explains. */
static int
size_of(PyObject *size, unsigned long long *out)
{
	if (PyLong_CheckExact(size)) {
		unsigned long long v = PyLong_AsUnsignedLongLong(size);
		if (!(v == (unsigned long long)-1 && PyErr_Occurred())) {
			*out = v;
			return 0;
		}
		PyErr_Clear();
	}
	if (py_count == NULL) {
		PyErr_SetString(PyExc_RuntimeError,
		                "cusafe._speedups.setup() has not been called");
		return -1;
	}
	PyObject *fn = py_count; /* held: the call may run setup() */
	Py_INCREF(fn);
	PyObject *n = PyObject_CallFunction(fn, "Os", size, "size");
	Py_DECREF(fn);
	if (n == NULL)
		return -1;
	*out = PyLong_AsUnsignedLongLong(n);
	Py_DECREF(n);
	return *out == (unsigned long long)-1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *
context_alloc(PyObject *op, PyObject *const *args, Py_ssize_t nargs,
              PyObject *kwnames)
{
	speedups_object *self = (speedups_object *)op;
	PyObject *size = NULL, *memory = NULL;
	Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
	if (nargs > 2) {
		PyErr_Format(PyExc_TypeError,
		             "Context.alloc() takes from 2 to 3 positional "
		             "arguments but %zd were given", nargs + 1);
		return NULL;
	}
	if (nargs > 0)
		size = args[0];
	if (nargs > 1)
		memory = args[1];
	for (Py_ssize_t i = 0; i < nkw; i++) {
		PyObject *key = PyTuple_GET_ITEM(kwnames, i);
		PyObject **slot = NULL;
		if (PyUnicode_CompareWithASCIIString(key, "size") == 0)
			slot = &size;
		else if (PyUnicode_CompareWithASCIIString(key, "memory") == 0)
			slot = &memory;
		if (slot == NULL) {
			PyErr_Format(PyExc_TypeError,
			             "Context.alloc() got an unexpected keyword "
			             "argument '%U'", key);
			return NULL;
		}
		if (*slot != NULL) {
			PyErr_Format(PyExc_TypeError,
			             "Context.alloc() got multiple values for "
			             "argument '%U'", key);
			return NULL;
		}
		*slot = args[nargs + i];
	}
	if (size == NULL) {
		PyErr_SetString(PyExc_TypeError,
		                "Context.alloc() missing 1 required positional "
		                "argument: 'size'");
		return NULL;
	}
	/* The checks of the ctypes path, in its order: kind, size, then the
	 * library's. */
	int kind = MEMORY_DEVICE;
	if (memory != NULL && memory_kind_of(memory, &kind) < 0)
		return NULL;
	unsigned long long nbytes;
	if (size_of(size, &nbytes) < 0)
		return NULL;
	if (fn_alloc == NULL)
		return no_init();
	if (py_buffer_type == NULL)
		return raise_status(-1);
	speedups_handle out = 0;
	int st;
	if (kind == MEMORY_DEVICE) {
		st = fn_alloc(&out, self->live, kind, (size_t)nbytes);
	} else {
		Py_BEGIN_ALLOW_THREADS
		st = fn_alloc(&out, self->live, kind, (size_t)nbytes);
		Py_END_ALLOW_THREADS
	}
	if (st) {
		/* A closed Context was passed as 0: ValueError, as every
		 * method of a closed object. */
		if (self->live == 0)
			return closed_error(op);
		return raise_status(st);
	}
	PyObject *obj = py_buffer_type->tp_alloc(py_buffer_type, 0);
	if (obj == NULL) {
		(void)release_now(KIND_BUFFER, out);
		return NULL;
	}
	speedups_buffer *b = (speedups_buffer *)obj;
	b->base.handle = b->base.live = out;
	b->base.kind = KIND_BUFFER;
	b->size = nbytes;
	b->memory = kind;
	return obj;
}

static PyMethodDef context_methods[] = {
	{"alloc", (PyCFunction)(void (*)(void))context_alloc,
	 METH_FASTCALL | METH_KEYWORDS,
	 "alloc(size, memory=Memory.DEVICE)\n--\n\n"
	 "A new Buffer of `size` bytes of `memory` in this context, which\n"
	 "the caller owns (Buffer(ctx, size, memory), by the shortest path).\n"
	 "Device memory is ordered on the context's default stream.  Raises\n"
	 "ValueError for a closed Context, a negative size or an unknown\n"
	 "memory kind, TypeError for a size that is not an int,\n"
	 "OverflowError for one beyond 64 bits, CusafeError OUT_OF_MEMORY\n"
	 "when the device (or host) has no room, NOT_SUPPORTED for managed\n"
	 "memory on a device without it."},
	{NULL, NULL, 0, NULL},
};

static PyTypeObject speedups_context_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "cusafe._speedups.ContextObject",
	.tp_basicsize = sizeof(speedups_object),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "The base of the package's Context: an Object with alloc().",
	.tp_methods = context_methods,
};

/* ------------------------------------------------------------------------
 * KernelObject: Kernel.launch
 * ------------------------------------------------------------------------
 *
 * A launch of the common cases -- grid and block as ints or tuples or
 * lists of 1 to 3 ints, `shared` an int, `stream` a Stream or None,
 * Hopper's attributes as bools, a cluster as a grid and a priority of 32
 * bits, and arguments that are Buffers, ints, floats, the typed scalars
 * with values of their own type in range, Bytes, or other libraries'
 * arrays (wrapped by the package's Buffer.wrap) -- is converted here and
 * queued by one call of cusafe_kernel_launch (cusafe_kernel_launch_ex
 * with attributes), with the GIL held (a launch queues; it waits for
 * nothing).  Anything else (values that must be converted or refused,
 * keywords given otherwise) goes to the ctypes path from the start, which
 * converts or raises: one behaviour, and the ctypes path's messages.
 */

/* The result of a conversion that cannot go on here: the ctypes path
 * runs the launch instead. */
#define FALLBACK 1
/* An argument of a type of its own: another library's array, or an
 * error (see wrap_foreign). */
#define FOREIGN 2

/* A dimension in 0..2**32-1 (the library checks >= 1). */
static int
dim_of(PyObject *v, uint32_t *out)
{
	if (!PyLong_CheckExact(v))
		return FALLBACK;
	int overflow;
	long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
	if (overflow || n < 0 || n > (long long)UINT32_MAX) {
		PyErr_Clear();
		return FALLBACK;
	}
	*out = (uint32_t)n;
	return 0;
}

/* A grid or block: an int, or a tuple or list of 1 to 3 ints. */
static int
dims_of(PyObject *v, uint32_t out[3])
{
	out[0] = out[1] = out[2] = 1;
	if (PyLong_CheckExact(v))
		return dim_of(v, &out[0]);
	if (!PyTuple_CheckExact(v) && !PyList_CheckExact(v))
		return FALLBACK;
	Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
	if (n < 1 || n > 3)
		return FALLBACK;
	PyObject **items = PySequence_Fast_ITEMS(v);
	for (Py_ssize_t i = 0; i < n; i++)
		if (dim_of(items[i], &out[i]))
			return FALLBACK;
	return 0;
}

/* The value of a typed scalar, in range, into *arg; FALLBACK for a value
 * of another type (the ctypes path converts it, or says why not) or out
 * of range (it raises). */
static int
scalar_of(PyObject *a, int kind, speedups_arg *arg)
{
	PyObject *v = PyObject_GetAttrString(a, "value");
	if (v == NULL) {
		PyErr_Clear();
		return FALLBACK;
	}
	int r = FALLBACK;
	arg->kind = (uint32_t)kind;
	if (kind == ARG_F32 || kind == ARG_F64) {
		if (PyFloat_CheckExact(v)) {
			double d = PyFloat_AS_DOUBLE(v);
			if (kind == ARG_F64) {
				arg->value.f64 = d;
				r = 0;
			} else {
				/* As struct's "f": finite, but rounds to
				 * infinity, is refused. */
				float f = (float)d;
				if (!(isinf(f) && !isinf(d))) {
					arg->value.u = 0;
					arg->value.f32 = f;
					r = 0;
				}
			}
		}
	} else if (PyLong_CheckExact(v)) {
		static const struct {
			long long lo;
			unsigned long long hi;
		} range[] = {
			[ARG_I8] = {INT8_MIN, INT8_MAX},
			[ARG_U8] = {0, UINT8_MAX},
			[ARG_I16] = {INT16_MIN, INT16_MAX},
			[ARG_U16] = {0, UINT16_MAX},
			[ARG_I32] = {INT32_MIN, INT32_MAX},
			[ARG_U32] = {0, UINT32_MAX},
			[ARG_I64] = {INT64_MIN, INT64_MAX},
			[ARG_U64] = {0, UINT64_MAX},
		};
		int overflow;
		long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
		if (overflow == 0 && !(n == -1 && PyErr_Occurred())) {
			if (n >= range[kind].lo &&
			    (n < 0 || (unsigned long long)n <= range[kind].hi)) {
				arg->value.i = n; /* signed: sign-extended */
				r = 0;
			}
		} else if (overflow > 0 && kind == ARG_U64) {
			unsigned long long u = PyLong_AsUnsignedLongLong(v);
			if (!(u == (unsigned long long)-1 && PyErr_Occurred())) {
				arg->value.u = u;
				r = 0;
			}
		}
		PyErr_Clear();
	}
	Py_DECREF(v);
	return r;
}

/* The cusafe_arg of one argument; FALLBACK where the ctypes path must
 * convert it, FOREIGN for an object of another type (perhaps another
 * library's array: see wrap_foreign); -1 with ValueError for a closed
 * Buffer (as the ctypes path: its handle is read first).  The bytes of a
 * Bytes argument are held in the list *keep (made on first use), which
 * the caller drops after the launch: Python code that runs before it
 * (another array's wrap) may replace the Bytes object's data. */
static int
arg_of(PyObject *a, speedups_arg *arg, PyObject **keep)
{
	PyTypeObject *t = Py_TYPE(a);
	arg->size = 0;
	if (t == py_buffer_type || PyType_IsSubtype(t, py_buffer_type)) {
		speedups_handle h = ((speedups_object *)a)->live;
		if (!h) {
			closed_error(a);
			return -1;
		}
		arg->kind = ARG_BUFFER;
		arg->value.buffer = h;
		return 0;
	}
	if (t == &PyLong_Type) {
		int overflow;
		long long n = PyLong_AsLongLongAndOverflow(a, &overflow);
		if (overflow)
			return FALLBACK; /* OverflowError, there */
		arg->kind = ARG_I64;
		arg->value.i = n;
		return 0;
	}
	if (t == &PyFloat_Type) {
		arg->kind = ARG_F64;
		arg->value.f64 = PyFloat_AS_DOUBLE(a);
		return 0;
	}
	for (int k = ARG_I8; k <= ARG_F64; k++)
		if (t == py_scalar_types[k - ARG_I8])
			return scalar_of(a, k, arg);
	if (t == py_bytes_type) {
		PyObject *data = PyObject_GetAttrString(a, "data");
		if (data == NULL) {
			PyErr_Clear();
			return FALLBACK;
		}
		int r = FALLBACK;
		if (PyBytes_CheckExact(data) &&
		    PyBytes_GET_SIZE(data) <= (Py_ssize_t)UINT32_MAX) {
			if (*keep == NULL && (*keep = PyList_New(0)) == NULL) {
				Py_DECREF(data);
				return -1;
			}
			if (PyList_Append(*keep, data) < 0) {
				Py_DECREF(data);
				return -1;
			}
			arg->kind = ARG_BYTES;
			arg->size = (uint32_t)PyBytes_GET_SIZE(data);
			arg->value.bytes = PyBytes_AS_STRING(data);
			r = 0;
		}
		Py_DECREF(data);
		return r;
	}
	if (t == &PyBool_Type)
		return FALLBACK; /* TypeError, there */
	return FOREIGN;
}

/* The arguments that arg_of found FOREIGN (kind 0), in `cargs`, each
 * another library's array, wrapped for the launch on `stream` (None: the
 * default) in the order of the arguments, as the ctypes path wraps them:
 * their Buffers go into the new list *wrapped, which the caller drops
 * after the launch (its queued work holds the memory then).  FALLBACK,
 * before any is wrapped, where one is no array; -1 where a wrap fails. */
static int
wrap_foreign(PyObject *const *args, speedups_arg *cargs, size_t n,
             PyObject *stream, PyObject **wrapped)
{
	*wrapped = NULL;
	if (py_foreign == NULL || py_wrap == NULL)
		return FALLBACK;
	for (size_t i = 0; i < n; i++) {
		if (cargs[i].kind != 0)
			continue;
		PyObject *fn = py_foreign; /* held: it may run setup() */
		Py_INCREF(fn);
		PyObject *yes = PyObject_CallFunctionObjArgs(fn, args[i], NULL);
		Py_DECREF(fn);
		if (yes == NULL)
			return -1;
		int is = PyObject_IsTrue(yes);
		Py_DECREF(yes);
		if (is <= 0)
			return is < 0 ? -1 : FALLBACK;
	}
	PyObject *list = PyList_New(0);
	if (list == NULL)
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (cargs[i].kind != 0)
			continue;
		PyObject *fn = py_wrap; /* held: it may run setup() */
		Py_INCREF(fn);
		PyObject *buf = PyObject_CallFunctionObjArgs(
			fn, args[i], stream ? stream : Py_None, NULL);
		Py_DECREF(fn);
		if (buf == NULL || PyList_Append(list, buf) < 0) {
			Py_XDECREF(buf);
			Py_DECREF(list);
			return -1;
		}
		Py_DECREF(buf);
		if (!PyObject_TypeCheck(buf, py_buffer_type) ||
		    ((speedups_object *)buf)->live == 0) {
			Py_DECREF(list);
			PyErr_SetString(PyExc_SystemError,
			                "cusafe: wrap() made no open Buffer");
			return -1;
		}
		cargs[i].kind = ARG_BUFFER;
		cargs[i].value.buffer = ((speedups_object *)buf)->live;
	}
	*wrapped = list;
	return 0;
}

/* The configuration of a launch; FALLBACK as arg_of, -1 with
 * ValueError for a closed Stream. */
static int
config_of(PyObject *grid, PyObject *block, PyObject *shared,
          PyObject *stream, speedups_config *config)
{
	if (dims_of(grid, config->grid) || dims_of(block, config->block))
		return FALLBACK;
	config->shared_memory = 0;
	if (shared != NULL) {
		if (!PyLong_CheckExact(shared))
			return FALLBACK;
		unsigned long long n = PyLong_AsUnsignedLongLong(shared);
		if (n == (unsigned long long)-1 && PyErr_Occurred()) {
			PyErr_Clear();
			return FALLBACK;
		}
		config->shared_memory = (size_t)n;
	}
	config->stream = 0;
	if (stream != NULL && stream != Py_None) {
		if (py_stream_type == NULL ||
		    !PyObject_TypeCheck(stream, py_stream_type))
			return FALLBACK;
		config->stream = ((speedups_object *)stream)->live;
		if (!config->stream) {
			closed_error(stream);
			return -1;
		}
	}
	return 0;
}

/* Raises for a failed launch: ValueError for a closed Kernel (passed as
 * 0), else the library's error. */
static PyObject *
launch_failed(PyObject *kernel, int status)
{
	if (((speedups_object *)kernel)->live == 0)
		return closed_error(kernel);
	return raise_status(status);
}

/* Hopper's keyword arguments, as Kernel.launch was given them (NULL: not
 * given). */
typedef struct {
	PyObject *cluster, *cooperative, *programmatic, *priority;
} launch_keywords;

/* A flag of Kernel.launch: a bool, or FALLBACK (the ctypes path raises
 * TypeError). */
static int
flag_of(PyObject *v, int *out)
{
	*out = 0;
	if (v == NULL || v == Py_False)
		return 0;
	if (v == Py_True) {
		*out = 1;
		return 0;
	}
	return FALLBACK;
}

/* The cusafe_launch_attr array of the keywords, in the ctypes path's
 * order (_launch_attrs): the cluster (and NON_PORTABLE_CLUSTER for more
 * than 8 blocks), cooperative, programmatic serialization, priority.
 * FALLBACK for any value that the ctypes path must convert or refuse;
 * the library checks the rest. */
static int
attrs_of(const launch_keywords *kw, speedups_attr attrs[ATTR_MAX],
         size_t *count)
{
	int cooperative, programmatic;
	size_t n = 0;
	*count = 0;
	if (flag_of(kw->cooperative, &cooperative) ||
	    flag_of(kw->programmatic, &programmatic))
		return FALLBACK;
	memset(attrs, 0, ATTR_MAX * sizeof *attrs);
	if (kw->cluster != NULL && kw->cluster != Py_None) {
		uint32_t *dim = attrs[n].value.dim;
		if (dims_of(kw->cluster, dim))
			return FALLBACK;
		attrs[n++].id = ATTR_CLUSTER;
		/* Each factor below 2**32: no overflow in 64 bits until the
		 * product has passed 8. */
		uint64_t blocks = (uint64_t)dim[0] * dim[1];
		if (blocks <= 8)
			blocks *= dim[2];
		if (blocks > 8) {
			attrs[n].id = ATTR_NON_PORTABLE_CLUSTER;
			attrs[n++].value.flag = 1;
		}
	}
	if (cooperative) {
		attrs[n].id = ATTR_COOPERATIVE;
		attrs[n++].value.flag = 1;
	}
	if (programmatic) {
		attrs[n].id = ATTR_PROGRAMMATIC_SERIALIZATION;
		attrs[n++].value.flag = 1;
	}
	if (kw->priority != NULL && kw->priority != Py_None) {
		if (!PyLong_CheckExact(kw->priority))
			return FALLBACK; /* bool, or converted there */
		int overflow;
		long long p = PyLong_AsLongLongAndOverflow(kw->priority,
		                                          &overflow);
		if (overflow || p < INT32_MIN || p > INT32_MAX) {
			PyErr_Clear();
			return FALLBACK;
		}
		attrs[n].id = ATTR_PRIORITY;
		attrs[n++].value.priority = (int32_t)p;
	}
	*count = n;
	return 0;
}

#define STACK_ARGS 16

/* Calls the ctypes Kernel.launch with the same arguments: it converts,
 * or raises its own error. */
static PyObject *
launch_by_ctypes(PyObject *op, PyObject *const *args, Py_ssize_t nargs,
                 PyObject *kwnames)
{
	if (py_launch == NULL)
		return raise_status(-1);
	/* The ctypes path, with self as its first argument. */
	PyObject *stack_call[STACK_ARGS + 8];
	PyObject **call = stack_call;
	size_t nkw = kwnames ? (size_t)PyTuple_GET_SIZE(kwnames) : 0;
	size_t total = (size_t)nargs + nkw;
	if (total + 1 > sizeof stack_call / sizeof stack_call[0]) {
		call = PyMem_Malloc((total + 1) * sizeof *call);
		if (call == NULL)
			return PyErr_NoMemory();
	}
	call[0] = op;
	for (size_t i = 0; i < total; i++)
		call[i + 1] = args[i];
	PyObject *fn = py_launch; /* held: the call may run setup() */
	Py_INCREF(fn);
	PyObject *res = PyObject_Vectorcall(fn, call, (size_t)nargs + 1,
	                                    kwnames);
	Py_DECREF(fn);
	if (call != stack_call)
		PyMem_Free(call);
	return res;
}

static PyObject *
kernel_launch(PyObject *op, PyObject *const *args, size_t nargsf,
              PyObject *kwnames)
{
	speedups_object *self = (speedups_object *)op;
	Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
	PyObject *shared = NULL, *stream = NULL;
	launch_keywords kw = {NULL, NULL, NULL, NULL};
	Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
	int r = nargs < 2 || fn_launch == NULL || fn_launch_ex == NULL ||
	                py_buffer_type == NULL
	        ? FALLBACK : 0;
	for (Py_ssize_t i = 0; r == 0 && i < nkw; i++) {
		static const char *const names[] = {
			"shared", "stream", "cluster", "cooperative",
			"programmatic_serialization", "priority"};
		PyObject **slots[] = {&shared, &stream, &kw.cluster,
		                      &kw.cooperative, &kw.programmatic,
		                      &kw.priority};
		PyObject *key = PyTuple_GET_ITEM(kwnames, i);
		size_t k = 0;
		while (k < sizeof names / sizeof names[0] &&
		       PyUnicode_CompareWithASCIIString(key, names[k]) != 0)
			k++;
		if (k < sizeof names / sizeof names[0])
			*slots[k] = args[nargs + i];
		else
			r = FALLBACK; /* an error, there */
	}
	/* The ctypes path's order: the attributes, the configuration, then
	 * the arguments. */
	speedups_attr attrs[ATTR_MAX];
	size_t nattrs = 0;
	if (r == 0 && (kw.cluster || kw.cooperative || kw.programmatic ||
	               kw.priority))
		r = attrs_of(&kw, attrs, &nattrs);
	speedups_config config;
	if (r == 0)
		r = config_of(args[0], args[1], shared, stream, &config);
	speedups_arg stack[STACK_ARGS], *cargs = stack;
	size_t n = nargs >= 2 ? (size_t)(nargs - 2) : 0;
	if (r == 0 && n > STACK_ARGS) {
		cargs = PyMem_Malloc(n * sizeof *cargs);
		if (cargs == NULL) {
			PyErr_NoMemory();
			r = -1;
		}
	}
	size_t foreign = 0;
	PyObject *keep = NULL; /* the bytes of Bytes arguments */
	for (size_t i = 0; r == 0 && i < n; i++) {
		r = arg_of(args[2 + i], &cargs[i], &keep);
		if (r == FOREIGN) {
			cargs[i].kind = 0;
			foreign++;
			r = 0;
		} else if (r < 0 && foreign) {
			/* The ctypes path wraps the arrays before it reads
			 * this closed Buffer, or refuses a non-array first. */
			PyErr_Clear();
			r = FALLBACK;
		}
	}
	PyObject *wrapped = NULL;
	if (r == 0 && foreign)
		r = wrap_foreign(args + 2, cargs, n, stream, &wrapped);
	int st = 0;
	if (r == 0 && nattrs == 0)
		st = fn_launch(self->live, &config, n ? cargs : NULL, n);
	else if (r == 0)
		st = fn_launch_ex(self->live, &config, attrs, nattrs,
		                  n ? cargs : NULL, n);
	if (cargs != stack)
		PyMem_Free(cargs);
	/* The launch's queued work holds the wrapped memory now, and the
	 * launch copied the bytes. */
	Py_XDECREF(wrapped);
	Py_XDECREF(keep);
	if (r < 0)
		return NULL;
	if (r == FALLBACK)
		return launch_by_ctypes(op, args, nargs, kwnames);
	if (st)
		return launch_failed(op, st);
	Py_RETURN_NONE;
}

static PyMethodDef kernel_methods[] = {
	{"launch", (PyCFunction)(void (*)(void))kernel_launch,
	 METH_FASTCALL | METH_KEYWORDS,
	 "launch(grid, block, *args, shared=0, stream=None, cluster=None,\n"
	 "       cooperative=False, programmatic_serialization=False,\n"
	 "       priority=None)\n--\n\n"
	 "Launches the kernel: grid and block are ints or tuples of up to 3\n"
	 "ints; args are Buffers (passed as their device address), arrays of\n"
	 "other libraries (objects with __dlpack__ or\n"
	 "__cuda_array_interface__), wrapped for the launch, ints (I64),\n"
	 "floats (F64), typed values (I32(...), F32(...), ...) or\n"
	 "Bytes(...).  Ordered on `stream` (None: the context's default);\n"
	 "the buffers stay alive until the kernel has completed.  Every\n"
	 "argument is checked against the kernel's parameters (CusafeError\n"
	 "INVALID_ARGUMENTS).  A closed Kernel, Buffer or Stream raises\n"
	 "ValueError; see the package's documentation of Kernel.launch for\n"
	 "every error and for Hopper's attributes (cluster, cooperative,\n"
	 "programmatic_serialization, priority).  One C call for the\n"
	 "common arguments and attributes (other libraries' arrays wrapped\n"
	 "through the package's Buffer.wrap); the ctypes path for the\n"
	 "others."},
	{NULL, NULL, 0, NULL},
};

static PyTypeObject speedups_kernel_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "cusafe._speedups.KernelObject",
	.tp_basicsize = sizeof(speedups_object),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "The base of the package's Kernel: an Object with launch().",
	.tp_methods = kernel_methods,
};

/* ------------------------------------------------------------------------
 * PreparedObject: the call of a PreparedLaunch
 * ------------------------------------------------------------------------
 *
 * Kernel.prepare converts and checks in Python, once; _prepare() copies
 * the kernel's handle, the configuration, the attributes and the packed
 * arguments here, and each call is one call of cusafe_kernel_launch (or
 * _ex), with the GIL held.  What the arguments point to (Bytes' data,
 * wrapped arrays) the Python subclass keeps.
 */
typedef struct {
	PyObject_HEAD
	speedups_handle kernel;
	speedups_config config;
	speedups_arg *args;
	size_t nargs;
	speedups_attr *attrs; /* [nattrs], or NULL */
	size_t nattrs;
	int prepared;
} speedups_prepared;

/* A copy of the bytes of a buffer-protocol object (None: *out NULL). */
static int
copy_of(PyObject *obj, const char *what, size_t unit, void **out,
        size_t *count)
{
	*out = NULL;
	*count = 0;
	if (obj == Py_None)
		return 0;
	Py_buffer view;
	if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
		return -1;
	int r = 0;
	if (view.len % (Py_ssize_t)unit) {
		PyErr_Format(PyExc_ValueError, "_prepare(): %s of %zd bytes, not "
		             "a multiple of %zu", what, view.len, unit);
		r = -1;
	} else if (view.len > 0) {
		*out = PyMem_Malloc((size_t)view.len);
		if (*out == NULL) {
			PyErr_NoMemory();
			r = -1;
		} else {
			memcpy(*out, view.buf, (size_t)view.len);
			*count = (size_t)view.len / unit;
		}
	}
	PyBuffer_Release(&view);
	return r;
}

static PyObject *
prepared_prepare(PyObject *op, PyObject *const *args, Py_ssize_t nargs)
{
	speedups_prepared *self = (speedups_prepared *)op;
	if (nargs != 4) {
		PyErr_Format(PyExc_TypeError,
		             "_prepare() takes 4 arguments (%zd given)", nargs);
		return NULL;
	}
	if (self->prepared) {
		PyErr_SetString(PyExc_RuntimeError,
		                "this launch is prepared already");
		return NULL;
	}
	speedups_handle kernel;
	if (handle_of(args[0], &kernel) < 0)
		return NULL;
	Py_buffer view;
	if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
		return NULL;
	if (view.len != (Py_ssize_t)sizeof self->config) {
		PyErr_Format(PyExc_ValueError, "_prepare(): a configuration of "
		             "%zd bytes, not %zu", view.len,
		             sizeof self->config);
		PyBuffer_Release(&view);
		return NULL;
	}
	speedups_config config;
	memcpy(&config, view.buf, sizeof config);
	PyBuffer_Release(&view);
	void *cargs, *attrs;
	size_t n, nattrs;
	if (copy_of(args[2], "arguments", sizeof(speedups_arg), &cargs,
	            &n) < 0)
		return NULL;
	if (copy_of(args[3], "attributes", sizeof(speedups_attr), &attrs,
	            &nattrs) < 0) {
		PyMem_Free(cargs);
		return NULL;
	}
	self->kernel = kernel;
	self->config = config;
	self->args = cargs;
	self->nargs = n;
	self->attrs = attrs;
	self->nattrs = nattrs;
	self->prepared = 1;
	Py_RETURN_NONE;
}

static PyObject *
prepared_call(PyObject *op, PyObject *args, PyObject *kwargs)
{
	speedups_prepared *self = (speedups_prepared *)op;
	if (PyTuple_GET_SIZE(args) != 0 ||
	    (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
		PyErr_Format(PyExc_TypeError, "%s() takes no arguments",
		             type_name(op));
		return NULL;
	}
	if (!self->prepared) {
		PyErr_SetString(PyExc_RuntimeError, "this launch is not prepared");
		return NULL;
	}
	int st;
	if (self->attrs == NULL) {
		if (fn_launch == NULL)
			return no_init();
		st = fn_launch(self->kernel, &self->config, self->args,
		               self->nargs);
	} else {
		if (fn_launch_ex == NULL)
			return no_init();
		st = fn_launch_ex(self->kernel, &self->config, self->attrs,
		                  self->nattrs, self->args, self->nargs);
	}
	if (st)
		return raise_status(st);
	Py_RETURN_NONE;
}

static void
prepared_dealloc(PyObject *op)
{
	speedups_prepared *self = (speedups_prepared *)op;
	PyMem_Free(self->args);
	PyMem_Free(self->attrs);
	Py_TYPE(op)->tp_free(op);
}

static PyMethodDef prepared_methods[] = {
	{"_prepare", (PyCFunction)(void (*)(void))prepared_prepare,
	 METH_FASTCALL,
	 "_prepare(kernel, config, args, attrs, /)\n--\n\n"
	 "Copies the launch: the kernel's handle (an int), a LaunchConfig,\n"
	 "the packed cusafe_arg array (bytes, or None for none) and the\n"
	 "cusafe_launch_attr array (a ctypes array, or None); once."},
	{NULL, NULL, 0, NULL},
};

static PyTypeObject speedups_prepared_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "cusafe._speedups.PreparedObject",
	.tp_basicsize = sizeof(speedups_prepared),
	.tp_dealloc = prepared_dealloc,
	.tp_call = prepared_call,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "The base of the package's PreparedLaunch: calling it\n"
	          "launches, one C call.",
	.tp_methods = prepared_methods,
};

static PyMethodDef speedups_methods[] = {
	{"init", speedups_init, METH_O,
	 "init(addresses, /)\n--\n\n"
	 "Takes the library's function addresses, a dict of name to int\n"
	 "(ctypes.cast(cdll[name], ctypes.c_void_p).value); needs\n"
	 "cusafe_retain and cusafe_release, and takes the types' own\n"
	 "releases and cusafe_buffer_alloc where given.  KeyError for a\n"
	 "missing name,\n"
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
	{"retain_handle",
	 (PyCFunction)(void (*)(void))speedups_retain_handle,
	 METH_FASTCALL | METH_KEYWORDS,
	 "retain_handle(handle)\n--\n\n"
	 "Adds a reference to a live handle (an int) of any type\n"
	 "(cusafe_retain): the caller owns it and must release it\n"
	 "(release_handle).  Raises CusafeError INVALID_HANDLE for a stale or\n"
	 "null handle, SHUTDOWN after shutdown(); TypeError, ValueError or\n"
	 "OverflowError for a value that is not a 64-bit unsigned int."},
	{"release_handle",
	 (PyCFunction)(void (*)(void))speedups_release_handle,
	 METH_FASTCALL | METH_KEYWORDS,
	 "release_handle(handle)\n--\n\n"
	 "Drops one reference of a handle of any type (cusafe_release); the\n"
	 "last one destroys the object once its children and queued work are\n"
	 "gone.  Raises CusafeError INVALID_HANDLE for a stale or forged handle\n"
	 "(a double release is caught, never undefined).  Releasing\n"
	 "NULL_HANDLE (0), and any release after shutdown(), is a no-op.  A\n"
	 "value that is not a 64-bit unsigned int raises TypeError, ValueError\n"
	 "or OverflowError, and releases nothing.  The GIL is released during\n"
	 "the call."},
	{"handle_functions",
	 (PyCFunction)(void (*)(void))speedups_handle_functions, METH_FASTCALL,
	 "handle_functions(retain_handle, release_handle, /)\n--\n\n"
	 "The ctypes retain_handle and release_handle, which run the calls\n"
	 "that retain_handle() and release_handle() here do not make\n"
	 "themselves (a handle that is not an exact int of 64 bits, a call\n"
	 "before init())."},
	{"setup", (PyCFunction)(void (*)(void))speedups_setup,
	 METH_VARARGS | METH_KEYWORDS,
	 "setup(*, check, count, kinds, buffer, stream, scalars, bytes, "
	 "launch,\n      foreign, wrap)\n--\n\n"
	 "What the package gives once its classes exist: check(status)\n"
	 "raises the library's error, count(value, what) converts a size or\n"
	 "raises, kinds maps the memory kinds alloc() takes to their ints,\n"
	 "buffer is the class (a BufferObject) of the Buffers alloc() makes,\n"
	 "stream the class of Streams, scalars the types I8 ... F64, bytes\n"
	 "the class Bytes, launch the ctypes Kernel.launch, which runs every\n"
	 "launch that is not of the common cases, foreign(a) whether a\n"
	 "launch argument is another library's array and wrap(a, stream)\n"
	 "its Buffer for the launch."},
	{"at_exit", speedups_at_exit, METH_NOARGS,
	 "at_exit()\n--\n\n"
	 "From now on a collected Object releases nothing (the package calls\n"
	 "it from Python's exit hooks)."},
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
	/* object's own __new__, so that object.__new__(cls) makes the
	 * package's objects (closed) as it does without the extension. */
	speedups_object_type.tp_new = PyBaseObject_Type.tp_new;
	speedups_buffer_type.tp_base = &speedups_object_type;
	speedups_context_type.tp_base = &speedups_object_type;
	speedups_kernel_type.tp_base = &speedups_object_type;
	speedups_prepared_type.tp_new = PyBaseObject_Type.tp_new;
	if (PyType_Ready(&speedups_object_type) < 0 ||
	    PyType_Ready(&speedups_buffer_type) < 0 ||
	    PyType_Ready(&speedups_context_type) < 0 ||
	    PyType_Ready(&speedups_kernel_type) < 0 ||
	    PyType_Ready(&speedups_prepared_type) < 0)
		return NULL;
	PyObject *m = PyModule_Create(&speedups_module);
	if (m == NULL)
		return NULL;
	static const struct {
		const char *name;
		PyTypeObject *type;
	} types[] = {
		{"Object", &speedups_object_type},
		{"BufferObject", &speedups_buffer_type},
		{"ContextObject", &speedups_context_type},
		{"KernelObject", &speedups_kernel_type},
		{"PreparedObject", &speedups_prepared_type},
	};
	for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
		Py_INCREF(types[i].type);
		if (PyModule_AddObject(m, types[i].name,
		                       (PyObject *)types[i].type) < 0) {
			Py_DECREF(types[i].type);
			Py_DECREF(m);
			return NULL;
		}
	}
	return m;
}
