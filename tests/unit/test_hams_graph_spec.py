"""The [graph] tables: a valid graph loads (alone or beside [models]); a cycle, an unknown
operator, a shape mismatch, a bad join and a bad mode are errors naming the key."""
from __future__ import annotations

import pytest

from keel.common.spec import SpecError, load_spec
from keel.common.spec.graph import GraphError, read_graph


def chain(**over):
    g = {"input_shape": [4], "edges": [["frontend", "a"], ["a", "b"], ["b", "frontend"]],
         "operators": {"a": {"kind": "gru", "input_shape": [4], "output_shape": [6]},
                       "b": {"kind": "mlp", "input_shape": [6], "output_shape": [2]}}}
    g.update(over)
    return g


def test_chain_loads_with_roles_from_the_spec():
    g = read_graph(chain())
    assert g.order == ["a", "b"] and g.stateful == {"a"} and g.next_stateful("frontend") == ["a"]
    assert read_graph(chain(mode="bare")).stateful == frozenset()


@pytest.mark.parametrize("change, message", [
    (dict(edges=[["frontend", "a"], ["a", "b"], ["b", "a"], ["b", "frontend"]]), "cycle"),
    (dict(edges=[["frontend", "a"], ["a", "zz"], ["b", "frontend"]]), "unknown operator 'zz'"),
    (dict(input_shape=[5]), "shape mismatch"),
    (dict(mode="fast"), "graph.mode"),
    (dict(window=0), "graph.window"),
    (dict(mode="ls", checkpoint_every=0), r"graph.checkpoint_every: must be an int >= 1"),
    (dict(mode="ls", checkpoint_every=2.5), r"graph.checkpoint_every: must be an int >= 1"),
    (dict(mode="ls", checkpoint_dir=3), "graph.checkpoint_dir: must be a path"),
    (dict(edges=[["frontend", "a"], ["a", "frontend"], ["b", "frontend"]]), "has no input"),
])
def test_bad_graphs_are_clear_errors(change, message):
    with pytest.raises(GraphError, match=message):
        read_graph(chain(**change))


def test_ls_mode_checkpoints_every_150_batches_unless_told_and_needs_a_place_for_them(tmp_path):
    from keel.common.spec import modes
    from keel.common.spec.graph import MODES

    assert MODES is modes.MODES and MODES["ls"].checkpoints and not MODES["ls"].ships_state  # one list of modes
    g = read_graph(chain(mode="ls"))
    assert g.checkpoint_every == 150 and read_graph(g.to_dict()).checkpoint_every == 150
    assert read_graph(chain(mode="ls", checkpoint_every=7)).checkpoint_every == 7
    with pytest.raises(GraphError, match="graph.checkpoint_dir: mode 'ls' needs"):
        load_spec({"graphs": {"graph": chain(mode="ls")}})  # neither a checkpoint_dir nor a trace_dir: nowhere
    services = load_spec({"graphs": {"graph": chain(mode="ls", trace_dir=str(tmp_path))}}).services
    tables = [s.config.graphs["graph"].graph if s.role == "frontend" else s.config.graph for s in services]
    assert {t["checkpoint_dir"] for t in tables} == {str(tmp_path)}  # every process, the same storage


def test_join_shapes_and_unknown_kind():
    g = {"input_shape": [4], "edges": [["frontend", "a"], ["frontend", "b"], ["a", "j"], ["b", "j"], ["j", "frontend"]],
         "operators": {"a": {"kind": "gru", "input_shape": [4], "output_shape": [3]},
                       "b": {"kind": "mlp", "input_shape": [4], "output_shape": [2]},
                       "j": {"kind": "mlp", "input_shape": [5], "output_shape": [1]}}}
    assert read_graph(g).predecessors("j") == ["a", "b"]
    g["operators"]["j"]["input_shape"] = [4]
    with pytest.raises(GraphError, match="does not combine"):
        read_graph(g)
    with pytest.raises(GraphError, match="kind"):
        read_graph(chain(operators={**chain()["operators"], "a": {"kind": "nope", "input_shape": [4], "output_shape": [6]}}))


def test_cluster_spec_runs_a_graph():
    spec = load_spec({"graph": chain()})
    roles = sorted((s.name, s.role) for s in spec.services)
    assert ("frontend", "frontend") in roles and ("op-a-backup", "graph_operator") in roles
    route = spec.service("frontend").config.graphs["keel"]  # the [graph] table: a graph named after the cluster
    assert spec.service("op-a").config.peers["frontend"] == route.endpoint == spec.service("op-a").config.frontends[0]
    assert len(spec.services) == 5 and spec.client_endpoints  # frontend, a + backup, b, the mlp standby
    standby = next(s for s in spec.services if s.name == "op-standby0")
    assert standby.config.role == "standby" and standby.config.operator == "b"
    both = load_spec({"graph": chain(), "models": {"m": {"builtin": "noop", "workers": 1}}})
    ports = [ep for s in both.services for ep in s.endpoints()]
    assert len(ports) == len(set(ports))  # the graph's ports do not collide with the model cluster's
    with pytest.raises(SpecError, match="graph.edges"):
        load_spec({"graph": chain(edges=[["frontend", "a"], ["a", "frontend"], ["b", "frontend"]])})


