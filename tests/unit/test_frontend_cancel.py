"""Cancellation at the frontend (``Cancel``): a query answered once as cancelled and withdrawn
from the dispatcher, one never sent, a computation shared with other clients left to them, an
application's model queries withdrawn, a graph request only before it entered the graph, and
a voided hold sent back to waiting. The stepped frontend of ``tests.support.frontends``."""
from __future__ import annotations

import time

import numpy as np
import orjson
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.config import FrontendConfig, GraphRouteConfig, ModelInfo
from keel.common.ids import SEQ_MASK, epoch_of
from keel.common.protocol import (
    Answered, Cancel, Configure, ErrorCode, Predict, Predictions, Queries, Replies, Reply, Source, Withdraw,
)
from keel.common.protocol.fields import LineageEntry
from keel.common.protocol.messages import GraphAck, GraphDurable, GraphRequest
from keel.services.frontend import Frontend
from tests.support.frontends import DIM, OUT, Harness, graph_input, gru_graph, harness, x_of  # noqa: F401 - harness: a fixture
from keel.services.requests import DedupTable, LifecycleError, Request, State


def cancel(dealer, rid: str, client: str | None = None) -> None:
    transport.send(dealer, Cancel(request_id=rid, client=client))


def test_a_cancelled_query_is_answered_once_and_withdrawn(harness):
    h = harness()
    c = h.client()
    h.predict(c, "a", x_of(30))
    q = h.queries()
    cancel(c, "a")
    reply = h.reply(c)
    assert (reply.request_id, reply.source, reply.error_code) == ("a", Source.ERROR, ErrorCode.CANCELLED)
    withdraw = h.queries()
    assert isinstance(withdraw, Withdraw) and (withdraw.model, withdraw.qids) == ("m", q.qids)
    status = h.fe.status()
    assert status["pending"] == status["in_flight"] == 0 and status["answered"]["cancelled"] == 1
    labels = {"service": "fe", "target": "m"}
    assert h.fe.metrics.registry.get_sample_value("keel_requests_cancelled_total", labels) == 1
    h.answer("m", q.qids, [[1, 2]])  # the worker ran it anyway: late, not a second answer
    h.no_reply(c)
    cancel(c, "a")  # answered already: nothing
    h.no_reply(c)
    h.predict(c, "a", x_of(30))  # a cancelled request is not remembered: a retry is computed
    assert isinstance(h.queries(), Queries)


def test_a_query_cancelled_before_it_left_is_never_sent(harness):
    h = harness()
    h.fe._on_predict(Predict(request_id="a", model="m", input=x_of(31), timeout_ms=10_000), [b"id"], time.perf_counter())
    h.fe._on_cancel(Cancel(request_id="a"), [b"id"])
    h.fe._flush()
    h.no_reply(h.dispatcher)
    assert h.fe.pending == {} and h.fe.by_request == {} and h.counts()["cancelled"] == 1


def test_a_cancel_leaves_a_shared_computation_to_the_others(harness):
    """Identical queries of two clients share one computation (the cache key): one client's
    cancel answers only its request; the query runs on for the other."""
    h = harness(cache_size=10)
    a, b = h.client(), h.client()
    x = x_of(32)
    transport.send(a, Predict(request_id="r", model="m", input=x, client="alice", timeout_ms=10_000))
    q = h.queries()
    transport.send(b, Predict(request_id="r", model="m", input=x, client="bob", timeout_ms=10_000))
    h.step(lambda: len(h.fe.pending[q.qids[0]].requests) == 2)
    cancel(a, "r", client="alice")
    assert h.reply(a).error_code == ErrorCode.CANCELLED
    h.answer("m", q.qids, [[5, 6]])
    assert list(h.reply(b).output) == [5.0, 6.0]
    h.no_reply(h.dispatcher)  # no Withdraw: the query was bob's too
    cancel(b, "r", client="bob")  # answered: its answer stays for a retry
    h.no_reply(b)
    transport.send(b, Predict(request_id="r", model="m", input=x, client="bob", timeout_ms=10_000))
    assert list(h.reply(b).output) == [5.0, 6.0] and h.counts()["duplicate"] == 1


