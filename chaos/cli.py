"""``keel chaos run|selftest|clean`` (also ``python -m keel.chaos.cli ...``).

- ``run EXPERIMENT.toml --json PATH``: run an experiment, write the report JSON and
  its plots beside it; exit 1 if an invariant failed, 2 if the harness failed.
- ``selftest --json PATH [--local]``: the harness's own checks (``chaos.selftest``);
  exit 0 when every check that could run passed.
- ``clean``: remove what crashed runs left (namespaces, processes, state files).

SIGINT, SIGTERM and the run's time bound all end in the same cleanup as a normal exit.
"""
from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path
from typing import Any

import orjson


class RunTimeout(Exception):
    """The experiment ran past its hard time bound; cleanup follows as on any exit."""


@contextlib.contextmanager
def _guard(max_s: float | None):
    """SIGTERM -> SystemExit and an optional SIGALRM bound, so ``finally`` blocks run;
    the previous handlers and timer are restored afterwards."""

    def on_term(signum, frame):  # noqa: ANN001
        raise SystemExit(128 + signum)

    def on_alarm(signum, frame):  # noqa: ANN001
        raise RunTimeout(f"ran past its bound of {max_s:.0f} s")

    # a shell starts background jobs with SIGINT ignored; Ctrl-C must still clean up
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    old_term = signal.signal(signal.SIGTERM, on_term)
    old_alarm = signal.signal(signal.SIGALRM, on_alarm) if max_s else None
    old_timer = signal.setitimer(signal.ITIMER_REAL, max_s) if max_s else None
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)
        if max_s:
            signal.setitimer(signal.ITIMER_REAL, *old_timer)
            signal.signal(signal.SIGALRM, old_alarm)


def _dump(path: str | None, data: dict) -> None:
    text = orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(text)


def cmd_selftest(args: argparse.Namespace) -> int:
    from keel.chaos.selftest import BUDGET_S, run_selftest

    with _guard(BUDGET_S + 30):
        report = run_selftest(local=args.local, link_mbit=args.link_mbit, shuffle_mb=args.shuffle_mb,
                              delay_ms=args.delay_ms)
    _dump(args.json, report)
    keys = ("netns", "kill_host_ok", "restart_ok", "freeze_ok", "partition_ok", "link_limit_mbps", "shuffle_mbps",
            "delay_configured_ms", "delay_added_ms", "cleanup_ok", "duration_s", "ok")
    for key in keys:
        print(f"{key:22s} {report.get(key)}")
    for key, why in report["skipped"].items():
        print(f"skipped {key}: {why}")
    for key, err in report["errors"].items():
        print(f"error in {key}: {err}", file=sys.stderr)
    return 0 if report["ok"] else 1


def cmd_run(args: argparse.Namespace) -> int:
    from keel.chaos.experiment import load_experiment, run_experiment
    from keel.chaos.resources import ChaosError

    try:
        exp = load_experiment(args.experiment)
        if args.local:
            exp.netns = False
        if args.max_s:
            exp.max_duration_s = args.max_s
        out_dir = Path(args.out) if args.out else Path(args.json).with_suffix("")
        manager = None
        if "manager" in exp.cluster:  # chaos/experiments/manager_*.toml
            from keel.chaos import manager

            manager.prepare(exp, out_dir)
        with _guard(exp.max_duration_s + 60):
            report = run_experiment(exp, json_path=Path(args.json), out_dir=out_dir)
        if manager is not None:
            manager.print_summary(manager.augment(exp, report, Path(args.json), out_dir))
        if exp.supervised:  # chaos/experiments/dispatcher_kill.toml: restart figures of each crash
            from keel.chaos import supervised

            supervised.print_summary(supervised.augment(exp, report, Path(args.json), out_dir))
    except (RunTimeout, ChaosError) as exc:
        print(f"experiment {args.experiment}: {exc}; everything it made was removed", file=sys.stderr)
        return 2
    for mode, s in report["modes"].items():
        lat = s["latency_ms"]
        print(f"{mode:10s} sent {s['sent']:6d} answered {s['answered']:6d} lost {s['lost']:5d}  "
              + "  ".join(f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in lat.items() if k.startswith("p")))
    for name, r in report["ratios"].items():
        print(f"ratio {name}: " + "  ".join(f"{k} {v:.2f}" for k, v in r.items() if v is not None))
    for inv in report["invariants_all"]:
        print(f"invariant {inv['name']:30s} {inv['mode']:8s} {inv['ok']}  {inv['detail']}")
    print(f"report {args.json}; plots {', '.join(report['plots'].values())}")
    return 1 if any(inv["ok"] is False for inv in report["invariants_all"]) else 0


def cmd_clean(args: argparse.Namespace) -> int:
    from keel.chaos.resources import clean_stale

    done = clean_stale()
    for line in done:
        print(line)
    if not done:
        print("nothing to clean")
    return 0


def add_parser(subparsers: Any, argv: Any = ()) -> argparse.ArgumentParser:
    """Add ``chaos`` with ``run``, ``selftest`` and ``clean`` to a parent's subparsers."""
    chaos = subparsers.add_parser("chaos", help="chaos experiments: hosts, faults, workload, invariants, reports")
    sub = chaos.add_subparsers(dest="chaos_command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run an experiment TOML; write the JSON report and plots")
    p.add_argument("experiment", help="experiment TOML (see docs/design/chaos.md)")
    p.add_argument("--json", required=True, help="report path; plots go beside it")
    p.add_argument("--out", help="run directory for logs and records (default: beside the report)")
    p.add_argument("--local", action="store_true", help="hosts on loopback even where netns is available")
    p.add_argument("--max-s", type=float, help="override the experiment's max_duration_s")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("selftest", help="check hosts, faults, shuffles, delay and cleanup on this machine")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--local", action="store_true", help="loopback hosts: netns-only checks are reported as skipped")
    p.add_argument("--link-mbit", type=float, default=500.0, help="tbf limit of each host's link (default 500)")
    p.add_argument("--shuffle-mb", type=float, default=64.0, help="size of the measured shuffle (default 64)")
    p.add_argument("--delay-ms", type=float, default=20.0, help="delay the proxy adds (default 20)")
    p.set_defaults(func=cmd_selftest)

    p = sub.add_parser("clean", help="remove leftovers of crashed runs (live runs are left alone)")
    p.set_defaults(func=cmd_clean)
    return chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keel.chaos.cli")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["chaos", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted; cleaned up", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
