"""The llguidance fence for a derived format: the format's literals (format.py) as a Lark grammar, each literal
cut at its added tokens (named `<[id]>`; llguidance never matches an added token from quoted text).

    start: think? answer
    answer: TEXT | TEXT_SEP? section | bare_call   (auto; `required` / a named tool: section only; bare_call
            after the `content_lead` the template opens every turn with, as one literal)
    section: "{section_open}" call ("{call_sep}" call)* "{section_close}"
    call: tool_0 | tool_1 ...
    tool_0: "{call_open}NAME{name_close}" %json{parameters} "{call_close}"                     (json)
    tool_0: "{call_open}NAME" p_0_0 p_0_1? "{name_close}{call_close}"-ish                        (tagged)
    p_0_0: "{param_open}KEY{param_mid}" VALUE "{param_close}"    string values raw, others %json

Free text never spells a literal that starts a call or closes reasoning (the parser would read it as one), nor
opens as a bare JSON call of a declared tool does (bare_json.py: `bare_call`, the whole answer, under `auto`).
Text before calls ends with the format's `content_sep` (the template writes it): a text lexeme ending in it where
the opener starts with an added token, else a lazy lexeme ending at the whole opener.
"""

from __future__ import annotations

import json

from zllm.canonical import FunctionTool
from zllm.dialects.bare_json import bare_call_rules, bare_opening_regex, reads_bare
from zllm.dialects.base import CANONICAL_JSON_GUIDANCE, FenceGrammar, FenceSpec, MarkupTokens
from zllm.dialects.derived.format import ID_SLOT, INDEX_SLOT, NAME_SLOT, SLOTS, CallFormat, split_slot
from zllm.dialects.derived.kwargs_grammar import kwargs_calls
from zllm.dialects.derived.param_grammar import typed_value, xml_value
from zllm.dialects.glm.format import is_string_schema, param_schemas
from zllm.dialects.string_values import raw_string_terminal

ANY = "/(?s:.*)/"


def fence_grammar(spec: FenceSpec, markup: MarkupTokens, *, fmt: CallFormat,
                  pieces: tuple[str, ...]) -> FenceGrammar | None:
    if not spec.constrains:
        return None
    return FenceGrammar(lark=_Writer(fmt, markup, pieces).grammar(spec), literals=pieces)


