"""The ``[store]`` table: store replicas wired first, every store-backed worker pointed at
them, a host's empty store resolved through them; ``for_host`` keeps one host's services."""
from __future__ import annotations

import pytest

from keel.common.spec import SpecError, load_spec


def spec(**store) -> dict:
    return {"hosts": {"a": "127.0.0.1", "b": "127.0.0.2"}, "store": store,
            "models": {"m": {"builtin": "noop", "workers": 2}}}


def test_store_replicas_take_the_first_ports_and_builtin_workers_fetch_nothing():
    s = load_spec(spec(hosts=["a", "b"], max_chunk_bytes=4096))
    stores = s.role("store")
    assert [(x.name, x.host) for x in stores] == [("store-1", "a"), ("store-2", "b")]
    assert stores[0].config.endpoint == "tcp://127.0.0.1:7000" and stores[1].config.endpoint == "tcp://127.0.0.2:7000"
    assert stores[0].config.max_chunk_bytes == 4096 and stores[0].config.store == s.store
    assert all(w.config.store_endpoints == [] for w in s.role("worker"))  # builtins have no versions to fetch


def test_a_store_model_missing_here_is_an_error_naming_the_store_service():
    data = spec()
    data["models"] = {"m": {"workers": 1}}
    with pytest.raises(SpecError, match="models.m.store_name: .*store service could not say"):
        load_spec({**data, "cluster": {"store": "/nonexistent-store"}})


def test_store_table_errors_name_their_key():
    with pytest.raises(SpecError, match=r"store\.hosts"):
        load_spec(spec(hosts=["c"]))
    with pytest.raises(SpecError, match=r"store\.hosts: one store replica per host"):
        load_spec(spec(hosts=["a", "a"]))
    with pytest.raises(SpecError, match=r"store\.endpoint"):
        load_spec(spec(endpoint="tcp://x:1"))


def test_for_host_keeps_only_that_hosts_services():
    s = load_spec(spec(hosts=["a"]))
    b = s.for_host("b")
    assert [x.name for x in b.services] == ["worker-m-1"]
    assert b.client_endpoints == s.client_endpoints and b.run_dir == s.run_dir
    with pytest.raises(SpecError, match="not in"):
        s.for_host("c")


def test_render_systemd_gives_workers_the_store_service_and_the_hosts_own_store(tmp_path):
    import orjson

    from keel.deploy.units import render_systemd

    s = load_spec(spec(hosts=["a"]))
    for w in s.role("worker"):  # as a store-backed worker would be
        w.config.builtin, w.config.store_endpoints = None, [s.role("store")[0].config.endpoint]
    render_systemd(s, "b", tmp_path, workdir="/opt/keel", store="/opt/keel/store")
    config = orjson.loads((tmp_path / "keel" / "worker-m-1.json").read_bytes())
    assert config["store"] == "/opt/keel/store" and config["store_endpoints"] == ["tcp://127.0.0.1:7000"]
    assert not (tmp_path / "keel" / "store-1.json").exists()  # the store runs on a, not b
