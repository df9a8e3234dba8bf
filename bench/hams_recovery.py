"""``keel experiment hams-recovery``: how fast a HAMS service graph recovers, and whether it
loses or contradicts anything (HAMS §IV-E, §VII-D), on real processes, in netns mode (every
process on a network namespace of its own, host faults; ``--netns auto`` when the machine
allows it) or in local mode (every process on loopback, ``--netns off``).

The graph is GRU -> GRU (NSPB, W=2) with the manager group (three Raft replicas) that
detects failures and promotes backups. Per trial: a fresh cluster, open-loop load at a
fixed rate, and at a random moment the stateful primary of g2 is SIGKILLed. The harness's
clock (``time.monotonic()``, one clock for every process of the host, the one the traces
use) gives, per trial:

- ``detection_ms``: fault -> the backup learns the manager promoted it (its ``takeover`` trace);
- ``takeover_ms``: that -> the first new output of the recovered operator;
- ``recovery_ms``: fault -> that first new output (the sum, what the targets name);
- ``lost`` (requests never answered or answered with an error), ``conflicts`` (violations
  of one output per (operator, seq), and requests answered twice or unlike an offline
  run of the deterministic GRUs), and the HAMS invariants' verdicts.

Cases (``CASES``): SIGKILL of the last stateful primary (g2), of the first (g1: g2 rolls
back when it took lost outputs), of g2's backup (its primary's window stalls; after a grace
it goes on alone from its newest shipped state, rolled back in place at a new epoch), of a
stateless operator (its hot standby takes over);
SIGSTOP of g2's primary (a freeze: its sockets stay open, so only the manager's heartbeat
silence detects it), SIGCONT once the backup was promoted (the thawed primary must be
fenced and number nothing more at its old epoch); in netns mode, a partition of g2's
primary's host (healed once the backup was promoted: fenced by epoch, it rejoins as
backup); the correlated cases: a stateless and a
stateful operator killed together (m and g2 of MLP -> GRU -> GRU), and two adjacent
stateful primaries (g1 and g2). A correlated trial's times are its slowest victim's. With
noise (GRUs whose every run differs) under NSPB, and under the ``strawman`` mode (no state
shipping: the replacement re-executes on a fresh state), where the checker must find
conflicts (``strawman_conflicts`` > 0; not counted in the nspb figures). HAMS Fig. 6
(``fig6_chain``): GRU -> GRU -> GRU, g2's state delivery to its backup delayed 30 ms (in netns
mode by the chaos delay proxy on that link, in local mode by the spec's ``state_delay_ms``
hook at the backup), then g2's primary and g3's backup killed
together: g3's primary rolls back in place (a trial's recovery is the slower of g2's takeover
and g3's roll-back); the same fault under the strawman.
``ls_stateful_kill``: the Lineage Stash baseline (mode ``ls``, ``ls_chain``: a checkpoint
every 100 batches, noise): its cold standby loads the checkpoint and replays; the checker must
find conflicts (``ls_conflicts`` > 0, ``ls_lost``; ``ls_kill_median_ms`` / ``_max_ms``: fault
-> its first output above its highest seq before the fault, i.e. after the replay), against
the outputs since the checkpoint (``ls_recovery_by_batches_since_checkpoint``: one input a
batch, so outputs = batches) beside nspb's against the kill time (``nspb_recovery_by_kill_at``:
``stateful_primary_kill`` and ``stateful_primary_kill_late``, the same fault after 5-10 s of
load); each with its least-squares slope (``ls_growth_ms_per_1000_batches``,
``nspb_growth_ms_per_1000_requests``). ``--cases A,B`` runs only those. JSON keys (``mode``: which mode ran):
``stateful_kill_median_ms``, ``stateful_kill_max_ms``, ``stateful_kill_late_median_ms`` / ``_max_ms``,
``detection_median_ms``, ``takeover_median_ms``, ``upstream_stateful_kill_median_ms``,
``stateless_kill_median_ms``, ``backup_kill_median_ms``, ``backup_kill_max_ms``,
``freeze_partition_median_ms``, ``freeze_partition_max_ms``
(freeze and partition trials), ``freeze_median_ms``, ``freeze_max_ms``, ``partition_trials``,
``partition_fenced``, ``partition_old_epoch_outputs_after_heal``, ``freeze_fenced``, ``freeze_old_epoch_outputs_after_thaw``,
``correlated_stateless_stateful_median_ms`` / ``_max_ms``,
``correlated_adjacent_stateful_median_ms`` / ``_max_ms``, ``fig6_median_ms``, ``fig6_max_ms``,
``fig6_trials``, ``fig6_rolled_back_in_place``, ``strawman_fig6_conflicts``, ``strawman_conflicts``, ``nspb_lost``,
``nspb_conflicts``, ``trials``, ``cases``.
"""
from __future__ import annotations

