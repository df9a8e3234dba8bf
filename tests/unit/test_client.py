"""The client library without a frontend process: timeouts it refuses, and how it spreads
calls over frontends (raw ROUTERs stand in for them)."""
from __future__ import annotations

import asyncio
import math
import threading

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.async_client import AsyncClient
from keel.common.client import Client
from keel.common.protocol import Predict, Reply, Source
from keel.deploy.local import local_endpoint

BAD_TIMEOUTS = [math.nan, math.inf, -math.inf, 0, -5.0, "100", True]


def answer_as_columns(c: Client, router: zmq.Socket) -> None:
    """One call answered with a Replies: the stand-in frontend shows it reads columns."""
    c.submit("m", np.zeros(4, np.float32))
    assert router.poll(5000)
    envelope, body = protocol.split_envelope(router.recv_multipart())
    (call,) = queries(body)
    transport.send(router, protocol.Replies(request_ids=[call.request_id], source=Source.MODEL, outputs=call.input[None]),
                   envelope)
    assert [r.request_id for r in c.collect(5000)] == [call.request_id]


def queries(body: list) -> list:
    """Every query in one message a client sent: a Predict, or a Predicts' rows (columns)."""
    return [q for m in protocol.decode_all(body) for q in (m.predicts() if isinstance(m, protocol.Predicts) else [m])]


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


