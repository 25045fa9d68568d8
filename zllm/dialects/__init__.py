"""Model text ⇄ canonical, one package per model family (see base.py for the contract)."""

from zllm.dialects.base import (
    CANONICAL_JSON_GUIDANCE,
    ChatTemplate,
    Conversation,
    Dialect,
    FenceGrammar,
    FenceSpec,
    MarkupTokens,
    StreamParser,
    canonical_arguments,
)

__all__ = ["CANONICAL_JSON_GUIDANCE", "ChatTemplate", "Conversation", "Dialect", "FenceGrammar", "FenceSpec",
           "MarkupTokens", "StreamParser", "canonical_arguments"]
