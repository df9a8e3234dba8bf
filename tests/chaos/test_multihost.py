"""Across hosts for real (netns): three hosts, each brought up by its own ``keel up SPEC
--host H`` in its namespace from a folder of its own (spec copy, run_dir, store), stores
empty at start so every worker fetches its model from the store service; queries from a
client namespace answered with each version's offline output; a store transfer corrupted
in flight by the chaos proxy refused and retried; a rollout of v2 and a whole host's death
(its supervisord too, restarted with an empty store) under the load. The same at 5,000
queries is ``python -m keel.chaos.multihost`` and the second test (``KEEL_MULTIHOST_FULL=1``)."""
from __future__ import annotations

import os

import pytest

from keel.chaos.multihost import HOSTS, run

pytestmark = [pytest.mark.netns, pytest.mark.timeout(420)]


def _check(f: dict, queries: int) -> None:
    assert f["fetched_v1"] == {h: True for h in HOSTS}, f["fetch_events"]
    for host in HOSTS:  # every worker of every host fetched (stores start empty), none was refused
        assert f["fetch_events"][host].get("model fetched", 0) >= 1, (host, f["fetch_events"])
    assert f["status"]["rc"] == 0 and not f["status"]["silent"], f["status"]
    assert {"store-1", "frontend-0", "frontend-1", "dispatcher", "worker-scale-2"} <= set(f["status"]["answered"])
    r = f["replies"]
    assert r["sent"] == queries and r["lost"] == 0 and r["errors"] == 0, r
    assert r["wrong"] == 0, r["wrong_examples"]  # every reply, reconstructions included, equals its version's
    assert set(r["by_version"]) == {"1", "2"}  # the rollout happened under the load
    assert f["fetched_v2"] == {h: True for h in HOSTS} and f["refetched"]
    assert f["rejoined"] and "worker-scale-2" in f["restarted_units"]  # h3 back from its systemd units, store refilled
    c = f["corrupted_transfer"]
    assert c["flipped"] and c["refused"] >= 1 and c["fetched"] and c["exact"] and c["rc"] == 0, c["output"]
    assert f["down_rc"] == {h: 0 for h in HOSTS}  # keel down spec.toml --host H on each


def test_three_hosts_fetch_roll_out_lose_a_host_and_refuse_a_corrupted_transfer(clusters, tmp_path):
    cluster = clusters(hosts=(*HOSTS, "client"), netns=True)
    _check(run(cluster, tmp_path / "hosts", queries=2400, rate=200.0, rollout=True, kill=True), 2400)


@pytest.mark.skipif(not os.environ.get("KEEL_MULTIHOST_FULL"), reason="the full three-host scenario (~1 min of 5,000 queries): "
                    "KEEL_MULTIHOST_FULL=1, or python -m keel.chaos.multihost")
def test_multihost_full_rollout_and_host_death_under_load(clusters, tmp_path):
    cluster = clusters(hosts=(*HOSTS, "client"), netns=True)
    _check(run(cluster, tmp_path / "hosts", queries=5000, rate=250.0, rollout=True, kill=True), 5000)
