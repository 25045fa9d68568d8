"""What a context edit asks for, protocol-free (the wire decoder builds these: anthropic_messages/context_management.py).

    ClearToolUses(trigger=Threshold("input_tokens", 6000), keep=3, clear_at_least=2000,
                  exclude_tools=frozenset({"Read"}), clear_inputs=True)
    ClearThinking(keep=1)          # keep=None: keep every turn's reasoning
    Compact(trigger=150_000, instructions=None, pause_after=False)

Defaults are Anthropic's (trigger 100,000 input tokens, keep 3 tool uses; thinking keep 1 turn; compaction at
150,000 input tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

INPUT_TOKENS = "input_tokens"
TOOL_USES = "tool_uses"


@dataclass(frozen=True)
class Threshold:
    unit: Literal["input_tokens", "tool_uses"]
    value: int


@dataclass(frozen=True)
class ClearToolUses:
    """Replace old tool results (and, with `clear_inputs`, the calls' arguments) by a placeholder."""

    trigger: Threshold = Threshold(INPUT_TOKENS, 100_000)
    keep: int = 3  # the most recent tool uses never cleared
    clear_at_least: int = 0  # an activation that cannot free this many tokens changes nothing
    exclude_tools: frozenset[str] = frozenset()
    # True: every cleared call's arguments too; a set: only those tools' arguments
    clear_inputs: bool | frozenset[str] = False

    def clears_input_of(self, tool: str) -> bool:
        return self.clear_inputs is True or (isinstance(self.clear_inputs, frozenset) and tool in self.clear_inputs)


@dataclass(frozen=True)
class ClearThinking:
    """Drop the reasoning of all but the `keep` most recent assistant turns that have some (None: keep all)."""

    keep: int | None = 1


@dataclass(frozen=True)
class Compact:
    """Summarise the conversation with the served model once its prompt passes `trigger` tokens."""

    trigger: int = 150_000
    instructions: str | None = None  # replaces the default summary prompt
    pause_after: bool = False  # answer with the summary alone (stop reason "compaction")


Edit = ClearToolUses | ClearThinking | Compact


@dataclass(frozen=True)
class ContextEdits:
    edits: tuple[Edit, ...] = field(default_factory=tuple)

    def of(self, kind: type) -> Edit | None:
        return next((edit for edit in self.edits if isinstance(edit, kind)), None)
