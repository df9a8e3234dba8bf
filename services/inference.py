"""Inference: what every OIP v2 gateway does whatever its transport (HTTP, gRPC).

A gateway decodes its transport's request into a name, an array of rows and the request's
parameters; ``Inference`` does the rest: which targets the frontends serve (models,
applications, graphs, from their status ``targets``), which versions, validating the input
(``common.inputs``), one Keel query per row through one ``AsyncClient``, and mapping Keel's
answers to a status and a message (``InferError``). The gateway then encodes the outputs.

Targets are asked of every frontend and kept: older than ``TARGETS_TTL_S`` they are asked
again in the background while requests go on with them; a name or version not among them
is asked again before it is refused, and metadata calls (``targets(fresh=True)``) always
ask, so a rollout shows at once. A frontend
that lists no ``targets`` (an older one) stands for the spec's models with the versions it
says it serves. While no frontend answers, a request for one of the spec's models still goes
out (the frontends may answer queries while a status is lost); anything else is a 503.

Example
-------
::

    inference = Inference(cfg, AsyncClient(cfg.frontend_endpoints))
    await inference.target("digits-ensemble")      # {"kind": "application", "key": True, ...}
    out, results = await inference.infer("digits-ensemble", x, key="alice")
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import Any

import numpy as np

from keel.common import inputs, targets, tracing, transport
from keel.common.async_client import AsyncClient
from keel.common.client import Result
from keel.common.config import GatewayConfig
from keel.common.protocol import ErrorCode
from keel.services.oip import tensors as tensors_
from keel.services.oip.stats import Statistics

#: Keel error code -> HTTP status (gRPC maps the HTTP status on)
STATUS_OF = {ErrorCode.BAD_REQUEST: 400, ErrorCode.UNKNOWN_MODEL: 404, ErrorCode.OVERLOADED: 503,
             ErrorCode.DEADLINE: 504, ErrorCode.TIMEOUT: 504, ErrorCode.MODEL_ERROR: 500, ErrorCode.INTERNAL: 500}
#: how long the frontends' targets are kept for inference (s): a status round trip per
#: request would double the cost of a small one
TARGETS_TTL_S = 1.0
#: how long each frontend has to answer a status (s)
STATUS_TIMEOUT_S = 0.5


class InferError(Exception):
    """A request a gateway answers with an OIP error: ``status`` (the HTTP status) and
    ``message``; a gRPC gateway maps the status to its own code."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def version_order(version: str) -> tuple:
    """Numeric versions in numeric order, before the others (by name)."""
    return (0, int(version), "") if version.isascii() and version.isdigit() else (1, 0, version)


def not_served(name: str, version: str, versions: list[str]) -> str:
    return f"model {name!r} version {version[:40]} is not served; its workers serve version(s) {', '.join(versions)}"


def call_parameters(params: dict) -> tuple[str | None, float | None]:
    """(key, deadline in ms) of a request's OIP ``parameters``, whichever transport it came
    by: ``key`` (an application's context, a graph's stream), ``timeout_ms`` or ``timeout``
    (us, tritonclient's). A malformed one is a 400 ``InferError`` (the rules are
    ``common.inputs``', the frontend's too)."""
    key = params.get("key")
    error = inputs.key_error(key)
    if error is not None:
        raise InferError(400, f"parameters.{error}")
    for name, scale in (("timeout_ms", 1.0), ("timeout", 1e-3)):
        value = params.get(name)
        if value is not None:
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            ms = value * scale if number else value
            error = inputs.timeout_error(ms, f"parameters.{name}")
            if error is not None or not ms:  # 0 is the frontend's "the target's own": not an OIP deadline
                raise InferError(400, error or f"parameters.{name} must be a number > 0, got {value}")
            return key, float(ms)
    return key, None


