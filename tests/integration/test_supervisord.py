"""A real supervisord running a rendered spec (builtin noop model, free ports, tmp run_dir):
up -> the client gets predictions -> a SIGKILLed worker is restarted by supervisord ->
down leaves no process behind. And a service that cannot start fails ``up`` clearly."""
from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from keel.common.spec import ClusterSpec, load_spec
from keel.deploy.local import free_port_block

pytestmark = pytest.mark.slow


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped between open and read
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_for(cond, timeout_s: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def cluster(tmp_path):
    """A factory: ``cluster(data) -> ClusterSpec`` with a tmp run_dir and free ports; at
    teardown brings down what it brought up and kills (by pid) anything that survived."""
    from keel.deploy import supervisor

    made: list[ClusterSpec] = []
    pids: set[int] = set()

    def make(data: dict) -> ClusterSpec:
        data = {**data, "cluster": {"name": "itest", "run_dir": str(tmp_path / "run"), "base_port": free_port_block(),
                                     **data.get("cluster", {})}}
        spec = load_spec(data)
        made.append(spec)
        return spec

    def remember() -> None:
        for spec in made:
            try:
                server = supervisor.rpc(spec.run_dir)
                pids.add(server.supervisor.getPID())
                pids.update(p["pid"] for p in server.supervisor.getAllProcessInfo() if p["pid"])
            except Exception:
                pass

    make.remember = remember
    yield make
    remember()
    for spec in made:
        try:
            supervisor.down(spec, out=None)
        except Exception:
            pass
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def noop_spec(workers: int = 2) -> dict:
    # fast heartbeats so the dispatcher notices the killed worker quickly
    return {"dispatcher": {"heartbeat_interval_s": 0.1}, "worker": {"heartbeat_interval_s": 0.1},
            "models": {"noop": {"builtin": "noop", "input_shape": [4], "output_size": 3, "workers": workers}}}


def predict_ok(client, timeout_ms: float = 2000) -> bool:
    x = np.random.default_rng().random(4, dtype=np.float32)  # fresh input: no cache hit can answer it
    result = client.predict("noop", x, timeout_ms=timeout_ms)
    return result.error is None and result.source == "model" and np.array_equal(result.output, np.zeros(3, np.float32))


def test_up_predict_restart_down(cluster, capsys):
    from keel.common.client import Client
    from keel.deploy import supervisor

    spec = cluster(noop_spec())
    supervisor.up(spec, wait_s=60)
    cluster.remember()
    assert "worker-noop-1" in capsys.readouterr().out  # the table
    server = supervisor.rpc(spec.run_dir)
    supervisord_pid = server.supervisor.getPID()
    procs = {p["name"]: p for p in server.supervisor.getAllProcessInfo()}
    # every service, and the listener that has supervisord restart a dead one at once (deploy.restarts)
    assert {n: p["statename"] for n, p in procs.items()} == {**{s.name: "RUNNING" for s in spec.services},
                                                             "keel-restarts": "RUNNING"}

    with Client(spec.client_endpoints) as client:
        assert predict_ok(client)

        victim = procs["worker-noop-0"]["pid"]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: not alive(victim), 10, "the killed worker to die")

        def restarted():
            info = server.supervisor.getProcessInfo("worker-noop-0")
            return info["statename"] == "RUNNING" and info["pid"] not in (0, victim) and info["pid"]

        new_pid = wait_for(restarted, 30, "supervisord to restart worker-noop-0")
        cluster.remember()
        assert alive(new_pid)
        # the listener saw the death and asked supervisord until it had reaped the worker
        listener_log = Path(spec.run_dir) / "logs" / "keel-restarts.log"
        assert f"worker-noop-0:worker-noop-0 (pid {victim}) exited; supervisord has it " in listener_log.read_text()
        wait_for(lambda: predict_ok(client, timeout_ms=1000), 30, "predictions after the restart")

    st = supervisor.status(spec)
    assert st["running"] and all(r["state"] == "RUNNING" for r in st["programs"])
    assert st["info"]["frontend"] is not None and st["info"]["dispatcher"] is not None

    program_pids = [p["pid"] for p in server.supervisor.getAllProcessInfo()]
    assert supervisor.down(spec, out=None)
    assert not alive(supervisord_pid)
    assert not [pid for pid in program_pids + [victim, new_pid] if alive(pid)]
    assert not supervisor.status(spec)["running"]
    assert supervisor.down(spec, out=None) is False  # idempotent


