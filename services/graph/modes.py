"""The fault-tolerance modes of a service graph, so their cost can be measured (HAMS §VI):

| mode  | state copy                       | outputs leave              |
|-------|----------------------------------|----------------------------|
| bare  | none (no fault tolerance)        | at once                    |
| nspb  | in the background, model running| at once (early release)    |
| s1    | in the background                | once the backup has it     |
| s2    | model stopped to copy            | at once                    |
| remus | model stopped to copy            | once the backup has it     |

In every mode but bare the frontend holds each reply until its lineage is durable.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    name: str
    copy_in_background: bool
    hold_outputs: bool


MODES = {m.name: m for m in (Mode("bare", True, False), Mode("nspb", True, False), Mode("s1", True, True),
                             Mode("s2", False, False), Mode("remus", False, True))}
