"""Coding-group formation (ParM §4.1): "query batches are placed in a coding group
consisting of k batches that have been consecutively dispatched".

One ``CodingGroups`` per coded model tags each batch the dispatcher sends with
``CodingTag(group, index, k)``; the dispatcher then copies the batch to the encoder, after
the worker has it, so encoding never delays dispatch. Group ids come from the
dispatcher's ``IdSpace`` (``common.ids``): a restarted dispatcher's groups never collide
with its previous incarnation's in the encoder and decoder, which key groups by
(model, group id).

Example
-------
>>> from keel.common.ids import IdSpace
>>> groups = CodingGroups(2, IdSpace(epoch=1))
>>> [(t.group & 0xFFFF, t.index) for t in (groups.tag(), groups.tag(), groups.tag())]
[(1, 0), (1, 1), (2, 0)]
"""
from __future__ import annotations

from keel.common.ids import IdSpace
from keel.common.protocol import CodingTag


class CodingGroups:
    """Consecutive batches of one model, k to a group."""

    __slots__ = ("k", "ids", "group", "index")

    def __init__(self, k: int, ids: IdSpace):
        self.k, self.ids = k, ids
        self.group, self.index = 0, 0

    def tag(self) -> CodingTag:
        """The tag of the next dispatched batch."""
        if self.index == 0:
            self.group = self.ids.next()
        tag = CodingTag(self.group, self.index, self.k)
        self.index = (self.index + 1) % self.k
        return tag
