"""ParM encoder: coding groups of dispatched batches -> parity batches (ParM §4.1-§4.2).

The dispatcher sends a copy of every batch of a coded model *after* dispatching it,
tagged (group, index, k). When all k batches of a group are here, the i-th queries of
the k batches are encoded into the i-th parity query (batches shorter than the longest
are padded with zero queries), and the parity batch goes to the dispatcher's parity
queue, where parity workers pull it like any batch. The parity batch carries each
member batch's query ids and reply addresses so the decoder can answer for a missing one;
its queries are numbered by row (qid r is row r).

A named model's batches carry ``rows`` (a dict of named tensors a query): parity query r
encodes each floating input of the members' row r, its variable dims zero-padded to the
largest among them (``erasure.encode_named``), and the parity batch carries ``rows`` too;
the parity worker pads and batches them as any named batch.

Partial groups (§4.1: encoding must not wait for a group that may never fill, e.g. at low
load): ``partial_group_ms`` after a group's first batch arrived, it is encoded with the
batches it has. Absent members count as zero queries (the sum covers only the present
ones) and are None in ``ParityMembers.batches``; a member arriving after its group was
encoded is dropped (counted ``late``). For the concatenation encoder (§5.2.3) the zero
tiles of absent members are an input the parity model was not trained on: partial
reconstructions are approximate there.

Deadlines: each member's ``budgets_ms`` become deadlines on this clock at arrival; parity
row r carries the latest deadline of the members' row r, so a parity worker skips a row
only when every query it protects has expired.

Bounds, since everything here comes from the wire (hardening): at most
``max_open_groups`` groups are open (the oldest is dropped and counted when one more
opens); a batch is refused if its model has no parity model, its k differs from its
group's, it repeats an index, its rows differ in shape or dtype from the group's, or it
is empty. Incarnations: per deployed model the encoder remembers the newest dispatcher
epoch (``ids.epoch_of(group)``); batches of an older epoch, or of one no ``IdSpace`` makes
(beyond ``ids.EPOCH_BITS``, which would shadow every real one), are dropped (``stale``),
and a newer epoch drops the open groups of older ones.
"""
from __future__ import annotations

import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

import numpy as np
import zmq

from keel.common import erasure, ids, protocol, tracing, transport
from keel.common.config import EncoderConfig
from keel.common.protocol import Batch, ModelRole
from keel.services.base import Service


@dataclass
class OpenGroup:
    k: int
    encode_at: float  # monotonic: encode with what is here by then
    members: list[Batch | None]
    deadlines: list[list[float] | None]  # per member: per-row monotonic deadlines (None: no budgets)


