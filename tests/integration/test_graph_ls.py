"""HAMS II's ``ls`` mode (the paper's Lineage Stash baseline) with real processes: three
manager replicas and a GRU -> GRU graph; g2's primary writes a checkpoint of its whole state
every few batches to global storage (the trace dir) and ships nothing per batch; it is
SIGKILLed under open load: its cold standby is promoted, loads the latest checkpoint, g1
resends by lineage what came after it, and the standby replays it. With deterministic GRUs
the replay equals what was lost (nothing lost, every reply equal to the offline run); with
noisy GRUs the replayed outputs differ from the ones clients got, and the checker sees it."""
from __future__ import annotations

import pytest

from keel.chaos.graph_trials import kill_trial, ls_chain
from keel.chaos.invariants import load_graph_traces

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def test_ls_deterministic_replay_loses_nothing(launcher, tmp_path):
    # one input a batch: checkpoints at seqs 39, 79, 119, 159; the kill after request 150 falls between two
    row = kill_trial(launcher, tmp_path, "g2", n=240, kill_at=150, seed=21, table=ls_chain(checkpoint_every=40, noise=0.0))
    assert row["promoted"] and row["mode"] == "ls" and not row["noisy"], row
    assert row["lost"] == 0 and row["answered_twice"] == 0 and row["unlike_offline"] == 0, row
    assert row["output_conflicts"] == 0, row["invariants"]
    assert (tmp_path / "trace" / "checkpoint-g2.bin").exists()
    traces = load_graph_traces(str(tmp_path / "trace"))
    replay = [r for r in traces.get("graph_replay", []) if r["operator"] == "g2"]
    assert len(replay) == 1 and replay[0]["checkpoint_seq"] >= 0, replay  # it loaded a checkpoint, not a fresh state
    assert row["outputs_since_checkpoint"] > 0 and row["replayed_ms"] == row["replayed_ms"], row  # it replayed past it


def test_ls_noisy_replay_shows_conflicts_the_checker_detects(launcher, tmp_path):
    row = kill_trial(launcher, tmp_path, "g2", n=240, kill_at=150, seed=22, table=ls_chain(checkpoint_every=40))
    print({k: row[k] for k in ("recovery_ms", "replayed_ms", "outputs_since_checkpoint", "conflicts", "lost")})
    assert row["promoted"] and row["mode"] == "ls" and row["noisy"], row
    assert row["outputs_since_checkpoint"] > 0, row  # something to replay (the kill fell between checkpoints)
    assert row["lost"] == 0, row
    assert row["output_conflicts"] > 0 and row["conflicts"] > 0, row["invariants"]
