"""Hosts with real processes: kill, freeze, restart, partition, tbf, proxy, crash cleanup."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import orjson
import pytest

from keel.chaos.probes import median_rtt_ms, ping, wait_file, wait_until
from keel.chaos.proxy import DelayProxy
from keel.chaos.resources import alive, clean_stale, list_netns, proc_state
from keel.chaos.shuffle import Shuffle

MODES = [pytest.param(False, id="local"), pytest.param(True, id="netns", marks=pytest.mark.netns)]


def echo(cluster, host, name="echo"):
    ready = cluster.run_dir / f"{name}.ready"
    ready.unlink(missing_ok=True)
    proc = cluster.spawn(host, [sys.executable, "-m", "keel.chaos.probes", "echo", "--bind", cluster.host(host).address,
                                "--ready", str(ready), "--max-s", "60"], name)
    got = wait_file(ready, 10.0, alive=proc.running)
    assert got, f"echo did not start: {proc.log.read_text()}"
    return proc, got["port"]


@pytest.mark.parametrize("netns", MODES)
def test_kill_freeze_restart_act_on_every_process_of_a_host(clusters, netns):
    cluster = clusters(netns=netns)
    _, port = echo(cluster, "b")
    cluster.spawn("b", [sys.executable, "-m", "keel.chaos.probes", "sleep", "--max-s", "60"], "sleeper")
    conn = cluster.connect("a", cluster.host("b").address, port)
    assert ping(conn, 2.0) is not None

    frozen = cluster.freeze_host("b")
    assert len(frozen) == 2 and wait_until(lambda: all(proc_state(p) == "T" for p in frozen), 2.0)
    assert ping(conn, 0.2) is None
    cluster.thaw_host("b")
    assert ping(conn, 2.0) is not None

    killed = cluster.kill_host("b")
    assert sorted(killed) == sorted(frozen) and not any(alive(p) for p in killed)
    assert ping(conn, 2.0) is None  # the client sees the failure
    assert cluster.processes("b") == []

    (cluster.run_dir / "echo.ready").unlink()
    started = cluster.restart_host("b")
    assert [p.name for p in started] == ["echo", "sleeper"]
    port = wait_file(cluster.run_dir / "echo.ready", 10.0)["port"]
    assert ping(cluster.connect("a", cluster.host("b").address, port), 2.0) is not None


@pytest.mark.parametrize("netns", MODES)
def test_delay_proxy_adds_the_configured_round_trip(clusters, netns):
    cluster = clusters(hosts=("a", "b"), netns=netns)
    _, port = echo(cluster, "b")
    b = cluster.host("b").address
    proxy = DelayProxy(cluster, "b", [(b, 0, b, port)]).start()
    conn = cluster.connect("a", b, proxy.ports[0])
    base = median_rtt_ms(conn, n=10)
    proxy.set_delay(15.0)
    delayed = median_rtt_ms(conn, n=10)  # the same connection: delay changes without reconnecting
    assert 12.0 < delayed - base < 19.0
    proxy.set_delay(0.0)
    assert median_rtt_ms(conn, n=10) < base + 3.0


def test_local_mode_refuses_link_faults_instead_of_faking_them(clusters):
    from keel.chaos.hosts import Unsupported

    cluster = clusters(hosts=("a", "b"), netns=False)
    for fault in (lambda: cluster.partition("a"), lambda: cluster.set_link_limit("a", 100)):
        with pytest.raises(Unsupported, match="netns"):
            fault()


@pytest.mark.netns
def test_partition_stops_traffic_and_heal_resumes_it(clusters):
    cluster = clusters(netns=True)
    _, port = echo(cluster, "b")
    conn = cluster.connect("a", cluster.host("b").address, port)
    assert ping(conn, 2.0) is not None
    cluster.partition("b")
    assert ping(conn, 0.3) is None
    with pytest.raises(OSError):
        cluster.connect("c", cluster.host("b").address, port, timeout=0.3)
    cluster.heal("b")
    assert ping(conn, 10.0) is not None


@pytest.mark.netns
def test_a_shuffle_runs_at_the_tbf_link_rate(clusters):
    cluster = clusters(hosts=("a", "b"), netns=True, link_mbit=400)
    assert "tbf" in cluster.network.qdiscs("a") and "400Mbit" in cluster.network.qdiscs("a")
    res = Shuffle(cluster, "a", "b", 24 << 20).start().wait(20.0)
    assert res.ok and abs(res.mbps - 400) < 0.15 * 400, res


CRASHER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from keel.chaos.hosts import Cluster
    c = Cluster(["a", "b"], run_dir=Path(sys.argv[1]), netns=sys.argv[2] == "1", clean=False)
    p = c.spawn("b", [sys.executable, "-m", "keel.chaos.probes", "sleep", "--max-s", "60"], "sleeper")
    print(__import__("json").dumps({"pid": p.pid, "state": str(c.registry.path),
                                    "ns": list(c.network.made) if c.network else []}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)   # crash: no cleanup runs
""")


@pytest.mark.parametrize("netns", MODES)
def test_leftovers_of_a_crashed_run_are_found_and_removed(tmp_path, netns):
    out = subprocess.run([sys.executable, "-c", CRASHER, str(tmp_path), "1" if netns else "0"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == -signal.SIGKILL, out.stderr
    left = orjson.loads(out.stdout.strip().splitlines()[-1])
    assert alive(left["pid"]) and os.path.exists(left["state"])
    assert set(left["ns"]) <= set(list_netns())
    done = clean_stale()
    assert any("stale run" in line for line in done)
    assert wait_until(lambda: not alive(left["pid"]), 5.0)
    assert not os.path.exists(left["state"])
    assert not set(left["ns"]) & set(list_netns())
