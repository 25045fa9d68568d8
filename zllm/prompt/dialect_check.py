"""The round-trip check (dialects/round_trip.py) run with one model's tokenizer and template: at load, where the
daemon logs it and `zllm ps` shows it, and offline in `zllm dialect`.

    check = check_renderer(renderer)      # a PromptRenderer: its dialect choice, template and tokenizer
    check.held, check.problem, check.sample, check.text_turn   # text_turn: what forks after a turn of text
    report = describe_dialect(renderer)   # `zllm dialect`'s answer: the above plus how the dialect was found
"""

from __future__ import annotations

from dataclasses import dataclass

from zllm.dialects.round_trip import RoundTrip, check_round_trip
from zllm.prompt.stop_tokens import END_OF_TURN_TOKENS


@dataclass(frozen=True)
class DialectReport:
    dialect: str
    derived: bool  # read from the template (True) or a hand-written family chosen by the registry's rules
    reason: str
    check: RoundTrip
    compared: str  # "tokens", or "text" when there was no tokenizer

    def to_json(self) -> dict:
        return {"dialect": self.dialect, "derived": self.derived, "reason": self.reason,
                "round_trip": self.check.held, "problem": self.check.problem, "sample": self.check.sample,
                "text_turn": self.check.text_turn, "compared": self.compared}


def describe_dialect(renderer, *, tokens: bool = True) -> DialectReport:
    """Which dialect `renderer` speaks, why, and whether its round trip holds (`tokens` False: compared as text,
    for a template given without a tokenizer)."""
    choice = renderer.choice
    reason = choice.reason
    template = getattr(renderer.tokenizer, "chat_template", None)
    if isinstance(template, str) and "tool_calls" not in template:
        reason += (f"; the chat template writes no tool calls (it never reads `tool_calls`): zllm writes them in "
                   f"{choice.name}'s format")
    return DialectReport(choice.name, choice.derived, reason,
                         check_renderer(renderer, tokens=tokens), "tokens" if tokens else "text")


def check_renderer(renderer, *, tokens: bool = True) -> RoundTrip:
    """The round trip of `renderer`'s dialect over its template and tokenizer (prompt ids as `render` builds them:
    special-token text becomes its token; `tokens` False compares the text)."""
    tokenizer = renderer.tokenizer
    specials = getattr(tokenizer, "special_tokens_map", None) or {}
    eos = getattr(tokenizer, "eos_token", None) or specials.get("eos_token")
    ends = tuple(dict.fromkeys((*END_OF_TURN_TOKENS, *([eos] if isinstance(eos, str) and eos else []))))
    encode = (lambda text: tokenizer.encode(text, add_special_tokens=False)) if tokens else list
    try:
        return check_round_trip(renderer.dialect, renderer.chat_template, encode=encode, end_texts=ends)
    except Exception as exc:  # a parser or tokenizer that trips on the probe: said, and the model still loads
        return RoundTrip(False, f"the check could not run: {type(exc).__name__}: {exc}")


def round_trip_line(name: str, check: RoundTrip) -> str:
    """The startup log's / `zllm ps`'s words for a check."""
    text = f"; {check.text_turn}" if check.text_turn else ""
    if check.held:
        return f"tool dialect {name}: round trip holds (render → parse → render gives the same tokens){text}"
    return f"tool dialect {name}: round trip FAILS: {check.problem}{text}"
