"""SERF's scheduler (§IV-D), run by the dispatcher: the current load in, the best
configuration out, switched live.

Per model with a profile (``services.serf.profile``): the configuration reference table is
built once at start over a grid of arrival rates per worker (``GRID`` rates up to the most
any configuration carries; ``table_ms`` says how long it took). Every chore the
configurator reads the model's arrival rate (divided over its workers: each worker is one
serving unit), looks up the table's best configuration at the first grid rate >= it, and
asks for a switch when

- the best differs from the current configuration,
- the current one is unstable near this rate, or Eq. 13 averaged over the rate and
  ``NOISE_Z`` standard errors of its count either side (``spread``) predicts the best at
  least ``hysteresis`` (a fraction) faster (so noise near a crossing does not flap), and
- it has been so for ``confirm_s`` (the dispatcher's ``serf_confirm_s``, 1 s) where the
  rate has not stepped since the last switch, and
- the last switch is at least ``hold_s`` old (minimum hold time), unless the current one
  cannot carry the rate: its backlog grows every moment it stays (a step past its
  capacity seen half-way, 4x2 at 126/s, then 174/s: held, it built a backlog for the
  rest of a 1.5 s phase).

The arrival rate is the dispatcher's count of the model's arrivals since the last step in
it, at most 4 s back (``ModelQueue.arrival_rate``: a step is a change point of the Poisson
arrivals, seen within 0.1-0.2 s; the queue's EWMA, used before, took 2-2.25 s to see a step
down to a fifth); the configurator looks every ``serf_interval_s`` (0.05 s). Where the count
is short (just after a step), the table's best is judged over where the rate may be
(``ModelPlan.best``).

The profile is checked against serving (``observe_service``): every ``Done`` gives the
worker's service time and how many batches it held (i), as a ratio to the profiled
S_(i,t) of the running configuration. When the median ratio of the last ``CHECK_SAMPLES``
(none older than ``CHECK_MAX_AGE_S``) stays off 1 by more than ``check_threshold`` for
``check_sustain_s``, that configuration's tuples are rescaled by it and the table rebuilt
(a profile taken in a burst of other work, or a machine that got slower or faster since).
Only the running configuration is corrected: the others were not observed.

``observe`` takes each query's latency inside Keel as the dispatcher sees it (queue wait +
service, from its receipt to the batch's Done) into an EWMA: the "observed" beside the
"predicted" (Eq. 13 for the current configuration at the current rate, without the
client-to-dispatcher path, which the dispatcher does not see) in status and metrics.

A profile belongs to one model version (``services.serf.profile``): when a rollout moves
the model's workers to another version, ``follow`` takes that version's profile, or,
where there is none, *holds* the model (its workers keep their configuration, status says
which profile is missing): a table of the old version would choose for another model.

The cores are a per-host budget (``[dispatcher] serf_cores``) shared by every worker on
the host: ``cores_left`` is the most cores (slots x threads) each of a model's workers
may take beside the others' current configurations, and ``decide`` picks the best
configuration within it (Eq. 13 at the current rate), at once when the current one no
longer fits.

Example
-------
>>> from keel.services.serf.profile import Profile
>>> p = Profile("m", "1", 2, {(1, 1): 20.0, (1, 2): 12.0, (2, 1): 21.0})
>>> conf = Configurator({"m": p}, hold_s=0.0)
>>> conf.decide("m", rate=10.0, current=(2, 1), workers=1, now=0.0)
(1, 2)
>>> conf.decide("m", rate=78.0, current=(1, 2), workers=1, now=1.0)
(2, 1)
"""
from __future__ import annotations

import bisect
import math
import statistics
import time
from collections import deque

from keel.services.serf.profile import Profile

#: arrival rates in a reference table
GRID = 200
#: standard errors of the window's count a switch must hold across (``spread``)
NOISE_Z = 1.5
#: the profile check: the last CHECK_SAMPLES service times (none older than CHECK_MAX_AGE_S),
#: how far off (a fraction) for how long (s)
CHECK_SAMPLES = 20
CHECK_MAX_AGE_S = 10.0
CHECK_THRESHOLD = 0.2
CHECK_SUSTAIN_S = 3.0


def around(rate: float, spread: float) -> tuple[tuple[float, float], ...]:
    """Where a rate counted with ``spread`` of chance error may be, as (rate, weight):
    rate -+ spread and the rate itself, weighted 1/4, 1/4 and 1/2 (how ``ModelPlan.best``
    and ``Configurator._better`` average Eq. 13 over it)."""
    return (max(0.0, rate - spread), 0.25), (rate, 0.5), (rate + spread, 0.25)


