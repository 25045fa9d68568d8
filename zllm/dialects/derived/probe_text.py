"""A turn's text and reasoning beside its calls (probe.py): the text's own lead, the separator before the calls,
text the template drops beside calls (or calls it drops beside text), text after the calls, the reasoning block,
and what ends a turn."""

from __future__ import annotations

from zllm.dialects.derived.format import INDEX_SLOT, CallFormat
from zllm.dialects.derived.probe_markers import MarkerSpans
from zllm.dialects.derived.probe_terms import K1, NAME_A, TEXT, THINK, V1, NotDerivable, call, changed


class TextLeads:
    """Mixed into probe.py's prober (`_text_lead`, `_tail`, `gen`, `reasoning_dropped`, `turn`, `_body` and the
    marker comparisons are its)."""

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

    def _with_content(self, fmt: CallFormat, lead: str) -> CallFormat:
        turn = self._body(self.turn(content=TEXT, tool_calls=[call(NAME_A, {K1: V1})]), lead)
        # up to the call's index where it is written before the name (the turn holds the number, `0`)
        opener = fmt.section_open + fmt.call_open + NAME_A
        opener = opener.partition(INDEX_SLOT)[0] if INDEX_SLOT in opener else opener
        if TEXT not in turn and turn.startswith(opener):  # the template drops text beside calls (Llama 3.x)
            return changed(fmt, text_with_calls=False)
        if opener not in turn and turn == self._body(self.turn(content=TEXT), lead):
            # the template writes a turn's calls only where it has no text (llama.cpp's DeepSeek R1): a turn holds
            # text or calls, and render.py drops the text beside calls so the calls and their results stay
            return changed(fmt, text_with_calls=False, calls_drop_text=True)
        if turn.startswith(opener) and TEXT in turn:  # the text after the calls (Gemma 4)
            without = self._body(self.turn(tool_calls=[call(NAME_A, {K1: V1})]), lead)
            end = fmt.call_turn_end or self._tail
            at = len(without) - len(end) if without.endswith(end) else -1
            if at < 0 or turn != without[:at] + TEXT + without[at:]:
                raise NotDerivable("text beside calls is written neither before nor right after them")
            return changed(fmt, text_after_calls=True)
        if self._text_lead and turn.startswith(self._text_lead + TEXT):
            turn = turn[len(self._text_lead):]  # the text's own lead (functionary v3.2's `all\n`), then the text
        if not turn.startswith(TEXT) or opener not in turn:
            raise NotDerivable("text before calls is not written as the text, then the calls")
        return changed(fmt, content_sep=turn[len(TEXT):turn.index(opener)])

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
                return changed(fmt, think_close=lead, gen_in_think=True)  # starts inside it
            first = _leading_marker(lead, self)
            if first.startswith("</") and self.gen.rstrip().endswith("<" + first[2:]):
                # the prompt opened the block and the template drops what was in it (DeepSeek V3.1, thinking on)
                return changed(fmt, think_close=lead, gen_in_think=True)
            return changed(fmt, think_open=first, think_close=lead)
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
            return changed(fmt, think_open=think_open, think_close=think_close, empty_think=True)
        if lead and lead not in (think_open + think_close, THINK + think_close):
            raise NotDerivable(f"a turn without reasoning starts with {lead!r}, not an empty reasoning block")
        return changed(fmt, think_open=think_open, think_close=think_close, gen_in_think=not think_open)

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


def _leading_marker(lead: str, prober: MarkerSpans) -> str:
    spans = prober._marker_spans(lead)
    return lead[:spans[0][1]] if spans else ""
