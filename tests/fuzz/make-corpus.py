#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz/fuzz_api.c into a directory.

usage: make-corpus.py [DIR]    (default: the corpus/ next to this script)

Each seed is one scenario in the input format that fuzz_api.c decodes: a
header byte, then records of an operation byte, a length byte and that many
parameter bytes.  A parameter byte of zero chooses the ordinary, valid case
(a held handle, the first table entry, the default stream, a whole buffer),
so most records need only the bytes that differ from it.  Any byte string is
a valid input: if the decoder changes, the seeds become less targeted, never
invalid.  The bytes below follow the order in which each op_* function of
fuzz_api.c reads them.

Inputs that once failed are kept in the corpus as they were found (or as
converted when the decoder changed, so that they keep their scenario), as
regress-* files next to the generated seeds; this script leaves them
alone."""

import os
import sys

# Operation bytes (fuzz_api.c, run_ops: the byte modulo 32).
CTX, STREAM, EVENT, ALLOC, ALLOC_ASYNC, VIEW = 0, 1, 2, 3, 5, 6
WRITE, READ, ASYNC, COPY, FILL = 7, 8, 9, 10, 11
EVENT_OP, STREAM_OP, CONTEXT_OP, MODULE, GET_KERNEL = 12, 13, 14, 15, 16
LAUNCH, KERNEL_QUERY, REFS, FOREIGN, BUFFER_QUERY, CONTROL = 17, 19, 20, 21, \
    22, 23
ROUNDTRIP = 23 | 0x80
ASYNC_READ = ASYNC | 32
# Where features meet: wrappers of streams, streams of another library,
# DLPack exports and their pending deleters, imports, captures and graphs,
# releases of a chosen type, and the shutdown (in a child process).
STREAM_WRAP, FOREIGN_STREAM, EXPORT, TENSOR, IMPORT, CAPTURE = 24, 25, 26, \
    27, 28, 29
RELEASE_OR_SHUTDOWN = 31

# choose(): the first byte picks the kind of handle, the second which one.
def held(i=0):
    return [0, i]


def any_type(i=0):
    return [7, i]


def stale(i=0):
    return [8, i]


def forged(mode, *extra):
    return [9, 0, mode] + list(extra)


NULL_HANDLE = [10]


def other_device(i=0):
    return [11, i]


def rec(op, *params):
    body = []
    for p in params:
        body += p if isinstance(p, list) else [p]
    assert len(body) < 256
    return [op, len(body)] + body


def seed(*records, header=0):
    out = [header]
    for r in records:
        out += r
    return bytes(out)


# Sizes and offsets (rel()): [0, 0] is the default, [5, k] SIZE_MAX - k,
# [4, k] just past the end, [1, k] the small number k, [2, 0] the whole.
DEFAULT = [0, 0]
PAST_END = [4, 0]
HUGE = [5, 0]
def small(k):
    return [1, k]


HALF = [8, 0]


def num(v):
    """The number v, for a buffer of at least v - 1 bytes."""
    return [10, 0, v & 255, v >> 8]


def launch(kernel=None, shape=2, dims=(0,) * 6, shm=0, stream=(0,), nm=0,
           rest=()):
    """A launch record: shape 2 takes small dimensions from `dims` (shape 1:
    indices into the table of odd ones), shm an index into the shared
    memory sizes, stream the choose_stream() bytes, nm the argument count
    (0: right; 6 more; 7 fewer; 8 none; 9 many), then the arguments' bytes,
    the built-in kernels' n byte and the NULL config / args byte."""
    return rec(LAUNCH, kernel or held(), shape, *dims, shm, *stream, nm, *rest)


def suggest(kernel=None, shm=0, n=0):
    return rec(KERNEL_QUERY, kernel or held(), 5, shm, n)

SEEDS = {}

SEEDS["contexts"] = seed(
    rec(CTX), rec(CTX, 1), rec(CTX, 0), rec(CTX, 6), rec(CTX, 7),
    rec(CTX, 10), rec(CTX, 0, 15),
    rec(CONTEXT_OP, held(0), 2), rec(CONTEXT_OP, held(1), 1),
    rec(CONTEXT_OP, held(0), 3), rec(CONTEXT_OP, held(0), 4, 1),
    rec(CONTEXT_OP, held(0), 4, 7), rec(CONTEXT_OP, held(0), 0),
    rec(REFS, 0, 0), rec(REFS, 1, 0))

SEEDS["streams"] = seed(
    rec(CTX), rec(STREAM), rec(STREAM, held(), 1, 0),
    rec(STREAM, held(), 0, 3), rec(STREAM, held(), 4, 0),
    rec(STREAM, held(), 0, 4), rec(STREAM, held(), 0, 0, 31),
    rec(STREAM_OP, held(0), 0), rec(STREAM_OP, held(1), 1),
    rec(STREAM_OP, held(0), 3), rec(STREAM_OP, held(0), 4),
    rec(STREAM_OP, held(0), 3, 7), rec(REFS, 0, 1))

