"""Fuzz the frontend's internal prediction PULL (the client ROUTER is fuzzed in
test_serving): garbage frames, headers of every kind with random field values, and
messages of every kind in ``protocol.MESSAGES`` built from hostile values -- Predictions
with random or huge query ids (of this incarnation too), wrong models, outputs of wrong
shapes, errors; Status, Queries, Answered, ... Afterwards the process is alive and a
normal client still gets a correct answer."""
from __future__ import annotations

import dataclasses

import numpy as np
import orjson
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keel.common import protocol
from keel.common.protocol import CodingTag, LineageEntry, ModelRole, Source
from keel.common.spec import load_spec
from keel.common.transport import request_status
from keel.deploy.local import free_port_block

pytestmark = pytest.mark.slow

DIM, OUT = 16, 4


@pytest.fixture(scope="module")
def cluster(module_launcher, tmp_path_factory):
    spec = load_spec({
        "cluster": {"name": "fuzz", "base_port": free_port_block(), "run_dir": str(tmp_path_factory.mktemp("fuzz"))},
        "frontend": {"cache_size": 0, "log_requests": False},
        "models": {"echo": {"builtin": "sleep", "input_shape": [DIM], "output_size": OUT}},
    })
    run = module_launcher("fuzz")
    run.start_spec(spec)
    return run, spec


NAMES = st.sampled_from(["echo", "", "nope", "echo-parity", "x" * 300])
TEXT = st.one_of(NAMES, st.text(max_size=20))
NUMBER = st.one_of(st.floats(allow_nan=False, width=32), st.integers(-10, 10**6), st.just(-1.0))
INT = st.integers(-3, 2**63 - 1)


def query_ids(epoch: int):
    """Random ids, huge ones, and ids of the frontend's own incarnation (sequence numbers
    far above what the test's own queries reach)."""
    own = st.integers(2**31, 2**32 - 1).map(lambda seq: (epoch << 32) | seq)
    return st.one_of(st.integers(0, 2**63 - 1), st.just(2**63 - 1), st.integers(0, 5), own)


def tensor(rows: int):
    return st.one_of(
        st.none(),
        st.integers(0, 12).map(lambda cols: np.full((rows, cols), 7.0, np.float32)),  # OUT columns or not
        st.just(np.zeros((rows + 1, OUT), np.float32)),  # a row count that does not match
        st.just(np.zeros(3, np.float32)),
    )


def _texts(items: list) -> np.ndarray:
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    return arr


@st.composite
def messages(draw, epoch: int):
    """A message of any kind with field values drawn to be plausible or hostile."""
    cls = draw(st.sampled_from(list(protocol.MESSAGES.values())))
    n = draw(st.integers(0, 6))
    fields = {
        "qids": st.lists(query_ids(epoch), min_size=n, max_size=n),
        "budgets_ms": st.one_of(st.none(), st.lists(NUMBER, min_size=n, max_size=n)),
        "reply_to": (TEXT if cls is protocol.Queries else st.one_of(st.none(), st.lists(TEXT, min_size=n, max_size=n))),
        "source": st.sampled_from([Source.MODEL, Source.RECONSTRUCTION, "junk"]),
        "role": st.sampled_from([ModelRole.DEPLOYED, ModelRole.PARITY]),
        "error": st.one_of(st.none(), st.text(max_size=30)),
        "group": st.one_of(st.none(), st.builds(CodingTag, INT, st.integers(0, 70), st.integers(0, 70))),
        "lineage": st.one_of(st.none(), st.lists(st.builds(LineageEntry, TEXT, INT, TEXT, INT), max_size=3)),
        "info": st.one_of(st.none(), st.dictionaries(st.text(max_size=5), INT, max_size=3)),
        "ok": st.booleans(), "known": st.booleans(),
        "members": st.none(),
    }
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in cls.TENSORS:
            kwargs[f.name] = draw(tensor(n))
        elif f.name == getattr(cls, "NAMED", None):  # named tensors (protocol.named): none, or rows of them
            row = st.fixed_dictionaries({"ids": st.lists(st.integers(0, 9), max_size=3).map(lambda v: np.array(v, np.int64)),
                                         "text": st.lists(st.binary(max_size=4), max_size=2).map(_texts)})
            one = cls in (protocol.Predict, protocol.Reply)
            kwargs[f.name] = draw(st.one_of(st.none(), row if one else st.lists(row, min_size=n, max_size=n)))
        elif f.name in fields:
            kwargs[f.name] = draw(fields[f.name])
        elif f.type in ("int", "int | None"):
            kwargs[f.name] = draw(INT)
        elif "float" in f.type:
            kwargs[f.name] = draw(NUMBER)
        else:
            kwargs[f.name] = draw(TEXT)
    return protocol.encode(cls(**kwargs))


def raw_headers(epoch: int):
    """A header dict of a random kind with random keys and values, and random frames."""
    value = st.one_of(st.none(), st.booleans(), INT, NUMBER, TEXT, st.lists(query_ids(epoch), max_size=4),
                      st.dictionaries(st.text(max_size=4), INT, max_size=2))  # orjson: 64-bit ints only
    header = st.fixed_dictionaries(
        {"v": st.sampled_from([1, 1, 1, 2, "1", True]), "kind": st.one_of(st.sampled_from(list(protocol.MESSAGES)), TEXT)},
        optional={"qids": st.lists(query_ids(epoch), max_size=4), "model": NAMES, "outputs": value,
                  "tensors": st.lists(st.one_of(st.none(), st.fixed_dictionaries(
                      {"dtype": st.sampled_from(["float32", "int64", "complex64", "bool"]),
                       "shape": st.lists(st.integers(-1, 9), max_size=3)})), max_size=2),
                  "batch_id": value, "worker": value, "source": value, "error": value, "budgets_ms": value})
    return st.tuples(header, st.lists(st.binary(max_size=64), max_size=2)).map(
        lambda hb: [orjson.dumps(hb[0]), *hb[1]])


GARBAGE = st.lists(st.binary(max_size=200), min_size=1, max_size=4)


def test_hostile_predictions_leave_the_frontend_serving(cluster, zsock, client, wait):
    run, spec = cluster
    endpoint = spec.client_endpoints[0]
    info = request_status(endpoint, 5.0)
    epoch = info["epoch"]
    push = zsock(zmq.PUSH, connect=spec.service("frontend").config.prediction_endpoint)
    sent = []

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(frames=st.one_of(messages(epoch), raw_headers(epoch), GARBAGE))
    def fuzz(frames):
        push.send_multipart(frames)
        sent.append(len(frames))

    fuzz()
    assert len(sent) >= 100
    c = client(endpoint, timeout_ms=10_000)
    for seed in range(3):
        x = np.random.default_rng(seed).random(DIM, dtype=np.float32)
        result = c.predict("echo", x)
        assert result.source == Source.MODEL, (result.source, result.error)
        np.testing.assert_array_equal(result.output, x[:OUT])
    assert run.procs["frontend"].poll() is None
    after = request_status(endpoint, 5.0)
    assert after is not None and after["epoch"] == epoch  # the same process, not a restart
    log = (run.log_dir / "frontend.log").read_text(errors="replace")
    assert "failed" not in log, log[-3000:]  # every hostile message was refused, none crashed a handler
