"""The frontend stepped with ``tick``: a raw DEALER as the client, a PULL as the dispatcher
and a PUSH as the worker. Covers the request lifecycle and its routes (model, application, graph), incarnation ids,
monotonic deadlines (de-duplication by (sender, request id): test_frontend_dedup.py)."""
from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.ids import SEQ_MASK, epoch_of
from keel.common.protocol import (
    Answered, Configure, ErrorCode, Predict, Predictions, Queries, Source,
)
from keel.common.protocol.fields import LineageEntry
from keel.common.protocol.messages import GraphAck, GraphDurable, GraphRequest
from tests.support.frontends import DIM, OUT, graph_input, gru_graph, harness, x_of  # noqa: F401 - harness: a fixture
from keel.services.requests import LifecycleError, Request, State

# --------------------------------------------------------------------------- lifecycle


def test_request_states_and_answering_twice_is_impossible():
    r = Request([b"c"], "r1", 0.0)
    assert r.state is State.ADMITTED
    r.to(State.WAITING)
    r.to(State.HELD)
    r.to(State.ANSWERED)
    with pytest.raises(LifecycleError, match="answered -> answered"):
        r.to(State.ANSWERED)
    with pytest.raises(LifecycleError):
        Request([b"c"], "r2", 0.0).to(State.ADMITTED)


def test_one_query_answered_once(harness):
    h = harness()
    c = h.client()
    h.predict(c, "a", x_of(1))
    q = h.queries()
    assert isinstance(q, Queries) and q.model == "m" and len(q.qids) == 1
    h.answer("m", q.qids, [[1, 2]])
    reply = h.reply(c)
    assert (reply.request_id, reply.source, list(reply.output)) == ("a", Source.MODEL, [1.0, 2.0])
    h.answer("m", q.qids, [[1, 2]])  # a second prediction for it: late, not a second answer
    h.no_reply(c)
    assert h.counts()["late_model"] == 1


def test_a_graph_reply_is_held_until_its_lineage_is_durable(harness, zsock):
    """The graph route's hold (HAMS §IV-D, ``ReleaseGate``): g's output leaves only once g's
    state up to its seq is durable; the request is HELD meanwhile and answered once."""
    graphs, g = gru_graph(zsock)
    h = harness(graphs=graphs)
    route = h.fe.graphs["graph"]
    c = h.client()
    transport.send(c, Predict(request_id="a", model="graph", input=x_of(2), key="7", client="alice"))
    sent = graph_input(h, g)
    assert route.ids.owns(sent.origin) and sent.stream == 7 and sent.reply_to == route.reply_to
    assert sent.request == protocol.request_key("alice", "a")
    out = h.zsock(zmq.PUSH, connect=route.reply_to)
    lineage = [LineageEntry("frontend", sent.origin, "g", 0)]
    transport.send(out, GraphRequest("g", 0, sent.origin, 7, lineage, np.asarray([3, 4], np.float32)))
    h.step(lambda: route.status()["held_now"] == 1)
    h.no_reply(c)
    (request,) = route.calls[sent.origin].requests
    assert request.state is State.HELD
    transport.send(out, GraphDurable("g", 1, 0))
    reply = h.reply(c)
    assert (reply.request_id, reply.source, reply.model, list(reply.output)) == ("a", Source.MODEL, "graph", [3.0, 4.0])
    assert request.state is State.ANSWERED and route.calls == {}
    transport.send(out, GraphDurable("g", 1, 0))  # again: nothing is answered twice
    h.no_reply(c)
    labels = {"service": "fe", "source": "model", "target": "graph", "kind": "graph",
              "model": "", "version": ""}  # one set of metrics, per target (a graph: no model label)
    assert h.fe.metrics.registry.get_sample_value("keel_requests_total", labels) == 1
    assert h.fe.metrics.registry.get_sample_value("keel_request_seconds_count", labels) == 1


