"""Models by content: a real store service process serves versions to an empty store, every
file checked by sha256; a damaged copy or transfer is refused, never written; a worker
whose store service is down waits with a clear log line and registers only after the fetch."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from keel.chaos.multihost import CONTAINER  # a query's first two features times the artifact's factor
from keel.common import modelfetch, protocol
from keel.common.config import StoreConfig, WorkerConfig
from keel.common.modelfetch import StoreClient, StoreRefused, StoreUnreachable, TransferError, ensure, fetch, publish_all
from keel.common.modelstore import ModelStore, sha256_file
from keel.common.protocol import store as wire
from keel.common.spec import ServiceLaunch
from keel.deploy.local import free_port


def add_scale(root: Path, tmp: Path, factor: float, pad: int = 0) -> str:
    """A Python container version of "scale" (factor in its artifact, padded to ``pad`` bytes)."""
    (tmp / "scale.py").write_text(CONTAINER)
    artifact = tmp / f"factor-{factor}.txt"
    artifact.write_text(f"{factor}" + " " * pad)
    m = ModelStore(root).add("scale", artifact, "python", entry=f"{tmp / 'scale.py'}:Scale", input_shape=[4], output_size=2)
    return m.version


def store_service(launcher, root: Path, name: str = "store"):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    cfg = StoreConfig(name=name, endpoint=endpoint, store=str(root), status_endpoint=f"tcp://127.0.0.1:{free_port()}",
                      max_chunk_bytes=4096)
    run = launcher(name)
    run.start(ServiceLaunch(name, "store", "local", cfg))
    run.wait_status(cfg.status_endpoint, timeout_s=30)
    return run, endpoint


def same_version(a: ModelStore, b: ModelStore, name: str, version: str) -> None:
    fa, fb = a.root / name / version, b.root / name / version
    assert sorted(p.name for p in fa.iterdir()) == sorted(p.name for p in fb.iterdir())
    for path in fa.iterdir():
        assert sha256_file(path) == sha256_file(fb / path.name), path.name


def test_publish_then_fetch_into_an_empty_store(launcher, tmp_path):
    author, served, host = ModelStore(tmp_path / "author"), ModelStore(tmp_path / "served"), ModelStore(tmp_path / "host")
    v1 = add_scale(author.root, tmp_path, 2.0, pad=10_000)  # several chunks of 4 KiB
    _, endpoint = store_service(launcher, served.root)
    publish_all([endpoint], author, "scale", v1)
    same_version(author, served, "scale", v1)
    publish_all([endpoint], author, "scale", v1)  # the same content again: no change, no error

    with StoreClient([endpoint]) as client:
        manifest = fetch(client, host, "scale", None)
    assert manifest.version == v1
    same_version(author, host, "scale", v1)
    assert not [p for p in (host.root / "scale").iterdir() if p.name.startswith(".")]  # no staging left
    from keel.common.containers import store_predictor

    predictor = store_predictor(str(host.root), "scale", v1, 1)
    out = predictor.predict_batch(np.ones((3, 4), np.float32))
    assert np.allclose(out, 2.0)


def test_a_damaged_copy_at_the_store_is_refused_never_served(launcher, tmp_path):
    served, host = ModelStore(tmp_path / "served"), ModelStore(tmp_path / "host")
    v1 = add_scale(served.root, tmp_path, 3.0)
    _, endpoint = store_service(launcher, served.root)
    artifact = served.root / "scale" / v1 / "artifact"
    artifact.write_text("4.0")  # same size class, other content: its sha256 no longer matches
    with StoreClient([endpoint]) as client, pytest.raises(StoreRefused, match="sha256"):
        fetch(client, host, "scale", v1)
    assert not host.has("scale")
    with pytest.raises(StoreUnreachable, match="not fetched"):
        ensure(host, "scale", v1, [endpoint], deadline_s=1.0, backoff_s=0.1)
    assert not host.has("scale") and not list((host.root / "scale").glob("*/artifact"))


def test_a_transfer_damaged_in_flight_is_refused_and_retried(launcher, tmp_path, monkeypatch):
    served, host = ModelStore(tmp_path / "served"), ModelStore(tmp_path / "host")
    v1 = add_scale(served.root, tmp_path, 5.0, pad=6000)
    _, endpoint = store_service(launcher, served.root)
    real_call, damaged = StoreClient.call, []

    def flip_first_chunk(self, op, *args):
        payload = real_call(self, op, *args)
        if op == wire.READ and not damaged:  # one byte flipped on the way, once
            data = bytearray(payload[0])
            data[len(data) // 2] ^= 0x01
            damaged.append(args)
            return [bytes(data)]
        return payload

    monkeypatch.setattr(StoreClient, "call", flip_first_chunk)
    with StoreClient([endpoint]) as client, pytest.raises(TransferError, match="refused"):
        fetch(client, host, "scale", v1)
    assert not host.has("scale") and not [p for p in (host.root / "scale").iterdir()]  # nothing of it kept

    damaged.clear()
    heard = []
    manifest = ensure(host, "scale", v1, [endpoint], log=lambda event, **kv: heard.append(event))
    assert damaged and manifest.version == v1
    assert heard == ["model transfer refused, retrying", "model fetched"]
    same_version(served, host, "scale", v1)


def test_a_partial_transfer_is_refused(launcher, tmp_path, monkeypatch):
    served, host = ModelStore(tmp_path / "served"), ModelStore(tmp_path / "host")
    v1 = add_scale(served.root, tmp_path, 5.0, pad=6000)
    _, endpoint = store_service(launcher, served.root)
    real_call = StoreClient.call

    def short(self, op, *args):
        payload = real_call(self, op, *args)
        return [b""] if op == wire.READ and int(args[3]) > 0 else payload  # the file stops after its first chunk

    monkeypatch.setattr(StoreClient, "call", short)
    with StoreClient([endpoint]) as client, pytest.raises(TransferError, match="partial"):
        fetch(client, host, "scale", v1)
    assert not host.has("scale")


def test_a_second_replica_answers_when_the_first_is_down(launcher, tmp_path):
    served, host = ModelStore(tmp_path / "served"), ModelStore(tmp_path / "host")
    v1 = add_scale(served.root, tmp_path, 7.0)
    _, endpoint = store_service(launcher, served.root)
    down = f"tcp://127.0.0.1:{free_port()}"
    with StoreClient([down, endpoint], timeout_s=0.5) as client:
        assert fetch(client, host, "scale", v1).version == v1


def test_a_worker_waits_for_the_store_then_fetches_and_registers(launcher, tmp_path, zsock):
    served, host = ModelStore(tmp_path / "served"), ModelStore(tmp_path / "host")
    v1 = add_scale(served.root, tmp_path, 2.0)
    store_port = free_port()
    endpoint = f"tcp://127.0.0.1:{store_port}"
    dispatcher = zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*")
    cfg = WorkerConfig(name="w-fetch", model="scale", version=v1, store=str(host.root), store_endpoints=[endpoint],
                       dispatcher_worker_endpoint=dispatcher.getsockopt_string(zmq.LAST_ENDPOINT))
    run = launcher("worker")
    run.start(ServiceLaunch("w-fetch", "worker", "local", cfg))
    log = run.log_path("w-fetch")

    def said(text: str, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if log.is_file() and text in log.read_text():
                return True
            time.sleep(0.1)
        return False

    assert said("store service unreachable: start delayed", 30), log.read_text()
    assert not dispatcher.poll(300), "a worker without its model registered"
    assert not host.has("scale")

    scfg = StoreConfig(endpoint=endpoint, store=str(served.root), status_endpoint=f"tcp://127.0.0.1:{free_port()}")
    launcher("store").start(ServiceLaunch("store", "store", "local", scfg))
    assert dispatcher.poll(30_000), "the worker did not register after the store came up"
    first = protocol.decode(dispatcher.recv_multipart()[1:])
    assert isinstance(first, protocol.Register) and first.model == "scale"
    assert said("model fetched", 5)
    same_version(served, host, "scale", v1)


def test_wire_requests_are_checked():
    with pytest.raises(wire.StoreWireError):
        wire.parse_request([b"nope", b"r", wire.LIST, b"m", b"1"])
    with pytest.raises(wire.StoreWireError, match="takes 2"):
        wire.parse_request(wire.request(b"r", wire.LIST, "m"))
    assert modelfetch.CHUNK >= 4096


def test_keel_model_add_publish_and_fetch_commands(launcher, tmp_path, capsys):
    from keel.deploy.keel import main as keel

    served = ModelStore(tmp_path / "served")
    _, endpoint = store_service(launcher, served.root)
    (tmp_path / "scale.py").write_text(CONTAINER)
    (tmp_path / "f.txt").write_text("4.0")
    assert keel(["model", "add", "scale", str(tmp_path / "f.txt"), "--python", f"{tmp_path / 'scale.py'}:Scale",
                 "--input-shape", "4", "--store", str(tmp_path / "author"), "--publish", endpoint]) == 0
    assert f"published scale version 1 to {endpoint}" in capsys.readouterr().out
    same_version(ModelStore(tmp_path / "author"), served, "scale", "1")
    assert keel(["model", "fetch", "scale", "--from", endpoint, "--store", str(tmp_path / "host")]) == 0
    same_version(served, ModelStore(tmp_path / "host"), "scale", "1")
    # a version that exists at the store with other content is refused, never replaced
    other = ModelStore(tmp_path / "other")
    add_scale(other.root, tmp_path, 9.0)
    assert keel(["model", "publish", "scale", "--to", endpoint, "--store", str(other.root)]) == 1
    assert "other content" in capsys.readouterr().err
    same_version(ModelStore(tmp_path / "author"), served, "scale", "1")


def test_with_curve_only_holders_of_the_keys_fetch(launcher, tmp_path):
    from keel.common import curve

    served = ModelStore(tmp_path / "served")
    v1 = add_scale(served.root, tmp_path, 2.0)
    keys = tmp_path / "keys"
    curve.generate(keys)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    cfg = StoreConfig(endpoint=endpoint, store=str(served.root), status_endpoint=f"tcp://127.0.0.1:{free_port()}")
    run = launcher("store")
    run.start(ServiceLaunch("store", "store", "local", cfg, curve_keys=str(keys)))
    try:
        with pytest.raises(StoreUnreachable):  # a plain socket gets no answer from a CURVE store
            ensure(ModelStore(tmp_path / "plain"), "scale", v1, [endpoint], deadline_s=2.5, backoff_s=0.2)
        curve.use(keys, "service")  # what a worker of the cluster holds
        assert ensure(ModelStore(tmp_path / "host"), "scale", v1, [endpoint], deadline_s=20).version == v1
    finally:
        curve.use(None)
    same_version(served, ModelStore(tmp_path / "host"), "scale", v1)
