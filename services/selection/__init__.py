"""Clipper's model selection layer (§5): policies over several models, their state kept
apart from them so each context has its own, and the store of those states.

- ``policies``: the interface of Listing 2 (``init``, ``select``, ``combine``, ``observe``)
  and Exp3 (§5.1), Exp4 (§5.2), robust (§5.2.1), default and a fixed A/B split.
- ``contexts``: one selection state per (application, context), created on first use,
  kept in an embedded SQLite database so a restart does not forget what was learned.
- ``feedback``: the frontend's bounded, time-limited log of answered calls for feedback.
- ``runtime``: what the frontend does with them per call (select, combine, mark the
  answer, learn from feedback) and the ``keel_selection_*`` metrics.
"""
