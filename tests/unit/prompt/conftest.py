"""Fixtures for prompt tests: real tokenizers (Qwen byte-level BPE, SentencePiece-style) from the tiny models."""

import pytest

from tests.support.tiny_models import tiny_llama_tokenizer, tiny_qwen_tokenizer


@pytest.fixture(scope="session")
def qwen_tokenizer():
    return tiny_qwen_tokenizer()


@pytest.fixture(scope="session")
def llama_tokenizer():
    return tiny_llama_tokenizer()
