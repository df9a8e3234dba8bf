"""The model selection experiment's classifiers, and how its five and Exp3's parameters are
chosen -- on a validation split, never on the test images the figures come from.

Candidates (``CANDIDATES``): scikit-learn MLPs and Keel's LeNet-5 (torch), on different
subsets of the digits training split, with different seeds. 20% of the training split is
held out (``VALIDATION``) and no candidate trains on it. On that held-out part:

- the five members and Exp4's ``eta`` (``EXP4_ETAS``) are those whose Exp4 ensemble has
  the lowest error relative to its best member, among five where all agree on >= 60% of
  queries (the ensemble targets' own criteria; with none so, the lowest ratio). A small
  ``eta`` keeps the weights flatter (more of a vote); a large one follows the best member;
- Exp3's ``eta`` and ``gamma`` are those of ``EXP3_GRID`` with the lowest error on the Fig. 8
  scenario replayed on validation queries.

Why (docs/results/selection.md): five MLPs trained on the same images made correlated mistakes and
one dominated, so Exp4 could not beat its best member (1.007 x) and all five agreed on
only 57% of queries; models of two kinds on different subsets disagree where they err.
"""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np

# (kind, hidden units, training images (None: all), seed)
CANDIDATES = [
    ("mlp", 16, 300, 1), ("mlp", 32, 700, 2), ("mlp", 64, None, 3), ("mlp", 8, None, 5),
    ("lenet5", 0, 300, 10), ("lenet5", 0, 700, 11), ("lenet5", 0, None, 12),
]
#: share of the training split held out to choose the members and Exp3's parameters
VALIDATION = 0.2
EXP4_ETAS = (0.01, 0.03, 0.1, 0.3)
EXP3_GRID = [(eta, gamma) for eta in (0.1, 0.2, 0.5) for gamma in (0.01, 0.02, 0.05)]


def name_of(kind: str, hidden: int, n: int | None, n_all: int) -> str:
    return f"{kind}{hidden or ''}-n{n or n_all}"


def train(kind: str, hidden: int, n: int | None, seed: int, x: np.ndarray, y: np.ndarray):
    """One candidate trained on ``n`` images of ``x`` (8x8) drawn with ``seed``."""
    idx = np.random.default_rng(seed).permutation(len(x))[: n or len(x)]
    if kind == "mlp":
        import warnings

        from sklearn.exceptions import ConvergenceWarning
        from sklearn.neural_network import MLPClassifier

        warnings.filterwarnings("ignore", category=ConvergenceWarning)  # small subsets, few iterations: on purpose
        return MLPClassifier((hidden,), max_iter=300, random_state=seed).fit(x[idx].reshape(len(idx), -1), y[idx])
    import torch
    import torch.nn.functional as F

    from keel.common.architectures import build, config_for

    torch.set_num_threads(1)  # tiny batches: more threads only contend (2 shared cores)
    torch.manual_seed(seed)
    model = build("lenet5", init="torch", **config_for("lenet5", (1, 8, 8), 10))
    xs, ys = torch.from_numpy(x[idx, None].astype(np.float32)), torch.from_numpy(y[idx])
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    order = np.random.default_rng(seed)
    for _ in range(40):  # epochs
        perm = torch.from_numpy(order.permutation(len(xs)))
        for i in range(0, len(xs), 64):
            b = perm[i:i + 64]
            loss = F.cross_entropy(model(xs[b]), ys[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


def scores(model, images: np.ndarray) -> np.ndarray:
    """Class probabilities of ``images`` (N, 8, 8), float32."""
    if hasattr(model, "predict_proba"):
        return model.predict_proba(images.reshape(len(images), -1)).astype(np.float32)
    import torch

    with torch.no_grad():
        return torch.softmax(model(torch.from_numpy(images[:, None].astype(np.float32))), -1).numpy()


def fig8_stream(scores_: np.ndarray, y: np.ndarray, n: int, degrade: tuple[int, int], best: int, rng):
    """``n`` queries drawn with replacement: (indices, labels, outputs (n, model, class)
    with model ``best`` scrambled to a wrong class in ``degrade``, the wrong classes)."""
    pick = rng.integers(0, len(y), n)
    labels = y[pick]
    outputs = scores_[pick].copy()
    wrong = (labels[degrade[0]:degrade[1]] + rng.integers(1, 10, degrade[1] - degrade[0])) % 10
    outputs[degrade[0]:degrade[1], best] = np.eye(10, dtype=np.float32)[wrong]
    return pick, labels, outputs, wrong


def choose_members(val_scores: np.ndarray, y_val: np.ndarray, names: list[str], replay) -> tuple[list[int], float, dict]:
    """The five candidates (indices) and Exp4's eta by the rule of the module docstring."""
    from keel.services.selection.policies import Exp4

    rng = np.random.default_rng(7)
    pick = rng.integers(0, len(y_val), 2000)
    y = y_val[pick]
    rows = []
    for combo in itertools.combinations(range(len(names)), 5):
        out = val_scores[pick][:, list(combo)]
        single = (out.argmax(-1) != y[:, None]).mean(0).min()
        votes = out.argmax(-1)
        coverage = float((votes == votes[:, :1]).all(1).mean())
        for eta in EXP4_ETAS:
            answers, _, _ = replay(Exp4([names[i] for i in combo], eta=eta), out, y)
            ratio = float((answers != y).mean() / single) if single > 0 else float("inf")
            rows.append((ratio, coverage, combo, eta))
    eligible = [r for r in rows if r[1] >= 0.60] or rows
    ratio, coverage, combo, eta = min(eligible)
    return list(combo), eta, {"validation_exp4_over_best": ratio, "validation_agree_all_coverage": coverage,
                              "combinations_tried": len(rows) // len(EXP4_ETAS)}


def choose_exp3(val_scores: np.ndarray, y_val: np.ndarray, names: list[str], replay) -> tuple[float, float, dict]:
    """Exp3's (eta, gamma) from ``EXP3_GRID``: the lowest error on Fig. 8 over validation queries."""
    from keel.services.selection.policies import Exp3

    best = int(np.argmax((val_scores.argmax(-1) == y_val[:, None]).mean(0)))
    _, y, outputs, _ = fig8_stream(val_scores, y_val, 10_000, (2_500, 5_000), best, np.random.default_rng(8))
    errors: dict[str, Any] = {}
    for eta, gamma in EXP3_GRID:
        answers, _, _ = replay(Exp3(names, eta=eta, gamma=gamma, seed=0), outputs, y)
        errors[f"eta={eta},gamma={gamma}"] = float((answers != y).mean())
    eta, gamma = min(EXP3_GRID, key=lambda p: errors[f"eta={p[0]},gamma={p[1]}"])
    return eta, gamma, errors
