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
- Why: what the structure says (tool lists compared by name and digest: reordered / added or removed / a
  schema changed; a mid-conversation system message or a tokens-left reminder (busters.py) where the divergence
  falls; a setting), else the decoded tokens on both sides of the divergence: the same `diagnose_divergence` that
  explains near misses (explain.py), with the same scope rule for another model.
"""

from __future__ import annotations

from collections.abc import Sequence

from zllm.diagnosis.causes import Cause, Diagnosis
from zllm.diagnosis.compare import tool_list_change
from zllm.diagnosis.explain import Decode, diagnose_divergence, label_from_segment, scope, windows
from zllm.diagnosis.records import CacheDiagnosis, RequestFingerprint
from zllm.diagnosis.segments import Label
from zllm.token_prefix import common_prefix_length


def diagnose(previous: RequestFingerprint | None, current: RequestFingerprint, *, compared_with: str,
             decode: Decode | None = None) -> CacheDiagnosis:
    """`previous` None: no fingerprint is kept for `compared_with` (unknown, expired, another namespace)."""
    if previous is None:
        return CacheDiagnosis("not_found", compared_with, busters=current.busters,
                              detail=f"no earlier request {compared_with!r} is known in this namespace")
    reusable = len(previous.prompt_ids)
    other_model = scope(previous.model, current.model, None, None)
    if other_model is not None:
        return CacheDiagnosis("model", compared_with, missed_tokens=reusable, reusable_tokens=reusable,
                              segment="model", cause=other_model.cause.value, busters=current.busters,
                              detail=other_model.detail)
    shared = common_prefix_length(previous.prompt_ids, current.prompt_ids)
    if shared >= min(reusable, len(current.prompt_ids)):
        return CacheDiagnosis(None, compared_with, reusable_tokens=reusable, busters=current.busters)
    reason, segment, known = _structural(previous, current)
    before, cached_after, request_after = _windows(previous.prompt_ids, current.prompt_ids, shared, decode)
    found = diagnose_divergence(before, cached_after, request_after, _label(segment), in_prompt=True,
                                known=known or _buster_at(segment, previous, current))
    return CacheDiagnosis(reason, compared_with, missed_tokens=reusable - shared, reusable_tokens=reusable,
                          divergence=shared, segment=segment, cause=found.cause.value, detail=found.detail,
                          busters=current.busters, before=before, cached_after=cached_after,
                          request_after=request_after)


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
    if old_names != new_names:  # read as `explain-miss --between` reads two canonical tool lists
        return segment, tool_list_change(old_names, new_names)
    return segment, Diagnosis(Cause.CHANGED_TOOL_SCHEMA, f"the definition of {name} changed (description or "
                                                         "input schema)")


def _buster_at(segment: str | None, previous: RequestFingerprint, current: RequestFingerprint) -> Diagnosis | None:
    """A reported buster (busters.py) in the message the divergence falls in, in either request."""
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
    """(shared tokens before `at`, the earlier prompt from `at`, this one from `at`), decoded ("" without a
    tokenizer, or when it fails: a diagnostic never fails the request)."""
    if decode is None:
        return "", "", ""
    try:
        return windows(previous, current, at, decode)
    except Exception:
        return "", "", ""


def _label(segment: str | None) -> Label | None:
    """The label `diagnose_divergence` reads, under this diagnosis's own segment name ("system", not "system
    block": the name the hosted APIs' `zllm` details have always carried)."""
    label = label_from_segment(segment)
    return Label(label.kind, segment, label.index) if label is not None and segment is not None else label


def _message_name(fingerprint: RequestFingerprint, index: int) -> str:
    if index == 0 and fingerprint.roles and fingerprint.roles[0] == "system":
        return "system"
    return f"message {index} ({fingerprint.roles[index]})"
