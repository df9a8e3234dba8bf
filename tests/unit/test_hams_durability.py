"""HAMS Algorithms 1-2 under a hostile network: a hypothesis state machine runs a graph
frontend -> A (stateful) -> B (stateful) -> frontend, and delivers the state and notify
messages late, out of order and twice. No backup may apply a state before the states it
depends on are durable, no reply may leave before its lineage is durable, and once
everything is delivered every reply leaves with the output an offline run gives."""
from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from keel.services.graph.lineage import Backup, DurableSeqs, ReleaseGate, ShippedState, extend, join

STATEFUL = {"A", "B"}


class Primary:
    """A stateful primary whose state is a running sum; it numbers what it emits."""

    def __init__(self, name: str):
        self.name, self.total, self.next_seq = name, 0, 0

    def run_batch(self, items: list[tuple[int, list, str, int]]) -> tuple[list, ShippedState]:
        out, lineages = [], []
        first = self.next_seq
        for value, lineage, pred, pred_seq in items:
            self.total += value
            lin = extend(lineage, pred, pred_seq, self.name, self.next_seq)
            out.append((self.total, lin, self.next_seq))
            lineages.append(lin)
            self.next_seq += 1
        return out, ShippedState(self.name, 1, first, self.next_seq - 1, lineages, {"total": self.total})


