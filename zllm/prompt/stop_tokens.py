"""Which token ids end the assistant's turn for a model: its EOS ids plus the template's end-of-turn marker.

Sources, all unioned: `generation_config.eos_token_id` (int or list; Qwen ships `[<|im_end|>, <|endoftext|>]`),
`config.eos_token_id`, the tokenizer's `eos_token_id`, and any well-known end-of-turn token that the chat
template itself writes (a ChatML template closes every turn with `<|im_end|>`, even when a base model's
eos is `<|endoftext|>`).
"""

from __future__ import annotations

from collections.abc import Iterable

# end-of-turn markers of common chat templates
END_OF_TURN_TOKENS = (
    "<|im_end|>",        # ChatML: Qwen, SmolLM2, ...
    "<|eot_id|>",        # Llama 3
    "<|eom_id|>",        # Llama 3 tool turn
    "<|end|>",           # Phi-3
    "<end_of_turn>",     # Gemma
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",  # DeepSeek
)


def model_stop_token_ids(tokenizer, *eos_sources: int | Iterable[int] | None) -> frozenset[int]:
    """Union of the eos ids given (from generation_config / config), the tokenizer's, and end-of-turn tokens."""
    ids: set[int] = set()
    for source in (*eos_sources, getattr(tokenizer, "eos_token_id", None)):
        ids.update(_as_ids(source))
    template = getattr(tokenizer, "chat_template", None) or ""
    template = template if isinstance(template, str) else " ".join(template.values())
    for text in END_OF_TURN_TOKENS:
        if text in template:
            token_id = _single_token_id(tokenizer, text)
            if token_id is not None:
                ids.add(token_id)
    return frozenset(ids)


def _as_ids(source: int | Iterable[int] | None) -> list[int]:
    if source is None:
        return []
    if isinstance(source, int):
        return [source]
    return [int(i) for i in source]


def _single_token_id(tokenizer, text: str) -> int | None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def single_token_ids(tokenizer, texts: Iterable[str]) -> frozenset[int]:
    """Ids of the `texts` that are one token in this tokenizer (a dialect's end-of-turn markers)."""
    return frozenset(i for i in (_single_token_id(tokenizer, text) for text in texts) if i is not None)


def control_token_ids(tokenizer, markup: Iterable[str]) -> frozenset[int]:
    """Special tokens that are never output text (`<|im_start|>` from a confused model), except the
    dialect's own markup (`<think>`, DeepSeek V4's `｜DSML｜`) which its parser must see."""
    keep = single_token_ids(tokenizer, markup)
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    special = {token_id for token_id, token in added.items() if getattr(token, "special", False)}
    special.update(getattr(tokenizer, "all_special_ids", None) or ())
    return frozenset(special - keep)
