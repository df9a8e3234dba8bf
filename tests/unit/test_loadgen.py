"""keel.common.loadgen's report writing."""
from __future__ import annotations

import orjson

from keel.common.loadgen import write_json_and_plot


def test_a_report_is_written_with_its_plot_beside_it_and_named_in_it(tmp_path):
    drawn = []

    def plot(report, path):
        drawn.append((dict(report), path))
        path.write_bytes(b"png")

    png = write_json_and_plot(tmp_path / "runs" / "r.json", {"x": 1.5}, plot)
    assert png == tmp_path / "runs" / "r.png"
    assert orjson.loads((tmp_path / "runs" / "r.json").read_bytes()) == {"x": 1.5, "plot": str(png)}
    assert drawn == [({"x": 1.5, "plot": str(png)}, png)]


def test_a_report_that_draws_nothing_names_no_plot_and_leaves_no_older_one(tmp_path):
    (tmp_path / "r.png").write_bytes(b"an older run's plot")
    png = write_json_and_plot(tmp_path / "r.json", {"x": 1.5}, lambda report, path: None)
    assert not png.exists()
    assert orjson.loads((tmp_path / "r.json").read_bytes()) == {"x": 1.5}
