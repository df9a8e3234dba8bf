"""SERF's pieces without processes: the profile (mu table, storage, staleness on a new
version), the configurator (table lookup, hysteresis, minimum hold time) and the worker's
executors (torch threads set by the thread that computes)."""
from __future__ import annotations

import threading
import time

import pytest

from keel.common.queueing import latency
from keel.services.serf import profile as serf_profile
from keel.services.serf.configurator import Configurator
from keel.services.serf.profile import Profile, path_bands, tuples
from keel.services.executors import Executors, Job

# threads help one request (20 -> 12 ms); two at once interfere a little (20 -> 21 ms each)
SERVICE = {(1, 1): 20.0, (1, 2): 12.0, (2, 1): 21.0}


def profile(**kw) -> Profile:
    return Profile("m", "1", 2, dict(SERVICE), **kw)


def test_tuples_and_configurations_on_two_cores():
    assert tuples(2) == [(1, 1), (1, 2), (2, 1)]
    assert len(tuples(4)) == 8
    p = profile()
    assert p.configurations() == [(1, 1), (1, 2), (2, 1)]
    assert p.mu((2, 1)) == pytest.approx([50.0, 1000 / 21]) and p.capacity((2, 1)) == pytest.approx(2000 / 21)
    assert Profile("m", "1", 2, {(2, 1): 25.0}).configurations() == []  # (2,1) needs mu_1 too


def test_prediction_is_eq13_plus_the_path():
    p = profile(path_ms=1.5)
    assert p.predict_ms((2, 1), 30.0) == pytest.approx(latency([50.0, 1000 / 21], 30.0) * 1000 + 1.5)
    assert p.predict_ms((2, 1), 30.0, path=False) == pytest.approx(latency([50.0, 1000 / 21], 30.0) * 1000)
    assert p.predict_ms((1, 2), 90.0) is None  # beyond its capacity (83/s)


def test_the_path_term_follows_the_rate_through_its_measured_bands():
    # nine tuples' paths: longer where requests came far apart, shorter back to back, and
    # one hiccup of the shared machine (15 ms) that its band's median leaves out
    points = [(15.0, 6.0, 8), (20.0, 5.0, 5), (25.0, 5.5, 5), (40.0, 4.0, 5), (50.0, 15.0, 5), (60.0, 4.0, 5),
              (80.0, 3.0, 5), (100.0, 3.0, 5), (110.0, 3.5, 5)]
    assert path_bands(points) == [(20.0, 5.5), (50.0, 4.0), (pytest.approx(290 / 3), 3.0)]
    p = profile(path_ms=6.0, path_points=points)
    assert p.path_at(5.0) == 5.5 and p.path_at(500.0) == 3.0  # flat beyond the ends
    assert p.path_at(35.0) == pytest.approx(4.75)  # on the line between two bands
    eq13 = latency([50.0, 1000 / 21], 30.0) * 1000
    assert p.predict_ms((2, 1), 30.0) == pytest.approx(eq13 + p.path_at(30.0))
    assert p.predict_ms((2, 1), 30.0, path=False) == pytest.approx(eq13)
    # the same for every configuration at a rate, so the table's best does not move
    assert p.table([30.0])[0]["best"] == profile(path_ms=6.0).table([30.0])[0]["best"]
    assert profile(path_ms=6.0).path_at(80.0) == 6.0  # a profile without points: one path
    assert path_bands(points[:2]) == [(15.0, 6.0), (20.0, 5.0)]


def test_the_hand_off_holds_a_slot_but_is_no_part_of_a_request():
    # a slot turns over every 20 + 2 ms: the queue is M/D/1 at 22 ms, a request's own
    # latency is its wait plus 20 ms (and the path)
    p = profile(path_ms=1.5, handoff_ms={1: 2.0, 2: 1.0})
    assert p.mu((1, 1)) == pytest.approx([1000 / 22]) and p.capacity((2, 1)) == pytest.approx(2000 / 22)
    assert p.predict_ms((1, 1), 30.0) == pytest.approx(latency([1000 / 22], 30.0) * 1000 - 2.0 + 1.5)
    assert p.predict_ms((1, 1), 30.0) > profile(path_ms=1.5).predict_ms((1, 1), 30.0)  # the queue turns over slower
    assert p.predict_ms((1, 1), 0.0) == pytest.approx(20.0 + 1.5)  # alone: no hand-off
    row = p.table([30.0])[0]
    assert row["latency_s"][(1, 1)] * 1000 == pytest.approx(p.predict_ms((1, 1), 30.0, path=False))
    assert row["best"] == min(row["latency_s"], key=row["latency_s"].get)