SEEDS["events"] = seed(
    rec(CTX), rec(STREAM), rec(EVENT), rec(EVENT, held(), 1),
    rec(EVENT_OP, held(0), 0, 1, held(0)), rec(EVENT_OP, held(0), 3),
    rec(EVENT_OP, held(0), 2), rec(EVENT_OP, held(1), 0, 0),
    rec(EVENT_OP, held(0), 4, held(1)), rec(EVENT_OP, held(0), 4, held(0)),
    rec(EVENT_OP, held(0), 4, held(1), 7),
    rec(STREAM_OP, held(0), 2, held(0)), rec(EVENT, held(), 5))

SEEDS["events-two-devices"] = seed(
    rec(CTX), rec(CTX, 1), rec(EVENT), rec(EVENT, held(1)),
    rec(STREAM, held(1)),
    rec(EVENT_OP, held(0), 0, 1, held(0)),
    rec(STREAM_OP, held(0), 2, held(0)),
    rec(EVENT_OP, held(0), 4, held(1)))

SEEDS["buffers"] = seed(
    rec(CTX), rec(ALLOC), rec(ALLOC, held(), 1), rec(ALLOC, held(), 2, 1),
    rec(ALLOC, held(), 6), rec(ALLOC, held(), 0, 14),
    rec(ALLOC, held(), 0, 15), rec(ALLOC, held(), 1, 16),
    rec(ALLOC, held(), 0, 0, 15), rec(ALLOC, NULL_HANDLE, 0, 0),
    rec(BUFFER_QUERY, held(0), 0), rec(BUFFER_QUERY, held(1), 1),
    rec(BUFFER_QUERY, held(2), 2), rec(BUFFER_QUERY, held(0), 3),
    rec(BUFFER_QUERY, held(0), 28))

SEEDS["alloc-async"] = seed(
    rec(CTX), rec(STREAM), rec(ALLOC_ASYNC), rec(ALLOC_ASYNC, held(), 1),
    rec(ALLOC_ASYNC, held(), 14), rec(ALLOC_ASYNC, NULL_HANDLE, 0),
    rec(WRITE), rec(REFS, 0, 1), rec(READ))

SEEDS["views"] = seed(
    rec(CTX), rec(ALLOC, held(), 0, 1),
    rec(VIEW), rec(VIEW, held(0), small(3), small(8)),
    rec(VIEW, held(2), small(1), small(4)),
    rec(VIEW, held(0), PAST_END), rec(VIEW, held(0), HUGE, small(2)),
    rec(VIEW, held(0), DEFAULT, [11, 0]),
    rec(WRITE, held(2)), rec(READ, held(1), small(1), small(2)),
    rec(REFS, 0, 1), rec(READ, held(2)), rec(VIEW, held(0), 0, 0, 0, 0, 31))

SEEDS["transfers"] = seed(
    rec(CTX), rec(ALLOC), rec(WRITE), rec(READ),
    rec(WRITE, held(), small(5), small(7), 3),
    rec(READ, held(), PAST_END), rec(WRITE, held(), DEFAULT, HUGE),
    rec(READ, held(), HUGE, small(1)), rec(WRITE, held(), DEFAULT, DEFAULT, 15),
    rec(WRITE, held(), DEFAULT, [11, 0], 15), rec(ROUNDTRIP))

SEEDS["transfers-async"] = seed(
    rec(CTX), rec(STREAM), rec(ALLOC), rec(ALLOC, held(), 1),
    rec(ASYNC, held(), DEFAULT, DEFAULT, 0, 1, held()),
    rec(ASYNC_READ, held(1), DEFAULT, DEFAULT, 0, 1, held()),
    rec(ASYNC, held(0), DEFAULT, PAST_END, 0, 0),
    rec(ROUNDTRIP))

SEEDS["copies"] = seed(
    rec(CTX), rec(ALLOC), rec(ALLOC), rec(ALLOC, held(), 1),
    rec(COPY), rec(COPY, held(0), 0, held(2)),
    rec(COPY, held(2), 0, held(0), small(1), small(2), small(8)),
    rec(COPY, held(0), 7), rec(COPY, held(0), 0, held(1), PAST_END),
    rec(COPY, held(0), 0, held(1), DEFAULT, DEFAULT, HUGE),
    rec(STREAM), rec(COPY, held(0), 0, held(1), DEFAULT, DEFAULT, DEFAULT,
                     0, 1, held(0)),
    rec(ROUNDTRIP))

SEEDS["copies-peer"] = seed(
    rec(CTX), rec(CTX, 1), rec(ALLOC), rec(ALLOC, held(1)),
    rec(ALLOC, held(1), 1), rec(STREAM, held(1)),
    rec(COPY, held(0), 0, held(1)), rec(COPY, held(1), 0, held(0)),
    rec(COPY, held(2), 0, held(0), DEFAULT, DEFAULT, DEFAULT, 1, 1, held()),
    rec(COPY, held(0), 0, held(2), DEFAULT, DEFAULT, DEFAULT, 0, 1, held()),
    rec(CONTROL, 0, 1), rec(COPY, held(0), 0, held(1)),
    rec(REFS, 0, 2), rec(REFS, 0, 1), rec(ROUNDTRIP))

