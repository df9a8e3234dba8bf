"""SERF's per-host core budget on live processes: two models on the emulated 8-core host
(``serf_host``, served by sleeping, so what is asserted does not move with this machine's
load), one worker each on the same host, ``serf_cores = {local = 8}``. Alone, each would
take all eight cores at a light load (1x8, its profile's best); together the dispatcher
gives the first what the other's one core leaves and the second what is left, and the
workers themselves run what the dispatcher says."""
from __future__ import annotations

import numpy as np
import pytest

from keel.common import transport
from keel.common.client import Client
from keel.common.spec import load_spec
from keel.common.waiting import wait_until
from keel.deploy.local import free_port_block
from keel.services.serf import profile as serf_profile
from keel.services.serf.profile import Profile
from keel.services.serf.profiler import closed_loop

pytestmark = pytest.mark.slow
CORES, BUDGET = 8, 8


def sublinear(model: str) -> Profile:
    """Threads help one request less than linearly, requests do not interfere: 1x8 best at
    a light load."""
    service = {(i, t): 20.0 / t ** 0.7 for i in range(1, CORES + 1) for t in range(1, CORES + 1) if i * t <= CORES}
    return Profile(model, "1", CORES, service)


def test_two_models_share_the_hosts_cores(tmp_path, launcher):
    paths = {m: str(serf_profile.save(sublinear(m), tmp_path / f"{m}.json")) for m in ("a", "b")}
    model = {"builtin": "serf_host", "serf_host": "small", "base_ms": 20.0, "max_batch": 1, "deadline_ms": 60_000.0,
             "input_shape": [16]}
    spec = load_spec({"cluster": {"name": "serf-budget", "base_port": free_port_block(), "run_dir": str(tmp_path / "run")},
                      "frontend": {"cache_size": 0},
                      "dispatcher": {"serf": paths, "serf_cores": {"local": BUDGET}, "serf_hold_s": 0.0},
                      "models": {"a": dict(model), "b": dict(model)}})
    launcher("serf-budget").start_spec(spec)
    dispatcher = spec.service("dispatcher").config.worker_endpoint
    inputs = np.zeros((4, 16), np.float32)
    with Client(spec.client_endpoints, timeout_ms=30_000.0) as client:
        for m in ("a", "b"):  # a light load on both: each alone would take all eight cores
            closed_loop(client, m, inputs, 1, 10)

        def configured() -> dict | None:
            serf = (transport.request_status(dispatcher, 2.0) or {}).get("serf") or {}
            got = {m: tuple(int(x) for x in (serf.get(m, {}).get("configuration") or "0x0").split("x")) for m in "ab"}
            # settled: the host's cores all given out (the second may keep its spec's 1x1)
            return got if sum(s * t for s, t in got.values()) == BUDGET else None

        got = wait_until(configured, 20.0, 0.2)
        assert got, transport.request_status(dispatcher, 2.0).get("serf")
        cores = sorted(s * t for s, t in got.values())
        # the first to switch took the seven cores the other's one left (1x7), the second
        # then the one left: never both at 1x8, never past the host's eight
        assert cores == [1, 7] and all(s == 1 for s, _ in got.values()), got
        for m in ("a", "b"):  # the workers run what the dispatcher says
            closed_loop(client, m, inputs, 1, 3)
    for m, (slots, threads) in got.items():
        info = transport.request_status(spec.service(f"worker-{m}-0").config.status_endpoint, 5.0)
        assert (info["slots"], info["threads"]) == (slots, threads)
