"""The one exception → HTTP mapper.

Every failure the edge reports goes through `describe_exception` (or `describe_code` for an engine failure
reported inside a stream as `Finished(ERROR, error_code, error_message)`), which yields a protocol-neutral
`ApiError`: HTTP status, a neutral `kind`, the stable zllm `code`, message and param. Each protocol then
renders it in its own shape with an `ErrorShape` function. OpenAI's (the default):

    HTTP 400
    {"error": {"message": "prompt is too long: 9000 tokens > 8192 maximum",
               "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}

A route picks its shape with `@uses_error_shape(fn)` (or, shared by several protocols, per request with
`@chooses_error_shape(fn)`); the error middleware (app.py) reads it back with
`error_shape_for(request)`, so the Anthropic and Responses APIs plug in their own shapes without touching
the mapping itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from aiohttp import web

from zllm.errors import ZllmError

log = logging.getLogger("zllm.api")

# Protocol-neutral error categories; each protocol names them its own way (OpenAI "type",
# Anthropic "error.type", Responses "error.code").
ErrorKind = Literal[
    "invalid_request", "authentication", "forbidden", "not_found", "request_too_large", "overloaded", "server_error",
]


class Unauthorized(ZllmError):
    """Missing or wrong API key. Lives here, not in zllm.errors: only the HTTP edge authenticates."""

    code = "invalid_api_key"


@dataclass(frozen=True)
class ApiError:
    status: int
    kind: ErrorKind
    code: str          # the stable zllm code (zllm.errors), or an HTTP-level one such as "not_found"
    message: str
    param: str | None = None


# zllm code → (HTTP status, kind). Codes not listed are server errors: the client could not have caused them.
_BY_CODE: dict[str, tuple[int, ErrorKind]] = {
    "invalid_request": (400, "invalid_request"),
    "context_length_exceeded": (400, "invalid_request"),
    "model_not_found": (404, "not_found"),
    # OpenAI Responses (api/openai_responses/chain.py)
    "previous_response_not_found": (404, "not_found"),
    "response_not_found": (404, "not_found"),
    "invalid_api_key": (401, "authentication"),
    # only its own clients (api/guard.py)
    "forbidden_host": (403, "forbidden"),
    "forbidden_origin": (403, "forbidden"),
    "unsupported_media_type": (415, "invalid_request"),
    "overloaded": (503, "overloaded"),
    "engine_error": (500, "server_error"),
    "internal_error": (500, "server_error"),
}

_INTERNAL_MESSAGE = "internal server error (details are in the zllm daemon log)"


def describe_code(code: str, message: str, param: str | None = None) -> ApiError:
    status, kind = _BY_CODE.get(code, (500, "server_error"))
    return ApiError(status=status, kind=kind, code=code, message=message, param=param)


def describe_exception(exc: BaseException) -> ApiError:
    """Map any exception to an `ApiError`. Unexpected ones are logged with their traceback, never sent."""
    if isinstance(exc, ZllmError):
        return describe_code(exc.code, exc.message, exc.param)
    if isinstance(exc, web.HTTPException) and exc.status >= 400:
        return _describe_http_exception(exc)
    log.error("unhandled error while serving a request", exc_info=exc)
    return describe_code("internal_error", _INTERNAL_MESSAGE)


def _describe_http_exception(exc: web.HTTPException) -> ApiError:
    # aiohttp's own failures: unknown route, wrong method, body over client_max_size.
    kind: ErrorKind
    if exc.status == 404:
        kind, code = "not_found", "not_found"
    elif exc.status == 413:
        kind, code = "request_too_large", "request_too_large"
    elif exc.status < 500:
        kind, code = "invalid_request", exc.reason.lower().replace(" ", "_")
    else:
        kind, code = "server_error", "internal_error"
    message = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else exc.reason
    return ApiError(status=exc.status, kind=kind, code=code, message=message)


# ----------------------------------------------------------------------------------------------------------
# Shapes

ErrorShape = Callable[[ApiError], dict]

_OPENAI_TYPES: dict[ErrorKind, str] = {
    "invalid_request": "invalid_request_error",
    "authentication": "invalid_request_error",
    "forbidden": "invalid_request_error",
    "not_found": "invalid_request_error",
    "request_too_large": "invalid_request_error",
    "overloaded": "server_error",
    "server_error": "server_error",
}

# OpenAI leaves `code` null for plain validation errors; the others carry a machine-readable code.
_OPENAI_NULL_CODES = frozenset({"invalid_request"})


def openai_error_body(error: ApiError) -> dict:
    return {
        "error": {
            "message": error.message,
            "type": _OPENAI_TYPES[error.kind],
            "param": error.param,
            "code": None if error.code in _OPENAI_NULL_CODES else error.code,
        }
    }


# Anthropic: `{"type":"error","error":{"type":…,"message":…}}`. Overloaded stays 503 rather than Anthropic's
# own 529: the SDK and Claude Code retry every 5xx, and 503 is what generic proxies and tools understand.
_ANTHROPIC_TYPES: dict[ErrorKind, str] = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "forbidden": "permission_error",
    "not_found": "not_found_error",
    "request_too_large": "request_too_large",
    "overloaded": "overloaded_error",
    "server_error": "api_error",
}


def anthropic_error_body(error: ApiError) -> dict:
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(error.kind, "api_error"),
                                       "message": error.message}}


_Handler = TypeVar("_Handler", bound=Callable)


def uses_error_shape(shape: ErrorShape) -> Callable[[_Handler], _Handler]:
    """Route decorator: errors raised by (or before) this handler are rendered with `shape`."""

    def mark(handler: _Handler) -> _Handler:
        handler.error_shape = shape  # type: ignore[attr-defined]
        return handler

    return mark


def chooses_error_shape(choose: Callable[[web.Request], ErrorShape]) -> Callable[[_Handler], _Handler]:
    """Route decorator for routes several protocols share (`GET /v1/models`): the shape depends on the request."""

    def mark(handler: _Handler) -> _Handler:
        handler.error_shape_chooser = choose  # type: ignore[attr-defined]
        return handler

    return mark


def error_shape_for(request: web.Request) -> ErrorShape:
    handler = request.match_info.handler
    choose = getattr(handler, "error_shape_chooser", None)
    if choose is not None:
        return choose(request)
    return getattr(handler, "error_shape", openai_error_body)


def error_response(request: web.Request, exc: BaseException) -> web.Response:
    error = describe_exception(exc)
    # the access log shows only the status; this says why, for whoever reads the daemon log
    log.info("%s %s → %d %s: %s", request.method, request.path, error.status, error.code, error.message)
    return web.json_response(error_shape_for(request)(error), status=error.status)


def finished_error(finished) -> ApiError:
    """The `ApiError` for a `Finished(ERROR, error_code, error_message)` reported inside a stream."""
    return describe_code(finished.error_code or "engine_error", finished.error_message or "the engine failed")


class ReportedError(ZllmError):
    """A failure the engine reported inside a stream (`Finished(ERROR, code, message)`), re-raised at the edge."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
