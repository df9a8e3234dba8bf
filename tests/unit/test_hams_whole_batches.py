"""An operator takes a predecessor's batch whole: the sender marks every row of a batch but
its last ``more``, and the receiver does not start a batch while the rest of one is on its
way (for at most ``REST_OF_BATCH_S``). A fragment taken alone left the rest of that batch a
whole batch time behind, and the two operators a batch apart from then on."""
from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np

from keel.common import protocol
from keel.common.protocol.messages import GraphRequest
from keel.services.graph.operator import REST_OF_BATCH_S, GraphOperator
from keel.services.graph.roles import OperatorRole
from keel.services.graph.tables import Inputs, Serving, Tables
from tests.unit.test_hams_reply_order import _Op


def _row(seq: int, more: bool | None) -> GraphRequest:
    return GraphRequest("g1", seq, seq, 0, [], np.zeros(4, np.float32), more=more)


def _receiver(max_batch: int = 64):
    return SimpleNamespace(preds=["g1"], _shapes={"g1": (4,)}, inputs=Inputs(), tables=Tables(), serving=Serving(),
                           rest_due={}, spec=SimpleNamespace(max_batch=max_batch, join="interleave"))


def test_more_travels_and_is_absent_by_default():
    assert protocol.decode(protocol.encode(_row(0, True))).more is True
    assert protocol.decode(protocol.encode(_row(0, None))).more is None


def test_the_receiver_waits_for_the_rest_of_a_batch_and_no_longer():
    op = _receiver()
    GraphOperator._on_request(op, _row(0, True))
    GraphOperator._on_request(op, _row(1, True))
    wait = GraphOperator._rest_of_batch_s(op)
    assert 0 < wait <= REST_OF_BATCH_S and len(op.serving.queue) == 2
    GraphOperator._on_request(op, _row(2, None))  # the batch's last row: it is whole
    assert GraphOperator._rest_of_batch_s(op) == 0.0 and len(op.serving.queue) == 3
    GraphOperator._on_request(op, _row(3, True))
    op.rest_due["g1"] = time.monotonic() - 0.001  # its sender died mid-batch: the wait is over
    assert GraphOperator._rest_of_batch_s(op) == 0.0
    GraphOperator._on_request(op, _row(4, True))  # the next batch of the replacement waits again
    assert GraphOperator._rest_of_batch_s(op) > 0


def test_a_full_batch_waits_for_nothing():
    op = _receiver(max_batch=2)
    GraphOperator._on_request(op, _row(0, True))
    GraphOperator._on_request(op, _row(1, True))
    assert GraphOperator._rest_of_batch_s(op) == 0.0


def test_every_row_of_a_batch_but_its_last_says_more():
    op = _Op("bare", OperatorRole.STATELESS, ["g3"])
    sent = []
    op.links.send_on = lambda target, msg: sent.append((msg.seq, msg.more))
    op.model.stateful = False
    for i in range(3):
        op.queue.append(GraphRequest("g1", i, i, 0, [], np.zeros(4, np.float32)))
    op.step()
    assert sent == [(0, True), (1, True), (2, None)]
