"""`zllm serve`: run the daemon in the foreground (logs to stderr) until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from zllm.cli.output import err, fail_with
from zllm.errors import ZllmError


def _speculation(ctx: typer.Context, value: str | None) -> str | None:
    """--speculative MODE, read as the setting reads it (a bool's spellings too); `--no-speculative` before it
    in the command line already said off."""
    from zllm.config import speculation_mode

    if value is None:
        return ctx.params.get("speculative")
    try:
        return speculation_mode(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r}: auto, on or off") from None


def _no_speculation(ctx: typer.Context, value: bool | None) -> None:
    """`--no-speculative` (the flag's old negative form): `--speculative off`. Its own value stays None, so
    `zllm start` passes no such setting on."""
    if value:
        ctx.params["speculative"] = "off"


def serve(
    model: str = typer.Option(None, "--model", "-m", help="Model to serve (a store name, alias, hub id or path). [env: ZLLM_MODEL; default: smollm2]"),
    host: str = typer.Option(None, help="Address to bind. [env: ZLLM_HOST; default: 127.0.0.1]"),
    port: int = typer.Option(None, "--port", "-p", help="HTTP port. [env: ZLLM_PORT; default: 11435]"),
    threads: int = typer.Option(None, help="CPU threads for the engine, 0 = the backend's default. [env: ZLLM_THREADS]"),
    backend: str = typer.Option(None, "--backend", help="Engine: auto (GGUF on llama.cpp, safetensors on torch), torch, llamacpp, or vllm (a vLLM server: --vllm-python or --vllm-url). [env: ZLLM_BACKEND; default: auto]"),
    vllm_python: str = typer.Option(None, "--vllm-python", help="--backend vllm: the Python of a vLLM environment to start the server from. [env: ZLLM_VLLM_PYTHON]"),
    vllm_url: str = typer.Option(None, "--vllm-url", help="--backend vllm: attach to a running vLLM server (started with --enable-scale-out) instead. [env: ZLLM_VLLM_URL]"),
    vllm_args: str = typer.Option(None, "--vllm-args", help="--backend vllm: more flags for the server zllm starts, e.g. \"--tensor-parallel-size 2\". [env: ZLLM_VLLM_ARGS]"),
    rpc: str = typer.Option(None, "--rpc", help="llama.cpp: put the GGUF's layers on these rpc-servers, HOST:PORT comma-separated (llama-cpp-python built with -DGGML_RPC=ON). [env: ZLLM_RPC]"),
    rpc_backend: str = typer.Option(None, "--rpc-backend", help="--rpc on a llama-cpp-python built without RPC: a libggml-rpc.so that .ci/llama-rpc built for it. [env: ZLLM_RPC_BACKEND]"),
    device: str = typer.Option(None, help="auto, cpu or cuda[:N]. [env: ZLLM_DEVICE]"),
    dtype: str = typer.Option(None, help="auto, float32, bfloat16 or float16. [env: ZLLM_DTYPE]"),
    context_length: int = typer.Option(None, "--context-length", help="Context window in tokens, 0 = the model's. [env: ZLLM_CONTEXT_LENGTH]"),
    api_key: str = typer.Option(None, "--api-key", help="Require this key on every request. [env: ZLLM_API_KEY]"),
    api_keys: str = typer.Option(None, "--api-keys", help="More accepted keys, comma-separated; each gets its own cache and Responses namespace. [env: ZLLM_API_KEYS]"),
    api_keys_file: str = typer.Option(None, "--api-keys-file", help="A file of accepted keys, one a line (# comments). [env: ZLLM_API_KEYS_FILE]"),
    allowed_hosts: str = typer.Option(None, "--allowed-hosts", help="Host names served besides localhost, 127.0.0.1, [::1] and the bound address, comma-separated; others get 403. [env: ZLLM_ALLOWED_HOSTS]"),
    allowed_origins: str = typer.Option(None, "--allowed-origins", help="Browser origins allowed to call the API, comma-separated (* = any); other Origins get 403. [env: ZLLM_ALLOWED_ORIGINS]"),
    max_queue: int = typer.Option(None, "--max-queue", help="Requests waiting for the engine before new ones get 503. [env: ZLLM_MAX_QUEUE]"),
    data_dir: Path = typer.Option(None, "--data-dir", help="Where models are stored. [env: ZLLM_DATA_DIR]"),
    log_level: str = typer.Option(None, "--log-level", help="debug, info, warning. [env: ZLLM_LOG_LEVEL]"),
    responses_websocket: bool = typer.Option(None, "--responses-websocket/--no-responses-websocket", help="Accept Responses WebSocket mode on GET /v1/responses (426 when off). [env: ZLLM_RESPONSES_WEBSOCKET; default: on]"),
    responses_max_stored: int = typer.Option(None, "--responses-max-stored", help="Stored Responses kept for previous_response_id, 0 = no bound. [env: ZLLM_RESPONSES_MAX_STORED; default: 10000]"),
    responses_max_age_days: int = typer.Option(None, "--responses-max-age-days", help="Days a stored Response is kept, 0 = no bound. [env: ZLLM_RESPONSES_MAX_AGE_DAYS; default: 30]"),
    responses_max_mb: int = typer.Option(None, "--responses-max-mb", help="MB the stored Responses may take, oldest evicted, 0 = no bound. [env: ZLLM_RESPONSES_MAX_MB; default: 1024]"),
    cache_budget_mb: int = typer.Option(None, "--cache-budget-mb", help="Prefix cache KV kept resident (RAM on cpu), 0 = a fraction of free memory. [env: ZLLM_CACHE_BUDGET_MB]"),
    cache_rounds: int = typer.Option(None, "--cache-rounds", help="Newest rounds of a conversation kept resident, 0 = no prefix cache. [env: ZLLM_CACHE_ROUNDS; default: 4]"),
    ssd_cache: bool = typer.Option(None, "--ssd-cache/--no-ssd-cache", help="Keep prefix cache snapshots on disk across restarts. [env: ZLLM_SSD_CACHE; default: on]"),
    ssd_cache_mb: int = typer.Option(None, "--ssd-cache-mb", help="Disk for prefix cache snapshots, 0 = min(10 GiB, half the free disk). [env: ZLLM_SSD_CACHE_MB]"),
    cache_ram_mb: int = typer.Option(None, "--cache-ram-mb", help="llama.cpp: host RAM for cached conversations parked out of the KV pool while other requests run (like llama-server's --cache-ram), at most a quarter of RAM, 0 = off. [env: ZLLM_CACHE_RAM_MB; default: 8192]"),
    exact_cache: bool = typer.Option(None, "--exact-cache/--no-exact-cache", help="llama.cpp: a cached prefix answers bit for bit like a cold prefill (Q8_0 KV cells, per-cell flash attention); off = F16 cells, faster long prefill, answers may depend on what else is cached. [env: ZLLM_EXACT_CACHE; default: off]"),
    cache_type: str = typer.Option(None, "--cache-type", help="llama.cpp: KV cells' type, K and V alike (llama.cpp's --cache-type-k/-v): f16, or q8_0 (1.88x the tokens in the same --cache-budget-mb, flash attention on); auto = f16, q8_0 under --exact-cache. [env: ZLLM_CACHE_TYPE; default: auto]"),
    cache_dir: Path = typer.Option(None, "--cache-dir", help="Where prefix cache snapshots live (under kv/). [env: ZLLM_CACHE_DIR]"),
    speculative: str = typer.Option(None, "--speculative", metavar="auto|on|off", callback=_speculation, help="Prompt-lookup speculative decoding (exact: same output, fewer forwards on echo-heavy turns): auto = on where the model verifies drafts exactly at no cost on a turn with nothing to copy (llama.cpp kernels that need no pad row, measured at load: quantized GGUFs), off elsewhere (F16 GGUFs, torch, vLLM); the startup line and `zllm ps` say which. [env: ZLLM_SPECULATIVE; default: auto]"),
    no_speculative: bool = typer.Option(None, "--no-speculative", hidden=True, callback=_no_speculation, help="--speculative off."),
    draft_model: str = typer.Option(None, "--draft-model", help="A small model of the same family drafting for speculative decoding (a store name or path; a .gguf file on llama.cpp; turns --speculative on). [env: ZLLM_DRAFT_MODEL]"),
    max_batch: int = typer.Option(None, "--max-batch", help="Requests decoding or prefilling together; the rest wait. [env: ZLLM_MAX_BATCH; default: 8]"),
    prefill_chunk: int = typer.Option(None, "--prefill-chunk", help="Prompt tokens per step while others decode (smaller: steadier streams; larger: sooner first token for long prompts). [env: ZLLM_PREFILL_CHUNK; default: 512]"),
    dialect: str = typer.Option(None, "--dialect", help="Tool dialect: auto (from the tokenizer), hermes, qwen3, glm45, deepseek-v3.2 or deepseek-v4. [env: ZLLM_DIALECT; default: auto]"),
) -> None:
    """Serve a model over HTTP in the foreground: OpenAI Chat Completions and Responses, Anthropic Messages, Ollama."""
    from zllm import daemon
    from zllm.config import load_settings
    from zllm.models import RichPullProgress

    try:
        settings = load_settings(
            model=model, host=host, port=port, threads=threads, device=device, dtype=dtype,
            context_length=context_length, api_key=api_key, api_keys=api_keys,
            api_keys_file=absolute_path(api_keys_file), allowed_hosts=allowed_hosts, allowed_origins=allowed_origins,
            max_queue=max_queue, data_dir=data_dir, log_level=log_level,
            responses_websocket=responses_websocket, responses_max_stored=responses_max_stored,
            responses_max_age_days=responses_max_age_days, responses_max_mb=responses_max_mb,
            cache_budget_mb=cache_budget_mb, cache_rounds=cache_rounds, ssd_cache=ssd_cache, ssd_cache_mb=ssd_cache_mb,
            cache_ram_mb=cache_ram_mb, cache_dir=cache_dir, exact_cache=exact_cache, cache_type=cache_type, dialect=dialect, speculative=speculative,
            draft_model=draft_model, max_batch=max_batch, prefill_chunk=prefill_chunk, backend=backend,
            vllm_python=str(Path(vllm_python).expanduser().absolute()) if vllm_python else None,  # a venv's python: no resolve()
            vllm_url=vllm_url, vllm_args=vllm_args, rpc=rpc, rpc_backend=absolute_path(rpc_backend),
        )
        logging.basicConfig(
            level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        daemon.run(settings, progress_factory=lambda: RichPullProgress(console=err))
    except ZllmError as exc:
        fail_with(exc)


def absolute_path(path: str | None) -> str | None:
    """A file named on the command line, absolute: `zllm restart` may run from another directory."""
    return str(Path(path).expanduser().resolve()) if path else path


def register(app: typer.Typer) -> None:
    app.command()(serve)
