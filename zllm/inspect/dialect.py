"""`zllm dialect`'s analysis, offline: a model's (or a template file's) tool dialect and its round trip.

The tokenizer and template are read with the `tokenizers` library and jinja2 (prompt/tokenizer_files.py): no
torch, no transformers. The check is the one the daemon runs at load (prompt/dialect_check.py).

    report = inspect_dialect(model="smollm2")                         # a stored model, or a model directory
    report = inspect_dialect(template=Path("t.jinja"), tokenizer="smollm2")
    report.to_json()   # {"dialect", "derived", "reason", "round_trip", "problem", "sample", "compared"}
"""

from __future__ import annotations

from pathlib import Path

from zllm.errors import ConfigError
from zllm.prompt.dialect_check import DialectReport, describe_dialect
from zllm.prompt.renderer import PromptRenderer
from zllm.prompt.tokenizer_files import TokenizerFiles


def inspect_dialect(*, model: str | None = None, template: Path | None = None, tokenizer: str | None = None,
                    dialect: str | None = None) -> DialectReport:
    """`model` (its own template) or `template` (with `tokenizer`'s vocabulary, or none: text compared);
    `dialect` as the daemon's setting. Raises `ZllmError`s."""
    source = model or tokenizer
    files = _tokenizer_files(source) if source else _no_tokenizer()
    if template is not None:
        files.chat_template = _read_template(template)
    return describe_dialect(PromptRenderer(files, dialect_override=dialect), tokens=source is not None)


def _tokenizer_files(name: str) -> TokenizerFiles:
    path = Path(name).expanduser()
    if path.is_dir():
        return TokenizerFiles.from_dir(path)
    from zllm.inspect.renderer import resolve_model

    return TokenizerFiles.from_dir(resolve_model(name).path)


def _no_tokenizer() -> TokenizerFiles:
    """A template alone: an empty vocabulary (no added tokens for the registry's rules to read)."""
    from tokenizers import Tokenizer, models

    return TokenizerFiles(Tokenizer(models.BPE()), {}, None)


def _read_template(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the template {path}: {exc}",
                          hint="give a chat template file (.jinja)") from None
