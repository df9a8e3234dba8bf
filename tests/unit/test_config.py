"""keel.common.roles.from_dict: what ``keel serve --config`` accepts. Unknown keys and bad
values are ConfigErrors whose messages name the role, the model and the key at fault."""
from __future__ import annotations

import dataclasses

import orjson
import pytest

from keel.common import config as cfg
from keel.common.config import ConfigError, to_json
from keel.common.roles import CONFIGS, from_dict


def test_defaults_of_every_role_are_valid():
    for role, cls in CONFIGS.items():
        assert isinstance(from_dict(role, {}), cls)


def test_unknown_role_is_named():
    with pytest.raises(ConfigError, match=r"'fronted'.*dispatcher"):
        from_dict("fronted", {})


@pytest.mark.parametrize("role", sorted(CONFIGS))
def test_unknown_key_is_named(role):
    with pytest.raises(ConfigError, match=rf"{role}: unknown option\(s\) \['cache_sise'\]"):
        from_dict(role, {"cache_sise": 10, "name": "x"})


def test_unknown_model_keys_are_named():
    with pytest.raises(ConfigError, match=r"frontend: model digits: unknown option\(s\) \['input_shap'\]"):
        from_dict("frontend", {"models": {"digits": {"input_shap": [64], "output_size": 10}}})
    with pytest.raises(ConfigError, match=r"dispatcher: model digits: unknown option\(s\) \['kk'\]"):
        from_dict("dispatcher", {"models": {"digits": {"kk": 2}}})


def test_missing_model_field_is_named():
    with pytest.raises(ConfigError, match=r"model digits: .*output_size"):
        from_dict("frontend", {"models": {"digits": {"input_shape": [64]}}})


@pytest.mark.parametrize("role,data,words", [
    ("frontend", {"cache_size": -1}, "cache_size"),
    ("frontend", {"admission_limit": 0}, "admission_limit"),
    ("frontend", {"dedup_ttl_s": 0}, "dedup_ttl_s"),
    ("frontend", {"max_payload_bytes": 0}, "max_payload_bytes"),
    ("frontend", {"models": {"m": {"input_shape": [0], "output_size": 10}}}, "model m: input_shape"),
    ("frontend", {"models": {"m": {"input_shape": [4], "output_size": 0}}}, "model m: output_size"),
    ("frontend", {"models": {"m": {"input_shape": [4], "output_size": 2, "deadline_ms": 0}}}, "model m: deadline_ms"),
    ("frontend", {"models": {"m": {"input_shape": [4], "output_size": 2, "default_output": [1.0]}}},
     "model m: default_output needs 2"),
    ("dispatcher", {"heartbeat_interval_s": 0}, "heartbeat_interval_s"),
    ("dispatcher", {"heartbeat_liveness": 1}, "heartbeat_liveness"),
    ("dispatcher", {"models": {"m": {"batch_budget_ms": -1}}}, "m: batch_budget_ms"),
    ("dispatcher", {"models": {"m": {"max_batch": 0}}}, "m: max_batch"),
    ("dispatcher", {"models": {"m": {"max_batch": 4, "fixed_batch": 5}}}, "m: fixed_batch"),
    ("dispatcher", {"models": {"m": {"aimd_backoff": 1.0}}}, "m: aimd_step >= 1 and 0 < aimd_backoff"),
    ("dispatcher", {"models": {"m": {"aimd_step": 0}}}, "m: aimd_step"),
    ("dispatcher", {"models": {"m": {"batch_delay_ms": -1}}}, "m: batch_delay_ms"),
    ("dispatcher", {"models": {"m": {"k": 1, "parity_model": "p"}}}, "m: k must be 0"),
    ("dispatcher", {"models": {"m": {"k": 2}}}, "m: k > 0 needs parity_model"),
    ("worker", {"role": "leader"}, "role must be deployed or parity, got 'leader'"),
    ("worker", {"builtin": "gpu"}, "builtin must be noop, sleep, kairos or serf_host, got 'gpu'"),
    ("worker", {"slots": 0}, "slots"),
    ("worker", {"max_batch": 0}, "max_batch"),
    ("worker", {"fixed_ms": -1.0}, "fixed_ms"),
    ("worker", {"heartbeat_liveness": 1}, "heartbeat_liveness"),
    ("encoder", {"encoder": "xor"}, "encoder must be add or concat, got 'xor'"),
    ("decoder", {"group_ttl_s": 0}, "group_ttl_s"),
])
def test_bad_values_are_named(role, data, words):
    with pytest.raises(ConfigError) as info:
        from_dict(role, data)
    assert words in str(info.value)


