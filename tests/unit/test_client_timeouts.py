"""Every client call ends by its deadline, whatever is at the other end, and says why it got
no answer: nothing listening (``Unreachable``), a socket that is not a frontend's
(``Refused``), a ROUTER that never answers (``DeadlineExceeded``). Raw sockets stand in for
the peers; tests/integration/test_client_timeouts.py does the same against real services
(CURVE refusals, a frozen frontend).

"Ends by" checks behaviour, not speed: the margin is half a second, far above what the
client itself adds, so that a busy machine never fails them.
"""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.async_client import AsyncClient
from keel.common.client import (GRACE_MS, Client, DeadlineExceeded, Link, Reason, Refused, RetryEngine, Unreachable, _Call)
from keel.common.protocol import ErrorCode, Predict, Reply, Source
from keel.deploy.local import local_endpoint
from tests.support.loop import Ticker

TIMEOUT_MS = 300.0
MARGIN_S = 0.5
#: the latest a call may end: its deadline, the grace for an answer on its way, the margin
LATEST_S = (TIMEOUT_MS + GRACE_MS) / 1000.0 + MARGIN_S
X = np.zeros(4, np.float32)

#: what stands at the other end -> the exception a call gets
PEERS = {"nothing": Unreachable, "pull": Refused, "router": DeadlineExceeded}


@pytest.fixture
def peer(zsock):
    """Factory: the endpoint of a peer that never answers a call."""

    def make(kind: str) -> str:
        if kind == "nothing":
            return local_endpoint()
        sock = zsock(zmq.PULL if kind == "pull" else zmq.ROUTER, bind="tcp://127.0.0.1:*")
        return transport.endpoint_of(sock)

    return make


class Echo:
    """A stand-in frontend on its own thread: answers every Predict with its input."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind("tcp://127.0.0.1:*")
        self.endpoint = transport.endpoint_of(self.router)
        self.stop = threading.Event()
        self.answered = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                if not self.router.poll(50):
                    continue
                while True:
                    try:
                        frames = self.router.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    envelope, body = protocol.split_envelope(frames)
                    for msg in protocol.decode_all(body):  # a client's corked sends come together
                        if isinstance(msg, Predict):
                            transport.send(self.router, Reply(request_id=msg.request_id, source=Source.MODEL,
                                                              output=msg.input), envelope)
                            self.answered += 1
        finally:
            self.router.close(0)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.ctx.term()


@pytest.fixture
def echo():
    made: list[Echo] = []

    def make() -> Echo:
        made.append(Echo())
        return made[-1]

    yield make
    for e in made:
        e.close()


def check_no_answer(exc: pytest.ExceptionInfo, kind: str) -> None:
    want = PEERS[kind]
    assert type(exc.value) is want, exc.value
    assert isinstance(exc.value, DeadlineExceeded) and isinstance(exc.value, TimeoutError)
    assert exc.value.error_code == ErrorCode.TIMEOUT and exc.value.source == Source.ERROR
    assert exc.value.result.reason == {Unreachable: Reason.UNREACHABLE, Refused: Reason.REFUSED,
                                       DeadlineExceeded: Reason.TIMEOUT}[want]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(PEERS))
def test_sync_calls_end_by_their_deadline_with_the_reason(peer, kind):
    endpoint = peer(kind)
    with Client(endpoint, timeout_ms=TIMEOUT_MS, retries=1, raise_errors=True) as c:
        for _ in range(3):  # the first send goes out; a refused socket takes no second one
            start = time.perf_counter()
            with pytest.raises(DeadlineExceeded) as exc:
                c.predict("m", X)
            assert time.perf_counter() - start <= LATEST_S
            check_no_answer(exc, kind)
        start = time.perf_counter()
        with pytest.raises(DeadlineExceeded) as exc:
            c.predict_batch("m", [X, X, X])
        assert time.perf_counter() - start <= LATEST_S
        check_no_answer(exc, kind)
        assert c.calls == {}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(PEERS))
def test_async_calls_end_by_their_deadline_and_the_loop_keeps_running(peer, kind):
    endpoint = peer(kind)

    async def run() -> None:
        async with Ticker() as loop, AsyncClient(endpoint, timeout_ms=TIMEOUT_MS, retries=1, raise_errors=True) as c:
            for _ in range(3):
                before, start = loop.ticks, time.perf_counter()
                with pytest.raises(DeadlineExceeded) as exc:
                    await c.predict("m", X)
                assert time.perf_counter() - start <= LATEST_S
                check_no_answer(exc, kind)
                assert loop.ticks > before, "the event loop ran nothing else during the call"
            start = time.perf_counter()
            with pytest.raises(DeadlineExceeded) as exc:
                await c.predict_batch("m", [X, X, X])
            assert time.perf_counter() - start <= LATEST_S
            check_no_answer(exc, kind)
            assert c.calls == {} and c.futures == {}

    asyncio.run(run())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(PEERS))
def test_wait_for_around_an_async_call_fires(peer, kind):
    """The caller's own, shorter deadline cuts the call short, and the client forgets it."""
    endpoint = peer(kind)

    async def run() -> None:
        async with AsyncClient(endpoint, timeout_ms=30_000.0, retries=1) as c:
            for _ in range(3):
                start = time.perf_counter()
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(c.predict("m", X), 0.2)
                assert time.perf_counter() - start <= 0.2 + MARGIN_S
            assert c.calls == {} and c.futures == {}

    asyncio.run(run())


