"""The HTTP gateway with TLS and a bearer-token allow-list: real gateway, frontend,
dispatcher and worker processes; a self-signed certificate made here; clients that trust
only it (urllib and the unmodified ``tritonclient[http]``)."""
from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import orjson
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from keel.common.spec import load_spec
from keel.deploy.local import free_port, free_port_block

pytestmark = pytest.mark.slow

DIM, OUT = 4, 2
TOKEN, OTHER = "alice-7b2f0c9e4d", "bob-51aa83e0f6"


def self_signed(folder: Path) -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1 and localhost, valid for a day."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "keel-gateway-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "gateway.crt", folder / "gateway.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_file.chmod(0o600)
    return cert_file, key_file


def write_tokens(path: Path, *tokens: str) -> None:
    path.write_text("# who may call the gateway\n" + "".join(f"{t}\n" for t in tokens))
    path.chmod(0o600)


@pytest.fixture(scope="module")
def gateway(module_launcher, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys")
    keys.chmod(0o700)
    cert, key = self_signed(keys)
    tokens = keys / "gateway.tokens"
    write_tokens(tokens, TOKEN)
    run = module_launcher("gwtls")
    port = free_port()
    spec = load_spec({
        "cluster": {"name": "gwtls", "base_port": free_port_block(), "run_dir": str(run.log_dir)},
        "gateway": {"http_port": port, "tls_cert": str(cert), "tls_key": str(key), "tokens_file": str(tokens)},
        "models": {"noop": {"builtin": "noop", "input_shape": [DIM], "output_size": OUT, "workers": 1}},
    })
    run.start_spec(spec)
    trust = ssl.create_default_context(cafile=str(cert))
    return port, trust, tokens, cert, run, spec


def get(port: int, path: str, context: ssl.SSLContext, token: str | None = None, body: bytes | None = None,
        scheme: str = "https") -> tuple[int, dict | None, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"{scheme}://127.0.0.1:{port}{path}", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as resp:
            raw = resp.read()
            return resp.status, orjson.loads(raw) if raw else None, dict(resp.headers)
    except urllib.error.HTTPError as err:
        assert err.headers.get_content_type() == "application/json"
        return err.code, orjson.loads(err.read()), dict(err.headers)


INFER = orjson.dumps({"inputs": [{"name": "input", "shape": [1, DIM], "datatype": "FP32", "data": [1.0] * DIM}]})


def test_tokens_are_asked_over_tls(gateway):
    port, trust, *_ = gateway
    assert get(port, "/v2/health/live", trust)[0] == 200  # probes need no token
    assert get(port, "/v2/health/ready", trust)[0] == 200
    for token in (None, OTHER, f"{TOKEN}x"):
        status, body, headers = get(port, "/v2/models/noop", trust, token)
        assert status == 401 and "token" in body["error"] and headers["WWW-Authenticate"].startswith("Bearer")
        status, body, _ = get(port, "/v2/models/noop/infer", trust, token, INFER)
        assert status == 401 and "token" in body["error"]
    status, body, _ = get(port, "/v2/models/noop/infer", trust, TOKEN, INFER)
    assert status == 200 and body["outputs"][0]["shape"] == [1, OUT]
    assert get(port, "/v2/models/noop", trust, TOKEN)[1]["versions"] == ["1"]


def test_plain_http_and_an_untrusted_certificate_get_nothing(gateway):
    port, trust, *_ = gateway
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        get(port, "/v2/health/live", trust, scheme="http")
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        get(port, "/v2/health/live", ssl.create_default_context())  # the system's CAs do not know it
    assert get(port, "/v2/health/live", trust)[0] == 200  # and it still serves


def test_the_token_list_is_read_again_when_it_changes(gateway):
    port, trust, tokens, *_ = gateway
    try:
        write_tokens(tokens, OTHER)
        assert get(port, "/v2/models/noop", trust, TOKEN)[0] == 401
        assert get(port, "/v2/models/noop", trust, OTHER)[0] == 200
        tokens.chmod(0o644)  # opened up: nobody passes until it is private again
        status, body, _ = get(port, "/v2/models/noop", trust, OTHER)
        assert status == 401 and "readable by others" in body["error"]
    finally:
        write_tokens(tokens, TOKEN)
    assert get(port, "/v2/models/noop", trust, TOKEN)[0] == 200


def test_tritonclient_over_tls_with_a_token(gateway):
    httpclient = pytest.importorskip("tritonclient.http")
    port, _, _, cert, *_ = gateway

    def trusting(*args, **kwargs):  # tritonclient builds its context with gevent's ssl
        import gevent.ssl

        return gevent.ssl.create_default_context(cafile=str(cert))

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", ssl=True, ssl_context_factory=trusting,
                                              network_timeout=30.0)
    try:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert client.is_server_live()
        inp = httpclient.InferInput("input", [2, DIM], "FP32")
        inp.set_data_from_numpy(np.ones((2, DIM), np.float32), binary_data=True)
        out = client.infer("noop", [inp], headers=auth).as_numpy("output")
        assert out.shape == (2, OUT)
        with pytest.raises(httpclient.InferenceServerException, match="token"):
            client.infer("noop", [inp])
    finally:
        client.close()


def test_an_unsafe_token_file_stops_the_start(tmp_path, launcher):
    tokens = tmp_path / "gateway.tokens"
    write_tokens(tokens, TOKEN)
    tokens.chmod(0o644)
    run = launcher("gwunsafe")
    spec = load_spec({
        "cluster": {"name": "gwunsafe", "base_port": free_port_block(), "run_dir": str(run.log_dir)},
        "gateway": {"http_port": free_port(), "tokens_file": str(tokens)},
        "models": {"noop": {"builtin": "noop", "input_shape": [DIM], "output_size": OUT}},
    })
    proc = run.start(spec.service("gateway"))
    assert proc.wait(30) == 2
    assert "readable by others" in run.log_path("gateway").read_text()
    assert os.stat(tokens).st_mode & 0o777 == 0o644  # the gateway changes nothing
