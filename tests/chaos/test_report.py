"""Report numbers and plots from synthetic records."""
from __future__ import annotations

import orjson

from keel.chaos import report


def records(mode, latencies_ms, lost=0):
    out = [{"mode": mode, "request_id": f"{mode}{i}", "send_t": float(i), "input_index": 0,
            "replies": [{"recv_t": i + v / 1000, "source": "model", "latency_ms": v, "error_code": None, "output": [0]}]}
           for i, v in enumerate(latencies_ms)]
    out += [{"mode": mode, "request_id": f"{mode}-lost{i}", "send_t": 50.0 + i, "input_index": 0,
             "replies": [{"recv_t": 51.0, "source": "error", "error_code": "timeout", "latency_ms": 1000}]} for i in range(lost)]
    return out


def test_summary_counts_and_percentiles():
    s = report.summarize(records("a", list(range(1, 1001)), lost=3))
    assert (s["sent"], s["accepted"], s["answered"], s["lost"], s["predictions"]) == (1003, 1003, 1000, 3, 1000)
    assert abs(s["latency_ms"]["p50"] - 500.5) < 1 and abs(s["latency_ms"]["p99"] - 990) < 1.5
    assert set(s["latency_ms"]) == {"p50", "p90", "p99", "p99.9", "mean", "max"}
    assert s["sources"] == {"model": 1000, "error": 3} and s["errors"] == {"timeout": 3}


def test_ratios_compare_every_mode_with_the_first():
    sums = {"parm": report.summarize(records("parm", [10.0] * 100)), "equal": report.summarize(records("equal", [30.0] * 100))}
    assert report.ratios(sums)["equal/parm"]["p99"] == 3.0


def test_plots_and_json_are_written(tmp_path):
    recs = {"parm": records("parm", [5, 6, 7, 50], lost=1), "equal": records("equal", [6, 7, 8, 90])}
    events = [{"t_wall": 1.5, "kind": "kill", "host": "w1", "ok": True, "params": {}},
              {"t_wall": 0.5, "kind": "shuffle", "host": None, "ok": True, "params": {"duration_s": 2}}]
    cdf = report.plot_cdf(recs, tmp_path / "cdf.png")
    timeline = report.plot_timeline(recs, events, 0.0, tmp_path / "timeline.png")
    for png in (cdf, timeline):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    path = report.write_json(tmp_path / "r.json", {"modes": {m: report.summarize(r) for m, r in recs.items()}})
    assert orjson.loads(path.read_bytes())["modes"]["parm"]["lost"] == 1
