"""ParM over named tensors, with real processes: a small localizer-shaped model (two
floating inputs, ``dense`` float32[6] and a variable ``seq`` float32[-1]; ``logits``[10]
and ``box``[4] out) and an untrained parity model of the same signature, served with k = 2.
With one deployed worker frozen (SIGSTOP), the queries it holds are answered by
reconstruction: both outputs, marked ``reconstruction``, each equal to the decoder's
formula applied offline, F_P(P)[name] - F(X_i)[name] with P = X_i + X_j (each input padded
to the larger), for the query X_i it was coded with (none: a partial group, F_P(X_j)).
The models are not linear, so a reconstruction is no prediction of F: the test checks the
code, not how well a parity model learnt it (``keel train localizer`` reports that)."""
from __future__ import annotations

import signal
import time
from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

from keel.common.containers import store_predictor
from keel.common.named_containers import call_rows
from keel.common.protocol import Source
from keel.common.spec import SpecError, load_spec
from keel.common.transport import request_status
from keel.deploy.local import free_port_block
from keel.training.named import add_scripted

pytestmark = pytest.mark.slow

INPUTS = ["dense:float32:6", "seq:float32:-1"]
PATIENT_MS = 10_000


class Tiny(nn.Module):
    """Two floating inputs (the padded tail of ``seq`` sums to nothing), two outputs."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Linear(6, 8)
        self.cls = nn.Linear(9, 10)
        self.box = nn.Linear(9, 4)

    def forward(self, dense: torch.Tensor, seq: torch.Tensor) -> dict[str, torch.Tensor]:
        h = torch.cat([torch.tanh(self.a(dense)), seq.sum(dim=1, keepdim=True)], 1)
        return {"logits": self.cls(h), "box": torch.sigmoid(self.box(h))}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("parm-named") / "store")
    deployed = add_scripted(root, "tiny-loc", Tiny(0), INPUTS)
    add_scripted(root, "tiny-loc-parity", Tiny(1), INPUTS, role="parity",
                 parity={"k": 2, "encoder": "add", "deployed": f"{deployed.name}/{deployed.version}"})
    return root


def offline(store: str, name: str):
    predictor = store_predictor(store, name, None)
    signature = predictor.manifest.signature_of()
    return lambda request: call_rows(predictor, signature, [request])[0][0]


def request(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"dense": rng.standard_normal(6).astype(np.float32),
            "seq": rng.standard_normal(int(rng.integers(1, 9))).astype(np.float32)}


def parity_query(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """P = A + B, the shorter ``seq`` zero-padded to the longer (ParM's addition encoder)."""
    n = max(len(a["seq"]), len(b["seq"]))
    seq = np.pad(a["seq"], (0, n - len(a["seq"]))) + np.pad(b["seq"], (0, n - len(b["seq"])))
    return {"dense": a["dense"] + b["dense"], "seq": seq}


def test_a_frozen_workers_named_queries_are_reconstructed_output_by_output(tmp_path, launcher, client, store, wait):
    spec = load_spec({
        "cluster": {"name": "parm-named", "store": store, "base_port": free_port_block(), "run_dir": str(tmp_path / "run")},
        "frontend": {"host": "local", "cache_size": 0},
        "models": {"loc": {"store_name": "tiny-loc", "workers": 2, "k": 2, "fixed_batch": 1}},
    })
    assert spec.role("encoder") and spec.role("decoder")  # a named model of floating inputs is coded
    run = launcher("parm-named")
    run.start_spec(spec)

    frozen = "worker-loc-0"
    run.kill(frozen, signal.SIGSTOP)
    try:
        c = client(spec.client_endpoints, timeout_ms=PATIENT_MS)
        rng = np.random.default_rng(5)
        requests, results = [], []
        deadline = time.monotonic() + 30
        while not any(r.source == Source.RECONSTRUCTION for r in results):
            assert time.monotonic() < deadline, f"no reconstruction within 30 s: {Counter(r.source for r in results)}"
            batch = [request(rng) for _ in range(8)]
            requests.extend(batch)
            results.extend(c.predict_batch("loc", batch))
    finally:
        run.procs[frozen].send_signal(signal.SIGCONT)

    F, F_P = offline(store, "tiny-loc"), offline(store, "tiny-loc-parity")
    plain = [F(x) for x in requests]
    sources = Counter(r.source for r in results)
    assert set(sources) <= {Source.MODEL, Source.RECONSTRUCTION}, sources
    for j, (x, r) in enumerate(zip(requests, results)):
        assert set(r.outputs) == {"logits", "box"}
        if r.source == Source.MODEL:
            for name in r.outputs:
                np.testing.assert_allclose(r.outputs[name], plain[j][name], rtol=1e-5, atol=1e-5)
            continue
        # the decoder's formula offline, for the partner this query was coded with
        errors = {}
        for i in [None, *(i for i in range(len(requests)) if i != j)]:
            other = {"dense": np.zeros(6, np.float32), "seq": np.zeros(0, np.float32)} if i is None else requests[i]
            fp = F_P(parity_query(other, x))
            want = {n: fp[n] - (0 if i is None else plain[i][n]) for n in fp}
            errors[i] = max(float(np.abs(r.outputs[n] - want[n]).max()) for n in want)
        partner = min(errors, key=errors.get)
        assert errors[partner] < 1e-4, f"reconstruction of query {j} matches no coding partner: {sorted(errors.values())[:3]}"
        assert max(float(np.abs(r.outputs[n] - plain[j][n]).max()) for n in plain[j]) > 1e-3  # rebuilt, not F's own

    dec = request_status(spec.role("decoder")[0].config.status_endpoint, 5.0)
    assert dec["reconstructed"] >= 1 and sources[Source.RECONSTRUCTION] >= 1

    # The reconstructed queries' real predictions still come (late, never sent to the client);
    # named outputs have no one top-1 to grade a reconstruction by, so none is counted graded.
    recon = sources[Source.RECONSTRUCTION]

    def late() -> dict | None:
        info = request_status(spec.client_endpoints[0], 2.0)
        return info if info and info["answered"].get("late_model", 0) >= recon else None

    answered = wait(late, timeout_s=20, what="the late predictions of the reconstructed queries")["answered"]
    assert answered.get("reconstructions_graded", 0) == 0
    assert c.collect(0) == []


def test_a_named_model_is_coded_with_add_only(tmp_path, store):
    with pytest.raises(SpecError, match='models.loc.encoder: "concat" decodes by subtracting softmaxes'):
        load_spec({"cluster": {"store": store},
                   "models": {"loc": {"store_name": "tiny-loc", "k": 2, "encoder": "concat"}}})
