"""One config dataclass per Keel process, each with documented defaults and ``validate()``.

``validate()`` checks each option and how options of one config relate (AIMD's batch
delay under its budget, the decoder's timeout under its group TTL); ``heartbeats_agree``
checks a worker against its dispatcher. Every ``ConfigError`` carries the option at
fault (``key``) and what is wrong with it (``reason``). Which config belongs to which
role is the role table's business (``common.roles``).

A process is started as ``keel serve ROLE --config JSON`` where JSON is
``dataclasses.asdict`` of its config; ``keel.common.roles.from_dict`` refuses unknown keys so a typo in a
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

from keel.common.jsontypes import describe, fits


class ConfigError(ValueError):
    """A configuration value is missing, mistyped or inconsistent with another.

    ``key`` names the option at fault (when one is) and ``reason`` says what is wrong
    with it, so that a cluster spec can report it under its own key path
    (``models.m.deadline_ms: must be > 0``)."""

    def __init__(self, message: str, key: str | None = None, reason: str | None = None):
        super().__init__(message)
        self.key, self.reason = key, reason if reason is not None else message


def _check(cond: bool, key: str, reason: str, where: str = "", msg: str | None = None) -> None:
    """Raise ``ConfigError("{where}{key} {reason}")`` (or ``msg``) unless ``cond``."""
    if not cond:
        raise ConfigError(msg or f"{where}{key} {reason}", key, reason)


@dataclass
class ManagerLinkConfig:
    """Where a process finds the Raft-replicated manager group (``services.manager``,
    ``common.control.ManagerLink``): every replica's control endpoint and its change feed,
    in the same order. A cluster spec with a ``[manager]`` table fills this in."""

    #: the replicas' control endpoints (ROUTER: Control and Status requests)
    endpoints: list[str] = field(default_factory=list)
    #: the replicas' PUB endpoints (their change feed)
    publish_endpoints: list[str] = field(default_factory=list)

    def validate(self) -> None:
        if not self.endpoints:
            raise ConfigError("manager.endpoints: must name the replicas' control endpoints", "endpoints",
                              "must not be empty")
        if len(self.publish_endpoints) != len(self.endpoints):
            raise ConfigError(f"manager.publish_endpoints: one per replica ({len(self.endpoints)}), got "
                              f"{len(self.publish_endpoints)}", "publish_endpoints", "one per replica")


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
    #: a store model's signature (``common.signature``, ``Signature.to_dict``) when it is not
    #: the single-input shorthand: named inputs checked against it, named outputs answered
    signature: dict | None = None

    def validate(self, name: str) -> None:
        where = f"model {name}: "
        if self.signature is None:  # a named model's shapes are its signature's
            _check(bool(self.input_shape) and all(isinstance(d, int) and d > 0 for d in self.input_shape), "input_shape",
                   f"must be positive integers, got {self.input_shape}", where)
            _check(self.output_size > 0, "output_size", "must be > 0", where)
        _check(self.deadline_ms > 0, "deadline_ms", "must be > 0", where)
        n = self.output_size
        _check(self.default_output is None or len(self.default_output) == n, "default_output",
               f"needs output_size = {n} values", where, msg=f"{where}default_output needs {n} values (output_size)")


@dataclass
class GraphRouteConfig:
    """One HAMS service graph a frontend serves (``services.graph.route``): where its
    operators are, and the PULL this frontend binds for the graph's outputs and
    durability notices."""

    #: the graph's table (common.spec.graph), as GraphSpec.to_dict() writes it
    graph: dict = field(default_factory=dict)
    #: PULL this frontend binds for the graph (each GraphRequest's ``reply_to``)
    endpoint: str = "tcp://127.0.0.1:7601"
    #: node -> PULL endpoint: each operator's name, "<operator>.backup"
    peers: dict[str, str] = field(default_factory=dict)
    #: a request's deadline when it names none (s); at its deadline a request not answered
    #: (durable, with a hold) gets ``default_output`` (source default), else ``deadline``
    request_timeout_s: float = 10.0
    default_output: list[float] | None = None
    #: this frontend's place among the graph's ``lanes`` frontends: origins of frontends
    #: started in the same 10 ms tick still differ (``services.graph.route.origin_space``)
    lane: int = 0
    lanes: int = 1
    #: JSON-lines event log for the invariant checker (services.graph.events); None = off
    trace_path: str | None = None

    def validate(self, name: str = "") -> None:
        _check(self.request_timeout_s > 0, "request_timeout_s", "must be > 0", f"graph {name}: ")
        _check(0 <= self.lane < self.lanes, "lane", "must be in 0..lanes-1", f"graph {name}: ")


@dataclass
class FrontendConfig:
    name: str = "frontend"
    #: ROUTER that clients' DEALERs connect to
    client_endpoint: str = "tcp://127.0.0.1:7000"
    #: the same ROUTER bound here too (a cluster on one machine: an ``ipc`` endpoint), for
    #: clients on this machine (the gateway, ``keel predict``): a cheaper hop than TCP
    local_client_endpoint: str | None = None
    #: PULL where workers and the decoder push predictions (also each query's reply_to)
    prediction_endpoint: str = "tcp://127.0.0.1:7001"
    #: the dispatcher's query PULL endpoint this frontend PUSHes queries to
    dispatcher_query_endpoint: str = "tcp://127.0.0.1:7100"
    models: dict[str, ModelInfo] = field(default_factory=dict)
    #: entries in the CLOCK prediction cache; 0 disables it (ParM's latency runs do)
    cache_size: int = 10_000
    #: queries admitted but not yet answered; beyond it a query is answered ``overloaded``
    admission_limit: int = 20_000
    #: the largest input one query may carry; a client frame above it (or above 64 KiB, the
    #: most a ``Predicts`` of several queries carries, if that is more) disconnects its sender
    max_payload_bytes: int = 16 * 1024 * 1024
    #: how long a request id is remembered for de-duplication (s)
    dedup_ttl_s: float = 60.0
    #: answered (sender, request id)s remembered for de-duplication, at most
    dedup_max_entries: int = 200_000
    #: bytes the de-duplication table may hold (its replies, keys and bookkeeping), at most
    dedup_max_bytes: int = 128 * 1024 * 1024
    #: replies queued per client before further replies to it are dropped (the client ROUTER's
    #: SNDHWM): a client that stops reading costs only itself
    client_hwm: int = 10_000
    #: client connections kept at once; past it the one that sent least recently is hung
    #: up and counted (``clients_hung_up``). Each costs ZeroMQ ~30-50 KB whatever it sends,
    #: so this with ``client_hwm`` bounds what clients that connect and never read can pin
    max_clients: int = 1024
    #: one canonical structlog line per request
    log_requests: bool = True
    metrics_port: int | None = None
    #: the manager group (``ManagerLinkConfig``); None: no manager, the roles and endpoints
    #: stay as configured
    manager: ManagerLinkConfig | None = None
    #: model selection (Clipper §5): application name -> its table, as
    #: ``common.spec.applications`` reads ``[applications.NAME]`` (the spec fills this in)
    applications: dict[str, dict] = field(default_factory=dict)
    #: the SQLite file of per-context selection states (services/selection/contexts.py);
    #: "" = in memory, forgotten on restart. A cluster spec puts it in the run dir
    selection_store: str = ""
    #: a context state unused this long is forgotten (s); past ``context_cap`` states the
    #: least recently used go first
    context_ttl_s: float = 7 * 24 * 3600.0
    context_cap: int = 100_000
    #: how long (s) and how many answered application calls are remembered for feedback
    feedback_ttl_s: float = 600.0
    feedback_cap: int = 100_000
    #: HAMS service graphs this frontend serves: graph name -> where its operators are (the
    #: spec fills this in)
    graphs: dict[str, GraphRouteConfig] = field(default_factory=dict)

    def validate(self) -> None:
        _check(self.context_ttl_s > 0, "context_ttl_s", "must be > 0")
        _check(self.context_cap >= 1, "context_cap", "must be >= 1")
        _check(self.feedback_ttl_s > 0, "feedback_ttl_s", "must be > 0")
        _check(self.feedback_cap >= 1, "feedback_cap", "must be >= 1")
        _check(self.cache_size >= 0, "cache_size", "must be >= 0")
        _check(self.admission_limit > 0, "admission_limit", "must be > 0")
        _check(self.dedup_ttl_s > 0, "dedup_ttl_s", "must be > 0")
        _check(self.dedup_max_entries >= 1, "dedup_max_entries", "must be >= 1")
        _check(self.dedup_max_bytes >= 1, "dedup_max_bytes", "must be >= 1")
        _check(self.client_hwm >= 1, "client_hwm", "must be >= 1")
        _check(self.max_clients >= 1, "max_clients", "must be >= 1")
        _check(self.max_payload_bytes > 0, "max_payload_bytes", "must be > 0")
        for name, info in self.models.items():
            info.validate(name)
        for name, route in self.graphs.items():
            route.validate(name)


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
    #: a named model's batching of queries whose variable dims differ (``common.ragged``):
    #: "pad" (anything queued, padded by the worker to the batch's largest), "bucket" (equal
    #: shapes after rounding variable dims up to ``bucket_width``), "equal" (equal shapes only)
    ragged: str = "pad"
    bucket_width: int = 8

    def validate(self, name: str) -> None:
        where = f"{name}: "
        _check(self.ragged in ("pad", "bucket", "equal"), "ragged", f'must be "pad", "bucket" or "equal", got {self.ragged!r}', where)
        _check(self.bucket_width >= 1, "bucket_width", "must be >= 1", where)
        _check(self.batch_budget_ms > 0, "batch_budget_ms", "must be > 0", where)
        _check(self.max_batch >= 1, "max_batch", "must be >= 1", where)
        _check(self.fixed_batch is None or 1 <= self.fixed_batch <= self.max_batch, "fixed_batch",
               "must be in 1..max_batch", where)
        aimd = f"{where}aimd_step >= 1 and 0 < aimd_backoff < 1"
        _check(self.aimd_step >= 1, "aimd_step", "must be >= 1", where, msg=aimd)
        _check(0 < self.aimd_backoff < 1, "aimd_backoff", "must be in (0, 1)", where, msg=aimd)
        _check(self.batch_delay_ms >= 0, "batch_delay_ms", "must be >= 0", where)
        # Relation: with AIMD on, a batch that waits its whole budget for company can
        # never meet the budget, so AIMD would shrink it forever.
        _check(self.fixed_batch is not None or self.batch_delay_ms < self.batch_budget_ms, "batch_delay_ms",
               f"must be < batch_budget_ms ({self.batch_budget_ms:g}) while AIMD sizes batches (no fixed_batch)", where)
        _check(self.k == 0 or self.k >= 2, "k", "must be 0 (off) or >= 2", where)
        _check(self.k == 0 or bool(self.parity_model), "parity_model", "is needed when k > 0", where,
               msg=f"{where}k > 0 needs parity_model")


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
    #: (Clipper/ParM single queue) or "round_robin"; Kairos §5.1 "kairos" and its §6
    #: baselines "fcfs_base", "clockwork", "drs" (services.scheduling.kairos)
    policy: str = "single_queue"
    #: the Kairos policies' profile: with ``kairos_model`` set they are built with the
    #: measured latencies of that model (``kairos_profile`` directory, "" =
    #: ../shared/data/kairos) times ``kairos_scale``, and read each query's batch size from
    #: its first feature (the emulated ``kairos`` model's rows); "" = latencies learned
    #: from Done alone, every query of size 1
    kairos_model: str = ""
    kairos_profile: str = ""
    kairos_scale: float = 1.0
    #: "drs": queries of at most this many items go to auxiliary types (Kairos §6)
    drs_threshold: int = 0
    #: SERF (services.serf): model -> its profile JSON (``keel serf profile``); the
    #: dispatcher then switches that model's workers' slots and threads with the load
    serf: dict[str, str] = field(default_factory=dict)
    #: SERF: switch only when Eq. 13 predicts at least this fraction less latency, and
    #: never sooner than ``serf_hold_s`` after the last switch
    serf_hysteresis: float = 0.05
    serf_hold_s: float = 1.0
    #: SERF: how often the configurator reads the arrival rate and decides (s); a step in
    #: the load shows in the rate within 0.1-0.2 s (``ModelQueue.arrival_rate``), which a
    #: chore on the heartbeat (0.25 s) would wait for up to another 0.25 s
    serf_interval_s: float = 0.05
    #: SERF: with no step in the rate since the last switch, a switch between two
    #: configurations that both carry the load is made once it has been worth it this long
    #: (s); after a step, or from one that cannot carry the load, at once. 1 s: a steady
    #: rate's count (4 s) wanders slowly; replayed at 155/s on the emulated host, 0.25 s
    #: left 11-13 switches a minute, 1 s 6-11, 2 s 4-8, and a step is followed as fast
    serf_confirm_s: float = 1.0
    #: SERF: the cores of each host (host -> cores), shared by the workers there: the
    #: configurator never gives a model's workers more slots x threads than the host has
    #: left beside the other workers' current ones; {} = no budget
    serf_cores: dict[str, int] = field(default_factory=dict)
    #: set by the spec: each worker's host (worker name -> host), for ``serf_cores``
    serf_hosts: dict[str, str] = field(default_factory=dict)
    #: set by the spec: where the profile of a version rolled out later is found
    #: (``services.serf.profile.where``): beside its manifest in ``serf_store`` under the
    #: model's store name (``serf_names``), else in ``serf_run_dir``/serf/
    serf_store: str = ""
    serf_run_dir: str = ""
    serf_names: dict[str, str] = field(default_factory=dict)
    heartbeat_interval_s: float = 0.25
    #: heartbeats a worker may miss before it is dropped and its batch re-queued
    #: (2 s by default: a loaded 2-core host can stall a healthy process for a second)
    heartbeat_liveness: int = 8
    #: query ids a frontend said were answered by a reconstruction, remembered (oldest
    #: forgotten first) so a dead worker's batch is not run again for them (ParM)
    answered_limit: int = 100_000
    metrics_port: int | None = None
    #: the manager group (``ManagerLinkConfig``); None: no manager, the roles and endpoints
    #: stay as configured
    manager: ManagerLinkConfig | None = None
    #: this dispatcher's host, as the manager records it (a standby runs on another host)
    host: str = ""
    #: a standby: registers with the manager only once another dispatcher holds the active
    #: role (or after ``standby_wait_s`` with none), so the spec's dispatcher starts active
    standby: bool = False
    standby_wait_s: float = 10.0

    def validate(self) -> None:
        _check(self.heartbeat_interval_s > 0, "heartbeat_interval_s", "must be > 0")
        _check(self.heartbeat_liveness >= 2, "heartbeat_liveness", "must be >= 2")
        _check(self.answered_limit >= 0, "answered_limit", "must be >= 0")
        _check(self.kairos_scale > 0, "kairos_scale", "must be > 0")
        _check(self.policy != "drs" or self.drs_threshold >= 1, "drs_threshold",
               'must be >= 1 with policy "drs" (items; Kairos §6 tunes it per pool)')
        _check(self.drs_threshold >= 0, "drs_threshold", "must be >= 0")
        _check(0 <= self.serf_hysteresis < 1, "serf_hysteresis", "must be in [0, 1)")
        _check(self.serf_hold_s >= 0, "serf_hold_s", "must be >= 0")
        _check(self.serf_interval_s > 0, "serf_interval_s", "must be > 0")
        _check(self.serf_confirm_s >= 0, "serf_confirm_s", "must be >= 0")
        for host, cores in self.serf_cores.items():
            _check(isinstance(cores, int) and cores >= 1, f"serf_cores.{host}", "must be a whole number of cores >= 1")
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
    #: store services (``services.store``) this worker fetches its version from when its
    #: own store lacks it, verified by sha256 before it registers; [] = the local store only
    store_endpoints: list[str] = field(default_factory=list)
    #: a model that is not in the store: "noop" (zeros) or "sleep" (fixed + per-query cost)
    builtin: str | None = None
    builtin_input_shape: list[int] = field(default_factory=lambda: [64])
    builtin_output_size: int = 10
    #: "sleep" model: cost per batch and per query (ms); store models: a floor on the
    #: service time, to stand in for a larger model
    fixed_ms: float = 0.0
    per_query_ms: float = 0.0
    #: the dispatcher's worker ROUTER endpoint this worker's DEALER connects to
    dispatcher_worker_endpoint: str = "tcp://127.0.0.1:7101"
    #: the decoder's PULL, for prediction copies of coded models; None = off
    decoder_endpoint: str | None = None
    #: batches this worker may hold at once (credits)
    slots: int = 1
    max_batch: int = 64
    torch_threads: int = 1
    #: how long torch's OpenMP threads spin waiting for the next parallel region before they
    #: sleep (libgomp's GOMP_SPINCOUNT, in spin iterations; 0 = libgomp's default). Set
    #: before the worker first loads torch. Off by default: in the SERF quick runs a longer
    #: spin made the spaced profile faster than the open-loop service (docs/results/serf.md)
    omp_spincount: int = 0
    #: a batch the model is expected to finish in less than this (ms, from the recent
    #: batches' service times) runs on the worker's loop thread, as a Clipper container runs
    #: its batches, when no executor is busy and one torch thread is configured: the hand-off
    #: to an executor and back (two thread wake-ups, a pipe) cost more than such a model.
    #: 0 = every batch goes to an executor
    inline_below_ms: float = 0.5
    #: where a store torch model runs: "cpu", "cuda" or "cuda:N"; a worker on a host
    #: without a GPU refuses "cuda" at start with a clear error
    device: str = "cpu"
    #: the GPU this worker's program sees as its only one (``CUDA_VISIBLE_DEVICES``): an index
    #: or a GPU/MIG UUID, set by the spec's ``gpus`` placement (``common.spec.gpus``); with it
    #: ``device`` is "cuda" (that GPU). None = every GPU the host shows
    gpu: str | None = None
    #: on a GPU: the share of its memory this worker's torch may take (0 = no cap,
    #: ``torch.cuda.set_per_process_memory_fraction``); a batch past it is split
    #: (``common.datapath.MemoryGuard``)
    memory_fraction: float = 0.0
    #: "float16" or "bfloat16": the model runs under torch autocast at that precision; "" = as stored
    autocast: str = ""
    #: rows of the zero batch run before the worker registers, so its first query is not the
    #: slow one (cuDNN plans, allocator, pinned buffers); None = ``max_batch`` on a GPU, none
    #: on the CPU; 0 = none
    warmup_batch: int | None = None
    #: what the worker declares to schedulers (Kairos): its instance type and hourly price
    instance: str = ""
    price: float = 0.0
    #: "kairos" model: the profiled model it emulates (rm2, ...), a factor on the profiled
    #: service time, and the profile directory ("" = ../shared/data/kairos)
    kairos_model: str = ""
    kairos_scale: float = 1.0
    kairos_profile: str = ""
    #: "serf_host" model: its curves (``common.serf_host.curves``: base_ms, speedup,
    #: interference, cores)
    serf_host: dict | None = None
    heartbeat_interval_s: float = 0.25
    heartbeat_liveness: int = 8
    #: ROUTER answering Status requests; None = none
    status_endpoint: str | None = None
    metrics_port: int | None = None
    #: the manager group (``ManagerLinkConfig``); None: no manager, the roles and endpoints
    #: stay as configured
    manager: ManagerLinkConfig | None = None

    def validate(self) -> None:
        _check(self.role in ("deployed", "parity"), "role", f"must be deployed or parity, got {self.role!r}")
        _check(self.builtin in (None, "noop", "sleep", "kairos", "serf_host"), "builtin",
               f"must be noop, sleep, kairos or serf_host, got {self.builtin!r}")
        if self.builtin == "kairos":
            _check(bool(self.kairos_model), "kairos_model", "the kairos model needs the profiled model's name")
            _check(bool(self.instance), "instance", "the kairos model needs the worker's instance type")
            _check(self.kairos_scale > 0, "kairos_scale", "must be > 0")
        both = "slots and max_batch must be >= 1"
        _check(self.slots >= 1, "slots", "must be >= 1", msg=both)
        _check(self.max_batch >= 1, "max_batch", "must be >= 1", msg=both)
        costs = "fixed_ms and per_query_ms must be >= 0"
        _check(self.fixed_ms >= 0, "fixed_ms", "must be >= 0", msg=costs)
        _check(self.per_query_ms >= 0, "per_query_ms", "must be >= 0", msg=costs)
        _check(self.price >= 0, "price", "must be >= 0")
        _check(1 <= self.torch_threads <= 256, "torch_threads", "must be in 1..256")
        _check(self.omp_spincount >= 0, "omp_spincount", "must be >= 0 (0 = libgomp's default)")
        _check(self.inline_below_ms >= 0, "inline_below_ms", "must be >= 0 (0 = never inline)")
        _check(self.heartbeat_interval_s > 0, "heartbeat_interval_s", "must be > 0")
        _check(self.heartbeat_liveness >= 2, "heartbeat_liveness", "must be >= 2")
        _check(self.device == "cpu" or self.device == "cuda" or (self.device.startswith("cuda:") and self.device[5:].isdigit()),
               "device", f'must be "cpu", "cuda" or "cuda:N", got {self.device!r}')
        _check(self.gpu is None or (self.device in ("cuda", "cuda:0") and bool(self.gpu)), "gpu",
               f'a worker placed on GPU {self.gpu!r} sees it as its only one: device must be "cuda", got {self.device!r}')
        _check(0.0 <= self.memory_fraction <= 1.0, "memory_fraction", "must be in 0..1 (0 = no cap)")
        _check(self.autocast in ("", "float16", "bfloat16"), "autocast", f'must be "", "float16" or "bfloat16", got {self.autocast!r}')
        _check(self.warmup_batch is None or self.warmup_batch >= 0, "warmup_batch", "must be >= 0 (0 = none)")


@dataclass
class EncoderConfig:
    name: str = "encoder"
    #: PULL for copies of dispatched batches
    batch_endpoint: str = "tcp://127.0.0.1:7200"
    #: the dispatcher's query PULL, where parity batches go
    dispatcher_query_endpoint: str = "tcp://127.0.0.1:7100"
    #: per deployed model: its parity model name
    parity_models: dict[str, str] = field(default_factory=dict)
    #: "add" (ParM §4.2) or "concat" (§5.2.3)
    encoder: str = "add"
    #: encode a coding group that has not filled within this long from its first batch
    #: with the batches it has (ParM §4.1), so its queries stay protected at low load (ms)
    partial_group_ms: float = 50.0
    #: coding groups open at once (each holds up to k batches); when one more opens, the
    #: oldest is dropped unencoded and counted (a bound on what peers can make it hold)
    max_open_groups: int = 256
    #: ROUTER answering Status requests; None = none
    status_endpoint: str | None = None
    metrics_port: int | None = None

    def validate(self) -> None:
        _check(self.encoder in ("add", "concat"), "encoder", f"must be add or concat, got {self.encoder!r}")
        _check(self.partial_group_ms > 0, "partial_group_ms", "must be > 0")
        _check(self.max_open_groups >= 1, "max_open_groups", "must be >= 1")


@dataclass
class DecoderConfig:
    name: str = "decoder"
    #: PULL for prediction copies and parity outputs
    endpoint: str = "tcp://127.0.0.1:7300"
    #: reconstruct after this long even without all k-1 predictions? None = only on arrival
    timeout_ms: float | None = None
    #: forget a coding group after this long (s)
    group_ttl_s: float = 10.0
    #: coding groups tracked at once; when one more opens, the oldest is forgotten and counted
    max_open_groups: int = 4096
    #: ROUTER answering Status requests; None = none
    status_endpoint: str | None = None
    metrics_port: int | None = None
    #: model -> {parity model version: the deployed version it was made for}: a reconstruction
    #: is made only from predictions of that version (after a rollout of the deployed model
    #: alone, none is made); {} = any, named after the predictions it was computed from
    parity_versions: dict[str, dict[str, str]] = field(default_factory=dict)

    def validate(self) -> None:
        _check(self.group_ttl_s > 0, "group_ttl_s", "must be > 0")
        _check(self.timeout_ms is None or self.timeout_ms > 0, "timeout_ms", "must be > 0 (or null: off)")
        # Relation: a group forgotten before its timeout fires is never reconstructed.
        _check(self.timeout_ms is None or self.timeout_ms / 1000.0 < self.group_ttl_s, "timeout_ms",
               f"must be shorter than group_ttl_s ({self.group_ttl_s:g} s)")
        _check(self.max_open_groups >= 1, "max_open_groups", "must be >= 1")



@dataclass
class StoreConfig:
    """The store service (``services.store``): serves the versions of its host's model
    store by content to workers on hosts that lack them, and takes published ones."""

    name: str = "store"
    #: ROUTER for manifest, file and publish requests (``common.protocol.store``)
    endpoint: str = "tcp://127.0.0.1:7400"
    #: the model store folder this service serves (and publishes into)
    store: str = "store"
    #: bytes of a file one answer carries at most (a request names offset and length)
    max_chunk_bytes: int = 1 << 20
    #: ROUTER answering Status requests; None = none
    status_endpoint: str | None = None
    metrics_port: int | None = None

    def validate(self) -> None:
        _check(1024 <= self.max_chunk_bytes <= 32 << 20, "max_chunk_bytes", "must be in 1 KiB..32 MiB")


@dataclass
class GatewayConfig:
    """The Open Inference Protocol v2 HTTP gateway (``services.gateway``)."""

    name: str = "gateway"
    #: where the HTTP server listens; port 0 = any free port
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    #: the same protocol's gRPC form (``inference.GRPCInferenceService``), on ``http_host``
    #: too; None = off, 0 = any free port
    grpc_port: int | None = None
    #: the frontends' client endpoints (the gateway is one AsyncClient of them)
    frontend_endpoints: list[str] = field(default_factory=lambda: ["tcp://127.0.0.1:7000"])
    models: dict[str, ModelInfo] = field(default_factory=dict)
    #: the client's default deadline for a request that names none and a model unknown to it (ms)
    timeout_ms: float = 1000.0
    retries: int = 1
    #: largest HTTP request body, and largest gRPC request message
    max_body_bytes: int = 16 * 1024 * 1024
    #: ROUTER answering Status requests; None = none
    status_endpoint: str | None = None
    metrics_port: int | None = None
    #: HTTPS: the server's certificate chain and its private key (PEM files); None = plain HTTP.
    #: A relative path is from the directory the gateway runs in (``keel up``'s)
    tls_cert: str | None = None
    tls_key: str | None = None
    #: bearer-token allow-list, one token a line (mode 600, e.g. beside the CURVE keys);
    #: None = no tokens asked. Read again when it changes; the health paths need none
    tokens_file: str | None = None

    def validate(self) -> None:
        _check(0 <= self.http_port <= 65535, "http_port", "must be a port in 0..65535")
        _check(self.grpc_port is None or 0 <= self.grpc_port <= 65535, "grpc_port", "must be a port in 0..65535")
        _check(self.grpc_port in (None, 0) or self.grpc_port != self.http_port, "grpc_port",
               f"must differ from http_port ({self.http_port})")
        missing, given = ("tls_key", "tls_cert") if self.tls_key is None else ("tls_cert", "tls_key")
        _check((self.tls_cert is None) == (self.tls_key is None), missing, f"must be given with {given} (both or neither)")
        for key in ("tls_cert", "tls_key", "tokens_file"):
            _check(getattr(self, key) != "", key, "must be a file path (leave it out to turn it off)")
        _check(bool(self.frontend_endpoints), "frontend_endpoints", "must name at least one frontend")
        _check(self.timeout_ms > 0, "timeout_ms", "must be > 0")
        _check(self.retries >= 0, "retries", "must be >= 0")
        _check(self.max_body_bytes > 0, "max_body_bytes", "must be > 0")
        for name, info in self.models.items():
            info.validate(name)

def heartbeats_agree(dispatcher: DispatcherConfig, worker: WorkerConfig) -> str | None:
    """Why a worker and its dispatcher would drop each other while both are healthy, or None.

    Each side declares the other dead after its own liveness window (interval x liveness)
    of silence; the window must hold at least two of the other side's heartbeats, so one
    late heartbeat on a loaded host is never taken for a death.
    """
    window = dispatcher.heartbeat_interval_s * dispatcher.heartbeat_liveness
    if window < 2 * worker.heartbeat_interval_s:
        return (f"the dispatcher's liveness window ({window:g} s) must hold two of the worker's heartbeats "
                f"(heartbeat_interval_s {worker.heartbeat_interval_s:g} s)")
    window = worker.heartbeat_interval_s * worker.heartbeat_liveness
    if window < 2 * dispatcher.heartbeat_interval_s:
        return (f"the worker's liveness window ({window:g} s) must hold two of the dispatcher's heartbeats "
                f"(heartbeat_interval_s {dispatcher.heartbeat_interval_s:g} s)")
    return None


def _check_types(cls: type, data: dict[str, Any], where: str) -> None:
    """A mistyped value is a ConfigError naming its key, not a TypeError from validate()."""
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        if not fits(value, hints[key]):
            reason = f"must be {describe(hints[key])}, got {value!r}"
            raise ConfigError(f"{where}{key} {reason}", key, reason)


def make(cls: type, data: Any, where: str) -> Any:
    """``cls(**data)`` after checking keys and types; ``where`` prefixes every message."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{where.rstrip(': ')}: must be a table of options, got {data!r}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"{where}unknown option(s) {sorted(unknown)}; options: {sorted(known)}")
    hints = typing.get_type_hints(cls)
    data = {k: _nested(hints[k], v, f"{where}{k}: ") for k, v in data.items()}
    _check_types(cls, data, where)
    try:
        return cls(**data)
    except TypeError as exc:
        raise ConfigError(f"{where}{exc}") from None


