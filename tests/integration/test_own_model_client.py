"""The client as a Python user expects it, against real processes: typed exceptions with
the reply still readable, results as values when asked, context managers, dtype conversion."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from keel.common.async_client import AsyncClient
from keel.common.client import BadInput, Client, DeadlineExceeded, KeelError, UnknownModel, coerce_input, error_for
from keel.common.protocol import ErrorCode, Source
from keel.common.spec import load_spec
from keel.deploy.local import free_port_block

pytestmark = pytest.mark.slow

DIM, OUT = 6, 3


@pytest.fixture(scope="module")
def cluster(module_launcher):
    run = module_launcher("client")
    spec = load_spec({
        "cluster": {"name": "client", "base_port": free_port_block(), "run_dir": str(run.log_dir)},
        "frontend": {"cache_size": 0},
        "models": {"echo": {"builtin": "sleep", "input_shape": [DIM], "output_size": OUT},
                   "ints": {"builtin": "sleep", "input_shape": [DIM], "output_size": OUT, "input_dtype": "int32"},
                   "slow": {"builtin": "sleep", "fixed_ms": 1500.0, "input_shape": [DIM], "output_size": OUT,
                            "deadline_ms": 5000}},
    })
    return run.start_spec(spec)


def test_failures_raise_typed_exceptions_with_the_reply(cluster):
    with Client(cluster.client_endpoints, timeout_ms=5000, raise_errors=True) as client:
        ok = client.predict("echo", np.ones(DIM, np.float32))
        assert ok.source == Source.MODEL and ok.output.shape == (OUT,)
        with pytest.raises(UnknownModel, match="unknown model 'nope'") as exc:
            client.predict("nope", np.ones(DIM, np.float32))
        assert exc.value.source == Source.ERROR and exc.value.error_code == ErrorCode.UNKNOWN_MODEL
        assert exc.value.request_id and isinstance(exc.value, KeelError) and isinstance(exc.value, LookupError)
        with pytest.raises(BadInput, match=r"shape \[4\] is not \[6\]"):  # the rules of common.inputs
            client.predict("echo", np.ones(4, np.float32))
        with pytest.raises(DeadlineExceeded) as exc:  # no default output: the deadline passes first
            client.predict("slow", np.ones(DIM, np.float32), timeout_ms=100)
        assert exc.value.error_code == ErrorCode.DEADLINE and isinstance(exc.value, TimeoutError)
        # results as values on one call; the client keeps serving after every failure
        value = client.predict("nope", np.ones(DIM, np.float32), raise_errors=False)
        assert value.source == Source.ERROR and value.error_code == ErrorCode.UNKNOWN_MODEL
        with pytest.raises(UnknownModel):
            value.raise_for_error()
        with pytest.raises(BadInput) as exc:
            client.predict_batch("echo", [np.ones(DIM, np.float32), np.ones(2, np.float32)])
        assert [r.source for r in exc.value.results] == [Source.MODEL, Source.ERROR]
    with Client(cluster.client_endpoints, timeout_ms=5000) as client:  # the default: values, as before
        assert client.predict("nope", np.ones(DIM, np.float32)).error_code == ErrorCode.UNKNOWN_MODEL


def test_compatible_dtypes_are_converted_others_refused_naming_the_dtype(cluster):
    dtypes = {"echo": "float32", "ints": "int32"}
    with Client(cluster.client_endpoints, timeout_ms=5000, raise_errors=True, dtypes=dtypes) as client:
        r = client.predict("echo", np.arange(DIM, dtype=np.float64))
        np.testing.assert_allclose(r.output, [0, 1, 2])
        r = client.predict("echo", list(range(DIM)))  # python ints
        np.testing.assert_allclose(r.output, [0, 1, 2])
        r = client.predict("ints", np.arange(DIM, dtype=np.int64))
        np.testing.assert_allclose(r.output, [0, 1, 2])
        with pytest.raises(BadInput, match="takes int32 input; float64 cannot be converted"):
            client.predict("ints", np.ones(DIM))
    with Client(cluster.client_endpoints, timeout_ms=5000, raise_errors=True) as client:
        # not told the dtype: the frontend's refusal names it
        with pytest.raises(BadInput, match="takes float32 input, got float64"):
            client.predict("echo", np.ones(DIM))


def test_async_with_and_typed_exceptions(cluster):
    async def run() -> None:
        async with AsyncClient(cluster.client_endpoints, timeout_ms=5000, raise_errors=True) as client:
            r = await client.predict("echo", np.ones(DIM, np.float32))
            assert r.source == Source.MODEL
            with pytest.raises(UnknownModel):
                await client.predict("nope", np.ones(DIM, np.float32))
            values = await client.predict_batch("echo", [np.ones(DIM, np.float32)] * 3)
            assert [v.source for v in values] == [Source.MODEL] * 3
        assert client.ctx.closed

    asyncio.run(run())


def test_error_mapping_and_coercion_without_a_cluster():
    from keel.common.client import InternalError, Overloaded, Result

    assert isinstance(error_for(Result("r", Source.ERROR, error_code=ErrorCode.OVERLOADED)), Overloaded)
    assert isinstance(error_for(Result("r", Source.ERROR, error_code=ErrorCode.TIMEOUT)), DeadlineExceeded)
    assert isinstance(error_for(Result("r", Source.ERROR, error_code="something new")), InternalError)
    assert coerce_input("m", np.ones(2, np.float32), None).dtype == np.float32
    assert coerce_input("m", [1, 2], "float32").dtype == np.float32


def test_demo_finds_a_free_port_when_the_default_is_taken():
    import socket

    from keel.deploy.demo import base_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        other = base_port(port)
        assert other != port
        with socket.socket() as s:
            s.bind(("127.0.0.1", other))  # free
