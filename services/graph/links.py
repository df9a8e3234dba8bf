"""Where a graph operator's messages go (``services.graph.operator`` wires it and hands it
to each part as its send functions): outputs to successors or to a request's frontend,
durability notices (Algorithm 2's notify), acks to predecessors, and anything to a peer
by name. The peer names' endpoints are the operator's ``config.peers``, which follow the
manager's feed (a group's new holder); several frontends may serve the graph.
"""
from __future__ import annotations

from keel.common import tracing, transport
from keel.common.protocol.messages import GraphAck, GraphDurable, GraphRequest
from keel.common.spec.graph import FRONTEND


class Links:
    """Parameters: ``op`` my operator, ``graph`` its graph (``read_graph``), ``peers`` the
    connections (``transport.Peers``), ``endpoints`` peer name -> endpoint (changed in
    place as holders move), ``frontends`` every frontend's endpoint (empty: the one in
    ``endpoints``)."""

    def __init__(self, op: str, graph, peers: transport.Peers, endpoints: dict[str, str], frontends):
        self.op, self.graph, self.peers, self.endpoints, self.frontends = op, graph, peers, endpoints, frontends
        self.succs = graph.successors(op)

    def to(self, name: str, msg) -> None:
        """``msg`` to the peer ``name`` (an operator, ``NAME.backup``, ``frontend``)."""
        self.peers.send(self.endpoints[name], msg)

    def send(self, endpoint: str, msg) -> None:
        self.peers.send(endpoint, msg)

    def send_on(self, target: str, msg: GraphRequest) -> None:
        """An output to a successor; one leaving the graph to its request's frontend."""
        endpoint = msg.reply_to if target == FRONTEND and msg.reply_to else self.endpoints[target]
        if tracing.ON:
            tracing.operator_sent(self.op, msg)
        self.peers.send(endpoint, msg)

    def frontend_endpoints(self) -> list[str]:
        """Every frontend serving the graph (durability notices and acks go to each)."""
        return list(self.frontends) or [self.endpoints[FRONTEND]]

    def notice_targets(self, targets: list[str]) -> list[str]:
        """Endpoints of peer names, ``FRONTEND`` standing for every frontend."""
        return [e for t in targets for e in (self.frontend_endpoints() if t == FRONTEND else [self.endpoints[t]])]

    def announce_durable(self, epoch: int, seq: int, successors: bool = False, primary: bool = False) -> None:
        """Algorithm 2's notify: my state up to ``seq`` is durable, to every frontend and the
        backups of the next stateful models; after a takeover or a roll-back also to my
        successors (they drop what came after it), and on a backup to my primary."""
        targets = [FRONTEND] + [f"{n}.backup" for n in self.graph.next_stateful(self.op)]
        targets += [n for n in self.succs if n != FRONTEND] if successors else []
        targets += [self.op] if primary else []
        note = GraphDurable(self.op, epoch, seq)
        for endpoint in self.notice_targets(targets):
            self.peers.send(endpoint, note)

    def ack_pred(self, pred: str, operator: str, epoch: int, seqs: dict[str, int]) -> None:
        """Tell ``pred`` the highest of its seqs ``operator``'s state (or successors) hold,
        from ``seqs`` (by ``source_of``). The frontends get one ack per frontend incarnation
        seen, each to every frontend: one resends above the ack of its own incarnation, and
        everything when none carries its incarnation (-1 alone: nothing of anyone's is held)."""
        if pred != FRONTEND:
            self.peers.send(self.endpoints[pred], GraphAck(operator, epoch, seqs.get(pred, -1)))
            return
        acks = [seq for source, seq in seqs.items() if source.partition("#")[0] == FRONTEND and seq >= 0] or [-1]
        for endpoint in self.frontend_endpoints():
            for seq in acks:
                self.peers.send(endpoint, GraphAck(operator, epoch, seq))
