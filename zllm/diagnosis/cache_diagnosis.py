"""Why a request could not reuse an earlier one's cached prompt: two fingerprints in, a `CacheDiagnosis` out.

The answer behind Anthropic's `diagnostics.cache_miss_reason` and Responses' `prompt_cache_diagnostics`.

- How much: the two prompts' token ids are compared; the earlier prompt's tokens past their first difference
  are what the cache cannot reuse (`missed_tokens`; zllm's prefix cache matches token by token, so when the
  earlier request's entry is still cached this is exactly the prompt it kept minus what this one restored).
  No difference inside the earlier prompt (it is a prefix of this one, or this one of it) is no miss.
- Which part: the structure, in the order Anthropic's cache is laid out: model, tools, system, then messages
  (an earlier message differs, instead of only new ones appended); then the other settings that change the
  prompt (thinking, tool choice, response format); else the template rendered the same conversation
  differently.
- Why: tool lists compared by name and digest (reordered / added or removed / a schema changed); a
  mid-conversation system message or a tokens-left reminder (cache_busters.py) where the divergence falls; else
  the decoded tokens on both sides of the divergence read for a timestamp, a session stamp, whitespace or JSON
  spelling (causes.py), else the text was edited.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from zllm.diagnosis.causes import Cause, Diagnosis, diagnose_text
from zllm.diagnosis.records import CacheDiagnosis, RequestFingerprint
from zllm.diagnosis.segments import shared_prefix_length

WINDOW_TOKENS = 24
Decode = Callable[[Sequence[int]], str]


def diagnose(previous: RequestFingerprint | None, current: RequestFingerprint, *, compared_with: str,
             decode: Decode | None = None) -> CacheDiagnosis:
    """`previous` None: no fingerprint is kept for `compared_with` (unknown, expired, another namespace)."""
    if previous is None:
        return CacheDiagnosis("not_found", compared_with, busters=current.busters,
                              detail=f"no earlier request {compared_with!r} is known in this namespace")
    reusable = len(previous.prompt_ids)
    if previous.model != current.model:
        return CacheDiagnosis("model", compared_with, missed_tokens=reusable, reusable_tokens=reusable,
                              segment="model", cause=Cause.DIFFERENT_MODEL.value, busters=current.busters,
                              detail=f"`{previous.model}` then `{current.model}`: cached prefixes are never "
                                     "shared across models")
    shared = shared_prefix_length(previous.prompt_ids, current.prompt_ids)
    if shared >= min(reusable, len(current.prompt_ids)):
        return CacheDiagnosis(None, compared_with, reusable_tokens=reusable, busters=current.busters)
    reason, segment, found = _structural(previous, current)
    windows = _windows(previous.prompt_ids, current.prompt_ids, shared, decode)
    if found is None:
        found = (_buster_at(segment, previous, current)
                 or (decode and diagnose_text(windows[0] + windows[1], windows[0] + windows[2],
                                              where=_the(segment), truncated=True))
                 or Diagnosis(Cause.EDITED_HISTORY, f"the text of {_the(segment)} changed"))
    return CacheDiagnosis(reason, compared_with, missed_tokens=reusable - shared, reusable_tokens=reusable,
                          divergence=shared, segment=segment, cause=found.cause.value, detail=found.detail,
                          busters=current.busters, before=windows[0], cached_after=windows[1],
                          request_after=windows[2])


def _structural(previous: RequestFingerprint, current: RequestFingerprint
                ) -> tuple[str, str | None, Diagnosis | None]:
    """(reason, segment, a diagnosis when the structure alone gives the cause)."""
    if previous.tools != current.tools:
        segment, found = _tools_diagnosis(previous.tools, current.tools)
        return "tools", segment, found
    if previous.system != current.system:
        return "system", "system", None
    for index, (old, new) in enumerate(zip(previous.messages, current.messages)):
        if old != new:
            return "messages", _message_name(current, index), None
    changed = [name for name, value in current.options.items() if previous.options.get(name) != value]
    if changed:
        names = ", ".join(f"`{name}`" for name in changed)
        return "options", None, Diagnosis(Cause.CHANGED_SETTING,
                                           f"the conversation is the same but {names} changed, which the "
                                           "template renders into the prompt")
    return "template", None, Diagnosis(Cause.TEMPLATE_CHANGE,
                                       "the conversation and settings are the same but the template renders the "
                                       "earlier turn differently once it is history (it drops reasoning or "
                                       "re-serializes tool calls)")


def _tools_diagnosis(old: tuple[tuple[str, str], ...], new: tuple[tuple[str, str], ...]
                     ) -> tuple[str, Diagnosis]:
    old_names, new_names = [name for name, _ in old], [name for name, _ in new]
    first = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
    name = new_names[first] if first < len(new_names) else None
    segment = f"tool {first} ({name})" if name else "tools"
    if sorted(old_names) != sorted(new_names):
        added = sorted(set(new_names) - set(old_names))
        removed = sorted(set(old_names) - set(new_names))
        parts = ([f"added {', '.join(added)}"] if added else []) + ([f"removed {', '.join(removed)}"] if removed
                                                                     else [])
        return segment, Diagnosis(Cause.TOOLS_ADDED_OR_REMOVED, f"tools were {' and '.join(parts) or 'changed'}")
    if old_names != new_names:
        return segment, Diagnosis(Cause.REORDERED_TOOLS,
                                  f"the same {len(new_names)} tools come in another order: tool {first} is "
                                  f"{name} (was {old_names[first]}); send tools in a stable order")
    return segment, Diagnosis(Cause.CHANGED_TOOL_SCHEMA, f"the definition of {name} changed (description or "
                                                         "input schema)")


def _buster_at(segment: str | None, previous: RequestFingerprint, current: RequestFingerprint) -> Diagnosis | None:
    """A reported buster (cache_busters.py) in the message the divergence falls in, in either request."""
    if not segment or not segment.startswith("message "):
        return None
    index = segment.split()[1]
    for buster in (*current.busters, *previous.busters):
        if buster.endswith(f" in message {index}"):
            what = buster.rsplit(" in message ", 1)[0]
            return Diagnosis(Cause.CACHE_BUSTER, f"{segment} is a {what} the client rewrites between turns: zllm "
                                                 "keeps it because the model reads it, so the cache cannot reuse "
                                                 "what follows it")
    return None


def _windows(previous: Sequence[int], current: Sequence[int], at: int, decode: Decode | None) -> tuple[str, str, str]:
    """(shared tokens before `at`, the earlier prompt from `at`, this one from `at`), decoded."""
    if decode is None:
        return "", "", ""
    try:
        return (decode(list(current[max(0, at - WINDOW_TOKENS):at])),
                decode(list(previous[at:at + WINDOW_TOKENS])), decode(list(current[at:at + WINDOW_TOKENS])))
    except Exception:  # a diagnostic never fails the request
        return "", "", ""


def _message_name(fingerprint: RequestFingerprint, index: int) -> str:
    if index == 0 and fingerprint.roles and fingerprint.roles[0] == "system":
        return "system"
    return f"message {index} ({fingerprint.roles[index]})"


def _the(segment: str | None) -> str:
    if segment is None:
        return "the prompt"
    return f"the {segment}" if segment in ("system", "tools", "model") else segment

