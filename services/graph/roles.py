"""The roles an operator process holds and the events that move it between them: the
zguide bstar shape (named states, one transition function, an exception for the state
that must never be). ``services.graph.operator`` keeps one ``Role`` and changes it only
through ``transition``; what each role does with each message is its handler table.

Role            what it serves (HAMS)                                           its resources
--------------  --------------------------------------------------------------  ----------------------
STATELESS       a stateless operator: computes, numbers, sends (§IV-A)           model
STANDBY         the hot standby of one kind of stateless operator: models       models of its kind
                loaded, serving nothing until promoted (§V, §IV-E)
PRIMARY         a stateful operator's primary: NSPB (§IV-B..D), states shipped   model, statemgr
                to its backup, outputs released per mode
BACKUP          a stateful operator's backup: Algorithm 2, applies a state only  lineage.Backup
                when what it depends on is durable, notifies (§IV-C, §IV-D)
REJOINING       a backup that waits for its primary's whole state (a new         lineage.Backup
                member, or an old primary fenced: "work as a backup by
                overwriting its state with the new primary's", §IV-E)
DEGRADED        a primary with no backup (promoted, or its backup lost): it      model, its own Backup
                runs Algorithm 2 on its own states (§IV-E)
ROLLING_BACK    a primary that asked the manager to roll it back in place        model, saved states
                (Fig. 6); it waits for the answer in its loop, heartbeats and
                answers status, and holds every other message and feed change
                until the answer (acted on then, in order)
FENCED          stepped down: a newer holder exists, or it rolled back to its    nothing that releases
                backup; nothing leaves it any more (§IV-E, "stale primary")

Edges (event -> new role; any other pair raises ``ImpossibleTransition``)::

    STANDBY      --promoted-->             STATELESS     the manager names it holder (§IV-E, stateless)
    STATELESS    --newer_holder_alone-->   FENCED        a newer holder of its group (nothing to rejoin)
    BACKUP       --promoted-->             DEGRADED      take over with the applied state (§IV-E)
    REJOINING    --promoted-->             DEGRADED      (the manager promotes only a ready member)
    BACKUP       --primary_moved-->        REJOINING     its primary rolled back at a new epoch
    REJOINING    --whole_state-->          BACKUP        the primary's whole state arrived
    DEGRADED     --backup_joined-->        PRIMARY       a new member joined: whole state shipped
    PRIMARY      --roll_back_in_place-->   ROLLING_BACK  a predecessor recovered below my state, or
                                                         my backup died (Fig. 6)
    ROLLING_BACK --manager_ok-->           DEGRADED      the manager's compare-and-set said yes
    ROLLING_BACK --manager_refused-->      FENCED        no, or no answer before the deadline
    PRIMARY      --no_saved_state-->       FENCED        nothing consistent to roll back to
    PRIMARY      --roll_back_to_backup-->  FENCED        the manager is asked to promote my backup
    DEGRADED     --roll_back_to_backup-->  FENCED        (no backup: it serves nothing more)
    PRIMARY      --newer_holder-->         REJOINING     fenced; rejoins as the holder's backup
    DEGRADED     --newer_holder-->         REJOINING     (without a manager to rejoin through: FENCED)
    PRIMARY      --newer_holder_alone-->   FENCED
    DEGRADED     --newer_holder_alone-->   FENCED

Two holders of one group at one epoch cannot happen (the manager decides each epoch once,
in its Raft log): an operator that sees it raises ``TwoPrimaries``.
"""
from __future__ import annotations

from enum import Enum


class Role(str, Enum):
    STATELESS = "stateless"
    STANDBY = "standby"
    PRIMARY = "primary"
    BACKUP = "backup"
    REJOINING = "rejoining"
    DEGRADED = "degraded"
    ROLLING_BACK = "rolling_back"
    FENCED = "fenced"


class ImpossibleTransition(RuntimeError):
    """An event that no edge of the table takes from the current role: the operator's
    view of its group went wrong somewhere; acting on it would break HAMS's invariants."""


class TwoPrimaries(ImpossibleTransition):
    """The manager named another holder of my group at the epoch it confirmed me in:
    two primaries in one epoch (bstar's "dual master"), which its Raft log rules out."""


R = Role
TRANSITIONS: dict[tuple[Role, str], Role] = {
    (R.STANDBY, "promoted"): R.STATELESS,
    (R.STATELESS, "newer_holder_alone"): R.FENCED,
    (R.BACKUP, "promoted"): R.DEGRADED,
    (R.REJOINING, "promoted"): R.DEGRADED,
    (R.BACKUP, "primary_moved"): R.REJOINING,
    (R.REJOINING, "whole_state"): R.BACKUP,
    (R.DEGRADED, "backup_joined"): R.PRIMARY,
    (R.PRIMARY, "roll_back_in_place"): R.ROLLING_BACK,
    (R.PRIMARY, "no_saved_state"): R.FENCED,
    (R.ROLLING_BACK, "manager_ok"): R.DEGRADED,
    (R.ROLLING_BACK, "manager_refused"): R.FENCED,
    (R.PRIMARY, "roll_back_to_backup"): R.FENCED,
    (R.DEGRADED, "roll_back_to_backup"): R.FENCED,
    (R.PRIMARY, "newer_holder"): R.REJOINING,
    (R.DEGRADED, "newer_holder"): R.REJOINING,
    (R.PRIMARY, "newer_holder_alone"): R.FENCED,
    (R.DEGRADED, "newer_holder_alone"): R.FENCED,
}

#: roles that compute and number outputs (a model, a lease)
SERVING = frozenset({R.STATELESS, R.PRIMARY, R.DEGRADED})
#: roles that run Algorithm 2 on a primary's shipped states
BACKING = frozenset({R.BACKUP, R.REJOINING})


def transition(role: Role, event: str) -> Role:
    """The role ``event`` moves ``role`` to; ``ImpossibleTransition`` if no edge does."""
    try:
        return TRANSITIONS[role, event]
    except KeyError:
        raise ImpossibleTransition(f"{event!r} cannot happen to a {role.value} operator") from None


def check_one_holder(role: Role, me: str, confirmed_epoch: int, holder: str | None, epoch: int) -> None:
    """Raise ``TwoPrimaries`` if ``holder`` (not me) holds my group at the epoch the
    manager confirmed me in while I still serve it."""
    if role in SERVING and holder not in (None, me) and epoch == confirmed_epoch > 0:
        raise TwoPrimaries(f"{holder} and {me} both hold the group at epoch {epoch}")
