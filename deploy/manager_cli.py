"""``keel manager``: show the manager group's view, and move its leadership.

Example
-------
::

    keel manager show --endpoints tcp://127.0.0.1:7510,tcp://127.0.0.1:7513,tcp://127.0.0.1:7516
    keel manager transfer --endpoints ... [--to 127.0.0.1:7303]

``show`` asks every replica (leader, term, applied seq, connected partners) and prints the
leader's view of every service (group, role, epoch, host) and the last decisions.
``transfer`` asks the leader to hand leadership to another replica (any, or ``--to``, a
raft address), e.g. before taking the leader's host down for maintenance.

``keel.deploy.manager_group.LocalGroup`` starts a group of replicas as real processes on
this host (tests, the benchmark, the chaos harness).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import orjson



def _endpoints(args: argparse.Namespace) -> list[str]:
    if args.endpoints:
        return [e.strip() for e in args.endpoints.split(",") if e.strip()]
    from keel.common.spec import load_spec
    from keel.deploy.keys_cli import use_for_spec

    spec = load_spec(args.spec)
    use_for_spec(spec)  # a spec under CURVE: the replicas' sockets want the client key
    found = [s.config.endpoint for s in spec.services if s.role == "manager"]
    if not found:
        raise SystemExit(f"{args.spec} runs no manager replicas (add a [manager] table)")
    return found


def show(endpoints: list[str], out=None) -> dict:
    """Print every replica's view and the leader's state; returns them as one dict."""
    from keel.common.control import ManagerClient

    out = out or sys.stdout
    client = ManagerClient(endpoints)
    replicas = {e: client.ask(e, "status", timeout_s=1.0) for e in endpoints}
    client.close()
    print(f"{'replica':<28} {'leader?':>7} {'term':>5} {'seq':>5}  leader it names", file=out)
    for e, info in replicas.items():
        if info is None:
            print(f"{e:<28} {'-':>7} {'-':>5} {'-':>5}  (no answer)", file=out)
        else:
            print(f"{e:<28} {'yes' if info['is_leader'] else 'no':>7} {info['term']:>5} {info['seq']:>5}  "
                  f"{info['leader']}", file=out)
    lead = next((i for i in replicas.values() if i and i["is_leader"]), None) or next(
        (i for i in replicas.values() if i), None)
    if lead is not None:
        print(f"\n{'service':<20} {'group':<14} {'role':<9} {'epoch':>6}  host", file=out)
        for name, svc in sorted(lead["services"].items()):
            print(f"{name:<20} {svc['group']:<14} {svc['role']:<9} {svc['epoch']:>6}  {svc.get('host', '')}", file=out)
        if lead["decisions"]:
            print("\nlast decisions:", file=out)
            for d in lead["decisions"]:
                print(f"  {time.strftime('%H:%M:%S', time.localtime(d['at']))} {d['group']}: {d['previous']} -> "
                      f"{d['holder']} at epoch {d['epoch']} ({d['reason']})", file=out)
    return {"replicas": replicas}


def cmd_show(args: argparse.Namespace) -> int:
    view = show(_endpoints(args))
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(view, option=orjson.OPT_INDENT_2))
    return 0 if any(view["replicas"].values()) else 1


def cmd_transfer(args: argparse.Namespace) -> int:
    from keel.common.control import ManagerClient, ManagerUnavailable
    from keel.common.waiting import wait_until

    client = ManagerClient(_endpoints(args))
    try:
        before = client.call("leader")
        result = client.call("transfer", {"to": args.to} if args.to else {})
    except ManagerUnavailable as exc:
        print(f"keel manager transfer: {exc}", file=sys.stderr)
        client.close()
        return 1
    if result.get("status") != "ok":
        print(f"keel manager transfer: refused: {result}", file=sys.stderr)
        client.close()
        return 1
    after = wait_until(lambda: (i := client.ask(before["self"], "leader")) and i["leader"] not in (None, before["leader"])
                       and i, timeout_s=5.0)
    client.close()
    print(f"leadership moved: {before['leader']} -> {after['leader'] if after else '(not confirmed within 5 s)'}")
    return 0 if after else 1


def add_parser(sub) -> None:
    p = sub.add_parser("manager", help="the Raft manager group: show its view, move its leadership")
    which = p.add_subparsers(dest="manager_command", required=True)
    for name, fn, text in (("show", cmd_show, "every replica's view, services' roles and epochs, last decisions"),
                           ("transfer", cmd_transfer, "ask the leader to hand leadership to another replica")):
        q = which.add_parser(name, help=text)
        where = q.add_mutually_exclusive_group(required=True)
        where.add_argument("--endpoints", help="replicas' control endpoints, comma-separated")
        where.add_argument("--spec", help="a cluster spec with a [manager] table")
        if name == "show":
            q.add_argument("--json", help="also write the view here")
        else:
            q.add_argument("--to", help="the raft address (host:port) of the replica to lead (default: any)")
        q.set_defaults(func=fn)
