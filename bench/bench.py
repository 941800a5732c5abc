#!/usr/bin/env python3
"""bench.py -- kernel launches and small allocations from Python: cusafe's
package, with its C accelerator (cusafe._speedups) and on ctypes alone,
next to CuPy and cuda.core.

    PYTHONPATH=python CUSAFE_LIBRARY=.libs/libcusafe.so \\
        python3 bench/bench.py [--quick] [--only=launch,alloc,extra] [--samples=N]
                               [--csv[=FILE]] [--device=N] [--one]

Both implementations: the package as imported (with the accelerator where
it is built, unless CUSAFE_PURE_PYTHON=1) is timed interleaved with the
peers; the other one (CUSAFE_PURE_PYTHON=1, or without it) runs the same
rows first, in a child process, and its rows are printed beside them,
labelled "cusafe (C)" and "cusafe (ctypes)".  --one times the imported one
alone.  The targets belong to the accelerator's rows.

launch: c = a + b on 1024 floats (so small that the launch cost is all
there is), as cusafe's built-in cusafe_vecadd_f32 through the binding, and
the same function (same source, compiled at run time) through CuPy's
RawKernel and cuda.core's launch().  The time is the host's per launch;
the queue is drained between batches, outside the timed region.

alloc: a device allocation and its release, 256 bytes and 64 KiB: a cusafe
Buffer, and CuPy with its caching pool, with cudaMallocAsync underneath
(MemoryAsyncPool) and with no pool (cudaMalloc / cudaFree), and cuda.core.

Each peer that is not installed, or whose interface differs from what this
script knows, is skipped with a line that says why.  Every implementation's
result is checked before it is timed.  Medians of interleaved samples with
their min-max; cusafe/this is the ratio of the medians (above 1: cusafe
takes longer).  Exit status: 0, 1 without a CUDA device (one line on
stderr), 2 on a failure.
"""

import argparse
import array
import ctypes
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time

N = 1024                 # floats per vector
BLOCK = 256
GRID = (N + BLOCK - 1) // BLOCK
BATCH = 256              # launches between two drains of the queue

VECADD_SOURCE = r"""
extern "C" __global__ void vecadd_f32(float *c, const float *a,
                                      const float *b, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    c[i] = __fadd_rn(a[i], b[i]);
}
"""

try:
    import numpy as np
except ImportError:  # numpy is optional for cusafe, needed by the peers
    np = None

now = time.perf_counter_ns


class Skip(Exception):
    """A peer that cannot run here; the message says why."""


def fail(message):
    print("bench.py: " + message, file=sys.stderr)
    sys.exit(2)


# --------------------------------------------------------------------------
# Statistics and the table
# --------------------------------------------------------------------------

