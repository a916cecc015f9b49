"""Run by tests/test_elastic_state.py::test_state_commits_restores_and_resumes_at_another_size.

TorchState (Note [Elastic state]) on real ranks: commit and restore roll the model, the
optimizer, an ElasticSampler and plain attributes back to the last commit; sync() makes every
rank's state rank 0's; a host update reported on rank 0 interrupts commit() on every rank;
reset callbacks run on reset. With a commit store attached, phase 'first' commits as it trains
and phase 'second' (another number of ranks, fresh objects) resumes from the newest commit.

argv: phase ('first', 'second'), a directory for the stores (one per host)."""

import socket
import sys
import threading
from pathlib import Path

import torch
from _harness import check, expect_error, finish

import scaleout.torch as hvd
from scaleout._commit_store import CommitStore
from scaleout._elastic_protocol import HostUpdateResult
from scaleout._elastic_state import HostsUpdatedInterrupt, ObjectState
from scaleout._errors import ScaleoutError
from scaleout.torch._elastic_sampler import ElasticSampler
from scaleout.torch._elastic_state import TorchState

hvd.init()
r, n = hvd.rank(), hvd.size()
phase, directory = sys.argv[1], Path(sys.argv[2])


def make(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt


def step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    opt.zero_grad()
    model(torch.randn(4, 5, generator=g)).pow(2).sum().backward()
    opt.step()


def weights(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


store = CommitStore(directory / socket.gethostname()) if hvd.local_rank() == 0 else None
if phase == "first":
    model, opt = make(seed=r)  # different on every rank until sync
    sampler = ElasticSampler(list(range(50)), shuffle=False)
    state = TorchState(model, opt, sampler=sampler, epoch=0, batch=0)
    state.sync()
    rows = hvd.allgather(weights(model)[None])
    check(all(torch.equal(rows[0], row) for row in rows), "sync: rank 0's model everywhere")
    step(model, opt, 0)
    sampler.record_batch(0, 2)
    state.batch = 1
    state.commit()
    committed = weights(model).clone()
    momentum = opt.state_dict()["state"][0]["momentum_buffer"].clone()
    step(model, opt, 1)
    sampler.record_batch(1, 2)
    state.batch = 2
    state.restore()
    check(torch.equal(weights(model), committed), "restore: the committed model")
    check(
        torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], momentum),
        "restore: the committed momentum",
    )
    check(
        sampler.processed_num == 2 * n and state.batch == 1,
        "restore: the committed sampler and attributes",
    )
    # A host update seen by rank 0 interrupts every rank's commit, after the save.
    if r == 0:
        state.on_hosts_updated(5, HostUpdateResult.removed)
    try:
        state.commit()
        check(False, "commit after a host update raises HostsUpdatedInterrupt")
    except HostsUpdatedInterrupt as e:
        check(e.skip_sync, "only removed: skip_sync")
    state.commit()  # nothing new since: no interrupt
    called = []
    state.register_reset_callbacks([lambda: called.append(1), lambda: called.append(2)])
    state.on_reset()
    check(called == [1, 2], "reset callbacks, in order")
    # Durable commits: every host keeps a copy.
    state.attach_store(store)
    state.epoch = 3
    state.commit()
    state.commit()
    final = weights(model)
    if r == 0:
        torch.save(final, directory / "expected.pt")
    # A state that cannot be written (an attribute that cannot be pickled, set on every rank
    # though only a host's writer serializes): the program's error, on every rank.
    unpicklable = ObjectState(lock=threading.Lock())
    unpicklable.attach_store(store)
    said = expect_error(
        ScaleoutError,
        unpicklable.commit,
        "was not written on every host",
        what="commit of an unpicklable attribute",
    )
    if store is not None:  # the writer says why
        check("cannot pickle" in said, f"the writer's reason: {said!r}")
else:
    model, opt = make(seed=100 + r)
    sampler = ElasticSampler(list(range(50)), shuffle=False)
    state = TorchState(model, opt, sampler=sampler, epoch=0, batch=0)
    state.attach_store(store)
    check(state.resume(), "a commit to resume from")
    expected = torch.load(directory / "expected.pt")
    check(torch.equal(weights(model), expected), "resumed: the last committed model")
    check(state.epoch == 3 and state.batch == 1, "resumed: the attributes")
    check(
        sampler.processed_num > 0 and sampler.num_replicas == n,
        "resumed: the sampler, re-sharded over this job's ranks",
    )
    step(model, opt, 7)  # and training goes on
    state.commit()
finish()
