"""One ``[hosts]`` entry of a cluster spec: the address others connect to, the address its
services bind when that differs (``common.spec.operations``), and the GPUs it offers
(``common.spec.gpus``).

    [hosts]
    a = "10.0.0.5"                                          # an address alone
    b = { address = "203.0.113.5", bind = "0.0.0.0" }       # advertise one, bind another
    c = { address = "10.0.0.7", gpus = [0, 1] }             # GPU indices, or GPU-/MIG- UUIDs

Example
-------
>>> from keel.common.spec.tables import Table
>>> read_host(Table({"a": {"address": "a.example", "bind": "0.0.0.0", "gpus": [0]}}, "hosts"), "a")
Host(address='a.example', bind='0.0.0.0', gpus=['0'])
"""
from __future__ import annotations

from typing import NamedTuple

from keel.common.spec.tables import Table, check_address, fail


class Host(NamedTuple):
    address: str
    bind: str | None  # None: its services bind ``address``
    gpus: list[str]


def read_host(hosts: Table, host: str) -> Host:
    """``host``'s entry in ``[hosts]``: an address, or a table with ``address`` and any of
    ``bind`` and ``gpus``."""
    value = hosts.take(host, str | dict)
    if isinstance(value, str):
        return Host(value, None, [])
    t = Table(value, hosts.key(host))
    address = t.take("address", str)
    check_address(t.key("address"), address)
    bind = t.take("bind", str, None)
    if bind is not None and bind != "*":
        check_address(t.key("bind"), bind)
    gpus = [str(g) for g in t.take("gpus", list[int | str], [])]
    for g in gpus:
        if not (g.isdigit() or g.startswith(("GPU-", "MIG-"))):
            fail(t.key("gpus"), f"{g!r} is neither a GPU index nor a GPU-/MIG- UUID")
    if len(set(gpus)) != len(gpus):
        fail(t.key("gpus"), "lists a GPU twice")
    t.finish()
    return Host(address, None if bind == address else bind, gpus)
