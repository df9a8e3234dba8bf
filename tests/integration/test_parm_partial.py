"""ParM §4.1 at low load: a coding group that never fills is encoded partial after the
encoder's ``partial_group_ms``, and when the worker holding its one batch is frozen, the
decoder answers that batch's queries from the parity output alone. The builtin sleep model
is linear and its own parity model, so those reconstructions are exact. Encoder, decoder
and workers answer Status."""
from __future__ import annotations

import signal
import tomllib
from pathlib import Path

import numpy as np
import pytest

from keel.common.protocol import Source
from keel.common.spec import load_spec
from keel.common.transport import request_status
from keel.deploy.local import free_port_block

pytestmark = pytest.mark.slow

PARM_TOML = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "parm.toml"


def test_partial_group_of_a_frozen_worker_is_answered_by_exact_reconstruction(tmp_path, launcher, client, wait):
    data = tomllib.loads(PARM_TOML.read_text())
    data["cluster"].update(base_port=free_port_block(), run_dir=str(tmp_path / "run"))
    data["models"]["sleep"].update(workers=2, k=2)
    data["encoder"] = {"partial_group_ms": 50.0}  # status endpoints: allocated by the spec
    spec = load_spec(data)
    dim, out = data["models"]["sleep"]["input_shape"][0], data["models"]["sleep"]["output_size"]
    run = launcher("partial")
    run.start_spec(spec)
    encoder, decoder = spec.role("encoder")[0].config, spec.role("decoder")[0].config

    deployed = [w.name for w in spec.role("worker") if w.config.role == "deployed"]
    for name in deployed:  # whichever takes the query never answers it
        run.kill(name, signal.SIGSTOP)
    try:
        x = np.random.default_rng(3).random((1, dim), dtype=np.float32)
        result = client(spec.client_endpoints, timeout_ms=10_000).predict_batch("sleep", x)[0]
    finally:
        for name in deployed:
            run.procs[name].send_signal(signal.SIGCONT)
    assert result.source == Source.RECONSTRUCTION
    np.testing.assert_allclose(result.output, x[0, :out], atol=1e-5)

    enc = request_status(encoder.status_endpoint, 5.0)
    assert enc["role"] == "encoder" and enc["partial"] >= 1 and enc["encoded"] >= 1
    dec = request_status(decoder.status_endpoint, 5.0)
    assert dec["role"] == "decoder" and dec["reconstructed"] >= 1 and dec["reconstructed_partial"] >= 1
    for key in ("groups_open", "skipped_expired", "stale"):
        assert key in dec
    assert "dropped_stale" in enc and "groups_open" in enc
