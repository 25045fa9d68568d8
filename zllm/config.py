"""The one settings table. Each setting has a default, a `ZLLM_*` environment variable, a config-file key
and (for `serve`/`start`) a CLI flag.

Precedence: flag > environment > config file > default. The config file is TOML with one top-level key per
setting, named as in the table below (`-` and `_` both accepted):

    # ~/.config/zllm/config.toml   (or the file $ZLLM_CONFIG names)
    model = "smollm2"
    port = 11435
    cache_budget_mb = 2048
    ssd_cache = true
    data_dir = "~/models/zllm"

`resolve_settings()` also says where each value came from (`zllm config` prints it); `load_settings()` is the
same without the sources.
"""

from __future__ import annotations

import difflib
import os
import tomllib
import warnings
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Literal

import platformdirs

from zllm.errors import ConfigError

SpeculationMode = str  # "auto", "on" or "off" (SPECULATION_MODES); a kind of its own for parsing

APP = "zllm"
DEFAULT_MODEL = "smollm2"
CONFIG_ENV = "ZLLM_CONFIG"
CACHE_TYPES = ("auto", "f16", "q8_0")  # llama.cpp's KV cell types zllm serves (Settings.cache_type)
SPECULATION_MODES = ("auto", "on", "off")  # Settings.speculative (engines.choose_speculation decides auto)


def _default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir(APP))


def _default_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir(APP))


def _default_state_dir() -> Path:
    return Path(platformdirs.user_state_dir(APP))


def _default_runtime_dir() -> Path:
    """platformdirs' runtime dir (/run/user/UID/zllm) exists only inside a login session; containers, cron and
    plain ssh sessions have no /run/user/UID, and there the state dir holds the socket and pid file."""
    with warnings.catch_warnings():  # platformdirs warns (and picks /tmp/runtime-UID) when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        runtime = Path(platformdirs.user_runtime_dir(APP))
    if runtime.parent.is_dir() and os.access(runtime.parent, os.W_OK | os.X_OK):
        return runtime
    return _default_state_dir()


