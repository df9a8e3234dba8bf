"""``keel kairos apply``: the planned pool written into a spec's model table."""
from __future__ import annotations

import argparse

import pytest

from keel.common.kairos.profiles import DEFAULT_ROOT
from keel.common.spec import load_spec
from keel.deploy.kairos_cli import apply_pool, cmd_apply

SPEC = """# a comment kept
[cluster]
name = "k"

[models.rm2]
builtin = "kairos"
kairos_model = "rm2"
pools = {"g4dn.xlarge" = 1}

[models.other]
builtin = "sleep"
"""


def test_apply_pool_replaces_the_models_pools_line_and_keeps_the_rest():
    out = apply_pool(SPEC, "rm2", {"g4dn.xlarge": 1, "r5n.large": 13, "t3.xlarge": 0})
    assert 'pools = {"g4dn.xlarge" = 1, "r5n.large" = 13}\n' in out
    assert out.count("pools =") == 1 and out.startswith("# a comment kept\n")
    assert out.replace('pools = {"g4dn.xlarge" = 1, "r5n.large" = 13}', 'pools = {"g4dn.xlarge" = 1}') == SPEC


def test_apply_pool_adds_the_line_to_a_table_without_one_and_refuses_a_missing_table():
    out = apply_pool(SPEC, "other", {"g4dn.xlarge": 2})
    assert out.endswith('[models.other]\npools = {"g4dn.xlarge" = 2}\nbuiltin = "sleep"\n')
    assert 'pools = {"g4dn.xlarge" = 1}' in out  # rm2's untouched
    with pytest.raises(ValueError, match=r"\[models.absent\]"):
        apply_pool(SPEC, "absent", {"g4dn.xlarge": 1})


@pytest.mark.skipif(not (DEFAULT_ROOT / "data.tar.gz").exists(), reason="Kairos profile data absent")
def test_keel_kairos_apply_writes_a_loadable_spec_with_the_pick(tmp_path, capsys):
    path = tmp_path / "spec.toml"
    path.write_text(SPEC.replace('[models.other]\nbuiltin = "sleep"\n', ""))
    args = argparse.Namespace(spec=str(path), profile=None, model="rm2", budget=2.5, qos_ms=None, which="pick")
    assert cmd_apply(args) == 0
    spec = load_spec(path)
    # the plan's pick for rm2 at $2.5/h: 1 base worker and 13 r5n.large ones
    assert sorted(w.config.instance for w in spec.role("worker")) == ["g4dn.xlarge"] + ["r5n.large"] * 13
    before = path.read_text()
    args.model = "absent"
    assert cmd_apply(args) == 2 and path.read_text() == before
    assert "unchanged" in capsys.readouterr().err
