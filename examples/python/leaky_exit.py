#!/usr/bin/env python3
"""leaky_exit.py -- exit with everything still alive and work still queued.

Creates a context, streams, events, buffers, a view, the built-in module
and one of its kernels, queues a fill, copies and kernel launches without
waiting for them, and exits without releasing anything.  cusafe's exit
handler waits for the work and destroys it all, in order, before the CUDA
runtime tears itself down: the program ends with status 0 and nothing on
stderr.  (With CUSAFE_LEAK_REPORT=1 the library lists each handle still
alive at exit on stderr, one "cusafe: leak: ..." line each.)

Exit status: 0, or 1 when the machine has no CUDA driver or device (one
line on stderr says which), 2 on any other failure.
"""
import array
import sys

import cusafe

N = 1 << 20
live = []  # everything stays referenced until the interpreter exits


def keep(obj):
    live.append(obj)
    return obj


def main():
    ctx = keep(cusafe.Context(0))
    s1 = keep(ctx.stream(non_blocking=True))
    s2 = keep(ctx.stream())
    start = keep(ctx.event())
    done = keep(ctx.event(timing=False))
    x = keep(cusafe.Buffer.from_host(ctx, array.array("f", [1.0]) * N))
    y = keep(ctx.alloc(4 * N).set_label("leaky_exit.py: y"))
    z = keep(ctx.alloc(4 * N, cusafe.MEMORY_HOST_PINNED))
    tail = keep(y.view(4 * (N // 2), 4 * (N // 2)))
    module = keep(cusafe.Module.builtin(ctx))
    vecadd = keep(module.kernel("cusafe_vecadd_f32"))
    fill = keep(module.kernel("cusafe_fill_f32"))

    grid, block = vecadd.suggest_config(N)
    start.record(s1)
    y.fill(0, stream=s1)
    fill.launch(grid, block, tail, cusafe.F32(2.0), N // 2, stream=s1)
    for _ in range(8):  # queued, never waited for
        vecadd.launch(grid, block, y, x, y, N, stream=s1)
        z.copy_from(y, stream=s2)
    done.record(s2)
    print("leaky_exit: exiting with %d live handles and work queued"
          % len(live))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cusafe.NoDeviceError as e:
        what = "driver" if e.status == cusafe.Status.NO_DRIVER else "device"
        print("cusafe: no CUDA %s found" % what, file=sys.stderr)
        sys.exit(1)
    except (cusafe.CusafeError, cusafe.LibraryNotFoundError) as e:
        print("leaky_exit: %s" % e, file=sys.stderr)
        sys.exit(2)
