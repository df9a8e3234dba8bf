"""Keel: prediction serving that keeps tail latency flat and loses nothing when hosts slow
down or die.

The public API is here; everything else lives in the subpackages (``keel.common``,
``keel.services``, ``keel.deploy``, ``keel.training``, ``keel.chaos``, ``keel.bench``),
which the repository keeps as top-level folders and the package maps under ``keel``.

Example
-------
>>> from keel import Client            # doctest: +SKIP
>>> with Client(["tcp://127.0.0.1:7001"]) as client:  # doctest: +SKIP
...     result = client.predict("digits-mlp", x)

Names are loaded on first use, so ``import keel`` (and the ``keel`` command's ``--help``)
does not import numpy, torch or ZeroMQ (nor ``importlib.metadata``: ``__version__`` too is
read on first use).
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "Client": "keel.common.client",
    "AsyncClient": "keel.common.async_client",
    "FuturesClient": "keel.common.futures_client",
    "Result": "keel.common.client",
    "FeedbackResult": "keel.common.client",
    "KeelError": "keel.common.client",
    "BadInput": "keel.common.client",
    "UnknownModel": "keel.common.client",
    "Overloaded": "keel.common.client",
    "DeadlineExceeded": "keel.common.client",
    "Refused": "keel.common.client",
    "Unreachable": "keel.common.client",
    "ModelError": "keel.common.client",
    "InternalError": "keel.common.client",
    "Cancelled": "keel.common.client",
    "load_spec": "keel.common.spec",
    "ClusterSpec": "keel.common.spec",
    "SpecError": "keel.common.spec",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name == "__version__":  # read on demand: importlib.metadata costs every process ~50 ms at start
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("keel")
        except PackageNotFoundError:  # a source tree that was never installed
            value = "0+unknown"
        globals()[name] = value
        return value
    if name not in _EXPORTS:
        raise AttributeError(f"module 'keel' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
