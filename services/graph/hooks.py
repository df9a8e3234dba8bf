"""The experiments' and fault plans' hooks on an operator, kept out of its protocol code:
a spec's ``pad_ms`` (the model's service time the overhead experiment emulates, HAMS's
GPU services taking tens to hundreds of ms per batch) and ``state_delay_ms`` (Fig. 6's
slow delivery of a state to a backup, where no delay proxy sits on the link).

``state_handler(spec, ...)`` is the handler of shipped states the operator wires (a late
one where the spec names a delay), ``padded(model, spec)`` pads a model where one is made;
with neither key set they change nothing. Nothing else reads these keys.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable

from keel.common.protocol.messages import GraphState


class Padded:
    """A model whose ``compute`` takes at least ``pad_ms`` per call (the rest of the model
    is the wrapped one's): the service time of a bigger model than this machine runs. The
    padding comes first and the wrapped model's compute last, as a real model's forward
    pass ends where its output is ready and its update follows at once (NSPB: on the way
    to every held reply), not a pad's length after what it read."""

    def __init__(self, model, pad_ms: float):
        self._model, self._pad_s = model, pad_ms / 1000
        self._compute_s = 0.0  # the last compute's time: the padding before the next leaves room for it

    def compute(self, batch):
        t0 = time.perf_counter()
        if self._pad_s > self._compute_s:
            time.sleep(self._pad_s - self._compute_s)
        t1 = time.perf_counter()
        out = self._model.compute(batch)
        t2 = time.perf_counter()
        self._compute_s = t2 - t1
        if t2 - t0 < self._pad_s:  # faster than the last: the rest (at least pad_ms in all)
            time.sleep(self._pad_s - (t2 - t0))
        return out

    def __getattr__(self, name):
        return getattr(self._model, name)


def padded(model, spec):
    """``model`` padded to its spec's ``pad_ms`` (``model`` itself without one)."""
    return Padded(model, spec.pad_ms) if spec.pad_ms > 0 else model


class LateStates:
    """A backup takes each shipped state ``delay_ms`` after it arrived (in arrival order):
    ``hold`` takes the states in the handler's place, and ``on_state`` (the backup side's)
    gets each when it is due, while ``backing()``. ``every`` is the loop's timer."""

    def __init__(self, delay_ms: float, on_state: Callable, backing: Callable[[], bool], every: Callable):
        self.delay_s, self.on_state, self.backing = delay_ms / 1000, on_state, backing
        self.late: deque[tuple[float, GraphState]] = deque()
        every(0.002, self.deliver)

    def hold(self, msg: GraphState) -> None:
        self.late.append((time.monotonic() + self.delay_s, msg))

    def deliver(self, now: float) -> None:
        while self.late and self.late[0][0] <= now and self.backing():
            self.on_state(self.late.popleft()[1])


def state_handler(spec, on_state: Callable, backing: Callable[[], bool], every: Callable) -> Callable:
    """The backup roles' handler of ``GraphState``: ``on_state`` itself, or, where the
    spec names a ``state_delay_ms``, a ``LateStates``'s ``hold`` in front of it."""
    return LateStates(spec.state_delay_ms, on_state, backing, every).hold if spec.state_delay_ms else on_state
