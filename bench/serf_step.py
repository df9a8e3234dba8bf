"""The step load of ``keel experiment serf`` (``bench.serf_experiment``): low, high, low,
high, on the same arrivals for every fixed configuration and for the adaptive
configurator, and the bound on any configurator (each phase's best fixed).

The step is derived from the profile (``design``), not chosen by hand: among low rates
``LOW_GRID`` and high rates ``HIGH_GRID`` (fractions of the largest capacity) and low
phases ``LOW_FACTORS`` times as long as the high ones, the one whose bound is least, the
shortest low phases that reach ``BOUND_AIM``. The bound is the one the runs measure
(``oracle_mean`` over the best single fixed run), predicted by replaying the step's own
arrivals through the profile's queue for each configuration (``replay``: from an empty
start, the backlog of a phase a configuration cannot carry running into the next), once
with the profile's hand-offs and once with none, the worse of the two. Why a replay and
not Eq. 13's steady state (``eq13_bound``, still reported): a phase of a few seconds from
an empty queue never reaches the queue Eq. 13 predicts near a configuration's capacity,
so Eq. 13 chose steps whose high phase the light load's best carried in fact (2x4 at 78%
of its capacity won both phases). Why both hand-offs: the hand-off moves a few ms from
run to run, and with it whether a configuration near the high rate carries it.

What such a step looks like on the small model: the high rate past the light load's best
(2x4, 1x8: their backlog grows), carried by 4x2 or 8x1, and low phases long and light
enough that 2x4 or 1x8 beat those by 1.5-2x there. 4x2 is the spoiler: within ~1.5x of
the best at light load and near the best at heavy load, it is the best single fixed
configuration, and the bound reaches 0.77-0.80 only with low phases 8-10 x the high ones.

On the interfering model no step makes the bound small: 2x4 is within ~12% of the best
at every load (SERF Fig. 12: a middle configuration throughout; 1x8 idle is 0.88 of 2x4
idle), so each phase's best fixed can gain at most that much over it.

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
from keel.common.queueing import sojourn_times
from keel.common.steal import least_starved
from keel.common.transport import request_status
from keel.deploy.local import Launcher
from keel.services.serf.profiler import set_configuration

#: the share of a run's first requests left out of its mean (the queue starts empty)
WARMUP = 0.1
#: the step's arrivals (``step_offsets``' seed): the design replays the very arrivals the runs send
STEP_SEED = 300
#: the step's rates looked at (fractions of the largest capacity) and how much longer a low
#: phase may last than a high one (``design``)
LOW_GRID = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3)
HIGH_GRID = tuple(round(0.5 + 0.05 * k, 2) for k in range(10))  # 0.5 .. 0.95
LOW_FACTORS = (3.0, 4.0, 6.0, 8.0, 10.0)
#: the bound a step aims at: under the target (0.80) by the run-to-run spread of a phase's mean
BOUND_AIM = 0.78
#: in Eq. 13's steady-state bound (``eq13_bound``, reported beside the design's) a
#: configuration carries a phase at utilisation <= CARRY
CARRY = 0.92
#: a configuration whose replayed step mean is within this factor of the best single one's
#: could be the best single fixed configuration measured: ``--quick`` runs it too
RIVAL = 1.25


def name_of(config) -> str:
    return "x".join(map(str, config))


def eq13_bound(p, configs, rates: list[float], lengths: list[float]) -> tuple[float, list, tuple] | None:
    """The bound by Eq. 13 on profile ``p`` for phases at ``rates`` (req/s) of ``lengths``
    (s), in order: (each phase's best / the best single configuration, each phase's best,
    the best single one); None where some phase has no configuration that carries it.
    As the measured bound (``oracle_picks``), it sees no backlog: a configuration serves a
    phase it carries from a clean start, and one that does not carry a phase serves no
    whole run."""
    lat = {c: [p.predict_ms(c, r) if r <= CARRY * p.capacity(c) else None for r in rates] for c in configs}
    picks = []
    for k in range(len(rates)):
        able = [c for c in configs if lat[c][k] is not None]
        if not able:
            return None
        picks.append(min(able, key=lambda c: lat[c][k]))
    weights = [r * length for r, length in zip(rates, lengths)]  # requests in each phase
    total = sum(weights)
    mean = {c: sum(w * v for w, v in zip(weights, lat[c])) / total for c in configs if None not in lat[c]}
    single = min(mean, key=mean.get)
    oracle = sum(w * lat[c][k] for k, (w, c) in enumerate(zip(weights, picks))) / total
    return oracle / mean[single], picks, single


def replay(p, config, offsets: np.ndarray, starts: list[float], rates: list[float], handoff: bool = True) -> dict:
    """The fixed run of ``config`` on the step's ``offsets`` as profile ``p``'s queue serves
    them from an empty start (``common.queueing.sojourn_times``: the backlog a phase leaves
    runs into the next), in the measured runs' figures: each phase's mean, the run's mean
    after ``WARMUP`` and the series (s from the first request, ms). A request's latency is
    its time in the queue less the hand-off, plus the path at its phase's rate; with
    ``handoff`` False the slots turn over with no hand-off (the most a run may carry)."""
    c, t = config
    h = p.handoff_ms.get(c, 0.0) if handoff else 0.0
    mu = [1000.0 / (p.service_ms[(i, t)] + h) for i in range(1, c + 1)]
    phase = np.searchsorted(np.asarray(starts), offsets, side="right") - 1
    lat = sojourn_times(mu, offsets) * 1000.0 - h + np.array([p.path_at(r) for r in rates])[phase]
    sent = offsets  # the schedule's own time, as the measured runs' (``phase_means``)
    ends = list(starts[1:]) + [np.inf]
    phases = [lat[(sent >= s) & (sent < e)] for s, e in zip(starts, ends)]
    return {"phases_ms": [float(x.mean()) if len(x) else float("nan") for x in phases],
            "mean_ms": float(lat[int(WARMUP * len(lat)):].mean()), "series": np.column_stack([sent, lat]).tolist()}


def replay_bound(p, configs, low: float, high: float, phase_s: float, factor: float, handoff: bool = True) -> dict:
    """The measured bound (``oracle_mean`` over the best single fixed run) as the profile's
    queue predicts it for the step (``low``, ``high`` req/s; low phases ``factor`` x
    ``phase_s``) on the runs' own arrivals: transients, backlogs and the oracle's rule for a
    low phase after a high one included, which Eq. 13's steady state (``eq13_bound``) does
    not see."""
    offsets, starts, lengths = step_offsets(low, high, phase_s, seed=STEP_SEED, low_factor=factor)
    runs = {name_of(c): replay(p, c, offsets, starts, [low, high] * 2, handoff) for c in configs}
    oracle, picks = oracle_mean(runs, starts, lengths)
    single = min(runs, key=lambda k: runs[k]["mean_ms"])
    return {"bound": oracle / runs[single]["mean_ms"], "picks": picks, "single": single,
            "means": {k: round(v["mean_ms"], 2) for k, v in runs.items()}}


def design(p, configs, phase_s: float) -> dict:
    """The step for profile ``p`` and the fixed ``configs`` (the module's docstring), high
    phases ``phase_s`` long: low and high rate (req/s), the low phases' length factor, the
    bound the runs can show as the profile's queue replays them (``bound``: the worse of
    the profile's hand-offs and none), each phase's best configuration and the best single
    one by that replay, the configurations that could be the best single fixed one
    (``rivals``), and Eq. 13's steady-state bound of the same step (``eq13_bound``)."""
    top = max(p.capacity(c) for c in p.configurations())
    found = []
    for factor in LOW_FACTORS:
        for lo in LOW_GRID:
            for hi in HIGH_GRID:
                low, high = round(lo * top, 2), round(hi * top, 2)  # the rates the runs send
                eq13 = eq13_bound(p, configs, [low, high] * 2, [factor * phase_s, phase_s] * 2)
                if eq13 is None:
                    continue  # no configuration carries the high rate for good: a backlog decides the run
                # the profile's hand-offs, and none: whether the light load's best carries the
                # high phase must not hang on the hand-off's run-to-run move (a few ms)
                worlds = [replay_bound(p, configs, low, high, phase_s, factor, handoff) for handoff in (True, False)]
                found.append((max(w["bound"] for w in worlds), factor, lo, hi, worlds, eq13))
    if not found:
        raise ValueError("no step load: no configuration carries any high rate looked at")
    aimed = [f for f in found if f[0] <= BOUND_AIM]
    if aimed:  # the shortest low phases that reach the aim, then the least bound
        bound, factor, lo, hi, worlds, eq13 = min(aimed, key=lambda f: (f[1], f[0]))
    else:  # no step reaches it: the shortest within 0.01 of the least bound
        least = min(f[0] for f in found)
        bound, factor, lo, hi, worlds, eq13 = min((f for f in found if f[0] <= least + 0.01), key=lambda f: (f[1], f[0]))
    low, high = round(lo * top, 2), round(hi * top, 2)
    rivals = sorted({k for w in worlds for k, v in w["means"].items() if v <= RIVAL * w["means"][w["single"]]})
    return {"low": lo, "high": hi, "low_rate": round(low, 2), "high_rate": round(high, 2), "low_factor": factor,
            "bound": round(bound, 4), "picks": worlds[0]["picks"], "best_single": worlds[0]["single"],
            "replayed_ms": worlds[0]["means"], "replayed_ms_no_handoff": worlds[1]["means"],
            "rivals": rivals, "named": sorted(set(rivals) | {k for w in worlds for k in w["picks"] + [w["single"]]}),
            "eq13_bound": round(eq13[0], 4), "eq13_picks": [name_of(c) for c in eq13[1]],
            "eq13_best_single": name_of(eq13[2])}


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
              again: bool = True, only_designed: bool = False) -> dict:
    """The step ``design`` gives for ``configs``; fixed runs of ``configs`` (with
    ``only_designed``, of those the design names: each phase's best and every one that
    could be the best single fixed configuration by its replay, ``named``), the adaptive run (``spec_of(profile_path)``), the
    oracle bound and (``again``) the best single fixed run once more."""
    cores = p.cores
    plan = design(p, configs, phase_s)
    low, high = plan["low_rate"], plan["high_rate"]
    log(f"   step: {plan['low']:.0%} / {plan['high']:.0%} of the largest capacity ({low} / {high} req/s), low "
        f"phases {plan['low_factor']:g} x the high ones; the bound replayed {plan['bound']:.3f} "
        f"({', '.join(plan['picks'])} against {plan['best_single']} throughout; replayed means {plan['replayed_ms']} ms, "
        f"with no hand-off {plan['replayed_ms_no_handoff']} ms); Eq. 13's steady state {plan['eq13_bound']:.3f}")
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


