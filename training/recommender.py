"""A DLRM-style recommender (Kairos serves RM2 of DLRM) on generated clicks.

Inputs of one request, as its signature names them: ``dense`` float32[13] and three id
bags ``bag0..bag2`` int64[1..40] (a user's history, an item's tags, categories), each with
a mask ``bagN_mask`` the ragged batcher fills; output ``click`` float32[1], the click
probability. The model is DLRM's shape (Naumov et al. 2019): a bottom MLP for the dense
features, an embedding table per bag (a masked mean of the bag's rows), pairwise dot
products of the four vectors, a top MLP.

The data is generated (seeded): dense features from N(0, 1), bag lengths uniform in
1..40, ids skewed to the small ones (popular items), and clicks drawn from a hidden
model of the same kinds of terms (a linear dense part, per-bag affinities and one
interaction between bags). ``bayes_auc`` is the AUC of the hidden click probability
itself, the best any model can reach on this data.

Example
-------
>>> m = train_recommender("store", seed=0)        # doctest: +SKIP
>>> m.metrics["test_auc"], m.metrics["bayes_auc"]  # doctest: +SKIP
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from keel.common.modelstore import DEFAULT_STORE, Manifest
from keel.training.named import Star, add_scripted
from keel.training.train import RUNS_DIR, fit

N_DENSE = 13
MAX_IDS = 40
BAGS = 3
INPUTS = ([f"dense:float32:{N_DENSE}"] + [f"bag{b}:int64:1..{MAX_IDS}" for b in range(BAGS)]
          + [f"bag{b}_mask:float32:mask=bag{b}" for b in range(BAGS)])


@dataclass
class RecConfig:
    vocab: tuple[int, ...] = (1000, 300, 50)  # ids of each bag
    dim: int = 16                             # embedding and bottom-MLP width
    hidden: int = 64
    n_train: int = 24_000
    n_test: int = 6_000
    epochs: int = 6
    batch_size: int = 256
    lr: float = 3e-3
    weight_decay: float = 1e-6
    seed: int = 0


def _bag(rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The masked mean of a bag's embedding rows: padding (mask 0) adds nothing."""
    m = mask.unsqueeze(-1)
    return (rows * m).sum(1) / m.sum(1).clamp(min=1.0)


