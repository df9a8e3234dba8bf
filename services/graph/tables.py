"""The tables several parts of a graph operator share (``services.graph.operator`` wires
them): what my state holds of each predecessor, the requests it applied, how far each
frontend's replies have left the graph (``Tables``), and what a serving operator holds
(``Serving``: its model, statemgr, queue, seqs and saved outputs). One object, handed to each part that needs it, so
that no part reads another's attributes to reach them.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from keel.common.ids import epoch_of
from keel.services.graph.applied import AppliedRequests


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
