"""The cluster spec: examples load, modes give the right services and wiring, every class of
error names its key path, ports never collide on one address; plus the renderers."""
from __future__ import annotations

import argparse
import configparser
import copy
import shlex
import tomllib
from collections import Counter
from pathlib import Path

import orjson
import pytest

from keel.common.config import to_json
from keel.common.roles import from_dict
from keel.common.modelstore import Manifest
from keel.common.spec import ClusterSpec, SpecError, load_spec, run_dir_of

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"


def fake_model(store: Path, name: str, version: str = "1", **fields) -> None:
    """A manifest-only store entry: enough for the spec, which never loads weights."""
    fields = {"arch": "mlp", "input_shape": [64], "output_size": 10, **fields}
    folder = store / name / version
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_bytes(Manifest(name=name, version=version, **fields).to_json())


def noop(**model) -> dict:
    return {"cluster": {"name": "t"}, "models": {"m": {"builtin": "noop", **model}}}


def names(spec: ClusterSpec) -> list[str]:
    return [s.name for s in spec.services]


def bound(spec: ClusterSpec) -> list[tuple[str, int]]:
    out = []
    for s in spec.services:
        for ep in s.endpoints():
            address, port = ep.removeprefix("tcp://").rsplit(":", 1)
            out.append((address, int(port)))
        if s.config.metrics_port is not None:
            out.append((spec.hosts[s.host], s.config.metrics_port))
    return out


# --------------------------------------------------------------------------- examples


def test_noop_example():
    spec = load_spec(EXAMPLES / "noop.toml")
    assert names(spec) == ["frontend", "dispatcher", "worker-noop-0", "worker-noop-1"]
    assert spec.client_endpoints == ["tcp://127.0.0.1:7400"]
    assert spec.service("worker-noop-0").config.builtin == "noop"
    assert spec.models["noop"]["input_shape"] == [8]
    assert spec.run_dir.endswith("runs/noop") and Path(spec.run_dir).is_absolute()


def test_parm_example():
    spec = load_spec(EXAMPLES / "parm.toml")
    roles = Counter(s.role for s in spec.services)
    assert roles == {"frontend": 1, "dispatcher": 1, "encoder": 1, "decoder": 1, "worker": 6}
    assert [s.config.role for s in spec.role("worker")].count("parity") == 2
    assert spec.service("frontend").config.cache_size == 0
    assert spec.service("dispatcher").config.models["sleep"].fixed_batch == 1


def test_local_example_reads_the_store(tmp_path):
    fake_model(tmp_path / "store", "digits-mlp", input_shape=[64], output_size=10)
    data = tomllib.loads((EXAMPLES / "local.toml").read_text())
    data["cluster"]["store"] = str(tmp_path / "store")
    spec = load_spec(data)
    workers = spec.role("worker")
    assert len(workers) == 4 and all(w.config.store_name == "digits-mlp" and w.config.version == "1" for w in workers)
    assert spec.service("frontend").config.models["digits-mlp"].input_shape == [64]


def test_local_example_without_the_model_names_store_name(tmp_path):
    data = tomllib.loads((EXAMPLES / "local.toml").read_text())
    data["cluster"]["store"] = str(tmp_path / "empty")
    with pytest.raises(SpecError, match=r"^models\.digits-mlp\.store_name: model 'digits-mlp' is not in the store"):
        load_spec(data)


def test_defaults():
    spec = load_spec({"models": {"m": {"builtin": "noop"}}})
    assert spec.name == "keel" and spec.hosts == {"local": "127.0.0.1"}
    assert names(spec) == ["frontend", "dispatcher", "worker-m-0"]
    assert spec.client_endpoints == ["tcp://127.0.0.1:7000"]


# --------------------------------------------------------------------------- modes and wiring


@pytest.mark.parametrize("mode,k,m,deployed,parity", [
    ("none", 0, 4, 4, 0), ("equal", 2, 4, 6, 0), ("parm", 2, 4, 4, 2), ("parm", 4, 4, 4, 1), ("parm", 2, 3, 3, 2),
])
def test_mode_worker_counts(mode, k, m, deployed, parity):
    spec = load_spec(noop(workers=m, k=k, mode=mode))
    workers = spec.role("worker")
    assert sum(w.config.role == "deployed" for w in workers) == deployed
    assert sum(w.config.role == "parity" for w in workers) == parity
    assert bool(spec.role("encoder")) == bool(spec.role("decoder")) == (mode == "parm")
    policy = spec.service("dispatcher").config.models["m"]
    assert policy.k == (k if mode == "parm" else 0)