class DLRM(nn.Module):
    def __init__(self, vocab: list[int], dim: int, hidden: int):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(N_DENSE, hidden), nn.ReLU(), nn.Linear(hidden, dim), nn.ReLU())
        self.emb0, self.emb1, self.emb2 = (nn.Embedding(v, dim) for v in vocab)
        n = BAGS + 1
        self.top = nn.Sequential(nn.Linear(dim + n * (n - 1) // 2, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def logit(self, dense: torch.Tensor, bag0: torch.Tensor, bag1: torch.Tensor, bag2: torch.Tensor,
              bag0_mask: torch.Tensor, bag1_mask: torch.Tensor, bag2_mask: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        vs = torch.stack([x, _bag(self.emb0(bag0), bag0_mask), _bag(self.emb1(bag1), bag1_mask),
                          _bag(self.emb2(bag2), bag2_mask)], dim=1)           # (N, 4, dim)
        dots = torch.bmm(vs, vs.transpose(1, 2))
        pairs = torch.triu_indices(4, 4, 1)  # the 6 pairs of the dense vector and the 3 bags
        return self.top(torch.cat([x, dots[:, pairs[0], pairs[1]]], dim=1))

    def forward(self, dense: torch.Tensor, bag0: torch.Tensor, bag1: torch.Tensor, bag2: torch.Tensor,
                bag0_mask: torch.Tensor, bag1_mask: torch.Tensor, bag2_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"click": torch.sigmoid(self.logit(dense, bag0, bag1, bag2, bag0_mask, bag1_mask, bag2_mask))}


def generate(n: int, vocab: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    """``n`` requests: dense, bags padded to 40 with their masks and lengths, the hidden
    click probability ``p`` and the drawn clicks ``y``. The hidden model is fixed (seed 1234)."""
    truth = np.random.default_rng(1234)
    w = truth.normal(size=N_DENSE) / np.sqrt(N_DENSE)
    tables = [truth.normal(size=(v, 4)) for v in vocab]
    affinity = [truth.normal(size=4) for _ in vocab]
    rng = np.random.default_rng([seed, 7])
    out: dict[str, np.ndarray] = {"dense": rng.normal(size=(n, N_DENSE)).astype(np.float32)}
    means = []
    for b, v in enumerate(vocab):
        lengths = rng.integers(1, MAX_IDS + 1, size=n)
        ids = np.floor(v * rng.random((n, MAX_IDS)) ** 2).astype(np.int64)  # popular (small) ids more often
        mask = (np.arange(MAX_IDS)[None, :] < lengths[:, None]).astype(np.float32)
        ids *= mask.astype(np.int64)
        out[f"bag{b}"], out[f"bag{b}_mask"], out[f"len{b}"] = ids, mask, lengths
        means.append((tables[b][ids] * mask[..., None]).sum(1) / lengths[:, None])
    logit = out["dense"] @ w + sum(m @ a for m, a in zip(means, affinity)) + 0.5 * (means[0] * means[1]).sum(1) - 0.5
    out["p"] = 1 / (1 + np.exp(-1.5 * logit))
    out["y"] = (rng.random(n) < out["p"]).astype(np.float32)
    return out


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores))


def _inputs(data: dict[str, np.ndarray], idx: np.ndarray | slice) -> tuple[torch.Tensor, ...]:
    names = ["dense"] + [f"bag{b}" for b in range(BAGS)] + [f"bag{b}_mask" for b in range(BAGS)]
    return tuple(torch.from_numpy(data[n][idx]) for n in names)


def train_recommender(store_root: str = DEFAULT_STORE, *, seed: int = 0, epochs: int = 6, name: str = "rec-dlrm",
                      progress: bool = True, runs_dir: str = RUNS_DIR, n_train: int = RecConfig.n_train,
                      n_test: int = RecConfig.n_test) -> Manifest:
    """Train the recommender on generated clicks and add it to the store with its signature;
    ``metrics``: test AUC and accuracy, and the hidden model's own AUC (``bayes_auc``)."""
    config = RecConfig(epochs=epochs, seed=seed, n_train=n_train, n_test=n_test)
    train, test = generate(config.n_train, config.vocab, seed), generate(config.n_test, config.vocab, seed + 10_000)
    torch.manual_seed(seed)
    model = DLRM(list(config.vocab), config.dim, config.hidden)
    steps_per_epoch = -(-config.n_train // config.batch_size)

    def batch(step: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        epoch, i = divmod(step, steps_per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(config.n_train)
        idx = order[i * config.batch_size:(i + 1) * config.batch_size]
        return _inputs(train, idx), torch.from_numpy(train["y"][idx])

    if progress:
        print(f"training {name}: DLRM on {config.n_train} generated requests, {epochs} epochs, seed {seed}", flush=True)
    star = Star(model)
    loss = fit(star, batch, lambda out, y: F.binary_cross_entropy(out["click"][:, 0], y), epochs * steps_per_epoch,
               asdict(config),
               Path(runs_dir) / "ckpt" / f"{name}.pt", steps_per_epoch, progress, log_every=steps_per_epoch)
    with torch.no_grad():
        p = model(*_inputs(test, slice(None)))["click"][:, 0].numpy()
    metrics = {"test_auc": _auc(p, test["y"]), "test_accuracy": float(((p > 0.5) == test["y"]).mean()),
               "bayes_auc": _auc(test["p"], test["y"]), "train_loss": loss, "epochs": epochs, "seed": seed}
    manifest = add_scripted(store_root, name, model, INPUTS, dataset="generated-clicks", arch="dlrm",
                            arch_config={"vocab": list(config.vocab), "dim": config.dim, "hidden": config.hidden},
                            metrics=metrics)
    (Path(runs_dir) / "ckpt" / f"{name}.pt").unlink(missing_ok=True)
    if progress:
        print(f"{name}/{manifest.version}: test AUC {metrics['test_auc']:.4f} (hidden model's {metrics['bayes_auc']:.4f}), "
              f"accuracy {metrics['test_accuracy']:.4f}", flush=True)
    return manifest
