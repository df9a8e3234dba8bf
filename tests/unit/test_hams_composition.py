"""The graph operator's parts are objects that read only what they own: a part given the
role record, the shared tables and its send functions reaches nothing of another part
through ``self``. AST checks: every ``self.NAME`` a part's class reads is assigned,
defined or declared in that class itself; the operator is put together from its parts,
not from mixins, and hands none of them itself; nothing patches the operator's methods."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

GRAPH = Path(__file__).resolve().parents[2] / "services" / "graph"

#: the parts (module, class), each an object of its own
PARTS = [("batches.py", "Batches"), ("backup.py", "BackupSide"), ("links.py", "Links"), ("tables.py", "Released"),
         ("tables.py", "Inputs"), ("recovery.py", "Recovery"), ("rollback.py", "RollBack"),
         ("stash.py", "LineageStash"), ("hooks.py", "LateStates")]


def _operator_class() -> ast.ClassDef:
    tree = ast.parse((GRAPH / "operator.py").read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GraphOperator")


def _own_and_read(source: str, name: str) -> tuple[set[str], dict[str, int]]:
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name)
    own: set[str] = set()
    read: dict[str, int] = {}
    for node in cls.body:  # methods, properties and class-level attributes
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own.add(node.name)
        elif isinstance(node, ast.Assign):
            own.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            if isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            else:
                read.setdefault(node.attr, node.lineno)
    return own, read


@pytest.mark.parametrize("module,name", PARTS)
def test_a_part_reads_no_attribute_it_does_not_own(module, name):
    own, read = _own_and_read((GRAPH / module).read_text(), name)
    foreign = {attr: line for attr, line in read.items() if attr not in own}
    assert not foreign, f"{module}: {name} reads attributes it neither assigns nor defines: {foreign}"


def test_the_check_sees_a_read_of_another_parts_attribute():
    source = "class Part:\n    def __init__(self, roles):\n        self.roles = roles\n" \
             "    def f(self):\n        return self.roles.role, self.outputs\n"
    own, read = _own_and_read(source, "Part")
    assert set(read) - own == {"outputs"}


def test_the_operator_is_a_service_and_no_mixin_of_its_parts():
    assert [ast.unparse(b) for b in _operator_class().bases] == ["Service"]


def test_the_operator_hands_no_part_itself():
    """A part given the whole operator could read anything of it (``self.operator.x``,
    which the check above does not see): each gets what it needs, by name."""
    calls = [n for n in ast.walk(_operator_class())  # (the handler table's ``attrgetter(name)(self)`` aside)
             if isinstance(n, ast.Call) and not isinstance(n.func, ast.Call)]
    given_self = [ast.unparse(c.func) for c in calls
                  if any(isinstance(a, ast.Name) and a.id == "self" for a in [*c.args, *(k.value for k in c.keywords)])]
    assert not given_self, f"handed the operator itself: {given_self}"


def test_nothing_patches_the_operators_methods():
    """A hook that replaced an operator's handler (``operator._on_state = ...``) changed
    what the handler table says from outside it."""
    methods = {n.name for n in _operator_class().body if isinstance(n, ast.FunctionDef)}
    patched = []
    for path in sorted(GRAPH.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr in methods:
                patched.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not patched, patched


@pytest.mark.parametrize("module", ["recovery.py", "rollback.py"])
def test_recovery_and_roll_back_read_the_role_records_clock_and_no_other(module):
    """What times a lease, a grace or a takeover is the clock the role record was given
    (``RoleRecord.clock``), not the process's: a test's clock drives all of it."""
    tree = ast.parse((GRAPH / module).read_text())
    clocks = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
              and n.value.id == "time"]
    assert not clocks, f"{module} reads the time module's clocks at lines {clocks}"
