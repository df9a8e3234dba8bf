"""``keel chaos selftest``: prove the harness does what it claims on this machine.

Builds three hosts (a, b, c) with tiny processes of its own (TCP echo servers and a
sleeper, not Keel services) and checks, each by measurement:

- ``kill_host_ok``   a killed host's processes are gone, a client's connection fails,
                     and ``restart`` brings the service back (``restart_ok``)
- ``freeze_ok``      a frozen host's processes are stopped (state T) and answer nothing;
                     after the thaw they answer again
- ``partition_ok``   (netns) no traffic while the link is down; the same TCP connection
                     carries traffic again after the heal
- ``shuffle_mbps``   (netns) a shuffle's measured rate is within ``tolerance`` of the
                     tbf limit ``link_limit_mbps``
- ``delay_added_ms`` extra round-trip time through the delay proxy against the
                     configured ``delay_configured_ms``
- ``cleanup_ok``     nothing the self-test made is left afterwards

In local mode the checks that need namespaces are ``null`` with the reason under
``skipped``: they are never faked.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from keel.chaos.hosts import Cluster
from keel.chaos.probes import median_rtt_ms, ping, wait_file, wait_until
from keel.chaos.proxy import DelayProxy
from keel.chaos.resources import clean_stale, proc_state
from keel.chaos.shuffle import Shuffle

BUDGET_S = 90.0


def _echo(cluster: Cluster, host: str, name: str) -> tuple[object, int]:
    ready = cluster.run_dir / f"{name}.ready"
    ready.unlink(missing_ok=True)
    proc = cluster.spawn(host, [sys.executable, "-m", "keel.chaos.probes", "echo", "--bind", cluster.host(host).address,
                                "--port", "0", "--ready", str(ready), "--max-s", str(BUDGET_S)], name)
    got = wait_file(ready, 15.0, alive=proc.running)
    if got is None:
        raise RuntimeError(f"echo server {name} on {host} did not start; see {proc.log}")
    return proc, got["port"]


def _connect_fails(cluster: Cluster, host: str, address: str, port: int, timeout: float) -> bool:
    try:
        cluster.connect(host, address, port, timeout=timeout).close()
    except OSError:
        return True
    return False


def run_selftest(local: bool = False, link_mbit: float = 500.0, shuffle_mb: float = 64.0, delay_ms: float = 20.0,
                 jitter_ms: float = 2.0, tolerance: float = 0.15, run_dir: Path | None = None) -> dict:
    """Run every check; returns the report dict (``ok`` is the verdict)."""
    t_start = time.monotonic()
    tmp = run_dir is None
    run_dir = Path(run_dir or tempfile.mkdtemp(prefix="keel-chaos-selftest-"))
    out: dict = {"netns": False, "mode": None, "skipped": {}, "errors": {}, "stale_cleaned": clean_stale()}
    cluster = Cluster(["a", "b", "c"], run_dir=run_dir, netns=False if local else "auto",
                      link_mbit=None if local else link_mbit, clean=False)
    out.update(netns=cluster.netns, mode=cluster.mode, netns_reason=cluster.netns_reason, hosts=cluster.addresses)
    addr = cluster.addresses

    def check(name: str, fn) -> None:
        try:
            fn()
        except Exception as exc:  # one broken check must not hide the others
            out[name] = False
            out["errors"][name] = f"{type(exc).__name__}: {exc}"

    try:
        ports = {"b": _echo(cluster, "b", "echo-b")[1], "c": _echo(cluster, "c", "echo-c")[1]}
        cluster.spawn("c", [sys.executable, "-m", "keel.chaos.probes", "sleep", "--max-s", str(BUDGET_S)], "sleeper-c")
        direct = cluster.connect("a", addr["b"], ports["b"])
        out["rtt_direct_ms"] = median_rtt_ms(direct)

        def kill() -> None:
            conn = cluster.connect("a", addr["b"], ports["b"])
            before = ping(conn, 2.0) is not None
            pids = cluster.kill_host("b")
            gone = not any(proc_state(p) not in (None, "Z") for p in pids)
            client_failed = ping(conn, 2.0) is None and _connect_fails(cluster, "a", addr["b"], ports["b"], 1.0)
            out["kill_host_detail"] = {"pids": pids, "gone": gone, "client_saw_failure": client_failed}
            out["kill_host_ok"] = before and bool(pids) and gone and client_failed
            (run_dir / "echo-b.ready").unlink(missing_ok=True)
            cluster.restart_host("b")
            got = wait_file(run_dir / "echo-b.ready", 15.0)
            ports["b"] = got["port"] if got else ports["b"]
            out["restart_ok"] = got is not None and ping(cluster.connect("a", addr["b"], ports["b"]), 2.0) is not None

        def freeze() -> None:
            conn = cluster.connect("a", addr["c"], ports["c"])
            before = ping(conn, 2.0) is not None
            pids = cluster.freeze_host("c")
            stopped = bool(wait_until(lambda: all(proc_state(p) == "T" for p in pids), 2.0))
            silent = ping(conn, 0.3) is None
            cluster.thaw_host("c")
            back = ping(conn, 3.0) is not None
            out["freeze_detail"] = {"pids": pids, "stopped": stopped, "silent_while_frozen": silent, "answers_after_thaw": back}
            out["freeze_ok"] = before and stopped and silent and back

        def partition() -> None:
            if not cluster.netns:
                out["partition_ok"] = None
                out["skipped"]["partition_ok"] = f"needs netns mode ({cluster.netns_reason})"
                return
            conn = cluster.connect("a", addr["b"], ports["b"])
            before = ping(conn, 2.0) is not None
            cluster.partition("b")
            try:
                silent = ping(conn, 0.5) is None and _connect_fails(cluster, "a", addr["b"], ports["b"], 0.5)
            finally:
                cluster.heal("b")
            t0 = time.monotonic()
            back = ping(conn, 10.0) is not None  # TCP retransmits what the cut link dropped
            out["partition_detail"] = {"silent_while_partitioned": silent, "resumed_after_heal": back,
                                       "resume_s": round(time.monotonic() - t0, 3)}
            out["partition_ok"] = before and silent and back

        def shuffle() -> None:
            res = Shuffle(cluster, "a", "c", int(shuffle_mb * (1 << 20)), max_s=30.0).start().wait(30.0)
            out["shuffle_mbps"] = round(res.mbps, 1)
            out["shuffle_detail"] = res.to_dict()
            if not cluster.netns:
                out["link_limit_mbps"] = None
                out["skipped"]["link_limit_mbps"] = f"tbf needs netns mode ({cluster.netns_reason}); loopback is unlimited"
                out["shuffle_ok"] = res.ok
                return
            out["link_limit_mbps"] = link_mbit
            out["shuffle_ok"] = res.ok and abs(res.mbps - link_mbit) <= tolerance * link_mbit

        def delay() -> None:
            proxy = DelayProxy(cluster, "b", [(addr["b"], 0, addr["b"], ports["b"])], seed=1).start()
            try:
                conn = cluster.connect("a", addr["b"], proxy.ports[0])
                base = median_rtt_ms(conn)
                proxy.set_delay(delay_ms, jitter_ms)
                delayed = median_rtt_ms(conn, n=30)
            finally:
                proxy.stop()
            direct_now = median_rtt_ms(cluster.connect("a", addr["b"], ports["b"]))
            out["delay_configured_ms"] = delay_ms
            out["delay_jitter_ms"] = jitter_ms
            out["proxy_overhead_ms"] = round(base - direct_now, 3)
            out["delay_added_ms"] = round(delayed - direct_now, 3)
            out["delay_ok"] = abs(out["delay_added_ms"] - delay_ms) <= max(3.0, tolerance * delay_ms)

        for name, fn in (("kill_host_ok", kill), ("freeze_ok", freeze), ("partition_ok", partition),
                         ("shuffle_ok", shuffle), ("delay_ok", delay)):
            check(name, fn)
    finally:
        cluster.close()
        left = cluster.leftovers()
        out["leftovers"] = left
        out["cleanup_ok"] = not left and not cluster.registry.path.exists()
        if tmp:
            shutil.rmtree(run_dir, ignore_errors=True)
    out["duration_s"] = round(time.monotonic() - t_start, 2)
    verdicts = [out.get(k) for k in ("kill_host_ok", "restart_ok", "freeze_ok", "partition_ok", "shuffle_ok",
                                     "delay_ok", "cleanup_ok")]
    out["ok"] = all(v is not False for v in verdicts) and not out["errors"] and out["duration_s"] < BUDGET_S
    return out
