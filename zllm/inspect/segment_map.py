"""The whole rendered prompt cut into named segments: which tokens are the system block, each tool's schema,
each message, the generation prompt. `count-tokens` sums them; `explain-miss` names the one a divergence
falls in.

    system block        tokens [0, 9)         <|im_start|>system\\nYou are terse.
    tools               tokens [9, 45)        \\n\\n# Tools … <tools>\\n
    tool 0 (Bash)       tokens [45, 98)       {"type": "function", "function": {"name": "Bash", …}}\\n
    tool 1 (Read)       tokens [98, 140)
    tools               tokens [140, 183)     </tools>\\n\\nFor each function call, …
    system block        tokens [183, 185)     <|im_end|>\\n
    message 1 (user)    tokens [185, 196)     <|im_start|>user\\nList files.<|im_end|>\\n
    generation prompt   tokens [196, 199)     <|im_start|>assistant\\n

The same method as zllm/prompt/segments.py (which names one index for the daemon's near-miss log): render
prefixes of the conversation, `messages[:k]` without the generation prompt, and see how many characters each
shares with the full prompt; message k-1 ends there. Here every prefix is rendered once (n template runs, a
few ms each) to get all boundaries at once. Tools: rendering without them gives the tool text as whatever
the two renders do not share; rendering with `tools[:j]` gives where tool j starts (the text first differs
there), and the length the last / first tool adds fixes the ends of the run of schemas. With a single tool
the template's tool preamble counts as that tool.

Approximate where templates are: a template that renders a message differently once later messages exist
moves a boundary by a few tokens; a token belongs where its first character is; a prefix the template
refuses widens a segment to a range ("messages 3-5"). Message numbers are indexes into
`ChatRequest.messages`; a per-session line the renderer drops (cache_busters.py) owns no tokens.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass
from typing import Literal

from zllm.canonical import ChatRequest, FunctionTool, Message, ToolChoice
from zllm.prompt.segments import kept_messages

SYSTEM_BLOCK = "system block"
TOOLS = "tools"
GENERATION_PROMPT = "generation prompt"

Kind = Literal["system", "message", "messages", "tools", "tool", "generation"]


@dataclass(frozen=True)
class Label:
    kind: Kind
    name: str
    # ChatRequest.messages index (system / message / first of messages) or ChatRequest.tools index (tool)
    index: int | None = None


@dataclass(frozen=True)
class Segment:
    label: Label
    start: int  # first token
    stop: int  # one past the last token

    @property
    def name(self) -> str:
        return self.label.name

    @property
    def tokens(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class SegmentMap:
    """Contiguous runs of tokens covering [0, total); one label may own several runs (system, tools, system)."""

    segments: tuple[Segment, ...]
    total: int

    def __post_init__(self) -> None:
        assert all(a.stop == b.start for a, b in zip(self.segments, self.segments[1:])), "runs must be contiguous"
        assert not self.segments or (self.segments[0].start == 0 and self.segments[-1].stop == self.total)

    def at(self, token: int) -> Segment | None:
        if not 0 <= token < self.total:
            return None
        return self.segments[bisect.bisect_right([s.start for s in self.segments], token) - 1]


def map_segments(renderer, request: ChatRequest, total: int | None = None) -> SegmentMap:
    """Segments of `request`'s prompt as `renderer.render` builds it (`total`: its length, when known)."""
    kept, origin = kept_messages(request.messages)
    full = renderer.template_text(request, kept)
    starts = renderer.token_starts(full)
    message_starts, message_labels = _message_layer(renderer, request, kept, origin, full)
    tool_ranges = _tool_layer(renderer, request, kept, full) if request.tools else []
    tool_starts = [start for start, _, _ in tool_ranges]

    def label_at(char: int) -> Label:
        i = bisect.bisect_right(tool_starts, char) - 1
        if i >= 0 and char < tool_ranges[i][1]:
            return tool_ranges[i][2]
        return message_labels[max(0, bisect.bisect_right(message_starts, char) - 1)]

    labels = [label_at(char) for char in starts]
    return _runs(labels, len(labels) if total is None else total)


def message_name(index: int, message: Message, *, first: bool) -> str:
    """"system block" for a leading system message, else "message 3 (user)" (the words segments.py uses)."""
    if message.role == "system" and first:
        return SYSTEM_BLOCK
    role = {"tool": "tool result"}.get(message.role, message.role)
    if message.role == "assistant" and message.tool_calls:
        role = "assistant tool call"
    return f"message {index} ({role})"


