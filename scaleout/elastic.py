"""Elastic training with Horovod's names, for any framework (`hvd.elastic` of scaleout.torch,
scaleout.tensorflow and scaleout.tensorflow.keras adds the framework's states):

    state = scaleout.elastic.ObjectState(epoch=0, batch=0)

    @scaleout.elastic.run
    def train(state):
        ...
        state.commit()

    train(state)

started by `scaleoutrun -np 3 --min-np 2 --host-discovery-script ./hosts.sh python train.py`.
A job loses a host and goes on at a smaller size, or grows when hosts are added, from its last
commit (Note [Elastic restarts] in scaleout/_elastic_run.py, Note [Elastic driver] in
launcher/elastic_driver.py).
"""

from scaleout._elastic_protocol import HostUpdateResult
from scaleout._elastic_run import run
from scaleout._elastic_state import HostsUpdatedInterrupt, ObjectState, State
from scaleout._errors import HorovodInternalError

__all__ = [
    "run",
    "State",
    "ObjectState",
    "HostsUpdatedInterrupt",
    "HostUpdateResult",
    "HorovodInternalError",
]
