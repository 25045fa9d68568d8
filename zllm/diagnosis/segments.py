"""Which part of a rendered prompt each token falls in: the system block, the tools (each tool's schema), each
message, the generation prompt. The one segmenter of the prompt, with two ways to ask it:

- `map_segments` cuts the whole prompt into runs (`zllm inspect count-tokens` sums them, `explain-miss` names
  the one a divergence falls in):

    system block        tokens [0, 9)         <|im_start|>system\\nYou are terse.
    tools               tokens [9, 45)        \\n\\n# Tools … <tools>\\n
    tool 0 (Bash)       tokens [45, 98)       {"type": "function", "function": {"name": "Bash", …}}\\n
    tool 1 (Read)       tokens [98, 140)
    tools               tokens [140, 183)     </tools>\\n\\nFor each function call, …
    system block        tokens [183, 185)     <|im_end|>\\n
    message 1 (user)    tokens [185, 196)     <|im_start|>user\\nList files.<|im_end|>\\n
    generation prompt   tokens [196, 199)     <|im_start|>assistant\\n

- `describe_position` names one token in coarser words ("system", "tools", "message 3 (user)") for the
  near-miss log (near_miss.py), which asks once per near miss, never per request: the cache layer that records
  near misses must not import this module, so the runtime hands it `position_describer`, a closure that costs
  nothing to create and renders only when called.

The renderer is zllm.prompt's `PromptRenderer`, seen through `TemplateRenderer` (the two calls used here): the
prompt package imports this package's busters, so this package never imports the prompt package.

How. A chat template renders the conversation as a whole, so message boundaries are found by rendering
prefixes of it, `messages[:k]` without the generation prompt, and counting how many leading characters each
shares with the full prompt's text: message k-1 ends there (`PromptLayout.message_end`). The map renders every
prefix; one position needs only a binary search over k, O(log n) template runs, so a long conversation's near
miss stays cheap to describe. The token index is mapped to its character by tokenizing the full text once with
offsets. The tools are found by rendering the whole prompt once more without them: the text between the
longest common prefix and the longest common suffix of the two renders is the tool text, wherever the template
puts it (inside the system block for Qwen, next to a user turn for others). Rendering with `tools[:j]` gives
where tool j starts (the text first differs there), and the length the last / first tool adds fixes the ends
of the run of schemas; with a single tool the template's tool preamble counts as that tool.

Approximate by nature:
- a template that renders a message differently once later messages exist (one that strips reasoning from all
  but the last assistant turn, one that closes a run of tool results only after the last of them) moves a
  boundary by a few tokens: the text that differs is attributed to the later message;
- a token that straddles a boundary belongs where its first character is (exact offsets need a fast
  tokenizer; a slow one's are estimated from each token's decoded length);
- whatever the template writes before the first message (BOS, a default system prompt) counts as message 0;
  the tokens that open a message (`<|im_start|>user\\n`) count as that message, the ones that close it as well;
- if the template rejects some prefix of the conversation (e.g. it must end with a user turn), the answer
  widens to a range ("messages 3-5");
- a template that rewrites text around the tools as well as inserting them (a different default system
  prompt, say) makes the tool text cover that text too.

Message numbers are 0-based indexes into the canonical `ChatRequest.messages` (a system prompt sent as
Anthropic's `system` or Responses' `instructions` is message 0 there); a leading system message is the system
block. A message that cache-buster stripping removed entirely (busters.py) owns no tokens.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from zllm.canonical import ChatRequest, FunctionTool, Message, ToolChoice
from zllm.diagnosis.busters import drop_billing_headers
from zllm.token_prefix import common_prefix_length

SYSTEM_BLOCK = "system block"
TOOLS = "tools"
GENERATION_PROMPT = "generation prompt"



class TemplateRenderer(Protocol):
    """What segmenting asks of zllm.prompt's `PromptRenderer`."""

    def template_text(self, request: ChatRequest, messages: tuple[Message, ...], *, tools: bool = True,
                      add_generation_prompt: bool = True) -> str: ...

    def token_starts(self, text: str) -> list[int]: ...


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


