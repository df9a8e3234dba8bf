"""Named tensors on the wire (``protocol.named``): several tensors of any signature dtype,
variable shapes per query and bytes without pickle survive encode -> decode; anything
malformed is a ProtocolError, never another exception; named messages never go as columns."""
from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keel.common import protocol
from keel.common.protocol import Batch, Predict, Predictions, ProtocolError, Queries, Reply, decode, encode
from keel.common.protocol.named import MAX_NAMES, NAMED_DTYPES

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def texts(*items) -> np.ndarray:
    arr = np.empty(len(items), dtype=object)
    arr[:] = list(items)
    return arr


def rec(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"dense": rng.standard_normal(13).astype(np.float32), "ids": rng.integers(0, 1000, n).astype(np.int64),
            "text": texts(b"hello", "caf\u00e9".encode(), b"")}


def same_rows(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert list(x) == list(y)
        for name in x:
            assert x[name].dtype == y[name].dtype and x[name].shape == y[name].shape, name
            assert x[name].tolist() == y[name].tolist(), name


def round_trip(msg):
    return decode([bytes(f) for f in encode(msg)])


def test_predict_with_named_inputs_round_trips_and_carries_no_input():
    msg = round_trip(Predict(request_id="r", model="rec", inputs=rec(7), timeout_ms=50.0))
    assert msg.input is None and msg.timeout_ms == 50.0
    same_rows([msg.inputs], [rec(7)])
    assert msg.inputs["text"].tolist() == [b"hello", "caf\u00e9".encode(), b""]


@pytest.mark.parametrize("dtype", NAMED_DTYPES)
def test_every_signature_dtype_round_trips(dtype):
    if dtype == "bytes":
        value = np.array([[b"a", b"bc"], [b"", b"\x00\xff"]], dtype=object)
    else:
        from keel.common.signature import numpy_dtype

        value = (np.arange(6) % 2).astype(numpy_dtype(dtype)).reshape(2, 3)
    msg = round_trip(Reply(request_id="r", source="model", outputs={"y": value, "scalar": np.float32(2.5) * np.ones(())}))
    assert msg.output is None
    assert msg.outputs["y"].dtype == value.dtype and msg.outputs["y"].shape == value.shape
    assert msg.outputs["y"].tolist() == value.tolist()
    assert msg.outputs["scalar"].shape == () and float(msg.outputs["scalar"]) == 2.5


def test_rows_of_different_lengths_travel_in_one_frame_a_name():
    rows = [rec(n, seed=n) for n in (1, 40, 3)]
    frames = encode(Queries(model="rec", qids=[1, 2, 3], budgets_ms=[5.0] * 3, reply_to="tcp://x", inputs=None, rows=rows))
    assert len(frames) == 1 + 3  # header, then dense, ids, text
    msg = decode([bytes(f) for f in frames])
    same_rows(msg.rows, rows)
    batch = round_trip(Batch(batch_id=1, model="rec", qids=[1, 2, 3], reply_to=["a"] * 3, inputs=None, rows=rows))
    same_rows(batch.rows, rows)
    out = round_trip(Predictions(batch_id=1, model="rec", qids=[1, 2, 3], outputs=None, rows=[{"p": np.ones(1)}] * 3))
    assert [r["p"].tolist() for r in out.rows] == [[1.0]] * 3


def test_named_messages_never_go_as_columns():
    named = Predict(request_id="r", model="rec", inputs=rec(3), timeout_ms=5.0)
    plain = Predict(request_id="s", model="m", input=np.zeros(4, np.float32), timeout_ms=5.0)
    assert protocol.column_key(named) is None and protocol.column_key(plain) is not None
    assert protocol.column_key(Reply(request_id="r", source="model", outputs={"p": np.ones(1)})) is None
    frames = protocol.encode_bundle([(named, None, None), (plain, None, protocol.column_key(plain))], 1 << 16)
    a, b = protocol.decode_all([bytes(f) for f in frames])
    same_rows([a.inputs], [rec(3)])
    assert b.input.tolist() == [0.0] * 4


@pytest.mark.parametrize("make, match", [
    (lambda: Predict(request_id="r", model="m"), "one of the two"),
    (lambda: Predict(request_id="r", model="m", input=np.zeros(2, np.float32), inputs={"a": np.zeros(2)}), "one of the two"),
    (lambda: Queries(model="m", qids=[1], budgets_ms=[1.0], reply_to="x", inputs=None), "one of the two"),
])
def test_a_message_carries_one_tensor_or_named_ones(make, match):
    with pytest.raises(ProtocolError, match=match):
        round_trip(make())


def frames_with(desc_change=None, frame=None, rows=None) -> list:
    msg = Queries(model="m", qids=[1, 2], budgets_ms=[1.0, 1.0], reply_to="x", inputs=None,
                  rows=rows or [{"ids": np.arange(3), "t": texts(b"ab")}, {"ids": np.arange(1), "t": texts(b"c")}])
    frames = [bytes(f) for f in encode(msg)]
    head = orjson.loads(frames[0])
    if desc_change:
        desc_change(head["named"])
    if frame is not None:
        frames[frame[0]] = frame[1]
    return [orjson.dumps(head), *frames[1:]]


@pytest.mark.parametrize("change, frame, match", [
    (lambda d: d[0].update(dtype="complex64"), None, "dtype"),
    (lambda d: d[0].update(dtype="object"), None, "dtype"),
    (lambda d: d[0].update(shapes=[[3]]), None, "row shapes"),
    (lambda d: d[0].update(shapes=[[3], [-1]]), None, "shape"),
    (lambda d: d[0].update(shapes=[[3], [1] * 9]), None, "shape"),
    (lambda d: d[0].update(shapes=[[4], [1]]), None, "frame has"),
    (lambda d: d[1].update(lengths=[2]), None, "lengths"),
    (lambda d: d[1].update(lengths=[1, 3]), None, "frame has"),
    (lambda d: d[1].update(lengths=[-1, 4]), None, "lengths"),
    (lambda d: d[0].update(lengths=[1]), None, "bytes tensors only"),
    (lambda d: d[1].update(name="ids"), None, "twice"),
    (lambda d: d[0].update(name=""), None, "name"),
    (lambda d: d[0].update(name=7), None, "name"),
    (lambda d: d.append(d[0]), None, "frames"),
    (None, (1, b"\x00" * 7), "frame has"),
])
def test_named_tensors_are_checked_at_the_edge(change, frame, match):
    with pytest.raises(ProtocolError, match=match):
        decode(frames_with(change, frame))


def test_named_payload_and_counts_are_bounded():
    frames = frames_with()
    with pytest.raises(ProtocolError, match="exceed the limit"):
        decode(frames, max_payload=16)
    head = orjson.loads(frames[0])
    head["named"] = [dict(head["named"][0], name=f"n{i}") for i in range(MAX_NAMES + 1)]
    with pytest.raises(ProtocolError, match="more than"):
        decode([orjson.dumps(head), *[frames[1]] * (MAX_NAMES + 1)])


def test_bytes_elements_are_not_unpickled():
    import pickle

    evil = pickle.dumps(object())
    msg = round_trip(Predict(request_id="r", model="m", inputs={"t": texts(evil)}))
    assert msg.inputs["t"][0] == evil and type(msg.inputs["t"][0]) is bytes


# --------------------------------------------------------------------------- fuzzing

named_values = st.one_of(
    st.lists(st.binary(max_size=6), max_size=4).map(lambda v: texts(*v)),
    st.lists(st.integers(-5, 5), max_size=6).map(lambda v: np.array(v, np.int64)),
    st.lists(st.floats(-1, 1, width=32), max_size=6).map(lambda v: np.array(v, np.float32)),
)


@FUZZ
@given(st.lists(st.dictionaries(st.sampled_from(["a", "b", "c"]), named_values, min_size=1, max_size=3), min_size=1, max_size=3))
def test_fuzz_multi_tensor_and_bytes_rows_round_trip(rows):
    names = list(rows[0])
    rows = [{n: r.get(n, rows[0][n]) for n in names} for r in rows]  # every row names the same tensors
    rows = [{n: r[n] if r[n].dtype == rows[0][n].dtype else rows[0][n] for n in names} for r in rows]
    msg = round_trip(Batch(batch_id=1, model="m", qids=list(range(len(rows))), reply_to=["x"] * len(rows), inputs=None,
                           rows=rows))
    same_rows(msg.rows, rows)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**40) | st.text(max_size=6),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=10)


@FUZZ
@given(st.sampled_from(["name", "dtype", "shapes", "lengths", "extra"]), json_values, st.integers(0, 1),
       st.lists(st.binary(max_size=12), max_size=3))
def test_fuzz_named_descriptors_and_frames(field, value, which, extra_frames):
    frames = frames_with(lambda d: d[which].update({field: value}))
    for frames_try in (frames, frames[:1] + extra_frames, frames + extra_frames):
        try:
            msg = decode(frames_try)
        except ProtocolError:
            continue
        assert isinstance(msg, Queries) and len(msg.rows) == 2
