"""``keel kairos plan``: Kairos's pool planner (§5.2) on the authors' measured profiles.

Example
-------
::

    keel kairos plan --model rm2 --budget 2.5 --json runs/kairos-plan-rm2.json

prints the top pools by throughput upper bound (Eq. 15), the pick without online trials,
the plain argmax and the best homogeneous pool within the budget, and writes them as JSON.

    keel kairos apply deploy/examples/kairos.toml --model rm2 --budget 2.5 [--which argmax]

writes the planned pool into the spec's ``[models.rm2]`` table (``pools = {...}``, the
line replaced or added; the rest of the file kept as it is), after checking that the
result loads as a spec.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import orjson


def _short(type_: str) -> str:
    return type_.split(".")[0]


def cmd_plan(args: argparse.Namespace) -> int:
    from keel.common.kairos.planner import plan_pools
    from keel.common.kairos.profiles import DEFAULT_ROOT, Profiles

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


def apply_pool(text: str, model: str, pool: dict[str, int]) -> str:
    """``text`` (a spec's TOML) with ``[models.<model>]``'s ``pools`` set to ``pool``: an
    existing ``pools = ...`` line of that table replaced, else one added under its header.
    ValueError when the spec has no such table."""
    lines = text.splitlines(keepends=True)
    header = re.compile(r"^\s*\[\s*models\.\"?" + re.escape(model) + r"\"?\s*\]\s*(#.*)?$")
    start = next((i for i, ln in enumerate(lines) if header.match(ln.rstrip("\n"))), None)
    if start is None:
        raise ValueError(f"the spec has no [models.{model}] table")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    value = "{" + ", ".join(f'"{t}" = {n}' for t, n in pool.items() if n) + "}"
    new = f"pools = {value}\n"
    for i in range(start + 1, end):
        if re.match(r"^\s*pools\s*=", lines[i]):
            lines[i] = new
            break
    else:
        if not lines[start].endswith("\n"):
            lines[start] += "\n"
        lines.insert(start + 1, new)
    return "".join(lines)


def cmd_apply(args: argparse.Namespace) -> int:
    from keel.common.kairos.planner import plan_pools
    from keel.common.kairos.profiles import DEFAULT_ROOT, Profiles
    from keel.common.spec import load_spec

    path = Path(args.spec)
    try:
        prof = Profiles.load(args.profile or DEFAULT_ROOT)
        try:
            plan = plan_pools(prof, args.model, budget=args.budget, qos_ms=args.qos_ms)
        except KeyError:
            raise ValueError(f"no profile of model {args.model!r} (known: {', '.join(prof.models)})") from None
        chosen = {"pick": plan.pick, "argmax": plan.argmax, "homogeneous": plan.homogeneous}[args.which]
        pool = {t: int(n) for t, n in zip(plan.types, chosen.counts) if n}
        text = apply_pool(path.read_text(), args.model, pool)
        tmp = path.with_name(path.name + ".kairos-tmp")
        tmp.write_text(text)
        try:
            load_spec(tmp)
        finally:
            tmp.unlink(missing_ok=True)
    except Exception as exc:  # noqa: BLE001 - the spec is left unchanged, the reason said
        print(f"keel kairos apply: {path}: {exc}; the spec is unchanged", file=sys.stderr)
        return 2
    path.write_text(text)
    print(f"{path}: [models.{args.model}] pools = {pool} (${chosen.cost:.3f}/h, {args.which}, "
          f"budget ${plan.budget:.2f}/h)")
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
    a = sub.add_parser("apply", help="write the planned pool into a spec's [models.M] table")
    a.add_argument("spec", help="the cluster spec (TOML) to change")
    a.add_argument("--profile", help="profile directory (default: ../shared/data/kairos beside the repository)")
    a.add_argument("--model", required=True, help="the model's table in the spec; dien, mtwnd, ncf, rm2 or wnd")
    a.add_argument("--budget", type=float, help="$/h (default: the search space's, instance.json)")
    a.add_argument("--qos-ms", type=float, help="override the paper's p99 QoS target")
    a.add_argument("--which", choices=("pick", "argmax", "homogeneous"), default="pick",
                   help="which pool of the plan (default: the pick without online trials)")
    a.set_defaults(func=cmd_apply)
    return kairos
