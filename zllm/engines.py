"""Which engine client the daemon serves, built from the settings: the one place that wires settings to engines.

    opened = await open_engine(settings, served, observer=trace.publish, fingerprints=store, on_exit=stop_daemon)
    opened.client                # an EngineClient (the API layer) that is also a ServedEngine (the control layer)
    opened.info                  # `zllm ps`'s facts (LoadedModelInfo)
    opened.line                  # "backend llamacpp: GGUF weights run on llama.cpp as they are" (the startup log)
    opened.speculation           # "on (auto): Q4_1 weights: ..." (the startup log, `zllm ps`)
    await opened.close()

Two kinds sit side by side behind those two declared interfaces (canonical/client.py, control/served.py):
- local (runtime/client.py's LocalEngineClient): a step-level engine in this process (torch or llama.cpp,
  engine/select.py) under zllm's own scheduler, sampler and prefix cache;
- vllm (engine/vllm/): a vLLM server that schedules, samples and caches itself; zllm renders, tokenizes,
  detokenizes and parses around it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from zllm.config import Settings, split_list
from zllm.errors import ConfigError


MEASURES_FILE = "llamacpp-measures.json"  # llama.cpp's load-time measures, kept across loads (load_measures.py)


@dataclass
class OpenedEngine:
    client: object  # EngineClient + ServedEngine
    info: object  # control.protocol.LoadedModelInfo
    line: str
    close: Callable[[], Awaitable[None]]
    speculation: str = "off"


@dataclass(frozen=True)
class Speculation:
    """Whether the served model speculates, and why (`choose_speculation`)."""

    on: bool
    why: str

    def __str__(self) -> str:
        return f"{'on' if self.on else 'off'} ({self.why})"


def speculation_load(settings: Settings) -> dict[str, bool]:
    """How a local engine loads for the speculation setting: `uniform_rows` (llama.cpp measures at load whether a
    verify's rows give 1-token decoding's bits) and `pad_allowed` (where they do not, `on` pads every lone step,
    `auto` drops uniform rows: backend.ContextSettings)."""
    mode = "on" if settings.draft_model else settings.speculative
    return {"uniform_rows": mode != "off", "pad_allowed": mode == "on"}


def choose_speculation(settings: Settings, loaded) -> Speculation:
    """The one place `--speculative auto|on|off` is decided. auto: on where the loaded model says prompt-lookup
    speculation is exact and costs nothing on a turn with nothing to copy (LoadedModel.free_speculation: on
    llama.cpp, kernels that agree without a pad row, measured at load), else off."""
    if settings.draft_model:
        return Speculation(True, f"--draft-model {settings.draft_model}")
    if settings.speculative == "off":
        return Speculation(False, "--speculative off")
    free, why = loaded.free_speculation()
    if settings.speculative == "on":
        return Speculation(True, "--speculative on" + ("" if free else f"; {why}"))
    force = "off" if free else "on"
    return Speculation(free, f"auto: {why}; --speculative {force} forces it {force}")


async def open_engine(settings: Settings, served, *, observer=None, fingerprints=None,
                      on_exit: Callable[[int], None] | None = None,
                      stop: asyncio.Event | None = None) -> OpenedEngine | None:
    """`served`: daemon.Served (name, path, created). `on_exit(status)`: an engine process that ended on its own
    (vLLM), called from a thread. None: `stop` was set while a vLLM server was still loading (it is stopped)."""
    if settings.backend == "vllm":
        return await _open_vllm(settings, served, observer=observer, fingerprints=fingerprints, on_exit=on_exit,
                                stop=stop or asyncio.Event())
    client = await asyncio.get_running_loop().run_in_executor(None, lambda: local_client(
        served.path, settings, name=served.name, created=served.created, observer=observer,
        fingerprints=fingerprints))
    loaded = client.loaded

    async def close() -> None:
        client.close()

    kv = f"; {loaded.kv_cache_type} KV cells" if loaded.kv_cache_type else ""
    speculation = str(choose_speculation(settings, loaded))  # as local_client chose it (a pure function)
    return OpenedEngine(client, _local_info(client, served, speculation),
                        f"backend {loaded.backend}: {loaded.backend_reason}{kv}", close, speculation)


def local_client(model_dir: str | Path, settings: Settings, *, name: str | None = None, created: int | None = None,
                 observer=None, fingerprints=None):
    """Load `model_dir` with the settings' device/dtype/threads/context_length/max_queue and serve it in-process.

    `name` (the model id clients must send) defaults to `settings.model`; `created` to the dir's mtime;
    `settings.draft_model`, when set, is a model directory (the daemon resolves store names)."""
    from zllm.engine.select import load_for_backend
    from zllm.runtime.client import LocalEngineClient
    from zllm.runtime.prefix import cache_config_from_settings, served_model_key
    from zllm.runtime.scheduler import SchedulerConfig

    model_dir = Path(model_dir)
    loaded = load_for_backend(model_dir, backend=settings.backend, device=settings.device, dtype=settings.dtype,
                              threads=settings.threads, context_length=settings.context_length,
                              cache_budget_mb=settings.cache_budget_mb, max_batch=settings.max_batch,
                              exact_cache=settings.exact_cache, cache_type=settings.cache_type,
                              **speculation_load(settings), rpc_servers=split_list(settings.rpc),
                              rpc_backend=settings.rpc_backend, measures_file=settings.state_dir / MEASURES_FILE)
    draft = (loaded.load_draft_model(Path(settings.draft_model), dtype=settings.dtype, threads=settings.threads)
             if settings.draft_model else None)
    return LocalEngineClient(
        loaded,
        model_name=name or settings.model,
        created=created if created is not None else int(model_dir.stat().st_mtime),
        max_queue=settings.max_queue,
        cache_config=cache_config_from_settings(settings, loaded, served_model_key(loaded)),
        prefix_cache=settings.cache_rounds > 0,
        observer=observer,
        dialect=settings.dialect,
        speculative=choose_speculation(settings, loaded).on,
        # one chunk size alone too: a request arriving during a long prefill waits for at most one chunk's
        # forward, and the long prompt's own prefill is no slower in smaller chunks (bench/batching.py)
        scheduler=SchedulerConfig(max_batch=settings.max_batch, prefill_chunk=settings.prefill_chunk,
                                  idle_prefill_chunk=settings.prefill_chunk),
        draft_model=draft,
        owns_engine=True,
        fingerprints=fingerprints,
    )


def _local_info(client, served, speculation: str):
    from zllm.control.protocol import LoadedModelInfo

    loaded = client.loaded
    weights = loaded.weights()
    return LoadedModelInfo(name=served.name, path=str(served.path), device=str(loaded.device),
                           dtype=loaded.quantization, context_length=loaded.context_length, loaded_at=time.time(),
                           backend=loaded.backend, backend_reason=loaded.backend_reason,
                           quantization=loaded.quantization, dialect_round_trip=client.dialect_check.held,
                           dialect_problem=client.dialect_check.problem,
                           dialect_text_turn=client.dialect_check.text_turn, architecture=weights.architecture,
                           parameters=weights.parameters, model_bytes=weights.model_bytes,
                           kv_cache_type=loaded.kv_cache_type, speculation=speculation)


async def _open_vllm(settings: Settings, served, *, observer, fingerprints, on_exit,
                     stop: asyncio.Event) -> OpenedEngine | None:
    from zllm.engine.vllm.client import VllmEngineClient
    from zllm.engine.vllm.server import VllmServer, check_tokenizer, served_model
    from zllm.prompt.tokenizer_files import read_model_json

    model_dir = Path(served.path)
    config = read_model_json(model_dir / "config.json")
    if settings.draft_model or settings.speculative == "on":  # auto: off here, silently
        raise ConfigError("--speculative and --draft-model drive zllm's own engines, not vLLM",
                          hint='pass vLLM\'s own, e.g. --vllm-args \'--speculative-config {"method": "ngram", '
                               '"num_speculative_tokens": 4, "prompt_lookup_max": 4}\'')
    if settings.cache_type != "auto":
        raise ConfigError(f"--cache-type {settings.cache_type} sets llama.cpp's KV cells, not vLLM's",
                          hint="pass vLLM's own, e.g. --vllm-args '--kv-cache-dtype fp8'")
    if settings.rpc:
        raise ConfigError("--rpc puts a GGUF's layers on llama.cpp rpc-servers, not vLLM's",
                          hint="vLLM spreads a model with its own --tensor-parallel-size / --pipeline-parallel-size "
                               "(--vllm-args)")
    if settings.vllm_url:
        server = VllmServer.attach(settings.vllm_url)
        reason = f"attached to the vLLM server at {server.url} (--vllm-url)"
    else:
        if not any(model_dir.glob("*.safetensors")):
            raise ConfigError(f"{served.name} has no safetensors weights: vLLM serves safetensors models",
                              hint="pull the model's safetensors repository (vLLM cannot read GGUF on CPU)")
        window = settings.context_length or int((config.get("text_config") or config).get("max_position_embeddings"))
        server = VllmServer.start(settings.vllm_python, model_dir, served_name=served.name, context_length=window,
                                  threads=settings.threads, kv_cache_gib=max(0, settings.cache_budget_mb // 1024),
                                  extra_args=settings.vllm_args, on_exit=on_exit)
        reason = f"a vLLM server zllm started at {server.url} ({server.python})"
    try:
        if not await _ready_unless_stopped(server, stop):
            server.stop()
            return None
        name, window = await served_model(server.url)
        client = VllmEngineClient.open(model_dir, server.url, served_model=name, name=served.name,
                                       created=served.created, context_length=window, dialect=settings.dialect,
                                       max_queue=settings.max_queue, fingerprints=fingerprints, observer=observer,
                                       layout=server.layout, cache_config=_vllm_index_config(settings))
        await check_tokenizer(server.url, name, lambda text: client.renderer.tokenizer.encode(
            text, add_special_tokens=False))
    except BaseException:
        server.stop()
        raise

    async def close() -> None:
        await client.aclose()
        await asyncio.get_running_loop().run_in_executor(None, server.stop)

    from zllm.control.protocol import LoadedModelInfo

    info = LoadedModelInfo(name=served.name, path=str(model_dir), device=server.url, context_length=window,
                           loaded_at=time.time(), backend="vllm", backend_reason=f"{reason}; {server.layout}",
                           architecture=",".join(config.get("architectures") or ()),
                           dtype=str(config.get("torch_dtype") or config.get("dtype") or ""),
                           dialect_round_trip=client.dialect_check.held, dialect_problem=client.dialect_check.problem,
                           dialect_text_turn=client.dialect_check.text_turn, speculation="off (vLLM: its own "
                           "--speculative-config in --vllm-args)")
    return OpenedEngine(client, info, f"backend vllm: {reason}; {server.layout}", close, info.speculation)


def _vllm_index_config(settings: Settings):
    """zllm's index of what it sent vLLM (engine/vllm/kv.py), bounded by the KV budget vLLM was given (its default,
    4 GiB, when none was)."""
    from zllm.kvcache import CacheConfig

    return CacheConfig(device_budget_bytes=(settings.cache_budget_mb or 4096) << 20, rounds=settings.cache_rounds)


async def _ready_unless_stopped(server, stop: asyncio.Event) -> bool:
    """Wait for the server, or for the daemon's stop (SIGTERM while vLLM loads takes a second, not its load)."""
    ready = asyncio.ensure_future(server.ready())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if ready.done():
        ready.result()  # a server that died while loading raises here
        return True
    ready.cancel()
    return False