class _Writer:
    def __init__(self, fmt: CallFormat, markup: MarkupTokens, pieces: tuple[str, ...]):
        self.f, self.markup = fmt, markup
        self.singles = tuple(sorted((p for p in pieces if markup.is_single(p)), key=len, reverse=True))
        self.lines: dict[str, str] = {}
        self.bare_tools: tuple[FunctionTool, ...] = ()  # the tools a bare JSON call may name (bare_json.py)

    # ------------------------------------------------------------------------------------ structure

    def grammar(self, spec: FenceSpec) -> str:
        f = self.f
        tools = _callable(spec)
        if reads_bare(f.section_open + f.call_open):
            self.bare_tools = spec.tools
        head = ""
        if f.gen_in_think:
            head = self.until("reasoning", f.think_close) + " "
        elif f.empty_think:  # reasoning, or its closer alone (MiniMax M3)
            thought = f"{self.lits(f.think_open)} {self.until('reasoning', f.think_close)}"
            head = f"({thought} | {self.lits(f.think_close)}) " if spec.thinking else f"{self.lits(f.think_close)} "
        elif f.reasons and spec.thinking:
            self.rule("think", f"{self.lits(f.think_open)} {self.until('reasoning', f.think_close)}")
            head = "think? "
        self.rule("start", head + self.answer(spec, tools))
        return "%llguidance {}\n" + "\n".join(self.lines.values()) + "\n"

    def answer(self, spec: FenceSpec, tools: tuple[FunctionTool, ...]) -> str:
        f = self.f
        forced = bool(tools) and spec.choice.mode in ("required", "tool")
        text = "" if forced else self.terminal("TEXT", self.answer_text())
        if text and f.text_close:  # the text's closing framing may follow it (Kimi K3)
            close = self.lits(f.text_close)
            text = self.rule("text_closed", f"{text} ({close})? | {close}")
        if spec.response_schema is not None:
            schema = {**spec.response_schema, "x-guidance": CANONICAL_JSON_GUIDANCE}
            self.rule("json_answer", f"%json {json.dumps(schema, ensure_ascii=False)}")
            text = "json_answer"
        # the text's own lead (format.py `text_lead`: Solar Open's `<|content|>`), which calls do not open with
        lead = self.lits(f.text_lead) + " " if f.text_lead else ""
        if not tools:
            return f"{lead}{text}" if text == "json_answer" else f"{lead}{text}?"
        if f.kwargs:  # each call's rules run on to the section's end (kwargs_grammar.py)
            self.rule("calls", kwargs_calls(self, tools))
        else:
            self.rule("call", " | ".join(self.tool(i, tool) for i, tool in enumerate(tools)))
            more = "" if f.single_call else f"({self.lits(f.call_sep + f.call_open)} call)*"
            self.rule("calls", f"call {more} {self.lits(f.section_close)}".strip())
        section = f"{self.lits(f.section_open + f.call_open)} calls"
        if spec.choice.mode in ("required", "tool"):
            return section
        if text == "json_answer":
            return f"({lead}json_answer | {section})"
        if self.bare_tools:  # one call written as a bare JSON object, the whole answer
            for name, body in bare_call_rules(tools, framing=f.content_lead).items():
                self.rule(name, body)
            closed = f" ({self.lits(f.text_close)})?" if f.text_close else ""  # the text's framing (Kimi K3)
            section = f"{lead}bare_call{closed} | {section}"
        if not f.text_with_calls or f.text_after_calls:
            # text beside calls would be lost from the next turn's prompt, or moved (Gemma 4 writes it after the
            # calls' results once they follow): a turn holds text or calls
            return f"({lead}{text}? | {section})"
        return f"({lead}{text}? | {section} | {lead}{self.text_then_section()})"

    def text_then_section(self) -> str:
        f = self.f
        opener = f.content_sep + f.section_open + f.call_open
        first = self.pieces(opener)
        special_at = next((i for i, p in enumerate(first) if self.markup.is_single(p)), None)
        if special_at is not None and all(not self.markup.is_single(p) for p in first[:special_at]):
            sep = "".join(first[:special_at])
            body = self.answer_text()
            if sep:
                body += f" & /(?s:.*){_regex(sep)}/"
            name = self.terminal("TEXT_SEP", body)
            return f"{name} {self.lits(''.join(first[special_at:]))} calls"
        # the opener starts with text: a lazy lexeme that ends at its first occurrence
        self.rule("text_head", f"{self.terminal('TEXT', self.answer_text())} "
                               f"{self.lits(opener)}", lazy=True)
        return "text_head calls"

    def tool(self, index: int, tool: FunctionTool) -> str:
        """`tool_<i>`: from the name to the call's closer (the opener is written by the caller)."""
        f = self.f
        name = f"tool_{index}"
        if f.tagged:  # the name, and again where the template repeats it (muse-glimmer)
            named = tool.name + f.name_close.replace(NAME_SLOT, tool.name)
            parts = [self.lits(named), *self.params(index, tool), self.lits(f.call_close)]
        elif f.notation:
            parts = [self.lits(tool.name + f.name_close), self.notation_object(index, tool), self.lits(f.call_close)]
        else:
            schema = json.dumps(_guided(_arguments_schema(tool), lines=bool(f.json_indent)), ensure_ascii=False)
            closer = self.lits(f.call_close)
            if f.bare_call_close:  # with the id the history writes, or without it as the turn does
                closer = f"({closer} | {self.lits(f.bare_call_close)})"
            parts = [self.lits(tool.name + f.name_close), f"%json {schema}", closer]
        return self.rule(name, " ".join(p for p in parts if p))

    def params(self, index: int, tool: FunctionTool) -> list[str]:
        """One rule per parameter in schema order; optional ones may be left out (the template writes the
        parameters it is given, in the order given)."""
        f = self.f
        schemas = param_schemas(tool) if tool.grammar is None else {"input": {"type": "string"}}
        required = set(tool.parameters.get("required") or ()) if tool.grammar is None else {"input"}
        parts = []
        for number, (key, schema) in enumerate(schemas.items()):
            rule = f"p_{index}_{number}"
            name, closer, opener = f"value_{index}_{number}", f.close_of(key), self.lits(f.param_open + key)
            if tool.grammar is not None:
                value = f"{self.lits(f.mid_of('string'))} {self.until(name, closer)}"
            elif f.type_words:
                value = typed_value(self, name, schema, closer)
            elif f.xml_item and not is_string_schema(schema):
                value = f"{self.lits(f.param_mid)} {xml_value(self, name, schema, closer)}"
            elif is_string_schema(schema) and f.wrap_open and not _choices(schema):
                value = f"{self.lits(f.param_mid)} {self.wrapped_string(name, schema)}"
            elif is_string_schema(schema):
                value = f"{self.lits(f.param_mid)} {self.string_value(name, schema, closer=closer)}"
            else:
                value = f"{self.lits(f.param_mid)} {self.json_value(schema)} {self.lits(closer)}"
            self.rule(rule, f"{opener} {value}")
            parts.append(rule if key in required else f"{rule}?")
        return parts

    def json_value(self, schema: dict) -> str:
        """A non-string value: its JSON, except that a `python_constants` format spells true / false / null
        `True` / `False` / `None` at the top level (what its template's `| string` writes)."""
        kinds = schema.get("type")
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or ())
        constants = [] if not self.f.python_constants else (
            (['"True"', '"False"'] if "boolean" in kinds else []) + (['"None"'] if "null" in kinds else []))
        rest = [kind for kind in kinds if kind not in ("boolean", "null")] if constants else kinds
        if not constants:
            return f"%json {json.dumps({**schema, 'x-guidance': CANONICAL_JSON_GUIDANCE}, ensure_ascii=False)}"
        if rest:
            narrowed = {**schema, "type": rest if len(rest) > 1 else rest[0], "x-guidance": CANONICAL_JSON_GUIDANCE}
            constants.append(f"%json {json.dumps(narrowed, ensure_ascii=False)}")
        return f"({' | '.join(constants)})"

    def string_value(self, name: str, schema: dict, closer: str | None = None) -> str:
        """A raw string value then the parameter's closer (or `closer`): one of an enum, or text under the
        schema's length and pattern bounds (string_values.py), or any text without markup."""
        closer = self.f.param_close if closer is None else closer
        choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
        if choices and all(isinstance(c, str) for c in choices):
            return f"({' | '.join(self.lits(c) for c in choices)}) {self.lits(closer)}"
        bounded = raw_string_terminal(schema)
        if bounded is None:
            return self.until(name, closer)
        first = self.pieces(closer)[0]
        terminal = self.terminal(f"{name.upper()}_BOUNDED", f"{bounded} & {self.free_text(nonempty=False)}")
        if self.markup.is_single(first):
            return f"{terminal} {self.lits(closer)}"
        rule = self.rule(f"{name}_bounded", f"{terminal} {json.dumps(first, ensure_ascii=False)}", lazy=True)
        rest = closer[len(first):]
        return f"{rule} {self.lits(rest)}" if rest else rule

    def wrapped_string(self, name: str, schema: dict) -> str:
        """A string value as a template that wraps some writes it: raw without any of the wrap characters, or
        wrapped holding at least one (a value written the other way would be spelled otherwise next turn)."""
        f = self.f
        chars = "".join(_regex(c) if c not in "\\]^-" else "\\" + c for c in f.wrap_chars)
        bounded = raw_string_terminal(schema)
        bound = f" & {bounded}" if bounded else ""
        raw = self.terminal(f"{name.upper()}_RAW", f"/[^{chars}]*/{bound} & {self.free_text(nonempty=False)}")
        inner = self.terminal(f"{name.upper()}_WRAPPED", f"/(?s:.*[{chars}].*)/{bound}")
        plain = self.pieces(f.wrap_close)[0]
        wrapped = self.rule(f"{name}_wrapped", f"{inner} {json.dumps(plain, ensure_ascii=False)}", lazy=True)
        rest = f.wrap_close[len(plain):]
        return (f"({raw} | {self.lits(f.wrap_open)} {wrapped} {self.lits(rest)}) "
                f"{self.lits(f.param_close)}").replace("  ", " ")

    # ------------------------------------------------------------------------------------ notation

    def notation_object(self, index: int, tool: FunctionTool) -> str:
        """`{KEY:VALUE,...}` in the template's notation: keys in the order it writes them (sorted, where it
        sorts), optional ones left out, commas only between the pairs written."""
        f = self.f
        if tool.grammar is None:
            schemas, required = param_schemas(tool), set(tool.parameters.get("required") or ())
        else:
            schemas, required = {"input": {"type": "string"}}, {"input"}
        keys = sorted(schemas) if f.sorted_keys else list(schemas)
        pairs = []
        for number, key in enumerate(keys):
            value = self.notation_value(f"nv_{index}_{number}", schemas[key])
            pairs.append(self.rule(f"n_{index}_{number}", f"{self.lits(key + ':')} {value}"))
        needed = [key in required for key in keys]

        def after(k: int) -> str:
            """What may follow pair k (k = -1: the object's start), as a reference to its rule."""
            alternatives = []
            for j in range(k + 1, len(keys)):
                comma = self.lits(",") + " " if k >= 0 else ""
                alternatives.append(f"{comma}{pairs[j]} {after(j)}".strip())
                if needed[j]:
                    break
            if not alternatives:
                return ""
            name = self.rule(f"a_{index}_{k + 1}", " | ".join(alternatives))
            return name if any(needed[k + 1:]) else f"{name}?"

        return f'{self.lits("{")} {after(-1)} {self.lits("}")}'.replace("  ", " ")

    def notation_value(self, name: str, schema: dict) -> str:
        """A value by its schema: a string between the quote markers; a number or boolean as its JSON (spelled
        alike); null as the template's word; objects and arrays in the notation, unchecked against the schema."""
        f = self.f
        if is_string_schema(schema):
            return f"{self.lits(f.quote_open)} {self.string_value(name, schema, closer=f.quote_close)}"
        kinds = schema.get("type")
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or ())
        scalar = [kind for kind in kinds if kind in ("integer", "number", "boolean")]
        if not kinds or len(scalar) < len(kinds) - ("null" in kinds):
            return self.any_notation_value()
        choices = []
        if scalar:
            narrowed = {**schema, "type": scalar if len(scalar) > 1 else scalar[0], "x-guidance": CANONICAL_JSON_GUIDANCE}
            choices.append(f"%json {json.dumps(narrowed, ensure_ascii=False)}")
        if "null" in kinds:
            choices.append(self.lits(f.null_word))
        return f"({' | '.join(choices)})"

    def any_notation_value(self) -> str:
        f = self.f
        quoted = f"{self.lits(f.quote_open)} {self.until('nv_text', f.quote_close)}"
        self.rule("nv", f'nv_object | nv_array | nv_string | NV_NUMBER | "true" | "false" | {self.lits(f.null_word)}')
        self.rule("nv_string", quoted)
        self.rule("nv_pair", 'NV_KEY ":" nv')
        self.rule("nv_object", '"{" (nv_pair ("," nv_pair)*)? "}"')
        self.rule("nv_array", '"[" (nv ("," nv)*)? "]"')
        self.terminal("NV_KEY", "/[A-Za-z_][A-Za-z0-9_]{0,40}/")
        self.terminal("NV_NUMBER", r"/-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,15})?/")
        return "nv"

    # ------------------------------------------------------------------------------------ text

    def answer_text(self) -> str:
        """The answer's free text: no markup, and (tools declared) no opening the way a bare call does, which
        the parser would read as one, after the format's content lead or without it (the parser drops it)."""
        body = self.free_text(nonempty=True)
        if not self.bare_tools:
            return body
        lead = self.f.content_lead
        framing = f"(?:{_regex(lead)})?" if lead else ""
        return f"{body} & ~{bare_opening_regex(self.bare_tools, framing=framing)}"

    def free_text(self, *, nonempty: bool) -> str:
        """Text that spells none of the format's literals' markers and none of its call openers."""
        f = self.f
        # each opener up to the call's id where it holds one (Solar Open's); with the text's separator before it
        # where the calls open with no marker of their own (functionary v3.2's `>>>`)
        openers = (f.section_open + f.call_open, f.call_open, f.content_sep + f.section_open + f.call_open)
        banned = [p for p in (*(split_slot(o)[0] for o in openers), f.think_close) if p.strip()]
        banned += [p for p in self.singles]
        body = "/(?s:.+)/" if nonempty else ANY
        alternatives = "|".join(_regex(b) for b in dict.fromkeys(banned))
        return f"{body} & ~/(?s:.*)(?:{alternatives})(?s:.*)/" if alternatives else body

    def until(self, name: str, closer: str) -> str:
        """Text with no markup, then `closer`."""
        first = self.pieces(closer)
        if first and self.markup.is_single(first[0]):
            terminal = self.terminal(name.upper(), self.free_text(nonempty=True))
            return f"{terminal}? {self.lits(closer)}"
        plain = first[0] if first else closer
        body = f"{self.free_text(nonempty=False)}"
        terminal = self.terminal(f"{name.upper()}_ANY", body)
        rule = self.rule(f"{name}_until", f"{terminal} {json.dumps(plain, ensure_ascii=False)}", lazy=True)
        rest = closer[len(plain):]
        return f"{rule} {self.lits(rest)}" if rest else rule

    # ------------------------------------------------------------------------------------ lark text

    def pieces(self, text: str) -> list[str]:
        out, at = [], 0
        while at < len(text):
            best = min(((text.find(s, at), -len(s), s) for s in self.singles if text.find(s, at) != -1), default=None)
            if best is None:
                out.append(text[at:])
                break
            start, _, single = best
            if start > at:
                out.append(text[at:start])
            out.append(single)
            at = start + len(single)
        return out

    def lits(self, text: str) -> str:
        """`text` as Lark: added tokens by id, the rest quoted; a slot (format.py) as the id / index it stands for."""
        for slot in SLOTS:
            if slot in text:
                head, _, tail = text.partition(slot)
                return " ".join(p for p in (self.lits(head), self.slot_terminal(slot), self.lits(tail)) if p)
        return " ".join(self.markup.lark(p) if self.markup.is_single(p) else json.dumps(p, ensure_ascii=False)
                        for p in self.pieces(text)) if text else ""

    def slot_terminal(self, slot: str) -> str:
        """A call's index (digits), or an id the model invents: the template's id shape, else a short word."""
        if slot == INDEX_SLOT:
            return self.terminal("CALL_INDEX", "/[0-9]{1,4}/")
        assert slot == ID_SLOT
        return self.terminal("CALL_ID", f"/{self.f.id_pattern}/" if self.f.id_pattern else "/[A-Za-z0-9_]{1,40}/")

    def rule(self, name: str, body: str, *, lazy: bool = False) -> str:
        self.lines.setdefault(name, f"{name}{'[lazy]' if lazy else ''}: {body}")
        return name

    def terminal(self, name: str, body: str) -> str:
        self.lines.setdefault(name, f"{name}: {body}")
        return name


