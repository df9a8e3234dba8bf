"""``keel bench manager``: the Raft manager's commit latency and leader failover, on loopback.

Three replicas run as real processes (``keel serve manager``, journals in a temporary
directory). The benchmark measures

* commit latency: a client's compare-and-set ``promote`` round trip, from sending it to
  the leader until the applied result comes back (``commit_p50_ms``, ``commit_p99_ms``);
* failover: SIGKILL of the leader, then decisions sent to the survivors until one is
  applied; the time from the kill to that first committed decision, per trial (the killed
  replica is restarted from its journal and catches up before the next trial);
* at the end, whether every replica holds the same state (``replicas_equal``).

Targets: commit p50 <= 2 ms; failover median <= 0.5 s, max <= 1 s.

Example
-------
::

    keel bench manager --json runs/bench-manager.json [--quick]
"""
from __future__ import annotations

import signal
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from keel.common.control import ManagerClient
from keel.deploy.local import Launcher
from keel.deploy.manager_group import LocalGroup

LIMITS = {"commit_p50_ms": 2.0, "failover_median_s": 0.5, "failover_max_s": 1.0}
#: the printed table and its targets (keel bench)
FIGURES = ("commit_p50_ms", "commit_p99_ms", "failover_median_s", "failover_max_s", "trials", "replicas_equal")
TARGETS = {k: f"<= {v}" for k, v in LIMITS.items()}


def _promote(client: ManagerClient, expected: int, name: str, timeout_s: float) -> dict:
    """One compare-and-set. An attempt whose answer was lost (the leader changed under it)
    and that was applied after all comes back ``stale`` naming ``name`` at the next epoch:
    that is this decision, committed."""
    result = client.call("promote", {"group": "dispatcher/bench", "name": name, "expected_epoch": expected,
                                     "reason": "bench"}, timeout_s=timeout_s)
    if result["status"] == "stale" and result.get("holder") == name and result.get("epoch", 0) > expected:
        return {**result, "status": "ok", "retried": True}
    return result


def measure_commits(group: LocalGroup, n: int) -> tuple[list[float], int]:
    """Round trips of ``n`` compare-and-set decisions at the leader (s); the last epoch."""
    client = group.client(attempt_s=1.0)
    epoch = client.call("snapshot")["groups"]["dispatcher/bench"]["epoch"]
    times = []
    for i in range(n):
        start = time.perf_counter()
        result = _promote(client, epoch, f"b{i % 2 + 1}", timeout_s=5.0)
        times.append(time.perf_counter() - start)
        if result["status"] != "ok":
            raise RuntimeError(f"promote at the leader was not applied: {result}")
        epoch = result["epoch"]
    client.close()
    return times, epoch


def failover_trial(group: LocalGroup, epoch: int) -> tuple[float, int]:
    """SIGKILL the leader; seconds until a decision is committed by a new one; new epoch."""
    old = group.leader()
    survivors = [e for i, e in enumerate(group.endpoints) if i != old]
    client = ManagerClient(survivors, attempt_s=0.05)
    killed = time.monotonic()
    group.kill(old, signal.SIGKILL)
    result = _promote(client, epoch, "b1" if epoch % 2 else "b2", timeout_s=10.0)
    took = time.monotonic() - killed
    client.close()
    if result["status"] != "ok":
        raise RuntimeError(f"first decision after failover not applied: {result}")
    group.start(old)
    if not group.wait_equal(timeout_s=20.0):
        raise RuntimeError("the restarted replica did not catch up")
    return took, result["epoch"]


def run(args, log=print) -> dict:
    quick = args.quick
    commits, trials = (200, 5) if quick else (1000, 20)
    with tempfile.TemporaryDirectory(prefix="keel-bench-manager-") as tmp, Launcher(Path(tmp) / "logs") as launcher:
        group = LocalGroup(launcher, Path(tmp) / "journal")
        group.start()
        leader = group.leader(timeout_s=20.0)
        client = group.client(attempt_s=1.0)
        for name in ("b1", "b2"):
            client.call("register", {"name": name, "group": "dispatcher/bench", "host": "local", "endpoints": {}})
        # warm-up, then the measured decisions
        measure_commits(group, 20)
        times, epoch = measure_commits(group, commits)
        failovers = []
        for t in range(trials):
            took, epoch = failover_trial(group, epoch)
            failovers.append(took)
            log(f"  failover trial {t + 1}/{trials}: {took * 1000:.0f} ms")
        client.close()
        equal = group.wait_equal(timeout_s=10.0)
        snaps = group.snapshots()
        group.close()
        ms = np.array(times) * 1000
        result = {
            "commit_p50_ms": float(np.percentile(ms, 50)), "commit_p99_ms": float(np.percentile(ms, 99)),
            "commit_mean_ms": float(ms.mean()), "commits": commits,
            "failover_median_s": float(statistics.median(failovers)), "failover_max_s": float(max(failovers)),
            "failover_min_s": float(min(failovers)), "failovers_s": failovers, "trials": trials,
            "replicas_equal": bool(equal), "final_seq": [s["seq"] if s else None for s in snaps],
            "first_leader": group.endpoints[leader], "targets": LIMITS, "quick": quick,
        }
    return result


def passed(report: dict) -> bool:
    return report["replicas_equal"]
