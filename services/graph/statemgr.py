"""The state manager beside a stateful operator (HAMS §IV-B, §V).

On the primary it copies the state after batch n out of the model *while batch n+1
computes* (NSPB: a thread; torch releases the GIL while it copies), packs it with the
batch's requests' lineage and outputs, and ships it to the backup. Handing a copy to the
thread has a cost of its own (the thread's wake-up and the GIL: 0.3-0.5 ms at the median on
a busy 2-core machine, more than copying a MiB), and a held reply waits for it; so NSPB
copies in place when its copies have cost less than the hand-off (the model stops for less
than the hand-off would delay durability) and in the background when they cost more, and
sends one copy in ``PROBE_EVERY`` to the thread to keep the hand-off's cost measured.
``ready_for_update`` says when the update of batch n+1 may start: the copy of state n has finished and fewer
than W states are in flight (W=1: state n was delivered, §III-B). In the stop-to-copy
modes (S2, Remus) the copy happens in place, with the model stopped. Shipped states are
kept until the backup says the next is applied (§IV-C), then freed.

The whole state travels (``pack``: one blob, a JSON header and the raw tensors, the
batch's outputs stacked as one more), so the backup overwrites, never merges; loading
never unpickles. Packing reads the model's tensors directly and is the state's one copy
(an ``np.savez`` with a zip member per output cost ~1 ms per batch of 64; this ~0.05 ms).
"""
from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import orjson
import zmq

from keel.common.protocol.fields import LineageEntry
from keel.common.protocol.messages import GraphState


_ALIGN = 64
#: one copy in this many goes to the thread even when copying in place is cheaper, so the
#: hand-off's cost follows the machine's load
PROBE_EVERY = 32
#: weight of the newest copy and hand-off in their running means
_EWMA = 0.2


def _running_mean(mean: float, x: float, first: bool) -> float:
    return x if first else (1 - _EWMA) * mean + _EWMA * x


