"""Run by tests/test_process_sets.py::test_process_sets.

Process sets on the numpy-level API (Note [Process sets]), at 3 or 4 ranks.

Sets: A and B disjoint (n=4: [0, 2] and [1, 3]; n=3: [0] and [1, 2]), C overlapping both
([1, 2, 3]; n=3: [0, 1]), all registered at init; D added and removed while the others run;
F made by its members alone ([2, 3]; n=3: [2]), then G added by every rank."""

import numpy as np
from _harness import check, check_close, expect_error, main
from mpi4py import MPI

import scaleout as so

world = MPI.COMM_WORLD.Dup()  # the test's own messages, outside scaleout


def body():
    r, n = so.rank(), so.size()
    # As Horovod's init: a set given twice (its ranks in another order) is an error naming the
    # entry, and scaleout runs on: the next init, without it, gives the objects their ids.
    check(
        isinstance(REFUSED, ValueError)
        and "process_sets entry number 3 is a duplicate" in str(REFUSED),
        f"a set given twice at init: {REFUSED!r}",
    )
    check(DUPLICATE.process_set_id is None, f"a set given twice: {DUPLICATE}")
    A, B, C = SETS
    check(
        [A.process_set_id, B.process_set_id, C.process_set_id] == [1, 2, 3],
        f"ids in order of init: {A}, {B}, {C}",
    )
    mine, other = (A, B) if r in A.ranks else (B, A)
    check(mine.included() and not other.included(), "included()")
    check(mine.rank() == mine.ranks.index(r) and other.rank() == -1, "rank() within the set")
    check(mine.size() == len(mine.ranks), "size()")

    # Every collective, on the rank's own set; results in the set's order, roots the job's.
    got = so.allreduce(np.array([float(r + 1)]), op=so.Sum, process_set=mine, name="sum")
    check_close(got, [sum(q + 1 for q in mine.ranks)], "allreduce on the set")
    check_close(so.allgather(np.array([r]), process_set=mine), mine.ranks, "allgather")
    root = mine.ranks[-1]
    check_close(
        so.broadcast(np.array([r * 10]), root, process_set=mine),
        [root * 10],
        "broadcast from the job's rank of the set's last member",
    )
    k = len(mine.ranks)
    out = so.alltoall(np.arange(k) + 100 * r, process_set=mine)
    check_close(out, [100 * q + mine.rank() for q in mine.ranks], "alltoall")
    rows = so.reducescatter(np.ones((k, 2)) * (r + 1), op=so.Sum, process_set=mine)
    check_close(rows, np.ones((1, 2)) * sum(q + 1 for q in mine.ranks), "reducescatter")
    check(so.allgather_object(r, process_set=mine) == mine.ranks, "allgather_object")
    so.barrier(process_set=mine)

    # Concurrency: the other set's last rank submits only once this set's rank 0 has finished
    # 20 collectives, while the other set's first ranks already wait in theirs. If one set's
    # collectives waited on the other's, this would never end (the subprocess timeout).
    late_b = B.ranks[-1]
    first_a = A.ranks[0]
    if r == late_b:
        world.recv(source=first_a, tag=7)
    for i in range(20):
        so.allreduce(np.ones(3), name=f"step.{i}", process_set=mine)
    if r == first_a:
        world.send("done", dest=late_b, tag=7)

    # Overlapping: C shares ranks with A and B; a rank in two sets interleaves them.
    if C.included():
        v = so.allreduce(np.array([1.0]), op=so.Sum, process_set=C, name="c")
        check_close(v, [len(C.ranks)], "allreduce on the overlapping set")
    v = so.allreduce(np.array([1.0]), op=so.Sum, process_set=mine, name="after_c")
    check_close(v, [len(mine.ranks)], "own set after the overlapping one")

    # Names are per set: the same name on two sets at once is two collectives.
    h1 = so.allreduce_async(np.array([1.0]), op=so.Sum, name="same", process_set=mine)
    h2 = so.allreduce_async(np.array([2.0]), op=so.Sum, name="same")
    check_close(so.synchronize(h1), [len(mine.ranks)], "'same' on the set")
    check_close(so.synchronize(h2), [2.0 * n], "'same' on the global set")

    # Errors: not a member, at once; a mismatch inside a set, on its ranks only.
    expect_error(
        so.InvalidArgumentError,
        lambda: so.allreduce(np.ones(1), process_set=other),
        f"rank {r} is not in process set {other.process_set_id}",
        what="not a member",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: so.broadcast(np.ones(1), other.ranks[0], process_set=mine),
        f"root rank {other.ranks[0]} is not in process set {mine.process_set_id}",
        what="a root outside the set",
    )
    if len(mine.ranks) > 1:
        shape = (2,) if mine.rank() == 0 else (3,)
        expect_error(
            so.MismatchError,
            lambda: so.allreduce(np.ones(shape), name="bad", process_set=mine),
            "Mismatched",
            f"in process set {mine.process_set_id}, whose ranks",
            what="a mismatch inside the set",
        )

    # A deadlock inside a set (its ranks wait for differently named collectives) is found on
    # that set's ranks, naming the set; the set then goes on working.
    if len(mine.ranks) > 1:
        label = "dl.a" if mine.rank() == 0 else "dl.b"
        expect_error(
            so.DeadlockError,
            lambda: so.allreduce(np.ones(1), name=label, process_set=mine),
            f"in process set {mine.process_set_id}",
            what="a deadlock inside the set",
        )
        check_close(
            so.allreduce(np.array([1.0]), op=so.Sum, name="after_deadlock", process_set=mine),
            [len(mine.ranks)],
            "the set after a deadlock",
        )

    # Dynamic: D added while A and B exist, used, then removed; a removal with work in flight
    # fails naming the rank, changing nothing.
    D = so.add_process_set([0, n - 1])
    check(D.process_set_id == 4 and D.ranks == [0, n - 1], f"added {D}")
    expect_error(
        so.InvalidArgumentError,
        lambda: so.add_process_set([0, n - 1]),
        "has these ranks already",
        what="a duplicate set",
    )
    try:  # Note [Error details]: the existing set's id comes as data
        so.add_process_set([0, n - 1])
    except so.InvalidArgumentError as e:
        check(e.process_set_id == 4 and e.culprit_ranks == (), f"a duplicate's details: {e!r}")
    if D.included():
        check_close(so.allreduce(np.array([1.0]), op=so.Sum, process_set=D), [2.0], "on D")
    pending = None
    if r == 0:
        pending = so.allreduce_async(np.ones(1), name="unmatched", process_set=D)
    expect_error(
        so.InvalidArgumentError,
        lambda: so.remove_process_set(D),
        "still has collectives in flight on rank(s) 0",
        what="removing a busy set",
    )
    if r == n - 1:
        so.allreduce(np.ones(1), name="unmatched", process_set=D)
    if pending is not None:
        so.synchronize(pending)
    # Another object of D's ranks given to a second init (running already: it gets D's id, as
    # in Horovod); D's removal unregisters it too.
    again = so.ProcessSet([n - 1, 0])
    so.init(process_sets=[A, again])
    check(again.process_set_id == D.process_set_id, f"a second init's object: {again}")
    check(so.remove_process_set(D) is True, "removed")
    check(D.process_set_id is None, "a removed set is unregistered")
    check(again.process_set_id is None, f"every object of a removed set: {again}")
    expect_error(
        so.InvalidArgumentError,
        lambda: so.init(process_sets=[so.ProcessSet([0, n - 1])]),
        "is not registered",
        what="a second init naming a removed set",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: so.allreduce(np.ones(1), process_set=D),
        "is not registered",
        what="a removed set",
    )
    check(so.remove_process_set(so.global_process_set) is False, "the global set stays")

    # Adding and removing a set while collectives of other sets are in flight: big allreduces
    # on the rank's own set and on the global set are submitted first and waited for after.
    big = np.full(1 << 20, float(r + 1))
    pending = [
        so.allreduce_async(big, op=so.Sum, name="inflight.own", process_set=mine),
        so.allreduce_async(big, op=so.Sum, name="inflight.all"),
    ]
    E = so.add_process_set([n - 1, 0] if n > 2 else [0])
    if E.included():
        check_close(
            so.allreduce(np.array([1.0]), op=so.Sum, process_set=E),
            [len(E.ranks)],
            "a set added while others' collectives are in flight",
        )
    check(so.remove_process_set(E) is True, "removed while others' collectives are in flight")
    own, everyone = so.synchronize(pending[0]), so.synchronize(pending[1])
    check_close(own[:3], [sum(q + 1 for q in mine.ranks)] * 3, "in flight on the own set")
    check_close(everyone[:3], [n * (n + 1) / 2] * 3, "in flight on the global set")

    # A set made by its members alone (torch.distributed's new_group): the other ranks
    # take no part. Its id is one no member has given out; a set that every rank adds later
    # gets one id everywhere, after it; adding a set of its ranks is refused on every rank.
    from scaleout._process_set_registry import member_process_set

    members = [2, 3] if n == 4 else [2]  # no set has these ranks yet
    F = member_process_set(members) if r in members else None
    if F is not None:
        check(F.process_set_id == 6, f"the next id after D (4) and E (5): {F}")
        v = so.allreduce(np.array([float(r)]), op=so.Sum, process_set=F, name="f")
        check_close(v, [sum(members)], "allreduce on a set its members made")
        again = member_process_set(members)
        check(again.process_set_id == F.process_set_id, f"made again: the same set, {again}")
    if B.included():  # the ranks of a set that exists: that set
        check(member_process_set(B.ranks).process_set_id == 2, "a member-made set of B's ranks")
    G = so.add_process_set([0, n - 1])
    ids = world.allgather(G.process_set_id)
    check(ids == [7] * n, f"a set added after a member-made one: id 7 everywhere, not {ids}")
    expect_error(
        so.InvalidArgumentError,
        lambda: so.add_process_set(members),
        "has these ranks already",
        what="adding the ranks of a member-made set, on every rank",
    )
    # Every rank, in any order: the global set's ranks, a ValueError as in Horovod.
    expect_error(
        ValueError,
        lambda: so.add_process_set(list(range(n))[::-1]),
        "process set 0 has these ranks already",
        what="adding a set of every rank",
    )
    so.barrier()


if __name__ == "__main__":
    import os

    size = MPI.COMM_WORLD.size
    pairs = ([0, 2], [1, 3]) if size == 4 else ([0], [1, 2])
    overlap = range(1, size) if size == 4 else [0, 1]
    SETS = [so.ProcessSet(pairs[0]), so.ProcessSet(pairs[1]), so.ProcessSet(overlap)]
    DUPLICATE = so.ProcessSet(pairs[1][::-1])  # given twice: refused, and left unregistered
    os.environ["SCALEOUT_DYNAMIC_PROCESS_SETS"] = "1"  # D is added after init
    REFUSED = None
    try:
        so.init(process_sets=SETS + [DUPLICATE])
    except ValueError as exc:
        REFUSED = exc
    main(body, process_sets=SETS)
