"""The emulated SERF host (common/serf_host.py): its curves, its service times alone and
beside other requests, how a spec names it, and how a worker gives it each executor's
threads."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from keel.common.serf_host import CORES, PRESETS, SPEEDUP, SerfHost, SerfHostError, curves
from keel.common.spec import load_spec
from keel.common.spec.tables import SpecError


def test_the_default_speed_up_is_near_linear_to_three_cores_and_flat_past_four():
    # SERF Fig. 3: each of the first threads adds most of a core, each past the fourth little
    gains = np.diff(SPEEDUP)
    assert len(SPEEDUP) == CORES == 8 and SPEEDUP[0] == 1.0
    assert all(g >= 0.8 for g in gains[:2]) and all(g <= 0.3 for g in gains[3:])
    assert all(g > 0 for g in gains)


def test_the_small_model_does_not_interfere_and_the_large_one_does_past_two():
    # SERF Fig. 6: CIFAR-10 flat, ImageNet-22K severe past 2 requests at once
    small, large = SerfHost(**PRESETS["small"]), SerfHost(**PRESETS["large"])
    assert [small.service_ms(1, i) for i in range(1, 9)] == [small.base_ms] * 8
    alone = large.service_ms(1, 1)
    assert large.service_ms(1, 2) < 1.1 * alone
    assert large.service_ms(1, 3) >= 1.4 * alone and large.service_ms(1, 8) >= 3 * alone
    # service time = base / speedup(t) x interference(i)
    assert large.service_ms(2, 3) == pytest.approx(large.base_ms / SPEEDUP[1] * PRESETS["large"]["interference"][2])


def test_more_threads_than_cores_time_share_them():
    host = SerfHost(**PRESETS["small"])
    assert host.service_ms(4, 2) == pytest.approx(host.base_ms / SPEEDUP[3])          # 8 threads: fits
    assert host.service_ms(4, 4) == pytest.approx(2 * host.base_ms / SPEEDUP[3])      # 16 threads on 8 cores


def test_curves_take_a_preset_and_any_curve_given_in_its_place():
    c = curves("large", base_ms=10.0)
    assert c["base_ms"] == 10.0 and c["interference"] == PRESETS["large"]["interference"] and c["cores"] == 8
    assert curves(None)["interference"] == [1.0] * 8  # "small" by default
    flat = [1.0] * 8
    assert curves("small", speedup=flat)["speedup"] == flat
    for bad in ({"preset": "huge"}, {"preset": None, "speedup": [1.0, 2.0]}, {"preset": None, "interference": [2.0] * 8},
                {"preset": None, "base_ms": 0.0}, {"preset": None, "speedup": [1.0, -1.0] + [1.0] * 6}):
        with pytest.raises(SerfHostError):
            curves(**bad)


def test_a_request_runs_at_the_rate_of_the_requests_running_beside_it():
    # three at once on the large model: each runs beside two others, so none can end
    # before base x interference(3) (45 ms; 30 ms if they did not interfere), and a lone
    # one is held base / speedup(t)
    host = SerfHost(**curves("large", base_ms=30.0))
    host.set_threads(2)
    t0 = time.monotonic()
    host.predict_batch(np.zeros((1, 64), np.float32))
    assert (time.monotonic() - t0) * 1000.0 >= 30.0 / SPEEDUP[1] - 0.5
    ends: list[float] = []

    def one() -> None:
        host.set_threads(1)
        host.predict_batch(np.zeros((1, 64), np.float32))
        ends.append(time.monotonic())

    threads = [threading.Thread(target=one) for _ in range(3)]
    with host._cond:  # all three wait to enter, so they start within a moment of each other
        for t in threads:
            t.start()
        time.sleep(0.05)
        released = time.monotonic()
    for t in threads:
        t.join(10.0)
    took = sorted((end - released) * 1000.0 for end in ends)
    assert len(took) == 3 and took[0] >= 30.0 * 1.5 - 5.0, took  # 5 ms for the threads' own start
    assert host.running == 0 and host.busy_threads == 0


def test_a_spec_names_the_emulated_host_and_its_workers_get_the_curves():
    spec = load_spec({"models": {"big": {"builtin": "serf_host", "serf_host": "large", "base_ms": 20.0, "max_batch": 1}}})
    cfg = spec.service("worker-big-0").config
    assert cfg.builtin == "serf_host" and cfg.serf_host == curves("large", base_ms=20.0)
    with pytest.raises(SpecError, match="models.big.speedup"):
        load_spec({"models": {"big": {"builtin": "serf_host", "speedup": [1.0, 2.0]}}})
    with pytest.raises(SpecError, match="models.m.interference.*serf_host"):
        load_spec({"models": {"m": {"builtin": "sleep", "interference": [1.0] * 8}}})
    with pytest.raises(SpecError, match="models.big.fixed_ms"):
        load_spec({"models": {"big": {"builtin": "serf_host", "fixed_ms": 3.0}}})


def test_a_worker_gives_the_emulated_host_each_executors_threads(tmp_path):
    from keel.common.config import WorkerConfig
    from keel.common.protocol import Configure
    from keel.deploy.local import free_port_block
    from keel.services.worker import Worker

    port = free_port_block()
    w = Worker(WorkerConfig(name="w", model="m", builtin="serf_host", serf_host=curves("small", base_ms=5.0),
                            dispatcher_worker_endpoint=f"tcp://127.0.0.1:{port}", torch_threads=8, slots=1))
    try:
        assert w.executors.set_threads == w.predictor.set_threads
        w.configure(Configure(slots=2, threads=4))
        seen = []
        w.executors.run = lambda job: seen.append(getattr(w.predictor._local, "threads", None))
        from keel.services.executors import Job

        w.executors.submit(Job(None, [0], 0.0, w.predictor))
        deadline = time.monotonic() + 5.0
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == [4]
    finally:
        w.shutdown()


def test_keel_serf_profile_gives_an_emulated_host_its_own_cores():
    from keel.deploy.serf_cli import model_cores

    spec = load_spec({"models": {"big": {"builtin": "serf_host", "max_batch": 1}, "s": {"builtin": "sleep"}}})
    assert model_cores(spec, "big") == 8 and model_cores(spec, "s") == 2
