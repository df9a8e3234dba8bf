"""The OIP v2 HTTP gateway against the unmodified ``tritonclient[http]``: real gateway,
frontend, dispatcher and worker processes of a spec with a ``[gateway]`` table."""
from __future__ import annotations

import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import orjson
import pytest

from keel.common.spec import load_spec
from keel.deploy.local import free_port, free_port_block

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.slow

DIM, OUT = 8, 4
BODY_LIMIT = 1 << 20


@pytest.fixture(scope="module")
def gateway(module_launcher):
    run = module_launcher("gateway")
    port = free_port()
    spec = load_spec({
        "cluster": {"name": "gw", "base_port": free_port_block(), "run_dir": str(run.log_dir)},
        "gateway": {"http_port": port, "max_body_bytes": BODY_LIMIT},
        "frontend": {"cache_size": 0},
        "models": {"echo": {"builtin": "sleep", "input_shape": [DIM], "output_size": OUT, "workers": 1},
                   "slow": {"builtin": "sleep", "fixed_ms": 2000.0, "input_shape": [DIM], "output_size": OUT,
                            "deadline_ms": 5000}},
    })
    assert [s.name for s in spec.role("gateway")] == ["gateway"]
    run.start_spec(spec)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=30.0)
    yield client, port
    client.close()
    assert "request failed" not in run.log_path("gateway").read_text(errors="replace")  # no traceback of its own


def infer(client, x: np.ndarray, binary: bool, model: str = "echo", **kwargs):
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput("output", binary_data=binary)
    return client.infer(model, [inp], outputs=[out], **kwargs)


