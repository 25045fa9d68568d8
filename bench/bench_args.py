"""What the benchmarks share: the model options every one takes, where the default model is found, and the
filler text long prompts are made of. Imported by the bench scripts (their folder is on sys.path when run as
`.venv/bin/python bench/NAME.py`), after they put the repository root on sys.path."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from zllm.config import DEFAULT_MODEL, load_settings

# the copy of the default model the end-to-end tests pull (used when the store has none)
E2E_SMOLLM2 = Path.home() / ".cache" / "zllm-tests" / "e2e-data" / "models" / "smollm2"
FILLER = ("The quick brown fox jumps over the lazy dog while the engineer profiles the decode loop. "
          "def step(self):\n    return self.sample(self.forward(token))\n")


def model_parser(description: str, *, dtype: bool = True) -> argparse.ArgumentParser:
    """A parser with MODEL_DIR (optional: see `resolve_model_dir`), --threads (1: steadier on a shared machine),
    --device and, unless `dtype` is False, --dtype."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("model_dir", nargs="?", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto")
    if dtype:
        parser.add_argument("--dtype", default="auto")
    return parser


def resolve_model_dir(args: argparse.Namespace, *, tiny_fallback: bool = False) -> Path:
    """MODEL_DIR if given, else the store's default model, else the e2e tests' copy; else the tiny test model
    (`tiny_fallback`: benches whose figures mean something on random weights) or an error."""
    if args.model_dir is not None:
        return args.model_dir
    store = load_settings().models_dir / DEFAULT_MODEL
    for path in (store, E2E_SMOLLM2):
        if (path / "config.json").is_file():
            return path
    if tiny_fallback:
        from tests.support.tiny_models import tiny_qwen_dir

        return tiny_qwen_dir()
    sys.exit(f"error: no model at {store} or {E2E_SMOLLM2}; pass MODEL_DIR")


def drop_page_cache(directory: Path) -> None:
    """Evict the snapshot files from the OS page cache (they are fsynced, so the pages are clean)."""
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
