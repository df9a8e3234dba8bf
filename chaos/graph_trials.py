"""HAMS kill trials on real processes: the service graphs the tests and the ``hams-recovery``
experiment run (``gru_chain``, ``fig6_chain``, ...), a graph started with its manager group
(``start_graph``), and one trial (``kill_trial``): open-loop load, a fault (SIGKILL, SIGSTOP,
a partition) on one or several operators' primaries, and what came of it (recovery times,
lost and conflicting replies, the HAMS invariants' verdicts), on loopback
(``run_trial(netns=False)``) or with every process on a network namespace of its own.
"""
from __future__ import annotations

import functools
import secrets
import signal
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import zmq

from keel.common import transport
from keel.common.client import Client
from keel.common.config import ManagerLinkConfig
from keel.common.protocol.messages import Reply
from keel.common.spec import load_spec
from keel.common.spec.graph import read_graph
from keel.common.waiting import wait_until
from keel.deploy.local import Launcher, free_port_block

def mlp_gru(max_batch: int = 4) -> dict:
    """A stateless operator first (its hot standby takes over), a stateful one after it."""
    return {"mode": "nspb", "window": 2, "input_shape": [4],
            "edges": [["frontend", "m"], ["m", "g"], ["g", "frontend"]],
            "operators": {"m": {"kind": "mlp", "input_shape": [4], "output_shape": [6], "max_batch": max_batch},
                          "g": {"kind": "gru", "input_shape": [6], "output_shape": [3], "max_batch": max_batch}}}


def gru_chain(max_batch: int = 4, pad_ms: float = 0.0, mode: str = "nspb", noise: float = 0.0) -> dict:
    """GRU -> GRU; ``noise`` > 0 makes both GRUs non-deterministic (every run, every
    re-execution differs: ``services.graph.models.GRU``)."""
    options = {"noise": noise} if noise else {}
    return {"mode": mode, "window": 2, "input_shape": [4],
            "edges": [["frontend", "g1"], ["g1", "g2"], ["g2", "frontend"]],
            "operators": {"g1": {"kind": "gru", "input_shape": [4], "output_shape": [6], "max_batch": max_batch,
                                 "pad_ms": pad_ms, "options": options},
                          "g2": {"kind": "gru", "input_shape": [6], "output_shape": [3], "max_batch": max_batch,
                                 "pad_ms": pad_ms, "options": options}}}


def noisy_chain() -> dict:
    return gru_chain(noise=0.01)


#: HAMS Fig. 6: g2's state delivery to its backup delayed this much (ms, one way)
FIG6_STATE_DELAY = {"g2": 30.0}


def fig6_chain(mode: str = "nspb", noise: float = 0.0) -> dict:
    """HAMS Fig. 6: GRU -> GRU -> GRU; the trial delays g2's state delivery to its backup
    (``FIG6_STATE_DELAY``, ``kill_trial``'s ``state_delay``), so g3's primary takes g2
    outputs its backup has not applied; g2's primary and g3's backup then die together."""
    options = {"noise": noise} if noise else {}
    gru = lambda i, o, **kw: {"kind": "gru", "input_shape": [i], "output_shape": [o], "max_batch": 4,  # noqa: E731
                              "options": options, **kw}
    return {"mode": mode, "window": 2, "input_shape": [4],
            "edges": [["frontend", "g1"], ["g1", "g2"], ["g2", "g3"], ["g3", "frontend"]],
            "operators": {"g1": gru(4, 6), "g2": gru(6, 5), "g3": gru(5, 3)}}


def strawman_chain() -> dict:
    """HAMS's strawman: only the frontend keeps inputs; a failover re-executes on a fresh state."""
    return gru_chain(mode="strawman", noise=0.01)


def ls_chain(checkpoint_every: int = 150, noise: float = 0.01, max_batch: int = 1) -> dict:
    """The paper's Lineage Stash baseline: GRU -> GRU, no state shipped per batch, a
    checkpoint every ``checkpoint_every`` batches; a failover loads it and replays.
    ``max_batch`` 1: a batch is one input, so the replay's batches are the logged ones
    (the seq order the lineage carries; batch boundaries of larger batches are not logged)."""
    return {**gru_chain(max_batch=max_batch, mode="ls", noise=noise), "checkpoint_every": checkpoint_every}