def _nested(hint: Any, value: Any, where: str) -> Any:
    """A table given for an option whose type is a config dataclass (``ManagerLinkConfig``,
    or one of it or None) is made into it, checked and validated."""
    if not isinstance(value, dict):
        return value
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    for cls in typing.get_args(hint) if union else (hint,):
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            made = make(cls, value, where)
            made.validate()
            return made
    return value


def to_json(cfg: Any) -> str:
    return orjson.dumps(dataclasses.asdict(cfg)).decode()


def _raft_host(address: str) -> str:
    return address.rpartition(":")[0].strip("[]")


@dataclass
class ManagerConfig:
    """One replica of the Raft-replicated manager (services.manager, HAMS §III-A).

    The pysyncobj defaults here are the settings measured in ../shared/papers/NOTES.md
    (three processes on loopback: commit p50 about 1 ms, leader SIGKILL to the first commit
    on a new leader 0.3-0.5 s). pysyncobj unpickles whatever a peer sends: ``raft_address``
    must be a loopback address unless ``password`` is set (then its traffic is encrypted
    and authenticated; needs the ``cryptography`` package)."""

    name: str = "manager-1"
    #: this replica's pysyncobj address, host:port (it binds it)
    raft_address: str = "127.0.0.1:7500"
    #: the other replicas: raft address -> their control endpoint (leader hints name it)
    raft_partners: dict[str, str] = field(default_factory=dict)
    #: ROUTER answering Control and Status requests
    endpoint: str = "tcp://127.0.0.1:7510"
    #: PUB of changes (Clone pattern: a subscriber that sees a gap asks for a snapshot)
    publish_endpoint: str = "tcp://127.0.0.1:7511"
    #: pysyncobj's shared secret; None = none (then raft_address must be loopback)
    password: str | None = None
    #: pysyncobj's journal: committed decisions survive a restart of all replicas; None =
    #: memory only (tests); the full dump for log compaction is this path + ".dump"
    journal_file: str | None = None
    raft_min_timeout_s: float = 0.15
    raft_max_timeout_s: float = 0.3
    append_entries_period_s: float = 0.04
    connection_timeout_s: float = 0.5
    connection_retry_s: float = 0.2
    leader_fallback_timeout_s: float = 0.5
    #: longest wait in one pysyncobj tick; Control requests wait at most this long (s)
    raft_poll_s: float = 0.001
    #: failure detection: services heartbeat the manager this often (s) ...
    heartbeat_interval_s: float = 0.03
    #: ... and one silent for this many intervals is suspected (the leader then decides)
    heartbeat_liveness: int = 5
    #: recovery decisions kept in the replicated log of decisions (oldest dropped first)
    decisions_kept: int = 256
    #: raft address of the replica that should lead: a leader elected in its first
    #: ``preferred_window_s`` hands leadership to it once (predictable placement for
    #: operations and the chaos experiments); None = whoever wins the election
    preferred_leader: str | None = None
    preferred_window_s: float = 30.0
    metrics_port: int | None = None

    def validate(self) -> None:
        _check(":" in self.raft_address, "raft_address", "must be host:port")
        loopback = all(_raft_host(a) in ("127.0.0.1", "localhost", "::1") for a in [self.raft_address, *self.raft_partners])
        _check(loopback or bool(self.password), "password",
               "must be set when a raft address is not loopback (pysyncobj unpickles what peers send)")
        _check(len(self.raft_partners) % 2 == 0, "raft_partners",
               f"must make an odd group with this replica (3 or 5), got {len(self.raft_partners) + 1}")
        _check(self.raft_address not in self.raft_partners, "raft_partners", "must not name this replica")
        # Relations pysyncobj's own validate() asserts; said here with the option at fault.
        _check(self.raft_min_timeout_s > 3 * self.append_entries_period_s, "raft_min_timeout_s",
               f"must exceed 3 x append_entries_period_s ({3 * self.append_entries_period_s:g} s)")
        _check(self.raft_max_timeout_s > self.raft_min_timeout_s, "raft_max_timeout_s", "must exceed raft_min_timeout_s")
        _check(self.connection_timeout_s >= self.raft_max_timeout_s, "connection_timeout_s",
               "must be >= raft_max_timeout_s")
        _check(self.leader_fallback_timeout_s > self.append_entries_period_s, "leader_fallback_timeout_s",
               "must exceed append_entries_period_s")
        _check(0 < self.raft_poll_s <= 0.05, "raft_poll_s", "must be in (0, 0.05]")
        _check(self.heartbeat_interval_s > 0, "heartbeat_interval_s", "must be > 0")
        _check(self.heartbeat_liveness >= 2, "heartbeat_liveness", "must be >= 2")
        # A service suspected faster than an election could only be decided on by a leader
        # that may be about to lose office; slower than two elections, and a dead active
        # dispatcher waits on the detector rather than on Raft.
        window = self.heartbeat_interval_s * self.heartbeat_liveness
        _check(window <= 2 * self.raft_max_timeout_s, "heartbeat_liveness",
               f"x heartbeat_interval_s ({window:g} s) must be at most 2 x raft_max_timeout_s "
               f"({2 * self.raft_max_timeout_s:g} s): detection must not be slower than two elections")
        _check(self.decisions_kept >= 1, "decisions_kept", "must be >= 1")
