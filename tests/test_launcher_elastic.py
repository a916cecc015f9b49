"""The elastic driver's pieces that run in one process: the discovery script as the shell runs
it (launcher/elastic_discovery.py), the host-update channel between the driver and rank 0
(launcher/elastic_notifier.py and the rank's listener in scaleout/_elastic_run.py, speaking
scaleout/_elastic_protocol.py, through to HostsUpdatedInterrupt), and the addresses the ranks
are given. The whole driver is tested with real ranks in
tests/test_elastic.py."""

from __future__ import annotations

import socket
import time

import pytest

from scaleout import _elastic_run
from scaleout._elastic_protocol import HostUpdateResult
from scaleout._elastic_state import HostsUpdatedInterrupt, ObjectState
from scaleout.launcher.elastic_discovery import Discovery, DiscoveryError
from scaleout.launcher.elastic_notifier import Notifier, driver_addresses
from scaleout.launcher.hosts import HostSlots


def test_discovery_runs_the_script_through_the_shell(tmp_path):
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho hostB:2\necho hostA\n")
    script.chmod(0o755)
    assert Discovery(str(script), 3).find() == [HostSlots("hostB", 2), HostSlots("hostA", 3)]
    assert Discovery("printf 'x:1\\ny:2\\n'", 1).find() == [HostSlots("x", 1), HostSlots("y", 2)]
    with pytest.raises(DiscoveryError, match="exited with code 4: no hosts today"):
        Discovery("echo no hosts today >&2; exit 4", 1).find()
    with pytest.raises(DiscoveryError, match="is not a host name"):
        Discovery("printf 'bad\\377host\\n'", 1).find()  # not even UTF-8


def rank_0_state(monkeypatch, notifier: Notifier, generation: int, token=None):
    """A rank 0 of `generation` (one process: the broadcast is the identity) listening."""
    env = notifier.rank_environment(generation)
    if token is not None:
        env["SCALEOUT_ELASTIC_TOKEN"] = token
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(_elastic_run._runtime, "rank", lambda: 0)
    state = ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0, epoch=0)
    _elastic_run._listen_for_host_updates(state)
    return state


def interrupted_within(state, seconds: float):
    """The HostsUpdatedInterrupt check_host_updates() raises within `seconds`, or None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state.check_host_updates()
        except HostsUpdatedInterrupt as interrupt:
            return interrupt
        time.sleep(0.02)
    return None


def test_a_host_update_reaches_rank_0_and_interrupts(monkeypatch):
    notifier = Notifier(["127.0.0.1"])
    try:
        notifier.start_generation(3)
        notifier.notify(HostUpdateResult.added, 3)  # before rank 0 connects: kept for it
        state = rank_0_state(monkeypatch, notifier, 3)
        added = interrupted_within(state, 5)
        assert added is not None and added.skip_sync is False
        assert interrupted_within(state, 0.2) is None  # once
        notifier.notify(HostUpdateResult.removed, 3)  # while connected
        removed = interrupted_within(state, 5)
        assert removed is not None and removed.skip_sync is True  # only removed: no sync
    finally:
        notifier.close()


@pytest.mark.parametrize("generation, token", [(2, None), (3, "not-the-token")])
def test_the_channel_refuses_other_generations_and_strangers(monkeypatch, generation, token):
    notifier = Notifier(["127.0.0.1"])
    try:
        notifier.start_generation(3)
        notifier.notify(HostUpdateResult.added, 3)
        state = rank_0_state(monkeypatch, notifier, generation, token)
        assert interrupted_within(state, 1.0) is None
    finally:
        notifier.close()


def test_an_update_for_an_ended_generation_is_dropped(monkeypatch):
    notifier = Notifier(["127.0.0.1"])
    try:
        notifier.start_generation(4)
        notifier.notify(HostUpdateResult.removed, 3)  # a discovery that ran as 3 ended
        state = rank_0_state(monkeypatch, notifier, 4)
        assert interrupted_within(state, 1.0) is None
    finally:
        notifier.close()


def test_ranks_get_addresses_of_this_machine_loopback_last():
    addresses = driver_addresses(())
    assert addresses[-1] == "127.0.0.1" and len(set(addresses)) == len(addresses)
    for address in addresses:
        socket.inet_aton(address)
    assert driver_addresses(("no-such-interface0",)) == ["127.0.0.1"]


def test_two_names_of_this_machine_keep_ucx_from_reading_a_dead_ranks_memory():
    from scaleout.launcher.elastic_driver import _one_machine_environment

    two = [HostSlots("localhost", 2), HostSlots("127.0.0.1", 1)]
    assert _one_machine_environment(two, {}) == {"UCX_TLS": "^cma"}
    assert _one_machine_environment(two, {"UCX_TLS": "tcp"}) == {}  # the user's stays
    assert _one_machine_environment([HostSlots("localhost", 3)], {}) == {}
    assert _one_machine_environment([HostSlots("localhost", 2), HostSlots("hostB", 1)], {}) == {}
