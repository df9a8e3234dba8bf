"""``keel predict --input NAME=JSON`` (deploy.predict): named inputs read and checked against
the target's signature, the single-input form as before, every named output printed."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from keel.common.signature import Signature, TensorSpec, parse_input
from keel.common.spec import SpecError
from keel.deploy.cli import _input
from keel.deploy.keel import build_parser
from keel.deploy.predict import answer, inputs_of

SIG = Signature((parse_input("dense:float32:3"), parse_input("ids:int64:1..40"), parse_input("text:bytes:scalar")),
                (TensorSpec("p", "float32", (1,)), TensorSpec("label", "bytes", ())))
REC = {"kind": "model", "input_shape": [3], "input_dtype": "float32", "output_size": 0, "key": False,
       "signature": SIG.to_dict()}
TEXT = {**REC, "signature": Signature((parse_input("text:bytes:scalar"),), SIG.outputs).to_dict()}
OLD = {"kind": "model", "input_shape": [2, 2], "input_dtype": "float32", "output_size": 2, "key": False}


def test_named_inputs_are_parsed_shaped_and_checked():
    x = inputs_of(["dense=[1, 2, 3]", "ids=[5, 6, 7, 8]", 'text="caf\u00e9"'], REC, _input)
    assert list(x) == ["dense", "ids", "text"]
    assert x["dense"].dtype == np.float32 and x["ids"].dtype == np.int64 and x["ids"].shape == (4,)
    assert x["text"].dtype == object and x["text"].item() == "caf\u00e9".encode()


@pytest.mark.parametrize("values, why", [
    (["dense=[1, 2, 3]", 'text="a"'], "missing input.*'ids'"),
    (["dense=[1, 2, 3]", "ids=[1]", 'text="a"', "box=[1]"], "unknown input.*'box'"),
    (["dense=[1, 2, 3]", "ids=[1.5]", 'text="a"'], "int64"),
    (["dense=[1, 2, 3]", "ids=[" + ", ".join(["1"] * 41) + "]", 'text="a"'], "over its bound 40"),
    (["dense=[1, 2, 3]", "dense=[1, 2, 3]"], "given twice"),
    (["[1, 2, 3]"], "name each input"),
    (["dense=[1, 2"], "neither a .npy file nor JSON"),
])
def test_bad_named_inputs_are_said_before_sending(values, why):
    with pytest.raises(SpecError, match=why):
        inputs_of(values, REC, _input)


def test_one_bare_input_to_a_single_input_target_is_the_old_form():
    x = inputs_of(["[1, 2, 3, 4]"], OLD, _input)
    assert isinstance(x, np.ndarray) and x.shape == (2, 2) and x.dtype == np.float32
    assert isinstance(inputs_of(["input=[1, 2, 3, 4]"], OLD, _input), np.ndarray)  # named, still one tensor
    text = inputs_of(['"a fine film"'], TEXT, _input)  # one input, not the old kind: named by the signature
    assert list(text) == ["text"] and text["text"].item() == b"a fine film"


def test_the_answer_prints_every_named_output():
    result = SimpleNamespace(request_id="r", source="model", model="rec", version="1", latency_ms=1.0, error=None,
                             error_code=None, models=None, confidence=None, output=None,
                             outputs={"p": np.array([0.25], np.float32), "label": np.array(b"yes", object)})
    printed = answer(result)
    assert printed["outputs"] == {"p": [0.25], "label": "yes"} and printed["output"] is None


def test_input_is_repeatable_on_the_command_line():
    args = build_parser().parse_args(["predict", "rec", "--spec", "s.toml", "--input", "dense=[1]", "--input", "ids=[2]"])
    assert args.input == ["dense=[1]", "ids=[2]"]
