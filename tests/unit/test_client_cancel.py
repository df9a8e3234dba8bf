"""Cancelling a call in the client library, against stand-in frontends (raw ROUTERs): what
the frontend is sent (one ``Cancel`` naming the request and the client) and what the
caller gets, for ``Client.cancel``, ``AsyncClient.cancel``, a cancelled ``asyncio`` task
and a cancelled ``concurrent.futures`` future."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.async_client import AsyncClient
from keel.common.client import Cancelled, Client
from keel.common.futures_client import FuturesClient
from keel.common.protocol import Cancel, ErrorCode, Predict, Reply, Source

X = np.zeros(4, np.float32)


def messages(router: zmq.Socket, wait_ms: int = 5000) -> tuple[list, list | None]:
    """Every message a stand-in frontend got until it has been quiet for 300 ms (waiting up
    to ``wait_ms`` for the first), bundles and columns taken apart, with the envelope of the last."""
    out, envelope = [], None
    timeout = wait_ms
    while router.poll(timeout):
        envelope, body = protocol.split_envelope(router.recv_multipart())
        for msg in protocol.decode_all(body):
            out += msg.predicts() if isinstance(msg, protocol.Predicts) else [msg]
        timeout = 300
    return out, envelope


@pytest.fixture
def frontend(zsock):
    """A stand-in frontend and its endpoint."""
    router = zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*")
    return router, transport.endpoint_of(router)


def test_client_cancel_sends_one_cancel_and_the_result_is_cancelled(frontend):
    router, endpoint = frontend
    with Client(endpoint, timeout_ms=5000) as c:
        rid = c.submit("m", X)
        got, envelope = messages(router)
        assert [type(m) for m in got] == [Predict]
        assert c.cancel(rid) is True
        got, _ = messages(router)
        assert got == [Cancel(request_id=rid, client=c.client_id)]
        (result,) = c.collect(0)
        assert (result.request_id, result.source, result.error_code) == (rid, Source.ERROR, ErrorCode.CANCELLED)
        with pytest.raises(Cancelled) as exc:
            result.raise_for_error()
        assert exc.value.request_id == rid
        assert c.cancel(rid) is False and c.calls == {}  # once; then unknown
        # the frontend's answer to the cancelled request finds no call: nothing more comes out
        transport.send(router, Reply(request_id=rid, source=Source.ERROR, error="cancelled",
                                     error_code=ErrorCode.CANCELLED), envelope)
        assert c.collect(300) == []


def test_an_answered_call_cannot_be_cancelled_and_keeps_its_result(frontend):
    router, endpoint = frontend
    with Client(endpoint, timeout_ms=5000) as c:
        rid = c.submit("m", X)
        (msg,), envelope = messages(router)
        transport.send(router, Reply(request_id=rid, source=Source.MODEL, output=msg.input), envelope)
        (result,) = c.collect(5000)
        assert result.ok and c.cancel(rid) is False
        assert messages(router, 300)[0] == []  # no Cancel for it


def test_a_call_cancelled_before_it_left_is_never_sent(frontend):
    router, endpoint = frontend
    with Client(endpoint, timeout_ms=5000) as c:
        with c.cork():
            kept = c.submit("m", X)
            dropped = c.submit("m", X)
            assert c.cancel(dropped)
        got, _ = messages(router)
        assert [(type(m), m.request_id) for m in got] == [(Predict, kept)]  # neither its query nor a Cancel
        assert c.collect(0)[0].error_code == ErrorCode.CANCELLED


def test_a_retried_call_is_cancelled_at_every_frontend(zsock):
    silent, other = (zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*") for _ in range(2))
    with Client([transport.endpoint_of(silent), transport.endpoint_of(other)], timeout_ms=600, retries=1) as c:
        rid = c.submit("m", X)  # to the first; its slice ends unanswered and the retry goes to the other
        assert silent.poll(5000)
        while not other.poll(10):
            assert c.collect(0) == []
        assert c.cancel(rid)
        for router in (silent, other):
            got, _ = messages(router)
            assert Cancel(request_id=rid, client=c.client_id) in got


def test_a_call_that_times_out_sends_no_cancel(frontend):
    """The frontend holds the same deadline and drops the request there itself."""
    router, endpoint = frontend
    with Client(endpoint, timeout_ms=100, grace_ms=50, retries=0) as c:
        result = c.predict("m", X)
        assert result.error_code == ErrorCode.TIMEOUT
        got, _ = messages(router)
        assert [type(m) for m in got] == [Predict]


def test_a_cancelled_asyncio_task_cancels_its_request(frontend):
    router, endpoint = frontend

    async def run() -> tuple[str, AsyncClient]:
        c = AsyncClient(endpoint, timeout_ms=5000)
        task = asyncio.ensure_future(c.predict("m", X, request_id="r-task"))
        while not router.poll(0):
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert c.calls == {} and c.futures == {}
        await asyncio.sleep(0.05)  # the Cancel leaves at the end of the loop's turn
        client_id = c.client_id
        await c.close()
        return client_id

    client_id = asyncio.run(run())
    got, _ = messages(router)
    assert [type(m) for m in got] == [Predict, Cancel]
    assert got[1] == Cancel(request_id="r-task", client=client_id)


def test_async_client_cancel_ends_the_call_with_a_cancelled_result(frontend):
    router, endpoint = frontend

    async def run() -> None:
        c = AsyncClient(endpoint, timeout_ms=5000, raise_errors=True)
        try:
            task = asyncio.ensure_future(c.predict("m", X, request_id="r-async"))
            while not router.poll(0):
                await asyncio.sleep(0.01)
            assert c.cancel("r-async") and not c.cancel("r-async")
            with pytest.raises(Cancelled):
                await task
            got, _ = messages(router)
            assert [type(m) for m in got] == [Predict, Cancel]
        finally:
            await c.close()

    asyncio.run(run())


def test_a_cancelled_future_cancels_its_request(frontend):
    router, endpoint = frontend
    with FuturesClient(endpoint, timeout_ms=5000) as c:
        kept = c.predict("m", X, request_id="r-kept")
        doomed = c.predict("m", X, request_id="r-doomed")
        got, envelope = messages(router)
        assert sorted(m.request_id for m in got) == ["r-doomed", "r-kept"]
        assert doomed.cancel()
        got, _ = messages(router)
        assert got == [Cancel(request_id="r-doomed", client=c.client.client_id)]
        transport.send(router, Reply(request_id="r-kept", source=Source.MODEL, output=X), envelope)
        assert kept.result(5).ok and doomed.cancelled()


def test_a_futures_client_with_bad_options_leaves_no_thread():
    import threading

    before = threading.active_count()
    with pytest.raises(ValueError, match="timeout_ms"):
        FuturesClient("tcp://127.0.0.1:1", timeout_ms=-1)
    assert threading.active_count() == before
