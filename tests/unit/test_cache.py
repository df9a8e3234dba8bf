"""ClockCache: CLOCK's second chance, eviction order, the capacity bound and the counters;
and a hypothesis state machine against a plain reference CLOCK, which also checks that a
get never answers anything but the last value put for that key."""
from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from keel.services.cache import ClockCache


def cached(cache: ClockCache) -> set:
    return set(cache.index)


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        ClockCache(0)


def test_hits_and_misses_are_counted():
    cache = ClockCache(4)
    assert cache.get("a") is None
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("a") == 1
    assert cache.get("b") is None
    assert (cache.hits, cache.misses, cache.evictions) == (2, 2, 0)
    assert len(cache) == 1


def test_put_replaces_the_value_in_place():
    cache = ClockCache(2)
    cache.put("a", 1)
    cache.put("a", 2)
    assert cache.get("a") == 2
    assert len(cache) == 1 and cache.evictions == 0


def test_unreferenced_entries_go_in_insertion_order():
    cache = ClockCache(3)
    for key in "abc":
        cache.put(key, key)
    cache.put("d", "d")
    assert cached(cache) == {"b", "c", "d"}
    cache.put("e", "e")
    assert cached(cache) == {"c", "d", "e"}
    assert cache.evictions == 2


def test_a_hit_buys_a_second_chance():
    cache = ClockCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)  # the hand clears a's bit and passes it: b goes
    assert cached(cache) == {"a", "c"}
    cache.put("d", 4)  # a's chance is spent now
    assert cached(cache) == {"c", "d"}


def test_the_second_chance_is_only_one():
    cache = ClockCache(3)
    for key in "abc":
        cache.put(key, key)
    for key in "abc":
        cache.get(key)  # every bit set: the hand sweeps once, clearing all, and evicts where it began
    cache.put("d", "d")
    assert cached(cache) == {"b", "c", "d"}
    cache.put("e", "e")
    assert cached(cache) == {"c", "d", "e"}


def test_putting_an_existing_key_references_it():
    cache = ClockCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert cached(cache) == {"a", "c"}
    assert cache.get("a") == 10


def test_capacity_is_a_bound():
    cache = ClockCache(5)
    for i in range(100):
        cache.put(i, i)
        if i % 3 == 0:
            cache.get(i)
        assert len(cache) <= 5
    assert len(cache) == 5 and cache.evictions == 95
    assert 99 in cached(cache)


class ReferenceClock:
    """CLOCK written out the slow, obvious way: a ring of [key, value, bit] and a hand."""

    def __init__(self, capacity: int):
        self.ring: list[list | None] = [None] * capacity
        self.hand = 0

    def find(self, key):
        for entry in self.ring:
            if entry is not None and entry[0] == key:
                return entry
        return None

    def get(self, key):
        entry = self.find(key)
        if entry is None:
            return None
        entry[2] = True
        return entry[1]

    def put(self, key, value) -> None:
        entry = self.find(key)
        if entry is not None:
            entry[1], entry[2] = value, True
            return
        while self.ring[self.hand] is not None and self.ring[self.hand][2]:
            self.ring[self.hand][2] = False
            self.hand = (self.hand + 1) % len(self.ring)
        self.ring[self.hand] = [key, value, False]
        self.hand = (self.hand + 1) % len(self.ring)

    def keys(self) -> set:
        return {e[0] for e in self.ring if e is not None}


keys = st.integers(0, 9)


class ClockMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.capacity = 4
        self.cache = ClockCache(self.capacity)
        self.reference = ReferenceClock(self.capacity)
        self.last_put: dict[int, int] = {}
        self.gets = 0
        self.counter = 0

    @rule(key=keys)
    def put(self, key):
        self.counter += 1
        value = self.counter * 100 + key  # every put a fresh value
        self.cache.put(key, value)
        self.reference.put(key, value)
        self.last_put[key] = value
        assert key in self.cache.index  # what was just put is cached

    @rule(key=keys)
    def get(self, key):
        self.gets += 1
        got = self.cache.get(key)
        assert got == self.reference.get(key)
        if got is not None:
            assert got == self.last_put[key], "a get answered a value that is not the last put"
        elif key in self.last_put:
            assert key not in self.cache.index

    @invariant()
    def bounded_and_consistent(self):
        assert len(self.cache) <= self.capacity
        assert set(self.cache.index) == self.reference.keys()
        assert self.cache.hits + self.cache.misses == self.gets
        for key, slot in self.cache.index.items():
            assert self.cache.keys[slot] == key


ClockMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
test_clock_against_reference = ClockMachine.TestCase
