"""systemd units for one host of a multi-host cluster spec.

``render_systemd(spec, host, out_dir)`` fills the templates in deploy/systemd/ and writes
what that host needs::

    OUT/keel-service@.service    the service template (instance = service name)
    OUT/keel.target              Wants= every service of this host
    OUT/keel/NAME.env            KEEL_ROLE and KEEL_CONFIG=@ETC/NAME.json, per service (and a
                                 worker's CUDA_VISIBLE_DEVICES when it is placed on a GPU;
                                 KEEL_SPARE_LOCK for a dispatcher with ``spare = true``, whose
                                 hot spare is the instance NAME-spare, with the same env)
    OUT/keel/NAME.json           the service's validated config

Install on the host with ``cp OUT/*.service OUT/keel.target /etc/systemd/system/``,
``cp -r OUT/keel /etc/`` (or wherever ``etc_dir`` says), ``systemctl daemon-reload`` and
``systemctl enable --now keel.target``.

Example
-------
>>> from keel.common.spec import load_spec
>>> spec = load_spec({"models": {"m": {"builtin": "noop"}}})
>>> paths = render_systemd(spec, "local", "/tmp/keel-units")     # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from keel.common import config as cfg
from keel.common import operations
from keel.common.devices import program_env
from keel.common.spec import ClusterSpec, SpecError

TEMPLATES = Path(__file__).parent / "systemd"


def render_systemd(spec: ClusterSpec, host: str, out_dir: str | os.PathLike, *, python: str = sys.executable,
                   workdir: str | None = None, etc_dir: str = "/etc/keel", store: str | None = None) -> list[Path]:
    """Write the units, env files and configs of ``host``'s services; returns the paths.

    ``python`` is the interpreter (of a venv with keel installed) on the target host,
    ``workdir`` the services' working directory there (default: the current one), and
    ``etc_dir`` where the files under ``OUT/keel/`` will be installed, ``store`` the model
    store folder there (default: the spec's, as resolved on this machine). With a
    ``[store]`` table the workers fetch into it what it lacks (``common.modelfetch``), so
    the host's store may start empty.
    """
    if host not in spec.hosts:
        raise SpecError(f"host {host!r} is not in [hosts] ({sorted(spec.hosts)})")
    services = spec.by_host()[host]
    out = Path(out_dir)
    (out / "keel").mkdir(parents=True, exist_ok=True)
    values = {"@PYTHON@": python, "@WORKDIR@": workdir or os.getcwd(), "@ETC@": etc_dir.rstrip("/"),
              "@CLUSTER@": spec.name, "@HOST@": host,
              "@WANTS@": " ".join(f"keel-service@{n}.service" for s in services for n in _instances(s))}
    for value in values.values():
        if "\n" in value or "%" in value:
            raise SpecError(f"{value!r}: systemd unit values may not hold '%' or newlines")
    written = []
    for template in ("keel-service@.service", "keel.target"):
        text = (TEMPLATES / template).read_text()
        for key, value in values.items():
            text = text.replace(key, value)
        written.append(out / template)
        written[-1].write_text(text)
    for svc in services:
        conf = out / "keel" / f"{svc.name}.json"
        config = dataclasses.replace(svc.config, store=store) if store and hasattr(svc.config, "store") else svc.config
        conf.write_text(cfg.to_json(config) + "\n")
        text = (f"# Keel service {svc.name} (role {svc.role}) of cluster {spec.name} on host {host}\n"
                f"KEEL_ROLE={svc.role}\nKEEL_CONFIG=@{values['@ETC@']}/{svc.name}.json\n"
                + (f"KEEL_CURVE_KEYS={svc.curve_keys}\n" if svc.curve_keys else "")
                + (f"KEEL_SPARE_LOCK={SPARE_LOCKS}/keel-{spec.name}-{svc.name}.lock\n" if _spare(svc) else "")
                + "".join(f"{k}={v}\n" for k, v in program_env(svc.config).items())  # a worker's GPU
                + "".join(f"{k}={v}\n" for k, v in operations.environment(svc).items()))
        for name in _instances(svc):  # a hot spare (``spare = true``) is a second instance, started alike
            env = out / "keel" / f"{name}.env"
            env.write_text(text)
            written.append(env)
        written.append(conf)
    return written


#: where a service and its hot spare keep the lock they take turns holding (``services.serve``)
SPARE_LOCKS = "/run/lock"


def _spare(svc) -> bool:
    return bool(getattr(svc.config, "spare", False))


def _instances(svc) -> list[str]:
    """The unit instances of ``svc``: its own, and its hot spare's when it has one."""
    from keel.deploy.programs import SPARE

    return [svc.name, svc.name + SPARE] if _spare(svc) else [svc.name]