@dataclass
class GraphOperatorConfig:
    """One operator process of a HAMS service graph (``services.graph.operator``)."""

    name: str = "op"
    #: the operator of ``graph`` this process runs
    operator: str = "op"
    #: primary | backup (stateful operators), stateless, or standby (the hot standby of the
    #: stateless operators of ``operator``'s kind); the manager drives it later
    role: str = "primary"
    epoch: int = 1
    #: PULL this process binds: requests, states, acks and durability notices
    endpoint: str = "tcp://127.0.0.1:7400"
    status_endpoint: str | None = None
    #: the [graph] table (common.spec.graph), as GraphSpec.to_dict() writes it
    graph: dict = field(default_factory=dict)
    #: node -> PULL endpoint: "frontend", each operator's name, "<operator>.backup"
    peers: dict[str, str] = field(default_factory=dict)
    #: the graph endpoint of every frontend serving this graph: durability notices go to
    #: each; an output goes to its request's ``reply_to`` (empty: ``peers["frontend"]`` only)
    frontends: list[str] = field(default_factory=list)
    seed: int = 0
    #: JSON-lines event log for the invariant checker (services.graph.events); None = off
    trace_path: str | None = None
    metrics_port: int | None = None
    #: the manager group (``ManagerLinkConfig``); None: no manager, the roles and endpoints
    #: stay as configured
    manager: ManagerLinkConfig | None = None

    def validate(self) -> None:
        _check(self.role in ("primary", "backup", "stateless", "standby"), "role",
               "must be primary, backup, stateless or standby")
        _check(self.epoch >= 1, "epoch", "must be >= 1")
        _check(bool(self.operator), "operator", "must name an operator of the graph")
