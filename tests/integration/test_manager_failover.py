"""Dispatcher failover through the manager, with real processes: three manager replicas, an
active and a standby dispatcher, two workers and a frontend, all ``keel serve``.

Under bounded open load the active dispatcher is SIGKILLed. The workers' socket monitors
report the disconnect, the manager's leader promotes the standby (a compare-and-set in the
Raft log, at a new epoch), the workers register with it and the frontend re-sends every
query it admitted and has not answered. Every request gets exactly one answer, from the
model, equal to the expected output for its input: none waits for its deadline default.
"""
from __future__ import annotations

import dataclasses
import signal
import time

import numpy as np
import pytest

from keel.common.config import ManagerLinkConfig
from keel.common.control import ManagerClient
from keel.common.protocol import Source
from keel.common.spec import ServiceLaunch, load_spec
from keel.common.transport import request_status
from keel.common.waiting import wait_until
from keel.deploy.local import free_port_block
from keel.deploy.manager_group import LocalGroup

pytestmark = pytest.mark.slow

DIM, OUT = 8, 4
QUERIES = 300
BURST = 40  # queries sent at once just before the kill
TIMEOUT_MS = 4000.0  # far above a failover: a default would mean a query was lost


def _cluster(tmp_path, launcher):
    managers = LocalGroup(launcher("managers"), tmp_path / "journal")
    managers.start()
    managers.leader(timeout_s=30.0)
    spec = load_spec({
        "cluster": {"name": "failover", "base_port": free_port_block(), "run_dir": str(tmp_path / "run")},
        "frontend": {"cache_size": 0},
        "models": {"sleep": {"builtin": "sleep", "input_shape": [DIM], "output_size": OUT, "fixed_ms": 2.0,
                             "workers": 2, "deadline_ms": TIMEOUT_MS}},
    })
    link = {"manager": ManagerLinkConfig(managers.endpoints, managers.publish_endpoints)}
    base = free_port_block(4)
    active = spec.service("dispatcher")
    active.config = dataclasses.replace(active.config, host="host-a", **link)
    standby = ServiceLaunch("dispatcher-b", "dispatcher", "host-b", dataclasses.replace(
        active.config, name="dispatcher-b", host="host-b", query_endpoint=f"tcp://127.0.0.1:{base}",
        worker_endpoint=f"tcp://127.0.0.1:{base + 1}"))
    others = [s for s in spec.services if s.role in ("worker", "frontend")]
    for svc in others:
        svc.config = dataclasses.replace(svc.config, **link)
    return managers, spec, active, standby, others


def _start(run, probe, spec, active, standby, others) -> None:
    """The active dispatcher first (the manager makes it the holder), then the standby, the
    workers and the frontend; returns once the workers and the frontend are ready."""
    run.start(active)
    wait_until(lambda: probe.call("snapshot")["groups"].get("dispatcher", {}).get("holder") == "dispatcher",
               timeout_s=30.0)
    run.start(standby)
    for svc in others:
        run.start(svc)
    run.wait_workers(active.config.worker_endpoint, 2, timeout_s=60)
    run.wait_status(spec.client_endpoints[0], timeout_s=30)


def test_killing_the_active_dispatcher_loses_nothing_and_defaults_nothing(tmp_path, launcher, client):
    managers, spec, active, standby, others = _cluster(tmp_path, launcher)
    run = launcher("cluster")
    probe = ManagerClient(managers.endpoints)
    try:
        _start(run, probe, spec, active, standby, others)
        assert request_status(standby.config.worker_endpoint, 5.0)["active"] is False

        c = client(spec.client_endpoints[0], timeout_ms=TIMEOUT_MS, retries=0)
        rng = np.random.default_rng(3)
        inputs: dict[str, np.ndarray] = {}
        results = []
        xs, i = rng.random((QUERIES, DIM), dtype=np.float32), 0
        while i < QUERIES:
            # at the kill, a burst: the dispatcher dies holding a queue (a failover decided on
            # its refused port is over in a few ms, before an open loop's next query)
            burst = BURST if i == QUERIES // 3 else 1
            for x in xs[i:i + burst]:
                inputs[c.submit("sleep", x)] = x
            i += burst
            if burst > 1:
                run.kill("dispatcher", signal.SIGKILL)
            results.extend(c.collect(0))
            time.sleep(0.004)  # open loop, about 250 queries/s
        deadline = time.monotonic() + 60
        while len(results) < len(inputs):
            assert time.monotonic() < deadline, "requests left unanswered"
            results.extend(c.collect(100))

        ids = [r.request_id for r in results]
        assert len(ids) == len(set(ids)) == QUERIES  # exactly one answer each
        sources = {str(s): sum(r.source == s for r in results) for s in {r.source for r in results}}
        assert sources == {str(Source.MODEL): QUERIES}, sources  # no default, no error
        for r in results:
            np.testing.assert_allclose(r.output, inputs[r.request_id][:OUT], atol=1e-5, err_msg=r.request_id)

        snap = probe.call("snapshot")
        assert snap["groups"]["dispatcher"] == {"holder": "dispatcher-b", "epoch": 2}
        assert snap["decisions"][-1]["reason"].startswith("dispatcher suspected")
        after = request_status(standby.config.worker_endpoint, 5.0)
        assert after["active"] is True and len(after["workers"]) == 2
        frontend = request_status(spec.client_endpoints[0], 5.0)
        assert frontend["answered"].get("resent", 0) > 0  # the dead dispatcher's queue came back
        assert managers.wait_equal()
    finally:
        probe.close()
        managers.close()


def test_a_frozen_dispatcher_is_replaced_and_steps_down_when_it_thaws(tmp_path, launcher, client):
    """SIGSTOP (a freeze or a partition: no disconnect, only silence) of the active
    dispatcher: the manager promotes the standby after the heartbeat window; thawed, the old
    one hears the newer epoch, steps down and reaches no worker."""
    managers, spec, active, standby, others = _cluster(tmp_path, launcher)
    run = launcher("cluster")
    probe = ManagerClient(managers.endpoints)
    try:
        _start(run, probe, spec, active, standby, others)

        c = client(spec.client_endpoints[0], timeout_ms=TIMEOUT_MS, retries=0)
        rng = np.random.default_rng(4)
        inputs: dict[str, np.ndarray] = {}
        results = []
        for i, x in enumerate(rng.random((150, DIM), dtype=np.float32)):
            inputs[c.submit("sleep", x)] = x
            results.extend(c.collect(0))
            time.sleep(0.004)
            if i == 50:
                run.kill("dispatcher", signal.SIGSTOP)
        assert wait_until(lambda: probe.call("snapshot")["groups"]["dispatcher"]["holder"] == "dispatcher-b",
                          timeout_s=10.0)
        run.kill("dispatcher", signal.SIGCONT)
        old = wait_until(lambda: (s := request_status(active.config.worker_endpoint, 1.0)) and not s["active"] and s,
                         timeout_s=10.0)
        assert old["fence_epoch"] == 2 and old["workers"] == {}
        deadline = time.monotonic() + 60
        while len(results) < len(inputs):
            assert time.monotonic() < deadline, "requests left unanswered"
            results.extend(c.collect(100))
        assert len({r.request_id for r in results}) == len(results) == len(inputs)
        assert {r.source for r in results} == {Source.MODEL}
        snap = probe.call("snapshot")
        assert snap["decisions"][-1]["reason"] == "dispatcher suspected: silent"
        assert len(request_status(standby.config.worker_endpoint, 5.0)["workers"]) == 2
    finally:
        probe.close()
        managers.close()
