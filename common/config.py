"""One config dataclass per Keel process, each with documented defaults and ``validate()``.

A process is started as ``keel serve ROLE --config JSON`` where JSON is
``dataclasses.asdict`` of its config; ``from_dict`` refuses unknown keys so a typo in a
cluster spec is an error, not a silently ignored option.

Example
-------
>>> cfg = WorkerConfig(name="w1", model="noop", builtin="noop")
>>> cfg.validate()
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import orjson


class ConfigError(ValueError):
    """A configuration value is missing, mistyped or inconsistent with another."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass
class ModelInfo:
    """What the frontend needs to know to admit queries for one model."""

    input_shape: list[int]
    output_size: int
    input_dtype: str = "float32"
    version: str = "1"
    #: Clipper's SLO default: the output answered (marked ``default``) when the deadline passes.
    default_output: list[float] | None = None
    #: the frontend's default deadline: used when a query names none (ms)
    deadline_ms: float = 1000.0

    def validate(self, name: str) -> None:
        _check(all(isinstance(d, int) and d > 0 for d in self.input_shape), f"model {name}: input_shape must be positive ints")
        _check(self.output_size > 0, f"model {name}: output_size must be > 0")
        _check(self.deadline_ms > 0, f"model {name}: deadline_ms must be > 0")
        if self.default_output is not None:
            _check(len(self.default_output) == self.output_size, f"model {name}: default_output needs {self.output_size} values")


@dataclass
class FrontendConfig:
    name: str = "frontend"
    #: ROUTER that clients' DEALERs connect to
    client_endpoint: str = "tcp://127.0.0.1:7000"
    #: PULL where workers and the decoder push predictions (also each query's reply_to)
    prediction_endpoint: str = "tcp://127.0.0.1:7001"
    #: the dispatcher's query PULL endpoint this frontend PUSHes queries to
    dispatcher_endpoint: str = "tcp://127.0.0.1:7100"
    models: dict[str, ModelInfo] = field(default_factory=dict)
    #: entries in the CLOCK prediction cache; 0 disables it (ParM's latency runs do)
    cache_size: int = 10_000
    #: queries admitted but not yet answered; beyond it a query is answered ``overloaded``
    admission_limit: int = 20_000
    max_payload_bytes: int = 16 * 1024 * 1024
    #: how long a request id is remembered for de-duplication (s)
    dedup_ttl_s: float = 60.0
    #: one canonical structlog line per request
    log_requests: bool = True
    metrics_port: int | None = None

    def validate(self) -> None:
        _check(self.cache_size >= 0, "cache_size must be >= 0")
        _check(self.admission_limit > 0, "admission_limit must be > 0")
        _check(self.dedup_ttl_s > 0, "dedup_ttl_s must be > 0")
        _check(self.max_payload_bytes > 0, "max_payload_bytes must be > 0")
        for name, info in self.models.items():
            info.validate(name)


@dataclass
class BatchPolicy:
    """Per-model batching at the dispatcher (Clipper §4.3)."""

    #: AIMD's batch latency budget: a batch's service time must stay under it for AIMD
    #: to grow the batch (ms; Clipper §4.3.1)
    batch_budget_ms: float = 20.0
    max_batch: int = 64
    #: fixed batch size; disables AIMD (ParM's latency runs use 1)
    fixed_batch: int | None = None
    #: additive increase step and multiplicative back-off of AIMD
    aimd_step: int = 2
    aimd_backoff: float = 0.9
    #: delayed batching: wait up to this long for a fuller batch (ms); 0 = never wait
    batch_delay_ms: float = 0.0
    #: ParM coding-group size; 0 = no coding
    k: int = 0
    #: the parity model's name (role parity workers register under it)
    parity_model: str | None = None

    def validate(self, name: str) -> None:
        _check(self.batch_budget_ms > 0, f"{name}: batch_budget_ms must be > 0")
        _check(self.max_batch >= 1, f"{name}: max_batch must be >= 1")
        _check(self.fixed_batch is None or 1 <= self.fixed_batch <= self.max_batch, f"{name}: fixed_batch must be in [1, max_batch]")
        _check(self.aimd_step >= 1 and 0 < self.aimd_backoff < 1, f"{name}: aimd_step >= 1 and 0 < aimd_backoff < 1")
        _check(self.batch_delay_ms >= 0, f"{name}: batch_delay_ms must be >= 0")
        _check(self.k == 0 or self.k >= 2, f"{name}: k must be 0 (off) or >= 2")
        _check(self.k == 0 or bool(self.parity_model), f"{name}: k > 0 needs parity_model")


