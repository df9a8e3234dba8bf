"""Training: datasets, models, deployed and parity training, evaluation, store round trip."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from keel.common import erasure
from keel.common.modelstore import ModelStore, ModelStoreError, sha256_file
from keel.training import datasets
from keel.training.cli import ensure_default_model, main
from keel.training.evaluate import evaluate, overall_accuracy
from keel.common.architectures import ARCHS, build, config_for, query_shape
from keel.training.parity import parity_name, train_parity
from keel.training.train import fit, predict, train_deployed

# Tiny models: one thread is as fast, and OpenMP threads spinning on a shared, loaded
# machine can make each step a hundred times slower.
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("training")


@pytest.fixture(scope="module")
def deployed(workdir):
    """digits-mlp trained for 3 epochs into a store shared by this module's tests."""
    return train_deployed("digits", "mlp", 3, seed=0, store_root=str(workdir / "store"), progress=False,
                          runs_dir=str(workdir / "runs"))


@pytest.fixture(scope="module")
def parity(workdir, deployed):
    return train_parity(deployed.name, 2, "add", steps=1500, seed=0, store_root=str(workdir / "store"),
                        progress=False, runs_dir=str(workdir / "runs"))


def test_digits_dataset_shapes_and_split():
    ds = datasets.load("digits")
    assert ds.x_train.shape == (1437, 1, 8, 8) and ds.x_test.shape == (360, 1, 8, 8)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0
    assert ds.input_shape == (1, 8, 8) and ds.n_classes == 10
    assert np.array_equal(np.bincount(ds.y_test), np.bincount(datasets.load("digits").y_test))  # fixed split
    assert np.bincount(ds.y_test).min() >= 35  # stratified: every class in the test split
    with pytest.raises(ValueError):
        datasets.load("cifar10")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("image_shape", [(1, 8, 8), (1, 28, 28)])
def test_models_map_queries_to_logits(arch, image_shape):
    config = config_for(arch, image_shape, 10, **({"width": 8} if arch in ("resnet18", "widemlp") else {}))
    net = build(arch, **config)
    x = torch.rand(3, *query_shape(arch, image_shape))
    assert net(x).shape == (3, 10)
    if arch == "mlp":
        assert query_shape(arch, image_shape) == [math.prod(image_shape)]
        torch.testing.assert_close(net(torch.rand(3, *image_shape)).shape, torch.Size([3, 10]))


def test_parm_initialisation():
    net = build("lenet5", in_channels=1, image_size=28, n_classes=10)
    assert all(torch.count_nonzero(m.bias) == 0 for m in net.modules() if hasattr(m, "bias") and m.bias is not None)
    assert abs(net.fc1.weight.std().item() - 0.01) < 0.002
    bound = math.sqrt(6 / (1 * 25 + 6 * 25))  # Xavier uniform of conv1
    assert net.conv1.weight.abs().max().item() <= bound
    assert net.conv1.weight.std().item() > 0.5 * bound / math.sqrt(3)
    with pytest.raises(ValueError):
        build("vgg11")


def test_deployed_model_beats_chance_and_is_stored(deployed, workdir):
    assert deployed.name == "digits-mlp" and deployed.role == "deployed" and deployed.dataset == "digits"
    assert deployed.input_shape == [64] and deployed.output_size == 10 and deployed.input_dtype == "float32"
    assert deployed.metrics["test_accuracy"] > 0.5  # chance is 0.1
    assert not (workdir / "runs" / "ckpt" / "digits-mlp.pt").exists()  # removed once stored