def test_parm_wiring():
    spec = load_spec(noop(workers=4, k=2, encoder="concat"))  # mode defaults to parm when k > 0
    fe, disp = spec.service("frontend").config, spec.service("dispatcher").config
    enc, dec = spec.service("encoder").config, spec.service("decoder").config
    assert fe.dispatcher_query_endpoint == disp.query_endpoint == enc.dispatcher_query_endpoint
    assert disp.encoder_endpoint == enc.batch_endpoint
    assert disp.models["m"].parity_model == "m-parity" and enc.parity_models == {"m": "m-parity"}
    assert enc.encoder == "concat"
    for w in spec.role("worker"):
        assert w.config.dispatcher_worker_endpoint == disp.worker_endpoint
        assert w.config.decoder_endpoint == dec.endpoint
    parity = [w for w in spec.role("worker") if w.config.role == "parity"]
    assert [w.name for w in parity] == ["parity-m-0", "parity-m-1"]
    assert all(w.config.model == "m-parity" and w.config.builtin == "noop" for w in parity)
    assert "m-parity" not in fe.models  # clients never query the parity model


def test_uncoded_workers_have_no_decoder():
    spec = load_spec(noop(workers=2))
    assert spec.service("dispatcher").config.encoder_endpoint is None
    assert all(w.config.decoder_endpoint is None for w in spec.role("worker"))


def test_serving_params_reach_frontend_and_dispatcher():
    spec = load_spec(noop(output_size=3, deadline_ms=50, max_batch=8, fixed_batch=2, batch_delay_ms=1.5,
                          default_output=[1, 2, 3], worker={"slots": 2}))
    info = spec.service("frontend").config.models["m"]
    policy = spec.service("dispatcher").config.models["m"]
    assert info.deadline_ms == 50 and info.default_output == [1.0, 2.0, 3.0] and info.output_size == 3
    assert (policy.batch_budget_ms, policy.max_batch, policy.fixed_batch, policy.batch_delay_ms) == (50, 8, 2, 1.5)
    assert spec.service("worker-m-0").config.slots == 2 and spec.service("worker-m-0").config.max_batch == 8


def test_sleep_model_and_passthrough_options():
    data = noop(workers=1)
    data["models"]["m"].update(builtin="sleep", fixed_ms=2, per_query_ms=0.5)
    data.update(frontend={"cache_size": 0}, dispatcher={"heartbeat_interval_s": 0.1}, worker={"torch_threads": 2},
                decoder={"timeout_ms": 30})
    spec = load_spec(data)
    w = spec.service("worker-m-0").config
    assert (w.builtin, w.fixed_ms, w.per_query_ms, w.torch_threads) == ("sleep", 2.0, 0.5, 2)
    assert spec.service("dispatcher").config.heartbeat_interval_s == 0.1


def test_store_models_and_parity_models(tmp_path):
    store = tmp_path / "store"
    fake_model(store, "mlp", input_shape=[8, 8], output_size=10)
    fake_model(store, "mlp", version="2", input_shape=[8, 8], output_size=10)
    fake_model(store, "mlp-parity", role="parity", input_shape=[8, 8], output_size=10, parity={"k": 2, "encoder": "add"})
    spec = load_spec({"cluster": {"store": str(store)}, "models": {"d": {"store_name": "mlp", "workers": 2, "k": 2}}})
    deployed, parity = spec.service("worker-d-0").config, spec.service("parity-d-0").config
    assert (deployed.model, deployed.store_name, deployed.version, deployed.store) == ("d", "mlp", "2", str(store))
    assert (parity.model, parity.store_name, parity.version, parity.role) == ("d-parity", "mlp-parity", "1", "parity")
    assert spec.service("frontend").config.models["d"].input_shape == [8, 8]
    pinned = load_spec({"cluster": {"store": str(store)}, "models": {"d": {"store_name": "mlp", "version": 1}}})
    assert pinned.service("worker-d-0").config.version == "1"


