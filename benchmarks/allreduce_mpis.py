"""scaleout beside each MPI's own mpi4py, on MPICH, Open MPI and Intel MPI: one column per MPI.

    python benchmarks/allreduce_mpis.py [--rounds 3] [--np 2]

For each MPI whose environment exists, runs benchmarks/allreduce.py (2 ranks, float32 Sum) with
that environment's scaleoutrun and Python, so scaleout runs on that MPI's library through its
shim and the baseline is that MPI's mpi4py in-place Allreduce in the same job; the MPIs take
turns, `--rounds` times. Prints the medians over rounds of each run's medians: 4 KiB, 1 MiB and
64 MiB, and 200 x 16 KiB submitted back to back (scaleout) beside 200 Allreduces one after
another (mpi4py). Environments: this Python's for MPICH, SCALEOUT_TEST_VENV_OMPI and
SCALEOUT_TEST_VENV_IMPI for the others (`eval "$(bash tools/make_mpi_envs.sh DIR)"`).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = ("4 KiB", "1 MiB", "64 MiB")
SMALL_SCALEOUT = "scaleout: 200 x allreduce_async_ (in place)"
SMALL_MPI4PY = "mpi4py: 200 x Allreduce of 16 KiB"
OTHERS = (("Open MPI", "SCALEOUT_TEST_VENV_OMPI"), ("Intel MPI", "SCALEOUT_TEST_VENV_IMPI"))
UNITS = {"us": 1.0, "ms": 1e3, "s": 1e6}
OPEN_MPI_AS_ROOT = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
}


def microseconds(text: str) -> float:
    value, unit = text.split()
    return float(value) * UNITS[unit]


def environments() -> dict[str, Path]:
    found = {"MPICH": Path(sys.prefix)}
    for name, variable in OTHERS:
        venv = os.environ.get(variable)
        if venv and (Path(venv) / "bin" / "scaleoutrun").exists():
            found[name] = Path(venv)
        else:
            print(f"# {name}: no environment ({variable}); left out", flush=True)
    return found


def run_once(venv: Path, nranks: int, work: str) -> dict[str, tuple[float, float]]:
    """{row: (scaleout us, mpi4py in-place us)} of one run of allreduce.py."""
    cmd = [
        str(venv / "bin" / "scaleoutrun"),
        "-np",
        str(nranks),
        str(venv / "bin" / "python"),
        str(ROOT / "benchmarks" / "allreduce.py"),
        "--max-mb", "64", "--no-halves", "--no-allgather", "--no-frameworks",
        "--iters", "200", "--small-iters", "20",
    ]  # fmt: skip
    env = dict(os.environ, **OPEN_MPI_AS_ROOT)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"
    env.pop("PYTHONPATH", None)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    got = {}
    small = {}
    lane = re.search(r"fast lane: (\d+) of this rank's (\d+)", out.stdout)
    if lane:  # Note [Fast lane]: how many of rank 0's allreduces it took
        print(f"# {venv.name}: fast lane {lane.group(1)} of {lane.group(2)}", flush=True)
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in re.sub(r"^\[\d+\]\s*", "", line).strip("|").split("|")]
        if len(cells) >= 6 and cells[0] in ROWS:
            got[cells[0]] = (microseconds(cells[2]), microseconds(cells[5]))
        elif len(cells) >= 2 and cells[0].startswith((SMALL_SCALEOUT, SMALL_MPI4PY)):
            small[cells[0][:20]] = microseconds(cells[1])
    got["200 x 16 KiB"] = (small[SMALL_SCALEOUT[:20]], small[SMALL_MPI4PY[:20]])
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--np", type=int, default=2)
    args = parser.parse_args()
    envs = environments()
    runs: dict[str, list[dict]] = {name: [] for name in envs}
    with tempfile.TemporaryDirectory() as work:
        for i in range(args.rounds):
            for name in envs if i % 2 == 0 else reversed(list(envs)):
                runs[name].append(run_once(envs[name], args.np, work))
                print(f"# round {i} {name} done", flush=True)
    print(f"\n## allreduce float32 Sum at {args.np} ranks; medians of {args.rounds} runs' medians")
    print("## scaleout / that MPI's mpi4py in-place Allreduce (200 x 16 KiB: 200 Allreduces)")
    header = "| size | " + " | ".join(f"{n}: scaleout | mpi4py | ratio" for n in envs) + " |"
    print(header)
    print("|" + "---|" * (1 + 3 * len(envs)))
    for row in ROWS + ("200 x 16 KiB",):
        cells = [row]
        for name in envs:
            mine = statistics.median(r[row][0] for r in runs[name])
            base = statistics.median(r[row][1] for r in runs[name])
            cells += [_fmt(mine), _fmt(base), f"{mine / base:.2f}"]
        print("| " + " | ".join(cells) + " |")
    return 0


def _fmt(us: float) -> str:
    return f"{us:.1f} us" if us < 1000 else f"{us / 1000:.2f} ms"


if __name__ == "__main__":
    sys.exit(main())