SEEDS["fills"] = seed(
    rec(CTX), rec(ALLOC), rec(STREAM),
    rec(FILL, held(), DEFAULT, DEFAULT, 0, 0x5A),
    rec(FILL, held(), small(3), small(5), 1, held(), 7),
    rec(FILL, held(), PAST_END), rec(FILL, held(), HUGE, small(2)),
    rec(FILL, NULL_HANDLE))

SEEDS["builtin-kernels"] = seed(
    rec(CTX), rec(ALLOC, held(), 0, 1), rec(ALLOC, held(), 0, 1),
    rec(MODULE), rec(GET_KERNEL), rec(GET_KERNEL, held(), 1),
    rec(GET_KERNEL, held(), 4), rec(GET_KERNEL, held(), 5),
    launch(held(0)), launch(held(1)), launch(held(2)), launch(held(3)),
    suggest(held(0)), launch(held(0), shape=0),
    launch(held(2), dims=(1, 3, 0, 0, 0, 0), stream=(0,)),
    rec(KERNEL_QUERY, held(0), 0), rec(KERNEL_QUERY, held(0), 0x12),
    rec(KERNEL_QUERY, held(0), 0x30),
    rec(MODULE, held(), 8), rec(GET_KERNEL, held(1), 2), launch(held(4)),
    rec(ROUNDTRIP), rec(REFS, 0, 3))

SEEDS["builtin-kernels-misuse"] = seed(
    rec(CTX), rec(CTX, 1), rec(ALLOC), rec(ALLOC, held(1)), rec(MODULE),
    rec(GET_KERNEL), rec(GET_KERNEL, held(), 6), rec(GET_KERNEL, held(), 7),
    rec(GET_KERNEL, held(), 63),
    launch(shape=1, dims=(7, 0, 0, 0, 0, 0)),
    launch(shape=1, dims=(0, 8, 0, 0, 0, 0)),
    launch(shape=1, dims=(12, 0, 9, 0, 0, 6)),
    launch(shm=5), launch(shm=7), launch(shm=8),
    launch(nm=6), launch(nm=7), launch(nm=8), launch(nm=9, rest=(3,)),
    launch(nm=8, rest=(31,)), launch(nm=8, rest=(30,)),
    launch(rest=(4, 0, 0, 0, 0, 0, 0, 4, 0, 4, 0)),
    rec(KERNEL_QUERY, held(), 1), rec(KERNEL_QUERY, held(), 3),
    suggest(shm=5, n=3), suggest(shm=8, n=4), rec(KERNEL_QUERY, held(), 14),
    rec(MODULE, held(1)), rec(GET_KERNEL, held(1)),
    launch(held(1), stream=(1, *held(0))), launch(held(1), stream=(1, 11, 0)),
    launch(held(0), rest=(0, *held(1))))


def image(kernels, damage=0, extra=(), size_flag=0):
    """gen_image bytes: kernels is a list of (maxthreads_idx, shared_idx,
    [param size indices]); damage 5 (with `extra` the place and the byte),
    6 or 7 (with the place of the cut) breaks the text."""
    out = [len(kernels) - 1]
    for mt, sh, params in kernels:
        out += [0, mt, sh, 0, len(params)] + params
    return out + [damage, *extra, size_flag]


# psizes: 0 'p', 3 4, 5 8, 7 1, 8 2, 9 16, 10 3, 14 32764, 15 40000
SEEDS["images"] = seed(
    rec(CTX), rec(ALLOC), rec(MODULE, held(), 2, image([(0, 0, [0, 3, 5])])),
    rec(GET_KERNEL), launch(), launch(rest=(4, 5)), launch(nm=6),
    rec(MODULE, held(), 2, image([(2, 2, [0, 7, 8, 9, 10]),
                                  (3, 3, [0, 0])])),
    rec(GET_KERNEL, held(1)), rec(GET_KERNEL, held(1), 1), launch(held(1)),
    launch(held(1), shape=1, dims=(0, 6, 0, 0, 0, 0)),
    launch(held(2)), launch(held(2), shm=4), suggest(held(2)),
    suggest(held(1), shm=3), rec(KERNEL_QUERY, held(1), 0x30))

SEEDS["images-many-params"] = seed(
    rec(CTX), rec(ALLOC),
    rec(MODULE, held(), 3, image([(0, 0, [0] * 20 + [3] * 20)])),
    rec(GET_KERNEL), launch(), launch(nm=9),
    rec(KERNEL_QUERY, held(), 0x40))

