"""A model's signature (``common.signature``): ``NAME:DTYPE:SHAPE`` parsing, bounds, the
manifest's JSON, the one-input shorthand, and validation of named inputs against it (one
clear error for each kind of bad input)."""
from __future__ import annotations

import numpy as np
import orjson
import pytest

from keel.common.inputs import InputError
from keel.common.signature import (DTYPES, PAYLOAD_BYTES, VARIABLE, Signature, SignatureError, TensorSpec,
                                   as_bytes, default_bound, parse_input, validate)


def rec() -> Signature:
    return Signature((parse_input("dense:float32:13"), parse_input("ids:int64:1..40"),
                      parse_input("ids_mask:bool:mask=ids"), parse_input("text:bytes:scalar")),
                     (TensorSpec("p", "float32", (1,)), TensorSpec("per_id", "float32", (-1, 2), follows=(("ids", 0), None))))


@pytest.mark.parametrize("text, shape, lo, hi", [
    ("dense:float32:13", (13,), (13,), (13,)),
    ("img:uint8:3,32,32", (3, 32, 32), (3, 32, 32), (3, 32, 32)),
    ("img:uint8:3x32x32", (3, 32, 32), (3, 32, 32), (3, 32, 32)),
    ("ids:int64:1..40", (-1,), (1,), (40,)),
    ("ids:int64:..40", (-1,), (0,), (40,)),
    ("seq:float16:-1,8", (-1, 8), (0, 8), (PAYLOAD_BYTES // (2 * 8), 8)),
    ("text:bytes:scalar", (), (), ()),
    ("h:bfloat16:2..4,3..5", (-1, -1), (2, 3), (4, 5)),
])
def test_parse_input(text, shape, lo, hi):
    spec = parse_input(text)
    assert (spec.shape, spec.min_shape, spec.max_shape) == (shape, lo, hi)
    assert parse_input(spec.text()) == spec  # what show prints reads back


@pytest.mark.parametrize("text, why", [
    ("ids:int64", "NAME:DTYPE:SHAPE"),
    ("ids:int65:4", "not one of"),
    ("ids:int64:-1..40", "not a dim"),
    ("ids:int64:0", "not a dim"),
    ("ids:int64:40..1", "not a dim"),
    ("ids:int64:", "empty"),
    ("a b:int64:4", "tensor name"),
    ("m:bytes:mask=ids", "not bytes"),
])
def test_parse_refuses_with_a_reason(text, why):
    with pytest.raises(SignatureError, match=why):
        parse_input(text)


def test_default_bound_comes_from_the_payload_limit():
    assert default_bound("int64", [-1]) == PAYLOAD_BYTES // 8
    assert default_bound("float32", [-1, 13]) == PAYLOAD_BYTES // (4 * 13)
    assert default_bound("uint8", [-1, -1]) == int((PAYLOAD_BYTES) ** 0.5)  # two variable dims share it
    assert default_bound("int64", [-1], payload_bytes=800) == 100          # overridable
    assert parse_input("ids:int64:-1", payload_bytes=800).max_shape == (100,)


def test_signature_rules():
    with pytest.raises(SignatureError, match="given twice"):
        Signature((parse_input("a:int64:4"), parse_input("a:int64:4")))
    with pytest.raises(SignatureError, match="not an input"):
        Signature((parse_input("a:int64:4"), parse_input("m:bool:mask=b")))
    with pytest.raises(SignatureError, match="no variable dim"):
        Signature((parse_input("a:int64:4"), parse_input("m:bool:mask=a")))
    with pytest.raises(SignatureError, match="at least one input"):
        Signature(())
    sig = rec()
    assert sig.input("ids_mask").shape == (VARIABLE,) and sig.input("ids_mask").max_shape == (40,)
    assert [s.name for s in sig.client_inputs] == ["dense", "ids", "text"] and sig.masks == {"ids": "ids_mask"}
    assert sig.variable and not sig.is_single


def test_json_round_trip_through_the_manifest():
    sig = rec()
    raw = orjson.dumps(sig.to_dict())
    assert Signature.from_dict(orjson.loads(raw)) == sig
    with pytest.raises(SignatureError):
        Signature.from_dict({"inputs": [{"name": "x"}]})
    with pytest.raises(SignatureError):
        Signature.from_dict(["x"])


def test_single_input_shorthand_and_its_legacy_fields():
    sig = Signature.single([3, 32, 32], "float32", 10)
    assert sig.is_single and sig.inputs[0].name == "input" and sig.outputs[0] == TensorSpec("output", "float32", (10,))
    assert sig.legacy_fields() == {"input_shape": [3, 32, 32], "input_dtype": "float32", "output_size": 10}
    assert rec().legacy_fields()["output_size"] == 0  # no single size serves several inputs
    assert "ids" in rec().describe() and "1..40" in rec().describe() and "mask of ids" in rec().describe()
    assert set(DTYPES) >= {"bool", "bfloat16", "bytes", "float64", "int16"}


def request(**over):
    r = {"dense": np.zeros(13, np.float32), "ids": np.arange(5), "text": b"hello"}
    r.update(over)
    return {k: v for k, v in r.items() if v is not None}


def test_validate_takes_a_good_request_and_converts_safely():
    out = validate(rec(), request(dense=[1] * 13, ids=np.arange(3, dtype=np.int32), text="héllo"))
    assert list(out) == ["dense", "ids", "text"]
    assert out["dense"].dtype == np.float32 and out["ids"].dtype == np.int64
    assert out["text"].dtype == object and out["text"].item() == "héllo".encode()
    one = Signature.single([4])
    assert validate(one, np.ones(4))["input"].shape == (4,)  # a bare array for one input


@pytest.mark.parametrize("over, why", [
    ({"ids": None}, r"missing input\(s\) 'ids'"),
    ({"extra": np.zeros(2)}, r"unknown input\(s\) 'extra'"),
    ({"ids_mask": np.ones(5, bool)}, "a mask the batcher fills"),
    ({"ids": np.arange(5, dtype=np.float64)}, "input 'ids' takes int64"),
    ({"ids": np.array([b"a", b"b"])}, "input 'ids' takes int64; got bytes"),
    ({"text": np.float32(3)}, "input 'text' takes bytes"),
    ({"ids": np.arange(41)}, "dim 0 is 41, over its bound 40"),
    ({"ids": np.arange(0)}, "dim 0 is 0, under its minimum 1"),
    ({"ids": np.zeros((2, 3), np.int64)}, "has 2 dim"),
    ({"dense": np.zeros(12, np.float32)}, r"shape \[12\] is not \[13\]"),
    ({"dense": np.full(13, np.nan, np.float32)}, "input 'dense' contains NaN"),
    ({"ids": [[1], [1, 2]]}, "input 'ids'"),
])
def test_validate_refuses_each_bad_input_with_one_clear_error(over, why):
    with pytest.raises(InputError, match=why):
        validate(rec(), request(**over))


def test_validate_rows_and_bfloat16():
    sig = Signature((parse_input("x:bfloat16:2..4"),))
    out = validate(sig, {"x": np.ones((3, 2), np.float32)}, rows=True)
    assert out["x"].dtype.name == "bfloat16" and out["x"].shape == (3, 2)
    with pytest.raises(InputError, match="NaN"):
        validate(sig, {"x": np.array([[np.nan, 1.0]], np.float32)}, rows=True)
    two = Signature((parse_input("a:int64:2"), parse_input("b:int64:2")))
    with pytest.raises(InputError, match="different numbers of rows"):
        validate(two, {"a": np.zeros((2, 2), np.int64), "b": np.zeros((3, 2), np.int64)}, rows=True)
    with pytest.raises(InputError, match="send a dict"):
        validate(two, np.zeros(2))


def test_as_bytes_normalises_strings_and_refuses_others():
    assert as_bytes(np.array([b"ab", b"c"]), "x").tolist() == [b"ab", b"c"]
    assert as_bytes(["é", b"\x00"], "x").tolist() == ["é".encode(), b"\x00"]
    with pytest.raises(InputError, match="element 1 is int"):
        as_bytes([b"a", 3], "x")
