#!/usr/bin/env python3
"""graph_replay.py -- capture a chain of built-in kernels once, replay it.

On one stream, captures three launches over two views of one buffer:

    lo = 1.0            (cusafe_fill_f32 over the first half)
    lo *= 1.5           (cusafe_scale_f32)
    y[:h] += 2 * lo     (cusafe_axpy_f32)

then closes everything the graph uses but y -- the views, their buffer,
the kernels and the module: the graph holds them, so their memory stays
valid -- and replays the graph R times on a second stream.  Each replay
adds 3.0 to the first half of y, so y's first half ends at 0.5 + 3 R and
its second half stays 0.5; the host checks every element.

    CUSAFE_LIBRARY=/path/to/libcusafe.so python3 graph_replay.py [N [R]]

Exit status: 0 when every element is right, 1 when the machine has no CUDA
driver or device (one line on stderr says which), 2 on any other failure.
"""
import array
import sys

import cusafe


def main(argv):
    n = int(argv[1]) if len(argv) > 1 else 1 << 20
    replays = int(argv[2]) if len(argv) > 2 else 100
    h = n // 2

    with cusafe.Context(0) as ctx, \
            ctx.stream(non_blocking=True) as s, \
            ctx.stream(non_blocking=True) as t, \
            ctx.alloc(4 * n) as y:
        name = ctx.properties.device_name
        y.write(array.array("f", [0.5]) * n)

        x = ctx.alloc(4 * n)
        lo = x.view(0, 4 * h)
        module = ctx.load_builtin()
        fill = module.kernel("cusafe_fill_f32")
        scale = module.kernel("cusafe_scale_f32")
        axpy = module.kernel("cusafe_axpy_f32")
        grid, block = fill.suggest_config(h)
        with s.capture() as graph:
            fill.launch(grid, block, lo, cusafe.F32(1.0), h, stream=s)
            scale.launch(grid, block, lo, cusafe.F32(1.5), h, stream=s)
            axpy.launch(grid, block, y, cusafe.F32(2.0), lo, h, stream=s)
        # The graph holds what its work used: all of it may go now.
        for obj in (lo, x, fill, scale, axpy, module):
            obj.close()

        with graph:
            for _ in range(replays):
                graph.launch(t)  # ordered with other work on y
            got = array.array("f", bytes(4 * n))
            y.read(got)  # after the replays

    want_lo, want_hi = 0.5 + 3.0 * replays, 0.5
    wrong = sum(1 for i, v in enumerate(got)
                if v != (want_lo if i < h else want_hi))
    print("graph_replay: %d replays of 3 kernels over %d floats, %d wrong, "
          "on %s" % (replays, n, wrong, name))
    return 0 if wrong == 0 else 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except cusafe.NoDeviceError as e:
        what = "driver" if e.status == cusafe.Status.NO_DRIVER else "device"
        print("cusafe: no CUDA %s found" % what, file=sys.stderr)
        sys.exit(1)
    except (cusafe.CusafeError, cusafe.LibraryNotFoundError) as e:
        print("graph_replay: %s" % e, file=sys.stderr)
        sys.exit(2)
