"""Models by content: fetch a version from a store service into this host's store, or
publish one to it (``services.store``; wire format ``common.protocol.store``).

A worker that must serve (model, version) and lacks it locally calls ``ensure`` before it
loads the model: the listing (manifest + every file's size and sha256) comes from the
first store replica that answers, each file is read in chunks into a staging folder, its
sha256 checked against both the listing and the manifest, and the folder renamed into
place with the manifest written last -- all or nothing, so a reader of the store never
sees half a version. A corrupted or partial transfer raises ``TransferError`` and is
retried; a store service that does not answer delays the start with one log line per try
(``StoreUnreachable``), never a guess.

Example
-------
>>> client = StoreClient(["tcp://10.0.0.1:7400"])                    # doctest: +SKIP
>>> manifest = fetch(client, ModelStore("store"), "digits-mlp", "2")  # doctest: +SKIP
>>> publish(StoreClient(eps), ModelStore("store"), "digits-mlp", "2")  # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import zmq

from keel.common import transport
from keel.common.modelstore import Manifest, ModelStore, ModelStoreError, version_files
from keel.common.protocol import store as wire

#: bytes asked for per READ (the service answers at most its max_chunk_bytes)
CHUNK = 1 << 20


class StoreUnreachable(RuntimeError):
    """No store replica answered in time: the version may exist, nobody can say."""


class StoreRefused(RuntimeError):
    """A store replica answered that it cannot serve or take the version (unknown, damaged
    there, exists with other content): the reason is the service's."""


class TransferError(RuntimeError):
    """What arrived does not match its sha256 or size (a corrupted or partial transfer):
    nothing of it is kept, and the fetch is tried again."""


class StoreClient:
    """Requests to store replicas over one DEALER at a time (zguide lazy pirate): a request
    that times out closes the socket and goes to the next replica."""

    def __init__(self, endpoints: list[str], timeout_s: float = 2.0, ctx: zmq.Context | None = None,
                 curve_keys: Any = None):
        if not endpoints:
            raise ValueError("a store client needs at least one store endpoint")
        self.endpoints, self.timeout_s = list(endpoints), timeout_s
        self.curve_keys = curve_keys  # None: this process's (common.curve.active())
        self.ctx = ctx or zmq.Context.instance()
        self.turn = 0  # the replica asked first: the one that answered last
        self.sock: zmq.Socket | None = None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def call(self, op: bytes, *args: str | bytes | int) -> list[bytes]:
        """The OK payload of ``op`` from the first replica that answers; ``StoreRefused``
        when one answers ERROR, ``StoreUnreachable`` when none answers."""
        for i in range(len(self.endpoints)):
            endpoint = self.endpoints[(self.turn + i) % len(self.endpoints)]
            reply = self._ask(endpoint, op, args)
            if reply is None:
                continue
            self.turn = (self.turn + i) % len(self.endpoints)
            status, payload = reply
            if status == wire.ERROR:
                raise StoreRefused(f"store {endpoint}: {payload[0].decode(errors='replace') if payload else '?'}")
            return payload
        raise StoreUnreachable(f"no store service answered within {self.timeout_s:g} s (asked {', '.join(self.endpoints)})")

    def _ask(self, endpoint: str, op: bytes, args: tuple) -> tuple[bytes, list[bytes]] | None:
        if self.sock is None or self.sock.getsockopt_string(zmq.LAST_ENDPOINT) != endpoint:
            self.close()
            self.sock = transport.make_socket(self.ctx, zmq.DEALER, connect=endpoint, curve_keys=self.curve_keys)
        rid = uuid.uuid4().bytes
        self.sock.send_multipart(wire.request(rid, op, *args))
        deadline = time.monotonic() + self.timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000) + 1):
                break
            frames = self.sock.recv_multipart()
            if len(frames) >= 2 and frames[0] == rid and frames[1] in (wire.OK, wire.ERROR):
                return frames[1], frames[2:]
            # an answer to an earlier, timed-out request, or one mangled in flight: not ours
        self.close()  # a confused or silent socket is replaced, not nursed
        return None

    def listing(self, name: str, version: str | None) -> tuple[bytes, dict]:
        """(manifest.json's bytes, listing) of a version ("latest" when None)."""
        raw, listing = self.call(wire.LIST, name, version or "latest")
        try:
            return raw, orjson.loads(listing)
        except orjson.JSONDecodeError:
            raise TransferError(f"{name}/{version}: the listing arrived damaged") from None

    def manifest(self, name: str, version: str | None) -> Manifest:
        """A version's manifest, checked against its sha256 in the listing."""
        raw, listing = self.listing(name, version)
        return _checked_manifest(raw, listing, name)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _checked_manifest(raw: bytes, listing: dict, name: str) -> Manifest:
    files = listing.get("files") if isinstance(listing, dict) else None
    if not isinstance(files, dict) or files.get(wire.MANIFEST, {}).get("sha256") != _sha(raw):
        raise TransferError(f"{name}: the manifest does not match the sha256 its listing gives (damaged in flight)")
    try:
        manifest = Manifest.from_json(raw)
    except (orjson.JSONDecodeError, TypeError):
        raise TransferError(f"{name}: the manifest is unreadable") from None
    if manifest.name != name or manifest.version != listing.get("version"):
        raise TransferError(f"{name}: asked for {name}, the listing names {manifest.name}/{manifest.version}")
    return manifest


