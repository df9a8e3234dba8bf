"""Accuracy of a parity model as in ParM §5.1.

- A_a  accuracy of the deployed model on the test split (predictions available)
- A_d  degraded mode accuracy: the test queries are placed at random (seeded) into
       coding groups of k (the N mod k left over are not used); each group is encoded
       with the parity model's encoder and run through the parity model, and for every
       group and every single unavailable prediction F(X_j) the reconstruction
       ``erasure.decode(encoder, F_P(P), [F(X_i) for i != j])`` (subtraction; in
       probability space for the concat encoder) is compared, top-1, with X_j's true label
- A_o(f) = (1 - f) A_a + f A_d, the overall accuracy when a fraction f of predictions
       is unavailable, for f in [0, 0.5]

The lower bound is the default prediction of §5.2.2: answer at random when a prediction
is unavailable, expected accuracy 1/n_classes ("default_accuracy"). Answering the most
frequent training class instead is recorded as "majority_accuracy" (also 1/n_classes
up to rounding here, the splits being stratified and the classes near balanced).

Encoding and decoding use the numpy functions of ``common.erasure`` that the serving
frontend uses, not the torch ones used in training.

Example
-------
>>> metrics = evaluate("mnist5k-mlp-parity-k2-add", store_root="store")   # doctest: +SKIP
A_a 0.9210  A_d 0.8700  (k=2, add, 500 groups)  plot runs/mnist5k-mlp-parity-k2-add-v1.png
"""
from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

from keel.common.erasure import decode, encode
from keel.common.modelstore import DEFAULT_STORE, ModelStore, ModelStoreError
from keel.common.plotting import pyplot
from keel.training import datasets
from keel.training.train import RUNS_DIR, accuracy, predict

FRACTIONS = [round(float(f), 2) for f in np.linspace(0.0, 0.5, 11)]


def overall_accuracy(a_a: float, a_d: float, f: float) -> float:
    """A_o = (1 - f) A_a + f A_d (ParM eq. 1)."""
    return (1.0 - f) * a_a + f * a_d


def degraded_accuracy(
    encoder: str, parity_outputs: np.ndarray, group_outputs: np.ndarray, group_labels: np.ndarray
) -> float:
    """A_d over every coding group and every single unavailable prediction.

    Parameters
    ----------
    encoder : str
        ``"add"`` or ``"concat"``; picks the matching decoder.
    parity_outputs : ndarray (G, n_out)
        F_P(P) for each of G coding groups.
    group_outputs : ndarray (k, G, n_out)
        F(X_i) of the deployed model for the i-th query of each group.
    group_labels : ndarray (k, G)
        True label of the i-th query of each group.
    """
    k = len(group_outputs)
    correct = 0
    for j in range(k):  # prediction j unavailable
        recon = decode(encoder, parity_outputs, np.delete(group_outputs, j, axis=0))
        correct += int((recon.argmax(axis=-1) == group_labels[j]).sum())
    return correct / group_labels.size


