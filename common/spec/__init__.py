"""The cluster spec: one TOML file that says which Keel processes run where.

``load_spec`` (``common.spec.load``) reads it (or a dict of the same shape), checks every key, allocates ports,
wires each service's endpoints to its peers, and returns a ``ClusterSpec``: a list of
``ServiceLaunch`` (name, role, host, validated config) that ``keel up`` hands to
supervisord and the chaos harness starts itself. Every error is a ``SpecError`` whose
message starts with the key path at fault, e.g. ``models.digits.k: must be 0 or >= 2``.

Format (full reference in docs/deploy.md)::

    [cluster]
    name = "local"            # default "keel"
    store = "store"           # model store; relative paths are taken from the cwd
    run_dir = "runs/local"    # default "runs/<name>"
    base_port = 7000          # bound endpoints get base_port, base_port+1, ... per address
    metrics_base_port = 9100  # optional: one prometheus port per service, per address

    [hosts]                   # default: local = "127.0.0.1"
    local = "127.0.0.1"

    [frontend]                # host = "local" or hosts = [...] (one frontend each);
    cache_size = 0            # any other key is a FrontendConfig option

    [dispatcher]              # host, plus DispatcherConfig options
    [encoder] / [decoder]     # host (default: the dispatcher's), plus their options
    [worker]                  # WorkerConfig options for every worker

    [models.digits]
    store_name = "digits-mlp" # or builtin = "noop" | "sleep"
    workers = 4
    k = 2                     # ParM coding-group size; mode = "none" | "equal" | "parm"

Example
-------
>>> spec = load_spec({"models": {"m": {"builtin": "noop", "workers": 2}}})
>>> [s.name for s in spec.services]
['frontend', 'dispatcher', 'worker-m-0', 'worker-m-1']

Modules: ``tables`` (typed table reading, ``SpecError``), ``models`` (``[models.NAME]``
resolved against the model store), ``ports`` (port allocation), ``topology`` (which
services run where and how they connect), ``load`` (``load_spec``).
"""
from keel.common.spec.load import load_spec
from keel.common.spec.tables import SpecError, run_dir_of
from keel.common.spec.topology import ClusterSpec, ServiceLaunch

__all__ = ["ClusterSpec", "ServiceLaunch", "SpecError", "load_spec", "run_dir_of"]
