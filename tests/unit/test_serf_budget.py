"""SERF across rollouts and hosts, without processes: the configurator follows the version
the model's workers serve (its profile, or held where it has none), and never gives a
model's workers more cores than their host's budget leaves beside the other models'."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from keel.services.serf.configurator import Configurator, cores_left
from keel.services.serf.profile import Profile

CORES = 4


def sublinear(model: str, version: str = "1", base_ms: float = 40.0) -> Profile:
    """Threads speed one request up less than linearly (t^0.7) and requests do not
    interfere: one request with every core is best at a light load, every core its own
    request at a heavy one."""
    service = {(i, t): base_ms / t ** 0.7 for i in range(1, CORES + 1) for t in range(1, CORES + 1) if i * t <= CORES}
    return Profile(model, version, CORES, service)


def worker(name: str, model: str, slots: int, threads: int) -> SimpleNamespace:
    return SimpleNamespace(name=name, model=model, slots=slots, threads=threads)


def test_cores_left_counts_the_other_models_on_each_host():
    hosts = {"a0": "h1", "a1": "h1", "b0": "h1", "a2": "h2", "c0": "h3"}
    workers = [worker("a0", "a", 2, 1), worker("a1", "a", 2, 1), worker("b0", "b", 1, 2),
               worker("a2", "a", 2, 1), worker("c0", "c", 4, 1)]
    # b shares h1 with a's two workers (4 cores): 8 - 4 left
    assert cores_left({"h1": 8}, hosts, workers, "b") == 4
    # a's two workers on h1 share what b leaves (8 - 2) / 2; h2 has no budget
    assert cores_left({"h1": 8}, hosts, workers, "a") == 3
    # with a budget on h2 too, a's workers get the least any of its hosts leaves
    assert cores_left({"h1": 8, "h2": 2}, hosts, workers, "a") == 2
    # c's host has no budget: no limit
    assert cores_left({"h1": 8}, hosts, workers, "c") is None


def test_the_best_configuration_within_the_budget_by_eq13():
    conf = Configurator({"m": sublinear("m")}, hold_s=0.0)
    plan = conf.models["m"]
    light, heavy = 5.0, 0.9 * plan.profile.capacity((4, 1))
    assert conf.decide("m", light, None, 1, now=0.0) == (1, 4)
    assert conf.decide("m", heavy, (1, 4), 1, now=1.0) == (4, 1)
    # the same loads with two cores: the best of the configurations of at most two
    for rate, current in ((light, (1, 1)), (0.9 * plan.profile.capacity((2, 1)), (1, 1))):
        allowed = [c for c in plan.profile.configurations() if c[0] * c[1] <= 2]
        stable = {c: plan.profile.predict_ms(c, rate, path=False) for c in allowed}
        expected = min((ms, c) for c, ms in stable.items() if ms is not None)[1]
        assert conf.decide("m", rate, current, 1, now=10.0 + rate, cores=2) == expected
    assert plan.best_within(light, 2) == (1, 2)
    # where no configuration that fits is stable: the one that carries the most
    assert plan.best_within(heavy, 2) == (2, 1)
    assert plan.best_within(light, 0) is None


def test_a_configuration_past_the_budget_goes_at_once():
    conf = Configurator({"m": sublinear("m")}, hold_s=60.0)
    assert conf.decide("m", 5.0, None, 1, now=0.0) == (1, 4)
    # within the hold time an ordinary switch waits (1x4 still carries 55/s; 2x2 is better) ...
    assert conf.decide("m", 55.0, (1, 4), 1, now=1.0) is None
    assert Configurator({"m": sublinear("m")}, hold_s=0.0).decide("m", 55.0, (1, 4), 1, now=1.0) == (2, 2)
    # ... but another model took two of the four cores: 1x4 no longer fits
    assert conf.decide("m", 5.0, (1, 4), 1, now=1.0, cores=2) == (1, 2)
    # nothing left at all: nothing SERF may choose, and it does not try
    assert conf.decide("m", 5.0, (1, 2), 1, now=2.0, cores=0) is None


@pytest.mark.parametrize("budget", [4, 6])
def test_two_models_share_a_hosts_budget(budget):
    """Two models on one host, each wanting every core at its load: as the dispatcher's
    chore does, each decides in turn within what the other's current configuration leaves,
    and their cores together never exceed the host's."""
    conf = Configurator({"a": sublinear("a"), "b": sublinear("b")}, hold_s=0.0)
    hosts = {"a0": "h", "b0": "h"}
    workers = {"a": worker("a0", "a", 1, 1), "b": worker("b0", "b", 1, 1)}
    heavy = 0.6 * conf.models["a"].profile.capacity((4, 1))
    chosen = []
    for step, (rate_a, rate_b) in enumerate([(5.0, 5.0), (heavy, 5.0), (heavy, heavy), (5.0, heavy), (5.0, 5.0)]):
        for model, rate in (("a", rate_a), ("b", rate_b)):
            w = workers[model]
            cores = cores_left({"h": budget}, hosts, workers.values(), model)
            choice = conf.decide(model, rate, (w.slots, w.threads), 1, now=float(step), cores=cores)
            if choice is not None:
                w.slots, w.threads = choice
            assert sum(x.slots * x.threads for x in workers.values()) <= budget
        chosen.append({m: (w.slots, w.threads) for m, w in workers.items()})
    # at a light load the first to ask takes every core it profiled that b's one core
    # leaves, and b then what a leaves
    a_cores = min(CORES, budget - 1)
    assert chosen[0]["a"] == (1, a_cores) and chosen[0]["b"] == (1, budget - a_cores)
    # the models did get cores: each always has at least one
    assert all(s * t >= 1 for step in chosen for s, t in step.values())


