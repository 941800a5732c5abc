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

/* What the package registers (setup()): Python code for the cold paths,
 * so that both implementations raise the same errors. */
static PyTypeObject speedups_buffer_type;
static PyObject *py_check;   /* check(status): raises the library's error */
static PyObject *py_count;   /* _count(value, what): an int or the error */
static PyObject *py_kinds;   /* {memory kind: int}: what alloc() takes */
static PyTypeObject *py_buffer_type; /* the package's Buffer */

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
	if (address_of(addresses, "cusafe_buffer_alloc", &alloc, 1) < 0)
		return NULL;
	/* ISO C has no function pointer from void *; POSIX (dlsym) does. */
	fn_retain = (speedups_handle_fn)(uintptr_t)retain;
	for (int k = 0; k < KIND_COUNT; k++)
		/* A type's own release where the library has it, else the
		 * generic one, which releases every type. */
		fn_releases[k] = (speedups_handle_fn)(uintptr_t)(
			releases[k] ? releases[k] : releases[KIND_ANY]);
	fn_alloc = (speedups_alloc_fn)(uintptr_t)alloc;
	Py_RETURN_NONE;
}

/* setup(check, count, kinds, buffer): what the package gives once its
 * classes exist; see py_check. */
static PyObject *
speedups_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
	(void)module;
	if (nargs != 4) {
		PyErr_Format(PyExc_TypeError,
		             "setup() takes 4 arguments (%zd given)", nargs);
		return NULL;
	}
	if (!PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
		PyErr_SetString(PyExc_TypeError,
		                "setup(): check and count must be callable");
		return NULL;
	}
	if (!PyDict_Check(args[2])) {
		PyErr_SetString(PyExc_TypeError, "setup(): kinds must be a dict");
		return NULL;
	}
	if (!PyType_Check(args[3]) ||
	    !PyType_IsSubtype((PyTypeObject *)args[3], &speedups_buffer_type)) {
		PyErr_SetString(PyExc_TypeError,
		                "setup(): buffer must be a subclass of "
		                "cusafe._speedups.BufferObject");
		return NULL;
	}
	Py_INCREF(args[0]);
	Py_XSETREF(py_check, args[0]);
	Py_INCREF(args[1]);
	Py_XSETREF(py_count, args[1]);
	Py_INCREF(args[2]);
	Py_XSETREF(py_kinds, args[2]);
	Py_INCREF(args[3]);
	Py_XSETREF(py_buffer_type, (PyTypeObject *)args[3]);
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
	PyObject *r = PyObject_CallFunction(py_check, "i", status);
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
	PyObject *n = PyObject_CallFunction(py_count, "Os", size, "size");
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
		             "alloc() takes from 1 to 2 positional arguments but "
		             "%zd were given", nargs);
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
			             "alloc() got an unexpected keyword argument "
			             "'%U'", key);
			return NULL;
		}
		if (*slot != NULL) {
			PyErr_Format(PyExc_TypeError,
			             "alloc() got multiple values for argument '%U'",
			             key);
			return NULL;
		}
		*slot = args[nargs + i];
	}
	if (size == NULL) {
		PyErr_SetString(PyExc_TypeError,
		                "alloc() missing 1 required positional argument: "
		                "'size'");
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
	{"setup", (PyCFunction)(void (*)(void))speedups_setup, METH_FASTCALL,
	 "setup(check, count, kinds, buffer, /)\n--\n\n"
	 "What the package gives once its classes exist: check(status)\n"
	 "raises the library's error, count(value, what) converts a size or\n"
	 "raises, kinds maps the memory kinds alloc() takes to their ints,\n"
	 "buffer is the class (a BufferObject) of the Buffers alloc() makes."},
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
	if (PyType_Ready(&speedups_object_type) < 0 ||
	    PyType_Ready(&speedups_buffer_type) < 0 ||
	    PyType_Ready(&speedups_context_type) < 0)
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
