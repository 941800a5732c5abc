#!/usr/bin/env python3
"""nccl_allreduce.py -- an all-reduce of cusafe buffers through PyTorch's
NCCL backend, one process per GPU, the buffers let go of while the
collective is still in flight.

Each rank, a process of its own (multiprocessing, spawn start method),
makes a cusafe context on its GPU and a device buffer of N float32 whose
element i is r + 1 + i % 7 on rank r, and hands it to PyTorch zero-copy
(Buffer.as_array, then torch.from_dlpack).  The collective runs on a
PyTorch stream that cusafe knows too (cusafe.Stream.wrap); before queueing
it, Stream.use_buffers() tells cusafe that this stream uses the buffer, as
cusafe asks of work that other libraries queue by address (cuBLAS, NCCL):
the stream then waits for the buffer's earlier work, and the buffer's
memory is freed only after the stream's later work.

dist.all_reduce returns once the collective is queued, not done.  Right
then the rank queues a copy of the result to pinned memory and lets go of
everything that names the buffer -- the tensor, the Array, the Buffer --
without waiting, and allocates a buffer of the same size filled with NaNs
at once: had the memory been freed under the collective, that buffer
could take it over and the sums would come out wrong.  The rank then waits
for its stream and checks every element on the host: the sum over the W
ranks, W (W + 1) / 2 + W (i % 7), exactly.

    CUSAFE_LIBRARY=/path/to/libcusafe.so python3 nccl_allreduce.py

One process per GPU that both cusafe and PyTorch see.  The processes meet
through a file in a temporary directory (no network).  NVLink multicast
stays off: NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are
set for the ranks unless already set, and NCCL_DEBUG=WARN unless set
(NCCL writes its messages to stdout).

Why a PyTorch stream wrapped by cusafe, not a cusafe stream seen by
PyTorch (torch.cuda.ExternalStream): the DLPack tensor's deleter names the
stream PyTorch gave it, and may run late (on PyTorch's threads, or at
exit); PyTorch's streams live as long as the process, so that stream is
always there, whereas a cusafe stream would have to outlive every such
tensor.

Exit status: 0 when every element of every rank is right; 77, with a line
"SKIP: <why>" on stdout, without two GPUs, PyTorch with its NCCL backend,
or cusafe's DLPack support (the test suite's "skipped", as the exit
scenarios have it); 1 on any failure, which stderr explains.
"""

from __future__ import annotations

import array
import datetime
import multiprocessing
import multiprocessing.connection
import os
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

import cusafe

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import SpawnProcess

N = 1 << 20  # floats per rank
PATTERN = 7  # element i of rank r is r + 1 + i % PATTERN
TIME_LIMIT = 100.0  # seconds for all ranks, start to end
PG_TIMEOUT = datetime.timedelta(seconds=60)  # rendezvous and collective

# Set for the ranks unless set already.  NVLink multicast (NVLS) must stay
# off: on shared machines a program using it can put the GPUs out of
# service.
ENVIRONMENT = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "NCCL_DEBUG": "WARN",
}

# What a rank sends back: rank, device name, elements wrong, the first
# wrong one in words ("" if none).
RankResult = Tuple[int, str, int, str]


class Skip(Exception):
    """The machine cannot run the example; the message says why."""


