"""Composition root: settings → model (pulled if missing) → engine → HTTP API; signals; graceful shutdown.

This is the only module that knows every layer. Nothing imports it except the CLI.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
from dataclasses import dataclass

from zllm.config import Settings
from zllm.errors import ConfigError

log = logging.getLogger("zllm.daemon")

# in-flight requests get this long to finish after SIGINT/SIGTERM before they are aborted
SHUTDOWN_GRACE_S = 5.0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(settings: Settings) -> None:
    """Serving beyond this machine without a key would hand the model (and the cache) to the network."""
    if not is_loopback(settings.host) and not settings.api_key:
        raise ConfigError(
            f"refusing to bind {settings.host} without an API key",
            hint="set ZLLM_API_KEY (or --api-key) to serve beyond 127.0.0.1",
        )


@dataclass
class Served:
    """What `serve` needs to know once the model is resolved."""

    name: str
    path: object  # pathlib.Path of the model directory
    created: int


def resolve_model(settings: Settings, progress=None) -> Served:
    """The model to serve, pulling it into the store first if it is not there (like `ollama run`)."""
    from zllm.models import ModelStore

    store = ModelStore(settings.models_dir)
    if store.has(settings.model):
        stored = store.get(settings.model)
    else:
        log.info("model %s is not in the store; pulling it", settings.model)
        stored = store.pull(settings.model, progress=progress)
    return Served(name=stored.name, path=stored.path, created=int(stored.manifest.added_at))


async def serve_forever(settings: Settings, served: Served) -> None:
    """Load the engine, serve HTTP until SIGINT/SIGTERM, then shut down in order: listener, requests, engine."""
    from zllm.api.app import create_app, start_site
    from zllm.runtime.client import LocalEngineClient

    responses = open_response_store(settings)  # before the weights load: an unusable store file fails fast
    engine = await asyncio.get_running_loop().run_in_executor(
        None, lambda: LocalEngineClient.from_model_dir(served.path, name=served.name, created=served.created, settings=settings)
    )
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    app = create_app(engine, api_key=settings.api_key, responses=responses, websocket=settings.responses_websocket)
    runner = await start_site(app, settings.host, settings.port)
    log.info("serving %s on http://%s:%d/v1", served.name, settings.host, settings.port)
    try:
        await stop.wait()
        log.info("shutting down")
    finally:
        await runner.cleanup()  # stops listening, lets handlers finish (grace), cancels the rest → aborts
        responses.close()       # after the app: its last saves have been written
        engine.close()


def open_response_store(settings: Settings):
    """The sqlite store behind `previous_response_id` (state_dir/responses.sqlite3), pruned on open."""
    from zllm.store import ResponseStore

    settings.state_dir.mkdir(parents=True, exist_ok=True)
    return ResponseStore(settings.state_dir / "responses.sqlite3", max_rows=settings.responses_max_stored,
                         max_age_s=settings.responses_max_age_days * 86400)


def run(settings: Settings, progress_factory=None) -> None:
    """`progress_factory()` gives a context-managed `PullProgress`, used only if the model must be pulled."""
    check_exposure(settings)
    if progress_factory is None:
        served = resolve_model(settings)
    else:
        with progress_factory() as progress:
            served = resolve_model(settings, progress)
    try:
        import uvloop

        uvloop.run(serve_forever(settings, served))
    except ImportError:  # uvloop has no Windows build
        asyncio.run(serve_forever(settings, served))
