"""The state manager beside a stateful operator (HAMS §IV-B, §V).

On the primary it copies the state after batch n out of the model *while batch n+1
computes* (NSPB: a thread; torch releases the GIL while it copies), packs it with the
batch's requests' lineage and outputs, and ships it to the backup. Handing a copy to the
thread has a cost of its own (the thread's wake-up and the GIL: 0.3-0.5 ms at the median on
a busy 2-core machine, more than copying a MiB), and a held reply waits for it; so where a
reply waits on the state (the operator answers the frontend, or its mode holds outputs
until the state is delivered) NSPB copies in place when its copies have cost less than the
hand-off (the model stops for less than the hand-off would delay durability), in the
background when they cost more, and sends one copy in ``PROBE_EVERY`` to the thread to keep
the hand-off's cost measured. Where nothing waits on it (the outputs go on to operators,
whose batches take longer than the hand-off), every copy goes to the thread: a copy in
place would lengthen every batch of the operator, the stage that then falls behind its
neighbours' (a 50 ms fan-out lost its branches' phase to 0.5 ms a batch). The primary's
fold of the states it lets go (``on_durable``) is on the thread too: nothing waits on it.
``ready_for_update`` says when the update of batch n+1 may start: the copy of state n has finished and fewer
than W states are in flight (W=1: state n was delivered, §III-B). In the stop-to-copy
modes (S2, Remus) the copy happens in place, with the model stopped. Shipped states are
kept until the backup says the next is applied (§IV-C), then freed.

A state travels as one blob (``pack``: a JSON header and the raw tensors, the batch's
outputs stacked as one more); loading never unpickles. Packing reads the model's tensors
directly and is the state's one copy (an ``np.savez`` with a zip member per output cost ~1
ms per batch of 64; this ~0.05 ms). In every mode a model that says which rows its
update touched (``StatefulOperator.touched``) ships those rows only, after a first whole
state: a 16 MiB state took 8-9 ms to cross one ZeroMQ TCP hop here, on the way to every
held reply, where the rows a batch touched take KBs. The backup still holds, and promotes
with, the whole state (``Folded``: the rows written into it in batch order), and the
primary rolls back in place to a whole state, so HAMS's overwrite semantics (§IV-C, §IV-E)
are kept; what the wire carries is what changed.
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


def pack(state: dict[str, np.ndarray], outputs: dict[int, np.ndarray], meta: dict | None = None,
         touched: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """The state and the batch's outputs as one byte blob: a 4-byte header length, a JSON
    header (each tensor's name, dtype, shape, offset; the outputs' seqs) and the raw
    buffers, each copied once, straight from the model's tensors (this is the copy).
    ``meta``: more header keys (each output's origin and stream, so a promoted backup can
    resend its saved outputs, HAMS II). ``touched``: per tensor, the rows (first axis) the
    update changed: only those rows travel, with their indices as ``NAME@rows``, and the
    header names the tensors shipped so (``rows``); the others travel whole."""
    seqs = sorted(outputs)
    touched = touched or {}
    arrays = {}
    for name, a in state.items():
        a = np.asarray(a)
        if name in touched:
            rows = np.asarray(touched[name], dtype=np.int64)
            arrays[name] = (a, rows)  # gathered straight into the blob below
            arrays[f"{name}@rows"] = rows
        else:
            arrays[name] = a
    if seqs:
        arrays[""] = np.stack([outputs[s] for s in seqs])  # "" is never a state name: the outputs
    entries, offset = [], 0
    for name, a in arrays.items():
        src, rows = a if isinstance(a, tuple) else (a, None)
        if src.dtype.hasobject:
            raise TypeError(f"state tensor {name!r} has an object dtype; only numeric tensors travel")
        shape = [len(rows), *src.shape[1:]] if rows is not None else list(src.shape)
        entries.append([name, src.dtype.str, shape, offset])
        offset += -(-(int(np.prod(shape)) * src.dtype.itemsize) // _ALIGN) * _ALIGN
    header = orjson.dumps({**(meta or {}), "tensors": entries, "seqs": seqs,
                           **({"rows": sorted(touched)} if touched else {})})
    start = -(-(4 + len(header)) // _ALIGN) * _ALIGN
    blob = np.empty(start + offset, dtype=np.uint8)
    blob[:4] = np.frombuffer(len(header).to_bytes(4, "little"), np.uint8)
    blob[4:4 + len(header)] = np.frombuffer(header, np.uint8)
    for (name, dtype, shape, off), a in zip(entries, arrays.values()):
        src, rows = a if isinstance(a, tuple) else (a, None)
        dest = blob[start + off:start + off + int(np.prod(shape)) * src.dtype.itemsize].view(src.dtype).reshape(shape)
        if rows is not None:
            np.take(src, rows, axis=0, out=dest)
        else:
            dest[...] = src
    return blob


class Packed:
    """A ``pack``ed blob read once: its JSON header and where its tensors start. A backup
    reads each applied state's header for folding, for its outputs and for its records:
    parsed once here, not once for each."""

    __slots__ = ("blob", "raw", "header", "start")

    def __init__(self, blob: np.ndarray):
        self.blob = blob
        self.raw = raw = np.ascontiguousarray(blob, dtype=np.uint8)
        n = int.from_bytes(raw[:4].tobytes(), "little")
        self.header = orjson.loads(raw[4:4 + n].tobytes())
        self.start = -(-(4 + n) // _ALIGN) * _ALIGN

    @staticmethod
    def of(blob: np.ndarray | Packed) -> Packed:
        return blob if isinstance(blob, Packed) else Packed(blob)

    def _tensor(self, dtype: str, shape: list[int], off: int) -> np.ndarray:
        """A copy of one tensor (never unpickles: object dtypes are refused)."""
        dt = np.dtype(dtype)
        if dt.hasobject:
            raise ValueError("object dtypes are refused")
        begin = self.start + off
        return self.raw[begin:begin + int(np.prod(shape)) * dt.itemsize].view(dt).reshape(shape).copy()

    def arrays(self) -> dict[str, np.ndarray]:
        """Every tensor the blob holds, the outputs as ``""``."""
        return {name: self._tensor(dtype, shape, off) for name, dtype, shape, off in self.header["tensors"]}

    def outputs(self) -> dict[int, np.ndarray]:
        """The batch's outputs alone, by seq (the state's tensors not copied)."""
        for name, dtype, shape, off in self.header["tensors"]:
            if name == "":
                return self.by_seq(self._tensor(dtype, shape, off))
        return {}

    def by_seq(self, outs: np.ndarray | None) -> dict[int, np.ndarray]:
        """The stacked outputs tensor as one row per seq ({} without one)."""
        return {} if outs is None else {s: outs[i] for i, s in enumerate(self.header["seqs"])}


def header_of(blob: np.ndarray) -> dict:
    """``pack``'s JSON header alone (the outputs' seqs and ``meta``)."""
    return Packed(blob).header


def unpack(blob: np.ndarray | Packed) -> tuple[dict[str, np.ndarray], dict[int, np.ndarray]]:
    """``pack``'s inverse (copies; never unpickles). A blob of touched rows gives those rows
    and their indices (``NAME@rows``): ``Folded`` writes them into a whole state."""
    packed = Packed.of(blob)
    arrays = packed.arrays()
    return arrays, packed.by_seq(arrays.pop("", None))


def outputs_of(blob: np.ndarray | Packed) -> dict[int, np.ndarray]:
    """The batch's outputs alone (a backup keeps them for a resend): ``unpack`` without
    copying the state's tensors, which a backup only reads at a takeover."""
    return Packed.of(blob).outputs()