SEEDS["images-malformed"] = seed(
    rec(CTX),
    rec(MODULE, held(), 2, image([(5, 0, [0])])),
    rec(MODULE, held(), 2, image([(6, 0, [0])])),
    rec(MODULE, held(), 2, image([(0, 4, [0])])),
    rec(MODULE, held(), 2, image([(0, 0, [15])])),
    rec(MODULE, held(), 2, image([(0, 0, [14, 14])])),
    rec(MODULE, held(), 2, image([(0, 0, [0])], damage=5, extra=(3, 0x7f))),
    rec(MODULE, held(), 2, image([(0, 0, [0])], damage=6)),
    rec(MODULE, held(), 2, image([(0, 0, [0])], damage=7, extra=(4,))),
    rec(MODULE, held(), 2, image([(0, 0, [0])], size_flag=7)),
    rec(MODULE, held(), 2, image([(0, 0, [0])]) + [31]),
    rec(MODULE, held(), 2, [1, 7, 0, 0, 0, 0, 7, 0, 0, 0, 0]))

SEEDS["images-other"] = seed(
    rec(CTX), rec(ALLOC),
    rec(MODULE, held(), 4, 0), rec(MODULE, held(), 4, 1),
    rec(MODULE, held(), 4, 2), rec(MODULE, held(), 4, 3),
    rec(MODULE, held(), 4, 4), rec(MODULE, held(), 4, 5),
    rec(MODULE, held(), 4, 6), rec(MODULE, held(), 4, 8),
    rec(MODULE, held(), 4, 7, 12, *b"hello world!"),
    rec(MODULE, held(), 4, 0, 15),
    rec(GET_KERNEL), rec(GET_KERNEL, held(1)), launch(), launch(held(1)))

SEEDS["files"] = seed(
    rec(CTX), rec(MODULE, held(), 5, 0), rec(MODULE, held(), 5, 1),
    rec(MODULE, held(), 5, 2), rec(MODULE, held(), 5, 3),
    rec(MODULE, NULL_HANDLE, 5, 0))


def source(kernels, error=0):
    """gen_source bytes: kernels is a list of (launch_bounds, [type
    indices]); types: 0 float *, 1 const double *, 2 int, 3 double, 4 char,
    5 unsigned short, 6 size_t, 7 bool, 8 uint64_t, 9 struct foo."""
    out = [len(kernels) - 1, error]
    for lb, types in kernels:
        out += [lb, len(types)] + types
    return out


# The last byte of an NVRTC record: 3 names the program, 0 leaves the name
# NULL, 17 passes a NULL source, 18 NULL options.
SEEDS["nvrtc"] = seed(
    rec(CTX), rec(ALLOC),
    rec(MODULE, held(), 6, 0, source([(1, [0, 3, 6])]), 3),
    rec(GET_KERNEL), launch(), suggest(),
    rec(MODULE, held(), 6, 2, 0, 2, source([(0, [0, 2]), (1, [4, 5, 7, 8, 1])]),
        3),
    rec(GET_KERNEL, held(1)), rec(GET_KERNEL, held(1), 1), launch(held(1)),
    launch(held(2)), launch(held(2), shape=1, dims=(0, 6, 0, 0, 0, 0)))

SEEDS["nvrtc-errors"] = seed(
    rec(CTX),
    rec(MODULE, held(), 6, 0, source([(1, [0])], error=7), 3),
    rec(MODULE, held(), 6, 0, source([(1, [9])]), 3),
    rec(MODULE, held(), 6, 1, 6, source([(1, [0])]), 3),
    rec(MODULE, held(), 6, 1, 4, source([(1, [0])]), 3),
    rec(MODULE, held(), 6, 1, 11, source([(1, [0])]), 3),
    rec(MODULE, held(), 6, 1, 12, source([(1, [0])]), 3),
    rec(MODULE, held(), 6, 3, 5, 7, 8, source([(1, [0])]), 3),
    rec(MODULE, held(), 6, 0, source([(1, [0])]), 0),
    rec(MODULE, held(), 6, 0, source([(1, [0])]), 17),
    rec(MODULE, held(), 6, 2, 0, 0, source([(1, [0])]), 18))

SEEDS["references"] = seed(
    rec(CTX), rec(ALLOC), rec(STREAM), rec(EVENT),
    rec(REFS, 2, 0, held(0)), rec(REFS, 2, 4, held(0)),
    rec(REFS, 2, 1, held(0)), rec(REFS, 2, 2, held(0)),
    rec(REFS, 2, 0, stale(0)), rec(REFS, 2, 0, forged(0, *[1] * 8)),
    rec(REFS, 3, 0, 0), rec(REFS, 3, 2, 0, 0), rec(REFS, 3, 0, 1),
    rec(REFS, 3, 0, 2), rec(REFS, 3, 3, 5),
    rec(REFS, 0, 0), rec(REFS, 0, 0), rec(REFS, 1, 1), rec(REFS, 1, 2),
    rec(REFS, 3, 0, 1), rec(REFS, 3, 4, 1), rec(WRITE, stale(0)),
    rec(WRITE, forged(1, 3)), rec(WRITE, forged(2)), rec(WRITE, forged(3)),
    rec(WRITE, forged(4, 5)), rec(WRITE, forged(5)), rec(WRITE, forged(6, 4)),
    rec(WRITE, forged(7)), rec(WRITE, forged(8)), rec(WRITE, forged(9)),
    rec(WRITE, any_type(0)), rec(WRITE, NULL_HANDLE))

