"""The experiments' and fault plans' hooks on an operator, kept out of its protocol code:
a spec's ``pad_ms`` (the model's service time the overhead experiment emulates, HAMS's
GPU services taking tens to hundreds of ms per batch) and ``state_delay_ms`` (Fig. 6's
slow delivery of a state to a backup, where no delay proxy sits on the link).

``install(operator)`` applies the ones its spec names, ``padded(model, spec)`` pads a
model where one is made; with neither key set they change nothing. Nothing else reads
these keys.
"""
from __future__ import annotations

import time
from collections import deque

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
    """A backup takes each shipped state ``delay_ms`` after it arrived (in arrival order)."""

    def __init__(self, operator, delay_ms: float):
        self.operator, self.delay_s = operator, delay_ms / 1000
        self.late: deque[tuple[float, GraphState]] = deque()
        self.on_state = operator._on_state
        operator._on_state = self.hold  # the backup roles' handler of GraphState
        operator.every(0.002, self.deliver)

    def hold(self, msg: GraphState) -> None:
        self.late.append((time.monotonic() + self.delay_s, msg))

    def deliver(self, now: float) -> None:
        while self.late and self.late[0][0] <= now and self.operator.backup_side.backing:
            self.on_state(self.late.popleft()[1])


def install(operator) -> None:
    """The hooks ``operator``'s spec asks for (padding is applied where models are made)."""
    if operator.spec.state_delay_ms:
        operator.late_states = LateStates(operator, operator.spec.state_delay_ms)