class Folded:
    """The whole state after the newest of a run of shipped states, oldest first (``fold``):
    a whole one is kept as shipped (read only when asked: a model that names no touched
    rows ships every state whole, and copying each again would cost what it already pays), and the rows of
    each later one shipped as touched rows are written into a copy of it. A backup folds
    every state it applies (it promotes with ``at()``); a primary folds the states it lets
    go, and rolls back to ``at(the saved ones up to the point)``."""

    def __init__(self):
        self.blob: np.ndarray | None = None
        self.tensors: dict[str, np.ndarray] | None = None

    def fold(self, blob: np.ndarray | Packed) -> None:
        self.blob, self.tensors = _folded(self.blob, self.tensors, blob, in_place=True)

    def at(self, later: list[np.ndarray] = ()) -> dict[str, np.ndarray]:
        """The whole state after ``later`` (states shipped after the folded ones, oldest
        first), leaving this as it was. Read only: ``load_state`` copies what it loads."""
        blob, tensors, owned = self.blob, self.tensors, False
        for b in later:
            blob, tensors = _folded(blob, tensors, b, in_place=owned)
            owned = tensors is not None and tensors is not self.tensors
        if tensors is None:
            return unpack(blob)[0] if blob is not None else {}
        return tensors


def _folded(blob, tensors, new: np.ndarray | Packed, in_place: bool):
    """(blob, tensors) after ``new``: a whole state replaces them, touched rows are written
    into the tensors (made from the whole blob first; copied first unless ``in_place``)."""
    new = Packed.of(new)
    header = new.header
    if not header.get("rows"):
        return new.blob, None
    if tensors is None:
        if blob is None:
            raise ValueError("a state of touched rows with no whole state before it")
        tensors = unpack(blob)[0]
    elif not in_place:
        tensors = {k: v.copy() for k, v in tensors.items()}
    part = unpack(new)[0]
    for name, value in part.items():
        if name.endswith("@rows"):
            continue
        if name in header["rows"]:
            tensors[name][part[f"{name}@rows"]] = value
        else:
            tensors[name] = value
    return None, tensors


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
        self.folded = Folded()  # the whole state after the saved states I let go
        self.durable_seq = -1
        self.copy_ms = 0.0  # the last copy's time
        self.copy_s = 0.0  # all copies' time
        self.copy_ms_avg = 0.0  # running mean of a copy's time
        self.handoff_ms = 0.0  # running mean of a hand-off: submitted -> the copying thread starts
        self.copies = self.in_background = 0
        self._submitted = 0.0

    def _copy(self, state_arrays, outputs, first: int, last: int, lineage: list[LineageEntry],
              on_loop: bool = False, meta: dict | None = None, touched: dict | None = None) -> None:
        t0 = time.perf_counter()
        if not on_loop:
            self.handoff_ms = _running_mean(self.handoff_ms, (t0 - self._submitted) * 1000, self.in_background == 1)
        state = GraphState(self.operator, self.epoch, first, last, lineage, pack(state_arrays(), outputs, meta, touched))
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

    def start(self, state_arrays, outputs, first, last, lineage, idle: bool = False, meta: dict | None = None,
              touched: dict[str, np.ndarray] | None = None, waited_on: bool = True) -> None:
        """Copy and ship the state after a batch: at once (stop to copy) or in the background.

        ``touched``: the rows of each tensor the batch's update changed (the model's
        ``touched()``): only they travel, and the backup writes them into the whole state it
        holds; None ships the whole state. The first state I ship is whole, whatever the
        update touched: the backup's whole state starts from it.

        ``idle``: no batch is waiting, so copying at once stops nothing, and it saves the
        thread hand-off on the way to durability (which a held reply waits for). Copies that
        have cost less than the hand-off are made at once too (the module's docstring). The
        two sockets may deliver states out of order; the backup applies them in batch order.

        ``waited_on``: a reply waits for this state's durability (False: only operators'
        batches do, which take longer than the hand-off; the copy goes to the thread)."""
        self.copies += 1
        touched = touched if self.copies > 1 else None
        if self.pool is None or idle or (waited_on and self.copy_ms_avg <= self.handoff_ms and self.copies % PROBE_EVERY):
            self.wait_copy()
            self._copy(state_arrays, outputs, first, last, lineage, on_loop=True, meta=meta, touched=touched)
        else:
            self.in_background += 1
            self._submitted = time.perf_counter()
            self.copying = self.pool.submit(self._copy, state_arrays, outputs, first, last, lineage, False, meta, touched)

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
            gone = [self.saved.pop(s) for s in sorted(s for s in self.saved if s < self.durable_seq)]
        if gone and self.pool is not None:
            self.pool.submit(self._fold, gone)  # off the loop, while the next batch computes
        elif gone:
            self._fold(gone)

    def _fold(self, gone: list[GraphState]) -> None:
        for state in gone:  # outside the lock: the first fold of touched rows copies the whole state once
            self.folded.fold(state.blob)

    def state_at(self, last: int) -> dict[str, np.ndarray]:
        """The whole state after my saved state ending at ``last`` (a roll-back in place),
        once the folds handed to the thread are done (it runs its tasks in order)."""
        if self.pool is not None:
            self.pool.submit(lambda: None).result()
        with self.lock:
            later = [st.blob for s, st in sorted(self.saved.items()) if s <= last]
        return self.folded.at(later)

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
    packed = Packed(blob)
    return unpack(packed)[0], packed.header
