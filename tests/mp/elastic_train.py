"""One generation of an elastic torch training (Note [Elastic restarts]), run by
tests/test_elastic_state.py as the elastic driver will: an MLP on 96 samples, 2 per rank per
batch, a commit after every batch, the samples of every committed batch recorded in the state.
KILL=rank:batch makes that rank kill itself (SIGKILL) before that batch's commit. At the end
rank 0 prints the samples the committed batches trained on, and the generations' sizes.

Environment: SCALEOUT_ELASTIC_JOB and SCALEOUT_ELASTIC_DIR, as the driver sets them; EXITS_FILE:
where each rank appends "<rank> <code>" when it stops through os._exit."""
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
if "EXITS_FILE" in os.environ:  # records the code a rank stops with (os._exit skips all else)
    _exit = os._exit

    def _recording_exit(code):
        with open(os.environ["EXITS_FILE"], "a") as f:
            f.write(f"{hvd.rank()} {code}\n")
        _exit(code)
    os._exit = _recording_exit
kill_rank, kill_batch = (int(x) for x in os.environ.get("KILL", "-1:-1").split(":"))

torch.manual_seed(0)
data = torch.randn(LENGTH, 8)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
sampler = ElasticSampler(list(range(LENGTH)), shuffle=True, seed=1)
state = TorchState(model, optimizer, sampler=sampler, seen=[], sizes=[], batch=0)
state.register_reset_callbacks([lambda: state.sizes.append(("reset", hvd.size()))])


@run
def train(state):
    state.sizes.append(hvd.size())
    mine = list(state.sampler)
    for b in range(-(-len(mine) // BATCH)):  # the last batch may be short
        indices = mine[b * BATCH:(b + 1) * BATCH]
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
