"""A backup that receives a successor's takeover ack before its own promotion (both failed
together, HAMS §IV-E correlated case) keeps it and acts on it once promoted: dropped, the
new primary waited for that ack for ever and withheld every output from the successor (a
correlated adjacent kill lost 116 replies). A real GraphOperator (g1's backup) with real
ZeroMQ sockets, its feed's view set by hand; the successor g2 is a PULL socket of the test."""
import time

import numpy as np
import zmq

from keel.chaos.graph_trials import gru_chain
from keel.common import transport
from keel.common.config import GraphOperatorConfig
from keel.common.protocol.messages import GraphAck, GraphRequest
from keel.common.protocol.codec import decode
from keel.common.protocol.fields import LineageEntry
from keel.services.graph.operator import GraphOperator


def test_a_successor_ack_that_comes_before_my_promotion_is_acted_on_at_it():
    ctx = zmq.Context.instance()
    g2 = ctx.socket(zmq.PULL)
    g2_endpoint = f"tcp://127.0.0.1:{g2.bind_to_random_port('tcp://127.0.0.1')}"
    cfg = GraphOperatorConfig(name="op-g1-backup", operator="g1", role="backup", epoch=1,
                              endpoint="tcp://127.0.0.1:*", graph=gru_chain(),
                              peers={"frontend": g2_endpoint, "g1": g2_endpoint, "g1.backup": g2_endpoint,
                                     "g2": g2_endpoint, "g2.backup": g2_endpoint})
    op = GraphOperator(cfg)
    sender = ctx.socket(zmq.PUSH)
    try:
        # g1's backup kept outputs 0-4 (applied states); its feed already shows g2's new epoch
        for seq in range(5):
            op.backup_side.kept[seq] = GraphRequest("g1", seq, seq, 0, [LineageEntry("frontend", seq, "g1", seq)],
                                        np.zeros(6, np.float32))
        op.recovery.epochs["g2"] = 4
        op.serving.awaiting.add("g2")  # what the feed's new g2 epoch does: hold new outputs until g2's ack
        # g2's new primary acks (it holds my outputs up to 1) before my own promotion reaches me
        sender.connect(transport.endpoint_of(op.inbox))
        transport.send(sender, GraphAck("g2", 4, 1))
        deadline = time.monotonic() + 5
        while not op.recovery.early_acks and time.monotonic() < deadline:
            op.tick(0.05)
        op.recovery.take_over(3)
        assert "g2" not in op.serving.awaiting  # new outputs flow to g2 again
        seqs = []
        while g2.poll(500):
            msg = decode(g2.recv_multipart())
            if isinstance(msg, GraphRequest):
                seqs.append(msg.seq)
        # every saved output once at the takeover, then those above g2's ack again, in order
        assert seqs[-3:] == [2, 3, 4] and sorted(seqs) == [0, 1, 2, 2, 3, 3, 4, 4], seqs
    finally:
        sender.close(0)
        op.shutdown()
        g2.close(0)