class ModelPlan:
    """One model's table and switching state."""

    def __init__(self, profile: Profile):
        self.profile = profile
        self.build()
        self.rate = 0.0
        self.predicted_ms: float | None = None
        self.observed_ms: float | None = None
        self.switches = 0
        self.last_switch: dict | None = None
        #: the recent switches (wall time, from, to, rate per worker), oldest first
        self.switch_log: deque[dict] = deque(maxlen=64)
        self.switched_at = float("-inf")
        #: a switch found worth it, and since when (``Configurator.confirm_s``)
        self.pending: tuple[int, int] | None = None
        self.pending_since = 0.0
        #: the profile check: (when, observed / profiled service time) of the running
        #: configuration since the last switch, when the mean went off, the corrections
        self.ratios: deque[tuple[float, float]] = deque(maxlen=CHECK_SAMPLES)
        self.ratios_of: tuple[int, int] | None = None
        self.off_since: float | None = None
        self.corrections = 0
        self.last_correction: dict | None = None

    def carry(self, old: ModelPlan) -> None:
        """Keep the switching history of the plan this one replaces (a new version's profile)."""
        self.switches, self.last_switch, self.switch_log = old.switches, old.last_switch, old.switch_log
        self.switched_at, self.rate, self.observed_ms = old.switched_at, old.rate, old.observed_ms

    def build(self) -> None:
        """The reference table over ``GRID`` rates up to the most any configuration carries."""
        t0 = time.perf_counter()
        top = max(self.profile.capacity(c) for c in self.profile.configurations())
        self.rates = [top * (k + 1) / GRID for k in range(GRID)]
        self.table = self.profile.table(self.rates)
        self.table_ms = (time.perf_counter() - t0) * 1000.0

    def service_ratio(self, now: float) -> float | None:
        """Median observed / profiled service time of the last ``CHECK_SAMPLES`` (a median:
        a burst counts only once it is half of them); None until there are that many."""
        while self.ratios and self.ratios[0][0] <= now - CHECK_MAX_AGE_S:
            self.ratios.popleft()
        if len(self.ratios) < CHECK_SAMPLES:
            return None
        return statistics.median(r for _, r in self.ratios)

    def best(self, rate: float, spread: float = 0.0) -> tuple[int, int]:
        """The table's best configuration at ``rate``, where the rate may be ``spread`` off
        by chance: of the configurations that carry rate + spread, the one whose Eq. 13 at
        rate -+ spread (the table's first grid rates >= each, weighted by ``around``) is least; none carries it: the one that carries the most. Why the
        spread: just after a step the rate is counted over a fraction of a second (the
        configurator follows a step within 0.1-0.2 s), and a configuration picked at the
        low end of where the rate may be, near its capacity at the high end, builds a
        backlog that the hold time then keeps it in."""
        rows = []
        for r, weight in around(rate, spread):
            i = bisect.bisect_left(self.rates, r)
            if i >= len(self.table) or self.table[i]["best"] is None:
                return max(self.profile.configurations(), key=self.profile.capacity)
            rows.append((self.table[i]["latency_s"], weight))
        # the configurations that carry the highest rate (its row), by their weighted Eq. 13
        return min(rows[-1][0], key=lambda c: sum(weight * latency[c] for latency, weight in rows))

    def best_within(self, rate: float, cores: int) -> tuple[int, int] | None:
        """The best configuration of at most ``cores`` (slots x threads) by Eq. 13 at
        ``rate`` (none stable there: the one that carries the most); None if none fits."""
        allowed = [c for c in self.profile.configurations() if c[0] * c[1] <= cores]
        stable = [(ms, c) for c in allowed if (ms := self.profile.predict_ms(c, rate, path=False)) is not None]
        if stable:
            return min(stable)[1]
        return max(allowed, key=self.profile.capacity) if allowed else None


def cores_left(budget: dict[str, int], hosts: dict[str, str], workers, model: str) -> int | None:
    """The most cores (slots x threads) each worker of ``model`` may take under the per-host
    ``budget`` (host -> cores) beside every other worker's current configuration on that
    host; None where none of its hosts has a budget. ``hosts``: worker name -> host;
    ``workers``: the dispatcher's workers (name, model, slots, threads)."""
    workers = list(workers)
    mine: dict[str, int] = {}
    for w in workers:
        if w.model == model and hosts.get(w.name) in budget:
            mine[hosts[w.name]] = mine.get(hosts[w.name], 0) + 1
    room = None
    for host, n in mine.items():
        used = sum(w.slots * w.threads for w in workers if w.model != model and hosts.get(w.name) == host)
        each = (budget[host] - used) // n
        room = each if room is None else min(room, each)
    return room


