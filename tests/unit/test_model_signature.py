"""Signatures in the store: ``keel model add --input`` for TorchScript and Python classes,
read from a ``.pt2``, outputs named by the check batches, printed by ``keel model show``;
and a version written before signatures keeps working (its signature derived)."""
from __future__ import annotations

import textwrap

import numpy as np
import orjson
import pytest
import torch

from keel.common.containers import store_predictor
from keel.common.modelstore import ModelStore
from keel.common.named_containers import call, check_batch, named_outputs
from keel.common.signature import Signature, TensorSpec
from keel.deploy.keel import main as keel
from keel.deploy.model_cli import ModelAddError, add_model


class Bag(torch.nn.Module):
    """dense float32[3] + a bag of ids (masked) -> a dict: score [1], and per-id echo [-1]."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 3)

    def forward(self, dense, ids, mask):
        m = mask.unsqueeze(-1).float()
        bag = (self.emb(ids) * m).sum(1) / m.sum(1).clamp(min=1.0)
        return {"score": (dense * bag).sum(1, keepdim=True), "echo": ids * 2}


class Pair(torch.nn.Module):
    def forward(self, a, b):
        return a + 1, (a * b).sum(1)


TEXT = textwrap.dedent('''
    import numpy as np

    class Words:
        """Counts each text's words; answers a label string and a score."""

        def predict_batch(self, inputs):
            counts = [len(t.split()) for t in inputs["text"]]
            return {"label": ["long" if c > 2 else "short" for c in counts],
                    "score": np.array(counts, np.float32)[:, None]}
