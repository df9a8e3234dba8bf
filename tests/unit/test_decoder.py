"""A real Decoder, stepped with ``tick``: the test plays the workers (a PUSH of prediction
copies and parity outputs) and the frontend (a PULL for reconstructions). ParM §4.1-§4.2
with full and partial coding groups, rows matched by query id, expired rows, incarnations."""
from __future__ import annotations

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.config import DecoderConfig
from keel.common.protocol import CodingTag, MemberBatch, ParityMembers, Predictions, ModelRole, Source
from keel.services.decoder import Decoder

ANY = "tcp://127.0.0.1:*"


@pytest.fixture
def make(zsock):
    made = []

    def build(**overrides):
        frontend = zsock(zmq.PULL, bind=ANY)
        dec = Decoder(DecoderConfig(name="dec", endpoint=ANY, **overrides))
        made.append(dec)
        push = zsock(zmq.PUSH, connect=transport.endpoint_of(dec.pull))
        return dec, push, frontend, transport.endpoint_of(frontend)

    yield build
    for dec in made:
        dec.shutdown()


def send(dec, push, msg, ticks: int = 3) -> None:
    transport.send(push, msg)
    for _ in range(ticks):
        dec.tick(0.02)


def qids_of(index: int, n: int) -> list[int]:
    return [1000 + 10 * index + i for i in range(n)]


def copy(group: int, index: int, k: int, outputs: np.ndarray, fe: str, qids=None, budgets=None) -> Predictions:
    qids = qids_of(index, len(outputs)) if qids is None else qids
    return Predictions(batch_id=index + 1, model="m", qids=qids, outputs=outputs, worker=f"w{index}",
                       group=CodingTag(group, index, k), reply_to=[fe] * len(qids), budgets_ms=budgets)


def parity(group: int, k: int, outputs: np.ndarray, fe: str, sizes: list[int | None], qids=None, budgets=None) -> Predictions:
    members = ParityMembers("m", "add", [None if n is None else MemberBatch(qids_of(i, n), [fe] * n)
                                         for i, n in enumerate(sizes)])
    qids = list(range(len(outputs))) if qids is None else qids
    return Predictions(batch_id=9, model="m-parity", qids=qids, outputs=outputs, worker="p", role=ModelRole.PARITY,
                       group=CodingTag(group, k, k), members=members, budgets_ms=budgets)


def reconstruction(sock, timeout_s: float = 2.0) -> Predictions | None:
    if not sock.poll(int(timeout_s * 1000)):
        return None
    return protocol.decode(sock.recv_multipart())


def rand(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 3), dtype=np.float32)


def test_full_group_reconstructs_the_missing_member(make):
    dec, push, fe, ep = make()
    f0, f1, f2 = rand(2, 0), rand(2, 1), rand(2, 2)
    send(dec, push, copy(4, 0, 3, f0, ep))
    send(dec, push, copy(4, 2, 3, f2, ep))
    send(dec, push, parity(4, 3, f0 + f1 + f2, ep, [2, 2, 2]))
    got = reconstruction(fe)
    assert got.source == Source.RECONSTRUCTION and got.qids == qids_of(1, 2)
    np.testing.assert_allclose(got.outputs, f1, atol=1e-6)
    assert dec.status()["reconstructed"] == 1


def test_partial_group_counts_only_present_members(make):
    """A group encoded partial (members 0 and 2 of k=3): member 2 = parity - member 0."""
    dec, push, fe, ep = make()
    f0, f2 = rand(2, 3), rand(1, 4)
    send(dec, push, copy(5, 0, 3, f0, ep))
    assert reconstruction(fe, 0.1) is None  # k=3, one prediction: nothing to do yet
    padded = np.vstack([f2, np.zeros((1, 3), np.float32)])
    send(dec, push, parity(5, 3, f0 + padded, ep, [2, None, 1]))
    got = reconstruction(fe)
    assert got.qids == qids_of(2, 1)
    np.testing.assert_allclose(got.outputs, f2, atol=1e-6)
    assert dec.counts["reconstructed_partial"] == 1
    send(dec, push, copy(5, 2, 3, f2, ep))  # every present member in: the group is done
    assert not dec.groups and reconstruction(fe, 0.1) is None


