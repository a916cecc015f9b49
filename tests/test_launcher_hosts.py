"""scaleoutrun across hosts, without starting any: Slurm's variables, where the hosts come from,
the launcher command lines for ssh and Slurm, and naming a host that cannot be reached."""

from __future__ import annotations

import os

import pytest
from conftest import fake_mpiexec, scaleoutrun

from scaleout.launcher.config import parse_config
from scaleout.launcher.errors import UsageError
from scaleout.launcher.hosts import HostSlots
from scaleout.launcher.mpi_launcher import (
    LaunchRequest,
    MPIExec,
    MPIFamily,
    build_command,
    interface_environment,
    launcher_variables,
)
from scaleout.launcher.plan import HostSource, plan_job, resolve_hosts
from scaleout.launcher.rank_env import local_rank_and_size
from scaleout.launcher.relay import StderrRelay
from scaleout.launcher.slurm import detect_allocation, expand_counts, expand_host_list
from scaleout.launcher.unreachable import parse_unreachable, planned_host

HYDRA = MPIExec("/venv/bin/mpiexec", MPIFamily.HYDRA)
OPEN_MPI = MPIExec("/opt/ompi/bin/mpirun", MPIFamily.OPEN_MPI)
RANK = ("/venv/bin/python", "/x/rank_exec.py", "--", "python", "train.py")
TWO_HOSTS = (HostSlots("h1", 2), HostSlots("h2", 2))

# What sbatch -N 4 --ntasks=7 sets (three nodes of 2 tasks, one of 1), trimmed.
SLURM = {
    "SLURM_JOB_ID": "4711",
    "SLURM_JOB_NODELIST": "node[01-03,07]",
    "SLURM_TASKS_PER_NODE": "2(x3),1",
    "SLURM_NTASKS": "7",
}


def parse(*argv: str, **environ: str):
    return parse_config(list(argv), environ)


# --- Slurm's compressed lists -------------------------------------------------------------


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("node7", ["node7"]),
        ("a,b,c", ["a", "b", "c"]),
        ("node[8-10]", ["node8", "node9", "node10"]),
        ("node[098-100]", ["node098", "node099", "node100"]),
        ("gpu[1-2]-ib,login", ["gpu1-ib", "gpu2-ib", "login"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("cn[1,3],cn[5-6]", ["cn1", "cn3", "cn5", "cn6"]),
        (" node[1-2] ", ["node1", "node2"]),
    ],
)
def test_expand_host_list(text, hosts):
    assert expand_host_list(text) == hosts


@pytest.mark.parametrize(
    "text",
    [
        "",
        "node[1-",
        "node]1",
        "node[3-1]",
        "node[a-b]",
        "node[[1]]",
        "a,,b",
        "node[]",
        "node[1-2,]",
    ],
)
def test_bad_host_lists_are_refused(text):
    with pytest.raises(ValueError):
        expand_host_list(text)


def test_expand_counts():
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("4") == [4]
    assert expand_counts("1,3(x2)") == [1, 3, 3]
    for bad in ("", "x", "2(x)", "2(x3", "2(3)", "-1"):
        with pytest.raises(ValueError):
            expand_counts(bad)


def test_detect_allocation():
    allocation = detect_allocation(SLURM)
    assert allocation.hosts == (
        HostSlots("node01", 2),
        HostSlots("node02", 2),
        HostSlots("node03", 2),
        HostSlots("node07", 1),
    )
    assert allocation.ntasks == 7 and allocation.job_id == "4711"
    assert detect_allocation({}) is None
    assert detect_allocation({"SLURM_JOB_ID": "1"}) is None  # no node list: not usable
    # salloc -N 2 without -n: no task counts, one rank per node; older variable names work.
    older = detect_allocation({"SLURM_JOBID": "9", "SLURM_NODELIST": "n[1-2]"})
    assert older.hosts == (HostSlots("n1", 1), HostSlots("n2", 1)) and older.ntasks is None


@pytest.mark.parametrize(
    "changed, message",
    [
        ({"SLURM_JOB_NODELIST": "node[1-"}, "SLURM_JOB_NODELIST"),
        ({"SLURM_TASKS_PER_NODE": "2(x3)"}, "gives 3 node"),
        ({"SLURM_TASKS_PER_NODE": "two"}, "SLURM_TASKS_PER_NODE"),
        ({"SLURM_NTASKS": "many"}, "SLURM_NTASKS"),
    ],
)
def test_unreadable_slurm_variables_are_named(changed, message):
    with pytest.raises(UsageError, match=message):
        detect_allocation({**SLURM, **changed})


