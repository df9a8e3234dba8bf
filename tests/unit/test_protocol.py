"""The wire format: every message kind survives encode -> decode (as bytes and through real
zmq frames); anything malformed is a ProtocolError and never any other exception."""
from __future__ import annotations

import dataclasses

import numpy as np
import orjson
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keel.common import protocol
from keel.common.protocol import (
    ALLOWED_DTYPES, MESSAGES, PROTOCOL_VERSION, Answered, Batch, CodingTag, Configure, Done, Heartbeat, Leave,
    LineageEntry, MemberBatch, ParityMembers, Predict, Predictions, ProtocolError, Queries, Register, Reply, ModelRole,
    Source, Status, decode, encode, split_envelope,
)
from keel.common.protocol.messages import GraphAck, GraphDurable, GraphRequest, GraphState

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tensor(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 100, size=shape).astype(dtype)
    return rng.standard_normal(size=shape).astype(dtype)


def assert_same(a, b) -> None:
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray), f.name
            assert x.dtype == y.dtype and x.shape == y.shape, f.name
            assert np.array_equal(x, y), f.name
        else:
            assert x == y, f.name


def header(frames: list) -> dict:
    return orjson.loads(bytes(frames[0]))


def frames_of(head: dict, *tensors: bytes) -> list:
    return [orjson.dumps(head), *tensors]


# --------------------------------------------------------------------------- round trips

SHAPES = [(), (0,), (3,), (2, 3), (2, 3, 4)]


