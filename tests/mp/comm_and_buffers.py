"""Run by tests/test_collectives.py::test_sub_communicator_user_mpi_threads_and_buffer_inputs.

init(comm=...) on a sub-communicator, the user's own mpi4py calls beside the coordinator,
and inputs given through the buffer protocol and DLPack."""

import threading

import numpy as np
from _harness import check, check_close, expect_error, finish
from mpi4py import MPI

import scaleout as so

world = MPI.COMM_WORLD
wr, wn = world.rank, world.size

# Split the world into evens and odds: each half runs its own scaleout job.
half = world.Split(color=wr % 2, key=wr)
so.init(comm=half)
check(so.size() == half.size and so.rank() == half.rank, "scaleout runs on the given communicator")
got = so.allreduce(np.array([float(wr)]), op=so.Sum, name="half")
check_close(got, [sum(k for k in range(wn) if k % 2 == wr % 2)], "allreduce within the half")

# The user's mpi4py traffic on the main thread while the coordinator works on its own thread.
handles = [so.allreduce_async(np.full(1000, 1.0), op=so.Sum, name=f"bg{i}") for i in range(20)]
user = world.allreduce(wr, op=MPI.SUM)
check(user == wn * (wn - 1) // 2, "mpi4py allreduce beside scaleout")
for h in handles:
    check_close(so.synchronize(h), np.full(1000, float(half.size)), "background allreduce")

# Several threads submitting at once: synchronous calls, which run the coordinator on the
# calling thread when it is free (Note [Caller drives]), beside one another and beside
# asynchronous ones in flight from the main thread.
results = {}


def worker(i):
    for k in range(100):
        x = np.full(3, float(i + k))
        so.allreduce_(x, op=so.Sum, name=f"thread{i}")
        if not np.array_equal(x, np.full(3, float((i + k) * half.size))):
            results[i] = ("allreduce_", k, x)
            return
        b = so.broadcast(np.full(2, float(half.rank + k)), root_rank=0, name=f"bcast{i}")
        if not np.array_equal(b, np.full(2, float(k))):
            results[i] = ("broadcast", k, b)
            return
        so.barrier()
    results[i] = so.allreduce(np.full(3, float(i)), op=so.Sum, name=f"thread{i}")


threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for k in range(50):
    h = so.allreduce_async(np.full(500, float(k)), op=so.Sum, name="beside")
    check_close(so.synchronize(h), np.full(500, float(k * half.size)), "async beside threads")
for t in threads:
    t.join()
for i in range(4):
    check_close(results[i], np.full(3, float(i * half.size)), f"thread {i}")
so.shutdown()

# Back on the world: buffer-protocol and DLPack inputs.
so.init()


class DLPackOnly:
    """Exposes an array only through the DLPack protocol."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, **kwargs):
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


check_close(
    so.allreduce(DLPackOnly(np.full(4, 2.0, np.float32)), op=so.Sum, name="dl"),
    np.full(4, 2.0 * wn),
    "DLPack input",
)
buf = bytearray(np.full(8, wr + 1, np.uint8).tobytes())
out = so.allreduce(buf, op=so.Sum, name="bytes")
check(out.dtype == np.uint8 and out.tolist() == [wn * (wn + 1) // 2] * 8, "buffer-protocol input")
mv = memoryview(np.arange(6, dtype=np.int32))
check(so.allgather(mv, name="mv").tolist() == list(range(6)) * wn, "memoryview allgather")
expect_error(
    so.InvalidArgumentError,
    lambda: so.allreduce_(np.ones(3).setflags(write=False) or np.frombuffer(b"abc", np.uint8)),
    "writable",
    what="in-place on read-only memory",
)
so.shutdown()
finish()