class PromptLayout:
    """One request's full template text and the partial renders that find its boundaries, each run at most
    once however often it is asked for."""

    def __init__(self, renderer: TemplateRenderer, request: ChatRequest) -> None:
        self.renderer, self.request = renderer, request
        self.kept, self.origin = kept_messages(request.messages)
        self.full = renderer.template_text(request, self.kept)
        self._ends: dict[int, int | None] = {0: 0}

    def token_starts(self) -> list[int]:
        """The character each token of the prompt starts at."""
        return self.renderer.token_starts(self.full)

    def message_end(self, k: int) -> int | None:
        """The character message k-1 ends at (None: the template refuses to render `kept[:k]` on its own)."""
        if k not in self._ends:
            try:
                text = self.renderer.template_text(self.request, self.kept[:k], add_generation_prompt=False)
            except Exception:  # e.g. a template that insists on a final user turn
                self._ends[k] = None
            else:
                self._ends[k] = common_prefix_length(self.full, text)
        return self._ends[k]

    def refused(self, k: int) -> bool:
        """Whether rendering `kept[:k]` was tried and the template refused it (not yet tried: False)."""
        return k in self._ends and self._ends[k] is None

    def tools_span(self) -> tuple[int, int]:
        """The characters of the full text that rendering without the tools does not have ((0, 0): none)."""
        try:
            without = self.renderer.template_text(self.request, self.kept, tools=False)
        except Exception:
            return 0, 0
        start = common_prefix_length(self.full, without)
        return start, len(self.full) - common_prefix_length(self.full[start:][::-1], without[start:][::-1])

    def messages_label(self, first: int, stop: int) -> Label:
        """The label of the kept messages [first, stop): one message, or a range the template would not split."""
        if stop == first + 1:
            message = self.kept[first]
            kind = "system" if message.role == "system" and first == 0 else "message"
            return Label(kind, message_name(self.origin[first], message, first=first == 0), self.origin[first])
        return Label("messages", f"messages {self.origin[first]}-{self.origin[stop - 1]}", self.origin[first])


def map_segments(renderer: TemplateRenderer, request: ChatRequest, total: int | None = None) -> SegmentMap:
    """Segments of `request`'s prompt as `renderer.render` builds it (`total`: its length, when known)."""
    layout = PromptLayout(renderer, request)
    starts = layout.token_starts()
    message_starts, message_labels = _message_layer(layout)
    tool_ranges = _tool_layer(layout) if request.tools else []
    tool_starts = [start for start, _, _ in tool_ranges]

    def label_at(char: int) -> Label:
        i = bisect.bisect_right(tool_starts, char) - 1
        if i >= 0 and char < tool_ranges[i][1]:
            return tool_ranges[i][2]
        return message_labels[max(0, bisect.bisect_right(message_starts, char) - 1)]

    labels = [label_at(char) for char in starts]
    return _runs(labels, len(labels) if total is None else total)


def position_describer(renderer: TemplateRenderer, request: ChatRequest) -> Callable[[int], str]:
    """A cheap closure `token index -> segment name` for this request; it renders only when called."""
    def describe(index: int) -> str:
        return describe_position(renderer, request, index)
    return describe


def describe_position(renderer: TemplateRenderer, request: ChatRequest, index: int) -> str:
    """Name the segment token `index` falls in, in the near-miss log's words: "system", "tools" (all of the
    tool text), "message 3 (user)", "messages 3-5", "generation prompt"."""
    layout = PromptLayout(renderer, request)
    starts = layout.token_starts()
    if not 0 <= index < len(starts):
        return f"past the end of the prompt ({len(starts)} tokens)"
    at = starts[index]  # the character the token starts at
    if request.tools:
        start, stop = layout.tools_span()
        if start <= at < stop:
            return TOOLS
    label = _message_label_at(layout, at)
    return "system" if label.kind == "system" else label.name