@pytest.mark.parametrize("dtype", sorted(ALLOWED_DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_predict_round_trip_every_dtype_and_shape(dtype, shape):
    msg = Predict(request_id="r1", model="m", input=tensor(dtype, shape), timeout_ms=12.5, version="2")
    out = decode(encode(msg))
    assert_same(msg, out)
    assert header(encode(msg))["tensors"] == [{"dtype": dtype, "shape": list(shape)}]


def test_non_contiguous_input_is_sent_contiguous():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    out = decode(encode(Predict(request_id="r", model="m", input=x)))
    assert np.array_equal(out.input, x)


def every_kind() -> list:
    inputs = tensor("float32", (3, 4), seed=1)
    members = ParityMembers("m", "add", [MemberBatch([1, 2, 3], ["tcp://a:1"] * 3), MemberBatch([4, 5], ["tcp://b:2"] * 2)])
    return [
        Predict(request_id="r1", model="m", input=tensor("int64", (4,))),
        Reply(request_id="r1", source=Source.MODEL, output=tensor("float32", (10,)), model="m", version="1"),
        Reply(request_id="r2", source=Source.ERROR, output=None, error="no", error_code="bad_request"),
        Reply(request_id="r3", source=Source.ENSEMBLE, output=tensor("float32", (10,)), model="app",
              models=["a", "b"], confidence=0.5),
        protocol.Feedback(request_id="r3", label=7),
        protocol.Feedback(request_id="r3", label=7, ok=False, error="unknown", error_code="unknown_request"),
        Queries(model="m", qids=[1, 2, 3], budgets_ms=[1.5, 2.5, 3.5], reply_to="tcp://127.0.0.1:9", inputs=inputs),
        Batch(batch_id=7, model="m", qids=[1, 2, 3], reply_to=["tcp://a:1"] * 3, inputs=inputs,
              group=CodingTag(4, 1, 2), budgets_ms=[5.0, 6.0, 7.5], lineage=[LineageEntry("a", 2, "m", 3)]),
        Batch(batch_id=8, model="m-parity", qids=[0, 1, 2], reply_to=[""] * 3, inputs=tensor("float16", (3, 2, 2)),
              role=ModelRole.PARITY, group=CodingTag(4, 2, 2), members=members),
        Predictions(batch_id=7, model="m", qids=[1, 2, 3], outputs=tensor("float32", (3, 10)), worker="w0",
                    group=CodingTag(4, 1, 2), service_ms=1.25, reply_to=["tcp://a:1"] * 3),
        Predictions(batch_id=8, model="m-parity", qids=[0, 1], outputs=tensor("float64", (2, 5)), role=ModelRole.PARITY,
                    members=members, group=CodingTag(4, 2, 2)),
        Predictions(batch_id=9, model="m", qids=[5], outputs=None, error="RuntimeError: boom"),
        Predictions(batch_id=10, model="m", qids=[6], outputs=tensor("uint8", (1, 3)), source=Source.RECONSTRUCTION),
        Register(worker="w0", model="m", role=ModelRole.PARITY, slots=3, max_batch=16, instance="c5.xlarge", price=0.17,
                 threads=2),
        Done(worker="w0", batch_id=7, batch_size=3, service_ms=4.5, ok=False, error="no frontend"),
        Leave(worker="w0"),
        Configure(slots=2, threads=4),
        Answered(model="m", qids=[3, 4]),
        protocol.Cancel(request_id="r9", client="c-1"),
        protocol.Withdraw(model="m", qids=[3, 4]),
        Heartbeat(sender="dispatcher", known=False),
        Status(service="frontend", info={"pending": 3, "answered": {"model": 2}, "cache": None}),
        Status(),
        protocol.Control(op="promote", args={"group": "dispatcher", "name": "d2", "expected_epoch": 3}),
        protocol.Control(op="promote", result={"status": "stale", "epoch": 4, "holder": "d1"}),
        protocol.Change(seq=7, values={"group/dispatcher": {"holder": "d2", "epoch": 4}, "service/d9": None}),
        GraphRequest(sender="g1", seq=4, origin=9, stream=2, lineage=[LineageEntry("frontend", 9, "g1", 4)],
                     input=tensor("float32", (6,))),
        GraphState(operator="g1", epoch=1, first_seq=3, last_seq=4, lineage=[LineageEntry("frontend", 9, "g1", 4)],
                   blob=tensor("uint8", (12,))),
        GraphAck(operator="g1", epoch=1, seq=4),
        GraphDurable(operator="g1", epoch=1, seq=4),
        protocol.Replies(request_ids=["r4", "r5"], source=Source.MODEL, outputs=tensor("float32", (2, 10)), model="m",
                         version="1"),
        protocol.Predicts(request_ids=["r6", "r7"], model="m", inputs=tensor("float32", (2, 4)), timeouts_ms=[10.0, 20.5],
                          client="c-1", bundle=True, columns=True),
    ]


def test_a_traced_message_keeps_its_stamps_and_an_untraced_one_sends_none():
    q = Queries(model="m", qids=[5, 6], budgets_ms=[10.0, 9.0], reply_to="tcp://x:1", inputs=tensor("float32", (2, 3)),
                traced=6, trace=[1700000000.25, 1700000000.5])
    back = decode(encode(q))
    assert (back.traced, back.trace) == (6, [1700000000.25, 1700000000.5])
    plain = encode(Predict(request_id="r", model="m", input=tensor("float32", (3,))))
    assert b"trace" not in bytes(plain[0])


@pytest.mark.parametrize("msg", every_kind(), ids=lambda m: f"{m.KIND}")
def test_every_kind_round_trips(msg):
    assert_same(msg, decode(encode(msg)))


def test_every_kind_is_covered():
    assert {m.KIND for m in every_kind()} == set(MESSAGES)


def test_coding_tag_and_members_survive():
    batch = every_kind()[8]
    out = decode(encode(batch))
    assert out.group == CodingTag(4, 2, 2) and isinstance(out.group, CodingTag)
    assert out.members.batches[1] == MemberBatch([4, 5], ["tcp://b:2"] * 2) and isinstance(out.members, ParityMembers)
    assert header(encode(batch))["group"] == [4, 2, 2]


def test_round_trip_through_zmq_frames():
    """Services read with copy=False: decode must take zmq.Frame objects (zero-copy)."""
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        for s in (a, b):
            s.setsockopt(zmq.LINGER, 0)
        a.bind("inproc://protocol-test")
        b.connect("inproc://protocol-test")
        for msg in every_kind():
            a.send_multipart(encode(msg), copy=False)
            assert b.poll(2000), "no message within 2 s"
            assert_same(msg, decode(b.recv_multipart(copy=False)))
    finally:
        a.close(0)
        b.close(0)
        ctx.term()


# --------------------------------------------------------------------------- malformed


def good_predict_frames() -> list:
    return [bytes(f) for f in encode(Predict(request_id="r", model="m", input=np.zeros(4, np.float32)))]


def test_wrong_version():
    head = header(good_predict_frames())
    for v in (PROTOCOL_VERSION + 1, 0, None, "1"):
        head["v"] = v
        with pytest.raises(ProtocolError, match="version"):
            decode(frames_of(head, bytes(16)))
    del head["v"]
    with pytest.raises(ProtocolError, match="version"):
        decode(frames_of(head, bytes(16)))


@pytest.mark.parametrize("kind", ["nonsense", "", None, 3, ["predict"], {"k": 1}])
def test_unknown_kind(kind):
    with pytest.raises(ProtocolError, match="kind"):
        decode([orjson.dumps({"v": PROTOCOL_VERSION, "kind": kind})])


@pytest.mark.parametrize("msg", every_kind(), ids=lambda m: f"{m.KIND}")
def test_each_missing_required_field(msg):
    frames = [bytes(f) for f in encode(msg)]
    head = header(frames)
    required = protocol._FIELDS[type(msg)][1]
    for name in required:
        broken = {k: v for k, v in head.items() if k != name}
        with pytest.raises(ProtocolError, match=name):
            decode([orjson.dumps(broken), *frames[1:]])


def test_sent_at_travels_and_is_checked():
    q = Queries(model="m", qids=[1], budgets_ms=[5.0], reply_to="tcp://a:1", inputs=np.zeros((1, 2), np.float32),
                sent_at=1_700_000_000.25)
    assert decode(encode(q)).sent_at == 1_700_000_000.25
    frames = [bytes(f) for f in encode(q)]
    for bad in ("now", -1.0, True, [1.0]):
        head = header(frames)
        head["sent_at"] = bad
        with pytest.raises(ProtocolError, match="sent_at"):
            decode([orjson.dumps(head), frames[1]])


def test_transit_is_never_negative():
    assert protocol.transit_s(None) == 0.0
    assert protocol.transit_s(100.0, now=103.5) == 3.5
    assert protocol.transit_s(100.0, now=99.0) == 0.0  # a lagging receiver's clock lengthens nothing


@pytest.mark.parametrize("field,value", [
    ("request_id", 5), ("model", ["m"]), ("timeout_ms", "fast"), ("timeout_ms", True),
    ("trace", [1.0, "late"]), ("trace", 3.0), ("trace", [0.5] * 17),
])
def test_mistyped_fields(field, value):
    frames = good_predict_frames()
    head = header(frames)
    head[field] = value
    with pytest.raises(ProtocolError, match=field):
        decode([orjson.dumps(head), frames[1]])


def test_mistyped_group_tag():
    frames = [bytes(f) for f in encode(every_kind()[7])]
    for bad in ([1, 2], [1, 2, "3"], "0:1:2", [1, 2, 3.0], {"group": 1}):
        head = header(frames)
        head["group"] = bad
        with pytest.raises(ProtocolError, match="coding group"):
            decode([orjson.dumps(head), frames[1]])


def test_mismatched_byte_counts():
    frames = good_predict_frames()  # float32 (4,) = 16 bytes
    for data in (bytes(15), bytes(17), b""):
        with pytest.raises(ProtocolError, match="bytes"):
            decode([frames[0], data])


def test_tensor_frame_count_must_match_descriptors():
    frames = good_predict_frames()
    with pytest.raises(ProtocolError, match="tensor frames"):
        decode([frames[0]])
    with pytest.raises(ProtocolError, match="tensor frames"):
        decode([frames[0], frames[1], frames[1]])
    done = [bytes(f) for f in encode(Done(worker="w", batch_id=1, batch_size=1, service_ms=1.0))]
    with pytest.raises(ProtocolError, match="extra frames"):
        decode([done[0], b"x"])


def test_a_bundle_is_several_messages_back_to_back_and_decode_takes_exactly_one():
    replies = [Reply(request_id="a", source=Source.MODEL, output=np.array([1.0, 2.0], np.float32), model="m"),
               Reply(request_id="b", source=Source.ERROR, error="no", error_code="model_error"),
               Reply(request_id="c", source=Source.MODEL, output=np.array([3.0, 4.0], np.float32), model="m")]
    frames = [bytes(f) for r in replies for f in encode(r)]
    got = protocol.decode_all(frames)
    assert [(r.request_id, None if r.output is None else list(r.output)) for r in got] == [
        ("a", [1.0, 2.0]), ("b", None), ("c", [3.0, 4.0])]
    assert [m.request_id for m in protocol.decode_all(frames[:2])] == ["a"]  # one message is a bundle of one
    with pytest.raises(ProtocolError, match="tensor frames"):
        decode(frames)  # a bundle is not one message
    with pytest.raises(ProtocolError, match="tensor frames"):
        protocol.decode_all(frames[:-1])  # the last reply lacks its tensor
    with pytest.raises(ProtocolError):
        protocol.decode_all(frames[:2] + [b"not json"])


def test_replies_are_columns_a_row_a_request_id_and_each_row_reads_as_its_reply():
    outputs = np.arange(6, dtype=np.float32).reshape(3, 2)
    cols = protocol.Replies(request_ids=["a", "b", "c"], source=Source.CACHE, outputs=outputs, model="m", version="2")
    alone = Reply(request_id="d", source=Source.ERROR, error="no", error_code="model_error")
    got = protocol.decode_all([bytes(f) for f in [*encode(cols), *encode(alone)]])  # beside a plain reply, one bundle
    assert [type(m) for m in got] == [protocol.Replies, Reply]
    rows = got[0].replies()
    assert [(r.request_id, r.source, r.model, r.version, list(r.output)) for r in rows] == [
        ("a", "cache", "m", "2", [0.0, 1.0]), ("b", "cache", "m", "2", [2.0, 3.0]), ("c", "cache", "m", "2", [4.0, 5.0])]
    frames = [bytes(f) for f in encode(cols)]
    for ids, why in ((["a", "b"], "rows"), ([], "request_ids"), (["a", ""], "request_ids"), (["a"] * 65, "request_ids"),
                     ([1, 2, 3], "request_ids"), ("abc", "request_ids")):
        head = header(frames)
        head["request_ids"] = ids
        with pytest.raises(ProtocolError, match=why):
            decode([orjson.dumps(head), frames[1]])
    head = header(frames)
    head["tensors"] = [{"dtype": "float32", "shape": []}]  # a scalar has no rows
    with pytest.raises(ProtocolError, match="rows"):
        decode([orjson.dumps(head), frames[1][:4]])


def test_predicts_are_columns_a_row_a_request_and_each_row_reads_as_its_predict():
    inputs = np.arange(6, dtype=np.float32).reshape(3, 2)
    cols = protocol.Predicts(request_ids=["a", "b", "c"], model="m", inputs=inputs, timeouts_ms=[1.0, 2.0, 3.0],
                             client="k-1", bundle=True, columns=True)
    rows = decode(encode(cols)).predicts()
    assert [(p.request_id, p.model, list(p.input), p.timeout_ms, p.client, p.bundle, p.columns) for p in rows] == [
        ("a", "m", [0.0, 1.0], 1.0, "k-1", True, True), ("b", "m", [2.0, 3.0], 2.0, "k-1", True, True),
        ("c", "m", [4.0, 5.0], 3.0, "k-1", True, True)]
    frames = [bytes(f) for f in encode(cols)]
    for field, value, why in (("request_ids", ["a", "b"], "rows"), ("request_ids", [], "request_ids"),
                              ("timeouts_ms", [1.0, 2.0], "timeouts_ms has 2"), ("timeouts_ms", [1.0, -2.0, 3.0], "timeouts_ms"),
                              ("timeouts_ms", [1.0, float("nan"), 3.0], "timeouts_ms"), ("model", None, "model")):
        head = header(frames)
        head[field] = value
        with pytest.raises(ProtocolError, match=why):
            decode([orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY), frames[1]])
    big = np.zeros((2, protocol.MAX_COLUMN_BYTES // 8 + 1), np.float32)  # a row under the bound, the column over it
    with pytest.raises(ProtocolError, match="bytes of inputs"):
        decode(encode(protocol.Predicts(request_ids=["a", "b"], model="m", inputs=big)))


def test_a_column_key_only_for_what_its_columns_kind_can_carry():
    x = np.zeros(4, np.float32)
    q = Predict(request_id="a", model="m", input=x, timeout_ms=100.0, client="k")
    assert protocol.column_key(q) == protocol.column_key(dataclasses.replace(q, request_id="b", input=x + 1))
    assert protocol.column_key(dataclasses.replace(q, input=np.zeros(5, np.float32))) != protocol.column_key(q)
    for change in ({"key": "u"}, {"version": "2"}, {"trace": [1.0]}, {"timeout_ms": None}):  # what a Predicts has no field for
        assert protocol.column_key(dataclasses.replace(q, **change)) is None, change
    r = Reply(request_id="a", source=Source.MODEL, output=x, model="m", version="1")
    assert protocol.column_key(r) == protocol.column_key(dataclasses.replace(r, request_id="b"))
    assert protocol.column_key(dataclasses.replace(r, version="2")) != protocol.column_key(r)
    for change in ({"output": None}, {"error": "e"}, {"models": ["m"]}, {"confidence": 1.0}, {"degraded": True},
                   {"trace": [1.0]}):  # what a Replies has no field for
        assert protocol.column_key(dataclasses.replace(r, **change)) is None, change
    assert protocol.column_key(Heartbeat(sender="w")) is None


def test_required_tensor_may_not_be_absent():
    head = header(good_predict_frames())
    head["tensors"] = [None]
    with pytest.raises(ProtocolError, match="input"):
        decode([orjson.dumps(head)])
    head["tensors"] = []
    with pytest.raises(ProtocolError, match="descriptor"):
        decode([orjson.dumps(head)])


def test_per_query_tensor_needs_a_row_per_query():
    queries = every_kind()[6]
    frames = [bytes(f) for f in encode(queries)]
    head = header(frames)
    head["qids"] = [1, 2]  # three rows
    with pytest.raises(ProtocolError, match="rows"):
        decode([orjson.dumps(head), frames[1]])
    head["qids"] = [1]
    head["tensors"] = [{"dtype": "float32", "shape": []}]  # a scalar has no rows at all
    with pytest.raises(ProtocolError, match="rows"):
        decode([orjson.dumps(head), bytes(4)])


@pytest.mark.parametrize("dtype", ["complex64", "float128", "object", "str", "<f4", None, 7, ["float32"], {"name": "float32"}])
def test_disallowed_dtype_on_decode(dtype):
    head = header(good_predict_frames())
    head["tensors"] = [{"dtype": dtype, "shape": [4]}]
    with pytest.raises(ProtocolError, match="dtype"):
        decode([orjson.dumps(head), bytes(16)])


@pytest.mark.parametrize("arr", [np.zeros(2, np.complex64), np.zeros(2, np.uint16), np.array(["a"])], ids=str)
def test_disallowed_dtype_on_encode(arr):
    with pytest.raises(ProtocolError, match="dtype"):
        encode(Predict(request_id="r", model="m", input=arr))


@pytest.mark.parametrize("shape", [[-1], [2, "3"], "4", [1] * 9, [True], None])
def test_bad_shapes(shape):
    head = header(good_predict_frames())
    head["tensors"] = [{"dtype": "float32", "shape": shape}]
    with pytest.raises(ProtocolError, match="shape"):
        decode([orjson.dumps(head), bytes(16)])


def test_oversized_payload():
    x = np.zeros(100, np.float32)  # 400 bytes
    frames = encode(Predict(request_id="r", model="m", input=x))
    assert decode(frames, max_payload=400).input.shape == (100,)
    with pytest.raises(ProtocolError, match="exceeds"):
        decode(frames, max_payload=399)
    # The limit is checked on the declared shape, before any frame is looked at.
    head = header(frames)
    head["tensors"] = [{"dtype": "float64", "shape": [1 << 40, 1 << 40]}]
    with pytest.raises(ProtocolError, match="exceeds"):
        decode([orjson.dumps(head), b""])


def test_oversized_header():
    big = orjson.dumps({"v": PROTOCOL_VERSION, "kind": "status", "service": "x" * protocol.MAX_HEADER_BYTES})
    with pytest.raises(ProtocolError, match="header"):
        decode([big])


@pytest.mark.parametrize("frames", [[], [b""], [b"{"], [b"[1, 2]"], [b"null"], [b"\xff\xfe"], [b'"v"']], ids=str)
def test_not_a_header(frames):
    with pytest.raises(ProtocolError):
        decode(frames)


# --------------------------------------------------------------------------- fuzzing


def must_decode_or_refuse(frames: list) -> None:
    try:
        msg = decode(frames)
    except ProtocolError:
        return
    assert type(msg) in MESSAGES.values()


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=5))
def test_fuzz_arbitrary_frames(frames):
    must_decode_or_refuse(frames)


@FUZZ
@given(st.binary(max_size=256))
def test_fuzz_arbitrary_header_bytes(raw):
    must_decode_or_refuse([raw])
    must_decode_or_refuse([raw, raw])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
ALL_FIELDS = sorted({f.name for cls in MESSAGES.values() for f in dataclasses.fields(cls)})
dims = st.integers(-2, 5) | json_values
descriptors = st.none() | json_values | st.fixed_dictionaries(
    {"dtype": st.sampled_from(sorted(ALLOWED_DTYPES) + ["complex64", "object"]) | json_values,
     "shape": st.lists(dims, max_size=3) | json_values})


@st.composite
def json_messages(draw) -> list:
    """Headers near the real ones: a real or odd kind, real field names with any JSON values,
    descriptors that sometimes match the frames that follow."""
    head: dict = {"v": draw(st.sampled_from([PROTOCOL_VERSION, PROTOCOL_VERSION, 2, "1"]) | json_values)}
    head["kind"] = draw(st.sampled_from(sorted(MESSAGES)) | json_values)
    for name in draw(st.lists(st.sampled_from(ALL_FIELDS), max_size=12, unique=True)):
        head[name] = draw(json_values | st.just([1, 2]) | st.just(["a", "b"]) | st.just([0, 1, 2]))
    if draw(st.booleans()):
        head["tensors"] = draw(st.lists(descriptors, max_size=2) | json_values)
    frames: list = [orjson.dumps(head)]
    descs = head.get("tensors")
    for desc in descs if isinstance(descs, list) else []:
        if draw(st.booleans()) and isinstance(desc, dict) and str(desc.get("dtype")) in ALLOWED_DTYPES \
                and isinstance(desc.get("shape"), list) and all(type(d) is int and 0 <= d < 6 for d in desc["shape"]):
            n = int(np.prod(desc["shape"])) * np.dtype(desc["dtype"]).itemsize
            frames.append(draw(st.binary(min_size=n, max_size=n)))  # a frame that matches its descriptor
        else:
            frames.append(draw(st.binary(max_size=16)))
    return frames


@FUZZ
@given(json_messages())
def test_fuzz_json_headers(frames):
    must_decode_or_refuse(frames)


@FUZZ
@given(st.sampled_from(every_kind()), st.sampled_from(ALL_FIELDS + ["tensors", "v", "kind"]), json_values)
def test_fuzz_one_field_of_a_real_message(msg, name, value):
    frames = [bytes(f) for f in encode(msg)]
    head = header(frames)
    head[name] = value
    must_decode_or_refuse([orjson.dumps(head), *frames[1:]])


@FUZZ
@given(st.sampled_from([m for m in every_kind() if m.TENSORS]), descriptors, st.binary(max_size=64))
def test_fuzz_descriptor_of_a_real_message(msg, desc, frame):
    frames = [bytes(f) for f in encode(msg)]
    head = header(frames)
    head["tensors"] = [desc]
    must_decode_or_refuse([orjson.dumps(head), frame])
    must_decode_or_refuse([orjson.dumps(head), *frames[1:]])


# --------------------------------------------------------------------------- envelopes


def test_split_envelope_dealer_peer():
    body = good_predict_frames()
    envelope, rest = split_envelope([b"id-1", *body])
    assert envelope == [b"id-1"] and rest == body


def test_split_envelope_req_peer():
    body = good_predict_frames()
    envelope, rest = split_envelope([b"id-1", b"", *body])
    assert envelope == [b"id-1", b""] and rest == body


def test_split_envelope_edges():
    assert split_envelope([b"id"]) == ([b"id"], [])
    assert split_envelope([b"id", b""]) == ([b"id", b""], [])
    with pytest.raises(ProtocolError):
        decode(split_envelope([b"id", b""])[1])


def test_split_envelope_of_zmq_frames():
    """A ROUTER reading copy=False hands over zmq.Frame objects."""
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        for s in (router, dealer):
            s.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.IDENTITY, b"peer")
        router.bind("inproc://envelope-test")
        dealer.connect("inproc://envelope-test")
        msg = Predict(request_id="r", model="m", input=np.arange(3, dtype=np.int32))
        dealer.send_multipart(encode(msg))
        dealer.send_multipart([b"", *encode(msg)])  # as a REQ-style peer would
        for expected in ([b"peer"], [b"peer", b""]):
            assert router.poll(2000), "no message within 2 s"
            envelope, body = split_envelope(router.recv_multipart(copy=False))
            assert [f.bytes for f in envelope] == expected
            assert_same(msg, decode(body))
    finally:
        router.close(0)
        dealer.close(0)
        ctx.term()


