"""The HTTP gateway's named-tensor path (services.gateway, services.inference) without a
cluster: its handler is called with requests that the unmodified ``tritonclient.http``
builds (``generate_request_body``) and its answers are read back the same way
(``parse_response_body``); a stand-in client answers each row from its named inputs."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import orjson
import pytest

from keel.common.config import GatewayConfig
from keel.common.signature import Signature, TensorSpec, parse_input
from keel.services.gateway import HEADER_LENGTH, Gateway
from keel.services.httpserver import Request
from keel.services.inference import Inference

httpclient = pytest.importorskip("tritonclient.http")

SIGNATURE = Signature((parse_input("dense:float32:3"), parse_input("ids:int64:1..40"), parse_input("text:bytes:scalar")),
                      (TensorSpec("score", "float32", (1,)), TensorSpec("label", "bytes", ()),
                       TensorSpec("ids_twice", "int64", (-1,))))
REC = {"kind": "model", "input_shape": [3], "input_dtype": "float32", "output_size": 0, "version": "1",
       "versions": ["1"], "key": False, "signature": SIGNATURE.to_dict()}
OLD = {"kind": "model", "input_shape": [2], "input_dtype": "float32", "output_size": 2, "version": "1",
       "versions": ["1"], "key": False}


def answer(x: dict) -> dict:
    """What the stand-in model answers for one request of named tensors."""
    return {"score": np.array([x["dense"].sum() + x["ids"].sum()], np.float32),
            "label": np.array(x["text"].item().upper(), dtype=object), "ids_twice": x["ids"] * 2}


class StandInClient:
    """``AsyncClient.predict`` as the named contract says: a dict in, ``Result.outputs`` out."""

    def __init__(self):
        self.rows: list = []

    async def predict(self, name, x, **options):
        self.rows.append((name, x, options))
        common = dict(source="model", version="1", latency_ms=1.0, models=None, confidence=None, error=None,
                      error_code=None)
        if isinstance(x, dict):
            return SimpleNamespace(output=None, outputs=answer(x), **common)
        return SimpleNamespace(output=np.asarray(x, np.float32) * 2, outputs={"output": np.asarray(x) * 2}, **common)


@pytest.fixture
def gateway():
    gw = Gateway(GatewayConfig(http_port=0))
    client = StandInClient()
    gw.inference = Inference(gw.cfg, client)
    gw.inference.known, gw.inference.known_at = {"rec": REC, "old": OLD}, time.monotonic() + 3600  # never asked again
    gw.client_standin = client
    return gw


def call(gw: Gateway, method: str, path: str, body: bytes = b"", headers: dict | None = None):
    request = Request(method, path, "", {k.lower(): v for k, v in (headers or {}).items()}, body, True)
    return asyncio.run(gw.handle(request))


def triton_inputs(rows: int = 2, n: int = 3, binary: bool = True) -> list:
    dense = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    ids = np.arange(rows * n, dtype=np.int64).reshape(rows, n)
    text = np.array([f"row {i}".encode() for i in range(rows)], dtype=object)
    made = []
    for name, x, datatype in (("dense", dense, "FP32"), ("ids", ids, "INT64"), ("text", text, "BYTES")):
        inp = httpclient.InferInput(name, list(x.shape), datatype)
        inp.set_data_from_numpy(x, binary_data=binary)
        made.append(inp)
    return made


def infer(gw: Gateway, inputs: list, outputs: list | None = None, model: str = "rec"):
    body, length = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    headers = {HEADER_LENGTH: str(length)} if length is not None else {}
    response = call(gw, "POST", f"/v2/models/{model}/infer", body, headers)
    if response.status != 200:
        return response.status, orjson.loads(response.body)["error"]
    length = (response.headers or {}).get(HEADER_LENGTH)
    return 200, httpclient.InferenceServerClient.parse_response_body(response.body, header_length=
                                                                     int(length) if length else None)


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_http_request_of_named_tensors(gateway, binary):
    status, result = infer(gateway, triton_inputs(binary=binary))
    assert status == 200, result
    assert result.as_numpy("score").tolist() == [[0 + 1 + 2 + 0 + 1 + 2], [3 + 4 + 5 + 3 + 4 + 5]]
    assert result.as_numpy("label").tolist() == [b"ROW 0", b"ROW 1"]
    ids_twice = result.as_numpy("ids_twice")
    assert ids_twice.dtype == np.int64 and ids_twice.tolist() == [[0, 2, 4], [6, 8, 10]]
    rows = gateway.client_standin.rows
    assert len(rows) == 2 and sorted(rows[0][1]) == ["dense", "ids", "text"]  # one Keel request per row, by name
    assert rows[1][1]["text"].item() == b"row 1"


def test_requested_outputs_only_and_json_or_binary_as_asked(gateway):
    outputs = [httpclient.InferRequestedOutput("label", binary_data=False)]
    status, result = infer(gateway, triton_inputs(rows=1, n=40), outputs)
    assert status == 200 and result.as_numpy("score") is None
    assert result.get_output("label") == {"name": "label", "datatype": "BYTES", "shape": [1], "data": ["ROW 0"]}


@pytest.mark.parametrize("change, why", [
    (lambda i: i.pop(1), "missing input.*'ids'"),
    (lambda i: i.append(httpclient.InferInput("extra", [2, 1], "FP32").set_data_from_numpy(np.ones((2, 1), np.float32))),
     "unknown input.*'extra'"),
    (lambda i: i.__setitem__(1, httpclient.InferInput("ids", [2, 3], "INT32").set_data_from_numpy(
        np.ones((2, 3), np.int32))), "datatype INT32, but the model takes INT64"),
    (lambda i: i.__setitem__(1, httpclient.InferInput("ids", [2, 41], "INT64").set_data_from_numpy(
        np.ones((2, 41), np.int64))), "over its bound 40"),
    (lambda i: i.__setitem__(0, httpclient.InferInput("dense", [2, 3], "FP32").set_data_from_numpy(
        np.full((2, 3), np.nan, np.float32))), "NaN"),
])
def test_bad_named_inputs_are_400_and_the_gateway_serves_on(gateway, change, why):
    inputs = triton_inputs()
    change(inputs)
    status, message = infer(gateway, inputs)
    assert status == 400 and __import__("re").search(why, message), message
    assert infer(gateway, triton_inputs())[0] == 200


def test_unknown_requested_output_is_400(gateway):
    status, message = infer(gateway, triton_inputs(), [httpclient.InferRequestedOutput("box")])
    assert status == 400 and "unknown output(s) 'box'" in message


def test_metadata_and_config_from_the_signature(gateway):
    gateway.inference.targets = _kept(gateway)  # metadata asks fresh targets: the kept ones here
    meta = orjson.loads(call(gateway, "GET", "/v2/models/rec").body)
    assert meta["inputs"][1] == {"name": "ids", "datatype": "INT64", "shape": [-1, -1]}
    assert [o["name"] for o in meta["outputs"]] == ["score", "label", "ids_twice"]
    config = orjson.loads(call(gateway, "GET", "/v2/models/rec/config").body)
    assert config["name"] == "rec" and config["max_batch_size"] > 0
    assert config["input"][2] == {"name": "text", "data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}}
    old = orjson.loads(call(gateway, "GET", "/v2/models/old").body)  # a model without a signature: as before
    assert old["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 2]}]
    assert orjson.loads(call(gateway, "GET", "/v2/models/old/config").body)["output"] == [
        {"name": "output", "data_type": "TYPE_FP32", "dims": [2]}]


def test_a_single_input_model_keeps_the_one_tensor_path(gateway):
    inp = httpclient.InferInput("input", [2, 2], "FP32").set_data_from_numpy(np.ones((2, 2), np.float32))
    status, result = infer(gateway, [inp], model="old")
    assert status == 200 and result.as_numpy("output").tolist() == [[2.0, 2.0], [2.0, 2.0]]
    assert all(not isinstance(x, dict) for _, x, _ in gateway.client_standin.rows)  # plain arrays, as before


def _kept(gw: Gateway):
    async def targets(fresh: bool = False):
        return gw.inference.known
    return targets


def test_statistics_count_each_request_and_row_as_triton_writes_them(gateway):
    gateway.inference.targets = _kept(gateway)
    assert infer(gateway, triton_inputs(rows=3))[0] == 200
    assert infer(gateway, triton_inputs(rows=1, n=41))[0] == 400  # refused at the edge: never sent
    one = orjson.loads(call(gateway, "GET", "/v2/models/rec/stats").body)["model_stats"]
    assert [(s["name"], s["inference_count"], s["execution_count"]) for s in one] == [("rec", 3, 1)]
    assert one[0]["inference_stats"]["success"]["count"] == 1 and one[0]["inference_stats"]["success"]["ns"] > 0
    every = orjson.loads(call(gateway, "GET", "/v2/models/stats").body)["model_stats"]
    assert [s["name"] for s in every] == ["old", "rec"] and every[0]["execution_count"] == 0
    assert call(gateway, "GET", "/v2/models/nope/stats").status == 404
