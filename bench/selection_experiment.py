"""``keel experiment selection``: Clipper's model selection (§5) replayed offline.

Five classifiers of different accuracy (scikit-learn MLPs and LeNet-5s on different
training subsets, with different seeds) are trained on the embedded ``digits`` dataset;
which five, and the policies' learning rates, are chosen on a validation split held out of
training (``bench/selection_models.py``), never on the test images. Their score vectors
on a stream of test images (drawn with replacement) are replayed through the policies of
services/selection/policies.py with immediate feedback:

- Fig. 8: the best model's outputs are scrambled (a wrong class) from query 5,000 to
  10,000 of 20,000. ``exp3_degraded_pick_rate`` is the share of Exp3's draws that go to
  it in [5,300, 10,000) (after 300 queries to notice); ``exp3_recovered_pick_rate`` the
  share in [11,000, 20,000) (after 1,000 queries to recover).
- Ensemble: Exp4 over the five models with no degradation; the subset where all five
  agree, its error relative to Exp4's overall and its coverage (Fig. 7's shape).
- Contexts: four user groups, each with its own input transform (identity, flipped left
  to right, upside down, transposed) and one model trained on that transform; Exp4 with
  one state per group versus one global state, error on the queries after 200 feedbacks
  per group.

Live (``bench/selection_live.py``; ``--no-live`` skips it): the same five models served by
worker processes behind a real frontend and dispatcher, called as applications with
feedback through the client. Fig. 8 again (``live_*`` keys; ``--quick``: 4,000 queries per
policy, the best model degraded in [1,000, 2,000), picks counted in [1,300, 2,000) and
[3,000, 4,000)); and the stragglers: Exp4 with a 20 ms deadline while the best model's
worker is frozen for 10 s (``straggler_*``).

Example
-------
::

    keel experiment selection --json runs/selection.json --quick
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from keel.bench import selection_models as sm
from keel.services.selection.policies import Exp3, Exp4

TRANSFORMS = {
    "identity": lambda x: x,
    "mirror": lambda x: x[:, :, ::-1],
    "upside-down": lambda x: x[:, ::-1, :],
    "transposed": lambda x: np.transpose(x, (0, 2, 1)),
}
def _replay(policy, outputs: np.ndarray, y: np.ndarray, states=None, groups=None):
    """Immediate feedback on every query; per query: the answer's class, the drawn model
    (Exp3) and the weights. ``groups`` picks each query's state (per context)."""
    models = policy.models
    states = states or {}
    n = len(y)
    answers = np.empty(n, np.int64)
    chosen = np.full(n, -1, np.int64)
    weights = np.empty((n, len(models)))
    for t in range(n):
        g = 0 if groups is None else int(groups[t])
        state = states.get(g) or policy.init()
        weights[t] = np.exp(state.log_w) / np.exp(state.log_w).sum()
        picked = policy.select(state, None)
        preds = {m: outputs[t, policy.index[m]] for m in picked}
        answers[t] = int(np.argmax(policy.combine(state, None, preds).output))
        if len(picked) == 1:
            chosen[t] = policy.index[picked[0]]
        states[g] = policy.observe(state, None, int(y[t]), preds)
    return answers, chosen, weights


def _fig8_figures(prefix: str, chosen, y, outputs, best: int, degrade: tuple[int, int]) -> dict[str, Any]:
    """Exp3's picks of the degraded model after 300 queries of degradation and after 1,000
    of recovery, and the best single model's error."""
    static = (outputs.argmax(-1) != y[:, None]).mean(0)
    return {
        f"{prefix}exp3_degraded_pick_rate": float((chosen[degrade[0] + 300:degrade[1]] == best).mean()),
        f"{prefix}exp3_recovered_pick_rate": float((chosen[degrade[1] + 1000:] == best).mean()),
        f"{prefix}best_static_error": float(static.min()),
    }