''')

BAG_INPUTS = ["dense:float32:3", "ids:int64:1..40", "mask:bool:mask=ids"]


@pytest.fixture
def files(tmp_path):
    torch.manual_seed(0)
    bag = tmp_path / "bag.pt"
    torch.jit.save(torch.jit.script(Bag()), bag)
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length", min=1, max=40)
    program = tmp_path / "bag.pt2"
    torch.export.save(torch.export.export(Bag(), (torch.zeros(2, 3), torch.zeros(2, 4, dtype=torch.int64),
                                                  torch.ones(2, 4, dtype=torch.bool)),
                                          dynamic_shapes=({0: batch}, {0: batch, 1: length}, {0: batch, 1: length})),
                      program)
    pair = tmp_path / "pair.pt"
    torch.jit.save(torch.jit.script(Pair()), pair)
    (tmp_path / "words.py").write_text(TEXT)
    return {"bag": bag, "program": program, "pair": pair, "words": tmp_path / "words.py"}


def test_torchscript_with_named_inputs_and_dict_outputs(tmp_path, files, capsys):
    store = str(tmp_path / "store")
    argv = ["model", "add", "bag", str(files["bag"]), "--store", store]
    assert keel(argv + sum((["--input", t] for t in BAG_INPUTS), [])) == 0
    said = capsys.readouterr().out
    assert "added bag version 1" in said and "mask of ids" in said
    sig = ModelStore(store).manifest("bag").signature_of()
    assert [s.name for s in sig.inputs] == ["dense", "ids", "mask"]
    assert sig.input("ids").max_shape == (40,) and sig.input("mask").mask_for == "ids"
    # outputs from the check batches: names from the dict, echo's dim follows the ids' length
    assert sig.outputs == (TensorSpec("score", "float32", (1,)), TensorSpec("echo", "int64", (-1,), follows=(("ids", 0),)))
    # served positionally in signature order: the same answer as the module run here
    pred = store_predictor(store, "bag", None)
    ids = np.array([[1, 2, 3, 0], [4, 5, 0, 0]])
    batch = {"dense": np.ones((2, 3), np.float32), "ids": ids, "mask": ids > 0}
    out = call(pred, sig, batch)
    want = Bag()
    want.load_state_dict(torch.jit.load(str(files["bag"])).state_dict())
    ref = want(*(torch.from_numpy(batch[k]) for k in ("dense", "ids", "mask")))
    np.testing.assert_allclose(out["score"], ref["score"].detach().numpy(), rtol=1e-6)
    np.testing.assert_array_equal(out["echo"], ids * 2)


def test_a_tuple_names_its_outputs_output0_and_a_pt2_gives_its_signature(tmp_path, files):
    store = str(tmp_path / "store")
    m = add_model(store, "pair", str(files["pair"]), inputs=["a:float32:2", "b:float32:2"])
    assert [o.name for o in m.signature_of().outputs] == ["output0", "output1"]
    assert m.signature_of().outputs[1].shape == ()
    exported = add_model(store, "bag2", str(files["program"]))  # names, dtypes and the dim's range from the program
    sig = exported.signature_of()
    assert [(s.name, s.dtype, s.shape) for s in sig.inputs] == [("dense", "float32", (3,)), ("ids", "int64", (-1,)),
                                                                 ("mask", "bool", (-1,))]
    assert sig.input("ids").min_shape == (1,) and sig.input("ids").max_shape == (40,)
    assert sig.output("echo").follows == (("ids", 0),)  # ids and mask share a length: stretched together
    # --input for a .pt2 declares the mask (and may bound); names must agree with the program
    declared = add_model(store, "bag3", str(files["program"]), inputs=BAG_INPUTS).signature_of()
    assert declared.input("mask").mask_for == "ids"
    with pytest.raises(ModelAddError, match="takes"):
        add_model(store, "bag4", str(files["program"]), inputs=["x:float32:3", "ids:int64:1..40", "m:bool:mask=ids"])
    out = call(store_predictor(store, "bag2", None), sig, check_batch(sig, 3, stretch=5))
    assert out["echo"].shape == (3, 6)


def test_python_class_takes_bytes_and_answers_bytes(tmp_path, files, capsys):
    store = str(tmp_path / "store")
    assert keel(["model", "add", "words", "--python", f"{files['words']}:Words", "--input", "text:bytes:scalar",
                 "--store", store]) == 0
    m = ModelStore(store).manifest("words")
    sig = m.signature_of()
    assert sig.outputs == (TensorSpec("label", "bytes", ()), TensorSpec("score", "float32", (1,)))
    out = call(store_predictor(store, "words", None), sig,
               {"text": np.array([b"a b c d", b"hi"], dtype=object)})
    assert out["label"].tolist() == [b"long", b"short"] and out["score"][:, 0].tolist() == [4.0, 1.0]
    capsys.readouterr()
    assert keel(["model", "show", "words", "--store", store]) == 0
    shown = capsys.readouterr().out
    assert "signature:" in shown and "text" in shown and "label" in shown and "bytes" in shown
    assert keel(["model", "list", "--store", store, "--json"]) == 0
    [row] = orjson.loads(capsys.readouterr().out)
    assert row["input"] == "text:bytes:scalar" and "label:bytes:scalar" in row["output"]


@pytest.mark.parametrize("extra, why", [
    (["--input", "text:bytes:scalar"], "takes tensors; a bytes input"),
    (["--input", "dense:float32:3", "--input-shape", "3"], "not both"),
    (["--input", "dense:float32:3", "--input", "ids:int64:-1..4"], "not a dim"),
    (["--input", "dense:float32:3"], "the check batch failed"),             # the model takes three inputs
    (["--input", "dense:float32:3", "--input", "ids:int64:1..40", "--input", "mask:bool:mask=ids",
      "--output-size", "2"], "--output-size is for the single-input shorthand"),
])
def test_add_refuses_a_bad_signature_in_one_line(tmp_path, files, capsys, extra, why):
    store = tmp_path / "store"
    assert keel(["model", "add", "bag", str(files["bag"]), "--store", str(store), *extra]) == 1
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err
    assert ModelStore(store).versions("bag") == []


def test_a_version_without_a_signature_keeps_working(tmp_path, files, capsys):
    store = ModelStore(tmp_path / "store")
    (tmp_path / "a").write_text("x")
    old = store.add("old", tmp_path / "a", "python", entry="numpy:ndarray", input_shape=[2, 3], output_size=4)
    assert old.signature is None  # written as before signatures
    assert old.signature_of() == Signature.single([2, 3], "float32", 4)
    # the shorthand writes the same signature into new versions
    (tmp_path / "sums.py").write_text("class Sums:\n    def predict_batch(self, x):\n"
                                      "        return x.reshape(len(x), -1).sum(1, keepdims=True)\n")
    new = add_model(str(store.root), "sums", None, python=f"{tmp_path / 'sums.py'}:Sums", input_shape=[2, 3])
    assert new.signature == Signature.single([2, 3], "float32", 1).to_dict() and new.signature_of().is_single
    assert keel(["model", "show", "old", "--store", str(store.root)]) == 0
    shown = capsys.readouterr().out
    assert "from input_shape, input_dtype, output_size" in shown and "input  " in shown


def test_named_outputs_rules():
    assert list(named_outputs(torch.zeros(2, 3))) == ["output"]
    assert list(named_outputs((torch.zeros(2), np.zeros(2)))) == ["output0", "output1"]
    assert named_outputs({"y": ["a", b"b"]})["y"].tolist() == [b"a", b"b"]
    bf = named_outputs(torch.ones(2, dtype=torch.bfloat16))["output"]
    assert bf.dtype.name == "bfloat16" and bf.astype(np.float32).tolist() == [1.0, 1.0]


def test_a_spec_serves_a_named_model_with_its_ragged_policy_and_refuses_parm_for_ids(tmp_path, files):
    from keel.common.spec import SpecError, load_spec

    store = str(tmp_path / "store")
    add_model(store, "pair", str(files["pair"]), inputs=["a:float32:2", "b:float32:2"])
    add_model(store, "bag", str(files["bag"]), inputs=BAG_INPUTS)
    spec = load_spec({"cluster": {"store": store}, "models": {"pair": {"workers": 1},
                                                              "bag": {"ragged": "bucket", "bucket_width": 4}}})
    bag = spec.models["bag"]
    assert [s["name"] for s in bag["signature"]["inputs"]] == ["dense", "ids", "mask"]
    assert (bag["ragged"], bag["bucket_width"]) == ("bucket", 4)
    assert spec.models["pair"]["ragged"] == "pad"  # the default for a named model
    with pytest.raises(SpecError, match="models.bag.ragged: must be"):
        load_spec({"cluster": {"store": store}, "models": {"bag": {"ragged": "sorted"}}})
    with pytest.raises(SpecError, match=r"models.bag.k: ParM cannot code this model: its input\(s\) ids \(int64\)"):
        load_spec({"cluster": {"store": store}, "models": {"bag": {"k": 2}}})