class Manifests:
    """Manifests for a cluster spec's model tables: from the local store, else (a host whose
    store starts empty) from the store service, checked like every listing."""

    def __init__(self, root: str | os.PathLike, endpoints: list[str] | None = None,
                 served: str | os.PathLike | None = None, curve_keys: str | None = None):
        self.local, self.endpoints = ModelStore(root), list(endpoints or [])
        #: the spec's keys folder: the store service is asked as the operator, as keel's commands do
        self.curve_keys = curve_keys
        #: the folder the store service serves, when it is on this machine (the store's own
        #: host resolves its spec before its store service runs)
        self.served = ModelStore(served) if served and Path(served).is_dir() else None

    def has(self, name: str) -> bool:
        return self.local.has(name) or (self.served is not None and self.served.has(name))

    def manifest(self, name: str, version: str | None = None) -> Manifest:
        try:
            return self.local.manifest(name, version)
        except ModelStoreError as missing:
            if self.served is not None and self.served.has(name, version):
                return self.served.manifest(name, version)
            if not self.endpoints:
                raise
            try:
                from keel.common import curve

                keys = curve.load(self.curve_keys, curve.OPERATOR) if self.curve_keys else None
                with StoreClient(self.endpoints, curve_keys=keys) as client:
                    return client.manifest(name, version)
            except curve.CurveError as exc:
                raise ModelStoreError(f"{missing}; the store service cannot be asked: {exc}") from None
            except StoreRefused as exc:
                raise ModelStoreError(f"not in the local store at {self.local.root}, and {exc}") from None
            except (StoreUnreachable, TransferError) as exc:
                raise ModelStoreError(f"{missing}; the store service could not say either ({exc}): "
                                      "bring the store's host up first") from None


def fetch(client: StoreClient, store: ModelStore, name: str, version: str | None) -> Manifest:
    """Copy one version from the store service into ``store``, every file checked; returns
    its manifest. A version already there is left as it is."""
    if version not in (None, "latest") and store.has(name, version):
        return store.manifest(name, version)
    raw, listing = client.listing(name, version)
    manifest = _checked_manifest(raw, listing, name)
    if store.has(name, manifest.version):
        return store.manifest(name, manifest.version)
    parent = store.root / name
    parent.mkdir(parents=True, exist_ok=True)
    staging = parent / f".fetch-{manifest.version}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    staging.mkdir()
    try:
        for file, want in version_files(manifest).items():
            size = listing["files"].get(file, {}).get("size")
            if listing["files"].get(file, {}).get("sha256") != want or not isinstance(size, int):
                raise TransferError(f"{name}/{manifest.version}: the listing's {file} disagrees with the manifest")
            _read_file(client, name, manifest.version, file, size, want, staging / file)
        with open(staging / wire.MANIFEST, "wb") as f:  # last: a version exists once its manifest does
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        target = parent / manifest.version
        try:
            os.rename(staging, target)
        except OSError:
            if not store.has(name, manifest.version):  # not another worker of this host, done first
                raise ModelStoreError(f"{target} exists and holds no version (removed here?): not overwritten")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return store.manifest(name, manifest.version)


