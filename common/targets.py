"""The one description of a target: what ``Frontend.targets``, the gateways (OIP metadata
and config) and ``keel status`` show of a model, an application or a graph. Apart from
``common.inputs`` because it names the target's signature (``common.signature``), which
itself builds on ``common.inputs``.
"""
from __future__ import annotations

from typing import Any

from keel.common.inputs import KEYED
from keel.common.signature import Signature


def describe(kind: str, info: Any, version: str | None = None, **extra: Any) -> dict:
    """The description of a target: ``kind`` (model, application or graph), what it takes
    (``input_shape``, ``input_dtype``) and answers (``output_size``), the ``version`` served
    (None: it has no versions), whether it takes a ``key``, and ``extra`` (a graph's
    ``mode``), and its ``signature`` (``Signature.to_dict``: named inputs and outputs, their
    dtypes and -1 dims; ``Signature.single`` of the other fields for a model without one).
    ``info`` has the model-like fields (``common.config.ModelInfo``)."""
    signature = getattr(info, "signature", None)
    if signature is None:
        signature = Signature.single(info.input_shape, info.input_dtype, info.output_size or None).to_dict()
    return {"kind": kind, "input_shape": list(info.input_shape), "input_dtype": info.input_dtype,
            "output_size": info.output_size, "version": version, "key": KEYED[kind], "signature": signature, **extra}