@pytest.mark.parametrize("tasks", ["1", "4"])
def test_inside_an_srun_step_the_allocation_is_refused(tasks):
    # Note [Inside an srun step]: a step's SLURM_NTASKS and SLURM_TASKS_PER_NODE are its own
    # (as srun -n 1 inside salloc -N 2 -n 4 sets them, seen under Slurm 22.05).
    step = {
        **SLURM,
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": tasks,
        "SLURM_NTASKS": tasks,
        "SLURM_TASKS_PER_NODE": tasks,
    }
    with pytest.raises(UsageError) as refused:
        detect_allocation(step)
    message = str(refused.value)
    assert "inside srun's job step 4711.0" in message and f"SLURM_STEP_NUM_TASKS={tasks}" in message
    assert ("each of its tasks would start the whole job" in message) == (tasks != "1")
    assert "srun --mpi=pmi2 python train.py" in message and "--slurm off" in message
    # A batch script's and salloc's shell have no step: the allocation is read there.
    assert detect_allocation({**SLURM, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}) is not None
    # --slurm off ignores Slurm, inside a step too.
    off = resolve_hosts(parse("--slurm", "off", "-H", "a:2,b:2", "python"), step)
    assert off.hosts == (HostSlots("a", 2), HostSlots("b", 2)) and off.remote_launch == "ssh"


def test_local_rank_under_srun():
    env = {"SLURM_LOCALID": "1", "SLURM_NODEID": "3", "SLURM_TASKS_PER_NODE": "2(x3),1"}
    assert local_rank_and_size(env) == (1, 1)
    assert local_rank_and_size({**env, "SLURM_NODEID": "1"}) == (1, 2)
    assert local_rank_and_size({**env, "SLURM_TASKS_PER_NODE": "junk"}) == (None, None)


# --- where the hosts come from ------------------------------------------------------------


def test_inside_an_allocation_its_nodes_and_tasks_are_the_hosts():
    source = resolve_hosts(parse("python"), SLURM)
    assert source.remote_launch == "slurm" and source.default_np == 7
    assert "job 4711" in source.origin
    plan = plan_job(
        parse("python"), local_cpus=2, source=source, is_local=lambda host: host == "node01"
    )
    assert plan.np == 7 and plan.hosts == source.hosts and plan.local_ranks == 2
    assert plan.remote_launch == "slurm"
    fewer = plan_job(parse("-np", "3", "python"), local_cpus=2, source=source)
    assert fewer.hosts == (HostSlots("node01", 2), HostSlots("node02", 1))
    with pytest.raises(UsageError, match="8 is more than the 7 slots of the Slurm allocation"):
        plan_job(parse("-np", "8", "python"), local_cpus=2, source=source)


def test_hosts_given_inside_an_allocation_are_reached_over_ssh():
    source = resolve_hosts(parse("-H", "a:2,b:2", "python"), SLURM)
    assert source == HostSource((HostSlots("a", 2), HostSlots("b", 2)), "-H", "ssh")
    forced = resolve_hosts(parse("--slurm", "on", "-H", "node01:2", "python"), SLURM)
    assert forced.remote_launch == "slurm" and forced.hosts == (HostSlots("node01", 2),)


def test_slurm_off_and_on():
    assert resolve_hosts(parse("--slurm", "off", "-np", "2", "python"), SLURM) is None
    assert resolve_hosts(parse("-np", "2", "python"), {}) is None
    assert resolve_hosts(parse("-np", "2", "python", SCALEOUTRUN_SLURM="off"), SLURM) is None
    with pytest.raises(UsageError, match="not inside a Slurm allocation"):
        resolve_hosts(parse("--slurm", "on", "python"), {})
    with pytest.raises(UsageError):
        parse("--slurm", "maybe", "python")


