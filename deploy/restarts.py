"""supervisord event listener: a program that dies is restarted at once, not up to 1 s later.

supervisord reaps a dead program in the loop turn that its closed output pipe wakes, and
restarts it (``autorestart``) in the next turn, which its poll starts with a 1 s timeout:
with nothing else to read, a SIGKILLed dispatcher stayed dead for up to a second while
every worker waited to register again (0.5 s on average; its own start takes ~0.15 s).
This listener watches each running program's pid (``pidfd_open``: woken by the death
itself) and then asks supervisord for the program's state over its XML-RPC socket until
it is reaped: the request wakes the poll, and the same turn's transition restarts the
program. It only wakes supervisord; what is restarted, when (``startsecs``, back-off) and
whether (a program stopped on purpose is STOPPED, never EXITED) stays supervisord's.

``deploy.supervisor`` renders it into every ``keel up`` configuration::

    [eventlistener:keel-restarts]
    command = PYTHON -m keel.deploy.restarts
    events = PROCESS_STATE_RUNNING

Standard library and supervisor only: it starts in a few ms and holds no model.
"""
from __future__ import annotations

import os
import selectors
import sys
import time
from typing import Any

#: how long after a death it keeps asking supervisord whether it has reaped the program
REAP_WAIT_S = 0.5
#: pause between those questions (each one wakes supervisord's loop once)
ASK_EVERY_S = 0.002


def _rpc() -> Any:
    from supervisor import childutils

    return childutils.getRPCInterface(os.environ).supervisor


def _log(msg: str) -> None:
    sys.stderr.write(msg + "\n")  # stdout is the event protocol's
    sys.stderr.flush()


class Watch:
    """The running programs' pids, each with a pidfd in the selector."""

    def __init__(self, rpc: Any, selector: selectors.BaseSelector):
        self.rpc, self.selector = rpc, selector
        self.fds: dict[int, tuple[str, int]] = {}  # pidfd -> (program, pid)

    def add(self, name: str, pid: int) -> None:
        if any(p == pid for _, p in self.fds.values()):
            return
        try:
            fd = os.pidfd_open(pid)
        except (ProcessLookupError, OSError):  # gone already: supervisord has seen it too
            return
        self.fds[fd] = (name, pid)
        self.selector.register(fd, selectors.EVENT_READ, "pid")

    def add_running(self) -> None:
        """Every program running now (the listener may start after them, or again)."""
        for info in self.rpc.getAllProcessInfo():
            if info.get("statename") == "RUNNING" and info.get("pid"):
                self.add(f"{info['group']}:{info['name']}", int(info["pid"]))

    def died(self, fd: int) -> None:
        self.selector.unregister(fd)
        os.close(fd)
        name, pid = self.fds.pop(fd)
        deadline = time.monotonic() + REAP_WAIT_S
        while time.monotonic() < deadline:
            try:
                info = self.rpc.getProcessInfo(name)
            except Exception as exc:  # supervisord shutting down, or the program removed
                _log(f"keel-restarts: {name} (pid {pid}) exited; supervisord: {exc}")
                return
            if info.get("pid") != pid or info.get("statename") != "RUNNING":
                _log(f"keel-restarts: {name} (pid {pid}) exited; supervisord has it {info.get('statename')}")
                return
            time.sleep(ASK_EVERY_S)


def main() -> int:
    stdin, stdout = sys.stdin.buffer, sys.stdout
    if not hasattr(os, "pidfd_open"):
        _log("keel-restarts: no pidfd_open on this system; supervisord restarts on its own clock")
    selector = selectors.DefaultSelector()
    watch = Watch(_rpc(), selector)
    selector.register(stdin, selectors.EVENT_READ, "event")
    if hasattr(os, "pidfd_open"):
        try:
            watch.add_running()
        except Exception as exc:  # its socket not open yet: the RUNNING events still come
            _log(f"keel-restarts: cannot list the programs: {exc}")
    ready = False
    while True:
        if not ready:
            stdout.write("READY\n")
            stdout.flush()
            ready = True
        for key, _ in selector.select():
            if key.data == "pid":
                watch.died(key.fd)
                continue
            line = stdin.readline()
            if not line:
                return 0  # supervisord closed our stdin: it is going away
            header = dict(x.split(":", 1) for x in line.decode().split())
            payload = stdin.read(int(header.get("len", 0))).decode()
            fields = dict(x.split(":", 1) for x in payload.split() if ":" in x)
            if hasattr(os, "pidfd_open") and fields.get("pid"):
                watch.add(f"{fields.get('groupname')}:{fields.get('processname')}", int(fields["pid"]))
            stdout.write("RESULT 2\nOK")
            stdout.flush()
            ready = False


if __name__ == "__main__":
    sys.exit(main())
