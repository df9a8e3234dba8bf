"""Bringing your own model: TorchScript, torch.export and Python containers through
``keel model add`` (checked by one batch, written with manifest and sha256), list, show."""
from __future__ import annotations

import textwrap

import numpy as np
import orjson
import pytest
import torch

from keel.common.containers import PythonPredictor, TorchPredictor, check, store_predictor
from keel.common.modelstore import ModelStore, ModelStoreError, sha256_file
from keel.deploy.keel import main as keel
from keel.deploy.model_cli import ModelAddError, add_model


class Affine(torch.nn.Module):
    """A model Keel has never seen: y = x W + b, 4 -> 3."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        with torch.no_grad():
            self.lin.weight.copy_(torch.arange(12, dtype=torch.float32).reshape(3, 4) / 10)
            self.lin.bias.copy_(torch.tensor([1.0, -1.0, 0.5]))

    def forward(self, x):
        return self.lin(x)


def expected(x: np.ndarray) -> np.ndarray:
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    return x @ w.T + np.array([1.0, -1.0, 0.5], np.float32)


RULES = textwrap.dedent('''
    import numpy as np

    class Rules:
        """Doubles each query's sum, plus an offset read by load()."""
        offset = 0.0

        def load(self, path):
            with open(path) as f:
                self.offset = float(f.read())

        def predict_batch(self, inputs):
            s = inputs.reshape(len(inputs), -1).sum(axis=1, keepdims=True)
            return np.concatenate([2 * s, s + self.offset], axis=1)
