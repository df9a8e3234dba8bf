"""Model selection (Clipper §5) through real processes: a frontend, a dispatcher and one
worker per model, on free loopback ports, the client library.

The builtin ``sleep`` model answers the first ``OUT`` input features, ``noop`` zeros: on a
one-hot input of class ``TRUE`` the ``sleep`` models are right and ``noop`` is wrong (it
says class 0), so feedback must move weight away from ``noop``.
"""
from __future__ import annotations

import asyncio
import signal
import time

import numpy as np
import pytest

from keel.common.async_client import AsyncClient
from keel.common.protocol import ErrorCode, Source
from keel.common.spec import load_spec
from keel.deploy.local import free_port_block
from keel.services.selection.contexts import ContextStore
from keel.services.selection.policies import State, probabilities

pytestmark = pytest.mark.slow

DIM, OUT, TRUE = 16, 4, 2
X = np.eye(DIM, dtype=np.float32)[TRUE]
DEADLINE_MS = 300.0  # the stragglers' deadline: far above a loaded 2-core machine's latency
PATIENT_MS = 10_000


def sleep_model() -> dict:
    return {"builtin": "sleep", "input_shape": [DIM], "output_size": OUT}


def spec_of(tmp_path, port: int):
    return load_spec({
        "cluster": {"name": "selection", "base_port": port, "run_dir": str(tmp_path / "run")},
        "models": {"right-a": sleep_model(), "right-b": sleep_model(),
                   "wrong": {"builtin": "noop", "input_shape": [DIM], "output_size": OUT}},
        "applications": {
            "ensemble": {"models": ["right-a", "right-b", "wrong"], "policy": "exp4", "deadline_ms": DEADLINE_MS},
            "pick": {"models": ["wrong", "right-a"], "policy": "exp3", "eta": 0.5},
            "robust": {"models": ["right-a", "wrong"], "policy": "robust", "threshold": 0.9,
                       "default_output": [0.25] * OUT},
        },
    })


@pytest.fixture(scope="module")
def cluster(module_launcher, tmp_path_factory):
    launcher = module_launcher("selection")
    spec = spec_of(tmp_path_factory.mktemp("selection"), free_port_block())
    launcher.start_spec(spec)
    return launcher, spec


def weights(spec, app: str, context: str) -> dict[str, float]:
    """What the frontend stored for ``context`` (read from its SQLite file, as ``keel selection show`` does)."""
    store = ContextStore(spec.service("frontend").config.selection_store)
    try:
        data = store.get(app, context, now=time.time())
    finally:
        store.close()
    assert data is not None, f"no state for {app}/{context}"
    models = spec.service("frontend").config.applications[app]["models"]
    return dict(zip(models, probabilities(State.from_dict(data).log_w)))


def test_an_application_call_says_which_models_answered_and_how_sure(cluster, client):
    _, spec = cluster
    c = client(spec.client_endpoints[0], timeout_ms=PATIENT_MS)
    r = c.predict("ensemble", X, key="alice")
    assert r.source == Source.ENSEMBLE and sorted(r.models) == ["right-a", "right-b", "wrong"], r
    assert int(np.argmax(r.output)) == TRUE and r.confidence == pytest.approx(2 / 3)
    low = c.predict("robust", X, key="alice")  # 1 of 2 agree < threshold 0.9: the default output
    assert low.source == Source.LOW_CONFIDENCE and low.confidence == pytest.approx(0.5)
    np.testing.assert_allclose(low.output, [0.25] * OUT)
    plain = c.predict("right-a", X)  # a model called by name: as before
    assert plain.source == Source.MODEL and plain.models is None and int(np.argmax(plain.output)) == TRUE


