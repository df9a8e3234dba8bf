"""Model selection from the client (Clipper §5): start deploy/examples/selection.toml on
free local ports, call its applications per user and teach them with feedback.

Run: ``.venv/bin/python deploy/examples/selection_client.py`` (from the repository root).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from keel import Client, load_spec
from keel.common.spec.tables import read_source
from keel.deploy.local import Launcher, free_port_block

TRUE = 2
x = np.eye(16, dtype=np.float32)[TRUE]  # the right models say class 2, "wrong" says 0

with tempfile.TemporaryDirectory() as tmp:
    data = read_source(Path(__file__).with_name("selection.toml"))
    data["cluster"].update(base_port=free_port_block(), run_dir=tmp)
    spec = load_spec(data)
    launcher = Launcher(Path(tmp) / "logs")
    try:
        launcher.start_spec(spec)
        with Client(spec.client_endpoints[0], timeout_ms=5000) as client:
            # a model's first batch after start is slower than the rest (its executor
            # thread, first allocations): warm each one, so that the application's 50 ms
            # straggler deadline does not leave them out of the first call
            for model in data["applications"]["digits"]["models"]:
                client.predict(model, x)
            r = client.predict("digits", x, key="alice")
            print(f"digits for alice: class {r.output.argmax()} from {r.models}, "
                  f"confidence {r.confidence:.2f}, source {r.source}")
            print("feedback:", client.feedback(r.request_id, TRUE))
            print("again:   ", client.feedback(r.request_id, TRUE).error_code)  # once per call

            picks = []
            for _ in range(30):  # Exp3 learns that "right-a" is right for bob
                r = client.predict("pick-one", x, key="bob")
                picks.append(r.models[0])
                client.feedback(r.request_id, TRUE)
            print("pick-one for bob, last 10 picks:", picks[-10:])
    finally:
        launcher.stop()
