"""`POST /v1/messages` and `POST /v1/messages/count_tokens` (both also with Claude Code's `?beta=true`).

    POST /v1/messages               → SSE (`"stream": true`) or one `message` object (with `diagnostics`
                                      when the request sends `diagnostics`: api/cache_diagnostics.py)
    POST /v1/messages/count_tokens  → {"input_tokens": 1234} (+ `"context_management": {"original_input_tokens":
                                      5678}` when the request sends edits: the count is of the edited prompt)

Errors before the first event (bad request, unknown model, prompt too long, overloaded) are plain HTTP
errors in Anthropic's shape, `{"type":"error","error":{"type":…,"message":…}}`: the engine raises them from
`submit`, so no broken stream is ever started. A request's `context_management` edits are applied to its
conversation before it is submitted or counted (context_management.py). count_tokens renders with the same
renderer as generation (`engine.count_tokens`) and never queues behind generation, so Claude Code's burst of
26 stays cheap. It
counts exactly any prompt tokenizing could find to fit; one whose length alone proves it over the window
(prompt/length_bound.py) gets generation's 400, "prompt is too long: at least N tokens > M maximum": an
exact count of a 50 MB body would take a minute and gigabytes, and tell the client nothing more.
"""

from __future__ import annotations

from aiohttp import web

from zllm import ids
from zllm.api.anthropic_messages.decode import (
    decode_count_tokens_request,
    decode_messages_request,
)
from zllm.api.anthropic_messages.compaction import edit_request
from zllm.api.anthropic_messages.context_management import decode_context_management
from zllm.api.anthropic_messages.encode import MessagesStreamEncoder, new_message_id
from zllm.api.anthropic_messages.message import MessageBuilder, MessageFold
from zllm.api.anthropic_messages.prompt_split import split_first
from zllm.api.auth import request_namespace
from zllm.api.cache_diagnostics import anthropic_diagnostics, anthropic_previous_id, diagnostics_of
from zllm.api.collect import run_to_finish
from zllm.api.context import engine_of, keep_alive_of
from zllm.api.context_edits import apply_context_edits
from zllm.api.errors import anthropic_error_body, uses_error_shape
from zllm.api.json_body import read_json_object
from zllm.api.sse import SseMessage, SseWriter, stream_sse

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"


@uses_error_shape(anthropic_error_body)
async def create_message(request: web.Request) -> web.StreamResponse:
    body = await read_json_object(request)
    namespace = request_namespace(request)
    call = decode_messages_request(body, request_id=ids.request_id(), namespace=namespace)
    wants_diagnostics, previous_id = anthropic_previous_id(body)
    engine = engine_of(request)
    edited = await edit_request(engine, call)  # context_management: cleared, or compacted (compaction.py)
    message_id, extra = new_message_id(), {}
    compaction = edited.summary.text if edited.summary is not None else None
    if edited.pause:  # the summary is the whole answer: nothing more to generate
        encoder = MessagesStreamEncoder(message_id=message_id, model=call.request.model,
                                        prompt_tokens=edited.summary.usage.prompt_tokens,
                                        context_management=edited.context_management, compaction=compaction)
        return await _answer_now(request, encoder.paused(edited.summary.usage), stream=call.stream)
    stream = await engine.submit(edited.request)
    if wants_diagnostics:  # the message says why the cache could not reuse the previous one's prompt
        service = diagnostics_of(request)
        diagnosis = (await service.note(engine, stream, namespace=namespace, response_id=message_id,
                                        previous_id=previous_id) if service is not None else None)
        extra["diagnostics"] = anthropic_diagnostics(diagnosis)
    encoder = MessagesStreamEncoder(message_id=message_id, model=call.request.model,
                                    prompt_tokens=stream.prompt_tokens, extra=extra,
                                    context_management=edited.context_management, compaction=compaction)
    split = split_first(stream)  # message_start waits for the prompt's cache split (encode.py)
    if call.stream:
        return await stream_sse(request, split, encoder, keep_alive=keep_alive_of(request))
    builder = MessageBuilder(encoder)
    await run_to_finish(split, builder.feed)
    return web.json_response(builder.result())


async def _answer_now(request: web.Request, frames: list[SseMessage], *, stream: bool) -> web.StreamResponse:
    """An answer whose every frame is known already, streamed or folded into one message."""
    if not stream:
        fold = MessageFold()
        for message in frames:
            fold.apply(message)
        return web.json_response(fold.result())
    writer = SseWriter(request)
    await writer.open()
    await writer.send(frames)
    await writer.close()
    return writer.response


@uses_error_shape(anthropic_error_body)
async def count_tokens(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    chat_request = decode_count_tokens_request(body, request_id=ids.request_id(),
                                               namespace=request_namespace(request))
    engine, edits = engine_of(request), decode_context_management(body)
    if edits is None:
        return web.json_response({"input_tokens": await engine.count_tokens(chat_request)})
    # as Anthropic counts: the prompt the edits leave, and what it was before them
    edited = await apply_context_edits(chat_request, edits, engine)
    counted = await engine.count_tokens(edited.request)
    original = await engine.count_tokens(chat_request) if edited.applied else counted
    return web.json_response({"input_tokens": counted, "context_management": {"original_input_tokens": original}})


def add_routes(app: web.Application) -> None:
    app.router.add_post(MESSAGES_PATH, create_message)
    app.router.add_post(COUNT_TOKENS_PATH, count_tokens)
