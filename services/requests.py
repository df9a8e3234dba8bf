"""A client request's life at the frontend, in one place: its states and the one
transition function, whatever its route (model, application, graph); and the
de-duplication table of answered requests.

States (``State``)::

    ADMITTED --> WAITING --> ANSWERED
        |          |  ^         ^
        |          v  |         |
        |          HELD --------+
        +-----------------------+        (errors, cache hits, duplicates answer at once)
        +--> HELD

- ADMITTED: decoded and checked; nothing is computing for it yet.
- WAITING: its model queries are in flight (or it shares a computation already in flight).
- HELD: its answer is decided but the hold keeps it from leaving (the graph route's
  ``ReleaseGate``, HAMS §IV-D: not yet durable). HELD -> WAITING: the held answer was
  voided (a backup took over without the state it came from, HAMS II) and the request
  waits for the re-run's.
- ANSWERED: its one reply has left. Any transition out of ANSWERED -- answering twice --
  raises ``LifecycleError``: exactly one answer per accepted request is the invariant.

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

import heapq
import struct
import time
from collections import deque
from collections.abc import Container, Iterator
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
    frozenset({State.WAITING, State.ANSWERED}),  # HELD: WAITING when its held answer is voided
    frozenset(),  # ANSWERED: final
)


class LifecycleError(RuntimeError):
    """An impossible transition of a request, such as answering it twice: a bug in the
    frontend that must be loud, because a second reply would break exactly-once."""


class Request:
    """One client request: where its reply goes and where it is in its life.

    ``dedup`` is its de-duplication key, (sender identity, request id), or None for a
    request that cannot be retried (one that did not decode)."""

    __slots__ = ("envelope", "request_id", "start", "state", "dedup", "digest", "bundle", "columns")

    def __init__(self, envelope: list, request_id: str, start: float, dedup: tuple | None = None, digest: int = 0,
                 bundle: bool = False, columns: bool = False):
        self.envelope, self.request_id, self.start = envelope, request_id, start
        self.state = State.ADMITTED
        self.dedup, self.digest = dedup, digest
        self.bundle = bundle  # its client reads several replies from one message (``Predict.bundle``)
        self.columns = columns  # ... and replies as columns (``Predict.columns``, ``Replies``)

    def to(self, state: State) -> None:
        """The one transition function; raises LifecycleError for an impossible one."""
        if state not in _NEXT[self.state]:
            raise LifecycleError(f"request {self.request_id[:64]!r}: {self.state} -> {state} is not a transition")
        self.state = state

    def __repr__(self) -> str:
        return f"Request({self.request_id[:64]!r}, {self.state})"


class DedupTable:
    """Replies remembered for de-duplication: (sender identity, request id) -> (reply
    frames, input digest, when), oldest first, bounded by age, count and bytes.

    Only real answers are remembered (never errors), so a later valid request with the
    same id is computed.

    Stored as records appended to large segments (``bytearray``), found through a dict
    from a 64-bit hash of the key to the record's place; a record carries its key, which
    a lookup checks, so a hash collision costs at most a forgotten entry, never a wrong
    answer. Why not a dict of Python objects: ~10 small objects an entry, allocated among
    everything else the frontend keeps (cache entries, metrics), pin CPython's 1 MiB
    arenas long after the entries expire -- a table that had held 36 MB kept all of it
    with every entry gone. Segments are freed whole as the entries in them expire.

    Record: ``<IdHHB`` (digest, when, identity length, request id length, frames), one
    ``I`` length per frame, then the identity, the request id (UTF-8) and the frames."""

    #: what one entry costs beyond the bytes of its key and frames: the record's fixed
    #: part with two frame lengths (27 bytes), the index's two ints (32-36 bytes each, in
    #: 48-byte blocks) and its dict slot at two thirds full (~40 bytes)
    OVERHEAD = 176
    #: bytes a segment holds before the next starts
    SEGMENT = 256 << 10

    _FIXED = struct.Struct("<IdHHB")

    def __init__(self, ttl_s: float, max_entries: int, max_bytes: int):
        self.ttl_s, self.max_entries, self.max_bytes = ttl_s, max_entries, max_bytes
        self.index: dict[int, int] = {}  # hash of key -> segment number << 32 | offset
        self.segments: deque[bytearray] = deque([bytearray()])
        self.first = 0  # number of the oldest segment kept
        self.head = 0  # offset of the oldest record in it not yet dropped
        self.bytes = 0  # counted size of the records not yet dropped
        self.peak = 0  # most index entries since the index was last rebuilt

    def __len__(self) -> int:
        return len(self.index)

    @property
    def entries(self) -> list[tuple[bytes, str]]:
        """The keys remembered, oldest first."""
        out, number, offset = [], self.first, self.head
        for seg in list(self.segments):
            while offset < len(seg):
                key, length, _ = self._key(seg, offset)
                if self.index.get(_hash(key)) == number << 32 | offset:
                    out.append(key)
                offset += length
            number, offset = number + 1, 0
        return out

    def get(self, key: tuple) -> tuple[tuple[bytes, ...], int, float] | None:
        """(reply frames, input digest, when) remembered for ``key``, or None."""
        place = self.index.get(_hash(key))
        if place is None:
            return None
        seg, offset = self.segments[(place >> 32) - self.first], place & 0xFFFFFFFF
        stored, _, at = self._key(seg, offset)
        if stored != (bytes(key[0]), key[1]):
            return None
        digest, when, _, _, nframes = self._FIXED.unpack_from(seg, offset)
        frames = []
        for n in struct.unpack_from(f"<{nframes}I", seg, offset + self._FIXED.size):
            frames.append(bytes(seg[at:at + n]))
            at += n
        return tuple(frames), digest, when

    def put(self, key: tuple, frames, digest: int, now: float, nbytes: int | None = None) -> None:
        """Remember (a copy of) ``frames``, buffers, as the answer to ``key``; ``nbytes`` is not
        needed (the frames' own lengths are counted). A key remembered before is found at
        its new record; the old one stays, counted, until its turn to go."""
        identity, rid = bytes(key[0]), key[1].encode()
        lengths = [memoryview(f).nbytes for f in frames]  # bytes, whatever the buffer's items
        record = b"".join([self._FIXED.pack(digest & 0xFFFFFFFF, now, len(identity), len(rid), len(frames)),
                           struct.pack(f"<{len(frames)}I", *lengths), identity, rid, *frames])
        segment = self.segments[-1]
        if segment and len(segment) + len(record) > self.SEGMENT:
            segment = bytearray()
            self.segments.append(segment)
        self.index[_hash(key)] = (self.first + len(self.segments) - 1) << 32 | len(segment)
        segment += record
        self.bytes += self._size(len(record), len(frames))
        self.peak = max(self.peak, len(self.index))
        while (len(self.index) > self.max_entries or self.bytes > self.max_bytes) and self._drop_oldest(None):
            pass

    def forget(self, now: float) -> None:
        """Drop entries older than the ttl."""
        horizon = now - self.ttl_s
        while self._drop_oldest(horizon):
            pass
        if self.peak > 4 * len(self.index) + 1024:  # a dict never shrinks its own table
            self.index = dict(self.index)
            self.peak = len(self.index)

    # ------------------------------------------------------------------ records

    def _size(self, length: int, nframes: int) -> int:
        """What a record of ``length`` bytes is counted: OVERHEAD + its key's and frames' bytes."""
        return length - self._FIXED.size - 4 * nframes + self.OVERHEAD

    def _key(self, seg: bytearray, offset: int) -> tuple[tuple[bytes, str], int, int]:
        """(key, record length, offset of its first frame) of the record at ``offset``."""
        _, _, nid, nrid, nframes = self._FIXED.unpack_from(seg, offset)
        at = offset + self._FIXED.size + 4 * nframes
        key = (bytes(seg[at:at + nid]), seg[at + nid:at + nid + nrid].decode())
        data = sum(struct.unpack_from(f"<{nframes}I", seg, offset + self._FIXED.size))
        return key, at + nid + nrid + data - offset, at + nid + nrid

    def _drop_oldest(self, horizon: float | None) -> bool:
        """Drop the oldest record (if ``horizon`` is given: only one older than it); False
        when there was none to drop."""
        while self.head >= len(self.segments[0]):
            if len(self.segments) == 1:
                if self.head:
                    self.segments[0] = bytearray()  # emptied: start it again, its memory back
                    self.head = 0
                return False
            self.segments.popleft()  # freed whole: its memory goes back
            self.first += 1
            self.head = 0
        seg, offset = self.segments[0], self.head
        _, when, _, _, nframes = self._FIXED.unpack_from(seg, offset)
        if horizon is not None and when >= horizon:
            return False
        key, length, _ = self._key(seg, offset)
        h = _hash(key)
        if self.index.get(h) == self.first << 32 | offset:  # live, not since replaced
            del self.index[h]
        self.head += length
        self.bytes -= self._size(length, nframes)
        return True


def _hash(key: tuple) -> int:
    """64 bits of (identity, request id): Python's keyed hash of the pair (per process)."""
    return hash((bytes(key[0]), key[1]))


class Deadlines:
    """When requests (or queries) time out: a heap of (deadline, id) whose answered ids are
    dropped lazily -- answering one costs nothing here; ``due`` pops what is due and the
    caller skips ids no longer live; ``settle`` keeps the heap from outgrowing what is live."""

    __slots__ = ("heap",)

    def __init__(self):
        self.heap: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self.heap)

    def push(self, deadline: float, ident: int) -> None:
        heapq.heappush(self.heap, (deadline, ident))

    def due(self, now: float) -> Iterator[int]:
        """The ids whose deadline is at or before ``now``, popped (live or not)."""
        while self.heap and self.heap[0][0] <= now:
            yield heapq.heappop(self.heap)[1]

    def settle(self, live: Container[int] | dict) -> float | None:
        """Drop the entries of answered ids once they outnumber the ``live`` ones four to one
        (all of them when none is live); -> the next deadline, or None."""
        if not live:
            self.heap.clear()
        elif len(self.heap) > 4 * len(live) + 1024:
            self.heap = [(d, i) for d, i in self.heap if i in live]
            heapq.heapify(self.heap)
        return self.heap[0][0] if self.heap else None


def stack_rows(rows: list):
    """The batch of ``rows`` (arrays of one shape): one row is a view of it with a batch
    axis, not a copy (``np.stack`` cost ~40 µs more in a process woken cold, as each is with
    one request at a time, and one row is what every batch is then)."""
    return rows[0][None] if len(rows) == 1 else np.stack(rows)


def carry_trace(traces: dict[int, list[float]], msg) -> None:
    """The first traced query of ``msg`` (a ``Queries`` or a ``Batch``) rides on it: its stamps
    leave ``traces`` and go on the message with its send added. One trace a message: a
    breakdown samples requests, it does not follow every one."""
    for qid in msg.qids:
        trace = traces.pop(qid, None)
        if trace is not None:
            msg.traced, msg.trace = qid, [*trace, time.time()]
            return
