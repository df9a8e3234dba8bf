"""The client library without a frontend process: timeouts it refuses, and how it spreads
calls over frontends (raw ROUTERs stand in for them)."""
from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.client import AsyncClient, Client
from keel.common.protocol import Predict, Reply, Source
from keel.deploy.local import local_endpoint

BAD_TIMEOUTS = [math.nan, math.inf, -math.inf, 0, -5.0, "100", True]


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS, ids=repr)
def test_bad_timeouts_are_refused_at_construction(timeout):
    with pytest.raises(ValueError, match="timeout_ms"):
        Client(local_endpoint(), timeout_ms=timeout)
    with pytest.raises(ValueError, match="timeout_ms"):
        AsyncClient(local_endpoint(), timeout_ms=timeout)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("timeout", [math.nan, math.inf, 0], ids=repr)
def test_bad_timeouts_are_refused_per_call(timeout):
    """No frontend listens: a NaN or infinite deadline would never end the call."""
    x = np.zeros(4, np.float32)
    with Client(local_endpoint(), timeout_ms=100) as c:
        with pytest.raises(ValueError, match="timeout_ms"):
            c.predict("m", x, timeout_ms=timeout)
        with pytest.raises(ValueError, match="timeout_ms"):
            c.predict_batch("m", [x], timeout_ms=timeout)
        assert c.calls == {}

    async def run():
        ac = AsyncClient(local_endpoint(), timeout_ms=100)
        try:
            with pytest.raises(ValueError, match="timeout_ms"):
                await ac.predict("m", x, timeout_ms=timeout)
        finally:
            await ac.close()

    asyncio.run(run())


def test_other_bad_options_are_refused():
    with pytest.raises(ValueError, match="retries"):
        Client(local_endpoint(), retries=-1)
    with pytest.raises(ValueError, match="grace_ms"):
        Client(local_endpoint(), grace_ms=math.nan)
    with pytest.raises(ValueError, match="suspect_s"):
        Client(local_endpoint(), suspect_s=math.inf)


def test_calls_are_spread_round_robin(zsock):
    routers = [zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*") for _ in range(3)]
    with Client([transport.endpoint_of(r) for r in routers], timeout_ms=5000) as c:
        for _ in range(6):
            c.submit("m", np.zeros(4, np.float32))
        for router in routers:
            got = 0
            while router.poll(2000 if got < 2 else 100):
                router.recv_multipart()
                got += 1
            assert got == 2


def serve_one(router: zmq.Socket, timeout_ms: int = 5000) -> None:
    """Answer one Predict on a stand-in frontend."""
    assert router.poll(timeout_ms), "no call arrived"
    envelope, body = protocol.split_envelope(router.recv_multipart())
    msg = protocol.decode(body)
    assert isinstance(msg, Predict)
    transport.send(router, Reply(request_id=msg.request_id, source=Source.MODEL, output=msg.input), envelope)


def test_a_frontend_that_timed_out_is_avoided_until_it_answers(zsock):
    silent, live = (zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*") for _ in range(2))
    with Client([transport.endpoint_of(silent), transport.endpoint_of(live)], timeout_ms=200, grace_ms=300,
                retries=1, suspect_s=60.0) as c:
        rid = c.submit("m", np.zeros(4, np.float32))  # round-robin starts at the silent one
        assert silent.poll(2000)
        while not live.poll(10):  # the attempt times out; the retry goes to the live one
            assert c.collect(0) == []
        serve_one(live)
        (result,) = c.collect(2000)
        assert result.request_id == rid and result.source == Source.MODEL
        assert c.suspect_until[0] > 0 and c.suspect_until[1] == 0
        for _ in range(4):  # all to the live one while the silent one is suspect
            c.submit("m", np.zeros(4, np.float32))
            serve_one(live)
        got = []
        while len(got) < 4:
            got.extend(c.collect(2000))
        assert {r.source for r in got} == {Source.MODEL}
        silent.recv_multipart()
        assert not silent.poll(100), "a suspect frontend got a new call"
