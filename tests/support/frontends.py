"""A frontend stepped in the test's own thread: ``tick`` until a condition holds, and client
DEALERs on its ROUTER. Subclasses build the ``Frontend`` (``self.fe``) and its far ends;
``Harness`` (the ``harness`` fixture) is the unit tests' one: a raw DEALER as the client, a
PULL as the dispatcher and a PUSH as the worker, three models ``m``, ``m2`` and ``d``."""
from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.config import FrontendConfig, GraphRouteConfig, ModelInfo
from keel.common.protocol import Predict, Predictions, Reply, Source
from keel.common.protocol.messages import GraphRequest


class SteppedFrontend:
    fe: object
    zsock: object

    def client(self) -> zmq.Socket:
        return self.zsock(zmq.DEALER, connect=transport.endpoint_of(self.fe.router))

    def step(self, condition, timeout_s: float = 5.0):
        """Tick the frontend until ``condition()`` is truthy (returned), else fail the test."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.fe.tick(0.01)
            value = condition()
            if value:
                return value
            assert time.monotonic() < deadline, "condition did not hold"

    def reply(self, dealer, timeout_s: float = 5.0) -> Reply:
        """The next reply on ``dealer``, ticking the frontend until it comes."""
        msg = protocol.decode(self.step(lambda: dealer.poll(0) and dealer.recv_multipart(), timeout_s))
        assert isinstance(msg, Reply)
        return msg

    def no_reply(self, dealer, ticks: int = 20) -> None:
        """``ticks`` ticks of the frontend answer nothing on ``dealer``."""
        for _ in range(ticks):
            self.fe.tick(0.005)
        assert not dealer.poll(0), protocol.decode(dealer.recv_multipart())


DIM, OUT = 4, 2


class Harness(SteppedFrontend):
    def __init__(self, zsock, **options):
        self.zsock = zsock
        self.dispatcher = zsock(zmq.PULL, bind="tcp://127.0.0.1:*")
        models = {"m": ModelInfo([DIM], OUT), "m2": ModelInfo([DIM], OUT), "d": ModelInfo([DIM], OUT, default_output=[-1.0, -1.0])}
        cfg = FrontendConfig(name="fe", client_endpoint="tcp://127.0.0.1:*", prediction_endpoint="tcp://127.0.0.1:*",
                             dispatcher_query_endpoint=transport.endpoint_of(self.dispatcher), models=models,
                             log_requests=False, **options)
        from keel.services.frontend import Frontend

        self.fe = Frontend(cfg)
        self.worker = zsock(zmq.PUSH, connect=self.fe.reply_to)

    def predict(self, dealer, rid: str, x, model: str = "m", timeout_ms: float | None = 10_000) -> None:
        transport.send(dealer, Predict(request_id=rid, model=model, input=np.asarray(x, np.float32), timeout_ms=timeout_ms))

    def queries(self):
        frames = self.step(lambda: self.dispatcher.poll(0) and self.dispatcher.recv_multipart())
        return protocol.decode(frames)

    def answer(self, model: str, qids: list[int], outputs, source: str = Source.MODEL) -> None:
        transport.send(self.worker, Predictions(batch_id=1, model=model, qids=qids, source=source,
                                                outputs=np.asarray(outputs, np.float32).reshape(len(qids), -1)))

    def counts(self) -> dict:
        return self.fe.status()["answered"]


@pytest.fixture
def harness(zsock):
    made = []

    def make(**kwargs) -> Harness:
        h = Harness(zsock, **kwargs)
        made.append(h)
        return h

    yield make
    for h in made:
        h.fe.shutdown()


def x_of(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(DIM, dtype=np.float32)


def gru_graph(zsock, mode: str = "nspb") -> tuple[dict, zmq.Socket]:
    """frontend -> g (a stateful GRU) -> frontend, g being a PULL of the test's; -> (graphs option, g)."""
    g = zsock(zmq.PULL, bind="tcp://127.0.0.1:*")
    table = {"mode": mode, "input_shape": [DIM], "edges": [["frontend", "g"], ["g", "frontend"]],
             "operators": {"g": {"kind": "gru", "input_shape": [DIM], "output_shape": [OUT]}}}
    return {"graph": GraphRouteConfig(graph=table, endpoint="tcp://127.0.0.1:*", peers={"g": transport.endpoint_of(g)})}, g


def graph_input(h, g) -> GraphRequest:
    """The next GraphRequest the operator g receives (GC notices skipped)."""
    while True:
        msg = protocol.decode(h.step(lambda: g.poll(0) and g.recv_multipart()))
        if isinstance(msg, GraphRequest):
            return msg
