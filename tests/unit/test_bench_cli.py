"""The one registry of ``keel bench`` and ``keel experiment`` (bench/cli.py): every row's
module has what the registry calls, and every command ends the same way."""
from __future__ import annotations

import importlib
import json
from types import SimpleNamespace

import pytest

from keel.bench.cli import BENCHMARKS, EXPERIMENTS, finish, json_path
from keel.deploy.keel import parse_args


@pytest.mark.parametrize("name,command", [*BENCHMARKS.items(), *EXPERIMENTS.items()])
def test_every_command_module_provides_run_and_its_figures(name, command):
    module = importlib.import_module(command.module)
    assert callable(module.run) and module.FIGURES
    assert not hasattr(module, "add_parser") and not hasattr(module, "main")  # one parser: the registry's


def test_every_command_takes_json_and_its_quick_form():
    args = parse_args(["experiment", "kairos", "--quick", "--live", "--scale", "2"])
    assert (args.quick, args.live, args.scale, args.json) == (True, True, 2.0, None)
    assert str(json_path("kairos", args)) == "runs/kairos-quick.json"
    from keel.bench import kairos_experiment

    assert str(json_path("kairos", args, kairos_experiment)) == "runs/kairos-live-quick.json"  # its own report
    assert str(json_path("kairos", parse_args(["experiment", "kairos"]), kairos_experiment)) == "runs/kairos.json"
    with pytest.raises(SystemExit):
        parse_args(["experiment", "hams-timeline", "--quick"])  # it has no quick form
    assert parse_args(["bench", "core", "--json", "x.json"]).json == "x.json"


def test_finish_prints_the_table_writes_json_and_plot_and_sets_the_exit_code(tmp_path):
    drawn = []
    module = SimpleNamespace(FIGURES=("a", "b", "missing"), TARGETS={"a": "<= 1"},
                             plot=lambda report, png: drawn.append(png) or png.write_bytes(b"png"))
    lines: list[str] = []
    path = tmp_path / "r.json"
    assert finish(module, {"a": 0.5, "b": 2, "lost": 0, "_series": [1, 2]}, path, lines.append) == 0
    saved = json.loads(path.read_text())
    assert saved == {"a": 0.5, "b": 2, "lost": 0, "plot": str(path.with_suffix(".png"))}  # the plot's series left out
    assert drawn == [path.with_suffix(".png")] and any(line.startswith("a ") and "<= 1" in line for line in lines)
    assert not any("missing" in line for line in lines)
    assert finish(SimpleNamespace(FIGURES=("lost",)), {"lost": 3}, tmp_path / "l.json", lines.append) == 1
    assert finish(SimpleNamespace(FIGURES=(), passed=lambda r: False), {}, tmp_path / "p.json", lines.append) == 1