def trial_spec(table: dict, address_of: Callable[[str], str], trace_dir: Path, run_dir: Path):
    """A trial's cluster spec, read by ``load_spec`` as ``keel up`` reads one: the graph as
    ``[graphs.graph]`` with its event logs in ``trace_dir``, served by one frontend, every
    process on a host of its own named after it (``[hosts]`` from ``address_of``: loopback for
    all in local mode, where the spec's hops are ipc as a user's on one machine are; a
    network namespace each in netns mode, ``placement`` putting each operator's process on
    its own). The manager group is the harness's (``start_graph``): the trials freeze and
    kill its replicas."""
    keys = read_graph(table).process_keys()
    names = {key: "op-" + key.replace(".", "-") for key in keys}
    hosts = {name: address_of(name) for name in ["frontend", *names.values()]}
    return load_spec({"cluster": {"name": "hams-trial", "base_port": free_port_block(64), "run_dir": str(run_dir)},
                      "hosts": hosts, "frontend": {"host": "frontend"},
                      "graphs": {"graph": {**table, "trace_dir": str(trace_dir), "host": "frontend", "placement": names}}})


def start_graph(make_launcher: Callable[[str], Launcher], journal_dir: Path, table: dict, trace_dir: Path,
                ctx: zmq.Context | None = None, state_delay: dict[str, float] | None = None):
    """A manager group and the graph's processes, each stateful primary made its group's
    holder before its backup starts; every process at its launcher's ``address_of`` (netns
    mode: a host each), asked from ``ctx`` (one made inside the client host in netns mode).
    ``state_delay`` (operator -> ms, HAMS Fig. 6): that operator's state delivery to its
    backup delayed: in netns mode its primary's link to its backup goes through the chaos
    ``DelayProxy`` (on the backup's host), which holds every byte that long; in local mode
    (no proxy host) the spec's ``state_delay_ms`` hook (the backup holds each state).
    Returns (managers, graph, launcher, services by name, client endpoint, a manager client)."""
    import dataclasses

    from keel.deploy.manager_group import LocalGroup

    launcher = make_launcher("managers")
    # replicas on hosts of their own (not loopback) must authenticate what they unpickle
    secret = {} if launcher.address_of("manager-1").startswith("127.") else {"password": secrets.token_hex(16)}
    managers = LocalGroup(launcher, journal_dir, ctx=ctx, **secret)
    managers.start()
    run = make_launcher("graph")
    proxied = state_delay if state_delay and hasattr(run, "cluster") else None  # netns mode: a proxy host
    if state_delay and not proxied:  # local mode: the backup holds each state (the spec's hook)
        table = {**table, "operators": {n: {**spec, "state_delay_ms": state_delay[n]} if n in state_delay else spec
                                        for n, spec in table["operators"].items()}}
    graph = read_graph(table)
    try:  # a start that fails (a timeout on a loaded machine) must not leave the managers running
        managers.leader(timeout_s=30.0)
        spec = trial_spec(table, run.address_of, trace_dir, journal_dir.parent / "spec")
        link = ManagerLinkConfig(list(managers.endpoints), list(managers.publish_endpoints))
        services = [dataclasses.replace(s, config=dataclasses.replace(s.config, manager=link)) for s in spec.services]
        client = spec.client_endpoints[0]
        probe = managers.client()
        services, start_proxies = delay_state(run, services, proxied or {})
        for svc in services:
            run.start(svc)
            if svc.role == "graph_operator" and svc.config.role in ("primary", "stateless"):
                group = f"graph/{svc.config.operator}"
                wait_until(lambda: probe.call("snapshot")["groups"].get(group, {}).get("holder") == svc.name, timeout_s=30.0)
        for svc in services:
            run.wait_status(svc.config.status_endpoint if svc.role == "graph_operator" else svc.config.client_endpoint,
                            timeout_s=90, ctx=ctx)  # seven processes importing torch on a loaded machine
        backups = [s.name for s in services if s.role == "graph_operator" and s.config.role in ("backup", "standby")]
        wait_until(lambda: all(b in probe.call("snapshot")["services"] for b in backups), timeout_s=30.0)
        start_proxies()
    except BaseException:
        run.stop()
        managers.close()
        managers.launcher.stop()  # the replicas themselves: close() only ends the probe
        raise
    return managers, graph, run, {s.name: s for s in services}, client, probe


