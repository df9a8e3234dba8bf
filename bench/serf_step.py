"""The step load of ``keel experiment serf`` (``bench.serf_experiment``): low, high, low,
high, on the same arrivals for every fixed configuration and for the adaptive
configurator, and the bound on any configurator (each phase's best fixed).

The step, and the bound it can show, come from the profile (``bench.serf_design``). Fixed
runs: the configurations given (the experiment passes its candidates: the reference
table's picks over the loads and the extremes, or with ``--quick`` those the design
names), each started from the same warm-up.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from keel.common.client import Client
from keel.bench.serf_design import (LOW_FACTORS, STEP_SEED, WARMUP, _durations, design, name_of, oracle_mean, oracle_picks,
                                    step_offsets)
from keel.common.loadgen import open_loop, summarize
from keel.common.steal import least_starved
from keel.common.transport import request_status
from keel.deploy.local import Launcher
from keel.services.serf.profiler import set_configuration

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


def phase_means(records, starts: list[float], phase_s: float | list[float], first: float = 0.0) -> list[float]:
    """Each phase's mean latency; ``first`` is the first request's offset in the schedule,
    so a phase is the schedule's (at 5 req/s the first request comes ~0.2 s in, and timed
    from it a high phase's first requests counted in the low phase before)."""
    t0 = records[0].sent - first if records else 0.0
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
                first = float(offsets[0])
                fixed[name] = {"phases_ms": phase_means(records, starts, lengths, first), "mean_ms": mean_after_warmup(records),
                               "lost": s["lost"], "series": _series(records, first), "steal": stolen, "takes": takes}
                log(f"   fixed {name}: phases " + ", ".join(f"{v:.1f}" for v in fixed[name]["phases_ms"])
                    + f" ms; overall {fixed[name]['mean_ms']:.1f} ms")
    return fixed


def step_load(spec_of: Callable, model, p, inputs, phase_s, profile_path, configs, log, launcher_dir,
              again: bool = True, only_designed: bool = False, factors: tuple[float, ...] = LOW_FACTORS) -> dict:
    """The step ``design`` gives for ``configs``; fixed runs of ``configs`` (with
    ``only_designed``, of those the design names: each phase's best and every one that
    could be the best single fixed configuration by its replay, ``named``), the adaptive run (``spec_of(profile_path)``), the
    oracle bound and (``again``) the best single fixed run once more."""
    cores = p.cores
    plan = design(p, configs, phase_s, factors)
    low, high = plan["low_rate"], plan["high_rate"]
    log(f"   step: {plan['low']:.0%} / {plan['high']:.0%} of the largest capacity ({low} / {high} req/s), low "
        f"phases {plan['low_factor']:g} x the high ones; the bound replayed {plan['bound']:.3f} "
        f"({', '.join(plan['picks'])} against {plan['best_single']} throughout; replayed means {plan['replayed_ms']} ms, "
        f"with no hand-off {plan['replayed_ms_no_handoff']} ms); the adaptive run replayed {plan['adaptive_replayed']:.3f}; "
        f"Eq. 13's steady state {plan['eq13_bound']:.3f}")
    if only_designed:
        configs = [c for c in configs if name_of(c) in plan["named"]]
    offsets, starts, lengths = step_offsets(low, high, phase_s, seed=STEP_SEED, low_factor=plan["low_factor"])
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
    first = float(offsets[0])
    origin = records[0].sent - first if records else t0  # the schedule's zero
    serf_status = (status.get("serf") or {}).get(model) or {}
    adaptive = {"phases_ms": phase_means(records, starts, lengths, first), "mean_ms": mean_after_warmup(records),
                "lost": s["lost"], "series": _series(records, first),
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
    oracle, picks = oracle_mean(fixed, starts, lengths)
    best_phase = [fixed[name]["phases_ms"][j] for name, j in oracle_picks(fixed, len(starts))]
    best_single = min(f["mean_ms"] for f in fixed.values())
    log(f"   oracle (each phase's best fixed: {', '.join(picks)}): {oracle:.1f} ms, "
        f"{oracle / best_single:.3f} x the best single fixed")
    # the machine moves from minute to minute (shared): the best single fixed
    # configuration once more, after the adaptive run, says how much the same
    # configuration's figures move between runs (fixed, adaptive, fixed)
    name = min(fixed, key=lambda k: fixed[k]["mean_ms"])
    out = {"low_rate": round(low, 2), "high_rate": round(high, 2), "phase_s": lengths, "design": plan, "fixed": fixed,
           "adaptive": adaptive, "best_fixed_per_phase_ms": best_phase,
           "adaptive_over_best_fixed": [round(a / b, 4) for a, b in zip(adaptive["phases_ms"], best_phase)],
           "adaptive_over_best_single_fixed": round(adaptive["mean_ms"] / best_single, 4),
           "oracle_ms": round(oracle, 3), "oracle_picks": picks,
           "oracle_over_best_single_fixed": round(oracle / best_single, 4), "best_single_fixed": name}
    if again:
        rerun = run_fixed(spec_of, model, inputs, offsets, starts, lengths, [tuple(map(int, name.split("x")))], cores,
                          log, launcher_dir / "fixed-again", warm_configs=configs)[name]
        out.update(best_single_fixed_again=rerun,
                   fixed_again_over_first=[round(a / b, 4) for a, b in zip(rerun["phases_ms"], fixed[name]["phases_ms"])])
    return out


def _series(records, first: float = 0.0) -> list[list[float]]:
    """(s in the schedule, ms) per request answered (``phase_means``)."""
    t0 = records[0].sent - first if records else 0.0
    return [[round(r.sent - t0, 3), round(r.latency_ms, 2)] for r in records if r.latency_ms is not None]


