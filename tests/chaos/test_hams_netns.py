"""HAMS II recovery in netns mode (``bench.hams_recovery``): every graph process and every
manager replica on a network namespace of its own, the load client inside a "client"
namespace, and host faults: a SIGKILL of the stateful primary's host, and a partition of
it (healed once its backup was promoted: the old primary must be fenced by its epoch,
release nothing more, and rejoin as the new primary's backup). Skipped without netns."""
from __future__ import annotations

import pytest

from keel.chaos.graph_trials import cluster_trial, gru_chain

pytest.importorskip("torch", reason="the graph operators need torch")
pytestmark = [pytest.mark.netns, pytest.mark.timeout(240)]


def trial(clusters, tmp_path, fault: str) -> dict:
    cluster = clusters(hosts=("client",), netns=True)
    row = cluster_trial(cluster, tmp_path / fault, victim="g2", n=160, kill_at=60, seed=3, fault=fault, table=gru_chain())
    # one host each: every process (graph and manager replicas) at its own namespace address
    addresses = row["addresses"]
    assert len(set(addresses.values())) == len(addresses) >= 5, addresses
    assert {"manager-1", "manager-2", "manager-3", "op-g2", "op-g2-backup", "frontend"} <= set(cluster.hosts)
    assert not any(a.startswith("127.") for a in addresses.values())
    return row


def test_a_stateful_primary_host_kill_recovers_without_loss(clusters, tmp_path):
    row = trial(clusters, tmp_path, "kill")
    assert row["lost"] == 0 and row["conflicts"] == 0, row["error_examples"]
    assert row["invariants_ok"], row["invariants"]
    assert row["promoted"] and row["recovery_ms"] is not None and row["detection_ms"] is not None


def test_a_partitioned_primary_is_fenced_and_rejoins_as_backup(clusters, tmp_path):
    row = trial(clusters, tmp_path, "partition")
    assert row["lost"] == 0 and row["conflicts"] == 0, row["error_examples"]
    assert row["invariants_ok"], row["invariants"]
    assert row["promoted"] and row["recovery_ms"] is not None
    assert row["thaw_after_fault_ms"] is not None  # healed after the takeover
    assert row["fenced"] is True and row["old_epoch_outputs_after_thaw"] == 0
    assert row["rejoined_as_backup"] is True
