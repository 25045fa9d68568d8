"""What varies per call and is not markup (probe.py): the call's id the model invents, where the template writes
it (after the opener, the name or the arguments; in earlier turns only), and the call's index."""

from __future__ import annotations

from zllm.dialects.derived.format import ID_SLOT, INDEX_SLOT, SLOTS, STRICT_ID, CallFormat, split_slot
from zllm.dialects.derived.probe_terms import K1, NAME_A, USER, V1, NotDerivable, call, changed, json_text, probe_id


class Slots:
    """Mixed into probe.py's prober (`reasoning_dropped`, `turn`, `_render` are its)."""

    def _with_history_ids(self, fmt: CallFormat) -> CallFormat:
        """A template that writes each call's id once results follow, not in the turn the model writes (Apriel
        1.5): the history's closer, with the id as a slot, is the call's closer; the turn's own stays readable."""
        if fmt.arguments != "json" or fmt.single_call or any(s in fmt.call_close for s in SLOTS):
            return fmt
        arguments = json_text({K1: V1})
        calling = {"role": "assistant", "content": "", "tool_calls": [call(NAME_A, {K1: V1})]}
        result = {"role": "tool", "content": "zq-result", "tool_call_id": probe_id(0), "name": NAME_A}
        history = self._render([{"role": "user", "content": USER}, calling, result], generation=False)
        at = history.find(NAME_A + fmt.name_close + arguments)
        if at == -1:
            return fmt
        after = history[at + len(NAME_A + fmt.name_close + arguments):]
        if after.startswith(fmt.call_close) or probe_id(0) not in after:
            return fmt
        head, _, rest = after.partition(probe_id(0))
        closer = head + ID_SLOT + rest[:rest.find(fmt.call_close) + len(fmt.call_close)] if fmt.call_close in rest \
            else ""
        if not closer:
            return fmt
        return changed(fmt, call_close=closer, bare_call_close=fmt.call_close)

    def _with_last_turn_ids(self, fmt: CallFormat) -> CallFormat:
        """Where the turns were read once the conversation goes on (`_drops_reasoning`) with the call's id after its
        arguments, and the template writes the last turn without it (Apriel 1.6, as its instructions show the model):
        the closer without the id reads back too (`bare_call_close`, as Apriel 1.5's)."""
        if not self.reasoning_dropped or fmt.arguments != "json" or ID_SLOT not in fmt.call_close \
                or not fmt.section_close:
            return fmt
        calling = {"role": "assistant", "content": "", "tool_calls": [call(NAME_A, {K1: V1})]}
        last = self._render([{"role": "user", "content": USER}, calling], generation=False)
        written = NAME_A + fmt.name_close + json_text({K1: V1})
        if written not in last or probe_id(0) in last:
            return fmt
        closer = last[last.index(written) + len(written):].partition(fmt.section_close)[0]
        return changed(fmt, bare_call_close=closer) if closer and not any(s in closer for s in SLOTS) else fmt

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
        return changed(fmt, slot=slot, id_pattern=pattern)


def index_before_name(before: str, mid: str, call_open: str, common_suffix) -> tuple[str, str, str]:
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


def indexed(first: str, second: str) -> str:
    """The first call's name closer with the call's index as a slot (Kimi K2's `:0<|...|>` / `:1<|...|>`)."""
    if len(first) == len(second):
        differ = [i for i, (a, b) in enumerate(zip(first, second)) if a != b]
        # counted from 0 (Kimi K2) or from 1 (Kimi K3's `index="1"`)
        if len(differ) == 1 and (first[differ[0]], second[differ[0]]) in (("0", "1"), ("1", "2")):
            return first[:differ[0]] + INDEX_SLOT + first[differ[0] + 1:]
    raise NotDerivable("the second call's name and arguments are not joined like the first's")
