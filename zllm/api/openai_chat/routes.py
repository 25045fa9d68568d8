"""`POST /v1/chat/completions`: decode → `engine.submit` → SSE stream or one JSON completion.

Errors before the first event (bad request, unknown model, prompt too long, overloaded) are plain HTTP
error responses in OpenAI's shape; the engine raises them from `submit` so no broken stream is ever started.
"""

from __future__ import annotations

import time

from aiohttp import web

from zllm import ids
from zllm.api.auth import request_namespace
from zllm.api.collect import run_to_finish
from zllm.api.context import engine_of, keep_alive_of
from zllm.api.errors import openai_error_body, uses_error_shape
from zllm.api.json_body import read_json_object
from zllm.api.openai_chat.completion import ChatCompletionBuilder
from zllm.api.openai_chat.decode import decode_chat_request
from zllm.api.openai_chat.encode import ChatStreamEncoder
from zllm.api.sse import stream_sse

PATH = "/v1/chat/completions"


@uses_error_shape(openai_error_body)
async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await read_json_object(request)
    call = decode_chat_request(body, request_id=ids.request_id(), namespace=request_namespace(request))
    stream = await engine_of(request).submit(call.request)
    completion_id, created = ids.chat_completion_id(), int(time.time())
    if call.stream:
        encoder = ChatStreamEncoder(
            completion_id=completion_id, model=call.request.model, created=created, include_usage=call.include_usage
        )
        return await stream_sse(request, stream, encoder, keep_alive=keep_alive_of(request))
    builder = ChatCompletionBuilder(completion_id=completion_id, model=call.request.model, created=created)
    await run_to_finish(stream, builder.feed)
    return web.json_response(builder.result())


def add_routes(app: web.Application) -> None:
    app.router.add_post(PATH, chat_completions)
