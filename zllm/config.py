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


def env_name(setting: str) -> str:
    return f"ZLLM_{setting.upper()}"


def _coerce(name: str, raw: str, kind: type | str) -> object:
    kind_name = kind if isinstance(kind, str) else kind.__name__
    try:
        if kind_name == "int":
            return int(raw)
        if kind_name == "Path":
            return Path(raw).expanduser()
        return raw
    except ValueError:
        raise ConfigError(f"{env_name(name)}={raw!r} is not a valid {kind_name}") from None


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