def test_profile_round_trips_and_a_new_version_is_stale(tmp_path):
    p = profile(scv={(1, 1): 0.01}, samples={(1, 1): 20}, path_ms=1.0, profiling_s=2.5, handoff_ms={1: 2.0, 2: 1.5},
                path_points=[(15.5, 1.0, 8), (48.25, 0.75, 5)])
    path = serf_profile.save(p, tmp_path / "p.json")
    back = serf_profile.load(path, "1")
    assert back == p
    assert serf_profile.load(path, "2") is None  # reprofile a new version
    assert serf_profile.load(tmp_path / "none.json") is None
    assert serf_profile.where("m", "1", None, str(tmp_path)) == tmp_path / "serf" / "m-1.json"


def test_configurator_picks_threads_when_light_and_concurrency_when_heavy():
    conf = Configurator({"m": profile()}, hysteresis=0.0, hold_s=0.0)
    assert conf.decide("m", 5.0, None, 1, now=0.0) == (1, 2)
    assert conf.decide("m", 5.0, (1, 2), 1, now=1.0) is None  # already the best
    assert conf.decide("m", 75.0, (1, 2), 1, now=2.0) == (2, 1)
    # two workers share the load: 150/s is 75/s each
    assert conf.decide("m", 150.0, (1, 2), 2, now=3.0) == (2, 1)
    st = conf.status({"m": (2, 1)})["m"]
    assert st["configuration"] == "2x1" and st["switches"] == 3 and st["arrival_rate"] == 75.0
    assert "-> [2, 1]" in st["last_switch"]
    # every switch is logged with its wall time, for the experiment's JSON
    log = st["switch_log"]
    assert [(d["from"], d["to"], d["rate"]) for d in log] == [(None, [1, 2], 5.0), ([1, 2], [2, 1], 75.0),
                                                              ([1, 2], [2, 1], 75.0)]
    assert all(b["wall"] >= a["wall"] for a, b in zip(log, log[1:]))


def test_hysteresis_and_hold_time_stop_flapping():
    p = profile()
    # find a rate just past the crossing of (1,2) and (2,1): the gain there is tiny
    rates = [r / 10 for r in range(100, 830)]  # (1,2) carries 83.3/s
    cross = next(r for r in rates if p.predict_ms((2, 1), r) < p.predict_ms((1, 2), r))
    conf = Configurator({"m": p}, hysteresis=0.1, hold_s=0.0)
    assert conf.decide("m", cross + 0.5, (1, 2), 1, now=0.0) is None  # < 10% better: stay
    assert conf.decide("m", 84.0, (1, 2), 1, now=1.0) == (2, 1)  # (1,2) unstable: go
    held = Configurator({"m": p}, hysteresis=0.0, hold_s=5.0)
    assert held.decide("m", 75.0, (1, 2), 1, now=0.0) == (2, 1)
    assert held.decide("m", 5.0, (2, 1), 1, now=1.0) is None  # within the hold time
    assert held.decide("m", 5.0, (2, 1), 1, now=6.0) == (1, 2)
    # within the hold time, but (1,2) cannot carry the rate: its backlog grows, so it goes at once
    assert held.decide("m", 84.0, (1, 2), 1, now=7.0) == (2, 1)
    # and the way back waits for the hold time as any switch does
    assert held.decide("m", 5.0, (2, 1), 1, now=8.0) is None


def test_configurator_observes_latency():
    conf = Configurator({"m": profile()}, alpha=0.5)
    conf.observe("m", 10.0)
    conf.observe("m", 20.0)
    conf.observe("other", 1.0)  # a model without a profile: ignored
    assert conf.models["m"].observed_ms == 15.0


def test_executors_set_torch_threads_on_the_computing_thread():
    seen: list[tuple[str, int]] = []
    gate = threading.Event()

    def run(job: Job) -> None:
        gate.wait(5.0)

    ex = Executors(run, lambda n: seen.append((threading.current_thread().name, n)) or True)
    try:
        ex.ensure(2)
        ex.torch_threads = 1
        for _ in range(2):
            ex.submit(Job(None, [0], 0.0, None))
        deadline = time.monotonic() + 5.0
        while ex.running < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert ex.running == 2 and ex.peak == 2  # two batches at once
        gate.set()
        finished = []
        while len(finished) < 2 and time.monotonic() < deadline:
            finished += ex.done()
            time.sleep(0.005)
        ex.torch_threads = 2
        ex.submit(Job(None, [0], 0.0, None))
        while len(finished) < 3 and time.monotonic() < deadline:
            finished += ex.done()
            time.sleep(0.005)
        assert len(finished) == 3
        assert {n for _, n in seen[:2]} == {1} and {name for name, _ in seen[:2]} == {"executor-0", "executor-1"}
        assert seen[2][1] == 2  # the next batch after the change ran with 2 threads
    finally:
        ex.close()


