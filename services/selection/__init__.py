"""Clipper's model selection layer (§5): policies over several models, their state kept
apart from them so each context has its own, and the store of those states.

- ``policies``: the interface of Listing 2 (``init``, ``select``, ``combine``, ``observe``)
  and Exp3 (§5.1), Exp4 (§5.2), robust (§5.2.1), default and a fixed A/B split.
- ``contexts``: one selection state per (application, context), created on first use,
  kept in an embedded SQLite database so a restart does not forget what was learned.

Not wired into the frontend yet (issue 13): this is the part that needs no process.
"""