@pytest.mark.parametrize("role,data,key", [
    ("frontend", {"cache_size": "big"}, "cache_size"),
    ("frontend", {"log_requests": "yes"}, "log_requests"),
    ("frontend", {"models": ["m"]}, "models"),
    ("frontend", {"models": {"m": 5}}, "model m"),
    ("frontend", {"models": {"m": {"input_shape": "64", "output_size": 10}}}, "input_shape"),
    ("dispatcher", {"models": {"m": {"k": "2"}}}, "k"),
    ("dispatcher", {"heartbeat_interval_s": None}, "heartbeat_interval_s"),
    ("worker", {"slots": "2"}, "slots"),
    ("worker", {"slots": True}, "slots"),
    ("worker", {"builtin_input_shape": "x"}, "builtin_input_shape"),
    ("worker", {"name": 3}, "name"),
    ("encoder", {"parity_models": {"m": 1}}, "parity_models"),
])
def test_mistyped_values_are_named(role, data, key):
    """JSON from a hand-written spec or command line: the wrong type is a ConfigError that
    names the key, never a TypeError from deep inside validate()."""
    with pytest.raises(ConfigError) as info:
        from_dict(role, data)
    assert key in str(info.value)


def test_numbers_may_be_ints_where_floats_are_expected():
    worker = from_dict("worker", {"fixed_ms": 2, "heartbeat_interval_s": 1})
    assert worker.fixed_ms == 2 and worker.heartbeat_interval_s == 1
    fe = from_dict("frontend", {"models": {"m": {"input_shape": [2], "output_size": 2, "default_output": [0, 1]}}})
    assert fe.models["m"].default_output == [0, 1]


def full_configs() -> dict:
    return {
        "frontend": cfg.FrontendConfig(name="fe", cache_size=0, models={
            "m": cfg.ModelInfo([3, 4], 5, default_output=[0.0] * 5, deadline_ms=50.0)}, graphs={
            "g": cfg.GraphRouteConfig(request_timeout_s=2.5, peers={"g": "tcp://127.0.0.1:9"}, lane=1, lanes=2)}),
        "dispatcher": cfg.DispatcherConfig(encoder_endpoint="tcp://127.0.0.1:9", models={
            "m": cfg.BatchPolicy(fixed_batch=1, k=2, parity_model="m-parity"), "n": cfg.BatchPolicy(batch_delay_ms=2.5)}),
        "worker": cfg.WorkerConfig(name="w", builtin="sleep", fixed_ms=1.5, role="parity", slots=2),
        "encoder": cfg.EncoderConfig(parity_models={"m": "m-parity"}, encoder="concat"),
        "decoder": cfg.DecoderConfig(timeout_ms=20.0),
        "manager": cfg.ManagerConfig(raft_partners={"127.0.0.1:9301": "tcp://127.0.0.1:9311",
                                                    "127.0.0.1:9302": "tcp://127.0.0.1:9312"}, journal_file="j/m1"),
        "gateway": cfg.GatewayConfig(http_port=0, frontend_endpoints=["tcp://127.0.0.1:9"], models={
            "m": cfg.ModelInfo([3], 2, version="4")}),
        "graph_operator": cfg.GraphOperatorConfig(operator="g", role="backup", epoch=2, graph={"mode": "nspb"},
                                                  peers={"g": "tcp://127.0.0.1:9"}, trace_path="t.jsonl"),
        "store": cfg.StoreConfig(name="s", store="elsewhere", max_chunk_bytes=4096, status_endpoint="tcp://127.0.0.1:9"),
    }