def run_experiment(quick: bool, log, live: bool = True) -> dict[str, Any]:
    from keel.training.datasets import load

    t0 = time.perf_counter()
    data = load("digits")
    x_all, y_all = data.x_train[:, 0], data.y_train
    x_test, y_test = data.x_test[:, 0], data.y_test
    # Held out of every candidate's training: the members and Exp3's parameters are chosen on it.
    held = np.random.default_rng(42).permutation(len(x_all))
    n_val = int(len(x_all) * sm.VALIDATION)
    x_val, y_val = x_all[held[:n_val]], y_all[held[:n_val]]
    x_train, y_train = x_all[held[n_val:]], y_all[held[n_val:]]
    candidates = [sm.train(kind, h, nimg, seed, x_train, y_train) for kind, h, nimg, seed in sm.CANDIDATES]
    cand_names = [sm.name_of(kind, h, nimg, len(x_train)) for kind, h, nimg, _ in sm.CANDIDATES]
    val_scores = np.stack([sm.scores(m, x_val) for m in candidates], axis=1)
    members, exp4_eta, chosen_by = sm.choose_members(val_scores, y_val, cand_names, _replay)
    models, names = [candidates[i] for i in members], [cand_names[i] for i in members]
    eta, gamma, exp3_grid = sm.choose_exp3(val_scores[:, members], y_val, names, _replay)
    log(f"members (chosen on {n_val} validation images among {chosen_by['combinations_tried']} combinations): "
        f"{', '.join(names)}; Exp4 eta {exp4_eta}; Exp3 eta {eta}, gamma {gamma}")
    test_scores = np.stack([sm.scores(m, x_test) for m in models], axis=1)  # (test, model, class)
    accuracy = (test_scores.argmax(-1) == y_test[:, None]).mean(0)
    log("models (test accuracy): " + ", ".join(f"{n} {a:.3f}" for n, a in zip(names, accuracy)))
    best = int(np.argmax(accuracy))

    n = 20_000
    degrade = (5_000, 10_000)
    rng = np.random.default_rng(0)
    pick, y, outputs, _ = sm.fig8_stream(test_scores, y_test, n, degrade, best, rng)
    static_err = (outputs.argmax(-1) != y[:, None]).mean(0)
    exp3 = Exp3(names, eta=eta, gamma=gamma, seed=0)
    a3, chosen, w3 = _replay(exp3, outputs, y)
    a4, _, w4 = _replay(Exp4(names, eta=exp4_eta), outputs, y)
    fig8 = {
        "exp3_error": float((a3 != y).mean()),
        "exp4_error": float((a4 != y).mean()),
        "static_errors": dict(zip(names, static_err.tolist())),
        **_fig8_figures("", chosen, y, outputs, best, degrade),
        "exp3_eta": eta, "exp3_gamma": gamma, "exp4_eta": exp4_eta, "exp3_validation_errors": exp3_grid, **chosen_by,
    }
    log(f"Fig. 8: best model {names[best]} degraded in [{degrade[0]}, {degrade[1]})")

    # Ensemble: no degradation.
    clean = test_scores[pick]
    e4, _, _ = _replay(Exp4(names, eta=exp4_eta), clean, y)
    single = (clean.argmax(-1) != y[:, None]).mean(0)
    votes = clean.argmax(-1)
    agree = (votes == votes[:, :1]).all(1)
    e4_err = float((e4 != y).mean())
    agree_err = float((votes[agree, 0] != y[agree]).mean()) if agree.any() else 0.0
    ensemble = {
        "exp4_clean_error": e4_err,
        "best_single_clean_error": float(single.min()),
        "exp4_over_best": e4_err / float(single.min()) if single.min() > 0 else None,
        "agree_all_error_ratio": agree_err / e4_err if e4_err > 0 else None,
        "agree_all_coverage": float(agree.mean()),
    }

    # Contexts: a model per transform, four groups.
    ctx_names = list(TRANSFORMS)
    ctx_models = [sm.train("mlp", 64, None, i, f(x_train), y_train) for i, f in enumerate(TRANSFORMS.values())]
    m = 4_000 if quick else 8_000
    groups = rng.integers(0, 4, m)
    idx = rng.integers(0, len(y_test), m)
    yc = y_test[idx]
    per_transform = {g: np.stack([sm.scores(cm, f(x_test)) for cm in ctx_models], axis=1)
                     for g, f in enumerate(TRANSFORMS.values())}
    ctx_out = np.stack([per_transform[int(g)][i] for g, i in zip(groups, idx)])
    policy = Exp4(ctx_names)
    ac, _, _ = _replay(policy, ctx_out, yc, groups=groups)
    ag, _, _ = _replay(Exp4(ctx_names), ctx_out, yc)
    seen = np.zeros(m, np.int64)  # feedbacks its group had before each query
    counts = np.zeros(4, np.int64)
    for t, g in enumerate(groups):
        seen[t] = counts[g]
        counts[g] += 1
    after = seen >= 200
    ctx_err = float((ac[after] != yc[after]).mean())
    glob_err = float((ag[after] != yc[after]).mean())
    contexts = {"context_error": ctx_err, "global_error": glob_err,
                "context_over_global": ctx_err / glob_err if glob_err > 0 else None}

    live_figures: dict[str, Any] = {"straggler_p99_ms": None, "straggler_deadline_ms": 20.0,
                                    "straggler_accuracy_drop": None}
    if live:
        from keel.bench.selection_live import run_live

        n_live, live_degrade = (4_000, (1_000, 2_000)) if quick else (n, degrade)
        seq, y_live, live_outputs, wrong_live = sm.fig8_stream(test_scores, y_test, n_live, live_degrade, best,
                                                               np.random.default_rng(3))
        log(f"live: {n_live} queries per policy, {names[best]} degraded in [{live_degrade[0]}, {live_degrade[1]})")
        runs = run_live(models, names, best, (x_test, y_test), seq, wrong_live, live_degrade, quick, log,
                        exp3={"eta": eta, "gamma": gamma}, exp4_eta=exp4_eta)
        live_static = (live_outputs.argmax(-1) != y_live[:, None]).mean(0)
        live_figures.update({
            "live_queries": n_live,
            "live_exp3_error": float((runs["exp3"]["answers"] != y_live).mean()),
            "live_exp4_error": float((runs["exp4"]["answers"] != y_live).mean()),
            "live_static_errors": dict(zip(names, live_static.tolist())),
            "live_errors": runs["exp3"]["errors"] + runs["exp4"]["errors"],
            **_fig8_figures("live_", runs["exp3"]["chosen"], y_live, live_outputs, best, live_degrade),
            **runs["stragglers"],
            "_live_series": {"chosen": runs["exp3"]["chosen"], "a3": runs["exp3"]["answers"],
                             "a4": runs["exp4"]["answers"], "y": y_live, "names": names, "degrade": live_degrade,
                             "outputs_best": live_outputs[:, best].argmax(-1)},
        })

    out = {"models": dict(zip(names, accuracy.tolist())), "best_model": names[best], **fig8, **ensemble, **contexts,
           **live_figures, "quick": quick, "live": live, "elapsed_s": time.perf_counter() - t0,
           "_series": {"w3": w3, "w4": w4, "a3": a3, "a4": a4, "y": y, "outputs_best": outputs[:, best].argmax(-1),
                       "names": names, "degrade": degrade}}
    return out


