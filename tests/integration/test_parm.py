"""ParM end to end from deploy/examples/parm.toml: with one deployed worker frozen
(SIGSTOP), the queries it holds are answered by reconstruction from the parity model,
and every reconstruction is exact (the builtin sleep model is linear and is its own
parity model). And the Equal-Resources spec of the same file deploys m + m/k workers
and no coding services."""
from __future__ import annotations

import signal
import time
import tomllib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from keel.common.protocol import Source
from keel.common.spec import load_spec
from keel.common.transport import request_status
from keel.deploy.local import free_port_block

pytestmark = pytest.mark.slow

PARM_TOML = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "parm.toml"
PATIENT_MS = 10_000


def parm_spec(tmp_path: Path, **model_overrides):
    data = tomllib.loads(PARM_TOML.read_text())
    data["cluster"].update(base_port=free_port_block(), run_dir=str(tmp_path / "run"))
    data["models"]["sleep"].update(model_overrides)
    return data, load_spec(data)


def test_frozen_worker_is_answered_by_exact_reconstructions(tmp_path, launcher, client, wait):
    data, spec = parm_spec(tmp_path)
    model = data["models"]["sleep"]
    dim, out = model["input_shape"][0], model["output_size"]
    assert [s.name for s in spec.role("encoder")] == ["encoder"] and [s.name for s in spec.role("decoder")] == ["decoder"]
    run = launcher("parm")
    run.start_spec(spec)

    frozen = "worker-sleep-0"
    run.kill(frozen, signal.SIGSTOP)
    try:
        c = client(spec.client_endpoints, timeout_ms=PATIENT_MS)
        rng = np.random.default_rng(7)
        results, inputs = [], []
        deadline = time.monotonic() + 30
        # Rounds until a reconstruction shows up: the frozen worker (idle longest, so first
        # in line) takes a query in the first round and never answers it.
        while not any(r.source == Source.RECONSTRUCTION for r in results):
            assert time.monotonic() < deadline, f"no reconstruction within 30 s: {Counter(r.source for r in results)}"
            xs = rng.random((12, dim), dtype=np.float32)
            inputs.extend(xs)
            results.extend(c.predict_batch("sleep", xs))
    finally:
        run.procs[frozen].send_signal(signal.SIGCONT)

    ids = Counter(r.request_id for r in results)
    assert len(ids) == len(inputs) and set(ids.values()) == {1}
    sources = Counter(r.source for r in results)
    assert set(sources) <= {Source.MODEL, Source.RECONSTRUCTION}, sources
    assert sources[Source.RECONSTRUCTION] >= 1
    for x, r in zip(inputs, results):
        expected = x[:out]
        if r.source == Source.RECONSTRUCTION:
            np.testing.assert_allclose(r.output, expected, atol=1e-4)
        else:
            np.testing.assert_array_equal(r.output, expected)
    assert c.collect(0) == []  # and nothing else: no second answer to any call

    # Each reconstructed query's real prediction still comes (from the thawed worker, or
    # from the worker its batch was re-queued to): counted late, graded against the
    # reconstruction, never sent to the client.
    recon = sources[Source.RECONSTRUCTION]

    def graded() -> dict | None:
        info = request_status(spec.client_endpoints[0], 2.0)
        return info if info and info["answered"].get("reconstructions_graded", 0) >= recon else None

    answered = wait(graded, timeout_s=20, what="every reconstruction graded against its late prediction")["answered"]
    assert answered[Source.RECONSTRUCTION] == recon
    assert answered["reconstructions_agree"] == answered["reconstructions_graded"] == recon
    assert answered["late_model"] >= recon
    assert c.collect(0) == []


def test_equal_resources_mode(tmp_path, launcher, client):
    data, spec = parm_spec(tmp_path, mode="equal")
    m, k = data["models"]["sleep"]["workers"], data["models"]["sleep"]["k"]
    workers = spec.role("worker")
    assert len(workers) == m + m // k
    assert {w.config.role for w in workers} == {"deployed"} and {w.config.model for w in workers} == {"sleep"}
    assert spec.role("encoder") == [] and spec.role("decoder") == []
    dispatcher = spec.role("dispatcher")[0].config
    assert dispatcher.encoder_endpoint is None and dispatcher.models["sleep"].k == 0
    assert all(w.config.decoder_endpoint is None for w in workers)

    launcher("equal").start_spec(spec)
    info = request_status(dispatcher.worker_endpoint, 5.0)
    assert len(info["workers"]) == m + m // k and set(info["queues"]) == {"sleep"}
    xs = np.random.default_rng(8).random((20, data["models"]["sleep"]["input_shape"][0]), dtype=np.float32)
    results = client(spec.client_endpoints, timeout_ms=PATIENT_MS).predict_batch("sleep", xs)
    assert [r.source for r in results] == [Source.MODEL] * 20
    for x, r in zip(xs, results):
        np.testing.assert_array_equal(r.output, x[:10])
