"""Invariant checks on synthetic records: each one catches what it names, and only that."""
from __future__ import annotations

import numpy as np

from keel.chaos.invariants import (AnsweredExactlyOnce, Checker, CheckContext, ModelRepliesMatchOffline,
                              NoConflictingAnswers, UniquePerKey)

INPUTS = np.arange(40, dtype=np.float32).reshape(10, 4)


class Head:
    """The offline model: the first two features."""

    def predict_batch(self, x):
        return x[:, :2]


def rec(i, *replies, row=None):
    return {"mode": "m", "i": i, "request_id": f"r{i}", "input_index": i if row is None else row, "send_t": 100.0 + i,
            "replies": list(replies)}


def reply(source="model", output=None, error_code=None, t=0.01):
    return {"recv_t": 100.0 + t, "source": source, "output": output, "error_code": error_code, "error": None,
            "latency_ms": t * 1000}


def good(i):
    return rec(i, reply(output=INPUTS[i, :2].tolist()))


CTX = CheckContext(inputs=INPUTS, predictors={"m": Head()}, model="m")


def test_clean_records_pass_every_default_check():
    records = [good(i) for i in range(10)] + [rec(10, reply("default", [0.0, 0.0]), row=3)]
    results = Checker.default().run(records, CTX)
    assert [r.ok for r in results] == [True, True, True], [r.detail for r in results]
    assert results[1].checked == 10  # only "model" replies are compared offline


def test_lost_and_duplicated_requests_break_exactly_once():
    records = [good(0), rec(1), rec(2, reply("error", error_code="timeout")), rec(3, reply(output=[12, 13]), reply(output=[12, 13])),
               rec(4, reply("error", error_code="overloaded"))]
    res = AnsweredExactlyOnce().check(records, CTX)
    assert not res.ok and res.violations == 3 and res.checked == 4  # the overloaded one was never accepted
    assert "2 lost, 1 answered more than once" in res.detail


def test_a_wrong_model_output_is_caught_with_its_difference():
    records = [good(0), rec(1, reply(output=[4.0, 5.5]))]
    res = ModelRepliesMatchOffline().check(records, CTX)
    assert not res.ok and res.violations == 1 and res.examples[0]["max_abs_diff"] == 0.5
    small = ModelRepliesMatchOffline().check([rec(1, reply(output=[4.00001, 5.0]))], CTX)
    assert small.ok


class HeadPlus100:
    """Version 2 of the offline model."""

    def predict_batch(self, x):
        return x[:, :2] + 100


def test_replies_are_checked_against_the_version_they_name():
    ctx = CheckContext(inputs=INPUTS, predictors={"m": Head(), "m@1": Head(), "m@2": HeadPlus100()}, model="m")
    v1, v2 = (INPUTS[0, :2]).tolist(), (INPUTS[0, :2] + 100).tolist()
    ok = [rec(0, {**reply(output=v1), "version": "1"}), rec(1, {**reply(output=v2), "version": "2"}, row=0),
          rec(2, {**reply("cache", output=v2), "version": "2"}, row=0)]
    assert ModelRepliesMatchOffline().check(ok, ctx).ok
    # another version's output under a version's name, from a model or from the cache, is caught
    wrong = [rec(0, {**reply(output=v2), "version": "1"}), rec(1, {**reply("cache", output=v1), "version": "2"}, row=0)]
    res = ModelRepliesMatchOffline().check(wrong, ctx)
    assert not res.ok and res.violations == 2 and res.checked == 2


def test_offline_check_is_reported_unchecked_without_a_predictor():
    res = ModelRepliesMatchOffline().check([good(0)], CheckContext())
    assert res.ok is None and "not checked" in res.detail


def test_two_different_answers_for_one_id_conflict_but_equal_ones_do_not():
    same = rec(0, reply(output=[0, 1]), reply("reconstruction", [0, 1]))
    differ = rec(1, reply(output=[4, 5]), reply("reconstruction", [4, 9]))
    res = NoConflictingAnswers().check([same, differ], CTX)
    assert res.violations == 1 and res.examples[0]["request_id"] == "r1"


