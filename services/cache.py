"""Clipper's prediction cache (§4.2) with CLOCK eviction.

Keys are (model, version, input bytes); values are output arrays. CLOCK approximates LRU
with one reference bit per slot: a hit sets the bit; on insert into a full cache the hand
sweeps, clearing set bits, and evicts the first entry whose bit is already clear.

Example
-------
>>> cache = ClockCache(2)
>>> cache.put("a", 1); cache.put("b", 2); cache.get("a")
1
>>> cache.put("c", 3)   # "b" has no reference bit: evicted
>>> cache.get("b") is None
True
"""
from __future__ import annotations

from typing import Any, Hashable


class ClockCache:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.keys: list[Hashable | None] = [None] * capacity
        self.values: list[Any] = [None] * capacity
        self.referenced = [False] * capacity
        self.index: dict[Hashable, int] = {}
        self.hand = 0
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self.index)

    def get(self, key: Hashable) -> Any | None:
        slot = self.index.get(key)
        if slot is None:
            self.misses += 1
            return None
        self.hits += 1
        self.referenced[slot] = True
        return self.values[slot]

    def put(self, key: Hashable, value: Any) -> None:
        slot = self.index.get(key)
        if slot is not None:
            self.values[slot] = value
            self.referenced[slot] = True
            return
        while self.keys[self.hand] is not None and self.referenced[self.hand]:
            self.referenced[self.hand] = False
            self.hand = (self.hand + 1) % self.capacity
        slot = self.hand
        old = self.keys[slot]
        if old is not None:
            del self.index[old]
            self.evictions += 1
        self.keys[slot], self.values[slot], self.referenced[slot] = key, value, False
        self.index[key] = slot
        self.hand = (self.hand + 1) % self.capacity
