"""The step load of ``keel experiment serf`` (``bench.serf_experiment``): low, high, low,
high, on the same arrivals for every fixed configuration and for the adaptive
configurator, and the bound on any configurator (each phase's best fixed).

Where SERF's choice matters (the emulated 8-core host, ``common.serf_host``), the best
configuration at a light load (all threads on one request) is slow at a heavy one and the
other way round, yet a middle configuration is never far from either. A request-weighted
mean over equal phases is mostly the high phases' requests, so the low phases last
``LOW_FACTOR`` times as long (the same order of requests in each phase): then the whole
run can show what switching gains (``oracle_over_best_single_fixed``).

Fixed runs: the configurations given (the experiment passes its candidates: the reference
table's picks over the loads and the extremes), each started from the same warm-up.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from keel.common.client import Client
from keel.common.loadgen import open_loop, schedule, summarize
from keel.common.steal import least_starved
from keel.common.transport import request_status
from keel.deploy.local import Launcher
from keel.services.serf.profiler import set_configuration

#: the share of a run's first requests left out of its mean (the queue starts empty)
WARMUP = 0.1
#: the step's levels, fractions of the largest capacity, and how much longer a low phase lasts
LOW, HIGH, LOW_FACTOR = 0.2, 0.85, 3.0


def run_load(client: Client, model: str, inputs: np.ndarray, rate: float, seconds: float, count: int, seed: int,
             offsets: np.ndarray | None = None) -> tuple[list, dict]:
    """``count`` Poisson arrivals at ``rate``, cut at ``seconds`` (or the given offsets)."""
    n = len(offsets) if offsets is not None else count
    records = open_loop(client, model, inputs, rate, n, seed=seed, duration_s=seconds if offsets is None else 1e9,
                        timeout_ms=60_000.0, drain_s=30.0, offsets=offsets)
    return records, summarize(records)


def mean_after_warmup(records) -> float:
    lat = [r.latency_ms for r in records[int(WARMUP * len(records)):] if r.latency_ms is not None and not r.error_code]
    return float(np.mean(lat)) if lat else float("nan")


def _durations(starts: list[float], phase_s: float | list[float]) -> list[float]:
    return list(phase_s) if isinstance(phase_s, (list, tuple)) else [phase_s] * len(starts)


def step_offsets(low: float, high: float, phase_s: float, seed: int,
                 low_factor: float = 1.0) -> tuple[np.ndarray, list[float], list[float]]:
    """Poisson arrivals of low, high, low, high phases (a low one ``low_factor`` x
    ``phase_s`` long): the offsets, each phase's start and its length (s)."""
    parts, starts, lengths, t = [], [], [], 0.0
    for i, rate in enumerate((low, high, low, high)):
        length = phase_s * (low_factor if i % 2 == 0 else 1.0)
        offs, _ = schedule(rate, None, seed + i, 1, duration_s=length)
        parts.append(offs + t)
        starts.append(t)
        lengths.append(length)
        t += length
    return np.concatenate(parts), starts, lengths


def phase_means(records, starts: list[float], phase_s: float | list[float]) -> list[float]:
    t0 = records[0].sent - 0.0 if records else 0.0
    out = []
    for s, length in zip(starts, _durations(starts, phase_s)):
        lat = [r.latency_ms for r in records if s <= r.sent - t0 < s + length and r.latency_ms is not None]
        out.append(float(np.mean(lat)) if lat else float("nan"))
    return out


