"""Composition root: settings → locks → model (pulled if missing) → control socket → engine → HTTP API;
signals; graceful shutdown.

This is the only module that knows every layer. Nothing imports it except the CLI.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path

from zllm import __version__, memory
from zllm.config import Settings, configured_api_keys, split_list
from zllm.errors import ConfigError, EngineFailure, ModelNotFound, PullError
from zllm.install_secrets import FILES as INSTALL_SECRET_FILES
from zllm.install_secrets import load_install_secrets
from zllm.private_files import private_dir, set_private_umask, tighten, tighten_tree

log = logging.getLogger("zllm.daemon")


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
    if not is_loopback(settings.host) and not configured_api_keys(settings):
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
        stored = _refreshed(store, settings.model, progress)
    else:
        log.info("model %s is not in the store; pulling it", settings.model)
        stored = store.pull(settings.model, progress=progress)
    return Served(name=stored.name, path=stored.path, created=int(stored.manifest.added_at))


def _refreshed(store, name: str, progress):
    """The stored model, upgraded first when it is the default as an older zllm stored it (store.refresh):
    the upgrade is offline; should it fail anyway, the old model is served and the log says so."""
    if reason := store.outdated(name):
        log.info("%s", reason)
    try:
        return store.refresh(name, progress=progress)
    except PullError as exc:
        log.warning("%s: could not upgrade it (%s); serving it as it is stored", name, exc.message)
        return store.get(name)


def model_library(settings: Settings):
    """The store as the API layer sees it (the Ollama API's /api/tags and /api/pull)."""
    from zllm.models import ModelStore
    from zllm.models.library import StoreLibrary

    return StoreLibrary(ModelStore(settings.models_dir))


def resolve_draft_model(settings: Settings) -> Settings:
    """Settings whose draft_model (a store name, alias or path) is a model directory, or a .gguf file (the
    llama.cpp backend loads one as it is)."""
    from zllm.models import ModelStore

    if not settings.draft_model:
        return settings
    store = ModelStore(settings.models_dir)
    if store.has(settings.draft_model):
        return replace(settings, draft_model=str(store.get(settings.draft_model).path))
    path = Path(settings.draft_model).expanduser()
    if not path.is_dir() and not (path.is_file() and path.suffix.lower() == ".gguf"):
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
                             request_shutdown=stop.set)
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
    from zllm.engines import open_engine

    settings = resolve_draft_model(settings)
    responses = open_response_store(settings)  # before the weights load: an unusable store file fails fast
    control.attach_responses(responses)
    fingerprints = open_fingerprint_store(settings)
    loop = asyncio.get_running_loop()
    died: list[int] = []  # the status of an engine process that ended on its own
    try:
        secrets = load_install_secrets(settings.state_dir)  # before the weights too: a damaged key fails fast
        opened = await open_engine(settings, served, observer=trace.publish, fingerprints=fingerprints,
                                   on_exit=lambda status: loop.call_soon_threadsafe(_engine_died, stop, died, status),
                                   stop=stop)
        if opened is None:  # stopped while the engine server was loading
            raise _StoppedWhileLoading
    except BaseException as exc:
        control.attach_responses(None)
        responses.close()
        fingerprints.close()
        if isinstance(exc, _StoppedWhileLoading):
            return
        raise
    engine = opened.client
    # hand the heap loading freed back to the OS: glibc keeps freed pages in its arenas, counted as resident
    # (the load's parsed JSON, tokenizer clones and GGUF metadata, ~tens of MB)
    memory.trim()
    try:
        control.attach(engine, opened.info)
        if stop.is_set():  # SIGTERM while the weights were loading
            return
        app = create_app(engine, api_keys=configured_api_keys(settings), namespace_secret=secrets.namespace,
                         allowed_hosts=served_host_names(settings),
                         allowed_origins=split_list(settings.allowed_origins),
                         responses=responses, websocket=settings.responses_websocket,
                         library=model_library(settings), compaction_key=secrets.compaction)
        try:
            runner = await start_site(app, settings.host, settings.port)
        except OSError as exc:  # taken since check_port_free looked
            raise port_in_use(settings.host, settings.port, exc) from None
        log.info("serving %s on http://%s:%d/v1 (%s; tool dialect %s: %s)", served.name, settings.host,
                 settings.port, opened.line, engine.dialect_choice.name, engine.dialect_choice.reason)
        log.info("speculation %s", opened.speculation)
        log_dialect_check(engine)
        try:
            await stop.wait()
            control.phase = "stopping"
            log.info("shutting down")
            if died:
                raise EngineFailure(f"the engine server exited on its own (status {died[0]})",
                                    hint="its last lines are in the log: zllm logs")
        finally:
            await runner.cleanup()  # stops listening, lets handlers finish (api.app's grace), cancels the rest → aborts
    finally:
        control.attach_responses(None)
        responses.close()  # after the app: its last saves have been written
        await opened.close()
        fingerprints.close()  # the engine client's, until it is closed


