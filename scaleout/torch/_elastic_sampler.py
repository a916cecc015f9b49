"""ElasticSampler, as Horovod's (scaleout.torch.elastic).

A sampler that can resume an epoch part-way through, at another number of ranks: it counts the
samples processed in the epoch by all ranks together (`record_batch`), and `reset()` shards what
is left of the epoch's order over the ranks there are now. Its state is (epoch, processed_num),
so it is small, and the same on every rank.

Horovod's semantics, to the sample: the epoch's order is range(len(dataset)), shuffled with
Python's `random.Random(seed + epoch)` when `shuffle`; the remaining samples are that order from
`processed_num` on; each rank takes every size()-th of them from its rank, the list padded by
wrapping around to a multiple of size() (so a rank may see a few samples twice at the end of an
epoch, as with torch's DistributedSampler). `set_epoch(e)` starts epoch e from its beginning.
"""

from __future__ import annotations

import math
import random
from typing import Iterator, List, Sized

import torch.utils.data

from scaleout._runtime import rank, size

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler):
    """Samples this rank's share of what is left of the epoch (see the module)."""

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch `epoch` from its beginning (call it at the end of each epoch)."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Counts a batch of `batch_size` samples processed by every rank."""
        del batch_idx  # Horovod's signature; the count is what matters
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Shards what is left of the epoch over the ranks there are now."""
        self.num_replicas = size()
        self.rank = rank()
        order: List[int] = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num :]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = list(self.remaining_indices)
        if indices:
            while len(indices) < self.total_size:  # wrap around to a multiple of the ranks
                indices += indices[: self.total_size - len(indices)]
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
