"""The OIP v2 conversions (services.oip.tensors, services.oip.rest): every datatype through
JSON, binary buffers and gRPC contents, BYTES as Triton lays it out, the checks against a
signature, and the metadata and model configuration built from one."""
from __future__ import annotations

import struct
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from keel.common.inputs import InputError
from keel.common.signature import Signature, TensorSpec, parse_input
from keel.services.oip import rest, tensors

tritonutils = pytest.importorskip("tritonclient.utils")  # only its helpers: no protobuf package loaded

NUMERIC = {"BOOL": np.array([[True, False, True]]), "UINT8": np.array([[0, 7, 255]], np.uint8),
           "INT8": np.array([[-128, 0, 127]], np.int8), "INT16": np.array([[-5, 0, 300]], np.int16),
           "INT32": np.array([[-70000, 1, 2]], np.int32), "INT64": np.array([[-(2 ** 40), 3, 2 ** 40]], np.int64),
           "FP16": np.array([[0.5, -1.25, 3.0]], np.float16),
           "BF16": np.array([[0.5, -1.25, 3.0]], ml_dtypes.bfloat16),
           "FP32": np.array([[0.1, -2.5, 1e6]], np.float32), "FP64": np.array([[0.1, -2.5, 1e300]], np.float64)}
TEXT = np.array([[b"hello", b"", "caf\u00e9".encode()]], dtype=object)


def recommender() -> Signature:
    return Signature((parse_input("dense:float32:13"), parse_input("ids:int64:1..40"), parse_input("text:bytes:scalar")),
                     (TensorSpec("p", "float32", (1,)), TensorSpec("label", "bytes", ())))


@pytest.mark.parametrize("datatype", sorted(NUMERIC))
def test_every_numeric_datatype_round_trips_raw_json_and_contents(datatype):
    x = NUMERIC[datatype]
    assert tensors.datatype_of(x) == datatype
    raw = tensors.to_raw(x)
    assert raw == x.tobytes()  # little-endian values, as tritonclient's tobytes()
    got = tensors.from_raw(raw, datatype, [1, 3], "t")
    assert got.dtype == x.dtype and np.array_equal(got, x)
    got = tensors.from_json(tensors.to_json(x, "t"), datatype, [1, 3], "t")
    assert got.dtype == x.dtype and np.array_equal(got.astype(np.float64), x.astype(np.float64))
    if datatype in tensors.CONTENTS_OF:
        field, _ = tensors.CONTENTS_OF[datatype]
        contents = SimpleNamespace(**{field: []})
        tensors.fill_contents(contents, x)
        got = tensors.from_contents(contents, datatype, [1, 3], "t")
        assert got.dtype == x.dtype and np.array_equal(got, x)
    else:  # FP16 and BF16 have no typed field
        with pytest.raises(InputError, match="only in raw"):
            tensors.from_contents(SimpleNamespace(), datatype, [1, 3], "t")


def test_bytes_are_length_prefixed_as_tritonclient_serializes_them():
    raw = tensors.encode_bytes(TEXT)
    assert raw == tritonutils.serialize_byte_tensor(TEXT).item()
    assert raw[:9] == struct.pack("<I", 5) + b"hello"
    got = tensors.from_raw(raw, "BYTES", [1, 3], "t")
    assert got.dtype == object and got.shape == (1, 3) and got.tolist() == TEXT.tolist()
    assert tritonutils.deserialize_bytes_tensor(tensors.to_raw(got)).tolist() == TEXT.reshape(-1).tolist()
    contents = SimpleNamespace(bytes_contents=[])
    tensors.fill_contents(contents, TEXT)
    assert contents.bytes_contents == list(TEXT.reshape(-1))
    assert tensors.from_contents(contents, "BYTES", [3], "t").tolist() == list(TEXT.reshape(-1))


@pytest.mark.parametrize("raw, why", [(b"\x05\x00\x00", "ends before element 0"),
                                      (struct.pack("<I", 9) + b"abc", "says 9 bytes"),
                                      (tensors.encode_bytes(np.array([b"a", b"b", b"c"], object)), "bytes left")])
def test_malformed_bytes_buffers_are_refused(raw, why):
    with pytest.raises(InputError, match=why):
        tensors.decode_bytes(raw, 2, "input 'text'")


