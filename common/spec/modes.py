"""The fault-tolerance modes of a service graph, so their cost can be measured (HAMS §VI):

| mode  | state copy                       | outputs leave              |
|-------|----------------------------------|----------------------------|
| bare  | none (no fault tolerance)        | at once                    |
| nspb  | in the background, model running| at once (early release)    |
| s1    | in the background                | once the backup has it     |
| s2    | model stopped to copy            | at once                    |
| remus | model stopped to copy            | once the backup has it     |
| strawman | none: the frontend only keeps inputs and resends them after a failure; the replacement starts from the initial state | at once |
| ls    | none per batch: every ``checkpoint_every`` batches a checkpoint of the whole state to global storage; the replacement loads it and replays what came after (Lineage Stash, HAMS §VII) | at once |

In every mode but bare, strawman and ls the frontend holds each reply until its lineage is
durable. ``strawman`` is HAMS's strawman (§VII-D): a failover re-executes requests
on a fresh state, so with non-deterministic models (``noise``) it releases outputs that
contradict ones already released; the checker must see them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    name: str
    copy_in_background: bool
    hold_outputs: bool
    #: the primary ships its state to the backup after each batch (all but strawman)
    ships_state: bool = True
    #: a stateful primary writes a checkpoint every ``checkpoint_every`` batches (ls only)
    checkpoints: bool = False


MODES = {m.name: m for m in (Mode("bare", True, False), Mode("nspb", True, False), Mode("s1", True, True),
                             Mode("s2", False, False), Mode("remus", False, True),
                             Mode("strawman", True, False, ships_state=False),
                             Mode("ls", True, False, ships_state=False, checkpoints=True))}
