"""The placement planner on described nodes, topology detection from a fake /sys, and ranks
that report the CPU affinity they actually got."""

from __future__ import annotations

import ast
import os
import sys

import pytest
from conftest import scaleoutrun

from scaleout.launcher.config import parse_config
from scaleout.launcher.errors import UsageError
from scaleout.launcher.placement import (
    PlacementError,
    PlacementRequest,
    plan_node,
    rank_environment,
)
from scaleout.launcher.placement_table import format_placement
from scaleout.launcher.plan import placement_request, plan_job, plan_placement, resolve_hosts
from scaleout.launcher.topology import Core, detect, format_cpu_list, parse_cpu_list, synthetic

THIS_MACHINE = synthetic(sockets=1, cores_per_socket=2)
XEON = synthetic(sockets=2, cores_per_socket=18, threads_per_core=2)  # CPUs 0-71
KNL = synthetic(sockets=1, cores_per_socket=68, threads_per_core=4)  # CPUs 0-271


def cpus(text: str) -> tuple[int, ...]:
    return tuple(parse_cpu_list(text))


def request(**fields) -> PlacementRequest:
    return PlacementRequest(**fields)


# --- topology -----------------------------------------------------------------------------


def test_synthetic_numbering_is_linuxs():
    assert len(XEON.cores) == 36 and XEON.sockets == (0, 1)
    assert XEON.cores[0] == Core(socket=0, numa=0, cpus=(0, 36))
    assert XEON.cores[18] == Core(socket=1, numa=1 - 0, cpus=(18, 54))
    assert XEON.cpus == tuple(range(72))


def test_cpu_lists():
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    with pytest.raises(ValueError):
        parse_cpu_list("0-x")


def fake_sys(root, sockets: int, cores: int, threads: int, numa_per_socket: int = 1):
    """A /sys tree for a node numbered as synthetic() numbers it."""
    node = synthetic(sockets, cores, threads, numa_per_socket)
    for core in node.cores:
        for cpu in core.cpus:
            topo = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
            topo.mkdir(parents=True)
            (topo / "physical_package_id").write_text(f"{core.socket}\n")
            (topo / "core_cpus_list").write_text(format_cpu_list(core.cpus) + "\n")
    for numa in node.numa_nodes:
        path = root / "devices" / "system" / "node" / f"node{numa}"
        path.mkdir(parents=True)
        members = [cpu for core in node.cores if core.numa == numa for cpu in core.cpus]
        (path / "cpulist").write_text(format_cpu_list(members) + "\n")
    return node


def test_detect_reads_sys(tmp_path):
    node = fake_sys(tmp_path, sockets=2, cores=4, threads=2, numa_per_socket=2)
    assert detect(str(tmp_path), allowed=range(16)) == node
    # Only the CPUs this process may use count (a cgroup or taskset restriction).
    limited = detect(str(tmp_path), allowed=[0, 8, 1])
    assert [core.cpus for core in limited.cores] == [(0, 8), (1,)]


def test_detect_without_sys(tmp_path):
    bare = detect(str(tmp_path), allowed=[0, 1, 2])
    assert [core.cpus for core in bare.cores] == [(0,), (1,), (2,)]


def test_detect_this_machine():
    here = detect()
    assert set(here.cpus) == os.sched_getaffinity(0)


# --- the planner --------------------------------------------------------------------------


def test_this_two_core_machine():
    one = plan_node(THIS_MACHINE, 1, request()).ranks
    assert (one[0].cpus, one[0].ep_cpus, one[0].threads) == ((0, 1), (), 2)
    two = plan_node(THIS_MACHINE, 2, request()).ranks
    assert [(r.bind, r.cpus, r.ep_cpus, r.threads) for r in two] == [
        ("core", (0,), (), 1),
        ("core", (1,), (), 1),
    ]
    # One rank with an endpoint server: compute on core 0, communicate on core 1.
    ep = plan_node(THIS_MACHINE, 1, request(ep_servers=1)).ranks[0]
    assert (ep.cpus, ep.ep_cpus, ep.threads) == ((0,), (1,), 1)


def test_this_machine_oversubscribed():
    plan = plan_node(THIS_MACHINE, 4, request())
    assert all(r.bind == "none" and r.cpus == () and r.threads == 1 for r in plan.ranks)
    assert "not bound" in plan.notes[0]
    with pytest.raises(PlacementError, match="more ranks than cores"):
        plan_node(THIS_MACHINE, 4, request(bind_to="core"))


