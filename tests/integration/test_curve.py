"""CURVE on every Keel socket (``[cluster] curve_keys``): real processes, real handshakes.

An allowed client gets predictions; a stranger (it knows the service's public key, its own
is not allowed) gets nothing, the frontend logs the refusal and keeps serving; a worker
with a key that is not allowed cannot register; and the bytes on the wire, captured by a
relay between client and frontend, carry no plaintext of the request."""
from __future__ import annotations

import shutil
import socket
import threading

import numpy as np
import pytest

from keel.common import curve
from keel.common.client import Client
from keel.common.protocol import ErrorCode, Source
from keel.common.spec import ServiceLaunch, load_spec
from keel.common.transport import request_status
from keel.common.waiting import wait_until
from keel.deploy.keel import main as keel
from keel.deploy.local import free_port, free_port_block
from tests.support.curve import cluster_and_stranger

pytestmark = pytest.mark.slow

DIM = 4


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder, stranger = cluster_and_stranger(tmp_path_factory.mktemp("keys"))
    for name in ("service", "client"):
        assert (folder / f"{name}.key_secret").stat().st_mode & 0o777 == 0o600
    assert folder.stat().st_mode & 0o777 == 0o700
    return folder, stranger


@pytest.fixture(scope="module")
def cluster(keys, module_launcher):
    folder, _ = keys
    run = module_launcher("curve")
    curve.use(folder, "client")  # this process's readiness checks are CURVE clients too
    try:
        spec = load_spec({"cluster": {"name": "curve", "base_port": free_port_block(), "run_dir": str(run.log_dir),
                                      "curve_keys": str(folder)},
                          "frontend": {"cache_size": 0}, "gateway": {"http_port": free_port()},
                          "models": {"echo": {"builtin": "sleep", "input_shape": [DIM], "output_size": DIM}}})
        assert all(s.curve_keys == str(folder) for s in spec.services)
        run.start_spec(spec)
        yield run, spec
    finally:
        curve.use(None)


def test_allowed_client_served_stranger_refused_and_logged(keys, cluster):
    folder, stranger = keys
    run, spec = cluster
    x = np.arange(DIM, dtype=np.float32)
    with Client(spec.client_endpoints, timeout_ms=5000, curve_keys=str(folder)) as client:
        r = client.predict("echo", x)
        assert r.source == Source.MODEL and np.allclose(r.output, x)
    with Client(spec.client_endpoints, timeout_ms=300, grace_ms=300, retries=0,
                curve_keys=str(stranger), curve_name="stranger") as client:
        r = client.predict("echo", x)
        assert r.source == Source.ERROR and r.error_code == ErrorCode.TIMEOUT  # nothing came back
    log = run.log_dir / "frontend.log"
    assert wait_until(lambda: "refused a connection" in log.read_text(), 10), log.read_text()[-2000:]
    with Client(spec.client_endpoints, timeout_ms=5000, curve_keys=str(folder)) as client:  # still serving
        assert client.predict("echo", x).source == Source.MODEL
    # a client without CURVE at all gets nothing either
    curve.use(None)
    try:
        with Client(spec.client_endpoints, timeout_ms=300, grace_ms=300, retries=0) as client:
            assert client.predict("echo", x).error_code == ErrorCode.TIMEOUT
    finally:
        curve.use(folder, "client")


def test_a_worker_with_a_key_not_allowed_cannot_register(keys, cluster, tmp_path):
    folder, _ = keys
    run, spec = cluster
    rogue_keys = tmp_path / "rogue"
    curve.generate(rogue_keys, ())  # its own "service" keypair, not the cluster's
    shutil.copyfile(folder / "service.key", rogue_keys / "service.key")  # it knows the public key
    genuine = spec.role("worker")[0]
    cfg = type(genuine.config)(**{**genuine.config.__dict__, "name": "rogue", "status_endpoint": None})
    run.start(ServiceLaunch("rogue", "worker", genuine.host, cfg, curve_keys=str(rogue_keys)))
    dispatcher = spec.service("dispatcher")
    log = run.log_dir / "dispatcher.log"
    assert wait_until(lambda: "refused a connection" in log.read_text(), 20), log.read_text()[-2000:]
    info = request_status(dispatcher.config.worker_endpoint, 2.0)
    assert info is not None and set(info["workers"]) == {genuine.name}


