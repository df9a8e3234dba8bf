"""Kairos live: a heterogeneous pool of emulated instance types (the ``kairos``
builtin: the authors' measured service times, CPU idle) behind real frontend, dispatcher
and worker processes, the dispatcher running the Kairos policy (§5.1) with the profile.

One base-type worker (g4dn.xlarge) and two auxiliary ones (r5n.large); queries of mixed
batch sizes, sent one at a time (one query in flight, so none waits behind another and
every one can meet its deadline). The deadline is 1.35 x the base type's time for the
largest query: a query of 900+ items misses it on r5n.large (rho x QoS, Eq. 5) and must go
to the base type; a small one costs least on r5n.large (coefficient x latency, Eq. 2).
The model has a default output, so a query served too slowly (a large one on r5n.large,
as a load balancer would send a third of them) is answered by the default, not the model.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from keel.common.kairos.profiles import DEFAULT_ROOT
from keel.common.protocol import Source
from keel.common.spec import load_spec
from keel.common.transport import request_status
from keel.deploy.local import free_port_block, wait_until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (DEFAULT_ROOT / "data.tar.gz").exists(),
                                 reason=f"Kairos profile data not found at {DEFAULT_ROOT}")]

BASE, CPU = "g4dn.xlarge", "r5n.large"
SCALE = 0.5
BASE_1000_MS = 260.8  # rm2 on g4dn.xlarge at 1000 items (profile, unscaled)
DEADLINE_MS = 1.35 * BASE_1000_MS * SCALE  # r5n.large at 900 items: 364 ms x SCALE, late


def test_kairos_pool_serves_every_query_and_large_ones_on_the_base_type(launcher, client):
    spec = load_spec({
        "cluster": {"name": "kairos-live", "base_port": free_port_block()},
        "frontend": {"cache_size": 0},  # equal batch sizes are equal rows: no cache hits
        "dispatcher": {"policy": "kairos"},
        "models": {"rm2": {"builtin": "kairos", "kairos_model": "rm2", "kairos_scale": SCALE,
                           "pools": {BASE: 1, CPU: 2}, "deadline_ms": DEADLINE_MS,
                           "default_output": [-1.0]}},
    })
    launcher("kairos").start_spec(spec)
    rng = np.random.default_rng(15)
    large = rng.integers(900, 1001, 25)
    small = rng.integers(1, 101, 75)
    sizes = rng.permutation(np.concatenate([large, small]))
    c = client(spec.client_endpoints[0], timeout_ms=DEADLINE_MS)  # the frontend answers the default then
    results = c.predict_batch("rm2", sizes.astype(np.float32).reshape(-1, 1), window=1)

    assert len(results) == len(sizes) and all(r.error is None for r in results)  # none lost
    is_large = sizes >= 900
    from_model = np.array([r.source == Source.MODEL for r in results])
    assert from_model[~is_large].all(), Counter(r.source for r, big in zip(results, is_large) if not big)
    # mostly: a query can arrive between its predecessor's reply and that one's Done, the
    # base-type worker still busy in the dispatcher's view; then r5n.large is cheaper
    assert from_model[is_large].mean() >= 0.8, Counter(r.source for r, big in zip(results, is_large) if big)
    # a worker replies to the frontend before its Done reaches the dispatcher: wait for the last
    endpoint, seen = spec.service("dispatcher").config.worker_endpoint, []
    assert wait_until(lambda: seen.append(request_status(endpoint, 1.0)) or
                      (seen[-1] is not None and not any(p["inflight"] for p in seen[-1]["pools"].values())), 10.0), \
        f"the dispatcher's last status: {seen[-1:]}"
    info = seen[-1]
    pools = info["pools"]
    assert pools[BASE]["workers"] == 1 and pools[CPU]["workers"] == 2
    assert info["cost_per_hour"] == pytest.approx(0.526 + 2 * 0.149)
    assert info["expired"] == 0 and info["requeued"] == 0
    # one query per batch (Kairos plans count 1): batches are queries served
    assert pools[BASE]["batches"] + pools[CPU]["batches"] == len(sizes)
    # large queries go to the base type, small ones to the cheaper CPUs
    assert 0.8 * len(large) <= pools[BASE]["batches"] <= len(large) + len(small) // 5, pools
    assert pools[CPU]["batches"] >= 0.8 * len(small), pools


def test_live_allowable_throughput_bisects_in_bounded_trials_and_loses_nothing(tmp_path):
    """``keel experiment kairos --live``'s measurement (bench/kairos_live.py) on a small
    pool, service times x 0.25, 150 queries a trial: every query answered, a bounded
    number of trials, the rate reported one that met the 1% target."""
    from keel.bench.kairos_sim import latency_table, sample_sizes
    from keel.bench.kairos_live import TARGET, live_throughput
    from keel.bench.kairos_sim import allowable_throughput
    from keel.common.kairos.profiles import Profiles
    from keel.services.scheduling.kairos import KairosPolicy, feature_size

    pool = {BASE: 1, CPU: 2}
    lat = latency_table(Profiles.load(), "rm2", [BASE, CPU])
    sim = allowable_throughput(lambda: KairosPolicy(lat, feature_size), pool, 350.0, lat, sample_sizes, rel_tol=0.1, n=500)
    out = live_throughput("rm2", pool, 350.0, sim, scale=0.25, n=150, rel_tol=0.25, log=lambda s: None,
                          run_dir=tmp_path)
    trials = out["trials"]
    assert out["lost"] == 0 and all(t["lost"] == 0 and t["sent"] == 150 for t in trials)
    assert 2 <= len(trials) <= 8  # the bracket's checks and a bisection to 25%
    met = [t["rate"] for t in trials if t["over_qos"] <= TARGET]
    assert out["kairos_live_rps"] in met if met else out["kairos_live_rps"] == 0.0
    assert out["cost_per_hour"] == pytest.approx(0.526 + 2 * 0.149)
