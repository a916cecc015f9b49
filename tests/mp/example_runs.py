"""Run by tests/test_topk.py::test_digits_at_one_percent_density_reach_dense_accuracy.

Runs an example script several times in one job: argv is the script, then its argument lists
separated by '--'. Each run is the script as `python script ARGS` runs it (run as __main__,
its directory first on sys.path), in the same processes, one after the other, so that the job
pays for starting ranks and importing torch once. Before each run rank 0 prints `run N: ARGS`.
Each run builds its own model, optimizer and compression state (the example's module-level
code runs again); what carries over is the initialised core, as in a script calling init()
twice."""

import os
import runpy
import sys

script = sys.argv[1]
runs: list = [[]]
for arg in sys.argv[2:]:
    if arg == "--":
        runs.append([])
    else:
        runs[-1].append(arg)
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
for number, args in enumerate(runs):
    if os.environ.get("PMI_RANK", "0") == "0":
        print(f"run {number}: {' '.join(args)}", flush=True)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