@pytest.mark.parametrize("model,message", [
    ({"store_name": "nope"}, r"^models\.d\.store_name: model 'nope' is not in the store"),
    ({"store_name": "mlp", "version": "7"}, r"^models\.d\.version: model 'mlp' has no version '7'"),
    ({"store_name": "mlp", "output_size": 3}, r"^models\.d\.output_size: 3 but store model mlp/1 has 10"),
    ({"store_name": "mlp", "k": 2}, r"^models\.d\.k: parity model: model 'mlp-parity' is not in the store"),
    ({"store_name": "mlp", "k": 4, "parity_store_name": "mlp-p2"}, r"^models\.d\.k: 4 but parity model mlp-p2/1 was trained for k = 2"),
    ({"store_name": "mlp", "k": 2, "encoder": "concat", "parity_store_name": "mlp-p2"}, r"^models\.d\.encoder: 'concat' but .* encoder = 'add'"),
])
def test_store_errors(tmp_path, model, message):
    store = tmp_path / "store"
    fake_model(store, "mlp")
    fake_model(store, "mlp-p2", role="parity", parity={"k": 2, "encoder": "add"})
    with pytest.raises(SpecError, match=message):
        load_spec({"cluster": {"store": str(store)}, "models": {"d": model}})


# --------------------------------------------------------------------------- placement and ports


def test_round_robin_placement_and_by_host():
    data = noop(workers=3, k=2)
    data["hosts"] = {"a": "10.0.0.1", "b": "10.0.0.2"}
    data["frontend"] = {"hosts": ["a", "b"]}
    data["dispatcher"] = {"host": "b"}
    spec = load_spec(data)
    assert [(w.name, w.host) for w in spec.role("worker")] == [
        ("worker-m-0", "a"), ("worker-m-1", "b"), ("worker-m-2", "a"), ("parity-m-0", "b"), ("parity-m-1", "a")]
    assert names(spec)[:2] == ["frontend-0", "frontend-1"]
    assert spec.client_endpoints == ["tcp://10.0.0.1:7000", "tcp://10.0.0.2:7000"]
    assert spec.service("encoder").host == spec.service("decoder").host == "b"  # default: beside the dispatcher
    by_host = spec.by_host()
    assert set(by_host) == {"a", "b"} and sum(map(len, by_host.values())) == len(spec.services)
    assert all(s.host == h for h, ss in by_host.items() for s in ss)
    with pytest.raises(KeyError):
        spec.service("nope")


def test_ports_distinct_per_address_in_local_mode():
    data = noop(workers=3, k=3)
    data["cluster"].update(base_port=20000, metrics_base_port=21000)
    data["hosts"] = {"a": "127.0.0.1", "b": "127.0.0.1", "c": "127.0.0.2"}
    data["frontend"] = {"hosts": ["a", "b", "c"]}
    spec = load_spec(data)
    ports = bound(spec)
    assert len(ports) == len(set(ports))
    assert ("127.0.0.2", 20000) in ports and ("127.0.0.1", 20000) in ports
    assert all(s.config.metrics_port >= 21000 for s in spec.services)


def test_a_cluster_on_one_machine_hops_over_ipc_and_clients_keep_tcp(tmp_path):
    data = noop(workers=2, k=2)
    data["cluster"].update(base_port=20000, run_dir=str(tmp_path / "a"))
    data["gateway"] = {}
    spec = load_spec(data)
    fe, disp = spec.service("frontend").config, spec.service("dispatcher").config
    hops = [fe.prediction_endpoint, disp.query_endpoint, disp.worker_endpoint, spec.service("encoder").config.batch_endpoint,
            spec.service("decoder").config.endpoint]
    assert all(ep.startswith("ipc://@keel-t-") for ep in hops) and len(set(hops)) == len(hops)
    assert fe.dispatcher_query_endpoint == disp.query_endpoint  # both ends of a hop agree
    assert all(w.config.dispatcher_worker_endpoint == disp.worker_endpoint for w in spec.role("worker"))
    # clients and the operator: TCP, numbered as before; the frontend's ipc twin for clients on this machine
    assert spec.client_endpoints == [fe.client_endpoint] == ["tcp://127.0.0.1:20000"]
    assert spec.local_client_endpoints == [fe.local_client_endpoint] == [hops[0].rsplit("-", 1)[0] + "-20000"]
    assert spec.service("gateway").config.frontend_endpoints == spec.local_client_endpoints
    assert all(s.config.status_endpoint.startswith("tcp://127.0.0.1:") for s in spec.role("worker"))
    # another run folder, another name: two clusters on one machine never share a hop
    data["cluster"]["run_dir"] = str(tmp_path / "b")
    assert load_spec(data).service("dispatcher").config.query_endpoint != disp.query_endpoint