def test_partial_group_of_one_is_the_parity_output(make):
    dec, push, fe, ep = make()
    f1 = rand(3, 5)
    send(dec, push, parity(6, 2, f1, ep, [None, 3]))
    got = reconstruction(fe)
    assert got.qids == qids_of(1, 3)
    np.testing.assert_allclose(got.outputs, f1)
    # its real prediction, arriving later, closes the group without a second answer
    send(dec, push, copy(6, 1, 2, f1, ep))
    assert reconstruction(fe, 0.1) is None and not dec.groups


def test_rows_match_by_qid_and_expired_rows_are_skipped(make):
    dec, push, fe, ep = make()
    f0, f1 = rand(4, 6), rand(4, 7)
    # Member 0's worker ran only rows 1..3 (row 0 had expired) and sent them out of order.
    send(dec, push, copy(7, 0, 2, f0[[3, 1, 2]], ep, qids=[qids_of(0, 4)[r] for r in (3, 1, 2)]))
    # The parity worker skipped row 2, and row 3's deadline has passed.
    send(dec, push, parity(7, 2, (f0 + f1)[[0, 1, 3]], ep, [4, 4], qids=[0, 1, 3], budgets=[60_000.0, 60_000.0, -1.0]))
    got = reconstruction(fe)
    assert got.qids == [qids_of(1, 4)[1]]  # row 0: member 0 unknown; row 2: parity unknown; row 3: expired
    np.testing.assert_allclose(got.outputs, f1[[1]], atol=1e-6)
    assert dec.counts["skipped_expired"] == 1 and dec.counts["unknown_rows"] == 2


def test_older_dispatcher_epochs_are_stale(make):
    dec, push, fe, ep = make()
    old, new = (5 << 32) | 1, (6 << 32) | 1
    send(dec, push, copy(old, 0, 2, rand(1, 8), ep))
    send(dec, push, copy(new, 0, 2, rand(1, 9), ep))
    assert list(dec.groups) == [("m", new)] and dec.counts["stale"] == 1
    send(dec, push, parity(old, 2, rand(1, 10), ep, [1, 1]))  # the old incarnation's parity output
    assert dec.counts["stale"] == 2 and list(dec.groups) == [("m", new)]
    send(dec, push, copy((1 << 30) << 32, 0, 2, rand(1, 11), ep, qids=[1]))  # an epoch no IdSpace makes
    assert dec.counts["stale"] == 3 and dec.epochs.newest["m"] == 6
    assert reconstruction(fe, 0.1) is None


def test_hostile_outputs_are_refused_and_groups_bounded(make):
    dec, push, fe, ep = make(max_open_groups=3)
    send(dec, push, copy(1, 0, 2, rand(1, 0), ep))
    send(dec, push, copy(1, 1, 3, rand(1, 0), ep))  # k differs from its group's
    no_members = Predictions(batch_id=1, model="m", qids=[0], outputs=rand(1, 0), role=ModelRole.PARITY,
                             group=CodingTag(1, 2, 2))
    send(dec, push, no_members)
    assert dec.counts["refused"] == 2
    for g in range(2, 12):
        transport.send(push, copy(g, 0, 2, rand(1, g), ep))
    for _ in range(5):
        dec.tick(0.02)
    assert len(dec.groups) == 3 and dec.counts["dropped_full"] == 8


# ParM across a rollout: a reconstruction is named after the deployed version it equals; a
# coding group whose predictions, or whose parity model, disagree on the version is not
# reconstructed.


