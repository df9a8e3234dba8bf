"""The ``[graph]`` tables of a cluster spec: a HAMS service graph (a DAG of operators,
the frontend as entry and exit).

Format::

    [graph]
    mode = "nspb"            # bare | remus | nspb | s1 | s2 | strawman | ls (common.spec.modes)
    checkpoint_every = 150   # ls: batches between checkpoints of a stateful operator's whole state
    checkpoint_dir = "..."   # ls (optional): the global storage; the trace_dir when left out
    window = 1               # NSPB: states in flight to the backup (1 = HAMS §III-B)
    input_shape = [8]        # one request's input, as the frontend receives it
    edges = [["frontend", "gru1"], ["gru1", "gru2"], ["gru2", "frontend"]]

    [graph.operators.gru1]
    kind = "gru"             # builtin (common.spec.operators) or "module:Class"
    input_shape = [8]
    output_shape = [16]
    max_batch = 8
    pad_ms = 5.0             # pad each batch's service time (experiments)
    join = "combine"         # an operator with several inputs: "combine" | "interleave"
    options = {}             # passed to the operator's constructor
    state_delay_ms = 0.0     # test hook: the backup takes each shipped state this much late
                             # (a slow state delivery: HAMS Fig. 6's delayed O2)

``trace_dir`` (optional, in ``[graph]``): every graph process writes its trace there
(``services.graph.events``, its event log) for the chaos harness's HAMS invariants.

``host`` (optional): the host of ``[hosts]`` the graph's processes run on (default: the first
frontend's). ``placement`` (optional) puts single processes elsewhere, by their key: an
operator's name (a stateful one's primary), ``NAME.backup`` (its backup), ``standbyN`` (a
hot standby, one per stateless kind in the order of ``GraphSpec.standby_kinds``); a primary
and its backup on two hosts survive the loss of either host::

    placement = {g1 = "a", "g1.backup" = "b"}

Errors (``GraphError``, a ``SpecError``) name the key at fault: a cycle, an unknown
operator, a shape mismatch between an edge's ends, an operator the frontend cannot reach
or whose outputs never reach the frontend.

Example
-------
>>> g = read_graph({"input_shape": [4], "edges": [["frontend", "m"], ["m", "frontend"]],
...                 "operators": {"m": {"kind": "mlp", "input_shape": [4], "output_shape": [2]}}})
>>> g.order, g.stateful
(['m'], frozenset())
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from keel.common.spec.modes import MODES
from keel.common.spec.operators import operator_stateful
from keel.common.spec.tables import SpecError

FRONTEND = "frontend"

JOINS = ("combine", "interleave")


class GraphError(SpecError):
    """A service graph that cannot run: the message starts with the key at fault."""


@dataclass(frozen=True)
class OperatorSpec:
    name: str
    kind: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    stateful: bool
    max_batch: int = 8
    pad_ms: float = 0.0
    join: str = "combine"
    options: dict = field(default_factory=dict)
    state_delay_ms: float = 0.0


@dataclass(frozen=True)
class GraphSpec:
    mode: str
    window: int
    input_shape: tuple[int, ...]
    operators: dict[str, OperatorSpec]
    edges: tuple[tuple[str, str], ...]
    #: operators in a topological order
    order: list[str]
    #: where the processes write their traces (None: no traces)
    trace_dir: str | None = None
    #: ls: batches between checkpoints; where they are written (None: the trace_dir)
    checkpoint_every: int = 150
    checkpoint_dir: str | None = None
    #: the host of a cluster spec where the operators run (None: the first frontend's)
    host: str | None = None
    #: process key (``process_keys``) -> its host, where it is not ``host``
    placement: dict[str, str] = field(default_factory=dict)

    @property
    def stateful(self) -> frozenset[str]:
        """Stateful operators whose state is kept durable (none in bare mode)."""
        if self.mode == "bare":
            return frozenset()
        return frozenset(n for n, op in self.operators.items() if op.stateful)

    def successors(self, node: str) -> list[str]:
        return [b for a, b in self.edges if a == node]

    def predecessors(self, node: str) -> list[str]:
        return [a for a, b in self.edges if b == node]

    def outputs_per_origin(self, node: str) -> int:
        """How many outputs ``node`` emits per request the frontend admits: one per input it
        takes, so an interleaving join emits the sum of its predecessors' (HAMS S1)."""
        if node == FRONTEND:
            return 1
        preds = self.predecessors(node)
        if len(preds) > 1 and self.operators[node].join == "interleave":
            return sum(self.outputs_per_origin(p) for p in preds)
        return self.outputs_per_origin(preds[0])

    @property
    def replies_per_origin(self) -> int:
        """Outputs that reach the frontend per request; it answers once all have arrived."""
        return self.outputs_per_origin(self.predecessors(FRONTEND)[0])

    @property
    def standby_kinds(self) -> list[str]:
        """Kinds of stateless operators: one hot standby each (HAMS §II-B), none in bare mode."""
        if self.mode == "bare":
            return []
        return sorted({op.kind for op in self.operators.values() if not op.stateful})

    def process_keys(self) -> list[str]:
        """Every process of the graph by key: per operator its name (a stateful one's
        primary) and, unless the mode is bare, ``NAME.backup`` for a stateful one; then
        ``standbyN``, one hot standby per stateless kind."""
        keys = []
        for name in self.order:
            keys += [name, f"{name}.backup"] if name in self.stateful else [name]
        return keys + [f"standby{i}" for i in range(len(self.standby_kinds))]

    def next_stateful(self, node: str) -> list[str]:
        """Stateful operators downstream of ``node`` (the ones its backup notifies)."""
        seen, todo, out = set(), self.successors(node), []
        while todo:
            n = todo.pop()
            if n in seen or n == FRONTEND:
                continue
            seen.add(n)
            if n in self.stateful:
                out.append(n)
            todo += self.successors(n)
        return sorted(out)

    def to_dict(self) -> dict:
        return {"mode": self.mode, "window": self.window, "input_shape": list(self.input_shape),
                **({"host": self.host} if self.host else {}), **({"placement": dict(self.placement)} if self.placement else {}),
                "checkpoint_every": self.checkpoint_every,
                **({"checkpoint_dir": self.checkpoint_dir} if self.checkpoint_dir else {}),
                "edges": [list(e) for e in self.edges],
                "operators": {n: {"kind": o.kind, "input_shape": list(o.input_shape),
                                  "output_shape": list(o.output_shape), "max_batch": o.max_batch,
                                  "pad_ms": o.pad_ms, "join": o.join, "options": o.options,
                                  **({"state_delay_ms": o.state_delay_ms} if o.state_delay_ms else {})}
                              for n, o in self.operators.items()}}


