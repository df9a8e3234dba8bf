"""A short experiment against the real serving core: a worker-host kill and a shuffle,
two modes back to back, report JSON with invariants and both plots."""
from __future__ import annotations

import orjson
import pytest

from keel.chaos.cli import main
from keel.chaos.experiment import load_experiment, run_experiment
from keel.chaos.resources import ChaosError, list_netns, NS_PREFIX


def experiment(netns: bool) -> dict:
    return {
        "name": "tiny", "seed": 3, "netns": netns, "link_mbit": 1000, "max_duration_s": 90,
        "modes": ["parm", "equal"], "settle_s": 0.2,
        # in netns mode both deployments run at once, each in its own namespaces
        "schedule": "interleaved" if netns else "back_to_back",
        "cluster": {
            "hosts": {"fe": "127.0.0.1", "w1": "127.0.0.1", "w2": "127.0.0.1"},
            "frontend": {"host": "fe", "cache_size": 0}, "dispatcher": {"host": "fe"},
            "models": {"m": {"builtin": "sleep", "fixed_ms": 1.0, "input_shape": [64], "output_size": 10,
                             "workers": 2, "k": 2, "hosts": ["w1", "w2"], "fixed_batch": 1, "max_batch": 1}},
        },
        "workload": {"model": "m", "rate": 40.0, "count": 200, "duration_s": 2.5, "timeout_ms": 800, "drain_s": 1.0},
        "faults": [
            {"at_s": 0.3, "kind": "shuffle", "hosts": ["fe", "w1", "w2"], "concurrent": 1, "size_mb": [8, 16], "duration_s": 1.5},
            {"at_s": 1.0, "kind": "kill", "host": "w1", "restart_after_s": 0.8},
        ],
    }


@pytest.mark.parametrize("netns", [pytest.param(False, id="local"), pytest.param(True, id="netns", marks=pytest.mark.netns)])
def test_worker_kill_and_shuffle_experiment_reports_modes_invariants_and_plots(tmp_path, netns):
    report = run_experiment(load_experiment(experiment(netns)), json_path=tmp_path / "tiny.json")
    assert report["hosts_mode"] == ("netns" if netns else "local")
    assert set(report["modes"]) == {"parm", "equal"} and "equal/parm" in report["ratios"]
    for mode, summary in report["modes"].items():
        assert summary["sent"] > 50 and summary["answered"] + summary["lost"] == summary["accepted"]
        assert summary["latency_ms"]["p99"] is not None
    kinds = {(e["mode"], e["kind"]) for e in report["faults"] if e["ok"]}
    assert {("parm", "kill"), ("parm", "restart"), ("parm", "shuffle"), ("equal", "kill")} <= kinds
    assert all(e["t_wall"] > 0 for e in report["faults"])
    names = {(i["mode"], i["name"]): i for i in report["invariants_all"]}
    assert names[("equal", "model_replies_match_offline")]["ok"] is True
    assert names[("parm", "model_replies_match_offline")]["checked"] > 0
    assert report["shuffles"], "the shuffle fault ran no shuffle"
    on_disk = orjson.loads((tmp_path / "tiny.json").read_bytes())
    assert on_disk["seed"] == 3 and on_disk["fault_plan"]
    for png in report["plots"].values():
        assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert report["leftovers"] == []
    assert not [ns for ns in list_netns() if ns.startswith(NS_PREFIX)]


def test_bad_experiments_are_refused_before_anything_starts(tmp_path):
    bad = experiment(False)
    bad["colour"] = "red"
    with pytest.raises(ChaosError, match="colour"):
        load_experiment(bad)
    with pytest.raises(ChaosError, match="schedule"):
        load_experiment({**experiment(False), "schedule": "sideways"})
    path = tmp_path / "x.toml"
    path.write_text('name = "x"\ncluster = {}\nworkload = {model = "m"}\nmodes = ["none", "none"]\n')
    assert main(["run", str(path), "--json", str(tmp_path / "x.json")]) == 2
