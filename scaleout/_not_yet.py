"""Horovod names whose features scaleout does not have yet: elastic training. They
exist, so a Horovod script fails where it uses the feature, with a NotImplementedError that
names it, never with an AttributeError or a TypeError.
"""
from __future__ import annotations

from scaleout._errors import NotYetImplementedError

__all__ = ["NotYetImplementedError", "elastic_missing"]

ELASTIC = ("elastic training (hvd.elastic: State, run, ElasticSampler) is not implemented in "
           "scaleout yet")


def elastic_missing(module: str) -> NotYetImplementedError:
    return NotYetImplementedError(f"{module}.elastic: {ELASTIC}")
