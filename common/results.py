"""What a call ends with: a ``Result`` (or a ``FeedbackResult``), and the typed exception
of a result without a prediction (``KeelError`` and its subclasses, ``error_for``).

Shared by both clients (``common.client``) and the retry engine (``common.retry``).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from keel.common.protocol import ErrorCode, Source


@dataclass(slots=True)
class Result:
    request_id: str
    source: str
    output: np.ndarray | None = None
    error: str | None = None
    error_code: str | None = None
    model: str | None = None
    version: str | None = None
    latency_ms: float = 0.0
    frontend: str = ""
    #: an application's call: the models whose outputs the answer used, and its confidence
    models: list[str] | None = None
    confidence: float | None = None
    #: a call no frontend answered (error code ``timeout``): why, when the client can tell
    reason: str | None = None
    #: a graph's answer computed while a stateful operator on its path ran without a backup
    #: (consistent, but one more failure there could not be masked)
    degraded: bool = False
    #: a named model's outputs as they came (``Reply.outputs``); read them as ``outputs``
    named: dict[str, np.ndarray] | None = None

    @property
    def outputs(self) -> dict[str, np.ndarray] | None:
        """Every output by name: a named model's, or ``{"output": output}`` of a one-tensor
        target; None without a prediction. (Made when asked: the one-tensor path builds no dict.)"""
        if self.named is not None:
            return self.named
        return None if self.output is None else {"output": self.output}

    @property
    def ok(self) -> bool:
        return self.source not in (Source.ERROR,) and (self.output is not None or self.named is not None)

    def raise_for_error(self) -> Result:
        """This result if it carries a prediction; else the ``KeelError`` subclass of its error."""
        if not self.ok:
            raise error_for(self)
        return self


@dataclass(slots=True)
class FeedbackResult:
    """The frontend's answer to ``feedback``: ``ok`` if it learned from it; otherwise why not
    (``error_code`` ``unknown_request``: unknown, repeated or expired request id;
    ``bad_request``: not a class; ``timeout``: no answer)."""

    request_id: str
    ok: bool
    error: str | None = None
    error_code: str | None = None


class KeelError(Exception):
    """A request that ended without a prediction. ``result`` is its reply: ``source``,
    ``error_code``, ``request_id``, ``model`` stay readable."""

    code: str | None = None

    def __init__(self, result: Result, message: str | None = None):
        super().__init__(message or f"{result.error_code or result.source}: {result.error or 'no output'}"
                         f" (model {result.model}, request {result.request_id})")
        self.result = result

    @property
    def source(self) -> str:
        return self.result.source

    @property
    def error_code(self) -> str | None:
        return self.result.error_code

    @property
    def request_id(self) -> str:
        return self.result.request_id


class BadInput(KeelError, ValueError):
    """The input was refused: wrong shape or dtype, NaN, too large, a reused request id."""

    code = ErrorCode.BAD_REQUEST


class UnknownModel(KeelError, LookupError):
    """No such model (or version) is served."""

    code = ErrorCode.UNKNOWN_MODEL


class Overloaded(KeelError):
    """The frontend's admission limit was reached: back off and retry."""

    code = ErrorCode.OVERLOADED


class DeadlineExceeded(KeelError, TimeoutError):
    """The deadline passed with no prediction and no default output, or no frontend answered."""

    code = ErrorCode.DEADLINE


class Refused(DeadlineExceeded):
    """No answer because the frontend refused the connection: its CURVE handshake failed (a
    key not in its allow-list, or CURVE on one side only), or the port is not a frontend's
    (a predictions port, the dispatcher, a graph operator)."""


class Unreachable(DeadlineExceeded):
    """No answer because nothing accepted a connection to the frontend within the timeout
    (nothing listens on its port, or its host is gone)."""


class ModelError(KeelError):
    """The model raised on this query's batch."""

    code = ErrorCode.MODEL_ERROR


class Cancelled(KeelError):
    """The caller cancelled the request (``cancel``) before it was answered."""

    code = ErrorCode.CANCELLED


class InternalError(KeelError):
    """Anything else that went wrong inside Keel."""

    code = ErrorCode.INTERNAL


_ERRORS: dict[str, type[KeelError]] = {
    ErrorCode.BAD_REQUEST: BadInput, ErrorCode.UNKNOWN_MODEL: UnknownModel, ErrorCode.OVERLOADED: Overloaded,
    ErrorCode.DEADLINE: DeadlineExceeded, ErrorCode.TIMEOUT: DeadlineExceeded, ErrorCode.MODEL_ERROR: ModelError,
    ErrorCode.CANCELLED: Cancelled,
}


class Reason(StrEnum):
    """Why no frontend answered a call (``Result.reason``)."""

    REFUSED = "refused"  # the handshake failed: CURVE refused the key, or not a frontend's socket
    UNREACHABLE = "unreachable"  # nothing accepted a connection
    TIMEOUT = "timeout"  # connected, no answer by the deadline


_NO_ANSWER: dict[str, type[KeelError]] = {Reason.REFUSED: Refused, Reason.UNREACHABLE: Unreachable}


def error_for(result: Result) -> KeelError:
    """The typed exception of a result without a prediction."""
    if result.error_code == ErrorCode.TIMEOUT and result.reason in _NO_ANSWER:
        return _NO_ANSWER[result.reason](result)
    return _ERRORS.get(result.error_code or "", InternalError)(result)
