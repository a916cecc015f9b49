"""SCALEOUT_TIMELINE: rank 0 writes a Chrome trace naming every tensor."""

import json

import pytest
from conftest import run_mpi


def test_timeline_is_a_chrome_trace_of_every_tensor(tmp_path):
    path = tmp_path / "timeline.json"
    run_mpi("timeline.py", 2, env={"SCALEOUT_TIMELINE": str(path)})
    events = json.loads(path.read_text())
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert set(rows.values()) == {f"layer{i}.grad" for i in range(4)} | {'odd "name"'}
    spans = [e for e in events if e.get("ph") == "X"]
    for tensor in rows.values():
        names = [e["name"] for e in spans if rows[e["tid"]] == tensor]
        kind = "ALLGATHER" if tensor.startswith("odd") else "ALLREDUCE"
        want = 1 if tensor.startswith("odd") else 3
        negotiate = names.count(f"NEGOTIATE_{kind}")
        assert negotiate == want and names.count(kind) == want, (tensor, names)
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    fused = [e["args"]["fused_tensors"] for e in spans if e["name"] == "ALLREDUCE"]
    assert max(fused) >= 1 and all(e["args"]["status"] == "OK" for e in spans if "args" in e)


@pytest.mark.parametrize("nranks", [2, 3], ids=["np2", "np3"])
def test_start_and_stop_timeline_at_run_time(nranks, tmp_path):
    # HOROVOD_TIMELINE=DYNAMIC, as Horovod's users set it for start_timeline (not needed here)
    proc = run_mpi(
        "timeline_runtime.py", nranks, str(tmp_path), env={"HOROVOD_TIMELINE": "DYNAMIC"}
    )
    assert proc.stdout.count("all checks passed") == nranks
