"""The turns of a template that rewrites its generation prompt in the turns it renders (probe.py): the reasoning
block the prompt opens or closes and the turn drops (Nemotron Nano v2, Command R7B, the R1 distills, Apriel 1.6),
or a block it writes after the last message (Command R+'s `Action:` instruction). The turns are then read once the
conversation goes on, or without the block."""

from __future__ import annotations

from zllm.dialects.derived.probe_terms import (
    K1,
    NAME_A,
    TEXT,
    THINK,
    USER,
    USER_NEXT,
    V1,
    NotDerivable,
    NotExtended,
    call,
)


class Rewrites:
    """Mixed into probe.py's prober: `gen`, `trailing`, `reasoning_dropped`, `_framing`, `turn`, `_render` and the
    marker comparisons (probe_markers.py) are its."""

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

    def _drops_reasoning(self) -> bool:
        """Whether the template renders the turns it prompts for without the reasoning block its generation prompt
        opens or closes (Nemotron Nano v2's `<think>\n`, Command R7B's `<|START_THINKING|><|END_THINKING|>`, the R1
        distills'): the turns are then read as the template writes them once the conversation goes on, after the
        block (`_turn_in_history`). The next prompt cannot start with this one there: the cache forks at each turn,
        as the load check says."""
        try:
            self.turn(content=TEXT)
            self.turn(tool_calls=[call(NAME_A, {K1: V1})])
        except NotExtended:
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
