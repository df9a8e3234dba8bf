"""SERF's scheduler (§IV-D), run by the dispatcher: the current load in, the best
configuration out, switched live.

Per model with a profile (``services.serf.profile``): the configuration reference table is
built once at start over a grid of arrival rates per worker (``GRID`` rates up to the most
any configuration carries; ``table_ms`` says how long it took). Every chore the
configurator reads the model's arrival rate (the dispatcher queue's EWMA, divided over its
workers: each worker is one serving unit), looks up the table's best configuration at the
first grid rate >= it, and asks for a switch when

- the best differs from the current configuration,
- the current one is unstable at this rate, or Eq. 13 predicts the best at least
  ``hysteresis`` (a fraction) faster than it (so a rate near a crossing does not flap), and
- the last switch is at least ``hold_s`` old (minimum hold time).

``observe`` takes each query's latency inside Keel as the dispatcher sees it (queue wait +
service, from its receipt to the batch's Done) into an EWMA: the "observed" beside the
"predicted" (Eq. 13 for the current configuration at the current rate, without the
client-to-dispatcher path, which the dispatcher does not see) in status and metrics.

Example
-------
>>> from services.serf.profile import Profile
>>> p = Profile("m", "1", 2, {(1, 1): 20.0, (1, 2): 12.0, (2, 1): 21.0})
>>> conf = Configurator({"m": p}, hold_s=0.0)
>>> conf.decide("m", rate=10.0, current=(2, 1), workers=1, now=0.0)
(1, 2)
>>> conf.decide("m", rate=78.0, current=(1, 2), workers=1, now=1.0)
(2, 1)
"""
from __future__ import annotations

import bisect
import time
from collections import deque

from services.serf.profile import Profile

#: arrival rates in a reference table
GRID = 200


class ModelPlan:
    """One model's table and switching state."""

    def __init__(self, profile: Profile):
        self.profile = profile
        t0 = time.perf_counter()
        top = max(profile.capacity(c) for c in profile.configurations())
        self.rates = [top * (k + 1) / GRID for k in range(GRID)]
        self.table = profile.table(self.rates)
        self.table_ms = (time.perf_counter() - t0) * 1000.0
        self.rate = 0.0
        self.predicted_ms: float | None = None
        self.observed_ms: float | None = None
        self.switches = 0
        self.last_switch: dict | None = None
        #: the recent switches (wall time, from, to, rate per worker), oldest first
        self.switch_log: deque[dict] = deque(maxlen=64)
        self.switched_at = float("-inf")

    def best(self, rate: float) -> tuple[int, int]:
        """The table's best configuration at the first grid rate >= ``rate`` (beyond the
        grid: the one that carries the most)."""
        i = bisect.bisect_left(self.rates, rate)
        row = self.table[min(i, len(self.table) - 1)]
        if row["best"] is None or i >= len(self.table):
            return max(self.profile.configurations(), key=self.profile.capacity)
        return row["best"]


class Configurator:
    def __init__(self, profiles: dict[str, Profile], hysteresis: float = 0.05, hold_s: float = 1.0, alpha: float = 0.1):
        self.models = {m: ModelPlan(p) for m, p in profiles.items()}
        self.hysteresis, self.hold_s, self.alpha = hysteresis, hold_s, alpha

    def decide(self, model: str, rate: float, current: tuple[int, int] | None, workers: int,
               now: float) -> tuple[int, int] | None:
        """The configuration to switch ``model``'s workers to now, or None to stay."""
        plan = self.models[model]
        per_worker = rate / max(1, workers)
        plan.rate = per_worker
        best = plan.best(per_worker)
        if current is not None:
            plan.predicted_ms = plan.profile.predict_ms(current, per_worker, path=False) \
                if current in plan.profile.configurations() else None
        if best == current or now - plan.switched_at < self.hold_s:
            return None
        if current is not None and current in plan.profile.configurations():
            now_ms, best_ms = plan.profile.predict_ms(current, per_worker), plan.profile.predict_ms(best, per_worker)
            if now_ms is not None and best_ms is not None and best_ms > (1.0 - self.hysteresis) * now_ms:
                return None
        plan.switches += 1
        plan.switched_at = now
        plan.last_switch = {"from": list(current) if current else None, "to": list(best), "rate": round(per_worker, 2),
                            "wall": time.time()}
        plan.switch_log.append(plan.last_switch)
        plan.predicted_ms = plan.profile.predict_ms(best, per_worker, path=False)
        return best

    def observe(self, model: str, latency_ms: float) -> None:
        plan = self.models.get(model)
        if plan is not None:
            plan.observed_ms = latency_ms if plan.observed_ms is None else \
                plan.observed_ms + self.alpha * (latency_ms - plan.observed_ms)

    def status(self, current: dict[str, tuple[int, int] | None]) -> dict:
        out = {}
        for model, plan in self.models.items():
            last = plan.last_switch
            out[model] = {
                "arrival_rate": round(plan.rate, 2), "configuration": "x".join(map(str, current.get(model) or ())) or None,
                "predicted_ms": None if plan.predicted_ms is None else round(plan.predicted_ms, 2),
                "observed_ms": None if plan.observed_ms is None else round(plan.observed_ms, 2),
                "switches": plan.switches, "table_ms": round(plan.table_ms, 2),
                "last_switch": None if last is None else f"{last['from']} -> {last['to']} at {last['rate']}/s, "
                                                         f"{time.time() - last['wall']:.1f} s ago",
                "switch_log": list(plan.switch_log),
            }
        return out