def test_a_corks_calls_go_to_one_frontend_and_corks_spread(zsock):
    routers = [zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*") for _ in range(3)]
    x = np.zeros(4, np.float32)

    def got() -> list[int]:
        """Predicts each stand-in frontend received."""
        counts = []
        for router in routers:
            n = 0
            while router.poll(300):
                n += len(queries(protocol.split_envelope(router.recv_multipart())[1]))
            counts.append(n)
        return counts

    with Client([transport.endpoint_of(r) for r in routers], timeout_ms=5000) as c:
        for _ in range(2):
            with c.cork():
                for _ in range(5):
                    c.submit("m", x)
        assert got() == [5, 5, 0]  # each cork whole, the corks round-robin
        with c.cork():
            for _ in range(protocol.MAX_BUNDLE + 1):
                c.submit("m", x)
        assert sorted(got()) == [0, 1, protocol.MAX_BUNDLE]  # at most a bundle's worth in a row


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


def received(router: zmq.Socket, n: int = 1) -> list[Predict]:
    """The next ``n`` Predicts a stand-in frontend got (alone, or several in a message)."""
    out = []
    while len(out) < n:
        assert router.poll(5000), "no call arrived"
        _, body = protocol.split_envelope(router.recv_multipart())
        msgs = queries(body)
        assert all(isinstance(msg, Predict) for msg in msgs)
        out += msgs
    return out


def test_corked_sends_leave_together_and_uncorked_ones_alone(zsock):
    router = zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*")
    xs = np.arange(12, dtype=np.float32).reshape(3, 4)
    with Client(transport.endpoint_of(router), timeout_ms=5000) as c:
        answer_as_columns(c, router)
        with c.cork():
            rids = [c.submit("m", x) for x in xs]
            assert not router.poll(200)  # held while corked
        assert router.poll(5000)
        envelope, body = protocol.split_envelope(router.recv_multipart())
        assert [type(m) for m in protocol.decode_all(body)] == [protocol.Predicts]  # one message, as columns
        msgs = queries(body)
        assert [m.request_id for m in msgs] == rids and all(m.bundle and m.columns for m in msgs)  # in order
        assert [list(m.input) for m in msgs] == xs.tolist() and all(m.timeout_ms == 5000 for m in msgs)
        for m in msgs:
            transport.send(router, Reply(request_id=m.request_id, source=Source.MODEL, output=m.input), envelope)
        got = {}
        while len(got) < 3:
            got.update((r.request_id, r) for r in c.collect(1000))
        assert [list(got[r].output) for r in rids] == xs.tolist()
        c.submit("m", xs[0])
        c.submit("m", xs[1])
        assert len(received(router, 2)) == 2 and not router.poll(200)
        with c.cork():  # over MAX_BUNDLE: more than one message
            for _ in range(protocol.MAX_BUNDLE + 1):
                c.submit("m", xs[0])
        sizes = []
        while sum(sizes) < protocol.MAX_BUNDLE + 1:
            assert router.poll(5000)
            sizes.append(len(queries(protocol.split_envelope(router.recv_multipart())[1])))
        assert sizes == [protocol.MAX_BUNDLE, 1]


def test_a_corks_queries_leave_as_columns_only_where_they_share_their_fields(zsock):
    router = zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*")
    with Client(transport.endpoint_of(router), timeout_ms=5000) as c:
        with c.cork():  # a frontend not yet seen to answer as columns (an older one) gets no columns
            before = [c.submit("m", np.zeros(4, np.float32)) for _ in range(3)]
        assert router.poll(5000)
        msgs = protocol.decode_all(protocol.split_envelope(router.recv_multipart())[1])
        assert [type(m) for m in msgs] == [Predict] * 3 and [m.request_id for m in msgs] == before
        answer_as_columns(c, router)
        big = np.zeros(protocol.MAX_COLUMN_BYTES // 4 // 2, np.float32)  # two rows fill a column
        with c.cork():
            plain = [c.submit("m", np.full(4, i, np.float32)) for i in range(3)]
            keyed = c.submit("app", np.zeros(4, np.float32), key="u1")  # a key: alone
            other = [c.submit("m", np.zeros(6, np.float32)) for _ in range(2)]  # another shape: its own columns
            other_model = c.submit("n", np.zeros(4, np.float32))  # the only one of its model: alone
            bigs = [c.submit("m", big) for _ in range(5)]  # columns of two rows, the fifth alone
        assert router.poll(5000)
        msgs = protocol.decode_all(protocol.split_envelope(router.recv_multipart())[1])
    shapes = sorted((type(m).__name__, tuple(m.request_ids if isinstance(m, protocol.Predicts) else [m.request_id]))
                    for m in msgs)
    assert shapes == sorted([("Predicts", tuple(plain)), ("Predict", (keyed,)), ("Predicts", tuple(other)),
                             ("Predict", (other_model,)), ("Predicts", tuple(bigs[:2])), ("Predicts", tuple(bigs[2:4])),
                             ("Predict", (bigs[4],))])
    (keyed_msg,) = [m for m in msgs if isinstance(m, Predict) and m.request_id == keyed]
    assert keyed_msg.key == "u1"


def test_every_predict_carries_its_key_version_and_the_client_id(zsock):
    router = zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*")
    with Client(transport.endpoint_of(router), timeout_ms=5000) as c:
        rid = c.submit("ensemble", np.zeros(4, np.float32), key="alice", request_id="r-1")
        plain = c.submit("m", np.zeros(4, np.float32), version="2")
        (first, second) = received(router, 2)
    assert (first.request_id, first.model, first.key, first.version) == (rid, "ensemble", "alice", None)
    assert not hasattr(first, "context")  # one key on the wire
    assert (second.request_id, second.key, second.version) == (plain, None, "2")
    assert first.client == second.client == c.client_id and c.client_id


def test_clients_with_one_client_id_name_the_same_requests(zsock):
    """A retry from a new connection (or process) with the same client id is the same request."""
    router = zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*")
    for _ in range(2):
        with Client(transport.endpoint_of(router), timeout_ms=5000, client_id="shop-7") as c:
            c.submit("m", np.zeros(4, np.float32), request_id="order-1")
            (msg,) = received(router)
            assert (msg.client, msg.request_id) == ("shop-7", "order-1")
    with Client(transport.endpoint_of(router)) as a, Client(transport.endpoint_of(router)) as b:
        assert a.client_id != b.client_id  # one id per Client object by default


def test_context_is_a_deprecated_alias_of_key(zsock):
    router = zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*")
    with Client(transport.endpoint_of(router), timeout_ms=5000) as c:
        with pytest.warns(DeprecationWarning, match="key="):
            c.submit("ensemble", np.zeros(4, np.float32), context="bob")
        (msg,) = received(router)
        assert msg.key == "bob"  # sent as the key (the wire has no context)
        with pytest.raises(ValueError, match="differ"):
            c.submit("ensemble", np.zeros(4, np.float32), key="a", context="b")
        with pytest.raises(TypeError, match="key must be a string"):
            c.submit("m", np.zeros(4, np.float32), 100.0)  # an old positional timeout_ms
        with pytest.raises(TypeError, match="version must be a string"):
            c.submit("m", np.zeros(4, np.float32), version=2)


def test_predict_batch_takes_one_key_or_one_per_row(zsock):
    router = zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*")
    xs = np.arange(12, dtype=np.float32).reshape(3, 4)
    with Client(transport.endpoint_of(router), timeout_ms=5000, retries=0, grace_ms=0) as c:
        with pytest.raises(ValueError, match="2 keys for 3 rows"):
            c.predict_batch("ensemble", xs, key=["a", "b"])
        c.predict_batch("ensemble", xs, key=["a", "b", "c"], request_id="batch", timeout_ms=300)
        msgs = sorted(received(router, 3), key=lambda m: m.request_id)
        assert [(m.request_id, m.key) for m in msgs] == [("batch-0", "a"), ("batch-1", "b"), ("batch-2", "c")]
        c.predict_batch("ensemble", xs, key="z", version="1", timeout_ms=300)
        assert {(m.key, m.version) for m in received(router, 3)} == {("z", "1")}


def test_replies_as_columns_answer_each_call_of_both_clients(zsock):
    router = zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*")
    xs = np.arange(12, dtype=np.float32).reshape(3, 4)

    def frontend(n: int) -> None:
        """A stand-in frontend: the calls of each message answered in one Replies, each row the
        call's input doubled, and the first row again (a duplicate answer counts once)."""
        while n > 0:
            assert router.poll(5000), "no call arrived"
            envelope, body = protocol.split_envelope(router.recv_multipart())
            calls = queries(body)
            rows = np.stack([2 * m.input for m in calls])
            transport.send(router, protocol.Replies(
                request_ids=[m.request_id for m in calls] + [calls[0].request_id], source=Source.MODEL, model="m",
                version="1", outputs=np.concatenate([rows, rows[:1]])), envelope)
            n -= len(calls)

    async def async_batch() -> list:
        async with AsyncClient(transport.endpoint_of(router), timeout_ms=5000) as c:
            return await c.predict_batch("m", xs)

    def blocking_batch() -> list:
        with Client(transport.endpoint_of(router), timeout_ms=5000) as c:
            return c.predict_batch("m", xs)

    for batch in (blocking_batch, lambda: asyncio.run(async_batch())):
        stand_in = threading.Thread(target=frontend, args=(len(xs),))
        stand_in.start()
        results = batch()
        stand_in.join()
        assert [list(r.output) for r in results] == (2 * xs).tolist()
        assert all(r.ok and r.version == "1" and r.source == Source.MODEL for r in results)


def test_the_async_client_sends_the_same_fields(zsock):
    router = zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*")

    async def run() -> tuple[list, list]:
        async with AsyncClient(transport.endpoint_of(router), timeout_ms=300, grace_ms=0, retries=0,
                               client_id="a-1") as c:
            one = await c.predict("ensemble", np.zeros(4, np.float32), key="k", version="3", request_id="x")
            many = await c.predict_batch("ensemble", np.zeros((2, 4), np.float32), key=["p", "q"], request_id="y")
            with pytest.warns(DeprecationWarning):
                await c.predict("ensemble", np.zeros(4, np.float32), context="old")
            return [one], many

    one, many = asyncio.run(run())
    assert one[0].error_code == "timeout" and len(many) == 2  # nobody answers: each call ends at its deadline
    msgs = {m.request_id: m for m in received(router, 4)}
    assert (msgs["x"].key, msgs["x"].version, msgs["x"].client) == ("k", "3", "a-1")
    assert (msgs["y-0"].key, msgs["y-1"].key) == ("p", "q")
    assert [m.key for m in msgs.values() if m.request_id not in ("x", "y-0", "y-1")] == ["old"]


def test_the_async_client_sends_a_lone_call_at_once_and_a_turns_calls_together(zsock):
    router = zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*")
    xs = np.arange(16, dtype=np.float32).reshape(4, 4)

    def messages() -> list[list[str]]:
        """The request ids of each message the stand-in frontend got so far."""
        out = []
        while router.poll(300):
            out.append([m.request_id for m in queries(protocol.split_envelope(router.recv_multipart())[1])])
        return out

    async def run() -> tuple[list, list]:
        async with AsyncClient(transport.endpoint_of(router), timeout_ms=3000, grace_ms=0, retries=0) as c:
            alone = asyncio.ensure_future(c.predict("m", xs[0], request_id="alone"))
            await asyncio.sleep(0.1)  # sent at once: it was the only call in flight
            first = await asyncio.get_running_loop().run_in_executor(None, messages)
            turn = [asyncio.ensure_future(c.predict("m", x, request_id=f"t{i}")) for i, x in enumerate(xs[1:])]
            then = await asyncio.get_running_loop().run_in_executor(None, messages)
            for call in (alone, *turn):
                call.cancel()
            return first, then

    first, then = asyncio.run(run())
    assert first == [["alone"]]
    assert then == [["t0", "t1", "t2"]]  # made in one turn while another was in flight: one message


def test_a_graph_answer_says_it_was_degraded(zsock):
    from keel.common.protocol import Reply

    router = zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*")
    with Client(transport.endpoint_of(router), timeout_ms=5000) as c:
        for degraded in (True, None):
            rid = c.submit("chain", np.zeros(4, np.float32), key="7")
            assert router.poll(5000)
            envelope, _ = protocol.split_envelope(router.recv_multipart())
            router.send_multipart([*envelope, *protocol.encode(Reply(rid, Source.MODEL, np.ones(2, np.float32),
                                                                     degraded=degraded))])
            (result,) = c.collect(5000)
            assert result.request_id == rid and result.ok and result.degraded is bool(degraded)


def test_a_wait_under_a_millisecond_polls_one_not_none():
    from keel.common.client import _poll_ms

    assert [_poll_ms(w) for w in (0.0, -1.0, 0.0003, 0.001, 0.0021, 0.05)] == [0, 0, 1, 1, 3, 50]