@pytest.mark.parametrize("hosts,ipc", [({"a": "127.0.0.1"}, False), ({"a": "127.0.0.1", "b": "127.0.0.2"}, True),
                                       ({"a": "10.0.0.1"}, True)])
def test_hops_stay_tcp_off_one_loopback_address_or_when_asked(hosts, ipc):
    data = noop(workers=2)
    data["cluster"]["ipc"] = ipc
    data["hosts"] = hosts
    spec = load_spec(data)
    assert all(ep.startswith("tcp://") for s in spec.services for ep in s.endpoints())
    assert spec.local_client_endpoints == spec.client_endpoints
    assert spec.service("frontend").config.local_client_endpoint is None


def test_addresses_override_hosts():
    data = noop()
    data["hosts"] = {"a": "127.0.0.1"}
    spec = load_spec(data, addresses={"a": "10.200.0.2"})
    assert spec.hosts == {"a": "10.200.0.2"}
    assert spec.client_endpoints == ["tcp://10.200.0.2:7000"]
    with pytest.raises(SpecError, match=r"^addresses\.zz: not a host"):
        load_spec(data, addresses={"zz": "10.0.0.1"})


def test_argv_round_trips_through_from_dict():
    spec = load_spec(noop(workers=2, k=2))
    for svc in spec.services:
        argv = svc.argv("/usr/bin/python3")
        assert argv[:5] == ["/usr/bin/python3", "-m", "keel.services.serve", svc.role, "--config"]
        assert from_dict(svc.role, orjson.loads(argv[5])) == svc.config


# --------------------------------------------------------------------------- errors name their key


