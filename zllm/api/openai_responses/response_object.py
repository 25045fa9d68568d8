"""The `response` object: what `response.created` / `.completed` carry, non-streaming answers return, and
`GET /v1/responses/{id}` reads back.

    {"id": "resp_…", "object": "response", "created_at": 1700000000, "status": "completed",
     "model": "m", "output": [items…], "error": null, "incomplete_details": null,
     "instructions": null, "tools": [as sent], "tool_choice": "auto", "parallel_tool_calls": true,
     "temperature": 1.0, "top_p": 1.0, "max_output_tokens": null, "previous_response_id": null,
     "store": false, "text": {"format": {"type": "text"}}, "metadata": {}, "background": false,
     "usage": {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 3,
               "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 12}}

`status`: in_progress → completed | incomplete (`incomplete_details.reason = "max_output_tokens"`) |
failed (`error = {"code": "context_length_exceeded" | "server_error" | …, "message": …}`) |
cancelled (`POST /v1/responses/{id}/cancel` stopped it; see in_flight.py).
"""

from __future__ import annotations

from zllm.api.errors import ApiError
from zllm.api.openai_responses import wire
from zllm.canonical import Usage


def response_shell(response_id: str, *, model: str, created_at: int, echo: dict) -> dict:
    """The object as `response.created` shows it: in progress, no output yet."""
    return {
        "id": response_id,
        "object": wire.RESPONSE,
        "created_at": created_at,
        "status": wire.STATUS_IN_PROGRESS,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": [],
        "usage": None,
        **echo,
    }


def usage_body(usage: Usage, *, reasoning_tokens: int) -> dict:
    return {
        "input_tokens": usage.prompt_tokens,
        # read from the prefix cache / prefilled and handed to it to keep (0 with the cache off)
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": usage.cache_write_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


EMPTY_USAGE = Usage(prompt_tokens=0, completion_tokens=0)


def failed_error_body(error: ApiError) -> dict:
    """`response.error` of a failed response (Codex reads `code`: "context_length_exceeded" ends its turn)."""
    return {"code": wire.FAILED_CODES.get(error.code, error.code), "message": error.message}
