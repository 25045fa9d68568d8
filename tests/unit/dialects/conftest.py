"""Fixtures shared by the dialect suites: real tokenizers and their llguidance views, loaded once per session."""

import pytest


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The real Qwen2.5/Qwen3 vocabulary: `<tool_call>`, `<think>` ... are single added tokens."""
    from tests.support.tiny_models import tiny_qwen_tokenizer

    return tiny_qwen_tokenizer()


@pytest.fixture(scope="session")
def llama_tokenizer():
    """A SentencePiece-style vocabulary without tool tokens: `<tool_call>` is several ordinary tokens."""
    from tests.support.tiny_models import tiny_llama_tokenizer

    return tiny_llama_tokenizer()


@pytest.fixture(scope="session")
def qwen_ll_tokenizer(qwen_tokenizer):
    """llguidance's view of the Qwen vocabulary (~1-4 s to build)."""
    import llguidance.hf

    return llguidance.hf.from_tokenizer(qwen_tokenizer)


@pytest.fixture(scope="session")
def llama_ll_tokenizer(llama_tokenizer):
    import llguidance.hf

    return llguidance.hf.from_tokenizer(llama_tokenizer)
