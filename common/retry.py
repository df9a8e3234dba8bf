"""The client's retry engine, without sockets or clocks of its own (sans-IO): which
frontend each attempt of a call goes to, when a call moves to another frontend, and when it
ends with no answer; and what a frontend's socket monitor says about its link.

Both clients (``common.client``) feed it the time, answers and monitor events, and send
what it says to send.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import zmq
from zmq.utils.monitor import parse_monitor_message

from keel.common.protocol import MAX_BUNDLE, ErrorCode, Predict, Source
from keel.common.results import Reason, Result


class Link(StrEnum):
    """What a frontend's socket monitor last said about the connection to it."""

    CONNECTING = "connecting"  # nothing accepted a connection yet
    CONNECTED = "connected"  # TCP accepted; the ZeroMQ handshake is pending
    UP = "up"  # handshake done: answers can come
    DOWN = "down"  # it was up and the connection dropped (reconnecting)
    UNREACHABLE = "unreachable"  # a connect attempt failed
    REFUSED = "refused"  # the handshake failed; the peer will never take this socket's messages


#: socket monitor events the client reads (the rest are noise to it)
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                     zmq.EVENT_HANDSHAKE_FAILED_AUTH)
LINK_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
               | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
               | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
#: links a frontend can answer over (the call waits out its grace for them)
_OPEN = (Link.CONNECTED, Link.UP)


def link_events(monitor: zmq.Socket) -> list[int]:
    """Every event waiting on a socket monitor (``get_monitor_socket``), without blocking."""
    events = []
    while True:
        try:
            events.append(parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))["event"])
        except zmq.Again:
            return events


@dataclass(slots=True)
class _Call:
    model: str
    x: np.ndarray
    timeout_ms: float
    sent: float  # perf_counter of the first send
    expires: float  # perf_counter at which the current attempt's slice ends
    attempt: int
    frontend: int
    key: str | None = None
    deadline: float = 0.0  # sent + timeout: the frontend answers by then
    version: str | None = None
    traceparent: str | None = None  # the caller's W3C trace context (common.tracing)


