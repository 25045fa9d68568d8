"""Harmony (gpt-oss): the literals the renderer, the parser and the fence grammar share.

A gpt-oss turn is a run of messages, each `<|start|>ROLE HEADER<|message|>BODY END`. The prompt ends with the
generation opener `<|start|>assistant`, so the output starts inside the first message's header:

    <|channel|>analysis<|message|>REASONING<|end|>
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{"k": "v"}<|call|>

or, answering, `...<|end|><|start|>assistant<|channel|>final<|message|>ANSWER<|return|>`. `<|end|>` ends a message
but not the turn; `<|call|>` (a call waits for its result) and `<|return|>` (the answer) end the turn. gpt-oss's
chat template writes a call's recipient before the channel and its content type as `commentary json`; the
model, trained on the harmony renderer, also writes `<|channel|>commentary to=functions.NAME <|constrain|>json`.
Both are read; the template's spelling is the one rendered and the one the fence prefers.
"""

from __future__ import annotations

START, END, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"
CALL, RETURN = "<|call|>", "<|return|>"
ASSISTANT = "assistant"
ANALYSIS, COMMENTARY, FINAL = "analysis", "commentary", "final"
RECIPIENT_PREFIX = " to=functions."
FUNCTIONS = "functions."
# every harmony special token the parser reads or the grammar writes (all are one added token in o200k_harmony)
MARKUP = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN)
# a message header longer than this (or with a newline) is no header: the text is given back as text
MAX_HEADER = 256

EFFORTS = ("low", "medium", "high")
DEFAULT_EFFORT = "medium"
# the clients' reasoning_effort values gpt-oss has no level for, mapped to its nearest
EFFORT_ALIASES = {"none": "low", "minimal": "low", "xhigh": "high"}


def effort_level(requested: str | None) -> str:
    """The `Reasoning:` level of the system message for a client's effort (None: the template's default)."""
    if requested is None:
        return DEFAULT_EFFORT
    return EFFORT_ALIASES.get(requested, requested if requested in EFFORTS else DEFAULT_EFFORT)


def call_header(name: str) -> str:
    """A call's header as gpt-oss's template writes it, after `<|start|>assistant`."""
    return f"{RECIPIENT_PREFIX}{name}{CHANNEL}{COMMENTARY} json{MESSAGE}"
