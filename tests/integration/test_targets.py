"""One call for every target: the client (``key=``, ``version=``, its client id), ``keel
predict``, the HTTP gateway and ``tritonclient[http]`` on an application, through real
frontend, dispatcher, worker and gateway processes of one spec file.

The builtin ``sleep`` model answers the first ``OUT`` input features, ``noop`` zeros: on a
one-hot input of class ``TRUE`` the application's ``sleep`` models are right."""
from __future__ import annotations

import time
import urllib.error
import urllib.request

import numpy as np
import orjson
import pytest

from keel.common.client import Client, UnknownModel
from keel.common.protocol import ErrorCode, Source
from keel.common.spec import load_spec
from keel.common.transport import request_status
from keel.deploy.keel import main as keel
from keel.deploy.local import free_port, free_port_block
from keel.services.selection.contexts import ContextStore

pytestmark = pytest.mark.slow

DIM, OUT, TRUE = 8, 4, 2
X = np.eye(DIM, dtype=np.float32)[TRUE]
PATIENT_MS = 10_000


@pytest.fixture(scope="module")
def cluster(module_launcher, tmp_path_factory):
    """right (sleep), slow (sleep, 300 ms), wrong (noop) and the application ``ensemble`` of
    right and wrong, behind one frontend (no cache: every call reaches a model) and a gateway."""
    run = module_launcher("targets")
    port = free_port()
    spec_file = tmp_path_factory.mktemp("targets") / "targets.toml"
    spec_file.write_text(f'[cluster]\nname = "targets"\nbase_port = {free_port_block()}\nrun_dir = "{run.log_dir}"\n'
                         f'[gateway]\nhttp_port = {port}\n[frontend]\ncache_size = 0\n'
                         f'[models.right]\nbuiltin = "sleep"\ninput_shape = [{DIM}]\noutput_size = {OUT}\n'
                         f'[models.slow]\nbuiltin = "sleep"\nfixed_ms = 300.0\ninput_shape = [{DIM}]\noutput_size = {OUT}\n'
                         f'[models.wrong]\nbuiltin = "noop"\ninput_shape = [{DIM}]\noutput_size = {OUT}\n'
                         '[applications.ensemble]\nmodels = ["right", "wrong"]\npolicy = "exp4"\n')
    spec = load_spec(str(spec_file))
    run.start_spec(spec)
    yield spec_file, spec, port
    assert "request failed" not in run.log_path("gateway").read_text(errors="replace")


def http(port: int, path: str, doc: dict | None = None) -> tuple[int, dict]:
    data = None if doc is None else orjson.dumps(doc)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="GET" if doc is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            return resp.status, orjson.loads(raw) if raw else {}
    except urllib.error.HTTPError as err:
        return err.code, orjson.loads(err.read())


def infer_doc(x: np.ndarray, **parameters) -> dict:
    return {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()}],
            "parameters": {"timeout_ms": PATIENT_MS, **parameters}}


def test_the_client_calls_an_application_with_a_key(cluster, client):
    _, spec, _ = cluster
    c = client(spec.client_endpoints, timeout_ms=PATIENT_MS)
    r = c.predict("ensemble", X, key="alice")
    assert r.source == Source.ENSEMBLE and sorted(r.models) == ["right", "wrong"], r
    assert r.confidence == pytest.approx(0.5) and r.output.shape == (OUT,)
    assert c.feedback(r.request_id, TRUE).ok
    plain = c.predict("right", X)
    assert plain.source == Source.MODEL and plain.models is None


def test_a_plain_model_refuses_a_key(cluster, client):
    _, spec, _ = cluster
    keyed = client(spec.client_endpoints, timeout_ms=PATIENT_MS).predict("right", X, key="alice")
    assert keyed.error_code == ErrorCode.BAD_REQUEST, keyed


def test_an_applications_state_is_per_key(cluster, client):
    _, spec, _ = cluster
    c = client(spec.client_endpoints, timeout_ms=PATIENT_MS)
    for _ in range(3):
        assert c.feedback(c.predict("ensemble", X, key="carol").request_id, TRUE).ok
    store = ContextStore(spec.service("frontend").config.selection_store)
    try:
        assert store.get("ensemble", "carol", now=time.time()) is not None
        assert store.get("ensemble", "dan", now=time.time()) is None
        assert store.get("ensemble", "", now=time.time()) is None  # nothing learned for "no key"
    finally:
        store.close()


def test_a_pinned_version_is_answered_by_it_and_another_is_refused(cluster, client):
    _, spec, _ = cluster
    c = client(spec.client_endpoints, timeout_ms=PATIENT_MS)
    r = c.predict("right", X, version="1")
    assert r.source == Source.MODEL and r.version == "1"
    refused = c.predict("right", X, version="7")
    assert refused.error_code == ErrorCode.UNKNOWN_MODEL and "7" in refused.error, refused
    with pytest.raises(UnknownModel):
        c.predict("right", X, version="7", raise_errors=True)
    assert c.predict("ensemble", X, key="k", version="1").error_code == ErrorCode.BAD_REQUEST  # no versions


