"""Fuzz the HTTP gateway: a real gateway in front of a real frontend, dispatcher and worker
(the builtin noop model), sent a few thousand hostile bodies -- OIP requests whose every
field may be of the wrong type or value, binary bodies with lying lengths, bytes that are
not JSON, odd paths and versions. Every answer is a 2xx or a 4xx whose JSON body holds
"error" (the noop model never fails, so no 5xx is allowed), the gateway logs no failure of
its own, and it still answers a good request afterwards."""
from __future__ import annotations

import http.client

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keel.common.spec import load_spec
from keel.deploy.local import free_port, free_port_block

pytestmark = pytest.mark.slow

DIM, OUT = 4, 2
FUZZ = settings(max_examples=700, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@pytest.fixture(scope="module")
def gateway(module_launcher):
    run = module_launcher("gwfuzz")
    port = free_port()
    spec = load_spec({
        "cluster": {"name": "gwfuzz", "base_port": free_port_block(), "run_dir": str(run.log_dir)},
        "gateway": {"http_port": port, "max_body_bytes": 64 * 1024},
        "frontend": {"log_requests": False},
        "models": {"noop": {"builtin": "noop", "input_shape": [DIM], "output_size": OUT, "workers": 1}},
    })
    run.start_spec(spec)
    conn = Connection(port)
    yield conn
    conn.close()
    log = run.log_path("gateway").read_text(errors="replace")
    assert "request failed" not in log and "Traceback" not in log


class Connection:
    """One keep-alive HTTP connection, opened again if the server closed it."""

    def __init__(self, port: int):
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, bytes, str]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                self.conn.request(method, path, body=body, headers=headers or {})
                resp = self.conn.getresponse()
                return resp.status, resp.read(), resp.getheader("Content-Type", "")
            except (ConnectionError, http.client.HTTPException):
                self.close()  # the server may close a kept-alive connection between requests
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def check(status: int, body: bytes, content_type: str) -> None:
    """2xx, or a 4xx in the protocol's format."""
    assert status < 500, (status, body[:300])
    if status >= 400:
        assert content_type.startswith("application/json"), (status, content_type, body[:300])
        error = orjson.loads(body)["error"]
        assert isinstance(error, str) and error, body[:300]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"]
SIZE = st.one_of(st.integers(0, 5), st.just(DIM), st.sampled_from([2**32, 2**61, 2**63 - 1, -1]))
VALUE = st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=False), st.integers(-300, 300),
                  st.integers(-2**63, 2**64 - 1), st.booleans(), st.floats(allow_nan=False, allow_infinity=False),
                  st.none(), st.text(max_size=3))


def maybe(strategy):
    """Mostly the plausible value, sometimes absent (``...``, see ``prune``) or any JSON at all."""
    return st.sampled_from(["plausible"] * 6 + ["absent", "any"]).flatmap(
        lambda pick: strategy if pick == "plausible" else st.just(...) if pick == "absent" else JSON)


def prune(value):
    """``value`` without what ``maybe`` left out."""
    if isinstance(value, dict):
        return {k: prune(v) for k, v in value.items() if v is not ...}
    if isinstance(value, list):
        return [prune(v) for v in value if v is not ...]
    return value


@st.composite
def tensors(draw) -> dict:
    rows = draw(st.integers(0, 3))
    shape = draw(maybe(st.sampled_from(["rows", "rows", "any"]).flatmap(
        lambda pick: st.just([rows, DIM]) if pick == "rows" else st.lists(SIZE, max_size=4))))
    n = rows * DIM if draw(st.integers(0, 3)) else draw(st.integers(0, 12))
    data = draw(st.one_of(st.lists(st.floats(-1e3, 1e3, width=32), min_size=n, max_size=n),
                          st.lists(st.integers(0, 255), min_size=n, max_size=n),
                          st.lists(VALUE, min_size=n, max_size=n),
                          st.lists(st.lists(VALUE, max_size=DIM), max_size=3)))
    fields = {
        "name": maybe(st.sampled_from(["input", "x"])),
        "shape": st.just(shape),
        "datatype": maybe(st.sampled_from(DATATYPES + ["BYTES", "fp32", ""])),
        "data": maybe(st.just(data)),
        "parameters": maybe(st.fixed_dictionaries({}, optional={"binary_data_size": maybe(st.integers(-1, 64))})),
    }
    return {k: draw(s) for k, s in fields.items()}