def kept_messages(messages: tuple[Message, ...]) -> tuple[tuple[Message, ...], list[int]]:
    """The messages the renderer renders (cache busters removed) and each one's index in `messages`."""
    kept: list[Message] = []
    origin: list[int] = []
    for i, message in enumerate(messages):
        for survivor in drop_billing_headers((message,))[0]:
            kept.append(survivor)
            origin.append(i)
    return tuple(kept), origin


def message_name(index: int, message: Message, *, first: bool) -> str:
    """"system block" for a leading system message, else "message 3 (user)", "message 4 (tool result)"…"""
    if message.role == "system" and first:
        return SYSTEM_BLOCK
    role = {"tool": "tool result"}.get(message.role, message.role)
    if message.role == "assistant" and message.tool_calls:
        role = "assistant tool call"
    return f"message {index} ({role})"


def tool_name(index: int, tool: FunctionTool) -> str:
    return f"tool {index} ({tool.name})"


def _message_label_at(layout: PromptLayout, at: int) -> Label:
    """The message (or range, or generation prompt) character `at` falls in: a binary search over k."""
    n = len(layout.kept)
    last = layout.message_end(n)
    if last is not None and at >= last:
        return Label("generation", GENERATION_PROMPT)
    lo, hi = 0, n  # invariant: end(lo) <= at < end(hi) (or the prompt's end)
    while candidates := [k for k in range(lo + 1, hi) if not layout.refused(k)]:
        k = candidates[len(candidates) // 2]
        boundary = layout.message_end(k)
        if boundary is None:
            continue
        if boundary <= at:
            lo = k
        else:
            hi = k
    return layout.messages_label(lo, hi)


def _message_layer(layout: PromptLayout) -> tuple[list[int], list[Label]]:
    """(start character, label) of each message range and of the generation prompt, every prefix rendered."""
    points = [(0, 0)]  # (messages rendered, the character they end at), for every prefix the template accepts
    for k in range(1, len(layout.kept) + 1):
        end = layout.message_end(k)
        if end is not None:  # a refused prefix widens its messages to a range
            points.append((k, max(points[-1][1], end)))
    starts = [char for _, char in points]
    labels = [layout.messages_label(k1, k2) for (k1, _), (k2, _) in itertools.pairwise(points)]
    last = points[-1][0]
    labels.append(Label("generation", GENERATION_PROMPT) if last == len(layout.kept)
                  else layout.messages_label(last, len(layout.kept)))
    return starts, labels


def _tool_layer(layout: PromptLayout) -> list[tuple[int, int, Label]]:
    """(start, stop, label) character ranges: the template's tool text and, inside it, each tool's schema."""
    request, full, tools = layout.request, layout.full, layout.request.tools

    def with_tools(subset: tuple[FunctionTool, ...]) -> str:
        # tool_choice reset: a forced tool may be missing from the subset, and the template never sees it
        return layout.renderer.template_text(dataclasses.replace(request, tools=subset, tool_choice=ToolChoice()),
                                             layout.kept)

    lo, hi = layout.tools_span()
    if hi <= lo:
        return []  # the template does not render tools (or refused to render without them)
    try:
        prefixes = [with_tools(tools[:j]) for j in range(1, len(tools))]
        without_first = with_tools(tools[1:]) if len(tools) > 1 else None
    except Exception:
        return []
    if len(tools) == 1:
        return [(lo, hi, Label("tool", tool_name(0, tools[0]), 0))]
    bounds = [lo]
    for text in prefixes:  # tool j starts where `tools[:j]` stops agreeing with the full prompt
        bounds.append(min(max(bounds[-1], common_prefix_length(full, text)), hi))
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