class _StoppedWhileLoading(Exception):
    """SIGTERM (or a control `shutdown`) came while the engine server was loading."""


def _engine_died(stop: asyncio.Event, died: list[int], status: int) -> None:
    """An engine process that ended on its own (the vLLM server): the daemon cannot serve, so it stops; the
    error and the engine's last lines are in the log (`zllm logs`)."""
    log.error("the engine is gone; stopping the daemon")
    died.append(status)
    stop.set()


def daemon_facts(settings: Settings, served: Served):
    from zllm.control.methods import DaemonFacts

    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return DaemonFacts(version=__version__, pid=os.getpid(), started_at=time.time(), model=served.name,
                       http_url=f"http://{host}:{settings.port}/v1", host=settings.host, port=settings.port,
                       socket=str(settings.control_socket), data_dir=str(settings.data_dir),
                       log_file=str(settings.log_file), max_queue=settings.max_queue)


def log_dialect_check(engine) -> None:
    """The load-time round trip of the tool dialect: a failure is a warning, the model is served all the same."""
    from zllm.prompt.dialect_check import round_trip_line

    line = round_trip_line(engine.dialect_choice.name, engine.dialect_check)
    check = engine.dialect_check
    if check.held and (not check.text_turn or check.text_turn_costs_only_the_answer):
        log.info("%s", line)  # only the last answer is prefilled again (the template leaves its reasoning out, ...)
    elif engine.dialect_check.held:  # the calls hold; answers in text fork the cache (the template rewrites them)
        log.warning("%s; the model is served anyway; `zllm dialect` shows the details", line)
    else:
        log.warning("%s; the model is served anyway (tool calls may still work, the prefix cache forks at the first "
                    "call); `zllm dialect` shows the details", line)


def open_response_store(settings: Settings):
    """The sqlite store behind `previous_response_id` (state_dir/responses.sqlite3), pruned on open."""
    from zllm.store import ResponseStore

    return ResponseStore(settings.state_dir / "responses.sqlite3", max_rows=settings.responses_max_stored,
                         max_age_s=settings.responses_max_age_days * 86400,
                         max_bytes=settings.responses_max_mb * (1 << 20))


def served_host_names(settings: Settings) -> tuple[str, ...]:
    """Host header names the API answers besides localhost and IP literals: the bound address, the configured
    ones, and this machine's name when serving beyond loopback (LAN clients dial it)."""
    names = [settings.host, *split_list(settings.allowed_hosts)]
    if not is_loopback(settings.host):
        names.append(socket.gethostname())
    return tuple(names)


# what the state dir holds about requests and keys (the log and start flags are written by `zllm start`)
PRIVATE_STATE_FILES = ("responses.sqlite3", "responses.sqlite3-wal", "responses.sqlite3-shm", "zllm.log",
                       "zllm.log.1", "start-flags.json", *INSTALL_SECRET_FILES)


def make_private(settings: Settings) -> None:
    """What zllm keeps about requests (the Responses store, KV snapshots and their index, the log, the control
    socket's directory) made 0700 / 0600, narrowing what an older zllm or a loose umask left readable."""
    for directory in (settings.state_dir, settings.runtime_dir):
        private_dir(directory)
    # only zllm's own files: a state dir pointed at a shared place keeps everything else as it was
    for name in PRIVATE_STATE_FILES:
        tighten(settings.state_dir / name)
    tighten_tree(settings.ssd_cache_dir)  # kv/ is zllm's alone


def open_fingerprint_store(settings: Settings):
    """The prompt fingerprints behind cache diagnostics (state_dir/fingerprints.sqlite3), bounded."""
    from zllm.diagnosis.fingerprint_store import FingerprintStore

    settings.state_dir.mkdir(parents=True, exist_ok=True)
    return FingerprintStore(settings.state_dir / "fingerprints.sqlite3")


def run(settings: Settings, progress_factory=None) -> None:
    """`progress_factory()` gives a context-managed `PullProgress`, used only if the model must be pulled.

    The daemon holds its runtime dir (pid file) and its data dir locked for its whole life (control/pidfile.py):
    a second daemon on either fails here, before pulling or loading anything."""
    from zllm.control.client import check_socket_path
    from zllm.control.pidfile import DaemonLocks

    check_exposure(settings)
    check_socket_path(settings.control_socket)
    make_private(settings)
    locks = DaemonLocks.acquire(settings.pid_file, settings.data_dir, settings.control_socket)
    try:
        check_port_free(settings.host, settings.port)
        if progress_factory is None:
            served = resolve_model(settings)
        else:
            with progress_factory() as progress:
                served = resolve_model(settings, progress)
        set_private_umask()  # after the model store (shareable); before anything about requests is written
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
