"""Removing the shared-memory segments a job's MPI left behind.

MPICH names its segments /dev/shm/mpich_shm_*, Open MPI 5 sm_segment.* (Open MPI 4
vader_segment.*); a job whose ranks and launcher were killed leaves them there (several MiB
each, until the machine restarts). PRRTE removes its job's segments when a rank dies but not when
it is killed itself; Intel MPI unlinks its segments as soon as every rank has mapped them.
Each rank's wrapper (rank_exec) notes which of
these its rank maps while it runs (read from /proc/PID/maps, about once a second), and when the
rank has ended, however it ended, removes those that are still there, belong to this user and
that no process maps any more: the last wrapper of a machine to finish removes its job's
segments, on every machine of the job.

Only segments this job's own ranks mapped are ever considered, never one merely found in
/dev/shm: a job in another container that shares /dev/shm but not the pid namespace maps its
segments where this one cannot see (its processes are not in our /proc), and may be creating
one right now. A rank killed before its first look (within about a second of MPI's start)
leaves its segments: less tidy, never unsafe.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Set

__all__ = ["SHM_DIR", "PREFIXES", "segments_mapped_by", "mapped_paths", "remove_unmapped"]

SHM_DIR = Path("/dev/shm")
PREFIXES = ("mpich_shm_", "sm_segment.", "vader_segment.")


def _mapped_by(pid_dir: Path) -> Set[str]:
    paths: Set[str] = set()
    try:
        with open(pid_dir / "maps", "r", errors="replace") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    paths.add(parts[5].strip().removesuffix(" (deleted)"))
    except OSError:
        pass
    return paths


def segments_mapped_by(pid: int, directory: Path = SHM_DIR) -> Set[str]:
    """The names of the MPI segments in `directory` that process `pid` maps now."""
    prefix = str(directory) + "/"
    return {
        path[len(prefix) :]
        for path in _mapped_by(Path("/proc") / str(pid))
        if path.startswith(prefix) and path[len(prefix) :].startswith(PREFIXES)
    }


def mapped_paths(proc: Path = Path("/proc")) -> Set[str]:
    """Every file path some process this one can see maps (that this user may read)."""
    paths: Set[str] = set()
    for pid_dir in proc.iterdir() if proc.is_dir() else ():
        if pid_dir.name.isdigit():
            paths |= _mapped_by(pid_dir)
    return paths


def remove_unmapped(names: Iterable[str], directory: Path = SHM_DIR) -> list[str]:
    """Removes those of `names` (segments this job's ranks mapped) that are still in
    `directory`, are this user's and no process maps now; returns the names removed."""
    names = sorted(set(names))
    if not names:
        return []
    mapped = mapped_paths()
    removed = []
    for name in names:
        path = directory / name
        try:
            if path.stat().st_uid != os.getuid() or str(path) in mapped:
                continue
            path.unlink()
            removed.append(name)
        except OSError:
            continue
    return removed
