"""The diagnosis package's plain values, passed across layers: a request's prompt fingerprint and a cache
diagnosis. Standard library only (tests/unit/test_layering.py), so the API edge and the engine-client contract
can name them without loading anything else of the package.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RequestFingerprint:
    """One request's prompt, as digests plus token ids (fingerprint.py makes it; fingerprint_store.py keeps it)."""

    model: str
    system: str  # digest of the leading system message ("" when there is none)
    tools: tuple[tuple[str, str], ...]  # (name, digest of the whole definition), in the order sent
    messages: tuple[str, ...]  # digest of each canonical message (the leading system message included)
    roles: tuple[str, ...]  # each message's role, to name the segment ("message 3 (user)")
    options: dict[str, str]  # other prompt-affecting settings: {"thinking": "True", "tool_choice": "auto", ...}
    prompt_ids: tuple[int, ...]
    # cache busters found in the request: normalized ones (removed before rendering) and reported ones
    busters: tuple[str, ...] = ()
    response_id: str = ""
    namespace: str = ""

    def with_response(self, response_id: str, namespace: str) -> RequestFingerprint:
        return dataclasses.replace(self, response_id=response_id, namespace=namespace)


@dataclass(frozen=True)
class CacheDiagnosis:
    """Why a request could not reuse all of an earlier one's cached prompt (the shared core of both APIs'
    diagnostics, and what `explain-miss --id` shows).

    `reason`: "model", "system", "tools", "messages", "options" (the structure is the same but a setting that
    changes the prompt differs, or the template renders it differently), "not_found" (no fingerprint for the
    id), "unavailable" (the engine cannot say), or None (no miss: the earlier prompt is a prefix of this one).
    """

    reason: str | None
    compared_with: str = ""
    missed_tokens: int = 0  # tokens of the earlier prompt past the divergence: what the cache cannot reuse
    reusable_tokens: int = 0  # the earlier prompt's length: what an append-only request would reuse
    divergence: int | None = None  # first differing token of the two prompts
    segment: str | None = None  # where in this request: "system", "tool 1 (Read)", "message 3 (user)"
    cause: str = ""  # causes.Cause value: "timestamp", "reordered_tools", "cache_buster", ...
    detail: str = ""  # one sentence a person can act on
    busters: tuple[str, ...] = ()  # cache busters this request carries (normalized or reported)
    before: str = ""  # decoded tokens both prompts share just before the divergence
    cached_after: str = ""  # decoded tokens of the earlier prompt from the divergence on
    request_after: str = ""  # ... and of this one
    at: float = field(default_factory=time.time)

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["busters"] = list(self.busters)
        return data

    @classmethod
    def from_json(cls, data: dict) -> CacheDiagnosis:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["busters"] = tuple(values.get("busters", ()))
        return cls(**values)
