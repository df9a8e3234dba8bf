"""Does a JSON-shaped value (parsed TOML or JSON) fit a type annotation, and how to say
what was expected. The one type checker of the config dataclasses and the cluster spec.

Annotations are the usual ones: ``int``, ``float`` (an int fits), ``str``, ``bool``,
``dict`` (a table), ``list[int]``, ``dict[str, float]``, ``X | None``.

Example
-------
>>> fits(3, float), fits(True, int), fits([1, 2], list[int])
(True, False, True)
>>> describe(list[int] | None)
'a list of integers or nothing'
"""
from __future__ import annotations

import types
import typing
from typing import Any

_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a table",
          type(None): "nothing", list: "a list"}
_PLURAL = {int: "integers", float: "numbers", str: "strings", bool: "booleans", dict: "tables"}


def fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits the annotation ``hint`` (an int fits a float, a bool no number)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        return isinstance(value, list) and all(fits(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(fits(k, args[0]) and fits(v, args[1]) for k, v in value.items())
    return isinstance(value, hint) if isinstance(hint, type) else True


def describe(hint: Any) -> str:
    """What ``hint`` asks for, in words ("an integer", "a list of numbers or nothing")."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is list:
        return f"a list of {_PLURAL.get(args[0], describe(args[0]))}"
    if origin is dict:
        return f"a table of {_PLURAL.get(args[1], describe(args[1]))}"
    if isinstance(hint, type) and hint in _WORDS:
        return _WORDS[hint]
    return getattr(hint, "__name__", str(hint))
