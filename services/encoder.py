"""ParM encoder: coding groups of dispatched batches -> parity batches (ParM §4.1-§4.2).

The dispatcher sends a copy of every batch of a coded model *after* dispatching it,
tagged (group, index, k). When all k batches of a group are here, the i-th queries of
the k batches are encoded into the i-th parity query (batches shorter than the longest
are padded with zero queries), and the parity batch goes to the dispatcher's parity
queue, where parity workers pull it like any batch. The parity batch carries each
member batch's query ids and reply addresses so the decoder can answer for a missing one.
"""
from __future__ import annotations

import time

import numpy as np
import zmq

from common import codec, protocol, transport
from common.config import EncoderConfig
from common.protocol import Batch, Role
from services.base import Service


class Encoder(Service):
    role = "encoder"

    def __init__(self, cfg: EncoderConfig):
        super().__init__(cfg.name, cfg.metrics_port)
        self.cfg = cfg
        self.pull = self.add_socket(transport.make_socket(self.ctx, zmq.PULL, bind=cfg.batch_endpoint), self._on_batches)
        self.push = self.add_socket(transport.make_socket(self.ctx, zmq.PUSH, connect=cfg.dispatcher_endpoint))
        self.groups: dict[tuple[str, int], tuple[float, list[Batch | None]]] = {}
        self.encoded = self.dropped = 0
        self.every(1.0, self._forget)
        self.m_encode = self.metrics.histogram("encode_seconds", "time to encode one parity batch")

    def _on_batches(self, sock: zmq.Socket) -> None:
        for _, batch in self.messages(sock):
            if not isinstance(batch, Batch) or batch.group is None:
                continue
            tag = batch.group
            key = (batch.model, tag.group)
            _, members = self.groups.setdefault(key, (time.monotonic(), [None] * tag.k))
            members[tag.index] = batch
            if all(m is not None for m in members):
                del self.groups[key]
                self.encode_group(batch.model, tag.group, members)

    def encode_group(self, model: str, group: int, members: list[Batch]) -> None:
        parity_model = self.cfg.parity_models.get(model)
        if parity_model is None:
            self.log.error("no parity model configured", model=model)
            return
        start = time.perf_counter()
        rows = max(len(b.qids) for b in members)
        first = members[0].inputs
        stacked = np.zeros((len(members), rows, *first.shape[1:]), first.dtype)
        for i, b in enumerate(members):
            stacked[i, : len(b.qids)] = b.inputs  # shorter batches are padded with zero queries
        parity = codec.encode(self.cfg.encoder, stacked)
        self.m_encode.observe(time.perf_counter() - start)
        k = len(members)
        transport.send(
            self.push,
            Batch(batch_id=0, model=parity_model, qids=list(range(rows)), reply_to=[""] * rows, inputs=parity,
                  role=Role.PARITY, group=protocol.CodingTag(group, k, k),
                  members=protocol.ParityMembers(model, self.cfg.encoder,
                                                 [protocol.MemberBatch(b.qids, b.reply_to) for b in members])),
        )
        self.encoded += 1

    def _forget(self, now: float) -> None:
        for key, (born, _) in list(self.groups.items()):
            if now - born > 10.0:  # (partial groups: see partial_group_ms)
                del self.groups[key]
                self.dropped += 1