def test_an_application_fans_out_and_combines(harness, tmp_path):
    """The application route (Clipper §5): one call queries each selected model and is
    answered once all answered."""
    h = harness(applications={"app": {"models": ["m", "m2"], "policy": "exp4", "params": {"eta": 0.3}}},
                selection_store=str(tmp_path / "sel.sqlite"))
    c = h.client()
    transport.send(c, Predict(request_id="a", model="app", input=x_of(3), key="alice", timeout_ms=10_000))
    first, second = h.queries(), h.queries()
    assert {first.model, second.model} == {"m", "m2"}
    by_model = {q.model: q.qids[0] for q in (first, second)}
    h.answer("m", [by_model["m"]], [[1, 5]])
    h.no_reply(c)  # one of two: wait
    h.answer("m2", [by_model["m2"]], [[0, 3]])
    reply = h.reply(c)
    assert reply.source == Source.ENSEMBLE and sorted(reply.models) == ["m", "m2"] and np.argmax(reply.output) == 1
    assert h.fe.pending == {}


def test_an_application_combines_what_arrived_by_the_deadline(harness, tmp_path):
    h = harness(applications={"app": {"models": ["m", "m2"], "policy": "exp4", "params": {"eta": 0.3}}},
                selection_store=str(tmp_path / "sel.sqlite"))
    c = h.client()
    transport.send(c, Predict(request_id="a", model="app", input=x_of(4), key="alice", timeout_ms=150))
    first, second = h.queries(), h.queries()
    q = first if first.model == "m" else second
    h.answer("m", [q.qids[0]], [[7, 8]])
    reply = h.reply(c)
    assert reply.source == Source.PARTIAL and reply.models == ["m"] and np.argmax(reply.output) == 1
    assert h.fe.pending == {}


def test_a_graph_retry_is_answered_by_the_frontend_never_sent_again(harness, zsock):
    """De-duplication by (Predict.client, request id), whatever the connection: a retry in
    flight joins the waiting request, a retry after the answer gets the remembered reply;
    the graph sees the request once."""
    graphs, g = gru_graph(zsock, mode="bare")  # nothing to hold: the output answers at once
    h = harness(graphs=graphs)
    route = h.fe.graphs["graph"]
    first, second, third = h.client(), h.client(), h.client()
    x = x_of(9)
    transport.send(first, Predict(request_id="r", model="graph", input=x, key="user-1", client="alice"))
    sent = graph_input(h, g)
    transport.send(second, Predict(request_id="r", model="graph", input=x, key="user-1", client="alice"))
    h.step(lambda: len(route.calls[sent.origin].requests) == 2)
    out = h.zsock(zmq.PUSH, connect=route.reply_to)
    transport.send(out, GraphRequest("g", 0, sent.origin, sent.stream, [LineageEntry("frontend", sent.origin, "g", 0)],
                                     np.asarray([1, 2], np.float32)))
    assert list(h.reply(first).output) == list(h.reply(second).output) == [1.0, 2.0]
    transport.send(third, Predict(request_id="r", model="graph", input=x, key="user-1", client="alice"))
    assert list(h.reply(third).output) == [1.0, 2.0]
    h.no_reply(first)
    assert not any(isinstance(protocol.decode(f), GraphRequest) for f in iter(lambda: g.poll(0) and g.recv_multipart(), 0))
    assert h.counts()["duplicate"] == 1 and route.counts["answered"] == 1
    transport.send(third, Predict(request_id="r", model="graph", input=x_of(10), key="user-1", client="alice"))
    assert h.reply(third).error_code == ErrorCode.BAD_REQUEST  # the same id, another input: not a retry


