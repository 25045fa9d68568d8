"""The one settings table. Each setting has a default, a `ZLLM_*` environment variable and a CLI flag.

Precedence: flag > environment > default (a config file joins between env and default with the CLI issue).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import platformdirs

from zllm.errors import ConfigError

APP = "zllm"
DEFAULT_MODEL = "smollm2"


def _default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir(APP))


def _default_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir(APP))


def _default_state_dir() -> Path:
    return Path(platformdirs.user_state_dir(APP))


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 11435
    model: str = DEFAULT_MODEL
    # "auto" = cuda when present, else cpu
    device: str = "auto"
    # "auto" = bfloat16 on cuda, float32 on cpu (bf16 is ~5x slower on AVX2 CPUs)
    dtype: str = "auto"
    # torch intra-op threads; 0 = torch's default
    threads: int = 0
    # tokens; 0 = the model's own max_position_embeddings
    context_length: int = 0
    # required on every request when set (x-api-key or Authorization: Bearer)
    api_key: str = ""
    # most requests waiting for the engine before new ones get 503 overloaded
    max_queue: int = 64
    data_dir: Path = field(default_factory=_default_data_dir)
    cache_dir: Path = field(default_factory=_default_cache_dir)
    state_dir: Path = field(default_factory=_default_state_dir)
    log_level: str = "info"
    # OpenAI Responses: accept WebSocket mode on GET /v1/responses (426 when off; Codex then uses POST)
    responses_websocket: bool = True
    # stored responses (previous_response_id chains) kept in state_dir/responses.sqlite3; 0 = no bound
    responses_max_stored: int = 10_000
    responses_max_age_days: int = 30
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

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be 1..65535, not {self.port}")
        if self.threads < 0:
            raise ConfigError("threads must be >= 0")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"device must be auto, cpu or cuda[:N], not {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, not {self.dtype!r}")
        if self.max_queue < 1:
            raise ConfigError("max_queue must be >= 1")
        if self.context_length < 0:
            raise ConfigError("context_length must be >= 0")
        if self.responses_max_stored < 0 or self.responses_max_age_days < 0:
            raise ConfigError("responses_max_stored and responses_max_age_days must be >= 0 (0 = no bound)")
        if self.cache_budget_mb < 0 or self.cache_rounds < 0 or self.ssd_cache_mb < 0 or self.ssd_min_tokens < 1:
            raise ConfigError("cache_budget_mb, cache_rounds and ssd_cache_mb must be >= 0, ssd_min_tokens >= 1")


def env_name(setting: str) -> str:
    return f"ZLLM_{setting.upper()}"


def _coerce(name: str, raw: str, kind: type | str) -> object:
    kind_name = kind if isinstance(kind, str) else kind.__name__
    try:
        if kind_name == "int":
            return int(raw)
        if kind_name == "bool":
            return _parse_bool(raw)
        if kind_name == "Path":
            return Path(raw).expanduser()
        return raw
    except ValueError:
        raise ConfigError(f"{env_name(name)}={raw!r} is not a valid {kind_name}") from None


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ValueError(raw)


def load_settings(env: dict[str, str] | None = None, **overrides: object) -> Settings:
    """Settings from the environment, then `overrides` (flags; `None` means "not given")."""
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    for f in fields(Settings):
        raw = env.get(env_name(f.name))
        if raw is not None and raw != "":
            values[f.name] = _coerce(f.name, raw, f.type)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return replace(Settings(), **values)
