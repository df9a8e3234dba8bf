"""Lineage (HAMS Algorithm 1) and durability (Algorithm 2) as pure code: no sockets, no
clocks, so tests can deliver state and notify messages late, twice or out of order.

- ``extend``: an operator numbers what it emits; the request's lineage grows by one
  ``LineageEntry`` (predecessor, its seq, operator, my seq); ``join`` concatenates the
  lineages of a join's inputs.
- ``DurableSeqs``: the highest durable seq per stateful operator, learnt from notifies
  (monotone, so a late or duplicated notify changes nothing).
- ``Backup``: a backup's Algorithm 2. A shipped state (the whole state after batch n, with
  its requests' lineage) is applied only when, for every request in it and every
  previous stateful model on its lineage, that model's durable seq is >= the seq in the
  lineage (the paper prints "<="; NOTES.md). States apply in batch order; a duplicate is
  dropped; an applied state returns the notify (operator, seq of the batch's last
  request) for every next stateful model.
- ``ReleaseGate``: the frontend as the last stateful node (§IV-D): a reply leaves only
  when every stateful state on its lineage is durable.

Example
-------
>>> d = DurableSeqs()
>>> lin = extend([], "frontend", 7, "gru1", 3)
>>> d.covers(lin, {"gru1"})
False
>>> d.notify("gru1", 5); d.covers(lin, {"gru1"})
True
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from keel.common.ids import epoch_of
from keel.common.protocol.fields import LineageEntry
from keel.common.spec.graph import FRONTEND


def source_of(sender: str, seq: int) -> str:
    """Whose numbering ``seq`` is: an operator's, or a frontend incarnation's (the origin's
    high bits, ``keel.common.ids``). Per source seqs arrive in order (resends aside): several
    frontends interleave their origins on one edge, so "taken already" is per incarnation."""
    incarnation = epoch_of(seq) if sender == FRONTEND and seq >= 0 else 0
    return f"{sender}#{incarnation}" if incarnation else sender


def extend(lineage: list[LineageEntry], predecessor: str, predecessor_seq: int, operator: str,
           seq: int) -> list[LineageEntry]:
    """Algorithm 1: the lineage a request carries after ``operator`` numbered it ``seq``."""
    return [*lineage, LineageEntry(predecessor, predecessor_seq, operator, seq)]


def number(rows, first: int, operator: str, combining: bool, stateful: bool):
    """Algorithm 1 for a batch: ``rows`` (``GraphRequest``) numbered ``first``, ``first`` + 1,
    ... by ``operator``. Returns each row's lineage, all of their entries, and (``stateful``)
    per source the highest of its seqs in the batch (what the state holds after it).
    ``combining``: the rows are a combining join's, their other inputs' entries still
    unnumbered (seq -1)."""
    took: dict[str, int] = {}
    row_lineages, lineages = [], []
    for seq, r in enumerate(rows, start=first):
        if stateful:
            source = r.sender if r.sender != FRONTEND else source_of(r.sender, r.seq)
            took[source] = max(took.get(source, -1), r.seq)
        if combining:
            lineage = [e for e in r.lineage if e.seq >= 0]
            lineage += [LineageEntry(e.predecessor, e.predecessor_seq, operator, seq) for e in r.lineage if e.seq < 0]
        else:
            lineage = r.lineage
        lineage = extend(lineage, r.sender, r.seq, operator, seq)
        row_lineages.append(lineage)
        lineages.extend(lineage)
    return row_lineages, lineages, took


def join(lineages: Iterable[list[LineageEntry]]) -> list[LineageEntry]:
    """A join's output depends on all its inputs: their lineages concatenated, each entry once."""
    seen: dict[LineageEntry, None] = {}
    for lineage in lineages:
        for entry in lineage:
            seen.setdefault(entry, None)
    return list(seen)


def lineage_of(entries: Iterable[LineageEntry], operator: str, seq: int) -> list[LineageEntry]:
    """The lineage of ``operator``'s output ``seq`` out of a batch's entries (a shipped
    state's): its entry and, back to the frontend, every entry it came from."""
    by_output = {}
    for e in entries:
        by_output.setdefault((e.operator, e.seq), []).append(e)
    out, todo, seen = [], [(operator, seq)], set()
    while todo:
        key = todo.pop()
        for e in by_output.get(key, []):
            if e not in seen:
                seen.add(e)
                out.append(e)
                todo.append((e.predecessor, e.predecessor_seq))
    return out[::-1]


