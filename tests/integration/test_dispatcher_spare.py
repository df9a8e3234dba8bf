"""A dispatcher's hot spare (``spare = true``): ``keel serve --spare-lock`` processes, real
ones, and what ``keel up`` and systemd render for them.

- A spare does its imports, then waits for the lock without binding anything; when the
  holder lets go (dies), it takes the lock, writes its pid there and serves.
- A spare stopped while it waits ends at once and cleanly (supervisord's stop, systemd's).
- ``keel up`` runs the dispatcher and ``dispatcher-spare`` with the same command and lock;
  systemd gets a second instance with the same environment.
"""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time

import pytest

from keel.common import config as cfg
from keel.common.spec import load_spec
from keel.common.transport import request_status
from keel.deploy.local import free_port_block
from keel.deploy.programs import SPARE, programs, spare_lock
from keel.services.serve import lock_holder

NOOP = {"models": {"m": {"builtin": "noop", "input_shape": [8], "output_size": 4}}}


def spec_with_spare(tmp_path, **cluster):
    return load_spec({"cluster": {"base_port": free_port_block(), "run_dir": str(tmp_path / "run"), **cluster},
                      "dispatcher": {"spare": True}, **NOOP})


def wait_for(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def spare(tmp_path):
    """A ``keel serve dispatcher --spare-lock`` process while the test holds the lock."""
    spec = spec_with_spare(tmp_path)
    conf = tmp_path / "dispatcher.json"
    conf.write_text(cfg.to_json(spec.service("dispatcher").config))
    lock = tmp_path / "locks" / "dispatcher.lock"
    lock.parent.mkdir()
    held = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    log = tmp_path / "spare.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "keel.services.serve", "dispatcher", "--config", f"@{conf}",
                                 "--spare-lock", str(lock)], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: b"spare: waiting to serve" in log.read_bytes() or proc.poll() is not None, 60, "the spare to wait")
        assert proc.poll() is None, log.read_text()
        yield proc, held, lock, log, spec.service("dispatcher").config.worker_endpoint
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        try:
            os.close(held)
        except OSError:  # the test closed it: the holder's death
            pass


def test_a_spare_serves_only_once_the_holder_lets_go(spare):
    proc, held, lock, log, endpoint = spare
    assert request_status(endpoint, timeout_s=0.3) is None  # nothing bound while it waits
    os.close(held)  # what the kernel does when the serving process dies
    wait_for(lambda: lock_holder(str(lock)) == proc.pid, 30, "the spare to take the lock")
    status = request_status(endpoint, timeout_s=10)
    assert status is not None and status["role"] == "dispatcher"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert b"spare: lock taken, serving" in log.read_bytes() and b'"stopped"' in log.read_bytes()


def test_a_spare_stopped_while_it_waits_ends_at_once(spare):
    proc, held, lock, log, endpoint = spare
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(5) == 0
    assert b"spare: stopped" in log.read_bytes() and lock_holder(str(lock)) is None


def test_keel_up_runs_a_spare_beside_the_dispatcher(tmp_path):
    spec = spec_with_spare(tmp_path)
    want = programs(spec, python="/py")
    lock = str(spare_lock(spec.run_dir, "dispatcher"))
    assert want["dispatcher"].argv == want["dispatcher" + SPARE].argv
    assert want["dispatcher"].argv[-2:] == ["--spare-lock", lock] and want["dispatcher" + SPARE].role == "dispatcher"
    assert list(want)[-1] == "dispatcher" + SPARE  # after every service: an --apply restarts the serving one first
    plain = programs(load_spec({"cluster": {"base_port": free_port_block()}, **NOOP}), python="/py")
    assert "--spare-lock" not in plain["dispatcher"].argv and "dispatcher" + SPARE not in plain


def test_systemd_runs_a_spare_instance_with_the_same_environment(tmp_path):
    from keel.deploy.supervisor import render_systemd

    spec = spec_with_spare(tmp_path)
    render_systemd(spec, "local", tmp_path / "units", python="/py", workdir="/w", etc_dir="/etc/keel")
    env = (tmp_path / "units" / "keel" / "dispatcher.env").read_text()
    assert env == (tmp_path / "units" / "keel" / f"dispatcher{SPARE}.env").read_text()
    assert "KEEL_ROLE=dispatcher\n" in env and "KEEL_SPARE_LOCK=/run/lock/keel-" in env
    target = (tmp_path / "units" / "keel.target").read_text()
    assert "keel-service@dispatcher.service keel-service@dispatcher-spare.service" in target


def test_keel_logs_shows_the_spare_beside_the_dispatcher(tmp_path):
    from keel.deploy.logs import log_paths

    spec = spec_with_spare(tmp_path)
    logs = tmp_path / "run" / "logs"
    logs.mkdir(parents=True)
    (logs / "dispatcher-spare.log").write_text("")
    assert set(log_paths(spec, "dispatcher")) == {"dispatcher", "dispatcher-spare"}
    assert "dispatcher-spare" not in log_paths(spec, "frontend")


def test_supervisord_starts_the_spare_after_its_dispatcher_and_stops_it_before(tmp_path):
    """supervisord starts lower priorities first and stops them last: ``keel down`` stops the
    spare before the dispatcher, which it would otherwise take over from as it stops."""
    from keel.deploy.supervisor import render

    conf = render(spec_with_spare(tmp_path)).read_text()

    def priority(program: str) -> int:
        section = conf.split(f"[program:{program}]\n")[1].split("\n\n")[0]
        return int(next(line for line in section.splitlines() if line.startswith("priority = ")).split(" = ")[1])

    assert priority("dispatcher" + SPARE) == priority("dispatcher") + 1
    assert "--spare-lock" in conf.split("[program:dispatcher]\n")[1].split("\n\n")[0]
