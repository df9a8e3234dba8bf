"""Model containers: Clipper's narrow interface, ``predict_batch(inputs) -> outputs``.

A predictor takes a stacked batch (N, *input_shape) and returns (N, output_size) float32.
Store models are torch modules loaded (sha256-checked) from the model store; the builtin
models serve benchmarks and experiments:

- ``noop``: answers zeros at once (measures Keel's own overhead);
- ``sleep``: holds the batch for ``fixed_ms + per_query_ms * N`` without using the CPU,
  like an accelerator would, so per-batch fixed cost and service time are set exactly;
- ``kairos``: emulates an instance type of the Kairos paper: each row is a query whose
  first feature is its batch size (items), served in the authors' measured time for
  (``instance``, ``kairos_model``, batch size) times ``kairos_scale``, CPU idle; rows of
  one Keel batch are served one after another. Answers zeros.

``sleep`` answers the first ``output_size`` input features (zero-padded), ``noop`` zeros:
both linear in the input, so a reply can be checked offline and a parity model for them
is the model itself (F(X1 + X2) = F(X1) + F(X2)), which makes ParM reconstructions exact.
"""
from __future__ import annotations

import time
from typing import Protocol

import numpy as np

from common.config import WorkerConfig


class Predictor(Protocol):
    input_shape: list[int]
    output_size: int

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray: ...


def _head(inputs: np.ndarray, output_size: int) -> np.ndarray:
    flat = inputs.reshape(len(inputs), -1).astype(np.float32, copy=False)
    out = np.zeros((len(inputs), output_size), np.float32)
    n = min(output_size, flat.shape[1])
    out[:, :n] = flat[:, :n]
    return out


class BuiltinPredictor:
    def __init__(self, kind: str, input_shape: list[int], output_size: int, fixed_ms: float = 0.0, per_query_ms: float = 0.0):
        self.kind, self.input_shape, self.output_size = kind, list(input_shape), output_size
        self.fixed_ms, self.per_query_ms = fixed_ms, per_query_ms

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        if self.kind == "noop":
            return np.zeros((len(inputs), self.output_size), np.float32)
        delay = (self.fixed_ms + self.per_query_ms * len(inputs)) / 1000.0
        if delay > 0:
            time.sleep(delay)
        return _head(inputs, self.output_size)


class KairosPredictor:
    """An emulated instance type (Kairos, §7): measured profile times, no CPU used."""

    def __init__(self, instance: str, model: str, scale: float, profile: str, input_shape: list[int], output_size: int):
        from common.kairos.profiles import Profiles

        self.profiles = Profiles.load(profile or None)
        self.instance, self.model, self.scale = instance, model, scale
        self.input_shape, self.output_size = list(input_shape), output_size
        self.profiles.latency_ms(instance, model, 1)     # unknown type or model fails at start

    def service_ms(self, inputs: np.ndarray) -> float:
        """Total time of the batch: one query per row, batch size in its first feature."""
        sizes = np.rint(inputs.reshape(len(inputs), -1)[:, 0]).clip(1, 1000)
        return float(np.sum(self.profiles.latency_ms(self.instance, self.model, sizes))) * self.scale

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        delay = self.service_ms(inputs) / 1000.0
        if delay > 0:
            time.sleep(delay)
        return np.zeros((len(inputs), self.output_size), np.float32)


class TorchPredictor:
    """A store model. ``fixed_ms``/``per_query_ms`` > 0 set a floor on the service time (the
    batch is held until then, CPU idle), to stand in for a larger model on an accelerator."""

    def __init__(self, store: str, name: str, version: str | None, threads: int = 1,
                 fixed_ms: float = 0.0, per_query_ms: float = 0.0):
        import torch

        from common.modelstore import ModelStore

        torch.set_num_threads(threads)
        self.torch = torch
        self.module, self.manifest = ModelStore(store).load(name, version)
        self.version = self.manifest.version
        self.input_shape, self.output_size = list(self.manifest.input_shape), self.manifest.output_size
        self.fixed_ms, self.per_query_ms = fixed_ms, per_query_ms

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        with self.torch.inference_mode():
            out = self.module(self.torch.from_numpy(np.ascontiguousarray(inputs, np.float32)))
        floor = (self.fixed_ms + self.per_query_ms * len(inputs)) / 1000.0
        left = floor - (time.perf_counter() - start)
        if left > 0:
            time.sleep(left)
        return out.numpy().astype(np.float32, copy=False)


def build_predictor(cfg: WorkerConfig) -> Predictor:
    if cfg.builtin is not None:
        if cfg.builtin == "kairos":
            return KairosPredictor(cfg.instance, cfg.kairos_model, cfg.kairos_scale, cfg.kairos_profile,
                                   cfg.builtin_input_shape, cfg.builtin_output_size)
        return BuiltinPredictor(cfg.builtin, cfg.builtin_input_shape, cfg.builtin_output_size, cfg.fixed_ms, cfg.per_query_ms)
    return TorchPredictor(cfg.store, cfg.store_name or cfg.model, cfg.version, cfg.torch_threads, cfg.fixed_ms, cfg.per_query_ms)