class RetryEngine:
    """The calls in flight and their attempts, without sockets or clocks of its own
    (sans-IO): both clients feed it the time, answers and socket monitor events, and send
    what it says to send.

    It chooses each attempt's frontend (round-robin over those not suspect), cuts a call's
    time into ``retries + 1`` slices and moves the call to another frontend when a slice
    passes with no answer, hands a frontend's calls to another at once when its link
    drops, is refused or cannot be made, and ends each call by its deadline (plus the
    grace, only while a frontend is connected and could still answer) with the reason
    it got no answer. ``expiry`` holds one live entry per call plus stale ones, never more
    than twice the calls in flight plus ``SLACK``.
    """

    #: stale expiry entries tolerated before the heap is rebuilt from the live calls
    SLACK = 64

    def __init__(self, frontends: list[str], retries: int, grace_s: float, suspect_s: float):
        self.frontends, self.retries, self.grace_s, self.suspect_s = frontends, retries, grace_s, suspect_s
        self.calls: dict[str, _Call] = {}
        self.expiry: list[tuple[float, str]] = []  # heap of (slice end, request id); stale entries skipped
        self.turn = 0  # round-robin: the frontend the next call tries first
        self.last, self.kept = -1, 0  # the last new call's frontend (-1: none), and how many calls in a row it got
        self.suspect_until = [0.0] * len(frontends)  # perf_counter; a frontend that timed out
        self.links = [Link.CONNECTING] * len(frontends)
        self.accepted = [False] * len(frontends)  # the current socket's connection was accepted once
        self.moved = 0  # calls sent to another frontend because theirs dropped, refused or was unreachable

    def start(self, rid: str, call: _Call, now: float, together: bool = False) -> None:
        """Take a new call; its first attempt goes to ``call.frontend`` (chosen here).
        ``together``: it leaves with the calls started before it (a corked client's), so it
        goes where they went while that frontend is not suspect, up to ``MAX_BUNDLE`` calls
        in a row: a bundle is not split over the frontends, and a long run of calls still
        spreads."""
        if together and self.kept < MAX_BUNDLE and self.last >= 0 and self.suspect_until[self.last] <= now:
            call.frontend = self.last
            self.kept += 1
        else:
            call.frontend = self.last = self.pick(now)
            self.kept = 1
        self.calls[rid] = call
        self._schedule(rid, call, now)

    def pick(self, now: float, avoid: int = -1) -> int:
        """The frontend for the next attempt: round-robin over those not suspect (and not
        ``avoid``, the one that just failed); round-robin over all if none is left."""
        n = len(self.frontends)
        if n == 1:
            return 0
        start = self.turn
        self.turn = (start + 1) % n
        for j in range(n):
            i = (start + j) % n
            if i != avoid and self.suspect_until[i] <= now:
                return i
        return start if start != avoid else (start + 1) % n

    def message(self, rid: str, call: _Call, now: float, client: str | None = None) -> Predict:
        """The current attempt's query: a retry carries the time left to the call's deadline."""
        timeout = call.timeout_ms if call.attempt == 0 else max(1.0, (call.deadline - now) * 1000.0)
        x = call.x
        named = type(x) is dict  # named tensors (``Predict.inputs``)
        return Predict(request_id=rid, model=call.model, input=None if named else x, timeout_ms=timeout, version=call.version,
                       key=call.key, client=client, bundle=True, columns=True, traceparent=call.traceparent,
                       inputs=x if named else None)

    def due(self, now: float) -> tuple[list[str], list[Result]]:
        """Calls whose slice passed: (to send again, to their new frontend; ended with no answer)."""
        again, ended = [], []
        while self.expiry and self.expiry[0][0] <= now:
            at, rid = heapq.heappop(self.expiry)
            call = self.calls.get(rid)
            if call is None or call.expires != at:
                continue  # answered, or a slice of an earlier attempt
            if call.attempt < self.retries and now < call.deadline:
                self.suspect_until[call.frontend] = now + self.suspect_s
                self._next_attempt(rid, call, now)
                again.append(rid)
            elif now < call.deadline + self.grace_s and self.links[call.frontend] in _OPEN:
                call.expires = call.deadline + self.grace_s  # its answer at the deadline may be on the way
                heapq.heappush(self.expiry, (call.expires, rid))
            else:
                self.suspect_until[call.frontend] = now + self.suspect_s
                del self.calls[rid]
                ended.append(self._no_answer(rid, call, now))
        return again, ended

    def next_due(self) -> float | None:
        """perf_counter of the next slice end (None: no call in flight)."""
        while self.expiry:
            at, rid = self.expiry[0]
            call = self.calls.get(rid)
            if call is not None and call.expires == at:
                return at
            heapq.heappop(self.expiry)
        return None

    def answered(self, rid: str, frontend: int) -> _Call | None:
        """An answer from ``frontend``: the call it ends, or None for a duplicate answer (a
        retried call's first answer counted)."""
        self.suspect_until[frontend] = 0.0  # it answers
        if self.links[frontend] not in _OPEN:
            self.links[frontend] = Link.UP  # an answer outran its monitor's events
        return self.drop(rid)

    def drop(self, rid: str) -> _Call | None:
        """Forget a call (answered, or its caller stopped waiting)."""
        call = self.calls.pop(rid, None)
        if len(self.expiry) > 2 * len(self.calls) + self.SLACK:
            self.expiry = [(c.expires, r) for r, c in self.calls.items()]
            heapq.heapify(self.expiry)
        return call

    def reached(self, frontend: int) -> bool:
        """Whether what is sent to ``frontend`` may reach it: its link was not refused, and
        not found unreachable (messages sent while it connects wait for the connection)."""
        return self.links[frontend] not in (Link.REFUSED, Link.UNREACHABLE)

    def new_socket(self, frontend: int) -> None:
        """``frontend`` has a new socket: its events start afresh (a refusal still holds)."""
        self.accepted[frontend] = False

    def link(self, frontend: int, event: int, now: float) -> list[str]:
        """A socket monitor event of ``frontend``'s connection; returns the calls moved to
        another frontend (to send now) when it dropped, was refused or could not be made."""
        old = self.links[frontend]
        if event == zmq.EVENT_CONNECTED:
            self.accepted[frontend] = True
            new = old if old == Link.REFUSED else Link.CONNECTED  # a refusal holds until a handshake passes
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            new = Link.UP
        elif event in _HANDSHAKE_FAILED:
            new = Link.REFUSED
        elif event == zmq.EVENT_DISCONNECTED:
            # dropped before any handshake event: the peer hung up on the greeting (a socket
            # of a kind a DEALER cannot talk to)
            new = Link.REFUSED if old in (Link.CONNECTED, Link.REFUSED) else Link.DOWN
        elif event == zmq.EVENT_CONNECT_RETRIED:
            # a socket retries after a refused handshake too: that peer is reachable
            new = old if old == Link.REFUSED and self.accepted[frontend] else Link.UNREACHABLE
        else:
            return []
        self.links[frontend] = new
        if new in _OPEN or len(self.frontends) == 1:
            return []
        self.suspect_until[frontend] = now + self.suspect_s
        moved = []
        for rid, call in self.calls.items():
            if call.frontend == frontend and call.attempt < self.retries:
                self._next_attempt(rid, call, now, avoid=frontend)
                moved.append(rid)
        self.moved += len(moved)
        return moved

    def _next_attempt(self, rid: str, call: _Call, now: float, avoid: int | None = None) -> None:
        call.attempt += 1
        call.frontend = self.pick(now, avoid=call.frontend if avoid is None else avoid)
        self._schedule(rid, call, now)

    def _schedule(self, rid: str, call: _Call, now: float) -> None:
        """The attempt's slice: an equal share of the time left for the attempts left."""
        call.expires = now + max(0.0, call.deadline - now) / (self.retries - call.attempt + 1)
        heapq.heappush(self.expiry, (call.expires, rid))

    def _no_answer(self, rid: str, call: _Call, now: float) -> Result:
        endpoint = self.frontends[call.frontend]
        link = self.links[call.frontend]
        if link == Link.REFUSED:
            reason, why = Reason.REFUSED, (f"{endpoint} refused the connection: its CURVE handshake failed (a key it "
                                           f"does not allow?), or it is not a frontend's port")
        elif link in _OPEN:
            reason, why = Reason.TIMEOUT, f"no answer within {call.timeout_ms:.0f} ms"
        else:
            reason, why = (Reason.UNREACHABLE,
                           f"nothing accepted a connection to {endpoint} within {call.timeout_ms:.0f} ms")
        return Result(rid, Source.ERROR, None, f"{why} after {call.attempt + 1} attempt(s)", ErrorCode.TIMEOUT,
                      call.model, None, (now - call.sent) * 1000.0, endpoint, reason=reason)