import argparse
import functools
import os
import random
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import zmq

from keel.common import loadgen, protocol, transport
from keel.common.protocol.messages import Predict
from keel.common.spec.graph import graph_services, read_graph
from keel.common.steal import StealMeter
from keel.common.waiting import wait_until
from keel.deploy.local import Launcher, free_port_block

TARGETS = {"partition_fenced": "== True", "partition_old_epoch_outputs_after_heal": "== 0", "stateful_kill_median_ms": "<= 100", "stateful_kill_max_ms": "<= 200", "stateless_kill_median_ms": "<= 100",
           "freeze_partition_max_ms": "<= 250", "freeze_fenced": "== True", "freeze_old_epoch_outputs_after_thaw": "== 0",
           "correlated_stateless_stateful_max_ms": "<= 200", "correlated_adjacent_stateful_max_ms": "<= 150", "fig6_max_ms": "<= 400", "fig6_trials": ">= 50 (full)",
           "strawman_conflicts": "> 0", "strawman_fig6_conflicts": "> 0", "nspb_lost": "== 0", "nspb_conflicts": "== 0",
           "ls_conflicts": "> 0", "ls_lost": "== 0", "stateful_kill_late_median_ms": "<= 100",
           "stateful_kill_late_max_ms": "<= 200", "nspb_growth_ms_per_1000_requests": "~0 (ls's grows)"}


def mlp_gru(max_batch: int = 4) -> dict:
    """A stateless operator first (its hot standby takes over), a stateful one after it."""
    return {"mode": "nspb", "window": 2, "input_shape": [4],
            "edges": [["frontend", "m"], ["m", "g"], ["g", "frontend"]],
            "operators": {"m": {"kind": "mlp", "input_shape": [4], "output_shape": [6], "max_batch": max_batch},
                          "g": {"kind": "gru", "input_shape": [6], "output_shape": [3], "max_batch": max_batch}}}


GRAPHS = {"g1": None, "g2": None, "m": mlp_gru}  # victim -> its graph (None: the GRU -> GRU chain)


def gru_chain(max_batch: int = 4, pad_ms: float = 0.0, mode: str = "nspb", noise: float = 0.0) -> dict:
    """GRU -> GRU; ``noise`` > 0 makes both GRUs non-deterministic (every run, every
    re-execution differs: ``services.graph.operators.GRU``)."""
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
        services, client = graph_services(graph, free_port_block(64), trace_dir=str(trace_dir),
                                          manager=(managers.endpoints, managers.publish_endpoints), address_of=run.address_of)
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


def open_load(sock: zmq.Socket, inputs, streams, on_sent: Callable[[int], None], gap_s: float = 0.004,
              timeout_s: float = 60.0) -> dict[str, list]:
    """Send at a fixed rate (open loop) on a DEALER, calling ``on_sent(i)`` after each; every
    answer by request id (a list: a second answer would be a violation)."""
    replies: dict[str, list] = {}

    def drain(wait_ms: int) -> None:
        while sock.poll(wait_ms):
            msg = protocol.decode(sock.recv_multipart())
            replies.setdefault(msg.request_id, []).append(msg)
            wait_ms = 0

    for i, (x, s) in enumerate(zip(inputs, streams)):
        transport.send(sock, Predict(f"r{i}", "graph", np.asarray(x, np.float32), stream=int(s)))
        on_sent(i)
        drain(int(gap_s * 1000))
    deadline = time.monotonic() + timeout_s
    while sum(map(len, replies.values())) < len(inputs) and time.monotonic() < deadline:
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
    table = table or ((GRAPHS.get(victims[0]) if victims else None) or gru_chain)()
    ctx = zmq.Context()  # made on this thread: inside the client host in netns mode (run_trial)
    ask_status = functools.partial(transport.request_status, ctx=ctx)
    try:
        managers, graph, run, by_name, client, probe = start_graph(make_launcher, workdir / "journal", table, trace_dir, ctx,
                                                                   state_delay)
    except BaseException:
        ctx.destroy(linger=0)
        raise
    sock = transport.make_socket(ctx, zmq.DEALER, connect=client)
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

        replies = open_load(sock, inputs, streams, on_sent, gap_s=gap_s)
        groups_after = probe.call("snapshot")["groups"]
        backup_of = {v: f"op-{v}-backup" if v in graph.stateful else "op-standby0" for v in victims}
        if "second" in fault_t:
            backup_of = {victims[0]: joiner}  # the group's holder at the end
        backup_of.update({v: f"op-{v}" for v in lone})  # its primary goes on: the group's holder at a new epoch
        backups = {v: ask_status(by_name[backup_of[v]].config.status_endpoint) or {} for v in (*victims, *lone)}
        frontend = ask_status(by_name["graph-frontend"].config.client_endpoint)
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
        sock.close(0)
        ctx.destroy(linger=0)  # the manager probes' sockets too
        run.stop()
        managers.close()
        managers.launcher.stop()  # the replicas themselves: close() only ends the probe
    from keel.services.graph.operators import run_offline

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