def fan_in(join):
    return {"input_shape": [4], "edges": [["frontend", "a"], ["frontend", "b"], ["a", "j"], ["b", "j"], ["j", "frontend"]],
            "operators": {"a": {"kind": "gru", "input_shape": [4], "output_shape": [3]},
                          "b": {"kind": "mlp", "input_shape": [4], "output_shape": [3]},
                          "b2": {"kind": "mlp", "input_shape": [4], "output_shape": [3]},
                          "j": {"kind": "gru", "input_shape": [3], "output_shape": [2], "join": join}}}


def test_interleaving_join_emits_one_output_per_input_and_cannot_feed_a_combine():
    g = fan_in("interleave")
    g["edges"] = g["edges"] + [["frontend", "b2"], ["b2", "j"]]
    graph = read_graph(g)
    assert graph.outputs_per_origin("a") == 1 and graph.outputs_per_origin("j") == 3 and graph.replies_per_origin == 3
    assert graph.standby_kinds == ["mlp"]  # one hot standby for b and b2 together
    assert read_graph({**g, "mode": "bare"}).standby_kinds == []
    with pytest.raises(GraphError, match="shape mismatch"):  # interleaved inputs all have the operator's shape
        read_graph({**g, "operators": {**g["operators"], "b": {**g["operators"]["b"], "output_shape": [2]}}})
    after = dict(g, edges=[e for e in g["edges"] if e[1] != "frontend"] + [["j", "k"], ["a", "k"], ["k", "frontend"]],
                 operators={**g["operators"], "k": {"kind": "mlp", "input_shape": [5], "output_shape": [1]}})
    with pytest.raises(GraphError, match="combining join takes one input"):
        read_graph(after)


@pytest.mark.parametrize("name", ["hams-gru.toml", "hams-join.toml"])
def test_example_graph_specs_load(name):
    import tomllib
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "deploy" / "examples" / name
    data = tomllib.loads(path.read_text())
    spec = load_spec(data)
    assert spec.client_endpoints and all(s.role in ("frontend", "graph_operator") for s in spec.services)
    assert list(spec.service("frontend").config.graphs) == [name.removesuffix(".toml")]
    # the older single [graph] table is still read: the same graph, named after the cluster
    (graph,) = data.pop("graphs").values()
    old = load_spec({**data, "graph": graph})
    assert [(s.name, s.role) for s in old.services] == [(s.name, s.role) for s in spec.services]
    assert old.service("frontend").config.graphs.keys() == spec.service("frontend").config.graphs.keys()


def test_named_graphs_beside_models_served_by_every_frontend():
    """[graphs.NAME] tables beside a model, two frontends: each frontend serves every graph
    on an endpoint of its own and a lane of its own; each operator knows every frontend."""
    spec = load_spec({"hosts": {"a": "127.0.0.1", "b": "127.0.0.2"}, "frontend": {"hosts": ["a", "b"]},
                      "models": {"m": {"builtin": "noop", "workers": 1}},
                      "graphs": {"one": chain(), "two": chain(mode="bare")}})
    frontends = spec.role("frontend")
    assert [f.name for f in frontends] == ["frontend-0", "frontend-1"] and len(spec.client_endpoints) == 2
    for name in ("one", "two"):
        routes = [f.config.graphs[name] for f in frontends]
        assert [r.lane for r in routes] == [0, 1] and {r.lanes for r in routes} == {2}
        assert routes[1].endpoint.startswith("tcp://127.0.0.2:")  # on its own frontend's host
        op = spec.service(f"op-{name}-a")  # several graphs: operators named by graph
        assert op.config.frontends == [r.endpoint for r in routes] and op.config.peers["frontend"] == routes[0].endpoint
        assert routes[0].peers["a"] == op.config.endpoint
    ports = [ep for s in spec.services for ep in s.endpoints()]
    assert len(ports) == len(set(ports))


def test_a_graph_only_spec_gets_a_frontend_and_its_gateway():
    spec = load_spec({"graphs": {"g": chain()}, "gateway": {}})
    assert {s.role for s in spec.services} == {"frontend", "gateway", "graph_operator"}
    assert spec.service("gateway").config.frontend_endpoints == spec.local_client_endpoints
    assert spec.service("frontend").config.models == {} and list(spec.service("frontend").config.graphs) == ["g"]


@pytest.mark.parametrize("data, message", [
    ({"graphs": {"m": chain()}, "models": {"m": {"builtin": "noop"}}}, "graphs.m: 'm' is also a model's"),
    ({"cluster": {"name": "c"}, "graph": chain(), "graphs": {"c": chain()}}, "graphs.c: the \\[graph\\] table"),
    ({"graphs": {"g": chain(input_shape=[5])}}, "graphs.g.edges"),
])
def test_graph_names_are_targets_names(data, message):
    with pytest.raises(SpecError, match=message):
        load_spec(data)


