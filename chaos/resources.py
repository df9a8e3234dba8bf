"""What a chaos run has made, written down so that a crashed run can be cleaned later.

Every run owns a ``Registry``: a JSON state file under ``STATE_DIR`` naming the run's
owner (pid and its start time), the network namespaces it created and every process it
started (pid, start time, process group). The registry is rewritten on every change,
so a run killed with SIGKILL leaves an accurate list behind. ``clean_stale`` (called
at the start of every run and by ``keel chaos clean``) removes what belongs to runs
whose owner is gone, and any namespace carrying our prefix that no live run claims.

A process is only ever signalled when its pid still has the start time we recorded,
so a recycled pid is never hit.

Example
-------
>>> reg = Registry.create()                       # doctest: +SKIP
>>> reg.add_proc(popen.pid)                        # doctest: +SKIP
>>> reg.close()                                    # doctest: +SKIP
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from keel.common.waiting import wait_until

#: where run state files live (override with KEEL_CHAOS_STATE)
STATE_DIR = Path(os.environ.get("KEEL_CHAOS_STATE", f"/tmp/keel-chaos-state-{os.getuid()}"))
#: every namespace the harness creates is named NS_PREFIX + run id + "-" + host
NS_PREFIX = "keelchaos-"


class ChaosError(RuntimeError):
    """The harness could not build, change or tear down part of an experiment."""


def run(cmd: list[str], check: bool = True, timeout: float = 10.0) -> subprocess.CompletedProcess:
    """Run a short system command (ip, tc); a failure names the command and its stderr."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise ChaosError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def proc_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: fields follow the last ')'
    fields = stat[stat.rindex(b")") + 2:].split()
    return int(fields[19])


