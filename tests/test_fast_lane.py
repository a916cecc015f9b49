"""Note [Fast lane]: small synchronous allreduces agreed with no negotiation, on real ranks (2,
and 4 on this 2-core machine), beside the same script with the lane off."""

import pytest
from conftest import run_mpi


@pytest.mark.parametrize("lane", ["on", "off"])
def test_the_lane_gives_what_negotiation_gives(nranks, lane):
    env = {} if lane == "on" else {"SCALEOUT_FAST_LANE": "0"}
    proc = run_mpi("fast_lane.py", nranks, lane, env=env)
    assert proc.stdout.count("all checks passed") == nranks
