"""Which dialect a model speaks, and why: decided from its tokenizer and chat template, overridable by config.

    choice = choose_dialect(TokenizerFacts(added_tokens=..., chat_template=...), override=settings.dialect)
    choice.dialect.name, choice.reason   # "deepseek-v4", "the tokenizer has `｜DSML｜` as one added token"

Rules, first match wins (the facts are what distinguishes the families' vocabularies, not model names):
1. an explicit override (`--dialect` / `ZLLM_DIALECT` / config `dialect`), unless it is "auto";
2. `｜DSML｜` is one added token → DeepSeek V4 DSML;
3. DeepSeek's `<｜Assistant｜>` added token → DeepSeek V3.2 DSML (markup spelled with ordinary tokens);
   — unless the template itself writes `<｜tool▁calls▁begin｜>` calls (DeepSeek V3.1): then rule 5 derives it;
4. GLM's `<arg_key>` added token → GLM-4.5 XML;
5. the template writes tool calls other than Hermes JSON, or Hermes JSON but cannot render without its tools
   (Hermes-2-Pro / 3) or opens the reasoning block in its generation prompt (Reka Edge) → a dialect derived from
   it (dialects/derived/: the template's own calls, found by
   rendering probe conversations);
6. a `<think>` added token and a template that reasons (`enable_thinking` / `<think>`) → Qwen3 Hermes;
7. otherwise Hermes JSON over the model's template (ChatML models whose template ignores tools included).
A hand-written family that writes its own framing (rules 1-4) is passed over where the template writes a call
otherwise (template_match.py: GLM-4.7's compact XML, DeepSeek V3.2's `function_calls` under a V4 vocabulary, R1's
`<｜tool▁calls▁begin｜>`): the next rule, the derived dialect, or Hermes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from zllm.dialects.base import Dialect
from zllm.dialects.template_match import writes_as_template
from zllm.errors import ConfigError

AUTO = "auto"

# name → "module:Class", imported on first use (each dialect module is independent)
_DIALECTS: dict[str, str] = {
    "hermes": "zllm.dialects.hermes.dialect:HermesJson",
    "qwen3": "zllm.dialects.hermes.dialect:Qwen3Hermes",
    "glm45": "zllm.dialects.glm.dialect:Glm45Xml",
    "deepseek-v3.2": "zllm.dialects.dsml.dialect:DeepSeekV32Dsml",
    "deepseek-v4": "zllm.dialects.dsml.dialect:DeepSeekV4Dsml",
    "harmony": "zllm.dialects.harmony.dialect:Harmony",
}
NAMES: tuple[str, ...] = tuple(_DIALECTS)


@dataclass(frozen=True)
class TokenizerFacts:
    """What the registry needs to know about a tokenizer (computed by prompt/, which may import tokenizers)."""

    added_tokens: frozenset[str]
    chat_template: str | None
    # the template's `bos_token` / `eos_token` variables (a derived dialect renders the template itself)
    bos_token: str = ""
    eos_token: str = ""


@dataclass(frozen=True)
class DialectChoice:
    dialect: Dialect
    reason: str
    derived: bool = False  # read from the model's chat template (dialects/derived/), not a hand-written family

    @property
    def name(self) -> str:
        return self.dialect.name


def dialect_named(name: str) -> Dialect:
    target = _DIALECTS.get(name)
    if target is None:
        raise ConfigError(f"unknown dialect {name!r}", hint=f"choose one of: {AUTO}, {', '.join(NAMES)}")
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)()


_Rule = tuple[str, Callable[[TokenizerFacts], bool], str]
_RULES: tuple[_Rule, ...] = (
    # gpt-oss's o200k_harmony: no other vocabulary has both tokens (checked first: it decides alone)
    ("harmony", lambda f: {"<|channel|>", "<|call|>"} <= f.added_tokens,
     "the tokenizer has harmony's `<|channel|>` and `<|call|>` tokens (gpt-oss, o200k_harmony)"),
    ("deepseek-v4", lambda f: "｜DSML｜" in f.added_tokens, "the tokenizer has `｜DSML｜` as one added token"),
    ("deepseek-v3.2", lambda f: "<｜Assistant｜>" in f.added_tokens,
     "DeepSeek V3 vocabulary (`<｜Assistant｜>`); DSML markup spelled with ordinary tokens"),
    ("glm45", lambda f: "<arg_key>" in f.added_tokens, "the tokenizer has GLM's `<arg_key>` tag"),
    ("qwen3", lambda f: "<think>" in f.added_tokens and _template_reasons(f.chat_template),
     "a `<think>` token and a chat template that reasons"),
)


def choose_dialect(facts: TokenizerFacts, override: str | None = None) -> DialectChoice:
    if override and override != AUTO:
        return DialectChoice(dialect_named(override), f"set by configuration (dialect = {override})")
    derived = _derived(facts)
    passed_over = []  # families whose token the vocabulary has but whose calls the template writes otherwise
    for name, matches, reason in _RULES:
        if name == "qwen3" and derived is not None:
            return derived
        if matches(facts):
            if name == "deepseek-v3.2" and derived is not None:
                return derived  # DeepSeek V3.1: the V3 vocabulary, but its template writes no DSML
            dialect = dialect_named(name)
            if writes_as_template(dialect, facts.chat_template, bos_token=facts.bos_token,
                                  eos_token=facts.eos_token) is False:
                passed_over.append(name)
                continue
            return DialectChoice(dialect, reason)
    note = (f" ({', '.join(passed_over)} passed over: the chat template writes calls otherwise)" if passed_over
            else "")
    if derived is not None:
        return DialectChoice(derived.dialect, derived.reason + note, derived=True)
    why = "the chat template renders tools itself" if _template_mentions_tools(facts.chat_template) else (
        "the chat template ignores tools")
    return DialectChoice(dialect_named("hermes"), f"default: Hermes JSON tool calls ({why}){note}")


def _derived(facts: TokenizerFacts) -> DialectChoice | None:
    """A dialect derived from the chat template, where the template writes calls other than Hermes JSON."""
    if not facts.chat_template:
        return None
    from zllm.dialects.derived.dialect import derive_dialect

    result = derive_dialect(facts.chat_template, added_tokens=facts.added_tokens, bos_token=facts.bos_token,
                            eos_token=facts.eos_token)
    if result.dialect is None:
        return None
    if result.dialect.format.hermes_json:
        if _opens_reasoning(result.dialect):
            return DialectChoice(result.dialect, result.reason + "; its generation prompt opens the reasoning block "
                                 "(the hand-written Qwen3 dialect writes reasoning into the turn itself)", derived=True)
        if _renders_without_tools(result.dialect.template):
            return None  # the hand-written Hermes dialect speaks it (it renders the messages, tools aside)
        return DialectChoice(result.dialect, result.reason + "; the template needs its tools to render (Hermes-2-Pro"
                             "'s `for tool in tools`), so it renders them itself", derived=True)
    return DialectChoice(result.dialect, result.reason, derived=True)


def _opens_reasoning(dialect) -> bool:
    """Whether the template's generation prompt opens the reasoning block under one of its settings (Reka Edge's
    `assistant: <think>\n` with `enable_thinking`): the model starts inside it, and the template writes a turn's
    reasoning only under that switch, which the hand-written Qwen3 dialect neither sets nor reads."""
    return any(fmt.gen_in_think for fmt in (dialect.format, *dialect.switched.values()))


def _renders_without_tools(template) -> bool:
    """Whether the template renders a conversation given no tools: the hand-written Hermes dialect renders the
    messages alone and writes the tools block itself."""
    try:
        template([{"role": "user", "content": "hi"}], tools=None, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - jinja's errors, raise_exception(...): the template insists on tools
        return False
    return True


def _template_reasons(template: str | None) -> bool:
    return bool(template) and ("enable_thinking" in template or "<think>" in template)


def _template_mentions_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template