def test_a_graph_takes_only_its_own_origins_and_times_out_from_a_heap(harness, zsock):
    graphs, g = gru_graph(zsock, mode="bare")
    graphs["graph"].request_timeout_s = 0.2
    h = harness(graphs=graphs)
    route = h.fe.graphs["graph"]
    c = h.client()
    transport.send(c, Predict(request_id="a", model="graph", input=x_of(11)))
    sent = graph_input(h, g)
    assert sent.stream == 0 and sent.origin >> 32 == route.ids.epoch  # no key: stream 0; origins carry the incarnation
    out = h.zsock(zmq.PUSH, connect=route.reply_to)
    for origin in (sent.origin & 0xFFFFFFFF, (route.ids.epoch - 1) << 32 | (sent.origin & 0xFFFFFFFF)):
        transport.send(out, GraphRequest("g", 0, origin, 0, [], np.asarray([1, 2], np.float32)))  # not mine
    h.step(lambda: route.counts["foreign"] == 2)
    reply = h.reply(c)
    assert reply.error_code == ErrorCode.DEADLINE and "graph graph" in reply.error
    assert route.calls == {} and h.fe.pending == {}  # its deadline was the frontend's, as every target's


def test_a_graph_ack_after_a_takeover_resends_the_waiting_requests_in_origin_order(harness, zsock):
    """The operator I feed was taken over: its ack names the highest of my origins its state
    holds, and the waiting requests above it go again; an ack naming an origin not mine
    (another frontend's, an earlier incarnation's) resends every waiting one."""
    graphs, g = gru_graph(zsock, mode="bare")
    h = harness(graphs=graphs)
    route = h.fe.graphs["graph"]
    c = h.client()
    for rid in ("a", "b", "c"):
        transport.send(c, Predict(request_id=rid, model="graph", input=x_of(20), key="1"))
    origins = [graph_input(h, g).origin for _ in range(3)]
    assert origins == sorted(origins)
    out = h.zsock(zmq.PUSH, connect=route.reply_to)
    transport.send(out, GraphAck("g", 2, origins[0]))
    assert [graph_input(h, g).origin for _ in range(2)] == origins[1:]
    transport.send(out, GraphAck("g", 3, 5))
    assert [graph_input(h, g).origin for _ in range(3)] == origins
    assert route.counts["resent"] == 5


def test_keys_unknown_names_and_targets(harness, zsock):
    from keel.services.graph.route import stream_of

    graphs, _ = gru_graph(zsock)
    h = harness(graphs=graphs)
    c = h.client()
    transport.send(c, Predict(request_id="k", model="m", input=x_of(12), key="alice"))
    assert h.reply(c).error_code == ErrorCode.BAD_REQUEST  # a plain model takes no key
    h.predict(c, "u", x_of(13), model="nope")
    reply = h.reply(c)
    assert reply.error_code == ErrorCode.UNKNOWN_MODEL and "graph, m" in reply.error
    transport.send(c, Predict(request_id="v", model="graph", input=x_of(14), version="2"))
    assert h.reply(c).error_code == ErrorCode.BAD_REQUEST  # a graph has no versions
    target = h.fe.status()["targets"]["graph"]
    assert target == {"kind": "graph", "input_shape": [DIM], "input_dtype": "float32", "output_size": OUT,
                      "version": None, "key": True, "mode": "nspb",
                      "signature": {"inputs": [{"name": "input", "dtype": "float32", "shape": [DIM]}],
                                    "outputs": [{"name": "output", "dtype": "float32", "shape": [OUT]}]}}
    assert stream_of("12") == 12 and stream_of("x") == stream_of("x") != stream_of("y") and stream_of(None) == 0
    assert 0 <= stream_of("x") < 2**63 and stream_of(str(2**63)) < 2**63


# --------------------------------------------------------------------------- incarnations


