"""The model an offline inspection renders for, and the one way inspection code gets its `PromptRenderer`.

`load_renderer(model_dir, dialect)` must build the renderer exactly as the daemon does for that model, or
offline counts and divergences drift from what the daemon reports: the tokenizer as the engine loader loads
it (`AutoTokenizer.from_pretrained`) and the dialect chosen the same way (`PromptRenderer(tokenizer,
dialect_override=settings.dialect)`, as `LocalEngineClient` does).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from zllm.config import Settings, load_settings
from zllm.errors import ConfigError, ModelNotFound


@dataclass(frozen=True)
class InspectedModel:
    name: str
    path: Path
    # the window the daemon would serve it with: the setting when given, else the model's own (None: unknown)
    context_length: int | None


def resolve_model(model: str | None = None, settings: Settings | None = None) -> InspectedModel:
    """The stored model named `model` (default: the one the daemon serves, `settings.model`)."""
    from zllm.models import ModelStore

    settings = settings or load_settings()
    name = model or settings.model
    # no store yet: say so without creating one (opening a store creates its directory)
    store = ModelStore(settings.models_dir) if settings.models_dir.is_dir() else None
    try:
        if store is None:
            raise ModelNotFound(name)
        stored = store.get(name)
    except ModelNotFound as exc:
        others = [n for n in store.names() if n != name] if store else []
        exc.hint = f"pull it first: zllm pull {name}" + (f" (or pick one with --model: {', '.join(others)})"
                                                        if others else "")
        raise
    window = settings.context_length or stored.manifest.context_length
    return InspectedModel(name=stored.name, path=stored.path, context_length=window)


@functools.lru_cache(maxsize=4)
def _renderer_for(model_dir: str, dialect: str | None):
    # imported here: transformers takes seconds to import, and most CLI verbs never need it
    from transformers import AutoTokenizer

    from zllm.prompt import PromptRenderer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the tokenizer in {model_dir}: {exc}",
                          hint="pull the model again: zllm pull --force NAME") from None
    return PromptRenderer(tokenizer, dialect_override=dialect)


def load_renderer(model_dir: str | Path, dialect: str | None = None):
    """The daemon's `PromptRenderer` for the model in `model_dir` (cached per directory); `dialect` as the
    daemon's setting (None / "auto": chosen from the tokenizer)."""
    return _renderer_for(str(model_dir), dialect or load_settings().dialect)
