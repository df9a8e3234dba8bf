"""The frontend's de-duplication by (sender, request id), stepped with ``tick``: one id with
another input is refused, another client's is its own request, errors are not remembered,
bad ids are refused without being echoed, and the answered table is bounded by bytes."""
from __future__ import annotations

import numpy as np
import orjson

from keel.common import protocol, transport
from keel.common.protocol import ErrorCode, Predict, Reply, Source
from tests.support.frontends import DIM, harness, x_of  # noqa: F401 - harness: a fixture
from keel.services.requests import DedupTable


def test_same_id_with_another_input_is_refused(harness):
    h = harness()
    c = h.client()
    h.predict(c, "r", x_of(13))
    (qid,) = h.queries().qids
    h.predict(c, "r", x_of(14))  # while the first is pending
    reply = h.reply(c)
    assert reply.error_code == ErrorCode.BAD_REQUEST and "reused with a different input" in reply.error
    h.answer("m", [qid], [[1, 2]])
    assert list(h.reply(c).output) == [1.0, 2.0]
    h.predict(c, "r", x_of(15))  # after it was answered
    reply = h.reply(c)
    assert reply.error_code == ErrorCode.BAD_REQUEST and "reused with a different input" in reply.error
    h.predict(c, "r", x_of(13))  # a true retry: the same answer
    reply = h.reply(c)
    assert list(reply.output) == [1.0, 2.0] and h.counts()["duplicate"] == 1


def test_same_id_from_another_client_is_its_own_request(harness):
    h = harness()
    a, b = h.client(), h.client()
    h.predict(a, "same", x_of(16))
    (qa,) = h.queries().qids
    h.answer("m", [qa], [[1, 1]])
    assert list(h.reply(a).output) == [1.0, 1.0]
    h.predict(b, "same", x_of(17))
    (qb,) = h.queries().qids  # computed, not answered from a's entry
    h.answer("m", [qb], [[2, 2]])
    assert list(h.reply(b).output) == [2.0, 2.0]
    assert "duplicate" not in h.counts()


def test_error_replies_are_not_remembered(harness):
    h = harness()
    c = h.client()
    transport.send(c, Predict(request_id="e", model="m", input=np.zeros(DIM + 1, np.float32)))
    assert h.reply(c).error_code == ErrorCode.BAD_REQUEST
    h.predict(c, "e", x_of(18))
    (qid,) = h.queries().qids  # the valid request with that id is computed
    h.answer("m", [qid], [[4, 4]])
    reply = h.reply(c)
    assert reply.source == Source.MODEL and list(reply.output) == [4.0, 4.0]


def test_empty_request_id_is_a_bad_request(harness):
    h = harness()
    c = h.client()
    header = orjson.loads(bytes(protocol.encode(Predict(request_id="x", model="m", input=x_of(19)))[0]))
    header["request_id"] = ""
    c.send_multipart([orjson.dumps(header), x_of(19).tobytes()])
    reply = h.reply(c)
    assert reply.error_code == ErrorCode.BAD_REQUEST and "request_id" in reply.error


def test_an_oversized_request_id_is_not_echoed(harness):
    h = harness()
    c = h.client()
    header = orjson.loads(bytes(protocol.encode(Predict(request_id="x", model="m", input=x_of(20)))[0]))
    header["request_id"] = "i" * 100_000
    c.send_multipart([orjson.dumps(header), b"short"])
    reply = h.reply(c)
    assert reply.error_code == ErrorCode.BAD_REQUEST and reply.request_id == ""
    assert len(reply.error) < 1000


def test_dedup_table_is_capped_by_bytes(harness):
    h = harness(cache_size=0, dedup_max_bytes=4000)
    c = h.client()
    for i in range(40):
        h.predict(c, f"r{i}", x_of(100 + i))
        (qid,) = h.queries().qids
        h.answer("m", [qid], [[i, i]])
        assert h.reply(c).request_id == f"r{i}"
    table = h.fe.dedup
    assert 0 < table.bytes <= 4000 and 0 < len(table) < 40
    assert h.fe.status()["dedup"]["bytes"] == table.bytes


def test_answered_table_bounds():
    table = DedupTable(ttl_s=10.0, max_entries=3, max_bytes=10_000)
    for i in range(5):
        table.put((b"c", f"r{i}"), [b"x"], 0, now=float(i), nbytes=1)
    assert [k[1] for k in table.entries] == ["r2", "r3", "r4"]
    table.forget(now=13.5)  # r2 and r3 are older than 10 s
    assert [k[1] for k in table.entries] == ["r4"]
    assert table.bytes == DedupTable.OVERHEAD + 1 + 2 + 1


def test_answered_table_counts_what_it_holds_and_gives_it_back():
    """What the table says it holds is at least what it allocated (tracemalloc), and it
    keeps no per-entry Python objects: forgotten entries leave next to nothing allocated."""
    import tracemalloc

    replies = [protocol.encode(Reply(request_id=f"req-{i:06d}", source=Source.MODEL, output=np.ones(2, np.float32),
                                     model="m", version="1")) for i in range(5000)]
    tracemalloc.start()
    try:
        table = DedupTable(ttl_s=10.0, max_entries=10**6, max_bytes=10**9)
        base = tracemalloc.get_traced_memory()[0]
        for i, frames in enumerate(replies):
            stored = tuple(bytes(memoryview(f)) for f in frames)
            table.put((b"\x00id%05d" % i, f"req-{i:06d}"), stored, i, float(i), sum(map(len, stored)))
        held = tracemalloc.get_traced_memory()[0] - base
        assert held <= table.bytes <= 1.5 * held, (held, table.bytes)
        got = table.get((b"\x00id%05d" % 7, "req-000007"))
        assert got is not None and got[1] == 7 and got[0] == tuple(bytes(memoryview(f)) for f in replies[7])
        assert table.get((b"\x00id%05d" % 7, "req-000008")) is None
        table.forget(now=10**6)
        assert len(table) == 0 and table.bytes == 0
        # what is left is the interpreter's free list of 2-tuples (the keys hashed), not the table
        assert tracemalloc.get_traced_memory()[0] - base < 0.1 * held
    finally:
        tracemalloc.stop()


