"""The client frames of the Responses WebSocket, read into what the session does with them.

    {"type": "response.create", "stream_id": "b", "model": …, "input": […]}   a response, on lane "b"
    {"type": "response.append", "input": [new items]}     Codex's incremental turn: the lane's last create,
                                                          chained to the lane's last response, these items
    {"type": "response.processed", "response_id": "resp_…"}   Codex's acknowledgement: nothing to do
    {"type": "response.cancel", "stream_id": "b"}         stop lane "b"'s running response (or the one named
                                                          by `response_id`); nothing running: nothing to do
    {"type": "response.steer", "previous_response_id": …, "input": …}
                                                          refused, per lane (see `steer_refusal`)

`stream_id` (1-256 letters, digits, `_`, `-`, `.`; absent = the default lane, as Codex sends) names a lane:
frames of one lane run in order, lanes run side by side, and every server frame of a named lane carries its
`stream_id`. A socket holds at most `MAX_NAMED_STREAMS` named lanes (OpenAI's limit).
"""

from __future__ import annotations

import re

from zllm.api.errors import ApiError
from zllm.api.openai_responses import wire
from zllm.errors import InvalidRequest

MAX_NAMED_STREAMS = 32
_STREAM_ID = re.compile(r"[A-Za-z0-9_.\-]{1,256}")
# what a lane's last create keeps for an append: everything but what the append itself says
_NOT_CARRIED = frozenset({"type", "input", "previous_response_id", "generate", wire.WS_STREAM_ID})


class FrameError(Exception):
    """A frame the session answers with an `error` event (on `stream_id`'s lane when it had a valid one)."""

    def __init__(self, error: ApiError):
        super().__init__(error.message)
        self.error = error


def stream_id_of(frame: dict) -> str | None:
    stream_id = frame.get(wire.WS_STREAM_ID)
    if stream_id is None:
        return None
    if not isinstance(stream_id, str) or not _STREAM_ID.fullmatch(stream_id):
        raise FrameError(ApiError(400, "invalid_request", "invalid_stream_id",
                                  "`stream_id` must be 1-256 letters, digits, `_`, `-` or `.`",
                                  param=wire.WS_STREAM_ID))
    return stream_id


def too_many_streams() -> FrameError:
    return FrameError(ApiError(400, "invalid_request", "websocket_stream_limit_reached",
                               f"this connection already has {MAX_NAMED_STREAMS} named streams; "
                               "reuse one or open another connection", param=wire.WS_STREAM_ID))


def create_body(frame: dict) -> dict:
    """The `response.create` fields (top-level, as Codex sends them; or nested under `response`)."""
    body = {key: value for key, value in frame.items() if key not in ("type", wire.WS_STREAM_ID)}
    nested = body.get("response")
    if isinstance(nested, dict) and "model" not in body:
        body = {**nested, **{k: v for k, v in body.items() if k != "response"}}
    return body


def append_body(frame: dict, last_create: dict | None, last_response_id: str | None) -> dict:
    """A `response.append` as the create it stands for: the lane's last create with its settings, chained to
    the lane's last response, with only the appended items as input."""
    if last_create is None or last_response_id is None:
        raise InvalidRequest("`response.append` continues the last response on its stream, and this stream has "
                             "none yet; send `response.create` first", param="type")
    if not isinstance(frame.get("input"), list):
        raise InvalidRequest("`response.append` needs `input`: the new items", param="input")
    carried = {key: value for key, value in last_create.items() if key not in _NOT_CARRIED}
    extra = {key: value for key, value in frame.items() if key not in _NOT_CARRIED}
    return {**carried, **extra, "previous_response_id": last_response_id, "input": frame["input"]}


def unknown_type(kind: object) -> InvalidRequest:
    known = ", ".join((wire.WS_CREATE, wire.WS_APPEND, wire.WS_CANCEL, wire.WS_PROCESSED, wire.WS_STEER))
    return InvalidRequest(f"unsupported client event type {kind!r}; expected one of {known}", param="type")


def steer_refusal(frame: dict) -> dict:
    """`response.steer` is refused, the running response going on untouched: a local model cannot take input
    into a generation under way without re-prefilling it, and continuing after it would leave its tool calls
    unanswered. The client sends the input with its next turn instead (as it does for a provider without
    steering)."""
    event: dict = {"type": wire.WS_STEER_FAILED,
                   "error": {"type": "invalid_request_error", "code": "steering_not_supported", "param": None,
                             "message": "this server does not steer running responses; send the input with "
                                        "the next response.create"}}
    if isinstance(frame.get("previous_response_id"), str):
        event["previous_response_id"] = frame["previous_response_id"]
    return event
