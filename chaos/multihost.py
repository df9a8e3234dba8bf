"""Three hosts for real: one spec, one ``keel up SPEC --host H`` per host, models by content.

Each host is a network namespace of a chaos ``Cluster`` with a folder of its own (its
working directory: its copy of the spec, its run_dir, its store), so hosts share no file:
the operator's steps of docs/guide/multihost.md, run as they are written there. h1 runs
the store service (serving the folder ``published``), the dispatcher, the ParM encoder and
decoder and a frontend; h2 a frontend; workers and parity workers are spread over all
three; the manager group has a replica on each host and a standby dispatcher on h2.
Every host's store starts empty, so every worker fetches its model from h1's store
service before it registers. A load client runs in a namespace of its own.

``run`` drives the scenario and returns its figures: bring-up, queries answered and lost,
every reply checked against the offline output of the version it names; optionally a
rollout of v2 under load, the death of a whole host (its supervisord too) under load and
its restart with an empty store from the systemd units ``keel render-systemd`` writes, and a store transfer corrupted in flight by the chaos
proxy (refused, retried). ``python -m keel.chaos.multihost`` runs the whole scenario and
writes the figures (docs/results/multihost.md holds a run's).

Example
-------
::

    sudo .venv/bin/python -m keel.chaos.multihost --queries 5000 --out runs/multihost
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from keel.chaos.probes import write_json
from keel.chaos.proxy import DelayProxy
from keel.chaos.workload import Workload, WorkloadConfig
from keel.common.modelstore import ModelStore, sha256_file

HOSTS = ("h1", "h2", "h3")
#: the model's versions: each answers a query's first two features times its factor
FACTORS = {"1": 2.0, "2": 3.0}
CONTAINER = '''import numpy as np


class Scale:
    """A query's first two features times the factor in the artifact: an exact offline output
    per version, and a linear model, so ParM's reconstructions are exact too."""

    def load(self, path):
        self.factor = float(open(path).read())

    def predict_batch(self, inputs):
        return inputs.reshape(len(inputs), -1)[:, :2] * self.factor
'''
#: the artifact's padding: the file spans many bytes, so the proxy's flip lands inside it
ARTIFACT_BYTES = 20_000
#: where in the replies the proxy flips its byte: past the listing (~1.5 KB), inside the file
FLIP_AT = 8_000


def spec_text(addresses: dict[str, str]) -> str:
    """The cluster spec every host gets a copy of (only the addresses are the machines')."""
    hosts = "\n".join(f'{h} = "{addresses[h]}"' for h in HOSTS)
    return f'''[cluster]
name = "three"
store = "store"           # each host's own store, relative to where keel runs there
run_dir = "run"

[hosts]
{hosts}

[store]
hosts = ["h1"]
root = "published"        # what h1's store service serves

[frontend]
hosts = ["h1", "h2"]

[dispatcher]
host = "h1"

[manager]                 # three Raft replicas; a standby dispatcher on h2
hosts = ["h1", "h2", "h3"]
standby_dispatcher = "h2"
password = "three-hosts-secret"