class Encoder(Service):
    role = "encoder"

    def __init__(self, cfg: EncoderConfig):
        super().__init__(cfg.name, cfg.metrics_port)
        self.cfg = cfg
        self.pull = self.add_socket(transport.make_socket(self.ctx, zmq.PULL, bind=cfg.batch_endpoint), self._on_batches)
        self.push = self.add_socket(transport.make_socket(self.ctx, zmq.PUSH, connect=cfg.dispatcher_query_endpoint))
        self.groups: OrderedDict[tuple[str, int], OpenGroup] = OrderedDict()  # oldest first
        self.closed: OrderedDict[tuple[str, int], None] = OrderedDict()  # recently encoded or dropped
        self.epochs = ids.NewestEpochs()  # deployed model -> newest dispatcher epoch seen
        self.counts: Counter[str] = Counter()
        self.partial_timer = self.timer(self._encode_due)
        self.serve_status(cfg.status_endpoint)
        self.m_encode = self.metrics.histogram("encode_seconds", "time to encode one parity batch")

    # ------------------------------------------------------------------ coding groups

    def _on_batches(self, sock: zmq.Socket) -> None:
        for _, batch in self.messages(sock):
            if isinstance(batch, Batch):
                self.add(batch)
            else:
                self.counts["refused"] += 1

    def _refuse(self, why: str, batch: Batch) -> None:
        self.counts["refused"] += 1
        self.log.warning("batch refused", why=why, model=batch.model, batch_id=batch.batch_id)

    def add(self, batch: Batch) -> None:
        tag, now = batch.group, time.monotonic()
        if tag is None or batch.role != ModelRole.DEPLOYED or tag.index >= tag.k:
            return self._refuse("not a query batch of a coding group", batch)
        if batch.model not in self.cfg.parity_models:
            return self._refuse("model has no parity model", batch)
        if not batch.qids or (batch.inputs is None and (batch.rows is None or len(batch.rows) != len(batch.qids))):
            return self._refuse("empty batch", batch)
        if not self._epoch_ok(batch.model, ids.epoch_of(tag.group)):
            self.counts["stale"] += 1
            return
        key = (batch.model, tag.group)
        if key in self.closed:
            self.counts["late"] += 1
            return
        group = self.groups.get(key)
        if group is None:
            while len(self.groups) >= self.cfg.max_open_groups:
                self._forget(next(iter(self.groups)), "dropped_full")
            group = self.groups[key] = OpenGroup(tag.k, now + self.cfg.partial_group_ms / 1000.0, [None] * tag.k, [None] * tag.k)
            self.partial_timer.at_latest(group.encode_at)
        else:
            first = next(m for m in group.members if m is not None)
            if tag.k != group.k:
                return self._refuse(f"k {tag.k} differs from its group's {group.k}", batch)
            if group.members[tag.index] is not None:
                return self._refuse("index already in its group", batch)
            if not _same_kind(batch, first):
                return self._refuse("rows differ in shape or dtype from the group's", batch)
        group.members[tag.index] = batch
        if batch.budgets_ms is not None:
            group.deadlines[tag.index] = [now + b / 1000.0 for b in batch.budgets_ms]
        if all(m is not None for m in group.members):
            del self.groups[key]
            self._close(key)
            self.encode_group(batch.model, tag.group, group)

    def _epoch_ok(self, model: str, epoch: int) -> bool:
        """False for an older dispatcher incarnation; a newer one drops older open groups."""
        return self.epochs.admit(model, epoch, self.groups, lambda key: self._forget(key, "stale"))

    def _forget(self, key: tuple[str, int], why: str) -> None:
        del self.groups[key]
        self._close(key)
        self.counts[why] += 1

    def _close(self, key: tuple[str, int]) -> None:
        self.closed[key] = None
        while len(self.closed) > 4 * self.cfg.max_open_groups:
            self.closed.popitem(last=False)

    def _encode_due(self, now: float) -> None:
        """Partial groups (§4.1): encode each group whose time is up with the batches it has."""
        while self.groups:
            key, group = next(iter(self.groups.items()))
            if group.encode_at > now:
                self.partial_timer.at_latest(group.encode_at)
                return
            del self.groups[key]
            self._close(key)
            self.counts["partial"] += 1
            self.encode_group(key[0], key[1], group)

    # ------------------------------------------------------------------ encoding

    def encode_group(self, model: str, group_id: int, group: OpenGroup) -> None:
        start = time.perf_counter()
        present = [b for b in group.members if b is not None]
        rows = max(len(b.qids) for b in present)
        try:
            if present[0].inputs is None:  # a named model's: each floating input, row by row
                parity, parity_rows = None, self._encode_rows(present, rows)
            else:
                parity, parity_rows = self._encode_stacked(group, rows), None
        except ValueError as exc:  # e.g. concat on inputs that are not images
            self.counts["errors"] += 1
            self.log.error("cannot encode coding group", model=model, group=group_id, error=str(exc))
            return
        self.m_encode.observe(time.perf_counter() - start)
        batch = Batch(
            batch_id=0, model=self.cfg.parity_models[model], qids=list(range(rows)), reply_to=[""] * rows,
            inputs=parity, rows=parity_rows, role=ModelRole.PARITY, group=protocol.CodingTag(group_id, group.k, group.k),
            budgets_ms=self._parity_budgets(group, rows),
            members=protocol.ParityMembers(model, self.cfg.encoder,
                                           [None if b is None else protocol.MemberBatch(b.qids, b.reply_to)
                                            for b in group.members]),
        )
        if tracing.ON:  # OpenTelemetry: sampled members' spans, their contexts for the decoder
            tracing.encoded(self.name, group.members, batch)
        if transport.try_send(self.push, batch):
            self.counts["encoded"] += 1
        else:
            self.counts["unsent"] += 1

    def _encode_stacked(self, group: OpenGroup, rows: int) -> np.ndarray:
        first = next(b for b in group.members if b is not None).inputs
        stacked = np.zeros((group.k, rows, *first.shape[1:]), first.dtype)  # absent members: zero queries
        for i, b in enumerate(group.members):
            if b is not None:
                stacked[i, : len(b.qids)] = b.inputs  # shorter batches are padded with zero queries
        return erasure.encode(self.cfg.encoder, stacked)

    def _encode_rows(self, present: list[Batch], rows: int) -> list[dict[str, np.ndarray]]:
        """Parity query r of a named model: the members' row r, each input padded to the
        largest among them (``erasure.encode_named``); a member shorter than r adds a zero query,
        that is nothing."""
        return [erasure.encode_named(self.cfg.encoder, [b.rows[r] for b in present if r < len(b.rows)])
                for r in range(rows)]

    @staticmethod
    def _parity_budgets(group: OpenGroup, rows: int) -> list[float] | None:
        """Per parity row: what is left of the latest deadline among the members' row; None
        when a present member has no budgets (its queries have no deadline)."""
        latest = [-np.inf] * rows
        for b, deadlines in zip(group.members, group.deadlines):
            if b is None:
                continue
            if deadlines is None:
                return None
            for r, d in enumerate(deadlines):
                latest[r] = max(latest[r], d)
        now = time.monotonic()
        return [(d - now) * 1000.0 for d in latest]

    def status(self) -> dict:
        return {**super().status(), "groups_open": len(self.groups), "encoded": self.counts["encoded"],
                "partial": self.counts["partial"], "dropped_stale": self.counts["stale"], **self.counts}


def _same_kind(batch: Batch, first: Batch) -> bool:
    """Whether ``batch`` can be coded with ``first``: rows of one shape and dtype, or (a
    named model's) queries naming the same inputs with the same dtypes (variable dims may
    differ: encoding pads them)."""
    if (batch.inputs is None) != (first.inputs is None):
        return False
    if batch.inputs is not None:
        return batch.inputs.shape[1:] == first.inputs.shape[1:] and batch.inputs.dtype == first.inputs.dtype
    want = {n: (a.dtype, a.ndim) for n, a in first.rows[0].items()}
    return all({n: (a.dtype, a.ndim) for n, a in row.items()} == want for row in batch.rows)
