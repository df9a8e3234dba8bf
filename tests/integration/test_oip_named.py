"""Named tensors at the gateway, end to end: two Python-class models added with ``keel model
add --input`` -- ``rec`` (dense float32[13] and a variable int64 id bag of 1..40 in; a
float32 score and an int64 sum out) and ``shout`` (bytes in; bytes and an int32 out) --
served by real frontend, dispatcher, worker and gateway processes, and called by the
unmodified ``tritonclient.http`` and ``tritonclient.grpc`` (binary and JSON, typed and
raw), by ``keel predict --input NAME=JSON``; every answer equals the model run offline
on that request alone, the bad inputs each get their OIP error, and the gateway serves on.

This process loads tritonclient's protobuf package ``inference``; only the gateway
process loads Keel's own generated modules of the same package."""
from __future__ import annotations

import importlib.util
import re
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import orjson
import pytest

from keel.common.spec import load_spec
from keel.deploy.keel import main as keel
from keel.deploy.local import free_port, free_port_block

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PATIENT_MS = 10_000
MODELS = textwrap.dedent('''
    import numpy as np


    class Rec:
        """dense float32[13] + ids int64[1..40] -> score float32[1], ids_sum int64 (zero padding changes neither)."""

        def load(self, path):
            self.scale = float(open(path).read())

        def predict_batch(self, inputs):
            dense, ids = inputs["dense"], inputs["ids"]
            ids_sum = ids.reshape(len(ids), -1).sum(axis=1)
            score = (dense.sum(axis=1) * self.scale + ids_sum).astype(np.float32)
            return {"score": score[:, None], "ids_sum": ids_sum.astype(np.int64)}


    class Shout:
        """text bytes -> upper bytes (and "!"), and its length int32."""

        def load(self, path):
            pass

        def predict_batch(self, inputs):
            texts = [bytes(t) for t in np.asarray(inputs["text"], dtype=object).reshape(-1)]
            return {"upper": [t.upper() + b"!" for t in texts], "length": np.array([len(t) for t in texts], np.int32)}
''')


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """The two model classes, loaded here to compute what each request alone must get."""
    folder = tmp_path_factory.mktemp("models")
    (folder / "models.py").write_text(MODELS)
    (folder / "scale.txt").write_text("0.5")
    spec = importlib.util.spec_from_file_location("oip_named_models", folder / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rec, shout = module.Rec(), module.Shout()
    rec.load(folder / "scale.txt")
    return folder, rec, shout


@pytest.fixture(scope="module")
def cluster(module_launcher, tmp_path_factory, offline):
    folder, _, _ = offline
    store = str(folder / "store")
    models = str(folder / "models.py")
    assert keel(["model", "add", "rec", str(folder / "scale.txt"), "--python", f"{models}:Rec", "--input",
                 "dense:float32:13", "--input", "ids:int64:1..40", "--store", store]) == 0
    assert keel(["model", "add", "shout", str(folder / "scale.txt"), "--python", f"{models}:Shout", "--input",
                 "text:bytes:scalar", "--store", store]) == 0
    run = module_launcher("oipnamed")
    http, grpc = free_port(), free_port()
    spec_file = folder / "named.toml"
    spec_file.write_text(f'[cluster]\nname = "oipnamed"\nstore = "{store}"\nbase_port = {free_port_block()}\n'
                         f'run_dir = "{run.log_dir}"\n[gateway]\nhttp_port = {http}\ngrpc_port = {grpc}\n'
                         '[frontend]\ncache_size = 0\n[models.rec]\nworkers = 1\n[models.shout]\nworkers = 1\n')
    spec = load_spec(str(spec_file))
    run.start_spec(spec)
    yield spec_file, http, grpc
    assert "request failed" not in run.log_path("gateway").read_text(errors="replace")  # no traceback of its own


@pytest.fixture(scope="module")
def http(cluster):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{cluster[1]}", network_timeout=30.0, concurrency=8)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(cluster):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{cluster[2]}")
    yield client
    client.close()


