"""The three seed models of deploy/examples/models.toml in a store without their real
training (too slow for the suite): the localizer's architecture untrained (weights from a
fixed seed) and a parity model of the same signature, saved as ``training/localizer.py``
saves them; the recommender and the text classifier trained for a moment on little
generated data. Names as the spec reads them."""
from __future__ import annotations

from pathlib import Path

import numpy as np

#: store names, as deploy/examples/models.toml serves them
REC, TEXT, LOC, LOC_PARITY = "rec-dlrm", "text-gru", "mnist-loc", "mnist-loc-parity-k2-add"


def train_small(root: Path) -> str:
    """The recommender and the text classifier trained for a moment into ``root/store``
    (seconds, from generated data: tests compare answers with the model, not quality)."""
    from keel.training.recommender import train_recommender
    from keel.training.text_classifier import train_text_classifier

    store, runs = str(root / "store"), str(root / "runs")
    train_recommender(store, epochs=1, n_train=512, n_test=128, progress=False, runs_dir=runs)
    train_text_classifier(store, epochs=1, n_train=256, n_test=64, progress=False, runs_dir=runs)
    return store


def seed_store(root: Path) -> str:
    """Build the store under ``root``; returns its path."""
    from keel.training.localizer import INPUTS, LocNet
    from keel.training.named import add_scripted

    import torch

    store = train_small(root)
    torch.manual_seed(0)
    deployed = add_scripted(store, LOC, LocNet(), INPUTS, arch="locnet")
    torch.manual_seed(1)
    add_scripted(store, LOC_PARITY, LocNet(), INPUTS, arch="locnet", role="parity",
                 parity={"k": 2, "encoder": "add", "deployed": f"{deployed.name}/{deployed.version}"})
    return store


def _tensor(name: str, dtype: str, shape: list[int], **more) -> dict:
    return {"name": name, "dtype": dtype, "shape": shape, **more}


_BAG = {"min_shape": [1], "max_shape": [40]}
_LOC = {"inputs": [_tensor("image", "float32", [1, 64, 64])],
        "outputs": [_tensor("logits", "float32", [10]), _tensor("box", "float32", [4])]}
#: the signatures the training writes, for a store of manifests only
SIGNATURES = {
    REC: {"inputs": [_tensor("dense", "float32", [13])]
          + [_tensor(f"bag{b}", "int64", [-1], **_BAG) for b in range(3)]
          + [_tensor(f"bag{b}_mask", "float32", [-1], **_BAG, mask_for=f"bag{b}") for b in range(3)],
          "outputs": [_tensor("click", "float32", [1])]},
    TEXT: {"inputs": [_tensor("text", "bytes", [])],
           "outputs": [_tensor("label", "bytes", []), _tensor("score", "float32", [])]},
    LOC: _LOC, LOC_PARITY: _LOC}


def seed_manifests(store: Path) -> None:
    """The four models' manifests alone (no weights, no torch): enough for ``load_spec``."""
    from keel.common.modelstore import Manifest

    for name, signature in SIGNATURES.items():
        folder = store / name / "1"
        folder.mkdir(parents=True)
        parity = {"k": 2, "encoder": "add", "deployed": f"{LOC}/1"} if name == LOC_PARITY else None
        (folder / "manifest.json").write_bytes(Manifest(
            name=name, version="1", arch="seed", input_shape=signature["inputs"][0]["shape"], output_size=0,
            format="torchscript", signature=signature, role="parity" if parity else "deployed",
            parity=parity).to_json())


def canvas(rng: np.random.Generator) -> np.ndarray:
    """A localizer query: a random blob on a 64x64 canvas, float32[1, 64, 64]."""
    x = np.zeros((1, 64, 64), np.float32)
    r, c = rng.integers(0, 64 - 28, 2)
    x[0, r:r + 28, c:c + 28] = rng.random((28, 28), dtype=np.float32)
    return x
