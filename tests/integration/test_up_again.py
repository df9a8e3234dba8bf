"""``keel up`` on a running cluster (a real supervisord): it changes nothing, keeps the
versions rolled out or back, and says what differs; ``keel up --apply`` rolls a changed
model like a rollout and restarts other changed services one at a time, under load,
without dropping a request. ``keel model remove`` refuses a version the cluster serves."""
from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import orjson
import pytest

from keel.common.client import Client
from keel.common.spec import load_spec
from keel.common.transport import request_status
from keel.common.waiting import wait_until
from keel.deploy.keel import main as keel
from keel.deploy.local import free_port, free_port_block

pytestmark = pytest.mark.slow

if not (Path(sys.executable).parent / "supervisord").exists():
    pytest.skip("supervisord is not installed", allow_module_level=True)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.fixture
def cluster(tmp_path):
    """``cluster(text) -> spec path``: writes the spec; at teardown ``keel down`` and a
    SIGKILL (by pid) for anything it left."""
    from keel.deploy import supervisor

    path = tmp_path / "spec.toml"
    pids: set[int] = set()

    def write(text: str) -> str:
        path.write_text(text)
        return str(path)

    def remember() -> None:
        try:
            server = supervisor.rpc(tmp_path / "run")
            pids.add(server.supervisor.getPID())
            pids.update(p["pid"] for p in server.supervisor.getAllProcessInfo() if p["pid"])
        except Exception:
            pass

    write.remember = remember
    yield write
    remember()
    if path.exists():
        keel(["down", str(path), "--wait", "30"])
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def pids(run_dir: Path) -> dict[str, int]:
    from keel.deploy import supervisor

    return {p["name"]: p["pid"] for p in supervisor.rpc(run_dir).supervisor.getAllProcessInfo()}


def test_up_again_changes_nothing_until_apply(cluster, tmp_path, capsys):
    base, http = free_port_block(), free_port()

    def spec(timeout_ms: int) -> str:
        return cluster(f'[cluster]\nname = "again"\nbase_port = {base}\nrun_dir = "{tmp_path / "run"}"\n'
                       f'[gateway]\nhttp_port = {http}\ntimeout_ms = {timeout_ms}\n'
                       '[models.noop]\nbuiltin = "noop"\ninput_shape = [2]\noutput_size = 2\nworkers = 2\n')

    path = spec(1000)
    assert keel(["up", path, "--wait", "60"]) == 0
    cluster.remember()
    before = pids(tmp_path / "run")
    capsys.readouterr()
    assert keel(["up", path]) == 0
    assert "nothing to change" in capsys.readouterr().out
    assert pids(tmp_path / "run") == before

    path = spec(2000)  # an edit of the gateway's timeout
    assert keel(["up", path]) == 0
    said = capsys.readouterr().out
    assert "gateway: timeout_ms: 1000 -> 2000" in said and "--apply" in said and "nothing changed" in said
    assert pids(tmp_path / "run") == before  # nothing restarted
    assert orjson.loads((tmp_path / "run" / "config" / "gateway.json").read_bytes())["timeout_ms"] == 1000.0

    assert keel(["up", path, "--apply", "--wait", "60"]) == 0
    cluster.remember()
    assert "gateway: restarted, ready" in capsys.readouterr().out
    after = pids(tmp_path / "run")
    assert after["gateway"] != before["gateway"]
    assert {n: p for n, p in after.items() if n != "gateway"} == {n: p for n, p in before.items() if n != "gateway"}
    assert orjson.loads((tmp_path / "run" / "config" / "gateway.json").read_bytes())["timeout_ms"] == 2000.0
    assert keel(["up", path]) == 0
    assert "nothing to change" in capsys.readouterr().out


CONTAINER = textwrap.dedent('''
    import numpy as np

    class Biased:
        """x + the version's bias."""

        def load(self, path):
            self.bias = float(open(path).read())

        def predict_batch(self, inputs):
            return inputs.reshape(len(inputs), -1) + self.bias
''')


def versions(spec) -> set:
    return {(request_status(w.config.status_endpoint, 2.0) or {}).get("version") for w in spec.role("worker")}


