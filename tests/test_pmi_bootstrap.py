"""Note [PMI bootstrap]'s parts that need no MPI: the PMI-1 server (scaleout/_pmi_server.py, a
real process spoken to over real sockets, as MPI's client speaks to it), which processes must
bootstrap (wanted), and the process mapping. The bootstrap itself, with MPI, is tested in
tests/test_torch_distributed.py (torchrun, processes given torch's variables, other MPIs)."""

import os
import socket
import subprocess
import sys

import pytest

from scaleout import _pmi_bootstrap

SERVER = os.path.join(os.path.dirname(_pmi_bootstrap.__file__), "_pmi_server.py")


class Server:
    def __init__(self, size: int, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, SERVER, "--size", str(size), "--host", "127.0.0.1", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            pass_fds=tuple(int(a) for a in args if a.isdigit()),
        )
        host, port = self.proc.stdout.readline().strip().rsplit(":", 1)
        self.address = (host, int(port))

    def client(self) -> "Client":
        return Client(socket.create_connection(self.address, timeout=10))

    def exit_code(self) -> int:
        return self.proc.wait(timeout=20)


class Client:
    def __init__(self, sock: socket.socket):
        self.sock, self.pending = sock, b""

    def send(self, line: str) -> None:
        self.sock.sendall(line.encode() + b"\n")

    def read(self) -> str:
        while b"\n" not in self.pending:
            data = self.sock.recv(4096)
            if not data:
                return ""
            self.pending += data
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()

    def ask(self, line: str) -> dict:
        self.send(line)
        return dict(field.split("=", 1) for field in self.read().split())


def test_two_ranks_put_get_barrier_and_finalize():
    server = Server(2, "--mapping", "(vector,(0,1,2))")
    a, b = server.client(), server.client()
    for c in (a, b):
        reply = c.ask("cmd=init pmi_version=1 pmi_subversion=1")
        assert reply["cmd"] == "response_to_init" and reply["rc"] == "0"
        maxes = c.ask("cmd=get_maxes")
        # Hydra's limits: MPICH's client reads a reply line of at most 1024 bytes.
        assert (maxes["keylen_max"], maxes["vallen_max"]) == ("64", "1024")
    kvs = a.ask("cmd=get_my_kvsname")["kvsname"]
    assert kvs.startswith("scaleout_") and kvs == b.ask("cmd=get_my_kvsname")["kvsname"]
    assert a.ask(f"cmd=put kvsname={kvs} key=card-0 value=abc")["rc"] == "0"
    a.send("cmd=barrier_in")
    b.send("cmd=barrier_in")
    assert a.read() == "cmd=barrier_out rc=0" and b.read() == "cmd=barrier_out rc=0"
    assert b.ask(f"cmd=get kvsname={kvs} key=card-0")["value"] == "abc"
    missing = b.ask(f"cmd=get kvsname={kvs} key=nothing")
    assert missing["rc"] == "-1"
    mapping = b.ask(f"cmd=get kvsname={kvs} key=PMI_process_mapping")
    assert mapping["value"] == "(vector,(0,1,2))"
    for c in (a, b):
        assert c.ask("cmd=finalize")["cmd"] == "finalize_ack"
        c.sock.close()
    assert server.exit_code() == 0


def test_a_rank_that_dies_before_finalizing_ends_the_others():
    server = Server(3)
    a, b, c = server.client(), server.client(), server.client()
    for x in (a, b, c):
        x.ask("cmd=init pmi_version=1 pmi_subversion=1")
    b.send("cmd=barrier_in")
    a.sock.close()  # dies in MPI_Init: the others must not wait in the barrier forever
    assert b.read() == "" and c.read() == ""
    assert server.exit_code() == 1
    assert "without finalizing" in server.proc.stderr.read()


def test_an_abort_ends_the_job():
    server = Server(2)
    a, b = server.client(), server.client()
    for x in (a, b):
        x.ask("cmd=init pmi_version=1 pmi_subversion=1")
    a.send("cmd=abort exitcode=3 msg=out of memory")
    assert b.read() == ""
    assert server.exit_code() == 1


def test_the_server_leaves_when_the_process_that_started_it_does():
    read_end, write_end = os.pipe()
    server = Server(2, "--watch-fd", str(read_end), "--grace", "0")
    os.close(read_end)
    waiting = server.client()  # one rank never comes: this one stays connected
    waiting.ask("cmd=init pmi_version=1 pmi_subversion=1")
    os.close(write_end)
    assert server.exit_code() == 0
    waiting.sock.close()


@pytest.mark.parametrize(
    "env,size,want",
    [
        ({"RANK": "0", "WORLD_SIZE": "2"}, None, True),  # processes given torch's variables
        ({"RANK": "0", "WORLD_SIZE": "1"}, None, False),  # one process: nothing to join
        ({"WORLD_SIZE": "2"}, None, False),  # no RANK: not torch's launch
        ({"RANK": "1", "WORLD_SIZE": "2", "PMI_RANK": "1", "PMI_SIZE": "2"}, None, False),
        ({"RANK": "0", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}, None, False),
        ({"RANK": "0", "WORLD_SIZE": "2", "SLURM_STEP_NUM_TASKS": "2"}, None, False),
        ({"PMI_RANK": "0", "PMI_SIZE": "2"}, 2, False),  # init_process_group under mpiexec
        ({}, 2, True),  # init_process_group(init_method="tcp://...", rank=, world_size=)
        # torchrun's workers inherit the variables of the srun or mpiexec that started torchrun
        ({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "4", "PMI_FD": "5"}, None, True),
    ],
)
def test_which_processes_join_through_the_store(env, size, want):
    assert _pmi_bootstrap.wanted(env, size) is want


def test_the_mapping_gives_each_run_of_a_hosts_ranks():
    assert _pmi_bootstrap.mapping(["a", "a", "a"]) == "(vector,(0,1,3))"
    assert _pmi_bootstrap.mapping(["a", "a", "b", "b"]) == "(vector,(0,1,2),(1,1,2))"
    assert _pmi_bootstrap.mapping(["a", "b", "a"]) == "(vector,(0,1,1),(1,1,1),(0,1,1))"
