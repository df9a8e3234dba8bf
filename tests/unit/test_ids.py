"""Incarnation ids: epochs in the high bits, a later start has a larger epoch; a receiver
tells an older incarnation's ids from the current one's."""
from __future__ import annotations

import time

from keel.common.ids import EPOCH_BITS, IdSpace, NewestEpochs, epoch_of, new_epoch


def test_ids_carry_their_epoch_and_count_from_one():
    space = IdSpace(epoch=7)
    a, b = space.next(), space.next()
    assert (epoch_of(a), epoch_of(b)) == (7, 7) and b == a + 1 and space.owns(a)
    assert not IdSpace(epoch=8).owns(a)


def test_a_later_start_has_a_larger_epoch():
    first = new_epoch()
    time.sleep(0.02)  # epochs tick every 10 ms
    assert 0 < first < new_epoch() < 1 << EPOCH_BITS


def test_newest_epochs_tell_older_incarnations_apart():
    seen = NewestEpochs(limit=2)
    assert seen.see("m", 5) == (True, True)
    assert seen.see("m", 5) == (True, False)
    assert seen.see("m", 4) == (False, False)  # an older incarnation
    assert seen.see("m", 6) == (True, True)  # a newer one: drop what older ones left
    assert seen.see("m", 1 << EPOCH_BITS) == (False, False)  # no IdSpace makes it
    seen.see("a", 1)
    seen.see("b", 1)  # past the limit: the first sender seen is forgotten
    assert set(seen.newest) == {"a", "b"}


def test_admit_forgets_what_older_incarnations_left_open():
    seen, forgotten = NewestEpochs(), []
    old = IdSpace(epoch=3)
    groups = {("m", old.next()): 1, ("other", old.next()): 2}
    assert seen.admit("m", 3, groups, forgotten.append)
    assert forgotten == []
    assert seen.admit("m", 4, groups, forgotten.append)
    assert forgotten == [next(iter(groups))]  # only m's group of epoch 3
    assert not seen.admit("m", 3, groups, forgotten.append)
