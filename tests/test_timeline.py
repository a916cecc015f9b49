"""SCALEOUT_TIMELINE: rank 0 writes a Chrome trace naming every tensor (TensorFlow's as Horovod
names them)."""

import sys

import pytest
from conftest import MP, one_size, run_mpi

sys.path.insert(0, str(MP))
import _timeline  # noqa: E402


def test_timeline_is_a_chrome_trace_of_every_tensor(tmp_path, nranks):
    path = tmp_path / "timeline.json"
    run_mpi("timeline.py", nranks, env={"SCALEOUT_TIMELINE": str(path)})
    _, rows, spans = _timeline.read(path)
    assert set(rows.values()) == {f"layer{i}.grad" for i in range(4)} | {'odd "name"'}
    for tensor in rows.values():
        names = [s["name"] for s in spans if s["tensor"] == tensor]
        kind = "ALLGATHER" if tensor.startswith("odd") else "ALLREDUCE"
        want = 1 if tensor.startswith("odd") else 3
        assert names == [f"NEGOTIATE_{kind}", kind] * want, (tensor, names)
    assert all(s["end"] is not None and s["end"] >= s["ts"] >= 0 for s in spans), spans
    done = [s["args"] for s in spans if s["name"] == "ALLREDUCE"]
    assert all(a["dtype"] == "float64" and a["shape"] == "[100]" for a in done), done
    assert max(a["fused_tensors"] for a in done) >= 1 and all(a["status"] == "OK" for a in done)


def test_horovod_timeline_is_whole_json_while_the_job_runs(tmp_path, nranks):
    """HOROVOD_TIMELINE set before init, as Horovod's users do: a moment after the first
    allreduce the file already holds it, and every read of it is a whole JSON array."""
    path = tmp_path / "timeline.json"
    env = {"HOROVOD_TIMELINE": str(path), "HOROVOD_TIMELINE_MARK_CYCLES": "1"}
    proc = run_mpi("timeline_live.py", nranks, str(path), env=env)
    assert proc.stdout.count("all checks passed") == nranks


@pytest.mark.parametrize("nranks", [2, 3], ids=["np2", "np3"])
def test_start_and_stop_timeline_at_run_time(nranks, tmp_path):
    # HOROVOD_TIMELINE=DYNAMIC, as Horovod's users set it for start_timeline (not needed here)
    proc = run_mpi(
        "timeline_runtime.py", nranks, str(tmp_path), env={"HOROVOD_TIMELINE": "DYNAMIC"}
    )
    assert proc.stdout.count("all checks passed") == nranks


@one_size(2)
def test_tensorflow_tensors_have_horovods_names(nranks, tmp_path):
    """In a graph (tf.function) every collective, and DistributedGradientTape's reductions in a
    graph and eagerly, show in the timeline under the node names Horovod 0.28.1's ops get from
    the same code (the script builds Horovod's graph around a stand-in op to find them)."""
    pytest.importorskip("tensorflow")
    proc = run_mpi("tf_horovod_names.py", nranks, str(tmp_path), timeout=300)
    assert proc.stdout.count("all checks passed") == nranks, proc.stdout + proc.stderr
