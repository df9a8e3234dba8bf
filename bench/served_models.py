"""``keel experiment served-models``: the three seed models trained, served from one spec
(deploy/examples/models.toml) and checked through every client, and the localizer's
accuracy under ParM with one deployed worker frozen.

1. Train the recommender, the text classifier and the localizer with its k = 2 parity
   model into ``runs/served-models/store`` (reused when there: ``--retrain`` forces it;
   ``--quick`` trains with fewer steps into a store of its own).
2. Serve deploy/examples/models.toml with that store (ports and run folder replaced) and
   send each model a bounded set of requests through the sync client, the async client,
   ``keel predict`` and tritonclient http and grpc: every answer must equal the model run
   offline on that request alone (floats to 1e-5); the localizer's answers that ParM's
   parity path delivered first (reconstructions) are counted apart.
3. Freeze one deployed localizer worker again and again (SIGSTOP for 0.3 s, running
   0.05 s) while a bounded test set of placed digits (mnist5k's test split, seeded places)
   is sent a coding group at a time: A_a (top-1 of the model's own answers) and A_d (of the
   reconstructions), and each one's mean box IoU against the ground truth, beside the
   offline figures the training wrote in the parity model's manifest (every test query
   rebuilt there, only those the freezes caught here).

Example
-------
    keel experiment served-models --quick
"""
from __future__ import annotations

import argparse
import asyncio
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson

from keel.common.async_client import AsyncClient
from keel.common.client import Client
from keel.common.protocol import Source
from keel.common.spec import load_spec
from keel.deploy.local import Launcher, free_port, free_port_block

EXAMPLE = Path(__file__).resolve().parents[1] / "deploy" / "examples" / "models.toml"
MODELS = {"rec": "rec-dlrm", "text": "text-gru", "loc": "mnist-loc"}
PARITY = "mnist-loc-parity-k2-add"
CLIENTS = ("sync", "async", "keel_predict", "triton_http", "triton_grpc")
PATIENT_MS = 30_000

FIGURES = ("mismatches", "answers_checked", "loc_reconstructed_in_checks", "frozen_queries", "frozen_reconstructed",
           "A_a", "A_d", "iou_a", "iou_d", "offline_A_a", "offline_A_d", "offline_iou_a", "offline_iou_d",
           "train_s", "serve_s")
TARGETS = {"mismatches": "== 0", "frozen_reconstructed": ">= 1"}


def spec_text(path: Path, **keys) -> str:
    """The spec at ``path`` with each top-level ``key = ...`` line given set to its value
    (a string is quoted): the example as written, but for where it reads and binds."""
    text = path.read_text()
    for key, value in keys.items():
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {orjson.dumps(value).decode()}", text, count=1, flags=re.M)
        if n != 1:
            raise ValueError(f"{path}: no line '{key} = ...'")
    return text


def train(store: Path, quick: bool, retrain: bool, log) -> float:
    """The three models into ``store`` unless there already; seconds spent."""
    from keel.training.localizer import train_localizer
    from keel.training.recommender import train_recommender
    from keel.training.text_classifier import train_text_classifier

    runs, t0 = str(store.parent / "train"), time.monotonic()
    have = lambda name: not retrain and (store / name).is_dir()  # noqa: E731
    if not have("rec-dlrm"):
        train_recommender(str(store), epochs=1 if quick else 6, runs_dir=runs)
    if not have("text-gru"):
        train_text_classifier(str(store), epochs=1 if quick else 3, runs_dir=runs)
    if not (have("mnist-loc") and have(PARITY)):
        train_localizer(str(store), runs_dir=runs, **({"steps": 300, "parity_steps": 200} if quick else {}))
    log(f"models in {store} ({time.monotonic() - t0:.0f} s training)")
    return time.monotonic() - t0


def offline_models(store: Path):
    """``f(model, request) -> outputs``: each model run in this process on one request alone."""
    from keel.common.containers import store_predictor
    from keel.common.named_containers import call_rows

    predictors = {m: store_predictor(str(store), name, None) for m, name in MODELS.items()}
    signatures = {m: p.manifest.signature_of() for m, p in predictors.items()}
    return lambda model, request: call_rows(predictors[model], signatures[model], [request])[0][0]


def requests_for(model: str, n: int, seed: int) -> list[dict]:
    """Bounded requests of mixed lengths: id bags of 1..40, generated reviews, placed digits."""
    rng = np.random.default_rng(seed)
    if model == "rec":
        from keel.training.recommender import RecConfig

        return [{"dense": rng.standard_normal(13).astype(np.float32),
                 **{f"bag{b}": rng.integers(0, v, int(rng.integers(1, 41))).astype(np.int64)
                    for b, v in enumerate(RecConfig.vocab)}} for _ in range(n)]
    if model == "text":
        from keel.training.text_classifier import generate

        return [{"text": np.array(t.encode(), dtype=object)} for t in generate(n, seed)[0]]
    x, _, _ = placed_digits(n, seed)
    return [{"image": row} for row in x]


