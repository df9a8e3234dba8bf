"""structlog setup: JSON lines when stdout is not a terminal, readable when it is.

Each service calls ``setup(service)`` once and gets a logger with the service name bound,
filtered at ``LEVEL`` (``keel serve --log-level``; a spec's ``[logs]``). The frontend
writes one canonical line per request (event "request"). ``keel logs`` reads what
supervisord keeps of each service's output (``deploy.logs``).

Example
-------
>>> log = setup("frontend")
>>> log.info("started", endpoint="tcp://127.0.0.1:7000")  # doctest: +SKIP
"""
from __future__ import annotations

import logging
import sys

import orjson
import structlog


def _orjson_dumps(obj, default=None) -> str:
    return orjson.dumps(obj, default=default, option=orjson.OPT_SERIALIZE_NUMPY).decode()


#: the levels a service may log at (``keel serve --log-level``, a spec's ``[logs]``)
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
          "critical": logging.CRITICAL}
#: this process's level, unless ``setup`` is given one
LEVEL = logging.INFO


def setup(service: str, json: bool | None = None, level: int | None = None) -> structlog.typing.FilteringBoundLogger:
    level = LEVEL if level is None else level
    if json is None:
        json = not sys.stdout.isatty()
    renderer = (
        structlog.processors.JSONRenderer(serializer=_orjson_dumps) if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            # log.exception(...) / exc_info=True: the type, message and traceback, not "exc_info": true
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
    return structlog.get_logger().bind(service=service)