def stats(values):
    v = sorted(values)
    return {"median": statistics.median(v), "min": v[0], "max": v[-1],
            "p25": v[len(v) // 4], "p75": v[(3 * len(v)) // 4]}


def fmt(x):
    a = abs(x)
    if a >= 1000:
        return "%.0f" % x
    if a >= 100:
        return "%.1f" % x
    if a >= 10:
        return "%.2f" % x
    return "%.3f" % x


ROW = "  %-60s %-26s %12s"
ROWS = []
VALUES = []  # (group, name, the samples) of each row: a child's output
# The rows of the other implementation, measured by a child process
# (other_implementation): {group: [(name, values)]}, and why there are
# none, if so.
OTHER = {"rows": {}, "skip": None, "label": None}


def group_header(group, what):
    print("\n[%s] %s" % (group, what))
    print(ROW % ("implementation", "median (min-max) us", "cusafe/this"))
    sys.stdout.flush()


def report(group, name, values, reference=None):
    """Prints and keeps a row; `reference` holds the cusafe values that the
    ratio compares with."""
    s = stats(values)
    ratio = None
    if reference is not None:
        ratio = stats(reference)["median"] / s["median"]
    ROWS.append((group, name, s, ratio))
    VALUES.append((group, name, list(values)))
    print(ROW % (name, "%s (%s-%s)" % (fmt(s["median"]), fmt(s["min"]),
                                       fmt(s["max"])),
                 "-" if ratio is None else "%.3f" % ratio))
    sys.stdout.flush()


def skipped(name, why):
    print("  %-60s skipped: %s" % (name, why))
    sys.stdout.flush()


def write_csv(f):
    f.write("group,implementation,unit,median,min,p25,p75,max,"
            "cusafe_over_this\n")
    for group, name, s, ratio in ROWS:
        f.write('%s,"%s",us,%.6g,%.6g,%.6g,%.6g,%.6g,%s\n' % (
            group, name, s["median"], s["min"], s["p25"], s["p75"],
            s["max"], "" if ratio is None else "%.6g" % ratio))


def measure(variants, samples, warmups):
    """variants: list of functions, each running one sample and returning
    microseconds per operation.  Interleaved, in alternating order, with
    the garbage collector off while they run (as timeit does)."""
    results = [[] for _ in variants]
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(warmups):
            for fn in variants:
                fn()
        for s in range(samples):
            order = range(len(variants))
            if s % 2:
                order = reversed(order)
            for i in order:
                results[i].append(variants[i]())
    finally:
        if enabled:
            gc.enable()
    return results


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------

def make_inputs():
    rng = random.Random(12345)
    a = array.array("f", (rng.uniform(-1000, 1000) for _ in range(N)))
    b = array.array("f", (rng.uniform(-1000, 1000) for _ in range(N)))
    # Each float32 sum is exact in double, so one rounding to float32
    # gives the device's correctly rounded sum.
    want = array.array("f", (x + y for x, y in zip(a, b)))
    return a, b, want


def poison():
    return array.array("f", [float("nan")] * N)


def check_result(name, got, want):
    got = array.array("f", bytes(got))
    if got.tobytes() != want.tobytes():
        bad = sum(1 for x, y in zip(got, want) if x != y)
        raise RuntimeError("%s computed a wrong sum (%d of %d elements)"
                           % (name, bad, N))


# --------------------------------------------------------------------------
# cusafe
# --------------------------------------------------------------------------

def label_of(impl):
    """How the rows name an implementation of the package."""
    return "cusafe (C)" if impl == "c" else "cusafe (ctypes)"


class CusafePeer:
    def __init__(self, cusafe, device, inputs):
        self.cs = cusafe
        self.label = label_of(cusafe.implementation())
        self.lib = cusafe.library()
        self.ctx = cusafe.Context(device)
        a, b, want = inputs
        self.da = cusafe.Buffer.from_host(self.ctx, a)
        self.db = cusafe.Buffer.from_host(self.ctx, b)
        self.dc = self.ctx.alloc(4 * N)
        self.module = cusafe.Module.builtin(self.ctx)
        self.kernel = self.module.kernel("cusafe_vecadd_f32")
        self.want = want
        self.dc.write(poison())
        self.kernel.launch(GRID, BLOCK, self.dc, self.da, self.db, N)
        check_result("cusafe", self.dc.read(), want)

    def sync(self):
        self.ctx.synchronize()

    def launch_sample(self, batches):
        k, dc, da, db, sync = self.kernel, self.dc, self.da, self.db, \
            self.sync

        def sample():
            total = 0
            for _ in range(batches):
                t0 = now()
                for _ in range(BATCH):
                    k.launch(GRID, BLOCK, dc, da, db, N)
                total += now() - t0
                sync()
            return total / (batches * BATCH) / 1e3
        return sample

    def prepared_sample(self, batches):
        """The binding's repeated-launch fast path, where it has one; else
        one ctypes call of cusafe_kernel_launch with a prebuilt
        configuration and argument array: the floor of any such path."""
        cs, lib = self.cs, self.lib
        prepare = getattr(self.kernel, "prepare", None)
        if prepare is not None:
            launch = prepare(GRID, BLOCK, self.dc, self.da, self.db, N)
            name = self.label + " Kernel.prepare(...)()"
        else:
            config = cs.LaunchConfig()
            config.grid[:] = (GRID, 1, 1)
            config.block[:] = (BLOCK, 1, 1)
            config.shared_memory = 0
            config.stream = 0
            args = (cs.Arg * 4)()
            for i, buf in enumerate((self.dc, self.da, self.db)):
                args[i].kind = cs.ArgKind.BUFFER
                args[i].value.buffer = buf.handle
            args[3].kind = cs.ArgKind.U64
            args[3].value.u = N
            fn, handle, ref, check = lib.fn.cusafe_kernel_launch, \
                self.kernel.handle, ctypes.byref(config), lib.check
            keep = (config, args)

            def launch():
                st = fn(handle, ref, args, 4)
                if st:
                    check(st)
            launch.keep = keep
            name = "cusafe, one ctypes call, prebuilt arguments"
        sync = self.sync

        def sample():
            total = 0
            for _ in range(batches):
                t0 = now()
                for _ in range(BATCH):
                    launch()
                total += now() - t0
                sync()
            return total / (batches * BATCH) / 1e3
        # The same launch must compute the same sum.
        self.dc.write(poison())
        launch()
        check_result(name, self.dc.read(), self.want)
        return name, sample

    def ctypes_floor_sample(self, batches):
        """A ctypes call into libcusafe that does nothing: what any call
        through ctypes costs."""
        fn = self.lib.fn.cusafe_last_cuda_error

        def sample():
            t0 = now()
            for _ in range(batches * BATCH):
                fn()
            return (now() - t0) / (batches * BATCH) / 1e3
        return sample

    def alloc_sample(self, size, count):
        ctx, sync = self.ctx, self.sync

        def sample():
            t0 = now()
            for _ in range(count):
                ctx.alloc(size).close()
            t = now() - t0
            sync()
            return t / count / 1e3
        return sample

    def alloc_raw_sample(self, size, count, fresh=False):
        """cusafe_buffer_alloc + cusafe_buffer_release as two bare ctypes
        calls with ready ctypes values (no argtypes to convert through):
        the floor of any allocation through ctypes.  fresh: with a new
        c_uint64 for the handle and its byref() per allocation, as an
        object that keeps its handle needs; what ctx.alloc(size).close()
        costs beyond that is the Python object's."""
        lib = self.lib
        raw = getattr(lib, "raw", None)
        if raw is not None:
            alloc, release = raw.cusafe_buffer_alloc, \
                raw.cusafe_buffer_release
        else:  # an older binding: the declared functions
            alloc, release = lib.fn.cusafe_buffer_alloc, \
                lib.fn.cusafe_buffer_release
        check = lib.check
        ctx = ctypes.c_uint64(self.ctx.handle)
        nbytes = ctypes.c_size_t(size)
        h = ctypes.c_uint64(0)
        ref = ctypes.byref(h)
        sync = self.sync

        def sample():
            t0 = now()
            for _ in range(count):
                st = alloc(ref, ctx, 0, nbytes)
                if st:
                    check(st)
                st = release(h)
                if st:
                    check(st)
            t = now() - t0
            sync()
            return t / count / 1e3

        def fresh_sample():
            t0 = now()
            for _ in range(count):
                out = new()
                st = alloc(byref(out), ctx, 0, nbytes)
                if st:
                    check(st)
                st = release(out)
                if st:
                    check(st)
            t = now() - t0
            sync()
            return t / count / 1e3
        new, byref = ctypes.c_uint64, ctypes.byref
        return fresh_sample if fresh else sample

    def refcount_sample(self, count):
        """retain_handle + release_handle of a Buffer's handle."""
        retain, release, h = self.cs.retain_handle, self.cs.release_handle, \
            self.dc.handle

        def sample():
            t0 = now()
            for _ in range(count):
                retain(h)
                release(h)
            return (now() - t0) / count / 1e3
        return sample

    def empty16_samples(self, batches):
        """An empty kernel of 16 parameters (4 pointers, 12 integers),
        compiled at run time: Kernel.launch and a prepared launch."""
        params = ", ".join(["float *p%d" % i for i in range(4)] +
                           ["long long v%d" % i for i in range(12)])
        src = 'extern "C" __global__ void empty16(%s) {}' % params
        self.empty_module = self.cs.Module.compile(self.ctx, src)
        k = self.empty_module.kernel("empty16")
        bufs = [self.da, self.db, self.dc, self.dc]
        args = bufs + list(range(12))
        sync = self.sync

        def launched():
            total = 0
            for _ in range(batches):
                t0 = now()
                for _ in range(BATCH):
                    k.launch(1, 32, *args)
                total += now() - t0
                sync()
            return total / (batches * BATCH) / 1e3
        run = k.prepare(1, 32, *args)

        def prepared():
            total = 0
            for _ in range(batches):
                t0 = now()
                for _ in range(BATCH):
                    run()
                total += now() - t0
                sync()
            return total / (batches * BATCH) / 1e3
        return launched, prepared

    def close(self):
        objs = [self.kernel, self.module, self.dc, self.db, self.da]
        if getattr(self, "empty_module", None) is not None:
            objs.insert(0, self.empty_module)
        for obj in objs:
            obj.close()
        self.ctx.synchronize()
        self.ctx.close()


# --------------------------------------------------------------------------
# CuPy
# --------------------------------------------------------------------------

class CupyPeer:
    def __init__(self, device, inputs):
        try:
            import cupy
        except Exception as e:  # ImportError, or a CUDA mismatch at import
            raise Skip("cupy cannot be imported (%s)" % e)
        if np is None:
            raise Skip("numpy is not installed")
        self.cupy = cupy
        self.version = cupy.__version__
        cupy.cuda.Device(device).use()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        a, b, want = inputs
        self.a = cupy.asarray(np.frombuffer(a, dtype=np.float32))
        self.b = cupy.asarray(np.frombuffer(b, dtype=np.float32))
        self.c = cupy.full(N, np.nan, dtype=np.float32)
        self.kernel = cupy.RawKernel(VECADD_SOURCE, "vecadd_f32")
        cupy.cuda.Device().synchronize()
        with self.stream:
            self.kernel((GRID,), (BLOCK,), (self.c, self.a, self.b,
                                            np.uint64(N)))
        self.stream.synchronize()
        check_result("CuPy RawKernel", cupy.asnumpy(self.c).tobytes(), want)
        get = getattr(cupy.cuda, "get_allocator", None)
        self.default_allocator = get() if get is not None else \
            cupy.get_default_memory_pool().malloc

    def launch_sample(self, batches):
        k, s = self.kernel, self.stream
        args = (self.c, self.a, self.b, np.uint64(N))
        grid, block = (GRID,), (BLOCK,)

        def sample():
            total = 0
            with s:
                for _ in range(batches):
                    t0 = now()
                    for _ in range(BATCH):
                        k(grid, block, args)
                    total += now() - t0
                    s.synchronize()
            return total / (batches * BATCH) / 1e3
        return sample

    def allocators(self, skips):
        """(name, allocator) pairs to time, those that this CuPy has; the
        others go to `skips`."""
        cupy = self.cupy
        out = [("CuPy cupy.empty + del, caching pool (default)",
                self.default_allocator),
               ("CuPy cupy.empty + del, no pool (cudaMalloc/cudaFree)",
                None)]
        try:
            pool = cupy.cuda.MemoryAsyncPool()
            out.append(("CuPy cupy.empty + del, MemoryAsyncPool "
                        "(cudaMallocAsync)", pool.malloc))
        except Exception as e:
            skips.append(("CuPy MemoryAsyncPool", str(e)))
        return out

    def alloc_sample(self, size, count, allocator):
        cupy = self.cupy
        empty, uint8 = cupy.empty, cupy.uint8
        set_allocator = cupy.cuda.set_allocator
        default = self.default_allocator
        sync = cupy.cuda.Device().synchronize

        def sample():
            set_allocator(allocator)
            try:
                t0 = now()
                for _ in range(count):
                    x = empty(size, dtype=uint8)
                    del x
                t = now() - t0
                sync()
            finally:
                set_allocator(default)
            return t / count / 1e3
        return sample

    def check_allocator(self, allocator):
        cupy = self.cupy
        cupy.cuda.set_allocator(allocator)
        try:
            x = cupy.arange(1000, dtype=cupy.int32)
            if int(x.sum()) != 499500:
                raise RuntimeError("CuPy computed a wrong sum")
            del x
        finally:
            cupy.cuda.set_allocator(self.default_allocator)


# --------------------------------------------------------------------------
# cuda.core
# --------------------------------------------------------------------------

def _cuda_core():
    """The cuda.core names this script uses, from the stable namespace
    (newer releases) or cuda.core.experimental (0.1 to 0.3)."""
    errors = []
    for module in ("cuda.core", "cuda.core.experimental"):
        try:
            mod = __import__(module, fromlist=["Device"])
            names = {n: getattr(mod, n) for n in
                     ("Device", "LaunchConfig", "Program", "launch")}
            names["ProgramOptions"] = getattr(mod, "ProgramOptions", None)
            names["module"] = module
            return names
        except Exception as e:
            errors.append("%s: %s" % (module, e))
    raise Skip("cuda.core cannot be imported (%s)" % "; ".join(errors))


def _memcpy():
    """A cudaMemcpy for raw addresses: cuda.bindings (which cuda.core needs
    anyway), else CuPy's runtime module."""
    try:
        try:
            from cuda.bindings import runtime as rt
        except ImportError:
            from cuda import cudart as rt

        def copy(dst, src, size, kind_name):
            kind = getattr(rt.cudaMemcpyKind, kind_name)
            err, = rt.cudaMemcpy(dst, src, size, kind)
            if int(err) != 0:
                raise RuntimeError("cudaMemcpy failed: %s" % err)
        return copy
    except Exception:
        pass
    try:
        import cupy

        def copy(dst, src, size, kind_name):
            kind = {"cudaMemcpyHostToDevice": 1,
                    "cudaMemcpyDeviceToHost": 2}[kind_name]
            cupy.cuda.runtime.memcpy(dst, src, size, kind)
        return copy
    except Exception:
        raise Skip("neither cuda.bindings nor CuPy is there to copy the "
                   "result back for the check")


def _address(obj):
    return ctypes.addressof(ctypes.c_char.from_buffer(obj))


class CudaCorePeer:
    def __init__(self, device, inputs):
        if np is None:
            raise Skip("numpy is not installed")
        cc = _cuda_core()
        self.cc = cc
        try:
            from importlib.metadata import version
            self.version = version("cuda-core")
        except Exception:
            self.version = "?"
        try:
            dev = cc["Device"](device)
            dev.set_current()
            self.dev = dev
            self.stream = dev.create_stream()
            cap = dev.compute_capability
            arch = "sm_%d%d" % (cap[0], cap[1])
            if cc["ProgramOptions"] is not None:
                prog = cc["Program"](VECADD_SOURCE, code_type="c++",
                                     options=cc["ProgramOptions"](arch=arch))
                module = prog.compile("cubin")
            else:  # 0.1: options go to compile()
                prog = cc["Program"](VECADD_SOURCE, "c++")
                module = prog.compile("cubin", options=("-arch=" + arch,))
            self.kernel = module.get_kernel("vecadd_f32")
            self.bufs = [dev.allocate(4 * N, stream=self.stream)
                         for _ in range(3)]
            self.stream.sync()
        except Skip:
            raise
        except Exception as e:
            raise Skip("%s %s: setup failed: %s: %s"
                       % (cc["module"], self.version, type(e).__name__, e))
        copy = _memcpy()
        a, b, want = inputs
        out = poison()
        pa, pb, pc = (int(buf.handle) for buf in self.bufs)
        copy(pa, _address(a), 4 * N, "cudaMemcpyHostToDevice")
        copy(pb, _address(b), 4 * N, "cudaMemcpyHostToDevice")
        copy(pc, _address(out), 4 * N, "cudaMemcpyHostToDevice")
        self.launch = self._find_launch(pa, pb, pc)
        self.stream.sync()
        copy(_address(out), pc, 4 * N, "cudaMemcpyDeviceToHost")
        check_result("cuda.core launch", out.tobytes(), want)

    def _find_launch(self, pa, pb, pc):
        """launch(stream, config, kernel, *args) since 0.2; before,
        launch(kernel, config, *args) with the stream in the config.
        Buffers are passed as cuda.core Buffers, else as raw addresses."""
        cc, s, k = self.cc, self.stream, self.kernel
        LaunchConfig, launch = cc["LaunchConfig"], cc["launch"]
        n = np.uint64(N)
        arg_sets = ((self.bufs[2], self.bufs[0], self.bufs[1], n),
                    (ctypes.c_void_p(pc), ctypes.c_void_p(pa),
                     ctypes.c_void_p(pb), n))
        errors = []
        for args in arg_sets:
            try:
                config = LaunchConfig(grid=GRID, block=BLOCK)

                def new(config=config, args=args):
                    launch(s, config, k, *args)
                new()
                return new
            except Exception as e:
                errors.append("%s: %s" % (type(e).__name__, e))
            try:
                config = LaunchConfig(grid=GRID, block=BLOCK, stream=s)

                def old(config=config, args=args):
                    launch(k, config, *args)
                old()
                return old
            except Exception as e:
                errors.append("%s: %s" % (type(e).__name__, e))
        raise Skip("%s %s: no known launch() form works (%s)"
                   % (cc["module"], self.version, "; ".join(errors)))

    def launch_sample(self, batches):
        launch, sync = self.launch, self.stream.sync

        def sample():
            total = 0
            for _ in range(batches):
                t0 = now()
                for _ in range(BATCH):
                    launch()
                total += now() - t0
                sync()
            return total / (batches * BATCH) / 1e3
        return sample

    def alloc_sample(self, size, count):
        dev, s = self.dev, self.stream

        def sample():
            t0 = now()
            for _ in range(count):
                dev.allocate(size, stream=s).close(s)
            t = now() - t0
            s.sync()
            return t / count / 1e3
        return sample


# --------------------------------------------------------------------------
# Groups
# --------------------------------------------------------------------------

def report_group(group, names, results, own, reference):
    """Reports the first `own` rows (the package as imported), then the
    other implementation's rows of `group` (OTHER), then the rest; each
    ratio against the values `reference`."""
    rows = list(zip(names, results))
    rows[own:own] = OTHER["rows"].get(group, [])
    for name, values in rows:
        report(group, name, values, reference)


def group_launch(cs, cupy_peer, core_peer, samples, batches):
    group_header("launch", "vecadd of %d floats (grid %d x block %d), us "
                 "per launch, host side (%d launches per sample, drained "
                 "every %d)" % (N, GRID, BLOCK, batches * BATCH, BATCH))
    names, fns = [cs.label + " Kernel.launch(grid, block, c, a, b, n)"], \
        [cs.launch_sample(batches)]
    skips = []
    name, fn = cs.prepared_sample(batches)
    names.append(name)
    fns.append(fn)
    if isinstance(cupy_peer, Skip):
        skips.append(("CuPy RawKernel", str(cupy_peer)))
    elif cupy_peer is not None:
        names.append("CuPy %s RawKernel(grid, block, args)"
                     % cupy_peer.version)
        fns.append(cupy_peer.launch_sample(batches))
    if isinstance(core_peer, Skip):
        skips.append(("cuda.core launch", str(core_peer)))
    elif core_peer is not None:
        names.append("cuda.core %s launch(stream, config, kernel, ...)"
                     % core_peer.version)
        fns.append(core_peer.launch_sample(batches))
    results = measure(fns, samples, 2)
    report_group("launch", names, results, 2, results[0])
    floor = measure([cs.ctypes_floor_sample(batches)], samples, 1)[0]
    report("launch", "(reference) an empty ctypes call into libcusafe",
           floor)
    for name, why in skips:
        skipped(name, why)


def group_alloc(cs, cupy_peer, core_peer, samples, count):
    for size, label in ((256, "256 B"), (64 * 1024, "64 KiB")):
        group_header("alloc", "one device allocation of %s and its release, "
                     "us, host side (%d per sample)" % (label, count))
        names = [cs.label + " ctx.alloc(size).close()",
                 "cusafe, ctypes calls of buffer_alloc + buffer_release",
                 "  the same, a new c_uint64 and byref() per allocation"]
        fns = [cs.alloc_sample(size, count), cs.alloc_raw_sample(size, count),
               cs.alloc_raw_sample(size, count, fresh=True)]
        skips = []
        if isinstance(cupy_peer, Skip):
            skips.append(("CuPy cupy.empty", str(cupy_peer)))
        elif cupy_peer is not None:
            for name, allocator in cupy_peer.allocators(skips):
                try:
                    cupy_peer.check_allocator(allocator)
                except Exception as e:
                    skips.append((name, "%s: %s" % (type(e).__name__, e)))
                    continue
                names.append(name)
                # cudaMalloc/cudaFree synchronise the device: fewer of them.
                fns.append(cupy_peer.alloc_sample(
                    size, count if allocator is not None else count // 4,
                    allocator))
        if isinstance(core_peer, Skip):
            skips.append(("cuda.core Device.allocate", str(core_peer)))
        elif core_peer is not None:
            fn = core_peer.alloc_sample(size, count)
            try:
                fn()
                names.append("cuda.core dev.allocate(size).close()")
                fns.append(fn)
            except Exception as e:
                skips.append(("cuda.core dev.allocate(size).close()",
                              "%s: %s" % (type(e).__name__, e)))
        results = measure(fns, samples, 2)
        report_group("alloc " + label, names, results, 1, results[0])
        for name, why in skips:
            skipped(name, why)


def group_extra(cs, samples, batches, count):
    group_header("extra", "us, host side: a handle's retain + release "
                 "(%d per sample); an empty kernel of 16 parameters (4 "
                 "buffers, 12 ints; %d launches per sample)"
                 % (count, batches * BATCH))
    other = OTHER["rows"].get("extra", [])
    results = measure([cs.refcount_sample(count)], samples, 1)
    report("extra", cs.label + " retain_handle + release_handle", results[0])
    for name, values in other:
        if "retain_handle" in name:
            report("extra", name, values)
    try:
        launched, prepared = cs.empty16_samples(batches)
    except cs.cs.CusafeError as e:
        skipped("empty kernel, 16 parameters", str(e))
        return
    results = measure([launched, prepared], samples, 2)
    report("extra", cs.label + " Kernel.launch, empty kernel, 16 args",
           results[0], results[0])
    report("extra", cs.label + " Kernel.prepare(...)(), empty kernel, 16 "
           "args", results[1], results[0])
    for name, values in other:
        if "retain_handle" not in name:
            report("extra", name, values, results[0])


# The targets, the accelerator's: (the group, the row measured, the row it
# is compared with, the most the ratio of their medians may be), matched by
# the start of the rows' names; with None for the row compared with, the
# most its median may be, in us.
TARGETS = [
    ("launch", "cusafe (C) Kernel.launch", "cuda.core", 0.90),
    ("launch", "cusafe (C) Kernel.launch", "CuPy", 0.85),
    ("launch", "cusafe (C) Kernel.prepare", "cuda.core", 0.80),
]
for _size in ("256 B", "64 KiB"):
    TARGETS += [("alloc " + _size, "cusafe (C) ctx.alloc", "cuda.core", 0.80),
                ("alloc " + _size, "cusafe (C) ctx.alloc",
                 "CuPy cupy.empty + del, caching pool", 0.80)]
TARGETS += [("extra", "cusafe (C) retain_handle + release_handle", None,
             0.25)]


def report_targets():
    """Prints each target's ratio with "met" or "NOT met", as bench/bench
    does; a target whose rows were not measured is listed as skipped."""
    met, missed = 0, []
    print("\ntargets (ratio of medians, cusafe / peer; or us):")
    for group, mine, peer, limit in TARGETS:
        rows = [r for r in ROWS if r[0] == group]
        a = next((r[2]["median"] for r in rows if r[1].startswith(mine)),
                 None)
        if peer is None:
            what = "[%s] %s" % (group, mine)
            b, unit = 1.0, " us"
        else:
            what = "[%s] %s / %s" % (group, mine, peer)
            b = next((r[2]["median"] for r in rows
                      if r[1].startswith(peer)), None)
            unit = "x"
        if a is None or b is None:
            print("  %-70s skipped (not measured)" % what)
            continue
        ratio = a / b
        ok = ratio <= limit
        met += ok
        if not ok:
            missed.append(what)
        print("  %-70s %.3f  <=%.2f%s %s" % (what, ratio, limit, unit,
                                           "met" if ok else "NOT met"))
    print("targets: %d met, %d NOT met" % (met, len(missed)))
    for what in missed:
        print("  NOT met: " + what)


def run_other(impl, groups, opt, samples):
    """Times the other implementation than `impl` (the one imported) in a
    child process, first, into OTHER: the package cannot switch within a
    process, since its classes are built on the one chosen at import.
    Fails (exit 2) where the child fails; OTHER["skip"] says why there are
    no rows where the other implementation cannot run here."""
    other = "python" if impl == "c" else "c"
    OTHER["label"] = label_of(other)
    env = dict(os.environ)
    if other == "python":
        env["CUSAFE_PURE_PYTHON"] = "1"
    else:
        env.pop("CUSAFE_PURE_PYTHON", None)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        cmd = [sys.executable, os.path.abspath(__file__),
               "--rows-to=" + out, "--implementation=" + other,
               "--only=" + ",".join(groups), "--samples=%d" % samples,
               "--device=%d" % opt.device] + (["--quick"] if opt.quick
                                              else [])
        r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, universal_newlines=True)
        why = r.stderr.strip().replace("bench.py: ", "")
        if r.returncode == 77:
            OTHER["skip"] = why
            return
        if r.returncode != 0:
            fail("%s, in a child process (exit %d): %s"
                 % (OTHER["label"], r.returncode, why))
        with open(out) as f:
            data = json.load(f)
    for group, name, values in data["rows"]:
        OTHER["rows"].setdefault(group, []).append((name, values))


def main():
    parser = argparse.ArgumentParser(
        description="cusafe's Python package, with its C accelerator and on "
        "ctypes alone, next to CuPy and cuda.core")
    parser.add_argument("--quick", action="store_true",
                        help="fewer samples and launches")
    parser.add_argument("--only", default=None,
                        help="comma-separated groups: launch, alloc, extra "
                        "(the C "
                        "benchmark's other groups are ignored here)")
    parser.add_argument("--samples", type=int, default=0)
    parser.add_argument("--csv", nargs="?", const="-", default=None,
                        help="also write the rows as CSV (to FILE, or to "
                        "stdout after the table)")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--one", action="store_true",
                        help="time the implementation imported only, not "
                        "the other one too")
    # The child process of run_other: the implementation it must run, and
    # the file that takes its rows.
    parser.add_argument("--implementation", choices=("c", "python"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--rows-to", default=None, help=argparse.SUPPRESS)
    opt = parser.parse_args()

    groups = ["launch", "alloc", "extra"]
    if opt.only is not None:
        asked = [g for g in opt.only.split(",") if g]
        known = {"launch", "alloc", "extra", "objects", "copy", "refcount",
                 "shutdown"}
        unknown = [g for g in asked if g not in known]
        if unknown:
            fail("unknown group %s" % ", ".join(unknown))
        groups = [g for g in groups if g in asked]
        if not groups:
            print("bench.py: no Python group (launch, alloc, extra) selected; "
                  "nothing to do")
            return 0
    samples = opt.samples or (7 if opt.quick else 21)
    if not 1 <= samples <= 1000:
        fail("--samples must be 1 to 1000")
    batches = 2 if opt.quick else 4
    count = 128 if opt.quick else 256

    try:
        import cusafe
    except ImportError as e:
        fail("cannot import the binding (%s); install it (make install, pip "
             "install ./python) or set PYTHONPATH to python/" % e)
    impl = cusafe.implementation()
    child = opt.rows_to is not None
    if child and impl != opt.implementation:
        try:
            import cusafe._speedups  # noqa: F401
            why = "CUSAFE_PURE_PYTHON=1"
        except ImportError as e:
            why = "not built for %s (%s)" % (sys.executable, e)
        print("bench.py: the C accelerator does not run here: %s" % why,
              file=sys.stderr)
        return 77
    try:
        ndev = cusafe.device_count()
    except cusafe.NoDeviceError as e:
        print("bench.py: no CUDA device found (%s)" % e, file=sys.stderr)
        return 1
    except (cusafe.CusafeError, cusafe.LibraryNotFoundError) as e:
        fail(str(e))
    if not 0 <= opt.device < ndev:
        fail("device %d does not exist (%d found)" % (opt.device, ndev))

    start = time.monotonic()
    if not (child or opt.one):
        run_other(impl, groups, opt, samples)
    inputs = make_inputs()
    try:
        cs = CusafePeer(cusafe, opt.device, inputs)
    except (cusafe.CusafeError, RuntimeError) as e:
        fail("%s: %s" % (label_of(impl), e))
    peers = [None, None]  # none in a child process
    if not child:
        peers = []
        for cls in (CupyPeer, CudaCorePeer):
            try:
                peers.append(cls(opt.device, inputs))
            except Skip as e:
                peers.append(e)
            except Exception as e:
                # A peer that runs but computes a wrong sum, or fails in a
                # way this script does not expect, is reported and left
                # out.
                peers.append(Skip("%s: %s" % (type(e).__name__, e)))

    props = cusafe.device_properties(opt.device)
    print("cusafe Python benchmark: cusafe %s" % cusafe.version())
    print("  binding:   %s" % os.path.abspath(cusafe.__file__))
    print("  library:   %s" % cusafe.library().path)
    print("  GPU %d:     %s, compute capability %d.%d" % (
        opt.device, props.device_name, props.compute_capability_major,
        props.compute_capability_minor))
    print("  Python:    %s %s, numpy %s" % (
        platform.python_implementation(), platform.python_version(),
        np.__version__ if np is not None else "not installed"))
    print("  package:   %s, timed with the peers" % cs.label)
    if OTHER["label"] is not None:
        print("  %-11s%s" % ("other:", "%s, timed first in a child "
                             "process" % OTHER["label"] if not OTHER["skip"]
                             else "%s skipped: %s" % (OTHER["label"],
                                                      OTHER["skip"])))
    for name, peer in (("CuPy", peers[0]), ("cuda.core", peers[1])):
        if peer is not None:
            print("  %-11s%s" % (name + ":", "skipped: %s" % peer
                                if isinstance(peer, Skip) else peer.version))
    print("  method:    medians of interleaved samples (%d) with min-max; "
          "cusafe/this = the median of the group's first row / this row's"
          % samples)

    try:
        if "launch" in groups:
            group_launch(cs, peers[0], peers[1], samples, batches)
        if "alloc" in groups:
            group_alloc(cs, peers[0], peers[1], samples, count)
        if "extra" in groups:
            group_extra(cs, samples, batches, count)
    except cusafe.CusafeError as e:
        fail("%s: %s" % (cs.label, e))
    cs.close()
    if child:
        with open(opt.rows_to, "w") as f:
            json.dump({"implementation": impl,
                       "rows": [[group, name, values]
                                for group, name, values in VALUES
                                if name.startswith(cs.label)]}, f)
        return 0
    report_targets()
    print("total: %.1f s" % (time.monotonic() - start))
    if opt.csv == "-":
        print()
        write_csv(sys.stdout)
    elif opt.csv:
        with open(opt.csv, "w") as f:
            write_csv(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