# --------------------------------------------------------------------------- hardening


def _with(msg, **changes) -> list:
    frames = [bytes(f) for f in encode(msg)]
    head = header(frames)
    head.update(changes)
    return [orjson.dumps(head), *frames[1:]]


@pytest.mark.parametrize("version", [True, 1.0, "1", [1]])
def test_version_must_be_the_integer_1(version):
    with pytest.raises(ProtocolError, match="version"):
        decode(_with(Done(worker="w", batch_id=1, batch_size=1, service_ms=1.0), v=version))


@pytest.mark.parametrize("changes,match", [
    ({"request_id": ""}, "request_id"),
    ({"request_id": "r" * 257}, "request_id"),
    ({"timeout_ms": float("inf")}, "timeout_ms"),
    ({"timeout_ms": -1}, "timeout_ms"),
])
def test_predict_bounds(changes, match):
    msg = Predict(request_id="r", model="m", input=np.zeros(4, np.float32))
    if "timeout_ms" in changes and changes["timeout_ms"] == float("inf"):
        frames = [bytes(f) for f in encode(msg)]
        text = bytes(frames[0]).replace(b'"model"', b'"timeout_ms":1e999,"model"')
        with pytest.raises(ProtocolError):
            decode([text, frames[1]])
        return
    with pytest.raises(ProtocolError, match=match):
        decode(_with(msg, **changes))


