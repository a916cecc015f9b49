"""The elastic driver's decisions (launcher/elastic_plan.py), as pure functions: the discovery
script's output, host order and the max-np cap, the blacklist and its cooldown, how each rank of
a generation ended, what follows a generation, and which host changes interrupt one."""

from __future__ import annotations

import pytest

from scaleout._elastic_protocol import RESTART_EXIT_CODE
from scaleout.launcher.elastic_plan import (
    HOSTS_ADDED,
    HOSTS_REMOVED,
    Blacklist,
    End,
    assign_slots,
    classify_ends,
    host_update,
    judge_generation,
    parse_discovery,
    worker_numbers,
)
from scaleout.launcher.errors import UsageError
from scaleout.launcher.hosts import HostSlots


def test_discovery_lines_with_and_without_slots():
    got = parse_discovery("hostA:4\n\nhostB\nhostA:2\n  hostC:1  \n", slots_per_host=2)
    assert got == [HostSlots("hostA", 4), HostSlots("hostB", 2), HostSlots("hostC", 1)]
    with pytest.raises(UsageError, match="'hostD:zero'"):
        parse_discovery("hostD:zero", 1, "discover.sh")
    with pytest.raises(UsageError, match="not a host name"):
        parse_discovery("bad host", 1)


def test_hosts_keep_their_order_new_ones_come_last_and_max_np_caps():
    found = [HostSlots("new", 2), HostSlots("b", 2), HostSlots("a", 2)]
    none = Blacklist()
    assert assign_slots(["a", "b"], found, none, 0, None) == [
        HostSlots("a", 2),
        HostSlots("b", 2),
        HostSlots("new", 2),
    ]
    assert assign_slots(["a", "b"], found, none, 0, 3) == [HostSlots("a", 2), HostSlots("b", 1)]
    assert assign_slots(["gone", "b"], found, none, 0, None)[0] == HostSlots("b", 2)


def test_a_blacklisted_host_stays_out_for_good_without_a_cooldown():
    blacklist = Blacklist()
    blacklist.add("a", now=0)
    found = [HostSlots("a", 2), HostSlots("b", 2)]
    assert assign_slots(["a", "b"], found, blacklist, 10**9, None) == [HostSlots("b", 2)]


def test_the_cooldown_doubles_and_is_capped():
    # Horovod's: MIN * 2**failures + uniform(0, 1) * MIN, clamped to [MIN, MAX]
    blacklist = Blacklist(cooldown=(10, 100), random_unit=lambda: 0.5)
    blacklist.add("a", now=0)  # 10 * 2 + 5 = 25 s
    assert blacklist.blocks("a", 24.9) and not blacklist.blocks("a", 25.0)
    blacklist.add("a", now=100)  # 10 * 4 + 5 = 45 s
    assert blacklist.blocks("a", 144.9) and not blacklist.blocks("a", 145.0)
    for _ in range(5):
        blacklist.add("a", now=1000)  # capped at 100 s
    assert blacklist.blocks("a", 1099.9) and not blacklist.blocks("a", 1100.0)


HOSTS = ["a", "a", "b"]  # ranks 0 and 1 on a, rank 2 on b


def test_how_each_rank_ended():
    # rank 2 killed; its peers blamed it and stopped for a restart
    ends = classify_ends(
        HOSTS,
        finished=[],
        reports=[(2, None, 9), (0, RESTART_EXIT_CODE, None), (1, RESTART_EXIT_CODE, None)],
        blamed=[2, 2],
        unreachable_hosts=[],
    )
    assert ends == {0: ("a", End.RESTART), 1: ("a", End.RESTART), 2: ("b", End.FAILED)}
    # host b vanished (no word from its rank); the others named it
    ends = classify_ends(
        HOSTS,
        [],
        [(0, RESTART_EXIT_CODE, None), (1, RESTART_EXIT_CODE, None)],
        blamed=[2],
        unreachable_hosts=[],
    )
    assert ends[2] == ("b", End.FAILED)
    # a rank that stopped for a restart is never a failure, whoever blamed it; one stopped by
    # scaleoutrun (no word) is not either
    ends = classify_ends(
        HOSTS, [], [(0, RESTART_EXIT_CODE, None), (2, 1, None)], blamed=[0], unreachable_hosts=[]
    )
    assert ends == {0: ("a", End.RESTART), 1: ("a", End.STOPPED), 2: ("b", End.FAILED)}
    # an unreachable host: all its ranks failed
    assert classify_ends(HOSTS, [], [], [], ["b"])[2] == ("b", End.FAILED)
    assert classify_ends(HOSTS, [0, 1, 2], [], [], [])[1] == ("a", End.DONE)


