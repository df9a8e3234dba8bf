"""Chaos tests: real processes and, where the machine allows, real network namespaces.

Tests marked ``netns`` need root and ``ip netns``; elsewhere they are skipped with the
reason. The ``clusters`` fixture yields a factory and, at teardown, closes every cluster
it made and asserts that nothing was left behind.
"""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from keel.chaos.hosts import Cluster
from keel.chaos.resources import have_netns

HERE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=1)
def netns_status() -> tuple[bool, str]:
    return have_netns()


def pytest_collection_modifyitems(config, items):
    ok, why = netns_status()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"needs network namespaces: {why}")
    for item in items:
        if "netns" in item.keywords and HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture
def clusters(tmp_path):
    made: list[Cluster] = []

    def make(hosts=("a", "b", "c"), netns=False, **kw) -> Cluster:
        cluster = Cluster(list(hosts), run_dir=tmp_path / f"c{len(made)}", netns=netns, **kw)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()
    for cluster in made:
        assert cluster.leftovers() == [], "cleanup left something behind"
        assert not cluster.registry.path.exists()
