"""Which served model an Ollama model name means: the zllm name, or `NAME:latest` (Ollama's default tag)."""

from __future__ import annotations

from zllm.api.ollama import wire
from zllm.canonical import ModelCard


def served_card(model: str, cards: list[ModelCard]) -> ModelCard | None:
    for card in cards:
        if model in (card.id, card.id + wire.DEFAULT_TAG):
            return card
    return None
