"""The requests a stateful operator's state has applied, so a retry never changes it twice.

A client's retry (after a reconnect, or to a second frontend after the first died) is a
new request for the frontend -- a new origin -- but the same request for the graph: it
carries the same ``GraphRequest.request`` (``protocol.request_key(client, request id)``).
A stateful operator looks each input's key up here before it runs a batch: a key found is
not applied again; the output saved for it goes downstream instead, so the retry gets an
answer, the same one.

The table describes one state: the primary records a batch's new keys when it updates
its state, ships them with that state (``GraphState``'s header: ``applied``, the batch's
wall-clock ``t``), and the backup records them when Algorithm 2 applies that state; both
record the same keys in the same order at the same ``t``, so after a takeover the new
primary's table is the old primary's as of the state it took over.

Bounded by count (``LIMIT``) and age (``MAX_AGE_S``, against the recording batch's ``t``):
past either the oldest keys are forgotten, and a retry of a forgotten key is applied again,
as a new request. Eviction happens only when a batch records, from shipped values, so a
primary and its backup forget the same keys.

Example
-------
>>> import numpy as np
>>> table = AppliedRequests(limit=2)
>>> table.record("1:c/r1", 0, 0, np.zeros(3, np.float32), t=10.0)
>>> table.get("1:c/r1").seq
0
>>> table.record("1:c/r2", 1, 1, np.ones(3, np.float32), t=11.0)
>>> table.record("1:c/r3", 2, 2, np.ones(3, np.float32), t=12.0)
>>> "1:c/r1" in table, len(table)
(False, 2)
"""
from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np

#: keys kept at most: a retry comes within a client's timeout and retries (seconds); at a
#: few thousand requests a second this still covers tens of seconds
LIMIT = 65536
#: keys older than this (seconds of the primary's wall clock) are forgotten
MAX_AGE_S = 300.0


class Applied(NamedTuple):
    """What a duplicate of an applied request needs: its output (answered again), and the
    seq and origin that first carried it (for logs and the trace)."""

    seq: int
    origin: int
    output: np.ndarray
    t: float


class AppliedRequests:
    """Request key -> ``Applied``, oldest first."""

    def __init__(self, limit: int | None = None, max_age_s: float | None = None):
        self.limit = LIMIT if limit is None else limit
        self.max_age_s = MAX_AGE_S if max_age_s is None else max_age_s
        self.entries: OrderedDict[str, Applied] = OrderedDict()

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def get(self, key: str | None) -> Applied | None:
        return self.entries.get(key) if key is not None else None

    def record(self, key: str, seq: int, origin: int, output: np.ndarray, t: float) -> None:
        """``key`` was applied at ``seq`` (a key recorded already keeps its first entry);
        then forget what is past the bounds."""
        if key not in self.entries:
            self.entries[key] = Applied(seq, origin, np.asarray(output), t)
        while len(self.entries) > self.limit:
            self.entries.popitem(last=False)
        while self.entries and next(iter(self.entries.values())).t < t - self.max_age_s:
            self.entries.popitem(last=False)

    def forget_after(self, seq: int) -> None:
        """A roll-back to the state at ``seq``: keys applied after it are not in that state
        (keys forgotten by the bounds since are not brought back: as if past the bound)."""
        for key in [k for k, a in self.entries.items() if a.seq > seq]:
            del self.entries[key]

    def to_json(self) -> list:
        """The whole table for a joining backup's whole state (a JSON header's value)."""
        return [[k, a.seq, a.origin, a.t, a.output.dtype.str, list(a.output.shape), a.output.ravel().tolist()]
                for k, a in self.entries.items()]

    @classmethod
    def from_json(cls, rows: list, limit: int | None = None, max_age_s: float | None = None) -> AppliedRequests:
        table = cls(limit, max_age_s)
        for key, seq, origin, t, dtype, shape, values in rows:
            table.entries[key] = Applied(seq, origin, np.asarray(values, dtype=np.dtype(dtype)).reshape(shape), t)
        return table