def proc_state(pid: int) -> str | None:
    """One-letter state of ``pid`` ("R", "S", "T" stopped, "Z" zombie...), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()[0].decode()


def alive(pid: int, start: int | None = None) -> bool:
    """``pid`` exists, is not a zombie, and (if given) still has start time ``start``."""
    state = proc_state(pid)
    if state is None or state in ("Z", "X"):
        return False
    return start is None or proc_start_time(pid) == start


def signal_group(pid: int, start: int | None, sig: int) -> bool:
    """Send ``sig`` to the process group led by ``pid`` if ``pid`` is still ours."""
    if not alive(pid, start):
        return False
    try:
        os.killpg(pid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        os.kill(pid, sig)
        return True


def have_netns() -> tuple[bool, str]:
    """Whether hosts can be network namespaces here, and why not if they cannot."""
    if os.geteuid() != 0:
        return False, "not root: network namespaces need CAP_SYS_ADMIN"
    for tool in ("ip", "tc"):
        if not any(Path(d, tool).exists() for d in os.environ.get("PATH", "/usr/sbin:/sbin").split(":") + ["/usr/sbin", "/sbin"]):
            return False, f"no `{tool}` command (iproute2)"
    probe = f"{NS_PREFIX}probe{os.getpid()}"
    try:
        made = run(["ip", "netns", "add", probe], check=False)
        if made.returncode != 0:
            return False, f"`ip netns add` failed: {made.stderr.strip()}"
    finally:
        run(["ip", "netns", "del", probe], check=False)
    return True, "root with ip netns"


def list_netns() -> list[str]:
    out = run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_pids(ns: str) -> list[int]:
    out = run(["ip", "netns", "pids", ns], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def delete_netns(ns: str) -> None:
    """Kill every process inside ``ns`` (all are ours: we made it), then delete it."""
    for _ in range(3):
        pids = netns_pids(ns)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _wait_gone(pids, 2.0)
    run(["ip", "netns", "del", ns], check=False)


def _wait_gone(pids: list[int], timeout: float) -> bool:
    return wait_until(lambda: not any(alive(p) for p in pids), timeout, interval_s=0.02)


@dataclass
class Registry:
    """The state file of one run: owner, namespaces, processes. Thread-safe."""

    run_id: str
    path: Path
    namespaces: list[str] = field(default_factory=list)
    procs: dict[int, int | None] = field(default_factory=dict)  # pid -> start time
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def create(cls, state_dir: Path | None = None) -> Registry:
        state_dir = Path(state_dir or STATE_DIR)
        state_dir.mkdir(parents=True, exist_ok=True)
        run_id = secrets.token_hex(3)
        reg = cls(run_id, state_dir / f"{run_id}.json")
        reg._write()
        return reg

    def ns_name(self, host: str) -> str:
        return f"{NS_PREFIX}{self.run_id}-{host}"

    def add_netns(self, ns: str) -> None:
        with self.lock:
            self.namespaces.append(ns)
            self._write()

    def remove_netns(self, ns: str) -> None:
        with self.lock:
            if ns in self.namespaces:
                self.namespaces.remove(ns)
            self._write()

    def add_proc(self, pid: int) -> None:
        with self.lock:
            self.procs[pid] = proc_start_time(pid)
            self._write()

    def remove_proc(self, pid: int) -> None:
        with self.lock:
            self.procs.pop(pid, None)
            self._write()

    def _write(self) -> None:
        state = {"run_id": self.run_id, "owner": os.getpid(), "owner_start": proc_start_time(os.getpid()),
                 "namespaces": self.namespaces, "procs": [[p, s] for p, s in self.procs.items()], "written": time.time()}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(state))
        tmp.replace(self.path)

    def close(self) -> None:
        """Forget the run: only call once everything it names is gone."""
        self.path.unlink(missing_ok=True)


def _owner_alive(state: dict) -> bool:
    return alive(int(state.get("owner", 0)), state.get("owner_start"))


def release(state: dict) -> list[str]:
    """Remove what ``state`` names: kill its processes, delete its namespaces."""
    done = []
    pids = []
    for pid, start in state.get("procs", []):
        if signal_group(pid, start, signal.SIGCONT):
            signal_group(pid, start, signal.SIGKILL)
            pids.append(pid)
            done.append(f"killed process group {pid}")
    _wait_gone(pids, 2.0)
    have_ns = set(list_netns()) if state.get("namespaces") else set()
    for ns in state.get("namespaces", []):
        if ns in have_ns:
            delete_netns(ns)
            done.append(f"deleted netns {ns}")
    return done


def clean_stale(state_dir: Path | None = None) -> list[str]:
    """Clean leftovers of crashed runs; live runs are left alone. Returns what was done."""
    state_dir = Path(state_dir or STATE_DIR)
    done: list[str] = []
    live_ids: set[str] = set()
    if state_dir.exists():
        for path in sorted(state_dir.glob("*.json")):
            try:
                state = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                path.unlink(missing_ok=True)
                continue
            if _owner_alive(state):
                live_ids.add(state["run_id"])
                continue
            done.append(f"stale run {state.get('run_id')} (owner {state.get('owner')} gone)")
            done += release(state)
            path.unlink(missing_ok=True)
        for tmp in state_dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
    if have_netns()[0]:
        for ns in list_netns():
            run_id = ns[len(NS_PREFIX):].split("-")[0]
            if ns.startswith(NS_PREFIX) and not run_id.startswith("probe") and run_id not in live_ids:
                delete_netns(ns)
                done.append(f"deleted orphan netns {ns}")
    return done


def leftovers(reg: Registry) -> list[str]:
    """What of ``reg``'s run still exists (empty when cleanup was complete)."""
    left = [f"process {p}" for p, s in reg.procs.items() if alive(p, s)]
    if os.geteuid() == 0:
        left += [f"netns {ns}" for ns in list_netns() if ns.startswith(f"{NS_PREFIX}{reg.run_id}-")]
    if reg.path.exists():
        left.append(f"state file {reg.path}")
    return left
