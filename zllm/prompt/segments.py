"""Which part of a rendered prompt a token falls in: "system", "tools", "message 3 (user)", "generation prompt".

The prefix cache's near-miss log (kvcache/near_miss.py) uses it to say *where* a request diverged from a
cached sequence. The cache layer must not import this package, so the runtime hands it a closure
(`position_describer`) that costs nothing to create and renders only when called: once per near miss, never
per request.

How. A chat template renders the conversation as a whole, so message boundaries are found by rendering
prefixes of it, `messages[:k]` without the generation prompt, and counting how many leading characters each
shares with the full prompt's text: message k-1 ends there. A binary search over k needs O(log n) template
runs (a few ms each, no tokenizing); the token index is mapped to its character by tokenizing the full text
once with offsets. The tools are found by rendering the whole prompt once more without them: the text between
the longest common prefix and the longest common suffix of the two renders is the tool schemas, wherever the
template puts them (inside the system block for Qwen, next to a user turn for others). Cost: one tokenization
of the prompt plus a dozen template runs, about 0.1 s for a 33K-token, 100-message conversation on a CPU.

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
  prompt, say) makes the "tools" span cover that text too.

Message numbers are 0-based indexes into the canonical `ChatRequest.messages` (a system prompt sent as
Anthropic's `system` or Responses' `instructions` is message 0 there); a leading system message is named
"system". A message that cache-buster stripping removed entirely (cache_busters.py) owns no tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from zllm.canonical import ChatRequest, Message
from zllm.prompt.cache_busters import drop_billing_headers
from zllm.prompt.renderer import PromptRenderer

GENERATION_PROMPT = "generation prompt"
TOOLS = "tools"


def position_describer(renderer: PromptRenderer, request: ChatRequest) -> Callable[[int], str]:
    """A cheap closure `token index -> segment name` for this request; it renders only when called."""
    def describe(index: int) -> str:
        return describe_position(renderer, request, index)
    return describe


def describe_position(renderer: PromptRenderer, request: ChatRequest, index: int) -> str:
    """Name the segment of `request`'s rendered prompt that token `index` falls in (see the module doc)."""
    kept, origin = kept_messages(request.messages)
    full = renderer.template_text(request, kept)
    starts = renderer.token_starts(full)
    if not 0 <= index < len(starts):
        return f"past the end of the prompt ({len(starts)} tokens)"
    at = starts[index]  # the character the token starts at
    if request.tools:
        start, stop = _tools_span(renderer, request, kept, full)
        if start <= at < stop:
            return TOOLS

    ends: dict[int, int | None] = {0: 0}  # k -> character message k-1 ends at (None: the template refused)

    def end(k: int) -> int | None:
        if k not in ends:
            try:
                text = renderer.template_text(request, kept[:k], add_generation_prompt=False)
            except Exception:  # e.g. a template that insists on a final user turn
                ends[k] = None
            else:
                ends[k] = shared_prefix_length(full, text)
        return ends[k]

    last = end(len(kept))
    if last is not None and at >= last:
        return GENERATION_PROMPT
    lo, hi = 0, len(kept)  # invariant: end(lo) <= at < end(hi) (or the prompt's end)
    while candidates := [k for k in range(lo + 1, hi) if ends.get(k, 0) is not None]:
        k = candidates[len(candidates) // 2]
        boundary = end(k)
        if boundary is None:
            continue
        if boundary <= at:
            lo = k
        else:
            hi = k
    if hi == lo + 1:
        return _name(origin[lo], kept[lo], first=lo == 0)
    return f"messages {origin[lo]}-{origin[hi - 1]}"


def kept_messages(messages: tuple[Message, ...]) -> tuple[tuple[Message, ...], list[int]]:
    """The messages the renderer renders (cache busters removed) and each one's index in `messages`."""
    kept: list[Message] = []
    origin: list[int] = []
    for i, message in enumerate(messages):
        for survivor in drop_billing_headers((message,))[0]:
            kept.append(survivor)
            origin.append(i)
    return tuple(kept), origin


def _tools_span(renderer: PromptRenderer, request: ChatRequest, kept: tuple[Message, ...],
                full: str) -> tuple[int, int]:
    """The characters of `full` that rendering without the tools does not have."""
    try:
        without = renderer.template_text(request, kept, tools=False)
    except Exception:
        return 0, 0
    start = shared_prefix_length(full, without)
    return start, len(full) - shared_prefix_length(reversed(full[start:]), reversed(without[start:]))


def shared_prefix_length(a: Iterable, b: Iterable) -> int:
    """How many leading items `a` and `b` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _name(index: int, message: Message, *, first: bool) -> str:
    if message.role == "system" and first:
        return "system"
    role = message.role
    if role == "assistant" and message.tool_calls:
        role = "assistant tool call"
    elif role == "tool":
        role = "tool result"
    return f"message {index} ({role})"
