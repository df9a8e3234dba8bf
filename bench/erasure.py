"""Benchmark of the erasure code on the serving path: encode and decode latency.

- ``encode_us[k]``  median microseconds to add-encode k float32 3x224x224 queries into a
                    preallocated parity buffer (``common.erasure.add_encode``)
- ``decode_us[k]``  median microseconds to subtraction-decode one 1000-class prediction
                    from F_P(P) and k-1 available ones into a preallocated buffer
                    (``common.erasure.subtract_decode``)

Targets: encode k=4 <= 100 us, decode k=4 <= 10 us. The numbers are printed as a table
and written as JSON (``--json PATH``). Timings only; tests never assert on them.

Example
-------
$ keel bench erasure --json runs/bench-erasure.json
"""
from __future__ import annotations

import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from keel.common.erasure import add_encode, subtract_decode

KS = (2, 3, 4)
QUERY_SHAPE = (3, 224, 224)
N_CLASSES = 1000
TARGETS_US = {"encode_k4": 100.0, "decode_k4": 10.0}
#: the printed table and its targets (keel bench)
FIGURES = ("encode_us_k4", "decode_us_k4")
TARGETS = {"encode_us_k4": "<= 100", "decode_us_k4": "<= 10"}


def median_us(fn: Callable[[], Any], repeats: int, warmup: int = 10) -> float:
    """Median wall time of ``fn()`` in microseconds over ``repeats`` calls."""
    for _ in range(warmup):
        fn()
    times = np.empty(repeats)
    for i in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times[i] = time.perf_counter_ns() - t0
    return float(np.median(times) / 1e3)


def run(args=None, log=print, encode_repeats: int = 300, decode_repeats: int = 3000) -> dict:
    """Measure encode and decode latency for k = 2, 3, 4; log a table.

    Parameters
    ----------
    args : argparse.Namespace
        ``keel bench erasure``'s (it has no options of its own).
    log : callable
        Where the table goes.
    encode_repeats, decode_repeats : int
        Timed calls per k.

    Returns
    -------
    dict
        ``encode_us`` and ``decode_us`` (keyed by k as a string), ``targets_us``,
        ``meets_targets``, shapes and the machine.
    """
    rng = np.random.default_rng(0)
    queries = rng.random((max(KS), *QUERY_SHAPE), dtype=np.float32)
    parity = np.empty(QUERY_SHAPE, dtype=np.float32)
    outputs = rng.standard_normal((max(KS), N_CLASSES), dtype=np.float32)
    parity_output = rng.standard_normal(N_CLASSES, dtype=np.float32)
    recon = np.empty(N_CLASSES, dtype=np.float32)

    encode_us, decode_us = {}, {}
    for k in KS:
        group = [queries[i] for i in range(k)]  # separate queries, as the frontend holds them
        available = [outputs[i] for i in range(k - 1)]
        encode_us[str(k)] = median_us(lambda: add_encode(group, out=parity), encode_repeats)
        decode_us[str(k)] = median_us(lambda: subtract_decode(parity_output, available, out=recon), decode_repeats)
    result = {
        "encode_us": encode_us,
        "decode_us": decode_us,
        "targets_us": TARGETS_US,
        "meets_targets": encode_us["4"] <= TARGETS_US["encode_k4"] and decode_us["4"] <= TARGETS_US["decode_k4"],
        "query_shape": list(QUERY_SHAPE),
        "dtype": "float32",
        "n_classes": N_CLASSES,
        "numpy": np.__version__,
        "machine": platform.machine(),
        "python": platform.python_version(),
    }
    result["encode_us_k4"], result["decode_us_k4"] = encode_us["4"], decode_us["4"]
    log(f"{'k':>3} {'encode_us':>10} {'decode_us':>10}   (3x224x224 float32 queries, {N_CLASSES}-class outputs)")
    for k in KS:
        log(f"{k:>3} {encode_us[str(k)]:>10.1f} {decode_us[str(k)]:>10.2f}")
    return result


def passed(report: dict) -> bool:
    return report["meets_targets"]

