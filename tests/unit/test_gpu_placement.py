"""GPU placement on the CPU: the spec deals a model's workers over the GPUs its hosts list,
each worker's program gets its GPU as ``CUDA_VISIBLE_DEVICES`` (supervisord and systemd),
``keel status`` shows it, and ``keel up`` refuses a GPU the host lacks in one line before
anything starts."""
from __future__ import annotations

import configparser
import os

import pytest

from keel.common import devices
from keel.common.config import ConfigError, WorkerConfig
from keel.common.spec import SpecError, load_spec
from keel.deploy.preflight import PreflightError, check_devices

SMI = """GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5f1a2b3c-0000-1111-2222-333344445555)
  MIG 3g.40gb     Device  0: (UUID: MIG-7e9d1c2b-aaaa-bbbb-cccc-ddddeeeeffff)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-6a2b3c4d-0000-1111-2222-333344445555)
"""


def spec(tmp_path, model: dict, hosts: dict | None = None, cluster: dict | None = None):
    return load_spec({"cluster": cluster or {"name": "g", "run_dir": str(tmp_path / "run")},
                      "hosts": hosts or {"a": {"address": "127.0.0.1", "gpus": [0, 1]}},
                      "models": {"m": {"builtin": "noop", **model}}})


def placed(s) -> list[tuple[str, str, str | None, str]]:
    return [(w.name, w.host, w.config.gpu, w.config.device) for w in s.role("worker")]


def test_workers_are_dealt_gpu_by_gpu_across_hosts_then_again_per_gpu(tmp_path):
    hosts = {"a": {"address": "127.0.0.1", "gpus": [0, 1]}, "b": {"address": "127.0.0.2", "gpus": ["MIG-x"]}, "c": "127.0.0.3"}
    s = spec(tmp_path, {"hosts": ["a", "b"], "gpus": "all", "per_gpu": 2}, hosts)
    assert placed(s) == [("worker-m-0", "a", "0", "cuda"), ("worker-m-1", "b", "MIG-x", "cuda"), ("worker-m-2", "a", "1", "cuda"),
                         ("worker-m-3", "a", "0", "cuda"), ("worker-m-4", "b", "MIG-x", "cuda"), ("worker-m-5", "a", "1", "cuda")]


def test_a_workers_count_is_dealt_over_the_slots_and_parity_workers_continue(tmp_path):
    s = spec(tmp_path, {"gpus": [1, 0], "workers": 3, "k": 2})
    assert [(n, g) for n, _, g, _ in placed(s)] == [("worker-m-0", "1"), ("worker-m-1", "0"), ("worker-m-2", "1"),
                                                  ("parity-m-0", "0"), ("parity-m-1", "1")]


def test_without_gpus_nothing_changes(tmp_path):
    s = spec(tmp_path, {"workers": 2}, {"a": "127.0.0.1"})
    assert [(g, d) for _, _, g, d in placed(s)] == [(None, "cpu"), (None, "cpu")]


@pytest.mark.parametrize("model, hosts, match", [
    ({"gpus": [2]}, None, r"models\.m\.gpus: GPU 2 is not one host 'a' offers"),
    ({"gpus": "all"}, {"a": "127.0.0.1"}, r"models\.m\.gpus: \"all\" but host 'a' lists no GPUs"),
    ({"gpus": [0], "worker": {"device": "cpu"}}, None, r"models\.m\.worker\.device: 'cpu' with gpus"),
    ({"per_gpu": 2}, None, r"models\.m\.per_gpu: only used with gpus"),
    ({"gpus": "some"}, None, r"models\.m\.gpus: must be \"all\" or a list"),
    ({}, {"a": {"address": "127.0.0.1", "gpus": ["card0"]}}, r"hosts\.a\.gpus: 'card0' is neither"),
    ({}, {"a": {"address": "127.0.0.1", "gpu": [0]}}, r"hosts\.a\.gpu: unknown key"),
])
def test_a_placement_the_hosts_cannot_take_is_refused_with_its_key(tmp_path, model, hosts, match):
    with pytest.raises(SpecError, match=match):
        spec(tmp_path, model, hosts)