@pytest.mark.parametrize("change,message", [
    (lambda d: d["models"]["m"].update(k=1), r"^models\.m\.k: must be 0 or >= 2"),
    (lambda d: d["models"]["m"].update(k=-2), r"^models\.m\.k: must be 0 or >= 2"),
    (lambda d: d["models"]["m"].update(k="2"), r"^models\.m\.k: must be an integer"),
    (lambda d: d["models"]["m"].update(mode="coded", k=2), r"^models\.m\.mode: must be one of"),
    (lambda d: d["models"]["m"].update(mode="parm"), r"^models\.m\.k: mode \"parm\" needs k >= 2"),
    (lambda d: d["models"]["m"].update(mode="none", k=2), r"^models\.m\.mode: \"none\" with k = 2"),
    (lambda d: d["models"]["m"].update(workers=0), r"^models\.m\.workers: must be >= 1"),
    (lambda d: d["models"]["m"].update(hosts=["x"]), r"^models\.m\.hosts: 'x' is not in \[hosts\]"),
    (lambda d: d["models"]["m"].update(wrokers=2), r"^models\.m\.wrokers: unknown key"),
    (lambda d: d["models"]["m"].update(builtin="magic"), r"^models\.m\.builtin: must be \"noop\", \"sleep\", \"kairos\" or \"serf_host\""),
    (lambda d: d["models"]["m"].update(store_name="x"), r"^models\.m\.store_name: a builtin model has no store_name"),
    (lambda d: d["models"]["m"].update(fixed_ms=3), r"^models\.m\.fixed_ms: the builtin \"noop\" model has no cost"),
    (lambda d: d["models"]["m"].update(input_shape=[0]), r"^models\.m\.input_shape: must be positive"),
    (lambda d: d["models"]["m"].update(max_batch=0), r"^models\.m\.max_batch: must be >= 1"),
    (lambda d: d["models"]["m"].update(fixed_batch=100), r"^models\.m\.fixed_batch: must be in 1\.\.max_batch"),
    (lambda d: d["models"]["m"].update(deadline_ms=0), r"^models\.m\.deadline_ms: must be > 0"),
    (lambda d: d["models"]["m"].update(default_output=[1.0]), r"^models\.m\.default_output: needs output_size = 10"),
    (lambda d: d["models"]["m"].update(encoder="xor", k=2), r"^models\.m\.encoder: must be \"add\" or \"concat\""),
    (lambda d: d["models"]["m"].update(parity_store_name="p"), r"^models\.m\.parity_store_name: only used with mode = \"parm\""),
    (lambda d: d["models"]["m"].update(worker={"model": "x"}), r"^models\.m\.worker\.model: is set by the spec"),
    (lambda d: d["models"]["m"].update(worker={"slotz": 1}), r"^models\.m\.worker\.slotz: unknown key; worker options"),
    (lambda d: d["models"]["m"].update(worker={"slots": 0}), r"^models\.m\.worker: slots and max_batch must be >= 1"),
    (lambda d: d["models"].update({"bad name": {"builtin": "noop"}}), r"^models\.bad name: model names"),
    (lambda d: d.pop("models"), r"^models: required"),
    (lambda d: d.update(models={}), r"^models: needs at least one"),
    (lambda d: d.update(extra=1), r"^extra: unknown key"),
    (lambda d: d["cluster"].update(base_port=70000), r"^cluster\.base_port: must be a port"),
    (lambda d: d["cluster"].update(base_port=65535), r"^cluster\.base_port: ports on 127\.0\.0\.1 run past 65535"),
    (lambda d: d["cluster"].update(base_port=9000, metrics_base_port=9002), r"^cluster\.metrics_base_port: .* collides"),
    (lambda d: d["cluster"].update(name="a/b"), r"^cluster\.name: 'a/b' must be"),
    (lambda d: d["cluster"].update(store=3), r"^cluster\.store: must be a string"),
    (lambda d: d.update(hosts={}), r"^hosts: needs at least one host"),
    (lambda d: d.update(hosts={"a": "tcp://x"}), r"^hosts\.a: must be an address"),
    (lambda d: d.update(frontend={"host": "nowhere"}), r"^frontend\.host: 'nowhere' is not in \[hosts\]"),
    (lambda d: d.update(frontend={"host": "local", "hosts": ["local"]}), r"^frontend\.hosts: give host or hosts"),
    (lambda d: d.update(frontend={"client_endpoint": "tcp://x:1"}), r"^frontend\.client_endpoint: is set by the spec"),
    (lambda d: d.update(frontend={"cache_size": -1}), r"^frontend: cache_size must be >= 0"),
    (lambda d: d.update(worker={"heartbeat_liveness": 1}), r"^worker: heartbeat_liveness must be >= 2"),
    (lambda d: d.update(dispatcher={"polcy": "x"}), r"^dispatcher\.polcy: unknown key; dispatcher options"),
    (lambda d: d.update(decoder=[]), r"^decoder: must be a table"),
])
def test_errors_name_the_key(change, message):
    data = copy.deepcopy(noop())
    change(data)
    with pytest.raises(SpecError, match=message):
        load_spec(data)


def test_coded_models_must_agree_on_the_encoder():
    data = noop(k=2)
    data["models"]["n"] = {"builtin": "noop", "k": 2, "encoder": "concat"}
    with pytest.raises(SpecError, match=r"^models\.n\.encoder: coded models use \['add', 'concat'\]"):
        load_spec(data)