def expected_values(world: int, n: int) -> array.array[float]:
    """The all-reduced buffer: element i is the sum over ranks r < world
    of r + 1 + i % PATTERN."""
    base = world * (world + 1) // 2
    out = array.array("f", [float(base + world * k)
                            for k in range(PATTERN)]) * (n // PATTERN + 1)
    del out[n:]
    return out


def rank_values(rank: int, n: int) -> array.array[float]:
    """Rank `rank`'s buffer before the all-reduce."""
    out = array.array("f", [float(rank + 1 + k)
                            for k in range(PATTERN)]) * (n // PATTERN + 1)
    del out[n:]
    return out


def all_reduce(rank: int, world: int, n: int) -> RankResult:
    """Rank `rank`'s part, in a process group that is set up: all-reduces
    a cusafe buffer through PyTorch, releasing it while the collective is
    in flight, and checks the result."""
    import torch
    import torch.distributed as dist
    from torch.utils.dlpack import from_dlpack

    device = torch.device("cuda", rank)
    ctx = cusafe.Context(rank)
    # A PyTorch stream (it lives as long as the process), as a cusafe
    # Stream: one CUDA stream for both libraries.  (torch.cuda.Stream's
    # constructor is not annotated.)
    new_stream: Callable[..., torch.cuda.Stream] = torch.cuda.Stream
    torch_stream = new_stream(device=device)
    stream = cusafe.Stream.wrap(torch_stream, ctx)

    buf = cusafe.Buffer.from_host(ctx, rank_values(rank, n))
    out = ctx.alloc(4 * n, cusafe.MEMORY_HOST_PINNED)
    with torch.cuda.stream(torch_stream):
        # The Array and the tensor each hold a reference on the buffer.
        arr = buf.as_array("float32", (n,), stream=stream)
        tensor = from_dlpack(arr)
        if tensor.data_ptr() != buf.interop_pointer():
            raise RuntimeError("the tensor does not share the buffer's "
                               "memory")
        # Foreign work on the stream by address: tell cusafe first.
        stream.use_buffers(buf)
        dist.all_reduce(tensor)  # queued on the stream, not done
        out.copy_from(buf, stream=stream)  # after it, on the same stream
        # Nothing that names the buffer is left while the collective and
        # the copy still run: work in flight keeps its inputs alive, and
        # the memory is freed, stream-ordered, after them.
        del tensor
        arr.close()
        buf.close()
    # A new buffer of the same size, filled with NaNs right away: it would
    # take over the old memory if that had been freed too soon.
    junk = ctx.alloc(4 * n)
    junk.fill(0xFF)

    stream.synchronize()
    got = array.array("f", bytes(4 * n))
    out.read(got)
    want = expected_values(world, n)
    wrong, first = 0, ""
    if got != want:
        bad = [i for i in range(n) if got[i] != want[i]]
        wrong = len(bad)
        i = bad[0]
        first = "element %d is %r, expected %r" % (i, got[i], want[i])
    name = ctx.properties.device_name
    for obj in (junk, out, stream, ctx):
        obj.close()
    return rank, name, wrong, first


def set_environment() -> None:
    """ENVIRONMENT's variables, where unset."""
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)


def run_rank(rank: int, world: int, init_method: str, n: int,
             conn: Connection) -> None:
    """A rank's process: joins the NCCL process group on GPU `rank`,
    all-reduces, sends its RankResult on conn, destroys the group.  An
    exception ends the process with status 1 and its traceback on
    stderr."""
    set_environment()
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    # device_id binds the group to the GPU and sets up NCCL now.
    dist.init_process_group("nccl", init_method=init_method, rank=rank,
                            world_size=world, timeout=PG_TIMEOUT,
                            device_id=torch.device("cuda", rank))
    try:
        result = all_reduce(rank, world, n)
    finally:
        dist.destroy_process_group()
    conn.send(result)
    conn.close()


def ranks() -> int:
    """The number of ranks: the GPUs that both cusafe and PyTorch see.
    Raises Skip where the example cannot run."""
    try:
        import torch
    except ImportError:
        raise Skip("PyTorch is not installed") from None
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_nccl_available():
        raise Skip("PyTorch has no NCCL backend "
                   "(torch.distributed.is_nccl_available() is False)")
    if "cusafe_buffer_to_dlpack" in cusafe.library().missing:
        raise Skip("libcusafe was built without DLPack")
    try:
        count = cusafe.device_count()
    except cusafe.NoDeviceError as e:
        raise Skip(str(e)) from None
    count = min(count, int(torch.cuda.device_count()))
    if count < 2:
        raise Skip("%d GPU: the all-reduce needs 2" % count)
    return count


def stop(procs: List[SpawnProcess]) -> None:
    """Ends the ranks still running."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()


def wait(procs: List[SpawnProcess]) -> Optional[str]:
    """Waits for the ranks to end, at most TIME_LIMIT seconds; None when
    all ended with status 0, else what went wrong (the others are then
    stopped by the caller: a rank waits for the others in every
    collective)."""
    deadline = time.monotonic() + TIME_LIMIT
    running = list(procs)
    while running:
        left = deadline - time.monotonic()
        if left <= 0:
            return "timed out after %gs, %s still running" % (
                TIME_LIMIT, ", ".join(p.name for p in running))
        multiprocessing.connection.wait([p.sentinel for p in running], left)
        for p in list(running):
            if p.exitcode is None:
                continue
            running.remove(p)
            if p.exitcode != 0:
                return "%s ended with status %d" % (p.name, p.exitcode)
    return None


def main() -> int:
    try:
        world = ranks()
    except Skip as e:
        print("SKIP: %s" % e)
        return 77
    set_environment()
    mp = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="nccl_allreduce.") as tmp:
        init_method = "file://" + os.path.join(tmp, "rendezvous")
        procs: List[SpawnProcess] = []
        conns: List[Connection] = []
        try:
            for rank in range(world):
                receiver, sender = mp.Pipe(duplex=False)
                p = mp.Process(target=run_rank, name="rank %d" % rank,
                               args=(rank, world, init_method, N, sender))
                p.start()
                sender.close()  # the child's end
                procs.append(p)
                conns.append(receiver)
            failed = wait(procs)
        finally:
            stop(procs)
        if failed:
            print("nccl_allreduce: %s" % failed, file=sys.stderr)
            return 1
        results: List[RankResult] = []
        for rank, conn in enumerate(conns):
            if not conn.poll():
                print("nccl_allreduce: rank %d sent no result" % rank,
                      file=sys.stderr)
                return 1
            results.append(conn.recv())

    total = 0
    for rank, name, wrong, first in results:
        print("rank %d: cuda:%d (%s), %d floats, zero-copy, %d wrong%s"
              % (rank, rank, name, N, wrong, ": " + first if first else ""))
        total += wrong
    print("nccl_allreduce: %d ranks, %d floats, %d wrong" % (world, N, total))
    if total:
        print("nccl_allreduce: %d elements wrong" % total, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
