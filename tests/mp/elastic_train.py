"""Run by
tests/test_elastic_state.py::test_a_killed_rank_stops_the_generation_and_the_next_one_resumes.

An elastic torch training (Note [Elastic restarts]), run by tests/test_elastic_state.py
under scaleoutrun's elastic driver: an MLP on 96 samples, 2 per rank per batch, a commit after
every batch, the samples of every committed batch recorded in the state. KILL=rank:batch makes
that rank kill itself (SIGKILL) before that batch's commit, in the first generation. At the end
rank 0 prints the samples the committed batches trained on, and the generations' sizes (and
the size the reset callback saw)."""

import json
import os
import signal

import torch

import scaleout.torch as hvd
from scaleout._elastic_run import run
from scaleout.torch._elastic_sampler import ElasticSampler
from scaleout.torch._elastic_state import TorchState

hvd.init()
LENGTH, BATCH = 96, 2
kill_rank, kill_batch = (int(x) for x in os.environ.get("KILL", "-1:-1").split(":"))
if os.environ.get("SCALEOUT_ELASTIC_GENERATION", "0") != "0":
    kill_rank = -1

torch.manual_seed(0)
data = torch.randn(LENGTH, 8)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
)
sampler = ElasticSampler(list(range(LENGTH)), shuffle=True, seed=1)
state = TorchState(model, optimizer, sampler=sampler, seen=[], sizes=[], batch=0)
state.register_reset_callbacks([lambda: state.sizes.append(("reset", hvd.size()))])


@run
def train(state):
    state.sizes.append(hvd.size())
    mine = list(state.sampler)
    for b in range(-(-len(mine) // BATCH)):  # the last batch may be short
        indices = mine[b * BATCH : (b + 1) * BATCH]
        optimizer.zero_grad()
        model(data[indices]).pow(2).mean().backward()
        optimizer.step()
        if hvd.rank() == kill_rank and state.batch == kill_batch:
            os.kill(os.getpid(), signal.SIGKILL)
        state.seen += [i for part in hvd.allgather_object(indices) for i in part]
        state.sampler.record_batch(b, BATCH)
        state.batch += 1
        state.commit()
    return state


train(state)
if hvd.rank() == 0:
    print("RESULT " + json.dumps({"seen": state.seen, "sizes": state.sizes}), flush=True)
