"""ZeroMQ CURVE on Keel's sockets: encryption and an allow-list of public keys (ZAP).

A keys folder (``keel keys generate DIR``) holds::

    DIR/service.key,  service.key_secret    the keypair of Keel's own processes
    DIR/operator.key, operator.key_secret   the operators' keypair: what ``keel up``,
                                            ``status``, ``predict`` and ``model rollout`` use
    DIR/client.key,   client.key_secret     a client keypair (``--client NAME`` names others)
    DIR/allowed/*.key                       public keys that may connect (all of the above)

Secret files are 0600 and the folder 0700. When a process uses CURVE (``use(DIR)``:
``keel serve --curve DIR``, which a spec with ``[cluster] curve_keys`` passes to every
service), every socket ``common.transport.make_socket`` makes is a CURVE socket: one that
binds is a CURVE server whose connections pyzmq's ``ThreadAuthenticator`` (ZAP) admits
only with a key in ``DIR/allowed``, and logs each refusal; one that connects is a CURVE
client of the service public key. A stranger's handshake fails, so it gets nothing and
sends nothing the service reads; the service goes on serving everyone else.

Example
-------
>>> keys = generate("keys")                                   # doctest: +SKIP
>>> use("keys")              # this process: Keel service key  # doctest: +SKIP
>>> Client(endpoints, curve_keys="keys")  # a client's keypair  # doctest: +SKIP
"""
from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import structlog
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator



class CurveError(RuntimeError):
    """A keys folder that is missing, incomplete or readable by others."""


@dataclass(frozen=True)
class Keys:
    """What one process needs: its keypair, the service public key, the allow-list folder."""

    public: bytes
    secret: bytes
    server_public: bytes
    allowed: Path


#: the keypair Keel's own command line talks to a cluster with (``use_for_spec``)
OPERATOR = "operator"


def generate(folder: str | os.PathLike, clients: tuple[str, ...] = ("client",)) -> list[Path]:
    """Write the service keypair, the operators' keypair and one keypair per client name,
    with the allow-list; returns the files written. Existing keypairs are kept (a second
    run adds clients, and the operators' keypair to a folder made without one)."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    allowed = root / "allowed"
    allowed.mkdir(exist_ok=True)
    written = []
    for name in dict.fromkeys(("service", OPERATOR, *clients)):
        public = root / f"{name}.key"
        if not public.is_file():
            zmq.auth.create_certificates(str(root), name)
            written += [public, root / f"{name}.key_secret"]
        (root / f"{name}.key_secret").chmod(0o600)
        shutil.copyfile(public, allowed / public.name)
        written.append(allowed / public.name)
    return written


def load(folder: str | os.PathLike, name: str = "service") -> Keys:
    """The keys of ``name`` (service, client or another client name) from a keys folder."""
    root = Path(folder)
    secret_file, server_file = root / f"{name}.key_secret", root / "service.key"
    for path in (secret_file, server_file):
        if not path.is_file():
            raise CurveError(f"{path} is missing: run `keel keys generate {root}`")
    if secret_file.stat().st_mode & 0o077:
        raise CurveError(f"{secret_file} is readable by others (mode {secret_file.stat().st_mode & 0o777:o}); chmod 600 it")
    public, secret = zmq.auth.load_certificate(str(secret_file))
    server_public, _ = zmq.auth.load_certificate(str(server_file))
    if secret is None:
        raise CurveError(f"{secret_file} holds no secret key")
    return Keys(public, secret, server_public, root / "allowed")


class _AllowList:
    """ZAP credentials provider: a key in the allowed folder passes; a refusal is logged."""

    def __init__(self, allowed: Path):
        self.allowed = allowed
        self.log = structlog.get_logger().bind(component="zap")  # the process's own log setup

    def keys(self) -> set[bytes]:
        found = set()
        for path in self.allowed.glob("*.key"):
            public, _ = zmq.auth.load_certificate(str(path))
            found.add(public)
        return found

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.keys():  # read at each handshake: a key added to allowed/ counts at once
            return True
        self.log.warning("refused a connection: its CURVE public key is not allowed", key=key.decode(), pid=os.getpid())
        return False


#: this process's keys (``use``); None = CURVE off
_ACTIVE: Keys | None = None
#: one authenticator per context (by its underlying handle), started at its first bind
_AUTHS: dict[int, ThreadAuthenticator] = {}
_LOCK = threading.Lock()


def use(folder: str | os.PathLike | None, name: str = "service") -> Keys | None:
    """Make every socket of this process a CURVE socket with ``name``'s keys (None: off)."""
    global _ACTIVE
    _ACTIVE = None if folder is None else load(folder, name)
    return _ACTIVE


def use_for_spec(spec) -> Keys | None:
    """This process talks to ``spec``'s cluster as its operator: the keys folder's operators'
    keypair when the spec turns CURVE on, nothing otherwise. A folder made before there was
    one gives its ``client`` keypair, if it has one; raises ``CurveError`` otherwise."""
    folder = getattr(spec, "curve_keys", None)
    if not folder:
        return None
    root = Path(folder)
    if not (root / f"{OPERATOR}.key_secret").is_file() and (root / "client.key_secret").is_file():
        return use(folder, "client")
    if not (root / f"{OPERATOR}.key_secret").is_file():
        raise CurveError(f"{root / (OPERATOR + '.key_secret')} is missing: `keel keys generate {root}` "
                         "adds the operators' keypair and keeps the keys already there")
    return use(folder, OPERATOR)


def active() -> Keys | None:
    return _ACTIVE


def apply(ctx: zmq.Context, sock: zmq.Socket, server: bool, keys: Keys) -> None:
    """Set ``sock``'s CURVE options: a server (it binds) checked by ZAP, or a client."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    if server:
        _authenticator(ctx, keys)
        sock.curve_server = True
    else:
        sock.curve_serverkey = keys.server_public


def _authenticator(ctx: zmq.Context, keys: Keys) -> None:
    handle = ctx.underlying
    with _LOCK:
        if handle in _AUTHS:
            return
        # an asyncio context gets a plain shadow: ZAP is per underlying context
        auth = ThreadAuthenticator(ctx if type(ctx) is zmq.Context else zmq.Context.shadow(handle))
        auth.start()
        auth.configure_curve_callback("*", credentials_provider=_AllowList(keys.allowed))
        _AUTHS[handle] = auth


def stop(ctx: zmq.Context) -> None:
    """Stop ``ctx``'s authenticator, if it has one (before ``ctx.term()``, which it would block)."""
    with _LOCK:
        auth = _AUTHS.pop(ctx.underlying, None)
    if auth is not None:
        auth.stop()