def test_one_batch_at_a_time_always_goes_to_the_same_executor():
    """Each executor has its own OpenMP team; one that slept is slow to wake: with batches
    one at a time the first executor takes them all, whatever others exist."""
    names: list[str] = []
    ex = Executors(lambda job: names.append(threading.current_thread().name), None)
    try:
        ex.ensure(3)
        for _ in range(6):
            ex.submit(Job(None, [0], 0.0, None))
            deadline, finished = time.monotonic() + 5.0, []
            while not finished and time.monotonic() < deadline:
                finished = ex.done()
                time.sleep(0.002)
        assert names == ["executor-0"] * 6
    finally:
        ex.close()


def test_a_process_without_torch_does_not_import_it_to_set_threads():
    """A Python container's worker never imports torch (seconds on a first batch); the
    setting is applied once torch is there."""
    import subprocess
    import sys

    code = ("import sys; from keel.services.executors import set_torch_threads; "
            "assert set_torch_threads(1) is False and 'torch' not in sys.modules; "
            "import torch; assert set_torch_threads(1) is True; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_keel_serf_table_reads_the_kept_profile_and_asks_for_one_when_stale(tmp_path, capsys):
    from keel.common.spec import load_spec
    from keel.deploy.keel import main, parse_args

    spec_file = tmp_path / "serf.toml"
    spec_file.write_text(f'[cluster]\nrun_dir = "{tmp_path / "run"}"\nbase_port = 27000\n'
                         '[models.m]\nbuiltin = "sleep"\nmax_batch = 1\n')
    assert main(["serf", "table", str(spec_file), "--model", "m"]) == 1
    assert "keel serf profile" in capsys.readouterr().out
    spec = load_spec(str(spec_file))
    serf_profile.save(profile(path_ms=1.0), serf_profile.where("m", "1", None, spec.run_dir))
    assert main(["serf", "table", str(spec_file), "--model", "m", "--rates", "5", "75"]) == 0
    out = capsys.readouterr().out
    assert "reference table of m v1: 2 rates x 3 configurations" in out
    lines = [line.split() for line in out.splitlines() if line.strip().startswith(("5.00", "75.00"))]
    assert [line[-1] for line in lines] == ["1x2", "2x1"]
    assert parse_args(["experiment", "serf", "--quick"]).quick


def test_a_worker_given_omp_spincount_sets_it_before_torch_loads():
    """libgomp reads GOMP_SPINCOUNT once, when torch loads it: the worker sets it first (a
    builtin worker here, in a fresh process: torch is not loaded, the setting is there when it is)."""
    import os
    import subprocess
    import sys

    code = ("import os, sys; from keel.common.config import WorkerConfig; from keel.services.worker import Worker; "
            "w = Worker(WorkerConfig(name='w-spin', model='m', builtin='sleep', dispatcher_worker_endpoint='tcp://127.0.0.1:9', "
            "omp_spincount=10_000_000)); "
            "assert 'torch' not in sys.modules; print('spin', os.environ.get('GOMP_SPINCOUNT')); w.shutdown()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"})
    assert "spin 10000000" in out.stdout.splitlines(), (out.stdout[-2000:], out.stderr[-2000:])


def test_a_negative_omp_spincount_is_refused_with_its_name():
    from keel.common.config import ConfigError, WorkerConfig

    with pytest.raises(ConfigError, match="omp_spincount"):
        WorkerConfig(name="w", model="m", omp_spincount=-1).validate()


