"""`POST /api/pull`: pull a model into zllm's store, with Ollama's NDJSON progress.

    {"model": "./tiny-model", "stream": true}
    → {"status":"pulling manifest"}
      {"status":"copying 3 files from /abs/tiny-model"}                           (the store's own stages)
      {"status":"pulling model.safetensors","digest":"model.safetensors","total":1048576,"completed":524288}
      {"status":"verifying sha256 digest"} {"status":"writing manifest"} {"status":"success"}

The model is anything `zllm pull` takes (an alias, hub id, local directory or .gguf, `ollama:NAME`, ...);
the served model, or one already in the store, succeeds at once. A source zllm cannot pull is a 404 before
any line; a pull that fails on the way (network, disk) is a last `{"error": "..."}` line, as Ollama sends it
(or a 502 with `stream: false`). A client that hangs up does not stop the pull: the store finishes or discards
it whole, and a later pull of the same model is then instant.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from zllm.api.context import engine_of
from zllm.api.errors import describe_exception, uses_error_shape
from zllm.api.fields import optional, required
from zllm.api.json_body import read_json_object
from zllm.api.ollama.encode import ollama_error_body
from zllm.api.ollama.model_routes import library_of
from zllm.api.ollama.ndjson import NdjsonWriter
from zllm.api.ollama.served import served_card
from zllm.canonical.library import ModelLibrary
from zllm.errors import InvalidRequest, ModelNotFound, PullError, ZllmError

PULLING_MANIFEST = {"status": "pulling manifest"}
DONE_LINES = ({"status": "verifying sha256 digest"}, {"status": "writing manifest"}, {"status": "success"})
# byte progress goes out at most this often per transfer (the store reports every chunk it copies)
TRANSFER_INTERVAL_S = 0.1


class QueueReporter:
    """The store's progress (from the pulling thread) as Ollama status objects on an asyncio queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
        self._loop = loop
        self._queue = queue
        self._last_sent: dict[str, float] = {}

    def stage(self, message: str) -> None:
        self._put({"status": message})

    def transfer(self, label: str, done: int, total: int | None) -> None:
        now = time.monotonic()
        finished = total is not None and done >= total
        if not finished and now - self._last_sent.get(label, 0.0) < TRANSFER_INTERVAL_S:
            return
        self._last_sent[label] = now
        line: dict = {"status": f"pulling {label}", "digest": label, "completed": done}
        if total is not None:
            line["total"] = total
        self._put(line)

    def _put(self, line: dict) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, line)


class UnknownSource(ZllmError):
    """A name zllm has no way to pull: Ollama's "not found" (404), before any progress line."""

    code = ModelNotFound.code


def _pull_failure(exc: Exception) -> tuple[dict, int]:
    """The error object and the status for a pull that failed on the way: a failed fetch (network, disk, a
    broken model) is the upstream's fault, 502; anything unexpected is logged and answered as the mapper says."""
    error = describe_exception(exc)
    return ollama_error_body(error), 502 if error.code == PullError.code else error.status


@uses_error_shape(ollama_error_body)
async def pull(request: web.Request) -> web.StreamResponse:
    body = await read_json_object(request)
    source = required(body, "model" if body.get("model") is not None else "name", "string")
    stream = optional(body, "stream", "boolean")
    stream = True if stream is None else stream
    if served_card(source, engine_of(request).models()) is not None:
        return await _answer_at_once(request, stream)
    library = library_of(request)
    if library is None:
        raise InvalidRequest("this daemon has no model store to pull into")
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, library.resolve, source)
    except ZllmError as exc:
        raise UnknownSource(f"pull model manifest: {exc.message}", param="model") from None
    queue: asyncio.Queue[dict] = asyncio.Queue()
    pulling = loop.run_in_executor(None, library.pull, source, QueueReporter(loop, queue))
    if stream:
        return await _stream_progress(request, pulling, queue)
    try:
        await pulling
    except Exception as exc:
        body, status = _pull_failure(exc)
        return web.json_response(body, status=status)
    return web.json_response(DONE_LINES[-1])


async def _answer_at_once(request: web.Request, stream: bool) -> web.StreamResponse:
    if not stream:
        return web.json_response(DONE_LINES[-1])
    writer = NdjsonWriter(request)
    await writer.open()
    await writer.send([PULLING_MANIFEST, *DONE_LINES])
    await writer.close()
    return writer.response


async def _stream_progress(request: web.Request, pulling: asyncio.Future, queue: asyncio.Queue) -> web.StreamResponse:
    writer = NdjsonWriter(request)
    await writer.open()
    await writer.send([PULLING_MANIFEST])
    while not pulling.done() or not queue.empty():
        next_line = asyncio.ensure_future(queue.get())
        await asyncio.wait({next_line, pulling}, return_when=asyncio.FIRST_COMPLETED)
        if next_line.done():
            await writer.send([next_line.result()])
        else:
            next_line.cancel()
        await writer.send(_drain(queue))
    try:
        pulling.result()
    except Exception as exc:
        await writer.send([_pull_failure(exc)[0]])
    else:
        await writer.send(DONE_LINES)
    await writer.close()
    return writer.response


def _drain(queue: asyncio.Queue) -> list[dict]:
    lines = []
    while not queue.empty():
        lines.append(queue.get_nowait())
    return lines


def add_routes(app: web.Application, library: ModelLibrary | None) -> None:
    app.router.add_post("/api/pull", pull)
