"""Why a request missed (most of) the prefix cache: the one mechanism, said the way a person wants it.

Every "why did it miss" in zllm ends in `diagnose_divergence`: the point where two token streams part, the
segment of the request it falls in, and the decoded windows on both sides, plus what the source knows of the
two requests' structure (`known`) when it knows any. Three sources feed it:

- a daemon near-miss record (near_miss.py): divergence index, the request's segment there, and decoded
  windows already cut (24 tokens each side). Only the text is left, so the cause comes from clues in the
  windows (causes.py) and the segment's kind; `explain_near_miss(record)` → `MissExplanation`.
- two canonical requests (`explain-miss --between A.json B.json`, zllm/inspect): both are rendered for one
  model, the first differing token found, the segment of B it falls in named (segments.py), and the structure
  read off the canonical forms (compare.py) before falling back to the windows; `explain_between(a, b, renderer)`.
- two prompt fingerprints (the hosted APIs' cache diagnostics): the structure read off their digests
  (cache_diagnosis.py), then the same windows.

    {"cause": "reordered_tools", "cause_label": "reordered tools", "segment": "tool 0 (Read)",
     "detail": "the same 3 tools come in a different order: tool 0 is Read (was Bash); send tools in a stable order",
     "divergence": 57, "cached_tokens": 240, "request_tokens": 240, "in_prompt": true,
     "before": "…<tools>\\n{\\"type\\": \\"function\\", \\"function\\": {\\"name\\": \\"",
     "cached_after": "Bash\\", …", "request_after": "Read\\", …", "entry_id": null, "tier": null, "namespace": null}

A different model or namespace is a miss whatever the tokens (cached prefixes are never shared across
them: `scope`); for records, the caller says what the request's namespace / models were (the record cannot know).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from zllm.canonical import ChatRequest
from zllm.diagnosis.causes import Cause, Diagnosis, diagnose_text
from zllm.diagnosis.compare import diagnose_requests
from zllm.diagnosis.near_miss import WINDOW_TOKENS, NearMiss
from zllm.diagnosis.segments import (
    GENERATION_PROMPT,
    SYSTEM_BLOCK,
    TOOLS,
    Label,
    map_segments,
)
from zllm.token_prefix import common_prefix_length

Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class MissExplanation:
    cause: Cause
    detail: str
    divergence: int | None  # first differing token; None when the token streams do not diverge
    segment: str | None  # the request's segment at the divergence: "tool 2 (Bash)", "message 3 (user)"
    before: str = ""  # decoded tokens just before the divergence, shared by both sides
    cached_after: str = ""  # what the cached side has from the divergence on
    request_after: str = ""  # what the request has there
    cached_tokens: int | None = None
    request_tokens: int | None = None
    in_prompt: bool | None = None  # False: inside the cached sequence's generated answer
    entry_id: str | None = None
    tier: str | None = None
    namespace: str | None = None

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["cause"], data["cause_label"] = self.cause.value, self.cause.label
        return data


def explain_near_miss(record: NearMiss | Mapping, *, request_namespace: str | None = None,
                      entry_model: str | None = None, request_model: str | None = None) -> MissExplanation:
    """Explain a daemon near-miss record (a `NearMiss`, or its fields as a mapping from the control socket)."""
    miss = _as_near_miss(record)
    label = label_from_segment(miss.segment)
    diagnosis = (scope(entry_model, request_model, miss.namespace, request_namespace)
                 or diagnose_divergence(miss.before, miss.entry_after, miss.request_after, label,
                                        in_prompt=miss.in_prompt))
    return MissExplanation(
        cause=diagnosis.cause, detail=diagnosis.detail, divergence=miss.divergence,
        segment=label.name if label else miss.segment, before=miss.before, cached_after=miss.entry_after,
        request_after=miss.request_after, cached_tokens=miss.entry_tokens, request_tokens=miss.request_tokens,
        in_prompt=miss.in_prompt, entry_id=miss.entry_id, tier=miss.tier, namespace=miss.namespace)


def explain_between(a: ChatRequest, b: ChatRequest, renderer, *, renderer_b=None,
                    namespace_a: str | None = None, namespace_b: str | None = None) -> MissExplanation:
    """Why `b` would miss a cache holding `a`'s prompt. `renderer_b`: B's renderer when the template changed."""
    renderer_b = renderer_b or renderer
    ids_a, ids_b = renderer.render(a).token_ids, renderer_b.render(b).token_ids
    d = common_prefix_length(ids_a, ids_b)
    out_of_scope = scope(a.model, b.model, namespace_a, namespace_b)
    counts = {"cached_tokens": len(ids_a), "request_tokens": len(ids_b), "namespace": namespace_b}
    if d == min(len(ids_a), len(ids_b)):  # one is a prefix of the other: a hit, unless scope forbids it
        diagnosis = out_of_scope or _prefix_diagnosis(len(ids_a), len(ids_b))
        return MissExplanation(cause=diagnosis.cause, detail=diagnosis.detail, divergence=None, segment=None,
                               **counts)
    label = _label_at(renderer_b, b, d, len(ids_b))
    before, cached_after, request_after = windows(ids_a, ids_b, d, renderer.tokenizer.decode,
                                                  renderer_b.tokenizer.decode)
    diagnosis = out_of_scope or diagnose_divergence(before, cached_after, request_after, label, in_prompt=True,
                                                    known=diagnose_requests(a, b, label))
    return MissExplanation(cause=diagnosis.cause, detail=diagnosis.detail, divergence=d,
                           segment=label.name if label else None, before=before, cached_after=cached_after,
                           request_after=request_after, in_prompt=True, **counts)


def diagnose_divergence(before: str, cached_after: str, request_after: str, label: Label | None, *,
                        in_prompt: bool | None, known: Diagnosis | None = None) -> Diagnosis:
    """Why two token streams part where they do: what the requests' structure says (`known`: a changed tool, a
    reported buster, a setting; None when the source has only the windows), else the clues in the decoded
    windows (`before` shared, then each side's tokens), the part of the prompt (`label`), and whether the
    divergence falls inside the cached sequence's generated answer (`in_prompt` False)."""
    if known is not None:
        return known
    where = _the(label.name) if label else "the prompt"
    found = diagnose_text(before + cached_after, before + request_after, where=where, truncated=True)
    if found:
        return found
    if in_prompt is False:
        return Diagnosis(Cause.TEMPLATE_CHANGE,
                         "the request diverges inside the answer the cached sequence generated: the template "
                         "renders that answer differently as history (it drops reasoning or re-serializes tool "
                         "calls)")
    kind = label.kind if label else None
    if kind in ("tool", "tools"):
        return _tool_window_diagnosis(before, cached_after, request_after, where)
    buster = _window_buster(before, cached_after, request_after, label)
    if buster:
        return buster
    if kind in ("system", "message", "messages"):
        return Diagnosis(Cause.EDITED_HISTORY, f"the text of {where} changed")
    if kind == "generation":
        return Diagnosis(Cause.TEMPLATE_CHANGE, "the conversation is the same but the template ends it differently")
    return Diagnosis(Cause.UNKNOWN, "the token streams differ here, and nothing in the windows says why")


def windows(cached: Sequence[int], request: Sequence[int], at: int, decode_cached: Decode,
            decode_request: Decode | None = None) -> tuple[str, str, str]:
    """(the shared tokens before `at`, the cached side from `at`, the request from `at`), decoded: the windows
    every explanation shows (near_miss.py cuts a record's the same way)."""
    decode_request = decode_request or decode_cached
    return (decode_request(list(request[max(0, at - WINDOW_TOKENS):at])),
            decode_cached(list(cached[at:at + WINDOW_TOKENS])), decode_request(list(request[at:at + WINDOW_TOKENS])))


def label_from_segment(segment: str | None) -> Label | None:
    """The label for a segment name as segments.py writes it (either way of asking it)."""
    if not segment:
        return None
    if segment in ("system", SYSTEM_BLOCK):
        return Label("system", SYSTEM_BLOCK, 0)
    if segment == TOOLS:
        return Label("tools", TOOLS)
    if segment == GENERATION_PROMPT:
        return Label("generation", GENERATION_PROMPT)
    patterns = ((r"tool (\d+)\b", "tool"), (r"message (\d+) \(", "message"), (r"messages (\d+)-", "messages"))
    for pattern, kind in patterns:
        match = re.match(pattern, segment)
        if match:
            return Label(kind, segment, int(match.group(1)))
    return None


_TOKENS_LEFT = re.compile(r"(?i)\btokens?\s+(?:left|remaining)\b|\bcontext\s+(?:left|remaining)\b|\btoken\s+usage\b")


def _window_buster(before: str, cached_after: str, request_after: str, label: Label | None) -> Diagnosis | None:
    """Claude Code's busters that zllm reports rather than removes (busters.py), read off the
    windows and the segment: a tokens-left reminder, a system message in the middle of the conversation."""
    if "<system-reminder>" in before + cached_after + request_after and _TOKENS_LEFT.search(
            before + cached_after + request_after):
        return Diagnosis(Cause.CACHE_BUSTER, "a trailing tokens-left reminder moved or was rewritten: the client "
                                             "rewrites it every turn, so the cache cannot reuse what follows it")
    if label is not None and label.kind == "message" and label.name.endswith("(system)") and label.index:
        return Diagnosis(Cause.CACHE_BUSTER, f"{label.name} is a mid-conversation system message whose text "
                                             "changed (dates, deferred tool lists): the model reads it, so zllm "
                                             "keeps it, and nothing after it can be reused")
    return None


def _tool_window_diagnosis(before: str, cached_after: str, request_after: str, where: str) -> Diagnosis:
    # the windows part inside a tool's "name" value: another tool stands where the cached one stood
    if re.search(r'"name":\s*"[^"]*$', before):
        cached, request = _word(cached_after), _word(request_after)
        return Diagnosis(Cause.REORDERED_TOOLS, f"a different tool stands in {where} ({request} where the cache has "
                                                f"{cached}): the tools were reordered, or one was added or removed "
                                                "before it")
    return Diagnosis(Cause.CHANGED_TOOL_SCHEMA, f"a tool schema changed in {where}")


def scope(entry_model: str | None, request_model: str | None, entry_namespace: str | None,
          request_namespace: str | None) -> Diagnosis | None:
    """A miss whatever the tokens: another model, or another namespace (None when neither is known to differ)."""
    if entry_model and request_model and entry_model != request_model:
        return Diagnosis(Cause.DIFFERENT_MODEL, f"the cached request was for model `{entry_model}`, this one is for "
                                                f"`{request_model}`: cached prefixes are never shared across models")
    if entry_namespace is not None and request_namespace is not None and entry_namespace != request_namespace:
        return Diagnosis(Cause.DIFFERENT_NAMESPACE,
                         f"the cached prefix is in namespace `{entry_namespace or '(none)'}`, the request in "
                         f"`{request_namespace or '(none)'}`: each API key has its own cache; send the same key")
    return None


def _prefix_diagnosis(cached: int, request: int) -> Diagnosis:
    if cached == request:
        return Diagnosis(Cause.NO_MISS, f"both render to the same {cached} tokens: the second is a full hit")
    if cached < request:
        return Diagnosis(Cause.NO_MISS, f"the cached prompt ({cached} tokens) is a prefix of the request "
                                        f"({request}): a hit on all of it")
    return Diagnosis(Cause.NO_MISS, f"the request ({request} tokens) is a prefix of the cached prompt ({cached}): "
                                    "a full hit (a retry or rewind)")


def _label_at(renderer, request: ChatRequest, index: int, total: int) -> Label | None:
    segment = map_segments(renderer, request, total).at(index)
    return segment.label if segment else None


def _as_near_miss(record: NearMiss | Mapping) -> NearMiss:
    if isinstance(record, NearMiss):
        return record
    names = {f.name for f in dataclasses.fields(NearMiss)}
    return NearMiss(**{k: v for k, v in record.items() if k in names})


def _word(text: str) -> str:
    return "`" + re.split(r'["\s]', text, maxsplit=1)[0] + "`"


def _the(name: str) -> str:
    # "system" and "model": the coarse segment names of cache diagnoses (cache_diagnosis.py)
    return f"the {name}" if name in (SYSTEM_BLOCK, TOOLS, GENERATION_PROMPT, "system", "model") else name
