"""Rolling a running cluster's workers of one model to another store version, one at a
time (``keel model rollout`` / ``rollback``, ``keel up --apply``, the chaos harness).

Each worker leaves the dispatcher (which hands what it held to the others), fetches the
version from the store service when its host lacks it (``common.modelfetch``), loads and
checks it with one batch, swaps and registers again; the next worker starts
only once this one is back, and a version a worker refuses stops the rollout there. Then
the frontends are told, since they key their caches by the version served.

A model SERF manages (``[dispatcher] serf``) is then SERF's to follow (``serf_follow``):
the dispatcher is told the version, and takes its profile (kept with the version, beside
its manifest). A version with no profile yet is profiled right after the switch through
the cluster, as ``keel serf profile`` does (a few seconds of requests of every (i, t)
tuple; SERF holds the model's configuration meanwhile), so that a rollout leaves the
model managed as it found it; ``profile=False`` leaves it held instead, which the
dispatcher's status and log say, with the command that ends it.

Example
-------
>>> rollout(load_spec("deploy/examples/local.toml"), "digits", "2")   # doctest: +SKIP
'2'
"""
from __future__ import annotations

from typing import Any

from keel.common.modelstore import ModelStore


class RolloutError(RuntimeError):
    """A rollout stopped: a worker refused the version or did not come back."""


def configure_version(endpoint: str, version: str, timeout_s: float, model: str | None = None,
                      ctx: Any = None) -> dict | None:
    """Ask the worker whose status endpoint is ``endpoint`` to serve ``version``; the status
    it answers with. ``ctx``:
    the ZeroMQ context to use (default the process's; the chaos harness passes one made
    inside a network namespace)."""
    from keel.common import protocol, transport

    return transport.ask(endpoint, protocol.Configure(version=version, model=model), timeout_s, ctx)


def model_workers(spec: Any, model: str) -> list[Any]:
    workers = [s for s in spec.role("worker") if s.config.model == model and s.config.role == "deployed"]
    if not workers:
        raise RolloutError(f"no workers serve model {model!r} in this spec (models: {sorted(spec.models)})")
    return workers


def served_versions(spec: Any, model: str, ctx: Any = None, timeout_s: float = 2.0) -> dict[str, str | None]:
    """Worker name -> the version it serves now (None: no answer within ``timeout_s``)."""
    from keel.common.transport import request_status

    return {w.name: (request_status(w.config.status_endpoint, timeout_s, ctx=ctx) or {}).get("version")
            for w in model_workers(spec, model)}


def rollout(spec: Any, model: str, version: str | None, timeout_s: float = 60.0, log: Any = print,
            ctx: Any = None, profile: bool = True) -> str:
    """Move every deployed worker of ``model`` to store ``version`` (None: latest), one at a
    time; returns the version. Raises ``RolloutError`` where it stopped. ``ctx``: as for
    ``configure_version``; ``profile``: as for ``serf_follow``."""
    from keel.common.modelfetch import Manifests
    from keel.common.transport import request_status
    from keel.common.waiting import wait_until

    workers = model_workers(spec, model)
    store_name = workers[0].config.store_name or model
    # across hosts this machine's store may lack it: the store service knows (each worker fetches it)
    served = spec.role("store")[0].config.store if spec.role("store") else None
    version = Manifests(spec.store, workers[0].config.store_endpoints, served).manifest(store_name, version).version
    dispatcher = spec.service("dispatcher").config.worker_endpoint
    for w in workers:
        info = configure_version(w.config.status_endpoint, version, timeout_s, ctx=ctx)
        if info is None:
            raise RolloutError(f"{w.name} did not answer within {timeout_s:g} s; stopped there")
        if info.get("refused"):
            raise RolloutError(f"{w.name} refused version {version}: {info['refused']}; stopped there, "
                               "the others serve what they served")

        def back() -> bool:
            seen = request_status(dispatcher, 1.0, ctx=ctx)
            return bool(seen) and w.name in seen.get("workers", {})

        if not wait_until(back, timeout_s, 0.05):
            raise RolloutError(f"{w.name} serves version {version} but did not register again within {timeout_s:g} s")
        log(f"{w.name}: serving {model} version {info.get('version')}")
    for fe in spec.role("frontend"):  # the frontends key their caches by the version served
        if not tell_frontend(fe.config, model, version, timeout_s, ctx):
            raise RolloutError(f"every worker serves version {version}, but frontend {fe.name} did not take it")
    if model in spec.service("dispatcher").config.serf:
        serf_follow(spec, model, version, timeout_s, log, ctx, profile)
    return version