def test_up_fails_clearly_when_a_service_cannot_start(cluster, tmp_path):
    """A model whose container fails to load: the worker exits during start-up, and ``up``
    names it with the tail of its log, then shuts its supervisord down again."""
    from keel.common.modelstore import ModelStore
    from keel.deploy import supervisor

    (tmp_path / "broken.py").write_text("class Broken:\n    def load(self, path):\n"
                                        "        raise RuntimeError('this model needs a file that is not here')\n"
                                        "    def predict_batch(self, inputs):\n        return inputs\n")
    (tmp_path / "artifact").write_text("x")
    store = ModelStore(tmp_path / "store")
    store.add("broken", tmp_path / "artifact", "python", entry=f"{tmp_path / 'broken.py'}:Broken",
              input_shape=[4], output_size=4)
    spec = cluster({"cluster": {"store": str(store.root)}, "models": {"broken": {"workers": 1}}})
    with pytest.raises(supervisor.DeployError) as err:
        supervisor.up(spec, wait_s=60, out=None)
    message = str(err.value)
    assert "worker-broken-0" in message and "tail of" in message and "needs a file that is not here" in message
    pidfile = Path(spec.run_dir) / "supervisord.pid"
    pid = int(pidfile.read_text()) if pidfile.exists() else None
    assert pid is None or not alive(pid)  # the failed up shut its supervisord down again


def test_up_with_a_port_in_use_starts_nothing(cluster):
    from keel.deploy import supervisor

    spec = cluster(noop_spec(workers=1))
    blocker = socket.socket()  # the frontend's client port is taken
    blocker.bind(("127.0.0.1", int(spec.client_endpoints[0].rsplit(":", 1)[1])))
    blocker.listen()
    try:
        with pytest.raises(supervisor.DeployError) as err:
            supervisor.up(spec, wait_s=30, out=None)
    finally:
        blocker.close()
    message = str(err.value)
    assert "\n" not in message and "frontend client_endpoint" in message and "in use" in message, message
    assert not (Path(spec.run_dir) / "supervisord.pid").exists()  # nothing was started


def test_a_dispatcher_with_a_spare_is_served_by_the_spare_when_killed_and_down_stops_both(cluster):
    """``spare = true``: one of the two serves (the one whose imports finished first); SIGKILLed,
    the other (already running) serves and supervisord restarts the killed one as the next
    spare; ``down`` leaves neither behind."""
    from keel.common.client import Client
    from keel.deploy import supervisor
    from keel.deploy.programs import spare_lock
    from keel.services.serve import lock_holder

    data = noop_spec()
    data["dispatcher"]["spare"] = True
    spec = cluster(data)
    supervisor.up(spec, wait_s=60)
    cluster.remember()
    server = supervisor.rpc(spec.run_dir)
    lock = str(spare_lock(spec.run_dir, "dispatcher"))

    def pid(name: str) -> int:
        return server.supervisor.getProcessInfo(name)["pid"]

    logs = Path(spec.run_dir) / "logs"

    def waiting() -> bool:
        return any(b"spare: waiting" in (logs / f"{n}.log").read_bytes() for n in ("dispatcher", "dispatcher-spare"))

    wait_for(lambda: pid("dispatcher") and pid("dispatcher-spare") and waiting(), 60, "the spare to wait")
    first = lock_holder(lock)
    programs = {pid("dispatcher"): "dispatcher", pid("dispatcher-spare"): "dispatcher-spare"}
    assert first in programs
    (other,) = set(programs) - {first}
    with Client(spec.client_endpoints) as client:
        assert predict_ok(client)
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: lock_holder(lock) == other, 30, "the spare to take over")
        wait_for(lambda: predict_ok(client, timeout_ms=1000), 30, "predictions from the spare")
        wait_for(lambda: pid(programs[first]) not in (0, first), 30, "supervisord to restart the killed one")
    cluster.remember()
    program_pids = [p["pid"] for p in server.supervisor.getAllProcessInfo()]
    assert supervisor.down(spec, out=None)
    assert not [p for p in program_pids + [first] if alive(p)]
    assert "spare: lock taken, serving" in (logs / f"{programs[other]}.log").read_text()
