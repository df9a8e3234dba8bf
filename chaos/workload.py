"""Open-loop Poisson workload from a real dataset, run on a client host, recorded per request.

The generator is a process (``python -m keel.chaos.workload --config FILE``) so that in netns
mode it runs inside the client host's namespace. It drives one Keel ``Client`` per mode
(deployment), each on its own thread and all from the same seeded schedule, so modes
see identical arrival times and inputs. Sends follow the schedule whether or not
earlier queries were answered; the run is bounded by ``count`` and ``duration_s``,
then waits at most ``drain_s`` for outstanding answers.

One JSON line per request in ``records-MODE.jsonl``::

    {"mode", "i", "request_id", "input_index", "send_t",
     "replies": [{"recv_t", "source", "error_code", "error", "output", "version", "latency_ms"}]}

``replies`` is empty for a request nobody answered before the drain ended, and holds
more than one entry only if a frontend answered the same id twice (the client library
drops such duplicates; the recording client keeps them for the invariants).
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import orjson

from keel.chaos.probes import wait_file, write_json
from keel.common.loadgen import MAX_REQUESTS, schedule

MAX_DURATION_S = 3600.0


@dataclass
class WorkloadConfig:
    """A bounded open-loop workload. ``count`` and ``duration_s`` both bound it."""

    model: str
    rate: float = 100.0
    count: int | None = 1000
    duration_s: float = 30.0
    dataset: str = "digits"
    seed: int = 0
    timeout_ms: float = 1000.0
    retries: int = 1
    drain_s: float = 5.0
    #: where the generator runs (a host of the experiment; made if the spec lacks it)
    client_host: str = "client"
    #: the model's query shape; filled from the cluster spec when None
    input_shape: list[int] | None = None
    keep_outputs: bool = True
    modes: dict[str, list[str]] = field(default_factory=dict)  # mode -> frontend endpoints

    def validate(self) -> None:
        if not 0 < self.rate <= 100_000:
            raise ValueError("workload.rate must be in (0, 100000] per second")
        if not 0 < self.duration_s <= MAX_DURATION_S:
            raise ValueError(f"workload.duration_s must be in (0, {MAX_DURATION_S}]: every run is bounded")
        if self.count is not None and not 0 < self.count <= MAX_REQUESTS:
            raise ValueError(f"workload.count must be in (0, {MAX_REQUESTS}]")
        if self.timeout_ms <= 0 or self.drain_s < 0 or self.retries < 0:
            raise ValueError("workload.timeout_ms > 0, drain_s >= 0, retries >= 0")


@functools.lru_cache(maxsize=4)
def _dataset(dataset: str) -> np.ndarray:
    try:
        from keel.training.datasets import load

        ds = load(dataset)
        return np.concatenate([ds.x_train, ds.x_test]).astype(np.float32)
    except ImportError:  # the training package is optional for the harness
        if dataset != "digits":
            raise
        from sklearn.datasets import load_digits

        return (load_digits().data / 16.0).astype(np.float32)


def load_inputs(dataset: str, input_shape: list[int] | None) -> np.ndarray:
    """Every example of ``dataset`` (train then test), float32, shaped to the model's query shape."""
    x = _dataset(dataset)
    if input_shape:
        want = int(np.prod(input_shape))
        flat = x.reshape(len(x), -1)
        if flat.shape[1] != want:  # a builtin model of another width: tile or cut the features
            flat = np.resize(flat, (len(x), want))
        x = flat.reshape(len(x), *input_shape)
    return np.ascontiguousarray(x)


