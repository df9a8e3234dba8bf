"""The state manager beside a stateful operator (HAMS §IV-B, §V).

On the primary it copies the state after batch n out of the model *while batch n+1
computes* (NSPB: a thread; torch releases the GIL while it copies), packs it with the
batch's requests' lineage and outputs, and ships it to the backup; ``ready_for_update``
says when the update of batch n+1 may start: the copy of state n has finished and fewer
than W states are in flight (W=1: state n was delivered, §III-B). In the stop-to-copy
modes (S2, Remus) the copy happens in place, with the model stopped. Shipped states are
kept until the backup says the next is applied (§IV-C), then freed.

The whole state travels (an ``np.savez`` of the tensors, "out:" + seq for outputs), so
the backup overwrites, never merges; loading never unpickles.
"""
from __future__ import annotations

import io
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from common.protocol.fields import LineageEntry
from common.protocol.messages import GraphState


def pack(state: dict[str, np.ndarray], outputs: dict[int, np.ndarray]) -> np.ndarray:
    buf = io.BytesIO()
    np.savez(buf, **state, **{f"out:{seq}": out for seq, out in outputs.items()})
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


def unpack(blob: np.ndarray) -> tuple[dict[str, np.ndarray], dict[int, np.ndarray]]:
    with np.load(io.BytesIO(blob.tobytes()), allow_pickle=False) as z:
        state = {k: z[k] for k in z.files if not k.startswith("out:")}
        outputs = {int(k[4:]): z[k] for k in z.files if k.startswith("out:")}
    return state, outputs


class StateManager:
    """The primary's side: copy, pack, ship, count what is in flight, keep until durable."""

    def __init__(self, operator: str, epoch: int, window: int, in_background: bool, wake=None):
        self.operator, self.epoch, self.window = operator, epoch, window
        self.wake = wake  # called from the copying thread when a copy is done (wakes the loop to ship it)
        self.in_background = in_background
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="statemgr") if in_background else None
        self.copying: Future | None = None
        self.in_flight: OrderedDict[int, float] = OrderedDict()  # last seq -> when shipped (not yet acked)
        self.saved: OrderedDict[int, GraphState] = OrderedDict()  # last seq -> shipped, not yet superseded
        self.durable_seq = -1
        self.copy_ms = 0.0  # the last copy's time

    def _copy(self, copy_state, outputs, first: int, last: int, lineage: list[LineageEntry]) -> GraphState:
        t0 = time.perf_counter()
        blob = pack(copy_state(), outputs)
        self.copy_ms = (time.perf_counter() - t0) * 1000
        state = GraphState(self.operator, self.epoch, first, last, lineage, blob)
        if self.wake is not None and self.pool is not None:
            self.wake()
        return state

    def start(self, copy_state, outputs, first, last, lineage) -> GraphState | None:
        """Copy the state after a batch: returns it at once (stop to copy) or later from ``finished``."""
        if self.pool is None:
            return self._copy(copy_state, outputs, first, last, lineage)
        self.copying = self.pool.submit(self._copy, copy_state, outputs, first, last, lineage)
        return None

    def finished(self, wait: bool = False) -> GraphState | None:
        """The background copy's state once it is done (``wait``: block until it is)."""
        if self.copying is None or (not wait and not self.copying.done()):
            return None
        state, self.copying = self.copying.result(), None
        return state

    def shipped(self, state: GraphState) -> None:
        self.in_flight[state.last_seq] = time.monotonic()
        self.saved[state.last_seq] = state

    def on_ack(self, seq: int) -> None:
        for s in [s for s in self.in_flight if s <= seq]:
            del self.in_flight[s]

    def on_durable(self, seq: int) -> None:
        """The backup applied the state ending at ``seq``: older states are not needed."""
        self.durable_seq = max(self.durable_seq, seq)
        self.on_ack(seq)
        for s in [s for s in self.saved if s < self.durable_seq]:
            del self.saved[s]

    def ready_for_update(self) -> bool:
        return self.copying is None and len(self.in_flight) < self.window

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
