"""scaleout on a real Ray cluster that this module starts on this machine (`ray start --head`):
Ray Train's TorchTrainer with TorchConfig(backend="scaleout"), whose workers find the backend
through torch's entry point (scaleout/_torch_plugin.py) and join through torch's store (Note
[PMI bootstrap]), trains as one process does on the global batch; scaleout.ray's RayExecutor
(Horovod's) runs Horovod-style functions on workers it joins through a Ray actor's store
(tests/mp/ray_train.py, tests/mp/ray_executor.py). And a Ray cluster of two nodes on two
namespace hosts (tests/_hosts.py), with TorchTrainer's workers one per node. Skipped where Ray
is not installed (`pip install 'scaleout[ray]'`)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from _hosts import HostsUnavailable, made_hosts  # noqa: E402
from conftest import free_port, run_job  # noqa: E402

MP = Path(__file__).resolve().parent / "mp"
RAY = str(Path(sys.executable).with_name("ray"))
# Set once the two-node cluster started (the tests that use it come first in this file).
TWO_NODES_CAME_UP: list = []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Ray head with 4 CPUs, its address; stopped (every process of it) afterwards."""
    port = free_port()
    # A short folder: Ray's sockets live under it, and a Unix socket's path is short.
    temp = Path("/tmp") / f"so-ray-{os.getpid()}"
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    start = [RAY, "start", "--head", "--port", str(port), "--num-cpus", "4"]
    start += ["--include-dashboard=false", "--disable-usage-stats", "--temp-dir", str(temp)]
    proc = subprocess.run(start, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    try:
        yield f"127.0.0.1:{port}", env
    finally:
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=60)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """A Ray head on hostA and a second node joined to it from hostB (namespace hosts of
    tests/_hosts.py: their own network, host names and links), one CPU each: (the hosts, the
    head's address). Every process of both nodes ends with its host."""
    env = {"RAY_AUTH_MODE": "disabled"}
    head = "10.250.0.1:6379"
    # A short folder (Ray's sockets live under it); the second node takes the head's, and Ray
    # names its sockets apart there.
    temp = Path("/tmp") / f"so-ray-{os.getpid()}"
    common = ["--num-cpus", "1", "--object-store-memory", str(200 << 20), "--disable-usage-stats"]
    head_only = ["--head", "--port", "6379", "--include-dashboard=false", "--temp-dir", str(temp)]
    try:
        with made_hosts(tmp_path_factory.mktemp("ray_hosts"), 2) as hosts:
            for name, ip, role in (
                ("hostA", "10.250.0.1", head_only),
                ("hostB", "10.250.0.2", ["--address", head]),
            ):
                argv = [RAY, "start", *role, "--node-ip-address", ip, *common]
                proc = hosts.run_on(name, argv, env=env, timeout=120)
                assert proc.returncode == 0, f"ray start on {name}:\n{proc.stdout}{proc.stderr}"
            TWO_NODES_CAME_UP.append(True)
            yield hosts, head, env
    except HostsUnavailable as exc:
        pytest.skip(f"two Ray nodes: {exc}")
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def test_torch_trainer_across_two_ray_nodes(two_nodes, tmp_path):
    """TorchTrainer's two workers, one per Ray node (STRICT_SPREAD), bootstrap the backend
    across the link, see one rank per host, and train as one process does on the global
    batch."""
    hosts, head, env = two_nodes
    cmd = [sys.executable, str(MP / "ray_train.py"), "2", head, str(tmp_path), "spread"]
    proc = hosts.run_on("hostA", cmd, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "all checks passed" in proc.stdout, proc.stdout[-3000:]


def test_ray_executor_across_two_ray_nodes(two_nodes):
    """RayExecutor's two one-CPU workers land on the two nodes: each sees local rank 0 of 1,
    and the Horovod-style function's collectives and optimizer step cross the link."""
    hosts, head, env = two_nodes
    cmd = [sys.executable, str(MP / "ray_executor.py"), "2", head, "spread"]
    proc = hosts.run_on("hostA", cmd, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "all checks passed" in proc.stdout, proc.stdout[-3000:]


def _on_one_node(request):
    """The one-node cluster's address and environment, or a skip where the two-node tests (the
    file's first) ran the same scripts and checks, and more (a host per worker)."""
    if TWO_NODES_CAME_UP:
        pytest.skip("the two-node tests ran the same scripts and checks, a worker per host")
    return request.getfixturevalue("cluster")


def test_torch_trainer_trains_over_the_backend(request, tmp_path):
    address, env = _on_one_node(request)
    cmd = [sys.executable, str(MP / "ray_train.py"), "2", address, str(tmp_path)]
    proc = run_job(cmd, "TorchTrainer over the scaleout backend", 240, env, cwd=MP)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "all checks passed" in proc.stdout


def test_ray_executor_runs_horovod_style_functions(request):
    address, env = _on_one_node(request)
    cmd = [sys.executable, str(MP / "ray_executor.py"), "2", address]
    proc = run_job(cmd, "RayExecutor", 240, env, cwd=MP)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "all checks passed" in proc.stdout