def rec_request(rng: np.random.Generator, rows: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.random((rows, 13), dtype=np.float32), rng.integers(0, 1000, (rows, n), dtype=np.int64)


def rec_inputs(lib, dense: np.ndarray, ids: np.ndarray, binary: bool = True) -> list:
    made = []
    for name, x, datatype in (("dense", dense, "FP32"), ("ids", ids, "INT64")):
        inp = lib.InferInput(name, list(x.shape), datatype)
        inp.set_data_from_numpy(x, **({"binary_data": binary} if lib is httpclient else {}))
        made.append(inp)
    return made


def expect_rec(rec, dense: np.ndarray, ids: np.ndarray) -> dict:
    """Each row run offline alone, stacked."""
    rows = [rec.predict_batch({"dense": dense[i:i + 1], "ids": ids[i:i + 1]}) for i in range(len(dense))]
    return {name: np.concatenate([r[name] for r in rows]) for name in rows[0]}


def check_rec(result, want: dict) -> None:
    np.testing.assert_allclose(result.as_numpy("score"), want["score"], rtol=1e-5, atol=1e-5)
    ids_sum = result.as_numpy("ids_sum")
    assert ids_sum.dtype == np.int64 and ids_sum.tolist() == want["ids_sum"].tolist()


@pytest.mark.parametrize("binary", [True, False])
def test_http_several_inputs_and_outputs_by_name(http, offline, binary):
    rng = np.random.default_rng(1)
    dense, ids = rec_request(rng, 3, 7)
    outputs = None if binary else [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("score", "ids_sum")]
    result = http.infer("rec", rec_inputs(httpclient, dense, ids, binary), outputs=outputs)
    check_rec(result, expect_rec(offline[1], dense, ids))


def test_http_mixed_lengths_under_concurrent_load(http, offline):
    rng = np.random.default_rng(2)
    requests = [rec_request(rng, 1, int(n)) for n in rng.integers(1, 41, 24)]
    pending = [http.async_infer("rec", rec_inputs(httpclient, d, i)) for d, i in requests]
    for (dense, ids), call in zip(requests, pending):
        check_rec(call.get_result(), expect_rec(offline[1], dense, ids))


@pytest.mark.parametrize("binary", [True, False])
def test_http_bytes_in_and_out(http, binary):
    text = np.array([b"hello", "caf\u00e9".encode(), b""], dtype=object)
    inp = httpclient.InferInput("text", [3], "BYTES").set_data_from_numpy(text, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("upper", "length")]
    result = http.infer("shout", [inp], outputs=outputs)
    upper = [v if isinstance(v, bytes) else v.encode() for v in result.as_numpy("upper")]  # JSON: tritonclient's str
    assert upper == [b"HELLO!", "CAF\u00e9!".encode(), b"!"]
    assert result.as_numpy("length").tolist() == [5, 5, 0]


def test_http_only_the_requested_outputs(http):
    inp = httpclient.InferInput("text", [1], "BYTES").set_data_from_numpy(np.array([b"a"], object))
    result = http.infer("shout", [inp], outputs=[httpclient.InferRequestedOutput("length")])
    assert result.as_numpy("length").tolist() == [1] and result.as_numpy("upper") is None


def test_http_metadata_and_config(http):
    meta = http.get_model_metadata("rec")
    assert meta["inputs"] == [{"name": "dense", "datatype": "FP32", "shape": [-1, 13]},
                              {"name": "ids", "datatype": "INT64", "shape": [-1, -1]}]
    assert {o["name"]: o["datatype"] for o in meta["outputs"]} == {"score": "FP32", "ids_sum": "INT64"}
    config = http.get_model_config("shout")
    assert config["max_batch_size"] > 0
    assert config["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}}]


BAD = {
    "missing": (lambda d, i: [rec_inputs(httpclient, d, i)[0]], "missing input.*'ids'"),
    "extra": (lambda d, i: rec_inputs(httpclient, d, i) + [
        httpclient.InferInput("box", [1, 4], "FP32").set_data_from_numpy(np.zeros((1, 4), np.float32))],
        "unknown input.*'box'"),
    "datatype": (lambda d, i: [rec_inputs(httpclient, d, i)[0], httpclient.InferInput("ids", list(i.shape), "INT32")
                               .set_data_from_numpy(i.astype(np.int32))], "datatype INT32, but the model takes INT64"),
    "bound": (lambda d, i: rec_inputs(httpclient, d, np.ones((1, 41), np.int64)), "over its bound 40"),
    "nan": (lambda d, i: rec_inputs(httpclient, np.full_like(d, np.nan), i), "NaN"),
}


@pytest.mark.parametrize("bad", sorted(BAD))
def test_http_bad_inputs_are_400_and_the_gateway_serves_on(http, offline, bad):
    make, says = BAD[bad]
    dense, ids = rec_request(np.random.default_rng(3), 1, 4)
    with pytest.raises(InferenceServerException) as exc:
        http.infer("rec", make(dense, ids))
    assert exc.value.status() == "400" and re.search(says, exc.value.message()), exc.value.message()
    check_rec(http.infer("rec", rec_inputs(httpclient, dense, ids)), expect_rec(offline[1], dense, ids))


def test_grpc_several_inputs_and_outputs_and_bytes(grpc, offline):
    rng = np.random.default_rng(4)
    with ThreadPoolExecutor(4) as pool:
        requests = [rec_request(rng, 2, int(n)) for n in rng.integers(1, 41, 8)]
        results = list(pool.map(lambda r: grpc.infer("rec", rec_inputs(grpcclient, *r)), requests))
    for (dense, ids), result in zip(requests, results):
        check_rec(result, expect_rec(offline[1], dense, ids))
    text = np.array([[b"grpc"], [b"\xffraw"]], dtype=object)  # [rows, 1]: Triton's reshape of a scalar per row
    inp = grpcclient.InferInput("text", [2, 1], "BYTES")
    inp.set_data_from_numpy(text)
    result = grpc.infer("shout", [inp], outputs=[grpcclient.InferRequestedOutput("upper")])
    assert result.as_numpy("upper").tolist() == [b"GRPC!", b"\xffRAW!"] and result.as_numpy("length") is None


def test_grpc_metadata_config_and_errors(grpc, offline):
    meta = grpc.get_model_metadata("rec", as_json=True)
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]] == [
        ("dense", "FP32", [-1, 13]), ("ids", "INT64", [-1, -1])]
    config = grpc.get_model_config("shout", as_json=True)["config"]
    assert config["input"][0]["data_type"] == "TYPE_STRING" and int(config["max_batch_size"]) > 0
    dense, ids = rec_request(np.random.default_rng(5), 1, 3)
    bad = grpcclient.InferInput("ids", [1, 3], "INT32")
    bad.set_data_from_numpy(ids.astype(np.int32))
    with pytest.raises(InferenceServerException) as exc:
        grpc.infer("rec", [rec_inputs(grpcclient, dense, ids)[0], bad])
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT" and "takes INT64" in exc.value.message()
    check_rec(grpc.infer("rec", rec_inputs(grpcclient, dense, ids)), expect_rec(offline[1], dense, ids))