def serf_follow(spec: Any, model: str, version: str, timeout_s: float = 60.0, log: Any = print, ctx: Any = None,
                profile: bool = True) -> dict:
    """Tell the dispatcher that ``model``'s workers serve ``version``, so SERF switches by
    that version's profile; where there is none and ``profile``, profile the version
    through the cluster, keep the profile with it and tell the dispatcher again. SERF's
    status of the model (``held``: why it keeps the configuration)."""
    from keel.common import protocol, transport

    def tell() -> dict:
        info = transport.ask(spec.service("dispatcher").config.worker_endpoint,
                             protocol.Configure(model=model, version=version), timeout_s, ctx)
        if info is None or "serf" not in info:
            raise RolloutError(f"every worker serves version {version}, but the dispatcher did not answer for SERF")
        return info["serf"]

    status = tell()
    if status.get("held") and profile:
        from keel.deploy.serf_cli import model_cores
        from keel.services.serf.profile import save, where
        from keel.services.serf.profiler import ProfileError, profile_model

        store_name = model_workers(spec, model)[0].config.store_name or model
        log(f"{model}: SERF has no profile of version {version}; profiling it through the cluster")
        try:
            p = profile_model(spec, model, model_cores(spec, model), version=version, log=log)
        except ProfileError as exc:
            log(f"{model}: profiling version {version} failed ({exc}); SERF holds its configuration: "
                f"keel serf profile SPEC --model {model}")
            return status
        log(f"{model}: profiled in {p.profiling_s:.1f} s, kept at {save(p, where(store_name, version, spec.store, spec.run_dir))}")
        status = tell()
    if status.get("held"):
        log(f"{model}: SERF holds its configuration: {status['held']}")
    else:
        log(f"{model}: SERF switches by the profile of version {version}")
    return status


def tell_frontend(cfg: Any, model: str, version: str, timeout_s: float, ctx: Any = None) -> bool:
    """Tell the frontend of ``cfg`` that ``model``'s workers serve ``version``: on its
    prediction endpoint (its clients' port refuses control messages), then wait until its
    status says so."""
    import zmq

    from keel.common import protocol, transport
    from keel.common.waiting import wait_until

    push = transport.make_socket(ctx or zmq.Context.instance(), zmq.PUSH, connect=cfg.prediction_endpoint)
    try:
        transport.send(push, protocol.Configure(version=version, model=model), flags=zmq.NOBLOCK)
    except zmq.Again:
        return False
    finally:
        push.close(int(timeout_s * 1000))

    def taken() -> bool:
        info = transport.request_status(cfg.client_endpoint, 1.0, ctx=ctx) or {}
        return (info.get("serving") or {}).get(model) == version

    return bool(wait_until(taken, timeout_s, 0.05))


def previous_version(spec: Any, model: str, ctx: Any = None) -> str:
    """The store version just before the one the model's workers serve."""
    served = {v for v in served_versions(spec, model, ctx).values() if v is not None}
    if len(served) != 1:
        raise RolloutError(f"workers of {model} serve {sorted(served) or 'nothing that answers'}; "
                           "give --version to roll back to")
    store_name = model_workers(spec, model)[0].config.store_name or model
    versions = ModelStore(spec.store).versions(store_name)
    current = served.pop()
    earlier = [v for v in versions if int(v) < int(current)]
    if not earlier:
        raise RolloutError(f"{model} serves version {current}, the first in the store: nothing to roll back to")
    return earlier[-1]