QUERIES = Queries(model="m", qids=[1, 2], budgets_ms=[5.0, 5.0], reply_to="tcp://a:1", inputs=np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("changes,match", [
    ({"budgets_ms": None}, "budgets_ms"),
    ({"budgets_ms": [5.0]}, "budgets_ms"),
    ({"budgets_ms": [5.0, "x"]}, "budgets_ms"),
    ({"qids": [1, -2]}, "qids"),
    ({"qids": [1, True]}, "qids"),
    ({"qids": [1, 2**63]}, "qids"),
    ({"reply_to": ["tcp://a:1"]}, "reply_to"),
])
def test_queries_are_checked_at_the_edge(changes, match):
    with pytest.raises(ProtocolError, match=match):
        decode(_with(QUERIES, **changes))


BATCH = Batch(batch_id=1, model="m", qids=[1, 2], reply_to=["a", "b"], inputs=np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("changes,match", [
    ({"reply_to": None}, "reply_to"),
    ({"reply_to": ["a"]}, "reply_to"),
    ({"group": [0, 3, 2]}, "coding group"),
    ({"group": [0, 0, 10**6]}, "coding group"),
    ({"group": [-1, 0, 2]}, "coding group"),
    ({"members": {"model": "m", "encoder": "add", "batches": [[[1], ["a"]]]}}, "members"),
    ({"group": [0, 2, 2], "members": {"model": "m", "encoder": "add", "batches": [[[1], ["a", "b"]], None]}}, "members"),
    ({"group": [0, 2, 2], "members": {"model": "m", "encoder": "xor", "batches": [None, [[1], ["a"]]]}}, "members"),
    ({"group": [0, 2, 2], "members": {"model": "m", "encoder": "add", "batches": [None, None]}}, "members"),
    ({"group": [0, 2, 3], "members": {"model": "m", "encoder": "add", "batches": [None, [[1], ["a"]]]}}, "members"),
    ({"lineage": [{"model": "m"}]}, "lineage"),
    ({"lineage": [["a", -1, "b", 2]]}, "lineage"),
    ({"role": "boss"}, "role"),
])
def test_batch_is_checked_at_the_edge(changes, match):
    with pytest.raises(ProtocolError, match=match):
        decode(_with(BATCH, **changes))


def test_partial_group_members_round_trip():
    members = ParityMembers("m", "add", [None, MemberBatch([7], ["tcp://a:1"])])
    batch = Batch(batch_id=2, model="m-parity", qids=[0], reply_to=[""], inputs=np.zeros((1, 3), np.float32),
                  role=ModelRole.PARITY, group=CodingTag(5, 2, 2), members=members)
    assert decode(encode(batch)).members == members


def test_a_traced_member_carries_its_query_and_context_and_an_untraced_one_nothing_more():
    tp = f"00-{'a' * 32}-{'b' * 16}-01"
    members = ParityMembers("m", "add", [MemberBatch([7], ["tcp://a:1"], traced=7, traceparent=tp), MemberBatch([8], ["tcp://a:1"])])
    assert members.to_json()["batches"] == [[[7], ["tcp://a:1"], 7, tp], [[8], ["tcp://a:1"]]]
    assert ParityMembers.from_json(members.to_json()) == members
    with pytest.raises(ProtocolError, match="traced"):
        ParityMembers.from_json({"model": "m", "encoder": "add", "batches": [[[7], ["a"], "7", tp], None]})


@pytest.mark.parametrize("changes,match", [
    ({"slots": 0}, "slots"), ({"slots": 10**6}, "slots"), ({"max_batch": 0}, "max_batch"),
    ({"max_batch": 10**7}, "max_batch"), ({"threads": 0}, "threads"), ({"price": -1}, "price"),
    ({"worker": "w" * 1000}, "worker"),
])
def test_register_values_are_bounded(changes, match):
    with pytest.raises(ProtocolError, match=match):
        decode(_with(Register(worker="w", model="m"), **changes))


@pytest.mark.parametrize("msg,name", [
    (Register(worker="w", model="m"), "slots"), (Register(worker="w", model="m"), "max_batch"),
    (Register(worker="w", model="m"), "threads"), (Register(worker="w", model="m"), "role"),
    (Done(worker="w", batch_id=1, batch_size=1, service_ms=1.0), "ok"), (Heartbeat(sender="d"), "known"),
    (QUERIES, "budgets_ms"), (BATCH, "role"),
])
def test_only_fields_typed_optional_may_be_null(msg, name):
    with pytest.raises(ProtocolError, match=name):
        decode(_with(msg, **{name: None}))


def test_graph_requests_carry_their_client_request_and_the_frontend_to_answer():
    from keel.common.protocol.messages import GraphRequest

    key = protocol.request_key("c1", "r/1")
    assert key != protocol.request_key("c1/r", "1")  # the id's length makes the pair unambiguous
    msg = GraphRequest("frontend", 3, 3, 0, [], np.zeros(2, np.float32), request=key, reply_to="tcp://127.0.0.1:9")
    back = protocol.decode(protocol.encode(msg))
    assert (back.request, back.reply_to) == (key, "tcp://127.0.0.1:9")
    bad = protocol.encode(msg)
    bad[0] = bad[0].replace(b'"reply_to":"tcp://127.0.0.1:9"', b'"reply_to":7')
    with pytest.raises(protocol.ProtocolError, match="reply_to"):
        protocol.decode(bad)


def test_a_field_a_header_lacks_keeps_a_default_its_check_accepts():
    # decode checks the fields a header has; one it lacks takes its dataclass default,
    # so every default must pass the check the field would get
    import dataclasses

    from keel.common.protocol.codec import _PLANS

    for cls, plan in _PLANS.items():
        defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        defaults.update({f.name: f.default_factory() for f in dataclasses.fields(cls)
                         if f.default_factory is not dataclasses.MISSING})
        for name, check, nullable in plan:
            if name not in defaults:
                continue  # required: a header without it is refused
            value = defaults[name]
            assert (value is None and nullable) or (value is not None and (check is None or check[0](value))), \
                (cls.__name__, name, value)