''')


@pytest.fixture
def files(tmp_path):
    torch.manual_seed(0)
    script = tmp_path / "affine.pt"
    torch.jit.save(torch.jit.script(Affine()), script)
    dynamic = tmp_path / "affine-dyn.pt2"
    torch.export.save(torch.export.export(Affine(), (torch.zeros(2, 4),),
                                          dynamic_shapes=({0: torch.export.Dim("batch")},)), dynamic)
    fixed = tmp_path / "affine-fixed.pt2"
    torch.export.save(torch.export.export(Affine(), (torch.zeros(3, 4),)), fixed)
    rules = tmp_path / "rules.py"
    rules.write_text(RULES)
    offset = tmp_path / "offset.txt"
    offset.write_text("7")
    return {"script": script, "dynamic": dynamic, "fixed": fixed, "rules": rules, "offset": offset}


X = np.arange(20, dtype=np.float32).reshape(5, 4) / 7


def test_torchscript_added_checked_and_served(tmp_path, files, capsys):
    store = tmp_path / "store"
    assert keel(["model", "add", "affine", str(files["script"]), "--input-shape", "4", "--store", str(store)]) == 0
    said = capsys.readouterr().out
    m = ModelStore(store).manifest("affine")
    assert (m.version, m.format, m.input_shape, m.output_size) == ("1", "torchscript", [4], 3)  # output size from the check
    assert m.sha256 == sha256_file(store / "affine" / "1" / "model.pt")
    assert "added affine version 1" in said and m.sha256 in said
    out = TorchPredictor(str(store), "affine", None).predict_batch(X)
    np.testing.assert_allclose(out, expected(X), rtol=1e-5)
    # a second add is version 2; the first stays
    assert keel(["model", "add", "affine", str(files["script"]), "--input-shape", "4", "--store", str(store)]) == 0
    assert ModelStore(store).versions("affine") == ["1", "2"]


def test_export_programs_dynamic_and_fixed_batch(tmp_path, files):
    store = str(tmp_path / "store")
    dyn = add_model(store, "dyn", str(files["dynamic"]))  # input shape read from the program
    assert (dyn.format, dyn.input_shape, dyn.static_batch, dyn.output_size) == ("export", [4], None, 3)
    fixed = add_model(store, "fixed", str(files["fixed"]), input_shape=[4], output_size=3)
    assert fixed.static_batch == 3
    for name in ("dyn", "fixed"):  # 5 rows: the fixed program runs chunks of 3, the last padded
        out = store_predictor(store, name, None).predict_batch(X)
        np.testing.assert_allclose(out, expected(X), rtol=1e-5)


def test_python_container_from_a_file_with_load(tmp_path, files, capsys):
    store = tmp_path / "store"
    argv = ["model", "add", "rules", str(files["offset"]), "--python", f"{files['rules']}:Rules",
            "--input-shape", "2,2", "--store", str(store)]
    assert keel(argv) == 0
    m = ModelStore(store).manifest("rules")
    assert (m.format, m.entry, m.output_size) == ("python", "container.py:Rules", 2)
    assert m.container_sha256 == sha256_file(store / "rules" / "1" / "container.py")
    files["rules"].unlink()  # the version holds its own copy
    pred = store_predictor(str(store), "rules", None)
    assert isinstance(pred, PythonPredictor)
    x = np.ones((3, 2, 2), np.float32)
    np.testing.assert_allclose(pred.predict_batch(x), [[8, 11]] * 3)
    # a swapped container file is refused, like swapped weights
    (store / "rules" / "1" / "container.py").write_text(RULES.replace("2 * s", "3 * s"))
    with pytest.raises(ModelStoreError, match="sha256"):
        store_predictor(str(store), "rules", None)


def test_python_container_by_module_name_without_load(tmp_path, monkeypatch):
    (tmp_path / "keel_test_plain.py").write_text(
        "import numpy as np\nclass Zeros:\n    def predict_batch(self, x):\n        return np.zeros((len(x), 5))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    m = add_model(str(tmp_path / "store"), "zeros", None, python="keel_test_plain:Zeros", input_shape=[3], input_dtype="int64")
    assert (m.entry, m.weights, m.output_size, m.input_dtype) == ("keel_test_plain:Zeros", "", 5, "int64")
    assert check(store_predictor(str(tmp_path / "store"), "zeros", None), [3], "int64").shape == (2, 5)


@pytest.mark.parametrize("argv, why", [
    (["--input-shape", "5"], "the check batch failed"),                    # wrong width: the model raises
    (["--input-shape", "4", "--output-size", "2"], "--output-size 2 but the model answers 3"),
    ([], "--input-shape is needed"),
    (["--input-shape", "4", "--input-dtype", "nonsense"], "not a numpy dtype"),
])
def test_add_refuses_a_model_that_fails_its_check(tmp_path, files, capsys, argv, why):
    store = tmp_path / "store"
    assert keel(["model", "add", "affine", str(files["script"]), "--store", str(store), *argv]) == 1
    assert why in capsys.readouterr().err
    assert ModelStore(store).versions("affine") == []  # nothing written


def test_add_refuses_bad_python_containers(tmp_path, files):
    bad = tmp_path / "bad.py"
    bad.write_text("class Wrong:\n    def predict_batch(self, x):\n        return [[1.0]]\n")  # one row for two
    with pytest.raises(ModelAddError, match=r"shape \[1, 1\] for 2 queries"):
        add_model(str(tmp_path / "store"), "bad", None, python=f"{bad}:Wrong", input_shape=[4])
    with pytest.raises(ModelAddError, match="has no Missing"):
        add_model(str(tmp_path / "store"), "bad", None, python=f"{bad}:Missing", input_shape=[4])
    with pytest.raises(ModelAddError, match="module:Class"):
        add_model(str(tmp_path / "store"), "bad", None, python="no-colon", input_shape=[4])
    with pytest.raises(ModelAddError, match="model name '../up'"):
        add_model(str(tmp_path / "store"), "../up", None, python=f"{bad}:Wrong", input_shape=[4])
    assert ModelStore(tmp_path / "store").models() == []


def test_list_and_show(tmp_path, files, capsys):
    store = str(tmp_path / "store")
    add_model(store, "affine", str(files["script"]), input_shape=[4])
    add_model(store, "affine", str(files["dynamic"]))
    capsys.readouterr()
    assert keel(["model", "list", "--store", store, "--json"]) == 0
    [row] = orjson.loads(capsys.readouterr().out)
    assert (row["model"], row["versions"], row["latest"], row["format"]) == ("affine", "1,2", "2", "export")
    assert keel(["model", "show", "affine", "--version", "1", "--store", store]) == 0
    shown = capsys.readouterr().out
    assert '"format": "torchscript"' in shown and "versions: 1, 2" in shown
    assert keel(["model", "show", "nope", "--store", store]) == 1


def _versions_of(root, count: int) -> ModelStore:
    store = ModelStore(root)
    for i in range(count):
        (root.parent / f"a{i}").write_text(str(i))
        store.add("m", root.parent / f"a{i}", "python", entry="numpy:ndarray", input_shape=[2], output_size=2)
    return store


def test_remove_a_version_and_its_number_is_never_given_again(tmp_path, capsys):
    store = _versions_of(tmp_path / "store", 3)
    assert keel(["model", "remove", "m", "3", "--store", str(store.root)]) == 0
    assert "removed m version 3" in capsys.readouterr().out
    assert store.versions("m") == ["1", "2"] and store.resolve("m") == "2"  # latest is no longer 3
    (tmp_path / "a9").write_text("9")
    assert store.add("m", tmp_path / "a9", "python", entry="numpy:ndarray", input_shape=[2], output_size=2).version == "4"
    assert keel(["model", "remove", "m", "3", "--store", str(store.root)]) == 1  # gone already: one line
    err = capsys.readouterr().err
    assert err.startswith("keel: ") and "no version '3'" in err and "Traceback" not in err


def test_a_corrupted_manifest_is_a_store_error(tmp_path):
    store = _versions_of(tmp_path / "store", 1)
    (store.root / "m" / "1" / "manifest.json").write_text('{"name": "m"')
    with pytest.raises(ModelStoreError, match="manifest.json is unreadable"):
        store.manifest("m")
    (store.root / "m" / "1" / "manifest.json").write_text('{"name": "m"}')  # fields missing
    with pytest.raises(ModelStoreError, match="not a manifest"):
        store.manifest("m")