def test_xeon_two_ranks_one_per_socket_with_two_endpoint_servers():
    ranks = plan_node(XEON, 2, request(ep_servers=2)).ranks
    assert ranks[0].sockets == (0,) and ranks[1].sockets == (1,)
    assert ranks[0].cpus == cpus("0-15,36-51")  # 16 cores, both hyperthreads
    assert ranks[0].ep_cpus == (16, 17)  # the last cores of socket 0
    assert ranks[1].cpus == cpus("18-33,54-69")
    assert ranks[1].ep_cpus == (34, 35)
    assert [r.threads for r in ranks] == [16, 16]
    assert [r.ep_servers for r in ranks] == [2, 2]


def test_xeon_four_ranks_two_per_socket_with_two_endpoint_servers():
    ranks = plan_node(XEON, 4, request(ep_servers=2)).ranks
    assert [r.sockets for r in ranks] == [(0,), (0,), (1,), (1,)]
    assert [format_cpu_list(r.cpus) for r in ranks] == [
        "0-6,36-42",
        "9-15,45-51",
        "18-24,54-60",
        "27-33,63-69",
    ]
    assert [r.ep_cpus for r in ranks] == [(7, 8), (16, 17), (25, 26), (34, 35)]
    assert [r.threads for r in ranks] == [7, 7, 7, 7]
    # No CPU is used twice, and no endpoint core computes.
    used = [cpu for r in ranks for cpu in r.cpus]
    assert len(used) == len(set(used))
    assert not set(used) & {cpu for r in ranks for cpu in r.ep_cpus}


def test_xeon_default_endpoint_server_and_socket_binding():
    ranks = plan_node(XEON, 2, request()).ranks
    assert [r.ep_cpus for r in ranks] == [(17,), (35,)]  # one per rank by default
    shared = plan_node(XEON, 4, request(bind_to="socket", ep_servers=1)).ranks
    # Bound to its socket's compute cores, shared with its neighbour; endpoint cores excluded.
    assert shared[0].cpus == shared[1].cpus == cpus("0-7,9-16,36-43,45-52")
    assert shared[0].ep_cpus == (8,) and shared[1].ep_cpus == (17,)
    assert shared[0].threads == 8


def test_map_by_numa_and_core():
    node = synthetic(sockets=2, cores_per_socket=8, numa_per_socket=2)
    by_numa = plan_node(node, 4, request(map_by="numa", ep_servers=0)).ranks
    assert [format_cpu_list(r.cpus) for r in by_numa] == ["0-3", "4-7", "8-11", "12-15"]
    by_core = plan_node(node, 3, request(map_by="core", ep_servers=0)).ranks
    assert [format_cpu_list(r.cpus) for r in by_core] == ["0-5", "6-10", "11-15"]


def test_68_core_single_socket_node():
    ranks = plan_node(KNL, 4, request()).ranks
    assert [len(r.compute_cores) for r in ranks] == [16, 16, 16, 16]
    assert [r.ep_cpus for r in ranks] == [(16,), (33,), (50,), (67,)]
    assert len(ranks[0].cpus) == 16 * 4  # all four hyperthreads of each core
    one = plan_node(KNL, 1, request(ep_servers=4)).ranks[0]  # MLSL's 4 servers per node
    assert one.ep_cpus == (64, 65, 66, 67) and one.threads == 64


def test_uneven_ranks_per_socket():
    ranks = plan_node(XEON, 3, request(ep_servers=1)).ranks
    assert [r.sockets for r in ranks] == [(0,), (0,), (1,)]
    assert [len(r.compute_cores) for r in ranks] == [8, 8, 17]


def test_uneven_slots_across_hosts():
    config = parse_config(["-H", "localhost:3,far:1", "--ep-servers", "1", "x"], {})
    plan = plan_job(config, local_cpus=72, source=resolve_hosts(config, {}))
    placements = plan_placement(plan, placement_request(config), XEON, include_remote=True)
    assert [(p.host, p.first_rank, len(p.plan.ranks), p.local) for p in placements] == [
        ("localhost", 0, 3, True),
        ("far", 3, 1, False),
    ]
    lone = placements[1].plan.ranks[0]
    assert lone.sockets == (0, 1) and lone.ep_cpus == (35,) and lone.threads == 35
    table = format_placement(placements, XEON, placement_request(config))
    assert "far" in table and "remote hosts" in table
    # Launching (include_remote=False) plans only what can be checked here.
    assert len(plan_placement(plan, placement_request(config), XEON, include_remote=False)) == 1


def test_explicit_endpoint_cores():
    ranks = plan_node(XEON, 2, request(ep_affinity=cpus("0,18"))).ranks
    assert [r.ep_cpus for r in ranks] == [(0,), (18,)]
    assert 0 not in ranks[0].cpus and 36 not in ranks[0].cpus  # core 0 no longer computes
    assert ranks[0].threads == 17
    unbound = plan_node(XEON, 2, request(bind_to="none", ep_affinity=(5, 23))).ranks
    assert [r.ep_cpus for r in unbound] == [(5,), (23,)] and unbound[0].cpus == ()