def test_a_worker_placed_on_a_gpu_sees_it_as_cuda():
    with pytest.raises(ConfigError, match="gpu"):
        WorkerConfig(device="cuda:1", gpu="1").validate()
    with pytest.raises(ConfigError, match="gpu"):
        WorkerConfig(gpu="1").validate()  # on the CPU
    WorkerConfig(device="cuda", gpu="MIG-x").validate()


def test_each_worker_program_starts_with_its_gpu_visible(tmp_path):
    from keel.deploy.supervisor import render

    s = spec(tmp_path, {"gpus": "all"})
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";",))
    parser.read(render(s, python="/venv/bin/python"))
    assert parser.get("program:worker-m-0", "environment") == 'PYTHONUNBUFFERED="1",CUDA_VISIBLE_DEVICES="0"'
    assert parser.get("program:worker-m-1", "environment") == 'PYTHONUNBUFFERED="1",CUDA_VISIBLE_DEVICES="1"'
    assert parser.get("program:frontend", "environment") == 'PYTHONUNBUFFERED="1"'


def test_each_systemd_worker_unit_gets_its_gpu_in_its_environment_file(tmp_path):
    from keel.deploy.units import render_systemd

    s = spec(tmp_path, {"gpus": [1]})
    render_systemd(s, "a", tmp_path / "units", python="/p", workdir="/w", etc_dir="/etc/keel")
    assert "CUDA_VISIBLE_DEVICES=1\n" in (tmp_path / "units" / "keel" / "worker-m-0.env").read_text()
    assert "CUDA_VISIBLE_DEVICES" not in (tmp_path / "units" / "keel" / "frontend.env").read_text()


def test_status_shows_each_workers_gpu(tmp_path):
    from keel.deploy.supervisor import _program_rows, format_table

    rows = _program_rows(spec(tmp_path, {"gpus": "all"}), {})
    assert {r["name"]: r["gpu"] for r in rows if r["role"] == "worker"} == {"worker-m-0": "0", "worker-m-1": "1"}
    assert "GPU" in format_table(rows).splitlines()[0]
    assert "gpu" not in _program_rows(spec(tmp_path, {}, {"a": "127.0.0.1"}), {})[0]  # a CPU cluster's table is as before


def test_the_gpus_of_a_host_are_read_from_nvidia_smi():
    assert devices.parse_smi(SMI) == ["0", "GPU-5f1a2b3c-0000-1111-2222-333344445555", "MIG-7e9d1c2b-aaaa-bbbb-cccc-ddddeeeeffff",
                                      "1", "GPU-6a2b3c4d-0000-1111-2222-333344445555"]


def test_preflight_refuses_a_gpu_the_host_lacks_in_one_line(tmp_path):
    s = spec(tmp_path, {"gpus": "all"})
    check_devices(s, present=["0", "1"])
    with pytest.raises(PreflightError) as err:
        check_devices(s, present=["0"])
    assert "worker-m-1 asks for GPU 1 but this host has 1 GPU(s): 0" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(PreflightError, match="this host has no GPU"):
        check_devices(s, present=[])
    cpu = spec(tmp_path, {"worker": {"device": "cuda:1"}}, {"a": "127.0.0.1"})
    with pytest.raises(PreflightError, match="worker-m-0 asks for GPU 1"):
        check_devices(cpu, present=["0"])
    check_devices(spec(tmp_path, {}, {"a": "127.0.0.1"}), present=[])  # CPU workers: nothing to check


def test_keel_up_refuses_before_anything_starts(tmp_path, monkeypatch):
    from keel.deploy import supervisor
    from keel.deploy.local import free_port_block

    monkeypatch.setattr(devices, "present_gpus", lambda: [])
    started = []
    monkeypatch.setattr(supervisor.subprocess, "run", lambda *a, **k: started.append(a))
    s = spec(tmp_path, {"gpus": [0]}, cluster={"name": "g", "run_dir": str(tmp_path / "run"), "base_port": free_port_block()})
    with pytest.raises(supervisor.DeployError, match="worker-m-0 asks for GPU 0 but this host has no GPU"):
        supervisor.up(s, out=None)
    assert not started


def test_a_worker_makes_its_gpu_its_only_visible_one(monkeypatch):
    monkeypatch.delenv(devices.VISIBLE, raising=False)
    devices.see_only(None)
    assert devices.VISIBLE not in os.environ
    devices.see_only("MIG-x")
    assert os.environ[devices.VISIBLE] == "MIG-x"
