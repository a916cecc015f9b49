"""scaleout/_elastic_protocol.py: what the elastic driver writes, a rank reads back as meant.
The channel itself, driver to rank 0, is tested in tests/test_launcher_elastic.py."""

from __future__ import annotations

from pathlib import Path

from scaleout import _elastic_protocol as protocol


def test_the_ranks_read_back_the_variables_the_driver_gives_them():
    env = {
        **protocol.job_environment("job-7", [("hostA", 2), ("hostB", 1)]),
        **protocol.driver_environment(["10.0.0.5", "127.0.0.1"], 4242, "secret", 3),
    }
    assert protocol.job_id(env) == "job-7" and protocol.generation(env) == 3
    assert [protocol.host_of_rank(env, rank) for rank in range(4)] == [
        "hostA",
        "hostA",
        "hostB",
        None,
    ]
    assert protocol.driver_addresses(env) == ["10.0.0.5:4242", "127.0.0.1:4242"]
    assert env[protocol.TOKEN] == "secret"
    # Not under the driver.
    assert protocol.job_id({}) is None and protocol.generation({}) == 0
    assert protocol.host_of_rank({}, 0) is None and protocol.driver_addresses({}) == []


def test_the_commits_directory():
    assert protocol.job_directory("j", {protocol.DIR: "/data/c"}) == Path("/data/c")
    assert protocol.job_directory("j", {}).name == "scaleout-commits-j"


def test_the_channels_lines():
    token = protocol.new_token()
    assert protocol.parse_hello(protocol.hello(token, 4)) == (token, "4")
    line = protocol.update_line(1700000000, protocol.HostUpdateResult.added)
    assert line == b"1700000000 2\n"
    assert protocol.parse_update(line.decode()) == (1700000000, 2)
    assert protocol.parse_update("garbage\n") is None
    assert (
        protocol.HostUpdateResult.mixed
        == protocol.HostUpdateResult.added | protocol.HostUpdateResult.removed
    )
    assert protocol.RESTART_EXIT_CODE == 75  # EX_TEMPFAIL, what Note [Elastic restarts] says