class StatusPoller:
    """The dispatcher's SERF status every ``interval`` s in a thread: (t, configuration,
    arrival rate per worker it reads)."""

    def __init__(self, endpoint: str, model: str, interval: float = 0.1):
        self.endpoint, self.model, self.interval = endpoint, model, interval
        self.seen: list[tuple[float, str | None, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            info = request_status(self.endpoint, 1.0) or {}
            mine = (info.get("serf") or {}).get(self.model, {})
            self.seen.append((time.time(), mine.get("configuration"), mine.get("arrival_rate")))
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5.0)


def switch_times(seen, t0: float, starts: list[float], phase_s: float | list[float] | None = None) -> list[float | None]:
    """Per step (after the first phase): seconds from the step to the first status showing
    another configuration than the one held at the step, within the phase; None when it
    did not change."""
    lengths = _durations(starts, phase_s if phase_s is not None else starts[1] - starts[0])
    out = []
    for s, length in zip(starts[1:], lengths[1:]):
        step = t0 + s
        before = [c for t, c, _ in seen if t <= step]
        held = before[-1] if before else None
        change = next((t for t, c, _ in seen if t > step and c != held and c is not None), None)
        out.append(None if change is None or change > step + length else round(change - step, 3))
    return out


def warm(client, dispatcher, model, inputs, configs, cores: int) -> None:
    """The same warm-up for the fixed runs' cluster and the adaptive one: each of
    ``configs`` 1 s at 10 req/s (executors grown, each thread's threads set), then the
    workers' start configuration, one request with all cores."""
    for config in configs:
        set_configuration(dispatcher, model, *config)
        run_load(client, model, inputs, 10.0, 1.0, 10, seed=1)
    set_configuration(dispatcher, model, 1, cores)


def run_fixed(spec_of: Callable, model, inputs, offsets, starts, lengths, configs, cores, log, where: Path,
              warm_configs=None) -> dict[str, dict]:
    """The step load on a cluster without SERF (``spec_of(None)``), once per fixed
    configuration in ``configs``."""
    fixed: dict[str, dict] = {}
    spec = spec_of(None)
    with Launcher(where) as launcher:
        launcher.start_spec(spec, timeout_s=180.0)
        dispatcher = spec.service("dispatcher").config.worker_endpoint
        with Client(spec.client_endpoints, timeout_ms=60_000.0) as client:
            warm(client, dispatcher, model, inputs, warm_configs or configs, cores)
            for config in configs:
                set_configuration(dispatcher, model, *config)
                mean_rate = len(offsets) / sum(lengths)  # the arrivals are the offsets
                # polled as the adaptive run is (ten status requests a second to the
                # dispatcher on the request path): the same observer's cost in both
                def one_run():
                    with StatusPoller(dispatcher, model):
                        return run_load(client, model, inputs, mean_rate, 0, 0, seed=301, offsets=offsets)

                name = "x".join(map(str, config))
                (records, s), stolen, takes = least_starved(one_run, log=log, what=f"fixed {name}")
                fixed[name] = {"phases_ms": phase_means(records, starts, lengths), "mean_ms": mean_after_warmup(records),
                               "lost": s["lost"], "series": _series(records), "steal": stolen, "takes": takes}
                log(f"   fixed {name}: phases " + ", ".join(f"{v:.1f}" for v in fixed[name]["phases_ms"])
                    + f" ms; overall {fixed[name]['mean_ms']:.1f} ms")
    return fixed


def step_load(spec_of: Callable, model, p, inputs, phase_s, profile_path, configs, log, launcher_dir,
              again: bool = True) -> dict:
    """Fixed runs of ``configs``, the adaptive run (``spec_of(profile_path)``), the oracle
    bound and (``again``) the best single fixed run once more."""
    cores = p.cores
    top = max(p.capacity(c) for c in p.configurations())
    low, high = LOW * top, HIGH * top
    offsets, starts, lengths = step_offsets(low, high, phase_s, seed=300, low_factor=LOW_FACTOR)
    fixed = run_fixed(spec_of, model, inputs, offsets, starts, lengths, configs, cores, log, launcher_dir / "fixed")
    spec = spec_of(str(profile_path))
    with Launcher(launcher_dir / "adaptive") as launcher:
        launcher.start_spec(spec, timeout_s=180.0)
        dispatcher = spec.service("dispatcher").config.worker_endpoint
        with Client(spec.client_endpoints, timeout_ms=60_000.0) as client:
            def one_run():
                warm(client, dispatcher, model, inputs, configs, cores)
                # the warm-up ends on (1, cores): the configurator's pick for its light load
                # (after the hold time), as each fixed run starts in its configuration
                run_load(client, model, inputs, low, 1.5, 1000, seed=2)
                with StatusPoller(dispatcher, model) as poller:
                    t0 = time.time()
                    records, s = run_load(client, model, inputs, high, 0, 0, seed=301, offsets=offsets)
                return records, s, poller, t0, request_status(dispatcher, 2.0) or {}

            (records, s, poller, t0, status), stolen, takes = least_starved(one_run, log=log, what="adaptive")
    origin = records[0].sent if records else t0
    serf_status = (status.get("serf") or {}).get(model) or {}
    adaptive = {"phases_ms": phase_means(records, starts, lengths), "mean_ms": mean_after_warmup(records),
                "lost": s["lost"], "series": _series(records),
                "switch_s": switch_times(poller.seen, origin, starts, lengths),
                # the configurator's decisions (time from the run's first request), and what
                # the status showed every 0.1 s: configuration and the arrival rate it read
                "decisions": [{"t": round(d["wall"] - origin, 3), "from": d["from"], "to": d["to"], "rate": d["rate"]}
                              for d in serf_status.get("switch_log", [])],
                "configurations": [(round(t - origin, 2), c, r) for t, c, r in poller.seen],
                "serf_status": serf_status, "steal": stolen, "takes": takes}
    log("   adaptive: phases " + ", ".join(f"{v:.1f}" for v in adaptive["phases_ms"])
        + f" ms; overall {adaptive['mean_ms']:.1f} ms; switches after steps {adaptive['switch_s']} s; decisions "
        + ", ".join(f"{d['t']:.2f} s {d['from']}->{d['to']} at {d['rate']}/s" for d in adaptive["decisions"]))
    oracle, oracle_picks = oracle_mean(fixed, starts, lengths)
    best_phase = [fixed[name]["phases_ms"][i] for i, name in enumerate(oracle_picks)]
    best_single = min(f["mean_ms"] for f in fixed.values())
    log(f"   oracle (each phase's best fixed: {', '.join(oracle_picks)}): {oracle:.1f} ms, "
        f"{oracle / best_single:.3f} x the best single fixed")
    # the machine moves from minute to minute (shared): the best single fixed
    # configuration once more, after the adaptive run, says how much the same
    # configuration's figures move between runs (fixed, adaptive, fixed)
    name = min(fixed, key=lambda k: fixed[k]["mean_ms"])
    out = {"low_rate": round(low, 2), "high_rate": round(high, 2), "phase_s": lengths, "fixed": fixed,
           "adaptive": adaptive, "best_fixed_per_phase_ms": best_phase,
           "adaptive_over_best_fixed": [round(a / b, 4) for a, b in zip(adaptive["phases_ms"], best_phase)],
           "adaptive_over_best_single_fixed": round(adaptive["mean_ms"] / best_single, 4),
           "oracle_ms": round(oracle, 3), "oracle_picks": oracle_picks,
           "oracle_over_best_single_fixed": round(oracle / best_single, 4), "best_single_fixed": name}
    if again:
        rerun = run_fixed(spec_of, model, inputs, offsets, starts, lengths, [tuple(map(int, name.split("x")))], cores,
                          log, launcher_dir / "fixed-again", warm_configs=configs)[name]
        out.update(best_single_fixed_again=rerun,
                   fixed_again_over_first=[round(a / b, 4) for a, b in zip(rerun["phases_ms"], fixed[name]["phases_ms"])])
    return out


def oracle_mean(fixed: dict[str, dict], starts: list[float], phase_s: float | list[float]) -> tuple[float, list[str]]:
    """The bound on any configurator under the step load: each phase's requests as the fixed
    configuration measured best in that phase served them (the runs share their arrivals),
    their mean after the first ``WARMUP`` (as ``mean_after_warmup``); and the configuration per phase."""
    picks, lat = [], []
    for i, (s, length) in enumerate(zip(starts, _durations(starts, phase_s))):
        name = min(fixed, key=lambda k: fixed[k]["phases_ms"][i])
        picks.append(name)
        lat += [ms for t, ms in fixed[name]["series"] if s <= t < s + length]
    return (float(np.mean(lat[int(WARMUP * len(lat)):])) if lat else float("nan")), picks


def _series(records) -> list[list[float]]:
    t0 = records[0].sent if records else 0.0
    return [[round(r.sent - t0, 3), round(r.latency_ms, 2)] for r in records if r.latency_ms is not None]