def placed_digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` digits of mnist5k's test split on canvases: (images, labels, boxes)."""
    from keel.training import datasets
    from keel.training.localizer import place

    ds = datasets.load("mnist5k")
    idx = np.random.default_rng([seed, 1]).permutation(len(ds.x_test))[:n]
    x, box = place(ds.x_test[idx], np.random.default_rng([seed, 99]))
    return x, ds.y_test[idx], box


def same(got: dict, want: dict) -> bool:
    if set(got) != set(want):
        return False
    for name, value in want.items():
        if value.dtype.kind == "O":
            if np.asarray(got[name], dtype=object).reshape(value.shape).tolist() != value.tolist():
                return False
        elif not np.allclose(np.reshape(got[name], value.shape), value, rtol=1e-5, atol=1e-5):
            return False
    return True


def _triton(transport: str, port: int, model: str, requests: list[dict]) -> list[tuple[dict, str]]:
    """Each request as a row of its own, all in flight at once: (outputs, keel's source)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    lib = httpclient if transport == "http" else grpcclient
    client = lib.InferenceServerClient(f"127.0.0.1:{port}", **({"concurrency": 8} if transport == "http" else {}))

    def inputs(request: dict) -> list:
        made = []
        for name, x in request.items():
            datatype = "BYTES" if x.dtype == object else {"float32": "FP32", "int64": "INT64"}[x.dtype.name]
            made.append(lib.InferInput(name, [1, *x.shape], datatype))
            made[-1].set_data_from_numpy(x[None])
        return made

    try:
        if transport == "http":
            results = [call.get_result() for call in [client.async_infer(model, inputs(r)) for r in requests]]
        else:
            with ThreadPoolExecutor(8) as pool:
                results = list(pool.map(lambda r: client.infer(model, inputs(r)), requests))
    finally:
        client.close()
    out = []
    for result in results:
        response = result.get_response()
        source = response["parameters"]["keel_sources"][0] if transport == "http" else \
            response.parameters["keel_sources"].string_param.split(",")[0]
        names = [o["name"] for o in response["outputs"]] if transport == "http" else [o.name for o in response.outputs]
        out.append(({n: result.as_numpy(n)[0] for n in names}, source))
    return out


def _keel_predict(spec_file: Path, model: str, request: dict) -> tuple[dict, str]:
    args = []
    for name, x in request.items():
        value = x.item().decode() if x.dtype.kind == "O" else x.tolist()
        args += ["--input", f"{name}={orjson.dumps(value).decode()}"]
    done = subprocess.run([str(Path(sys.executable).parent / "keel"), "predict", "--spec", str(spec_file), model, *args,
                           "--timeout-ms", str(PATIENT_MS)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"keel predict {model}: {done.stderr.strip()[-300:]}")
    answer = orjson.loads(done.stdout)
    outputs = {n: np.array([s.encode() for s in np.ravel(v)], dtype=object).reshape(np.shape(v))
               if isinstance(np.ravel(v)[0], str) else np.asarray(v, np.float32) for n, v in answer["outputs"].items()}
    return outputs, answer["source"]


def answers(client: str, spec, spec_file: Path, ports: tuple[int, int], model: str,
            requests: list[dict]) -> list[tuple[dict, str]]:
    """``requests`` to ``model`` through one client: (outputs, source) each."""
    if client == "sync":
        with Client(spec.client_endpoints, timeout_ms=PATIENT_MS, raise_errors=True) as c:
            return [(r.outputs, str(r.source)) for r in c.predict_batch(model, requests, window=16)]
    if client == "async":
        async def run() -> list:
            async with AsyncClient(spec.client_endpoints, timeout_ms=PATIENT_MS, raise_errors=True) as c:
                return await asyncio.gather(*(c.predict(model, r) for r in requests))

        return [(r.outputs, str(r.source)) for r in asyncio.run(run())]
    if client == "keel_predict":
        return [_keel_predict(spec_file, model, r) for r in requests[:2]]  # a process each: two
    return _triton(client.removeprefix("triton_"), ports[0] if client == "triton_http" else ports[1], model, requests)


def check_clients(spec, spec_file: Path, ports: tuple[int, int], offline, n: int, log) -> dict:
    checks: dict[str, dict[str, int]] = {}
    for model in MODELS:
        requests = requests_for(model, n, seed=3)
        for client in CLIENTS:
            got = answers(client, spec, spec_file, ports, model, requests)
            row = Counter()
            for request, (outputs, source) in zip(requests, got):
                if source == Source.RECONSTRUCTION:
                    row["reconstructed"] += 1  # ParM's parity path came first: not the model's own answer
                else:
                    row["equal" if same(outputs, offline(model, request)) else "differ"] += 1
            checks[f"{model}/{client}"] = dict(row)
            log(f"  {model:<5} {client:<13} {dict(row)}")
    return checks


def frozen_localizer(run: Launcher, spec, n: int, log, stopped_s: float = 0.3, running_s: float = 0.05) -> dict:
    """The test set, one coding group (two queries) at a time, while worker-loc-0 is frozen
    (SIGSTOP) for ``stopped_s`` in every ``stopped_s + running_s``: a worker holds one
    query at a time, and frozen for longer than the dispatcher's liveness (2 s) it would be
    dropped and its query re-queued, so short freezes, each catching the query it holds,
    give the decoder queries to rebuild all along the test set. Each answer is graded by
    where it came from."""
    import threading

    from keel.training.localizer import iou

    x, labels, boxes = placed_digits(n, seed=7)
    frozen, results, done = "worker-loc-0", [], threading.Event()

    def freezes() -> None:
        while not done.is_set():
            run.procs[frozen].send_signal(signal.SIGSTOP)
            done.wait(stopped_s)
            run.procs[frozen].send_signal(signal.SIGCONT)
            done.wait(running_s)

    toggler = threading.Thread(target=freezes, daemon=True)
    toggler.start()
    try:
        with Client(spec.client_endpoints, timeout_ms=PATIENT_MS) as c:
            for at in range(0, n, 2):
                results += c.predict_batch("loc", [{"image": row} for row in x[at:at + 2]], window=2)
                time.sleep(stopped_s / 2)  # about two groups a freeze: most freezes catch a query
    finally:
        done.set()
        toggler.join()
        run.procs[frozen].send_signal(signal.SIGCONT)
    out: dict = {"frozen_queries": n, "frozen_sources": dict(Counter(str(r.source) for r in results))}
    for tag, source in (("a", Source.MODEL), ("d", Source.RECONSTRUCTION)):
        idx = [i for i, r in enumerate(results) if r.source == source and r.outputs]
        if not idx:
            continue
        logits = np.stack([results[i].outputs["logits"] for i in idx])
        box = np.stack([results[i].outputs["box"] for i in idx])
        out[f"A_{tag}"] = float((logits.argmax(1) == labels[idx]).mean())
        out[f"iou_{tag}"] = float(iou(box, boxes[idx]).mean())
    out["frozen_reconstructed"] = out["frozen_sources"].get(str(Source.RECONSTRUCTION), 0)
    log(f"  frozen {frozen}: {out['frozen_sources']}")
    return out


def run(args: argparse.Namespace, log=print) -> dict:
    from keel.common.modelstore import ModelStore

    quick = bool(args.quick)
    folder = Path("runs") / ("served-models-quick" if quick else "served-models")
    store = Path(args.store) if args.store else folder / "store"
    log(f"served-models: three seed models from {EXAMPLE.relative_to(EXAMPLE.parents[2])}, store {store}")
    report: dict = {"quick": quick, "store": str(store), "train_s": train(store, quick, args.retrain, log)}
    metrics = ModelStore(str(store)).manifest(PARITY, None).metrics
    report.update({f"offline_{k}": metrics[k] for k in ("A_a", "A_d", "iou_a", "iou_d") if k in metrics})

    t0 = time.monotonic()
    with Launcher(folder / "logs") as launcher:
        ports = (free_port(), free_port())
        spec_file = folder / "models.toml"
        spec_file.write_text(spec_text(EXAMPLE, store=str(store.resolve()), run_dir=str(launcher.log_dir.resolve()),
                                       base_port=free_port_block(), http_port=ports[0], grpc_port=ports[1]))
        spec = launcher.start_spec(load_spec(str(spec_file)))
        offline = offline_models(store)
        log(f"every client, {args.requests} requests per model (keel predict: 2), against the models offline:")
        report["checks"] = check_clients(spec, spec_file, ports, offline, args.requests, log)
        report.update(frozen_localizer(launcher, spec, args.queries or (100 if quick else 400), log))
    report["serve_s"] = time.monotonic() - t0
    rows = report["checks"].values()
    report["mismatches"] = sum(r.get("differ", 0) for r in rows)
    report["answers_checked"] = sum(r.get("equal", 0) for r in rows)
    report["loc_reconstructed_in_checks"] = sum(r.get("reconstructed", 0) for r in rows)
    return report


def passed(report: dict) -> bool:
    return report["mismatches"] == 0 and report.get("frozen_reconstructed", 0) >= 1


def plot(report: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in ("A_a", "A_d", "iou_a", "iou_d") if k in report]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    at = np.arange(len(keys))
    ax.bar(at - 0.2, [report.get(f"offline_{k}", 0) for k in keys], 0.4, label="offline (training)")
    ax.bar(at + 0.2, [report[k] for k in keys], 0.4, label="served, one worker frozen in turns")
    ax.set_xticks(at, keys)
    ax.set_ylim(0, 1)
    ax.set_title("localizer under ParM k=2: top-1 and mean box IoU")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def options(e: argparse.ArgumentParser) -> None:
    """``keel experiment served-models``'s own options."""
    e.add_argument("--store", help="the model store (default runs/served-models[-quick]/store)")
    e.add_argument("--retrain", action="store_true", help="train the three models even if the store has them")
    e.add_argument("--requests", type=int, default=16, help="requests per model and client (default 16)")
    e.add_argument("--queries", type=int, help="placed digits sent with a worker frozen (default 400, quick 100)")