@st.composite
def requests(draw) -> dict:
    outputs = st.lists(maybe(st.fixed_dictionaries(
        {"name": maybe(st.just("output"))},
        optional={"parameters": maybe(st.fixed_dictionaries({}, optional={"binary_data": maybe(st.booleans())}))})),
        max_size=2)
    params = st.fixed_dictionaries({}, optional={
        # deadlines long enough for the noop model: a 504 here would be the caller's own choice
        "timeout_ms": maybe(st.one_of(st.floats(10_000, 1e9), st.floats(max_value=0), st.integers(-5, 0), st.just(1e30))),
        "timeout": maybe(st.one_of(st.integers(10**7, 10**12), st.integers(-5, 0))),
        "binary_data_output": maybe(st.booleans()),
    })
    fields = {
        "id": maybe(st.text(max_size=10)),
        "inputs": maybe(st.sampled_from([1, 1, 1, 1, 0, 2]).flatmap(lambda n: st.lists(tensors(), min_size=n, max_size=n))),
        "outputs": maybe(outputs),
        "parameters": maybe(params),
    }
    return prune({k: draw(s) for k, s in fields.items()})


PATHS = st.one_of(st.just("/v2/models/noop/infer"), st.just("/v2/models/noop/infer"),
                  st.sampled_from(["/v2/models/noop/versions/1/infer", "/v2/models/noop/versions/2/infer",
                                   "/v2/models/nope/infer", "/v2/models/noop/versions//infer", "/v2/models/noop"]))


@FUZZ
@given(doc=requests(), path=PATHS)
def test_json_bodies(gateway, doc, path):
    check(*gateway.request("POST", path, orjson.dumps(doc)))


@FUZZ
@given(doc=requests(), payload=st.binary(max_size=64),
       length=st.one_of(st.none(), st.integers(-3, 400), st.text(st.characters(min_codepoint=33, max_codepoint=126),
                                                                 max_size=6)))
def test_binary_bodies(gateway, doc, payload, length):
    head = orjson.dumps(doc)
    headers = {"Inference-Header-Content-Length": str(len(head) if length is None else length)}
    check(*gateway.request("POST", "/v2/models/noop/infer", head + payload, headers))


@FUZZ
@given(body=st.one_of(st.binary(max_size=200), st.text(max_size=100).map(str.encode), JSON.map(orjson.dumps)),
       method=st.sampled_from(["POST", "GET", "PUT", "DELETE"]),
       path=st.one_of(PATHS, st.sampled_from(["/v2", "/v2/health/ready", "/", "/v2/models/noop/versions/1/ready",
                                              "/v2/models/noop/versions/x/ready", "/v2/models/%ff/infer"])))
def test_any_bytes_anywhere(gateway, body, method, path):
    check(*gateway.request(method, path, body))


def test_still_serves_after_the_fuzz(gateway):
    x = np.arange(2 * DIM, dtype=np.float32).reshape(2, DIM)
    status, body, _ = gateway.request("POST", "/v2/models/noop/infer", orjson.dumps(
        {"inputs": [{"name": "input", "shape": [2, DIM], "datatype": "FP32", "data": x.ravel().tolist()}]}))
    assert status == 200, body
    answer = orjson.loads(body)
    assert answer["outputs"][0]["shape"] == [2, OUT] and answer["parameters"]["keel_sources"][0] in ("model", "cache")
