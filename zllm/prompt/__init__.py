"""Canonical request → prompt token ids. The only place chat templates run."""

from zllm.prompt.renderer import PromptRenderer, RenderedPrompt
from zllm.prompt.stop_tokens import model_stop_token_ids

__all__ = ["PromptRenderer", "RenderedPrompt", "model_stop_token_ids"]