CASES = (  # name, victims, fault, graph, what, trials (quick, full)
    ("stateful_primary_kill", "g2", "kill", gru_chain, "SIGKILL of g2's primary (stateful, last), GRU -> GRU", (3, 20)),
    ("stateful_primary_kill_late", "g2", "kill", gru_chain,
     "SIGKILL of g2's primary after 5-10 s of load (1,200-2,400 requests), GRU -> GRU: recovery must not grow "
     "with how long the graph ran", (1, 5)),
    ("upstream_stateful_kill", "g1", "kill", gru_chain,
     "SIGKILL of g1's primary (stateful, first; g2 rolls back if it took lost outputs)", (2, 10)),
    ("stateful_backup_kill", (), "kill", gru_chain,
     "SIGKILL of g2's backup, GRU -> GRU: its primary's window stalls; it goes on alone from its newest shipped "
     "state, rolled back in place at a new epoch (degraded)", (2, 10)),
    ("stateless_kill", "m", "kill", mlp_gru, "SIGKILL of m (stateless MLP, first), MLP -> GRU: the hot standby takes over", (2, 10)),
    ("stateful_primary_freeze", "g2", "freeze", gru_chain,
     "SIGSTOP of g2's primary, GRU -> GRU: detected by heartbeat silence; SIGCONT after the takeover: fenced", (3, 20)),
    ("stateful_primary_partition", "g2", "partition", gru_chain,
     "g2's primary's host partitioned from every host, GRU -> GRU: detected by heartbeat silence, fenced by its "
     "lease; healed after the takeover: fenced by epoch, rejoins as backup (netns mode only)", (3, 20)),
    ("correlated_stateless_stateful_kill", ("m", "g2"), "kill", mlp_gru_gru,
     "SIGKILL of m (stateless) and g2's primary (stateful) together, MLP -> GRU -> GRU", (2, 10)),
    ("correlated_adjacent_stateful_kill", ("g1", "g2"), "kill", gru_chain,
     "SIGKILL of g1's and g2's primaries (adjacent, stateful) together, GRU -> GRU", (2, 10)),
    ("stateful_primary_kill_noisy", "g2", "kill", noisy_chain,
     "SIGKILL of g2's primary, GRU -> GRU with noise (every re-execution differs)", (2, 10)),
    ("fig6_kill", "g2", "kill", fig6_chain,
     "HAMS Fig. 6: g2's state delivery delayed 30 ms, then g2's primary and g3's backup SIGKILLed together, "
     "GRU -> GRU -> GRU (g3's primary rolls back in place)", (3, 50)),
    ("strawman_fig6_kill", "g2", "kill", lambda: fig6_chain(mode="strawman", noise=0.01),
     "the Fig. 6 fault under the strawman with noise", (2, 10)),
    ("strawman_stateful_kill", "g2", "kill", strawman_chain,
     "SIGKILL of g2's primary, GRU -> GRU with noise, strawman mode (no state shipping: re-executes on a fresh state)",
     (2, 10)),
    ("ls_stateful_kill", "g2", "kill", lambda: ls_chain(checkpoint_every=100),
     "SIGKILL of g2's primary, GRU -> GRU with noise, ls mode (Lineage Stash: checkpoint every 100 batches, replay)",
     (3, 10)),
)


