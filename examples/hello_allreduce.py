"""The smallest scaleout job: every rank contributes its rank number.

scaleoutrun -np 2 python examples/hello_allreduce.py
"""

import numpy as np

import scaleout as so

so.init()
total = so.allreduce(np.array([so.rank()], dtype=np.float32), op=so.Sum, name="hello")
gathered = so.allgather(np.array([[so.rank(), so.local_rank()]]))
print(
    f"rank {so.rank()} of {so.size()}: sum of ranks = {total[0]:.0f}, "
    f"(rank, local_rank) of everyone = {gathered.tolist()}"
)
so.shutdown()
