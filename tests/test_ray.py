"""scaleout on a real Ray cluster that this module starts on this machine (`ray start --head`):
Ray Train's TorchTrainer with TorchConfig(backend="scaleout"), whose workers find the backend
through torch's entry point (scaleout/_torch_plugin.py) and join through torch's store (Note
[PMI bootstrap]), trains as one process does on the global batch; scaleout.ray's RayExecutor
(Horovod's) runs Horovod-style functions on workers it joins through a Ray actor's store
(tests/mp/ray_train.py, tests/mp/ray_executor.py). Skipped where Ray is not installed
(`pip install 'scaleout[ray]'`)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from conftest import free_port, run_job  # noqa: E402

MP = Path(__file__).resolve().parent / "mp"
RAY = str(Path(sys.executable).with_name("ray"))


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


def test_torch_trainer_trains_over_the_backend(cluster, tmp_path):
    address, env = cluster
    cmd = [sys.executable, str(MP / "ray_train.py"), "2", address, str(tmp_path)]
    proc = run_job(cmd, "TorchTrainer over the scaleout backend", 240, env, cwd=MP)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "all checks passed" in proc.stdout


def test_ray_executor_runs_horovod_style_functions(cluster):
    address, env = cluster
    cmd = [sys.executable, str(MP / "ray_executor.py"), "2", address]
    proc = run_job(cmd, "RayExecutor", 240, env, cwd=MP)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "all checks passed" in proc.stdout
