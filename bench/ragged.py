"""``keel bench ragged``: batching requests of variable length, padded vs equal shapes only.

A bag-of-ids model (``ids`` int64 of 4..64 ids, a mask the batcher fills; a masked mean of
embeddings through a small dense layer: a Python class, ``BagModel`` below) is served twice
in one cluster, under two ragged policies (``common.ragged``, ``services.scheduling.ragged``):

- ``pad``: anything queued goes in one batch, padded by the worker to the batch's largest;
- ``equal``: equal shapes only (Triton's default dynamic batcher); with lengths drawn
  uniformly from 4..64 a batch rarely holds more than one or two requests.

For each, the highest open-loop Poisson rate whose p99 stays <= 50 ms with every request
answered by the model (``bench.rates.max_rate``: a bisection, a failed rate re-probed by a
majority of three), the two searches alternated ``REPEATS`` times in one run (one with
``--quick``) so drift hits both; and the padding waste the ``pad`` worker recorded
(padded elements / elements computed). Target: pad >= 1.5x equal.

Figures:

- ``pad_throughput_rps`` / ``equal_throughput_rps``: the medians of the searches;
- ``pad_vs_equal``: their ratio;
- ``pad_waste``: the pad worker's padding waste over the run;
- ``pad_batches`` / ``equal_batches``: batches each worker ran (the same requests offered:
  fewer batches, larger ones).
"""
from __future__ import annotations

import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from keel.bench import rates

FIGURES = ("pad_throughput_rps", "equal_throughput_rps", "pad_vs_equal", "pad_waste", "pad_batches", "equal_batches")
TARGETS = {"pad_vs_equal": ">= 1.5"}
SLO_P99_MS = 50.0
REPEATS = 2
LENGTHS = (4, 64)

MODEL = textwrap.dedent('''
    import numpy as np

    class BagModel:
        """A masked mean of each request's id embeddings through a dense layer."""

        def __init__(self):
            rng = np.random.default_rng(0)
            self.table = rng.standard_normal((1000, 32)).astype(np.float32)
            self.w = rng.standard_normal((32, 8)).astype(np.float32)

        def predict_batch(self, inputs):
            ids, mask = inputs["ids"], inputs["ids_mask"].astype(np.float32)
            bag = (self.table[ids % 1000] * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1.0)
            return {"score": np.tanh(bag @ self.w)}
''')


def options(parser) -> None:
    parser.add_argument("--seconds", type=float, default=None, help="each probe's length (default 3, --quick 1.5)")


def _store(root: str) -> str:
    from keel.common.model_add import add_model

    path = Path(root) / "bag.py"
    path.write_text(MODEL)
    add_model(str(Path(root) / "store"), "bag", None, python=f"{path}:BagModel",
              inputs=[f"ids:int64:{LENGTHS[0]}..{LENGTHS[1]}", "ids_mask:bool:mask=ids"])
    return str(Path(root) / "store")


def _requests(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(0, 1000, int(rng.integers(LENGTHS[0], LENGTHS[1] + 1))).astype(np.int64)}
            for _ in range(n)]


def run(args, log=print) -> dict:
    from keel.common.client import Client
    from keel.common.spec import load_spec
    from keel.common.transport import request_status
    from keel.deploy.local import Launcher, free_port_block

    quick = bool(getattr(args, "quick", False))
    seconds = args.seconds or (1.5 if quick else 3.0)
    repeats = 1 if quick else REPEATS
    out: dict = {"quick": quick, "slo_p99_ms": SLO_P99_MS, "lengths": list(LENGTHS), "probe_seconds": seconds,
                 "repeats": repeats, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    xs = _requests(2000)
    with tempfile.TemporaryDirectory(prefix="keel-bench-ragged-") as tmp:
        store = _store(tmp)
        with Launcher(Path(tmp) / "logs") as launcher:
            spec = load_spec({
                "cluster": {"name": "bench-ragged", "store": store, "base_port": free_port_block(),
                            "run_dir": str(launcher.log_dir)},
                "frontend": {"log_requests": False, "cache_size": 0},
                "models": {policy: {"store_name": "bag", "ragged": policy, "workers": 1, "max_batch": 64,
                                    "deadline_ms": 1000.0} for policy in ("pad", "equal")},
            })
            launcher.start_spec(spec)
            found: dict[str, list[float]] = {"pad": [], "equal": []}
            with Client(spec.client_endpoints, timeout_ms=5000) as client:
                for policy in found:  # warm both
                    client.predict_batch(policy, xs[:64])
                for r in range(repeats):
                    for policy in ("pad", "equal") if r % 2 == 0 else ("equal", "pad"):
                        log(f"{policy} (repeat {r + 1}/{repeats}): throughput at p99 <= {SLO_P99_MS:g} ms ...")
                        rate, rows = rates.max_rate(
                            lambda rate: rates.probe(client, policy, xs, rate, seconds, SLO_P99_MS),
                            start=200.0, limit=20_000.0, log=log)
                        found[policy].append(rate)
                        out.setdefault(f"{policy}_probes", []).extend(rows)
            for policy, runs in found.items():
                rates.put(out, f"{policy}_throughput_rps", rates.spread(runs))
            for name, endpoint in spec.status_endpoints().items():  # each worker's padding waste (its Status)
                info = request_status(endpoint, 2.0) or {}
                model = info.get("model")
                if info.get("role") == "worker" and model in found:
                    out[f"{model}_waste"] = info.get("padding_waste")
                    out[f"{model}_batches"] = info.get("padded_batches")

    equal = out.get("equal_throughput_rps") or 0.0
    out["pad_vs_equal"] = round(out["pad_throughput_rps"] / equal, 3) if equal else None
    return out


def passed(report: dict) -> bool:
    return (report.get("pad_vs_equal") or 0.0) >= 1.5
