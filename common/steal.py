"""CPU time the hypervisor gave to other guests while this one wanted it (``steal`` in
/proc/stat), so an experiment can say how much of the machine it really had.

On a shared VM it can be the largest source of noise: on the 2-core VM where Keel's results
were measured, with nothing else running, two busy threads saw 27-64% of the CPU time stolen in some minutes and ~1% in others
(2026-11-26), while the load average reads the same. A latency taken in such a minute says
more about the neighbours than about Keel; experiments record the fraction per cell and
re-run cells taken above ``STEAL_MAX``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

from keel.common.waiting import wait_until

PROC_STAT = "/proc/stat"
#: a cell measured while more than this fraction of the CPU time was stolen is re-run
STEAL_MAX = 0.10
#: times a measurement taken above STEAL_MAX is taken again
STEAL_RETRIES = 2
#: how long a starved measurement waits, at most, for the hypervisor to stop stealing
QUIET_WAIT_S = 120.0


def _ticks() -> tuple[int, int] | None:
    """(steal, total) jiffies since boot over all CPUs; None where /proc/stat has no steal."""
    try:
        with open(PROC_STAT) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if fields[:1] != ["cpu"] or len(fields) < 9:
        return None
    values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return values[7], sum(values)


class StealMeter:
    """``fraction()``: the stolen share of all CPU time since the meter was made (or reset)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.start = _ticks()

    def fraction(self) -> float | None:
        end = _ticks()
        if self.start is None or end is None or end[1] <= self.start[1]:
            return None
        return (end[0] - self.start[0]) / (end[1] - self.start[1])


def probe(seconds: float = 1.0) -> float | None:
    """The steal while every core is kept busy for ``seconds`` (an idle guest asks for
    nothing, so nothing is stolen from it: only demand shows the neighbours)."""
    meter = StealMeter()
    burners = [subprocess.Popen([sys.executable, "-c", f"import time\nt = time.time() + {seconds}\nwhile time.time() < t: pass"])
               for _ in range(os.cpu_count() or 1)]
    for b in burners:
        b.wait()
    return meter.fraction()


def wait_for_quiet(limit_s: float = QUIET_WAIT_S, every_s: float = 5.0) -> tuple[float, float | None]:
    """Probe until the steal is at most ``STEAL_MAX`` or ``limit_s`` passed: (waited, last probe)."""
    t0, last = time.monotonic(), None

    def quiet() -> bool:
        nonlocal last
        last = probe()
        return last is None or last <= STEAL_MAX

    wait_until(quiet, timeout_s=limit_s, interval_s=every_s)
    return time.monotonic() - t0, last


def least_starved(measure, steal_of=None, retries: int = STEAL_RETRIES, log=None, what: str = ""):
    """Take ``measure()`` until the hypervisor stole at most ``STEAL_MAX`` of the CPU time
    while it ran, at most ``1 + retries`` times, and keep the least starved take; before a
    take again, wait (up to ``QUIET_WAIT_S``) for a probe to read quiet: the bursts seen
    here last a minute or more. The steal is ``steal_of(result)`` when given (a measurement
    that meters its own window), else metered around the whole call. Returns (result, its
    steal or None, takes)."""
    takes = []
    for take in range(1 + retries):
        meter = None if steal_of else StealMeter()
        result = measure()
        stolen = steal_of(result) if steal_of else meter.fraction()
        takes.append((stolen or 0.0, take, result, stolen))
        if (stolen or 0.0) <= STEAL_MAX or take == retries:
            break
        waited, now = wait_for_quiet()
        if log:
            log(f"   {what}: {stolen:.0%} of the CPU time stolen while it ran; waited {waited:.0f} s for quiet "
                f"(probe {now or 0:.0%}), taken again")
    _, _, result, stolen = min(takes, key=lambda t: t[:2])
    return result, stolen, len(takes)
