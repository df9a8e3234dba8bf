"""The gateways' transport-neutral part (services.inference) against a stand-in frontend: a
ROUTER in a thread that answers Status with the targets a test sets and echoes Predicts."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.async_client import AsyncClient
from keel.common.config import GatewayConfig, ModelInfo
from keel.common.protocol import ErrorCode, Predict, Reply, Source
from keel.deploy.local import local_endpoint
from keel.services.inference import Inference, InferError

MODEL = {"kind": "model", "input_shape": [4], "input_dtype": "float32", "output_size": 4, "version": "1", "key": False}
APP = {"kind": "application", "input_shape": [4], "input_dtype": "float32", "output_size": 4, "version": None, "key": True}


class StandIn:
    """A frontend that lists ``targets`` and answers each Predict with its input (an
    application's answer names its models); it records what it got."""

    def __init__(self, targets: dict):
        self.targets = targets
        self.statuses = 0
        self.predicts: list[Predict] = []
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.linger = 0
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = transport.endpoint_of(self.sock)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(20):
                continue
            envelope, body = protocol.split_envelope(self.sock.recv_multipart())
            msg = protocol.decode(body)
            if isinstance(msg, protocol.Status):
                self.statuses += 1
                reply = protocol.Status(service="frontend", info={"targets": dict(self.targets)})
            else:
                self.predicts.append(msg)
                kind = self.targets[msg.model]["kind"]
                if msg.version is not None and msg.version != self.targets[msg.model]["version"]:
                    reply = Reply(request_id=msg.request_id, source=Source.ERROR, error="not served",
                                  error_code=ErrorCode.UNKNOWN_MODEL)
                else:
                    reply = Reply(request_id=msg.request_id, source=Source.ENSEMBLE if kind == "application" else Source.MODEL,
                                  output=msg.input, model=msg.model, version=self.targets[msg.model]["version"],
                                  models=["a", "b"] if kind == "application" else None,
                                  confidence=1.0 if kind == "application" else None)
            transport.send(self.sock, reply, envelope)

    def close(self) -> None:
        if self.stop.is_set():
            return
        self.stop.set()
        self.thread.join(5)
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def standin():
    made = []

    def make(targets: dict) -> StandIn:
        made.append(StandIn(targets))
        return made[-1]

    yield make
    for s in made:
        s.close()


def run(endpoints: list[str], body, models: dict | None = None):
    """``body(inference)`` in a fresh loop with an Inference on ``endpoints``."""
    async def main():
        cfg = GatewayConfig(frontend_endpoints=endpoints, models=models or {})
        async with AsyncClient(endpoints, timeout_ms=3000) as client:
            return await body(Inference(cfg, client))

    return asyncio.run(main())


def test_targets_come_from_the_frontends_and_an_unknown_name_is_asked_again(standin):
    frontend = standin({"m": MODEL})

    async def body(inference: Inference):
        assert set(await inference.targets()) == {"m"}
        asked = frontend.statuses
        await inference.target("m")
        assert frontend.statuses == asked  # kept: no status round per request
        frontend.targets["ensemble"] = APP  # served since: asked again before a 404
        assert (await inference.target("ensemble"))["kind"] == "application"
        assert frontend.statuses == asked + 1
        with pytest.raises(InferError) as exc:
            await inference.target("nope")
        assert exc.value.status == 404 and "unknown model 'nope'" in exc.value.message and "ensemble" in exc.value.message
        with pytest.raises(InferError) as exc:
            await inference.target("m", "7")
        assert exc.value.status == 404 and "version 7 is not served" in exc.value.message
        assert (await inference.target("m", "1"))["versions"] == ["1"]

    run([frontend.endpoint], body)


def test_no_frontend_answering_is_a_503_except_for_the_specs_models_inference():
    async def body(inference: Inference):
        with pytest.raises(InferError) as exc:
            await inference.targets()
        assert exc.value.status == 503
        with pytest.raises(InferError) as exc:
            await inference.target("m")
        assert exc.value.status == 503
        target = await inference.target_or_spec("m", None)  # its queries may still be answered
        assert (target["kind"], target["input_shape"], target["key"]) == ("model", [4], False)
        with pytest.raises(InferError):
            await inference.target_or_spec("ensemble", None)

    run([local_endpoint()], body, {"m": ModelInfo(input_shape=[4], output_size=4)})


def test_infer_sends_key_version_and_rows_and_refuses_what_a_target_does_not_take(standin):
    frontend = standin({"m": MODEL, "ensemble": APP})

    async def body(inference: Inference):
        x = np.arange(8, dtype=np.float64).reshape(2, 4)  # float64 rows: converted to the target's float32
        out, results = await inference.infer("ensemble", x, key="alice", request_id="r")
        assert out.dtype == np.float32 and out.shape == (2, 4)
        np.testing.assert_array_equal(out, x)
        assert [r.models for r in results] == [["a", "b"]] * 2
        out, _ = await inference.infer("m", x[:1], version="1")
        assert out.shape == (1, 4)
        out, _ = await inference.infer("m", np.zeros((0, 4), np.float32))
        assert out.shape == (0, 4)
        for call, status, says in [
            (inference.infer("m", x, key="alice"), 400, "takes no key"),
            (inference.infer("m", np.zeros((1, 3))), 400, r"shape [1, 3] is not [-1, 4]"),
            (inference.infer("m", np.full((1, 4), np.nan)), 400, "NaN"),
            (inference.infer("m", np.zeros((1, 4), np.int64) - 1, version="1"), 200, ""),
            (inference.infer("m", x, version="2"), 404, "version 2 is not served"),
            (inference.infer("ensemble", x, version="1"), 404, "has no versions"),
        ]:
            if status == 200:
                await call
                continue
            with pytest.raises(InferError) as exc:
                await call
            assert exc.value.status == status and says in exc.value.message, exc.value.message
        frontend.targets["m"] = {**MODEL, "version": "2"}  # a rollout the kept targets do not know yet
        with pytest.raises(InferError) as exc:  # the frontend refuses the pinned version itself
            await inference.infer("m", x[:1], version="1")
        assert exc.value.status == 404 and "version 1 is not served" in exc.value.message

    run([frontend.endpoint], body)
    sent = {m.request_id: m for m in frontend.predicts}
    assert sent["r.1-0"].key == sent["r.1-1"].key == "alice" and sent["r.1-0"].model == "ensemble"
    # no rows, no query; a version the frontends do not serve is refused before any query
    assert [m.version for m in frontend.predicts if m.model == "m"] == ["1", "1", "1"]


def test_stale_targets_are_asked_again_in_the_background_and_forgotten_when_none_answers(standin, monkeypatch):
    from keel.services import inference as module

    monkeypatch.setattr(module, "TARGETS_TTL_S", 0.0)  # every kept answer is stale at once
    frontend = standin({"m": MODEL})

    async def body(inference: Inference):
        first = await inference.targets()
        asked = frontend.statuses
        assert await inference.targets() is first  # answered from what is kept, no waiting
        while frontend.statuses == asked:  # ... while it is asked again in the background
            await asyncio.sleep(0.01)
        await inference.refresh
        frontend.close()  # no frontend answers any more
        await inference.targets()
        await inference.refresh
        with pytest.raises(InferError) as exc:  # nothing kept: this request asks, and hears nothing
            await inference.targets()
        assert exc.value.status == 503
        await inference.close()

    run([frontend.endpoint], body)