def test_keel_predict_with_named_inputs(cluster, offline, capsys):
    spec_file = str(cluster[0])
    dense, ids = rec_request(np.random.default_rng(6), 1, 5)
    capsys.readouterr()
    assert keel(["predict", "--spec", spec_file, "rec", "--input", f"dense={orjson.dumps(dense[0].tolist()).decode()}",
                 "--input", f"ids={orjson.dumps(ids[0].tolist()).decode()}", "--timeout-ms", str(PATIENT_MS)]) == 0
    out = orjson.loads(capsys.readouterr().out)
    want = expect_rec(offline[1], dense, ids)
    np.testing.assert_allclose(np.ravel(out["outputs"]["score"]), want["score"].ravel(), rtol=1e-5)
    assert np.ravel(out["outputs"]["ids_sum"]).tolist() == want["ids_sum"].tolist()
    assert keel(["predict", "--spec", spec_file, "shout", "--input", 'text="keel"', "--timeout-ms", str(PATIENT_MS)]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["outputs"]["upper"] in ("KEEL!", ["KEEL!"]) and np.ravel(out["outputs"]["length"]).tolist() == [4]
    assert keel(["predict", "--spec", spec_file, "rec", "--input", "dense=[1]"]) == 1
    assert "missing input(s) 'ids'" in capsys.readouterr().err  # said before anything is sent
