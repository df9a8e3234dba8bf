"""SERF's testbed host, emulated: a worker kind (builtin ``"serf_host"``) whose service time
is that of SERF's 8-core Xeon sockets, served by sleeping, so eight emulated cores cost no
CPU here and the time does not move with this machine's load.

A request that runs with ``t`` threads while ``i`` requests run at once (itself included)
the whole time is held

    base_ms / speedup(t) * interference(i)

- ``speedup`` (SERF Fig. 3, intra-node parallelism): close to linear up to 3 cores, flat
  past 4 (memory bandwidth);
- ``interference`` (SERF Fig. 6): a small model (CIFAR-10) runs concurrently at almost the
  same service time; a large one (ImageNet-22K) slows sharply past 2 requests at once
  (their working sets no longer fit in L3).

A request's work is ``base_ms / speedup(t)``; it progresses at ``1 / interference(i)`` for
the ``i`` running at each moment (and slower still while the running requests' threads
exceed the cores, which then time-share: a manual ``keel serf set``; SERF's configurations
never do). So, as on SERF's hardware and in its M/D_interf/c queue, the rate depends on
how many run now, not on how many ran when a request started: eight requests started a
few ms apart all slow to interference(8) and end together (timed by how many ran when
each started, the first would take base x 1 and the last base x 4). The threads ``t`` are
those of the executor running it (``set_threads``, called per executor thread as torch's
would be).

Spec (``common.spec.models``)::

    [models.small]
    builtin = "serf_host"
    serf_host = "small"        # the defaults of a model: "small" (no interference) or "large"
    base_ms = 40.0             # optional: one request alone with one thread
    speedup = [1.0, 1.9, ...]  # optional: by threads 1..cores
    interference = [1.0, ...]  # optional: by requests at once 1..cores
    max_batch = 1

Example
-------
>>> host = SerfHost(**PRESETS["large"])
>>> round(host.service_ms(threads=2, running=3), 2)
39.47
"""
from __future__ import annotations

import threading
import time

import numpy as np

#: SERF's testbed: one 8-core Xeon E5-2450 socket
CORES = 8
#: speed-up by intra-node threads 1..8, after SERF Fig. 3: near linear to 3, flat past 4
SPEEDUP = [1.0, 1.9, 2.7, 3.3, 3.55, 3.7, 3.8, 3.85]
#: the two models of SERF Fig. 6 (service time x by requests at once 1..8): CIFAR-10-like,
#: which does not interfere, and ImageNet-22K-like, which does past 2
PRESETS: dict[str, dict] = {
    "small": {"base_ms": 40.0, "speedup": SPEEDUP, "interference": [1.0] * CORES},
    "large": {"base_ms": 50.0, "speedup": SPEEDUP, "interference": [1.0, 1.05, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]},
}


class SerfHostError(ValueError):
    """A speed-up or interference curve (or preset) that cannot describe an emulated SERF
    host. Named for the host, not "curve": ``common.curve.CurveError`` is ZeroMQ CURVE's."""


def check_curves(base_ms: float, speedup: list[float], interference: list[float], cores: int) -> None:
    if base_ms <= 0:
        raise SerfHostError(f"base_ms must be > 0, got {base_ms}")
    for name, curve in (("speedup", speedup), ("interference", interference)):
        if len(curve) != cores:
            raise SerfHostError(f"{name} needs one value per core count 1..{cores}, got {len(curve)}")
        if curve[0] != 1.0 or any(v <= 0 for v in curve):
            raise SerfHostError(f"{name} must start at 1.0 (one thread / one request alone) and stay > 0, got {curve}")


class SerfHost:
    """The emulated host's predictor: ``predict_batch`` serves each row in turn (SERF does
    not batch; ``max_batch`` 1), sleeping on a condition, and answers zeros."""

    def __init__(self, base_ms: float, speedup: list[float], interference: list[float], cores: int = CORES,
                 input_shape: list[int] | None = None, output_size: int = 10):
        check_curves(base_ms, speedup, interference, cores)
        self.base_ms, self.cores = base_ms, cores
        self.speedup, self.interference = list(speedup), list(interference)
        self.input_shape, self.output_size = list(input_shape or [64]), output_size
        self.running = self.busy_threads = 0
        self._changed = 0  # bumped whenever a request starts or ends: the rates change
        self._cond = threading.Condition()
        self._local = threading.local()

    def set_threads(self, n: int) -> bool:
        """The calling executor's threads from its next request on (the worker calls it as it
        would torch's ``set_num_threads``)."""
        self._local.threads = n
        return True

    def service_ms(self, threads: int, running: int) -> float:
        """A request's time with ``threads`` threads beside ``running`` - 1 others throughout
        (each with as many threads)."""
        return self.base_ms / self.speedup[min(max(threads, 1), self.cores) - 1] * self.slowdown(running, running * threads)

    def slowdown(self, running: int, busy_threads: int) -> float:
        """How much slower than alone every running request progresses now."""
        return self.interference[min(max(running, 1), self.cores) - 1] * max(1.0, busy_threads / self.cores)

    def _serve(self, threads: int) -> None:
        left = self.base_ms / self.speedup[min(max(threads, 1), self.cores) - 1]  # ms of work alone
        with self._cond:
            self.running += 1
            self.busy_threads += threads
            self._changed += 1
            self._cond.notify_all()
            try:
                last = time.monotonic()
                while left > 0.01:
                    slow, seen = self.slowdown(self.running, self.busy_threads), self._changed
                    self._cond.wait_for(lambda: self._changed != seen, timeout=left * slow / 1000.0)
                    now = time.monotonic()
                    left -= (now - last) * 1000.0 / slow
                    last = now
            finally:
                self.running -= 1
                self.busy_threads -= threads
                self._changed += 1
                self._cond.notify_all()

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        threads = getattr(self._local, "threads", 1)
        for _ in range(len(inputs)):
            self._serve(threads)
        return np.zeros((len(inputs), self.output_size), np.float32)


def curves(preset: str | None, base_ms: float | None = None, speedup: list[float] | None = None,
           interference: list[float] | None = None, cores: int = CORES) -> dict:
    """A host's curves: ``preset``'s ("small" or "large", default "small") with any given
    one in its place; checked."""
    if preset is not None and preset not in PRESETS:
        raise SerfHostError(f'serf_host must be one of {sorted(PRESETS)}, got {preset!r}')
    out = dict(PRESETS[preset or "small"])
    for key, value in (("base_ms", base_ms), ("speedup", speedup), ("interference", interference)):
        if value is not None:
            out[key] = value
    out["speedup"], out["interference"] = [float(v) for v in out["speedup"]], [float(v) for v in out["interference"]]
    out["base_ms"], out["cores"] = float(out["base_ms"]), cores
    check_curves(out["base_ms"], out["speedup"], out["interference"], cores)
    return out