SEEDS["parents-released-first"] = seed(
    rec(CTX), rec(ALLOC), rec(VIEW), rec(STREAM), rec(EVENT), rec(MODULE),
    rec(GET_KERNEL), rec(REFS, 0, 0), rec(REFS, 0, 0), rec(REFS, 0, 3),
    rec(WRITE, held(0)), launch(held(0)), rec(ASYNC, held(0), DEFAULT,
                                                   DEFAULT, 0, 1, held(0)),
    rec(CTX), rec(BUFFER_QUERY, held(0), 3), rec(STREAM_OP, held(0), 4),
    rec(REFS, 0, 0), rec(REFS, 0, 0))

SEEDS["labels-types"] = seed(
    rec(CTX), rec(ALLOC), rec(STREAM), rec(MODULE), rec(GET_KERNEL),
    rec(REFS, 4, 1, held(0), 2), rec(REFS, 4, 2, held(0), 1),
    rec(REFS, 4, 3, held(0), 0), rec(REFS, 4, 4, held(0), 5),
    rec(REFS, 4, 0, stale(0), 6), rec(REFS, 5, 0, held(0)),
    rec(REFS, 5, 1, held(0)), rec(REFS, 5, 3, held(0)), rec(REFS, 5, 5, held(0)),
    rec(REFS, 5, 0, forged(0, 7, 7)), rec(REFS, 5, 2, held(0), 15))

SEEDS["paused-streams"] = seed(
    rec(CTX), rec(CTX, 1), rec(STREAM), rec(ALLOC), rec(ALLOC, held(1)),
    rec(ASYNC, held(0), DEFAULT, DEFAULT, 0, 1, held(0)),
    rec(COPY, held(1), 0, held(0)), rec(FILL, held(0)),
    rec(EVENT), rec(EVENT_OP, held(0), 0, 1, held(0)),
    rec(EVENT_OP, held(0), 3), rec(STREAM_OP, held(0), 1),
    rec(REFS, 0, 3), rec(REFS, 0, 4), rec(ROUNDTRIP), rec(REFS, 0, 2),
    header=2)

SEEDS["paused-launches"] = seed(
    rec(CTX), rec(ALLOC, held(), 0, 1), rec(MODULE), rec(GET_KERNEL),
    launch(), launch(), rec(REFS, 0, 2), rec(REFS, 0, 3),
    rec(REFS, 0, 1), header=2 | 4 | 8)

SEEDS["fault-once"] = seed(
    rec(CTX), rec(ALLOC), rec(CONTROL, 1, 0, 0, 0),
    rec(ALLOC), rec(CONTROL, 1, 1, 1, 0), rec(WRITE), rec(STREAM),
    rec(CONTROL, 1, 2, 2, 0), rec(MODULE), rec(GET_KERNEL), launch(),
    rec(CONTROL, 3), rec(ROUNDTRIP))

SEEDS["fault-persistent"] = seed(
    rec(CTX), rec(ALLOC), rec(STREAM), rec(CONTROL, 1, 3, 4, 3),
    rec(ALLOC), rec(WRITE), rec(COPY), rec(EVENT), rec(MODULE),
    rec(REFS, 0, 1), rec(REFS, 0, 2), rec(CONTROL, 3), rec(ROUNDTRIP))

SEEDS["fault-functions"] = seed(
    rec(CTX), rec(ALLOC), rec(STREAM),
    rec(CONTROL, 2, 0, 0), rec(CONTROL, 2, 3, 1), rec(CONTROL, 2, 8, 2),
    rec(CONTROL, 2, 27, 3), rec(CONTROL, 2, 29, 4),
    rec(ALLOC), rec(WRITE), rec(EVENT), rec(EVENT_OP, held(0), 0),
    rec(MODULE, held(), 6, 0, source([(1, [0])]), 3), rec(MODULE),
    rec(GET_KERNEL), launch(), rec(CONTROL, 3), rec(ROUNDTRIP))

SEEDS["fault-destroy"] = seed(
    rec(CTX), rec(ALLOC), rec(STREAM), rec(EVENT), rec(MODULE),
    rec(CONTROL, 2, 37, 2), rec(CONTROL, 2, 38, 2), rec(CONTROL, 2, 39, 2),
    rec(CONTROL, 2, 42, 2), rec(REFS, 0, 1), rec(REFS, 0, 1),
    rec(REFS, 0, 1), rec(REFS, 0, 1))

SEEDS["sticky-error"] = seed(
    rec(CTX), rec(ALLOC), rec(STREAM), rec(MODULE), rec(GET_KERNEL),
    rec(CONTROL, 4, 0, 0), rec(WRITE), launch(), rec(STREAM),
    rec(CONTEXT_OP, held(0), 0), rec(EVENT), rec(ALLOC), rec(REFS, 0, 1))

