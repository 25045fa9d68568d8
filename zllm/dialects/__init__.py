"""Model text ⇄ canonical, one package per model family (see base.py for the contract).

Each family package (`hermes/`, `glm/`, `dsml/`, `harmony/`, `derived/`) has the same roles, one file each:
    dialect.py  the Dialect classes the registry names (`hermes`, `qwen3`, `glm45`, `deepseek-v3.2`, ...)
    format.py   the literals and value rules the other three share
    render.py   conversation → prompt text
    parse.py    model output → canonical events (a StreamParser)
    grammar.py  the fence: `fence_grammar(spec, markup)` → one request's llguidance grammar, from the same
                literals the parser scans for (a family with variants takes the variant as a keyword)
derived/ (dialects read from the model's own chat template) also has jinja.py (the template environment) and
probe.py (the probe conversations that find the format, with probe_*.py beside it for its paths); its entry point
is `derived.dialect.derive_dialect`.
hermes/ also has json_cursor.py, the incremental JSON checker its parser reads call bodies with.
Shared by all families: base.py (the contract), registry.py (which dialect a model speaks), scan.py (the tag
scanner the parsers use), string_values.py (string-parameter rules the grammars share), round_trip.py (the
render → parse → render check a dialect passes at load and in `zllm dialect`), template_match.py (whether a
hand-written family writes a call as the model's template does: the registry passes it over where not).
"""

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
