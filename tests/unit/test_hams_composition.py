"""The graph operator's parts are objects that read only what they own: a part given the
role record, the shared tables and its send functions reaches nothing of another part
through ``self``. An AST check: every ``self.NAME`` a part's class reads is assigned,
defined or declared in that class itself."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

GRAPH = Path(__file__).resolve().parents[2] / "services" / "graph"

#: the parts made objects (module, class); recovery.py is still a mixin of GraphOperator
#: and joins this list once it is an object too
PARTS = [("batches.py", "Batches"), ("backup.py", "BackupSide"), ("links.py", "Links"), ("tables.py", "Released")]


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