class DurableSeqs:
    """Highest durable seq per stateful operator; notifies only ever raise it."""

    def __init__(self) -> None:
        self.seqs: dict[str, int] = {}

    def notify(self, operator: str, seq: int) -> bool:
        """Record a durability notice; True if it raised the operator's durable seq."""
        if seq > self.seqs.get(operator, -1):
            self.seqs[operator] = seq
            return True
        return False

    def of(self, operator: str) -> int:
        return self.seqs.get(operator, -1)

    def covers(self, lineage: Iterable[LineageEntry], stateful: set[str] | frozenset[str], skip: str = "") -> bool:
        """Algorithm 2's condition for one request: every stateful model on its lineage
        (but ``skip``, the checker itself) has a durable seq >= the seq it gave it."""
        return all(e.seq <= self.seqs.get(e.operator, -1) for e in lineage
                   if e.operator in stateful and e.operator != skip)


@dataclass
class ShippedState:
    """The whole state of a stateful operator after one batch, as its backup receives it:
    the batch's seqs (first..last), every request's lineage, the state tensors and the
    batch's outputs (kept because a stateful operator cannot re-execute)."""

    operator: str
    epoch: int
    first_seq: int
    last_seq: int
    lineages: list[list[LineageEntry]]
    state: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)


class Backup:
    """A stateful operator's backup: Algorithm 2 over the states its primary ships.

    ``receive`` queues a state; ``on_notify`` records a predecessor's durability; both
    return the states applied as a result, oldest first. ``applied`` is the newest applied
    state (what HAMS II promotes); ``max_applied_seq`` its last seq (-1: none yet)."""

    def __init__(self, operator: str, stateful: Iterable[str], epoch: int = 1):
        self.operator, self.epoch = operator, epoch
        self.stateful = frozenset(stateful)
        self.durable = DurableSeqs()
        self.pending: dict[int, ShippedState] = {}  # first_seq -> state
        self.applied: ShippedState | None = None
        self.max_applied_seq = -1
        #: the whole state the applied states make (``services.graph.statemgr.Folded``: a
        #: state may ship only the rows its update touched); the operator folds each in
        self.folded = None

    def receive(self, state: ShippedState) -> list[ShippedState]:
        if state.epoch != self.epoch or state.operator != self.operator or state.last_seq <= self.max_applied_seq:
            return []  # another incarnation's, or a duplicate of what is applied
        self.pending.setdefault(state.first_seq, state)
        return self._apply_ready()

    def forget_after(self, operator: str, seq: int) -> int:
        """``operator``'s backup took over with its state up to ``seq``: pending states that
        took its outputs above it depend on a state that died; they never apply. Returns
        how many were dropped."""
        void = [k for k, st in self.pending.items()
                if any(e.operator == operator and e.seq > seq for lin in st.lineages for e in lin)]
        for k in void:
            del self.pending[k]
        return len(void)

    def on_notify(self, operator: str, seq: int) -> list[ShippedState]:
        return self._apply_ready() if self.durable.notify(operator, seq) else []

    def ready(self, state: ShippedState) -> bool:
        return all(self.durable.covers(lin, self.stateful, skip=self.operator) for lin in state.lineages)

    def _apply_ready(self) -> list[ShippedState]:
        out = []
        while True:
            state = self.pending.get(self.max_applied_seq + 1)
            if state is None or not self.ready(state):
                return out
            del self.pending[state.first_seq]
            self.applied, self.max_applied_seq = state, state.last_seq  # overwrite, not merge
            out.append(state)


class ReleaseGate:
    """The frontend's hold (§IV-D): replies wait until their lineage is durable.

    ``hold(key, lineage)`` returns True when the reply must wait; ``on_notify`` returns
    the keys released by a durability notice, in arrival order."""

    def __init__(self, stateful: Iterable[str]):
        self.stateful = frozenset(stateful)
        self.durable = DurableSeqs()
        self.waiting: dict = {}  # key -> lineage, oldest first

    def hold(self, key, lineage: list[LineageEntry]) -> bool:
        if self.durable.covers(lineage, self.stateful):
            return False
        self.waiting[key] = lineage
        return True

    def on_notify(self, operator: str, seq: int) -> list:
        if not self.durable.notify(operator, seq):
            return []
        released = [k for k, lin in self.waiting.items() if self.durable.covers(lin, self.stateful)]
        for k in released:
            del self.waiting[k]
        return released
