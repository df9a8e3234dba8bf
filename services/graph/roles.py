"""The roles an operator process holds and the events that move it between them: the
zguide bstar shape (named states, one transition function, an exception for the state
that must never be). An operator holds one ``RoleRecord``: its role and the epochs it holds
it in, changed only along an edge of ``TRANSITIONS`` and by the manager's word, and read by
every other part; what each role does with each message is the operator's handler table.

role            what it serves (HAMS)                                           its resources
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

The edges that change the epoch the role is held in (``EPOCH_EDGES``: a promotion, my
primary moved, fenced to rejoin, a roll-back the manager allowed) carry the new epoch; an
older one is refused. From then on a message of the operator's own group at another epoch
is refused (``RoleRecord.current``: fencing, the one check).

Example
-------
>>> r = RoleRecord(OperatorRole.BACKUP, epoch=1)
>>> r.heard("op-g2-backup", "op-g2-backup", 2)  # the manager names me holder at epoch 2
0
>>> r.become("promoted", epoch=2).value, r.epoch, r.current(1)
('degraded', 2, False)
"""
from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum


class OperatorRole(str, Enum):
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


R = OperatorRole
TRANSITIONS: dict[tuple[OperatorRole, str], OperatorRole] = {
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


def transition(role: OperatorRole, event: str) -> OperatorRole:
    """The role ``event`` moves ``role`` to; ``ImpossibleTransition`` if no edge does."""
    try:
        return TRANSITIONS[role, event]
    except KeyError:
        raise ImpossibleTransition(f"{event!r} cannot happen to a {role.value} operator") from None


def check_one_holder(role: OperatorRole, me: str, confirmed_epoch: int, holder: str | None, epoch: int) -> None:
    """Raise ``TwoPrimaries`` if ``holder`` (not me) holds my group at the epoch the
    manager confirmed me in while I still serve it."""
    if role in SERVING and holder not in (None, me) and epoch == confirmed_epoch > 0:
        raise TwoPrimaries(f"{holder} and {me} both hold the group at epoch {epoch}")


#: the edges whose new role is held at a new epoch (``RoleRecord.become`` needs it)
EPOCH_EDGES = frozenset({"promoted", "primary_moved", "newer_holder", "manager_ok"})

#: what the manager calls each role (status ``assignment``)
ASSIGNMENT = {R.STATELESS: "stateless", R.STANDBY: "standby", R.PRIMARY: "primary", R.DEGRADED: "primary",
              R.ROLLING_BACK: "primary", R.BACKUP: "backup", R.REJOINING: "backup", R.FENCED: "fenced"}


class RoleRecord:
    """The one record of an operator's role and epochs: the state machine owns them, every
    other part reads them, and only these methods change them.

    role             where the operator is in ``TRANSITIONS``
    epoch            the epoch it holds its role in: its states, notices and acks carry it
    newest           the newest epoch of its group the manager's word carried (older word is stale)
    confirmed_epoch  the epoch the manager last named it holder at (another holder then: two primaries)
    confirmed_at     when (``clock``), for the lease
    ``on_change(event, before, after)`` hears every move (the event log).
    """

    def __init__(self, role: OperatorRole, epoch: int = 1, clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[str, OperatorRole, OperatorRole], None] | None = None):
        self._role, self._epoch, self.clock, self.on_change = role, epoch, clock, on_change
        self._newest = self._confirmed_epoch = 0
        self._confirmed_at = 0.0

    role = property(lambda self: self._role)
    epoch = property(lambda self: self._epoch)
    newest = property(lambda self: self._newest)
    confirmed_epoch = property(lambda self: self._confirmed_epoch)
    confirmed_at = property(lambda self: self._confirmed_at)

    @property
    def assignment(self) -> str:
        """What the manager calls my role: primary, backup, stateless, standby (or fenced)."""
        return ASSIGNMENT[self._role]

    def become(self, event: str, epoch: int | None = None, confirmed: bool = False) -> OperatorRole:
        """Move along the edge ``event`` (``ImpossibleTransition`` if none); an edge of
        ``EPOCH_EDGES`` needs the ``epoch`` its new role is held in, never an older one.
        ``confirmed``: the manager's own answer names me holder at it (the lease starts)."""
        after = transition(self._role, event)
        if (epoch is not None) != (event in EPOCH_EDGES):
            raise ImpossibleTransition(f"{event!r} {'needs' if epoch is None else 'takes no'} epoch")
        if epoch is not None and epoch < self._epoch:
            raise ImpossibleTransition(f"{event!r} at epoch {epoch}, older than my {self._epoch}")
        before, self._role = self._role, after
        if epoch is not None:
            self._epoch, self._newest = epoch, max(self._newest, epoch)
        if confirmed:
            self._confirmed_at, self._confirmed_epoch = self.clock(), self._epoch
        if self.on_change is not None and before is not after:
            self.on_change(event, before, after)
        return after

    def heard(self, holder: str | None, me: str, epoch: int) -> int | None:
        """The manager's applied decision for my group, ``holder`` at ``epoch``: None if an
        older epoch than one heard already (a lagging replica's answer: stale news), else the
        newest epoch heard before it. A decision naming me confirms me (the lease); another
        holder at the epoch it confirmed me in raises ``TwoPrimaries``."""
        if epoch < self._newest:
            return None
        check_one_holder(self._role, me, self._confirmed_epoch, holder, epoch)
        previous, self._newest = self._newest, epoch
        if holder == me:
            self._confirmed_at, self._confirmed_epoch = self.clock(), epoch
        return previous

    def current(self, epoch: int) -> bool:
        """Fencing: is a message of my own group (my primary's state, my backup's ack or
        notice) of the epoch I hold my role in? One of an older epoch comes from before a
        change (a deposed holder's, a backup of my old epoch) and is refused."""
        return epoch == self._epoch

    def leased(self, lease_s: float) -> bool:
        """Did the manager name me holder within ``lease_s``?"""
        return self.clock() - self._confirmed_at < lease_s
