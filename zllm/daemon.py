"""Composition root: settings → locks → model (pulled if missing) → control socket → engine → HTTP API;
signals; graceful shutdown.

This is the only module that knows every layer. Nothing imports it except the CLI.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path

from zllm import __version__
from zllm.config import Settings
from zllm.errors import ConfigError, ModelNotFound

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


def check_port_free(host: str, port: int) -> None:
    """Fail in a second, not after loading the weights, when another server holds the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the real listener: TIME_WAIT is no owner
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise port_in_use(host, port, exc) from None


def port_in_use(host: str, port: int, exc: OSError) -> ConfigError:
    return ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                       hint="another server is using the port: stop it, or pick another with --port / ZLLM_PORT")


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


def resolve_draft_model(settings: Settings) -> Settings:
    """Settings whose draft_model (a store name, alias or path) is a model directory."""
    from zllm.models import ModelStore

    if not settings.draft_model:
        return settings
    store = ModelStore(settings.models_dir)
    if store.has(settings.draft_model):
        return replace(settings, draft_model=str(store.get(settings.draft_model).path))
    path = Path(settings.draft_model).expanduser()
    if not path.is_dir():
        raise ModelNotFound(settings.draft_model)
    return replace(settings, draft_model=str(path))


async def serve_forever(settings: Settings, served: Served) -> None:
    """Open the control socket, load the engine, serve HTTP until SIGINT/SIGTERM (or a control `shutdown`),
    then shut down in order: listener, requests, engine, control socket."""
    from zllm.control.methods import ControlMethods
    from zllm.control.server import ControlServer
    from zllm.runtime.trace import LogHub, TraceHub

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    trace, log_hub = TraceHub(loop), LogHub(loop)
    logging.getLogger().addHandler(log_hub)
    control = ControlMethods(daemon_facts(settings, served), trace=trace, logs=log_hub.ring,
                             request_shutdown=stop.set, explain=near_miss_explainer())
    server = ControlServer(settings.control_socket, version=__version__, methods=control.methods(),
                           streams=control.streams())
    await server.start()  # up while the model loads: `zllm status` says "loading", `zllm start` waits for "ready"
    log.info("control socket %s", settings.control_socket)
    try:
        await _serve_model(settings, served, control, trace, stop)
    finally:
        await server.close()
        logging.getLogger().removeHandler(log_hub)


async def _serve_model(settings: Settings, served: Served, control, trace, stop: asyncio.Event) -> None:
    from zllm.api.app import create_app, start_site
    from zllm.runtime.client import LocalEngineClient

    settings = resolve_draft_model(settings)
    responses = open_response_store(settings)  # before the weights load: an unusable store file fails fast
    try:
        engine = await asyncio.get_running_loop().run_in_executor(None, lambda: LocalEngineClient.from_model_dir(
            served.path, name=served.name, created=served.created, settings=settings, observer=trace.publish))
    except BaseException:
        responses.close()
        raise
    release_freed_heap()
    try:
        control.attach(engine, describe_model(engine, served))
        if stop.is_set():  # SIGTERM while the weights were loading
            return
        app = create_app(engine, api_key=settings.api_key, responses=responses, websocket=settings.responses_websocket)
        try:
            runner = await start_site(app, settings.host, settings.port)
        except OSError as exc:  # taken since check_port_free looked
            raise port_in_use(settings.host, settings.port, exc) from None
        log.info("serving %s on http://%s:%d/v1 (backend %s: %s; tool dialect %s: %s)", served.name, settings.host,
                 settings.port, engine.loaded.backend, engine.loaded.backend_reason, engine.dialect_choice.name,
                 engine.dialect_choice.reason)
        try:
            await stop.wait()
            control.phase = "stopping"
            log.info("shutting down")
        finally:
            await runner.cleanup()  # stops listening, lets handlers finish (grace), cancels the rest → aborts
    finally:
        responses.close()  # after the app: its last saves have been written
        engine.close()


def daemon_facts(settings: Settings, served: Served):
    from zllm.control.methods import DaemonFacts

    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return DaemonFacts(version=__version__, pid=os.getpid(), started_at=time.time(), model=served.name,
                       http_url=f"http://{host}:{settings.port}/v1", host=settings.host, port=settings.port,
                       socket=str(settings.control_socket), data_dir=str(settings.data_dir),
                       log_file=str(settings.log_file), max_queue=settings.max_queue)


def describe_model(engine, served: Served):
    """`zllm ps`'s facts about the loaded weights, computed once."""
    from zllm.control.protocol import LoadedModelInfo

    loaded = engine.loaded
    facts = dict(name=served.name, path=str(served.path), device=str(loaded.device), dtype=loaded.quantization,
                 context_length=loaded.context_length, loaded_at=time.time(), backend=loaded.backend,
                 backend_reason=loaded.backend_reason, quantization=loaded.quantization)
    architectures = getattr(loaded.config, "architectures", None)
    if loaded.engine is not None:  # llama.cpp holds the weights: it counts them
        return LoadedModelInfo(architecture=(architectures or ["-"])[0], parameters=loaded.engine.parameters,
                               model_bytes=loaded.engine.model_bytes, **facts)
    model = loaded.model
    tensors = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}.values()
    return LoadedModelInfo(architecture=(architectures or [type(model).__name__])[0],
                           parameters=sum(p.numel() for p in model.parameters()),
                           model_bytes=sum(t.numel() * t.element_size() for t in tensors), **facts)


def near_miss_explainer():
    """`zllm cache explain-miss`'s analysis, when the inspect package is installed with this daemon."""
    try:
        from zllm.inspect.explain_miss import explain_near_miss
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("zllm.inspect"):
            raise
        log.debug("zllm.inspect.explain_miss is not available: explain-miss shows raw near-miss records")
        return None
    return explain_near_miss


def open_response_store(settings: Settings):
    """The sqlite store behind `previous_response_id` (state_dir/responses.sqlite3), pruned on open."""
    from zllm.store import ResponseStore

    settings.state_dir.mkdir(parents=True, exist_ok=True)
    return ResponseStore(settings.state_dir / "responses.sqlite3", max_rows=settings.responses_max_stored,
                         max_age_s=settings.responses_max_age_days * 86400)


def run(settings: Settings, progress_factory=None) -> None:
    """`progress_factory()` gives a context-managed `PullProgress`, used only if the model must be pulled.

    The daemon holds its runtime dir (pid file) and its data dir locked for its whole life (control/pidfile.py):
    a second daemon on either fails here, before pulling or loading anything."""
    from zllm.control.client import check_socket_path
    from zllm.control.pidfile import DaemonLocks

    check_exposure(settings)
    check_socket_path(settings.control_socket)
    locks = DaemonLocks.acquire(settings.pid_file, settings.data_dir, settings.control_socket)
    try:
        check_port_free(settings.host, settings.port)
        if progress_factory is None:
            served = resolve_model(settings)
        else:
            with progress_factory() as progress:
                served = resolve_model(settings, progress)
        _run_loop(serve_forever(settings, served))
    finally:
        locks.release()


def _run_loop(main) -> None:
    try:
        import uvloop
    except ImportError:  # uvloop has no Windows build
        asyncio.run(main)
        return
    uvloop.run(main)


def release_freed_heap() -> None:
    """Hand the heap that loading freed back to the OS (glibc keeps freed pages in its arenas, counted as
    resident: the load's parsed JSON, tokenizer clones and GGUF metadata, ~tens of MB); a no-op elsewhere."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        pass