def delay_state(run, services, proxied: dict[str, float]):
    """``services`` with each ``proxied`` operator's primary sending to its backup through a
    ``chaos.proxy.DelayProxy`` on the backup's host (``proxied[operator]`` ms one way: the
    proxy's delay is a round trip), and a function that starts the proxies: call it once
    the backups run (a proxy with no backup behind it would accept and close, and the
    primary would read that as its backup's death; before it listens, connects are refused)."""
    import dataclasses

    from keel.chaos.proxy import DelayProxy

    proxies, out = [], []
    for svc in services:
        cfg = svc.config
        if svc.role == "graph_operator" and cfg.role == "primary" and cfg.operator in proxied:
            backup = next(s for s in services if s.name == f"op-{cfg.operator}-backup").config
            address, port = backup.endpoint.rsplit("//", 1)[1].rsplit(":", 1)
            listen = int(port) + 1000  # the backup's host runs nothing else
            run.address_of(backup.name)  # its host, made before the backup starts
            proxies.append(DelayProxy(run.cluster, backup.name, [(address, listen, address, int(port))],
                                      delay_ms=2 * proxied[cfg.operator], name="state-delay"))
            svc = dataclasses.replace(svc, config=dataclasses.replace(
                cfg, peers={**cfg.peers, f"{cfg.operator}.backup": f"tcp://{address}:{listen}"}))
        out.append(svc)
    return out, lambda: [p.start() for p in proxies]


class TrialClient(Client):
    """``keel.Client`` (its client id; a request unanswered for ``timeout_ms`` sent again)
    that also keeps the answers it drops: a user sees a request's first answer only, and a
    second is a violation a trial reports (``answered_twice``)."""

    def __init__(self, endpoint: str, timeout_ms: float = 30_000.0):
        super().__init__([endpoint], timeout_ms=timeout_ms, retries=1)
        self.again: list[Reply] = []  # answers to requests answered already

    def _result(self, reply, frontend: int):
        result = super()._result(reply, frontend)
        if result is None and isinstance(reply, Reply):
            self.again.append(reply)
        return result


def open_load(client: Client, inputs, streams, on_sent: Callable[[int], None], gap_s: float = 0.004,
              timeout_s: float = 60.0) -> dict[str, list]:
    """Send at a fixed rate (open loop) through ``client`` (a ``TrialClient``), calling
    ``on_sent(i)`` after each; every answer by request id (``r<i>``; a list: a second answer
    would be a violation)."""
    replies: dict[str, list] = {}

    def drain(wait_ms: int) -> None:
        results = client.collect(wait_ms)
        again, client.again = getattr(client, "again", []), []
        for result in [*results, *again]:  # every answer: a second one would be a violation
            replies.setdefault(result.request_id, []).append(result)

    for i, (x, s) in enumerate(zip(inputs, streams)):
        client.submit("graph", np.asarray(x, np.float32), key=str(int(s)), request_id=f"r{i}")
        on_sent(i)
        drain(int(gap_s * 1000))
    deadline = time.monotonic() + timeout_s
    while len(replies) < len(inputs) and time.monotonic() < deadline:
        drain(200)
    drain(300)  # a second answer to anything would show up here
    return replies


def mlp_gru_gru(max_batch: int = 4) -> dict:
    """A stateless operator, then two stateful ones: the correlated case kills m and g2 together."""
    return {"mode": "nspb", "window": 2, "input_shape": [4],
            "edges": [["frontend", "m"], ["m", "g1"], ["g1", "g2"], ["g2", "frontend"]],
            "operators": {"m": {"kind": "mlp", "input_shape": [4], "output_shape": [6], "max_batch": max_batch},
                          "g1": {"kind": "gru", "input_shape": [6], "output_shape": [5], "max_batch": max_batch},
                          "g2": {"kind": "gru", "input_shape": [5], "output_shape": [3], "max_batch": max_batch}}}


