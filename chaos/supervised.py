"""A chaos host whose services run under supervisord, as ``keel up`` runs them, and the
``crash`` fault: SIGKILL one service there and let supervisord bring it back.

An experiment names such hosts in ``supervised = ["d1"]``: the harness renders that host's
part of the spec with ``deploy.supervisor.render`` (the program settings ``keel up``
writes: autorestart, startsecs, ...) and runs ``supervisord -n`` on the host, so what
restarts a crashed service is the real process manager, not the harness. A crash fault::

    [[faults]]
    at_s = 3.0
    kind = "crash"
    host = "d1"
    service = "dispatcher"

``restart_figures`` reads, for each crash, what the processes logged: supervisord's
"spawned" line, the new process's "started" line and the dispatcher's "worker registered"
lines; ``augment`` adds them to the report as ``restart`` (per crash: seconds from the
kill to the new process spawned, to its loop started, to every worker registered again;
and the median of the last). ``chaos/experiments/dispatcher_kill.toml`` measures a
dispatcher's restart under load this way.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from keel.chaos.resources import ChaosError, alive
from keel.common.waiting import wait_until


class SupervisedHost:
    """supervisord on one chaos host, running that host's services of a spec."""

    def __init__(self, cluster: Any, host: str, spec: Any, launches: list[Any]):
        from keel.deploy.supervisor import render

        self.cluster, self.host = cluster, host
        self.run_dir = (cluster.run_dir / "supervised" / host).absolute()
        self.spec = dataclasses.replace(spec, run_dir=str(self.run_dir), services=list(launches))
        self.conf = render(self.spec)
        self.names = [svc.name for svc in launches]
        #: every pid supervisord ran a program with, for cleanup (its programs have process groups of their own)
        self.pids: set[int] = set()
        self.proc = None

    def start(self, timeout_s: float = 30.0) -> SupervisedHost:
        supervisord = Path(sys.executable).parent / "supervisord"
        command = [str(supervisord)] if supervisord.exists() else [sys.executable, "-m", "supervisor.supervisord"]
        self.proc = self.cluster.spawn(self.host, [*command, "-n", "-c", str(self.conf)], f"supervisord-{self.host}",
                                       kind="service")
        if not wait_until(lambda: all(self.pid(n) for n in self.names), timeout_s, interval_s=0.05):
            raise ChaosError(f"supervisord on {self.host} did not start {self.names}; see {self.run_dir}")
        return self

    def _rpc(self) -> Any:
        from keel.deploy.supervisor import rpc

        return rpc(self.run_dir).supervisor

    def pid(self, name: str) -> int | None:
        """The pid of program ``name`` now, if it runs."""
        try:
            pid = int(self._rpc().getProcessInfo(name)["pid"])
        except (OSError, Exception):  # the socket not yet open, or supervisord gone
            return None
        if pid:
            self._remember(pid)
        return pid or None

    def _remember(self, pid: int) -> None:
        if pid not in self.pids:
            self.pids.add(pid)
            self.cluster.registry.add_proc(pid)

    def crash(self, name: str) -> dict:
        """SIGKILL program ``name`` (nothing else): supervisord sees it die and restarts it."""
        if name not in self.names:
            raise ChaosError(f"no service {name!r} under supervisord on {self.host}; there: {self.names}")
        pid = self.serving(name)
        if pid is None:
            raise ChaosError(f"{name} on {self.host} is not running")
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)
        return {"service": name, "pid": pid, "t_kill": t_kill}

    def serving(self, name: str) -> int | None:
        """The pid of the process that serves ``name``: with a hot spare (``spare = true``),
        whichever of the two holds the lock, else the program's."""
        from keel.deploy.programs import SPARE, spare_lock
        from keel.services.serve import lock_holder

        own = self.pid(name)
        if name + SPARE not in self._all_programs():
            return own
        holder = lock_holder(str(spare_lock(self.run_dir, name)))
        return holder if holder is not None and holder in (own, self.pid(name + SPARE)) else own

    def _all_programs(self) -> list[str]:
        try:
            return [info["name"] for info in self._rpc().getAllProcessInfo()]
        except Exception:  # supervisord gone
            return []

    def close(self) -> None:
        """Stop supervisord and its programs (the cluster's close then finds nothing left)."""
        if self.proc is not None and self.proc.running():
            self.cluster.stop(self.proc, grace_s=8.0)  # supervisord stops its programs first
        for pid in self.pids:
            if alive(pid, self.cluster.registry.procs.get(pid)):  # a program supervisord had no time to stop
                os.kill(pid, signal.SIGKILL)
            self.cluster.registry.remove_proc(pid)

    def log_path(self, name: str) -> Path:
        return self.run_dir / "logs" / f"{name}.log"