#: more processes killed with the victims, per case
ALSO_KILL = {"fig6_kill": ("op-g3-backup",), "stateful_backup_kill": ("op-g2-backup",)}
#: the request the fault lands at, drawn from this range (default 60-160 of 240 requests):
#: randomized timing, the fault lands anywhere in a batch's life; each trial runs 80 more
KILL_AT = {"stateful_primary_kill_late": (1200, 2400)}


def growth_per_1000(points: list) -> float | None:
    """The least-squares slope of recovery (ms) per 1,000 units of x, over ``[x, ms]``
    points (None where a trial did not recover, or fewer than 3 points)."""
    pts = [(x, y) for x, y in points if x is not None and y is not None and y == y]
    if len(pts) < 3 or len({x for x, _ in pts}) < 2:
        return None
    x, y = np.array(pts, dtype=float).T
    return float(1000 * np.polyfit(x, y, 1)[0])


def recovery_times(case: dict) -> list[float]:
    """A case's recovery per recovered trial: fault -> first new output; for ls, until its
    replay is done (its first output above its highest seq before the fault)."""
    key = "replayed_ms" if case["mode"] == "ls" else "recovery_ms"
    return [t[key] for t in case["trials"] if t.get(key) is not None and t[key] == t[key]]


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


def run(quick: bool, json_path: Path, log, trials: int | None = None, netns: bool | str = "auto",
        only: set[str] | None = None) -> dict:
    from keel.chaos.hosts import resolve_netns

    use_netns, why = resolve_netns(netns)
    mode_text = ("netns (a network namespace per process, host faults)" if use_netns
                 else "local (one host, real processes, loopback TCP)")
    log(f"mode: {mode_text} ({why})")
    rng = random.Random(1)
    t0, steal = time.time(), StealMeter()
    cases: dict[str, dict] = {}
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="hams-recovery-", ignore_cleanup_errors=True) as tmp:
        for name, victim, fault, graph, what, counts in CASES:
            if only and name not in only:
                continue
            if fault == "partition" and not use_netns:
                log(f"  {name}: skipped, a partition needs netns mode ({why})")
                continue
            rows = []
            for k in range(trials or counts[0 if quick else 1]):
                work = Path(tmp) / f"{name}-{k}"
                kill_at = rng.randint(*KILL_AT.get(name, (60, 160)))
                row = run_trial(use_netns, work, victim=victim, n=max(240, kill_at + 80), kill_at=kill_at, seed=k, fault=fault, table=graph(),
                                also_kill=ALSO_KILL.get(name.replace("strawman_", ""), ()),
                                state_delay=FIG6_STATE_DELAY if name.endswith("fig6_kill") else None)
                rows.append(row)
                log(f"  {name} {k}: {fault} at request {kill_at}: detection {fmt(row['detection_ms'])} ms, takeover "
                    f"{fmt(row['takeover_ms'])} ms, recovery {fmt(row['recovery_ms'])} ms, lost {row['lost']}, "
                    f"conflicts {row['conflicts']}, degraded replies {row['degraded_replies']}, rolled back {row['rolled_back'] or '-'}, "
                    + (f"thawed at {fmt(row['thaw_after_fault_ms'])} ms, fenced {row['fenced']}, "
                       f"old-epoch outputs after thaw {row['old_epoch_outputs_after_thaw']}, " if row["fenced"] is not None else "") +
                    f"invariants {'ok' if row['invariants_ok'] else 'VIOLATED'}")
            rec = [r["recovery_ms"] for r in rows if r["recovery_ms"] is not None]
            med = lambda key, rows=rows: (float(np.median([r[key] for r in rows if r[key] is not None]))  # noqa: E731
                                          if any(r[key] is not None for r in rows) else None)
            mode = rows[0]["mode"]
            cases[name] = {"fault": f"{what}, {mode}, {'netns' if use_netns else 'local'} mode", "mode": mode, "trials": rows,
                           "recovery_median_ms": float(np.median(rec)) if rec else None,
                           "recovery_max_ms": max(rec) if rec else None,
                           "detection_median_ms": med("detection_ms"), "takeover_median_ms": med("takeover_ms"),
                           "detection_max_ms": max((r["detection_ms"] for r in rows if r["detection_ms"] is not None), default=None),
                           "takeover_max_ms": max((r["takeover_ms"] for r in rows if r["takeover_ms"] is not None), default=None),
                           "lost": sum(r["lost"] for r in rows), "conflicts": sum(r["conflicts"] for r in rows),
                           "degraded_replies": sum(r["degraded_replies"] for r in rows),
                           "invariants_ok": all(r["invariants_ok"] for r in rows),
                           "not_recovered": len(rows) - len(rec), "n": len(rows)}
    ls_ = [c for c in cases.values() if c["mode"] == "ls"]
    ls_out = {"ls_conflicts": sum(c["conflicts"] for c in ls_), "ls_lost": sum(c["lost"] for c in ls_),
              "ls_kill_median_ms": float(np.median(r)) if (r := [x for c in ls_ for x in recovery_times(c)]) else None,
              "ls_kill_max_ms": max(r) if r else None,
              # recovery grows with what ls replays; nspb's does not grow with how long the graph ran
              "ls_recovery_by_batches_since_checkpoint": [[t["outputs_since_checkpoint"], t["replayed_ms"]]
                                                          for c in ls_ for t in c["trials"]],
              "nspb_recovery_by_kill_at": [[t["kill_at"], t["recovery_ms"]] for name in
                                           ("stateful_primary_kill", "stateful_primary_kill_late")
                                           for t in cases.get(name, {}).get("trials", [])]}
    ls_out["ls_growth_ms_per_1000_batches"] = growth_per_1000(ls_out["ls_recovery_by_batches_since_checkpoint"])
    ls_out["nspb_growth_ms_per_1000_requests"] = growth_per_1000(ls_out["nspb_recovery_by_kill_at"])
    if only:  # a selection of cases (--cases): their rows and the ls figures
        out = {"quick": quick, "cases": cases, **ls_out, "trials": sum(c["n"] for c in cases.values()),
               "elapsed_s": time.time() - t0, "loadavg_1m_at_end": os.getloadavg()[0], "steal": steal.fraction()}
        loadgen.write_json(json_path, out)
        return out
    sk, up, sl = cases["stateful_primary_kill"], cases["upstream_stateful_kill"], cases["stateless_kill"]
    bk = cases["stateful_backup_kill"]
    fz, co = cases["stateful_primary_freeze"], cases["correlated_stateless_stateful_kill"]
    adj, fig6 = cases["correlated_adjacent_stateful_kill"], cases["fig6_kill"]
    nspb = [c for c in cases.values() if c["mode"] == "nspb"]
    straw = [c for c in cases.values() if c["mode"] == "strawman"]
    # freeze and partition: one figure (the issue's), over both faults' trials
    cut = fz["trials"] + (cases["stateful_primary_partition"]["trials"] if "stateful_primary_partition" in cases else [])
    cut_rec = [r["recovery_ms"] for r in cut if r["recovery_ms"] is not None]
    pt = cases.get("stateful_primary_partition", {"trials": []})["trials"]
    out = {"quick": quick, "mode": mode_text, "netns": use_netns,
           "stateful_kill_median_ms": sk["recovery_median_ms"], "stateful_kill_max_ms": sk["recovery_max_ms"],
           "stateful_kill_late_median_ms": cases["stateful_primary_kill_late"]["recovery_median_ms"],
           "stateful_kill_late_max_ms": cases["stateful_primary_kill_late"]["recovery_max_ms"],
           "detection_median_ms": sk["detection_median_ms"], "takeover_median_ms": sk["takeover_median_ms"],
           "upstream_stateful_kill_median_ms": up["recovery_median_ms"],
           "upstream_stateful_kill_max_ms": up["recovery_max_ms"],
           "stateless_kill_median_ms": sl["recovery_median_ms"], "stateless_kill_max_ms": sl["recovery_max_ms"],
           "backup_kill_median_ms": bk["recovery_median_ms"], "backup_kill_max_ms": bk["recovery_max_ms"],
           "freeze_partition_median_ms": float(np.median(cut_rec)) if cut_rec else None,
           "freeze_partition_max_ms": max(cut_rec) if cut_rec else None,
           "freeze_median_ms": fz["recovery_median_ms"], "freeze_max_ms": fz["recovery_max_ms"],
           "partition_trials": len(pt), "partition_fenced": all(r["fenced"] for r in pt) if pt else None,
           "partition_old_epoch_outputs_after_heal": sum(r["old_epoch_outputs_after_thaw"] for r in pt),
           "freeze_detection_median_ms": fz["detection_median_ms"],
           "freeze_fenced": all(r["fenced"] for r in fz["trials"]),
           "freeze_old_epoch_outputs_after_thaw": sum(r["old_epoch_outputs_after_thaw"] for r in fz["trials"]),
           "correlated_stateless_stateful_median_ms": co["recovery_median_ms"],
           "correlated_stateless_stateful_max_ms": co["recovery_max_ms"],
           "correlated_adjacent_stateful_median_ms": adj["recovery_median_ms"],
           "correlated_adjacent_stateful_max_ms": adj["recovery_max_ms"],
           "fig6_median_ms": fig6["recovery_median_ms"], "fig6_max_ms": fig6["recovery_max_ms"], "fig6_trials": fig6["n"],
           "fig6_rolled_back_in_place": sum(1 for r in fig6["trials"] if r["rolled_back_in_place"]),
           "strawman_fig6_conflicts": cases["strawman_fig6_kill"]["conflicts"],
           "nspb_lost": sum(c["lost"] for c in nspb), "nspb_conflicts": sum(c["conflicts"] for c in nspb),
           "invariants_ok": all(c["invariants_ok"] for c in nspb),
           "not_recovered": sum(c["not_recovered"] for c in nspb),
           # the strawman must show what NSPB prevents (the checker's proof that it can see a conflict)
           "strawman_conflicts": sum(c["conflicts"] for c in straw), "strawman_lost": sum(c["lost"] for c in straw),
           "strawman_trials_with_conflicts": sum(1 for c in straw for r in c["trials"] if r["conflicts"] > 0),
           "strawman_trials": sum(c["n"] for c in straw),
           **ls_out, "trials": sum(c["n"] for c in cases.values()), "cases": cases, "elapsed_s": time.time() - t0,
           # the machine's load while it ran: the figures are taken under load (2 cores, shared)
           "loadavg_1m_at_end": os.getloadavg()[0], "steal": steal.fraction()}
    loadgen.write_json(json_path, out)
    return out