SEEDS["misaligned-kernel"] = seed(
    rec(CTX), rec(ALLOC, held(), 0, 1), rec(VIEW, held(0), small(1), num(64)),
    rec(MODULE), rec(GET_KERNEL),
    launch(rest=(0, *held(1), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)),
    rec(READ, held(0)), rec(CONTEXT_OP, held(0), 0), rec(ALLOC),
    rec(CONTROL, 4, 0, 3), rec(ROUNDTRIP))

SEEDS["memory-limits"] = seed(
    rec(CONTROL, 5, 0, 2), rec(CTX), rec(ALLOC), rec(ALLOC, held(), 0, 1),
    rec(CONTROL, 5, 0, 0), rec(ALLOC, held(), 1), rec(ALLOC, held(), 2),
    rec(CONTROL, 6, 1, 0), rec(CTX, 1), rec(ALLOC, held(1), 2),
    rec(ALLOC, held(1), 1))

SEEDS["two-threads"] = bytes([1, 40]) + seed(
    rec(ALLOC), rec(WRITE), rec(COPY), rec(REFS, 2, 0, held(0)),
    rec(REFS, 0, 0), launch(), rec(READ), rec(REFS, 1, 0))[1:41].ljust(
        40, b"\0") + seed(
    rec(CTX), rec(ALLOC), rec(ALLOC), rec(MODULE), rec(GET_KERNEL),
    rec(COPY), launch(), rec(REFS, 0, 0), rec(REFS, 0, 0), rec(ALLOC))[1:]

SEEDS["two-threads-release-race"] = bytes([1 | 2, 24]) + seed(
    rec(REFS, 0, 0), rec(REFS, 0, 0), rec(REFS, 1, 0), rec(WRITE),
    rec(VIEW), rec(REFS, 0, 0))[1:25].ljust(24, b"\0") + seed(
    rec(CTX), rec(STREAM), rec(ALLOC), rec(VIEW), rec(REFS, 2, 0, held(0)),
    rec(ASYNC, held(0), DEFAULT, DEFAULT, 0, 1, held(0)), rec(REFS, 0, 0),
    rec(REFS, 0, 0))[1:]


# Where features meet.  Each seed mixes the kinds of objects that the pool
# holds; the fuzzer mixes them further.
def wrap_stream(stream=None, ctx=None, keep=True, capturing=None, fill=None):
    """op_stream_wrap: a wrapper of the CUDA stream of a stream of the pool;
    with capturing=k, the k-th of the streams that capture now; fill: a
    buffer filled on the wrapper at once; keep=False: released at once."""
    m = (0 if keep else 0x20) | (0x10 if capturing is not None else 0) | \
        (0x40 if fill else 0)
    pick = [capturing] if capturing is not None else (stream or held())
    return rec(STREAM_WRAP, ctx or held(), m, *pick, *(fill or []))


def wrap_default(which, ctx=None):
    """A wrapped default stream: 0 NULL, 1 cudaStreamLegacy, 2
    cudaStreamPerThread."""
    return rec(STREAM_WRAP, ctx or held(), 3 | which << 2)


def foreign_stream(which=7, twice=False, ctx=None, other_device=False):
    """op_foreign_stream: the other library's stream number `which` (a new
    one when it has fewer), wrapped once or twice."""
    m = (0x10 if twice else 0) | (15 if other_device else 0)
    return rec(FOREIGN_STREAM, ctx or held(), which, m)


def export(buf=None, stream=None, legacy=False, off=DEFAULT, length=DEFAULT,
           work=None):
    """op_export: stream=None exports for no consumer stream; work: the
    consumer's work at once (0 a memset, 1 a fill through its wrapper of
    the memory, 2 the same on a new wrapper of its stream)."""
    m = (3 if stream is None else 0) | (4 if legacy else 0) | \
        (work << 5 if work is not None else 0x10)
    return rec(EXPORT, buf or held(), m, *(stream or []), off, length, 0x5A)


# op_tensor modes: the deleter now, on the helper thread joined at once or
# after the next operation; the consumer's memset on its CUDA stream, its
# fill through its own wrapper of the memory, on its stream or on a new
# wrapper of the CUDA stream.
NOW, HELPER, HELPER_NEXT, MEMSET, ALIAS_FILL, ALIAS_FILL_NEW_WRAPPER = \
    0, 1, 2, 4, 6, 7


def tensor(k, mode, value=0x5A):
    return rec(TENSOR, k, mode, value)


def import_(ctx=None, size=0, kind=0, how=0, m=0):
    """op_import: size indexes 64, 256, 8, 4096, 1, 24, 0; kind 6 pinned, 7
    managed, else device; how 0 whole, 1 2-D, 2 negative stride, 3 byte
    offset, 4 another device, 5 read-only, 6 empty, 7 too long; m bit 0:
    legacy."""
    return rec(IMPORT, ctx or held(), size, kind, how, m)


def begin(stream=None):
    return rec(CAPTURE, 0, *(stream or held()))


