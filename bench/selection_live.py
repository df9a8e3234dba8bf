"""The live half of ``keel experiment selection``: the experiment's five classifiers served
by real worker processes behind a real frontend and dispatcher, called through the client
as applications (``predict(app, x, key=...)``, ``feedback(request_id, y)``).

Each classifier goes into a model store as a Python container (``ScoreContainer``): a
scikit-learn MLP as its weights (forward pass in numpy), a LeNet-5 as TorchScript, in one
``.npz``, so a worker runs the very model the offline replay scored. A query is the 8x8 digit (64 features) plus one more feature, the
*scramble* flag: 0, or 1 + a wrong class. Only the degradable model (the best one) reads
it: while the flag is set it answers that wrong class, as the offline replay scrambles it
(Fig. 8). The others ignore it.

- ``fig8``: one application call and one feedback per query, in order (immediate
  feedback), through Exp3 and through Exp4 applications.
- ``stragglers``: an Exp4 application with a 20 ms deadline over the five models; the
  same sequence of queries is sent with every worker running and again while the best
  model's worker is frozen (SIGSTOP) for 10 s; p99 latency while frozen, the accuracy
  drop on the queries both runs answered, the errors.
"""
from __future__ import annotations

import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

#: features of a query: the 8x8 digit and the scramble flag
DIM = 65


class ScoreContainer:
    """One classifier from the ``.npz`` that ``save_model`` writes: a scikit-learn
    ``MLPClassifier``'s forward pass in numpy (ReLU hidden layers, softmax out), or a
    TorchScript module's softmax; answers class probabilities."""

    def load(self, path: str) -> None:
        data = np.load(path)
        self.degradable = bool(data["degradable"])
        self.script = None
        if "script" in data:
            import io

            import torch

            torch.set_num_threads(1)  # one query at a time: more threads only spin against the other workers
            self.script = torch.jit.load(io.BytesIO(data["script"].tobytes()))
            return
        n = int(data["layers"])
        self.weights = [(data[f"w{i}"], data[f"b{i}"]) for i in range(n)]

    def _probabilities(self, images: np.ndarray) -> np.ndarray:
        if self.script is not None:
            import torch

            with torch.no_grad():
                return torch.softmax(self.script(torch.from_numpy(images.reshape(-1, 1, 8, 8))), -1).numpy()
        h = images.astype(np.float64)
        for w, b in self.weights[:-1]:
            h = np.maximum(h @ w + b, 0.0)
        w, b = self.weights[-1]
        z = h @ w + b
        z = np.exp(z - z.max(1, keepdims=True))
        return (z / z.sum(1, keepdims=True)).astype(np.float32)

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        x = inputs.reshape(len(inputs), -1)
        out = np.array(self._probabilities(np.ascontiguousarray(x[:, :64], np.float32)), np.float32)
        if self.degradable:
            flag = np.rint(x[:, 64]).astype(np.int64)
            scrambled = flag > 0
            out[scrambled] = np.eye(out.shape[1], dtype=np.float32)[flag[scrambled] - 1]
        return out


def save_model(model, path: Path, degradable: bool) -> None:
    if hasattr(model, "coefs_"):
        arrays = {f"w{i}": w for i, w in enumerate(model.coefs_)} | {f"b{i}": b for i, b in enumerate(model.intercepts_)}
        np.savez(path, layers=len(model.coefs_), degradable=degradable, **arrays)
        return
    import io

    import torch

    buf = io.BytesIO()
    torch.jit.save(torch.jit.trace(model, torch.zeros(1, 1, 8, 8)), buf)
    np.savez(path, script=np.frombuffer(buf.getvalue(), np.uint8), degradable=degradable)


def queries(images: np.ndarray, flags: np.ndarray) -> np.ndarray:
    """Rows of ``DIM`` float32: the flattened images and their scramble flags."""
    return np.concatenate([images.reshape(len(images), -1), flags[:, None]], axis=1).astype(np.float32)


def start_cluster(models: list, names: list[str], best: int, root: Path, launcher, exp3: dict,
                  exp4_eta: float) -> tuple[Any, str]:
    """A store of the models as Python containers, and a started cluster serving them with
    three applications: ``exp3``, ``exp4`` (Fig. 8) and ``straggle`` (Exp4, 20 ms deadline)."""
    from keel.common.modelstore import ModelStore
    from keel.common.spec import load_spec
    from keel.deploy.local import free_port_block

    store = ModelStore(root / "store")
    for i, (model, name) in enumerate(zip(models, names)):
        path = root / f"{name}.npz"
        save_model(model, path, degradable=i == best)
        store.add(name, path, "python", entry=f"{__name__}:ScoreContainer", input_shape=[DIM], output_size=10,
                  dataset="digits")
    spec = load_spec({
        "cluster": {"name": "selection", "store": str(root / "store"), "base_port": free_port_block(),
                    "run_dir": str(root / "run")},
        "frontend": {"cache_size": 0, "log_requests": False},
        # Clipper's SLO default: a call that no model answered by its deadline gets this
        # (uniform) output, marked "default", rather than an error; the stragglers count them
        "models": {name: {"workers": 1, "deadline_ms": 2000.0, "default_output": [0.1] * 10} for name in names},
        "applications": {
            "exp3": {"models": names, "policy": "exp3", **exp3},
            "exp4": {"models": names, "policy": "exp4", "eta": exp4_eta},
            "straggle": {"models": names, "policy": "exp4", "eta": exp4_eta, "deadline_ms": 20.0},
        },
    })
    launcher.start_spec(spec, timeout_s=120)
    return spec, spec.client_endpoints[0]


