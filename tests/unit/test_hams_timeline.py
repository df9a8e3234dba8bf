"""The recovery timeline reads a trial's traces into series relative to the fault; the
recovery-growth figure of hams-recovery."""
import pytest

from keel.bench.hams_recovery import growth_per_1000
from keel.bench.hams_timeline import events


def test_events_split_old_and_new_epoch_and_measure_from_the_fault():
    streams = {
        "graph_output": [{"operator": "g2", "seq": 5, "epoch": 1, "t": 9.99},
                         {"operator": "g2", "seq": 6, "epoch": 2, "t": 10.08}],
        "graph_apply": [{"operator": "g2", "last_seq": 5, "t": 9.995},
                        {"operator": "g2", "last_seq": 6, "degraded": True, "t": 10.09}],
        "graph_release": [{"origin": 5, "t": 9.996}, {"origin": 6, "t": 10.091}],
        "graph_takeover": [{"operator": "g2", "epoch": 2, "max_seq": 5, "t": 10.07}],
    }
    out = events(streams, fault_t=10.0, victim="g2")
    assert [s for _, s in out["series"]["g2 output"]] == [5]
    assert [s for _, s in out["series"]["g2 output (new epoch)"]] == [6]
    assert [s for _, s in out["series"]["g2 durable (degraded)"]] == [6]
    assert out["max_seq"] == 5
    assert abs(out["takeover_ms"] - 70.0) < 1e-6 and abs(out["first_new_output_ms"] - 80.0) < 1e-6
    assert out["series"]["frontend release"][0][0] < 0


def test_recovery_growth_is_the_least_squares_slope_per_thousand():
    # ls-like: replay grows 0.5 ms a batch -> 500 ms per 1,000; a trial that never recovered is left out
    assert growth_per_1000([[0, 20.0], [40, 40.0], [100, 70.0], [60, None]]) == pytest.approx(500.0)
    assert growth_per_1000([[100, 80.0], [2000, 80.0], [1200, 80.0]]) == pytest.approx(0.0, abs=1e-9)
    assert growth_per_1000([[1, 2.0], [3, 4.0]]) is None  # too few points to say
    assert growth_per_1000([[5, 2.0], [5, 4.0], [5, 9.0]]) is None  # one x: no slope