class Inference:
    """The frontends' targets and inference on them, for any gateway (module docstring)."""

    def __init__(self, cfg: GatewayConfig, client: AsyncClient):
        self.cfg = cfg
        self.client = client
        self.known: dict[str, dict] | None = None  # the targets last asked, with when
        self.known_at = -float("inf")
        self.asking = asyncio.Lock()  # one status round at a time: the others then find it kept
        self.refresh: asyncio.Future | None = None  # the background ask of stale targets
        self.requests = itertools.count(1)  # makes callers' request ids unique (see infer)
        self.queries = 0  # Keel queries sent, whatever transport asked for them
        self.statistics = Statistics()  # Triton's model statistics, per target (perf_analyzer reads them)

    # ------------------------------------------------------------------ targets

    async def statuses(self) -> list[dict]:
        """The Status of every frontend that answers within ``STATUS_TIMEOUT_S``, all asked at once."""
        loop = asyncio.get_running_loop()
        asks = [loop.run_in_executor(None, transport.request_status, ep, STATUS_TIMEOUT_S)
                for ep in self.cfg.frontend_endpoints]
        return [info for info in await asyncio.gather(*asks) if info is not None]

    async def targets(self, fresh: bool = False) -> dict[str, dict]:
        """name -> target (as the frontends' ``Frontend.targets``, plus ``versions``: every
        version some frontend serves, sorted; [] for a target without versions); a 503
        ``InferError`` if no frontend answers. Unless ``fresh``, the targets last asked:
        older than ``TARGETS_TTL_S``, they are asked again in the background meanwhile (a
        request never waits on a status round, which a silent frontend makes last
        ``STATUS_TIMEOUT_S``)."""
        if not fresh and self.known is not None:
            if time.monotonic() - self.known_at >= TARGETS_TTL_S and (self.refresh is None or self.refresh.done()):
                self.refresh = asyncio.ensure_future(self._refresh())
            return self.known
        asked = time.monotonic()
        async with self.asking:
            if self.known is not None and self.known_at >= asked:  # asked while this call waited
                return self.known
            return await self._ask()

    async def _refresh(self) -> None:
        try:
            await self.targets(fresh=True)
        except InferError:
            pass  # none answered: nothing is kept now, so the next request asks (and says 503) itself

    async def close(self) -> None:
        """Stop a background ask (the gateway is stopping)."""
        if self.refresh is not None and not self.refresh.done():
            self.refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.refresh

    async def _ask(self) -> dict[str, dict]:
        statuses = await self.statuses()
        if not statuses:
            self.known = None  # what was kept is not known to be served any more
            raise InferError(503, "no frontend answered: the targets served now are unknown")
        merged: dict[str, dict] = {}
        for status in statuses:
            for name, target in self._targets_of(status).items():
                seen = merged.setdefault(name, {**target, "versions": []})
                if target.get("version") is not None and target["version"] not in seen["versions"]:
                    seen["versions"].append(target["version"])
        for target in merged.values():
            target["versions"].sort(key=version_order)
        self.known, self.known_at = merged, time.monotonic()
        return merged

    def _targets_of(self, status: dict) -> dict[str, dict]:
        """One frontend's targets; the spec's models for a frontend that does not list them."""
        if isinstance(status.get("targets"), dict):
            return {n: t for n, t in status["targets"].items() if isinstance(t, dict)}
        serving = status.get("serving") if isinstance(status.get("serving"), dict) else {}
        return {name: self._spec_target(name, serving.get(name)) for name in self.cfg.models}

    def _spec_target(self, name: str, version: str | None = None) -> dict:
        version = version or self.cfg.models[name].version
        return {**targets.describe("model", self.cfg.models[name], version), "versions": [version]}

    async def target(self, name: str, version: str | None = None) -> dict:
        """The target ``name`` (pinned to ``version``, if given): 404 when the frontends do
        not serve it (asked again first when the kept targets do not have it), 503 when no
        frontend answers."""
        targets = await self.targets()
        if not self._has(targets, name, version):
            targets = await self.targets(fresh=True)
        target = targets.get(name)
        if target is None:
            raise InferError(404, f"unknown model {inputs.short(name)}; served: {', '.join(sorted(targets)) or 'none'}")
        if version is not None and version not in target["versions"]:
            if not target["versions"]:
                raise InferError(404, inputs.call_error(name, target["kind"], version=version)
                                 or f"{target['kind']} {name!r} has no versions (asked for version {version[:40]})")
            raise InferError(404, not_served(name, version, target["versions"]))
        return target

    @staticmethod
    def _has(targets: dict[str, dict], name: str, version: str | None) -> bool:
        return name in targets and (version is None or version in targets[name]["versions"])

    # ------------------------------------------------------------------ inference

    async def infer(self, name: str, x: np.ndarray, *, key: str | None = None, version: str | None = None,
                    timeout_ms: float | None = None, request_id: str | None = None,
                    traceparent: str | None = None) -> tuple[np.ndarray, list[Result]]:
        """One Keel query per row of ``x`` (axis 0 is the batch), all in flight at once: the
        one-tensor path (a target of one fixed-shape ``input`` and one FP32 ``output``).

        Returns the stacked outputs (float32, rows x output_size) and each row's ``Result``;
        raises ``InferError``: 400 a bad input or a key for a model, 404 an unknown target or
        a version not served, 409 another version answered a pinned request (a rollout moved
        the workers under it), and the status of the first row Keel refused (``STATUS_OF``).
        ``request_id`` (the caller's) names row ``i``'s query ``{request_id}.{n}-{i}``, ``n``
        counting this gateway's requests: callers pick ids freely (two may both send "1"),
        so Keel's id must be unique yet traceable in the frontends' logs.
        """
        target = await self._callable(name, version, key, timeout_ms)
        try:
            x = inputs.validate(x, target["input_shape"], target["input_dtype"], rows=True, what=f"input of {name!r}")
        except inputs.InputError as exc:
            raise InferError(400, str(exc)) from None
        results = await self._queries(name, list(x), lambda r: r.output, key=key, version=version,
                                      timeout_ms=timeout_ms, request_id=request_id, traceparent=traceparent)
        if len(results) == 1:  # the common case, without np.stack's list
            out = np.asarray(results[0].output, np.float32).reshape(1, -1)
        else:
            out = np.stack([np.asarray(r.output, np.float32) for r in results]) if results else \
                np.zeros((0, target["output_size"]), np.float32)
        return out, results

    async def infer_named(self, name: str, tensors: dict[str, tuple[str, np.ndarray]], *,
                          outputs: list[str] | None = None, key: str | None = None, version: str | None = None,
                          timeout_ms: float | None = None, request_id: str | None = None,
                          traceparent: str | None = None) -> tuple[dict[str, np.ndarray], list[Result]]:
        """``infer`` for named tensors: ``tensors`` is name -> (OIP datatype, array with the
        batch axis first), checked against the target's signature (``oip.tensors.check_inputs``);
        row ``i`` of every input is one Keel query of named tensors. Returns each output
        asked for (``outputs``; None: all) stacked over the rows, and each row's ``Result``;
        the same refusals as ``infer``."""
        target = await self._callable(name, version, key, timeout_ms)
        try:
            signature = tensors_.signature_of(target)
            x = tensors_.check_inputs(signature, tensors)
            wanted = tensors_.requested(signature, outputs)
        except inputs.InputError as exc:
            raise InferError(400, str(exc)) from None
        # a[i, ...]: an array even for a scalar per request (a[i] would be a bare bytes or number)
        rows = [{n: a[i, ...] for n, a in x.items()} for i in range(len(next(iter(x.values()))))]
        results = await self._queries(name, rows, lambda r: getattr(r, "outputs", None), key=key, version=version,
                                      timeout_ms=timeout_ms, request_id=request_id, traceparent=traceparent)
        try:
            return tensors_.stack_rows([r.outputs for r in results], wanted), results
        except inputs.InputError as exc:
            raise InferError(400, str(exc)) from None
        except ValueError as exc:
            raise InferError(500, f"model {name!r}: {exc}") from None

    async def _callable(self, name: str, version: str | None, key: str | None, timeout_ms: float | None) -> dict:
        """The target of a call, once its key and deadline are ones it takes."""
        target = await self.target_or_spec(name, version)
        error = inputs.call_error(name, target["kind"], key, None, timeout_ms)
        if error is not None:
            raise InferError(400, error)
        return target

    async def _queries(self, name: str, rows: list, answer: Any, *, key: str | None, version: str | None,
                       timeout_ms: float | None, request_id: str | None, traceparent: str | None) -> list[Result]:
        """One Keel query per row, all in flight at once; each row's ``Result``, or the
        ``InferError`` of the first row without an ``answer`` (or answered by another version)."""
        if timeout_ms is None and name in self.cfg.models:
            timeout_ms = self.cfg.models[name].deadline_ms  # the model's own deadline, as the frontend's
        n = next(self.requests)
        self.queries += len(rows)
        traceparent = traceparent if tracing.valid(traceparent) else None  # W3C: a malformed one is ignored
        calls = [self.client.predict(name, row, key=key, version=version, timeout_ms=timeout_ms,
                                     request_id=f"{request_id}.{n}-{i}" if request_id else None, traceparent=traceparent)
                 for i, row in enumerate(rows)]
        start = time.perf_counter_ns()
        results = [await calls[0]] if len(calls) == 1 else list(await asyncio.gather(*calls))  # one row: no task
        try:
            self._answered(name, version, results, answer)
        except InferError:
            self.statistics.record(name, version, rows=len(rows), ns=time.perf_counter_ns() - start, ok=False)
            raise
        self.statistics.record(name, results[0].version if results else version, rows=len(rows),
                               ns=time.perf_counter_ns() - start, ok=True)
        return results

    def _answered(self, name: str, version: str | None, results: list[Result], answer: Any) -> None:
        """Nothing, when every row has its ``answer`` from the version asked; else the ``InferError``."""
        failed = next((r for r in results if answer(r) is None), None)
        if failed is not None:
            raise self._refusal(name, version, failed, results.index(failed) if len(results) > 1 else None)
        # a frontend answers a pinned query by that version or refuses it; one that does not
        # look at the version (an older one) may let a rollout's new version answer: refused
        other = next((r for r in results if version is not None and r.version != version), None)
        if other is not None:
            raise InferError(409, f"model {name!r} version {version} was asked, but version {other.version} answered: "
                                  "a rollout moved the workers; send it again, or without a version")

    async def target_or_spec(self, name: str, version: str | None) -> dict:
        """``target``, for inference: while no frontend answers a status, one of the spec's
        models (unpinned) is still sent (its queries may be answered while a status is lost)."""
        try:
            return await self.target(name, version)
        except InferError as exc:
            if exc.status != 503 or version is not None or name not in self.cfg.models:
                raise
            return self._spec_target(name)

    def _refusal(self, name: str, version: str | None, failed: Result, row: int | None) -> InferError:
        code = failed.error_code or ErrorCode.INTERNAL
        where = "" if row is None else f" (row {row})"
        status = STATUS_OF.get(code, 500)
        if status == 404 and version is not None:  # the frontend does not serve the version pinned
            return InferError(404, f"model {name!r} version {version[:40]} is not served{where}: {failed.error}")
        return InferError(status, f"{code}{where}: {failed.error or failed.source}")
