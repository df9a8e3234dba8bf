"""Kairos pools: heterogeneous pools in the cluster spec, the dispatcher's
Kairos policies built with the emulated model's profile and fed from ``Done``, and the
per-instance-type summary of its status."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.config import BatchPolicy, ConfigError, DispatcherConfig
from keel.common.kairos.profiles import DEFAULT_ROOT
from keel.common.protocol import Batch, Done, Queries, Register, ModelRole
from keel.common.spec import SpecError, load_spec
from keel.deploy.cli import info_tables
from keel.services.dispatcher import Dispatcher
from keel.services.scheduling.distribution import distribution_policy
from keel.services.scheduling import SingleQueue
from keel.services.scheduling.kairos import DrsPolicy, KairosPolicy, feature_size

HAVE_DATA = (DEFAULT_ROOT / "data.tar.gz").exists()
needs_data = pytest.mark.skipif(not HAVE_DATA, reason=f"Kairos profile data not found at {DEFAULT_ROOT}")
ANY_PORT = "tcp://127.0.0.1:*"
BASE, CPU = "g4dn.xlarge", "r5n.large"


def kairos_model(**extra) -> dict:
    return {"builtin": "kairos", "kairos_model": "rm2", "kairos_scale": 0.1, "pools": {BASE: 1, CPU: 2}, **extra}


def spec_of(models: dict, **tables):
    return load_spec({"models": models, **tables})


# --------------------------------------------------------------------------- spec


@needs_data
def test_pools_give_each_worker_its_type_price_and_the_emulated_model():
    spec = spec_of({"rm2": kairos_model()}, dispatcher={"policy": "kairos"})
    workers = spec.role("worker")
    assert [(w.config.instance, w.config.price) for w in workers] == [(BASE, 0.526), (CPU, 0.149), (CPU, 0.149)]
    for w in workers:
        c = w.config
        assert (c.builtin, c.kairos_model, c.kairos_scale, c.builtin_input_shape) == ("kairos", "rm2", 0.1, [1])
        assert c.kairos_profile == str(DEFAULT_ROOT) and c.kairos_profile.startswith("/")
    d = spec.service("dispatcher").config
    assert (d.policy, d.kairos_model, d.kairos_scale, d.kairos_profile) == ("kairos", "rm2", 0.1, str(DEFAULT_ROOT))
    assert spec.models["rm2"]["workers"] == 3


@needs_data
def test_pool_price_override_and_relative_profile_made_absolute(monkeypatch):
    monkeypatch.chdir(DEFAULT_ROOT.parent)
    spec = spec_of({"rm2": kairos_model(kairos_profile="kairos")}, pools={CPU: {"price": 0.2}})
    assert [w.config.price for w in spec.role("worker")] == [0.526, 0.2, 0.2]
    profile = spec.role("worker")[0].config.kairos_profile
    # made absolute from the cwd, which the OS gives with symbolic links resolved
    assert Path(profile).is_absolute() and Path(profile).resolve() == DEFAULT_ROOT.resolve()


def test_store_free_pools_with_prices_given_need_no_profile():
    spec = spec_of({"m": {"builtin": "sleep", "pools": {"big": 1, "small": 0, "tiny": 2}}},
                   pools={"big": {"price": 1.5}, "small": {"price": 0.5}, "tiny": {"price": 0.1}})
    assert [(w.config.instance, w.config.price, w.config.builtin) for w in spec.role("worker")] == [
        ("big", 1.5, "sleep"), ("tiny", 0.1, "sleep"), ("tiny", 0.1, "sleep")]
    assert spec.service("dispatcher").config.kairos_model == ""


@pytest.mark.parametrize("model, tables, message", [
    ({"builtin": "sleep", "pools": {"a": -1, "b": 2}}, {"pools": {"a": {"price": 1.0}, "b": {"price": 1.0}}},
     'models.m.pools."a": must be >= 0 workers, got -1'),
    ({"builtin": "sleep", "workers": 2, "pools": {"a": 1}}, {"pools": {"a": {"price": 1.0}}},
     "models.m.pools: give workers or pools, not both"),
    ({"builtin": "sleep", "pools": {"a": 0}}, {"pools": {"a": {"price": 1.0}}}, "models.m.pools: needs at least one worker"),
    ({"builtin": "sleep", "pools": {"a": "two"}}, {}, "models.m.pools: must be"),
    ({"builtin": "kairos", "kairos_model": "rm2"}, {}, "models.m.pools: builtin = \"kairos\" needs pools"),
    ({"builtin": "sleep", "kairos_model": "rm2", "workers": 1}, {}, 'models.m.kairos_model: only used with builtin = "kairos"'),
    ({"builtin": "kairos", "kairos_model": "rm2", "kairos_scale": 0.0, "pools": {BASE: 1}}, {},
     "models.m.kairos_scale: must be > 0"),
    ({"builtin": "sleep", "pools": {"a": 1}}, {"pools": {"a": {"price": -1.0}}}, "pools.a.price: must be >= 0"),
    ({"builtin": "sleep", "pools": {"a": 1}}, {"pools": {"a": {"price": 1.0, "cost": 1.0}}}, "pools.a.cost: unknown key"),
    ({"builtin": "sleep", "pools": {"a": 2}, "k": 2}, {"pools": {"a": {"price": 1.0}}}, "models.m.pools: mode \"parm\" with pools"),
])
def test_pool_errors_name_the_key(model, tables, message):
    with pytest.raises(SpecError) as err:
        spec_of({"m": model}, **tables)
    assert str(err.value).startswith(message), str(err.value)


@needs_data
def test_unknown_instance_type_or_model_is_refused():
    with pytest.raises(SpecError, match=r'models.m.pools."p3.2xlarge": unknown instance type; profiled types'):
        spec_of({"m": kairos_model(pools={"p3.2xlarge": 1})})
    with pytest.raises(SpecError, match=r"models.m.kairos_model: 'gpt' is not profiled"):
        spec_of({"m": kairos_model(kairos_model="gpt")})
    with pytest.raises(SpecError, match=r"models.m.kairos_profile: no Kairos profile at /nowhere"):
        spec_of({"m": kairos_model(kairos_profile="/nowhere")})


@needs_data
def test_kairos_models_must_agree_on_the_dispatcher_profile():
    with pytest.raises(SpecError, match="models.b.kairos_model: kairos-emulated models must agree"):
        spec_of({"a": kairos_model(), "b": kairos_model(kairos_scale=0.5)})
    # unless [dispatcher] says which profile its policy uses
    spec = spec_of({"a": kairos_model(), "b": kairos_model(kairos_scale=0.5)}, dispatcher={"kairos_model": "rm2"})
    assert spec.service("dispatcher").config.kairos_scale == 1.0


# --------------------------------------------------------------------------- policy construction


def dispatcher_config(**options) -> DispatcherConfig:
    options.setdefault("heartbeat_interval_s", 30.0)
    cfg = DispatcherConfig(query_endpoint=ANY_PORT, worker_endpoint=ANY_PORT, models={"rm2": BatchPolicy()}, **options)
    cfg.validate()
    return cfg


@needs_data
def test_kairos_policy_is_built_with_the_scaled_profile():
    p = distribution_policy(dispatcher_config(policy="kairos", kairos_model="rm2", kairos_scale=0.1))
    assert isinstance(p, KairosPolicy) and p.size_of is feature_size
    assert p.predictor.prior(BASE, 1000) == pytest.approx(26.08, abs=0.1)   # 260.8 ms x 0.1
    assert p.predictor.prior("no-such-type", 10) is None
    assert p.coefficients[BASE] == 1.0 and 0.6 < p.coefficients[CPU] < 0.7


def test_policies_without_a_profile_and_their_checks():
    assert isinstance(distribution_policy(dispatcher_config()), SingleQueue)
    p = distribution_policy(dispatcher_config(policy="drs", drs_threshold=200))
    assert isinstance(p, DrsPolicy) and p.threshold == 200 and p.predictor.prior is None
    with pytest.raises(ConfigError, match="drs_threshold"):
        dispatcher_config(policy="drs")
    with pytest.raises(ConfigError, match="unknown distribution policy 'fifo'"):
        distribution_policy(dispatcher_config(policy="fifo"))
    with pytest.raises(ConfigError, match="no Kairos profile at /nowhere"):
        distribution_policy(dispatcher_config(policy="kairos", kairos_model="rm2", kairos_profile="/nowhere"))


# --------------------------------------------------------------------------- a stepped dispatcher


@pytest.fixture
def kairos_dispatcher(zsock):
    d = Dispatcher(dispatcher_config(policy="kairos", kairos_model="rm2", kairos_scale=0.1))
    front = zsock(zmq.PUSH, connect=transport.endpoint_of(d.pull))
    yield d, front, lambda name: zsock(zmq.DEALER, connect=transport.endpoint_of(d.router), identity=name.encode())
    d.shutdown()


def pump(d: Dispatcher, condition, what: str, timeout_s: float = 3.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        d.tick(0.01)


def batches_on(sock) -> list[Batch]:
    out = []
    while sock.poll(0):
        msg = protocol.decode(sock.recv_multipart(copy=False))
        if isinstance(msg, Batch):
            out.append(msg)
    return out


@needs_data
def test_stepped_dispatcher_sends_large_queries_to_the_base_type_and_learns_from_done(kairos_dispatcher):
    d, front, dealer = kairos_dispatcher
    socks = {}
    for name, instance, price in (("base", BASE, 0.526), ("cpu0", CPU, 0.149), ("cpu1", CPU, 0.149)):
        socks[name] = dealer(name)
        transport.send(socks[name], Register(worker=name, model="rm2", role=ModelRole.DEPLOYED, slots=1, max_batch=8,
                                             instance=instance, price=price))
    pump(d, lambda: len(d.workers) == 3, "workers registered")
    # one large query (1000 items) and two small ones; QoS 350 ms x 0.1: a large one is late on a CPU
    sizes = [10, 1000, 10]
    transport.send(front, Queries(model="rm2", qids=[1, 2, 3], budgets_ms=[35.0] * 3, reply_to="tcp://127.0.0.1:1",
                                  inputs=np.array([[s] for s in sizes], np.float32)))
    got: dict[str, list[Batch]] = {n: [] for n in socks}
    pump(d, lambda: [got[n].extend(batches_on(s)) for n, s in socks.items()] and sum(map(len, got.values())) == 3,
         "three batches sent")
    assert [b.qids for b in got["base"]] == [[2]]
    assert sorted(b.qids[0] for n in ("cpu0", "cpu1") for b in got[n]) == [1, 3]
    assert all(len(b.qids) == 1 for bs in got.values() for b in bs)   # one Kairos query per batch

    pools = d.status()["pools"]
    assert pools[BASE] == {"workers": 1, "slots": 1, "inflight": 1, "batches": 0, "cost_per_hour": 0.526, "busy": 1.0}
    assert pools[CPU]["workers"] == 2 and pools[CPU]["cost_per_hour"] == 0.298 and pools[CPU]["busy"] == 1.0
    assert d.status()["cost_per_hour"] == 0.824
    # keel status renders it as a table, one row per instance type
    tables = dict(info_tables(d.status()))
    assert [(r["pools"], r["workers"], r["busy"], r["cost_per_hour"]) for r in tables["pools"]] == [
        (BASE, 1, 1.0, 0.526), (CPU, 2, 1.0, 0.298)]

    # Done feeds the policy's predictor with the batch's summed query sizes (§5.1 learning)
    b = got["base"][0]
    transport.send(socks["base"], Done(worker="base", batch_id=b.batch_id, batch_size=1, service_ms=30.0, ok=True))
    pump(d, lambda: not d.workers[b"base"].inflight, "Done processed")
    assert d.policy.predictor.seen[("rm2", BASE)] == {1000: 30.0}
    assert d.status()["pools"][BASE]["batches"] == 1 and d.status()["pools"][BASE]["busy"] == 0.0
    # a failed batch teaches nothing
    c = got["cpu0"][0]
    transport.send(socks["cpu0"], Done(worker="cpu0", batch_id=c.batch_id, batch_size=1, service_ms=99.0, ok=False))
    pump(d, lambda: not d.workers[b"cpu0"].inflight, "Done processed")
    assert ("rm2", CPU) not in d.policy.predictor.seen


def test_single_queue_dispatcher_has_no_observer_and_no_pools(zsock):
    d = Dispatcher(dispatcher_config())
    try:
        assert d._observe is None
        assert "pools" not in d.status() and "cost_per_hour" not in d.status()
    finally:
        d.shutdown()


def test_pools_are_listed_by_instance_type_whatever_order_workers_registered_in():
    """The registrations of several workers reach the dispatcher in any order; the pool
    summary (and the table ``keel status`` draws from it) lists instance types by name."""
    from keel.services.scheduling.view import WorkerState, pool_summary

    def worker(name: str, instance: str, price: float) -> WorkerState:
        return WorkerState(identity=name.encode(), name=name, model="rm2", role="deployed", slots=1, max_batch=8,
                           batch_size=1, last_seen=0.0, instance=instance, price=price)

    ws = [worker("cpu0", CPU, 0.149), worker("base", BASE, 0.526), worker("cpu1", CPU, 0.149)]
    for order in (ws, ws[::-1], ws[1:] + ws[:1]):
        assert list(pool_summary(order)["pools"]) == sorted([BASE, CPU])