def test_a_retry_from_a_new_connection_with_the_same_client_id_is_answered_once(cluster):
    _, spec, _ = cluster
    endpoint = spec.client_endpoints[0]
    before = request_status(endpoint)["answered"].get("duplicate", 0)
    with Client(endpoint, timeout_ms=PATIENT_MS, client_id="till-4") as first:
        one = first.predict("slow", X, request_id="sale-1")
    with Client(endpoint, timeout_ms=PATIENT_MS, client_id="till-4") as again:  # a new connection, as after a crash
        two = again.predict("slow", X, request_id="sale-1")
    assert one.source == two.source == Source.MODEL
    np.testing.assert_array_equal(one.output, two.output)
    assert request_status(endpoint)["answered"].get("duplicate", 0) == before + 1  # the remembered answer


def test_keel_predict_calls_an_application_and_lists_what_is_served(cluster, capsys):
    spec_file, _, _ = cluster
    capsys.readouterr()
    assert keel(["predict", "--spec", str(spec_file), "ensemble", "--key", "erin", "--input", orjson.dumps(X.tolist()).decode(),
                 "--timeout-ms", str(PATIENT_MS)]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["source"] == Source.ENSEMBLE and sorted(out["models"]) == ["right", "wrong"] and len(out["output"]) == OUT
    assert keel(["predict", "--spec", str(spec_file), "right", "--version", "1", "--input", "[0, 0, 1, 0, 0, 0, 0, 0]"]) == 0
    assert orjson.loads(capsys.readouterr().out)["version"] == "1"
    assert keel(["predict", "--spec", str(spec_file), "nope", "--input", "[0]"]) == 1
    err = capsys.readouterr().err
    assert "'nope' is not served" in err and "ensemble (application)" in err and "right (model)" in err
    assert keel(["predict", "--spec", str(spec_file), "right", "--key", "k", "--input", "[0]"]) == 1
    assert "takes no --key" in capsys.readouterr().err


def test_the_gateway_lists_and_infers_an_application_with_a_key(cluster):
    _, spec, port = cluster
    info = request_status(spec.status_endpoints()["gateway"])
    queries = info["queries"]
    assert info["event_loop"] == "uvloop"  # a dependency where Keel runs: the gateway's loop
    status, meta = http(port, "/v2/models/ensemble")
    assert status == 200 and meta["parameters"] == {"keel_kind": "application", "keel_key": True}, meta
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, DIM]}] and meta["versions"] == []
    assert http(port, "/v2/models/ensemble/ready")[0] == 200
    xs = np.stack([X, X])
    status, body = http(port, "/v2/models/ensemble/infer", infer_doc(xs, key="alice"))
    assert status == 200, body
    params = body["parameters"]
    assert params["keel_sources"] == [Source.ENSEMBLE] * 2 and [sorted(m) for m in params["keel_models"]] == [["right", "wrong"]] * 2
    assert params["keel_confidence"] == [0.5, 0.5] and body["outputs"][0]["shape"] == [2, OUT]
    assert request_status(spec.status_endpoints()["gateway"])["queries"] == queries + 2  # one per row
    status, body = http(port, "/v2/models/right/infer", infer_doc(xs, key="alice"))
    assert status == 400 and "takes no key" in body["error"]
    status, body = http(port, "/v2/models/ensemble/infer", infer_doc(xs, key=7))
    assert status == 400 and "parameters.key" in body["error"]
    status, body = http(port, "/v2/models/ensemble/versions/1/infer", infer_doc(xs, key="alice"))
    assert status == 404 and "no versions" in body["error"]
    status, body = http(port, "/v2/models/nope")
    assert status == 404 and "ensemble" in body["error"] and "right" in body["error"]


def test_tritonclient_reads_an_applications_metadata_and_infers_with_a_key(cluster):
    httpclient = pytest.importorskip("tritonclient.http")
    _, _, port = cluster
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=30.0)
    try:
        assert client.is_model_ready("ensemble")
        meta = client.get_model_metadata("ensemble")
        assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, DIM]}]
        assert meta["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, OUT]}]
        for binary in (False, True):
            inp = httpclient.InferInput("input", [1, DIM], "FP32")
            inp.set_data_from_numpy(X[None], binary_data=binary)
            out = httpclient.InferRequestedOutput("output", binary_data=binary)
            result = client.infer("ensemble", [inp], outputs=[out], parameters={"key": "frank"}, timeout=PATIENT_MS * 1000)
            assert result.as_numpy("output").shape == (1, OUT)
            assert result.get_response()["parameters"]["keel_models"] in (
                [["right", "wrong"]], [["wrong", "right"]])
    finally:
        client.close()
