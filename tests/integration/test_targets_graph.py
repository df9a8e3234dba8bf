"""A HAMS graph is a target like any other: ``keel predict`` and the HTTP gateway reach it
by name, with a key (its stream), through real frontend, operator and gateway processes.

Needs named graphs in the spec (``[graphs.NAME]``, served by the frontend): until then the
spec is refused with a ``SpecError`` and the test is an expected failure."""
from __future__ import annotations

import urllib.error
import urllib.request

import numpy as np
import orjson
import pytest

from keel.common.spec import load_spec
from keel.deploy.keel import main as keel
from keel.deploy.local import free_port, free_port_block

pytestmark = pytest.mark.slow

SPEC = """
[cluster]
name = "graph-targets"
base_port = {base}
run_dir = "{run_dir}"

[gateway]
http_port = {port}

[models.m]
builtin = "noop"
input_shape = [8]
output_size = 4

[graphs.chain]
mode = "nspb"
input_shape = [8]
edges = [["frontend", "g1"], ["g1", "frontend"]]

[graphs.chain.operators.g1]
kind = "gru"
input_shape = [8]
output_shape = [4]
"""


def post(port: int, path: str, doc: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=orjson.dumps(doc), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, orjson.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, orjson.loads(err.read())


def test_keel_predict_and_the_gateway_reach_a_graph_with_a_key(tmp_path, launcher, capsys):
    run = launcher("graph-targets")
    port = free_port()
    spec_file = tmp_path / "graph.toml"
    spec_file.write_text(SPEC.format(base=free_port_block(), run_dir=run.log_dir, port=port))
    spec = load_spec(str(spec_file))
    run.start_spec(spec)

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/chain", timeout=30) as resp:
        meta = orjson.loads(resp.read())
    assert meta["parameters"] == {"keel_kind": "graph", "keel_key": True} and meta["versions"] == []
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 8]}]
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    doc = {"inputs": [{"name": "input", "shape": [2, 8], "datatype": "FP32", "data": x.reshape(-1).tolist()}],
           "parameters": {"key": "7", "timeout_ms": 10_000}}
    status, body = post(port, "/v2/models/chain/infer", doc)
    assert status == 200 and body["outputs"][0]["shape"] == [2, 4], body
    status, body = post(port, "/v2/models/chain/versions/1/infer", doc)
    assert status == 404 and "no versions" in body["error"]

    capsys.readouterr()
    assert keel(["predict", "--spec", str(spec_file), "chain", "--key", "7", "--input", "[0, 1, 2, 3, 4, 5, 6, 7]",
                 "--timeout-ms", "10000"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["model"] == "chain" and len(out["output"]) == 4 and out["error"] is None
