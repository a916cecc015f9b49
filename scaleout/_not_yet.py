"""Horovod names whose features scaleout does not have yet: process sets, elastic training and
Adasum. They exist, so a Horovod script fails where it uses the feature, with a
NotImplementedError that names it, never with an AttributeError or a TypeError.

Only the global process set exists: passing it (or leaving process_set= out) is always fine.
"""
from __future__ import annotations

from typing import Any, Optional

from scaleout import _basics
from scaleout._errors import ScaleoutError

__all__ = ["NotYetImplementedError", "ProcessSet", "global_process_set", "add_process_set",
           "remove_process_set", "check_process_set", "Adasum", "elastic_missing"]

PROCESS_SETS = ("process sets (collectives on a subgroup of ranks) are not implemented in "
                "scaleout yet")
ELASTIC = ("elastic training (hvd.elastic: State, run, ElasticSampler) is not implemented in "
           "scaleout yet")


class NotYetImplementedError(ScaleoutError, NotImplementedError):
    """A Horovod feature scaleout does not have yet."""


class ProcessSet:
    """Horovod's process set. Until process sets are implemented only `global_process_set`
    (every rank) exists; ProcessSet(ranks) raises NotYetImplementedError."""

    def __init__(self, ranks_or_comm: Any) -> None:
        raise NotYetImplementedError(f"ProcessSet({ranks_or_comm!r}): {PROCESS_SETS}; use "
                                     "the global process set (leave process_set= out)")

    @classmethod
    def _global(cls) -> "ProcessSet":
        ps = object.__new__(cls)
        ps.process_set_id = 0
        return ps

    @property
    def ranks(self) -> list:
        return list(range(_basics.size()))

    def size(self) -> int:
        return _basics.size()

    def rank(self) -> int:
        return _basics.rank()

    def included(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "ProcessSet(process_set_id=0, global)"


global_process_set = ProcessSet._global()


def add_process_set(process_set: Any) -> ProcessSet:
    raise NotYetImplementedError(f"add_process_set: {PROCESS_SETS}")


def remove_process_set(process_set: Any) -> bool:
    raise NotYetImplementedError(f"remove_process_set: {PROCESS_SETS}")


def check_process_set(process_set: Optional[Any], what: str) -> None:
    """Accepts the global process set (or None); anything else: NotYetImplementedError."""
    if process_set is not None and process_set is not global_process_set:
        raise NotYetImplementedError(f"{what}(process_set={process_set!r}): {PROCESS_SETS}; "
                                     "only the global process set is available")


# Horovod's Adasum reduce op: a name that exists, refused by resolve_op where it is used.
Adasum = -1


def elastic_missing(module: str) -> NotYetImplementedError:
    return NotYetImplementedError(f"{module}.elastic: {ELASTIC}")
