"""ParM decoder: rebuilds an unavailable prediction batch from its coding group (§4.1-§4.2).

Workers of coded models push a copy of each prediction batch here; parity workers push
the parity model's output. When the parity output and k-1 of a group's k predictions are
here and one is missing, the missing batch is reconstructed at once as
``F_P(P) - sum(other predictions)`` (``codec.decode``; the concat encoder subtracts in
probability space) and sent to each query's frontend marked ``reconstruction``. With
``timeout_ms`` set, the decoder instead waits that long after the group's first output
for the missing prediction before declaring it unavailable (the timeout policy of §4.1).
A group is forgotten once all k predictions are in, or after ``group_ttl_s``.

The decoder is never on the critical path of an available prediction: workers answer
the frontend directly. The structure keeps "missing" as a set so that r > 1 (§7) only
changes when a group is decodable.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import zmq

from common import codec, transport
from common.config import DecoderConfig
from common.protocol import Predictions, Role, Source
from services.base import Service


@dataclass
class Group:
    k: int
    born: float
    outputs: dict[int, Predictions] = field(default_factory=dict)  # index -> prediction copy
    parity: Predictions | None = None
    decoded: bool = False


class Decoder(Service):
    role = "decoder"

    def __init__(self, cfg: DecoderConfig):
        super().__init__(cfg.name, cfg.metrics_port)
        self.cfg = cfg
        self.pull = self.add_socket(transport.make_socket(self.ctx, zmq.PULL, bind=cfg.endpoint), self._on_outputs)
        self.frontends: dict[str, zmq.Socket] = {}
        self.groups: dict[tuple[str, int], Group] = {}
        self.reconstructed = 0
        self.every(min(0.05, (cfg.timeout_ms or 50.0) / 1000.0), self._chores)
        self.m_decode = self.metrics.histogram("decode_seconds", "time to reconstruct one batch")
        self.m_reconstructions = self.metrics.counter("reconstructions_total", "batches reconstructed")

    def _on_outputs(self, sock: zmq.Socket) -> None:
        for _, msg in self.messages(sock):
            if isinstance(msg, Predictions) and msg.group is not None:
                self.add(msg)

    def add(self, msg: Predictions) -> None:
        tag = msg.group
        if msg.role == Role.PARITY:
            if not msg.members:
                return
            key = (msg.members.model, tag.group)
        else:
            key = (msg.model, tag.group)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(tag.k, time.monotonic())
        if msg.role == Role.PARITY:
            group.parity = msg if msg.outputs is not None else None
        elif msg.outputs is not None:  # a failed batch counts as unavailable
            group.outputs[tag.index] = msg
        if len(group.outputs) == group.k:
            del self.groups[key]  # every prediction arrived: nothing to rebuild
            return
        if self.cfg.timeout_ms is None:
            self._try_decode(key, group)

    def _try_decode(self, key: tuple[str, int], group: Group) -> None:
        if group.decoded or group.parity is None:
            return
        missing = [i for i in range(group.k) if i not in group.outputs]
        if len(missing) != 1:  # r = 1: exactly one unavailable prediction can be rebuilt
            return
        j = missing[0]
        members = group.parity.members
        qids, reply_to = members.batches[j].qids, members.batches[j].reply_to
        start = time.perf_counter()
        rows = group.parity.outputs.shape[0]
        available = np.zeros((group.k - 1, rows, group.parity.outputs.shape[1]), np.float32)
        for slot, i in enumerate(sorted(group.outputs)):
            out = group.outputs[i].outputs
            available[slot, : len(out)] = out  # padded queries of shorter batches predict nothing
        rebuilt = codec.decode(members.encoder, group.parity.outputs, available)[: len(qids)]
        self.m_decode.observe(time.perf_counter() - start)
        group.decoded = True
        self.reconstructed += 1
        self.m_reconstructions.inc()
        by_dest: dict[str, list[int]] = {}
        for row, dest in enumerate(reply_to):
            by_dest.setdefault(dest, []).append(row)
        for dest, rows_of in by_dest.items():
            transport.send(
                self._frontend(dest),
                Predictions(batch_id=0, model=key[0], qids=[qids[r] for r in rows_of],
                            outputs=np.ascontiguousarray(rebuilt[rows_of]), worker=self.name,
                            source=Source.RECONSTRUCTION, group=group.parity.group),
            )

    def _frontend(self, endpoint: str) -> zmq.Socket:
        sock = self.frontends.get(endpoint)
        if sock is None:
            sock = self.frontends[endpoint] = self.add_socket(transport.make_socket(self.ctx, zmq.PUSH, connect=endpoint))
        return sock

    def _chores(self, now: float) -> None:
        timeout = None if self.cfg.timeout_ms is None else self.cfg.timeout_ms / 1000.0
        for key, group in list(self.groups.items()):
            age = now - group.born
            if timeout is not None and age >= timeout:
                self._try_decode(key, group)
            if age > self.cfg.group_ttl_s:
                del self.groups[key]