def test_file_errors(tmp_path):
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[cluster\n")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(bad)


def test_run_dir_of_needs_no_store(tmp_path):
    assert run_dir_of({"cluster": {"name": "x"}, "models": {"d": {"store_name": "absent"}}}) == str(Path("runs/x").absolute())
    assert run_dir_of({"cluster": {"run_dir": str(tmp_path)}}) == str(tmp_path)


# --------------------------------------------------------------------------- renderers


def test_render_supervisord_conf(tmp_path):
    from keel.deploy.supervisor import render

    data = noop(workers=2, k=2)
    data["cluster"]["run_dir"] = str(tmp_path / "run")
    data["frontend"] = {"admission_limit": 100}
    spec = load_spec(data)
    conf = render(spec, python="/venv/bin/python")
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";",))
    parser.read(conf)
    programs = [s.removeprefix("program:") for s in parser.sections() if s.startswith("program:")]
    assert programs == names(spec)
    for svc in spec.services:
        section = f"program:{svc.name}"
        config = tmp_path / "run" / "config" / f"{svc.name}.json"
        assert shlex.split(parser.get(section, "command").replace("%%", "%")) == svc.argv("/venv/bin/python", f"@{config}")
        assert orjson.loads(config.read_bytes()) == orjson.loads(to_json(svc.config))  # what `serve --config @FILE` reads
        assert parser.get(section, "autorestart") == "true" and parser.get(section, "stopsignal") == "TERM"
        assert parser.get(section, "stdout_logfile") == str(tmp_path / "run" / "logs" / f"{svc.name}.log")
        assert "PYTHONUNBUFFERED" in parser.get(section, "environment")
    assert parser.get("supervisord", "nodaemon") == "false"
    assert parser.get("supervisord", "pidfile") == str(tmp_path / "run" / "supervisord.pid")
    assert parser.get("unix_http_server", "file").endswith(".sock")


def test_render_escapes_percent_for_supervisord(tmp_path):
    from keel.deploy.supervisor import render

    data = noop()
    data["cluster"]["run_dir"] = str(tmp_path / "100%run")
    conf = render(load_spec(data)).read_text()
    assert "100%%run" in conf and "100%run" not in conf.replace("100%%run", "")


def test_render_systemd(tmp_path):
    from keel.deploy.supervisor import render_systemd

    data = noop(workers=3)
    data["hosts"] = {"a": "10.0.0.1", "b": "10.0.0.2"}
    data["dispatcher"] = {"host": "b"}
    spec = load_spec(data)
    paths = render_systemd(spec, "a", tmp_path, python="/opt/keel/.venv/bin/python", workdir="/opt/keel", etc_dir="/etc/keel")
    unit = (tmp_path / "keel-service@.service").read_text()
    assert "ExecStart=/opt/keel/.venv/bin/python -m keel.services.serve ${KEEL_ROLE} --config ${KEEL_CONFIG}" in unit
    assert "EnvironmentFile=/etc/keel/%i.env" in unit and "@" not in unit.replace("keel-service@", "").replace("%i", "")
    target = (tmp_path / "keel.target").read_text()
    on_a = [s.name for s in spec.by_host()["a"]]
    assert on_a == ["frontend", "worker-m-0", "worker-m-2"]
    assert "Wants=" + " ".join(f"keel-service@{n}.service" for n in on_a) in target
    env = (tmp_path / "keel" / "worker-m-0.env").read_text()
    assert "KEEL_ROLE=worker\n" in env and "KEEL_CONFIG=@/etc/keel/worker-m-0.json\n" in env
    conf = orjson.loads((tmp_path / "keel" / "worker-m-0.json").read_bytes())
    assert from_dict("worker", conf) == spec.service("worker-m-0").config
    assert not (tmp_path / "keel" / "dispatcher.env").exists() and len(paths) == 2 + 2 * len(on_a)
    with pytest.raises(SpecError, match="host 'zz'"):
        render_systemd(spec, "zz", tmp_path)


def test_cli_parser_and_info_tables():
    from keel.deploy.cli import add_parser, info_tables

    parser = argparse.ArgumentParser(prog="keel")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["predict", "--spec", "s.toml", "m", "--input", "[1, 2]", "--timeout-ms", "50"])
    assert (args.spec, args.model, args.input, args.timeout_ms) == ("s.toml", "m", ["[1, 2]"], 50.0)
    for argv in (["up", "s.toml"], ["down", "runs/x"], ["status", "s.toml"], ["serve-spec", "s.toml", "--service", "w"],
                 ["render-systemd", "s.toml", "--out", "o"]):
        assert callable(parser.parse_args(argv).func)
    tables = info_tables({"service": "dispatcher", "queues": {"m": 0}, "workers": {"w0": {"batch_size": 4, "queue": 1}}})
    assert tables[0] == ("", [{"key": "service", "value": "dispatcher"}, {"key": "queues", "value": {"m": 0}}])
    assert tables[1] == ("workers", [{"workers": "w0", "batch_size": 4, "queue": 1}])


