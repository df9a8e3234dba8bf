"""Who is primary, who is backup, and in which epoch: the one seam between an operator
process and the manager (HAMS §III-A).

A process starts with the role and epoch of its spec (a stateful operator's primary and
backup, epoch 1); the Raft manager's decisions move it (``change``, a newer epoch only).
The operator reads ``role`` and ``epoch`` on every batch and every state, so a promotion
needs no other change here. Messages of another epoch are dropped.
"""
from __future__ import annotations

from collections.abc import Callable


class EpochRole:
    """The role this process holds and the epoch it holds it in."""

    def __init__(self, role: str, epoch: int = 1):
        self.role, self.epoch = role, epoch
        self.listeners: list[Callable[[str, int], None]] = []

    def change(self, role: str, epoch: int) -> None:
        """The manager's decision: a newer epoch only (fencing)."""
        if epoch <= self.epoch:
            return
        self.role, self.epoch = role, epoch
        for fn in self.listeners:
            fn(role, epoch)