@dataclass
class DispatcherConfig:
    name: str = "dispatcher"
    #: PULL for frontends' queries and the encoder's parity batches
    query_endpoint: str = "tcp://127.0.0.1:7100"
    #: ROUTER that workers' DEALERs connect to
    worker_endpoint: str = "tcp://127.0.0.1:7101"
    #: the encoder's PULL, for copies of dispatched batches of coded models; None = off
    encoder_endpoint: str | None = None
    models: dict[str, BatchPolicy] = field(default_factory=dict)
    #: distribution policy plug-in (services.scheduling.distribution): "single_queue"
    #: (Clipper/ParM single queue) or "round_robin"
    policy: str = "single_queue"
    heartbeat_interval_s: float = 0.25
    #: heartbeats a worker may miss before it is dropped and its batch re-queued
    #: (2 s by default: a loaded 2-core host can stall a healthy process for a second)
    heartbeat_liveness: int = 8
    #: query ids a frontend said were answered by a reconstruction, remembered (oldest
    #: forgotten first) so a dead worker's batch is not run again for them (ParM)
    answered_limit: int = 100_000
    metrics_port: int | None = None

    def validate(self) -> None:
        _check(self.heartbeat_interval_s > 0, "heartbeat_interval_s must be > 0")
        _check(self.heartbeat_liveness >= 2, "heartbeat_liveness must be >= 2")
        _check(self.answered_limit >= 0, "answered_limit must be >= 0")
        for name, policy in self.models.items():
            policy.validate(name)


@dataclass
class WorkerConfig:
    name: str = "worker"
    #: the model name queries use (and the store name unless ``store_name`` is set)
    model: str = "digits-mlp"
    version: str | None = None
    #: role "deployed" or "parity"
    role: str = "deployed"
    store: str = "store"
    store_name: str | None = None
    #: a model that is not in the store: "noop" (zeros) or "sleep" (fixed + per-query cost)
    builtin: str | None = None
    builtin_input_shape: list[int] = field(default_factory=lambda: [64])
    builtin_output_size: int = 10
    #: "sleep" model: cost per batch and per query (ms); store models: a floor on the
    #: service time, to stand in for a larger model
    fixed_ms: float = 0.0
    per_query_ms: float = 0.0
    dispatcher_endpoint: str = "tcp://127.0.0.1:7101"
    #: the decoder's PULL, for prediction copies of coded models; None = off
    decoder_endpoint: str | None = None
    #: batches this worker may hold at once (credits)
    slots: int = 1
    max_batch: int = 64
    torch_threads: int = 1
    #: what the worker declares to schedulers (Kairos): its instance type and hourly price
    instance: str = ""
    price: float = 0.0
    heartbeat_interval_s: float = 0.25
    heartbeat_liveness: int = 8
    #: ROUTER answering Status requests; None = none
    status_endpoint: str | None = None
    metrics_port: int | None = None

    def validate(self) -> None:
        _check(self.role in ("deployed", "parity"), f"role must be deployed or parity, got {self.role!r}")
        _check(self.builtin in (None, "noop", "sleep"), f"builtin must be noop or sleep, got {self.builtin!r}")
        _check(self.slots >= 1 and self.max_batch >= 1, "slots and max_batch must be >= 1")
        _check(self.fixed_ms >= 0 and self.per_query_ms >= 0, "fixed_ms and per_query_ms must be >= 0")
        _check(self.price >= 0, "price must be >= 0")
        _check(1 <= self.torch_threads <= 256, "torch_threads must be in 1..256")
        _check(self.heartbeat_liveness >= 2, "heartbeat_liveness must be >= 2")


