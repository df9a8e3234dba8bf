"""Every route through the same frontend harness: one rule book for every target.

Each test runs for a model, an application (two models, Exp4) and a graph (one operator,
mode bare: an output answers at once), stepping the frontend with ``tick``; the test's
sockets stand in for the dispatcher, the models' workers and the graph's operator. What is
checked is the same for all three: the call's ``timeout_ms`` bounds it, the deadline
answer, the one admission budget counted in queries, retries and cancellation."""
from __future__ import annotations


import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.config import FrontendConfig, GraphRouteConfig, ModelInfo
from keel.common.protocol import Cancel, ErrorCode, Predict, Predictions, Queries, Source, Withdraw
from keel.common.protocol.fields import LineageEntry
from keel.common.protocol.messages import GraphRequest
from keel.services.frontend import Frontend
from tests.support.frontends import SteppedFrontend

DIM, OUT = 4, 2
NAMES = {"model": "m", "application": "app", "graph": "graph"}
KINDS = list(NAMES)


class Front(SteppedFrontend):
    """A frontend serving a target of each kind, and the far ends of each route."""

    def __init__(self, zsock, kind: str, default: list[float] | None = None, own_ms: float = 60_000.0, **options):
        self.zsock, self.kind, self.name = zsock, kind, NAMES[kind]
        self.dispatcher = zsock(zmq.PULL, bind="tcp://127.0.0.1:*")
        self.g = zsock(zmq.PULL, bind="tcp://127.0.0.1:*")
        table = {"mode": "bare", "input_shape": [DIM], "edges": [["frontend", "g"], ["g", "frontend"]],
                 "operators": {"g": {"kind": "gru", "input_shape": [DIM], "output_shape": [OUT]}}}
        cfg = FrontendConfig(
            name="fe", client_endpoint="tcp://127.0.0.1:*", prediction_endpoint="tcp://127.0.0.1:*",
            dispatcher_query_endpoint=transport.endpoint_of(self.dispatcher), log_requests=False,
            # the application's default output is its first model's
            models={"m": ModelInfo([DIM], OUT, default_output=default, deadline_ms=own_ms),
                    "m2": ModelInfo([DIM], OUT, deadline_ms=own_ms)},
            applications={"app": {"models": ["m", "m2"], "policy": "exp4", "params": {"eta": 0.3}}},
            # each target's own deadline (a graph's request_timeout_s), by default far beyond every
            # call's here: the call's timeout must bound it
            graphs={"graph": GraphRouteConfig(graph=table, endpoint="tcp://127.0.0.1:*", request_timeout_s=own_ms / 1000,
                                              peers={"g": transport.endpoint_of(self.g)},
                                              **({"default_output": default} if default else {}))},
            **options)
        self.fe = Frontend(cfg)
        self.worker = zsock(zmq.PUSH, connect=self.fe.reply_to)
        self.out = zsock(zmq.PUSH, connect=self.fe.graphs["graph"].reply_to)

    def send(self, dealer, rid: str, x: np.ndarray, name: str | None = None, **kwargs) -> None:
        name = name or self.name
        key = None if name in ("m", "m2") else "7"
        transport.send(dealer, Predict(request_id=rid, model=name, input=x, key=key, **kwargs))

    def arrived(self) -> list:
        """What the request became at the far end: its queries (model, qid), or its GraphRequest."""
        if self.kind == "graph":
            while True:
                msg = protocol.decode(self.step(lambda: self.g.poll(0) and self.g.recv_multipart()))
                if isinstance(msg, GraphRequest):
                    return [msg]
        got = []
        for _ in range(2 if self.kind == "application" else 1):
            msg = self.dispatcher_message()
            assert isinstance(msg, Queries)
            got += [(msg.model, qid) for qid in msg.qids]
        return got

    def dispatcher_message(self):
        return protocol.decode(self.step(lambda: self.dispatcher.poll(0) and self.dispatcher.recv_multipart()))

    def answer(self, arrived: list, value: float) -> None:
        """Every part of the request answered with ``value``."""
        for part in arrived:
            if isinstance(part, GraphRequest):
                lineage = [LineageEntry("frontend", part.origin, "g", 0)]
                transport.send(self.out, GraphRequest("g", 0, part.origin, part.stream, lineage,
                                                      np.full(OUT, value, np.float32)))
            else:
                model, qid = part
                transport.send(self.worker, Predictions(batch_id=1, model=model, qids=[qid], source=Source.MODEL,
                                                        outputs=np.full((1, OUT), value, np.float32)))

    def in_flight(self) -> tuple[int, int]:
        return self.fe.status()["pending"], len(self.fe.by_request)


@pytest.fixture
def front(zsock):
    made = []

    def make(kind: str, **kwargs) -> Front:
        made.append(Front(zsock, kind, **kwargs))
        return made[-1]

    yield make
    for f in made:
        f.fe.shutdown()