class HostileNetwork(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.a, self.b = Primary("A"), Primary("B")
        self.backups = {"A": Backup("A", STATEFUL), "B": Backup("B", STATEFUL)}
        self.gate = ReleaseGate(STATEFUL)
        self.net: list[tuple] = []  # ("state", backup, ShippedState) | ("notify", target, op, seq)
        self.fe_seq = 0
        self.a_queue: list = []
        self.b_queue: list = []
        self.replies: dict[int, tuple[int, list]] = {}  # frontend seq -> (output, lineage)
        self.released: list[int] = []
        self.inputs: list[int] = []
        self.applied_seqs: dict[str, list[tuple[int, int]]] = {"A": [], "B": []}  # (first, last) in apply order

    def _truly_durable(self, lineage) -> bool:
        return all(e.seq <= self.backups[e.operator].max_applied_seq for e in lineage if e.operator in STATEFUL)

    def _applied(self, name: str, states: list[ShippedState]) -> None:
        for s in states:  # Algorithm 2: the applied state's dependencies are durable now
            self.applied_seqs[name].append((s.first_seq, s.last_seq))
            for lin in s.lineages:
                assert all(e.seq <= self.backups[e.operator].max_applied_seq for e in lin
                           if e.operator in STATEFUL and e.operator != name), (name, lin)
            for target in ("A", "B", "frontend"):  # notify next stateful models (and the frontend)
                if target != name:
                    self.net.append(("notify", target, name, s.last_seq))

    @rule(values=st.lists(st.integers(0, 9), min_size=1, max_size=3))
    def client_requests(self, values):
        for v in values:
            self.inputs.append(v)
            self.a_queue.append((v, [], "frontend", self.fe_seq))
            self.fe_seq += 1

    @precondition(lambda self: self.a_queue)
    @rule(n=st.integers(1, 4))
    def a_batch(self, n):
        batch, self.a_queue = self.a_queue[:n], self.a_queue[n:]
        out, state = self.a.run_batch(batch)
        self.net.append(("state", "A", state))
        self.b_queue += [(total, lin, "A", seq) for total, lin, seq in out]  # early release (NSPB)

    @precondition(lambda self: self.b_queue)
    @rule(n=st.integers(1, 4))
    def b_batch(self, n):
        batch, self.b_queue = self.b_queue[:n], self.b_queue[n:]
        out, state = self.b.run_batch(batch)
        self.net.append(("state", "B", state))
        for total, lin, _ in out:
            fe = lin[0].predecessor_seq
            self.replies[fe] = (total, lin)
            if not self.gate.hold(fe, lin):
                self._release([fe])

    def _release(self, keys):
        for k in keys:
            assert self._truly_durable(self.replies[k][1]), f"reply {k} left before its lineage was durable"
            assert k not in self.released, "a reply left twice"
            self.released.append(k)

    @precondition(lambda self: self.net)
    @rule(data=st.data(), duplicate=st.booleans())
    def deliver(self, data, duplicate):
        i = data.draw(st.integers(0, len(self.net) - 1))  # any message: reorders and delays
        msg = self.net[i] if duplicate else self.net.pop(i)
        if msg[0] == "state":
            self._applied(msg[1], self.backups[msg[1]].receive(msg[2]))
        elif msg[1] == "frontend":
            self._release(self.gate.on_notify(msg[2], msg[3]))
        else:
            self._applied(msg[1], self.backups[msg[1]].on_notify(msg[2], msg[3]))

    @invariant()
    def applied_in_order(self):
        for seqs in self.applied_seqs.values():  # each state once, in batch order, none skipped
            assert [first for first, _ in seqs] == [0, *(last + 1 for _, last in seqs)][:len(seqs)]

    def teardown(self):
        # Drain: run every batch, deliver everything; all replies leave, equal to offline.
        while self.a_queue:
            self.a_batch(4)
        while self.b_queue:
            self.b_batch(4)
        while self.net:
            msg = self.net.pop(0)
            if msg[0] == "state":
                self._applied(msg[1], self.backups[msg[1]].receive(msg[2]))
            elif msg[1] == "frontend":
                self._release(self.gate.on_notify(msg[2], msg[3]))
            else:
                self._applied(msg[1], self.backups[msg[1]].on_notify(msg[2], msg[3]))
        assert sorted(self.released) == list(range(self.fe_seq))
        a_totals = [sum(self.inputs[:i + 1]) for i in range(len(self.inputs))]
        offline = [sum(a_totals[:i + 1]) for i in range(len(a_totals))]
        assert [self.replies[k][0] for k in range(self.fe_seq)] == offline


TestHostileNetwork = HostileNetwork.TestCase
TestHostileNetwork.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class HostileJoin(RuleBasedStateMachine):
    """Fan-out and a combining join, all stateful: frontend -> A and C -> J -> frontend. J's
    states depend on both A and C (a join concatenates its inputs' lineage); states and
    notifies are delayed, reordered, duplicated, and a stale incarnation (epoch 0) ships
    states too. No backup applies early, no reply leaves early, and once everything is
    delivered the replies equal an offline run."""

    def __init__(self):
        super().__init__()
        self.prim = {n: Primary(n) for n in ("A", "C", "J")}
        self.stateful = {"A", "C", "J"}
        self.backups = {n: Backup(n, self.stateful) for n in self.prim}
        self.gate = ReleaseGate(self.stateful)
        self.net: list[tuple] = []
        self.queues: dict[str, list] = {"A": [], "C": []}
        self.joining: dict[int, dict[str, tuple]] = {}  # frontend seq -> input -> (total, lineage, seq)
        self.j_queue: list = []
        self.inputs: list[int] = []
        self.replies: dict[int, tuple[int, list]] = {}
        self.released: list[int] = []

    def _check_applied(self, name, states):
        for s in states:
            assert s.epoch == 1, f"{name}'s backup applied a stale incarnation's state"
            for lin in s.lineages:
                assert all(e.seq <= self.backups[e.operator].max_applied_seq for e in lin
                           if e.operator in self.stateful and e.operator != name), (name, lin)
            for target in ("J", "frontend") if name != "J" else ("frontend",):  # the next stateful models
                self.net.append(("notify", target, name, s.last_seq))

    def _release(self, keys):
        for k in keys:
            lin = self.replies[k][1]
            assert all(e.seq <= self.backups[e.operator].max_applied_seq for e in lin if e.operator in self.stateful)
            assert k not in self.released
            self.released.append(k)

    @rule(values=st.lists(st.integers(0, 9), min_size=1, max_size=3))
    def client_requests(self, values):
        for v in values:
            fe = len(self.inputs)
            self.inputs.append(v)
            self.queues["A"].append((v, [], "frontend", fe))
            self.queues["C"].append((2 * v, [], "frontend", fe))

    @precondition(lambda self: self.queues["A"] or self.queues["C"])
    @rule(op=st.sampled_from(["A", "C"]), n=st.integers(1, 4))
    def fan_out_batch(self, op, n):
        batch, self.queues[op] = self.queues[op][:n], self.queues[op][n:]
        if not batch:
            return
        out, state = self.prim[op].run_batch(batch)
        self.net.append(("state", op, state))
        if state.last_seq % 3 == 0:  # a stale incarnation (epoch 0) ships a state of its own
            self.net.append(("state", op, ShippedState(op, 0, state.first_seq, state.last_seq, state.lineages, {})))
        for total, lin, seq in out:
            fe = lin[0].predecessor_seq
            parts = self.joining.setdefault(fe, {})
            parts[op] = (total, lin, seq)
            if len(parts) == 2:  # combine: both inputs of this request arrived
                del self.joining[fe]
                (a, la, sa), (c, lc, _) = parts["A"], parts["C"]
                self.j_queue.append((a + c, join([la, lc]), "A", sa))

    @precondition(lambda self: self.j_queue)
    @rule(n=st.integers(1, 4))
    def join_batch(self, n):
        batch, self.j_queue = self.j_queue[:n], self.j_queue[n:]
        out, state = self.prim["J"].run_batch(batch)
        self.net.append(("state", "J", state))
        for total, lin, _ in out:
            fe = lin[0].predecessor_seq
            self.replies[fe] = (total, lin)
            if not self.gate.hold(fe, lin):
                self._release([fe])

    def _deliver(self, msg):
        if msg[0] == "state":
            self._check_applied(msg[1], self.backups[msg[1]].receive(msg[2]))
        elif msg[1] == "frontend":
            self._release(self.gate.on_notify(msg[2], msg[3]))
        else:
            self._check_applied(msg[1], self.backups[msg[1]].on_notify(msg[2], msg[3]))

    @precondition(lambda self: self.net)
    @rule(data=st.data(), duplicate=st.booleans())
    def deliver(self, data, duplicate):
        i = data.draw(st.integers(0, len(self.net) - 1))
        self._deliver(self.net[i] if duplicate else self.net.pop(i))

    def teardown(self):
        while self.queues["A"] or self.queues["C"]:
            self.fan_out_batch("A", 4)
            self.fan_out_batch("C", 4)
        while self.j_queue:
            self.join_batch(4)
        while self.net:
            self._deliver(self.net.pop(0))
        assert sorted(self.released) == list(range(len(self.inputs)))
        totals = [3 * sum(self.inputs[:i + 1]) for i in range(len(self.inputs))]  # A's plus C's running sums
        assert [self.replies[k][0] for k in range(len(self.inputs))] == [sum(totals[:i + 1]) for i in range(len(totals))]


TestHostileJoin = HostileJoin.TestCase
TestHostileJoin.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


def test_durable_seqs_are_monotone():
    d = DurableSeqs()
    assert d.notify("A", 3) and not d.notify("A", 2) and d.of("A") == 3


def test_join_concatenates_lineage_once():
    x = extend([], "frontend", 1, "A", 4)
    y = extend(x, "A", 4, "B", 0)
    z = extend(x, "A", 4, "C", 9)
    assert join([y, z]) == [x[0], y[1], z[1]]


def test_backup_drops_other_epoch_and_duplicates():
    b = Backup("A", STATEFUL)
    s = ShippedState("A", 1, 0, 1, [extend([], "frontend", 0, "A", 0)])
    assert b.receive(ShippedState("A", 2, 0, 1, [])) == []
    assert b.receive(s) == [s] and b.receive(s) == [] and b.max_applied_seq == 1