def _moving(values: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(query index at each window's end, moving mean over ``window`` queries)."""
    moving = np.convolve(values, np.ones(window) / window, mode="valid")
    return np.arange(window - 1, window - 1 + len(moving)), moving


def plot_fig8(path: Path, title: str, s: dict[str, Any], best_model: str) -> None:
    """Fig. 8's two panels: Exp3's weights (offline) or share of picks (live) per model over
    time, and the error over time of Exp3, Exp4 and the degraded model alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for i, name in enumerate(s["names"]):
        if "w3" in s:
            top.plot(s["w3"][:, i], label=f"Exp3 {name}")
        else:
            top.plot(*_moving((s["chosen"] == i).astype(float), 200), label=f"Exp3 {name}")
    top.axvspan(*s["degrade"], color="grey", alpha=0.2, label="best model degraded")
    top.set_ylabel("Exp3 weight" if "w3" in s else "Exp3's share of picks (moving 200)")
    top.legend(fontsize=7)
    window = 500 if len(s["y"]) > 5000 else 200
    for label, answers in (("Exp3", s["a3"]), ("Exp4", s["a4"]), (f"{best_model} alone", s["outputs_best"])):
        bottom.plot(*_moving((answers != s["y"]).astype(float), window), label=label)
    bottom.axvspan(*s["degrade"], color="grey", alpha=0.2)
    bottom.set_ylabel(f"error (moving {window})")
    bottom.set_xlabel("query")
    bottom.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


CHECKS = [
    ("exp3_error", "< every single model", lambda o: o["exp3_error"] < min(o["static_errors"].values())),
    ("exp4_error", "< every single model", lambda o: o["exp4_error"] < min(o["static_errors"].values())),
    ("exp3_degraded_pick_rate", "< 0.10", lambda o: o["exp3_degraded_pick_rate"] < 0.10),
    ("exp3_recovered_pick_rate", "> 0.50", lambda o: o["exp3_recovered_pick_rate"] > 0.50),
    ("exp4_over_best", "<= 0.95", lambda o: o["exp4_over_best"] is not None and o["exp4_over_best"] <= 0.95),
    ("agree_all_error_ratio", "<= 0.333", lambda o: o["agree_all_error_ratio"] is not None and o["agree_all_error_ratio"] <= 1 / 3),
    ("agree_all_coverage", ">= 0.60", lambda o: o["agree_all_coverage"] >= 0.60),
    ("context_over_global", "<= 0.5", lambda o: o["context_over_global"] is not None and o["context_over_global"] <= 0.5),
    ("live_exp3_error", "< every single model", lambda o: o["live_exp3_error"] < min(o["live_static_errors"].values())),
    ("live_exp4_error", "< every single model", lambda o: o["live_exp4_error"] < min(o["live_static_errors"].values())),
    ("live_exp3_degraded_pick_rate", "< 0.10", lambda o: o["live_exp3_degraded_pick_rate"] < 0.10),
    ("live_exp3_recovered_pick_rate", "> 0.50", lambda o: o["live_exp3_recovered_pick_rate"] > 0.50),
    ("straggler_p99_ms", "<= 22 (deadline + 2)", lambda o: o["straggler_p99_ms"] <= o["straggler_deadline_ms"] + 2),
    ("straggler_accuracy_drop", "<= 1 point", lambda o: o["straggler_accuracy_drop"] <= 1.0),
    ("straggler_errors", "0", lambda o: o["straggler_errors"] == 0),
]


#: the printed table and its targets (keel experiment); ``met`` in the report says which were
FIGURES = tuple(key for key, _, _ in CHECKS)
TARGETS = {key: target for key, target, _ in CHECKS}


def run(args: argparse.Namespace, log=print) -> dict:
    out = run_experiment(args.quick, log, live=not args.no_live)
    out["met"] = {key: bool(met(out)) for key, _, met in CHECKS if out.get(key) is not None}
    log("static errors: " + ", ".join(f"{k} {v:.4f}" for k, v in out["static_errors"].items()))
    log("targets met: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in out["met"].items()))
    return out


def passed(report: dict) -> bool:
    return True  # an experiment's figures, met or not; nothing here is lost


def plot(out: dict, path: Path) -> None:
    """Fig. 8 offline beside the JSON, and through the live cluster beside it (``-live``)."""
    plot_fig8(path, "Clipper Fig. 8 offline: weights and error over time", out["_series"], out["best_model"])
    if "_live_series" in out:
        live_path = path.with_name(path.stem + "-live.png")
        plot_fig8(live_path, "Clipper Fig. 8 through a live cluster: Exp3's picks and error over time",
                  out["_live_series"], out["best_model"])
        out["live_plot"] = str(live_path)


def options(e: argparse.ArgumentParser) -> None:
    """``keel experiment selection``'s own options."""
    e.add_argument("--no-live", action="store_true", help="the offline replay only (no cluster)")