def test_prediction_of_an_earlier_incarnation_is_not_delivered(harness):
    """A restarted frontend numbers its queries again; predictions still in flight for the
    old incarnation's queries carry the same sequence numbers and must not answer them."""
    h = harness()
    c = h.client()
    x = x_of(5)
    h.predict(c, "new", x)
    (qid,) = h.queries().qids
    assert epoch_of(qid) == h.fe.ids.epoch
    seq = qid & SEQ_MASK
    old_epoch = h.fe.ids.epoch - 1
    # what an earlier incarnation numbered the same: without an epoch, and with an older one
    h.answer("m", [seq, (old_epoch << 32) | seq], [[9, 9], [9, 9]])
    h.no_reply(c)
    assert h.counts()["stale"] == 2
    h.answer("m", [qid], [[1, 0]])
    assert list(h.reply(c).output) == [1.0, 0.0]


def test_reconstruction_is_reported_answered_to_the_dispatcher(harness):
    h = harness(cache_size=0)
    c = h.client()
    h.predict(c, "a", x_of(6))
    h.predict(c, "b", x_of(7))
    qids = h.queries().qids
    if len(qids) == 1:  # the frontend flushed between the two requests: two Queries
        qids = qids + h.queries().qids
    assert len(qids) == 2
    h.answer("m", [qids[1]], [[5, 6]], source=Source.RECONSTRUCTION)
    reply = h.reply(c)
    assert (reply.request_id, reply.source) == ("b", Source.RECONSTRUCTION)
    answered = h.queries()
    assert isinstance(answered, Answered) and (answered.model, answered.qids) == ("m", [qids[1]])
    h.answer("m", [qids[0]], [[1, 1]])
    assert h.reply(c).request_id == "a"
    h.no_reply(c)
    assert not h.dispatcher.poll(0)  # a model's own answer is not reported


def test_budgets_are_ms_left_at_send(harness):
    h = harness()
    c = h.client()
    h.predict(c, "a", x_of(8), timeout_ms=2000)
    (budget,) = h.queries().budgets_ms
    assert 0 < budget <= 2000


def test_deadline_is_on_the_monotonic_clock(harness, monkeypatch):
    """A wall-clock jump (NTP step) does not expire queries early."""
    h = harness()
    c = h.client()
    h.predict(c, "a", x_of(9), model="d", timeout_ms=5000)
    (qid,) = h.queries().qids
    wall = time.time
    monkeypatch.setattr(time, "time", lambda: wall() + 3600.0)
    h.no_reply(c)
    h.answer("d", [qid], [[1, 2]])
    assert h.reply(c).source == Source.MODEL


def test_deadline_answers_default(harness):
    h = harness()
    c = h.client()
    h.predict(c, "a", x_of(10), model="d", timeout_ms=50)
    h.queries()
    reply = h.reply(c)
    assert reply.source == Source.DEFAULT and list(reply.output) == [-1.0, -1.0]


# --------------------------------------------------------------------------- hostile predictions


def test_prediction_of_another_model_does_not_answer(harness):
    h = harness()
    c = h.client()
    h.predict(c, "a", x_of(11))
    (qid,) = h.queries().qids
    h.answer("m2", [qid], [[6, 6]])
    h.no_reply(c)
    assert h.counts()["mismatched"] == 1
    h.answer("m", [qid], [[1, 2]])
    assert list(h.reply(c).output) == [1.0, 2.0]


def test_outputs_of_the_wrong_shape_are_a_model_error(harness):
    h = harness()
    c = h.client()
    h.predict(c, "a", x_of(12))
    (qid,) = h.queries().qids
    h.answer("m", [qid], [[1, 2, 3]])
    reply = h.reply(c)
    assert reply.error_code == ErrorCode.MODEL_ERROR and "shape" in reply.error


# --------------------------------------------------------------------------- de-duplication


