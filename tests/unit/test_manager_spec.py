"""The spec's [manager] table: replicas first, a standby dispatcher, every follower wired;
supervisord and systemd files for the three replicas."""
from __future__ import annotations

import pytest

from keel.common.spec import SpecError, load_spec
from keel.deploy.supervisor import render
from keel.deploy.units import render_systemd

EXAMPLE = "deploy/examples/manager.toml"


def test_replicas_come_first_and_every_follower_knows_them(tmp_path):
    spec = load_spec(EXAMPLE)
    assert [s.name for s in spec.services[:3]] == ["manager-1", "manager-2", "manager-3"]
    endpoints = [s.config.endpoint for s in spec.role("manager")]
    assert len(set(endpoints)) == 3
    for svc in spec.services[3:]:
        assert svc.config.manager.endpoints == endpoints
    active, standby = spec.role("dispatcher")
    assert (active.config.standby, standby.config.standby) == (False, True)
    assert (active.host, standby.host) == ("a", "b")
    assert standby.config.worker_endpoint != active.config.worker_endpoint
    partners = [set(s.config.raft_partners) | {s.config.raft_address} for s in spec.role("manager")]
    assert partners[0] == partners[1] == partners[2] and len(partners[0]) == 3
    assert all(s.config.journal_file.endswith(f"{s.name}.journal") for s in spec.role("manager"))


def test_supervisord_starts_the_replicas_first_and_systemd_has_a_unit_each(tmp_path):
    spec = load_spec({**_example(tmp_path)})
    conf = render(spec).read_text()
    for i in (1, 2, 3):
        assert f"[program:manager-{i}]" in conf
    section = conf.split("[program:manager-1]")[1].split("[program:")[0]
    assert "priority = 50" in section
    files = render_systemd(spec, "b", tmp_path / "units")
    names = {p.name for p in files}
    assert "manager-2.env" in names and "dispatcher-b.env" in names


def test_off_loopback_replicas_need_a_password(tmp_path):
    data = _example(tmp_path)
    data["hosts"] = {"a": "10.1.0.1", "b": "10.1.0.2", "c": "10.1.0.3"}
    with pytest.raises(SpecError, match="manager: .*password"):
        load_spec(data)
    data["manager"]["password"] = "s3cret"
    assert load_spec(data).service("manager-1").config.password == "s3cret"


def test_a_manager_group_has_three_or_five_replicas(tmp_path):
    data = _example(tmp_path)
    data["manager"]["hosts"] = ["a", "b"]
    with pytest.raises(SpecError, match="manager.hosts: a manager group has 3"):
        load_spec(data)


def _example(tmp_path) -> dict:
    import tomllib

    with open(EXAMPLE, "rb") as f:
        data = tomllib.load(f)
    data["cluster"]["run_dir"] = str(tmp_path / "run")
    return data
