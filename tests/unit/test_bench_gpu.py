"""``keel bench gpu`` without a GPU: it says it skipped and why, in its output and its JSON;
its measurement of the data path and SERF's choice from the profile run on the CPU
(tiny cells: the figures are not asserted, only their shape)."""
from __future__ import annotations

import argparse

import torch

from keel.bench import gpu


def test_without_a_cuda_device_it_skips_with_a_clear_line_and_json_saying_so(monkeypatch):
    monkeypatch.setattr(gpu, "cuda_device", lambda: None)
    lines = []
    report = gpu.run(argparse.Namespace(quick=True, device="cuda", no_tail=False), lines.append)
    assert report["skipped"] == "no CUDA device" and report["device"] is None
    assert lines[0].startswith("skipped: no CUDA device")
    assert gpu.passed(report)


def test_the_data_path_cells_and_serfs_choice_on_the_cpu():
    module = torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()
    rows = [gpu.measure(module, "cpu", [8], batch, slots, per_slot=5, cell_s=1.0) for batch in (1, 4) for slots in (1, 2)]
    for row in rows:
        assert row["error"] is None and 1 <= row["batches"] <= 5 * row["slots"]
        assert row["qps"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0 and row["copy_share"] == 0.0
    choice = gpu.serf(rows, loads=4)
    assert set(choice["predicted_ms"]) == {"1", "2"} and len(choice["choice"]) == 4
    assert all(c["slots"] in (1, 2) for c in choice["choice"])


def test_an_out_of_memory_cell_is_reported_not_fatal():
    class Fails(torch.nn.Module):
        def forward(self, x):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    row = gpu.measure(Fails(), "cpu", [8], 4, 2, per_slot=3, cell_s=1.0)
    assert row["batches"] == 0 and row["qps"] is None and "OutOfMemoryError" in row["error"]


def test_the_command_is_registered():
    from keel.bench.cli import BENCHMARKS

    assert BENCHMARKS["gpu"].module == "keel.bench.gpu" and BENCHMARKS["gpu"].quick