def test_unique_per_key_is_the_extension_point_for_operator_outputs():
    inv = UniquePerKey("operator_outputs_unique", key=lambda r: (r["operator"], r["seq"]), value=lambda r: r["output"],
                       stream="operator_outputs")
    rows = [{"operator": "a", "seq": 1, "output": [1]}, {"operator": "a", "seq": 1, "output": [1]},
            {"operator": "b", "seq": 1, "output": [2]}, {"operator": "b", "seq": 1, "output": [3]}]
    res = inv.check([], CheckContext(streams={"operator_outputs": rows}))
    assert not res.ok and res.violations == 1 and res.examples == [{"key": "('b', 1)"}]
    assert inv.check([], CheckContext()).ok is None


def test_a_check_that_raises_fails_in_the_report_instead_of_crashing():
    class Broken:
        name = "broken"

        def check(self, records, ctx):
            raise KeyError("oops")

    results = Checker([Broken()]).add(AnsweredExactlyOnce()).run([good(0)], CTX)
    assert results[0].ok is False and "KeyError" in results[0].detail and results[1].ok


# --- HAMS graph invariants on hand-made traces ----------------------------------------------
# g1 -> g2 (both stateful); lineage entries are [predecessor, its seq, operator, my seq].
from keel.chaos.invariants import graph_invariants  # noqa: E402


def _trace():
    """A correct run: g1's backup applies seq 0, then g2's applies its seq 0 (which depends
    on g1 seq 0), then the reply leaves."""
    lin = [["frontend", 0, "g1", 0], ["g1", 0, "g2", 0]]
    return {"graph_apply": [{"operator": "g1", "last_seq": 0, "epoch": 1, "lineage": [lin[0]], "t": 1.0,
                             "requests": [["1:c/r0", 0]]},
                            {"operator": "g2", "last_seq": 0, "epoch": 1, "lineage": lin, "t": 2.0,
                             "requests": [["1:c/r0", 0]]}],
            "graph_release": [{"origin": 0, "lineage": lin, "t": 3.0}],
            "graph_output": [{"operator": "g1", "seq": 0, "epoch": 1, "origin": 0, "output": [1.0]},
                             {"operator": "g2", "seq": 0, "epoch": 1, "origin": 0, "output": [2.0]}]}


def _graph_results(streams):
    return {r.name: r for r in Checker(graph_invariants(["g1", "g2"])).run([], CheckContext(streams=streams))}


def test_a_correct_graph_trace_passes_the_hams_invariants():
    results = _graph_results(_trace())
    assert all(r.ok for r in results.values()), [r.detail for r in results.values()]
    assert [r.checked for r in results.values()] == [1, 2, 2, 2, 2]


def test_a_reply_released_before_its_lineage_was_durable_fails():
    streams = _trace()
    streams["graph_release"][0]["t"] = 1.5  # g2 applied only at 2.0
    results = _graph_results(streams)
    assert results["graph_durable_before_release"].ok is False
    assert results["graph_durable_before_release"].examples[0]["not_durable"] == [["g1", 0, "g2", 0]]
    assert results["graph_algorithm2_order"].ok is True


def test_a_backup_applying_before_its_dependency_fails_algorithm2_order():
    streams = _trace()
    streams["graph_apply"][0]["last_seq"] = -1  # g1's backup never had seq 0 when g2's applied
    streams["graph_apply"][0]["t"] = 1.0
    results = _graph_results(streams)
    assert results["graph_algorithm2_order"].ok is False
    assert results["graph_algorithm2_order"].violations == 1
    assert results["graph_durable_before_release"].ok is False  # g1 seq 0 never became durable


def test_two_outputs_for_one_operator_seq_fail_but_a_repeat_does_not():
    streams = _trace()
    streams["graph_output"].append({"operator": "g1", "seq": 0, "epoch": 1, "origin": 0, "output": [1.0]})
    assert _graph_results(streams)["graph_one_output_per_operator_seq"].ok is True
    streams["graph_output"].append({"operator": "g1", "seq": 0, "epoch": 2, "origin": 0, "output": [5.0]})
    assert _graph_results(streams)["graph_one_output_per_operator_seq"].ok is False


