"""A stateful operator whose batches are long computes them on its device thread: its loop
goes on serving while a batch computes (inputs queue, status answers), and what leaves it
is what the loop-bound path sends: every output in order, every state applied by the
backup. A real primary and backup (GraphOperators on real ZeroMQ sockets, ticked here)."""
from __future__ import annotations

import time

import numpy as np

from keel.chaos.graph_trials import gru_chain
from keel.common import transport
from keel.common.protocol.messages import GraphRequest
from keel.services.graph.batches import DEVICE_ABOVE_MS
from tests.support.graphs import g1_in_process

PAD_MS = 300.0  # one batch: long enough to look inside it


def test_the_loop_serves_while_a_long_batch_computes_and_nothing_leaves_out_of_order():
    with g1_in_process(gru_chain(max_batch=4, pad_ms=PAD_MS)) as g:
        primary, backup = g.primary, g.backup
        rng = np.random.default_rng(2)
        origin = 5 << 32
        sent = []

        def send(n: int) -> None:
            nonlocal origin
            for _ in range(n):
                origin += 1
                sent.append(f"k{len(sent)}")
                transport.send(g.push, GraphRequest("frontend", origin, origin, int(rng.integers(0, 3)), [],
                                                    rng.normal(size=4).astype(np.float32), request=sent[-1],
                                                    reply_to=g.sink_endpoint))

        send(1)  # the first batch computes on the loop: nothing says yet that batches are long
        assert g.tick_until(lambda: primary.batcher.batches == 1)
        assert primary.batcher.computing is None and primary.batcher.compute_ms > DEVICE_ABOVE_MS
        send(1)
        assert g.tick_until(lambda: primary.batcher.computing is not None)  # the second is on the device thread
        t0 = time.monotonic()
        send(3)  # these arrive while it computes: the loop takes them in, and answers status
        assert g.tick_until(lambda: len(primary.serving.queue) == 3, limit_s=PAD_MS / 2000)
        info = primary.status()
        assert info["computing"] and primary.batcher.computing is not None and time.monotonic() - t0 < PAD_MS / 1000
        assert g.tick_until(lambda: backup.backup_side.max_applied_seq == len(sent) - 1)
        outputs = g.outputs()
        assert [m.request for m in outputs] == sent and [m.seq for m in outputs] == list(range(len(sent)))
        assert primary.batcher.batches == 3 and primary.serving.statemgr.copies == 3  # one state shipped per batch


def test_a_state_ships_only_once_the_device_has_begun_the_next_batch():
    """The ship's copy holds the GIL while it runs; made before the device thread began the
    batch just submitted, it delayed that batch's start, every batch (the module's
    ``ship_pending``)."""
    with g1_in_process(gru_chain(max_batch=1, pad_ms=60.0)) as g:
        primary, backup = g.primary, g.backup
        began, ships = [], []
        compute, start = primary.serving.model.compute, primary.serving.statemgr.start

        def timed_compute(batch):
            began.append(time.monotonic())
            return compute(batch)

        def timed_start(*args, **kwargs):
            # (computes begun, batches taken, whether one computes on the device now)
            ships.append((len(began), primary.batcher.batches, primary.batcher.computing is not None))
            return start(*args, **kwargs)

        primary.serving.model.compute, primary.serving.statemgr.start = timed_compute, timed_start
        for i in range(5):  # one row a batch: five batches, the first on the loop, the rest on the device
            transport.send(g.push, GraphRequest("frontend", (5 << 32) + i, (5 << 32) + i, 0, [],
                                                np.ones(4, np.float32), request=f"k{i}", reply_to=g.sink_endpoint))
        g.tick_until(lambda: backup.backup_side.max_applied_seq >= 4)
        assert backup.backup_side.max_applied_seq == 4
        behind = [s for s in ships if s[2]]  # the ships made while the next batch was on the device
        assert behind and all(n_began == taken + 1 for n_began, taken, _ in behind), ships