def x_of(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(DIM, dtype=np.float32)


@pytest.mark.parametrize("kind", KINDS)
def test_the_calls_timeout_bounds_every_target_and_the_deadline_answer_is_one_rule(front, kind):
    """The call's timeout_ms (here 150 ms) is the deadline whatever the target (a graph's own
    is 60 s here); at it, every target answers the same way: source default, code deadline
    when it has no default output."""
    f = front(kind)
    c = f.client()
    f.send(c, "a", x_of(1), timeout_ms=150)
    f.arrived()
    reply = f.reply(c, timeout_s=3.0)
    assert (reply.request_id, reply.source, reply.error_code, reply.model) == ("a", Source.DEFAULT, ErrorCode.DEADLINE,
                                                                              f.name)
    assert f.in_flight() == (0, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_without_a_timeout_gets_the_targets_own_deadline_and_the_same_answer(front, kind):
    f = front(kind, own_ms=150.0)
    c = f.client()
    f.send(c, "a", x_of(9))
    reply = f.reply(c, timeout_s=3.0)
    assert (reply.source, reply.error_code) == (Source.DEFAULT, ErrorCode.DEADLINE)
    assert f.name in reply.error and "no default output" in reply.error


@pytest.mark.parametrize("kind", KINDS)
def test_at_the_deadline_a_target_with_a_default_output_answers_it(front, kind):
    f = front(kind, default=[-1.0, -2.0])
    c = f.client()
    f.send(c, "a", x_of(2), timeout_ms=100)
    reply = f.reply(c, timeout_s=3.0)
    assert (reply.source, reply.error_code, list(reply.output)) == (Source.DEFAULT, None, [-1.0, -2.0])


@pytest.mark.parametrize("kind", KINDS)
def test_one_admission_budget_counted_in_queries_for_every_target(front, kind):
    """admission_limit queries in flight, whatever their targets: a model request is one, an
    application's one per selected model (two here), a graph request one."""
    queries = 2 if kind == "application" else 1
    f = front(kind, admission_limit=queries + 1)
    c = f.client()
    f.send(c, "first", x_of(3), name="m", timeout_ms=10_000)  # one query to another target
    f.send(c, "a", x_of(4), timeout_ms=10_000)  # the budget holds it
    f.step(lambda: f.fe.status()["pending"] == 1 + queries)
    f.send(c, "b", x_of(5), timeout_ms=10_000)
    reply = f.reply(c)
    assert (reply.request_id, reply.error_code) == ("b", ErrorCode.OVERLOADED)
    f.send(c, "c", x_of(6), name="m", timeout_ms=10_000)  # the other target's request counts the same
    assert f.reply(c).error_code == ErrorCode.OVERLOADED


@pytest.mark.parametrize("kind", KINDS)
def test_a_retry_joins_in_flight_and_then_gets_the_same_answer(front, kind):
    f = front(kind)
    first, second = f.client(), f.client()
    x = x_of(7)
    f.send(first, "r", x, client="alice", timeout_ms=10_000)
    arrived = f.arrived()
    f.send(second, "r", x, client="alice", timeout_ms=10_000)  # another connection, the same request
    f.step(lambda: len(f.fe.by_request[(b"alice", "r")][0].requests) == 2)
    f.answer(arrived, 3.0)
    assert np.argmax(f.reply(first).output) == np.argmax(f.reply(second).output)
    f.send(second, "r", x, client="alice", timeout_ms=10_000)
    again = f.reply(second)
    assert again.request_id == "r" and again.error_code is None and f.fe.status()["answered"]["duplicate"] == 1
    assert f.in_flight() == (0, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_cancel_answers_once_and_frees_the_frontend(front, kind):
    """A model's or an application's request is answered cancelled and its queries are
    withdrawn; a graph's, once sent into the graph, completes (exactly once): its answer is
    the client's and is kept for a retry."""
    f = front(kind)
    c = f.client()
    f.send(c, "a", x_of(8), client="alice", timeout_ms=10_000)
    arrived = f.arrived()
    transport.send(c, Cancel(request_id="a", client="alice"))
    if kind == "graph":
        f.step(lambda: f.fe.status()["answered"].get("cancel_too_late") == 1)
        f.answer(arrived, 4.0)
        assert list(f.reply(c).output) == [4.0, 4.0]
    else:
        reply = f.reply(c)
        assert (reply.request_id, reply.source, reply.error_code) == ("a", Source.ERROR, ErrorCode.CANCELLED)
        withdrawn = {}
        for _ in arrived:
            msg = f.dispatcher_message()
            assert isinstance(msg, Withdraw)
            withdrawn[msg.model] = msg.qids
        assert withdrawn == {model: [qid] for model, qid in arrived}
        assert f.fe.status()["answered"]["cancelled"] == 1
        f.answer(arrived, 4.0)  # run anyway: late, never a second answer
        f.no_reply(c)
    assert f.in_flight() == (0, 0)
    transport.send(c, Cancel(request_id="a", client="alice"))  # answered: nothing
    f.no_reply(c)


@pytest.mark.parametrize("kind", KINDS)
def test_the_rules_of_a_call_are_the_same_for_every_target(front, kind):
    """Refused by ``common.inputs``, as the client and the gateways refuse them."""
    f = front(kind)
    c = f.client()
    f.send(c, "day", x_of(10), timeout_ms=1e12)
    reply = f.reply(c)
    assert reply.error_code == ErrorCode.BAD_REQUEST and "more than a day" in reply.error
    f.send(c, "shape", np.zeros(DIM + 1, np.float32))
    reply = f.reply(c)
    assert reply.error_code == ErrorCode.BAD_REQUEST and f"{kind} {f.name}: shape [{DIM + 1}] is not [{DIM}]" in reply.error
    f.send(c, "dtype", np.zeros(DIM, np.float64))
    assert f.reply(c).error == f"{kind} {f.name} takes float32 input, got float64"
    assert f.in_flight() == (0, 0)
