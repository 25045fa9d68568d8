"""vLLM's token-in / token-out endpoint, `POST /inference/v1/generate` (vLLM ≥ 0.32 behind `--enable-scale-out`),
as zllm uses it: token ids in, token ids streamed back (SSE), one usage chunk at the end.

    body = generate_body(request_id, prompt_ids, sampling, max_tokens=.., stop_token_ids=.., grammar=lark, salt=..)
    data: {"request_id": .., "choices": [{"index": 0, "token_ids": [..], "finish_reason": null|"stop"|..,
                                          "stop_reason": ..}]}
    data: {"request_id": .., "choices": [], "usage": {"prompt_tokens": N, "completion_tokens": M,
                                                      "prompt_tokens_details": {"cached_tokens": K}}}
    data: {"error": {"message": .., "type": .., "code": 400}}      (a failure after the stream began)
    data: [DONE]

What zllm does itself and vLLM must not: detokenizing (`detokenize: false`), stop strings, tool-call parsing.
What vLLM does for zllm: the fence (zllm's llguidance grammar, verbatim, as a structured-output grammar), the
namespace's cache isolation (`cache_salt`), stopping on the same stop token ids zllm checks, and a backstop for
loops (`repetition_detection`). Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from zllm.canonical import SamplingParams
from zllm.runtime.loop_guard import LoopGuardConfig

GENERATE_PATH = "/inference/v1/generate"
METRICS_PATH = "/metrics"
WAITING_METRIC = "vllm:num_requests_waiting"


def cache_salt(namespace: str) -> str:
    """vLLM's prefix cache key for one zllm namespace: requests of two namespaces (two API keys) never share a
    cached block. Hashed: the namespace may carry a key-derived secret, and vLLM logs request fields."""
    return hashlib.sha256(f"zllm-namespace:{namespace}".encode()).hexdigest()


def repetition_backstop(config: LoopGuardConfig = LoopGuardConfig()) -> dict:
    """vLLM's n-gram repetition stop, set no stricter than zllm's loop guard (which also watches the stream,
    client.py): patterns of 2..max_period tokens repeated min_repeats times. Period 1 is left to zllm's guard
    alone: vLLM has no minimum span, so min_count 10 would end a 10-token run zllm lets go on to min_span."""
    return {"min_pattern_size": 2, "max_pattern_size": config.max_period, "min_count": config.min_repeats}


def generate_body(request_id: str, prompt_ids: Iterable[int], sampling: SamplingParams, *, max_tokens: int,
                  stop_token_ids: Iterable[int], grammar: str | None, salt: str, model: str) -> dict:
    params: dict = {
        "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k or -1,
        "max_tokens": max_tokens,
        # zllm's stop ids (the model's end of turn, the dialect's, the client's): the same tokens end the turn
        # on both sides, and vLLM's own EOS rule adds nothing zllm does not check
        "stop_token_ids": sorted(stop_token_ids), "ignore_eos": False,
        "detokenize": False, "skip_special_tokens": False,
        "repetition_detection": repetition_backstop(),
    }
    if sampling.seed is not None:
        params["seed"] = sampling.seed % (1 << 63)  # vLLM takes a signed 64-bit seed
    if grammar is not None:
        params["structured_outputs"] = {"grammar": grammar}
    return {"request_id": request_id, "model": model, "token_ids": list(prompt_ids), "sampling_params": params,
            "stream": True, "stream_options": {"include_usage": True}, "cache_salt": salt, "output_mode": "tokens"}


@dataclass(frozen=True)
class Chunk:
    """One SSE data line, read."""

    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None  # vLLM's: stop, length, abort, repetition, error
    usage: tuple[int, int, int] | None = None  # (prompt, completion, cached)
    error: str | None = None
    done: bool = False


def read_chunk(data: str) -> Chunk:
    """`data` is the text after `data: `."""
    if data.strip() == "[DONE]":
        return Chunk(done=True)
    try:
        payload = json.loads(data)
    except ValueError:
        return Chunk(error=f"vLLM sent a line that is not JSON: {data[:200]!r}")
    if not isinstance(payload, dict):
        return Chunk(error=f"vLLM sent an unexpected value: {data[:200]!r}")
    if "error" in payload:
        return Chunk(error=error_message(payload))
    tokens: list[int] = []
    finish = None
    for choice in payload.get("choices") or ():
        tokens += choice.get("token_ids") or ()
        finish = choice.get("finish_reason") or finish
    usage = payload.get("usage")
    counts = None
    if isinstance(usage, dict):
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        counts = (int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), int(cached))
    return Chunk(token_ids=tuple(tokens), finish_reason=finish, usage=counts)


def error_message(payload: object) -> str:
    """The message of vLLM's error shapes: {"error": {"message"}} (OpenAI), {"detail": ...} (FastAPI)."""
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if error:
            return str(error)
        if payload.get("detail"):
            return str(payload["detail"])
        if payload.get("message"):
            return str(payload["message"])
    return str(payload)[:500]


def waiting_requests(metrics: str) -> int:
    """vLLM's waiting requests (received, not yet scheduled), summed over its engines, from its Prometheus text:
    `vllm:num_requests_waiting{engine="0",model_name=".."} 3.0`. 0 when the metric is absent."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith((WAITING_METRIC + "{", WAITING_METRIC + " ")):  # not ..._waiting_by_reason
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return int(total)