def test_a_nan_or_infinite_output_is_a_model_error_never_cached(harness):
    """Per row: the finite outputs of the same batch still answer; the bad ones are
    model_error, counted, not cached (the same input asked again is computed again)."""
    h = harness()
    c = h.client()
    xs = [x_of(200 + i) for i in range(3)]
    for i, x in enumerate(xs):
        h.predict(c, f"n{i}", x)
    qids = []
    while len(qids) < 3:
        qids += h.queries().qids
    h.answer("m", qids, [[np.nan, 1.0], [1.0, 2.0], [np.inf, 0.0]])
    replies = {r.request_id: r for r in (h.reply(c) for _ in range(3))}
    assert replies["n1"].source == Source.MODEL and list(replies["n1"].output) == [1.0, 2.0]
    for rid in ("n0", "n2"):
        assert replies[rid].source == Source.ERROR and replies[rid].error_code == ErrorCode.MODEL_ERROR
        assert "NaN" in replies[rid].error
    assert h.counts()["nonfinite_outputs"] == 2
    h.predict(c, "again", xs[0])  # not cached: computed again
    q = h.queries()
    h.answer("m", q.qids, [[3.0, 4.0]])
    again = h.reply(c)
    assert again.source == Source.MODEL and list(again.output) == [3.0, 4.0]


def test_a_late_prediction_of_the_old_version_does_not_undo_a_rollout(harness):
    """After a rollout's Configure says v2, a v1 prediction still in flight (computed before
    its worker switched) answers its query but does not move the served version back: cache
    keys and the gateway's metadata keep saying v2."""
    h = harness()
    c = h.client()
    h.predict(c, "before", x_of(300))
    q = h.queries()
    transport.send(h.worker, Configure(model="m", version="2"))  # the rollout's last step
    h.step(lambda: h.fe.status()["serving"]["m"] == "2")
    transport.send(h.worker, Predictions(batch_id=1, model="m", qids=q.qids, version="1",
                                         outputs=np.asarray([[1, 2]], np.float32)))
    reply = h.reply(c)
    assert reply.source == Source.MODEL and reply.version == "1"  # the reply names what computed it
    assert h.fe.status()["serving"]["m"] == "2"


def test_status_lists_every_target_with_what_it_takes(harness):
    targets = harness().fe.status()["targets"]
    assert set(targets) == {"m", "m2", "d"}
    # the signature of a one-tensor model: Signature.single of its shapes (what the gateway's metadata says)
    assert targets["m"].pop("signature") == {"inputs": [{"name": "input", "dtype": "float32", "shape": [DIM]}],
                                             "outputs": [{"name": "output", "dtype": "float32", "shape": [OUT]}]}
    assert targets["m"] == {"kind": "model", "input_shape": [DIM], "input_dtype": "float32", "output_size": OUT,
                            "version": "1", "key": False}


def test_deadlines_pop_what_is_due_and_drop_answered_entries():
    from keel.services.requests import Deadlines

    d = Deadlines()
    for i in range(5):
        d.push(float(i), i)
    assert list(d.due(2.0)) == [0, 1, 2] and len(d) == 2
    assert d.settle({3: None}) == 3.0 and len(d) == 2  # few answered entries: kept, dropped lazily
    assert d.settle({}) is None and len(d) == 0  # none live: all go
    for i in range(2000):
        d.push(float(i), i)
    assert d.settle({1999: None}) == 1999.0 and len(d) == 1  # outnumbered four to one: rebuilt


