"""A client request's life at the frontend, in one place: its states, the one transition
function, and the two seams where later layers attach.

States (``State``)::

    ADMITTED --> WAITING --> ANSWERED
        |           |           ^
        |           +--> HELD --+
        +-----------------------+        (errors, cache hits, duplicates answer at once)
        +--> HELD

- ADMITTED: decoded and checked; nothing is computing for it yet.
- WAITING: its model queries are in flight (or it shares a computation already in flight).
- HELD: its answer is decided but the hold keeps it from leaving (HAMS: not yet durable).
- ANSWERED: its one reply has left. Any transition out of ANSWERED -- answering twice --
  raises ``LifecycleError``: exactly one answer per accepted request is the invariant.

Seams:

- ``Selection`` (Clipper §5, model selection): which model queries a request makes and
  how their outputs combine into its answer -- when enough of them answered, or with what
  arrived by the deadline. Today one model and the identity.
- ``Hold`` (HAMS §IV, the frontend as the last stateful node): may keep a decided reply
  from leaving until a durability notice arrives; ``Frontend.release(request)`` sends it
  then. Today every reply leaves at once.

Example
-------
>>> r = Request([b"client"], "r1", 0.0)
>>> r.to(State.WAITING); r.to(State.ANSWERED)
>>> r.to(State.ANSWERED)
Traceback (most recent call last):
...
services.requests.LifecycleError: request 'r1': answered -> answered is not a transition
"""
from __future__ import annotations

from collections import OrderedDict
from enum import IntEnum

import numpy as np


class State(IntEnum):
    ADMITTED = 0
    WAITING = 1
    HELD = 2
    ANSWERED = 3

    def __str__(self) -> str:
        return self.name.lower()


# Per state (by value): the states it may move to.
_NEXT: tuple[frozenset[State], ...] = (
    frozenset({State.WAITING, State.HELD, State.ANSWERED}),  # ADMITTED
    frozenset({State.HELD, State.ANSWERED}),  # WAITING
    frozenset({State.ANSWERED}),  # HELD
    frozenset(),  # ANSWERED: final
)


class LifecycleError(RuntimeError):
    """An impossible transition of a request, such as answering it twice: a bug in the
    frontend that must be loud, because a second reply would break exactly-once."""


class Request:
    """One client request: where its reply goes and where it is in its life.

    ``dedup`` is its de-duplication key, (sender identity, request id), or None for a
    request that cannot be retried (one that did not decode)."""

    __slots__ = ("envelope", "request_id", "start", "state", "dedup", "digest")

    def __init__(self, envelope: list, request_id: str, start: float, dedup: tuple | None = None, digest: int = 0):
        self.envelope, self.request_id, self.start = envelope, request_id, start
        self.state = State.ADMITTED
        self.dedup, self.digest = dedup, digest

    def to(self, state: State) -> None:
        """The one transition function; raises LifecycleError for an impossible one."""
        if state not in _NEXT[self.state]:
            raise LifecycleError(f"request {self.request_id[:64]!r}: {self.state} -> {state} is not a transition")
        self.state = state

    def __repr__(self) -> str:
        return f"Request({self.request_id[:64]!r}, {self.state})"


class Selection:
    """Seam for model selection (Clipper §5): one request fanned out to several models.

    ``select`` names the models a request for ``model`` queries (each must be served by
    this frontend; the request's own model need not be among them). ``combine`` is called
    with the outputs that have arrived, by model, each time one arrives (``final`` False)
    and once more at the deadline if the answer is still open (``final`` True); it returns
    the request's answer or None to keep waiting (at the deadline, None answers the
    model's default output). Keel today: one model, its output as is."""

    def select(self, model: str) -> tuple[str, ...]:
        return (model,)

    def combine(self, model: str, outputs: dict[str, np.ndarray], final: bool) -> np.ndarray | None:
        return outputs.get(model)


class Hold:
    """Seam for HAMS's durable replies: ``hold`` returns True to keep ``request``'s decided
    reply (it is then HELD) until the frontend's ``release(request)`` is called, e.g. when
    every state on the request's lineage is durable. Keel today: release at once."""

    def hold(self, request: Request, source: str) -> bool:
        return False


class Answered:
    """Replies remembered for de-duplication: (sender identity, request id) -> (reply
    frames, input digest, when), oldest first, bounded by age, count and bytes.

    Only real answers are remembered (never errors), so a later valid request with the
    same id is computed."""

    # What one entry costs beyond the bytes of its key and frames, measured (CPython 3.11,
    # 64-bit; tests/unit/test_frontend.py checks it against tracemalloc): the object
    # headers of the identity, request id and frames (bytes 33, str 49), the key, frames
    # and entry tuples, digest, time and size, the OrderedDict's link and slot, and the
    # allocator's rounding of each object to 16 bytes. It was 200, which let a table
    # "within" dedup_max_bytes hold several times that.
    OVERHEAD = 640

    def __init__(self, ttl_s: float, max_entries: int, max_bytes: int):
        self.ttl_s, self.max_entries, self.max_bytes = ttl_s, max_entries, max_bytes
        self.entries: OrderedDict[tuple, tuple[list, int, float, int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: tuple) -> tuple[list, int, float, int] | None:
        return self.entries.get(key)

    def put(self, key: tuple, frames: list, digest: int, now: float, nbytes: int) -> None:
        """Remember ``frames`` (``nbytes`` long) as the answer to ``key``."""
        size = self.OVERHEAD + len(key[0]) + len(key[1]) + nbytes
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= old[3]
        self.entries[key] = (frames, digest, now, size)
        self.bytes += size
        while len(self.entries) > self.max_entries or self.bytes > self.max_bytes:
            self.bytes -= self.entries.popitem(last=False)[1][3]

    def forget(self, now: float) -> None:
        """Drop entries older than the ttl."""
        horizon = now - self.ttl_s
        entries = self.entries
        while entries:
            entry = entries[next(iter(entries))]
            if entry[2] >= horizon:
                break
            entries.popitem(last=False)
            self.bytes -= entry[3]