@pytest.mark.parametrize(
    "topology, ranks, req, message",
    [
        (XEON, 2, request(ep_servers=18), "leaves rank 0 no compute core"),
        (XEON, 2, request(ep_affinity=(0, 99)), "CPU 99"),
        (XEON, 2, request(ep_affinity=(0, 1, 2)), "not a multiple"),
        (XEON, 2, request(ep_servers=2, ep_affinity=(0, 18)), "need 4"),
        (XEON, 40, request(bind_to="core"), "more ranks than cores"),
        (synthetic(2, 2), 5, request(bind_to="core", ep_servers=0), "more ranks than cores"),
        (THIS_MACHINE, 2, request(ep_servers=1), "no compute core"),
    ],
)
def test_impossible_requests(topology, ranks, req, message):
    with pytest.raises(PlacementError, match=message):
        plan_node(topology, ranks, req)


def test_impossible_requests_are_usage_errors_before_launch():
    config = parse_config(["-np", "3", "--bind-to", "core", "x"], {})
    plan = plan_job(config, local_cpus=2)
    with pytest.raises(UsageError, match="more ranks than cores"):
        plan_placement(plan, placement_request(config), THIS_MACHINE, include_remote=False)
    with pytest.raises(UsageError, match="ep-affinity"):
        placement_request(parse_config(["-np", "1", "--ep-affinity", "a-b", "x"], {}))


def test_rank_environment_keeps_the_users_thread_settings():
    rank = plan_node(XEON, 2, request(ep_servers=2)).ranks[1]
    env = rank_environment(rank, {"OMP_NUM_THREADS": "4"})
    assert "OMP_NUM_THREADS" not in env
    assert env["MKL_NUM_THREADS"] == env["SCALEOUT_COMPUTE_THREADS"] == "16"
    assert env["SCALEOUT_EP_CORES"] == "34,35" and env["SCALEOUT_EP_SERVERS"] == "2"
    assert env["SCALEOUT_COMPUTE_CORES"].split(",")[:2] == ["18", "19"]
    assert env["SCALEOUT_BIND_TO"] == "core"


def test_table():
    config = parse_config(["-np", "2", "--ep-servers", "2", "x"], {})
    plan = plan_job(config, local_cpus=72)
    table = format_placement(
        plan_placement(plan, placement_request(config), XEON, True), XEON, placement_request(config)
    )
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("rank"))
    assert header.split() == [
        "rank",
        "host",
        "socket",
        "bind",
        "compute",
        "cores",
        "endpoint",
        "cores",
        "threads",
    ]
    assert lines[lines.index(header) + 1].split() == [
        "0",
        "localhost",
        "0",
        "core",
        "0-15,36-51",
        "16-17",
        "16",
    ]


# --- real launches ------------------------------------------------------------------------

REPORT = (
    "import os; print(sorted(os.sched_getaffinity(0)), os.environ['SCALEOUT_EP_CORES'], "
    "os.environ['OMP_NUM_THREADS'])"
)


@pytest.mark.parametrize(
    "args",
    [
        ["-np", "1"],
        ["-np", "2"],
        ["-np", "1", "--ep-servers", "1"],
        ["-np", "2", "--bind-to", "none"],
    ],
)
def test_ranks_get_the_planned_affinity(args):
    here = detect()
    config = parse_config(args + ["x"], {})
    if config.np > len(here.cores) or (config.ep_servers and len(here.cores) < 2):
        pytest.skip("this machine has too few cores for the case")
    expected = plan_node(here, config.np, placement_request(config)).ranks
    result = scaleoutrun(*args, sys.executable, "-c", REPORT)
    assert result.returncode == 0, result.stderr
    for rank in expected:
        line = next(
            line for line in result.stdout.splitlines() if line.startswith(f"[{rank.local_rank}] ")
        )
        got_cpus, ep_cores, threads = line.split(" ", 1)[1].rsplit(" ", 2)
        want = sorted(rank.cpus) if rank.cpus else sorted(os.sched_getaffinity(0))
        assert ast.literal_eval(got_cpus) == want
        assert ep_cores == ",".join(map(str, rank.ep_cpus))
        assert int(threads) == rank.threads


def test_print_placement_does_not_launch():
    result = scaleoutrun("-np", "2", "--print-placement", "no-such-program")
    assert result.returncode == 0, result.stderr
    assert "compute cores" in result.stdout and "endpoint cores" in result.stdout
    assert "could not start" not in result.stderr


def test_impossible_placement_exits_2_before_starting():
    many = str(len(os.sched_getaffinity(0)) + 1)
    result = scaleoutrun("-np", many, "--bind-to", "core", "no-such-program")
    assert result.returncode == 2
    assert "more ranks than cores" in result.stderr and "could not start" not in result.stderr
