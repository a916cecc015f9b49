"""Run by tests/test_slurm.py::test_salloc_scaleoutrun_reads_the_allocation,
tests/test_slurm.py::test_srun_starts_the_ranks, tests/test_slurm.py::test_sbatch_script,
tests/test_slurm.py::test_srun_starts_uneven_tasks_on_three_nodes,
tests/test_slurm.py::test_srun_without_a_pmi_plugin_is_refused,
tests/test_slurm.py::test_srun_with_a_plugin_open_mpi_does_not_read_is_refused.

A small deterministic data-parallel training, whatever started the ranks: linear regression by
SGD on one global data set (the same seed everywhere), each rank on its own rows, the gradient
averaged by allreduce every step. Every rank prints one RESULT line: where it ran (host, local
rank and size) and the final weights' bytes, so that a test can check the placement and compare
the weights of jobs started by scaleoutrun, salloc, srun and sbatch bit for bit.
"""

import json
import socket

import numpy as np

import scaleout as so

STEPS, FEATURES, ROWS = 40, 16, 512

so.init()
r, n = so.rank(), so.size()
data = np.random.default_rng(2026)
x = data.standard_normal((ROWS, FEATURES))
y = x @ data.standard_normal(FEATURES) + 0.01 * data.standard_normal(ROWS)
mine = slice(r, None, n)  # rank r's rows: every n-th from r
w = np.zeros(FEATURES)
for _ in range(STEPS):
    error = x[mine] @ w - y[mine]
    gradient = 2.0 * x[mine].T @ error / ROWS * n
    w -= 0.05 * so.allreduce(gradient, op=so.Average, name="gradient")
loss = so.allreduce(np.array([float(np.sum((x[mine] @ w - y[mine]) ** 2))]), op=so.Sum, name="loss")
print(
    "RESULT "
    + json.dumps(
        {
            "rank": r,
            "size": n,
            "host": socket.gethostname(),
            "local_rank": so.local_rank(),
            "local_size": so.local_size(),
            "weights": w.tobytes().hex(),
            "loss": float(loss[0]) / ROWS,
        }
    ),
    flush=True,
)
so.shutdown()