@pytest.mark.timeout(60)
def test_feedback_ends_by_its_timeout(peer):
    endpoint = peer("pull")
    with Client(endpoint, timeout_ms=TIMEOUT_MS) as c:
        for _ in range(2):
            start = time.perf_counter()
            ack = c.feedback("some-call", 1)
            assert time.perf_counter() - start <= LATEST_S
            assert not ack.ok and ack.error_code == ErrorCode.TIMEOUT

    async def run() -> None:
        async with AsyncClient(endpoint, timeout_ms=TIMEOUT_MS) as c:
            for _ in range(2):
                start = time.perf_counter()
                ack = await c.feedback("some-call", 1)
                assert time.perf_counter() - start <= LATEST_S
                assert not ack.ok and ack.error_code == ErrorCode.TIMEOUT

    asyncio.run(run())


@pytest.mark.timeout(60)
def test_the_retry_fits_inside_the_deadline(zsock):
    """Two silent frontends: the retry goes to the second half way through the call, and
    the call still ends by its deadline (not one deadline per attempt)."""
    silent = [zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*") for _ in range(2)]
    with Client([transport.endpoint_of(s) for s in silent], timeout_ms=400, retries=1) as c:
        start = time.perf_counter()
        result = c.predict("m", X)
        assert time.perf_counter() - start <= (400 + GRACE_MS) / 1000.0 + MARGIN_S
        assert result.error_code == ErrorCode.TIMEOUT and result.reason == Reason.TIMEOUT
        for s in silent:  # each got the call, under the same request id
            assert s.poll(1000)
            msg = protocol.decode(protocol.split_envelope(s.recv_multipart())[1])
            assert msg.request_id == result.request_id
        assert c.suspect_until[0] > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("kind", ["nothing", "pull"])
def test_a_refused_or_unreachable_frontend_hands_its_calls_over_at_once(peer, echo, kind, flavour):
    """Its calls go to the live frontend when the connection fails, long before their
    slice (half of 20 s) would have moved them."""
    live = echo()
    endpoints = [peer(kind), live.endpoint]
    start = time.perf_counter()
    if flavour == "sync":
        with Client(endpoints, timeout_ms=20_000.0, retries=1) as c:
            results = [c.predict("m", X) for _ in range(4)]
            moved = c.moved
    else:
        async def run():
            async with AsyncClient(endpoints, timeout_ms=20_000.0, retries=1) as c:
                return [await c.predict("m", X) for _ in range(4)], c.moved

        results, moved = asyncio.run(run())
    assert time.perf_counter() - start < 10.0
    assert [r.source for r in results] == [Source.MODEL] * 4
    assert {r.frontend for r in results} == {live.endpoint}
    assert moved >= 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_the_expiry_heap_stays_bounded(echo, flavour):
    """10,000 answered calls with a long deadline leave no pile of expiry entries behind."""
    live = echo()
    calls, window = 10_000, 100
    xs = np.zeros((calls, 4), np.float32)
    if flavour == "sync":
        with Client(live.endpoint, timeout_ms=60_000.0) as c:
            results = c.predict_batch("m", xs, window=window)
            heap = len(c.expiry)
    else:
        async def run():
            async with AsyncClient(live.endpoint, timeout_ms=60_000.0) as c:
                return await c.predict_batch("m", xs, window=window), len(c.expiry)

        results, heap = asyncio.run(run())
    assert [r.source for r in results] == [Source.MODEL] * calls
    assert heap <= 2 * window + RetryEngine.SLACK, heap


# ----------------------------------------------------------------- the engine, stepped by hand


def new_call(engine: RetryEngine, rid: str, now: float, timeout_s: float) -> _Call:
    call = _Call("m", X, timeout_s * 1000.0, now, now, 0, 0, None, now + timeout_s)
    engine.start(rid, call, now)
    return call


def test_the_engine_slices_a_call_moves_it_and_ends_it_with_the_reason():
    engine = RetryEngine(["a", "b"], retries=1, grace_s=0.05, suspect_s=5.0)
    call = new_call(engine, "r1", 0.0, 0.4)
    assert call.frontend == 0 and call.expires == pytest.approx(0.2)
    assert engine.due(0.1) == ([], [])
    again, ended = engine.due(0.2)
    assert again == ["r1"] and ended == [] and call.frontend == 1 and call.attempt == 1
    assert engine.suspect_until[0] == pytest.approx(5.2)
    assert engine.message("r1", call, 0.2).timeout_ms == pytest.approx(200.0)  # the time left
    _, ended = engine.due(0.4)  # nothing ever accepted a connection to b
    assert [r.reason for r in ended] == [Reason.UNREACHABLE] and engine.calls == {}

    assert engine.suspect_until[1] == pytest.approx(5.4)  # b stayed silent too

    engine = RetryEngine(["a", "b"], retries=0, grace_s=0.05, suspect_s=5.0)
    call = new_call(engine, "r2", 0.0, 0.4)
    engine.link(0, zmq.EVENT_CONNECTED, 0.0)
    engine.link(0, zmq.EVENT_HANDSHAKE_SUCCEEDED, 0.0)
    assert engine.due(0.4) == ([], [])  # connected: its answer at the deadline may be on the way
    _, ended = engine.due(0.45)
    assert [(r.reason, r.error_code, r.frontend) for r in ended] == [(Reason.TIMEOUT, ErrorCode.TIMEOUT, "a")]
    assert new_call(engine, "r3", 1.0, 0.4).frontend == 1  # a is suspect


def test_the_engine_moves_a_refused_frontends_calls_at_once():
    engine = RetryEngine(["a", "b"], retries=1, grace_s=0.05, suspect_s=5.0)
    call = new_call(engine, "r1", 0.0, 10.0)
    assert call.frontend == 0
    assert engine.link(0, zmq.EVENT_CONNECTED, 0.01) == []
    assert engine.link(0, zmq.EVENT_HANDSHAKE_FAILED_AUTH, 0.01) == ["r1"]
    assert engine.links[0] == Link.REFUSED and call.frontend == 1 and engine.moved == 1
    engine.link(0, zmq.EVENT_DISCONNECTED, 0.01)
    engine.link(0, zmq.EVENT_CONNECT_RETRIED, 0.02)  # the refused socket tries again: still refused
    assert engine.links[0] == Link.REFUSED
    assert engine.answered("r1", 1) is call and engine.answered("r1", 1) is None  # the duplicate


def test_the_engines_expiry_heap_is_bounded_by_the_calls_in_flight():
    engine = RetryEngine(["a"], retries=1, grace_s=0.05, suspect_s=5.0)
    for i in range(10_000):
        new_call(engine, f"r{i}", i * 1e-4, 60.0)
        if i >= 10:
            engine.answered(f"r{i - 10}", 0)
        assert len(engine.expiry) <= 2 * len(engine.calls) + RetryEngine.SLACK