def test_bytes_in_json_are_strings_both_ways():
    x = tensors.from_json([["hi", "caf\u00e9"]], "BYTES", [1, 2], "t")
    assert x.tolist() == [[b"hi", "caf\u00e9".encode()]]
    assert tensors.to_json(x, "t") == ["hi", "caf\u00e9"]
    with pytest.raises(InputError, match="must be strings"):
        tensors.from_json([1, 2], "BYTES", [2], "t")
    with pytest.raises(InputError, match="not UTF-8.*binary"):
        tensors.to_json(np.array([b"\xff"], object), "label")


@pytest.mark.parametrize("data, datatype, shape, why", [
    ([1.5, 2.0], "INT64", [2], "must be integers"), ([300], "UINT8", [1], "do not fit"),
    ([1, 2, 3], "FP32", [2, 2], "3 values do not fill"), ("abc", "FP32", [3], "must be a list"),
    ([1, 0], "BOOL", [2], "true/false")])
def test_json_data_that_is_not_the_datatype_is_refused(data, datatype, shape, why):
    with pytest.raises(InputError, match=why):
        tensors.from_json(data, datatype, shape, "t")


def test_raw_of_the_wrong_size_is_refused():
    with pytest.raises(InputError, match="7 bytes do not hold shape"):
        tensors.from_raw(b"\0" * 7, "INT64", [1], "t")


def _good(rows: int = 2, n: int = 3) -> dict:
    return {"dense": ("FP32", np.zeros((rows, 13), np.float32)), "ids": ("INT64", np.ones((rows, n), np.int64)),
            "text": ("BYTES", np.array([b"x"] * rows, object))}


def test_check_inputs_takes_a_good_request_in_signature_order():
    out = tensors.check_inputs(recommender(), dict(reversed(list(_good().items()))))
    assert list(out) == ["dense", "ids", "text"] and out["ids"].shape == (2, 3)
    scalar_as_column = {**_good(), "text": ("BYTES", np.array([[b"x"], [b"y"]], object))}  # Triton's reshape [1] -> []
    assert tensors.check_inputs(recommender(), scalar_as_column)["text"].shape == (2,)


@pytest.mark.parametrize("change, why", [
    (lambda r: r.pop("ids"), "missing input.*'ids'"),
    (lambda r: r.update(extra=("FP32", np.zeros((2, 1), np.float32))), "unknown input.*'extra'"),
    (lambda r: r.update(ids=("INT32", np.ones((2, 3), np.int32))), "datatype INT32, but the model takes INT64"),
    (lambda r: r.update(ids=("INT64", np.ones((2, 41), np.int64))), "dim 0 is 41, over its bound 40"),
    (lambda r: r.update(dense=("FP32", np.zeros((2, 12), np.float32))), "shape"),
    (lambda r: r.update(dense=("FP32", np.full((2, 13), np.nan, np.float32))), "NaN"),
    (lambda r: r.update(ids=("INT64", np.ones((3, 3), np.int64))), "different numbers of rows"),
])
def test_check_inputs_refuses_each_bad_request_with_one_message(change, why):
    request = _good()
    change(request)
    with pytest.raises(InputError, match=why):
        tensors.check_inputs(recommender(), request)


def test_requested_outputs_and_stacking_rows():
    sig = recommender()
    assert tensors.requested(sig, None) is None
    assert tensors.requested(sig, ["label", "label"]) == ["label"]
    with pytest.raises(InputError, match="unknown output.*'box'.*answers p, label"):
        tensors.requested(sig, ["box"])
    rows = [{"p": np.array([0.25], np.float32), "label": np.array(b"a", object)},
            {"p": np.array([0.75], np.float32), "label": np.array(b"b", object)}]
    out = tensors.stack_rows(rows, None)
    assert out["p"].shape == (2, 1) and out["label"].tolist() == [b"a", b"b"]
    assert list(tensors.stack_rows(rows, ["label"])) == ["label"]
    with pytest.raises(ValueError, match="different shapes"):
        tensors.stack_rows([{"p": np.zeros(1)}, {"p": np.zeros(2)}], None)


def test_signature_of_a_target_with_and_without_one():
    old = {"kind": "model", "input_shape": [4], "input_dtype": "float32", "output_size": 3}
    sig = tensors.signature_of(old)
    assert tensors.is_single(sig) and [s.name for s in sig.outputs] == ["output"]
    new = {**old, "signature": recommender().to_dict()}
    assert not tensors.is_single(tensors.signature_of(new))
    two_outputs = Signature.single([4], "float32", 3)
    two_outputs = Signature(two_outputs.inputs, (TensorSpec("logits", "float32", (10,)), TensorSpec("box", "float32", (4,))))
    assert not tensors.is_single(two_outputs)  # one input, but its outputs are named: the named path