@dataclass
class EncoderConfig:
    name: str = "encoder"
    #: PULL for copies of dispatched batches
    batch_endpoint: str = "tcp://127.0.0.1:7200"
    #: the dispatcher's query PULL, where parity batches go
    dispatcher_endpoint: str = "tcp://127.0.0.1:7100"
    #: per deployed model: its parity model name
    parity_models: dict[str, str] = field(default_factory=dict)
    #: "add" (ParM §4.2) or "concat" (§5.2.3)
    encoder: str = "add"
    #: encode a coding group that has not filled within this long from its first batch
    #: with the batches it has (ParM §4.1), so its queries stay protected at low load (ms)
    partial_group_ms: float = 50.0
    #: ROUTER answering Status requests; None = none
    status_endpoint: str | None = None
    metrics_port: int | None = None

    def validate(self) -> None:
        _check(self.encoder in ("add", "concat"), f"encoder must be add or concat, got {self.encoder!r}")
        _check(self.partial_group_ms > 0, "partial_group_ms must be > 0")


@dataclass
class DecoderConfig:
    name: str = "decoder"
    #: PULL for prediction copies and parity outputs
    endpoint: str = "tcp://127.0.0.1:7300"
    #: reconstruct after this long even without all k-1 predictions? None = only on arrival
    timeout_ms: float | None = None
    #: forget a coding group after this long (s)
    group_ttl_s: float = 10.0
    #: ROUTER answering Status requests; None = none
    status_endpoint: str | None = None
    metrics_port: int | None = None

    def validate(self) -> None:
        _check(self.group_ttl_s > 0, "group_ttl_s must be > 0")


CONFIGS: dict[str, type] = {
    "frontend": FrontendConfig,
    "dispatcher": DispatcherConfig,
    "worker": WorkerConfig,
    "encoder": EncoderConfig,
    "decoder": DecoderConfig,
}

_NESTED = {("frontend", "models"): ModelInfo, ("dispatcher", "models"): BatchPolicy}


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON-shaped value fits a config field's annotation (an int fits a float)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
    return isinstance(value, hint) if isinstance(hint, type) else True


def _check_types(cls: type, data: dict[str, Any], where: str) -> None:
    """A mistyped value is a ConfigError naming its key, not a TypeError from validate()."""
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        if not _fits(value, hints[key]):
            kind = str(hints[key]).replace("common.config.", "").replace("<class '", "").replace("'>", "")
            raise ConfigError(f"{where}{key} must be {kind}, got {value!r}")


def from_dict(role: str, data: dict[str, Any]) -> Any:
    """The validated config of ``role`` from a plain dict; unknown keys and values of the
    wrong type are errors."""
    cls = CONFIGS.get(role)
    if cls is None:
        raise ConfigError(f"unknown service role {role!r}; roles: {sorted(CONFIGS)}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"{role}: unknown option(s) {sorted(unknown)}; options: {sorted(known)}")
    data = dict(data)
    nested = _NESTED.get((role, "models"))
    if nested and "models" in data:
        if not isinstance(data["models"], dict):
            raise ConfigError(f"{role}: models must be a table of model name -> options, got {data['models']!r}")
        models = {}
        for name, value in data["models"].items():
            if isinstance(value, nested):
                models[name] = value
                continue
            if not isinstance(value, dict):
                raise ConfigError(f"{role}: model {name}: must be a table of options, got {value!r}")
            sub_known = {f.name for f in dataclasses.fields(nested)}
            bad = set(value) - sub_known
            if bad:
                raise ConfigError(f"{role}: model {name}: unknown option(s) {sorted(bad)}; options: {sorted(sub_known)}")
            _check_types(nested, value, f"{role}: model {name}: ")
            try:
                models[name] = nested(**value)
            except TypeError as exc:
                raise ConfigError(f"{role}: model {name}: {exc}") from None
        data["models"] = models
    _check_types(cls, data, f"{role}: ")
    try:
        cfg = cls(**data)
    except TypeError as exc:
        raise ConfigError(f"{role}: {exc}") from None
    cfg.validate()
    return cfg


def to_json(cfg: Any) -> str:
    return orjson.dumps(dataclasses.asdict(cfg)).decode()
