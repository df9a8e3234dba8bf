"""``keel up`` of a spec with a [manager] table under real supervisord: the three replicas
start first, SIGKILL of the active dispatcher promotes the standby while supervisord
restarts the old one (which stays a standby), queries keep being answered by the model,
and ``keel status`` ends with the manager's view."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from keel.common.client import Client
from keel.common.control import ManagerClient
from keel.common.spec import load_spec
from keel.common.waiting import wait_until
from keel.deploy.local import free_port_block

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (Path(sys.executable).parent / "supervisord").exists(), reason="supervisord is not installed"),
]


def test_up_failover_status_down(tmp_path, capsys):
    from keel.deploy import supervisor
    from keel.deploy.cli import cmd_status

    with open("deploy/examples/manager.toml", "rb") as f:
        data = tomllib.load(f)
    data["cluster"].update(run_dir=str(tmp_path / "run"), base_port=free_port_block())
    spec = load_spec(data)
    probe = ManagerClient([s.config.endpoint for s in spec.role("manager")])
    pids: list[int] = []
    try:
        supervisor.up(spec, wait_s=60, out=None)
        server = supervisor.rpc(spec.run_dir)
        procs = {p["name"]: p for p in server.supervisor.getAllProcessInfo()}
        pids[:] = [server.supervisor.getPID(), *(p["pid"] for p in procs.values() if p["pid"])]
        assert wait_until(lambda: probe.call("snapshot")["groups"].get("dispatcher", {}).get("holder") == "dispatcher",
                          timeout_s=30)
        with Client(spec.client_endpoints, timeout_ms=5000, retries=0) as client:
            x = np.arange(8, dtype=np.float32)
            assert client.predict("noop", x).source == "model"

            os.kill(procs["dispatcher"]["pid"], signal.SIGKILL)
            snap = wait_until(lambda: (s := probe.call("snapshot"))["groups"]["dispatcher"]["holder"] == "dispatcher-b"
                              and s, timeout_s=20)
            assert snap["groups"]["dispatcher"]["epoch"] == 2
            results = [client.predict("noop", x + i + 1) for i in range(20)]  # fresh inputs: no cache hit
            assert {r.source for r in results} == {"model"}
            # supervisord restarted the old dispatcher: it registered again and waits as a standby
            assert wait_until(lambda: supervisor.rpc(spec.run_dir).supervisor.getProcessInfo("dispatcher")["pid"]
                              not in (0, procs["dispatcher"]["pid"]), timeout_s=20)
            assert wait_until(lambda: probe.call("snapshot")["services"]["dispatcher"]["role"] == "standby", timeout_s=10)

        capsys.readouterr()
        assert cmd_status(argparse.Namespace(spec=data, address=None, timeout=1.0, json=False)) == 0
        out = capsys.readouterr().out
        assert "the manager's view" in out and "dispatcher-b" in out
        assert "dispatcher -> dispatcher-b at epoch 2" in out
    finally:
        probe.close()
        supervisor.down(spec, out=None)
        for pid in pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            os.kill(pid, signal.SIGKILL)

