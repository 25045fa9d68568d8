"""Find a template's tool-call format by rendering probe conversations and comparing them (format.py says what
is found). Each probe differs from another in one thing — one call or two, one parameter or two, none, a string
or a number, text before the calls, reasoning — so where their renderings differ tells which text belongs to
what. The sentinels (`zqa`, `zq-v1`, ...) are strings no template writes by itself.

    fmt = derive_format(template, markers)      # CallFormat, or raises NotDerivable("why")

Splits between literals are snapped to the edges of special markers (`<|tool_call_begin|>`, `[ARGS]`): a
character-level common suffix could otherwise cut `<|tool_calls_section_begin|>` into two pieces.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from zllm.dialects.derived import kwargs, notation
from zllm.dialects.derived.format import (
    ID_SLOT,
    INDEX_SLOT,
    KEY_SLOT,
    NAME_SLOT,
    SLOTS,
    STRICT_ID,
    CallFormat,
    json_lines,
    split_slot,
)
from zllm.dialects.derived.jinja import JinjaChatTemplate
from zllm.dialects.derived.param_probes import json_kind as _json_kind
from zllm.dialects.derived.param_probes import keyed_closer, typed_values, xml_item

USER = "zq-user"
USER_NEXT = "zq-user-next"
TEXT = "zq-text"
THINK = "zq-think"
NAME_A, NAME_B = "zqa", "zqb"
K1, K2, KN = "zqk1", "zqk2", "zqkn"
V1, V2, VN = "zq-v1", "zq-v2", 7

# each parameter described: Command R+'s template reads every parameter's description
PROBE_TOOLS = [
    {"type": "function", "function": {"name": NAME_A, "description": "probe a", "parameters": {
        "type": "object", "properties": {K1: {"type": "string", "description": "probe k1"},
                                         K2: {"type": "string", "description": "probe k2"}}, "required": [K1]}}},
    {"type": "function", "function": {"name": NAME_B, "description": "probe b", "parameters": {
        "type": "object", "properties": {KN: {"type": "integer", "description": "probe kn"}}, "required": [KN]}}},
]
_GENERIC_MARKER = re.compile(r"<[|｜][^<>]{0,60}?[|｜]>|<[^<>\s]{1,40}>|\[[A-Z_]{2,30}\]")


class NotDerivable(ValueError):
    """The template's calls cannot be described (or do not come back the same way): the reason, in words."""


class _NotExtended(NotDerivable):
    """A turn the template renders does not start with its generation prompt (`_Prober._drops_reasoning`)."""


def call(name: str, arguments: dict, index: int = 0, call_id: str = "") -> dict:
    # nine letters and digits: the one id shape every template takes (Mistral's insist on it)
    return {"id": call_id or _probe_id(index), "type": "function", "function": {"name": name, "arguments": arguments}}


def _probe_id(index: int) -> str:
    return f"zqidaaaa{index}"


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


