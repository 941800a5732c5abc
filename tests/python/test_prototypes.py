"""The ctypes prototypes of the package against the C headers: every
function of include/cusafe.h and include/cusafe_dlpack.h is bound, with
the C types of its return value and of each parameter, and the library
exports it (those of cusafe_dlpack.h only where it was built with DLPack).
Struct layouts are compared with the C compiler's by tests/exit-python.sh
("layout")."""

import ctypes
import os
import re

import cusafe
from cusafe import _capi

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.join(HERE, os.pardir, os.pardir, "include")

HANDLES = {"cusafe_handle", "cusafe_context", "cusafe_stream",
           "cusafe_event", "cusafe_buffer", "cusafe_module",
           "cusafe_kernel", "cusafe_graph"}
ENUMS = {"cusafe_status", "cusafe_handle_type", "cusafe_memory",
         "cusafe_arg_kind"}
STRUCTS = {"cusafe_device_properties": cusafe.DeviceProperties,
           "cusafe_arg": cusafe.Arg,
           "cusafe_launch_config": cusafe.LaunchConfig,
           "cusafe_launch_attr": _capi.LaunchAttr,
           "cusafe_ipc_desc": _capi.IpcDesc,
           "DLDataType": _capi._DLDataType}
# Types passed as opaque addresses (void *) by the binding.
OPAQUE = {"void", "cusafe_release_fn", "DLManagedTensorVersioned",
          "DLManagedTensor"}
SCALARS = {"int": ctypes.c_int, "unsigned": ctypes.c_uint,
           "unsigned int": ctypes.c_uint, "size_t": ctypes.c_size_t,
           "uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32,
           "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
           "float": ctypes.c_float, "unsigned char": ctypes.c_ubyte,
           "uint8_t": ctypes.c_uint8}


def declarations():
    """{name: (return type, [parameter types])} of the CUSAFE_API
    functions of both headers, as C text without names."""
    text = ""
    for header in ("cusafe.h", "cusafe_dlpack.h"):
        with open(os.path.join(INCLUDE, header)) as f:
            text += f.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"^\s*#.*?(?<!\\)$", " ", text, flags=re.S | re.M)
    out = {}
    for m in re.finditer(r"CUSAFE_API\s+([^;()]*?)\b(cusafe_\w+)\s*"
                         r"\(([^)]*)\)", text):
        ret, name, params = m.group(1), m.group(2), m.group(3).strip()
        types = []
        if params not in ("", "void"):
            for p in params.split(","):
                p = " ".join(p.split())
                # Drop the parameter's name: the last identifier.
                p = re.sub(r"\b\w+$", "", p).strip()
                types.append(p)
        out[name] = (" ".join(ret.split()), types)
    return out


def ctype_of(c):
    """The ctypes type that the C type `c` must be bound as; a tuple lists
    the accepted alternatives."""
    c = c.replace("const ", "").strip()
    stars = c.count("*")
    base = c.replace("*", "").strip()
    if stars == 0:
        if base in HANDLES:
            return ctypes.c_uint64
        if base in ENUMS:
            return ctypes.c_int
        if base in STRUCTS:
            return STRUCTS[base]
        if base == "void":
            return None
        if base == "cusafe_release_fn":
            return ctypes.c_void_p
        return SCALARS[base]
    if stars == 1 and base == "char":
        return ctypes.c_char_p
    if base in OPAQUE and stars == 1:
        return ctypes.c_void_p
    if stars == 2 and base in OPAQUE:
        return ctypes.POINTER(ctypes.c_void_p)
    if stars == 2 and base == "char":
        return ctypes.POINTER(ctypes.c_char_p)
    inner = ctype_of(base + "*" * (stars - 1))
    return ctypes.POINTER(inner)


def test_every_function_bound_with_its_types():
    decls = declarations()
    assert len(decls) >= 65, len(decls)
    bound = _capi._PROTOTYPES
    assert sorted(set(decls) - set(bound)) == []
    assert sorted(set(bound) - set(decls)) == []
    problems = []
    for name, (ret, params) in sorted(decls.items()):
        restype, argtypes = bound[name]
        want = ctype_of(ret)
        if restype is not want:
            problems.append("%s returns %s, bound as %s" % (name, ret,
                                                          restype))
        if len(argtypes) != len(params):
            problems.append("%s takes %d parameters, bound with %d"
                            % (name, len(params), len(argtypes)))
            continue
        for i, (c, got) in enumerate(zip(params, argtypes)):
            if got is not ctype_of(c):
                problems.append("%s parameter %d is %s, bound as %s"
                                % (name, i, c, got))
    assert problems == []


def test_the_library_exports_them():
    lib = cusafe.library()
    dlpack = {n for n in declarations() if "dlpack" in n}
    assert set(lib.missing) <= dlpack
    if "cusafe_buffer_to_dlpack" not in lib.missing:
        assert lib.missing == []


def test_the_mapping_itself():
    """The checker maps types as the binding must."""
    assert ctype_of("cusafe_buffer *") is ctypes.POINTER(ctypes.c_uint64)
    assert ctype_of("const cusafe_buffer *") is \
        ctypes.POINTER(ctypes.c_uint64)
    assert ctype_of("const char *") is ctypes.c_char_p
    assert ctype_of("DLManagedTensorVersioned **") is \
        ctypes.POINTER(ctypes.c_void_p)
    assert ctype_of("cusafe_status") is ctypes.c_int