def run_versioned_group(dec, push, frontend, fe: str, versions: tuple[str, str], group: int = 7) -> Predictions | None:
    """Member 0 (version versions[0]) arrives, member 1 does not; the parity model (its own
    version versions[1]) answers. The reconstruction of member 1 the frontend gets, or None."""
    x0, x1 = np.ones((2, 3), np.float32), np.full((2, 3), 2.0, np.float32)
    members = ParityMembers("m", "add", [MemberBatch([10 * (i + 1), 10 * (i + 1) + 1], [fe] * 2) for i in range(2)])
    msgs = [Predictions(batch_id=1, model="m", qids=[10, 11], outputs=x0, worker="w0", group=CodingTag(group, 0, 2),
                        reply_to=[fe] * 2, version=versions[0]),
            Predictions(batch_id=9, model="m-parity", qids=[0, 1], outputs=x0 + x1, worker="p", role=ModelRole.PARITY,
                        group=CodingTag(group, 2, 2), members=members, version=versions[1])]
    for msg in msgs:
        send(dec, push, msg)
    return reconstruction(frontend, 0.5)


def test_a_reconstruction_is_named_after_the_predictions_it_was_computed_from(make):
    dec, push, frontend, ep = make(parity_versions={"m": {"1": "1"}})
    got = run_versioned_group(dec, push, frontend, ep, ("1", "1"))
    assert got is not None and got.source == Source.RECONSTRUCTION and got.version == "1" and got.qids == [20, 21]
    np.testing.assert_allclose(got.outputs, 2.0)


def test_predictions_of_another_version_than_the_parity_models_are_not_reconstructed(make):
    dec, push, frontend, ep = make(parity_versions={"m": {"1": "1"}})
    assert run_versioned_group(dec, push, frontend, ep, ("2", "1")) is None  # deployed rolled to 2, parity still for 1
    assert dec.status()["mixed_versions"] == 1 and dec.status()["reconstructed"] == 0
    assert run_versioned_group(dec, push, frontend, ep, ("1", "5"), group=8) is None  # a parity version made for none known
    assert dec.status()["unpaired_parity_version"] == 1


def test_without_pairs_the_reconstruction_takes_the_predictions_version(make):
    dec, push, frontend, ep = make()
    got = run_versioned_group(dec, push, frontend, ep, ("3", "1"))
    assert got is not None and got.version == "3"


def named(seed: int, n: int, box_len: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"logits": rng.random(10, dtype=np.float32), "box": rng.random(box_len, dtype=np.float32)} for _ in range(n)]


def test_named_outputs_are_each_reconstructed(make):
    """A named model (logits and box): the missing query's answer is F_P[name] - others[name] for each."""
    dec, push, fe, ep = make()
    f0, f1 = named(0, 2), named(1, 2)
    c0 = copy(6, 0, 2, None, ep, qids=qids_of(0, 2))
    c0.rows = f0
    send(dec, push, c0)
    fp = named(2, 2)
    p = parity(6, 2, None, ep, [2, 2], qids=[0, 1])
    p.rows = fp
    send(dec, push, p)
    got = reconstruction(fe)
    assert got.source == Source.RECONSTRUCTION and got.qids == qids_of(1, 2) and got.outputs is None
    for r in range(2):
        assert set(got.rows[r]) == {"logits", "box"}
        for name in ("logits", "box"):
            np.testing.assert_allclose(got.rows[r][name], fp[r][name] - f0[r][name], atol=1e-6)
    assert f1  # the unavailable member's own outputs never reach the decoder


def test_named_reconstruction_pads_a_variable_output_and_skips_a_short_member(make):
    dec, push, fe, ep = make()
    f0 = named(3, 1, box_len=2)  # member 0 ran one query; member 1 (missing) two
    c0 = copy(7, 0, 2, None, ep, qids=qids_of(0, 1))
    c0.rows = f0
    send(dec, push, c0)
    fp = named(4, 2)
    p = parity(7, 2, None, ep, [1, 2], qids=[0, 1])
    p.rows = fp
    send(dec, push, p)
    got = reconstruction(fe)
    assert got.qids == qids_of(1, 2)
    np.testing.assert_allclose(got.rows[0]["box"], fp[0]["box"] - np.pad(f0[0]["box"], (0, 2)), atol=1e-6)
    np.testing.assert_allclose(got.rows[1]["logits"], fp[1]["logits"], atol=1e-6)  # row 1: parity alone