def _rolled_back_trace():
    """g2's old primary (epoch 1) numbered seq 1 for origin 1; g2 was rolled back, the
    frontend voided that output; g2's new primary (epoch 2) numbered seq 1 for origin 2 and
    seq 2 for origin 1, and those replies left."""
    streams = _trace()
    streams["graph_output"] += [{"operator": "g2", "seq": 1, "epoch": 1, "origin": 1, "output": [7.0]},  # voided
                                {"operator": "g2", "seq": 1, "epoch": 2, "origin": 2, "output": [8.0]},
                                {"operator": "g2", "seq": 2, "epoch": 2, "origin": 1, "output": [7.0]}]
    streams["graph_release"] += [{"origin": 2, "lineage": [["frontend", 2, "g1", 2], ["g1", 2, "g2", 1]], "t": 4.0},
                                 {"origin": 1, "lineage": [["frontend", 1, "g1", 1], ["g1", 1, "g2", 2]], "t": 4.0}]
    return streams


def test_an_output_nobody_took_is_not_an_output_of_the_graph():
    result = _graph_results(_rolled_back_trace())["graph_one_output_per_operator_seq"]
    assert result.ok is True and result.checked == 4, result.detail  # the voided one is not counted


def test_two_different_released_outputs_for_one_operator_seq_are_flagged():
    streams = _rolled_back_trace()
    # the voided output reached a reply after all: two different g2 seq-1 outputs left the graph
    streams["graph_release"].append({"origin": 1, "lineage": [["frontend", 1, "g1", 1], ["g1", 1, "g2", 1]], "t": 5.0})
    result = _graph_results(streams)["graph_one_output_per_operator_seq"]
    assert result.ok is False and result.violations == 1 and result.examples == [{"key": "('g2', 1)"}]


def test_a_voided_output_re_run_for_the_same_request_is_not_counted_twice():
    """HAMS Fig. 6, found in a quiet hams-recovery run: g2's old primary numbered seq 1 for
    origin 1 (its backup died, nothing applied it); g1 failed, g2 rolled back in place and
    re-ran origin 1 with the same seq, in a batch of another size (the last float bit
    differs); the frontend voided the first and released the second. Only the output the
    reply carried, the newest made before the release, counts."""
    streams = _trace()
    lin = [["frontend", 1, "g1", 1], ["g1", 1, "g2", 1]]
    streams["graph_output"] += [{"operator": "g2", "seq": 1, "epoch": 1, "origin": 1, "output": [7.0], "t": 3.1},
                                {"operator": "g2", "seq": 1, "epoch": 3, "origin": 1, "output": [7.000001], "t": 3.5}]
    streams["graph_release"].append({"origin": 1, "lineage": lin, "t": 3.6})
    result = _graph_results(streams)["graph_one_output_per_operator_seq"]
    assert result.ok is True and result.checked == 3, result.detail
    # had the first left before the re-run, the two would conflict
    streams["graph_release"].append({"origin": 1, "lineage": lin, "t": 3.2})
    assert _graph_results(streams)["graph_one_output_per_operator_seq"].ok is False


def test_an_output_a_backup_applied_counts_even_if_no_reply_shows_it():
    streams = _rolled_back_trace()
    # g2's backup applied the epoch-1 state holding seq 1: that output is the graph's, and the re-run contradicts it
    streams["graph_apply"].append({"operator": "g2", "last_seq": 1, "epoch": 1, "lineage": [["g1", 1, "g2", 1]], "t": 3.5})
    result = _graph_results(streams)["graph_one_output_per_operator_seq"]
    assert result.ok is False and result.violations == 1


def test_graph_invariants_without_traces_are_unchecked_not_passed():
    results = _graph_results({})
    assert [r.ok for r in results.values()] == [None, None, None, None, None]


