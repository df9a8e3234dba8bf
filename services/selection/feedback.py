"""The frontend's feedback log (Clipper §5): request id -> what selection needs to learn
from that request's feedback later, so feedback never re-runs a model.

An entry holds the application, the context and each queried model's output. The log is
bounded twice: an entry older than ``ttl_s`` is gone (feedback that late is answered
"expired or unknown"), and past ``cap`` entries the oldest go first. An entry is taken
once: a second feedback for the same request is answered "unknown" too, so a request's
feedback is learned from at most once.

Example
-------
>>> log = FeedbackLog(ttl_s=10, cap=2)
>>> log.put("r1", Entry("digits", "alice", {"m0": [0.9, 0.1]}), now=0.0)
>>> log.take("r1", now=1.0).context
'alice'
>>> log.take("r1", now=1.0) is None  # taken already
True
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Entry:
    app: str
    context: str
    predictions: dict[str, Any]  # model -> its output (score vector)


class FeedbackLog:
    def __init__(self, ttl_s: float = 600.0, cap: int = 100_000):
        if not ttl_s > 0 or cap < 1:
            raise ValueError(f"ttl_s must be > 0 and cap >= 1, got {ttl_s}, {cap}")
        self.ttl_s, self.cap = float(ttl_s), int(cap)
        self.entries: OrderedDict[str, tuple[float, Entry]] = OrderedDict()  # oldest first

    def put(self, request_id: str, entry: Entry, now: float) -> None:
        self.entries.pop(request_id, None)
        self.entries[request_id] = (now, entry)
        self._expire(now)
        while len(self.entries) > self.cap:
            self.entries.popitem(last=False)

    def take(self, request_id: str, now: float) -> Entry | None:
        """The entry of ``request_id``, removed; None if it is unknown, taken or expired."""
        self._expire(now)
        found = self.entries.pop(request_id, None)
        return None if found is None else found[1]

    def _expire(self, now: float) -> None:
        while self.entries:
            stamp, _ = next(iter(self.entries.values()))
            if now - stamp <= self.ttl_s:
                break
            self.entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self.entries)
