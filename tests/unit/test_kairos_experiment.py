"""``keel experiment kairos`` (bench/kairos_experiment.py) on a tiny configuration."""
from __future__ import annotations

import json

import numpy as np
import pytest

from keel.bench import kairos_experiment
from keel.bench.cli import finish
from keel.bench.kairos_experiment import Config, UrgentKairos, run_experiment
from keel.common.kairos.profiles import DEFAULT_ROOT

needs_data = pytest.mark.skipif(not (DEFAULT_ROOT / "data.tar.gz").exists(),
                                reason=f"Kairos profiles absent ({DEFAULT_ROOT}/data.tar.gz)")


@needs_data
def test_tiny_experiment_writes_the_keys_within_budget_and_a_plot(tmp_path):
    cfg = Config(n=250, rel_tol=0.15, plus_n=150, plus_tol=0.3, solve_reps=5, seeds=2)
    path = tmp_path / "k.json"
    out = run_experiment(["dien"], cfg, log=lambda s: None)
    assert finish(kairos_experiment, out, path, log=lambda s: None) == 0  # what keel experiment does at its end
    saved = json.loads(path.read_text())
    assert path.with_suffix(".png").exists() and saved["plot"] == str(path.with_suffix(".png"))
    for key in ("plan_ms", "solve_p99_ms_28x14", "solve_p99_ms_200x200", "lost", "models"):
        assert key in saved
    m = saved["models"]["dien"]
    for key in ("kairos_rps", "best_homogeneous_rps", "best_baseline_rps", "oracle_rps", "pool", "pool_cost"):
        assert key in m
    assert saved["lost"] == 0 and out["lost"] == 0
    assert 0 < m["pool_cost"] <= m["budget"] + 1e-9
    assert m["kairos_rps"] > 0 and m["best_homogeneous_rps"] > 0 and m["oracle_rps"] > 0
    assert m["best_baseline_rps"] == max(m["rates"]["drs"], m["rates"]["clockwork"])
    # two draws, averaged; the paper's accounting beside: homogeneous scaled to the budget
    # (§8.1), the oracle of the best pool of the space (§7), never below the planned pool's
    assert [r["seed"] for r in m["per_seed"]] == [0, 1]
    assert m["kairos_rps"] == pytest.approx(np.mean([r["rates"]["kairos"] for r in m["per_seed"]]))
    lo, hi = m["ratios"]["vs_best_baseline"]["range"]
    assert lo <= hi and min(r["ratios"]["vs_best_baseline"]["value"] for r in m["per_seed"]) == lo
    assert m["best_homogeneous_scaled_rps"] == pytest.approx(
        m["best_homogeneous_rps"] * m["budget"] / m["homogeneous_cost"], rel=1e-3)
    assert m["oracle_space_rps"] >= m["oracle_rps"] > 0 and m["oracle_space_pool"]
    assert 0 < m["homogeneous_vs_its_oracle"] <= 1.0
    cdf = m["latency_quantiles_ms_at_rate"]["kairos"]  # the CDF plotted against the QoS line
    assert len(cdf) == 201 and cdf == sorted(cdf) and cdf[0] > 0
    assert set(m["max_latency_ms_at_rate"]) == set(m["rates"])
    assert 1 <= m["kairos_plus"]["evaluated"] <= m["kairos_plus"]["space"]
    png = tmp_path / "k.png"
    assert png.exists() and png.read_bytes()[:4] == b"\x89PNG"


def test_urgent_kairos_matches_a_query_late_everywhere_first():
    from keel.common.config import BatchPolicy
    from keel.services.scheduling.batching import FixedBatch
    from keel.services.scheduling.kairos import KairosPolicy, feature_size
    from keel.services.scheduling.view import ModelQueue, Query, WorkerState

    lat = lambda t, s: 1.0 * s  # noqa: E731
    cfg = BatchPolicy(fixed_batch=1)
    queue = ModelQueue("m", cfg, FixedBatch(cfg))
    kind = ((1,), np.dtype(np.float32))
    # query 0 (size 90) has waited 50 ms of its 100: late on the one instance; 1 and 2 are small and on time
    for qid, size, enq in ((0, 90, 0.0), (1, 5, 0.05), (2, 5, 0.05)):
        queue.entries.append(Query(qid, enq + 0.1, "", np.array([size], np.float32), enq, kind))
    worker = WorkerState(identity=b"w", name="w", model="m", role="deployed", slots=1, max_batch=1,
                         batch_size=1, last_seen=0.0, instance="cpu")
    plain = KairosPolicy(lat, feature_size).assign(queue, [worker], 0.05)
    urgent = UrgentKairos(lat, feature_size).assign(queue, [worker], 0.05)
    assert plain[0].worker is None            # Eq. 8's penalty: the late query waits behind the rest
    assert urgent[0].worker is worker         # made urgent: served first


def test_live_over_qos_counts_errors_and_unanswered_as_over_and_skips_the_warmup():
    from keel.bench.kairos_live import over_qos
    from keel.common.loadgen import Record

    recs = [Record(str(i), i, 0.0, 0.050) for i in range(10)]  # 50 ms each
    recs[0].received = 9.0  # in the warm-up (the first 10%): not counted
    recs[3].received = 0.2  # 200 ms: over
    recs[5].error_code = "deadline_exceeded"
    recs[7].received = None  # never answered
    frac, lat, over = over_qos(recs, 100.0)
    assert frac == pytest.approx(3 / 9) and sorted(over) == [3, 5, 7]
    assert sorted(lat.round(1).tolist()) == [50.0] * 6 + [200.0]


@needs_data
def test_live_spec_runs_the_kairos_policy_on_the_pool_with_the_qos_as_deadline():
    from keel.bench.kairos_live import cluster_spec

    spec = cluster_spec("rm2", {"g4dn.xlarge": 1, "r5n.large": 2}, 350.0, 0.5)
    d = spec.service("dispatcher").config
    assert (d.policy, d.kairos_model, d.kairos_scale) == ("kairos", "rm2", 0.5)
    assert sorted(w.config.instance for w in spec.role("worker")) == ["g4dn.xlarge", "r5n.large", "r5n.large"]
    assert spec.models["rm2"]["deadline_ms"] == 175.0


@needs_data
def test_live_and_simulation_serve_the_same_queries():
    from keel.bench.kairos_live import live_inputs, same_sequence
    from keel.common.loadgen import schedule

    inputs = live_inputs(0)
    offsets, rows = schedule(80.0, 50, 0, len(inputs))  # what open_loop sends
    assert same_sequence(inputs, 50, 0)(None, 50).tolist() == inputs[rows, 0].astype(int).tolist()
    # the simulator's arrivals with the same seed: its generator's first draws
    assert np.allclose(np.cumsum(np.random.default_rng(0).exponential(1 / 80.0, 50)), offsets)
