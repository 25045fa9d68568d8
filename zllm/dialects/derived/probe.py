"""Find a template's tool-call format by rendering probe conversations and comparing them (format.py says what
is found). Each probe differs from another in one thing — one call or two, one parameter or two, none, a string
or a number, text before the calls, reasoning — so where their renderings differ tells which text belongs to
what. The sentinels (`zqa`, `zq-v1`, ...) are strings no template writes by itself.

    fmt = derive_format(template, markers)      # CallFormat, or raises NotDerivable("why")

Splits between literals are snapped to the edges of special markers (probe_markers.py). The prober's paths
live beside it: the sentinels and probe tools (probe_terms.py), templates that rewrite their generation prompt in
the turns they render (probe_rewrite.py), ids and indexes (probe_slots.py), the text and reasoning beside the
calls (probe_text.py); this module probes the calls themselves (JSON, notation, keyword or tagged arguments) and
the literals around them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from zllm.dialects.derived import kwargs, notation
from zllm.dialects.derived.format import (
    ID_SLOT,
    KEY_SLOT,
    NAME_SLOT,
    CallFormat,
    json_lines,
)
from zllm.dialects.derived.jinja import JinjaChatTemplate
from zllm.dialects.derived.param_probes import json_kind as _json_kind
from zllm.dialects.derived.param_probes import keyed_closer, typed_values, xml_item
from zllm.dialects.derived.probe_markers import MarkerSpans, split_markers
from zllm.dialects.derived.probe_rewrite import Rewrites
from zllm.dialects.derived.probe_slots import Slots, index_before_name, indexed
from zllm.dialects.derived.probe_terms import (
    K1,
    K2,
    KN,
    NAME_A,
    NAME_B,
    PROBE_TOOLS,
    TEXT,
    THINK,
    USER,
    V1,
    V2,
    VN,
    NotDerivable,
    NotExtended,
    as_text,
    call,
    changed,
    find,
    json_text,
    probe_id,
)
from zllm.dialects.derived.probe_text import TextLeads

# what the modules that derive a dialect take from here (dialect.py, parse.py, template_survey)
__all__ = ["PROBE_TOOLS", "NotDerivable", "call", "derive_format", "split_markers", "thinking_switch",
           "thinking_variable", "written_after"]

def derive_format(template: JinjaChatTemplate, markers: Iterable[str] = (), **variables) -> CallFormat:
    """`variables`: template variables every probe renders with (`enable_thinking=False`)."""
    probe = _Prober(template, tuple(markers), variables)
    return probe.derive()


def written_after(template: JinjaChatTemplate, prompt: str, rendered: str) -> str:
    """What the model wrote for a turn `rendered` (prompt and turn, as the template renders the conversation) holds,
    where the template drops from the turn the reasoning block `prompt` opens or closes (Nemotron Nano v2, QwQ):
    the block's closer where the prompt left it open, then the turn."""
    prober = _Prober(template, ())
    shared = prober._common_prefix(prompt, rendered)
    return prober._closer_of(prompt[len(shared):]) + rendered[len(shared):]


# the variables a template's reasoning switch is read from, in the order looked for (Kimi K3 reads `thinking`)
SWITCHES = ("enable_thinking", "thinking")


def thinking_variable(template: JinjaChatTemplate) -> str:
    """The variable the template's generation prompt follows for reasoning ("" where none is)."""
    return next((name for name in SWITCHES if thinking_switch(template, name) is not None), "")


def thinking_switch(template: JinjaChatTemplate, variable: str = "enable_thinking") -> bool | None:
    """Whether the template's generation prompt follows `variable`: None when it does not, else the
    setting it uses when the variable is not given (Qwen3.5: True, DeepSeek V3.1: False)."""
    if not re.search(rf"\b{variable}\b", template.source):
        return None
    try:
        prompts = [template([{"role": "user", "content": USER}], tools=PROBE_TOOLS, add_generation_prompt=True,
                            **({} if setting is None else {variable: setting}))
                   for setting in (None, True, False)]
    except Exception:
        return None
    default, on, off = prompts
    if on == off or default not in (on, off):
        return None
    return default == on


