"""The hold against its floor (``keel experiment hams-overhead``): per reply, the hold
(output -> released), one hop (the backup applied its state -> released) and the ship
(handed over after the update -> applied); the floor is each reply's hop + ship, and the
target reads the hold's p50 against that floor's p50."""
from __future__ import annotations

import orjson
import pytest

from keel.bench.hams_readings import floor_of


def _trace(tmp_path, replies):
    """One stateful operator g answering the frontend; per reply (out, update, ship, apply,
    release) times in seconds."""
    lines = []
    for seq, (out, update, ship, apply, release) in enumerate(replies):
        lines += [{"stream": "output", "operator": "g", "seq": seq, "t": out},
                  {"stream": "update", "operator": "g", "first_seq": seq, "last_seq": seq, "t": update},
                  {"stream": "ship", "operator": "g", "first_seq": seq, "last_seq": seq, "t": ship},
                  {"stream": "apply", "operator": "g", "last_seq": seq, "t": apply},
                  {"stream": "release", "origin": seq, "lineage": [["frontend", seq, "g", seq]], "t": release}]
    (tmp_path / "g.jsonl").write_bytes(b"\n".join(orjson.dumps(rec) for rec in lines))
    return tmp_path


def test_the_floor_is_each_replys_hop_plus_ship(tmp_path):
    # a reply waits for its own hop and ship: here one of the two is long for most replies
    # (each reply's floor 6 ms but one), while each alone is 1 ms at the median: the sum of
    # the two p50s (2 ms) would count 4 ms of the floor as the hold's excess
    ms = 1e-3
    ships, hops = (1, 5, 5, 1, 1), (1, 1, 1, 5, 5)
    replies = [(t0, t0 + 0.1 * ms, t0 + 0.2 * ms, t0 + (0.2 + ship) * ms, t0 + (0.2 + ship + hop) * ms)
               for t0, ship, hop in zip((0.0, 0.1, 0.2, 0.3, 0.4), ships, hops)]  # a batch each 100 ms
    f = floor_of(_trace(tmp_path, replies))
    assert f["replies_traced"] == 5
    assert f["hold_p50_ms"] == pytest.approx(6.2)
    assert f["floor_ms"] == pytest.approx(6.0)
    assert f["floor_p50s_summed_ms"] == pytest.approx(2.0)
    assert f["hold_over_floor_ms"] == pytest.approx(0.2)
    assert f["update_p50_ms"] == pytest.approx(0.1)
    assert f["hold_over_floor_and_update_ms"] == pytest.approx(0.1)


def test_remus_over_nspb_divides_by_no_less_than_the_cells_resolution():
    from keel.bench.hams_readings import remus_over_nspb, resolution

    bare = [198.0, 202.0, 200.0]  # bare moves 2% of its median between its own repetitions
    assert resolution(bare) == pytest.approx(0.02)
    assert resolution([200.0]) is None
    res = resolution(bare)
    assert remus_over_nspb({"nspb": 0.05, "remus": 0.30}, res) == pytest.approx(6.0)  # measured: the plain ratio
    assert remus_over_nspb({"nspb": -0.01, "remus": 0.30}, res) == pytest.approx(15.0)  # within noise: a lower bound
    assert remus_over_nspb({"nspb": 0.005, "remus": 0.30}, res) == pytest.approx(15.0)
    assert remus_over_nspb({"nspb": -0.01, "remus": 0.30}, None) is None  # no resolution, no cost: undefined
    assert remus_over_nspb({"nspb": None, "remus": 0.30}, res) is None


def test_paired_cells_read_each_mode_against_the_bare_cells_of_its_own_repetition():
    from keel.bench.hams_readings import paired

    cell = lambda rep, p50: {"rep": rep, "p50_ms": p50}  # noqa: E731
    # repetition 1's draw is slower for every mode: a comparison across repetitions would
    # read it as a cost of the mode that ran there
    runs = {"bare": [cell(0, 200.0), cell(0, 202.0), cell(1, 230.0), cell(1, 230.0), cell(2, None)],
            "nspb": [cell(0, 201.0), cell(1, 230.0), cell(2, 250.0)],
            "remus": [cell(0, 221.1), cell(1, 253.0)]}
    over, aa = paired(runs)
    assert aa == pytest.approx([0.01, 0.0])  # |b2 / b1 - 1| of each repetition with two bare cells
    assert over["nspb"] == pytest.approx([0.0, 0.0])  # a repetition without a bare cell reads nothing
    assert over["remus"] == pytest.approx([0.1, 0.1])


def test_stages_split_each_reply_between_the_operators_outputs_and_the_release(tmp_path):
    from keel.bench.hams_graphs import graphs
    from keel.bench.hams_readings import chain_of, stages_of

    assert chain_of(graphs(50.0, 64)["ol_large"]) == ["m", "ol", "post"]
    with pytest.raises(ValueError):
        chain_of(graphs(50.0, 64)["fanout_join"])
    lines = []
    for b, t0 in enumerate((0.0, 0.05, 0.10)):  # three batches of two rows, 50 ms apart
        for k in range(2):
            seq = 2 * b + k
            lines += [{"stream": "output", "operator": "g1", "seq": seq, "t": t0 + 0.0001 * k},
                      {"stream": "output", "operator": "g2", "seq": seq, "t": t0 + 0.051 + 0.0001 * k},
                      {"stream": "release", "origin": seq, "t": t0 + 0.053 + 0.0001 * k,
                       "lineage": [["frontend", seq, "g1", seq], ["g1", seq, "g2", seq]]}]
    (tmp_path / "g.jsonl").write_bytes(b"\n".join(orjson.dumps(rec) for rec in lines))
    st = stages_of(tmp_path, ["g1", "g2"])
    assert st["replies"] == 6
    assert st["stages_p50_ms"]["g1 -> g2"] == pytest.approx(51.0)
    assert st["stages_p50_ms"]["g2 -> release"] == pytest.approx(2.0)
    assert st["cycle_ms"]["g1"] == pytest.approx(50.0)
    assert st["rows_per_batch"]["g2"] == 2
