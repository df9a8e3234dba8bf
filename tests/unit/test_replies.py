"""The frontend's answer path (``services.replies``): a batch's replies leave before they are
remembered, bundles for a client that reads them, columns only for replies that share their
fields. The stepped frontend of ``tests.support.frontends``."""
from __future__ import annotations

import time

import numpy as np
import orjson
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.config import FrontendConfig, GraphRouteConfig, ModelInfo
from keel.common.ids import SEQ_MASK, epoch_of
from keel.common.protocol import (
    Answered, Cancel, Configure, ErrorCode, Predict, Predictions, Queries, Replies, Reply, Source, Withdraw,
)
from keel.common.protocol.fields import LineageEntry
from keel.common.protocol.messages import GraphAck, GraphDurable, GraphRequest
from keel.services.frontend import Frontend
from tests.support.frontends import DIM, OUT, Harness, graph_input, gru_graph, harness, x_of  # noqa: F401 - harness: a fixture
from keel.services.requests import DedupTable, LifecycleError, Request, State


def test_a_batchs_replies_leave_before_they_are_remembered_and_a_retry_still_finds_each(harness):
    h = harness()
    c = h.client()
    for i in range(3):
        h.predict(c, f"b{i}", x_of(30 + i))
    qids = []
    while len(qids) < 3:
        qids += h.queries().qids
    sends, seen_at_put = [], []
    real_send, real_put = h.fe.replies.send, h.fe.dedup.put
    h.fe.replies.send = lambda envelope, frames: (sends.append(1), real_send(envelope, frames))
    h.fe.dedup.put = lambda *a, **k: (seen_at_put.append(len(sends)), real_put(*a, **k))
    h.answer("m", qids, [[i, i] for i in range(3)])
    replies = {h.reply(c).request_id for _ in range(3)}
    assert replies == {"b0", "b1", "b2"} and h.fe.replies.unrecorded == [] and len(h.fe.dedup) == 3
    assert seen_at_put == [3, 3, 3]  # each remembered once, after all the batch's replies were sent
    for i in range(3):  # retries: the same answers, from the table
        h.predict(c, f"b{i}", x_of(30 + i))
        assert list(h.reply(c).output) == [float(i), float(i)]
    assert h.counts()["duplicate"] == 3


def _rows(frames: list) -> list[Reply]:
    """Every reply in one message: a Reply, or a Replies' rows."""
    return [r for m in protocol.decode_all(frames) for r in (m.replies() if isinstance(m, Replies) else [m])]


def test_a_client_that_reads_bundles_gets_a_batchs_replies_in_one_message(harness, monkeypatch):
    h = harness()
    bundled, plain, older = h.client(), h.client(), h.client()
    for i in range(3):
        transport.send(bundled, Predict(request_id=f"b{i}", model="m", input=x_of(40 + i), timeout_ms=10_000, bundle=True,
                                        columns=True))
        h.predict(plain, f"p{i}", x_of(50 + i))
        transport.send(older, Predict(request_id=f"o{i}", model="m", input=x_of(90 + i), timeout_ms=10_000, bundle=True))
    qids = []
    while len(qids) < 9:
        qids += h.queries().qids
    h.answer("m", qids, [[i, i] for i in range(9)])
    frames = h.step(lambda: bundled.poll(0) and bundled.recv_multipart())
    older_msgs = protocol.decode_all(h.step(lambda: older.poll(0) and older.recv_multipart()))
    assert sorted(m.request_id for m in older_msgs) == ["o0", "o1", "o2"] and all(type(m) is Reply for m in older_msgs)
    msgs = protocol.decode_all(frames)
    assert [type(m) for m in msgs] == [Replies] and msgs[0].outputs.shape == (3, 2)  # one message, as columns
    rows = {r.request_id: list(r.output) for r in _rows(frames)}
    assert sorted(rows) == ["b0", "b1", "b2"] and all(r.source == Source.MODEL and r.model == "m" for r in _rows(frames))
    assert {h.reply(plain).request_id for _ in range(3)} == {"p0", "p1", "p2"}  # one message each
    h.no_reply(bundled)
    transport.send(bundled, Predict(request_id="b1", model="m", input=x_of(41), timeout_ms=10_000, bundle=True, columns=True))
    again = h.reply(bundled)  # a retry: from the table, alone, and the row its column carried
    assert again.request_id == "b1" and list(again.output) == rows["b1"] and h.counts()["duplicate"] == 1


def test_a_bundle_carries_as_columns_only_the_replies_that_share_their_fields():
    from keel.services.replies import BUNDLE_BYTES, COLUMN_ROW_BYTES, column_key

    def entry(rid, readable=True, **fields):
        reply = Reply(request_id=rid, **{"source": Source.MODEL, "model": "m", "version": "1", **fields})
        return reply, protocol.encode(reply), column_key(reply) if readable else None

    out = lambda v: np.full(2, v, np.float32)
    entries = [entry("a", output=out(1)), entry("b", output=out(2)), entry("t", output=out(3), trace=[1.0, 2.0]),
               entry("v", output=out(4), version="2"), entry("c", output=out(5)), entry("r", output=out(6), source=Source.RECONSTRUCTION),
               entry("s", output=out(7), source=Source.RECONSTRUCTION), entry("x", error="failed", error_code=ErrorCode.MODEL_ERROR),
               entry("o", readable=False, output=out(8)),  # its client does not read columns (an older Keel)
               entry("big", output=np.zeros(COLUMN_ROW_BYTES // 4 + 1, np.float32)), entry("big2", output=np.zeros(COLUMN_ROW_BYTES // 4 + 1, np.float32))]
    msgs = protocol.decode_all(protocol.encode_bundle(entries, BUNDLE_BYTES))
    columns = sorted((m.source, m.version, m.request_ids, m.outputs[:, 0].tolist()) for m in msgs if isinstance(m, Replies))
    assert columns == [("model", "1", ["a", "b", "c"], [1.0, 2.0, 5.0]), ("reconstruction", "1", ["r", "s"], [6.0, 7.0])]
    alone = {m.request_id: m for m in msgs if isinstance(m, Reply)}
    # a trace, another version (a row alone), an error, a client that reads no columns, outputs over a row's bound
    assert sorted(alone) == ["big", "big2", "o", "t", "v", "x"]
    assert alone["t"].trace == [1.0, 2.0] and alone["v"].version == "2" and alone["x"].error_code == ErrorCode.MODEL_ERROR
