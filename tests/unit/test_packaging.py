"""Keel as a Python package: one top-level package, layers that point one way, a wheel that
installs and runs, and a ``keel --help`` that imports nothing heavy."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: the repository's folders that the package maps under ``keel``, lowest layer first: a
#: module may import its own layer and those before it, never one after it
LAYERS = ("common", "training", "services", "deploy", "chaos", "bench")


def _modules() -> dict[str, Path]:
    """``keel.<folder>.<module>`` -> its file, for every module of the mapped folders."""
    out = {}
    for top in LAYERS:
        for path in (REPO / top).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(("keel",) + parts)] = path
    return out


def _import_graph() -> dict[str, set[str]]:
    """module -> the Keel modules it imports anywhere in its file (lazy imports count too)."""
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = owner(name)
                if target and target != module:
                    graph[module].add(target)
    return graph


def _layer(module: str) -> int:
    return LAYERS.index(module.split(".")[1])


def test_layers_point_one_way():
    graph = _import_graph()
    assert len(graph) > 100  # the walk found the tree
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets if _layer(t) > _layer(m))
    assert upward == [], "a lower layer imports a higher one:\n" + "\n".join(upward)


def test_no_import_circles():
    graph = _import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            visit(v)
    assert circles == []


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The walk above would catch ``common`` importing ``services``."""
    tree = ast.parse("def f():\n    from keel.services.frontend import Frontend\n")
    found = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert found == ["keel.services.frontend"]
    assert _layer("keel.common.client") < _layer("keel.services.frontend")


def test_every_subpackage_is_in_the_wheel():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(project["packages"])
    for top in LAYERS:
        for init in (REPO / top).rglob("__init__.py"):
            name = ".".join(("keel",) + init.parent.relative_to(REPO).parts)
            assert name in listed, f"{name} is not in pyproject.toml's [tool.setuptools] packages"
            assert project["package-dir"][f"keel.{top}"] == top


def modules_after(call: str) -> tuple[str, set[str]]:
    """Run ``call`` (a statement using ``main`` or ``parse_args`` of the keel command) in a
    fresh interpreter; -> (what it printed, the modules it had imported)."""
    code = ("import sys; from keel.deploy.keel import main, parse_args\n"
            f"try:\n    {call}\nexcept SystemExit:\n    pass\n"
            "print('MODULES', ' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    printed, _, modules = out.stdout.partition("MODULES")
    return printed, set(modules.split())


def test_keel_help_imports_no_experiment_and_no_heavy_library():
    printed, loaded = modules_after("main(['--help'])")
    assert "experiment" in printed and "chaos" in printed  # the plug-in commands are listed
    heavy = {"torch", "numpy", "zmq", "matplotlib", "scipy", "grpc", "httptools", "pysyncobj"} & loaded
    assert not heavy, heavy
    experiments = sorted(m for m in loaded if m.startswith("keel.bench.") and m != "keel.bench.cli")
    assert experiments == []


def test_an_experiment_command_imports_only_its_own_module():
    _, loaded = modules_after("parse_args(['experiment', 'hams-timeline', '--json', 'x.json'])")
    assert "keel.bench.hams_timeline" in loaded
    assert not {"keel.bench.serf_experiment", "keel.bench.kairos_experiment", "keel.chaos.parm_tail"} & loaded


def test_the_architectures_the_cli_names_are_the_models_architectures():
    from keel.common.architectures import ARCHS
    from keel.training.cli import ARCH_NAMES, DATASET_NAMES
    from keel.training.datasets import NAMES

    assert ARCH_NAMES == ARCHS and DATASET_NAMES == NAMES


@pytest.mark.slow
def test_the_wheel_installs_one_package_with_the_api_and_the_command(tmp_path):
    """Build the wheel, install it (without dependencies: they come from this environment)
    into a scratch virtualenv, and use it from outside the repository."""
    source = tmp_path / "source"  # a copy, so that the build leaves nothing in the checkout
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "runs", "store", "build", "*.egg-info",
                                                                 "__pycache__", ".hypothesis", "docs"))
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(source)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheels.glob("keel-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    install = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                              str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-2000:]
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    ours = {p.name for p in site.iterdir()} - {"pip", "_distutils_hack", "distutils-precedence.pth", "__pycache__",
                                                "setuptools", "pkg_resources"}
    ours = {n for n in ours if not (n.startswith("pip-") or n.startswith("setuptools-"))}
    assert {n for n in ours if not n.endswith(".dist-info")} == {"keel"}, ours
    # the dependencies come from the environment running this test, after the scratch venv's
    # own site-packages (so its keel, not the repository's, is the one imported)
    (site / "zz_deps.pth").write_text("\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    api = subprocess.run([str(py), "-c", "import keel; from keel import Client, AsyncClient, KeelError, Result, "
                          "load_spec; print(keel.__file__); print(load_spec({'models': {'m': {'builtin': 'noop'}}}).models)"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert api.returncode == 0, api.stderr[-2000:]
    assert api.stdout.splitlines()[0].startswith(str(site))
    version = subprocess.run([str(env_dir / "bin" / "keel"), "--version"], capture_output=True, text=True, timeout=60,
                             cwd=tmp_path, env=env)
    assert version.returncode == 0, version.stderr[-2000:]
    assert version.stdout.strip().startswith("keel ")
