"""Train a deployed model and put it in the model store.

Adam, learning rate 1e-3, L2 regularisation (weight decay) 1e-5, batches of 64 (§5.1).
Everything is seeded: the weights by ``torch.manual_seed(seed)``, the order of an epoch
by a numpy generator seeded with (seed, epoch), so a step's batch depends only on the
step and a run resumes exactly.

A checkpoint (weights, optimizer, step, config) is written to RUNS/ckpt/NAME.pt every
epoch. Starting a run whose config matches a checkpoint resumes from it; once the model
is in the store the checkpoint is removed.

Example
-------
>>> m = train_deployed("digits", "mlp", epochs=30, seed=0, store_root="store")  # doctest: +SKIP
step 690/690 epoch 30 loss 0.0123 (0.9 ms/step)
digits-mlp/1: test_accuracy 0.9722
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from keel.common.modelstore import DEFAULT_STORE, Manifest, ModelStore
from keel.common.progress import bar
from keel.training import datasets
from keel.common.architectures import build, config_for, query_shape

RUNS_DIR = "runs"


@dataclass
class TrainConfig:
    dataset: str
    arch: str
    epochs: int
    seed: int = 0
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 1e-5
    init: str = "parm"  # models.INITS
    arch_config: dict[str, Any] = field(default_factory=dict)


def predict(model: nn.Module, x: np.ndarray, batch_size: int = 1000) -> np.ndarray:
    """Logits of ``model`` (put in eval mode) for numpy queries ``x``, as float32 numpy."""
    model.eval()
    with torch.no_grad():
        chunks = [model(torch.from_numpy(x[i : i + batch_size])) for i in range(0, len(x), batch_size)]
    return torch.cat(chunks).numpy()


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy of ``logits`` (N, n_classes) against integer ``labels``."""
    return float((logits.argmax(axis=-1) == labels).mean())


def fit(
    model: nn.Module,
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    total_steps: int,
    config: dict[str, Any],
    ckpt_path: Path,
    ckpt_every: int,
    progress: bool = True,
    log_every: int = 100,
) -> float:
    """The training loop shared by deployed and parity models; returns the last logged loss.

    ``batch(step)`` must depend only on ``step`` so that a resumed run sees the same data.
    A checkpoint at ``ckpt_path`` whose ``config`` equals ``config`` is resumed from.
    """
    opt = torch.optim.Adam(model.parameters(), lr=config["lr"], weight_decay=config["weight_decay"])
    step = 0
    if ckpt_path.is_file():
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        if ckpt["config"] == config:
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            step = ckpt["step"]
            if progress:
                print(f"resuming from {ckpt_path} at step {step}/{total_steps}", flush=True)
        elif progress:
            print(f"ignoring {ckpt_path}: made for another config", flush=True)
    ckpt_path.parent.mkdir(parents=True, exist_ok=True)
    model.train()
    running, t0, last = 0.0, time.perf_counter(), float("nan")
    shown = bar(total_steps, "train", enabled=progress, initial=step, unit="step")  # a terminal's bar; else lines
    for step in range(step, total_steps):
        x, y = batch(step)
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        running += loss.item()
        done = step + 1
        shown.update(1)
        if done % log_every == 0 or done == total_steps:
            n = (done - 1) % log_every + 1
            last, dt = running / n, (time.perf_counter() - t0) / n
            if shown.disable and progress:
                print(f"step {done}/{total_steps} loss {last:.4f} ({dt * 1e3:.1f} ms/step)", flush=True)
            shown.set_postfix(loss=f"{last:.4f}", refresh=False)
            running, t0 = 0.0, time.perf_counter()
        if done % ckpt_every == 0 or done == total_steps:
            tmp = ckpt_path.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": done, "config": config}, tmp)
            tmp.replace(ckpt_path)
    shown.close()
    model.eval()
    return last


def train_deployed(
    dataset: str,
    arch: str,
    epochs: int,
    seed: int,
    store_root: str = DEFAULT_STORE,
    name: str | None = None,
    progress: bool = True,
    *,
    arch_config: dict[str, Any] | None = None,
    init: str = "parm",
    runs_dir: str = RUNS_DIR,
) -> Manifest:
    """Train a deployed model on ``dataset`` and save it to the store with role "deployed".

    Parameters
    ----------
    dataset : str
        ``"digits"`` or ``"mnist5k"``.
    arch : str
        ``"mlp"``, ``"lenet5"`` or ``"resnet18"``.
    epochs : int
        Passes over the training split.
    seed : int
        Seeds the initial weights and the batch order.
    store_root : str
        Model store folder.
    name : str, optional
        Store name; default ``f"{dataset}-{arch}"`` (e.g. ``"digits-mlp"``).
    progress : bool
        Print progress lines.
    arch_config : dict, optional
        Overrides of the architecture config (e.g. ``{"width": 16}`` for resnet18).
    init : str
        Initial weights: ``"parm"`` (§5.1) or ``"torch"`` (PyTorch defaults).
    runs_dir : str
        Checkpoints go to ``runs_dir/ckpt/``.

    Returns
    -------
    Manifest
        The new version's manifest; ``metrics["test_accuracy"]`` is A_a.
    """
    name = name or f"{dataset}-{arch}"
    ds = datasets.load(dataset)
    shape = query_shape(arch, ds.input_shape)
    x_train = torch.from_numpy(ds.x_train.reshape(-1, *shape))
    y_train = torch.from_numpy(ds.y_train)
    arch_config = config_for(arch, ds.input_shape, ds.n_classes, **(arch_config or {}))
    config = TrainConfig(dataset, arch, epochs, seed, init=init, arch_config=arch_config)
    torch.manual_seed(seed)
    model = build(arch, init=init, **arch_config)

    steps_per_epoch = -(-len(x_train) // config.batch_size)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, i = divmod(step, steps_per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(len(x_train))
        idx = torch.from_numpy(order[i * config.batch_size : (i + 1) * config.batch_size])
        return x_train[idx], y_train[idx]

    if progress:
        print(f"training {name}: {arch} on {dataset} ({len(x_train)} queries), {epochs} epochs, seed {seed}", flush=True)
    ckpt_path = Path(runs_dir) / "ckpt" / f"{name}.pt"
    loss = fit(model, batch, F.cross_entropy, epochs * steps_per_epoch, asdict(config), ckpt_path, steps_per_epoch, progress)
    test_accuracy = accuracy(predict(model, ds.x_test.reshape(-1, *shape)), ds.y_test)
    manifest = ModelStore(store_root).save(
        name,
        model,
        arch=arch,
        arch_config=config.arch_config,
        input_shape=shape,
        output_size=ds.n_classes,
        role="deployed",
        dataset=dataset,
        metrics={"test_accuracy": test_accuracy, "train_loss": loss, "epochs": epochs, "seed": seed, "init": init},
    )
    ckpt_path.unlink(missing_ok=True)
    if progress:
        print(f"{name}/{manifest.version}: test_accuracy {test_accuracy:.4f}", flush=True)
    return manifest
