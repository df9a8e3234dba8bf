"""A frontend stepped in the test's own thread: ``tick`` until a condition holds, and client
DEALERs on its ROUTER. Subclasses build the ``Frontend`` (``self.fe``) and its far ends."""
from __future__ import annotations

import time

import zmq

from keel.common import transport


class SteppedFrontend:
    fe: object
    zsock: object

    def client(self) -> zmq.Socket:
        return self.zsock(zmq.DEALER, connect=transport.endpoint_of(self.fe.router))

    def step(self, condition, timeout_s: float = 5.0):
        """Tick the frontend until ``condition()`` is truthy (returned), else fail the test."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.fe.tick(0.01)
            value = condition()
            if value:
                return value
            assert time.monotonic() < deadline, "condition did not hold"