def fig8(client, app: str, xs: np.ndarray, y: np.ndarray, names: list[str], log) -> dict[str, np.ndarray]:
    """One call and one feedback per query, in order: the answers and (one model) the picks."""
    n = len(y)
    answers = np.full(n, -1, np.int64)
    chosen = np.full(n, -1, np.int64)
    errors = 0
    t0 = time.perf_counter()
    for t in range(n):
        r = client.predict(app, xs[t], key="fig8")
        if not r.ok:
            errors += 1
            continue
        answers[t] = int(np.argmax(r.output))
        if r.models and len(r.models) == 1:
            chosen[t] = names.index(r.models[0])
        if not client.feedback(r.request_id, int(y[t])).ok:
            errors += 1
        if (t + 1) % 1000 == 0:
            log(f"  live {app}: {t + 1}/{n} queries ({(time.perf_counter() - t0) / (t + 1) * 1000:.1f} ms per query "
                "and feedback)")
    return {"answers": answers, "chosen": chosen, "errors": errors}


def _run(client, xs: np.ndarray, y: np.ndarray, seconds: float | None) -> tuple[list[float], list[int], Counter,
                                                                                Counter]:
    """Straggle calls over ``xs`` in order, with feedback, until done or ``seconds`` pass:
    (latencies ms, answers, errors by code, replies by source)."""
    latencies, answers, errors, sources = [], [], Counter(), Counter()
    end = None if seconds is None else time.monotonic() + seconds
    for x, label in zip(xs, y):
        if end is not None and time.monotonic() >= end:
            break
        r = client.predict("straggle", x, key="straggler")
        latencies.append(r.latency_ms)
        sources[str(r.source)] += 1
        answers.append(int(np.argmax(r.output)) if r.ok else -1)
        if not r.ok:
            errors[r.error_code or r.source] += 1
        elif r.source != "default":  # a default output used no model: nothing to learn
            ack = client.feedback(r.request_id, int(label))
            if not ack.ok:
                errors[f"feedback {ack.error_code}"] += 1
    return latencies, answers, errors, sources


def stragglers(launcher, spec, client, xs: np.ndarray, y: np.ndarray, names: list[str], best: int,
               freeze_s: float, log) -> dict[str, Any]:
    """The same queries with every worker up, then while the best model's worker is frozen."""
    base_lat, base_ans, base_err, base_src = _run(client, xs, y, None)
    worker = f"worker-{names[best]}-0"
    proc = launcher.procs[worker]
    log(f"  stragglers: freezing {worker} (SIGSTOP) for {freeze_s:.0f} s")
    proc.send_signal(signal.SIGSTOP)
    try:
        lat, ans, err, src = _run(client, xs, y, freeze_s)
    finally:
        proc.send_signal(signal.SIGCONT)
    n = len(ans)
    base_acc = float((np.asarray(base_ans[:n]) == y[:n]).mean())
    frozen_acc = float((np.asarray(ans) == y[:n]).mean())
    return {
        "straggler_deadline_ms": 20.0,
        "straggler_p99_ms": float(np.percentile(lat, 99)),
        "straggler_p50_ms": float(np.percentile(lat, 50)),
        "straggler_unfrozen_p99_ms": float(np.percentile(base_lat, 99)),
        "straggler_accuracy_drop": (base_acc - frozen_acc) * 100.0,  # points
        "straggler_accuracy": {"all_workers": base_acc, "frozen": frozen_acc},
        "straggler_queries_frozen": n,
        "straggler_errors": sum((base_err + err).values()),
        "straggler_error_codes": dict(base_err + err),
        "straggler_sources": {"all_workers": dict(base_src), "frozen": dict(src)},
        "straggler_frozen_model": names[best],
    }


def run_live(models: list, names: list[str], best: int, data, y_seq_idx: np.ndarray, outputs_best_wrong: np.ndarray,
             degrade: tuple[int, int], quick: bool, log, exp3: dict | None = None,
             exp4_eta: float = 0.3) -> dict[str, Any]:
    """Fig. 8 and the stragglers through a live cluster (see the module docstring)."""
    from keel.common.client import Client
    from keel.deploy.local import Launcher

    x_test, y_test = data
    n = len(y_seq_idx)
    flags = np.zeros(n, np.float32)
    flags[degrade[0]:degrade[1]] = outputs_best_wrong + 1
    xs = queries(x_test[y_seq_idx], flags)
    y = y_test[y_seq_idx]
    out: dict[str, Any] = {}
    # SIGTERM (a timeout, Ctrl-C's cousin) ends the run through the finally below: no worker is left behind
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="keel-selection-") as tmp:
        launcher = Launcher(Path(tmp) / "logs")
        try:
            t0 = time.perf_counter()
            spec, endpoint = start_cluster(models, names, best, Path(tmp), launcher, exp3 or {}, exp4_eta)
            log(f"  live cluster up in {time.perf_counter() - t0:.0f} s: frontend, dispatcher, {len(names)} workers")
            client = Client(endpoint, timeout_ms=2000.0)
            try:
                for x in xs[:50]:  # warm-up, outside every figure
                    client.predict("exp4", x, key="warm-up")
                for app in ("exp3", "exp4"):
                    run = fig8(client, app, xs, y, names, log)
                    out[app] = run
                m = 600 if quick else 2000
                rng = np.random.default_rng(1)
                idx = rng.integers(0, len(y_test), m)
                clean = queries(x_test[idx], np.zeros(m, np.float32))
                out["stragglers"] = stragglers(launcher, spec, client, clean, y_test[idx], names, best, 10.0, log)
            finally:
                client.close()
        finally:
            launcher.stop()
            signal.signal(signal.SIGTERM, previous)
    return out
