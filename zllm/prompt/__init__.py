"""Canonical request → prompt token ids. The only place chat templates run."""

from zllm.prompt.renderer import PromptRenderer, RenderedPrompt
from zllm.prompt.segments import describe_position, position_describer
from zllm.prompt.stop_tokens import model_stop_token_ids

__all__ = ["PromptRenderer", "RenderedPrompt", "describe_position", "model_stop_token_ids", "position_describer"]
