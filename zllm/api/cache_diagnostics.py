"""Prompt-cache diagnostics in the hosted APIs' shapes: Anthropic `diagnostics`, Responses
`prompt_cache_diagnostics`. The diagnosis itself is zllm's (zllm/diagnosis/, reached through the engine client's
declared `diagnose_cache`, which also keeps each prompt's fingerprint by response id); this module reads the
request fields and writes the wire objects.

Anthropic (request `"diagnostics": {"previous_message_id": "msg_…" | null}`; the beta header
`cache-diagnosis-2026-04-07` is accepted and not required):

    "diagnostics": {"cache_miss_reason": {"type": "tools_changed", "cache_missed_input_tokens": 412},
                    "zllm": {"segment": "tool 1 (Read)", "token_index": 96, "cause": "changed_tool_schema", …}}
    "diagnostics": {"cache_miss_reason": {"type": "previous_message_not_found"}, "zllm": {…}}
    "diagnostics": null            ← the first turn (`null` id), or no miss: the earlier prompt was reused whole

on the message and, streaming, on `message_start`'s message. Types: model_changed, system_changed,
tools_changed, messages_changed (with `cache_missed_input_tokens`), previous_message_not_found, unavailable
(the structure matches but a setting or the template changed the prompt; or the engine cannot say).

Responses (request `"prompt_cache_options": {"comparison_response_id": "resp_…"}`):

    "prompt_cache_diagnostics": {"type": "cache_miss", "reason": "tools_changed", "cache_missed_tokens": 412,
                                 "comparison_reusable_tokens": 1024, "zllm": {…}}
    "prompt_cache_diagnostics": {"type": "cache_hit" | "comparison_response_not_found" | "unavailable", …}

with reasons model_changed, tools_changed, input_changed (system, messages, template),
text_format_changed, reasoning_effort_changed; and `prompt_cache_options` echoed with the id.

`zllm` is what the hosted APIs cannot say, ignored by the SDKs (it lands in `model_extra`): the segment and the
token index where the prompts part, the likely cause, the busters this request carries. Which fingerprints are
kept: every Anthropic request that sends `diagnostics`, and every Responses response (a comparison may name
any of them); by the daemon in sqlite in the state dir (zllm/diagnosis/fingerprint_store.py), bounded, so they
survive a restart.
"""

from __future__ import annotations

from aiohttp import web

from zllm.api.fields import check_type, optional
from zllm.canonical import EngineClient, RequestStream
from zllm.diagnosis.records import CacheDiagnosis

_ANTHROPIC_TYPES = {"model": "model_changed", "system": "system_changed", "tools": "tools_changed",
                    "messages": "messages_changed", "not_found": "previous_message_not_found"}
_RESPONSES_REASONS = {"model": "model_changed", "tools": "tools_changed", "system": "input_changed",
                      "messages": "input_changed", "template": "input_changed"}
_RESPONSES_OPTION_REASONS = {"response_format": "text_format_changed", "thinking": "reasoning_effort_changed"}


class CacheDiagnostics:
    """The step a route takes: compare an admitted request with an earlier id and remember it (the engine client
    does both; the fingerprints live with it)."""

    async def note(self, engine: EngineClient, stream: RequestStream, *, namespace: str, response_id: str,
                   previous_id: str | None) -> CacheDiagnosis | None:
        """Compare an admitted request with `previous_id` (None: nothing to compare), then remember it as
        `response_id`. Runs between submit and the first event: a hang-up meanwhile aborts the request."""
        try:
            return await engine.diagnose_cache(stream, namespace=namespace, response_id=response_id,
                                               previous_id=previous_id)
        except BaseException:
            stream.abort()
            raise


CACHE_DIAGNOSTICS = web.AppKey("zllm.cache_diagnostics", CacheDiagnostics)


def diagnostics_of(request: web.Request) -> CacheDiagnostics | None:
    return request.app.get(CACHE_DIAGNOSTICS)


# ---------------------------------------------------------------------------------------------- Anthropic


def anthropic_previous_id(body: dict) -> tuple[bool, str | None]:
    """(whether the request asked for diagnostics, the previous message id: None on a first turn)."""
    raw = body.get("diagnostics")
    if raw is None:
        return False, None
    diagnostics = check_type(raw, "object", "diagnostics")
    return True, optional(diagnostics, "previous_message_id", "string", "diagnostics.previous_message_id") or None


def anthropic_diagnostics(diagnosis: CacheDiagnosis | None) -> dict | None:
    """The message's `diagnostics` value (None: the first turn, or no miss)."""
    if diagnosis is None or diagnosis.reason is None:
        return None
    kind = _ANTHROPIC_TYPES.get(diagnosis.reason, "unavailable")
    reason: dict = {"type": kind}
    if kind.endswith("_changed"):
        reason["cache_missed_input_tokens"] = diagnosis.missed_tokens
    return {"cache_miss_reason": reason, "zllm": zllm_details(diagnosis)}


# ---------------------------------------------------------------------------------------------- Responses


def comparison_response_id(body: dict) -> tuple[dict | None, str | None]:
    """(the request's `prompt_cache_options` object, its comparison response id)."""
    raw = body.get("prompt_cache_options")
    if raw is None:
        return None, None
    options = check_type(raw, "object", "prompt_cache_options")
    compared = optional(options, "comparison_response_id", "string", "prompt_cache_options.comparison_response_id")
    return options, compared or None


def responses_options_echo(options: dict, compared: str | None) -> dict:
    """`prompt_cache_options` as the response object shows what was applied."""
    return {"mode": options.get("mode") if options.get("mode") in ("implicit", "explicit") else "implicit",
            "ttl": options.get("ttl") if options.get("ttl") in ("30m", "12h") else "30m",
            "comparison_response_id": compared, "prewarm": options.get("prewarm") is True}


def responses_diagnostics(diagnosis: CacheDiagnosis) -> dict:
    """The response's `prompt_cache_diagnostics` value."""
    extra = {"zllm": zllm_details(diagnosis)}
    if diagnosis.reason is None:
        return {"type": "cache_hit", **extra}
    if diagnosis.reason == "not_found":
        return {"type": "comparison_response_not_found", **extra}
    if diagnosis.reason == "unavailable":
        return {"type": "unavailable", **extra}
    return {"type": "cache_miss", "reason": _responses_reason(diagnosis),
            "cache_missed_tokens": diagnosis.missed_tokens, "comparison_reusable_tokens": diagnosis.reusable_tokens,
            **extra}


def _responses_reason(diagnosis: CacheDiagnosis) -> str:
    if diagnosis.reason == "options":
        for name, reason in _RESPONSES_OPTION_REASONS.items():
            if f"`{name}`" in diagnosis.detail:
                return reason
    return _RESPONSES_REASONS.get(diagnosis.reason or "", "input_changed")


def zllm_details(diagnosis: CacheDiagnosis) -> dict:
    return {"compared_with": diagnosis.compared_with, "reason": diagnosis.reason, "segment": diagnosis.segment,
            "token_index": diagnosis.divergence, "missed_tokens": diagnosis.missed_tokens,
            "reusable_tokens": diagnosis.reusable_tokens, "cause": diagnosis.cause or None,
            "detail": diagnosis.detail or None, "busters": list(diagnosis.busters)}