def test_the_gateway_is_a_curve_client_of_the_frontends(cluster):
    """Its status ROUTER (an asyncio context) answered the readiness check over CURVE; its
    AsyncClient reaches the frontends with the service key."""
    import orjson
    import urllib.request

    _, spec = cluster
    port = spec.service("gateway").config.http_port
    doc = {"inputs": [{"name": "input", "shape": [1, DIM], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/echo/infer", orjson.dumps(doc), timeout=30) as resp:
        assert orjson.loads(resp.read())["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]
    assert request_status(spec.service("gateway").config.status_endpoint, 2.0)["role"] == "gateway"


class Relay:
    """A TCP relay on loopback that keeps every byte it passes (a capture)."""

    def __init__(self, target_port: int):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.target = target_port
        self.captured = bytearray()
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
                if not data:
                    return
                with self.lock:
                    self.captured += data
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.server.close()
        for conn in self.conns:
            conn.close()


def test_the_wire_carries_no_plaintext(keys, cluster):
    folder, _ = keys
    _, spec = cluster
    relay = Relay(int(spec.client_endpoints[0].rsplit(":", 1)[1]))
    try:
        probe = np.full(DIM, 1234.5, np.float32)
        with Client(f"tcp://127.0.0.1:{relay.port}", timeout_ms=5000, curve_keys=str(folder)) as client:
            r = client.predict("echo", probe, request_id="plaintext-probe-42")
            assert r.source == Source.MODEL and np.allclose(r.output, probe)
        with relay.lock:
            captured = bytes(relay.captured)
    finally:
        relay.close()
    assert b"CURVE" in captured  # the ZMTP greeting names the mechanism: this is the stream
    for plain in (b"plaintext-probe", b"echo", b'"kind"', probe.tobytes()):
        assert plain not in captured


def test_keel_up_predict_and_down_with_curve(keys, tmp_path, capsys):
    """supervisord starts every service with --curve; keel predict talks CURVE with the client key."""
    import sys
    from pathlib import Path

    if not (Path(sys.executable).parent / "supervisord").exists():
        pytest.skip("supervisord is not installed")
    folder, _ = keys
    spec_file = tmp_path / "curve.toml"
    spec_file.write_text(f'[cluster]\nname = "curveup"\nbase_port = {free_port_block()}\nrun_dir = "{tmp_path / "run"}"\n'
                         f'curve_keys = "{folder}"\n'
                         '[models.noop]\nbuiltin = "noop"\ninput_shape = [2]\noutput_size = 2\n')
    try:
        assert keel(["up", str(spec_file), "--wait", "60"]) == 0
        assert f"--curve {folder}" in (tmp_path / "run" / "supervisord.conf").read_text()
        capsys.readouterr()
        assert keel(["predict", "--spec", str(spec_file), "noop", "--input", "[1, 2]"]) == 0
        assert '"source":"model"' in capsys.readouterr().out
    finally:
        assert keel(["down", str(spec_file), "--wait", "30"]) == 0
        curve.use(None)


def test_the_security_guide_as_written(tmp_path, monkeypatch, capsys):
    """docs/guide/security.md's steps, verbatim: named clients only, a relative keys folder;
    ``keel up`` talks with the operators' keypair, alice with hers."""
    import sys
    from pathlib import Path

    if not (Path(sys.executable).parent / "supervisord").exists():
        pytest.skip("supervisord is not installed")
    monkeypatch.chdir(tmp_path)
    assert keel(["keys", "generate", "keys/", "--client", "alice", "--client", "bob"]) == 0
    assert not Path("keys/client.key_secret").exists()  # nobody asked for a "client"
    Path("guide.toml").write_text(f'[cluster]\nname = "guide"\nbase_port = {free_port_block()}\nrun_dir = "run"\n'
                                  'curve_keys = "keys"\n'
                                  '[models.noop]\nbuiltin = "noop"\ninput_shape = [2]\noutput_size = 2\n')
    try:
        assert keel(["up", "guide.toml", "--wait", "60"]) == 0, capsys.readouterr().err
        assert keel(["status", "guide.toml"]) == 0
        spec = load_spec("guide.toml")
        with Client(spec.client_endpoints, timeout_ms=5000, curve_keys="keys", curve_name="alice") as client:
            assert client.predict("noop", np.ones(2, np.float32)).source == Source.MODEL
    finally:
        assert keel(["down", "guide.toml", "--wait", "30"]) == 0
        curve.use(None)
