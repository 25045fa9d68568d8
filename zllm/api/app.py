"""The aiohttp application: routes, middlewares, and how the daemon runs it.

    app = create_app(engine, api_key=settings.api_key)
    runner = await start_site(app, settings.host, settings.port)    # listening when this returns
    ...
    await runner.cleanup()     # stops listening, lets in-flight requests finish (shutdown timeout), closes
or, as one task to cancel:  await run_server(app, host, port, ready=ready_event)

Middlewares, outermost first: errors (any exception → the route's error shape; see api/errors.py),
then the client guard (Host, Origin and content type: only its own clients; api/guard.py), then identity
(the API key check when keys are configured, and the request's namespace; api/auth.py).
The runner uses `handler_cancellation=True` so a client that hangs up cancels its handler, and the handler
aborts its engine request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aiohttp import web

from zllm.api import meta_routes
from zllm.api.anthropic_messages import routes as anthropic_messages_routes
from zllm.api.auth import NAMESPACE_SECRET, identity_middleware, new_namespace_secret
from zllm.api.cache_diagnostics import CACHE_DIAGNOSTICS, CacheDiagnostics
from zllm.api.context import ENGINE, SSE_KEEP_ALIVE
from zllm.api.errors import error_response
from zllm.api.guard import ClientGuard
from zllm.api.http_log import log_malformed_requests_in_one_line
from zllm.api.json_body import BODY_PARSING, BodyParsing
from zllm.api.ollama import routes as ollama_routes
from zllm.api.openai_chat import routes as openai_chat_routes
from zllm.api.openai_responses import routes as openai_responses_routes
from zllm.api.stream_pump import DEFAULT_EVENT_HEARTBEAT_S, DEFAULT_HEARTBEAT_S, KeepAlive
from zllm.canonical import EngineClient
from zllm.canonical.library import ModelLibrary
from zllm.store import ResponseStore

log = logging.getLogger("zllm.api")

# Agents resend whole conversations every turn: 100k+ tokens of history is several MB of JSON.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except (asyncio.CancelledError, ConnectionError):
        raise  # the client went away: nothing to answer, aiohttp ends the connection quietly
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects and the like are not errors
        return error_response(request, exc)
    except Exception as exc:
        return error_response(request, exc)


def create_app(
    engine: EngineClient,
    *,
    api_key: str = "",
    api_keys: Sequence[str] = (),
    namespace_secret: bytes | None = None,
    allowed_hosts: Sequence[str] = (),
    allowed_origins: Sequence[str] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    sse_heartbeat_s: float | None = DEFAULT_HEARTBEAT_S,
    sse_event_heartbeat_s: float | None = DEFAULT_EVENT_HEARTBEAT_S,
    responses: ResponseStore | None = None,
    websocket: bool = True,
    library: ModelLibrary | None = None,
    compaction_key: bytes | None = None,
) -> web.Application:
    """`responses`: where `store: true` Responses are kept (None = in memory, for the app's lifetime; a store
    passed in is closed by the caller after the app); cache diagnostics' prompt fingerprints are the engine
    client's (`EngineClient.diagnose_cache`). `websocket=False` refuses Responses WebSockets (426).
    `library`: the model store the Ollama API lists and pulls into (None = only the served model, no pulls).
    `compaction_key`: signs Responses compaction items (None: a key for this app's life only).
    `sse_heartbeat_s` / `sse_event_heartbeat_s`: how often an idle stream sends a comment / a heartbeat event
    (api/stream_pump.py; None = never; tests shorten them).
    `api_key` and `api_keys` are the accepted keys (none = auth off); `namespace_secret` salts namespace ids
    (None = a fresh one: namespaces then last as long as the app). `allowed_hosts` / `allowed_origins`: the Host
    names (the bound address among them) and browser origins served besides localhost (api/guard.py)."""
    log_malformed_requests_in_one_line()
    secret = new_namespace_secret() if namespace_secret is None else namespace_secret
    keys = tuple(dict.fromkeys(k for k in (api_key, *api_keys) if k))
    guard = ClientGuard(allowed_hosts, allowed_origins)
    middlewares = [error_middleware, guard.middleware(), identity_middleware(keys, secret)]
    app = web.Application(middlewares=middlewares, client_max_size=max_body_bytes)
    guard.install(app)
    app[NAMESPACE_SECRET] = secret
    app[ENGINE] = engine
    app[SSE_KEEP_ALIVE] = KeepAlive(sse_heartbeat_s, sse_event_heartbeat_s)
    app[CACHE_DIAGNOSTICS] = CacheDiagnostics()
    app[BODY_PARSING] = BodyParsing()
    meta_routes.add_routes(app)
    openai_chat_routes.add_routes(app)
    openai_responses_routes.add_routes(app, store=responses, websocket=websocket, compaction_key=compaction_key)
    anthropic_messages_routes.add_routes(app)
    ollama_routes.add_routes(app, library=library)
    return app


def create_runner(app: web.Application, *, shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S) -> web.AppRunner:
    """The one way to run the app: handler cancellation on, so hang-ups abort engine requests.

    On shutdown, in-flight requests get `shutdown_timeout` seconds; then their handlers are cancelled, which
    aborts their engine requests like a client hang-up.
    """
    return web.AppRunner(app, handler_cancellation=True, shutdown_timeout=shutdown_timeout)


async def start_site(
    app: web.Application, host: str, port: int, *, shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S
) -> web.AppRunner:
    """Bind and start serving; returns once the socket listens. `port=0` picks a free port (see `bound_port`).

    Stop it with `await runner.cleanup()` (it runs the app's shutdown hooks itself).
    """
    runner = create_runner(app, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    log.info("listening on http://%s:%d", host, bound_port(runner))
    return runner


def bound_port(runner: web.AppRunner) -> int:
    return runner.addresses[0][1]


async def run_server(app: web.Application, host: str, port: int, *, ready: asyncio.Event | None = None) -> None:
    """Serve until cancelled, then shut down (in-flight requests get the shutdown timeout to finish)."""
    runner = await start_site(app, host, port)
    try:
        if ready is not None:
            ready.set()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
