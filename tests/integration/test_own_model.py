"""A model Keel has never seen, served through real processes: a TorchScript file and a
Python class written here are added with ``keel model add`` (the same store path as the
demo's own models) and answered by real frontend, dispatcher and worker processes."""
from __future__ import annotations

import textwrap
import time

import numpy as np
import pytest
import torch

from keel.common.client import Client
from keel.common.modelstore import ModelStore
from keel.common.spec import load_spec
from keel.deploy.keel import main as keel
from keel.deploy.local import free_port_block

pytestmark = pytest.mark.slow

PATIENT_MS = 10_000


class Scale(torch.nn.Module):
    """4 -> 2: (sum of x, 3 * x[0])."""

    def forward(self, x):
        return torch.stack([x.sum(1), 3 * x[:, 0]], dim=1)


CONTAINER = textwrap.dedent('''
    import os
    import numpy as np

    class Counter:
        """Answers each query's maximum and the pid of the process that ran it."""

        def load(self, path):
            self.bias = float(open(path).read())

        def predict_batch(self, inputs):
            flat = inputs.reshape(len(inputs), -1)
            return np.stack([flat.max(axis=1) + self.bias, np.full(len(inputs), os.getpid())], axis=1)
''')


@pytest.fixture
def store(tmp_path, capsys):
    script = tmp_path / "scale.pt"
    torch.jit.save(torch.jit.script(Scale()), script)
    (tmp_path / "counter.py").write_text(CONTAINER)
    (tmp_path / "bias.txt").write_text("0.5")
    root = str(tmp_path / "store")
    assert keel(["model", "add", "scale", str(script), "--input-shape", "4", "--store", root]) == 0
    assert keel(["model", "add", "counter", str(tmp_path / "bias.txt"), "--python", f"{tmp_path / 'counter.py'}:Counter",
                 "--input-shape", "2,3", "--store", root]) == 0
    out = capsys.readouterr().out
    assert "added scale version 1" in out and "added counter version 1" in out
    return root


def test_own_models_are_served_by_worker_processes(store, launcher):
    run = launcher("own")
    spec = load_spec({"cluster": {"name": "own", "store": store, "base_port": free_port_block(), "run_dir": str(run.log_dir)},
                      "frontend": {"cache_size": 0},
                      "models": {"scale": {"workers": 1}, "counter": {"workers": 2}}})
    assert spec.models["counter"]["input_shape"] == [2, 3] and spec.models["scale"]["output_size"] == 2
    run.start_spec(spec)
    xs = np.random.default_rng(0).random((40, 4), dtype=np.float32)
    with Client(spec.client_endpoints, timeout_ms=PATIENT_MS) as client:
        results = client.predict_batch("scale", xs)
        assert [r.source for r in results] == ["model"] * len(xs)
        np.testing.assert_allclose(np.stack([r.output for r in results]), np.stack([xs.sum(1), 3 * xs[:, 0]], 1), rtol=1e-5)
        assert {r.version for r in results} == {"1"}
        qs = np.random.default_rng(1).random((60, 2, 3), dtype=np.float32)
        results = client.predict_batch("counter", qs)
        assert [r.source for r in results] == ["model"] * len(qs)
        outs = np.stack([r.output for r in results])
        np.testing.assert_allclose(outs[:, 0], qs.reshape(60, -1).max(1) + 0.5, rtol=1e-5)
        # the container ran in the worker processes, not in this one
        pids = {int(p) for p in outs[:, 1]}
        worker_pids = {proc.pid for name, proc in run.procs.items() if "counter" in name}
        assert pids and pids <= worker_pids
    assert ModelStore(store).versions("counter") == ["1"]


class ScalePlus(torch.nn.Module):
    """Version 2 of "scale": (sum of x + 100, 3 * x[0])."""

    def forward(self, x):
        return torch.stack([x.sum(1) + 100, 3 * x[:, 0]], dim=1)


def expected_output(x: np.ndarray, version: str) -> np.ndarray:
    return np.array([x.sum() + (100 if version == "2" else 0), 3 * x[0]], np.float32)