def evaluate(
    parity_name: str,
    version: str | None = None,
    store_root: str = DEFAULT_STORE,
    seed: int = 0,
    runs_dir: str = RUNS_DIR,
    plot: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Measure A_a, A_d and A_o(f) of a parity model and record them in its manifest.

    Parameters
    ----------
    parity_name : str
        Store name of the parity model; its manifest names the deployed model.
    version : str, optional
        Parity model version; default the latest.
    store_root : str
        Model store folder.
    seed : int
        Seeds the random placement of test queries into coding groups.
    runs_dir : str
        The plot of A_o(f) is written to ``runs_dir/NAME-vVERSION.png``.
    plot : bool
        Write the plot.
    progress : bool
        Print a summary line.

    Returns
    -------
    dict
        The metrics added to the parity manifest: ``A_a``, ``A_d``, ``A_o`` (pairs
        [f, A_o(f)]), ``default_accuracy``, ``majority_accuracy``, ``k``, ``encoder``,
        ``eval_groups``, ``eval_seed`` and ``plot`` (path or None).
    """
    store = ModelStore(store_root)
    parity_model, pm = store.load(parity_name, version)
    if pm.role != "parity" or not pm.parity:
        raise ModelStoreError(f"{pm.name}/{pm.version} is not a parity model (role {pm.role!r})")
    k, encoder = int(pm.parity["k"]), pm.parity["encoder"]
    deployed_name, deployed_version = pm.parity["deployed"].split("/")
    deployed, dm = store.load(deployed_name, deployed_version)
    ds = datasets.load(dm.dataset)
    shape = pm.input_shape

    outputs = predict(deployed, ds.x_test.reshape(-1, *shape))
    a_a = accuracy(outputs, ds.y_test)

    n_groups = len(ds.x_test) // k
    groups = np.random.default_rng(seed).permutation(len(ds.x_test))[: n_groups * k].reshape(n_groups, k).T
    parities = encode(encoder, ds.x_test[groups])  # (k, G, C, H, W) -> (G, C, H, W)
    parity_outputs = predict(parity_model, parities.reshape(n_groups, *shape))
    a_d = degraded_accuracy(encoder, parity_outputs, outputs[groups], ds.y_test[groups])

    majority = int(np.bincount(ds.y_train).argmax())
    metrics: dict[str, Any] = {
        "A_a": a_a,
        "A_d": a_d,
        "A_o": [[f, overall_accuracy(a_a, a_d, f)] for f in FRACTIONS],
        "default_accuracy": 1.0 / dm.output_size,
        "majority_accuracy": float((ds.y_test == majority).mean()),
        "k": k,
        "encoder": encoder,
        "eval_groups": n_groups,
        "eval_seed": seed,
        "plot": None,
    }
    if plot and find_spec("matplotlib") is not None:  # the plot needs the bench extra
        metrics["plot"] = str(plot_overall(metrics, Path(runs_dir) / f"{pm.name}-v{pm.version}.png", f"{pm.name}/{pm.version}"))
    store.update_metrics(pm.name, pm.version, metrics)
    if progress:
        print(
            f"A_a {a_a:.4f}  A_d {a_d:.4f}  (k={k}, {encoder}, {n_groups} groups)  plot {metrics['plot']}",
            flush=True,
        )
    return metrics


def accuracy_table(store_root: str = DEFAULT_STORE) -> str:
    """A markdown table of every evaluated parity model in the store (latest versions).

    Columns: deployed model, architecture, dataset, k, encoder, A_a, A_d, the gap
    A_a - A_d in points, A_o at f = 0.1, and the default-prediction bound 1/n_classes.
    """
    store = ModelStore(store_root)
    header = "| deployed model | arch | dataset | k | encoder | A_a | A_d | gap (points) | A_o(f=0.1) | default bound |"
    rows = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for name in store.models():
        m = store.manifest(name)
        if m.role != "parity" or "A_d" not in m.metrics:
            continue
        x = m.metrics
        a_o = dict((f, a) for f, a in x["A_o"])[0.1]
        rows.append(
            f"| {m.parity['deployed']} | {m.arch} | {m.dataset} | {x['k']} | {x['encoder']} | {x['A_a']:.3f} | "
            f"{x['A_d']:.3f} | {100 * (x['A_a'] - x['A_d']):.1f} | {a_o:.3f} | {x['default_accuracy']:.2f} |"
        )
    return "\n".join(rows)


def plot_overall(metrics: dict[str, Any], path: Path, title: str) -> Path:
    """Plot A_o(f) with ParM against A_o(f) with default predictions; returns ``path``."""
    plt = pyplot()
    f = np.array([p[0] for p in metrics["A_o"]])
    a_a, default = metrics["A_a"], metrics["default_accuracy"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(f, [p[1] for p in metrics["A_o"]], marker="o", label=f"ParM (k={metrics['k']}, {metrics['encoder']})")
    ax.plot(f, [overall_accuracy(a_a, default, x) for x in f], marker="s", label="default prediction")
    ax.axhline(a_a, color="grey", linestyle="--", label="deployed model, A_a")
    ax.set_xlabel("fraction of predictions unavailable, f")
    ax.set_ylabel("overall accuracy, A_o")
    ax.set_title(title)
    ax.legend(loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