def _shape(value, key: str) -> tuple[int, ...]:
    if not (isinstance(value, list) and value and all(type(d) is int and d > 0 for d in value)):
        raise GraphError(f"{key}: must be a non-empty list of positive ints, got {value!r}")
    return tuple(value)


def read_graph(table: dict, prefix: str = "graph") -> GraphSpec:
    """Check and build a ``GraphSpec`` from a ``[graph]`` table."""
    table = dict(table)
    mode = table.pop("mode", "nspb")
    if mode not in MODES:
        raise GraphError(f"{prefix}.mode: {mode!r} is not one of {list(MODES)}")
    window = table.pop("window", 1)
    if type(window) is not int or window < 1:
        raise GraphError(f"{prefix}.window: must be an int >= 1, got {window!r}")
    checkpoint_every = table.pop("checkpoint_every", 150)
    if type(checkpoint_every) is not int or checkpoint_every < 1:
        raise GraphError(f"{prefix}.checkpoint_every: must be an int >= 1 (batches between ls checkpoints), "
                         f"got {checkpoint_every!r}")
    checkpoint_dir = table.pop("checkpoint_dir", None)
    if checkpoint_dir is not None and not isinstance(checkpoint_dir, str):
        raise GraphError(f"{prefix}.checkpoint_dir: must be a path")
    input_shape = _shape(table.pop("input_shape", None), f"{prefix}.input_shape")
    trace_dir = table.pop("trace_dir", None)
    if trace_dir is not None and not isinstance(trace_dir, str):
        raise GraphError(f"{prefix}.trace_dir: must be a path")
    host = table.pop("host", None)
    if host is not None and not isinstance(host, str):
        raise GraphError(f"{prefix}.host: must name a host of the spec")
    placement = table.pop("placement", None) or {}
    if not (isinstance(placement, dict) and all(isinstance(h, str) for h in placement.values())):
        raise GraphError(f"{prefix}.placement: must map process keys to hosts of the spec")
    raw_ops = table.pop("operators", None)
    if not isinstance(raw_ops, dict) or not raw_ops:
        raise GraphError(f"{prefix}.operators: needs at least one [{prefix}.operators.NAME] table")
    operators = {}
    for name, raw in raw_ops.items():
        key = f"{prefix}.operators.{name}"
        if name == FRONTEND:
            raise GraphError(f"{key}: 'frontend' is the graph's entry and exit, not an operator")
        raw = dict(raw)
        kind = raw.pop("kind", None)
        if not isinstance(kind, str):
            raise GraphError(f"{key}.kind: must name a builtin operator or 'module:Class'")
        try:
            stateful = operator_stateful(kind)
        except (ImportError, AttributeError, ValueError) as exc:
            raise GraphError(f"{key}.kind: {exc}") from None
        op = OperatorSpec(name, kind, _shape(raw.pop("input_shape", None), f"{key}.input_shape"),
                          _shape(raw.pop("output_shape", None), f"{key}.output_shape"), stateful,
                          raw.pop("max_batch", 8), float(raw.pop("pad_ms", 0.0)), raw.pop("join", "combine"),
                          dict(raw.pop("options", {})), float(raw.pop("state_delay_ms", 0.0)))
        if type(op.max_batch) is not int or not 1 <= op.max_batch <= 1024:
            raise GraphError(f"{key}.max_batch: must be an int in 1..1024")
        if op.join not in JOINS:
            raise GraphError(f"{key}.join: {op.join!r} is not one of {list(JOINS)}")
        if raw:
            raise GraphError(f"{key}: unknown option(s) {sorted(raw)}")
        operators[name] = op
    edges = []
    for i, edge in enumerate(table.pop("edges", None) or []):
        if not (isinstance(edge, list) and len(edge) == 2 and all(isinstance(e, str) for e in edge)):
            raise GraphError(f"{prefix}.edges[{i}]: must be [from, to], got {edge!r}")
        for end in edge:
            if end != FRONTEND and end not in operators:
                raise GraphError(f"{prefix}.edges[{i}]: unknown operator {end!r} (operators: {sorted(operators)})")
        if edge[0] == edge[1]:
            raise GraphError(f"{prefix}.edges[{i}]: {edge[0]!r} -> itself is a cycle")
        edges.append((edge[0], edge[1]))
    if table:
        raise GraphError(f"{prefix}: unknown option(s) {sorted(table)}")
    if not edges:
        raise GraphError(f"{prefix}.edges: needs at least frontend -> an operator -> frontend")
    order = _topological(operators, edges, prefix)
    graph = GraphSpec(mode, window, input_shape, operators, tuple(edges), order, trace_dir, checkpoint_every,
                      checkpoint_dir, host, dict(placement))
    _check_shapes(graph, prefix)
    unknown = sorted(set(placement) - set(graph.process_keys()))
    if unknown:
        raise GraphError(f"{prefix}.placement: {unknown} are not processes of the graph ({graph.process_keys()})")
    return graph


