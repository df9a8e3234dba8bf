"""The self-test itself, in local mode everywhere and in netns mode where it can run."""
from __future__ import annotations

import orjson

from keel.chaos.cli import main

import pytest


def run(tmp_path, *args):
    path = tmp_path / "selftest.json"
    rc = main(["selftest", "--json", str(path), "--shuffle-mb", "24", *args])
    return rc, orjson.loads(path.read_bytes())


def test_selftest_local_mode_skips_what_needs_namespaces(tmp_path):
    rc, r = run(tmp_path, "--local")
    assert rc == 0 and r["ok"], r["errors"]
    assert r["netns"] is False and r["kill_host_ok"] and r["freeze_ok"] and r["cleanup_ok"]
    assert r["partition_ok"] is None and "netns" in r["skipped"]["partition_ok"]
    assert r["link_limit_mbps"] is None and "tbf" in r["skipped"]["link_limit_mbps"]
    assert abs(r["delay_added_ms"] - r["delay_configured_ms"]) <= 3.0


@pytest.mark.netns
def test_selftest_netns_mode_passes_every_check(tmp_path):
    rc, r = run(tmp_path)
    assert rc == 0 and r["ok"], r["errors"]
    assert r["netns"] is True and r["partition_ok"] is True and not r["skipped"]
    assert abs(r["shuffle_mbps"] - r["link_limit_mbps"]) <= 0.15 * r["link_limit_mbps"]
    assert r["cleanup_ok"] and r["duration_s"] < 90
