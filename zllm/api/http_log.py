"""Requests aiohttp cannot parse (a request line or header over 8 KB, bytes that are not HTTP) are logged in
one line, not with the parser's traceback.

aiohttp answers them 400 itself, before any route or middleware runs, and logs each at ERROR with a
traceback through its Cython parser: it says nothing about zllm, and in the daemon log it reads like a crash.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import BadHttpMessage

AIOHTTP_SERVER_LOGGER = "aiohttp.server"


class MalformedRequestInOneLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, BadHttpMessage):
            # the exception's own text quotes the raw bytes it choked on: the class name says enough
            record.msg = f"{record.getMessage()}: malformed HTTP request ({type(exc).__name__}), answered 400"
            record.args = None
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def log_malformed_requests_in_one_line() -> None:
    logger = logging.getLogger(AIOHTTP_SERVER_LOGGER)
    if not any(isinstance(f, MalformedRequestInOneLine) for f in logger.filters):
        logger.addFilter(MalformedRequestInOneLine())
