"""SERF across ``keel model rollout``: real frontend, dispatcher and two workers serving a
TorchScript model from the store; the profile is kept with the version.

A rollout tells the dispatcher the version the workers now serve: with no profile of it
SERF holds the model (status and log say which profile is missing, and the command); the
rollout's default profiles the new version through the cluster right after the switch,
keeps the profile beside that version's manifest, and SERF switches by it."""
from __future__ import annotations

import pytest
import torch

from keel.common import transport
from keel.common.spec import load_spec
from keel.deploy.keel import main as keel
from keel.deploy.local import free_port_block
from keel.deploy.rollout import rollout
from keel.services.serf import profile as serf_profile
from keel.services.serf.profile import Profile
from tests.support.models import Scale

pytestmark = pytest.mark.slow


def serf_status(spec) -> dict:
    info = transport.request_status(spec.service("dispatcher").config.worker_endpoint, 5.0)
    return info["serf"]["scale"]


def test_rollout_of_a_serf_managed_model(tmp_path, launcher):
    store = str(tmp_path / "store")
    for version, offset in (("1", 0.0), ("2", 100.0)):
        torch.jit.save(torch.jit.script(Scale(offset)), tmp_path / f"v{version}.pt")
    assert keel(["model", "add", "scale", str(tmp_path / "v1.pt"), "--input-shape", "4", "--store", store]) == 0
    run = launcher("serf-rollout")
    v1 = serf_profile.where("scale", "1", store, str(run.log_dir))
    # version 1's profile, kept beside its manifest (as ``keel serf profile`` keeps it)
    serf_profile.save(Profile("scale", "1", 2, {(1, 1): 20.0, (1, 2): 12.0, (2, 1): 21.0}), v1)
    spec = load_spec({"cluster": {"name": "serf-rollout", "store": store, "base_port": free_port_block(),
                                  "run_dir": str(run.log_dir)},
                      "frontend": {"cache_size": 0}, "dispatcher": {"serf": {"scale": str(v1)}},
                      "models": {"scale": {"workers": 2, "max_batch": 1, "deadline_ms": 10_000.0,
                                            # a floor on the service time: requests overlap as a real model's do
                                            "fixed_ms": 20.0}}})
    run.start_spec(spec)
    assert serf_status(spec)["version"] == "1"
    assert keel(["model", "add", "scale", str(tmp_path / "v2.pt"), "--input-shape", "4", "--store", store]) == 0

    # without profiling: held, not switched by version 1's table
    lines: list[str] = []
    assert rollout(spec, "scale", "2", log=lines.append, profile=False) == "2"
    held = serf_status(spec)["held"]
    assert held.startswith("no profile for scale version 2: keel serf profile SPEC --model scale"), held
    assert any("SERF holds its configuration" in line for line in lines), lines

    # a rollout's default: profile the new version through the cluster, keep it, follow it
    torch.jit.save(torch.jit.script(Scale(200.0)), tmp_path / "v3.pt")
    assert keel(["model", "add", "scale", str(tmp_path / "v3.pt"), "--input-shape", "4", "--store", store]) == 0
    lines.clear()
    assert rollout(spec, "scale", "3", log=lines.append) == "3"
    status = serf_status(spec)
    assert "held" not in status and status["version"] == "3", (status, lines)
    kept = serf_profile.load(serf_profile.where("scale", "3", store, str(run.log_dir)), "3")
    assert kept is not None and sorted(kept.service_ms) == [(1, 1), (1, 2), (2, 1)]
    assert any("profiling it through the cluster" in line for line in lines), lines
    # version 1's profile is still its own: a rollback finds it
    assert serf_profile.load(v1, "1") is not None
