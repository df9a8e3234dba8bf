"""Deployment files for the gateway and the dashboard: systemd units include the gateway,
and every metric the Grafana dashboard queries is one a Keel service serves."""
from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import orjson

from keel.common.spec import load_spec
from keel.deploy.units import render_systemd

ROOT = Path(__file__).resolve().parents[2]


def test_systemd_units_include_the_gateway(tmp_path):
    spec = load_spec(ROOT / "deploy" / "examples" / "gateway.toml")
    render_systemd(spec, "local", tmp_path, python="/usr/bin/python3", workdir="/srv/keel", etc_dir="/etc/keel")
    env = (tmp_path / "keel" / "gateway.env").read_text()
    assert "KEEL_ROLE=gateway" in env
    config = orjson.loads((tmp_path / "keel" / "gateway.json").read_bytes())
    assert config["http_port"] == 8000 and config["frontend_endpoints"] == spec.local_client_endpoints
    assert "noop" in config["models"]
    assert "gateway" in (tmp_path / "keel.target").read_text()


def test_dashboard_queries_only_metrics_keel_serves():
    dash = json.loads((ROOT / "deploy" / "grafana" / "keel-dashboard.json").read_text())
    queried = {m for p in dash["panels"] for t in p["targets"] for m in re.findall(r"keel_[a-z_]+", t["expr"])}
    served = set()
    for path in (ROOT / "services").glob("*.py"):
        for kind, name in re.findall(r'metrics\.(counter|histogram|gauge)\(\s*"([a-z_]+)"', path.read_text()):
            served.add(f"keel_{name}")
            if kind == "histogram":
                served |= {f"keel_{name}_bucket", f"keel_{name}_sum", f"keel_{name}_count"}
    assert queried and queried <= served, queried - served
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


def test_the_gateway_page_exists_and_names_only_real_options():
    """The example spec points to docs/guide/http.md; every [gateway] key that page and the
    example show (commented out or not) is a gateway option, and loads."""
    from keel.common.config import GatewayConfig

    example = (ROOT / "deploy" / "examples" / "gateway.toml").read_text()
    page = ROOT / "docs" / "guide" / "http.md"
    assert "docs/guide/http.md" in example and page.is_file()
    known = {f for f in GatewayConfig.__dataclass_fields__} | {"host"}
    shown = set()
    for text in (example, page.read_text()):
        for block in re.findall(r"\[gateway\]\n((?:#? ?[a-z_]+ = .*\n)+)", text):
            shown |= set(re.findall(r"^#? ?([a-z_]+) = ", block, re.M))
    assert {"tls_cert", "tls_key", "tokens_file", "http_port"} <= shown and shown <= known, shown - known
    on = re.sub(r"^# (tls_cert|tls_key|tokens_file) = ", r"\1 = ", example, flags=re.M)
    spec = load_spec(tomllib.loads(on))
    config = spec.service("gateway").config
    assert (config.tls_cert, config.tls_key, config.tokens_file) == ("keys/gateway.crt", "keys/gateway.key",
                                                                     "keys/gateway.tokens")