# --------------------------------------------------------------------------- figures


def _log_lines(path: Path) -> list[dict]:
    out = []
    if not path.exists():
        return out
    for line in path.read_bytes().splitlines():
        if line.startswith(b"{"):
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(entry, dict) and "timestamp" in entry:
                entry["t"] = datetime.datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()
                out.append(entry)
    return out


def _spawned(supervisord_log: Path, name: str) -> list[float]:
    """Wall times of supervisord's "spawned: 'NAME'" lines (its log is in local time, ms)."""
    out = []
    if supervisord_log.exists():
        for line in supervisord_log.read_text(errors="replace").splitlines():
            if f"spawned: '{name}'" in line:
                stamp = line[:23]  # 2026-12-01 20:01:02,345
                try:
                    out.append(datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp())
                except ValueError:
                    continue
    return out


def restart_figures(crash: dict, run_dir: Path, workers: list[str]) -> dict:
    """For one crash of a dispatcher: seconds from the kill to supervisord's spawn of the
    new process, to its loop started, to each worker's registration with it, and to every
    worker registered (None where it never happened before the run ended)."""
    t_kill, name = crash["t_kill"], crash["service"]
    spawned = sorted(t for n in (name, name + "-spare") for t in _spawned(run_dir / "supervisord.log", n)
                     if t >= t_kill - 0.002)
    # with a hot spare the next process to serve is the spare, which logs in its own file
    lines = sorted((e for log in (f"{name}.log", f"{name}-spare.log") for e in _log_lines(run_dir / "logs" / log)
                    if e["t"] >= t_kill), key=lambda e: e["t"])
    started = next((e["t"] for e in lines if e.get("event") == "started"), None)
    registered: dict[str, float] = {}
    for e in lines:
        if e.get("event") == "worker registered" and e.get("worker") in workers:
            registered.setdefault(e["worker"], e["t"])
    every = max(registered.values()) if len(registered) == len(workers) and workers else None

    def since(t: float | None) -> float | None:
        return None if t is None else round(t - t_kill, 4)

    return {"service": name, "pid": crash["pid"], "t_kill": t_kill, "spawned_s": since(spawned[0] if spawned else None),
            "started_s": since(started), "registered_s": {w: since(t) for w, t in sorted(registered.items())},
            "all_registered_s": since(every)}


def augment(exp: Any, report: dict, json_path: Path, out_dir: Path) -> dict:
    """Add ``restart`` to the report (and its JSON): the figures of every crash fault."""
    from keel.chaos import report as rep
    from keel.common.spec import load_spec

    spec = load_spec(exp.cluster)
    workers = [s.name for s in spec.role("worker")]
    per_mode: dict[str, Any] = {}
    for event in report["faults"]:
        if event["kind"] != "crash" or not event.get("ok") or not isinstance(event.get("crash"), dict):
            continue
        run_dir = Path(out_dir) / event["mode"] / "supervised" / event["host"]
        per_mode.setdefault(event["mode"], []).append(restart_figures(event["crash"], run_dir, workers))
    summary = {}
    for mode, crashes in per_mode.items():
        done = [c["all_registered_s"] for c in crashes if c["all_registered_s"] is not None]
        summary[mode] = {"crashes": crashes, "kills": len(crashes), "all_registered": len(done),
                         "median_all_registered_s": round(statistics.median(done), 4) if done else None,
                         "median_spawned_s": _median([c["spawned_s"] for c in crashes]),
                         "median_started_s": _median([c["started_s"] for c in crashes])}
    report["restart"] = summary
    rep.write_json(Path(json_path), report)
    return summary


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 4) if known else None


def print_summary(summary: dict) -> None:
    for mode, s in summary.items():
        for c in s["crashes"]:
            print(f"{mode:10s} crash of {c['service']} (pid {c['pid']}): spawned {c['spawned_s']} s, "
                  f"started {c['started_s']} s, every worker registered {c['all_registered_s']} s")
        print(f"{mode:10s} kill -> every worker registered again: median {s['median_all_registered_s']} s "
              f"over {s['all_registered']}/{s['kills']} kills (spawned {s['median_spawned_s']} s, "
              f"started {s['median_started_s']} s)")
