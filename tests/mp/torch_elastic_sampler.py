"""Run by tests/test_elastic_sampler.py::test_the_epoch_goes_on_at_another_size.

ElasticSampler (scaleout/torch/_elastic_sampler.py) across a change of world size: phase
'first' processes three batches of an epoch and saves the sampler's state; phase 'second', at
another number of ranks, loads it and processes the rest. Every sample of the epoch is then
processed, the ones before the save exactly once; the order is Horovod's (Python's random with
seed + epoch).

argv: phase ('first' or 'second'), a file shared by the ranks."""

import json
import random
import sys

from _harness import check, finish

import scaleout.torch as hvd
from scaleout.torch._elastic_sampler import ElasticSampler

hvd.init()
r, n = hvd.rank(), hvd.size()
phase, path = sys.argv[1], sys.argv[2]
LENGTH, BATCH, SEED, EPOCH = 101, 4, 3, 2
order = list(range(LENGTH))
random.Random(SEED + EPOCH).shuffle(order)

sampler = ElasticSampler(list(range(LENGTH)), shuffle=True, seed=SEED)
if phase == "first":
    sampler.set_epoch(EPOCH)
    mine = list(sampler)
    check(len(sampler) == -(-LENGTH // n), "len is this rank's share")
    check(mine == (order + order)[r : n * len(sampler) : n], "the rank's share of Horovod's order")
    seen = []
    for b in range(3):
        seen += mine[b * BATCH : (b + 1) * BATCH]
        sampler.record_batch(b, BATCH)
    everyone = hvd.allgather_object(seen)
    if r == 0:
        with open(path, "w") as f:
            json.dump({"state": sampler.state_dict(), "seen": everyone}, f)
else:
    with open(path) as f:
        saved = json.load(f)
    sampler.load_state_dict(saved["state"])
    check(sampler.state_dict() == saved["state"], "the state comes back")
    rest = hvd.allgather_object(list(sampler))
    if r == 0:
        first = sorted(i for part in saved["seen"] for i in part)
        done = saved["state"]["processed_num"]
        check(first == sorted(order[:done]), "the first phase took the epoch's first samples")
        second = [i for part in rest for i in part]
        check(sorted(set(second)) == sorted(order[done:]), "the second phase takes the rest")
        # only padding repeats: at most n - 1 samples twice
        check(len(second) - len(set(second)) <= n - 1, "no sample twice but the padding")
        check(not set(first) & set(second), "nothing processed before the save comes again")
finish()