# --------------------------------------------------------------------------- addresses and relations


@pytest.mark.parametrize("address", ["999.1.1.1", "1.2.3", "10.0.0.256", "-bad.host", "a..b", "host name", "x" * 254])
def test_bad_host_addresses_are_refused(address):
    with pytest.raises(SpecError, match=r"^hosts\.local: must be an address"):
        load_spec({**noop(), "hosts": {"local": address}})


@pytest.mark.parametrize("address", ["127.0.0.1", "10.213.0.2", "localhost", "node-1.lan"])
def test_good_host_addresses_pass(address):
    assert load_spec({**noop(), "hosts": {"local": address}}).hosts["local"] == address


def test_batch_budget_must_not_exceed_the_deadline():
    with pytest.raises(SpecError, match=r"^models\.m\.batch_budget_ms: must be <= deadline_ms \(50\)"):
        load_spec(noop(deadline_ms=50, batch_budget_ms=80))


def test_batch_delay_must_stay_under_the_aimd_budget():
    with pytest.raises(SpecError, match=r"^models\.m\.batch_delay_ms: must be < batch_budget_ms \(20\)"):
        load_spec(noop(batch_delay_ms=20))
    load_spec(noop(batch_delay_ms=20, fixed_batch=4))  # no AIMD: the delay is only a wait


@pytest.mark.parametrize("tables,where", [
    ({"dispatcher": {"heartbeat_interval_s": 0.1, "heartbeat_liveness": 2}, "worker": {"heartbeat_interval_s": 0.5}},
     r"^worker: heartbeat settings disagree with the dispatcher's: the dispatcher's liveness window"),
    ({"dispatcher": {"heartbeat_interval_s": 1.0}, "worker": {"heartbeat_interval_s": 0.1, "heartbeat_liveness": 3}},
     r"^worker: heartbeat settings disagree with the dispatcher's: the worker's liveness window"),
    ({"dispatcher": {"heartbeat_interval_s": 1.5}},
     r"^worker: heartbeat settings disagree with the dispatcher's: the worker's liveness window"),
])
def test_worker_and_dispatcher_heartbeats_must_agree(tables, where):
    with pytest.raises(SpecError, match=where):
        load_spec({**noop(), **tables})


def test_status_endpoints_and_binds_come_from_the_role_table():
    from keel.common.roles import ROLES

    spec = load_spec(noop(workers=2, k=2))
    status = spec.status_endpoints()
    assert {n: status[n] for n in ("frontend", "dispatcher")} == {
        "frontend": spec.service("frontend").config.client_endpoint,
        "dispatcher": spec.service("dispatcher").config.worker_endpoint}
    # every other process answers Status on an endpoint of its own, allocated by the spec
    others = [s for s in spec.services if s.role not in ("frontend", "dispatcher")]
    assert {s.role for s in others} == {"worker", "encoder", "decoder"}
    for svc in others:
        assert status[svc.name] == svc.config.status_endpoint and svc.config.status_endpoint.startswith("tcp://")
    assert len(set(status.values())) == len(spec.services)
    for svc in spec.services:
        assert svc.endpoints() == [getattr(svc.config, f) for f in ROLES[svc.role].binds]
        assert type(svc.config) is ROLES[svc.role].config


# --------------------------------------------------------------------------- the reference


def _known(data: dict) -> list[str]:
    """The "known keys" an unknown key's error lists."""
    import ast

    with pytest.raises(SpecError) as err:
        load_spec(data)
    return ast.literal_eval(str(err.value).split("known keys here: ", 1)[1])


def test_unknown_table_lists_every_table_the_reader_accepts_and_the_reference_has_them_all():
    reference = (EXAMPLES.parents[1] / "docs" / "deploy.md").read_text()
    tables = _known({"models": {"m": {"builtin": "noop"}}, "gatway": {}})
    assert {"gateway", "applications", "manager", "graph", "pools", "cluster", "models"} <= set(tables)
    for table in tables:
        assert f"[{table}" in reference, f"[{table}] is not in docs/deploy.md"
    for key in _known({"models": {"m": {"builtin": "noop"}}, "cluster": {"nme": "x"}}):
        assert f"| `{key}` |" in reference, f"cluster.{key} is not in docs/deploy.md's [cluster] table"
