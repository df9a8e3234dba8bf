"""The ``ls`` baseline (Lineage Stash, HAMS §VI): no backup; every ``checkpoint_every``
batches a stateful operator writes its whole state to global storage, and a replacement
loads the latest checkpoint and has the rest replayed by lineage (HAMS Fig. 2). A mixin of
``services.graph.operator.GraphOperator``: only the ``checkpoints`` mode calls it.
"""
from __future__ import annotations

import os
import time

from keel.services.graph.applied import AppliedRequests
from keel.services.graph.statemgr import read_checkpoint, write_checkpoint


class LineageStash:
    def checkpoint_path(self, op: str) -> str:
        """ls: where ``op``'s checkpoint lies in the global storage (every process reads the same place)."""
        return os.path.join(self.graph.checkpoint_dir, f"checkpoint-{op}.bin")

    def _after_update(self, last: int, lineages: list, applied: list) -> None:
        """After a batch's update: count it, and checkpoint every ``checkpoint_every``."""
        if self.takeovers:  # the state the recovered system holds, rebuilt by replay (HAMS Fig. 2):
            # its outputs count for the checker as a backup's applied state would
            self.trace.write("apply", operator=self.op, last_seq=last, epoch=self.assignment.epoch, degraded=True,
                             replay=True, lineage=[e.to_json() for e in lineages if e.operator == self.op],
                             requests=applied)
        self.since_checkpoint += 1
        if self.since_checkpoint >= self.graph.checkpoint_every:
            self._checkpoint(last)

    def _checkpoint(self, last: int) -> None:
        """My whole state (tensors, what I took per predecessor, my output seq) to global
        storage; predecessors free what it holds."""
        t0 = time.monotonic()
        write_checkpoint(self.checkpoint_path(self.op), self.model.state_arrays(),
                         {"last_seq": last, "consumed": dict(self.consumed), "epoch": self.assignment.epoch,
                          "applied": self.applied.to_json()})
        self.since_checkpoint = 0
        self.trace.write("checkpoint", operator=self.op, epoch=self.assignment.epoch, last_seq=last,
                         consumed=dict(self.consumed), ms=round(1000 * (time.monotonic() - t0), 3))
        self.trace.flush()

    def _from_checkpoint(self, state: dict, max_seq: int) -> tuple[dict, int]:
        """A cold standby's state and last seq: the latest checkpoint's, with what it took
        and the requests it holds set here; (``state``, ``max_seq``) as given without one."""
        checkpoint = read_checkpoint(self.checkpoint_path(self.op))
        if checkpoint is None:
            return state, max_seq
        state, meta = checkpoint
        self.consumed = dict(meta["consumed"])  # the predecessors resend by lineage what came after
        self.applied = AppliedRequests.from_json(meta.get("applied", []))  # the requests that state holds
        return state, meta["last_seq"]

    def _stashed(self) -> int:
        """The highest of my seqs every stateful successor's latest checkpoint holds (the
        causal log below it is no longer needed; -1: keep all)."""
        held = []
        for succ in (n for n in self.succs if n in self.graph.stateful):
            path = self.checkpoint_path(succ)
            try:
                mtime = os.stat(path).st_mtime
            except FileNotFoundError:
                return -1
            if self.stash_seen.get(succ, (None,))[0] != mtime:
                checkpoint = read_checkpoint(path)
                self.stash_seen[succ] = (mtime, checkpoint[1]["consumed"].get(self.op, -1) if checkpoint else -1)
            held.append(self.stash_seen[succ][1])
        return min(held, default=self.next_seq)