def pack(state: dict[str, np.ndarray], outputs: dict[int, np.ndarray], meta: dict | None = None) -> np.ndarray:
    """The whole state and the batch's outputs as one byte blob: a 4-byte header length, a
    JSON header (each tensor's name, dtype, shape, offset; the outputs' seqs) and the raw
    buffers, each copied once, straight from the model's tensors (this is the copy).
    ``meta``: more header keys (each output's origin and stream, so a promoted backup can
    resend its saved outputs, HAMS II)."""
    seqs = sorted(outputs)
    arrays = dict(state)
    if seqs:
        arrays[""] = np.stack([outputs[s] for s in seqs])  # "" is never a state name: the outputs
    entries, offset = [], 0
    for name, a in arrays.items():
        a = np.asarray(a)
        if a.dtype.hasobject:
            raise TypeError(f"state tensor {name!r} has an object dtype; only numeric tensors travel")
        entries.append([name, a.dtype.str, list(a.shape), offset])
        offset += -(-a.nbytes // _ALIGN) * _ALIGN
    header = orjson.dumps({**(meta or {}), "tensors": entries, "seqs": seqs})
    start = -(-(4 + len(header)) // _ALIGN) * _ALIGN
    blob = np.empty(start + offset, dtype=np.uint8)
    blob[:4] = np.frombuffer(len(header).to_bytes(4, "little"), np.uint8)
    blob[4:4 + len(header)] = np.frombuffer(header, np.uint8)
    for (name, _, _, off), a in zip(entries, arrays.values()):
        a = np.asarray(a)
        blob[start + off:start + off + a.nbytes].view(a.dtype).reshape(a.shape)[...] = a
    return blob


def header_of(blob: np.ndarray) -> dict:
    """``pack``'s JSON header alone (the outputs' seqs and ``meta``)."""
    raw = np.ascontiguousarray(blob, dtype=np.uint8)
    n = int.from_bytes(raw[:4].tobytes(), "little")
    return orjson.loads(raw[4:4 + n].tobytes())


def unpack(blob: np.ndarray) -> tuple[dict[str, np.ndarray], dict[int, np.ndarray]]:
    """``pack``'s inverse (copies; never unpickles)."""
    raw = np.ascontiguousarray(blob, dtype=np.uint8)
    n = int.from_bytes(raw[:4].tobytes(), "little")
    header = orjson.loads(raw[4:4 + n].tobytes())
    start = -(-(4 + n) // _ALIGN) * _ALIGN
    arrays = {}
    for name, dtype, shape, off in header["tensors"]:
        dt = np.dtype(dtype)
        if dt.hasobject:
            raise ValueError("object dtypes are refused")
        size = int(np.prod(shape)) * dt.itemsize
        arrays[name] = raw[start + off:start + off + size].view(dt).reshape(shape).copy()
    outs = arrays.pop("", None)
    return arrays, ({s: outs[i] for i, s in enumerate(header["seqs"])} if outs is not None else {})


def outputs_of(blob: np.ndarray) -> dict[int, np.ndarray]:
    """The batch's outputs alone (a backup keeps them for a resend): ``unpack`` without
    copying the state's tensors, which a backup only reads at a takeover."""
    raw = np.ascontiguousarray(blob, dtype=np.uint8)
    n = int.from_bytes(raw[:4].tobytes(), "little")
    header = orjson.loads(raw[4:4 + n].tobytes())
    start = -(-(4 + n) // _ALIGN) * _ALIGN
    for name, dtype, shape, off in header["tensors"]:
        if name == "":
            dt = np.dtype(dtype)
            size = int(np.prod(shape)) * dt.itemsize
            outs = raw[start + off:start + off + size].view(dt).reshape(shape).copy()
            return {s: outs[i] for i, s in enumerate(header["seqs"])}
    return {}


class StateManager:
    """The primary's side: copy, pack, ship, count what is in flight, keep until durable.

    In the background modes the copying thread ships the state itself, on a PUSH socket
    only that thread uses, the moment the copy is packed; ``send`` ships from the loop in
    the stop-to-copy modes. What the thread and the loop share is behind ``lock``."""

    def __init__(self, operator: str, epoch: int, window: int, in_background: bool, send, ctx=None,
                 backup_endpoint: str | None = None):
        self.operator, self.epoch, self.window = operator, epoch, window
        self.send = send
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="statemgr") if in_background else None
        self.ctx, self.backup_endpoint, self._sock = ctx, backup_endpoint, None
        self.lock = threading.Lock()
        self.copying: Future | None = None
        self.in_flight: OrderedDict[int, float] = OrderedDict()  # last seq -> when shipped (not yet acked)
        self.saved: OrderedDict[int, GraphState] = OrderedDict()  # last seq -> shipped, not yet superseded
        self.durable_seq = -1
        self.copy_ms = 0.0  # the last copy's time
        self.copy_s = 0.0  # all copies' time
        self.copy_ms_avg = 0.0  # running mean of a copy's time
        self.handoff_ms = 0.0  # running mean of a hand-off: submitted -> the copying thread starts
        self.copies = self.in_background = 0
        self._submitted = 0.0

    def _copy(self, state_arrays, outputs, first: int, last: int, lineage: list[LineageEntry],
              on_loop: bool = False, meta: dict | None = None) -> None:
        t0 = time.perf_counter()
        if not on_loop:
            self.handoff_ms = _running_mean(self.handoff_ms, (t0 - self._submitted) * 1000, self.in_background == 1)
        state = GraphState(self.operator, self.epoch, first, last, lineage, pack(state_arrays(), outputs, meta))
        self.copy_ms = (time.perf_counter() - t0) * 1000
        self.copy_s += self.copy_ms / 1000
        self.copy_ms_avg = _running_mean(self.copy_ms_avg, self.copy_ms, self.copies == 1)
        with self.lock:
            self.in_flight[last] = time.monotonic()
            self.saved[last] = state
        if on_loop:
            self.send(state)
            return
        if self._sock is None:  # made and used by the copying thread only
            from keel.common import transport

            self._sock = transport.make_socket(self.ctx, zmq.PUSH, connect=self.backup_endpoint)
        transport_send(self._sock, state)

    def start(self, state_arrays, outputs, first, last, lineage, idle: bool = False, meta: dict | None = None) -> None:
        """Copy and ship the state after a batch: at once (stop to copy) or in the background.

        ``idle``: no batch is waiting, so copying at once stops nothing, and it saves the
        thread hand-off on the way to durability (which a held reply waits for). Copies that
        have cost less than the hand-off are made at once too (the module's docstring). The
        two sockets may deliver states out of order; the backup applies them in batch order."""
        self.copies += 1
        if self.pool is None or idle or (self.copy_ms_avg <= self.handoff_ms and self.copies % PROBE_EVERY):
            self.wait_copy()
            self._copy(state_arrays, outputs, first, last, lineage, on_loop=True, meta=meta)
        else:
            self.in_background += 1
            self._submitted = time.perf_counter()
            self.copying = self.pool.submit(self._copy, state_arrays, outputs, first, last, lineage, False, meta)

    def wait_copy(self) -> None:
        """NSPB: the update of batch n+1 starts only once the copy of state n has finished."""
        if self.copying is not None:
            self.copying.result()
            self.copying = None

    def on_ack(self, seq: int) -> None:
        with self.lock:
            for s in [s for s in self.in_flight if s <= seq]:
                del self.in_flight[s]

    def on_durable(self, seq: int) -> None:
        """The backup applied the state ending at ``seq``: older states are not needed."""
        self.on_ack(seq)
        with self.lock:
            self.durable_seq = max(self.durable_seq, seq)
            for s in [s for s in self.saved if s < self.durable_seq]:
                del self.saved[s]

    def ready_for_update(self) -> bool:
        with self.lock:
            return len(self.in_flight) < self.window

    def close(self) -> None:
        if self.pool is not None:
            self.pool.submit(self._close).result()
            self.pool.shutdown(wait=True)

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None


def transport_send(sock, msg) -> None:
    from keel.common import transport

    transport.try_send(sock, msg)


def write_checkpoint(path: str, state: dict[str, np.ndarray], meta: dict) -> None:
    """ls (Lineage Stash): the whole state to global storage, atomically (a tmp file, then a
    rename: a reader finds the previous checkpoint or this one, never half of one)."""
    blob = pack(state, {}, meta)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(np.ascontiguousarray(blob, dtype=np.uint8).tobytes())
    os.replace(tmp, path)


def read_checkpoint(path: str) -> tuple[dict[str, np.ndarray], dict] | None:
    """``write_checkpoint``'s (state, meta); None if no checkpoint was written yet."""
    try:
        with open(path, "rb") as f:
            blob = np.frombuffer(f.read(), dtype=np.uint8)
    except FileNotFoundError:
        return None
    return unpack(blob)[0], header_of(blob)