def test_rolled_back_version_survives_up_and_a_restart_and_apply_rolls_a_pin(cluster, tmp_path, capsys):
    (tmp_path / "biased.py").write_text(CONTAINER)
    store = tmp_path / "store"
    for version, bias in (("1", "0"), ("2", "100")):
        (tmp_path / f"bias{version}.txt").write_text(bias)
        assert keel(["model", "add", "m", str(tmp_path / f"bias{version}.txt"), "--python",
                     f"{tmp_path / 'biased.py'}:Biased", "--input-shape", "2", "--store", str(store)]) == 0
    head = (f'[cluster]\nname = "roll"\nstore = "{store}"\nbase_port = {free_port_block()}\n'
            f'run_dir = "{tmp_path / "run"}"\n[frontend]\ncache_size = 0\n')
    path = cluster(head + '[models.m]\nworkers = 2\n')  # the version left open: latest, 2
    assert keel(["up", path, "--wait", "120"]) == 0
    cluster.remember()
    spec = load_spec(path)
    assert versions(spec) == {"2"}
    assert keel(["model", "rollback", path, "m"]) == 0
    assert versions(spec) == {"1"}
    capsys.readouterr()
    assert keel(["status", path]) == 0
    assert "model rollback" in capsys.readouterr().out  # the record status reads
    before = pids(tmp_path / "run")

    assert keel(["up", path]) == 0
    said = capsys.readouterr().out
    assert "nothing to change" in said and "serves version 1" in said and "kept" in said
    assert pids(tmp_path / "run") == before and versions(spec) == {"1"}

    victim = before["worker-m-0"]  # supervisord restarts it: from its config file, with version 1
    os.kill(victim, signal.SIGKILL)
    assert wait_until(lambda: pids(tmp_path / "run")["worker-m-0"] not in (0, victim), 30)
    cluster.remember()
    assert wait_until(lambda: (request_status(spec.service("worker-m-0").config.status_endpoint, 1.0) or {})
                      .get("version") == "1", 60)

    # pin version 2 and change a worker option: --apply restarts the workers one at a time
    # and rolls them to 2, while a client sends
    path = cluster(head + '[models.m]\nversion = 2\nworkers = 2\n[models.m.worker]\nslots = 2\n')
    assert keel(["up", path]) == 0
    said = capsys.readouterr().out
    assert "the spec pins version 2" in said and "worker-m-1: slots: 1 -> 2" in said and versions(spec) == {"1"}
    results, sent, stop = [], [], threading.Event()
    xs = np.random.default_rng(0).random((3000, 2), dtype=np.float32)  # at most this many requests

    def load() -> None:
        with Client(spec.client_endpoints, timeout_ms=10_000) as client:
            while not stop.is_set() and len(sent) < len(xs):
                sent.append(client.submit("m", xs[len(sent)]))
                results.extend(client.collect(20.0))
            results.extend(client.collect(10_000.0) if len(results) < len(sent) else [])
            while len(results) < len(sent) and client.calls:
                results.extend(client.collect(1000.0))

    loader = threading.Thread(target=load)
    loader.start()
    try:
        assert wait_until(lambda: len(results) >= 20, 30)
        assert keel(["up", path, "--apply", "--wait", "120"]) == 0
        cluster.remember()
        n = len(results)
        assert wait_until(lambda: len(results) >= n + 20, 30)
    finally:
        stop.set()
        loader.join(60)
    said = capsys.readouterr().out
    assert "worker-m-0: restarted, ready" in said and "every worker" not in said
    assert len(results) == len(sent) and {r.source for r in results} == {"model"}, {r.source for r in results}
    index = {rid: i for i, rid in enumerate(sent)}
    for r in results:
        np.testing.assert_allclose(r.output, xs[index[r.request_id]] + (100 if r.version == "2" else 0), rtol=1e-5)
    assert versions(spec) == {"2"} and results[-1].version == "2"
    served = orjson.loads((tmp_path / "run" / "served.json").read_bytes())["models"]["m"]
    assert served["version"] == "2" and served["by"] == "up --apply"
    assert keel(["up", path]) == 0
    assert "nothing to change" in capsys.readouterr().out

    # the store: the served version is refused, another goes
    assert keel(["model", "remove", "m", "2", "--store", str(store), "--spec", path]) == 1
    err = capsys.readouterr().err
    assert err.startswith("keel: m version 2 is served by") and "--force" in err and "Traceback" not in err
    assert keel(["model", "remove", "m", "1", "--store", str(store), "--spec", path]) == 0
    assert keel(["model", "add", "m", str(tmp_path / "bias1.txt"), "--python", f"{tmp_path / 'biased.py'}:Biased",
                 "--input-shape", "2", "--store", str(store)]) == 0
    assert "added m version 3" in capsys.readouterr().out  # a removed number is never given again