def end(stream=None):
    return rec(CAPTURE, 1, *(stream or held()))


def join(stream=None, event=None, other=None, work=None, back=None):
    """An event recorded on `stream` and waited for by `other` (which joins
    the capture of `stream`), then a fill of buffer `work` on `other`, and
    `other` joined back through event `back` (None: left unjoined)."""
    k = (1 if work else 0) | (0 if back else 2)
    return rec(CAPTURE, 2, *(stream or held()), *(event or held()),
               *(other or held()), k, *(work or []), *(back or []))


def replay(stream=None, graph=None, launches=1, instantiate=False,
           release=False):
    k = (0 if instantiate else 1) | (launches - 1) << 2 | \
        (0x40 if release else 0)
    return rec(CAPTURE, 3, *(stream or held()), *(graph or held()), k)


# release(): the kind of the object released (op_release_kind).
R_STREAM, R_BUF, R_GRAPH, R_EVENT, R_CTX = 0, 1, 2, 3, 4


def release(kind, i=0):
    return rec(RELEASE_OR_SHUTDOWN, 0, kind, i)


# The shutdown happens with header bit 5 in inputs whose length is a
# multiple of 8 (shutdown_seed() pads the record to that).
SHUTDOWN = rec(RELEASE_OR_SHUTDOWN, 7)
MAY_SHUT_DOWN = 32


def shutdown_seed(*records, header=0):
    """seed() of records that include SHUTDOWN, padded so that it
    happens."""
    data = seed(*records, header=header | MAY_SHUT_DOWN)
    pad = -len(data) % 8
    i = records.index(SHUTDOWN)
    return seed(*records[:i], rec(RELEASE_OR_SHUTDOWN, 7, *[0] * pad),
                *records[i + 1:], header=header | MAY_SHUT_DOWN)


def fill(buf=None, stream=None, value=0x11):
    """A fill of a whole buffer on a held stream (None: the default)."""
    return rec(FILL, buf or held(), DEFAULT, DEFAULT,
               *([1] + stream if stream else [0]), value)


SEEDS["streams-wrapped"] = seed(
    rec(CTX), rec(STREAM), rec(ALLOC), rec(ALLOC),
    wrap_stream(held(0)), wrap_stream(held(1)),
    wrap_default(0), wrap_default(1), wrap_default(2),
    fill(held(0), held(1)), fill(held(1), held(2)), fill(held(0), held(3)),
    rec(COPY, held(0), 0, held(1), DEFAULT, DEFAULT, DEFAULT, 0, 1, held(2)),
    rec(EVENT), rec(EVENT_OP, held(0), 0, 1, held(1)),
    rec(STREAM_OP, held(4), 2, held(0)),
    begin(held(3)), begin(held(5)),
    release(R_STREAM, 0), fill(held(0), held(0)), fill(held(1), held(1)),
    rec(STREAM_OP, held(0), 0), rec(ROUNDTRIP), release(R_STREAM, 0),
    rec(FOREIGN, 0, 0, 3))

SEEDS["streams-foreign"] = seed(
    rec(CTX), rec(CTX, 1), rec(ALLOC), rec(ALLOC, held(1)),
    foreign_stream(7, twice=True), foreign_stream(0),
    foreign_stream(7, ctx=held(1)), foreign_stream(0, ctx=held(1)),
    fill(held(0), held(0)), fill(held(0), held(1)),
    rec(ASYNC, held(0), DEFAULT, DEFAULT, 0, 1, held(2)),
    rec(COPY, held(0), 0, held(1), DEFAULT, DEFAULT, DEFAULT, 1, 1, held(0)),
    rec(COPY, held(1), 0, held(0), DEFAULT, DEFAULT, DEFAULT, 0, 1, held(1)),
    wrap_stream(held(0)), rec(ALLOC_ASYNC, held(3)),
    rec(FOREIGN, 0, 2, 1, held(1), held(0)),
    release(R_STREAM, 0), release(R_STREAM, 0), release(R_BUF, 0),
    rec(ROUNDTRIP))

SEEDS["captures-streams"] = seed(
    rec(CTX), rec(STREAM), rec(ALLOC), rec(ALLOC),
    foreign_stream(7), wrap_stream(held(0)), wrap_default(0),
    wrap_stream(held(2), fill=held(1), keep=False),
    begin(held(0)), fill(held(0), held(0)), rec(COPY, held(1), 0, held(0),
                                                 DEFAULT, DEFAULT, DEFAULT, 0,
                                                 1, held(0)),
    end(held(0)),
    begin(held(1)), fill(held(1), held(1)), end(held(1)),
    begin(held(3)), end(held(3)),
    replay(held(0), held(0), instantiate=True),
    replay(held(1), held(1), launches=2, release=True),
    replay(held(2), held(0), launches=3),
    begin(held(2)), fill(held(0), held(2)), release(R_BUF, 0),
    release(R_STREAM, 0), release(R_GRAPH, 0),
    begin(held(0)), fill(held(0), held(0)), rec(STREAM_OP, held(0), 0),
    release(R_STREAM, 0), rec(CONTEXT_OP, held(0), 0))