def read_records(path: Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


# ---------------------------------------------------------------------- harness side


class Workload:
    """Start the generator on the client host, wait for it, read its records."""

    def __init__(self, cfg: WorkloadConfig, out_dir: Path):
        cfg.validate()
        self.cfg, self.dir = cfg, Path(out_dir)
        self.proc = None

    def start(self, cluster) -> Workload:
        """Spawn the generator. It says when it is ready (``wait_ready``) and sends from the
        wall time ``go`` gives it, so a slow start-up (imports on a loaded machine take
        seconds) never shifts its schedule against the faults'."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in [self.dir / "done.json", self.dir / "ready.json", self.dir / "go.json",
                      *self.dir.glob("records-*.jsonl")]:
            stale.unlink(missing_ok=True)
        path = self.dir / "workload.json"
        # the generator reads the inputs from here: it never imports the dataset code
        np.save(self.dir / "inputs.npy", load_inputs(self.cfg.dataset, self.cfg.input_shape))
        write_json(path, {**asdict(self.cfg), "out_dir": str(self.dir),
                          "inputs": str(self.dir / "inputs.npy")})
        self.proc = cluster.spawn(self.cfg.client_host, [sys.executable, "-m", "keel.chaos.workload", "--config", str(path)],
                                  "workload", kind="aux", restartable=False)
        self.cluster = cluster
        return self

    def wait_ready(self, timeout: float) -> None:
        if wait_file(self.dir / "ready.json", timeout, alive=self.proc.running) is None:
            raise RuntimeError(f"workload generator not ready within {timeout:.0f} s; see {self.proc.log}")

    def go(self, start_at: float) -> None:
        write_json(self.dir / "go.json", {"start_at": start_at})

    def bound_s(self) -> float:
        """Longest the generator can take: schedule + retries + drain, plus start-up."""
        patience = (self.cfg.timeout_ms + max(250.0, self.cfg.timeout_ms / 2)) / 1000.0 * (self.cfg.retries + 1)
        return self.cfg.duration_s + patience + self.cfg.drain_s + 30.0

    def wait(self, timeout: float | None = None) -> dict:
        done = wait_file(self.dir / "done.json", timeout or self.bound_s(), alive=self.proc.running)
        if self.proc.running():
            self.cluster.stop(self.proc)
        return done or {"error": f"workload ended without finishing; see {self.proc.log}"}

    def records(self) -> dict[str, list[dict]]:
        return {mode: read_records(self.dir / f"records-{mode}.jsonl") for mode in self.cfg.modes}


# ---------------------------------------------------------------------- the generator


def _recording_client(frontends: list[str], timeout_ms: float, retries: int, duplicates: list):
    from keel.common.client import Client

    class RecordingClient(Client):
        """Keeps the answers the library drops as duplicates, for the invariants."""

        def _result(self, reply, frontend):  # noqa: ANN001 - the library's own hook
            rid = getattr(reply, "request_id", None)
            if rid is not None and rid not in self.calls:
                duplicates.append((time.time(), reply))
            return super()._result(reply, frontend)

    return RecordingClient(frontends, timeout_ms=timeout_ms, retries=retries)


def _reply(result, keep_outputs: bool) -> dict:
    out = result.output if keep_outputs and result.output is not None else None
    return {"recv_t": time.time(), "source": str(result.source), "error_code": result.error_code and str(result.error_code),
            "error": result.error, "output": None if out is None else np.asarray(out, np.float32).ravel().tolist(),
            "version": result.version, "latency_ms": result.latency_ms}


def drive(mode: str, frontends: list[str], cfg: dict, inputs: np.ndarray, offsets: np.ndarray, rows: np.ndarray,
          start_at: float, out: Path) -> dict:
    """Send the schedule to one deployment and write its records; returns counts."""
    duplicates: list = []
    client = _recording_client(frontends, cfg["timeout_ms"], cfg["retries"], duplicates)
    records: dict[str, dict] = {}
    order: list[str] = []

    def absorb(results) -> None:
        for r in results:
            rec = records.get(r.request_id)
            if rec is not None:
                rec["replies"].append(_reply(r, cfg["keep_outputs"]))

    try:
        i, n = 0, len(offsets)
        while i < n:
            due = start_at + offsets[i]
            now = time.time()
            if now >= due:
                rid = f"{mode}-{cfg['seed']}-{i}"
                records[rid] = {"mode": mode, "i": i, "request_id": rid, "input_index": int(rows[i]), "send_t": now,
                                "replies": []}
                order.append(rid)
                client.submit(cfg["model"], inputs[rows[i]], request_id=rid)
                i += 1
                continue
            absorb(client.collect(min(5.0, (due - now) * 1000.0)))
        drain_end = time.time() + cfg["drain_s"] + (cfg["timeout_ms"] / 1000.0 + 0.5) * (cfg["retries"] + 1)
        while client.calls and time.time() < drain_end:
            absorb(client.collect(20.0))
        for t, reply in duplicates:
            rec = records.get(reply.request_id)
            if rec is not None:
                out_arr = getattr(reply, "output", None)
                rec["replies"].append({"recv_t": t, "source": str(reply.source), "error_code": reply.error_code and str(reply.error_code),
                                       "error": reply.error, "duplicate": True, "version": reply.version, "latency_ms": None,
                                       "output": None if out_arr is None else np.asarray(out_arr, np.float32).ravel().tolist()})
    finally:
        client.close()
    with open(out, "wb") as f:
        for rid in order:
            f.write(orjson.dumps(records[rid]) + b"\n")
    return {"sent": len(order), "unanswered": sum(1 for r in records.values() if not r["replies"]),
            "duplicates": len(duplicates)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keel.chaos.workload")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    cfg = orjson.loads(Path(args.config).read_bytes())
    out_dir = Path(cfg["out_dir"])
    inputs = np.load(cfg["inputs"]) if cfg.get("inputs") else load_inputs(cfg["dataset"], cfg.get("input_shape"))
    offsets, rows = schedule(cfg["rate"], cfg.get("count"), cfg["seed"], len(inputs), cfg["duration_s"])
    from keel.common.client import Client  # noqa: F401 - imported before "ready", not on the clock

    write_json(out_dir / "ready.json", {"pid": os.getpid()})
    go = wait_file(out_dir / "go.json", 300.0)  # the harness sets the start once every generator is ready
    if go is None:
        return 1
    stats: dict[str, dict] = {}

    def run(mode: str, frontends: list[str]) -> None:
        try:
            stats[mode] = drive(mode, frontends, cfg, inputs, offsets, rows, go["start_at"], out_dir / f"records-{mode}.jsonl")
        except Exception as exc:  # reported in done.json, never silently lost
            stats[mode] = {"error": f"{type(exc).__name__}: {exc}"}

    threads = [threading.Thread(target=run, args=(m, fe), name=f"mode-{m}") for m, fe in cfg["modes"].items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    write_json(out_dir / "done.json", {"modes": stats, "scheduled": len(offsets), "finished_t": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
