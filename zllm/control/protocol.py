"""The control protocol: newline-delimited JSON over the daemon's unix socket (mode 0600).

One request per line; every reply names the protocol version, the request id and the daemon's version:

    → {"v": 1, "id": 1, "method": "status", "params": {}}
    ← {"v": 1, "id": 1, "zllm": "0.1.0", "result": {"pid": 4242, "phase": "ready", ...}}
    ← {"v": 1, "id": 1, "zllm": "0.1.0", "error": {"code": "not_ready", "message": "...", "hint": "..."}}

A streaming method (`trace`, `logs`) answers with any number of items, then one end marker, and is the last
request on its connection (the server closes it after the end marker; closing it early is how a client stops
following):

    → {"v": 1, "id": 2, "method": "trace", "params": {"last": 5, "follow": true}}
    ← {"v": 1, "id": 2, "zllm": "0.1.0", "item": {"phase": "finished", "request_id": "chatcmpl-…", ...}}
    ← {"v": 1, "id": 2, "zllm": "0.1.0", "end": {"reason": "done"}}          # or "shutdown"

A request with another "v" is answered with error code `protocol_version`. Error codes are stable strings:
the `ZllmError.code` of the failure (`config_error`, `model_not_found`, ...) or one of the codes below.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from zllm.errors import ZllmError

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 4 << 20  # one message; a near-miss explanation or a cache listing stays far below

# protocol-level error codes (the rest are ZllmError codes)
BAD_REQUEST = "bad_request"
UNKNOWN_METHOD = "unknown_method"
PROTOCOL_MISMATCH = "protocol_version"
NOT_READY = "not_ready"
NOT_FOUND = "not_found"
INTERNAL = "internal_error"


class ControlError(ZllmError):
    """The daemon answered a control request with an error."""

    def __init__(self, code: str, message: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.code = code


class DaemonUnreachable(ZllmError):
    """Nothing answers on the control socket (no daemon, or one that is stuck)."""

    code = "daemon_unreachable"


# ---------------------------------------------------------------------- framing


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), default=str).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """One message; raises ValueError for anything that is not a JSON object."""
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("a control message is a JSON object")
    return message


def request(request_id: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "id": request_id, "method": method, "params": params or {}}


def reply(request_id: object, version: str, **body: Any) -> dict[str, Any]:
    """`body` is exactly one of result=, error=, item= or end=."""
    assert len(body) == 1 and next(iter(body)) in ("result", "error", "item", "end")
    return {"v": PROTOCOL_VERSION, "id": request_id, "zllm": version, **body}


def error_body(code: str, message: str, hint: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "hint": hint}


# ---------------------------------------------------------------------- typed results


class _Wire:
    """`from_json` ignores keys it does not know and defaults the ones it misses: a newer or older daemon
    still parses (the CLI reports the version skew separately)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]):
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DaemonStatus(_Wire):
    version: str
    pid: int
    phase: str  # "loading" (control socket up, model loading), "ready", "stopping"
    started_at: float
    uptime_s: float
    model: str = ""
    http_url: str = ""  # http://127.0.0.1:11435/v1
    host: str = ""  # the address the HTTP APIs are bound to (127.0.0.1, or 0.0.0.0 with an API key)
    port: int = 0
    queue_waiting: int = 0  # requests waiting for the engine
    requests_running: int = 0  # requests prefilled (generating) and not finished
    max_queue: int = 0
    socket: str = ""
    data_dir: str = ""
    log_file: str = ""
    # requests whose prompt is being prefilled (a prefill longer than one chunk, as its progress report shows it)
    requests_prefilling: int = 0
    # one per prefilling request, oldest first: PrefillProgress.to_json()
    prefilling: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class PrefillProgress(_Wire):
    """A prefilling request in `zllm status`: `prefilled_tokens` of `prompt_tokens` are in its cache (the
    `cached_tokens` restored from the prefix cache included), `at` when that was reported."""

    request_id: str
    api: str = ""
    prompt_tokens: int = 0
    prefilled_tokens: int = 0
    cached_tokens: int = 0
    at: float = 0.0


@dataclass(frozen=True)
class LoadedModelInfo(_Wire):
    """`zllm ps`: the one model a daemon serves."""

    name: str
    path: str = ""
    architecture: str = ""
    parameters: int = 0
    device: str = ""
    dtype: str = ""
    context_length: int = 0
    model_bytes: int = 0  # weights and buffers
    kv_cache_bytes: int = 0  # prefix cache: resident entries + working buffers
    kv_cache_budget_bytes: int = 0
    kv_cache_type: str = ""  # llama.cpp's KV cells: "f16", "q8_0" (--cache-type); "" where KV keeps the dtype
    # prompt-lookup speculation: "on (why)" / "off (why)" (engines.choose_speculation); "": an older daemon
    speculation: str = ""
    dialect: str = ""
    dialect_reason: str = ""  # how the dialect was chosen ("chat template mentions <tool_call>", ...)
    # the load-time round trip (dialects/round_trip.py): render → parse → render gave the same tokens; None: an
    # older daemon that did not check. `dialect_problem` says what breaks when it did not hold
    dialect_round_trip: bool | None = None
    dialect_problem: str = ""
    dialect_text_turn: str = ""  # what forks the cache after a turn of text ("" where it continues)
    loaded_at: float = 0.0
    backend: str = ""  # the engine backend: "torch" or "llamacpp"
    backend_reason: str = ""  # why ("GGUF weights run on llama.cpp as they are", "--backend torch", ...)
    quantization: str = ""  # "Q4_1", "Q4_K_M", "float32", ...
    resident_bytes: int = 0  # the daemon's real resident memory (RSS) when asked
    # prompt tokens prefilled per second, as measured recently (control/prefill_rate.py); None: not yet
    prefill_tokens_per_s: float | None = None


@dataclass(frozen=True)
class PruneReport(_Wire):
    dry_run: bool
    removed: list[dict[str, Any]] = field(default_factory=list)  # cache_views.CacheEntry JSON (dry run: would go)
    device_freed_bytes: int = 0
    ssd_removed: int = 0
    freed_bytes: int = 0  # device + ssd (dry run: an estimate)