def test_a_cancelled_application_call_withdraws_each_model_query(harness, tmp_path):
    h = harness(applications={"app": {"models": ["m", "m2"], "policy": "exp4", "params": {"eta": 0.3}}},
                selection_store=str(tmp_path / "sel.sqlite"))
    c = h.client()
    transport.send(c, Predict(request_id="a", model="app", input=x_of(33), key="alice", timeout_ms=10_000))
    sent = {q.model: q.qids for q in (h.queries(), h.queries())}
    cancel(c, "a")
    assert h.reply(c).error_code == ErrorCode.CANCELLED
    withdrawn = {w.model: w.qids for w in (h.queries(), h.queries())}
    assert withdrawn == sent and h.fe.pending == {} and h.fe.by_request == {}


def test_a_graph_request_is_cancelled_only_before_it_entered_the_graph(harness, zsock):
    """Once sent, the frontend cannot know whether the first stateful operator applied it:
    it completes, and its answer is kept for a retry. One not yet sent (its operator taken
    over, the ack awaited) is cancelled."""
    graphs, g = gru_graph(zsock, mode="bare")
    h = harness(graphs=graphs)
    route = h.fe.graphs["graph"]
    c = h.client()
    transport.send(c, Predict(request_id="a", model="graph", input=x_of(34), client="alice"))
    sent = graph_input(h, g)
    cancel(c, "a", client="alice")
    h.step(lambda: h.counts().get("cancel_too_late") == 1)
    out = h.zsock(zmq.PUSH, connect=route.reply_to)
    transport.send(out, GraphRequest("g", 0, sent.origin, 0, [LineageEntry("frontend", sent.origin, "g", 0)],
                                     np.asarray([1, 2], np.float32)))
    assert list(h.reply(c).output) == [1.0, 2.0]
    route.awaiting.add("g")  # taken over: new requests wait for its ack
    transport.send(c, Predict(request_id="b", model="graph", input=x_of(35), client="alice"))
    h.step(lambda: route.calls)
    cancel(c, "b", client="alice")
    reply = h.reply(c)
    assert (reply.request_id, reply.error_code) == ("b", ErrorCode.CANCELLED)
    assert route.calls == {} and h.fe.by_request == {} and h.counts()["cancelled"] == 1
    transport.send(out, GraphAck("g", 2, 5))
    h.step(lambda: not route.awaiting)
    for _ in range(20):
        h.fe.tick(0.005)
    # nothing to resend: the cancelled request never enters the graph (GC notices only)
    assert not any(isinstance(protocol.decode(f), GraphRequest) for f in iter(lambda: g.poll(0) and g.recv_multipart(), 0))


def test_a_voided_hold_sends_the_same_request_back_to_waiting(harness, zsock):
    """HAMS II: a backup took over without the state a held output came from; the output is
    voided and the request waits for the re-run's (HELD -> WAITING, the one transition
    function), the same request with its flags, answered once."""
    graphs, g = gru_graph(zsock)
    h = harness(graphs=graphs)
    route = h.fe.graphs["graph"]
    c = h.client()
    transport.send(c, Predict(request_id="a", model="graph", input=x_of(40), key="7", client="alice", bundle=True))
    sent = graph_input(h, g)
    out = h.zsock(zmq.PUSH, connect=route.reply_to)
    lineage = [LineageEntry("frontend", sent.origin, "g", 5)]
    transport.send(out, GraphRequest("g", 0, sent.origin, 7, lineage, np.asarray([3, 4], np.float32)))
    h.step(lambda: route.status()["held_now"] == 1)
    (request,) = route.calls[sent.origin].requests
    assert request.state is State.HELD and request.bundle
    transport.send(out, GraphDurable("g", 2, 4))  # the new primary's state holds up to seq 4: seq 5 is lost
    h.step(lambda: route.counts["voided"] == 1)
    assert route.calls[sent.origin].requests == [request] and request.state is State.WAITING and request.bundle
    h.no_reply(c)
    transport.send(out, GraphRequest("g", 0, sent.origin, 7, lineage, np.asarray([5, 6], np.float32)))  # the re-run
    h.step(lambda: route.status()["held_now"] == 1)
    transport.send(out, GraphDurable("g", 2, 5))
    assert list(h.reply(c).output) == [5.0, 6.0] and request.state is State.ANSWERED
    h.no_reply(c)
