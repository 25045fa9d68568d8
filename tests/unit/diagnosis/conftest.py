"""Fixtures for diagnosis tests: real tokenizers (tests/unit/prompt) and the daemon's renderer for the tiny Qwen
model in a linked store (tests/unit/inspect), the same fixtures those packages' tests use."""

from tests.unit.inspect.conftest import renderer, tiny_data_dir, tiny_env  # noqa: F401 (fixtures)
from tests.unit.prompt.conftest import llama_tokenizer, qwen_tokenizer  # noqa: F401 (fixtures)