class _Prober(Rewrites, Slots, TextLeads, MarkerSpans):
    def __init__(self, template: JinjaChatTemplate, markers: tuple[str, ...], variables: dict | None = None):
        self.template = template
        self.variables = variables or {}
        self.markers = tuple(sorted(set(markers), key=len, reverse=True))
        self.text_arguments = False  # the template takes arguments as JSON text (format.py `text_arguments`)
        self._text_lead = ""
        self.reasoning_dropped = False  # `_drops_reasoning`
        self._framing = ""  # after a turn in a conversation that goes on (`_after_turns`)
        self.trailing = ""  # what the template writes after the last message, whatever it is (`_trailing_block`)
        self.gen = self._render([{"role": "user", "content": USER}], generation=True)

    # ---------------------------------------------------------------------------------- rendering

    def _render(self, messages: list[dict], *, generation: bool) -> str:
        try:
            return self.template(as_text(messages) if self.text_arguments else messages, tools=PROBE_TOOLS,
                                 add_generation_prompt=generation, **self.variables)
        except Exception as exc:  # jinja errors, raise_exception(...), a template that insists on its own shape
            failure = exc
        if not self.text_arguments and as_text(messages) != messages:
            # a template that takes the arguments as JSON text (functionary v3.2 writes `'\n' + arguments`)
            try:
                text = self.template(as_text(messages), tools=PROBE_TOOLS, add_generation_prompt=generation,
                                     **self.variables)
            except Exception:  # noqa: BLE001 - it fails either way: the first failure says why
                pass
            else:
                self.text_arguments = True
                return text
        raise NotDerivable(f"the template fails on a probe conversation: {type(failure).__name__}: {failure}") \
            from failure

    def turn(self, **assistant) -> str:
        """The text an assistant turn adds after the generation prompt: what the model writes."""
        message = {"role": "assistant", "content": assistant.pop("content", ""), **assistant}
        if self.reasoning_dropped:
            return self._slots(self._turn_in_history(message))
        full = self._without_trailing(self._render([{"role": "user", "content": USER}, message], generation=False))
        for reasoning in (THINK, ""):
            if full.startswith(self.gen) or "reasoning_content" in assistant:
                break
            # a generation prompt that opens reasoning (`<think>\n`): the model always reasons, and a turn
            # extends that prompt only with its reasoning in it; one that closes an empty block (Qwen3.5 with
            # `enable_thinking` off): a turn extends it with its reasoning empty
            message["reasoning_content"] = reasoning
            full = self._without_trailing(self._render([{"role": "user", "content": USER}, message],
                                                       generation=False))
        if not full.startswith(self.gen):
            raise NotExtended("an assistant turn does not extend the generation prompt (the template renders "
                               "the last turn differently from how the model is prompted to write it)")
        return self._slots(full[len(self.gen):])

    @staticmethod
    def _slots(turn: str) -> str:
        # a call id the template writes is what the model invents: a slot in the format, not literal text
        return turn.replace(probe_id(0), ID_SLOT).replace(probe_id(1), ID_SLOT)

    # ---------------------------------------------------------------------------------- derivation

    def derive(self) -> CallFormat:
        try:
            self.turn(content=TEXT)
        except NotExtended:
            self.trailing = self._trailing_block()
        self._drops_reasoning()
        plain = self.turn(content=TEXT)
        if TEXT not in plain:
            raise NotDerivable("the template does not write an assistant's text")
        lead, tail = plain.split(TEXT, 1)
        self._tail = tail
        lead = self._split_text_lead(lead, self.turn(tool_calls=[call(NAME_A, {K1: V1})]))
        one = self._body(self.turn(tool_calls=[call(NAME_A, {K1: V1})]), lead)
        if NAME_A not in one:
            raise NotDerivable("the template writes no tool calls (a call's name never appears in its rendering)")
        if json.dumps({K1: V1}, ensure_ascii=False) in one:
            fmt = self._json_calls(lead, tail)
        elif (layout := self._json_layout(lead)) is not None:
            fmt = self._json_calls(lead, tail, layout=layout)
        elif (spelling := self._notation(lead)) is not None:
            fmt = self._json_calls(lead, tail, spelling)
        elif (spelling := self._kwargs(lead)) is not None:
            fmt = self._json_calls(lead, tail, kwargs_spelling=spelling)
        elif K1 in one and V1 in one:
            fmt = self._tagged_calls(lead, tail)
        else:
            raise NotDerivable("the call's arguments are written neither as a JSON object nor as key/value markup")
        fmt = self._with_slot(self._with_history_ids(self._with_last_turn_ids(
            self._with_reasoning(self._with_content(fmt, lead), lead, tail))))
        if lead and not lead.strip() and not fmt.reasons:
            # whitespace every turn opens with, whatever follows (Laguna XS's `\n` after the prompt's `</think>`)
            fmt = changed(fmt, content_lead=lead)
        if fmt.end_opens_calls and not fmt.text_close:
            fmt = changed(fmt, text_close=fmt.turn_end)  # GigaChat 3: after text, the marker closes it
        return changed(fmt, text_lead=self._text_lead, text_arguments=self.text_arguments, after_last=self.trailing)

    def _body(self, turn: str, lead: str) -> str:
        if not turn.startswith(lead):
            raise NotDerivable(f"a turn with calls does not start like a turn with text ({lead!r})")
        return turn[len(lead):]

    def _notation(self, lead: str) -> dict | None:
        """The quoting rule of a template that writes arguments as an object in its own notation (notation.py),
        found by probing with a value of each JSON type; None when the arguments are not written so."""
        def body(arguments: dict) -> str:
            turn = self._body(self.turn(tool_calls=[call(NAME_A, arguments)]), lead)
            return turn[find(turn, NAME_A) + len(NAME_A):]

        number, string = body({K1: VN}), body({K1: V1})
        k_num, k_str = number.find(K1 + ":"), string.find(K1 + ":")
        if k_num == -1 or k_num != k_str or not number.startswith(f"{K1}:{VN}", k_num):
            return None
        at = k_str + len(K1) + 1
        quote_open = string[at:string.find(V1, at)] if V1 in string[at:] else ""
        after_number, after_string = number[k_num + len(f"{K1}:{VN}"):], string[string.find(V1, at) + len(V1):]
        if not quote_open or not after_string.endswith(after_number):
            return None
        quote_close = after_string[:len(after_string) - len(after_number)]
        probe = {K2: V2, K1: "zq x", "zqkc": [True, False, 1.5, {"zqkd": "zq y"}], "zqkb": None}
        written = body(probe)
        for null in ("None", "null"):
            for sorted_keys in (True, False):
                spelling = {"quote_open": quote_open, "quote_close": quote_close, "null": null,
                            "sorted_keys": sorted_keys}
                if notation.write(probe, **spelling) in written:
                    return spelling
        raise NotDerivable(f"arguments are written in a notation of their own ({quote_open!r} around strings) "
                           "that zllm cannot spell back")

    def _kwargs(self, lead: str) -> dict | None:
        """How a template that writes keyword arguments (`NAME(k='v')`, kwargs.py) spells each JSON type; None
        when its arguments are not written so."""
        def written(arguments: dict) -> str:
            turn = self._body(self.turn(tool_calls=[call(NAME_A, arguments)]), lead)
            return turn[find(turn, NAME_A) + len(NAME_A):]

        return kwargs.kwargs_spelling(written, K1, K2, V1, V2, VN)

    def _json_layout(self, lead: str) -> tuple[int, int] | None:
        """(indent, margin) of JSON arguments written on lines of their own (Command R+'s `tojson(indent=4) |
        indent(8)`: `indent` spaces per level, `margin` more before every line after the first); None when the
        arguments are not written so."""
        def body(arguments: dict) -> str:
            return self._body(self.turn(tool_calls=[call(NAME_A, arguments)]), lead)

        two = body({K1: V1, K2: V2})
        found = next(((indent, margin) for indent in (2, 4, 1, 3, 8) for margin in range(0, 33)
                      if json_lines({K1: V1, K2: V2}, indent, margin) in two), None)
        if found is None:
            return None
        nested = {K1: {"zqx": [1, "zq y", None]}, K2: []}
        if json_lines(nested, *found) not in body(nested):
            raise NotDerivable(f"arguments are written as JSON on lines of their own, indented {found}, but a nested "
                               "value is laid out otherwise")
        return found

    def _json_calls(self, lead: str, tail: str, spelling: dict | None = None,
                    kwargs_spelling: dict | None = None, layout: tuple[int, int] | None = None) -> CallFormat:
        """JSON arguments (`layout`: on lines of their own, `_json_layout`), or (`spelling`) arguments in the
        template's notation (notation.py), or (`kwargs_spelling`) keyword arguments (kwargs.py)."""
        _json = (lambda value: notation.write(value, **spelling)) if spelling else \
            (lambda value: kwargs.write(value, **kwargs_spelling)) if kwargs_spelling else \
            (lambda value: json_lines(value, *layout)) if layout else json_text
        a1, a2 = {K1: V1}, {KN: VN}
        one = self._body(self.turn(tool_calls=[call(NAME_A, a1)]), lead)
        n1 = find(one, NAME_A)
        s1 = find(one, _json(a1), n1)
        name_close = one[n1 + len(NAME_A):s1]
        before, after = one[:n1], one[s1 + len(_json(a1)):]
        try:
            two = self._body(self.turn(tool_calls=[call(NAME_A, a1), call(NAME_B, a2, 1)]), lead)
        except NotDerivable:  # a family that calls one tool per turn (Llama 3.x refuses two)
            return self._single_call(before, after, tail, name_close=name_close)
        if NAME_B not in two[s1:] and two == one:
            # the template writes only the first of two calls (GigaChat 3 renders `tool_calls[0]`): one per turn
            return self._single_call(before, after, tail, name_close=name_close)
        n2 = find(two, NAME_B, s1)
        mid = two[s1 + len(_json(a1)):n2]
        second_close = two[n2 + len(NAME_B):].partition(_json(a2))[0]
        if second_close != name_close:
            name_close = indexed(name_close, second_close)
        quoting = {} if not spelling else {
            "arguments": "notation", "quote_open": spelling["quote_open"], "quote_close": spelling["quote_close"],
            "null_word": spelling["null"], "sorted_keys": spelling["sorted_keys"]}
        if kwargs_spelling:
            quoting = {"arguments": "kwargs", **kwargs_spelling}
        if layout:
            quoting = {"json_indent": layout[0], "json_margin": layout[1]}
        return self._frame(before, mid, after, two[n2 + len(NAME_B) + len(name_close) + len(_json(a2)):], tail,
                           **{"arguments": "json", "name_close": name_close, **quoting})

    def _tagged_calls(self, lead: str, tail: str) -> CallFormat:
        two_params = self._body(self.turn(tool_calls=[call(NAME_A, {K1: V1, K2: V2})]), lead)
        n = find(two_params, NAME_A)
        k1 = find(two_params, K1, n)
        v1 = find(two_params, V1, k1)
        k2 = find(two_params, K2, v1)
        v2 = find(two_params, V2, k2)
        # name_close + param_open, the name written again as its slot (muse-glimmer's `<atem:invoke name="NAME">`)
        x = two_params[n + len(NAME_A):k1].replace(NAME_A, NAME_SLOT)
        # param_close + param_open, the key the closer names (MiniMax M3's `NS</KEY>`) as its slot
        y = two_params[v1 + len(V1):k2].replace(K1, KEY_SLOT)
        param_open = self._common_suffix(x, y)
        if not param_open:
            raise NotDerivable("no common markup opens each parameter")
        name_close, param_close = x[:len(x) - len(param_open)], y[:len(y) - len(param_open)]
        param_mid = two_params[k1 + len(K1):v1]
        close = lambda key: param_close.replace(KEY_SLOT, key)  # noqa: E731
        if two_params[k2 + len(K2):v2] != param_mid:
            raise NotDerivable("the parameters' keys and values are not joined alike")
        if not two_params[v2 + len(V2):].startswith(close(K2)):
            raise NotDerivable("the last parameter is not closed like the others")
        one = self._body(self.turn(tool_calls=[call(NAME_A, {K1: V1})]), lead)
        after_one = one[find(one, V1) + len(V1) + len(close(K1)):]
        none = self._body(self.turn(tool_calls=[call(NAME_A, {})]), lead)
        after_none = none[find(none, NAME_A) + len(NAME_A):].replace(NAME_A, NAME_SLOT, 1)
        if after_none != name_close + after_one:
            raise NotDerivable("a call without arguments is not written as the same call minus its parameters")
        parts = {"param_open": param_open, "param_mid": param_mid, "param_close": param_close}
        if KEY_SLOT in param_close:
            parts, name_close, after_one = keyed_closer(parts, name_close, after_one)
        wrap = self._wrapping(parts["param_mid"], close(K1))
        draft = CallFormat("", "", name_close, "", "", "", "tagged", **parts)
        typed = typed_values(lambda value: self._written(lead, draft, value), draft)
        draft = changed(draft, **typed)
        two = self._body(self.turn(tool_calls=[call(NAME_A, {K1: V1}), call(NAME_B, {KN: VN}, 1)]), lead)
        first_end = find(two, V1) + len(V1) + len(draft.close_of(K1))
        n2 = find(two, NAME_B, first_end)
        second_close = two[n2 + len(NAME_B):].partition(draft.param_open + KN)[0].replace(NAME_B, NAME_SLOT, 1)
        if second_close != name_close:
            name_close = indexed(name_close, second_close)  # Kimi K3's `index="1"` / `index="2"`
        number = f"{second_close}{draft.param_open}{KN}{draft.mid_of('integer')}{VN}{draft.close_of(KN)}"
        number = number.replace(NAME_SLOT, NAME_B)  # as written: the name again where the template repeats it
        if not two[n2 + len(NAME_B):].startswith(number):
            raise NotDerivable("a number parameter is not written as its JSON text in the same markup")
        fmt = self._frame(one[:find(one, NAME_A)], two[first_end:n2], after_one,
                          two[n2 + len(NAME_B) + len(number):], tail, arguments="tagged", name_close=name_close,
                          **{**parts, **typed}, **self._constants(lead, draft), **wrap)
        return self._marker_ends_literals(fmt)

    def _marker_ends_literals(self, fmt: CallFormat) -> CallFormat:
        """A marker every literal after the name, a parameter or a call starts with (Kimi K3's `<|sep|>`) ends
        the literal before it instead: `<|open|>call tool="NAME" index="1"<|sep|>`, not `<|sep|><|open|>...`
        (the same text in the same order; the literals read as the template's tags)."""
        followers = (fmt.call_open, fmt.param_open, fmt.call_close, fmt.section_close)
        spans = self._marker_spans(fmt.call_open)
        if fmt.call_sep or not spans or spans[0][0] != 0:
            return fmt
        marker = fmt.call_open[:spans[0][1]]
        if not all(f.startswith(marker) and f != marker for f in followers):
            return fmt
        return changed(fmt, section_open=fmt.section_open + marker, name_close=fmt.name_close + marker,
                        param_close=fmt.param_close + marker, call_close=fmt.call_close[len(marker):] + marker,
                        call_open=fmt.call_open[len(marker):], param_open=fmt.param_open[len(marker):],
                        section_close=fmt.section_close[len(marker):])

    def _written(self, lead: str, draft: CallFormat, value) -> str | None:
        """How a tagged call writes `value` for parameter KN: from after the key to the parameter's closer
        (the type word's joiner included); None where the template leaves the parameter out (null)."""
        turn = self._body(self.turn(tool_calls=[call(NAME_B, {KN: value})]), lead)
        start = turn.find(draft.param_open + KN, find(turn, NAME_B))
        if start == -1:
            return None
        start += len(draft.param_open + KN)
        end = turn.rfind(draft.close_of(KN))
        if end < start:
            raise NotDerivable(f"a parameter holding {value!r} is not closed like the others")
        return turn[start:end]

    def _wrapping(self, param_mid: str, param_close: str) -> dict:
        """How a string value with markup characters is written: raw ({}), or wrapped when it holds one of
        them (MiniCPM5's `<![CDATA[...]]>` around a value with `<`, `&` or a newline)."""
        def written(value: str) -> str:
            turn = self.turn(tool_calls=[call(NAME_A, {K1: value})])
            start = find(turn, K1 + param_mid) + len(K1 + param_mid)
            return turn[start:find(turn, param_close, start + len(value))]

        markup_value = 'zq <b> "q" & \\ </x>\nzq'
        spelled = written(markup_value)
        if spelled == markup_value:
            return {}
        head, found, tail = spelled.partition(markup_value)
        if not found or not head or not tail:
            raise NotDerivable("a string value with markup characters is not written raw (escaped or wrapped)")
        chars = "".join(c for c in '<>&"\\\n' if written(f"zq{c}x") == f"{head}zq{c}x{tail}")
        if not chars or any(written(f"zq{c}x") != f"zq{c}x" for c in '<>&"\\\n' if c not in chars):
            raise NotDerivable(f"string values are wrapped in {head!r} ... {tail!r} by a rule zllm cannot tell")
        return {"wrap_open": head, "wrap_close": tail, "wrap_chars": chars}

    def _constants(self, lead: str, draft: CallFormat) -> dict:
        """How a tagged value spells true / false / null: Qwen3-Coder's template writes a non-string value with
        `| string` (Python's `True`, `None`), an object or array with `tojson` (JSON's `true` inside); MiniMax M3
        leaves a null out and writes objects and arrays as elements (xml_values.py)."""
        def written(value) -> str | None:
            text = self._written(lead, draft, value)
            if text is None:
                return None
            mid = draft.mid_of(_json_kind(value))
            if not text.startswith(mid):
                raise NotDerivable(f"a parameter holding {value!r} is not joined to its key like the others")
            return text[len(mid):]

        spelled = (written(True), written(False), written(None))
        omitted = spelled[2] is None
        if omitted:
            spelled = (*spelled[:2], "null")
        if spelled not in (("true", "false", "null"), ("True", "False", "None")):
            raise NotDerivable(f"true / false / null values are written {spelled}, neither as JSON nor as Python")
        out = {"null_omitted": True} if omitted else {}
        nested = {"a": [True, None, 1]}
        if written(nested) == json.dumps(nested, ensure_ascii=False):
            return {**out, "constants": "python" if spelled[0] == "True" else ""}
        if spelled[0] == "True" and written(nested) == str(nested):
            return {**out, "constants": "python-objects"}  # Seed-OSS: `| string` on everything, Python literals
        item = xml_item(written, draft)
        if item and spelled[0] == "true":
            return {**out, "xml_item": item}
        raise NotDerivable("an object value is written neither as JSON nor as a Python literal")

    def _frame(self, before: str, mid: str, after: str, after_two: str, tail: str, **parts) -> CallFormat:
        """The literals around calls: `before` the first name (section + call opener), `mid` between one call's
        arguments and the next name, `after` the last arguments to the end of the turn."""
        if after_two != after:
            raise NotDerivable("the last of two calls does not end the turn like a single call")
        call_open = self._common_suffix(before, mid)
        before, mid, call_open = index_before_name(before, mid, call_open, self._common_suffix)
        close_and_sep = mid[:len(mid) - len(call_open)]
        call_close = self._common_prefix(close_and_sep, after)
        rest = after[len(call_close):]
        call_turn_end = ""
        if not rest.endswith(tail) and self.trailing and not self._marker_spans(rest):
            # no end of its own: the template writes the block after the last message or the results right after
            # the calls (Command R+): the model ends the turn as it ends one of text, and the prompt never shows it
            tail = ""
        elif not rest.endswith(tail):
            # a turn with calls ends on a marker of its own (Gemma 4's `<|tool_response>`: the results follow)
            spans = self._marker_spans(rest)
            if not spans or rest[spans[-1][1]:].strip():
                raise NotDerivable(f"a turn with calls does not end like a turn with text ({tail!r})")
            call_turn_end, tail = rest[spans[-1][0]:], rest[spans[-1][0]:]
        text_close, turn_end = self._text_close(self._tail, before + mid)
        return CallFormat(section_open=before[:len(before) - len(call_open)], call_open=call_open,
                          call_close=call_close, call_sep=close_and_sep[len(call_close):],
                          section_close=rest[:len(rest) - len(tail)], turn_end=turn_end, text_close=text_close,
                          call_turn_end=self._turn_end(call_turn_end) if call_turn_end else "", **parts)

    def _single_call(self, before: str, after: str, tail: str, **parts) -> CallFormat:
        if not after.endswith(tail):
            raise NotDerivable(f"a turn with a call does not end like a turn with text ({tail!r})")
        return CallFormat(section_open="", call_open=before, call_close=after[:len(after) - len(tail)], call_sep="",
                          section_close="", arguments="json", turn_end=self._turn_end(tail), single_call=True,
                          **parts)