class _Prober:
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
            return self.template(_as_text(messages) if self.text_arguments else messages, tools=PROBE_TOOLS,
                                 add_generation_prompt=generation, **self.variables)
        except Exception as exc:  # jinja errors, raise_exception(...), a template that insists on its own shape
            failure = exc
        if not self.text_arguments and _as_text(messages) != messages:
            # a template that takes the arguments as JSON text (functionary v3.2 writes `'\n' + arguments`)
            try:
                text = self.template(_as_text(messages), tools=PROBE_TOOLS, add_generation_prompt=generation,
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
            raise _NotExtended("an assistant turn does not extend the generation prompt (the template renders "
                               "the last turn differently from how the model is prompted to write it)")
        return self._slots(full[len(self.gen):])

    def _without_trailing(self, full: str) -> str:
        if self.trailing and not full.endswith(self.trailing):
            raise NotDerivable("the block the template writes after the last message is not written after a turn")
        return full[:len(full) - len(self.trailing)]

    def _trailing_block(self) -> str:
        """A block the template writes after the last message, whatever that message is, and before the generation
        prompt (Command R+'s `<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Write 'Action:' ...` instruction): what a turn
        of text and a turn of calls both end with, from its first marker, that the conversation before them ends with
        too. The turns are read without it, after the generation prompt without it (`gen`); the next turn's prompt
        moves it after the new messages, so it cannot start with this one: the cache forks at each turn, as the load
        check says. "" where the template writes none."""
        base = self._render([{"role": "user", "content": USER}], generation=False)
        if not self.gen.startswith(base):
            return ""
        opener = self.gen[len(base):]
        turns = [self._render([{"role": "user", "content": USER}, {"role": "assistant", **message}], generation=False)
                 for message in ({"content": TEXT}, {"content": "", "tool_calls": [call(NAME_A, {K1: V1})]})]
        shared = self._common_suffix(*turns)
        spans = self._marker_spans(shared)
        block = shared[spans[0][0]:] if spans else ""
        if not block or not base.endswith(block):
            return ""
        head = base[:len(base) - len(block)] + opener
        if not opener or not all(turn.startswith(head) for turn in turns):
            return ""
        self.gen = head
        return block

    @staticmethod
    def _slots(turn: str) -> str:
        # a call id the template writes is what the model invents: a slot in the format, not literal text
        return turn.replace(_probe_id(0), ID_SLOT).replace(_probe_id(1), ID_SLOT)

    def _drops_reasoning(self) -> bool:
        """Whether the template renders the turns it prompts for without the reasoning block its generation prompt
        opens or closes (Nemotron Nano v2's `<think>\n`, Command R7B's `<|START_THINKING|><|END_THINKING|>`, the R1
        distills'): the turns are then read as the template writes them once the conversation goes on, after the
        block (`_turn_in_history`). The next prompt cannot start with this one there: the cache forks at each turn,
        as the load check says."""
        try:
            self.turn(content=TEXT)
            self.turn(tool_calls=[call(NAME_A, {K1: V1})])
        except _NotExtended:
            pass
        except NotDerivable:
            return False
        else:
            return False
        self.reasoning_dropped = True
        try:
            self._framing = self._after_turns()
            self.turn(content=TEXT)
        except NotDerivable:
            self.reasoning_dropped = False
            return False
        return True

    def _turn_in_history(self, message: dict) -> str:
        """What the model writes for `message`, read from a conversation that goes on after it (a user speaks
        next): the generation prompt's reasoning block closed where the prompt opened it (the model writes its
        reasoning, the closer, then the turn), nothing where the prompt closed it; the turn as the template writes
        it, up to its end of turn."""
        full = self._history(message)
        shared = self._common_prefix(self.gen, full)
        end = len(full) - len(self._framing) if full.endswith(self._framing) else -1
        if not shared or end < len(shared):
            raise NotDerivable("an assistant turn does not extend the generation prompt, even once the conversation "
                               "goes on")
        turn = full[len(shared):end]
        if THINK in turn:  # the turn's reasoning written where the prompt opened it (Apriel 1.6): the model's own
            return turn
        return self._closer_of(self.gen[len(shared):]) + turn

    def _closer_of(self, dropped: str) -> str:
        """How the model closes the block the prompt left in `dropped` (what the prompt has and the turn does not):
        "" for an empty block the prompt closed itself, the opener's closer (`</think>`, spelled in the template)
        for one it left open."""
        spans = [dropped[a:b] for a, b in dict.fromkeys(self._marker_spans(dropped))]
        if not dropped.strip():
            return ""
        if not spans:
            return self._text_closer(dropped)
        if "".join(spans).strip() != "".join(dropped.split()) or len(spans) not in (1, 2):
            raise NotDerivable(f"the template drops {dropped!r} of its generation prompt from the turn it renders")
        if len(spans) == 2:
            return ""  # an empty reasoning block, opened and closed by the prompt
        opener = spans[0]
        # the marker the template closes reasoning with where it writes some (Cohere2MoE's `<|END_THINKING|>`), else
        # the opener's closing tag where the template reads it (the R1 distills split the content at `</think>`)
        written = self._history({"role": "assistant", "content": TEXT, "reasoning_content": THINK})
        after = written[written.find(THINK) + len(THINK):] if opener + THINK in written.replace(opener + "\n", opener) \
            else ""
        closers = [after[a:b] for a, b in self._marker_spans(after) if not after[:a].strip()]
        tag = opener.startswith("<") and not opener.startswith("</")
        closer = closers[0] if closers else "</" + opener[1:] if tag else ""
        if not closer or closer not in self.template.source:
            raise NotDerivable(f"the generation prompt opens {opener!r}, which the template never closes")
        return closer

    def _text_closer(self, dropped: str) -> str:
        """The closer of a reasoning block the prompt opens with text, no marker (Apriel 1.6's `Here are my
        reasoning steps:\n`): what the template writes between a turn's reasoning and its text, where it writes
        that reasoning right where the prompt left off (in the last turn: Apriel 1.6 drops it from earlier ones)."""
        written = self._render([{"role": "user", "content": USER},
                                {"role": "assistant", "content": TEXT, "reasoning_content": THINK}], generation=False)
        shared = self._common_prefix(self.gen, written)
        turn = written[len(shared):]
        if not turn.startswith(THINK) or TEXT not in turn or not turn[len(THINK):turn.index(TEXT)].strip():
            raise NotDerivable(f"the template drops {dropped!r} of its generation prompt from the turn it renders")
        return turn[len(THINK):turn.index(TEXT)]

    def _history(self, message: dict) -> str:
        return self._render([{"role": "user", "content": USER}, message, {"role": "user", "content": USER_NEXT}],
                            generation=False)

    def _after_turns(self) -> str:
        """The framing after an assistant's turn once the conversation goes on: what a turn of text and a turn of
        calls are both followed by, after the first marker of it (their end of turn: `<|im_end|>`, `\n<SPECIAL_12>`,
        Command R7B's `<|END_OF_TURN_TOKEN|>`, each the model's own)."""
        text, calls = (self._history({"role": "assistant", "content": content, **extra})
                       for content, extra in ((TEXT, {}), ("", {"tool_calls": [call(NAME_A, {K1: V1})]})))
        shared = self._common_suffix(text, calls)
        spans = self._marker_spans(shared)
        if not spans or USER_NEXT not in shared:
            raise NotDerivable("an assistant turn does not end on a marker once the conversation goes on")
        return shared[spans[0][1]:]

    # ---------------------------------------------------------------------------------- derivation

    def derive(self) -> CallFormat:
        try:
            self.turn(content=TEXT)
        except _NotExtended:
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
            fmt = _replace(fmt, content_lead=lead)
        if fmt.end_opens_calls and not fmt.text_close:
            fmt = _replace(fmt, text_close=fmt.turn_end)  # GigaChat 3: after text, the marker closes it
        return _replace(fmt, text_lead=self._text_lead, text_arguments=self.text_arguments, after_last=self.trailing)

    def _split_text_lead(self, lead: str, calling: str) -> str:
        """The lead a turn of calls shares with a turn of text; the rest of the text's lead is the text's own
        (format.py `text_lead`: Solar Open's `<|content|>`, functionary v3.2's `all\\n`). Where they part inside a
        recipient (muse-glimmer's ` to=user<|message|>` against ` to=NAME<|message|>`), the whole lead is the
        text's and the calls open with their own ` to=`."""
        if calling.startswith(lead):
            return lead
        shared = self._common_prefix(lead, calling)
        if not any(end == len(shared) for _, end in self._marker_spans(lead)):
            shared = ""
        self._text_lead = lead[len(shared):]
        return shared

    def _with_history_ids(self, fmt: CallFormat) -> CallFormat:
        """A template that writes each call's id once results follow, not in the turn the model writes (Apriel
        1.5): the history's closer, with the id as a slot, is the call's closer; the turn's own stays readable."""
        if fmt.arguments != "json" or fmt.single_call or any(s in fmt.call_close for s in SLOTS):
            return fmt
        arguments = _json_text({K1: V1})
        calling = {"role": "assistant", "content": "", "tool_calls": [call(NAME_A, {K1: V1})]}
        result = {"role": "tool", "content": "zq-result", "tool_call_id": _probe_id(0), "name": NAME_A}
        history = self._render([{"role": "user", "content": USER}, calling, result], generation=False)
        at = history.find(NAME_A + fmt.name_close + arguments)
        if at == -1:
            return fmt
        after = history[at + len(NAME_A + fmt.name_close + arguments):]
        if after.startswith(fmt.call_close) or _probe_id(0) not in after:
            return fmt
        head, _, rest = after.partition(_probe_id(0))
        closer = head + ID_SLOT + rest[:rest.find(fmt.call_close) + len(fmt.call_close)] if fmt.call_close in rest \
            else ""
        if not closer:
            return fmt
        return _replace(fmt, call_close=closer, bare_call_close=fmt.call_close)

    def _with_last_turn_ids(self, fmt: CallFormat) -> CallFormat:
        """Where the turns were read once the conversation goes on (`_drops_reasoning`) with the call's id after its
        arguments, and the template writes the last turn without it (Apriel 1.6, as its instructions show the model):
        the closer without the id reads back too (`bare_call_close`, as Apriel 1.5's)."""
        if not self.reasoning_dropped or fmt.arguments != "json" or ID_SLOT not in fmt.call_close \
                or not fmt.section_close:
            return fmt
        calling = {"role": "assistant", "content": "", "tool_calls": [call(NAME_A, {K1: V1})]}
        last = self._render([{"role": "user", "content": USER}, calling], generation=False)
        written = NAME_A + fmt.name_close + _json_text({K1: V1})
        if written not in last or _probe_id(0) in last:
            return fmt
        closer = last[last.index(written) + len(written):].partition(fmt.section_close)[0]
        return _replace(fmt, bare_call_close=closer) if closer and not any(s in closer for s in SLOTS) else fmt

    def _with_slot(self, fmt: CallFormat) -> CallFormat:
        """Where the call's id (or index) is written, and which ids the template accepts."""
        slots = {slot for literal in (fmt.section_open, fmt.call_open, fmt.name_close, fmt.call_close, fmt.call_sep,
                                      fmt.section_close, fmt.param_open, fmt.param_mid, fmt.param_close,
                                      fmt.content_sep, fmt.think_open, fmt.think_close, fmt.turn_end)
                 for slot in SLOTS if slot in literal}
        if not slots:
            return fmt
        # before the name (Solar Open's `<|tool_call:begin|>ID<|tool_call:name|>`), after it, or after the arguments
        held = [name for name in ("name_close", "call_close", "call_open")
                if any(s in getattr(fmt, name) for s in slots)]
        if len(slots) > 1 or len(held) != 1 or (fmt.tagged and held != ["name_close"]) or any(
                getattr(fmt, name).count(next(iter(slots))) != 1 for name in held) or (
                held == ["call_open"] and not split_slot(fmt.call_open)[0]):
            raise NotDerivable("the call's id or index is written where zllm cannot read it back (only once, "
                               "after the call's opening marker, after the name, or after the arguments of a JSON "
                               "call)")
        slot = next(iter(slots))
        pattern = ""
        if slot == ID_SLOT:
            try:
                self.turn(tool_calls=[call(NAME_A, {K1: V1}, call_id="call_zq_long")])
            except NotDerivable:
                pattern = STRICT_ID
        return _replace(fmt, slot=slot, id_pattern=pattern)

    def _body(self, turn: str, lead: str) -> str:
        if not turn.startswith(lead):
            raise NotDerivable(f"a turn with calls does not start like a turn with text ({lead!r})")
        return turn[len(lead):]

    def _notation(self, lead: str) -> dict | None:
        """The quoting rule of a template that writes arguments as an object in its own notation (notation.py),
        found by probing with a value of each JSON type; None when the arguments are not written so."""
        def body(arguments: dict) -> str:
            turn = self._body(self.turn(tool_calls=[call(NAME_A, arguments)]), lead)
            return turn[_find(turn, NAME_A) + len(NAME_A):]

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
            return turn[_find(turn, NAME_A) + len(NAME_A):]

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
            (lambda value: json_lines(value, *layout)) if layout else _json_text
        a1, a2 = {K1: V1}, {KN: VN}
        one = self._body(self.turn(tool_calls=[call(NAME_A, a1)]), lead)
        n1 = _find(one, NAME_A)
        s1 = _find(one, _json(a1), n1)
        name_close = one[n1 + len(NAME_A):s1]
        before, after = one[:n1], one[s1 + len(_json(a1)):]
        try:
            two = self._body(self.turn(tool_calls=[call(NAME_A, a1), call(NAME_B, a2, 1)]), lead)
        except NotDerivable:  # a family that calls one tool per turn (Llama 3.x refuses two)
            return self._single_call(before, after, tail, name_close=name_close)
        if NAME_B not in two[s1:] and two == one:
            # the template writes only the first of two calls (GigaChat 3 renders `tool_calls[0]`): one per turn
            return self._single_call(before, after, tail, name_close=name_close)
        n2 = _find(two, NAME_B, s1)
        mid = two[s1 + len(_json(a1)):n2]
        second_close = two[n2 + len(NAME_B):].partition(_json(a2))[0]
        if second_close != name_close:
            name_close = _indexed(name_close, second_close)
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
        n = _find(two_params, NAME_A)
        k1 = _find(two_params, K1, n)
        v1 = _find(two_params, V1, k1)
        k2 = _find(two_params, K2, v1)
        v2 = _find(two_params, V2, k2)
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
        after_one = one[_find(one, V1) + len(V1) + len(close(K1)):]
        none = self._body(self.turn(tool_calls=[call(NAME_A, {})]), lead)
        after_none = none[_find(none, NAME_A) + len(NAME_A):].replace(NAME_A, NAME_SLOT, 1)
        if after_none != name_close + after_one:
            raise NotDerivable("a call without arguments is not written as the same call minus its parameters")
        parts = {"param_open": param_open, "param_mid": param_mid, "param_close": param_close}
        if KEY_SLOT in param_close:
            parts, name_close, after_one = keyed_closer(parts, name_close, after_one)
        wrap = self._wrapping(parts["param_mid"], close(K1))
        draft = CallFormat("", "", name_close, "", "", "", "tagged", **parts)
        typed = typed_values(lambda value: self._written(lead, draft, value), draft)
        draft = _replace(draft, **typed)
        two = self._body(self.turn(tool_calls=[call(NAME_A, {K1: V1}), call(NAME_B, {KN: VN}, 1)]), lead)
        first_end = _find(two, V1) + len(V1) + len(draft.close_of(K1))
        n2 = _find(two, NAME_B, first_end)
        second_close = two[n2 + len(NAME_B):].partition(draft.param_open + KN)[0].replace(NAME_B, NAME_SLOT, 1)
        if second_close != name_close:
            name_close = _indexed(name_close, second_close)  # Kimi K3's `index="1"` / `index="2"`
        number = f"{second_close}{draft.param_open}{KN}{draft.mid_of('integer')}{VN}{draft.close_of(KN)}"
        number = number.replace(NAME_SLOT, NAME_B)  # as written: the name again where the template repeats it
        if not two[n2 + len(NAME_B):].startswith(number):
            raise NotDerivable("a number parameter is not written as its JSON text in the same markup")
        fmt = self._frame(one[:_find(one, NAME_A)], two[first_end:n2], after_one,
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
        return _replace(fmt, section_open=fmt.section_open + marker, name_close=fmt.name_close + marker,
                        param_close=fmt.param_close + marker, call_close=fmt.call_close[len(marker):] + marker,
                        call_open=fmt.call_open[len(marker):], param_open=fmt.param_open[len(marker):],
                        section_close=fmt.section_close[len(marker):])

    def _written(self, lead: str, draft: CallFormat, value) -> str | None:
        """How a tagged call writes `value` for parameter KN: from after the key to the parameter's closer
        (the type word's joiner included); None where the template leaves the parameter out (null)."""
        turn = self._body(self.turn(tool_calls=[call(NAME_B, {KN: value})]), lead)
        start = turn.find(draft.param_open + KN, _find(turn, NAME_B))
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
            start = _find(turn, K1 + param_mid) + len(K1 + param_mid)
            return turn[start:_find(turn, param_close, start + len(value))]

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
        before, mid, call_open = _index_before_name(before, mid, call_open, self._common_suffix)
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

    def _text_close(self, tail: str, calls: str) -> tuple[str, str]:
        """(text_close, turn_end) of a turn with text: where the tail's first marker is one the calls' markup
        uses too (Kimi K3's `<|close|>`), it frames the text and cannot end the turn: the turn ends at the first
        marker that is not, the markup before it closes the text (format.py `text_close`)."""
        structural = {calls[a:b] for a, b in self._marker_spans(calls)}
        spans = self._marker_spans(tail)
        if not spans or tail[spans[0][0]:spans[0][1]] not in structural:
            return "", self._turn_end(tail)
        end = next(((a, b) for a, b in spans if tail[a:b] not in structural), None)
        if end is None:
            return "", self._turn_end(tail)
        return tail[:end[0]], tail[end[0]:end[1]]

    def _turn_end(self, tail: str) -> str:
        """What ends a turn as the model writes it: the tail after the text up to and including its first marker
        (the framing after it — a newline before the next turn — is the template's, not the model's)."""
        for match in self._marker_spans(tail):
            return tail[:match[1]]
        return tail

    def _with_content(self, fmt: CallFormat, lead: str) -> CallFormat:
        turn = self._body(self.turn(content=TEXT, tool_calls=[call(NAME_A, {K1: V1})]), lead)
        # up to the call's index where it is written before the name (the turn holds the number, `0`)
        opener = fmt.section_open + fmt.call_open + NAME_A
        opener = opener.partition(INDEX_SLOT)[0] if INDEX_SLOT in opener else opener
        if TEXT not in turn and turn.startswith(opener):  # the template drops text beside calls (Llama 3.x)
            return _replace(fmt, text_with_calls=False)
        if opener not in turn and turn == self._body(self.turn(content=TEXT), lead):
            # the template writes a turn's calls only where it has no text (llama.cpp's DeepSeek R1): a turn holds
            # text or calls, and render.py drops the text beside calls so the calls and their results stay
            return _replace(fmt, text_with_calls=False, calls_drop_text=True)
        if turn.startswith(opener) and TEXT in turn:  # the text after the calls (Gemma 4)
            without = self._body(self.turn(tool_calls=[call(NAME_A, {K1: V1})]), lead)
            end = fmt.call_turn_end or self._tail
            at = len(without) - len(end) if without.endswith(end) else -1
            if at < 0 or turn != without[:at] + TEXT + without[at:]:
                raise NotDerivable("text beside calls is written neither before nor right after them")
            return _replace(fmt, text_after_calls=True)
        if self._text_lead and turn.startswith(self._text_lead + TEXT):
            turn = turn[len(self._text_lead):]  # the text's own lead (functionary v3.2's `all\n`), then the text
        if not turn.startswith(TEXT) or opener not in turn:
            raise NotDerivable("text before calls is not written as the text, then the calls")
        return _replace(fmt, content_sep=turn[len(TEXT):turn.index(opener)])

    def _with_reasoning(self, fmt: CallFormat, lead: str, tail: str) -> CallFormat:
        try:
            turn = self.turn(content=TEXT, reasoning_content=THINK)
        except NotDerivable:  # reasoning written where the prompt closed it (`enable_thinking` off): none
            return fmt
        if THINK not in turn:  # Kimi K2 Thinking keeps reasoning only in turns that call tools
            try:
                with_call = self.turn(content=TEXT, reasoning_content=THINK, tool_calls=[call(NAME_A, {K1: V1})])
            except NotDerivable:  # written inside the block the prompt closed (Command R7B, thinking off): none
                with_call = turn
            turn = with_call if THINK in with_call and with_call.index(THINK) < with_call.find(TEXT) else turn
        if THINK not in turn:
            if not lead.strip():
                return fmt
            if self.reasoning_dropped:  # the lead closes the block the prompt opened (`_closer_of`): the model
                return _replace(fmt, think_close=lead, gen_in_think=True)  # starts inside it
            first = _leading_marker(lead, self)
            if first.startswith("</") and self.gen.rstrip().endswith("<" + first[2:]):
                # the prompt opened the block and the template drops what was in it (DeepSeek V3.1, thinking on)
                return _replace(fmt, think_close=lead, gen_in_think=True)
            return _replace(fmt, think_open=first, think_close=lead)
        think_open, rest = turn.split(THINK, 1)
        if TEXT not in rest:
            raise NotDerivable("reasoning and text are not written one after the other")
        opener = (fmt.section_open + fmt.call_open).partition(INDEX_SLOT)[0]
        # reasoning ends where the text or the calls begin (Gemma 4 writes its calls before the text)
        think_close = rest[:min(rest.index(TEXT), rest.index(opener) if opener and opener in rest else len(rest))]
        if self._text_lead and think_close.endswith(self._text_lead) and think_close != self._text_lead:
            think_close = think_close[:-len(self._text_lead)]  # the text's own lead (Cohere2MoE's `<|START_TEXT|>`)
        if lead and lead == think_close and think_open:
            # a turn without reasoning opens with the closer alone (MiniMax M3's `</mm:think>`)
            return _replace(fmt, think_open=think_open, think_close=think_close, empty_think=True)
        if lead and lead not in (think_open + think_close, THINK + think_close):
            raise NotDerivable(f"a turn without reasoning starts with {lead!r}, not an empty reasoning block")
        return _replace(fmt, think_open=think_open, think_close=think_close, gen_in_think=not think_open)

    # ---------------------------------------------------------------------------------- splitting

    def _marker_spans(self, text: str) -> list[tuple[int, int]]:
        spans = []
        for marker in self.markers:
            at = text.find(marker)
            while at != -1:
                spans.append((at, at + len(marker)))
                at = text.find(marker, at + 1)
        spans += [m.span() for m in _GENERIC_MARKER.finditer(text)]
        return sorted(spans)

    def _inside_marker(self, text: str, at: int) -> int | None:
        """The start of a marker that position `at` cuts through, else None."""
        for start, end in self._marker_spans(text):
            if start < at < end:
                return start
        return None

    def _common_suffix(self, a: str, b: str) -> str:
        size = 0
        while size < min(len(a), len(b)) and a[-1 - size] == b[-1 - size]:
            size += 1
        while size:
            cut_a, cut_b = self._inside_marker(a, len(a) - size), self._inside_marker(b, len(b) - size)
            if cut_a is None and cut_b is None:
                break
            size -= 1
        return a[len(a) - size:]

    def _common_prefix(self, a: str, b: str) -> str:
        size = 0
        while size < min(len(a), len(b)) and a[size] == b[size]:
            size += 1
        while size and (self._inside_marker(a, size) is not None or self._inside_marker(b, size) is not None):
            size -= 1
        return a[:size]


def _index_before_name(before: str, mid: str, call_open: str, common_suffix) -> tuple[str, str, str]:
    """(before, mid, call_open) with the call's index as a slot where the two calls' openers differ only in a number
    written before the name (Command R7B's `{"tool_call_id": "0", "tool_name": "` / `"1", ...`: counted from 0),
    the opener then reaching back over the text before the index; unchanged where they do not."""
    cut_before, cut_mid = before[:len(before) - len(call_open)], mid[:len(mid) - len(call_open)]
    if not (cut_before[-1:].isdigit() and cut_mid[-1:].isdigit()):
        return before, mid, call_open
    if (cut_before[-1], cut_mid[-1]) not in (("0", "1"), ("1", "2")) or cut_before[-2:-1].isdigit() \
            or cut_mid[-2:-1].isdigit():
        raise NotDerivable("the calls' openers differ in a number before the name that does not count them")
    head = common_suffix(cut_before[:-1], cut_mid[:-1])
    if not head:
        raise NotDerivable("the call's index is written before its name with nothing opening the call before it")
    opener = head + INDEX_SLOT + call_open
    index_at = len(cut_before) - 1 - len(head)
    return (cut_before[:index_at] + opener, cut_mid[:len(cut_mid) - 1 - len(head)] + opener, opener)


def _indexed(first: str, second: str) -> str:
    """The first call's name closer with the call's index as a slot (Kimi K2's `:0<|...|>` / `:1<|...|>`)."""
    if len(first) == len(second):
        differ = [i for i, (a, b) in enumerate(zip(first, second)) if a != b]
        # counted from 0 (Kimi K2) or from 1 (Kimi K3's `index="1"`)
        if len(differ) == 1 and (first[differ[0]], second[differ[0]]) in (("0", "1"), ("1", "2")):
            return first[:differ[0]] + INDEX_SLOT + first[differ[0] + 1:]
    raise NotDerivable("the second call's name and arguments are not joined like the first's")


def _as_text(messages: list[dict]) -> list[dict]:
    """The conversation with each call's arguments as their JSON text."""
    def call_as_text(tool_call: dict) -> dict:
        arguments = tool_call["function"]["arguments"]
        if isinstance(arguments, str):
            return tool_call
        return {**tool_call, "function": {**tool_call["function"], "arguments": _json_text(arguments)}}

    return [{**m, "tool_calls": [call_as_text(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m
            for m in messages]


def _leading_marker(lead: str, prober: _Prober) -> str:
    spans = prober._marker_spans(lead)
    return lead[:spans[0][1]] if spans else ""


def _json_text(arguments: dict) -> str:
    return json.dumps(arguments, ensure_ascii=False)


def _find(text: str, needle: str, start: int = 0) -> int:
    at = text.find(str(needle), start)
    if at == -1:
        raise NotDerivable(f"{needle!r} is missing where the probe expects it")
    return at


def _replace(fmt: CallFormat, **changes) -> CallFormat:
    from dataclasses import replace

    return replace(fmt, **changes)


def split_markers(literal: str, markers: tuple[str, ...] = ()) -> list[str]:
    """`literal` cut before and after every special marker in it (the vocabulary's added tokens where known,
    else anything that looks like one): `"\\n<tool_call>\\n<function="` → `["\\n", "<tool_call>", "\\n<function="]`."""
    spans = _marker_spans_in(literal, tuple(sorted(set(markers), key=len, reverse=True)))
    pieces, at = [], 0
    for start, end in spans:
        if start < at:
            continue
        pieces += [literal[at:start], literal[start:end]]
        at = end
    pieces.append(literal[at:])
    return [piece for piece in pieces if piece]


def _marker_spans_in(text: str, markers: tuple[str, ...]) -> list[tuple[int, int]]:
    spans = []
    for marker in markers:
        at = text.find(marker)
        while at != -1:
            spans.append((at, at + len(marker)))
            at = text.find(marker, at + 1)
    if not markers:
        spans += [m.span() for m in _GENERIC_MARKER.finditer(text)]
    return sorted(spans, key=lambda span: (span[0], -span[1]))