def test_a_worker_keeps_one_torch_thread_on_its_loop_and_gives_the_executors_theirs(tmp_path):
    """Only executors compute; a multi-threaded OpenMP team on the loop's thread too would put
    more OpenMP threads than cores in the process and libgomp would then cut every team's spin."""
    import os
    import subprocess
    import sys

    from keel.common.modelstore import ModelStore

    from keel.common.architectures import build

    arch_config = {"in_features": 4, "n_classes": 2, "hidden": [3]}
    ModelStore(tmp_path).save("lin", build("mlp", **arch_config), arch="mlp", arch_config=arch_config, input_shape=[4],
                              output_size=2)
    code = ("import torch; from keel.common.config import WorkerConfig; from keel.services.worker import Worker; "
            f"w = Worker(WorkerConfig(name='w-threads', model='lin', store={str(tmp_path)!r}, torch_threads=2, "
            "dispatcher_worker_endpoint='tcp://127.0.0.1:9')); "
            "print('threads', torch.get_num_threads(), w.executors.torch_threads); w.shutdown()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert "threads 1 2" in out.stdout.splitlines(), (out.stdout[-2000:], out.stderr[-2000:])


def test_the_experiment_projects_a_stable_point_by_its_standard_error():
    from keel.bench.serf_points import STABLE_SE, stable_requests

    # a mean of 100 requests with an SE of 3% needs 4x the requests for 1.5%, / 0.9 for the warm-up
    assert STABLE_SE == 0.015
    assert stable_requests(se_ms=3.0, n=100, mean_ms=100.0) == 445
    # already precise: the warm-up and one request
    assert stable_requests(se_ms=0.01, n=100, mean_ms=100.0) == 11


def test_the_step_loads_oracle_takes_each_phases_best_fixed_configuration():
    from keel.bench.serf_design import oracle_mean

    # two phases of 1 s, the same arrivals: "a" is best in the first, "b" in the second
    fixed = {"a": {"phases_ms": [10.0, 50.0], "series": [[0.1 * k, 10.0] for k in range(10)]
                   + [[1 + 0.1 * k, 50.0] for k in range(10)]},
             "b": {"phases_ms": [20.0, 30.0], "series": [[0.1 * k, 20.0] for k in range(10)]
                   + [[1 + 0.1 * k, 30.0] for k in range(10)]}}
    mean, picks = oracle_mean(fixed, [0.0, 1.0], 1.0)
    assert picks == ["a", "b"]
    assert mean == pytest.approx((8 * 10.0 + 10 * 30.0) / 18)  # the first 10% (2 requests) dropped


def test_the_drift_swing_is_the_move_of_one_prediction_between_two_profiles():
    from keel.bench.serf_drift import swings

    a = Profile("m", "1", cores=1, service_ms={(1, 1): 20.0})
    same = Profile("m", "1", cores=1, service_ms={(1, 1): 20.0})
    slower = Profile("m", "1", cores=1, service_ms={(1, 1): 25.0})  # unstable at 85% of a's capacity
    assert swings([(0, a, 0), (1, same, 0)]) == {"55%": [0.0], "85%": [0.0]}
    moved = swings([(0, a, 0), (1, slower, 0)])
    rate = 0.55 * a.capacity((1, 1))
    assert moved["55%"] == [pytest.approx(slower.predict_ms((1, 1), rate) / a.predict_ms((1, 1), rate) - 1)]
    assert moved["85%"] == [1.0]


def test_the_profiler_measures_a_curves_ends_and_middles_and_interpolates_its_straight_stretches():
    from keel.common.serf_host import PRESETS, SPEEDUP
    from keel.services.serf.profiler import REL_SE, curve

    def measured(f):
        seen = []
        return seen, lambda x: seen.append(x) or f(x)

    # the small model's flat interference: the ends and the middle, the rest on the line
    seen, value = measured(lambda i: 40.0)
    assert curve(list(range(1, 9)), value) == {i: 40.0 for i in range(1, 9)} and sorted(seen) == [1, 4, 8]
    # the large one's: bent at two, straight past: 5 and 7 interpolated, exactly
    large = PRESETS["large"]["interference"]
    seen, value = measured(lambda i: 50.0 * large[i - 1])
    got = curve(list(range(1, 9)), value)
    assert got == pytest.approx({i: 50.0 * large[i - 1] for i in range(1, 9)}, rel=REL_SE) and 5 not in seen and 7 not in seen
    # the speed-up bends everywhere it matters: every point measured but where it is flat
    seen, value = measured(lambda t: 40.0 / SPEEDUP[t - 1])
    got = curve(list(range(1, 9)), value)
    assert all(abs(got[t] - 40.0 / SPEEDUP[t - 1]) <= REL_SE * got[t] for t in range(1, 9))
    assert {1, 2, 3, 4, 8} <= set(seen)
    # a point given is not measured again
    seen, value = measured(lambda i: 40.0)
    curve([1, 2, 3], value, {1: 40.0})
    assert seen == [3, 2]


def test_the_hand_off_is_one_figure_for_every_number_of_slots_the_median_of_those_timed():
    from keel.services.serf.profiler import pooled

    # one profile of the emulated host, 2026-11-27: two slots' few rounds read 3.15 ms
    timed = {1: 1.15, 2: 3.15, 4: 0.45, 8: 0.17}
    h = pooled(timed, 8)
    assert sorted(h) == list(range(1, 9)) and all(v == pytest.approx(0.8) for v in h.values())
    assert pooled({}, 2) == {}
