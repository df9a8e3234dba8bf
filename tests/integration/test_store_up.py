"""``keel up`` with a ``[store]`` table on one machine (supervisord, real processes): the
store service starts first and serves its own folder; the workers' store starts empty,
the first worker fetches its version, checked, before it registers (the other finds it in the
shared store and says so); queries answer with it;
``keel status`` shows the store service. ``keel up --host`` across hosts: tests/chaos/test_multihost.py."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from keel.chaos.multihost import CONTAINER  # a query's first two features times the artifact's factor
from keel.common.modelstore import ModelStore
from keel.common.spec import load_spec
from keel.deploy.local import free_port_block

pytestmark = pytest.mark.slow


def test_up_with_a_store_service_fetches_into_an_empty_store(tmp_path):
    from keel.common.client import Client
    from keel.deploy import supervisor

    published = ModelStore(tmp_path / "published")
    (tmp_path / "scale.py").write_text(CONTAINER)
    (tmp_path / "f.txt").write_text("2.5")
    published.add("scale", tmp_path / "f.txt", "python", entry=f"{tmp_path / 'scale.py'}:Scale", input_shape=[4],
                  output_size=2)
    spec = load_spec({"cluster": {"name": "storeup", "run_dir": str(tmp_path / "run"), "store": str(tmp_path / "store"),
                                  "base_port": free_port_block()},
                      "store": {"root": str(published.root)}, "models": {"scale": {"workers": 2}}})
    assert [s.name for s in spec.services][:1] == ["store-1"]
    pids = []
    try:
        supervisor.up(spec, wait_s=60, out=None)
        server = supervisor.rpc(spec.run_dir)
        pids = [server.supervisor.getPID()] + [p["pid"] for p in server.supervisor.getAllProcessInfo() if p["pid"]]
        assert ModelStore(spec.store).has("scale", "1")  # fetched: the workers' store started empty
        # the two workers share this machine's store: the first to start fetches, the other finds it there
        logs = [supervisor.log_tail(spec.run_dir, name, lines=50) for name in ("worker-scale-0", "worker-scale-1")]
        assert any("model fetched" in log for log in logs), logs
        assert all("model fetched" in log or "model already in the store" in log for log in logs), logs
        with Client(spec.client_endpoints) as client:
            result = client.predict("scale", np.array([1, 2, 3, 4], np.float32), timeout_ms=5000)
        assert result.error is None and result.version == "1"
        np.testing.assert_allclose(result.output, [2.5, 5.0])
        st = supervisor.status(spec)
        assert st["info"]["store-1"]["models"] == {"scale": ["1"]}
    finally:
        try:
            supervisor.down(spec, out=None)
        except supervisor.DeployError:  # down could not stop them: ours, killed by pid
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
