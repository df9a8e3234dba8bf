"""Train a parity model F_P for a deployed model F (ParM §4.4).

Each training sample is a parity query made from k training queries drawn at random
(with replacement) from the deployed model's own training split:

- ``add``     P = X_1 + ... + X_k, label F(X_1) + ... + F(X_k) (the frozen deployed model's
              logits, computed once for the whole split), mean-squared-error loss
- ``concat``  P = the k images downsampled and tiled (§5.2.3), label the sum of the
              one-hot true labels divided by k (a probability distribution),
              cross-entropy loss

The parity model has the deployed model's architecture and config (§4.3), fresh §5.1
weights, and is trained with Adam, learning rate 1e-3, weight decay 1e-5, batches of 64
parity queries. Encoding uses ``common.erasure``, the code the serving frontend uses.
"One epoch" here is as many parity queries as there are training queries.

Example
-------
>>> m = train_parity("mnist5k-mlp", k=2, encoder="add", epochs=100, seed=0,
...                  store_root="store")                          # doctest: +SKIP
>>> m.name, m.parity                                             # doctest: +SKIP
('mnist5k-mlp-parity-k2-add', {'k': 2, 'encoder': 'add', 'deployed': 'mnist5k-mlp/1'})
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from keel.common.erasure import Encoder, encode_torch
from keel.common.modelstore import DEFAULT_STORE, Manifest, ModelStore, ModelStoreError
from keel.training import datasets
from keel.common.architectures import build
from keel.training.train import RUNS_DIR, fit, predict


@dataclass
class ParityConfig:
    deployed: str  # "name/version" of the deployed model
    k: int
    encoder: str
    steps: int
    seed: int = 0
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 1e-5
    init: str = "parm"
    arch_config: dict[str, Any] = field(default_factory=dict)


def parity_name(deployed: str, k: int, encoder: str) -> str:
    """The store name of the parity model for ``deployed`` with coding group size ``k``."""
    return f"{deployed}-parity-k{k}-{Encoder(encoder)}"


def train_parity(
    deployed_name: str,
    k: int,
    encoder: str = "add",
    epochs: int | None = None,
    steps: int | None = None,
    seed: int = 0,
    store_root: str = DEFAULT_STORE,
    progress: bool = True,
    *,
    name: str | None = None,
    deployed_version: str | None = None,
    init: str = "parm",
    runs_dir: str = RUNS_DIR,
) -> Manifest:
    """Train a parity model for a deployed model in the store and save it with role "parity".

    Parameters
    ----------
    deployed_name : str
        Store name of the deployed model F.
    k : int
        Coding group size: one parity query per k queries.
    encoder : str
        ``"add"`` (MSE against summed outputs) or ``"concat"`` (cross-entropy against
        the normalised sum of one-hot labels).
    epochs, steps : int, optional
        Training length; give exactly one. An epoch is ceil(N_train / 64) steps.
    seed : int
        Seeds the initial weights and every coding group drawn.
    store_root : str
        Model store folder.
    progress : bool
        Print progress lines.
    name : str, optional
        Store name; default ``parity_name(deployed_name, k, encoder)``.
    deployed_version : str, optional
        Version of the deployed model; default the latest.
    init : str
        Initial weights: ``"parm"`` (§5.1) or ``"torch"``.
    runs_dir : str
        Checkpoints go to ``runs_dir/ckpt/``.

    Returns
    -------
    Manifest
        The parity model's manifest, with ``parity={"k", "encoder", "deployed"}``.
    """
    encoder = Encoder(encoder)
    if k < 2:
        raise ValueError(f"k must be at least 2, got {k}")
    if (epochs is None) == (steps is None):
        raise ValueError("give exactly one of epochs and steps")
    store = ModelStore(store_root)
    deployed, dm = store.load(deployed_name, deployed_version)
    if dm.role != "deployed":
        raise ModelStoreError(f"{dm.name}/{dm.version} has role {dm.role!r}, not 'deployed'")
    name = name or parity_name(dm.name, k, encoder)
    ds = datasets.load(dm.dataset)
    shape = dm.input_shape
    images = torch.from_numpy(ds.x_train)  # encode images as images, then reshape to the query shape
    n_train, batch_size = len(images), ParityConfig.batch_size
    steps = steps if steps is not None else epochs * -(-n_train // batch_size)
    if encoder is Encoder.ADD:
        targets = torch.from_numpy(predict(deployed, ds.x_train.reshape(-1, *shape)))  # F(X) for every query
        loss_fn = F.mse_loss
    else:
        targets = F.one_hot(torch.from_numpy(ds.y_train), dm.output_size).float()
        loss_fn = F.cross_entropy  # accepts probability targets
    config = ParityConfig(f"{dm.name}/{dm.version}", k, str(encoder), steps, seed, init=init, arch_config=dm.arch_config)
    torch.manual_seed(seed)
    model = build(dm.arch, init=init, **dm.arch_config)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(np.random.default_rng([seed, step]).integers(0, n_train, size=(k, batch_size)))
        parity = encode_torch(encoder, images[idx]).reshape(batch_size, *shape)
        label = targets[idx].sum(dim=0)
        return parity, label / k if encoder is Encoder.CONCAT else label

    if progress:
        print(f"training {name}: {dm.arch} parity model for {config.deployed}, k={k}, {encoder} encoder, {steps} steps", flush=True)
    ckpt_path = Path(runs_dir) / "ckpt" / f"{name}.pt"
    loss = fit(model, batch, loss_fn, steps, asdict(config), ckpt_path, ckpt_every=1000, progress=progress, log_every=500)
    manifest = store.save(
        name,
        model,
        arch=dm.arch,
        arch_config=dm.arch_config,
        input_shape=shape,
        output_size=dm.output_size,
        role="parity",
        dataset=dm.dataset,
        metrics={"train_loss": loss, "steps": steps, "seed": seed, "init": init},
        parity={"k": k, "encoder": str(encoder), "deployed": config.deployed},
    )
    ckpt_path.unlink(missing_ok=True)
    if progress:
        print(f"{name}/{manifest.version}: saved", flush=True)
    return manifest
