"""Install time: scaleout's prebuilt wheel beside a build from source, each into a fresh venv.

    python benchmarks/install_time.py [--wheel dist/scaleout-*.whl] [--rounds 3]

Each round makes two fresh virtual environments and times, alternating which goes first:
- wheel:  `pip install <wheel>[mpich]` (numpy, mpi4py, mpich and scaleout, nothing compiled; run
  with no C++ compiler on PATH to show that none is needed),
- source: `pip install <copy of the source tree>` (the same packages, the core and its MPI shims
  compiled; on a machine without MPI the build depends on the mpich wheel).
pip's cache is off for both. Without --wheel the wheel is built first (tools/build_wheel.sh,
not timed). Prints each round and the medians.
"""

from __future__ import annotations

import argparse
import glob
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed_install(work: Path, name: str, target: str) -> float:
    venv = work / name
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    start = time.perf_counter()
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--no-cache-dir", target],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    elapsed = time.perf_counter() - start
    shutil.rmtree(venv)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", help="the wheel (default: build one)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        wheel = args.wheel
        if wheel is None:
            subprocess.run(["bash", str(ROOT / "tools" / "build_wheel.sh"), str(work)], check=True)
            wheel = glob.glob(str(work / "scaleout-*.whl"))[0]
        source = work / "src"
        files = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True
        ).stdout.split()
        for f in files:
            (source / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, source / f)
        times = {"wheel": [], "source": []}
        targets = {"wheel": f"{wheel}[mpich]", "source": str(source)}
        print(f"{'round':>5} {'wheel s':>9} {'source s':>9}")
        for i in range(args.rounds):
            order = ["wheel", "source"] if i % 2 == 0 else ["source", "wheel"]
            for kind in order:
                times[kind].append(timed_install(work, kind, targets[kind]))
            print(f"{i:>5} {times['wheel'][-1]:>9.1f} {times['source'][-1]:>9.1f}", flush=True)
        print(
            f"median {statistics.median(times['wheel']):>8.1f} "
            f"{statistics.median(times['source']):>9.1f}   "
            f"(pip install into a fresh venv; wheel: {Path(wheel).name})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
