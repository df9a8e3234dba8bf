"""The recovery timeline reads a trial's traces into series relative to the fault."""
from bench.hams_timeline import events


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