@pytest.mark.parametrize("role", sorted(CONFIGS))
def test_json_round_trip(role):
    """What Launcher and supervisord pass as --config comes back as the same config."""
    original = full_configs()[role]
    again = from_dict(role, orjson.loads(to_json(original)))
    assert again == original
    if role in ("frontend", "dispatcher", "gateway"):
        assert all(dataclasses.is_dataclass(v) for v in again.models.values())
    if role == "frontend":
        assert all(dataclasses.is_dataclass(v) for v in again.graphs.values())


def test_model_objects_pass_through():
    info = cfg.ModelInfo([4], 2)
    assert from_dict("frontend", {"models": {"m": info}}).models["m"] is info


# --------------------------------------------------------------------------- how options relate


def test_aimd_delay_must_be_shorter_than_the_budget():
    with pytest.raises(ConfigError, match=r"m: batch_delay_ms must be < batch_budget_ms \(10\)") as info:
        from_dict("dispatcher", {"models": {"m": {"batch_budget_ms": 10, "batch_delay_ms": 10}}})
    assert info.value.key == "batch_delay_ms"
    from_dict("dispatcher", {"models": {"m": {"batch_budget_ms": 10, "batch_delay_ms": 10, "fixed_batch": 4}}})


def test_decoder_timeout_must_be_shorter_than_the_group_ttl():
    with pytest.raises(ConfigError, match=r"timeout_ms must be shorter than group_ttl_s"):
        from_dict("decoder", {"timeout_ms": 2000.0, "group_ttl_s": 1.0})
    with pytest.raises(ConfigError, match=r"timeout_ms must be > 0"):
        from_dict("decoder", {"timeout_ms": 0.0})
    assert from_dict("decoder", {"timeout_ms": 500.0, "group_ttl_s": 1.0}).timeout_ms == 500.0


def test_decoder_group_ttl_must_be_positive():
    with pytest.raises(ConfigError, match="group_ttl_s must be > 0") as info:
        from_dict("decoder", {"group_ttl_s": 0})
    assert (info.value.key, info.value.reason) == ("group_ttl_s", "must be > 0")


@pytest.mark.parametrize("dispatcher,worker,words", [
    ({"heartbeat_interval_s": 0.1, "heartbeat_liveness": 2}, {"heartbeat_interval_s": 0.25}, "dispatcher's liveness window"),
    ({"heartbeat_interval_s": 1.0}, {"heartbeat_interval_s": 0.25, "heartbeat_liveness": 4}, "worker's liveness window"),
    ({}, {}, None),
    ({"heartbeat_interval_s": 0.1, "heartbeat_liveness": 4}, {"heartbeat_interval_s": 0.1}, None),
])
def test_worker_and_dispatcher_heartbeats_agree(dispatcher, worker, words):
    from keel.common.config import heartbeats_agree

    why = heartbeats_agree(from_dict("dispatcher", dispatcher), from_dict("worker", worker))
    assert (why is None) if words is None else (words in why)


def test_errors_carry_the_key_and_reason():
    with pytest.raises(ConfigError) as info:
        from_dict("frontend", {"models": {"m": {"input_shape": [4], "output_size": 2, "deadline_ms": 0}}})
    assert (info.value.key, info.value.reason) == ("deadline_ms", "must be > 0")
    with pytest.raises(ConfigError) as info:
        from_dict("worker", {"slots": "2"})
    assert info.value.key == "slots" and info.value.reason.startswith("must be an integer")
