"""ParM decoder: rebuilds an unavailable prediction batch from its coding group (§4.1-§4.2).

Workers of coded models push a copy of each prediction batch here; parity workers push
the parity model's output. When the parity output and all but one of a group's member
predictions are here, the missing batch is reconstructed at once as
``F_P(P) - sum(other predictions)`` (``erasure.decode``; the concat encoder subtracts in
probability space) and sent to each query's frontend marked ``reconstruction``. A named model's
predictions carry ``rows`` (a dict of outputs a query): each output is rebuilt the same
way, ``F_P(P)[name] - sum(other predictions[name])`` (``erasure.decode_named``). With
``timeout_ms`` set, the decoder instead waits that long after the group's first output
for the missing prediction before declaring it unavailable (the timeout policy of §4.1).
A group is forgotten once all its predictions are in, or after ``group_ttl_s``.

Partial groups: the encoder encodes a group that did not fill in time with the members it
had (``ParityMembers.batches`` is None for the others, which it counted as zero queries).
Such a group's "k" is its number of present members: with one of them missing it is
rebuilt from the parity output minus the other present members' predictions (with a
single present member, the parity output alone).

Rows are matched by query id, not position: workers send only the queries they ran
(expired ones are skipped), so member i's copy is placed by its qids in the member batch,
and parity row r has qid r. A row of the missing batch is rebuilt only when the parity row
and every other present member's row are known.

Deadlines (an approximation): the missing batch's own budgets never reach the decoder, so
row r is skipped (``skipped_expired``) when the parity row's deadline has passed. The
encoder gives parity row r the latest deadline of the members' row r, so a skipped row
was surely expired; a row that expired a little earlier than the latest may still be
rebuilt, and its frontend ignores it.

Incarnations: per deployed model the decoder remembers the newest dispatcher epoch
(``ids.epoch_of(group)``); outputs of an older epoch, or of one no ``IdSpace`` makes, are
dropped (``stale``) and a newer epoch drops the groups of older ones. At most ``max_open_groups`` groups are tracked.

Versions: a reconstruction is named after the deployed version it equals, that of the
other members' predictions; a group whose members, or whose parity model
(``parity_versions``: the deployed version each parity model version was made for),
disagree on the version is not reconstructed (``mixed_versions``,
``unpaired_parity_version``): across a rollout, F_P(P) minus predictions of another
version than F_P's is no prediction of either.

The decoder is never on the critical path of an available prediction: workers answer
the frontend directly. The structure keeps "missing" as a set so that r > 1 (§7) only
changes when a group is decodable.
"""
from __future__ import annotations

import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import numpy as np
import zmq

from keel.common import erasure, ids, tracing, transport
from keel.common.config import DecoderConfig
from keel.common.protocol import Predictions, ModelRole, Source
from keel.services.base import Service


@dataclass
class Group:
    k: int
    born: float
    outputs: dict[int, Predictions] = field(default_factory=dict)  # index -> prediction copy
    parity: Predictions | None = None
    parity_deadlines: list[float] | None = None  # per parity output row (monotonic)
    decoded: bool = False

    def present(self) -> list[int]:
        """Members the parity batch covers (all k until the parity output is here)."""
        if self.parity is None:
            return list(range(self.k))
        return [i for i, b in enumerate(self.parity.members.batches) if b is not None]