def _read_file(client: StoreClient, name: str, version: str, file: str, size: int, sha256: str, path: Path) -> None:
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        offset = 0
        while offset < size:
            (data,) = client.call(wire.READ, name, version, file, offset, min(CHUNK, size - offset))
            if not data:
                raise TransferError(f"{name}/{version}: {file} ended at {offset} of {size} bytes (partial transfer)")
            digest.update(data)
            f.write(data)
            offset += len(data)
        f.flush()
        os.fsync(f.fileno())
    if offset != size or digest.hexdigest() != sha256:
        raise TransferError(f"{name}/{version}: {file} arrived with sha256 {digest.hexdigest()[:12]}... "
                            f"({offset} bytes), expected {sha256[:12]}... ({size} bytes): refused")


def ensure(store: ModelStore, name: str, version: str | None, endpoints: list[str], *,
           log: Callable[..., Any] | None = None, deadline_s: float | None = None,
           stop: Callable[[], bool] = lambda: False, backoff_s: float = 0.5, max_backoff_s: float = 5.0) -> Manifest:
    """The version in ``store``, fetched from the store service when it is missing, tried
    until it is there (``deadline_s`` None: for ever, as a worker at start-up does) or
    ``stop()``. ``log(event, **fields)`` hears where the version came from (fetched, or
    already in the store: on one machine, the workers share a store and the first fetches)
    and every failed try: why, and when the next is."""
    if version not in (None, "latest") and store.has(name, version):
        if log is not None:
            log("model already in the store", model=name, version=version, store=str(store.root))
        return store.manifest(name, version)
    end = None if deadline_s is None else time.monotonic() + deadline_s
    wait, tries = backoff_s, 0
    with StoreClient(endpoints) as client:
        while True:
            tries += 1
            try:
                manifest = fetch(client, store, name, version)
                if log is not None:
                    log("model fetched", model=name, version=manifest.version, tries=tries, store=str(store.root))
                return manifest
            except TransferError as exc:  # a damaged transfer is refused and tried again at once
                why, event, pause = str(exc), "model transfer refused, retrying", 0.05
            except (StoreUnreachable, StoreRefused) as exc:  # refused: not there (yet), it may be published soon
                why, pause = str(exc), wait
                event = ("store service unreachable: start delayed" if isinstance(exc, StoreUnreachable)
                         else "store service cannot serve the model yet: start delayed")
                wait = min(wait * 2, max_backoff_s)
            if end is not None and time.monotonic() + pause > end:
                raise StoreUnreachable(f"{name}/{version or 'latest'} not fetched after {tries} tries: {why}")
            if log is not None:
                log(event, model=name, version=version or "latest", error=why, retry_in_s=round(pause, 2), tries=tries)
            if _sleep_unless(pause, stop):
                raise StoreUnreachable(f"{name}/{version or 'latest'}: stopped while waiting for the store service")


def _sleep_unless(seconds: float, stop: Callable[[], bool]) -> bool:
    """Sleep ``seconds`` in short steps; True (at once) when ``stop()`` says so."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if stop():
            return True
        time.sleep(min(0.05, left))
    return stop()


def fetch_for_worker(cfg: Any, log: Callable[..., Any], **options: Any) -> Manifest:
    """``ensure`` for a worker's config (``WorkerConfig``): its store, model and version."""
    return ensure(ModelStore(cfg.store), cfg.store_name or cfg.model, cfg.version, cfg.store_endpoints, log=log, **options)


def publish(client: StoreClient, store: ModelStore, name: str, version: str | None) -> Manifest:
    """Send one version of ``store`` to the store service the client talks to (every file
    checked here first; the service checks them again before it writes the version)."""
    manifest = store.manifest(name, version)
    store.artifact(manifest)  # refuses a local copy that does not match its manifest
    folder = store.folder(manifest)
    raw = (folder / wire.MANIFEST).read_bytes()
    files = {wire.MANIFEST: {"size": len(raw), "sha256": _sha(raw)}}
    for file, sha256 in version_files(manifest).items():
        path = folder / file
        files[file] = {"size": path.stat().st_size, "sha256": sha256}
        with open(path, "rb") as f:
            offset = 0
            while data := f.read(CHUNK):
                client.call(wire.PUT, name, manifest.version, file, offset, data)
                offset += len(data)
    client.call(wire.COMMIT, name, manifest.version, raw, orjson.dumps({"version": manifest.version, "files": files}))
    return manifest


def publish_all(endpoints: list[str], store: ModelStore, name: str, version: str | None) -> Manifest:
    """``publish`` to each replica in turn (each keeps its own copy)."""
    manifest = None
    for endpoint in endpoints:
        with StoreClient([endpoint], timeout_s=10.0) as client:
            manifest = publish(client, store, name, version)
    assert manifest is not None
    return manifest
