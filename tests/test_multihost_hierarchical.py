"""Hierarchical allreduce across two network-namespace hosts (Note [Hierarchical allreduce]):
every op and dtype at 2 x 2, 2 x 3 and 2 + 1 ranks (the uneven layout stays flat and says so),
the same bits on every rank, and the bytes that cross the link: each rank sends only its slice.
The hosts are tests/_hosts.py's, made once per module by test_multihost.py's fixture."""

import json
import re

import pytest
from _hosts import job_command
from test_multihost import JOB_ENV, MP, hosts, received_bytes  # noqa: F401 (hosts: a fixture)

PROGRAM = MP / "hierarchical.py"


def run(hosts, slots: dict, *args: str, env: dict = None, program=PROGRAM) -> dict:
    """Runs tests/mp/hierarchical.py (or `program`) with scaleoutrun from hostA; every rank's
    RESULT."""
    command = job_command(slots, program, *args)
    result = hosts.run_on("hostA", command, env={**JOB_ENV, **(env or {})})
    assert result.returncode == 0, result.stdout + result.stderr
    found = {}
    for line in result.stdout.splitlines():
        match = re.match(r"^\[(\d+)\] RESULT (.*)$", line)
        if match:
            found[int(match.group(1))] = json.loads(match.group(2))
    assert sorted(found) == list(range(sum(slots.values()))), result.stdout + result.stderr
    return found


@pytest.mark.parametrize(
    "slots, algorithm",
    [
        (
            {"hostA": 2, "hostB": 2},
            "hierarchical: shared memory inside each of 2 machines (2 ranks",
        ),
        (
            {"hostA": 3, "hostB": 3},
            "hierarchical: shared memory inside each of 2 machines (3 ranks",
        ),
        (
            {"hostA": 2, "hostB": 1},
            "hierarchical, leader-based: shared memory inside each of 2 "
            "machines (of different sizes)",
        ),
    ],
    ids=["2x2", "2x3", "2+1"],
)
@pytest.mark.parametrize("area", ["default", "4KiB", "16MiB-3-servers"])
def test_every_op_and_dtype_across_machines(hosts, slots, algorithm, area):
    # 4 KiB areas: many rounds and uneven slices; 16 MiB areas with 3 endpoint servers: slices
    # large enough to be split across the servers' cross communicators.
    env = {
        "default": {},
        "4KiB": {"SCALEOUT_SHM_AREA": "4096"},
        "16MiB-3-servers": {"SCALEOUT_SHM_AREA": str(16 << 20), "SCALEOUT_EP_SERVERS": "3"},
    }[area]
    found = run(hosts, slots, env=env)
    for rank, got in found.items():
        assert got["algorithm"].startswith(algorithm), (rank, got)
        assert got["broadcast"].startswith("hierarchical: shared memory inside each of 2"), got
        assert got["allgather"].startswith("hierarchical: gathered inside each of 2"), got
        assert got["alltoall"].startswith("shared memory between the ranks of each of 2"), got
        assert got["adasum"].startswith("mpi: Adasum tree"), got  # auto: flat, as Horovod's
        # Note [Algorithm plan]: the codes Python reads say what the words say
        assert got["plan"] == {
            "allreduce": "hierarchical" if slots["hostB"] > 1 else "hierarchical_leader_based",
            "broadcast": "hierarchical",
            "alltoall": "shared_memory_and_mpi",
            "allgather": "hierarchical",
            "reducescatter": "mpi",
            "adasum": "mpi",
        }, got
        assert got["failures"] == [], (rank, got)
        assert got["same_bits"], (rank, got)


def test_hierarchical_moves_no_more_bytes_across_the_link_than_flat_mpi(hosts):
    # Measured on the veth's counters. Here flat MPICH already moves the minimum at 2 x 2 (its
    # recursive halving reduces inside the host first, so only a half-size block crosses), and
    # hierarchical matches it while the part inside the host goes through shared memory.
    slots = {"hostA": 2, "hostB": 2}
    crossed = {}
    for mode in ("0", "auto"):
        before = received_bytes(hosts, "hostB")
        found = run(hosts, slots, "--big", env={"SCALEOUT_HIERARCHICAL_ALLREDUCE": mode})
        crossed[mode] = received_bytes(hosts, "hostB") - before
        assert all(not got["failures"] and got["same_bits"] for got in found.values()), found
        assert found[0]["algorithm"].startswith("mpi" if mode == "0" else "hierarchical"), found
        # Flat allreduces leave the other collectives' use of shared memory alone.
        assert found[0]["alltoall"].startswith("shared memory between"), found
    # 4 allreduces of 16 MiB: hostB must receive hostA's contribution to each.
    assert crossed["auto"] > 4 * (16 << 20) * 0.95, crossed
    assert crossed["auto"] < 1.05 * crossed["0"], crossed


@pytest.mark.parametrize(
    "slots, hierarchical",
    [
        ({"hostA": 2, "hostB": 2}, True),
        ({"hostA": 3, "hostB": 3}, True),
        ({"hostA": 2, "hostB": 1}, False),
    ],
    ids=["2x2", "2x3", "2+1"],
)
def test_topk_sums_machines_densely_and_sparsifies_between_them(hosts, slots, hierarchical):
    """Note [Hierarchical top-k]: against numpy with a residual per machine (uneven machines:
    per rank, flat), the machine's ranks holding the same residual, nothing lost; a torch
    DistributedOptimizer with momentum correction ends with the same model on every rank."""
    found = run(hosts, slots, program=MP / "topk_hosts.py")
    for rank, got in found.items():
        assert got["hierarchical"] is hierarchical, (rank, got)
        assert got["failures"] == [], (rank, got)
        assert got["torch_same"] in (True, None), (rank, got)


def test_adasum_asked_hierarchical_sums_machines_first(hosts):
    """Note [Hierarchical Adasum]: with SCALEOUT_HIERARCHICAL_ALLREDUCE=1, each machine's sum
    and the Adasum tree over the machines, against numpy, the same bits everywhere."""
    found = run(hosts, {"hostA": 2, "hostB": 2}, env={"SCALEOUT_HIERARCHICAL_ALLREDUCE": "1"})
    for rank, got in found.items():
        assert got["adasum"].startswith("hierarchical: summed inside each of 2"), (rank, got)
        assert got["failures"] == [], (rank, got)
        assert got["same_bits"], (rank, got)


def test_a_commit_outlives_the_host_that_made_it(hosts, tmp_path):
    """Note [Commit store]: every host keeps a copy; with hostA's gone, hostB's comes back."""
    tmp_path.chmod(0o777)
    found = run(hosts, {"hostA": 2, "hostB": 2}, str(tmp_path), program=MP / "commit_hosts.py")
    for rank, got in found.items():
        assert got["failures"] == [], (rank, got)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostA", "hostB"]


def test_local_sgd_averages_machines_every_step(hosts):
    """Note [Local SGD]: with hierarchical allreduces, LocalSGDOptimizer averages a machine's
    ranks after every local step and the machines every period (3) steps: equal within a
    machine always, apart across machines between rounds, equal everywhere after one."""
    found = run(hosts, {"hostA": 2, "hostB": 2}, program=MP / "local_sgd_hosts.py")
    for rank, got in found.items():
        assert got["hierarchical"] is True, (rank, got)
        assert got["failures"] == [], (rank, got)
        assert got["stats"]["all"]["rounds"] == 2, (rank, got)
        assert got["stats"]["host"]["rounds"] == 4, (rank, got)