def plot(out: dict, path: Path) -> None:
    """Left: each case's recovery times (one dot a trial; the targets as ticks). Right: what
    recovery grows with: ls against the batches since its checkpoint (its replay), nspb's
    stateful kill against how long the graph had run (the request it died at)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    names = [n for n, c in out["cases"].items() if recovery_times(c)]
    for i, name in enumerate(names):
        rec = recovery_times(out["cases"][name])
        color = {"nspb": "tab:blue", "strawman": "tab:gray", "ls": "tab:red"}.get(out["cases"][name]["mode"], "k")
        left.scatter(i + (np.linspace(-0.2, 0.2, len(rec)) if len(rec) > 1 else np.zeros(len(rec))), rec, s=10, color=color)
    left.set_xticks(range(len(names)), [n.replace("_", " ") for n in names], rotation=35, ha="right", fontsize=8)
    left.set_ylabel("fault -> first new output (ms)")
    left.set_yscale("log")
    left.set_title("recovery per trial (blue nspb, gray strawman, red ls: until its replay is done)")
    ls_pts = out.get("ls_recovery_by_batches_since_checkpoint") or []
    nspb_pts = out.get("nspb_recovery_by_kill_at") or []
    if ls_pts:
        right.scatter(*zip(*ls_pts), color="tab:red")
    right.set_xlabel("batches since its checkpoint (ls, red)", color="tab:red")
    right.set_ylabel("fault -> first new output (ms)")
    if nspb_pts:  # on a top axis: nspb's x is how long the graph ran (requests), not batches
        top = right.twiny()
        top.scatter(*zip(*[(x, y) for x, y in nspb_pts if y is not None]), color="tab:blue", marker="s")
        top.set_xlabel("requests served before the kill (nspb stateful kill, blue)", color="tab:blue")
    right.set_title("what recovery grows with")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cmd(args: argparse.Namespace) -> int:
    json_path = Path(args.json or ("runs/hams-recovery-quick.json" if args.quick else "runs/hams-recovery.json"))
    log = lambda s: print(s, flush=True)  # noqa: E731
    log("HAMS recovery: kills, freezes and partitions under open load, manager-driven failover (figures under load)")
    only = set(args.cases.split(",")) if args.cases else None
    out = run(args.quick, json_path, log, trials=args.trials, netns=args.netns, only=only)
    plot(out, json_path.with_suffix(".png"))
    log(f"plot: {json_path.with_suffix('.png')}")
    if only:
        for line in loadgen.figures_table(out, ("ls_conflicts", "ls_lost", "ls_kill_median_ms", "ls_kill_max_ms",
                                                "ls_recovery_by_batches_since_checkpoint", "ls_growth_ms_per_1000_batches",
                                                "nspb_recovery_by_kill_at", "nspb_growth_ms_per_1000_requests", "trials",
                                                "loadavg_1m_at_end", "steal"), TARGETS):
            log(line)
        return 0
    keys = ("stateful_kill_median_ms", "stateful_kill_max_ms", "stateful_kill_late_median_ms", "stateful_kill_late_max_ms",
            "detection_median_ms", "takeover_median_ms",
            "upstream_stateful_kill_median_ms", "upstream_stateful_kill_max_ms", "stateless_kill_median_ms",
            "stateless_kill_max_ms", "backup_kill_median_ms", "backup_kill_max_ms", "freeze_partition_median_ms", "freeze_partition_max_ms", "freeze_detection_median_ms",
            "freeze_median_ms", "freeze_max_ms", "partition_trials", "partition_fenced", "partition_old_epoch_outputs_after_heal",
            "freeze_fenced", "freeze_old_epoch_outputs_after_thaw", "correlated_stateless_stateful_median_ms",
            "correlated_stateless_stateful_max_ms", "correlated_adjacent_stateful_median_ms",
            "correlated_adjacent_stateful_max_ms", "fig6_median_ms", "fig6_max_ms", "fig6_trials", "fig6_rolled_back_in_place",
            "strawman_fig6_conflicts", "strawman_conflicts", "strawman_trials_with_conflicts",
            "strawman_trials", "strawman_lost", "ls_conflicts", "ls_lost", "ls_kill_median_ms", "ls_kill_max_ms",
            "ls_recovery_by_batches_since_checkpoint", "ls_growth_ms_per_1000_batches", "nspb_recovery_by_kill_at",
            "nspb_growth_ms_per_1000_requests", "nspb_lost", "nspb_conflicts", "invariants_ok", "not_recovered", "trials",
            "loadavg_1m_at_end", "steal")
    for line in loadgen.figures_table(out, keys, TARGETS):
        log(line)
    log(f"wrote {json_path} in {out['elapsed_s']:.0f} s")
    return 0 if (out["nspb_lost"] == 0 and out["nspb_conflicts"] == 0 and out["invariants_ok"] and not out["not_recovered"]
                 and out["freeze_fenced"] and out["freeze_old_epoch_outputs_after_thaw"] == 0
                 and out["partition_fenced"] is not False and out["partition_old_epoch_outputs_after_heal"] == 0
                 and out["strawman_trials_with_conflicts"] == out["strawman_trials"]
                 and out["ls_conflicts"] > 0 and out["ls_lost"] == 0) else 1


def add_parser(which: Any) -> None:
    """Add ``hams-recovery`` to ``keel experiment``'s subparsers."""
    e = which.add_parser("hams-recovery", help="HAMS II: recovery time, lost replies and conflicts after kills and freezes of graph operators")
    e.add_argument("--json", help="write the figures here")
    e.add_argument("--quick", action="store_true", help=f"{' + '.join(str(c[-1][0]) for c in CASES)} trials (several minutes; the partition case in netns mode only)")
    e.add_argument("--trials", type=int, help=f"trials per case (default: {'/'.join(str(c[-1][0]) for c in CASES)} quick, "
                                                    f"{'/'.join(str(c[-1][1]) for c in CASES)} full)")
    e.add_argument("--netns", choices=("auto", "on", "off"), default="auto",
                   help="netns mode (a network namespace per process, host faults, the partition case): "
                        "auto = when the machine allows it (root with ip netns)")
    e.add_argument("--cases", help="only these cases, comma-separated (e.g. ls_stateful_kill): their rows and the ls figures")
    e.set_defaults(func=cmd)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="experiment", required=True))
    a = p.parse_args(["hams-recovery", *sys.argv[1:]])
    sys.exit(cmd(a))