def ends_of(*kinds):
    return {rank: (HOSTS[rank], kind) for rank, kind in enumerate(kinds)}


def test_after_a_generation():
    for resets, limit in ((0, None), (5, 1)):  # success, whatever the resets
        done = judge_generation(ends_of(End.DONE, End.DONE, End.DONE), resets, limit)
        assert done.done and done.message is None and done.failed_hosts == ()
    # rank 2 killed on b; the others stop for a restart (or were stopped): go on without b
    for survivors in (End.RESTART, End.STOPPED):
        going = judge_generation(ends_of(survivors, End.RESTART, End.FAILED), 0, None)
        assert not going.done and going.failed_hosts == ("b",)
    # a host update: every rank stops for a restart, no host failed
    update = judge_generation(ends_of(End.RESTART, End.RESTART, End.RESTART), 0, None)
    assert not update.done and update.failed_hosts == ()
    ends = ends_of(End.RESTART, End.RESTART, End.FAILED)
    assert judge_generation(ends, resets=1, reset_limit=2).done is False
    stopped = judge_generation(ends, resets=2, reset_limit=2)
    assert stopped.done and "exceeded the limit: 2" in stopped.message
    assert judge_generation(ends, resets=0, reset_limit=0).done  # no reset at all
    # a program error everywhere is not a host failure to restart from
    broken = judge_generation(ends_of(End.FAILED, End.FAILED, End.FAILED), 0, None)
    assert broken.done and "failure of the program" in broken.message
    # failures on every host leave none to go on with
    everywhere = judge_generation(ends_of(End.FAILED, End.RESTART, End.FAILED), 0, None)
    assert everywhere.done and "every host" in everywhere.message
    # once a rank finished, the job ends (as Horovod's driver), and says so
    late = judge_generation(ends_of(End.DONE, End.DONE, End.FAILED), 0, None)
    assert late.done and "ranks 0, 1 finished while rank 2 did not" in late.message
    # nothing failed, nothing restarts (the launch failed): the job ends, the caller says why
    silent = judge_generation(ends_of(End.STOPPED, End.STOPPED, End.STOPPED), 0, None)
    assert silent.done and silent.message is None and silent.failed_hosts == ()


def test_which_host_changes_interrupt_a_generation():
    running = [HostSlots("a", 2), HostSlots("b", 1)]
    assert host_update(running, running) == 0
    assert host_update(running, running + [HostSlots("c", 1)]) == HOSTS_ADDED
    assert host_update(running, [HostSlots("a", 3), HostSlots("b", 1)]) == HOSTS_ADDED
    assert host_update(running, [HostSlots("a", 2)]) == HOSTS_REMOVED
    assert (
        host_update(running, [HostSlots("a", 1), HostSlots("c", 2)]) == HOSTS_ADDED | HOSTS_REMOVED
    )


def test_worker_numbers_survive_restarts_and_new_slots_get_unused_ones():
    # Note [horovodrun's rank variables]: Horovod's identity of a worker, HOROVOD_RANK.
    first = worker_numbers([HostSlots("a", 2), HostSlots("b", 2)], {}, (), 0)
    assert first == {("a", 0): 0, ("a", 1): 1, ("b", 0): 2, ("b", 1): 3}
    # b failed (blacklisted), c added: a's workers keep theirs, c's are new (4, 5), not 2, 3.
    second = worker_numbers([HostSlots("a", 2), HostSlots("c", 2)], first, ("b",), 4)
    assert second == {("a", 0): 0, ("a", 1): 1, ("c", 0): 4, ("c", 1): 5}
    # A restart for a host update keeps every survivor's; a host that failed and is back after
    # its cooldown runs new workers; a slot a host no longer has is gone.
    third = worker_numbers([HostSlots("c", 2), HostSlots("a", 1)], second, (), 6)
    assert third == {("c", 0): 4, ("c", 1): 5, ("a", 0): 0}
    back = worker_numbers([HostSlots("a", 1), HostSlots("b", 1)], first, ("b",), 6)
    assert back == {("a", 0): 0, ("b", 0): 6}
    # A rank that raised (its host failed): that host's workers are new too.
    assert worker_numbers([HostSlots("a", 2)], first, ("a",), 4) == {("a", 0): 4, ("a", 1): 5}