def test_follow_the_version_served():
    conf = Configurator({"m": sublinear("m", "1")}, hold_s=0.0)
    assert conf.decide("m", 5.0, None, 1, now=0.0) == (1, 4)
    # version 2 is twice as slow: its own profile, the switching history kept
    assert conf.follow("m", "2", sublinear("m", "2", base_ms=80.0)) is None
    plan = conf.models["m"]
    assert plan.profile.version == "2" and plan.profile.service_ms[(1, 1)] == 80.0 and plan.switches == 1
    status = conf.status({"m": (1, 4)})["m"]
    assert status["version"] == "2" and status["switches"] == 1
    # version 3 has no profile: held, not switched by version 2's table
    why = conf.follow("m", "3", None, "store/m/3/serf_profile.json")
    assert why.startswith("no profile for m version 3: keel serf profile SPEC --model m")
    assert "m" not in conf.models and conf.status({"m": (1, 4)})["m"] == {"held": why, "configuration": "1x4"}
    conf.observe("m", 10.0)  # serving a held model is not counted against any profile
    conf.observe_service("m", (1, 4), 1, 10.0, 0.0, 1.0)
    # a rollout back to a version with a profile ends the hold
    assert conf.follow("m", "2", sublinear("m", "2", base_ms=80.0)) is None and "m" not in conf.held


def test_the_spec_gives_the_dispatcher_each_workers_host_and_where_versions_keep_profiles(tmp_path):
    from pathlib import Path

    from keel.common.spec import SpecError, load_spec

    spec = load_spec({"cluster": {"store": str(tmp_path / "store"), "run_dir": str(tmp_path / "run")},
                      "hosts": {"h1": "127.0.0.1", "h2": "127.0.0.2"},
                      "dispatcher": {"serf": {"m": "m.json"}, "serf_cores": {"h1": 8, "h2": 4}},
                      "models": {"m": {"builtin": "sleep", "workers": 3}, "n": {"builtin": "sleep"}}})
    d = spec.service("dispatcher").config
    assert d.serf_cores == {"h1": 8, "h2": 4}
    assert d.serf_hosts == {"worker-m-0": "h1", "worker-m-1": "h2", "worker-m-2": "h1", "worker-n-0": "h1"}
    assert d.serf_store == str(tmp_path / "store") and Path(d.serf_run_dir) == tmp_path / "run"
    with pytest.raises(SpecError, match=r"dispatcher.serf_cores.h3: no such host"):
        load_spec({"dispatcher": {"serf_cores": {"h3": 8}}, "models": {"m": {"builtin": "sleep"}}})
    with pytest.raises(SpecError, match=r"serf_cores.local must be a whole number of cores >= 1"):
        load_spec({"dispatcher": {"serf_cores": {"local": 0}}, "models": {"m": {"builtin": "sleep"}}})
    with pytest.raises(SpecError, match=r"dispatcher.serf.mm: no such model"):
        load_spec({"dispatcher": {"serf": {"mm": "m.json"}}, "models": {"m": {"builtin": "sleep"}}})
    with pytest.raises(SpecError, match=r"dispatcher.serf_hosts: is set by the spec itself"):
        load_spec({"dispatcher": {"serf_hosts": {"w": "local"}}, "models": {"m": {"builtin": "sleep"}}})
    reference = (Path(__file__).parents[2] / "docs" / "deploy.md").read_text()
    for key in ("serf", "serf_cores", "serf_hysteresis", "serf_hold_s"):
        assert f"| `{key}` |" in reference, f"[dispatcher] {key} is not in docs/deploy.md"
