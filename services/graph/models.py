"""The models of a service graph's operators, stateless and stateful (HAMS §IV-D, §V).

A stateless operator implements ``compute(batch) -> outputs``. A stateful one also
implements ``initialize() -> state`` (a dict of name -> tensor), and splits a batch in
two: ``compute(batch)`` reads the state only and returns the outputs (they may go
downstream at once), ``update(batch, outputs)`` changes the state. NSPB copies state n
to the backup while batch n+1 computes, so ``compute`` must not write the state.

Writing your own: subclass ``StatefulOperator`` (or ``StatelessOperator``), keep the
state in ``self.state`` as torch tensors, and name it ``"your.module:YourClass"`` in
``[graph.operators.NAME] kind``; ``options`` go to its constructor as keywords::

    class Counter(StatefulOperator):
        def initialize(self):
            return {"count": torch.zeros(1)}
        def compute(self, batch):
            return np.repeat(self.state["count"].numpy()[None], len(batch.inputs), 0)
        def update(self, batch, outputs):
            self.state["count"] += len(batch.inputs)

A ``GraphBatch`` is the rows of one batch: ``inputs`` (numpy, stacked on axis 0) and
``streams`` (the stream id per row; GRU state is per stream).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from keel.common.spec.operators import operator_class


@dataclass
class GraphBatch:
    inputs: np.ndarray
    streams: list[int]


def split_failing(model, rows: list) -> tuple[list, GraphBatch | None, object, dict]:
    """A model raised on a batch of ``rows`` (``GraphRequest``s): find the rows it fails on
    alone, and compute the rest again as one batch (``compute`` only reads the state, so
    trying rows changes nothing). Returns (the good rows, their batch, its outputs, id(row)
    -> the exception of each failing row); rows that fail only together all fail."""
    good, errors = [], {}
    for r in rows:
        try:
            model.compute(GraphBatch(r.input[None], [r.stream]))
            good.append(r)
        except Exception as exc:
            errors[id(r)] = exc
    batch = GraphBatch(np.stack([r.input for r in good]), [r.stream for r in good]) if good else None
    outputs = None
    if good:
        try:
            outputs = model.compute(batch)
        except Exception as exc:  # the rows fail only together: every one gets the error
            errors.update({id(r): exc for r in good})
            good = []
    return good, batch, outputs, errors


class StatelessOperator:
    stateful = False

    def __init__(self, input_shape: tuple[int, ...], output_shape: tuple[int, ...], seed: int = 0, **options):
        torch.manual_seed(seed)
        self.input_shape, self.output_shape = input_shape, output_shape

    def compute(self, batch: GraphBatch) -> np.ndarray:
        raise NotImplementedError


class StatefulOperator(StatelessOperator):
    stateful = True

    def __init__(self, input_shape, output_shape, seed: int = 0, **options):
        super().__init__(input_shape, output_shape, seed, **options)
        self.state: dict[str, torch.Tensor] = {}

    def start(self) -> None:
        self.state = self.initialize()

    def initialize(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def update(self, batch: GraphBatch, outputs: np.ndarray) -> None:
        raise NotImplementedError

    def copy_state(self) -> dict[str, np.ndarray]:
        """A copy of the whole state (statemgr ships it; the backup overwrites with it)."""
        return {k: v.detach().clone().numpy() for k, v in self.state.items()}

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The state's tensors as numpy views, no copy: the statemgr's ``pack`` copies them
        once, into the blob it ships, while the next batch computes (it only reads them) and
        before the next update (NSPB waits for that copy)."""
        return {k: v.detach().numpy() for k, v in self.state.items()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        self.state = {k: torch.from_numpy(np.array(v)) for k, v in state.items()}

    def touched(self) -> dict[str, np.ndarray] | None:
        """The rows (first axis) of each state tensor the last ``update`` changed, for the
        tensors it changed only in part; None (the default): it may have changed any of them.
        NSPB then ships those rows only (``statemgr.pack``): a model whose state is large and
        whose update touches little of it (per-stream states, sparse weights) ships KBs, not
        its whole state. Called after ``update``, before the next ``compute``."""
        return None


class MLP(StatelessOperator):
    """A stateless two-layer MLP on flat inputs."""

    def __init__(self, input_shape, output_shape, seed: int = 0, hidden: int = 32, **options):
        super().__init__(input_shape, output_shape, seed)
        n_in, n_out = int(np.prod(input_shape)), int(np.prod(output_shape))
        self.net = torch.nn.Sequential(torch.nn.Linear(n_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, n_out))

    @torch.no_grad()
    def compute(self, batch):
        x = torch.from_numpy(np.ascontiguousarray(batch.inputs, dtype=np.float32)).reshape(len(batch.inputs), -1)
        return self.net(x).reshape(len(batch.inputs), *self.output_shape).numpy()


class LeNet(StatelessOperator):
    """A stateless LeNet-5 (``common.architectures``) on [1, H, H] images."""

    def __init__(self, input_shape, output_shape, seed: int = 0, **options):
        super().__init__(input_shape, output_shape, seed)
        from keel.common.architectures import build, config_for

        self.net = build("lenet5", **config_for("lenet5", input_shape, int(np.prod(output_shape)))).eval()

    @torch.no_grad()
    def compute(self, batch):
        x = torch.from_numpy(np.ascontiguousarray(batch.inputs, dtype=np.float32)).reshape(len(batch.inputs), *self.input_shape)
        return self.net(x).reshape(len(batch.inputs), *self.output_shape).numpy()


class GRU(StatefulOperator):
    """Stateful inference: a GRU cell with one hidden state per stream (a request carries
    its stream id). Rows of one stream in one batch are applied in order.

    ``noise`` > 0: every new hidden state (the output and the state) gets Gaussian noise of
    that scale from a generator seeded by the OS, so no two runs, and no re-execution,
    compute the same values (the non-determinism of GPU kernels, made visible)."""

    def __init__(self, input_shape, output_shape, seed: int = 0, streams: int = 64, noise: float = 0.0, **options):
        super().__init__(input_shape, output_shape, seed)
        self.streams = streams
        self.noise = noise
        self.noise_rng = torch.Generator().manual_seed(int.from_bytes(os.urandom(7), "little")) if noise else None
        self.cell = torch.nn.GRUCell(int(np.prod(input_shape)), int(np.prod(output_shape)))
        self._pending: tuple[list[int], torch.Tensor] | None = None

    def initialize(self):
        return {"hidden": torch.zeros(self.streams, self.cell.hidden_size)}

    @torch.no_grad()
    def compute(self, batch):
        x = torch.from_numpy(np.ascontiguousarray(batch.inputs, dtype=np.float32)).reshape(len(batch.inputs), -1)
        streams = [s % self.streams for s in batch.streams]
        hidden = {}  # stream -> its newest hidden state in this batch (the state is not written)
        out = torch.empty(len(streams), self.cell.hidden_size)
        rounds: list[list[int]] = []  # round k: the k-th row of each stream
        seen: dict[int, int] = {}
        for i, s in enumerate(streams):
            k = seen.get(s, 0)
            seen[s] = k + 1
            if k == len(rounds):
                rounds.append([])
            rounds[k].append(i)
        for rows in rounds:
            h = torch.stack([hidden.get(streams[i], self.state["hidden"][streams[i]]) for i in rows])
            new = self.cell(x[rows], h)
            if self.noise_rng is not None:
                new = new + self.noise * torch.randn(new.shape, generator=self.noise_rng)
            for j, i in enumerate(rows):
                out[i] = hidden[streams[i]] = new[j]
        self._pending = (list(hidden), torch.stack(list(hidden.values())))
        return out.reshape(len(streams), *self.output_shape).numpy()

    def update(self, batch, outputs):
        streams, h = self._pending
        self.state["hidden"][streams] = h
        self._touched = np.asarray(streams, dtype=np.int64)

    def touched(self):
        """The hidden states of the batch's streams (each stream once)."""
        return {"hidden": self._touched}


class OnlineMLP(StatefulOperator):
    """Stateful learning: an MLP trained online. Each request's input row is its features
    followed by the feedback (the target) for the previous prediction of its stream;
    ``compute`` predicts, ``update`` takes one SGD step on the batch's feedback."""

    def __init__(self, input_shape, output_shape, seed: int = 0, hidden: int = 32, lr: float = 0.01, **options):
        super().__init__(input_shape, output_shape, seed)
        self.n_out = int(np.prod(output_shape))
        self.n_in = int(np.prod(input_shape)) - self.n_out
        if self.n_in < 1:
            raise ValueError("OnlineMLP input is features followed by output_size feedback values")
        self.net = torch.nn.Sequential(torch.nn.Linear(self.n_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, self.n_out))
        self.lr = lr

    def initialize(self):
        return {k: v.detach().clone() for k, v in self.net.state_dict().items()}

    def load_state(self, state):
        super().load_state(state)
        self.net.load_state_dict(self.state)

    def _xy(self, batch):
        rows = torch.from_numpy(np.ascontiguousarray(batch.inputs, dtype=np.float32)).reshape(len(batch.inputs), -1)
        return rows[:, :self.n_in], rows[:, self.n_in:]

    @torch.no_grad()
    def compute(self, batch):
        """The forward pass, read from the state (writes nothing); its hidden layer is kept
        for this batch's update, which would compute it again (the update is on the way to
        every held reply; the state does not change between a batch's compute and update)."""
        x = self._xy(batch)[0]
        w1, b1, w2, b2 = (self.state[k] for k in ("0.weight", "0.bias", "2.weight", "2.bias"))
        h = torch.addmm(b1, x, w1.t()).clamp_min_(0)  # the hidden layer after its ReLU
        out = torch.addmm(b2, h, w2.t())
        self._forward = (batch, h, out)
        return out.reshape(len(batch.inputs), *self.output_shape).numpy()

    @torch.no_grad()
    def update(self, batch, outputs):
        """One SGD step on the batch's mean squared error, its gradients written out by hand
        and applied in place (autograd's step, the test checks, at ~2.5x less time: this
        update is on the way to every held reply). In place is safe: NSPB starts an update
        only once the copy of the previous state has finished."""
        x, y = self._xy(batch)
        w1, b1, w2, b2 = (self.state[k] for k in ("0.weight", "0.bias", "2.weight", "2.bias"))
        seen, h, out = getattr(self, "_forward", (None, None, None))
        self._forward = None
        if seen is not batch:  # not this batch's compute (a caller that updates alone)
            h = torch.addmm(b1, x, w1.t()).clamp_min_(0)
            out = torch.addmm(b2, h, w2.t())
        d_out = (out - y).mul_(2.0 / y.numel())  # d loss / d output
        d_z = torch.ops.aten.threshold_backward(d_out @ w2, h, 0)  # through the ReLU: 0 where its output is 0
        w2.addmm_(d_out.t(), h, alpha=-self.lr)
        b2.sub_(d_out.sum(0), alpha=self.lr)
        w1.addmm_(d_z.t(), x, alpha=-self.lr)
        b1.sub_(d_z.sum(0), alpha=self.lr)


def run_offline(graph, inputs, streams) -> tuple[list[np.ndarray], dict]:
    """The graph run in this process one request at a time, each operator built as its
    processes build it (seed 0): the reference a deterministic graph's replies must equal.
    Returns each request's output and the operators (their final states)."""
    models = {}
    for name in graph.order:
        spec = graph.operators[name]
        models[name] = operator_class(spec.kind)(spec.input_shape, spec.output_shape, seed=0, **spec.options)
        if models[name].stateful:
            models[name].start()
    outs = []
    for x, s in zip(inputs, streams):
        vals = {"frontend": np.asarray(x, np.float32)[None]}
        for name in graph.order:
            b = GraphBatch(np.concatenate([vals[p] for p in graph.predecessors(name)], axis=-1), [int(s)])
            vals[name] = models[name].compute(b)
            if models[name].stateful:
                models[name].update(b, vals[name])
        outs.append(vals[graph.predecessors("frontend")[0]][0])
    return outs, models
