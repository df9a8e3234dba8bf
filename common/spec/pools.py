"""Heterogeneous pools (Kairos §3, §7): a model served by workers of several instance
types, and the emulated ``kairos`` builtin model that stands in for them.

Spec syntax::

    [models.rm2]
    builtin = "kairos"              # each row a query, its batch size in the first feature
    kairos_model = "rm2"            # the profiled model emulated (Table 3)
    kairos_scale = 0.1              # service time = measured time x 0.1 (fast experiments)
    kairos_profile = "../shared/data/kairos"   # the default; relative to the cwd
    pools = {"g4dn.xlarge" = 1, "r5n.large" = 4}   # workers per instance type

    [pools."r5n.large"]             # optional: a price ($/h) other than the profile's
    price = 0.149

Each worker of a pool declares its ``instance`` and ``price`` at ``Register``; the
profile's ``price.csv`` (or ``instance.json``) gives prices not overridden. A model with
``pools`` may be a store or ``sleep`` model too (it then only declares types and prices);
``builtin = "kairos"`` needs ``pools``, every type of which must be profiled.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from keel.common.spec.tables import NAME, SpecError, Table, fail

KAIROS_KEYS = ("kairos_model", "kairos_scale", "kairos_profile")


@lru_cache(maxsize=4)
def _profiles(root: str):
    from keel.common.kairos.profiles import Profiles

    return Profiles.load(root)


def default_profile() -> str:
    """``../shared/data/kairos`` beside the repository, absolute."""
    from keel.common.kairos.profiles import DEFAULT_ROOT

    return str(DEFAULT_ROOT)


def read_pool_prices(t: Table) -> dict[str, float]:
    """Root ``[pools.TYPE]`` tables: ``price`` ($/h, >= 0) per instance type."""
    prices: dict[str, float] = {}
    for type_ in list(t.data):
        sub = Table(t.take(type_, dict), t.key(type_))
        if not NAME.match(type_):
            fail(sub.path, "instance type names must be letters, digits, '_', '.', '-'")
        prices[type_] = sub.take("price", float)
        if prices[type_] < 0:
            fail(sub.key("price"), "must be >= 0")
        sub.finish()
    return prices


def read_kairos(t: Table, builtin: str | None) -> dict[str, Any]:
    """The emulated model's options: profiled model, scale, profile directory (absolute)."""
    if builtin != "kairos":
        for key in KAIROS_KEYS:
            if t.has(key):
                fail(t.key(key), 'only used with builtin = "kairos"')
        return {}
    out = {"kairos_model": t.take("kairos_model", str),
           "kairos_scale": t.take("kairos_scale", float, 1.0)}
    if out["kairos_scale"] <= 0:
        fail(t.key("kairos_scale"), "must be > 0")
    given = t.take("kairos_profile", str, None)
    out["kairos_profile"] = str(Path(given).absolute()) if given else default_profile()
    return out


def read_pools(t: Table, out: dict[str, Any], prices: dict[str, float]) -> list[tuple[str, float]] | None:
    """``pools`` of a model: one (instance type, price) per worker, pool by pool, or None
    without pools. ``out`` is the model resolved so far (builtin, kairos options)."""
    kairos = out.get("builtin") == "kairos"
    if not t.has("pools"):
        if kairos:
            fail(t.key("pools"), 'builtin = "kairos" needs pools = {"TYPE" = workers, ...}')
        return None
    if t.has("workers"):
        fail(t.key("pools"), "give workers or pools, not both (pools sets the workers per instance type)")
    pools = t.take("pools", dict[str, int])
    for type_, count in pools.items():
        if not NAME.match(type_):
            fail(t.key(f'pools."{type_}"'), "instance type names must be letters, digits, '_', '.', '-'")
        if count < 0:
            fail(t.key(f'pools."{type_}"'), f"must be >= 0 workers, got {count}")
    if sum(pools.values()) < 1:
        fail(t.key("pools"), "needs at least one worker")
    root = out.get("kairos_profile") or default_profile()
    needs_profile = kairos or any(ty not in prices for ty in pools)
    prof = None
    if needs_profile:
        try:
            prof = _profiles(root)
        except FileNotFoundError as exc:
            key = "kairos_profile" if kairos else "pools"
            raise SpecError(f"{t.key(key)}: {exc}; give [pools.TYPE] price for a model that is not kairos-emulated") from None
    if kairos and out["kairos_model"] not in prof.models:
        fail(t.key("kairos_model"), f"{out['kairos_model']!r} is not profiled at {root}; models: {prof.models}")
    per_worker: list[tuple[str, float]] = []
    for type_, count in pools.items():
        if prof is not None and (kairos or type_ not in prices) and type_ not in prof.types:
            fail(t.key(f'pools."{type_}"'), f"unknown instance type; profiled types: {prof.types}")
        price = prices[type_] if type_ in prices else prof.price(type_)
        per_worker += [(type_, price)] * count
    return per_worker
