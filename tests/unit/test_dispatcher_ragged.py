"""The dispatcher's batching of a named model's queries (``services.scheduling.ragged``): it
only chooses which queries go together, by the model's ragged policy, and forwards each
query's dict of named tensors (the worker pads); the one-tensor path is untouched."""
from __future__ import annotations

import numpy as np
import pytest

from keel.common import transport
from keel.common.config import BatchPolicy
from keel.common.protocol import Queries
from keel.services.scheduling.ragged import PAD, kind_of

from tests.unit.test_dispatcher import REPLY_TO, harness  # noqa: F401  (the fixture)


def send_rows(h, model: str, lengths: list[int]) -> list[int]:
    qids = list(range(h.next_qid, h.next_qid + len(lengths)))
    h.next_qid += len(lengths)
    rows = [{"ids": np.arange(n, dtype=np.int64), "dense": np.ones(3, np.float32)} for n in lengths]
    transport.send(h.frontend, Queries(model=model, qids=qids, budgets_ms=[60_000.0] * len(qids), reply_to=REPLY_TO,
                                       inputs=None, rows=rows))
    h.pump(lambda: h.d.status()["queues"][model] >= len(lengths), what="queued")
    return qids


def test_kinds_of_each_policy():
    row = {"ids": np.zeros(5, np.int64), "dense": np.zeros(13, np.float32)}
    assert kind_of("pad", 8, row) is PAD
    assert kind_of("equal", 8, row) == (("ids", (5,)), ("dense", (13,)))
    assert kind_of("bucket", 8, row) == (("ids", (8,)), ("dense", (16,)))
    assert kind_of("bucket", 8, {**row, "ids": np.zeros(8, np.int64)}) == kind_of("bucket", 8, row)
    assert kind_of("bucket", 8, {**row, "ids": np.zeros(9, np.int64)}) != kind_of("bucket", 8, row)


@pytest.mark.parametrize("policy, width, want", [
    ("pad", 1, [[0, 1, 2, 3, 4, 5]]),              # anything queued, in one batch
    ("equal", 1, [[0, 3], [1, 5], [2], [4]]),      # equal lengths only: the head's, looked for past others
    ("bucket", 8, [[0, 1, 3, 5], [2, 4]]),         # lengths rounded up to 8: 3, 5, 3, 5 | 12, 9
])
def test_a_named_model_is_batched_by_its_ragged_policy_and_rows_forwarded_whole(harness, policy, width, want):  # noqa: F811
    h = harness({"m": BatchPolicy(fixed_batch=8, ragged=policy, bucket_width=width)})
    lengths = [3, 5, 12, 3, 9, 5]
    qids = send_rows(h, "m", lengths)
    w = h.worker("w0", slots=1)
    got = []
    for _ in want:
        batch = h.next_batch(w)
        assert batch.inputs is None and [len(r["ids"]) for r in batch.rows] == [lengths[qids.index(q)] for q in batch.qids]
        got.append([qids.index(q) for q in batch.qids])
        h.done(w, batch, 1.0)
    assert got == want
    assert h.d.status()["queues"]["m"] == 0