def test_a_traced_request_gets_the_frontends_four_stamps_and_an_untraced_one_none(harness):
    h = harness()
    c = h.client()
    t0 = time.time()
    transport.send(c, Predict(request_id="t", model="m", input=x_of(1), timeout_ms=10_000, trace=[t0]))
    h.predict(c, "plain", x_of(2))
    q1 = h.queries()
    qs = [q1] if len(q1.qids) == 2 else [q1, h.queries()]
    traced = [q for q in qs if q.traced is not None]
    assert len(traced) == 1 and len(traced[0].trace) == 3 and traced[0].trace[0] == t0  # + receipt, + send
    assert t0 <= traced[0].trace[1] <= traced[0].trace[2] <= time.time()
    assert h.fe.traces == {}  # nothing kept once its Queries left
    qid_traced = traced[0].traced
    qid_plain = next(q for m in qs for q in m.qids if q != qid_traced)
    stamps = [*traced[0].trace, time.time(), time.time()]  # the dispatcher's and the worker's, say
    transport.send(h.worker, Predictions(batch_id=1, model="m", qids=[qid_traced, qid_plain],
                                         outputs=np.zeros((2, OUT), np.float32), traced=qid_traced, trace=stamps))
    replies = {r.request_id: r for r in (h.reply(c), h.reply(c))}
    assert replies["plain"].trace is None and replies["t"].source == Source.MODEL
    assert replies["t"].trace[:5] == stamps and len(replies["t"].trace) == 7  # + receipt, + reply's send
    assert stamps[-1] <= replies["t"].trace[5] <= replies["t"].trace[6] <= time.time()


def test_queries_sent_as_columns_are_each_their_own_request(harness):
    h = harness(max_payload_bytes=4 * DIM)  # one row's input exactly; a column is more, and is read
    c = h.client()
    xs = np.stack([x_of(100 + i) for i in range(4)])
    xs[2, 0] = np.nan  # this row alone is refused
    cols = protocol.Predicts(request_ids=[f"k{i}" for i in range(4)], model="m", inputs=xs, timeouts_ms=[10_000.0] * 4,
                             client="cli-1")
    c.send_multipart(protocol.encode(cols))
    bad = h.reply(c)
    assert (bad.request_id, bad.error_code) == ("k2", ErrorCode.BAD_REQUEST) and "NaN" in bad.error
    queries = h.queries()
    assert len(queries.qids) == 3 and np.array_equal(queries.inputs, xs[[0, 1, 3]])  # the others, each admitted
    h.answer("m", queries.qids, [[i, i] for i in range(3)])
    got = {r.request_id: list(r.output) for r in (h.reply(c) for _ in range(3))}
    assert got == {"k0": [0.0, 0.0], "k1": [1.0, 1.0], "k3": [2.0, 2.0]}
    transport.send(c, Predict(request_id="k1", model="m", input=xs[1], timeout_ms=10_000, client="cli-1"))
    again = h.reply(c)  # a row's retry, alone: from the table
    assert list(again.output) == [1.0, 1.0] and h.counts()["duplicate"] == 1
    wide = protocol.Predicts(request_ids=["w0", "w1"], model="m", inputs=np.zeros((2, 2 * DIM), np.float32))
    c.send_multipart(protocol.encode(wide))  # each row over max_payload_bytes: each refused, saying why
    refused = [h.reply(c) for _ in range(2)]
    assert sorted(r.request_id for r in refused) == ["w0", "w1"] and all("exceeds" in r.error for r in refused)


def test_queries_a_client_sent_together_are_each_their_own_request(harness):
    h = harness()
    c = h.client()
    msgs = [Predict(request_id=f"t{i}", model="m", input=x_of(70 + i), timeout_ms=10_000) for i in range(3)]
    msgs.insert(1, Predict(request_id="bad", model="m", input=np.zeros(DIM + 1, np.float32)))
    c.send_multipart([f for m in msgs for f in protocol.encode(m)])
    bad = h.reply(c)
    assert (bad.request_id, bad.error_code) == ("bad", ErrorCode.BAD_REQUEST)  # its own answer; the rest go on
    qids = []
    while len(qids) < 3:
        qids += h.queries().qids
    h.answer("m", qids, [[i, i] for i in range(3)])
    assert {h.reply(c).request_id for _ in range(3)} == {"t0", "t1", "t2"}
    c.send_multipart([f for _ in range(protocol.MAX_BUNDLE + 1) for f in protocol.encode(msgs[0])])
    too_many = h.reply(c)
    assert too_many.error_code == ErrorCode.BAD_REQUEST and "at most" in too_many.error