def _regex(text: str) -> str:
    """`text` as a regex matching it literally, safe inside Lark's /.../ (control characters spelled out)."""
    out = []
    for char in text:
        if char in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[char])
        elif char.isalnum() or char in " _-~'\"<>=:,;!@%&":
            out.append(char)
        elif char == "/":
            out.append("\\/")
        else:
            out.append("\\" + char if ord(char) < 128 else char)
    return "".join(out)


def _choices(schema: dict) -> list | None:
    return schema.get("enum", [schema["const"]] if "const" in schema else None)


def _callable(spec: FenceSpec) -> tuple[FunctionTool, ...]:
    if spec.choice.mode == "none":
        return ()
    if spec.choice.mode == "tool":
        chosen = tuple(t for t in spec.tools if t.name == spec.choice.name)
        if not chosen:
            raise ValueError(f"tool_choice names {spec.choice.name!r}, which is not among the tools")
        return chosen
    return spec.tools


def _arguments_schema(tool: FunctionTool) -> dict:
    if tool.grammar is not None:
        return {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"],
                "additionalProperties": False}
    return tool.parameters or {"type": "object"}


def _guided(schema: dict, *, lines: bool = False) -> dict:
    """`lines`: JSON laid out on lines of their own (format.py `json_indent`): spaces and newlines between its
    tokens, as the parser reads them (%json cannot count the indentation per level; the next prompt spells it as the
    template does)."""
    guidance = {**CANONICAL_JSON_GUIDANCE, **LINES_JSON_GUIDANCE} if lines else CANONICAL_JSON_GUIDANCE
    return {**schema, "x-guidance": {**schema.get("x-guidance", {}), **guidance}}


LINES_JSON_GUIDANCE = {"whitespace_flexible": True, "whitespace_pattern": r"[ \n]{1,64}", "item_separator": ",",
                       "key_separator": ":"}
