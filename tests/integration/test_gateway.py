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


@pytest.fixture(scope="module")
def gateway(module_launcher):
    run = module_launcher("gateway")
    port = free_port()
    spec = load_spec({
        "cluster": {"name": "gw", "base_port": free_port_block(), "run_dir": str(run.log_dir)},
        "gateway": {"http_port": port},
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


def raw(port: int, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, orjson.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, orjson.loads(err.read())


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
