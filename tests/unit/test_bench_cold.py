"""``keel bench core --cold``: every step measured warm and cold, one request's codec share
summed from the kinds of the request path (tiny counts here: the figures are not judged)."""
from __future__ import annotations

from types import SimpleNamespace

from keel.bench import cold


def test_every_step_has_warm_and_cold_figures(monkeypatch):
    monkeypatch.setattr(cold, "REPEATS", 2)
    monkeypatch.setattr(cold, "CALLS", {True: (5, 2)})
    monkeypatch.setattr(cold, "THRASH_BYTES", 64 * 1024)
    lines: list[str] = []
    out = cold.run_cold(SimpleNamespace(quick=True), lines.append)
    kinds = ("Predict", "Queries", "Batch", "Predictions", "Reply", "Done")
    for name in ["nothing", *(f"{op} {k}" for k in kinds for op in ("decode", "encode"))]:
        step = out["steps"][name]
        assert len(step["warm_us"]["runs"]) == len(step["cold_us"]["runs"]) == 2
        assert all(v > 0 for v in step["warm_us"]["runs"] + step["cold_us"]["runs"])
    total = sum(out["steps"][f"{op} {k}"]["cold_us"]["median"] for k in kinds for op in ("decode", "encode"))
    assert out["codec_per_request_cold_us"] == total
    assert any(line.startswith("decode Batch") for line in lines)


def test_the_decode_steps_decode_what_the_path_sends():
    table = cold.steps()
    assert type(table["decode Batch"]()).__name__ == "Batch"
    assert type(table["decode Reply"]()).__name__ == "Reply"
