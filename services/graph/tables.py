"""The tables several parts of a graph operator share (``services.graph.operator`` wires
them): what my state holds of each predecessor, the requests it applied, how far each
frontend's replies have left the graph (``Tables``), what a serving operator holds
(``Serving``: its model, statemgr, queue, seqs and saved outputs), and what its inbox took
of each source (``Inputs``: the numbering recovery reads and resets). One object, handed to
each part that needs it, so that no part reads another's attributes to reach them.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from keel.common.ids import epoch_of
from keel.services.graph.applied import AppliedRequests
from keel.services.graph.lineage import source_of


class Released:
    """Per frontend incarnation (an origin's high bits), the frontend's notice: replies up
    to this origin left the graph. One frontend's notice frees none of another's outputs."""

    def __init__(self):
        self.seqs: dict[int, int] = {}

    def note(self, seq: int) -> None:
        incarnation = epoch_of(seq)
        self.seqs[incarnation] = max(self.seqs.get(incarnation, -1), seq)

    def covers(self, origin: int) -> bool:
        """Has the reply of ``origin`` left the graph?"""
        return origin <= self.seqs.get(epoch_of(origin), -1)


@dataclass
class Tables:
    #: per source (``lineage.source_of``), the highest of its seqs my state (a backup: the
    #: state it applied) holds
    consumed: dict[str, int] = field(default_factory=dict)
    #: the requests my state holds (a retry is answered, not applied); None: a stateless operator
    applied: AppliedRequests | None = None
    released: Released = field(default_factory=Released)


@dataclass
class Serving:
    """What a serving operator holds that its batches (``services.graph.batches``) and its
    recovery (promotions, roll-backs, fencing) both change."""
    model: object = None  # None: fenced, stepped down, a backup or a standby
    statemgr: object = None  # a primary's ``StateManager`` (None without a backup to ship to)
    own: object = None  # a degraded primary's Algorithm 2 on its own states (``lineage.Backup``)
    queue: deque = field(default_factory=deque)  # inputs taken, waiting for a batch
    next_seq: int = 0
    outputs: OrderedDict = field(default_factory=OrderedDict)  # seq -> output message, until its reply left
    held: OrderedDict = field(default_factory=OrderedDict)  # last seq of a batch -> its held sends (s1, remus)
    awaiting: set = field(default_factory=set)  # successors taken over whose ack I wait for: new outputs wait too (order)


@dataclass
class Inputs:
    """What my inbox took of each source (``lineage.source_of``): the operator's inbox
    takes inputs through ``take``; its recovery tells a predecessor's replacement what I
    took (``took``, ``took_before``), drops resent duplicates after a takeover (``taken``)
    and resets all of it when it rolls back or rejoins."""
    took: dict = field(default_factory=dict)  # source -> highest of its seqs taken
    took_before: dict = field(default_factory=dict)  # source -> its predecessor -> highest seq on that lineage
    #: after a takeover: per source, the inputs taken (predecessors resend: each input once); None: none
    taken: dict | None = None
    #: after a roll-back in place (same inbox: predecessors that have not heard of it keep
    #: sending), per source, the seq its resend starts at: a newer input that reaches me
    #: first is dropped (it comes again in that resend, in order)
    resync: dict = field(default_factory=dict)
    #: a combining join: (reply_to, origin) -> predecessor -> its request (origins are unique per frontend only)
    joining: dict = field(default_factory=dict)

    def take(self, msg, consumed: dict[str, int]) -> bool:
        """Is ``msg`` (a ``GraphRequest``) new to me? Records what it takes; ``consumed``
        is what my state holds of each source (``Tables.consumed``)."""
        source = source_of(msg.sender, msg.seq)
        if msg.seq <= self.took.get(source, -1) and self.taken is None:
            return False  # a resent input taken already (each source's seqs arrive in order, resends aside)
        if source in self.resync:
            if msg.seq > self.resync[source]:
                return False  # sent before the sender heard of my roll-back: its resend carries it, in order
            if msg.seq == self.resync[source]:
                del self.resync[source]  # the resend (or the next new input) arrived: in order again
        if msg.lineage:  # for a predecessor's replacement (``Recovery.report_taken``, roll-backs)
            self.took[source] = max(msg.seq, self.took.get(source, -1))
            entry, before = msg.lineage[-1], self.took_before.setdefault(source, {})
            came_from = source_of(entry.predecessor, entry.predecessor_seq)
            before[came_from] = max(before.get(came_from, -1), entry.predecessor_seq)
        if self.taken is not None:  # after a takeover predecessors resend: each input once
            taken = self.taken.setdefault(source, set())
            if msg.seq <= consumed.get(source, -1) or msg.seq in taken:
                return False
            taken.add(msg.seq)
        return True