class Configurator:
    def __init__(self, profiles: dict[str, Profile], hysteresis: float = 0.05, hold_s: float = 1.0, alpha: float = 0.1,
                 check_threshold: float = CHECK_THRESHOLD, check_sustain_s: float = CHECK_SUSTAIN_S,
                 confirm_s: float = 0.0):
        self.models = {m: ModelPlan(p) for m, p in profiles.items()}
        #: models SERF manages but holds: model -> why (no profile of the version served)
        self.held: dict[str, str] = {}
        self.hysteresis, self.hold_s, self.alpha = hysteresis, hold_s, alpha
        #: how long a switch that is not forced (the current configuration unstable or past
        #: the budget) must stay worth it before it is made (``decide``)
        self.confirm_s = confirm_s
        self.check_threshold, self.check_sustain_s = check_threshold, check_sustain_s
        self.noise_z = NOISE_Z

    def follow(self, model: str, version: str, profile: Profile | None, where: str = "") -> str | None:
        """``model``'s workers now serve ``version``: switch by its ``profile`` from now on,
        or (None) hold the model where it is; why it is held, or None."""
        old = self.models.pop(model, None)
        if profile is None:
            return self.hold(model, f"no profile for {model} version {version}: keel serf profile SPEC --model {model}"
                             + (f" (looked at {where})" if where else ""))
        self.held.pop(model, None)
        plan = self.models[model] = ModelPlan(profile)
        if old is not None:
            plan.carry(old)
        return None

    def hold(self, model: str, why: str) -> str:
        """Stop switching ``model`` (its workers keep their configuration) for ``why``."""
        self.models.pop(model, None)
        self.held[model] = why
        return why

    def decide(self, model: str, rate: float, current: tuple[int, int] | None, workers: int,
               now: float, spread: float = 0.0, cores: int | None = None,
               step_at: float = float("-inf")) -> tuple[int, int] | None:
        """The configuration to switch ``model``'s workers to now, or None to stay.
        ``spread`` (req/s, of ``rate``): how far the estimate may be off by chance
        (``_better``); ``cores``: the most slots x threads each worker may take (the host
        budgets, ``cores_left``; None: no budget); ``step_at``: when the rate last stepped
        (``ModelQueue.arrival_rate``)."""
        plan = self.models[model]
        per_worker, spread = rate / max(1, workers), spread / max(1, workers)
        plan.rate = per_worker
        best = plan.best(per_worker, spread)
        if current is not None:
            plan.predicted_ms = plan.profile.predict_ms(current, per_worker, path=False) \
                if current in plan.profile.configurations() else None
        over = cores is not None and current is not None and current[0] * current[1] > cores
        if cores is not None and best[0] * best[1] > cores:
            best = plan.best_within(per_worker, cores)
            if best is None:  # not even one core each is left: nothing SERF may choose
                return None
        if best == current:
            plan.pending = None
            return None
        # a configuration past the budget, or one that cannot carry the rate, goes at once;
        # any other switch must be worth it
        unstable = current is not None and current in plan.profile.configurations() and plan.predicted_ms is None
        if not (over or unstable) and now - plan.switched_at < self.hold_s:
            return None
        if not over and current is not None and current in plan.profile.configurations() and \
                not self._better(plan.profile, best, current, per_worker, spread):
            plan.pending = None
            return None
        if not (over or unstable) and current is not None and step_at <= plan.switched_at:
            # a switch between two that both carry the load, with no step in the rate since
            # the last switch: the better one for ``confirm_s`` on end. The configurator
            # looks every 0.05 s so that a step is followed at once; twenty looks a second
            # at a steady rate wandering near a crossing would otherwise find the crossing
            # five times as often as the heartbeat's four did (4x2 and 8x1 at 155/s);
            # the confirmation spans several looks, which see much the same count
            if plan.pending != best:
                plan.pending, plan.pending_since = best, now
            if now - plan.pending_since < self.confirm_s:
                return None
        plan.pending = None
        plan.switches += 1
        plan.switched_at = now
        plan.ratios.clear()
        plan.off_since = None
        plan.last_switch = {"from": list(current) if current else None, "to": list(best), "rate": round(per_worker, 2),
                            "wall": time.time()}
        plan.switch_log.append(plan.last_switch)
        plan.predicted_ms = plan.profile.predict_ms(best, per_worker, path=False)
        return best

    def _better(self, profile: Profile, best: tuple[int, int], current: tuple[int, int], rate: float,
                spread: float) -> bool:
        """Is ``best`` worth a switch from ``current``? Eq. 13 averaged over where the rate
        may be (``around``) at least ``hysteresis`` lower; at
        once where only the current one is unstable, never where only the best is."""
        mean_now = mean_best = 0.0
        for r, weight in around(rate, spread):
            now_ms, best_ms = profile.predict_ms(current, r), profile.predict_ms(best, r)
            if now_ms is None and best_ms is None:
                continue
            if now_ms is None:
                return True
            if best_ms is None:
                return False
            mean_now, mean_best = mean_now + weight * now_ms, mean_best + weight * best_ms
        return mean_best <= (1.0 - self.hysteresis) * mean_now

    def spread(self, rate: float, window_s: float) -> float:
        """``noise_z`` standard errors of a Poisson count over ``window_s`` at ``rate`` (req/s)."""
        return self.noise_z * math.sqrt(max(rate, 1.0 / window_s) / window_s)

    def observe_service(self, model: str, config: tuple[int, int], running: int, service_ms: float, sent_at: float,
                        now: float) -> None:
        """One batch's service time on a worker in ``config`` that held ``running`` batches
        (itself included) when it finished; batches sent before the last switch ran in
        the previous configuration and are not counted."""
        plan = self.models.get(model)
        if plan is None or sent_at < plan.switched_at:
            return
        if config != plan.ratios_of:  # switched by someone else (``keel serf set``)
            plan.ratios.clear()
            plan.ratios_of = config
        profiled = plan.profile.service_ms.get((min(max(running, 1), config[0]), config[1]))
        if profiled:
            plan.ratios.append((now, service_ms / profiled))

    def check(self, model: str, config: tuple[int, int] | None, now: float) -> dict | None:
        """Correct the running configuration's profile when serving has measured it off by
        more than ``check_threshold`` for ``check_sustain_s``; what was corrected, or None."""
        plan = self.models[model]
        ratio = plan.service_ratio(now)
        if config not in plan.profile.configurations() or ratio is None or abs(ratio - 1.0) <= self.check_threshold:
            plan.off_since = None
            return None
        if plan.off_since is None:
            plan.off_since = now
        if now - plan.off_since < self.check_sustain_s:
            return None
        before = plan.profile.service_ms[(config[0], config[1])]
        plan.profile.rescale(config, ratio)
        plan.build()
        plan.ratios.clear()
        plan.off_since = None
        plan.corrections += 1
        plan.last_correction = {"configuration": list(config), "factor": round(ratio, 3),
                                "service_ms": [round(before, 2), round(plan.profile.service_ms[config], 2)],
                                "wall": time.time()}
        return plan.last_correction

    def observe(self, model: str, latency_ms: float) -> None:
        plan = self.models.get(model)
        if plan is not None:
            plan.observed_ms = latency_ms if plan.observed_ms is None else \
                plan.observed_ms + self.alpha * (latency_ms - plan.observed_ms)

    def status(self, current: dict[str, tuple[int, int] | None]) -> dict:
        out = {m: {"held": why, "configuration": "x".join(map(str, current.get(m) or ())) or None}
               for m, why in self.held.items()}
        for model, plan in self.models.items():
            last = plan.last_switch
            out[model] = {
                "version": plan.profile.version, "arrival_rate": round(plan.rate, 2), "configuration": "x".join(map(str, current.get(model) or ())) or None,
                "predicted_ms": None if plan.predicted_ms is None else round(plan.predicted_ms, 2),
                "observed_ms": None if plan.observed_ms is None else round(plan.observed_ms, 2),
                "switches": plan.switches, "table_ms": round(plan.table_ms, 2),
                "last_switch": None if last is None else f"{last['from']} -> {last['to']} at {last['rate']}/s, "
                                                         f"{time.time() - last['wall']:.1f} s ago",
                "switch_log": list(plan.switch_log),
                "service_ratio": None if (r := plan.service_ratio(time.monotonic())) is None else round(r, 3),
                "profile_corrections": plan.corrections,
                "last_correction": None if plan.last_correction is None else
                f"{'x'.join(map(str, plan.last_correction['configuration']))} x{plan.last_correction['factor']} "
                f"({plan.last_correction['service_ms'][0]} -> {plan.last_correction['service_ms'][1]} ms), "
                f"{time.time() - plan.last_correction['wall']:.1f} s ago",
            }
        return out
