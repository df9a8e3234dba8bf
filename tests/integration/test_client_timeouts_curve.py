"""Client calls against a real CURVE cluster end by their deadline with the reason, from
both clients, whatever port they are pointed at: a client whose key the frontend does not
allow (``Refused``), the frontend's predictions port and the dispatcher's worker port
(sockets of other kinds: ``Refused``, and ``DeadlineExceeded`` from a ROUTER that never
answers a client), a SIGSTOPped frontend (``DeadlineExceeded``). The async client's event
loop keeps running other tasks meanwhile, and ``asyncio.wait_for`` around a call fires.

"Ends by" allows a half-second margin: behaviour (the call returns), not speed.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import pytest

from keel.common import curve
from keel.common.async_client import AsyncClient
from keel.common.client import GRACE_MS, Client, DeadlineExceeded, Reason, Refused
from keel.common.protocol import ErrorCode, Source
from keel.common.spec import load_spec
from keel.deploy.local import free_port_block
from tests.support.curve import cluster_and_stranger
from tests.support.loop import Ticker

pytestmark = pytest.mark.slow

DIM = 4
TIMEOUT_MS = 400.0
MARGIN_S = 0.5
LATEST_S = (TIMEOUT_MS + GRACE_MS) / 1000.0 + MARGIN_S
X = np.arange(DIM, dtype=np.float32)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return cluster_and_stranger(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def cluster(keys, module_launcher):
    folder, _ = keys
    run = module_launcher("client-timeouts")
    curve.use(folder, "client")  # this process's readiness checks are CURVE clients too
    try:
        spec = load_spec({"cluster": {"name": "timeouts", "base_port": free_port_block(), "run_dir": str(run.log_dir),
                                      "curve_keys": str(folder)},
                          "frontend": {"cache_size": 0},
                          "models": {"echo": {"builtin": "sleep", "input_shape": [DIM], "output_size": DIM}}})
        run.start_spec(spec)
        yield run, spec
    finally:
        curve.use(None)


def no_answer_from_both_clients(endpoint: str, want: type[DeadlineExceeded], reason: Reason, **options) -> None:
    """Two calls from each client to ``endpoint``: each ends by its deadline with ``want``."""
    with Client(endpoint, timeout_ms=TIMEOUT_MS, retries=1, raise_errors=True, **options) as c:
        for _ in range(2):  # the second finds the socket the first was refused on
            start = time.perf_counter()
            with pytest.raises(DeadlineExceeded) as exc:
                c.predict("echo", X)
            assert time.perf_counter() - start <= LATEST_S
            assert type(exc.value) is want and exc.value.result.reason == reason, exc.value
            assert exc.value.error_code == ErrorCode.TIMEOUT

    async def run() -> None:
        async with Ticker() as loop, AsyncClient(endpoint, timeout_ms=TIMEOUT_MS, retries=1, raise_errors=True,
                                                 **options) as ac:
            for _ in range(2):
                before, start = loop.ticks, time.perf_counter()
                with pytest.raises(DeadlineExceeded) as exc:
                    await ac.predict("echo", X)
                assert time.perf_counter() - start <= LATEST_S
                assert type(exc.value) is want and exc.value.result.reason == reason, exc.value
                assert loop.ticks > before, "the event loop ran nothing else during the call"
                start = time.perf_counter()
                with pytest.raises(asyncio.TimeoutError):  # the caller's shorter deadline
                    await asyncio.wait_for(ac.predict("echo", X, timeout_ms=30_000.0), 0.2)
                assert time.perf_counter() - start <= 0.2 + MARGIN_S
            assert ac.calls == {}

    asyncio.run(run())


def served(spec, folder) -> None:
    with Client(spec.client_endpoints, timeout_ms=5000, curve_keys=str(folder)) as c:
        r = c.predict("echo", X)
        assert r.source == Source.MODEL and np.allclose(r.output, X), (r.source, r.error)


@pytest.mark.timeout(120)
def test_a_key_the_frontend_does_not_allow_is_refused(keys, cluster):
    folder, stranger = keys
    _, spec = cluster
    no_answer_from_both_clients(spec.client_endpoints[0], Refused, Reason.REFUSED, curve_keys=str(stranger),
                                curve_name="stranger")
    served(spec, folder)  # the frontend serves allowed clients all along


@pytest.mark.timeout(120)
def test_a_port_that_is_not_a_frontend(keys, cluster):
    folder, _ = keys
    _, spec = cluster
    # the frontend's predictions port: a PULL socket hangs up on a DEALER's handshake
    no_answer_from_both_clients(spec.service("frontend").config.prediction_endpoint, Refused, Reason.REFUSED,
                                curve_keys=str(folder))
    # the dispatcher's worker port: a ROUTER that takes the call and never answers it
    no_answer_from_both_clients(spec.service("dispatcher").config.worker_endpoint, DeadlineExceeded, Reason.TIMEOUT,
                                curve_keys=str(folder))
    served(spec, folder)


@pytest.mark.timeout(120)
def test_a_stopped_frontend(keys, cluster):
    folder, _ = keys
    run, spec = cluster
    served(spec, folder)
    pid = run.procs["frontend"].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        no_answer_from_both_clients(spec.client_endpoints[0], DeadlineExceeded, Reason.TIMEOUT, curve_keys=str(folder))
    finally:
        os.kill(pid, signal.SIGCONT)
    served(spec, folder)