def _topological(operators: dict, edges: list, prefix: str) -> list[str]:
    inner = [(a, b) for a, b in edges if a != FRONTEND and b != FRONTEND]
    indegree = {n: 0 for n in operators}
    for _, b in inner:
        indegree[b] += 1
    ready = sorted(n for n, d in indegree.items() if d == 0)
    order = []
    while ready:
        n = ready.pop(0)
        order.append(n)
        for a, b in inner:
            if a == n:
                indegree[b] -= 1
                if indegree[b] == 0:
                    ready.append(b)
    if len(order) != len(operators):
        cyclic = sorted(n for n in operators if n not in order)
        raise GraphError(f"{prefix}.edges: a cycle through {cyclic}; a service graph is a DAG")
    sources = {b for a, b in edges if a == FRONTEND}
    sinks = {a for a, b in edges if b == FRONTEND}
    for n in order:  # every operator fed from the frontend and feeding it, through the graph
        if not any(a in order[:order.index(n)] or a == FRONTEND for a, b in edges if b == n):
            raise GraphError(f"{prefix}.edges: operator {n!r} has no input")
        if not any(b == FRONTEND or b in operators for a, b in edges if a == n):
            raise GraphError(f"{prefix}.edges: operator {n!r}'s outputs go nowhere")
    if not sources or not sinks:
        raise GraphError(f"{prefix}.edges: the frontend must feed an operator and receive from one")
    if len(sinks) != 1:
        raise GraphError(f"{prefix}.edges: exactly one operator answers the frontend (a join combines), got {sorted(sinks)}")
    return order


