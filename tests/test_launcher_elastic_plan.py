"""The elastic driver's decisions (launcher/elastic_plan.py, groundwork of issue 14), as pure
functions: the discovery script's output, host order and the max-np cap, the blacklist and its
cooldown, and what follows a generation."""
from __future__ import annotations

import pytest

from scaleout.launcher.config import UsageError
from scaleout.launcher.elastic_plan import (RESTART_EXIT_CODE, Blacklist, assign_slots,
                                            judge_generation, parse_discovery)
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
        HostSlots("a", 2), HostSlots("b", 2), HostSlots("new", 2)]
    assert assign_slots(["a", "b"], found, none, 0, 3) == [HostSlots("a", 2), HostSlots("b", 1)]
    assert assign_slots(["gone", "b"], found, none, 0, None)[0] == HostSlots("b", 2)


def test_a_blacklisted_host_stays_out_for_good_without_a_cooldown():
    blacklist = Blacklist()
    blacklist.add("a", now=0)
    found = [HostSlots("a", 2), HostSlots("b", 2)]
    assert assign_slots(["a", "b"], found, blacklist, 10**9, None) == [HostSlots("b", 2)]


def test_the_cooldown_doubles_and_is_capped():
    blacklist = Blacklist(cooldown=(10, 100), random_unit=lambda: 0.5)
    blacklist.add("a", now=0)            # 10 * 1 + 5 = 15 s
    assert blacklist.blocks("a", 14.9) and not blacklist.blocks("a", 15.0)
    blacklist.add("a", now=100)          # 10 * 2 + 5 = 25 s
    assert blacklist.blocks("a", 124.9) and not blacklist.blocks("a", 125.0)
    for _ in range(5):
        blacklist.add("a", now=1000)     # capped at 100 s
    assert blacklist.blocks("a", 1099.9) and not blacklist.blocks("a", 1100.0)
    with pytest.raises(UsageError, match="1 <= min <= max <= 3600"):
        Blacklist(cooldown=(0, 10))


def test_after_a_generation():
    done = judge_generation({0: ("a", 0, None), 1: ("b", 0, None)}, resets=0, reset_limit=None)
    assert done.done and done.message is None
    # rank 1 killed on b; the others stop for a restart: go on without b
    ends = {0: ("a", RESTART_EXIT_CODE, None), 1: ("b", None, 9),
            2: ("a", RESTART_EXIT_CODE, None)}
    going = judge_generation(ends, resets=0, reset_limit=None)
    assert not going.done and going.failed_hosts == ("b",)
    stopped = judge_generation(ends, resets=2, reset_limit=2)
    assert stopped.done and "exceeded the limit: 2" in stopped.message
    # a program error everywhere is not a host failure to restart from
    broken = judge_generation({0: ("a", 1, None), 1: ("b", 1, None)}, resets=0, reset_limit=None)
    assert broken.done and "program failed" in broken.message
