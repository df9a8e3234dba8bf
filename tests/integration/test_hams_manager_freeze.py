"""An operator never waits for the manager in its loop. GRU -> GRU with three manager
replicas, under open load: the replicas are SIGSTOPped for 3 s, and meanwhile g2's backup
is SIGKILLed, so g2's primary asks the manager to roll it back in place (a promote of
itself at a new epoch, Fig. 6) while no replica can answer. Through the freeze g2 answers
every status request and keeps heartbeating (its loop turns), holding the request as a
ROLLING_BACK primary; the other operators heartbeat too. Thawed, the manager decides, g2
goes on degraded at the new epoch, and every request is answered exactly once."""
from __future__ import annotations

import functools
import signal
import threading
import time

import numpy as np
import pytest
import zmq

from keel.chaos.graph_trials import TrialClient, gru_chain, open_load, start_graph
from keel.common import transport

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

FREEZE_S = 3.0


def test_a_frozen_manager_stalls_no_operator_loop_and_its_late_decision_is_acted_on(launcher, tmp_path):
    ctx = zmq.Context()
    managers, graph, run, by_name, client, probe = start_graph(launcher, tmp_path / "journal", gru_chain(), tmp_path / "trace", ctx)
    sock = TrialClient(client)  # keel.Client, keeping any second answer
    ask = functools.partial(transport.request_status, ctx=ctx)
    g1, g2 = (by_name[f"op-{op}"].config.status_endpoint for op in ("g1", "g2"))
    start = threading.Event()
    seen: dict[str, list] = {"g1": [], "g2": []}
    frozen = []

    def freeze_and_watch() -> None:
        start.wait(60)
        try:
            for i in range(len(managers.names)):
                managers.kill(i, signal.SIGSTOP)
                frozen.append(i)
            run.kill("op-g2-backup", signal.SIGKILL, wait=False)
            until = time.monotonic() + FREEZE_S
            while time.monotonic() < until:
                seen["g2"].append(ask(g2, 0.5))
                seen["g1"].append(ask(g1, 0.5))
                time.sleep(0.1)
        finally:
            for i in frozen:
                managers.kill(i, signal.SIGCONT)

    watcher = threading.Thread(target=freeze_and_watch, daemon=True)
    watcher.start()
    try:
        rng = np.random.default_rng(21)
        n = 200
        inputs, streams = rng.normal(size=(n, 4)), rng.integers(0, 4, size=n)
        replies = open_load(sock, inputs, streams, lambda i: start.set() if i == 60 else None, gap_s=0.01)
        watcher.join(30)
        after = run.wait_status(g2, lambda info: info.get("hams_role") == "degraded", timeout_s=30, ctx=ctx)
    finally:
        start.set()
        watcher.join(30)
        for i in frozen:  # never leave a stopped replica behind
            managers.kill(i, signal.SIGCONT)
        sock.close()
        run.stop()
        managers.close()
        managers.launcher.stop()
        ctx.destroy(linger=0)

    for op in ("g1", "g2"):  # every status asked during the freeze was answered: no loop waited on the manager
        assert len(seen[op]) >= 10 and all(info is not None for info in seen[op]), [i is None for i in seen[op]]
        beats = [info["heartbeats"] for info in seen[op]]
        assert beats[-1] - beats[0] >= 20, beats  # about one each 30 ms: heartbeats went on through the freeze
    roles = [info["hams_role"] for info in seen["g2"]]
    assert "rolling_back" in roles, roles  # the decision was asked and waited for in the loop
    asked = [info for info in seen["g2"] if info["hams_role"] == "rolling_back"]
    assert all(info["manager_requests"] == ["promote"] for info in asked), asked
    assert after["epoch"] > 1 and after["takeovers"] >= 1 and after["manager_requests"] == [], after
    assert len(replies) == n and all(len(r) == 1 for r in replies.values()), \
        {k: len(v) for k, v in replies.items() if len(v) != 1}  # each answered exactly once
    assert all(r[0].error is None for r in replies.values()), [r[0].error for r in replies.values() if r[0].error][:5]