def _check_shapes(graph: GraphSpec, prefix: str) -> None:
    def out_shape(node: str) -> tuple[int, ...]:
        return graph.input_shape if node == FRONTEND else graph.operators[node].output_shape

    for name in graph.order:
        op, preds = graph.operators[name], graph.predecessors(name)
        shapes = [out_shape(p) for p in preds]
        if len(preds) > 1 and op.join == "combine":
            several = [p for p in preds if graph.outputs_per_origin(p) > 1]
            if several:
                raise GraphError(f"{prefix}.operators.{name}.join: a combining join takes one input per request from "
                                 f"each predecessor, but {several} emit several (after an interleaving join)")
            if any(s[:-1] != shapes[0][:-1] for s in shapes) or op.input_shape != (*shapes[0][:-1], sum(s[-1] for s in shapes)):
                raise GraphError(f"{prefix}.operators.{name}.input_shape: {list(op.input_shape)} does not combine its "
                                 f"inputs {dict(zip(preds, map(list, shapes)))} (concatenated on the last axis)")
            continue
        for pred, shape in zip(preds, shapes):
            if shape != op.input_shape:
                raise GraphError(f"{prefix}.edges: {pred} -> {name}: shape mismatch, {pred} emits {list(shape)}, "
                                 f"{name} takes {list(op.input_shape)}")


def graph_operators(graph: GraphSpec, frontends: list[str], endpoint: Callable[[str, str], str], host: str = "local",
                    seed: int = 0, trace_dir: str | None = None, manager: tuple[list[str], list[str]] | None = None,
                    prefix: str = "op-") -> tuple[list, dict[str, str]]:
    """The operator processes of ``graph`` (``ServiceLaunch``es) and the peers table every
    frontend's route and every operator reads (node -> PULL endpoint): per stateless
    operator one process; per stateful operator a primary and, unless the mode is bare, a
    backup (roles and epoch 1 from the spec: the manager's decisions move them later, in
    each operator's ``RoleRecord``); unless the mode is bare, one hot standby per kind of
    stateless operator (``standby0``, ...), which HAMS II's failover promotes (the keys of
    ``GraphSpec.process_keys``). ``frontends``: the graph endpoint of each frontend serving
    the graph (``peers["frontend"]`` is the first); each process runs on ``host`` or its
    ``graph.placement``; ``endpoint(service name, its host)`` allocates an endpoint where
    that process listens; process names are ``prefix`` + the key (``op-g1``, ``op-g1-backup``)."""
    from keel.common import config as cfg
    from keel.common.spec.topology import ServiceLaunch

    trace_dir = trace_dir or graph.trace_dir
    link = {"manager": cfg.ManagerLinkConfig(list(manager[0]), list(manager[1]))} if manager else {}

    def service(key: str) -> str:
        return f"{prefix}{key.replace('.', '-')}"

    table = graph_table(graph, trace_dir)
    peers = {FRONTEND: frontends[0]}
    plan = []
    for name in graph.order:
        op = graph.operators[name]
        roles = ["primary", "backup"] if name in graph.stateful else ["primary" if op.stateful else "stateless"]
        plan += [(f"{name}.backup" if r == "backup" else name, name, r) for r in roles]
    for i, kind in enumerate(graph.standby_kinds):  # a standby is named by the first operator of its kind
        plan.append((f"standby{i}", next(n for n in graph.order if graph.operators[n].kind == kind), "standby"))
    at = {key: graph.placement.get(key, host) for key, _, _ in plan}
    for key, _, _ in plan:
        peers[key] = endpoint(service(key), at[key])
    services = []
    for key, name, r in plan:
        services.append(ServiceLaunch(service(key), "graph_operator", at[key], cfg.GraphOperatorConfig(
            name=service(key), operator=name, role=r, epoch=1, endpoint=peers[key],
            status_endpoint=endpoint(service(key), at[key]), graph=table, peers=peers, frontends=list(frontends),
            seed=seed, trace_path=f"{trace_dir}/{prefix}{key}.jsonl" if trace_dir else None, **link)))
    return services, peers


