"""The gRPC gateway's named-tensor path (services.gateway_grpc's Servicer) called directly
with Keel's own generated messages: raw and typed contents, BYTES, requested outputs,
metadata from the signature, Triton's ModelConfig, and a refusal as INVALID_ARGUMENT.

Keel's generated modules define the protobuf package ``inference``, as tritonclient's do,
and one process holds one of them: the checks run in a fresh interpreter."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CHECKS = textwrap.dedent('''
    import asyncio, sys, time
    from types import SimpleNamespace
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from test_oip_gateway import REC, OLD, StandInClient
    from keel.common.config import GatewayConfig
    from keel.services.inference import Inference
    from keel.services import gateway_grpc
    from keel.services.oip import grpc_predict_v2_pb2 as pb, tensors

    inference = Inference(GatewayConfig(http_port=0), StandInClient())
    inference.known, inference.known_at = {"rec": REC, "old": OLD}, time.monotonic() + 3600

    async def kept(fresh=False):
        return inference.known

    inference.targets = kept


    class Metric:
        def labels(self, **labels):
            return self

        def inc(self):
            pass


    class Context:
        def time_remaining(self):
            return None

        def invocation_metadata(self):
            return []

        async def abort(self, code, message):
            raise RuntimeError(f"{code.name}: {message}")


    gateway = SimpleNamespace(inference=inference, log=None, counts={"requests": 0, "errors": 0, "cancelled": 0})
    servicer = gateway_grpc.Servicer(gateway, "0", Metric())
    dense = np.arange(6, dtype=np.float32).reshape(2, 3)
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    text = np.array([b"a", b"\\xffbc"], object)


    def request(raw):
        r = pb.ModelInferRequest(model_name="rec")
        for name, x, datatype in (("dense", dense, "FP32"), ("ids", ids, "INT64"), ("text", text, "BYTES")):
            tensor = r.inputs.add(name=name, datatype=datatype, shape=list(x.shape))
            if raw:
                r.raw_input_contents.append(tensors.to_raw(x))
            else:
                tensors.fill_contents(tensor.contents, x)
        return r


    async def main():
        for raw in (True, False):
            response = await servicer.ModelInfer(request(raw), Context())
            assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
                ("score", "FP32", [2, 1]), ("label", "BYTES", [2]), ("ids_twice", "INT64", [2, 3])]
            assert len(response.raw_output_contents) == (3 if raw else 0)  # raw for raw, typed for typed
            got = {o.name: tensors.from_raw(b, o.datatype, list(o.shape), o.name)
                   for o, b in zip(response.outputs, response.raw_output_contents)} if raw else \\
                {o.name: tensors.from_contents(o.contents, o.datatype, list(o.shape), o.name) for o in response.outputs}
            assert got["score"].tolist() == [[6.0], [24.0]] and got["label"].tolist() == [b"A", b"\\xffBC"]
            assert got["ids_twice"].tolist() == [[0, 2, 4], [6, 8, 10]]
        asked = request(True)
        asked.outputs.add(name="label")
        assert [o.name for o in (await servicer.ModelInfer(asked, Context())).outputs] == ["label"]
        wrong = request(False)
        wrong.inputs[1].datatype = "INT32"
        wrong.inputs[1].contents.Clear()
        wrong.inputs[1].contents.int_contents.extend(range(6))
        try:
            await servicer.ModelInfer(wrong, Context())
            raise AssertionError("an INT32 ids was taken")
        except RuntimeError as exc:
            assert str(exc) == "INVALID_ARGUMENT: input 'ids': datatype INT32, but the model takes INT64", exc
        meta = await servicer.ModelMetadata(pb.ModelMetadataRequest(name="rec"), Context())
        assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
            ("dense", "FP32", [-1, 3]), ("ids", "INT64", [-1, -1]), ("text", "BYTES", [-1])]
        old = await servicer.ModelMetadata(pb.ModelMetadataRequest(name="old"), Context())
        assert [(t.name, list(t.shape)) for t in old.inputs] == [("input", [-1, 2])]  # as before signatures
        assert b"TYPE" not in await servicer.ModelConfig(b"\\n\\x03rec", Context())  # enums, not names
        stats = await servicer.ModelStatistics(b"", Context())  # no name: every target
        assert b"rec" in stats and b"old" in stats
        print("ok")


    asyncio.run(main())
''')


def test_grpc_named_tensors_in_a_fresh_interpreter():
    here = Path(__file__).parent
    done = subprocess.run([sys.executable, "-c", CHECKS, str(here)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-4000:]
