"""Horovod names whose features scaleout does not have yet: elastic training, Adasum, and
process sets in the torch and TensorFlow front ends. They exist, so a Horovod script fails where
it uses the feature, with a NotImplementedError that names it, never with an AttributeError or
a TypeError.
"""
from __future__ import annotations

from typing import Any, Optional

from scaleout._errors import ScaleoutError

__all__ = ["NotYetImplementedError", "check_process_set", "Adasum", "elastic_missing"]

PROCESS_SETS = ("process sets are not yet passed on by this front end (torch, TensorFlow, "
                "Keras)")
ELASTIC = ("elastic training (hvd.elastic: State, run, ElasticSampler) is not implemented in "
           "scaleout yet")


class NotYetImplementedError(ScaleoutError, NotImplementedError):
    """A Horovod feature scaleout does not have yet."""


from scaleout._process_sets import global_process_set  # noqa: E402


def check_process_set(process_set: Optional[Any], what: str) -> None:
    """The torch and TensorFlow front ends, until they pass process sets on: the global process
    set (or None) only; anything else: NotYetImplementedError."""
    if process_set is not None and process_set is not global_process_set and \
            getattr(process_set, "process_set_id", None) != 0:
        raise NotYetImplementedError(f"{what}(process_set={process_set!r}): {PROCESS_SETS}; "
                                     "the numpy-level collectives (scaleout.allreduce, ...) take "
                                     "process sets already")


# Horovod's Adasum reduce op: a name that exists, refused by resolve_op where it is used.
Adasum = -1


def elastic_missing(module: str) -> NotYetImplementedError:
    return NotYetImplementedError(f"{module}.elastic: {ELASTIC}")
