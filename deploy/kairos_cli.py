"""``keel kairos plan``: Kairos's pool planner (§5.2) on the authors' measured profiles.

Example
-------
::

    keel kairos plan --model rm2 --budget 2.5 --json runs/kairos-plan-rm2.json

prints the top pools by throughput upper bound (Eq. 15), the pick without online trials,
the plain argmax and the best homogeneous pool within the budget, and writes them as JSON.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson


def _short(type_: str) -> str:
    return type_.split(".")[0]


def cmd_plan(args: argparse.Namespace) -> int:
    from common.kairos.planner import plan_pools
    from common.kairos.profiles import DEFAULT_ROOT, Profiles

    prof = Profiles.load(args.profile or DEFAULT_ROOT)
    plan = plan_pools(prof, args.model, budget=args.budget, qos_ms=args.qos_ms)
    head = "  ".join(f"{_short(t):>5}" for t in plan.types)
    print(f"Kairos plan: {args.model}, budget ${plan.budget:.2f}/h, {len(plan.ranked)} pools "
          f"ranked in {plan.plan_ms:.1f} ms")
    print(f"{'':>12}{head}  {'$/h':>7}  {'UB qps':>9}")

    def row(label: str, p) -> None:
        counts = "  ".join(f"{n:>5}" for n in p.counts)
        print(f"{label:>12}{counts}  {p.cost:>7.3f}  {p.upper_bound:>9.2f}")

    for i, p in enumerate(plan.ranked[:args.top], start=1):
        row(f"#{i}", p)
    row("pick", plan.pick)
    row("argmax", plan.argmax)
    row("homogeneous", plan.homogeneous)
    print(f"pick rule: {plan.pick_rule}; pick / homogeneous upper bound: "
          f"{plan.pick.upper_bound / plan.homogeneous.upper_bound:.2f}x")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(plan.to_json(top=args.top), option=orjson.OPT_INDENT_2))
        print(f"wrote {path}")
    return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``kairos`` with ``plan`` to a parent's subparsers."""
    kairos = subparsers.add_parser("kairos", help="Kairos heterogeneous pools: plan a pool within a budget")
    sub = kairos.add_subparsers(dest="kairos_command", required=True, metavar="COMMAND")
    p = sub.add_parser("plan", help="rank every pool within the budget by throughput upper bound (§5.2)")
    p.add_argument("--profile", help="profile directory (default: ../shared/data/kairos beside the repository)")
    p.add_argument("--model", required=True, help="dien, mtwnd, ncf, rm2 or wnd")
    p.add_argument("--budget", type=float, help="$/h (default: the search space's, instance.json)")
    p.add_argument("--qos-ms", type=float, help="override the paper's p99 QoS target")
    p.add_argument("--top", type=int, default=10, help="pools to print (default: %(default)s)")
    p.add_argument("--json", help="write the plan here")
    p.set_defaults(func=cmd_plan)
    return kairos