class Decoder(Service):
    role = "decoder"

    def __init__(self, cfg: DecoderConfig):
        super().__init__(cfg.name, cfg.metrics_port)
        self.cfg = cfg
        self.pull = self.add_socket(transport.make_socket(self.ctx, zmq.PULL, bind=cfg.endpoint), self._on_outputs)
        self.peers = transport.Peers(self.ctx, on_new=self.add_socket, on_drop=self.remove_socket)  # frontend endpoint -> PUSH
        self.groups: OrderedDict[tuple[str, int], Group] = OrderedDict()  # oldest first
        self.epochs = ids.NewestEpochs()  # deployed model -> newest dispatcher epoch seen
        self.counts: Counter[str] = Counter()
        self.every(min(0.05, (cfg.timeout_ms or 50.0) / 1000.0), self._chores)
        self.serve_status(cfg.status_endpoint)
        self.m_decode = self.metrics.histogram("decode_seconds", "time to reconstruct one batch")
        self.m_reconstructions = self.metrics.counter("reconstructions_total", "batches reconstructed")

    @property
    def reconstructed(self) -> int:
        return self.counts["reconstructed"]

    def _on_outputs(self, sock: zmq.Socket) -> None:
        for _, msg in self.messages(sock):
            if isinstance(msg, Predictions) and msg.group is not None:
                self.add(msg)
            else:
                self.counts["refused"] += 1

    def _refuse(self, why: str, msg: Predictions) -> None:
        self.counts["refused"] += 1
        self.log.warning("output refused", why=why, model=msg.model, batch_id=msg.batch_id)

    def add(self, msg: Predictions) -> None:
        tag, now = msg.group, time.monotonic()
        parity = msg.role == ModelRole.PARITY
        if parity and (msg.members is None or tag.index != tag.k):
            return self._refuse("parity output without members or parity index", msg)
        if not parity and tag.index >= tag.k:
            return self._refuse("prediction copy with a parity index", msg)
        if msg.outputs is not None and msg.outputs.ndim != 2:
            return self._refuse("outputs are not (queries, classes)", msg)
        model = msg.members.model if parity else msg.model
        if not self._epoch_ok(model, ids.epoch_of(tag.group)):
            self.counts["stale"] += 1
            return
        key = (model, tag.group)
        group = self.groups.get(key)
        if group is None:
            while len(self.groups) >= self.cfg.max_open_groups:
                self._forget(next(iter(self.groups)), "dropped_full")
            group = self.groups[key] = Group(tag.k, now)
        elif group.k != tag.k:
            return self._refuse(f"k {tag.k} differs from its group's {group.k}", msg)
        has_outputs = msg.outputs is not None or msg.rows is not None
        if parity:
            if has_outputs and group.parity is None:
                group.parity = msg
                if msg.budgets_ms is not None:
                    group.parity_deadlines = [now + b / 1000.0 for b in msg.budgets_ms]
        elif has_outputs:  # a failed batch counts as unavailable
            group.outputs[tag.index] = msg
        if all(i in group.outputs for i in group.present()):
            del self.groups[key]  # every prediction arrived: nothing to rebuild
            return
        if self.cfg.timeout_ms is None:
            self._try_decode(key, group)

    def _epoch_ok(self, model: str, epoch: int) -> bool:
        """False for an older dispatcher incarnation; a newer one drops older groups."""
        return self.epochs.admit(model, epoch, self.groups, lambda key: self._forget(key, "stale"))

    def _forget(self, key: tuple[str, int], why: str) -> None:
        del self.groups[key]
        self.counts[why] += 1

    # ------------------------------------------------------------------ reconstruction

    def _try_decode(self, key: tuple[str, int], group: Group) -> None:
        if group.decoded or group.parity is None:
            return
        present = group.present()
        missing = [i for i in present if i not in group.outputs]
        if len(missing) != 1:  # r = 1: exactly one unavailable prediction can be rebuilt
            return
        group.decoded = True
        j, parity, members = missing[0], group.parity, group.parity.members
        start = time.perf_counter()
        rows = max(len(members.batches[i].qids) for i in present)
        named = parity.outputs is None  # a named model's: a dict of outputs a query (``rows``)
        known = np.zeros(rows, bool)
        parity_at: dict[int, int] = {}  # row -> its position in the parity output
        deadline = np.full(rows, np.inf)
        for pos, q in enumerate(parity.qids):  # parity query r is row r
            if q < rows:
                parity_at[q], known[q] = pos, True
                if group.parity_deadlines is not None:
                    deadline[q] = group.parity_deadlines[pos]
        others = [i for i in present if i != j]
        version = self._version(key[0], parity, [group.outputs[i] for i in others])
        if version is False:
            return
        at: list[dict[int, int]] = []  # per other member: row -> its position in that member's copy
        for i in others:
            copy, member = group.outputs[i], members.batches[i]
            if named != (copy.outputs is None) or (not named and copy.outputs.shape[1] != parity.outputs.shape[1]):
                return self._refuse("prediction width differs from the parity output's", copy)
            row_of = {q: r for r, q in enumerate(member.qids)}
            have = np.zeros(rows, bool)
            have[len(member.qids):] = True  # padding rows: zero queries predict nothing
            pos_of = {}
            for pos, q in enumerate(copy.qids):
                r = row_of.get(q)
                if r is not None:
                    pos_of[r], have[r] = pos, True
            at.append(pos_of)
            known &= have
        target = members.batches[j]
        now = time.monotonic()
        live = [r for r in range(len(target.qids)) if known[r] and deadline[r] > now]
        self.counts["skipped_expired"] += int(np.count_nonzero(known[: len(target.qids)] & (deadline[: len(target.qids)] <= now)))
        self.counts["unknown_rows"] += len(target.qids) - int(np.count_nonzero(known[: len(target.qids)]))
        if not live:
            return
        if named:  # each named output: F_P(P)[name] - sum of the others' [name]
            rebuilt = {r: erasure.decode_named(members.encoder, parity.rows[parity_at[r]],
                                               [group.outputs[i].rows[p[r]] for i, p in zip(others, at) if r in p])
                       for r in live}
        else:
            rebuilt = erasure.decode(members.encoder, *self._stacked(parity, parity_at, group, others, at, rows))
        self.m_decode.observe(time.perf_counter() - start)
        self.counts["reconstructed"] += 1
        self.counts["reconstructed_partial"] += len(present) < group.k
        self.m_reconstructions.inc()
        if tracing.ON and target.traceparent is not None:  # a sampled query's trace gets its reconstruction
            tracing.span(self.name, "decoder", target.traceparent, time.time() - (time.monotonic() - group.born),
                         qid=target.traced, model=key[0], group=key[1], index=j)
        for dest, picked in transport.split_rows([target.reply_to[r] for r in live]).items():
            rows_of = [live[p] for p in picked]
            msg = Predictions(batch_id=0, model=key[0], qids=[target.qids[r] for r in rows_of],
                              outputs=None if named else np.ascontiguousarray(rebuilt[rows_of]),
                              rows=[rebuilt[r] for r in rows_of] if named else None, worker=self.name,
                              source=Source.RECONSTRUCTION, group=parity.group, version=version)
            if not self.peers.send(dest, msg):
                self.counts["undeliverable"] += len(rows_of)

    @staticmethod
    def _stacked(parity: Predictions, parity_at: dict[int, int], group: Group, others: list[int],
                 at: list[dict[int, int]], rows: int) -> tuple[np.ndarray, np.ndarray]:
        """The parity output and the others' predictions as arrays (rows, width) and
        (k-1, rows, width), by row; rows nobody sent stay zero."""
        width = parity.outputs.shape[1]
        parity_out = np.zeros((rows, width), np.float32)
        for r, pos in parity_at.items():
            parity_out[r] = parity.outputs[pos]
        available = np.zeros((len(others), rows, width), np.float32)
        for slot, (i, pos_of) in enumerate(zip(others, at)):
            outputs = group.outputs[i].outputs
            for r, pos in pos_of.items():
                available[slot, r] = outputs[pos]
        return parity_out, available

    def _version(self, model: str, parity: Predictions, others: list[Predictions]) -> str | None | bool:
        """The deployed version a reconstruction equals: that of the other members'
        predictions, which must agree with each other and with the version the parity model
        was made for (``parity_versions``); False (counted, nothing sent) when they do not.
        During and after a rollout a group can mix versions, and F_P(P) minus predictions of
        another version than F_P's is no prediction of either."""
        versions = {o.version for o in others}
        pairs = self.cfg.parity_versions.get(model)
        if pairs:
            if parity.version not in pairs:
                self.counts["unpaired_parity_version"] += 1
                return False
            versions.add(pairs[parity.version])
        if len(versions) > 1:
            self.counts["mixed_versions"] += 1
            return False
        return versions.pop() if versions else None

    def _chores(self, now: float) -> None:
        timeout = None if self.cfg.timeout_ms is None else self.cfg.timeout_ms / 1000.0
        for key, group in list(self.groups.items()):
            age = now - group.born
            if timeout is not None and age >= timeout:
                self._try_decode(key, group)
            if age > self.cfg.group_ttl_s:
                del self.groups[key]

    def status(self) -> dict:
        return {**super().status(), "groups_open": len(self.groups), "reconstructed": self.counts["reconstructed"],
                "skipped_expired": self.counts["skipped_expired"], "stale": self.counts["stale"], **self.counts}