def oracle_picks(fixed: dict[str, dict], phases: int) -> list[tuple[str, int]]:
    """Each phase's best fixed configuration, and the phase whose requests stand for it:
    its own, or for a phase at the rate of the one two before (low, high, low, high) that
    earlier one where the configuration did better there, unless it was the one picked for
    the phase before. A fixed configuration that cannot carry a high phase enters the next
    low one with a backlog that a configurator switching at the step never builds (it ran
    another configuration through the high phase), so that low phase is the first low phase
    again, from its clean start; a configurator that kept the configuration through the
    phase before has its backlog too, so there its own phase stands."""
    out: list[tuple[str, int]] = []
    for i in range(phases):
        seen = [(name, i) for name in fixed]
        if i >= 2:
            seen += [(name, i - 2) for name in fixed if name != out[i - 1][0]]
        out.append(min(seen, key=lambda nj: fixed[nj[0]]["phases_ms"][nj[1]]))
    return out


def oracle_mean(fixed: dict[str, dict], starts: list[float], phase_s: float | list[float]) -> tuple[float, list[str]]:
    """The bound on any configurator under the step load: each phase's requests as the fixed
    configuration measured best in that phase served them (the runs share their arrivals;
    ``oracle_picks``), their mean after the first ``WARMUP`` (as ``mean_after_warmup``);
    and the configuration per phase."""
    lengths, lat = _durations(starts, phase_s), []
    picks = oracle_picks(fixed, len(starts))
    for name, j in picks:
        s, length = starts[j], lengths[j]
        lat += [ms for t, ms in fixed[name]["series"] if s <= t < s + length]
    return (float(np.mean(lat[int(WARMUP * len(lat)):])) if lat else float("nan")), [name for name, _ in picks]


def _series(records, first: float = 0.0) -> list[list[float]]:
    """(s in the schedule, ms) per request answered (``phase_means``)."""
    t0 = records[0].sent - first if records else 0.0
    return [[round(r.sent - t0, 3), round(r.latency_ms, 2)] for r in records if r.latency_ms is not None]


