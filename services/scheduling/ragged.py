"""Which queries of a named model may share a batch (``common.ragged``'s policies, as the
dispatcher applies them).

The dispatcher is the bottleneck process: it only chooses which queries go together and
forwards each query's dict of named tensors (``Batch.rows``); the worker pads them
(``common.ragged.pad``) and cuts the outputs back. A query's *kind* says what it may be
batched with (queries of one kind go together, ``Dispatcher._take_batch``):

- ``pad``: one kind for all: anything queued, up to the batch size, padded to the batch's
  largest by the worker;
- ``bucket``: each tensor's shape with every dim rounded up to a multiple of
  ``bucket_width`` (a fixed dim is the same for every query, so rounding it groups nothing
  apart): waste bounded by the width, batches smaller;
- ``equal``: each tensor's exact shape (Triton's default dynamic batcher: equal shapes only).

Where kinds differ the dispatcher looks past the head of the queue (at most ``SCAN`` queries)
for those of the head's kind, so a batch is not cut short by one query of another length.
"""
from __future__ import annotations

import numpy as np

#: the one kind of every query of a ``pad`` model
PAD = ("pad",)
#: queries the dispatcher looks through for the head's kind, beyond the batch it fills
SCAN = 256


def kind_of(policy: str, width: int, row: dict[str, np.ndarray]) -> tuple:
    """The kind of one query (``row``: its named tensors) under ``policy``."""
    if policy == "pad":
        return PAD
    if policy == "bucket" and width > 1:
        return tuple((name, tuple(-(-d // width) * width for d in arr.shape)) for name, arr in row.items())
    return tuple((name, arr.shape) for name, arr in row.items())
