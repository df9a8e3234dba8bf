"""How much of each measured point's prediction error Keel's path explains, from a SERF run's
stored figures (``keel experiment serf --json PATH``), and whether each point's error is
within its own standard error.

Each point holds Eq. 13's prediction, the path the profile added, the measured mean and
its standard error. What the point measured beyond Eq. 13 without a path
(``implied_path_ms``) is the path that would have made it exact; the figures compare three
path terms against it:

- ``const``: one path for every rate, from the profile's spaced requests (as Eq. 13's path
  term was before it was measured by rate);
- ``rate``: the profile's path by arrival rate (``Profile.path_at``), where the profile
  has one;
- ``best_const`` and ``best_rate``: fitted to the points themselves (their median implied
  path; their implied paths in bands of rate, ``path_bands``). Not predictions: the most
  a constant, or a path that moves only with the rate, could explain of these points.

Example
-------
>>> report = analyse(orjson.loads(Path("runs/serf/quick.json").read_bytes()))  # doctest: +SKIP
>>> report["host-small"]["within_2se"]                                              # doctest: +SKIP
{'const': 3, 'rate': 5, 'best_const': 6, 'best_rate': 7, 'points': 12}
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import orjson

from keel.services.serf.profile import Profile, path_bands

#: a point within this many of its standard errors is as near as its measurement can say
WITHIN_SE = 2.0
TERMS = ("const", "rate", "best_const", "best_rate")


def within(error_ms: float, se_ms: float | None) -> bool:
    """Is a point's error (ms) within ``WITHIN_SE`` of its standard errors?"""
    return se_ms is not None and abs(error_ms) <= WITHIN_SE * se_ms


def analyse_model(model: dict) -> dict:
    """Per point: Eq. 13 without the path (``eq13_ms``), the implied path, and the error
    (measured - predicted, ms) under each path term; in all: the mean relative error and
    the points within 2 standard errors under each term."""
    p = Profile.from_json(model["profile"])
    rows = []
    for pt in model["points"]:
        # the stored prediction less the path it was given (a run before the path by rate: path_ms)
        given = pt.get("path_term_ms", p.path_ms)
        eq13 = pt["predicted_ms"] - given
        rows.append({"config": pt["config"], "load": pt["load"], "rate": pt["rate"], "eq13_ms": eq13,
                     "measured_ms": pt["measured_ms"], "se_ms": pt["se_ms"],
                     "implied_path_ms": pt["measured_ms"] - eq13,
                     "path_ms": {"const": p.path_ms, "rate": p.path_at(pt["rate"]) if p.path_points else None}})
    implied = [(r["rate"], r["implied_path_ms"], 1) for r in rows]
    best_const = float(np.median([ms for _, ms, _ in implied])) if implied else 0.0
    bands = path_bands(implied)
    for r in rows:
        r["path_ms"]["best_const"] = best_const
        r["path_ms"]["best_rate"] = float(np.interp(r["rate"], *zip(*bands))) if bands else None
        r["error_ms"] = {t: None if ms is None else r["implied_path_ms"] - ms for t, ms in r["path_ms"].items()}
    out = {"points": rows, "mean_error": {}, "within_2se": {"points": len(rows)}}
    for t in TERMS:
        errs = [r["error_ms"][t] for r in rows if r["error_ms"][t] is not None]
        if len(errs) < len(rows) or not rows:
            out["mean_error"][t] = out["within_2se"][t] = None
            continue
        out["mean_error"][t] = float(np.mean([abs(e) / r["measured_ms"] for e, r in zip(errs, rows)]))
        out["within_2se"][t] = sum(within(e, r["se_ms"]) for e, r in zip(errs, rows))
    return out


def analyse(run: dict) -> dict:
    """``analyse_model`` for every model of a run."""
    return {name: analyse_model(m) for name, m in run["models"].items()}


def lines(report: dict) -> list[str]:
    """The printed table: per model, each point's implied path and error under each term."""
    out = []
    for name, m in report.items():
        out.append(f"-- {name}: mean error " + ", ".join(
            f"{t} {'-' if v is None else f'{v:.1%}'}" for t, v in m["mean_error"].items())
            + "; within 2 SE " + ", ".join(f"{t} {m['within_2se'][t]}" for t in TERMS)
            + f" of {m['within_2se']['points']}")
        out.append(f"   {'config':>6} {'load':>5} {'rate':>7} {'eq13':>7} {'measured':>9} {'2 SE':>6} {'implied':>8} "
                   + " ".join(f"{t + ' err':>14}" for t in TERMS))
        for r in m["points"]:
            out.append(f"   {'x'.join(map(str, r['config'])):>6} {r['load']:5.0%} {r['rate']:7.1f} {r['eq13_ms']:7.2f} "
                       f"{r['measured_ms']:9.2f} {2 * (r['se_ms'] or 0):6.2f} {r['implied_path_ms']:8.2f} "
                       + " ".join(f"{'-':>14}" if e is None else f"{e:+14.2f}" for e in r["error_ms"].values()))
    return out


def main(argv: list[str] | None = None) -> None:
    for path in argv if argv is not None else sys.argv[1:]:
        print(f"== {path}")
        print("\n".join(lines(analyse(orjson.loads(Path(path).read_bytes())))))


if __name__ == "__main__":
    main()
