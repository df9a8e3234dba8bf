"""Ids that carry their sender's incarnation, so a restart never mixes old and new work.

A frontend numbers its queries, and a dispatcher its batches and coding groups, from an
``IdSpace``: the high bits of every id are the *epoch* the process chose when it started
(10 ms ticks of the wall clock, so a later start has a larger epoch), the low 32 bits a
counter. A peer that receives an id from an older incarnation than the newest it has seen
from that sender -- or, for the sender itself, any epoch but its own -- knows it is stale.

Example
-------
>>> space = IdSpace(epoch=5)
>>> qid = space.next()
>>> epoch_of(qid), qid & SEQ_MASK
(5, 1)
"""
from __future__ import annotations

import time
from collections.abc import Callable

SEQ_BITS = 32
SEQ_MASK = (1 << SEQ_BITS) - 1
EPOCH_BITS = 30  # 10 ms ticks: wraps after about 124 days; ids stay below 2**62


def new_epoch() -> int:
    """An epoch for a process starting now: larger than that of any earlier start (until
    the wrap) and never 0."""
    return (time.time_ns() // 10_000_000) % (1 << EPOCH_BITS) or 1


def epoch_of(ident: int) -> int:
    return ident >> SEQ_BITS


class IdSpace:
    """Ids of one incarnation: ``epoch << 32 | seq`` with seq counting from 1."""

    __slots__ = ("epoch", "base", "seq")

    def __init__(self, epoch: int | None = None):
        self.epoch = new_epoch() if epoch is None else epoch
        self.base = self.epoch << SEQ_BITS
        self.seq = 0

    def next(self) -> int:
        self.seq += 1
        return self.base | self.seq

    def owns(self, ident: int) -> bool:
        return ident >> SEQ_BITS == self.epoch


class NewestEpochs:
    """The newest epoch seen from each sender (a dispatcher, by the model it serves), so a
    receiver can recognise a message of an older incarnation. Bounded: past ``limit``
    senders the first one seen is forgotten."""

    def __init__(self, limit: int = 1024):
        self.limit = limit
        self.newest: dict[str, int] = {}

    def see(self, sender: str, epoch: int) -> tuple[bool, bool]:
        """(current, advanced). ``current`` is False for an epoch older than the newest seen
        from ``sender``, or one no ``IdSpace`` makes (it would shadow every real one);
        ``advanced`` is True when ``epoch`` is newer than any before it: what older
        incarnations left behind can be dropped."""
        newest = self.newest.get(sender)
        if epoch >> EPOCH_BITS or (newest is not None and epoch < newest):
            return False, False
        if newest is not None and epoch == newest:
            return True, False
        if newest is None and len(self.newest) >= self.limit:
            del self.newest[next(iter(self.newest))]
        self.newest[sender] = epoch
        return True, True

    def admit(self, sender: str, epoch: int, groups: dict, forget: Callable[[tuple], None]) -> bool:
        """Whether a message of ``epoch`` from ``sender`` is current; when it is the newest
        yet, ``forget`` each key of ``groups`` -- (sender, id) -- that an older incarnation
        left open. The encoder's and decoder's coding groups are kept this way."""
        current, advanced = self.see(sender, epoch)
        if advanced:
            for key in [k for k in groups if k[0] == sender and epoch_of(k[1]) < epoch]:
                forget(key)
        return current