def test_rollout_and_rollback_under_load_drop_nothing(store, launcher, tmp_path, capsys):
    import threading

    script = tmp_path / "scale-v2.pt"
    torch.jit.save(torch.jit.script(ScalePlus()), script)
    assert keel(["model", "add", "scale", str(script), "--input-shape", "4", "--store", store]) == 0
    run = launcher("rollout")
    spec_file = tmp_path / "rollout.toml"
    spec_file.write_text(f'[cluster]\nname = "rollout"\nstore = "{store}"\nbase_port = {free_port_block()}\n'
                         f'run_dir = "{run.log_dir}"\n'
                         '[models.scale]\nversion = 1\nworkers = 2\n')
    spec = run.start_spec(load_spec(str(spec_file)))
    xs = np.random.default_rng(2).random((16, 4), dtype=np.float32)  # few distinct inputs: the cache answers many
    results, sent, stop = [], [], threading.Event()

    def load() -> None:
        with Client(spec.client_endpoints, timeout_ms=PATIENT_MS) as client:
            while not stop.is_set() and len(sent) < 5000:
                i = len(sent) % len(xs)
                sent.append((client.submit("scale", xs[i]), i))
                results.extend(client.collect(10.0))
            while len(results) < len(sent):
                got = client.collect(1000.0)
                if not got and client.calls == {}:
                    break
                results.extend(got)

    loader = threading.Thread(target=load)
    loader.start()
    try:
        wait_results = lambda n: __import__("keel.common.waiting", fromlist=["wait_until"]).wait_until(lambda: len(results) >= n, 30)
        assert wait_results(50)
        assert keel(["model", "rollout", str(spec_file), "scale", "--version", "2"]) == 0
        n = len(results)
        assert wait_results(n + 50)
        assert keel(["model", "rollback", str(spec_file), "scale"]) == 0  # to version 1
        n = len(results)
        assert wait_results(n + 50)
    finally:
        stop.set()
        loader.join(60)
    said = capsys.readouterr().out
    assert "every worker serves version 2" in said and "every worker serves version 1" in said
    by_id = {rid: i for rid, i in sent}
    assert len(results) == len(sent) and {r.request_id for r in results} == set(by_id)  # one answer each
    assert {r.source for r in results} <= {"model", "cache"}, {r.source for r in results}
    for r in results:  # each answer is its version's output, cached or not
        np.testing.assert_allclose(r.output, expected_output(xs[by_id[r.request_id]], r.version), rtol=1e-5)
    versions = [r.version for r in results]
    assert "2" in versions and versions[-1] == "1"


class Wider(torch.nn.Module):
    """An incompatible "version 3": three outputs where the served model has two."""

    def forward(self, x):
        return torch.stack([x.sum(1), x[:, 0], x[:, 1]], dim=1)


def test_a_version_the_workers_refuse_stops_the_rollout_and_the_old_one_serves(store, launcher, tmp_path, capsys):
    run = launcher("refuse")
    spec_file = tmp_path / "refuse.toml"
    spec_file.write_text(f'[cluster]\nname = "refuse"\nstore = "{store}"\nbase_port = {free_port_block()}\n'
                         f'run_dir = "{run.log_dir}"\n[models.scale]\nworkers = 2\n')
    spec = run.start_spec(load_spec(str(spec_file)))
    script = tmp_path / "wider.pt"
    torch.jit.save(torch.jit.script(Wider()), script)
    assert keel(["model", "add", "scale", str(script), "--input-shape", "4", "--store", store]) == 0
    capsys.readouterr()
    assert keel(["model", "rollout", str(spec_file), "scale", "--version", "2"]) == 1
    err = capsys.readouterr().err
    assert "refused version 2" in err and "stopped there" in err
    with Client(spec.client_endpoints, timeout_ms=PATIENT_MS) as client:
        x = np.ones(4, np.float32)
        results = [client.predict("scale", x) for _ in range(10)]
    assert {r.version for r in results} == {"1"} and {r.source for r in results} <= {"model", "cache"}
    assert ModelStore(store).manifest("scale", "2").output_size == 3  # stored: its check passed alone


SLOW = textwrap.dedent('''
    import time
    import numpy as np

    class Slow:
        """x.sum() + the version's bias, after 0.5 s: long enough to roll out meanwhile."""

        def load(self, path):
            self.bias = float(open(path).read())

        def predict_batch(self, inputs):
            time.sleep(0.5)
            flat = inputs.reshape(len(inputs), -1)
            return np.stack([flat.sum(axis=1) + self.bias, np.zeros(len(inputs))], axis=1)
''')


def test_a_batch_computing_through_a_rollout_names_the_version_that_computed_it(launcher, tmp_path, capsys):
    """A worker computes on an executor thread while a rollout swaps its model: the
    predictions of the batch in flight are the old version's and must say so."""
    import threading

    (tmp_path / "slow.py").write_text(SLOW)
    root = str(tmp_path / "store")
    for version, bias in (("1", "0"), ("2", "100")):
        (tmp_path / f"bias{version}.txt").write_text(bias)
        assert keel(["model", "add", "slow", str(tmp_path / f"bias{version}.txt"), "--python",
                     f"{tmp_path / 'slow.py'}:Slow", "--input-shape", "4", "--store", root]) == 0
    run = launcher("inflight")
    spec_file = tmp_path / "inflight.toml"
    spec_file.write_text(f'[cluster]\nname = "inflight"\nstore = "{root}"\nbase_port = {free_port_block()}\n'
                         f'run_dir = "{run.log_dir}"\n[models.slow]\nversion = 1\nworkers = 1\nmax_batch = 1\n')
    spec = run.start_spec(load_spec(str(spec_file)))
    x = np.arange(4, dtype=np.float32)
    with Client(spec.client_endpoints, timeout_ms=PATIENT_MS) as client:
        client.submit("slow", x)
        time.sleep(0.15)  # the batch is computing with version 1
        rolled = threading.Thread(target=lambda: keel(["model", "rollout", str(spec_file), "slow", "--version", "2"]))
        rolled.start()
        replies = client.collect(PATIENT_MS)
        rolled.join(30)
    assert len(replies) == 1 and replies[0].source == "model"
    r = replies[0]
    assert r.output[0] == pytest.approx(x.sum() + (100 if r.version == "2" else 0)), (r.version, r.output)
    assert "every worker serves version 2" in capsys.readouterr().out
