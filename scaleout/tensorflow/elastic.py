"""Elastic training for TensorFlow with Horovod 0.28.1's names (`hvd.elastic` of
scaleout.tensorflow): `run`, `TensorFlowKerasState(model, optimizer, **kwargs)`,
`TensorFlowState(variables, session, **kwargs)`, and the framework-neutral names of
scaleout.elastic.

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...                      # steps, and state.commit() every few of them

    train(state)

What each state saves, syncs and commits: Note [Keras elastic state]
(scaleout/tensorflow/_elastic_state.py). ObjectState's bcast_object and get_rank may be left
out, and Horovod's one-argument bcast_object (broadcast_object_fn()'s) works.
"""

from scaleout.elastic import (
    HorovodInternalError,
    HostsUpdatedInterrupt,
    HostUpdateResult,
    ObjectState,
    State,
    run,
)
from scaleout.tensorflow._elastic_state import TensorFlowKerasState, TensorFlowState

__all__ = [
    "run",
    "State",
    "ObjectState",
    "TensorFlowKerasState",
    "TensorFlowState",
    "HostsUpdatedInterrupt",
    "HostUpdateResult",
    "HorovodInternalError",
]
