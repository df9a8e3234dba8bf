"""The operator's role table (services.graph.roles): each edge HAMS §IV-E names moves the
role it says, anything else is refused, and two holders at one epoch raise."""
import pytest

from keel.services.graph.roles import (BACKING, SERVING, TRANSITIONS, ImpossibleTransition, Role, TwoPrimaries,
                                       check_one_holder, transition)


def test_the_recovery_paths_of_hams_iv_e_are_edges_of_the_table():
    # a backup promoted runs degraded until a new backup joins
    assert transition(transition(Role.BACKUP, "promoted"), "backup_joined") is Role.PRIMARY
    # the hot standby of a stateless kind serves once promoted
    assert transition(Role.STANDBY, "promoted") is Role.STATELESS
    # a primary fenced by a newer holder rejoins as a backup and is one once it has the whole state
    assert transition(transition(Role.PRIMARY, "newer_holder"), "whole_state") is Role.BACKUP
    # Fig. 6: roll back in place, decided by the manager, or refused
    assert transition(transition(Role.PRIMARY, "roll_back_in_place"), "manager_ok") is Role.DEGRADED
    assert transition(transition(Role.PRIMARY, "roll_back_in_place"), "manager_refused") is Role.FENCED


@pytest.mark.parametrize("role,event", [(Role.BACKUP, "roll_back_in_place"), (Role.FENCED, "promoted"),
                                        (Role.STATELESS, "whole_state"), (Role.ROLLING_BACK, "promoted"),
                                        (Role.STANDBY, "newer_holder")])
def test_an_event_with_no_edge_is_refused(role, event):
    assert (role, event) not in TRANSITIONS
    with pytest.raises(ImpossibleTransition):
        transition(role, event)


def test_every_role_but_fenced_can_be_left_and_every_edge_lands_on_a_role():
    left = {role for role, _ in TRANSITIONS}
    assert left == set(Role) - {Role.FENCED}
    assert all(isinstance(to, Role) for to in TRANSITIONS.values())
    assert not SERVING & BACKING


def test_two_holders_at_one_epoch_raise_and_a_newer_epoch_does_not():
    with pytest.raises(TwoPrimaries):
        check_one_holder(Role.PRIMARY, "op-g2", 4, "op-g2-backup", 4)
    check_one_holder(Role.PRIMARY, "op-g2", 4, "op-g2-backup", 5)  # a newer holder: fencing, not a contradiction
    check_one_holder(Role.PRIMARY, "op-g2", 4, "op-g2", 4)
    check_one_holder(Role.BACKUP, "op-g2-backup", 0, "op-g2", 4)
    check_one_holder(Role.PRIMARY, "op-g2", 0, "op-g2-backup", 0)  # never confirmed: nothing to contradict


def test_the_edges_the_module_docstring_draws_are_the_table():
    import re

    from keel.services.graph import roles

    drawn = {(Role[a], event, Role[b]) for a, event, b in re.findall(r"^\s+(\w+)\s+--(\w+)-->\s+(\w+)", roles.__doc__, re.M)}
    assert drawn == {(a, event, b) for (a, event), b in TRANSITIONS.items()}
