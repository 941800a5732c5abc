#!/usr/bin/env python3
"""vecadd.py -- add two float vectors with cusafe's built-in kernel.

Writes two arrays of N floats to the device, runs cusafe_vecadd_f32
(c[i] = a[i] + b[i]) with the launch configuration that cusafe suggests,
reads c back and compares it with the sum computed on the host.

    CUSAFE_LIBRARY=/path/to/libcusafe.so python3 vecadd.py [N]

Exit status: 0 when every element is right, 1 when the machine has no CUDA
driver or device (one line on stderr says which), 2 on any other failure.
"""
import array
import sys

import cusafe


def main(argv):
    n = int(argv[1]) if len(argv) > 1 else 1_000_000

    a = array.array("f", (float(i % 1000) * 0.5 for i in range(n)))
    b = array.array("f", (float(i % 7) - 3.25 for i in range(n)))
    # The host's sum, rounded to float like the device's.
    expected = array.array("f", (x + y for x, y in zip(a, b)))
    c = array.array("f", bytes(4 * n))

    with cusafe.Context(0) as ctx:
        name = ctx.properties.device_name
        with cusafe.Buffer.from_host(ctx, a) as da, \
                cusafe.Buffer.from_host(ctx, b) as db, \
                ctx.alloc(4 * n) as dc, \
                cusafe.Module.builtin(ctx) as module, \
                module.kernel("cusafe_vecadd_f32") as vecadd:
            grid, block = vecadd.suggest_config(n)
            # size_t n: a Python int is passed as a 64-bit integer.
            vecadd.launch(grid, block, dc, da, db, n)
            dc.read(c)  # ordered after the kernel

    error = max((abs(x - y) for x, y in zip(c, expected)), default=0.0)
    print("vecadd: %d floats, max error %g on %s" % (n, error, name))
    return 0 if error == 0 else 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except cusafe.NoDeviceError as e:
        what = "driver" if e.status == cusafe.Status.NO_DRIVER else "device"
        print("cusafe: no CUDA %s found" % what, file=sys.stderr)
        sys.exit(1)
    except (cusafe.CusafeError, cusafe.LibraryNotFoundError) as e:
        print("vecadd: %s" % e, file=sys.stderr)
        sys.exit(2)