def test_metadata_and_model_config_name_every_tensor_with_variable_dims():
    target = {"kind": "model", "versions": ["2"], "key": False}
    meta = tensors.metadata("rec", target, recommender())
    assert meta["inputs"] == [{"name": "dense", "datatype": "FP32", "shape": [-1, 13]},
                              {"name": "ids", "datatype": "INT64", "shape": [-1, -1]},
                              {"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"][1] == {"name": "label", "datatype": "BYTES", "shape": [-1]}
    config = tensors.model_config("rec", recommender())
    assert config["max_batch_size"] == tensors.MAX_BATCH_SIZE and config["platform"] == "keel"
    assert config["input"][1] == {"name": "ids", "data_type": "TYPE_INT64", "dims": [-1]}
    assert config["input"][2] == {"name": "text", "data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}}
    assert [o["name"] for o in config["output"]] == ["p", "label"]


def test_a_mask_input_is_hidden_from_clients():
    sig = Signature((parse_input("ids:int64:1..8"), parse_input("m:bool:mask=ids")), (TensorSpec("y", "float32", (1,)),))
    assert [t["name"] for t in tensors.metadata("m", {}, sig)["inputs"]] == ["ids"]
    with pytest.raises(InputError, match="a mask the batcher fills"):
        tensors.check_inputs(sig, {"ids": ("INT64", np.ones((1, 2), np.int64)), "m": ("BOOL", np.ones((1, 2), bool))})


# ---------------------------------------------------------------------- HTTP bodies (oip.rest)

def test_rest_reads_json_and_binary_inputs_in_order():
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    text = np.array([b"a", b"bc"], object)
    binary = ids.tobytes() + tensors.encode_bytes(text)
    header = {"inputs": [{"name": "dense", "datatype": "FP32", "shape": [2, 1], "data": [[1.0], [2.0]]},
                         {"name": "ids", "datatype": "INT64", "shape": [2, 3], "parameters": {"binary_data_size": 48}},
                         {"name": "text", "datatype": "BYTES", "shape": [2],
                          "parameters": {"binary_data_size": len(binary) - 48}}]}
    got = rest.read_inputs(header, binary)
    assert got["dense"][1].tolist() == [[1.0], [2.0]] and np.array_equal(got["ids"][1], ids)
    assert got["text"] == ("BYTES", got["text"][1]) and got["text"][1].tolist() == [b"a", b"bc"]


@pytest.mark.parametrize("header, binary, why", [
    ({"inputs": []}, b"", "non-empty list"),
    ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}] * 2}, b"", "given twice"),
    ({"inputs": [{"name": "a", "datatype": "FP99", "shape": [1], "data": [1]}]}, b"", "datatype 'FP99'"),
    ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [-1], "data": [1]}]}, b"", "sizes >= 0"),
    ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1]}]}, b"", "neither data nor binary_data_size"),
    ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 8}}]},
     b"\0" * 4, "4 binary bytes are left"),
    ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}]}, b"\0", "no input's binary_data_size"),
])
def test_rest_refuses_malformed_inputs(header, binary, why):
    with pytest.raises(InputError, match=why):
        rest.read_inputs(header, binary)


def test_rest_outputs_asked_for_by_name_as_json_or_binary():
    assert rest.read_outputs({}) == (None, {"": False})
    assert rest.read_outputs({"parameters": {"binary_data_output": True}}) == (None, {"": True})
    names, binary = rest.read_outputs({"parameters": {"binary_data_output": True},
                                       "outputs": [{"name": "p", "parameters": {"binary_data": False}}, {"name": "label"}]})
    assert names == ["p", "label"] and binary == {"p": False, "label": True}
    outs = {"p": np.array([[0.5]], np.float32), "label": np.array([b"yes"], object)}
    described, raw = rest.write_outputs(outs, binary)
    assert described[0] == {"name": "p", "datatype": "FP32", "shape": [1, 1], "data": [0.5]}
    assert described[1] == {"name": "label", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 7}}
    assert raw == struct.pack("<I", 3) + b"yes"
    with pytest.raises(InputError, match="with a name"):
        rest.read_outputs({"outputs": [{"parameters": {}}]})
