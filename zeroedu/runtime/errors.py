"""Failures a rank reports by type (`rank.failure`), below every module that raises them."""
from __future__ import annotations


class CollectiveError(RuntimeError):
    """A collective failed on this rank (`comm` raises it from the backend's error): most often
    the fallout of a peer that raised, died or hung, so the parent blames another rank first.
    Failures are told apart by this type, never by the words of a traceback."""

    def __init__(self, op: str, axis: str, tag: str, cause: BaseException):
        self.op, self.axis, self.tag = op, axis, tag
        super().__init__(f"{op} on axis {axis} ({tag}) failed: {type(cause).__name__}: {cause}")
