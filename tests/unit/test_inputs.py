"""The one set of input rules (common.inputs) the client and the gateways share."""
from __future__ import annotations

import numpy as np
import pytest

from keel.common.inputs import InputError, cast, coerce, from_values, validate


@pytest.mark.parametrize("x, dtype", [
    (np.arange(4, dtype=np.float64), "float32"),  # narrower float
    ([1, 2, 3], "float32"),  # python ints
    (np.array([True, False]), "float32"),  # bools are numbers
    (np.arange(4, dtype=np.int64), "int32"),  # ints that fit
    (np.arange(4, dtype=np.int8), "int64"),  # wider int
])
def test_safe_conversions_are_made(x, dtype):
    out = coerce(x, dtype)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, np.asarray(x).astype(dtype))


@pytest.mark.parametrize("x, dtype, says", [
    (np.ones(3), "int32", "takes int32 input; float64 cannot be converted"),  # floats never become ints
    (np.ones(3), "bool", "takes bool input; float64 cannot be converted"),
    (np.array([1, 2, 300], np.uint16), "uint8", "values 1..300 do not fit UINT8 (0..255)"),  # never wrapped
    (np.array([1, -200]), "int8", "values -200..1 do not fit INT8"),
    (np.array([1]), "uint16", "takes uint16 input; int64 cannot be converted"),  # signed never becomes unsigned
])
def test_unsafe_conversions_are_refused_naming_the_dtype(x, dtype, says):
    with pytest.raises(InputError, match=says.replace("(", r"\(").replace(")", r"\)")):
        coerce(x, dtype)


def test_cast_keeps_the_same_dtype_and_refuses_what_does_not_fit():
    x = np.arange(3, dtype=np.int32)
    assert cast(x, "int32") is x
    with pytest.raises(InputError, match="do not fit INT8"):
        cast(np.array([1000]), "int8", "row")


@pytest.mark.parametrize("data, datatype, says", [
    ({"a": 1}, "FP32", "data must be a list"),
    (["1", "2"], "FP32", "must be numbers"),
    ([None], "FP32", "must be numbers"),
    ([0.5], "INT32", "must be integers"),
    ([1], "BOOL", "must be true/false"),
    ([[1, 2], [3]], "FP32", "not a tensor of FP32"),  # ragged
])
def test_values_of_the_wrong_kind_are_refused(data, datatype, says):
    with pytest.raises(InputError, match=says):
        from_values(data, datatype, "input 'x'")


def test_values_become_the_datatype():
    assert from_values([[1, 2], [3, 4]], "FP32").dtype == np.float32
    assert from_values([True, False], "BOOL").dtype == np.bool_
    assert from_values([1, 2], "INT8").tolist() == [1, 2]


def test_validate_checks_shape_rows_and_values():
    assert validate([1, 2, 3, 4], [4], "float32").shape == (4,)
    assert validate(np.zeros((3, 2, 2)), [2, 2], "float32", rows=True).dtype == np.float32
    assert validate(np.zeros((0, 4)), [4], "float32", rows=True).shape == (0, 4)
    with pytest.raises(InputError, match=r"shape \[3\] is not \[4\]"):
        validate([1, 2, 3], [4], "float32", what="model m")
    with pytest.raises(InputError, match=r"shape \[2, 3\] is not \[-1, 4\]"):
        validate(np.zeros((2, 3)), [4], "float32", rows=True)
    with pytest.raises(InputError, match=r"shape \[\] is not \[-1, 4\]"):
        validate(np.float32(1.0), [4], "float32", rows=True)
    with pytest.raises(InputError, match="NaN or infinity"):
        validate([1.0, np.nan], [2], "float32")
    with pytest.raises(InputError, match="NaN or infinity"):
        validate([1e300, 0.0], [2], "float32")  # finite as float64, infinite as the model's float32
    assert validate([1, 2], None, None).tolist() == [1, 2]  # nothing known: nothing checked


def test_the_rules_of_a_call_beside_its_input():
    from keel.common.inputs import call_error
    from keel.common.targets import describe

    assert call_error("m", "model", version="2", timeout_ms=100) is None
    assert "takes no key" in call_error("m", "model", key="alice")
    assert "has no versions" in call_error("app", "application", key="alice", version="1")
    assert "has no versions" in call_error("g", "graph", version="1")
    assert "non-empty string" in call_error("g", "graph", key="")
    assert "non-empty string" in call_error("g", "graph", key="k" * 201)
    assert "more than a day" in call_error("m", "model", timeout_ms=1e30)
    for bad in (float("nan"), -1, True, "100"):
        assert "must be a number" in call_error("m", "model", timeout_ms=bad)
    assert call_error("m", "model", timeout_ms=0) is None  # the target's own deadline

    class Info:
        input_shape, input_dtype, output_size = (4,), "float32", 2

    assert describe("graph", Info, None, mode="nspb") == {
        "kind": "graph", "input_shape": [4], "input_dtype": "float32", "output_size": 2, "version": None, "key": True,
        "mode": "nspb", "signature": {"inputs": [{"name": "input", "dtype": "float32", "shape": [4]}],
                                      "outputs": [{"name": "output", "dtype": "float32", "shape": [2]}]}}
