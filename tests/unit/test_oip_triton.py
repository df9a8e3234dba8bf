"""Triton's ModelConfig and ModelStatistics gRPC answers, hand-written (services.oip.triton),
decoded by tritonclient's own generated messages: every field Keel sends lands where
Triton's has it.

This process loads tritonclient's protobuf package ``inference``; the module under test
loads none (the gateway's own generated modules would clash with it)."""
from __future__ import annotations

import pytest

from keel.common.signature import Signature, TensorSpec, parse_input
from keel.services.oip import tensors, triton
from keel.services.oip.stats import Statistics

service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
from google.protobuf import json_format  # noqa: E402

SIG = Signature((parse_input("dense:float32:13"), parse_input("ids:int64:1..40"), parse_input("text:bytes:scalar")),
                (TensorSpec("p", "float32", (1,)), TensorSpec("label", "bytes", ()), TensorSpec("h", "bfloat16", (2, 3))))


def test_the_answer_decodes_as_tritons_model_config_response():
    config = tensors.model_config("rec", SIG)
    response = service_pb2.ModelConfigResponse.FromString(triton.encode_config(config))
    got = json_format.MessageToDict(response.config, preserving_proto_field_name=True)
    assert got["name"] == "rec" and got["platform"] == "keel" and got["backend"] == "keel"
    assert got["max_batch_size"] == tensors.MAX_BATCH_SIZE
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in got["input"]] == [
        ("dense", "TYPE_FP32", [13]), ("ids", "TYPE_INT64", [-1]), ("text", "TYPE_STRING", [1])]
    assert response.config.input[2].HasField("reshape") and list(response.config.input[2].reshape.shape) == []
    assert not response.config.input[0].HasField("reshape")
    assert [(t["name"], t["data_type"]) for t in got["output"]] == [
        ("p", "TYPE_FP32"), ("label", "TYPE_STRING"), ("h", "TYPE_BF16")]
    assert list(response.config.output[2].dims) == [2, 3]
    assert response.config.HasField("dynamic_batching") and not response.config.model_transaction_policy.decoupled


def test_the_request_is_read_whatever_tritonclient_puts_in_it():
    data = service_pb2.ModelConfigRequest(name="rec", version="2").SerializeToString()
    assert triton.decode_request(data) == ("rec", "2")
    assert triton.decode_request(b"") == ("", "")
    with pytest.raises(triton.WireError):
        triton.decode_request(b"\n\x09rec")  # a name of 9 bytes in 3


def test_statistics_decode_as_tritons_model_statistics_response():
    stats = Statistics()
    stats.record("rec", "1", rows=4, ns=2_000_000, ok=True)
    stats.record("rec", "1", rows=1, ns=5, ok=False)
    response = service_pb2.ModelStatisticsResponse.FromString(triton.encode_statistics(stats.to_json(["rec", "idle"])))
    rec, idle = response.model_stats
    assert (rec.name, rec.version, rec.inference_count, rec.execution_count) == ("rec", "1", 4, 1)
    assert rec.last_inference > 0 and rec.inference_stats.success.ns == 2_000_000
    assert rec.inference_stats.fail.count == 1 and rec.inference_stats.queue.count == 1
    assert (idle.name, idle.execution_count, idle.inference_stats.success.count) == ("idle", 0, 0)
