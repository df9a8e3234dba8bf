"""The operator's role table (services.graph.roles): each edge HAMS §IV-E names moves the
role it says, anything else is refused, and two holders at one epoch raise."""
import pytest

from keel.services.graph.roles import (BACKING, EPOCH_EDGES, SERVING, TRANSITIONS, ImpossibleTransition, OperatorRole,
                                       RoleRecord, TwoPrimaries,
                                       check_one_holder, transition)


def test_the_recovery_paths_of_hams_iv_e_are_edges_of_the_table():
    # a backup promoted runs degraded until a new backup joins
    assert transition(transition(OperatorRole.BACKUP, "promoted"), "backup_joined") is OperatorRole.PRIMARY
    # the hot standby of a stateless kind serves once promoted
    assert transition(OperatorRole.STANDBY, "promoted") is OperatorRole.STATELESS
    # a primary fenced by a newer holder rejoins as a backup and is one once it has the whole state
    assert transition(transition(OperatorRole.PRIMARY, "newer_holder"), "whole_state") is OperatorRole.BACKUP
    # Fig. 6: roll back in place, decided by the manager, or refused
    assert transition(transition(OperatorRole.PRIMARY, "roll_back_in_place"), "manager_ok") is OperatorRole.DEGRADED
    assert transition(transition(OperatorRole.PRIMARY, "roll_back_in_place"), "manager_refused") is OperatorRole.FENCED


@pytest.mark.parametrize("role,event", [(OperatorRole.BACKUP, "roll_back_in_place"), (OperatorRole.FENCED, "promoted"),
                                        (OperatorRole.STATELESS, "whole_state"), (OperatorRole.ROLLING_BACK, "promoted"),
                                        (OperatorRole.STANDBY, "newer_holder")])
def test_an_event_with_no_edge_is_refused(role, event):
    assert (role, event) not in TRANSITIONS
    with pytest.raises(ImpossibleTransition):
        transition(role, event)


def test_every_role_but_fenced_can_be_left_and_every_edge_lands_on_a_role():
    left = {role for role, _ in TRANSITIONS}
    assert left == set(OperatorRole) - {OperatorRole.FENCED}
    assert all(isinstance(to, OperatorRole) for to in TRANSITIONS.values())
    assert not SERVING & BACKING


def test_two_holders_at_one_epoch_raise_and_a_newer_epoch_does_not():
    with pytest.raises(TwoPrimaries):
        check_one_holder(OperatorRole.PRIMARY, "op-g2", 4, "op-g2-backup", 4)
    check_one_holder(OperatorRole.PRIMARY, "op-g2", 4, "op-g2-backup", 5)  # a newer holder: fencing, not a contradiction
    check_one_holder(OperatorRole.PRIMARY, "op-g2", 4, "op-g2", 4)
    check_one_holder(OperatorRole.BACKUP, "op-g2-backup", 0, "op-g2", 4)
    check_one_holder(OperatorRole.PRIMARY, "op-g2", 0, "op-g2-backup", 0)  # never confirmed: nothing to contradict


def test_the_edges_the_module_docstring_draws_are_the_table():
    import re

    from keel.services.graph import roles

    drawn = {(OperatorRole[a], event, OperatorRole[b]) for a, event, b in re.findall(r"^\s+(\w+)\s+--(\w+)-->\s+(\w+)", roles.__doc__, re.M)}
    assert drawn == {(a, event, b) for (a, event), b in TRANSITIONS.items()}


# --- the role record: the one holder of the role and its epochs -------------------------------

def _at(role: OperatorRole, epoch: int = 3) -> RoleRecord:
    return RoleRecord(role, epoch, clock=lambda: 100.0)


@pytest.mark.parametrize("role,event", sorted(TRANSITIONS))
def test_each_edge_moves_the_record_and_fences_what_it_must(role, event):
    r = _at(role)
    if event in EPOCH_EDGES:  # held at a new epoch: a message of the old one is refused from then on
        with pytest.raises(ImpossibleTransition):
            r.become(event)  # an epoch edge without its epoch
        with pytest.raises(ImpossibleTransition):
            r.become(event, epoch=2)  # an older epoch than the one held: refused, nothing moved
        assert (r.role, r.epoch) == (role, 3) and r.current(3)
        assert r.become(event, epoch=4) is TRANSITIONS[role, event]
        assert (r.epoch, r.newest) == (4, 4) and r.current(4) and not r.current(3) and not r.current(5)
    else:  # the same epoch: its messages are still mine
        with pytest.raises(ImpossibleTransition):
            r.become(event, epoch=4)
        assert r.become(event) is TRANSITIONS[role, event]
        assert r.epoch == 3 and r.current(3) and not r.current(2)
    assert r.assignment in {"primary", "backup", "stateless", "standby", "fenced"}


def test_the_record_tells_its_moves_and_the_manager_confirms_only_by_naming_me():
    moves = []
    r = RoleRecord(OperatorRole.BACKUP, 1, clock=lambda: 10.0, on_change=lambda *m: moves.append(m))
    assert r.heard("op-g2", "op-g2-backup", 1) == 0 and not r.leased(0.1)  # the primary named: no lease for me
    assert r.heard("op-g2-backup", "op-g2-backup", 2) == 1 and r.confirmed_epoch == 2 and r.leased(0.1)
    assert r.heard("op-g2", "op-g2-backup", 1) is None  # a lagging replica's older word: stale
    r.become("promoted", epoch=2)
    assert moves == [("promoted", OperatorRole.BACKUP, OperatorRole.DEGRADED)] and r.assignment == "primary"
    with pytest.raises(TwoPrimaries):
        r.heard("op-g2", "op-g2-backup", 2)  # another holder at the epoch I was confirmed in
    rolled = _at(OperatorRole.ROLLING_BACK)
    rolled.become("manager_ok", epoch=5, confirmed=True)  # the manager's compare-and-set: confirmed at its epoch
    assert (rolled.epoch, rolled.confirmed_epoch, rolled.leased(1.0)) == (5, 5, True)


def test_no_module_but_the_role_record_assigns_a_role_or_an_epoch():
    """The five places that had to agree (the role, the assignment's role and epoch, the
    newest epoch seen, the confirmed one) are one record: nothing else writes them."""
    import ast
    from pathlib import Path

    from keel.services import graph

    owned = {"hams_role", "role_epoch", "confirmed_epoch", "confirmed", "assignment", "newest"}
    born = {"role", "epoch", "role_record"}  # given once, when the object holding them is made
    found = []
    for path in sorted(Path(graph.__file__).parent.glob("*.py")):
        if path.name == "roles.py":
            continue
        tree = ast.parse(path.read_text())
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Module))]:
            nodes = ast.walk(fn) if isinstance(fn, ast.FunctionDef) else ast.iter_child_nodes(fn)
            for node in nodes:
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
                for t in [e for t in targets for e in ast.walk(t) if isinstance(e, ast.Attribute)]:
                    init = isinstance(fn, ast.FunctionDef) and fn.name == "__init__"
                    if t.attr in owned or (t.attr in born and not init):
                        found.append(f"{path.name}:{t.lineno} assigns .{t.attr}")
    assert not found, found