def tool_name(index: int, tool: FunctionTool) -> str:
    return f"tool {index} ({tool.name})"


def _message_layer(renderer, request: ChatRequest, kept: tuple[Message, ...], origin: list[int],
                   full: str) -> tuple[list[int], list[Label]]:
    """(start character, label) of each message range and of the generation prompt."""
    points = [(0, 0)]  # (messages rendered, the character they end at), for every prefix the template accepts
    for k in range(1, len(kept) + 1):
        try:
            text = renderer.template_text(request, kept[:k], add_generation_prompt=False)
        except Exception:  # e.g. a template that insists on ending with a user turn: widen to a range
            continue
        points.append((k, max(points[-1][1], _shared(full, text))))
    starts = [char for _, char in points]
    labels = [_message_label(kept, origin, k1, k2) for (k1, _), (k2, _) in zip(points, points[1:])]
    last = points[-1][0]
    labels.append(Label("generation", GENERATION_PROMPT) if last == len(kept)
                  else _message_label(kept, origin, last, len(kept)))
    return starts, labels


def _message_label(kept: tuple[Message, ...], origin: list[int], first: int, stop: int) -> Label:
    if stop == first + 1:
        message = kept[first]
        kind = "system" if message.role == "system" and first == 0 else "message"
        return Label(kind, message_name(origin[first], message, first=first == 0), origin[first])
    return Label("messages", f"messages {origin[first]}-{origin[stop - 1]}", origin[first])


def _tool_layer(renderer, request: ChatRequest, kept: tuple[Message, ...], full: str) -> list[tuple[int, int, Label]]:
    """(start, stop, label) character ranges: the template's tool text and, inside it, each tool's schema."""
    tools = request.tools

    def with_tools(subset: tuple[FunctionTool, ...]) -> str:
        # tool_choice reset: a forced tool may be missing from the subset, and the template never sees it
        return renderer.template_text(dataclasses.replace(request, tools=subset, tool_choice=ToolChoice()), kept)

    try:
        prefixes = [with_tools(tools[:j]) for j in range(len(tools))]  # prefixes[0]: no tools at all
        without_first = with_tools(tools[1:]) if len(tools) > 1 else prefixes[0]
    except Exception:
        return []
    lo = _shared(full, prefixes[0])
    hi = len(full) - _shared(full[lo:][::-1], prefixes[0][lo:][::-1])
    if hi <= lo:
        return []  # the template does not render tools
    bounds = [lo]
    for text in prefixes[1:]:  # tool j starts where `tools[:j]` stops agreeing with the full prompt
        bounds.append(min(max(bounds[-1], _shared(full, text)), hi))
    if len(tools) == 1:
        return [(lo, hi, Label("tool", tool_name(0, tools[0]), 0))]
    # the first schema is as long as what dropping it removes; so is the last
    bounds[0] = min(max(lo, bounds[1] - (len(full) - len(without_first))), bounds[1])
    bounds.append(min(max(bounds[-1], bounds[-1] + len(full) - len(prefixes[-1])), hi))
    ranges = [(lo, bounds[0], Label("tools", TOOLS))]
    ranges += [(bounds[j], bounds[j + 1], Label("tool", tool_name(j, tool), j)) for j, tool in enumerate(tools)]
    ranges.append((bounds[-1], hi, Label("tools", TOOLS)))
    return [r for r in ranges if r[1] > r[0]]


def _runs(labels: list[Label], total: int) -> SegmentMap:
    """Runs of equal labels; a token count that differs from `total` (slow tokenizers) is absorbed at the end."""
    labels = labels[:total] + [labels[-1] if labels else Label("generation", GENERATION_PROMPT)] * (total - len(labels))
    segments: list[Segment] = []
    for i, label in enumerate(labels):
        if segments and segments[-1].label == label:
            segments[-1] = Segment(label, segments[-1].start, i + 1)
        else:
            segments.append(Segment(label, i, i + 1))
    return SegmentMap(tuple(segments), total)


def _shared(a: str, b: str) -> int:
    """Length of the common prefix: a binary search over C-level slice compares (prompts run to 100K+
    characters and are compared once per message)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
