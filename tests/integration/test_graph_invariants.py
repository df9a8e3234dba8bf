"""A fault-free run of a stateful graph (GRU -> GRU, NSPB, W=2) with traces on passes the
HAMS invariants of the chaos checker; a doctored trace fails each of them."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from keel.chaos.invariants import CheckContext, Checker, graph_invariants, load_graph_traces
from tests.support.graphs import ask, gru_chain, start

pytestmark = pytest.mark.timeout(120)


def test_fault_free_run_passes_graph_invariants(launcher, zsock, tmp_path):
    table = dict(gru_chain(max_batch=4), window=2, trace_dir=str(tmp_path))
    run = launcher("trace")
    graph, _, client = start(run, table)
    rng = np.random.default_rng(7)
    ask(zsock, client, rng.normal(size=(100, 4)), rng.integers(0, 4, size=100))
    run.stop()  # flushes and closes the traces
    streams = load_graph_traces(str(tmp_path))
    assert len(streams["graph_release"]) == 100 and len(streams["graph_output"]) == 200
    checker = Checker(graph_invariants(graph.stateful))
    results = checker.run([], CheckContext(streams=streams))
    assert all(r.ok for r in results), [r.to_dict() for r in results]
    assert all(r.checked > 0 for r in results)

    # each invariant can fail: a release before its apply, an apply before its dependency, two outputs for one seq,
    # two processes numbering at one (operator, epoch), one request applied at two seqs of g1's state
    bad = copy.deepcopy(streams)
    bad["graph_release"][0]["t"] = -1.0
    g2 = [a for a in bad["graph_apply"] if a["operator"] == "g2"]
    g2[0]["t"] = -1.0
    bad["graph_output"].append(dict(bad["graph_output"][0], output=[9.0] * len(bad["graph_output"][0]["output"]),
                                    process="op-g1-backup:1"))
    g1 = [a for a in bad["graph_apply"] if a["operator"] == "g1" and a["requests"]]
    key, seq = g1[0]["requests"][0]
    g1[-1]["requests"].append([key, seq + 1000])
    assert [r.ok for r in checker.run([], CheckContext(streams=bad))] == [False, False, False, False, False]
