"""keel.common.loadgen's report writing."""
from __future__ import annotations

import orjson

from keel.common.loadgen import write_json_and_plot


def test_a_report_is_written_with_its_plot_beside_it_and_named_in_it(tmp_path):
    drawn = []
    png = write_json_and_plot(tmp_path / "runs" / "r.json", {"x": 1.5}, lambda report, path: drawn.append((dict(report), path)))
    assert png == tmp_path / "runs" / "r.png"
    assert orjson.loads((tmp_path / "runs" / "r.json").read_bytes()) == {"x": 1.5, "plot": str(png)}
    assert drawn == [({"x": 1.5, "plot": str(png)}, png)]
