"""When a stateful primary's outputs leave (NSPB, HAMS §IV-B): outputs to other operators
at once, before the update (they compute while the state ships); replies to the frontend,
which holds them until the batch's state is durable, once the state's ship has started,
so their sends are not on the way to it. Without a backup to ship to, nothing waits."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from keel.common.protocol.messages import GraphRequest
from keel.common.spec.modes import MODES
from keel.services.graph.batches import Batches
from keel.services.graph.roles import OperatorRole, RoleRecord
from keel.services.graph.tables import Serving, Tables


class _Model:
    stateful = True

    def __init__(self, log):
        self.log, self.state_arrays = log, {}

    def compute(self, batch):
        return np.zeros((len(batch.inputs), 2), np.float32)

    def update(self, batch, outputs):
        self.log.append(("update",))


class _Op:
    """What a graph operator gives its ``Batches``, faked; sends, the update and the ship logged."""

    def __init__(self, mode: str, role: OperatorRole, succs: list[str]):
        self.log: list[tuple] = []
        self.model = _Model(self.log)
        self.statemgr = SimpleNamespace(wait_copy=lambda: None, ready_for_update=lambda: True,
                                        start=lambda *a, **kw: self.log.append(("ship",)))
        serving = Serving(model=self.model, statemgr=self.statemgr)
        self.queue = serving.queue
        self.links = SimpleNamespace(send_on=lambda target, msg: self.log.append(("send", target, msg.seq)))
        self.batcher = Batches("g2", SimpleNamespace(max_batch=64, join="interleave"), MODES[mode], True, ["g1"], succs,
                               RoleRecord(role), serving, Tables(), self.links, None, None, None,
                               notify=lambda applied: None, leased=lambda: True, inbox_waiting=lambda: False)

    def step(self) -> None:
        self.batcher.step()


def _run(mode: str, role: OperatorRole = OperatorRole.PRIMARY, succs=("frontend",)) -> list[tuple]:
    op = _Op(mode, role, list(succs))
    for i in range(3):
        op.queue.append(GraphRequest("g1", i, i, 0, [], np.zeros(4, np.float32)))
    op.step()
    return op.log


def test_nspb_replies_leave_once_the_state_ships():
    log = _run("nspb")
    assert log.index(("ship",)) < log.index(("send", "frontend", 0))
    assert [e for e in log if e[0] == "send"] == [("send", "frontend", s) for s in range(3)]  # each once, in order


def test_nspb_outputs_to_operators_leave_before_the_update():
    log = _run("nspb", succs=("g3", "frontend"))
    assert log.index(("send", "g3", 2)) < log.index(("update",)) < log.index(("ship",)) < log.index(("send", "frontend", 0))


def test_without_a_ship_nothing_waits_for_one():
    for mode in ("strawman", "ls"):
        log = _run(mode)
        assert log.index(("send", "frontend", 2)) < log.index(("update",)), mode
        assert ("ship",) not in log, mode


def test_a_batch_abandoned_before_its_update_sends_no_reply():
    op = _Op("nspb", OperatorRole.PRIMARY, ["frontend"])
    op.statemgr.ready_for_update = lambda: False  # the window is full: the update waits
    op.queue.append(GraphRequest("g1", 0, 0, 0, [], np.zeros(4, np.float32)))
    op.step()
    assert op.log == [] and op.batcher.pending_update is not None
    op.batcher.roles = RoleRecord(OperatorRole.BACKUP)  # stepped down meanwhile: its inputs come again by lineage
    op.batcher._try_update()
    assert op.log == [] and op.batcher.pending_update is None