def graph_table(graph: GraphSpec, trace_dir: str | None = None) -> dict:
    """The graph's table as every process of it reads it (``ls``: the checkpoints' place)."""
    table = graph.to_dict()
    if graph.mode == "ls":  # the checkpoints' global storage: every process of the graph reads the same place
        table["checkpoint_dir"] = graph.checkpoint_dir or trace_dir or graph.trace_dir
        if not table["checkpoint_dir"]:
            raise GraphError("graph.checkpoint_dir: mode 'ls' needs a checkpoint_dir (or a trace_dir) for its checkpoints")
    return table


def route_config(graph: GraphSpec, name: str, endpoint: str, peers: dict[str, str], lane: int = 0, lanes: int = 1,
                 trace_dir: str | None = None, frontend: str = "frontend"):
    """What a frontend needs to serve ``graph`` as ``name`` (``GraphRouteConfig``): its
    graph endpoint (a PULL it binds), where the operators are, its lane among ``lanes``
    frontends, and its trace (``<trace_dir>/<frontend>-<name>.jsonl``)."""
    from keel.common import config as cfg

    trace_dir = trace_dir or graph.trace_dir
    return cfg.GraphRouteConfig(graph=graph_table(graph, trace_dir), endpoint=endpoint,
                                peers={k: v for k, v in peers.items() if k != FRONTEND}, lane=lane, lanes=lanes,
                                trace_path=f"{trace_dir}/{frontend}-{name}.jsonl" if trace_dir else None)


def wire_graphs(graphs: dict[str, GraphSpec], services: list, hosts: dict[str, str], ports, default_host: str) -> list:
    """Every frontend of ``services`` serves every graph of ``graphs`` (name ->
    ``GraphSpec``): each gets a graph endpoint of its own per graph (on its host) and a lane;
    a graph's operators run on its ``host`` (``default_host`` when it names none; single ones on
    their ``placement``) and send to
    the frontends (``frontends``; the first is ``peers["frontend"]``). Returns the operators'
    services; operator processes are ``op-OPERATOR``, or ``op-GRAPH-OPERATOR`` when the spec
    has several graphs. A spec with a ``[manager]`` links every operator to it."""
    frontends = [s for s in services if s.role == "frontend"]
    # with a [manager] table (wired before the graphs) the operators follow it as the frontends
    # do: HAMS II's failover (promotions, fencing) is the manager's
    link = getattr(frontends[0].config, "manager", None) if frontends else None
    manager = (list(link.endpoints), list(link.publish_endpoints)) if link is not None else None
    operators = []
    for name, graph in graphs.items():
        routes = [ports.tcp(hosts[fe.host], fe.name) for fe in frontends]
        host = graph.host or default_host
        prefix = "op-" if len(graphs) == 1 else f"op-{name}-"
        unknown = sorted(h for h in graph.placement.values() if h not in hosts)
        if unknown:
            raise GraphError(f"graphs.{name}.placement: {unknown} are not in [hosts] ({sorted(hosts)})")
        ops, peers = graph_operators(graph, routes, lambda svc, at: ports.tcp(hosts[at], svc), host,
                                     manager=manager, prefix=prefix)
        operators += ops
        for lane, (fe, endpoint) in enumerate(zip(frontends, routes)):
            fe.config.graphs = {**fe.config.graphs, name: route_config(graph, name, endpoint, peers, lane, len(frontends),
                                                                       frontend=fe.name)}
    return operators