def test_health_and_metadata(gateway):
    client, _ = gateway
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("echo") and client.is_model_ready("echo", "1")
    assert not client.is_model_ready("nope")
    meta = client.get_server_metadata()
    assert meta["name"] == "keel" and "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("echo")
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, DIM]}]
    assert model["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, OUT]}]
    assert model["versions"] == ["1"]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer(gateway, binary):
    client, _ = gateway
    x = np.random.default_rng(int(binary)).random((5, DIM), dtype=np.float32)
    result = infer(client, x, binary, request_id="req-7")
    np.testing.assert_allclose(result.as_numpy("output"), x[:, :OUT], rtol=1e-6)  # sleep answers its first features
    response = result.get_response()
    assert response["id"] == "req-7" and response["model_name"] == "echo" and response["model_version"] == "1"
    assert response["parameters"]["keel_sources"] == ["model"] * 5


def test_unknown_model_and_bad_shape(gateway):
    client, port = gateway
    with pytest.raises(InferenceServerException, match="unknown model 'nope'") as exc:
        infer(client, np.zeros((1, DIM), np.float32), False, model="nope")
    assert exc.value.status() == "404"
    with pytest.raises(InferenceServerException, match=r"shape \[2, 3\] is not \[-1, 8\]") as exc:
        infer(client, np.zeros((2, 3), np.float32), True)
    assert exc.value.status() == "400"
    # the gateway keeps serving
    x = np.ones((1, DIM), np.float32)
    np.testing.assert_allclose(infer(client, x, True).as_numpy("output"), x[:, :OUT])


def raw(port: int, path: str, body: bytes | None, headers: dict | None = None, method: str = "POST") -> tuple[int, dict]:
    """(status, JSON body) of one request; a body that is not JSON fails the test."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, orjson.loads(resp.read())
    except urllib.error.HTTPError as err:
        assert err.headers.get_content_type() == "application/json", (err.code, err.headers, err.read()[:200])
        return err.code, orjson.loads(err.read())


def body_of(tensor: dict, **more) -> bytes:
    return orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", **tensor}], **more})


ROW = {"shape": [1, DIM], "data": [0.0] * DIM}
HUGE = {"shape": [4294967296, 4294967296], "data": []}


@pytest.mark.parametrize("body, headers, status, says", [
    (body_of({"shape": [1, DIM], "datatype": "UINT8", "data": [-1] * DIM}), {}, 400, "do not fit UINT8"),
    (body_of({"shape": [1, DIM], "datatype": "INT8", "data": [1000] * DIM}), {}, 400, "do not fit INT8"),
    (body_of(HUGE), {}, 400, "is not [-1, 8]"),
    (body_of({"shape": [2**61, DIM], "data": []}), {}, 400, "values do not fill shape"),  # 2**64 values: 0 in int64
    (body_of({"shape": [2**61, DIM], "parameters": {"binary_data_size": 0}}),
     {"Inference-Header-Content-Length": str(len(body_of({"shape": [2**61, DIM], "parameters": {"binary_data_size": 0}})))},
     400, "bytes do not hold shape"),
    (body_of(HUGE, outputs=5), {}, 400, "is not [-1, 8]"),
    (body_of(ROW, outputs=5), {}, 400, "outputs must be a list"),
    (body_of(ROW, outputs=[{"name": "output", "parameters": [1]}]), {}, 400, "outputs[0].parameters must be a JSON object"),
    (body_of(ROW, outputs=[{"name": "logits"}]), {}, 400, "one output, 'output'"),
    (body_of(ROW, parameters=[]), {}, 400, "parameters must be a JSON object"),
    (body_of({**ROW, "parameters": "x"}), {}, 400, "parameters must be a JSON object"),
    (body_of({"shape": [1, DIM], "data": ["1"] * DIM}), {}, 400, "must be numbers"),
    (body_of({"shape": [1, DIM], "data": [None] * DIM}), {}, 400, "must be numbers"),
    (body_of({"shape": [1, DIM], "datatype": "INT32", "data": [0.5] * DIM}), {}, 400, "must be integers"),
    (body_of({"shape": [1, DIM], "data": {"a": 1}}), {}, 400, "data must be a list"),
    (body_of({"shape": [1, DIM], "datatype": ["FP32"], "data": [0.0] * DIM}), {}, 400, "datatype ['FP32']"),
    (body_of(ROW, parameters={"timeout_ms": 1e30}), {}, 400, "more than a day"),
    (b"x" * (BODY_LIMIT + 1), {}, 413, "max_body_bytes"),
], ids=["uint8-negative", "int8-range", "shape-overflow-json", "rows-overflow-json", "rows-overflow-binary",
        "outputs-5-and-huge-shape", "outputs-5", "output-parameters-list", "output-name", "parameters-list",
        "input-parameters-string", "strings", "nulls", "fractions-for-int", "data-object", "datatype-list",
        "timeout-huge", "body-too-large"])
def test_bad_input_is_a_json_4xx(gateway, body, headers, status, says):
    _, port = gateway
    got, answer = raw(port, "/v2/models/echo/infer", body, headers)
    assert got == status and says in answer["error"], (got, answer)


def test_unknown_paths_and_methods_are_json_errors(gateway):
    _, port = gateway
    status, body = raw(port, "/v2/nothing/here", None, method="GET")
    assert status == 404 and "no such path" in body["error"]
    status, body = raw(port, "/v2/models/echo/infer", None, method="GET")
    assert status == 405 and "GET is not allowed" in body["error"]
    status, body = raw(port, "/v2/models/nope", None, method="GET")
    assert status == 404 and "unknown model 'nope'" in body["error"]
    status, body = raw(port, "/v2/models/echo/versions/7/ready", None, method="GET")
    assert status == 404 and "version 7 is not served" in body["error"]


def test_errors_in_the_protocol_format(gateway):
    _, port = gateway
    status, body = raw(port, "/v2/models/echo/infer", b"{not json")
    assert status == 400 and "not JSON" in body["error"]
    doc = {"inputs": [{"name": "input", "shape": [1, DIM], "datatype": "BYTES", "data": ["a"] * DIM}]}
    status, body = raw(port, "/v2/models/echo/infer", orjson.dumps(doc))
    assert status == 400 and "datatype 'BYTES'" in body["error"]
    doc = {"inputs": [{"name": "input", "shape": [1, DIM], "datatype": "FP32", "data": [0.0] * DIM}]}
    status, body = raw(port, "/v2/models/echo/versions/9/infer", orjson.dumps(doc))
    assert status == 404 and "version 9 is not served" in body["error"] and "serve version(s) 1" in body["error"]
    # int64 data for an FP32 model is converted; the deadline parameter is honoured (504, no default)
    doc = {"inputs": [{"name": "input", "shape": [1, DIM], "datatype": "INT64", "data": list(range(DIM))}]}
    status, body = raw(port, "/v2/models/echo/infer", orjson.dumps(doc))
    assert status == 200 and body["outputs"][0]["data"] == [0.0, 1.0, 2.0, 3.0]
    doc = {"parameters": {"timeout_ms": 100}, "inputs": [{"name": "input", "shape": [1, DIM], "datatype": "FP32",
                                                          "data": [0.0] * DIM}]}
    status, body = raw(port, "/v2/models/slow/infer", orjson.dumps(doc))
    assert status == 504 and "deadline" in body["error"]


@pytest.mark.skipif(not (Path(sys.executable).parent / "supervisord").exists(), reason="supervisord is not installed")
def test_keel_up_starts_the_gateway(tmp_path):
    """``keel up`` of a spec with [gateway] starts it under supervisord; ``keel down`` stops it."""
    from keel.deploy import supervisor
    from keel.deploy.keel import main as keel

    port = free_port()
    spec_file = tmp_path / "gw.toml"
    spec_file.write_text(f'[cluster]\nname = "gwup"\nbase_port = {free_port_block()}\nrun_dir = "{tmp_path / "run"}"\n'
                         f'[gateway]\nhttp_port = {port}\n'
                         '[models.noop]\nbuiltin = "noop"\ninput_shape = [2]\noutput_size = 2\n')
    assert keel(["up", str(spec_file), "--wait", "60"]) == 0
    try:
        conf = (tmp_path / "run" / "supervisord.conf").read_text()
        assert "[program:gateway]" in conf
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=30.0)
        assert client.is_server_ready()
        inp = httpclient.InferInput("input", [1, 2], "FP32")
        inp.set_data_from_numpy(np.ones((1, 2), np.float32))
        np.testing.assert_array_equal(client.infer("noop", [inp]).as_numpy("output"), [[0.0, 0.0]])
        client.close()
    finally:
        assert keel(["down", str(spec_file), "--wait", "30"]) == 0
    assert supervisor.status(load_spec(str(spec_file)), timeout_s=0.5)["running"] is False