[models.scale]
workers = 3
hosts = ["h1", "h2", "h3"]
k = 2
deadline_ms = 2000
'''


class ThreeHosts:
    """The deployment: a folder per host, keel commands run in its namespace from there."""

    def __init__(self, cluster: Any, root: Path):
        self.cluster, self.root = cluster, Path(root)
        self.dirs = {h: self.root / h for h in HOSTS}
        self.calls = 0
        spec = spec_text(cluster.addresses)
        for host, folder in self.dirs.items():
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "spec.toml").write_text(spec)  # copied to each host, as the runbook says
        (self.dirs["h1"] / "scale.py").write_text(CONTAINER)

    def keel(self, host: str, *args: str, timeout_s: float = 180.0) -> tuple[int, str]:
        """Run ``keel ARGS`` on ``host`` in its folder; (exit status, its output)."""
        self.calls += 1
        name = f"keel-{self.calls}-{args[0]}"
        proc = self.cluster.spawn(host, [sys.executable, "-m", "keel.deploy.keel", *args], name, kind="aux",
                                  restartable=False, cwd=self.dirs[host])
        try:
            rc = proc.popen.wait(timeout=timeout_s)
        except Exception:  # subprocess.TimeoutExpired: say so with the output
            self.cluster.stop(proc)
            rc = -1
        return rc, proc.log.read_text(errors="replace")

    def must(self, host: str, *args: str, timeout_s: float = 180.0) -> str:
        rc, out = self.keel(host, *args, timeout_s=timeout_s)
        if rc != 0:
            raise AssertionError(f"keel {' '.join(args)} on {host} exited {rc}:\n{out[-3000:]}")
        return out

    def add_version(self, factor: float) -> str:
        """``keel model add`` on h1 into the folder its store service serves."""
        artifact = self.dirs["h1"] / f"factor-{factor}.txt"
        artifact.write_text(f"{factor}".ljust(ARTIFACT_BYTES))
        out = ""
        for name in (("scale", "scale-parity") if factor == FACTORS["1"] else ("scale",)):
            out = self.must("h1", "model", "add", name, artifact.name, "--python", "scale.py:Scale",
                            "--input-shape", "64", "--store", "published")
        return out

    def up(self, *hosts: str, wait_s: float = 90.0) -> None:
        """``keel up spec.toml --host H`` on each host at once (as operators on three machines).
        h1 starts first: the others read the model's manifest from its store service, and
        h1's ``up`` returns only once the manager group has a quorum (the others are up)."""
        procs = {}
        for host in hosts:
            if host != "h1" and "h1" in procs:
                self.wait_store(procs["h1"])
            self.calls += 1
            procs[host] = self.cluster.spawn(host, [sys.executable, "-m", "keel.deploy.keel", "up", "spec.toml", "--host",
                                                    host, "--wait", str(wait_s)], f"keel-{self.calls}-up", kind="aux",
                                             restartable=False, cwd=self.dirs[host])
        for host, proc in procs.items():
            rc = proc.popen.wait(timeout=wait_s + 60)
            if rc != 0:
                raise AssertionError(f"keel up --host {host} exited {rc}:\n{proc.log.read_text(errors='replace')[-4000:]}")
            for pid in self.pids(host):  # removed at close even if this process dies first
                self.cluster.registry.add_proc(pid)

    def up_systemd(self, host: str) -> list[str]:
        """Start ``host``'s services as its systemd units would (no systemd here): render them
        with ``keel render-systemd`` on the host, then run each instance of ``keel.target``
        with its env file, working directory and ExecStart. Returns the services."""
        folder = self.dirs[host]
        self.must(host, "render-systemd", "spec.toml", "--host", host, "--out", "units", "--python", sys.executable,
                  "--workdir", str(folder), "--etc", str(folder / "units" / "keel"), "--store", str(folder / "store"))
        units = folder / "units"
        wants = next(line for line in (units / "keel.target").read_text().splitlines() if line.startswith("Wants="))
        template = (units / "keel-service@.service").read_text().splitlines()
        exec_start = next(line for line in template if line.startswith("ExecStart="))[len("ExecStart="):]
        workdir = next(line for line in template if line.startswith("WorkingDirectory="))[len("WorkingDirectory="):]
        names = [w[len("keel-service@"):-len(".service")] for w in wants[len("Wants="):].split()]
        for name in names:
            env = dict(line.split("=", 1) for line in (units / "keel" / f"{name}.env").read_text().splitlines()
                       if line and not line.startswith("#"))
            command = exec_start
            for key, value in env.items():
                command = command.replace("${%s}" % key, value)
            self.cluster.spawn(host, shlex.split(command), f"unit-{name}", cwd=workdir)
        return names

    def wait_registered(self, worker: str, timeout_s: float = 90.0) -> bool:
        """Until the active dispatcher lists ``worker`` (asked from the client's namespace)."""
        endpoints = [s.config.worker_endpoint for s in spec_of(self).role("dispatcher")]
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            for endpoint in endpoints:
                info = self.ask(endpoint) or {}
                if info.get("active", True) and worker in info.get("workers", {}):
                    return True
            time.sleep(0.3)
        return False

    def ask(self, endpoint: str) -> dict | None:
        """A status request from the client's namespace."""
        import zmq

        from keel.chaos.netns import in_netns
        from keel.common.transport import request_status

        def ask() -> dict | None:
            ctx = zmq.Context()  # made inside the namespace, so its connections start there
            try:
                return request_status(endpoint, 0.5, ctx=ctx)
            finally:
                ctx.destroy(0)

        return in_netns(self.cluster.host("client").ns, ask)

    def wait_store(self, starting: Any, timeout_s: float = 60.0) -> None:
        """Until h1's store service answers (asked from the client's namespace)."""
        endpoint = spec_of(self).role("store")[0].config.status_endpoint
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and starting.running():
            if self.ask(endpoint) is not None:
                return
            time.sleep(0.2)
        raise AssertionError(f"h1's store service did not answer; see {starting.log}")

    def run_dir(self, host: str) -> Path:
        return self.dirs[host] / "run"

    def pids(self, host: str) -> list[int]:
        """The host's supervisord and its programs."""
        from keel.deploy.supervisor import rpc

        run_dir = self.run_dir(host)
        out = []
        try:
            out.append(int((run_dir / "supervisord.pid").read_text()))
            out += [p["pid"] for p in rpc(run_dir).supervisor.getAllProcessInfo() if p.get("pid")]
        except (OSError, ValueError):
            pass
        return out

    def kill(self, host: str) -> list[int]:
        """SIGKILL the host's supervisord first (nothing restarts), then every program."""
        pids = self.pids(host)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def down(self, host: str) -> int:
        """``keel down spec.toml --host H`` on the host; whatever outlives it is killed."""
        rc, _ = self.keel(host, "down", "spec.toml", "--host", host, "--wait", "20", timeout_s=60)
        self.kill(host)
        return rc

    def close(self) -> dict[str, int]:
        return {host: self.down(host) for host in HOSTS}

    def store(self, host: str) -> ModelStore:
        return ModelStore(self.dirs[host] / "store")


def check_replies(records: list[dict], inputs: np.ndarray) -> dict[str, Any]:
    """Lost, errors, and replies whose output differs from the offline output of the version
    they name (by source)."""
    out: dict[str, Any] = {"sent": len(records), "answered": 0, "lost": 0, "errors": 0, "wrong": 0,
                           "wrong_by_source": {}, "by_source": {}, "by_version": {}, "wrong_examples": []}
    for rec in records:
        replies = [r for r in rec["replies"] if not r.get("duplicate")]
        good = [r for r in replies if r["output"] is not None and not r["error"]]
        if not good:
            out["lost" if not replies else "errors"] += 1
            continue
        out["answered"] += 1
        r = good[0]
        out["by_source"][r["source"]] = out["by_source"].get(r["source"], 0) + 1
        out["by_version"][str(r["version"])] = out["by_version"].get(str(r["version"]), 0) + 1
        factor = FACTORS.get(str(r["version"]))
        want = None if factor is None else inputs[rec["input_index"]].ravel()[:2] * factor
        if want is None or not np.allclose(r["output"], want, rtol=1e-4, atol=1e-3):
            out["wrong"] += 1
            out["wrong_by_source"][r["source"]] = out["wrong_by_source"].get(r["source"], 0) + 1
            if len(out["wrong_examples"]) < 5:
                out["wrong_examples"].append({"i": rec["i"], "source": r["source"], "version": r["version"],
                                              "output": r["output"], "want": None if want is None else want.tolist()})
    return out


def spec_of(hosts: ThreeHosts) -> Any:
    """The spec as h1 reads it (its relative paths taken from h1's folder, not from here)."""
    from keel.common.spec import load_spec

    data = _toml(hosts.dirs["h1"] / "spec.toml")
    data["cluster"].update(store=str(hosts.dirs["h1"] / "store"), run_dir=str(hosts.run_dir("h1")))
    data["store"]["root"] = str(hosts.dirs["h1"] / "published")
    data["manager"]["journal_dir"] = str(hosts.run_dir("h1") / "manager")
    return load_spec(data)


def workload(hosts: ThreeHosts, out: Path, queries: int, rate: float) -> Workload:
    spec = spec_of(hosts)
    cfg = WorkloadConfig(model="scale", rate=rate, count=queries, duration_s=queries / rate + 30, input_shape=[64],
                         timeout_ms=3000, retries=3, drain_s=5, client_host="client", keep_outputs=True,
                         modes={"keel": spec.client_endpoints})
    work = Workload(cfg, out).start(hosts.cluster)
    work.wait_ready(60.0)
    work.go(time.time())
    return work


def _toml(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())


def stores_match(hosts: ThreeHosts, host: str, versions: list[str]) -> bool:
    """Whether ``host``'s store holds ``versions`` of scale byte for byte as published."""
    published, mine = ModelStore(hosts.dirs["h1"] / "published"), hosts.store(host)
    for v in versions:
        if not mine.has("scale", v):
            return False
        for f in ("manifest.json", "artifact", "container.py"):
            if sha256_file(published.root / "scale" / v / f) != sha256_file(mine.root / "scale" / v / f):
                return False
    return True


def fetch_lines(hosts: ThreeHosts, host: str) -> dict[str, int]:
    """How often the host's workers logged each fetch event."""
    counts: dict[str, int] = {}
    for log in (hosts.run_dir(host) / "logs").glob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            for event in ("model fetched", "model transfer refused, retrying", "store service unreachable: start delayed"):
                if event in line:
                    counts[event] = counts.get(event, 0) + 1
    return counts


def corrupted_fetch(hosts: ThreeHosts) -> dict[str, Any]:
    """``keel model fetch`` on h3 through a chaos proxy (on h3) that flips one byte of the
    store's replies: the transfer is refused and retried, and what lands is exact."""
    cluster = hosts.cluster
    store = spec_of(hosts).role("store")[0].config.endpoint  # tcp://H1:PORT
    address, port = store[len("tcp://"):].rsplit(":", 1)
    h3 = cluster.addresses["h3"]
    proxy = DelayProxy(cluster, "h3", [(h3, 0, address, int(port))], flip_at=FLIP_AT, name="flip").start()
    try:
        rc, out = hosts.keel("h3", "model", "fetch", "scale", "--version", "1", "--from", f"tcp://{h3}:{proxy.ports[0]}",
                             "--store", "prefetched", "--timeout", "30")
        flipped = proxy.flipped()
    finally:
        proxy.stop()
    target = ModelStore(hosts.dirs["h3"] / "prefetched")
    exact = target.has("scale", "1") and all(
        sha256_file(target.root / "scale" / "1" / f) == sha256_file(hosts.dirs["h1"] / "published" / "scale" / "1" / f)
        for f in ("manifest.json", "artifact", "container.py"))
    return {"rc": rc, "flipped": flipped is not None, "refused": out.count("model transfer refused, retrying"),
            "fetched": "model fetched" in out, "exact": exact, "output": out[-2000:]}


def run(cluster: Any, root: Path, queries: int = 600, rate: float = 200.0, rollout: bool = False,
        kill: bool = False, corrupt: bool = True) -> dict[str, Any]:
    """The scenario on ``cluster`` (hosts h1, h2, h3 and client); its figures."""
    hosts = ThreeHosts(cluster, root)
    figures: dict[str, Any] = {"queries": queries, "rate": rate, "addresses": cluster.addresses, "mode": cluster.mode}
    try:
        hosts.add_version(FACTORS["1"])
        t0 = time.monotonic()
        hosts.up("h1", "h2", "h3")
        figures["bring_up_s"] = round(time.monotonic() - t0, 1)
        figures["fetched_v1"] = {h: stores_match(hosts, h, ["1"]) for h in HOSTS}
        figures["status"] = _status(hosts)
        load = workload(hosts, root / "load", queries, rate)
        if rollout:
            time.sleep(queries / rate / 4)
            hosts.add_version(FACTORS["2"])
            t1 = time.monotonic()
            figures["rollout_output"] = hosts.must("h1", "model", "rollout", "spec.toml", "scale", "--version", "2",
                                                   "--timeout", "60")[-1500:]
            figures["rollout_s"] = round(time.monotonic() - t1, 1)
            figures["fetched_v2"] = {h: stores_match(hosts, h, ["2"]) for h in HOSTS}
        if kill:
            time.sleep(queries / rate / 4)
            figures["killed_pids"] = len(hosts.kill("h3"))
            time.sleep(2.0)
            shutil.rmtree(hosts.dirs["h3"] / "store", ignore_errors=True)  # it comes back with an empty store
            t2 = time.monotonic()
            # back as systemd would start it: the units keel render-systemd writes for h3
            figures["restarted_units"] = hosts.up_systemd("h3")
            figures["rejoined"] = hosts.wait_registered("worker-scale-2")
            figures["restart_s"] = round(time.monotonic() - t2, 1)
            figures["refetched"] = stores_match(hosts, "h3", ["2" if rollout else "1"])
        done = load.wait()
        figures["workload"] = done
        inputs = np.load(root / "load" / "inputs.npy")
        figures["replies"] = check_replies(load.records()["keel"], inputs)
        figures["fetch_events"] = {h: fetch_lines(hosts, h) for h in HOSTS}
        if corrupt:
            figures["corrupted_transfer"] = corrupted_fetch(hosts)
    finally:
        figures["down_rc"] = hosts.close()
    return figures


def _status(hosts: ThreeHosts) -> dict[str, Any]:
    """``keel status spec.toml --json`` from h2: every service of the cluster answers."""
    rc, out = hosts.keel("h2", "status", "spec.toml", "--json", "--timeout", "2")
    try:
        st = orjson.loads(out[out.index("{"):])
    except (ValueError, orjson.JSONDecodeError):
        return {"rc": rc, "error": out[-1000:]}
    return {"rc": rc, "answered": sorted(n for n, v in st["info"].items() if v is not None),
            "silent": sorted(n for n, v in st["info"].items() if v is None)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keel.chaos.multihost", description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=250.0)
    parser.add_argument("--out", default="runs/multihost")
    args = parser.parse_args(argv)
    from keel.chaos.hosts import Cluster

    out = Path(args.out).absolute()
    if out.exists():
        shutil.rmtree(out)
    cluster = Cluster([*HOSTS, "client"], run_dir=out / "cluster", netns=True)
    try:
        figures = run(cluster, out / "hosts", args.queries, args.rate, rollout=True, kill=True, corrupt=True)
    finally:
        cluster.close()
    figures["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_json(out / "multihost.json", figures)
    print(orjson.dumps({k: figures[k] for k in figures if k not in ("rollout_output",)}, option=orjson.OPT_INDENT_2).decode())
    r = figures["replies"]
    return 0 if r["lost"] == 0 and r["errors"] == 0 and r["wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
