"""What a frontend and a dispatcher import at start: only what their spec uses.

A restarted process's imports are part of its downtime (supervisord restarts a killed
dispatcher while every worker waits to register again), so heavy modules load only where
the spec runs the code that needs them: ``scipy.optimize`` for a Kairos policy, torch where
a model runs. Each service is built in a fresh interpreter the way ``keel serve`` builds it
(``services.serve``: the config from JSON, the role's row, the process class), from the
config ``keel up`` renders for it (``load_spec``).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from keel.common import config as cfg
from keel.common.spec import load_spec
from keel.deploy.local import free_port_block

HEAVY = ("torch", "scipy.optimize", "sklearn", "matplotlib")

#: ``keel serve ROLE --config JSON`` up to its loop: then the modules it holds
SERVE = """
import json, sys
import orjson
from keel.common.roles import from_dict
from keel.services.serve import build
from keel.common.containers import DeviceError  # noqa: F401 (serve.main imports it before building)

role, raw = sys.argv[1], sys.argv[2]
service = build(role, from_dict(role, orjson.loads(raw)))
watched = {heavy}
try:
    print("imported:", json.dumps(sorted(m for m in sys.modules if m in watched or m.split(".")[0] in watched)), flush=True)
finally:
    service.shutdown()
"""


def imported_at_start(tables: dict, role: str, watched: tuple[str, ...] = HEAVY) -> list[str]:
    """The ``watched`` modules (the heavy ones by default; a top-level name stands for its
    package too) a fresh ``keel serve ROLE`` holds once built for ``tables``' spec."""
    spec = load_spec({"cluster": {"base_port": free_port_block()}, **tables})
    config = cfg.to_json(spec.service(role).config)
    out = subprocess.run([sys.executable, "-c", SERVE.format(heavy=set(watched)), role, config],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("imported: "))  # logs go to stdout too
    return json.loads(line.removeprefix("imported: "))


NOOP = {"models": {"m": {"builtin": "noop", "input_shape": [8], "output_size": 4}}}


@pytest.mark.parametrize("role", ["frontend", "dispatcher"])
def test_a_service_of_a_plain_spec_imports_no_torch_nor_scipy_optimize(role):
    assert imported_at_start(NOOP, role) == []


def test_a_kairos_dispatcher_imports_scipy_optimize_at_start():
    """At start, not at its first query: the import (~0.25 s) must not land on a request."""
    assert "scipy.optimize" in imported_at_start({**NOOP, "dispatcher": {"policy": "kairos"}}, "dispatcher")


def test_a_frontend_of_a_graph_spec_imports_no_torch():
    """The spec's operator facts live in common (``common.spec.operators``): a frontend that
    routes to a graph of torch operators does not load torch itself."""
    graph = {"graphs": {"g": {"input_shape": [8], "edges": [["frontend", "g1"], ["g1", "frontend"]],
                              "operators": {"g1": {"kind": "gru", "input_shape": [8], "output_shape": [16]}}}}}
    assert imported_at_start(graph, "frontend") == []


#: what a dispatcher whose spec has no manager, no tracing, no SERF and no Kairos never runs:
#: each loads only where the spec asks for it (the control plane's link, OpenTelemetry's SDK,
#: SERF's configurator and profiles, the Raft library), so none of it lengthens a restart
NOT_BEFORE_SERVING = ("opentelemetry", "keel.common.control", "keel.services.serf", "keel.services.serf.configurator",
                      "pysyncobj", "scipy", "keel.common.modelfetch")


def test_a_plain_dispatcher_imports_nothing_its_spec_does_not_use():
    assert imported_at_start(NOOP, "dispatcher", NOT_BEFORE_SERVING) == []


def test_a_dispatcher_with_a_manager_imports_the_control_plane_at_start():
    """The bound above is not vacuous: what a spec asks for is imported before serving."""
    manager = {"hosts": {"a": "127.0.0.1", "b": "127.0.0.1", "c": "127.0.0.1"}, "manager": {"hosts": ["a", "b", "c"]}}
    assert "keel.common.control" in imported_at_start({**NOOP, **manager}, "dispatcher", NOT_BEFORE_SERVING)