def test_feedback_moves_weight_to_the_right_models_once_per_call(cluster, client):
    _, spec = cluster
    c = client(spec.client_endpoints[0], timeout_ms=PATIENT_MS)
    for _ in range(5):
        r = c.predict("ensemble", X, key="bob")
        assert c.feedback(r.request_id, TRUE).ok
    w = weights(spec, "ensemble", "bob")
    assert w["wrong"] < 0.5 * w["right-a"], w
    again = c.feedback(r.request_id, TRUE)  # learned from already
    assert not again.ok and again.error_code == ErrorCode.UNKNOWN_REQUEST
    unknown = c.feedback("never-asked", TRUE)
    assert not unknown.ok and unknown.error_code == ErrorCode.UNKNOWN_REQUEST and "never-asked" in unknown.error
    r = c.predict("ensemble", X, key="bob")
    bad = c.feedback(r.request_id, OUT + 3)  # not a class: refused, the call's feedback still possible
    assert bad.error_code == ErrorCode.BAD_REQUEST and c.feedback(r.request_id, TRUE).ok
    assert c.predict("ensemble", X, key="bob").confidence == pytest.approx(2 / 3)  # the service still serves


def test_exp3_learns_to_pick_the_right_model_per_context(cluster, client):
    _, spec = cluster
    c = client(spec.client_endpoints[0], timeout_ms=PATIENT_MS)
    picks = []
    for _ in range(40):
        r = c.predict("pick", X, key="dave")
        assert r.source == Source.MODEL and len(r.models) == 1
        picks.append(r.models[0])
        assert c.feedback(r.request_id, TRUE).ok
    assert picks[-10:].count("right-a") >= 8, picks
    assert weights(spec, "pick", "dave")["right-a"] > 0.9
    # another context starts from equal weights
    c.predict("pick", X, key="erin")
    assert weights(spec, "pick", "erin") == pytest.approx({"wrong": 0.5, "right-a": 0.5})


def test_async_client_predicts_and_gives_feedback(cluster):
    _, spec = cluster

    async def run():
        async with AsyncClient(spec.client_endpoints[0], timeout_ms=PATIENT_MS) as c:
            r = await c.predict("ensemble", X, key="async")
            ack = await c.feedback(r.request_id, TRUE)
            return r, ack

    r, ack = asyncio.run(run())
    assert r.source == Source.ENSEMBLE and ack.ok


def test_a_frozen_model_is_a_straggler_the_ensemble_answers_without(cluster, client):
    launcher, spec = cluster
    c = client(spec.client_endpoints[0], timeout_ms=PATIENT_MS, retries=0)
    frozen = launcher.procs["worker-right-b-0"]
    frozen.send_signal(signal.SIGSTOP)
    try:
        results = [c.predict("ensemble", X, key="frank") for _ in range(3)]
    finally:
        frozen.send_signal(signal.SIGCONT)
    for r in results:
        assert r.source == Source.PARTIAL and sorted(r.models) == ["right-a", "wrong"], r
        # the missing model counts as disagreeing: 1 of 3 agree with the answer (the two
        # answering disagree; the weights decide)
        assert r.confidence == pytest.approx(1 / 3)
        # answered at the application's deadline, not the client's 10 s
        assert r.latency_ms < PATIENT_MS / 2
    r = c.predict("ensemble", X, key="frank")  # thawed: everyone answers again
    assert r.source == Source.ENSEMBLE


def test_learned_context_state_survives_a_frontend_restart(cluster, client):
    launcher, spec = cluster
    c = client(spec.client_endpoints[0], timeout_ms=PATIENT_MS)
    for _ in range(3):
        r = c.predict("ensemble", X, key="gina")
        assert c.feedback(r.request_id, TRUE).ok
    before = weights(spec, "ensemble", "gina")
    launcher.kill("frontend", signal.SIGKILL)
    launcher.start(spec.service("frontend"))
    launcher.wait_status(spec.client_endpoints[0])
    assert weights(spec, "ensemble", "gina") == pytest.approx(before)
    stale = c.feedback(r.request_id, TRUE)  # the feedback log is the old incarnation's: gone
    assert not stale.ok and stale.error_code == ErrorCode.UNKNOWN_REQUEST
    r = c.predict("ensemble", X, key="gina")
    assert r.source == Source.ENSEMBLE and c.feedback(r.request_id, TRUE).ok
    after = weights(spec, "ensemble", "gina")
    assert after["wrong"] < before["wrong"], (before, after)  # learning went on from the stored state


def test_the_client_example_runs():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "deploy/examples/selection_client.py"], capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "digits for alice: class 2" in done.stdout and "ok=True" in done.stdout, done.stdout
    assert "again:    unknown_request" in done.stdout
