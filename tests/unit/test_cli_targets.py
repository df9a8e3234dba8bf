"""``keel status`` and ``keel predict`` read what a frontend serves from its status ``targets``."""
from __future__ import annotations

import numpy as np
import pytest

from keel.common.spec import SpecError
from keel.deploy.cli import _input, info_tables, target_rows

TARGETS = {
    "m": {"kind": "model", "input_shape": [4], "input_dtype": "float32", "output_size": 2, "version": "3", "key": False},
    "app": {"kind": "application", "input_shape": [4], "input_dtype": "float32", "output_size": 2, "version": None,
            "key": True},
    "chain": {"kind": "graph", "input_shape": [2, 2], "input_dtype": "float32", "output_size": 4, "version": None,
              "key": True, "mode": "nspb"},
}


def test_status_shows_each_target_with_its_kind_version_and_key():
    tables = dict(info_tables({"service": "frontend", "targets": TARGETS}))
    rows = {row["target"]: row for row in tables["targets"]}
    assert set(rows) == {"m", "app", "chain"}
    assert (rows["m"]["kind"], rows["m"]["version"], rows["m"]["key"]) == ("model", "3", "no")
    assert (rows["app"]["kind"], rows["app"]["version"], rows["app"]["key"]) == ("application", "-", "yes")
    assert rows["chain"]["input"] == "float32[2, 2]" and rows["chain"]["mode"] == "nspb"  # what else a target says
    assert target_rows({}) == []


def test_predict_input_is_shaped_and_converted_for_its_target(tmp_path):
    x = _input("[1, 2, 3, 4]", TARGETS["chain"])  # ints, flat: reshaped to the target's shape, made float32
    assert x.shape == (2, 2) and x.dtype.name == "float32"
    np.save(tmp_path / "x.npy", np.array([1.0, 2.0, 3.0, np.nan]))
    with pytest.raises(SpecError, match="NaN"):
        _input(str(tmp_path / "x.npy"), TARGETS["m"])
    np.save(tmp_path / "c.npy", np.ones(4, np.complex128))
    with pytest.raises(SpecError, match="takes float32 input; complex128 cannot be converted"):
        _input(str(tmp_path / "c.npy"), TARGETS["m"])
    with pytest.raises(SpecError, match=r"shape \[3\] is not \[4\]"):
        _input("[1, 2, 3]", TARGETS["m"])
    with pytest.raises(SpecError, match="neither a .npy file nor a JSON list"):
        _input("[1, 2", TARGETS["m"])