def kill_trial(make_launcher: Callable[[str], Launcher], workdir: Path, victim: str | tuple[str, ...] = "g2", n: int = 240,
               kill_at: int = 80, gap_s: float = 0.004, seed: int = 0, fault: str = "kill",
               table: dict | None = None, rejoin: bool = False, also_kill: tuple[str, ...] = (),
               state_delay: dict[str, float] | None = None) -> dict[str, Any]:
    """One trial: after ``kill_at`` of ``n`` requests, SIGKILL (``fault="kill"``) the
    primary of ``victim`` (one operator, or several together: a correlated failure), or
    SIGSTOP it (``fault="freeze"``: its sockets stay open, only the manager's heartbeat
    silence detects it) and SIGCONT it once the manager has promoted its backup: the thawed
    old primary must be fenced and release nothing. ``rejoin`` (one stateful victim, a
    kill): once the backup was promoted, the killed primary's process is started again as a
    new member of the group (``joiner``, standing in for a standby host); once the new
    primary has brought it up to date (no longer degraded), the new primary is SIGKILLed
    too: the second failover promotes the joiner, and must lose and contradict nothing.
    ``state_delay`` (operator -> ms): that operator's state delivery to its backup delayed
    (Fig. 6; ``start_graph``).
    ``also_kill``: more processes SIGKILLed with the victims (Fig. 6: a successor's backup);
    an operator whose backup is among them recovers too (its primary goes on alone from its
    newest shipped state, rolled back in place at a new epoch): it counts as a victim for the
    times, and ``victim`` may be empty (only a backup killed)."""
    from keel.chaos.invariants import CheckContext, Checker, InvariantResult, graph_invariants, load_graph_traces
    from keel.chaos.manager import replicas_equal

    victims = (victim,) if isinstance(victim, str) else tuple(victim)
    lone = [n[len("op-"):-len("-backup")] for n in also_kill if n.startswith("op-") and n.endswith("-backup")]
    trace_dir = workdir / "trace"
    table = table or (mlp_gru if victims[:1] == ("m",) else gru_chain)()  # the victim's graph by default
    ctx = zmq.Context()  # made on this thread: inside the client host in netns mode (run_trial)
    ask_status = functools.partial(transport.request_status, ctx=ctx)
    try:
        managers, graph, run, by_name, client, probe = start_graph(make_launcher, workdir / "journal", table, trace_dir, ctx,
                                                                   state_delay)
    except BaseException:
        ctx.destroy(linger=0)
        raise
    sender = TrialClient(client)  # made on this thread: inside the client host in netns mode
    fault_t: dict[str, float] = {}
    # a frozen or partitioned old primary comes back once its backup was promoted: it must be fenced
    frozen = [f"op-{v}" for v in victims] if fault in ("freeze", "partition") else []

    def come_back(name: str) -> None:
        run.heal(name) if fault == "partition" else run.kill(name, signal.SIGCONT)

    try:
        groups_before = probe.call("snapshot")["groups"]
        rng = np.random.default_rng(seed)
        inputs, streams = rng.normal(size=(n, 4)), rng.integers(0, 4, size=n)

        def taken_over() -> bool:
            groups = probe.call("snapshot")["groups"]
            return all(groups[f"graph/{v}"]["epoch"] > groups_before[f"graph/{v}"]["epoch"] for v in victims)

        joiner = f"op-{victims[0]}-r1" if victims else None

        def start_joiner() -> None:
            import dataclasses

            from keel.common.spec.topology import ServiceLaunch

            v = victims[0]
            old, primary = by_name[f"op-{v}"].config, by_name[f"op-{v}-backup"].config
            port = free_port_block(4)
            config = dataclasses.replace(old, name=joiner, role="backup", epoch=probe.call("snapshot")["groups"][f"graph/{v}"]["epoch"],
                                         endpoint=f"tcp://{run.address_of(joiner)}:{port}", status_endpoint=f"tcp://{run.address_of(joiner)}:{port + 1}",
                                         peers={**old.peers, v: primary.endpoint}, trace_path=str(trace_dir / f"{joiner}.jsonl"))
            by_name[joiner] = ServiceLaunch(joiner, "graph_operator", "local", config)
            fault_t["rejoin"] = time.monotonic()
            run.start(by_name[joiner])

        def brought_up() -> bool:
            new = ask_status(by_name[f"op-{victims[0]}-backup"].config.status_endpoint, 0.2) or {}
            mine = ask_status(by_name[joiner].config.status_endpoint, 0.2) or {}
            return new.get("degraded") is False and mine.get("max_applied_seq", -1) >= 0

        def on_sent(i: int) -> None:
            if rejoin and i > kill_at and i % 5 == 0:
                if "rejoin" not in fault_t and taken_over():
                    start_joiner()
                elif "rejoin" in fault_t and "second" not in fault_t and i % 25 == 0 and brought_up():
                    fault_t["second"] = time.monotonic()  # the new primary dies too: the joiner must hold it all
                    run.kill(f"op-{victims[0]}-backup", signal.SIGKILL, wait=False)
            if i == kill_at:
                fault_t["t"] = time.monotonic()
                for v in victims:
                    if fault == "partition":  # cut from everyone: its sockets stay open, frames stall
                        run.partition(f"op-{v}")
                    else:
                        run.kill(f"op-{v}", signal.SIGSTOP if fault == "freeze" else signal.SIGKILL, wait=False)
                for name in also_kill:
                    run.kill(name, signal.SIGKILL, wait=False)
            elif frozen and "thaw" not in fault_t and i > kill_at and (i % 5 == 0 and taken_over() or i == n - 1):
                fault_t["thaw"] = time.monotonic()  # the backup was promoted (or the load ends): thaw or heal
                for name in frozen:
                    come_back(name)

        replies = open_load(sender, inputs, streams, on_sent, gap_s=gap_s)
        after = probe.call("snapshot")
        groups_after = after["groups"]
        backup_of = {v: f"op-{v}-backup" if v in graph.stateful else "op-standby0" for v in victims}
        if "second" in fault_t:
            backup_of = {victims[0]: joiner}  # the group's holder at the end
        backup_of.update({v: f"op-{v}" for v in lone})  # its primary goes on: the group's holder at a new epoch
        backups = {v: ask_status(by_name[backup_of[v]].config.status_endpoint) or {} for v in (*victims, *lone)}
        frontend = (ask_status(by_name["frontend"].config.client_endpoint) or {}).get("graphs", {}).get("graph", {})
        thawed = {}
        if frozen:  # the thawed old primary: fenced, and says so
            wait_until(lambda: all((ask_status(by_name[f].config.status_endpoint) or {}).get("fenced") for f in frozen),
                       timeout_s=5.0)
            wait_until(lambda: all((ask_status(by_name[f].config.status_endpoint) or {}).get("max_applied_seq", -1) >= 0
                                   for f in frozen), timeout_s=5.0)  # and rejoined as the new primary's backup
            thawed = {f: ask_status(by_name[f].config.status_endpoint) or {} for f in frozen}
    finally:
        for name in frozen:  # never leave a stopped or cut-off process behind
            come_back(name)
        sender.close()
        ctx.destroy(linger=0)  # the manager probes' sockets too
        run.stop()
        managers.close()
        managers.launcher.stop()  # the replicas themselves: close() only ends the probe
    from keel.services.graph.models import run_offline

    expected = run_offline(graph, inputs, streams)[0]
    answered = {k: v for k, v in replies.items() if len(v) >= 1}
    errors = sum(1 for v in answered.values() if v[0].error is not None)
    twice = sum(1 for v in answered.values() if len(v) > 1)
    # with noise no run equals the offline one: conflicts are then what the checker finds
    noisy = any(op.options.get("noise") for op in graph.operators.values())
    wrong = 0 if noisy else sum(1 for i in range(n) if f"r{i}" in answered and answered[f"r{i}"][0].error is None
                                and not np.allclose(answered[f"r{i}"][0].output, expected[i], atol=1e-5))
    streams_ = load_graph_traces(str(trace_dir))
    checks = {r.name: r.to_dict() for r in Checker(graph_invariants(graph.stateful)).run([], CheckContext(streams=streams_))}
    equal, finals = replicas_equal(workdir / "journal")  # the final states the replicas wrote at shutdown
    checks["manager_replicas_equal"] = InvariantResult("manager_replicas_equal", equal, checked=finals,
                                                       violations=int(not equal), detail=f"{finals} final states").to_dict()
    per_victim = {}
    for v in (*victims, *lone):
        takeover = sorted((t for t in streams_.get("graph_takeover", []) if t["operator"] == v), key=lambda t: t["t"])
        first_new = min((o["t"] for o in streams_["graph_output"]
                         if o["operator"] == v and takeover and o.get("epoch") == takeover[0]["epoch"]), default=None)
        old_epoch = groups_before[f"graph/{v}"]["epoch"]
        before = max((o["seq"] for o in streams_["graph_output"] if o["operator"] == v and o["t"] < fault_t["t"]), default=-1)
        per_victim[v] = {
            "detection_ms": 1000 * (takeover[0]["t"] - fault_t["t"]) if takeover else None,
            "recovery_ms": 1000 * (first_new - fault_t["t"]) if first_new is not None else None,
            "promoted": groups_after[f"graph/{v}"]["holder"] == backup_of[v] and groups_after[f"graph/{v}"]["epoch"] > old_epoch,
            # why the manager acted first (e.g. "op-g2 suspected: refused"): the detection path taken
            "why": next((d.get("reason") for d in after.get("decisions", [])
                         if d.get("group") == f"graph/{v}" and d.get("epoch", 0) > old_epoch), None),
            "new_primary_degraded": backups[v].get("degraded"),
            # a thawed old primary numbers nothing more at its old epoch
            "old_epoch_outputs_after_thaw": sum(1 for o in streams_["graph_output"] if o["operator"] == v
                                                and o.get("epoch") == old_epoch and o["t"] > fault_t.get("thaw", 1e18)),
            "fenced": thawed[f"op-{v}"].get("fenced") if frozen else None,
            # the thawed old primary overwrote its state with the new primary's: its backup now (§IV-E)
            # ls: the recovered operator's first output above its highest seq before the fault (after the
            # replay), and how many of its outputs came after its latest checkpoint (what it replays)
            "replayed_ms": 1000 * (min((o["t"] for o in streams_["graph_output"] if o["operator"] == v and takeover
                                        and o.get("epoch") == takeover[0]["epoch"] and o["seq"] > before), default=float("nan"))
                                   - fault_t["t"]),
            "outputs_since_checkpoint": before - max((c["last_seq"] for c in streams_.get("graph_checkpoint", [])
                                                      if c["operator"] == v and c["t"] < fault_t["t"]), default=-1),
            "rejoined_as_backup": (thawed[f"op-{v}"].get("assignment") == "backup"
                                   and thawed[f"op-{v}"].get("max_applied_seq", -1) >= 0) if frozen else None}
    # the graph is recovered when every failed operator is: the trial's figures are the slowest victim's
    slowest = max(per_victim.values(), key=lambda r: (r["recovery_ms"] is None, r["recovery_ms"] or 0, r["detection_ms"] or 0))
    detection = max((r["detection_ms"] for r in per_victim.values() if r["detection_ms"] is not None), default=None)
    if any(r["detection_ms"] is None for r in per_victim.values()):
        detection = None
    recovery = slowest["recovery_ms"]
    return {"victim": "+".join(victims) or "-",  "fault": fault, "mode": graph.mode, "noisy": noisy, "requests": n, "kill_at": kill_at, "rate_rps": 1 / gap_s,
            "detection_ms": detection,
            "takeover_ms": (recovery - slowest["detection_ms"]) if recovery is not None and slowest["detection_ms"] is not None else None,
            "recovery_ms": recovery, "lost": n - len(answered) + errors, "errors": errors, "answered_twice": twice,
            # answers the client was told came from a primary without a backup (Reply.degraded)
            "degraded_replies": sum(1 for v in answered.values() if v[0].error is None and v[0].degraded),
            "error_examples": sorted({str(v[0].error)[:200] for v in answered.values() if v[0].error is not None})[:3],
            "unlike_offline": None if noisy else wrong, "output_conflicts": checks["graph_one_output_per_operator_seq"]["violations"],
            "conflicts": twice + wrong + checks["graph_one_output_per_operator_seq"]["violations"],
            "invariants_ok": all(c["ok"] is not False for c in checks.values()),
            "invariants": {k: {"ok": c["ok"], "checked": c["checked"], "violations": c["violations"]} for k, c in checks.items()},
            "promoted": all(r["promoted"] for r in per_victim.values()),
            "new_primary_degraded": all(r["new_primary_degraded"] for v, r in per_victim.items() if v in graph.stateful),
            "per_victim": per_victim, "thaw_after_fault_ms": 1000 * (fault_t["thaw"] - fault_t["t"]) if "thaw" in fault_t else None,
            "old_epoch_outputs_after_thaw": sum(r["old_epoch_outputs_after_thaw"] for r in per_victim.values()),
            "fenced": all(r["fenced"] for r in per_victim.values()) if frozen else None,
            "rejoined_as_backup": all(r["rejoined_as_backup"] for r in per_victim.values()) if frozen else None,
            "rejoined_after_ms": 1000 * (fault_t["second"] - fault_t["rejoin"]) if "second" in fault_t else None,
            "second_failover": "second" in fault_t,
            "replayed_ms": slowest["replayed_ms"], "outputs_since_checkpoint": slowest["outputs_since_checkpoint"],
            "second_recovery_ms": (1000 * (min((o["t"] for o in streams_["graph_output"] if o["operator"] == victims[0]
                                                and o["t"] > fault_t["second"]), default=float("nan")) - fault_t["second"])
                                   if "second" in fault_t else None),
            "also_killed": list(also_kill),
            "addresses": {name: run.address_of(name) for name in sorted(by_name)},  # one host per process in netns mode
            # primaries that lost their backup too and rolled back to their previous state (Fig. 6)
            "rolled_back_in_place": sorted({t["operator"] for t in streams_.get("graph_takeover", []) if t.get("rollback")}),
            "held_voided": frontend.get("voided"), "resent_by_frontend": frontend.get("resent"),
            # other groups whose holder changed: downstream stateful operators rolled back to their backups
            "rolled_back": sorted(g[len("graph/"):] for g, v in groups_after.items() if g[len("graph/"):] not in victims
                                  and v["holder"] != groups_before.get(g, {}).get("holder"))}


def run_trial(netns: bool, work: Path, **trial) -> dict[str, Any]:
    """``kill_trial`` in local mode (every process on loopback), or in netns mode: a fresh
    ``chaos.hosts.Cluster`` whose every process (each graph process, each manager replica)
    runs on a host (network namespace) of its own, faults are host faults, and the harness
    (load client, status and manager probes) runs on a thread inside the "client" host.
    Namespaces share the filesystem (the traces) and ``time.monotonic()``."""
    if not netns:
        return kill_trial(lambda n: Launcher(work / "logs" / n), work, **trial)
    from keel.chaos.hosts import Cluster

    cluster = Cluster(["client"], run_dir=work, netns=True, clean=False)
    try:
        return cluster_trial(cluster, work, **trial)
    finally:
        cluster.close()


def cluster_trial(cluster, work: Path, **trial) -> dict[str, Any]:
    """``kill_trial`` on ``cluster`` (which has a "client" host): each process on a host of
    its own name, added on first use, the harness on a thread inside the client host."""
    from keel.chaos.hosts import HostLauncher
    from keel.chaos.netns import in_netns

    return in_netns(cluster.host("client").ns, lambda: kill_trial(lambda n: HostLauncher(cluster), work, **trial))
