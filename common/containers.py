"""Model containers: Clipper's narrow interface, ``predict_batch(inputs) -> outputs``.

A predictor takes a stacked batch (N, *input_shape) and returns (N, output_size) float32.
Store models are loaded (sha256-checked) from the model store: torch modules (Keel's own
architectures, a user's TorchScript file or ``torch.export`` program) by ``TorchPredictor``,
a user's Python class (``module:Class`` with ``predict_batch`` and optional ``load(path)``)
by ``PythonPredictor``. Each runs in its worker's own process. ``check`` runs one batch
through a predictor the way a worker would, before a version is accepted. The builtin
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

import importlib
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from keel.common.config import WorkerConfig


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
        from keel.common.kairos.profiles import Profiles

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


class DeviceError(RuntimeError):
    """The spec asks for a device this host does not have."""


def check_device(device: str) -> str:
    """``device`` if torch can use it here; a ``DeviceError`` that says why not otherwise."""
    if device == "cpu":
        return device
    import torch

    if not torch.cuda.is_available():
        raise DeviceError(f'device = "{device}" but torch sees no GPU on this host (torch {torch.__version__}, '
                          f'built with CUDA {torch.version.cuda or "none"}); set device = "cpu" or run the worker on a GPU host')
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise DeviceError(f'device = "{device}" but this host has {torch.cuda.device_count()} GPU(s)')
    return device


class TorchPredictor:
    """A store model. ``fixed_ms``/``per_query_ms`` > 0 set a floor on the service time (the
    batch is held until then, CPU idle), to stand in for a larger model on an accelerator.
    A ``torch.export`` program traced with a fixed batch size runs a batch in chunks of it
    (the last one zero-padded). ``device`` "cuda" places the model on a GPU; each batch
    goes there and back through the worker's ``DataPath`` (pinned buffers, a stream per
    slot, optional ``autocast``; ``memory_fraction`` caps its share of the GPU's memory)."""

    def __init__(self, store: str, name: str, version: str | None, threads: int = 1,
                 fixed_ms: float = 0.0, per_query_ms: float = 0.0, device: str = "cpu",
                 autocast: str = "", memory_fraction: float = 0.0):
        import torch

        from keel.common.datapath import DataPath
        from keel.common.modelstore import ModelStore

        torch.set_num_threads(threads)
        self.torch = torch
        self.device = check_device(device)
        self.module, self.manifest = ModelStore(store).load(name, version)
        self.path = DataPath(torch, self.device, autocast, memory_fraction)
        if self.device != "cpu":
            self.module = self.module.to(self.device)
            torch.cuda.synchronize(self.device)  # the weights are in place before any slot's stream reads them
        self.version = self.manifest.version
        self.input_shape, self.output_size = list(self.manifest.input_shape), self.manifest.output_size
        self.fixed_ms, self.per_query_ms = fixed_ms, per_query_ms

    def _run(self, inputs: np.ndarray) -> np.ndarray:
        chunk = self.manifest.static_batch
        if not chunk or len(inputs) == chunk:
            return self.path.run(self.module, inputs)
        parts = []
        for start in range(0, len(inputs), chunk):
            part = inputs[start:start + chunk]
            padded = np.zeros((chunk, *inputs.shape[1:]), inputs.dtype)
            padded[:len(part)] = part
            parts.append(self.path.run(self.module, padded)[:len(part)])
        return np.concatenate(parts)

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        with self.torch.inference_mode():
            out = self._run(np.ascontiguousarray(inputs, self.manifest.input_dtype))
        floor = (self.fixed_ms + self.per_query_ms * len(inputs)) / 1000.0
        left = floor - (time.perf_counter() - start)
        if left > 0:
            time.sleep(left)
        return out.astype(np.float32, copy=False)


