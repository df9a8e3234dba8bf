"""The ``ls`` baseline (Lineage Stash, HAMS §VI): no backup; every ``checkpoint_every``
batches a stateful operator writes its whole state to global storage, and a replacement
loads the latest checkpoint and has the rest replayed by lineage (HAMS Fig. 2).

Not part of the operator's protocol: an operator of a graph in the ``checkpoints`` mode
holds a ``LineageStash`` (``operator.stash``; None in every other mode), given what it
reads (the role record, the shared tables of ``services.graph.tables``, the event log),
and its parts call it at three points: after each update (``after_update``), when outputs could be freed
(``stashed``: what the successors' checkpoints hold) and when it takes over
(``from_checkpoint``: a cold standby's state).
"""
from __future__ import annotations

import os
import time
from typing import Callable

from keel.services.graph.applied import AppliedRequests
from keel.services.graph.statemgr import read_checkpoint, write_checkpoint


class LineageStash:
    """Parameters: ``op`` my operator, ``graph`` its graph (``read_graph``), ``roles`` my
    role record, ``serving`` and ``tables`` (``services.graph.tables``), ``events``, and
    ``recovered()``: has this process taken over (its state is rebuilt by replay)?"""

    def __init__(self, op: str, graph, roles, serving, tables, events, recovered: Callable[[], bool]):
        self.op, self.graph, self.roles, self.serving, self.tables = op, graph, roles, serving, tables
        self.events, self.recovered = events, recovered
        self.succs = graph.successors(op)
        self.since_checkpoint = 0  # batches since my last checkpoint
        self.seen: dict[str, tuple[float, int]] = {}  # successor -> (its checkpoint's mtime, my seq it holds)

    def path(self, op: str) -> str:
        """Where ``op``'s checkpoint lies in the global storage (every process reads the same place)."""
        return os.path.join(self.graph.checkpoint_dir, f"checkpoint-{op}.bin")

    def after_update(self, last: int, lineages: list, applied: list) -> None:
        """After a batch's update: count it, and checkpoint every ``checkpoint_every``."""
        if self.recovered():  # the state the recovered system holds, rebuilt by replay (HAMS Fig. 2):
            # its outputs count for the checker as a backup's applied state would
            self.events.write("apply", operator=self.op, last_seq=last, epoch=self.roles.epoch, degraded=True,
                              replay=True, lineage=[e.to_json() for e in lineages if e.operator == self.op],
                              requests=applied)
        self.since_checkpoint += 1
        if self.since_checkpoint >= self.graph.checkpoint_every:
            self.checkpoint(last)

    def checkpoint(self, last: int) -> None:
        """The operator's whole state (tensors, what it took per predecessor, its output seq)
        to global storage; predecessors free what it holds."""
        t0 = time.monotonic()
        consumed = self.tables.consumed
        write_checkpoint(self.path(self.op), self.serving.model.state_arrays(),
                         {"last_seq": last, "consumed": dict(consumed), "epoch": self.roles.epoch,
                          "applied": self.tables.applied.to_json()})
        self.since_checkpoint = 0
        self.events.write("checkpoint", operator=self.op, epoch=self.roles.epoch, last_seq=last,
                          consumed=dict(consumed), ms=round(1000 * (time.monotonic() - t0), 3))
        self.events.flush()

    def from_checkpoint(self, state: dict, max_seq: int) -> tuple[dict, int]:
        """A cold standby's state and last seq: the latest checkpoint's, with what it took
        and the requests it holds set in the shared tables; (``state``, ``max_seq``) as
        given without one."""
        checkpoint = read_checkpoint(self.path(self.op))
        if checkpoint is None:
            return state, max_seq
        state, meta = checkpoint
        self.tables.consumed = dict(meta["consumed"])  # the predecessors resend by lineage what came after
        self.tables.applied = AppliedRequests.from_json(meta.get("applied", []))  # the requests that state holds
        return state, meta["last_seq"]

    def stashed(self) -> int:
        """The highest of the operator's seqs every stateful successor's latest checkpoint
        holds (the causal log below it is no longer needed; -1: keep all)."""
        held = []
        for succ in (n for n in self.succs if n in self.graph.stateful):
            path = self.path(succ)
            try:
                mtime = os.stat(path).st_mtime
            except FileNotFoundError:
                return -1
            if self.seen.get(succ, (None,))[0] != mtime:
                checkpoint = read_checkpoint(path)
                self.seen[succ] = (mtime, checkpoint[1]["consumed"].get(self.op, -1) if checkpoint else -1)
            held.append(self.seen[succ][1])
        return min(held, default=self.serving.next_seq)
