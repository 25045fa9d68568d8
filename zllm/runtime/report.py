"""What the runtime tells observers about each request (`zllm trace`, the daemon log).

    loop = EngineLoop(..., observer=hub.publish)     # called on the engine thread: must only hand off
    observer(RequestReport(phase="prefilling", ...))  # a long prefill: as it begins, then about once a second
    observer(RequestReport(phase="started", ...))     # after the prompt is prefilled (TTFT known soon after)
    observer(RequestReport(phase="finished", ...))    # after the Finished event went to the client

Plain data (no torch, no protocol objects): `to_json()` is what the control socket streams.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Literal

from zllm.cache_views import Tier

Phase = Literal["prefilling", "started", "finished"]


@dataclass(frozen=True)
class RequestReport:
    phase: Phase
    request_id: str
    api: str = ""  # "chat" / "responses" / "messages" / "count" as the edge labelled it
    model: str = ""
    namespace: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # prompt tokens in the request's cache so far, the restored ones included: prefilled_tokens / prompt_tokens
    # is a prefill's progress (the whole prompt once started)
    prefilled_tokens: int = 0
    cache_tier: str = Tier.COLD  # a Tier's word ("device", "ssd-hint", ...), or "off" (no prefix cache)
    restore_s: float | None = None  # admission (lookup + restore) time
    prefill_s: float | None = None  # restore included: the request's time to its first logits
    ttft_s: float | None = None  # submission (queue wait included) to first streamed output
    completion_tokens: int = 0
    decode_tok_s: float | None = None
    dialect: str = ""
    fence: str = ""  # "off" or what constrained the output ("tools:auto", "tools:required", "json_schema")
    fence_events: tuple[str, ...] = ()  # notable fence / loop-guard events ("loop guard banned token 42")
    tool_calls: tuple[str, ...] = ()  # names of the calls the output made
    drafted_tokens: int = 0  # speculative decoding: draft tokens verified
    accepted_tokens: int = 0  # ... and accepted
    finish_reason: str | None = None
    error: str | None = None
    near_miss: str | None = None  # "near miss of <entry> at token N in <segment>"
    cache_rejected: str | None = None  # "SSD snapshot <id> set aside: <why>": it was damaged, the request ran cold
    notes: tuple[str, ...] = ()  # normalization notes (dropped per-session header lines, ...)
    at: float = field(default_factory=time.time)

    def to_json(self) -> dict:
        data = asdict(self)
        for key in ("fence_events", "tool_calls", "notes"):
            data[key] = list(data[key])
        return data