def test_hostfile_source_is_named_in_errors(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("a slots=1\nb slots=1\n")
    config = parse("--hostfile", str(path), "-np", "3", "python")
    with pytest.raises(UsageError, match=f"2 slots of {path}"):
        plan_job(config, local_cpus=2, source=resolve_hosts(config, {}))


# --- the launcher command lines -----------------------------------------------------------


def test_hydra_over_ssh():
    request = LaunchRequest(
        np=4,
        rank_command=RANK,
        hosts=TWO_HOSTS,
        ssh_port=2222,
        network_interfaces=("eth1",),
        environment=(("SCALEOUT_CYCLE_TIME", "2"), ("UCX_NET_DEVICES", "eth1")),
    )
    assert build_command(HYDRA, request) == [
        "/venv/bin/mpiexec",
        "-n",
        "4",
        "-launcher",
        "ssh",
        "-hosts",
        "h1:2,h2:2",
        "-iface",
        "eth1",
        "-genvall",
        "-genv",
        "SCALEOUT_CYCLE_TIME",
        "2",
        "-genv",
        "UCX_NET_DEVICES",
        "eth1",
        *RANK,
    ]
    assert launcher_variables(HYDRA, request, {}) == {
        "HYDRA_LAUNCHER_EXTRA_ARGS": "-p 2222",
        "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": "-p 2222",
    }
    # ssh arguments the user gives Hydra are kept.
    mine = launcher_variables(HYDRA, request, {"HYDRA_LAUNCHER_EXTRA_ARGS": "-o Foo=1"})
    assert mine["HYDRA_LAUNCHER_EXTRA_ARGS"] == "-o Foo=1 -p 2222"
    assert (
        launcher_variables(HYDRA, LaunchRequest(np=4, rank_command=RANK, hosts=TWO_HOSTS), {}) == {}
    )


def test_hydra_through_slurm():
    request = LaunchRequest(
        np=4, rank_command=RANK, hosts=TWO_HOSTS, remote_launch="slurm", ssh_port=2222
    )
    command = build_command(HYDRA, request)
    assert command[:7] == [
        "/venv/bin/mpiexec",
        "-n",
        "4",
        "-launcher",
        "slurm",
        "-hosts",
        "h1:2,h2:2",
    ]
    assert launcher_variables(HYDRA, request, {}) == {}  # no ssh: its port means nothing


def test_open_mpi_over_ssh_and_through_slurm():
    request = LaunchRequest(
        np=4, rank_command=RANK, hosts=TWO_HOSTS, ssh_port=2222, exported=("PATH",)
    )
    ssh = " ".join(build_command(OPEN_MPI, request))
    assert "--host h1:2,h2:2 --mca plm rsh" in ssh and "--mca plm_rsh_args -p 2222" in ssh
    assert ssh.endswith("-x PATH " + " ".join(RANK))
    slurm = " ".join(
        build_command(
            OPEN_MPI,
            LaunchRequest(
                np=4, rank_command=RANK, hosts=TWO_HOSTS, ssh_port=2222, remote_launch="slurm"
            ),
        )
    )
    assert "--mca plm slurm" in slurm and "plm_rsh_args" not in slurm
    local = build_command(OPEN_MPI, LaunchRequest(np=2, rank_command=RANK))
    assert "plm" not in local


def test_network_interface_reaches_the_mpis_own_transport():
    assert interface_environment(("eth1",), {}) == {
        "UCX_NET_DEVICES": "eth1",
        "FI_TCP_IFACE": "eth1",
        "SCALEOUT_NETWORK_INTERFACE": "eth1",
    }
    assert interface_environment(("eth1",), {"UCX_NET_DEVICES": "mlx5_0:1"}) == {
        "FI_TCP_IFACE": "eth1",
        "SCALEOUT_NETWORK_INTERFACE": "eth1",
    }
    assert interface_environment((), {}) == {}
    # UCX takes a list; libfabric's tcp provider one interface, the first.
    assert interface_environment(("eth1", "eth2"), {}) == {
        "UCX_NET_DEVICES": "eth1,eth2",
        "FI_TCP_IFACE": "eth1",
        "SCALEOUT_NETWORK_INTERFACE": "eth1",
    }


# --- a host that cannot be reached --------------------------------------------------------


@pytest.mark.parametrize(
    "line, host",
    [
        ("ssh: connect to host hostb port 2222: Connection refused", "hostb"),
        ("ssh: connect to host 10.0.0.9 port 22: No route to host", "10.0.0.9"),
        ("ssh: connect to host n7 port 22: Connection timed out\r\n", "n7"),
        ("ssh: Could not resolve hostname nosuch: Name or service not known", "nosuch"),
        ("root@hostb: Permission denied (publickey).", "hostb"),
        ("hostb: Permission denied (publickey,password).", "hostb"),
    ],
)
def test_unreachable_lines(line, host):
    assert parse_unreachable(line).host == host


@pytest.mark.parametrize(
    "line",
    [
        "[2] ssh: connect to host hostb port 22: Connection refused",  # a rank's own output
        "scaleoutrun: rank 1 exited with code 3",
        "[mpiexec@hostA] ui_cmd_cb (pmiserv_pmci.c:51): Launch proxy failed.",
        "Host key verification failed.",
    ],
)
def test_other_lines_are_not_unreachable_hosts(line):
    assert parse_unreachable(line) is None


def test_planned_host_matches_sshs_lower_case():
    assert planned_host("hostb", ["hostA", "hostB"]) == "hostB"
    assert planned_host("other", ["hostA"]) == "other"


def test_stderr_relay_records_unreachable_hosts_and_passes_them_on():
    relay = StderrRelay()
    out = relay.feed(b"ssh: connect to host hostb port 22: Connection refused\nnext\n")
    assert out == b"ssh: connect to host hostb port 22: Connection refused\nnext\n"
    assert [u.host for u in relay.unreachable] == ["hostb"]


def test_an_unreachable_host_ends_the_launch_naming_it(tmp_path):
    # A launcher whose ssh to hostB fails and which then waits (as Hydra can, on a slow host).
    fake = fake_mpiexec(
        tmp_path,
        "echo 'ssh: connect to host hostb port 2222: Connection refused' >&2\nexec sleep 30\n",
    )
    result = scaleoutrun("-H", "localhost:2,hostB:2", "--mpiexec", fake, "python", "-c", "pass")
    assert result.returncode == 1, result.stderr
    assert (
        "host hostB could not be reached (ranks 2, 3 were to run there): ssh: connect to "
        "host hostb port 2222: Connection refused; the job was stopped" in result.stderr
    )


def test_a_host_the_launcher_fails_on_silently_is_probed_and_named(tmp_path):
    # Hydra can exit on a failed proxy launch before it has passed on ssh's complaint; then
    # scaleoutrun asks ssh itself (the ssh on PATH, here one that refuses like a closed port).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "ssh_calls"
    ssh = bin_dir / "ssh"
    ssh.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n'
        "echo 'ssh: connect to host hostb port 2299: Connection refused' >&2\n"
        "exit 255\n"
    )
    ssh.chmod(0o755)
    fake = fake_mpiexec(tmp_path, "echo '[mpiexec@here] Launch proxy failed.' >&2\nexit 255\n")
    result = scaleoutrun(
        "-H",
        "localhost:1,hostB:2",
        "--ssh-port",
        "2299",
        "--mpiexec",
        fake,
        "python",
        "-c",
        "pass",
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert result.returncode == 1, result.stderr
    assert (
        "host hostB could not be reached (ranks 1, 2 were to run there): ssh: connect to "
        "host hostb port 2299: Connection refused" in result.stderr
    )
    # Only the remote host was probed, on the job's port, never asking for a password.
    assert calls.read_text().split() == [
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-p",
        "2299",
        "hostB",
        "true",
    ]


def test_slurm_allocation_reaches_the_launcher_command_line(tmp_path):
    fake = fake_mpiexec(tmp_path, "exit 0\n")
    env = {**SLURM, "SLURM_JOB_NODELIST": "localhost,far[1-3]"}
    result = scaleoutrun("--verbose", "--mpiexec", fake, "python", "-c", "pass", env=env)
    assert result.returncode == 0, result.stderr
    assert (
        f"{fake} -n 7 -launcher slurm -hosts localhost:2,far1:2,far2:2,far3:1 -genvall"
        in result.stderr
    )
    off = scaleoutrun(
        "--verbose",
        "-np",
        "2",
        "--slurm",
        "off",
        "--mpiexec",
        fake,
        "python",
        "-c",
        "pass",
        env=env,
    )
    assert off.returncode == 0 and "-launcher" not in off.stderr
