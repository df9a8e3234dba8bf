"""The operator kinds a graph spec may name (``[graphs.NAME.operators.X] kind``): the
builtins' table and ``module:Class`` for one's own. What a spec needs of a kind, whether it
keeps state, the table says without importing the class: reading a spec imports no torch
and sets no threads (the operator process sets its own).

Example
-------
>>> operator_stateful("gru"), operator_stateful("mlp")
(True, False)
"""
from __future__ import annotations

import importlib

#: the builtin operator kinds a spec may name: the class that implements each
#: (``keel.services.graph.models``, imported only by a process that runs one) and whether it
#: is stateful, which the spec needs: reading a spec imports no torch and sets no threads
BUILTIN_OPERATORS: dict[str, tuple[str, bool]] = {
    "mlp": ("keel.services.graph.models:MLP", False),
    "lenet": ("keel.services.graph.models:LeNet", False),
    "gru": ("keel.services.graph.models:GRU", True),
    "online_mlp": ("keel.services.graph.models:OnlineMLP", True),
}


def operator_class(kind: str) -> type:
    """The operator class a spec's ``kind`` names: a builtin or ``module:Class``; a
    ``ValueError`` says why another name is not one."""
    target = BUILTIN_OPERATORS[kind][0] if kind in BUILTIN_OPERATORS else kind
    module, sep, name = target.partition(":")
    if not sep:
        raise ValueError(f"{kind!r} is neither a builtin ({sorted(BUILTIN_OPERATORS)}) nor 'module:Class'")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and isinstance(getattr(cls, "stateful", None), bool)
            and callable(getattr(cls, "compute", None))):
        raise ValueError(f"{kind} is not a StatelessOperator or StatefulOperator")
    return cls


def operator_stateful(kind: str) -> bool:
    """Whether ``kind``'s operator keeps state: a builtin's from the table (nothing
    imported), a ``module:Class``'s from its class."""
    if kind in BUILTIN_OPERATORS:
        return BUILTIN_OPERATORS[kind][1]
    return operator_class(kind).stateful