def test_store_round_trip_checks_sha256(deployed, workdir):
    store = ModelStore(workdir / "store")
    folder = workdir / "store" / deployed.name / deployed.version
    assert sha256_file(folder / "weights.pt") == deployed.sha256
    net, manifest = store.load(deployed.name, deployed.version)
    ds = datasets.load("digits")
    logits = predict(net, ds.x_test.reshape(-1, 64))
    assert float((logits.argmax(1) == ds.y_test).mean()) == pytest.approx(manifest.metrics["test_accuracy"])
    # a copy with one flipped byte is refused
    copy = ModelStore(workdir / "tampered")
    target = workdir / "tampered" / deployed.name / deployed.version
    target.mkdir(parents=True)
    (target / "manifest.json").write_bytes((folder / "manifest.json").read_bytes())
    raw = bytearray((folder / "weights.pt").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (target / "weights.pt").write_bytes(bytes(raw))
    with pytest.raises(ModelStoreError, match="sha256"):
        copy.load(deployed.name, deployed.version)


def parity_mse(net: torch.nn.Module, deployed_net: torch.nn.Module) -> float:
    """MSE of a parity model against sum F(X_i) on fixed test coding groups (k = 2)."""
    ds = datasets.load("digits")
    groups = np.random.default_rng(0).permutation(len(ds.x_test))[:300].reshape(2, 150)
    parities = erasure.add_encode(ds.x_test[groups]).reshape(150, 64)
    target = predict(deployed_net, ds.x_test.reshape(-1, 64))[groups].sum(axis=0)
    return float(F.mse_loss(torch.from_numpy(predict(net, parities)), torch.from_numpy(target)))


def test_parity_training_lowers_the_loss(deployed, parity, workdir):
    store = ModelStore(workdir / "store")
    assert parity.name == parity_name("digits-mlp", 2, "add") == "digits-mlp-parity-k2-add"
    assert parity.role == "parity" and parity.arch == deployed.arch and parity.arch_config == deployed.arch_config
    assert parity.parity == {"k": 2, "encoder": "add", "deployed": f"digits-mlp/{deployed.version}"}
    deployed_net, _ = store.load(deployed.name, deployed.version)
    trained, _ = store.load(parity.name, parity.version)
    torch.manual_seed(0)
    untrained = build(deployed.arch, **deployed.arch_config)
    assert parity_mse(trained, deployed_net) < 0.25 * parity_mse(untrained, deployed_net)


def test_evaluate_reports_sane_accuracies(deployed, parity, workdir):
    m = evaluate(parity.name, store_root=str(workdir / "store"), runs_dir=str(workdir / "runs"), progress=False)
    assert m["A_a"] == pytest.approx(deployed.metrics["test_accuracy"])
    assert m["default_accuracy"] == 0.1 and 0.0 < m["majority_accuracy"] < 0.2
    assert m["default_accuracy"] * 3 < m["A_d"] <= 1.0  # reconstruction far above the default prediction
    assert m["eval_groups"] == 180 and m["k"] == 2 and m["encoder"] == "add"
    assert m["A_o"][0] == [0.0, m["A_a"]]
    assert m["A_o"][-1][1] == pytest.approx(overall_accuracy(m["A_a"], m["A_d"], 0.5))
    assert (workdir / "runs" / f"{parity.name}-v{parity.version}.png").stat().st_size > 1000
    stored = ModelStore(workdir / "store").manifest(parity.name, parity.version)
    assert stored.metrics["A_d"] == m["A_d"] and stored.metrics["train_loss"] > 0
    assert evaluate(parity.name, store_root=str(workdir / "store"), plot=False, progress=False)["A_d"] == m["A_d"]


def test_concat_parity_trains_and_evaluates(deployed, workdir):
    store_root = str(workdir / "store")
    m = train_parity(deployed.name, 4, "concat", steps=50, seed=0, store_root=store_root, progress=False,
                     runs_dir=str(workdir / "runs"))
    assert m.parity["encoder"] == "concat" and m.name == "digits-mlp-parity-k4-concat"
    metrics = evaluate(m.name, store_root=store_root, plot=False, progress=False)
    assert metrics["eval_groups"] == 90 and 0.0 <= metrics["A_d"] <= 1.0


def test_fit_resumes_from_its_checkpoint(tmp_path):
    x, y = torch.rand(256, 64), torch.randint(0, 10, (256,))
    config = {"lr": 1e-3, "weight_decay": 1e-5, "name": "resume"}

    def batch(step):
        idx = torch.from_numpy(np.random.default_rng([0, step]).integers(0, 256, 32))
        return x[idx], y[idx]

    def fresh():
        torch.manual_seed(0)
        return build("mlp", in_features=64, n_classes=10)

    straight = fresh()
    fit(straight, batch, F.cross_entropy, 20, config, tmp_path / "a.pt", ckpt_every=5, progress=False)

    def interrupted(step):
        if step == 12:
            raise KeyboardInterrupt
        return batch(step)

    ckpt = tmp_path / "b.pt"
    with pytest.raises(KeyboardInterrupt):
        fit(fresh(), interrupted, F.cross_entropy, 20, config, ckpt, ckpt_every=5, progress=False)
    assert torch.load(ckpt, weights_only=True)["step"] == 10
    resumed = fresh()
    fit(resumed, batch, F.cross_entropy, 20, config, ckpt, ckpt_every=5, progress=False)
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b)
    # a checkpoint made for another config is not resumed from
    other = fresh()
    fit(other, batch, F.cross_entropy, 20, {**config, "name": "other"}, tmp_path / "a.pt", ckpt_every=5, progress=False)
    for a, b in zip(straight.state_dict().values(), other.state_dict().values()):
        torch.testing.assert_close(a, b)


def test_cli_and_default_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "deployed", "--dataset", "digits", "--arch", "lenet5", "--epochs", "1", "--store", "s"]) == 0
    store = ModelStore(tmp_path / "s")
    assert store.manifest("digits-lenet5").input_shape == [1, 8, 8]
    assert main(["train", "parity", "--model", "digits-lenet5", "--k", "2", "--encoder", "concat", "--steps", "20",
                 "--store", "s"]) == 0
    assert main(["evaluate", "--parity", "digits-lenet5-parity-k2-concat", "--store", "s"]) == 0
    assert "A_d" in store.manifest("digits-lenet5-parity-k2-concat").metrics
    first = ensure_default_model("s")
    assert first.name == "digits-mlp" and first.input_shape == [64] and first.output_size == 10
    assert ensure_default_model("s").version == first.version == "1"  # present: not trained again
    with pytest.raises(SystemExit):
        main(["train", "parity", "--model", "digits-mlp", "--encoder", "xor"])
