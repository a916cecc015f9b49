"""Horovod names whose features scaleout does not have yet: elastic training and Adasum. They
exist, so a Horovod script fails where it uses the feature, with a NotImplementedError that
names it, never with an AttributeError or a TypeError.
"""
from __future__ import annotations

from scaleout._errors import ScaleoutError

__all__ = ["NotYetImplementedError", "Adasum", "elastic_missing"]

ELASTIC = ("elastic training (hvd.elastic: State, run, ElasticSampler) is not implemented in "
           "scaleout yet")


class NotYetImplementedError(ScaleoutError, NotImplementedError):
    """A Horovod feature scaleout does not have yet."""


# Horovod's Adasum reduce op: a name that exists, refused by resolve_op where it is used.
Adasum = -1


def elastic_missing(module: str) -> NotYetImplementedError:
    return NotYetImplementedError(f"{module}.elastic: {ELASTIC}")
