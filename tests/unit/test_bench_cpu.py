"""``bench.cpu``: a process's CPU time split by thread, as the breakdown reports it."""
from __future__ import annotations

import os
import threading
import time

import zmq

from keel.bench.cpu import CPUMeter, combine, thread_cpu


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_threads_cpu_counts_under_its_kind():
    burnt, done = threading.Event(), threading.Event()

    def helper() -> None:  # counted while it lives: an ended thread leaves /proc/PID/task
        _burn(0.3)
        burnt.set()
        done.wait(10)

    before = thread_cpu(os.getpid())
    worker = threading.Thread(target=helper)
    worker.start()
    burnt.wait(10)
    _burn(0.2)
    after = thread_cpu(os.getpid())
    done.set()
    worker.join()
    assert after["other"] - before["other"] >= 0.2  # the helper thread's 0.3 s, at the clock's 10 ms grain
    assert after["main"] - before["main"] >= 0.1


def test_zeromqs_background_threads_are_their_own_kind():
    ctx = zmq.Context()
    try:
        ctx.socket(zmq.PUSH).close()  # the context's I/O thread starts with its first socket
        assert "zmq" in thread_cpu(os.getpid())
    finally:
        ctx.term()


def test_the_meter_gives_cpu_per_request_and_groups_add_up():
    meter = CPUMeter({"me": os.getpid()})
    meter.start()
    _burn(0.2)
    rows = meter.stop(requests=100)
    assert rows["me"]["main"] >= 0.1 / 100 * 1e6  # µs per request
    assert rows["me"]["total"] == sum(rows["me"][k] for k in ("main", "zmq", "other"))
    assert combine({"a": rows["me"], "b": rows["me"]}, {"both": ["a", "b"]})["both"]["total"] == 2 * rows["me"]["total"]
