"""CPU time per request of each process on the request path, split by thread: what the
breakdown's in-flight parts cannot show on a machine with fewer cores than the path has
threads.

On two cores, the processes of the path (client, frontend, dispatcher, workers) and each
one's ZeroMQ I/O thread take turns: a hop's in-flight time includes waiting for a core
that another process's work after its own send still holds. So the CPU every process spends
per request, on or off the critical path, weighs on latency; the floor chain's figure
beside Keel's says how much of it Keel adds. Read from ``/proc/PID/task/*/stat`` (Linux),
so it counts every thread, whatever it runs (Python, ZeroMQ, the kernel on its behalf).

Example
-------
>>> import os
>>> sorted(thread_cpu(os.getpid()))
['main', 'other', 'zmq']
"""
from __future__ import annotations

import glob
import os

_TICK = os.sysconf("SC_CLK_TCK")
KINDS = ("main", "zmq", "other")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of ``pid``'s threads so far: its main thread, ZeroMQ's
    background threads (``ZMQbg/...``: I/O and reaper), and the rest (executors, metrics)."""
    out = dict.fromkeys(KINDS, 0.0)
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(f"{task}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        seconds = (int(fields[11]) + int(fields[12])) / _TICK
        kind = "main" if task.endswith(f"/{pid}") else "zmq" if name.startswith("ZMQbg") else "other"
        out[kind] += seconds
    return out


class CPUMeter:
    """CPU per request of named processes between ``start()`` and ``stop(requests)``:
    name -> {kind: µs per request, "total": ...}. A thread that ends in between takes its
    time with it (it leaves ``/proc/PID/task``): the path's threads live as long as their
    process."""

    def __init__(self, pids: dict[str, int]):
        self.pids = pids
        self.before: dict[str, dict[str, float]] = {}

    def start(self) -> None:
        self.before = {name: thread_cpu(pid) for name, pid in self.pids.items()}

    def stop(self, requests: int) -> dict[str, dict[str, float]]:
        out = {}
        for name, pid in self.pids.items():
            after = thread_cpu(pid)
            row = {k: (after[k] - self.before[name][k]) / max(1, requests) * 1e6 for k in KINDS}
            row["total"] = sum(row.values())
            out[name] = row
        return out


def combine(rows: dict[str, dict[str, float]], groups: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """``rows`` summed into ``groups`` (group -> the names in it: e.g. every worker as one)."""
    return {group: {k: sum(rows[n][k] for n in names if n in rows) for k in (*KINDS, "total")}
            for group, names in groups.items()}
