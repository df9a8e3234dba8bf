"""The steal meter: the hypervisor's share of CPU time between two reads of /proc/stat."""
from __future__ import annotations

import time

import pytest

from keel.common import steal


def write(path, steal_ticks: int, busy: int, idle: int) -> None:
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    path.write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 {steal_ticks} 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n")


def test_fraction_is_stolen_over_all_ticks_since_the_start(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    monkeypatch.setattr(steal, "PROC_STAT", str(stat))
    write(stat, 100, 1000, 1000)
    meter = steal.StealMeter()
    write(stat, 130, 1060, 1010)  # +30 stolen of +100 in all
    assert meter.fraction() == pytest.approx(0.30)
    meter.reset()
    assert meter.fraction() is None  # no time has passed


def test_no_steal_field_or_no_file_reads_as_unknown(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    monkeypatch.setattr(steal, "PROC_STAT", str(stat))
    stat.write_text("cpu  1 2 3 4\n")
    assert steal.StealMeter().fraction() is None
    monkeypatch.setattr(steal, "PROC_STAT", str(tmp_path / "absent"))
    assert steal.StealMeter().fraction() is None


def test_this_machine_reads():
    meter = steal.StealMeter()
    sum(i * i for i in range(200_000))
    got = meter.fraction()
    assert got is None or 0.0 <= got <= 1.0


def test_a_starved_measurement_is_taken_again_and_the_least_starved_kept(monkeypatch):
    waits = []
    monkeypatch.setattr(steal, "wait_for_quiet", lambda: waits.append(1) or (0.0, 0.0))
    steals = iter([0.5, 0.3, 0.4])
    results = iter(["a", "b", "c"])
    said = []
    got = steal.least_starved(lambda: next(results), steal_of=lambda r: next(steals), log=said.append, what="x")
    assert got == ("b", 0.3, 3) and len(said) == 2 and len(waits) == 2  # all starved: the least starved kept
    assert steal.least_starved(lambda: "q", steal_of=lambda r: 0.01) == ("q", 0.01, 1)  # not starved: once
    assert steal.least_starved(lambda: "u", steal_of=lambda r: None) == ("u", None, 1)  # unknown: once


def test_the_probe_keeps_the_cores_busy_and_reads_a_fraction():
    t0 = time.monotonic()
    got = steal.probe(0.3)
    assert time.monotonic() - t0 >= 0.3 and (got is None or 0.0 <= got <= 1.0)


def test_wait_for_quiet_probes_until_quiet_or_the_limit(monkeypatch):
    readings = iter([0.5, 0.3, 0.05, 0.0])
    monkeypatch.setattr(steal, "probe", lambda: next(readings))
    waited, last = steal.wait_for_quiet(limit_s=5.0, every_s=0.01)
    assert last == 0.05 and waited < 5.0
    monkeypatch.setattr(steal, "probe", lambda: 0.9)
    waited, last = steal.wait_for_quiet(limit_s=0.05, every_s=0.01)
    assert last == 0.9 and waited >= 0.05
