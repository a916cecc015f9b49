"""Note [Commit store]: atomic writes, complete marks, the newest complete commit, pruning, and
a writer killed mid-write leaving nothing a reader would take (real processes, real files)."""

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scaleout._commit_store import CommitStore
from scaleout._errors import InvalidArgumentError

REPO = Path(__file__).resolve().parent.parent


def test_only_marked_commits_count_and_the_newest_wins(tmp_path):
    store = CommitStore(tmp_path / "store", keep=2)
    assert store.newest_complete() is None
    store.write(0, b"zero")
    assert store.newest_complete() is None  # written, not marked
    store.mark_complete(0)
    store.write(1, b"one")
    assert store.newest_complete() == 0
    store.mark_complete(1)
    assert store.newest_complete() == 1 and store.read(1) == b"one"
    with pytest.raises(InvalidArgumentError, match="no complete commit 5"):
        store.read(5)
    with pytest.raises(InvalidArgumentError, match="was not written"):
        store.mark_complete(7)


def test_pruning_keeps_the_newest_and_what_is_being_written(tmp_path):
    store = CommitStore(tmp_path, keep=2)
    for i in range(4):
        store.write(i, bytes([i]) * 10)
        if i != 2:  # commit 2 failed between write and mark
            store.mark_complete(i)
    store.write(4, b"in progress")
    store.prune()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "commit-1.bin",
        "commit-1.done",
        "commit-3.bin",
        "commit-3.done",
        "commit-4.bin",
    ], names
    assert store.complete() == [1, 3]


def test_a_writer_killed_mid_write_leaves_the_previous_commit(tmp_path):
    store = CommitStore(tmp_path)
    store.write(0, b"safe")
    store.mark_complete(0)
    # A process writing commit 1 is killed after its bytes are out, before the rename.
    code = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from scaleout._commit_store import CommitStore
        def stuck(src, dst):
            print("renaming", flush=True)
            time.sleep(60)   # the scenario: a writer stuck before its rename, until killed
        os.replace = stuck
        CommitStore({str(tmp_path)!r}).write(1, bytearray(50 << 20))
        """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "renaming"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert store.newest_complete() == 0 and store.read(0) == b"safe"
    assert not (tmp_path / "commit-1.bin").exists()
    assert any(p.name.startswith(".writing-") for p in tmp_path.iterdir())
    # The next commit's mark clears what the killed writer left.
    store.write(2, b"next")
    store.mark_complete(2)
    assert not any(p.name.startswith(".writing-") for p in tmp_path.iterdir())
    assert store.complete() == [0, 2]
