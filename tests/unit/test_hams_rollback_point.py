"""Where a stateful operator rolls back to in place (HAMS §IV-E, Fig. 6): the newest
state it shipped that took none of a failed predecessor's lost outputs, or -- none of its
own states durable yet -- the state before its first batch."""
from __future__ import annotations

from collections import OrderedDict
import numpy as np

from keel.common.protocol.fields import LineageEntry
from keel.common.protocol.messages import GraphState
from keel.services.graph.rollback import saved_without
from keel.services.graph.statemgr import StateManager, pack


def _statemgr(saved: dict, durable_seq: int) -> StateManager:
    statemgr = StateManager("g3", 1, window=2, in_background=False, send=lambda state: None)
    statemgr.saved, statemgr.durable_seq = OrderedDict(saved), durable_seq  # the whole state at a seq comes from it
    return statemgr


def _state(last: int, took_from_g2: int) -> GraphState:
    # g2's output took_from_g2 (numbered by g2), taken by my batch ``last``
    lineage = [LineageEntry("g1", took_from_g2, "g2", took_from_g2), LineageEntry("g2", took_from_g2, "g3", last)]
    return GraphState("g3", 1, last, last, lineage, pack({"w": np.full(2, last, np.float32)}, {}))


def test_the_newest_saved_state_that_took_none_of_the_lost_outputs():
    statemgr = _statemgr({0: _state(0, 1), 1: _state(1, 2)}, durable_seq=0)
    last, tensors, _ = saved_without(statemgr, True, "g2", max_seq=1)
    assert last == 0 and list(tensors["w"]) == [0, 0]


def test_none_durable_yet_rolls_back_to_the_state_before_the_first_batch():
    # Fig. 6 right after the start: o3's only state took o2's lost output 2, and o3's
    # backup died with o2 before anything of o3 became durable
    statemgr = _statemgr({0: _state(0, 2)}, durable_seq=-1)
    assert saved_without(statemgr, True, "g2", max_seq=1) == (-1, {}, [])


def test_a_durable_state_that_took_lost_outputs_leaves_no_state_to_roll_back_to():
    statemgr = _statemgr({3: _state(3, 2)}, durable_seq=3)  # what Algorithm 2 does not let happen
    assert saved_without(statemgr, True, "g2", max_seq=1) is None
