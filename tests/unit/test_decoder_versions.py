"""ParM across a rollout (a real Decoder, stepped with ``tick``): a reconstruction is named
after the deployed version it equals; a coding group whose predictions, or whose parity
model, disagree on the version is not reconstructed."""
from __future__ import annotations

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.config import DecoderConfig
from keel.common.protocol import CodingTag, MemberBatch, ModelRole, ParityMembers, Predictions, Source
from keel.services.decoder import Decoder

ANY = "tcp://127.0.0.1:*"


@pytest.fixture
def decoder(zsock):
    made = []

    def build(**options):
        frontend = zsock(zmq.PULL, bind=ANY)
        dec = Decoder(DecoderConfig(name="dec", endpoint=ANY, **options))
        made.append(dec)
        push = zsock(zmq.PUSH, connect=transport.endpoint_of(dec.pull))
        return dec, push, frontend, transport.endpoint_of(frontend)

    yield build
    for dec in made:
        dec.shutdown()


def run_group(dec, push, frontend, fe: str, versions: tuple[str, str], group: int = 7) -> Predictions | None:
    """Member 0 (version versions[0]) arrives, member 1 does not; the parity model (its own
    version versions[1]) answers. The reconstruction of member 1 the frontend gets, or None."""
    x0, x1 = np.ones((2, 3), np.float32), np.full((2, 3), 2.0, np.float32)
    members = ParityMembers("m", "add", [MemberBatch([10 * (i + 1), 10 * (i + 1) + 1], [fe] * 2) for i in range(2)])
    msgs = [Predictions(batch_id=1, model="m", qids=[10, 11], outputs=x0, worker="w0", group=CodingTag(group, 0, 2),
                        reply_to=[fe] * 2, version=versions[0]),
            Predictions(batch_id=9, model="m-parity", qids=[0, 1], outputs=x0 + x1, worker="p", role=ModelRole.PARITY,
                        group=CodingTag(group, 2, 2), members=members, version=versions[1])]
    for msg in msgs:
        transport.send(push, msg)
        for _ in range(3):
            dec.tick(0.02)
    if not frontend.poll(500):
        return None
    return protocol.decode(frontend.recv_multipart())


def test_a_reconstruction_is_named_after_the_predictions_it_was_computed_from(decoder):
    dec, push, frontend, ep = decoder(parity_versions={"m": {"1": "1"}})
    got = run_group(dec, push, frontend, ep, ("1", "1"))
    assert got is not None and got.source == Source.RECONSTRUCTION and got.version == "1" and got.qids == [20, 21]
    np.testing.assert_allclose(got.outputs, 2.0)


def test_predictions_of_another_version_than_the_parity_models_are_not_reconstructed(decoder):
    dec, push, frontend, ep = decoder(parity_versions={"m": {"1": "1"}})
    assert run_group(dec, push, frontend, ep, ("2", "1")) is None  # deployed rolled to 2, parity still for 1
    assert dec.status()["mixed_versions"] == 1 and dec.status()["reconstructed"] == 0
    assert run_group(dec, push, frontend, ep, ("1", "5"), group=8) is None  # a parity version made for none known
    assert dec.status()["unpaired_parity_version"] == 1


def test_without_pairs_the_reconstruction_takes_the_predictions_version(decoder):
    dec, push, frontend, ep = decoder()
    got = run_group(dec, push, frontend, ep, ("3", "1"))
    assert got is not None and got.version == "3"