def default_config_path() -> Path:
    return Path(platformdirs.user_config_dir(APP)) / "config.toml"


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 11435
    model: str = DEFAULT_MODEL
    # "auto" = cuda when present, else cpu
    device: str = "auto"
    # "auto" = bfloat16 on cuda, float32 on cpu (bf16 is much slower on AVX2 CPUs: design/PERF.md)
    dtype: str = "auto"
    # torch intra-op threads, or llama.cpp's; 0 = the backend's default
    threads: int = 0
    # engine backend: auto (GGUF → llamacpp, safetensors → torch), torch, llamacpp, or vllm (a vLLM server)
    backend: str = "auto"
    # --backend vllm: the Python of a vLLM environment zllm starts the server from ("" = none)
    vllm_python: str = ""
    # --backend vllm: a running vLLM server (or cluster front) to attach to instead of starting one
    vllm_url: str = ""
    # --backend vllm: more flags for the server zllm starts (e.g. "--tensor-parallel-size 2")
    vllm_args: str = ""
    # llama.cpp RPC: rpc-servers (HOST:PORT, comma-separated) a GGUF's layers are put on; "" = this machine only
    rpc: str = ""
    # llama.cpp RPC on a llama-cpp-python built without it: a libggml-rpc.so .ci/llama-rpc built for this install
    rpc_backend: str = ""
    # tokens; 0 = the model's own max_position_embeddings
    context_length: int = 0
    # required on every request when set (x-api-key or Authorization: Bearer)
    api_key: str = ""
    # more accepted keys, comma-separated; each key gets its own cache and Responses namespace
    api_keys: str = ""
    # a file of accepted keys, one a line (blank lines and `#` comments skipped); "" = none
    api_keys_file: str = ""
    # Host header names served besides localhost, 127.0.0.1, [::1] and the bound address (comma-separated;
    # DNS rebinding: a web page's requests carry the attacker's name)
    allowed_hosts: str = ""
    # browser origins allowed to call the API (comma-separated, e.g. http://localhost:3000; "*" = any);
    # requests without an Origin header (SDKs, CLIs) are always allowed
    allowed_origins: str = ""
    # most requests waiting for the engine before new ones get 503 overloaded
    max_queue: int = 64
    # tool dialect: "auto" (chosen from the tokenizer) or hermes / qwen3 / glm45 / deepseek-v3.2 / deepseek-v4
    dialect: str = "auto"
    # prompt-lookup speculative decoding: drafts from the prompt and output, verified in one forward (exact).
    # auto: on where the loaded model says it is exact and costs nothing on a turn with nothing to copy
    # (engines.choose_speculation); on, off (true/false, yes/no, 1/0 read as on/off: the setting was a bool)
    speculative: SpeculationMode = "auto"
    # a small model of the same family drafting for speculative decoding (a store name or path; implies
    # speculative); "" = prompt lookup only
    draft_model: str = ""
    # continuous batching: most requests decoding or prefilling together (the rest wait in arrival order)
    max_batch: int = 8
    # chunked prefill: prompt tokens per step while other requests decode (smaller: steadier streams for the
    # running requests; larger: sooner first token for the long prompt)
    prefill_chunk: int = 512
    data_dir: Path = field(default_factory=_default_data_dir)
    cache_dir: Path = field(default_factory=_default_cache_dir)
    state_dir: Path = field(default_factory=_default_state_dir)
    # the control socket and the pid file (short-lived files: /run/user/UID when there is one)
    runtime_dir: Path = field(default_factory=_default_runtime_dir)
    log_level: str = "info"
    # OpenAI Responses: accept WebSocket mode on GET /v1/responses (426 when off; Codex then uses POST)
    responses_websocket: bool = True
    # stored responses (previous_response_id chains) kept in state_dir/responses.sqlite3; 0 = no bound
    responses_max_stored: int = 10_000
    responses_max_age_days: int = 30
    # the store's size bound in MB (compressed rows); oldest evicted first; 0 = no bound
    responses_max_mb: int = 1024
    # prefix cache, device tier: MB of KV kept resident (RAM on cpu); 0 = a fraction of device memory / RAM
    cache_budget_mb: int = 0
    # newest rounds of a conversation kept resident; 0 = keep nothing (every request cold)
    cache_rounds: int = 4
    # prefix cache, SSD tier: snapshots in cache_dir/kv that survive restarts
    ssd_cache: bool = True
    # SSD tier size bound in MB; 0 = 10 GiB or half the free disk, whichever is smaller
    ssd_cache_mb: int = 0
    # sequences shorter than this are not written to the SSD tier
    ssd_min_tokens: int = 256
    # llama.cpp: MB of host RAM for cached conversations parked out of the KV pool while other requests run (like
    # llama-server's --cache-ram: a prompt beside kept cells is attended over them); at most a quarter of RAM; 0 = off
    cache_ram_mb: int = 8192
    # llama.cpp: a cached prefix (device tier or SSD) answers bit for bit like a cold prefill, whatever else is in
    # the cache (Q8_0 KV cells read by flash attention's per-cell kernel); off = F16 cells and the tiled kernel,
    # but logits then depend on where a sequence's cells sit in the pool (README). Off by default: it halves
    # long prefill, and on the F16 default model a hit still differs from cold (1-row vs sgemm kernels)
    exact_cache: bool = False
    # llama.cpp: the KV cells' type, for K and V alike (llama.cpp's --cache-type-k/-v): f16, or q8_0 (34 bytes per
    # 32 elements: 1.88x the tokens in the same --cache-budget-mb, read by flash attention's per-cell kernel);
    # "auto" = f16, or q8_0 under exact_cache (which needs Q8_0 cells: f16 with it is refused)
    cache_type: str = "auto"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def ssd_cache_dir(self) -> Path:
        """The SSD tier's snapshots and index: the one place that names the directory (the prefix cache's
        config, the daemon's start-up tightening)."""
        return self.cache_dir / "kv"

    @property
    def control_socket(self) -> Path:
        return self.runtime_dir / "zllm.sock"

    @property
    def pid_file(self) -> Path:
        return self.runtime_dir / "zllm.pid"

    @property
    def log_file(self) -> Path:
        """Where `zllm start` sends a background daemon's log (a foreground `serve` logs to stderr)."""
        return self.state_dir / "zllm.log"

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be 1..65535, not {self.port}")
        if self.threads < 0:
            raise ConfigError("threads must be >= 0")
        if self.backend not in ("auto", "torch", "llamacpp", "vllm"):
            raise ConfigError(f"backend must be auto, torch, llamacpp or vllm, not {self.backend!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"device must be auto, cpu or cuda[:N], not {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, not {self.dtype!r}")
        if self.max_queue < 1:
            raise ConfigError("max_queue must be >= 1")
        if self.max_batch < 1 or self.prefill_chunk < 1:
            raise ConfigError("max_batch and prefill_chunk must be >= 1")
        if self.context_length < 0:
            raise ConfigError("context_length must be >= 0")
        if self.responses_max_stored < 0 or self.responses_max_age_days < 0 or self.responses_max_mb < 0:
            raise ConfigError("responses_max_stored, responses_max_age_days and responses_max_mb must be >= 0 "
                              "(0 = no bound)")
        if self.speculative not in SPECULATION_MODES:
            raise ConfigError(f"speculative must be auto, on or off, not {self.speculative!r}")
        if self.cache_type not in CACHE_TYPES:
            raise ConfigError(f"cache_type must be auto, f16 or q8_0, not {self.cache_type!r}")
        if self.cache_type == "f16" and self.exact_cache:
            raise f16_cannot_be_exact()
        if self.cache_budget_mb < 0 or self.cache_rounds < 0 or self.ssd_cache_mb < 0 or self.ssd_min_tokens < 1 \
                or self.cache_ram_mb < 0:
            raise ConfigError("cache_budget_mb, cache_rounds, ssd_cache_mb and cache_ram_mb must be >= 0, "
                              "ssd_min_tokens >= 1")


def f16_cannot_be_exact() -> ConfigError:
    """--cache-type f16 with --exact-cache: refused rather than either one silently ignored."""
    return ConfigError("--cache-type f16 cannot serve --exact-cache: exact answers need Q8_0 KV cells",
                       hint="drop --cache-type (--exact-cache implies q8_0), or drop --exact-cache")


def split_list(raw: str) -> tuple[str, ...]:
    """A comma-separated setting's items, stripped, empties dropped."""
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def configured_api_keys(settings: Settings) -> tuple[str, ...]:
    """Every key the server accepts: api_key, api_keys, then the lines of api_keys_file (read now)."""
    keys = [settings.api_key.strip()] if settings.api_key.strip() else []
    keys += split_list(settings.api_keys)
    if settings.api_keys_file:
        path = Path(settings.api_keys_file).expanduser()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the API keys file {path}: {getattr(exc, 'strerror', None) or exc}",
                              hint="one key a line; fix --api-keys-file / ZLLM_API_KEYS_FILE") from None
        from_file = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not from_file:  # auth silently off would be the worst reading of an empty file
            raise ConfigError(f"the API keys file {path} holds no key",
                              hint="one key a line, or unset --api-keys-file / ZLLM_API_KEYS_FILE")
        keys += from_file
    return tuple(dict.fromkeys(keys))


def env_name(setting: str) -> str:
    return f"ZLLM_{setting.upper()}"


SETTING_NAMES = tuple(f.name for f in fields(Settings))
_KINDS = {f.name: (f.type if isinstance(f.type, str) else f.type.__name__) for f in fields(Settings)}


_KIND_NAMES = {"SpeculationMode": "mode (auto, on or off)"}


def parse_setting(name: str, raw: str) -> object:
    """A setting's typed value from its text form (as in a `ZLLM_*` variable)."""
    return _coerce(name, raw, _KINDS[name])


def _coerce(name: str, raw: str, kind: str) -> object:
    try:
        return _parse_text(raw, kind)
    except ValueError:
        raise ConfigError(f"{env_name(name)}={raw!r} is not a valid {_KIND_NAMES.get(kind, kind)}") from None


def _parse_text(raw: str, kind: str) -> object:
    if kind == "int":
        return int(raw)
    if kind == "bool":
        return _parse_bool(raw)
    if kind == "Path":
        return Path(raw).expanduser()
    if kind == "SpeculationMode":
        return speculation_mode(raw)
    return raw


def speculation_mode(raw: str | bool) -> str:
    """auto / on / off from a flag, a variable or the config file; a bool's spellings (the setting was one) are
    on and off."""
    if isinstance(raw, bool):
        return "on" if raw else "off"
    value = raw.strip().lower()
    if value in SPECULATION_MODES:
        return value
    return "on" if _parse_bool(value) else "off"


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ValueError(raw)


# ---------------------------------------------------------------------- config file


def config_path(env: dict[str, str] | None = None) -> tuple[Path, bool]:
    """The config file to read and whether it was named explicitly ($ZLLM_CONFIG must exist; the default
    location may be absent)."""
    env = os.environ if env is None else env
    named = env.get(CONFIG_ENV)
    if named:
        return Path(named).expanduser(), True
    return default_config_path(), False


def read_config_file(path: Path) -> dict[str, object]:
    """Setting name → typed value. Unknown keys are errors: a typo must not be silently ignored."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}",
                          hint="fix the file, or point ZLLM_CONFIG elsewhere") from None
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror}",
                          hint=f"create it, or unset {CONFIG_ENV}") from None
    values: dict[str, object] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in _KINDS:
            close = difflib.get_close_matches(name, SETTING_NAMES, n=1)
            hint = f"did you mean `{close[0]}`?" if close else f"known settings: {', '.join(SETTING_NAMES)}"
            raise ConfigError(f"{path}: unknown setting `{key}`", hint=hint)
        values[name] = _config_value(path, name, value)
    return values


def _config_value(path: Path, name: str, value: object) -> object:
    kind = _KINDS[name]
    if isinstance(value, str) and kind != "str":
        try:
            return _parse_text(value, kind)
        except ValueError:
            pass
    elif kind in ("bool", "SpeculationMode") and isinstance(value, bool):
        return speculation_mode(value) if kind == "SpeculationMode" else value
    elif kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif kind == "str" and isinstance(value, str):
        return value
    raise ConfigError(f"{path}: `{name}` must be a {_KIND_NAMES.get(kind, kind)}, not {value!r}")


# ---------------------------------------------------------------------- resolution

SourceKind = Literal["flag", "env", "config", "default"]


@dataclass(frozen=True)
class Source:
    """Where one effective value came from: the flag, the variable name or the config file's path."""

    kind: SourceKind
    origin: str = ""

    def __str__(self) -> str:
        return f"{self.kind} ({self.origin})" if self.origin else self.kind


@dataclass(frozen=True)
class ResolvedSettings:
    settings: Settings
    sources: dict[str, Source]
    config_file: Path
    config_found: bool


def resolve_settings(env: dict[str, str] | None = None, **overrides: object) -> ResolvedSettings:
    """Settings from defaults < config file < environment < `overrides` (flags; `None` means "not given")."""
    env = os.environ if env is None else env
    path, named = config_path(env)
    found = path.is_file()
    if named and not found:
        raise ConfigError(f"the config file {path} does not exist", hint=f"create it, or unset {CONFIG_ENV}")
    values: dict[str, object] = {}
    sources: dict[str, Source] = {name: Source("default") for name in SETTING_NAMES}
    if found:
        for name, value in read_config_file(path).items():
            values[name], sources[name] = value, Source("config", str(path))
    for name in SETTING_NAMES:
        raw = env.get(env_name(name))
        if raw is not None and raw != "":
            values[name], sources[name] = _coerce(name, raw, _KINDS[name]), Source("env", env_name(name))
    for name, value in overrides.items():
        if value is not None:
            values[name], sources[name] = value, Source("flag", "--" + name.replace("_", "-"))
    return ResolvedSettings(replace(Settings(), **values), sources, path, found)


def load_settings(env: dict[str, str] | None = None, **overrides: object) -> Settings:
    """Settings from the config file, the environment, then `overrides` (flags; `None` means "not given")."""
    return resolve_settings(env, **overrides).settings