def load_entry(entry: str, folder: Path | None = None) -> type:
    """The class named ``module:Class``; ``container.py:Class`` is the file in ``folder``
    (a version's own copy), any other ``FILE.py:Class`` that file."""
    module_name, _, cls = entry.rpartition(":")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_absolute() and folder is not None:
            path = folder / path
        spec = importlib.util.spec_from_file_location(f"keel_container_{abs(hash(str(path)))}", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # what dataclasses and pickling look a class's module up in
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    found = getattr(module, cls, None)
    if found is None:
        raise ImportError(f"{module_name} has no {cls}")
    return found


class PythonPredictor:
    """A user's Python container (Clipper §3): ``Class()``, then ``load(path)`` if it has
    one (the version's artifact, or its folder when there is none), then ``predict_batch``.
    ``fixed_ms``/``per_query_ms`` are taken for a uniform signature; the class sets its own cost."""

    def __init__(self, store: str, name: str, version: str | None, threads: int = 1,
                 fixed_ms: float = 0.0, per_query_ms: float = 0.0):
        from keel.common.modelstore import ModelStore

        mstore = ModelStore(store)
        self.manifest = mstore.manifest(name, version)
        self.version = self.manifest.version
        self.input_shape, self.output_size = list(self.manifest.input_shape), self.manifest.output_size
        artifact = mstore.artifact(self.manifest)  # checks its sha256
        folder = mstore.folder(self.manifest)
        if self.manifest.container_sha256:
            from keel.common.modelstore import ModelStoreError, sha256_file

            if sha256_file(folder / "container.py") != self.manifest.container_sha256:
                raise ModelStoreError(f"{name}/{self.version}: container.py does not match its manifest's sha256; "
                                      "refusing to load")
        self.container: Any = load_entry(self.manifest.entry or "", folder)()
        if hasattr(self.container, "load"):
            self.container.load(str(artifact or folder))
        self.fixed_ms, self.per_query_ms = fixed_ms, per_query_ms

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        return np.asarray(self.container.predict_batch(inputs), np.float32)


def check(predictor: Predictor, input_shape: list[int], input_dtype: str, rows: int = 2) -> np.ndarray:
    """Run one batch of ``rows`` zero queries as a worker would; the outputs, or a
    ``ValueError`` saying what is wrong with them."""
    inputs = np.zeros((rows, *input_shape), input_dtype)
    try:
        outputs = np.asarray(predictor.predict_batch(inputs))
    except Exception as exc:
        raise ValueError(f"the model failed on a batch of {rows} x {list(input_shape)} {input_dtype}: "
                         f"{type(exc).__name__}: {exc}") from exc
    if outputs.ndim != 2 or outputs.shape[0] != rows:
        raise ValueError(f"the model returned shape {list(outputs.shape)} for {rows} queries; "
                         f"want ({rows}, output_size)")
    if not np.issubdtype(outputs.dtype, np.number):
        raise ValueError(f"the model returned dtype {outputs.dtype}, not numbers")
    return outputs


def store_predictor(store: str, name: str, version: str | None, threads: int = 1,
                    fixed_ms: float = 0.0, per_query_ms: float = 0.0, device: str = "cpu",
                    autocast: str = "", memory_fraction: float = 0.0) -> Predictor:
    """The container for a store version, by its manifest's format (a Python container
    places itself: ``device`` and ``autocast`` are for torch models; ``memory_fraction`` caps
    the process's share of the GPU either way)."""
    from keel.common.modelstore import ModelStore

    if ModelStore(store).manifest(name, version).format == "python":
        check_device(device)
        if memory_fraction and device != "cpu":  # the process's share, whatever the class allocates
            import torch

            torch.cuda.set_per_process_memory_fraction(memory_fraction, int(device.partition(":")[2] or 0))
        return PythonPredictor(store, name, version, threads, fixed_ms, per_query_ms)
    return TorchPredictor(store, name, version, threads, fixed_ms, per_query_ms, device, autocast, memory_fraction)


def build_predictor(cfg: WorkerConfig) -> Predictor:
    if cfg.builtin is not None:
        check_device(cfg.device)  # a builtin uses no torch, but the spec asked for a GPU: say so
        if cfg.builtin == "serf_host":
            from keel.common.serf_host import SerfHost, curves

            return SerfHost(**(cfg.serf_host or curves(None)), input_shape=cfg.builtin_input_shape,
                            output_size=cfg.builtin_output_size)
        if cfg.builtin == "kairos":
            return KairosPredictor(cfg.instance, cfg.kairos_model, cfg.kairos_scale, cfg.kairos_profile,
                                   cfg.builtin_input_shape, cfg.builtin_output_size)
        return BuiltinPredictor(cfg.builtin, cfg.builtin_input_shape, cfg.builtin_output_size, cfg.fixed_ms, cfg.per_query_ms)
    return store_predictor(cfg.store, cfg.store_name or cfg.model, cfg.version, cfg.torch_threads, cfg.fixed_ms,
                           cfg.per_query_ms, cfg.device, cfg.autocast, cfg.memory_fraction)