def test_two_processes_numbering_at_one_operator_epoch_fail_one_primary_per_epoch():
    streams = _trace()
    for o in streams["graph_output"]:
        o["process"] = "op-g1:10" if o["operator"] == "g1" else "op-g2:11"
    # a takeover at a new epoch by another process is fine
    streams["graph_output"].append({"operator": "g2", "seq": 1, "epoch": 2, "origin": 1, "output": [3.0],
                                    "process": "op-g2-backup:12"})
    assert _graph_results(streams)["graph_one_primary_per_epoch"].ok is True
    # a fenced old primary numbering again at its old epoch is not
    streams["graph_output"].append({"operator": "g2", "seq": 1, "epoch": 2, "origin": 1, "output": [3.0],
                                    "process": "op-g2:11"})
    result = _graph_results(streams)["graph_one_primary_per_epoch"]
    assert result.ok is False and result.examples == [{"operator": "g2", "epoch": 2,
                                                       "processes": ["op-g2-backup:12", "op-g2:11"]}]


def test_load_graph_traces_tells_apart_two_processes_that_wrote_one_file(tmp_path):
    import os

    from keel.chaos.invariants import load_graph_traces
    from keel.services.graph.events import EventLog

    path = tmp_path / "op-g2.jsonl"
    first = EventLog(str(path))
    first.write("output", operator="g2", seq=0, epoch=1, origin=0, output=[1.0])
    first.close()
    path.open("ab").write(b'{"stream": "process", "pid": 424242}\n'  # a process started again on the path (a joiner)
                          b'{"stream": "output", "operator": "g2", "seq": 1, "epoch": 3, "origin": 1, "output": [2.0]}\n')
    outs = load_graph_traces(tmp_path)["graph_output"]
    assert [o["process"] for o in outs] == [f"op-g2:{os.getpid()}", "op-g2:424242"]


# --- exactly-once effects: each (client, request id) changes each stateful operator's state once ---

def _retried_trace():
    """A correct run with a retry: request c/r1 came again (a new origin); g1's and g2's
    states answered it from their tables (seq 2 applied nothing), so each applies it once."""
    streams = _trace()
    streams["graph_apply"] += [
        {"operator": "g1", "last_seq": 2, "epoch": 1, "lineage": [], "t": 3.0, "requests": [["1:c/r1", 1]]},
        {"operator": "g2", "last_seq": 2, "epoch": 1, "lineage": [], "t": 4.0, "requests": [["1:c/r1", 1]]}]
    return streams


def test_a_request_applied_once_per_operator_passes():
    result = _graph_results(_retried_trace())["graph_request_applied_once"]
    assert result.ok is True and result.checked == 4 and result.violations == 0, result.detail


def test_a_request_applied_twice_to_one_operators_state_fails():
    streams = _retried_trace()
    # g2's state applied the retry of c/r1 again, at seq 2: its state moved twice
    streams["graph_apply"].append({"operator": "g2", "last_seq": 3, "epoch": 1, "lineage": [], "t": 5.0,
                                   "requests": [["1:c/r1", 3]]})
    result = _graph_results(streams)["graph_request_applied_once"]
    assert result.ok is False and result.violations == 1
    assert result.examples == [{"operator": "g2", "request": "1:c/r1", "seqs": [1, 3]}]


def test_a_request_applied_again_above_a_takeovers_max_seq_is_not_twice():
    streams = _retried_trace()
    # g2's primary rolled back in place to seq 0: its state at seq 1-2 is gone, and c/r1 is applied again
    streams["graph_takeover"] = [{"operator": "g2", "epoch": 2, "max_seq": 0, "t": 4.5}]
    streams["graph_apply"].append({"operator": "g2", "last_seq": 1, "epoch": 2, "lineage": [], "t": 5.0,
                                   "requests": [["1:c/r1", 1]]})
    assert _graph_results(streams)["graph_request_applied_once"].ok is True
    # applied again before that takeover (at another seq), it contradicts the state it was in
    streams["graph_apply"][-1].update(t=4.2, requests=[["1:c/r1", 2]])
    assert _graph_results(streams)["graph_request_applied_once"].ok is False
