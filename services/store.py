"""The store service: a host's model store served by content to hosts that lack a version.

A worker whose own store lacks the (model, version) it must serve asks a store service
(``common.modelfetch``) for the version's listing -- its manifest and every file's size
and sha256 -- then reads the files in chunks, checks each digest and only then writes the
version into its own store. ``keel model add --publish`` and ``keel model publish`` send
a version the other way (PUT chunks, then COMMIT), to every replica of the service.

What this service never does is hand out a file that does not match its manifest: a
version whose copy here is damaged is refused at LIST with the reason, and a published
version is written only after every file's sha256 matches, all or nothing (a staging
folder renamed into place). Wire format: ``common.protocol.store``.

Example
-------
::

    keel serve store --config '{"endpoint": "tcp://0.0.0.0:7400", "store": "store"}'
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import orjson
import zmq

from keel.common import transport
from keel.common.config import StoreConfig
from keel.common.modelstore import Manifest, ModelStore, ModelStoreError, sha256_file, version_files
from keel.common.protocol import store as wire
from keel.common.spec.tables import NAME
from keel.services.base import Service

#: the largest frame the store takes: a PUT chunk (clients send at most max_chunk_bytes)
MAX_FRAME = 64 << 20


class StoreService(Service):
    role = "store"

    def __init__(self, cfg: StoreConfig):
        super().__init__(cfg.name, cfg.metrics_port)
        self.cfg = cfg
        self.store = ModelStore(cfg.store)
        self.router = self.add_socket(
            transport.make_socket(self.ctx, zmq.ROUTER, bind=cfg.endpoint, max_frame_bytes=MAX_FRAME), self._on_request)
        self.serve_status(cfg.status_endpoint)
        #: (path, size, mtime_ns) -> sha256: a listing re-reads a file only when it changed
        self.digests: dict[tuple[str, int, int], str] = {}
        self.counts = {"listed": 0, "chunks": 0, "bytes_out": 0, "published": 0, "refused": 0}

    # ------------------------------------------------------------------ requests
    def _on_request(self, sock: zmq.Socket) -> None:
        for _ in range(100):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            envelope, body = frames[:1], frames[1:]  # DEALER peers: identity, then the request
            request_id = body[1] if len(body) > 1 else b""
            try:
                rid, op, args = wire.parse_request(body)
                reply = wire.ok(rid, *self._handle(op, args))
            except (wire.StoreWireError, ModelStoreError, ValueError, OSError) as exc:
                self.counts["refused"] += 1
                self.log.warning("store request refused", error=str(exc))
                reply = wire.error(request_id, str(exc))
            transport.try_send_frames(sock, envelope + reply)

    def _handle(self, op: bytes, args: list) -> list[bytes]:
        name, version = args[0], args[1]
        if not NAME.match(name) or not (version == "latest" or version.isdigit()):
            raise wire.StoreWireError(f"bad model name or version {name!r}/{version!r}")
        if op == wire.LIST:
            return self._list(name, version)
        if op == wire.READ:
            return [self._read(name, version, args[2], int(args[3]), int(args[4]))]
        if op == wire.PUT:
            self._put(name, version, args[2], int(args[3]), args[4])
            return []
        self._commit(name, version, args[2], args[3])
        return []

    def _digest(self, path: Path) -> str:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in self.digests:
            self.digests[key] = sha256_file(path)
        return self.digests[key]

    def _list(self, name: str, version: str) -> list[bytes]:
        manifest = self.store.manifest(name, version)
        folder = self.store.folder(manifest)
        raw = (folder / wire.MANIFEST).read_bytes()
        files = {wire.MANIFEST: {"size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}}
        for file, want in version_files(manifest).items():
            path = folder / file
            if not path.is_file():
                raise ModelStoreError(f"{name}/{manifest.version}: {file} is missing from this store")
            digest = self._digest(path)
            if digest != want:  # a damaged copy here is refused, never served
                raise ModelStoreError(f"{name}/{manifest.version}: this store's {file} has sha256 {digest[:12]}..., "
                                      f"its manifest says {want[:12]}...; restore it or publish the version again")
            files[file] = {"size": path.stat().st_size, "sha256": digest}
        self.counts["listed"] += 1
        return [raw, orjson.dumps({"version": manifest.version, "files": files})]

    def _read(self, name: str, version: str, file: str, offset: int, length: int) -> bytes:
        manifest = self.store.manifest(name, version)
        if file != wire.MANIFEST and file not in version_files(manifest):
            raise wire.StoreWireError(f"{name}/{manifest.version} has no file {file!r}")
        if offset < 0 or length <= 0:
            raise wire.StoreWireError(f"READ: bad offset {offset} or length {length}")
        with open(self.store.folder(manifest) / file, "rb") as f:
            f.seek(offset)
            data = f.read(min(length, self.cfg.max_chunk_bytes))  # a bigger ask gets one chunk: the reader goes on
        self.counts["chunks"] += 1
        self.counts["bytes_out"] += len(data)
        return data

    # ------------------------------------------------------------------ publishing
    def _staging(self, name: str, version: str) -> Path:
        return self.store.root / name / f".publish-{version}"

    def _put(self, name: str, version: str, file: str, offset: int, data: bytes) -> None:
        if "/" in file or file.startswith(".") or file == wire.MANIFEST or offset < 0:
            raise wire.StoreWireError(f"PUT: bad file {file!r} or offset {offset}")
        folder = self._staging(name, version)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / file
        with open(path, "r+b" if path.exists() else "wb") as f:
            f.seek(offset)
            f.write(data)

    def _commit(self, name: str, version: str, raw: bytes, listing_raw: str) -> None:
        listing = orjson.loads(listing_raw)
        files = listing["files"]
        if files.get(wire.MANIFEST, {}).get("sha256") != hashlib.sha256(raw).hexdigest():
            raise ModelStoreError(f"{name}/{version}: the manifest's bytes do not match their sha256: resend")
        manifest = Manifest.from_json(raw)
        if (manifest.name, manifest.version) != (name, version):
            raise ModelStoreError(f"COMMIT {name}/{version} carries the manifest of {manifest.name}/{manifest.version}")
        target = self.store.root / name / version
        if (target / wire.MANIFEST).is_file():  # published before: the same content is no change
            have = self.store.manifest(name, version)
            if version_files(have) != version_files(manifest):
                raise ModelStoreError(f"{name}/{version} exists here with other content; a version never changes")
            shutil.rmtree(self._staging(name, version), ignore_errors=True)
            return
        if target.exists():
            raise ModelStoreError(f"{name}/{version} was removed from this store; its number is not reused")
        staging = self._staging(name, version)
        for file, want in version_files(manifest).items():
            path = staging / file
            digest = sha256_file(path) if path.is_file() else "missing"
            if digest != want or files.get(file, {}).get("sha256") != want:
                raise ModelStoreError(f"{name}/{version}: {file} arrived with sha256 {digest[:12]}..., "
                                      f"the manifest says {want[:12]}...; publish it again")
        (staging / wire.MANIFEST).write_bytes(raw)
        os.replace(staging, target)  # all or nothing: the version appears with every file checked
        self.counts["published"] += 1
        self.log.info("version published", model=name, version=version)

    def status(self) -> dict:
        models = {m: self.store.versions(m) for m in self.store.models()}
        return {**super().status(), "endpoint": self.cfg.endpoint, "store": str(self.store.root), "models": models,
                **self.counts}