def test_the_front_door_example_serves_a_model_an_application_and_a_graph():
    from pathlib import Path

    spec = load_spec(Path(__file__).resolve().parents[2] / "deploy" / "examples" / "front-door.toml")
    fe = spec.service("frontend").config
    assert list(fe.models) == ["m", "m2"] and list(fe.applications) == ["ensemble"] and list(fe.graphs) == ["chain"]


def test_a_graphs_operators_run_on_its_host_and_send_to_every_frontend():
    graph = {"input_shape": [4], "edges": [["frontend", "g"], ["g", "frontend"]], "host": "ops",
             "operators": {"g": {"kind": "gru", "input_shape": [4], "output_shape": [2]}}}
    spec = load_spec({"cluster": {"name": "c", "base_port": 9000},
                      "hosts": {"fe1": "127.0.0.2", "fe2": "127.0.0.3", "ops": "127.0.0.4"},
                      "frontend": {"hosts": ["fe1", "fe2"]}, "graphs": {"chain": graph}})
    ops = [s for s in spec.services if s.role == "graph_operator"]
    assert ops and {s.host for s in ops} == {"ops"}
    fronts = [s for s in spec.services if s.role == "frontend"]
    routes = [fe.config.graphs["chain"].endpoint for fe in fronts]
    assert [r.split(":")[1] for r in routes] == ["//127.0.0.2", "//127.0.0.3"]
    assert all(s.config.frontends == routes for s in ops)
    with pytest.raises(SpecError, match=r"graphs\.chain\.host: 'nowhere' is not in \[hosts\]"):
        load_spec({"cluster": {"name": "c", "base_port": 9000}, "graphs": {"chain": {**graph, "host": "nowhere"}}})


def test_loading_every_example_spec_imports_no_torch_and_sets_no_threads(tmp_path):
    """Reading a spec (``keel up``, ``keel status``, the gateway) is not an operator process:
    it imports neither torch nor the graph's models (whose process sets torch's threads)."""
    import subprocess
    import sys
    from pathlib import Path

    from keel.common.modelstore import Manifest

    folder = tmp_path / "store" / "digits-mlp" / "1"  # local.toml's model, from ./store: its manifest only
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_bytes(Manifest(name="digits-mlp", version="1", arch="mlp", input_shape=[64],
                                                    output_size=10).to_json())
    from tests.support.seed_models import seed_manifests

    seed_manifests(tmp_path / "store")  # models.toml's three models
    examples = sorted(str(p) for p in (Path(__file__).resolve().parents[2] / "deploy" / "examples").glob("*.toml"))
    assert any("hams" in e for e in examples)
    code = ("import sys\nfrom keel.common.spec import load_spec\n"
            f"for path in {examples!r}:\n    load_spec(path)\n"
            "print(sorted(m for m in ('torch', 'keel.services.graph.models') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_builtin_operator_table_says_what_each_class_is():
    from keel.common.spec.operators import BUILTIN_OPERATORS, operator_class, operator_stateful

    for kind, (_, stateful) in BUILTIN_OPERATORS.items():
        assert operator_class(kind).stateful is stateful is operator_stateful(kind)


def test_a_manager_table_links_every_operator_to_the_manager():
    """HAMS II's failover is the manager's: with a [manager] table the graph's operators
    follow the same replicas as the frontend (without one, none does)."""
    spec = load_spec({"graphs": {"g": chain()}, "manager": {}})
    link = spec.service("frontend").config.manager
    operators = spec.role("graph_operator")
    assert link is not None and len(operators) == 4  # a + its backup, b, b's kind's standby
    assert all((o.config.manager.endpoints, o.config.manager.publish_endpoints) == (link.endpoints, link.publish_endpoints)
               for o in operators)
    assert all(o.config.manager is None for o in load_spec({"graphs": {"g": chain()}}).role("graph_operator"))


def test_placement_puts_a_backup_on_a_host_of_its_own():
    """A primary and its backup on two hosts (a host's loss then loses one of them); every
    other process on the graph's host; a key that is not a process, or a host not in
    [hosts], is an error naming the key."""
    hosts = {"a": "127.0.0.1", "b": "127.0.0.2"}
    spec = load_spec({"hosts": hosts, "graphs": {"g": chain(placement={"a.backup": "b", "standby0": "b"})}})
    at = {s.name: (s.host, s.config.endpoint.rsplit(":", 1)[0]) for s in spec.role("graph_operator")}
    assert at == {"op-a": ("a", "tcp://127.0.0.1"), "op-a-backup": ("b", "tcp://127.0.0.2"),
                  "op-b": ("a", "tcp://127.0.0.1"), "op-standby0": ("b", "tcp://127.0.0.2")}
    assert read_graph(chain()).process_keys() == ["a", "a.backup", "b", "standby0"]
    with pytest.raises(GraphError, match=r"graph.placement: \['b.backup'\] are not processes"):
        read_graph(chain(placement={"b.backup": "b"}))  # b is stateless: no backup
    with pytest.raises(SpecError, match=r"graphs.g.placement: \['c'\] are not in \[hosts\]"):
        load_spec({"hosts": hosts, "graphs": {"g": chain(placement={"a.backup": "c"})}})
