"""The errors scaleoutrun reports with its own exit status (see main.py)."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """A request scaleoutrun cannot carry out as given: reported with exit status 2."""