SEEDS["captures-joins"] = seed(
    rec(CTX), rec(STREAM), rec(STREAM), rec(ALLOC), rec(ALLOC),
    rec(EVENT), rec(EVENT), foreign_stream(7),
    begin(held(0)),
    join(held(0), held(0), held(1), work=held(0), back=held(1)),
    join(held(0), held(0), held(2), back=held(1)),
    end(held(0)), replay(held(1), held(0), launches=2, release=True),
    begin(held(2)), join(held(2), held(1), held(0), work=held(1)),
    end(held(2)), rec(CONTEXT_OP, held(0), 0),
    begin(held(1)), join(held(1), held(0), held(0), work=held(0)),
    release(R_STREAM, 1), release(R_EVENT, 0), rec(CONTEXT_OP, held(0), 0))

SEEDS["dlpack-consumers"] = seed(
    rec(CTX), rec(STREAM), rec(ALLOC), rec(ALLOC, held(), 1),
    foreign_stream(7), wrap_default(0),
    export(held(0), held(0)), export(held(0), held(1), legacy=True),
    export(held(1), held(2)), export(held(0)),
    export(held(0), held(0), off=small(8), length=small(16)),
    export(held(1), held(1), work=1), export(held(0), held(2), work=2),
    tensor(0, MEMSET), tensor(1, ALIAS_FILL), tensor(2, ALIAS_FILL_NEW_WRAPPER),
    tensor(4, MEMSET), release(R_BUF, 0),
    tensor(0, HELPER), tensor(0, HELPER_NEXT), fill(held(0), held(0)),
    tensor(1, NOW), begin(held(0)), tensor(0, NOW), end(held(0)),
    export(held(0), held(1)), rec(STREAM_OP, held(1), 0))

SEEDS["dlpack-import"] = seed(
    rec(CTX), rec(CTX, 1), rec(STREAM),
    import_(), import_(how=1, m=1), import_(how=2), import_(size=1, how=3),
    import_(how=4), import_(how=5), import_(how=5, m=1), import_(how=6),
    import_(how=7), import_(kind=6), import_(kind=7, m=1),
    import_(held(1), size=3),
    fill(held(0), held(0)), rec(COPY, held(0), 0, held(1)),
    rec(COPY, held(0), 0, held(9), DEFAULT, DEFAULT, DEFAULT, 1, 1, held(0)),
    rec(VIEW, held(0), small(8), small(8)), export(held(0), held(0)),
    tensor(0, MEMSET), release(R_BUF, 0), release(R_BUF, 0),
    rec(READ, held(2)), release(R_CTX, 0), tensor(0, NOW), header=16)

SEEDS["shutdown"] = shutdown_seed(
    rec(CTX), rec(STREAM), rec(ALLOC), rec(ALLOC, held(), 1), rec(EVENT),
    foreign_stream(7, twice=True), import_(), wrap_stream(held(0)),
    export(held(0), held(0)), export(held(1), held(1)), export(held(2)),
    tensor(0, MEMSET), begin(held(0)), fill(held(0), held(0)),
    rec(FOREIGN, 3), SHUTDOWN,
    fill(held(0), held(1)), tensor(0, HELPER), tensor(0, NOW),
    release(R_BUF, 0), rec(ALLOC), end(held(0)), rec(STREAM_OP, held(0), 0),
    rec(REFS, 3, 0, 1))

SEEDS["shutdown-paused"] = shutdown_seed(
    rec(CTX), rec(CTX, 1), rec(STREAM), rec(STREAM, held(1)), rec(ALLOC),
    rec(ALLOC, held(1)), import_(held(1)), foreign_stream(7),
    rec(COPY, held(0), 0, held(1)), fill(held(0), held(2)),
    export(held(0), held(1), work=0), release(R_BUF, 0),
    rec(MODULE), rec(GET_KERNEL), launch(),
    begin(held(0)), join(held(0), held(0), held(2)),
    SHUTDOWN, tensor(0, NOW), header=2)

SEEDS["two-threads-meet"] = bytes([1, 40]) + seed(
    export(held(0), held(0)), tensor(0, HELPER_NEXT), fill(held(0), held(1)),
    wrap_stream(held(0)), release(R_STREAM, 0), tensor(0, NOW),
    release(R_BUF, 0))[1:41].ljust(40, b"\0") + seed(
    rec(CTX), rec(STREAM), rec(ALLOC), rec(ALLOC), foreign_stream(7),
    import_(), begin(held(0)), fill(held(1), held(0)), export(held(1)),
    end(held(0)), replay(held(1), held(0)), release(R_STREAM, 0),
    rec(REFS, 0, 0))[1:]

def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "corpus")
    os.makedirs(out, exist_ok=True)
    for name, data in sorted(SEEDS.items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"{len(SEEDS)} seeds written to {out}")


if __name__ == "__main__":
    main()
