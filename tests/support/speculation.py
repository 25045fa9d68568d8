"""Speculative decoding on the tiny Qwen, step by step outside the engine: the drivers and helpers that
test_speculative.py (prompt lookup) and test_draft_model.py (a draft model) share.

- `plain(...)` / `speculative(...)`: the engine loop's plain step and its speculative step, each token through
  the loop's output path (`emit`), returning a `Generation` to compare.
- `echo_model(model, script, gaps)`: makes a model continue `script`, so drafts get accepted in runs.
- `ModelHooks` / `force_rows`: the hook plumbing behind echo_model, for other hooks on a model's forwards.
- The edit grammar (`EDIT_GRAMMAR`, `EDIT_EXAMPLE`, `check_edit`) for fenced runs, and the tiny Qwen's stop ids.

Nothing here imports the engine loop: test_draft_model.py runs without it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tests.support.tiny_models import tiny_qwen_tokenizer
from zllm.dialects.base import CANONICAL_JSON_GUIDANCE, FenceGrammar
from zllm.engine.sampler import Sampler, SamplingConfig
from zllm.engine.torch.kv_layers import crop_to
from zllm.runtime.fence import sample_fenced
from zllm.runtime.speculative import Drafter, SpeculationConfig, SpeculativeStep

IM_END, END_OF_TEXT = 151645, 151643
STOP_IDS = frozenset({IM_END, END_OF_TEXT})
GREEDY = SamplingConfig(temperature=0.0)
FILE = "def add(a, b):\n    total = a + b\n    return total\n\n\nprint(add(2, 3))\n"
SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string", "maxLength": 12}, "line": {"type": "integer", "maximum": 99},
                   "mode": {"enum": ["replace", "append"]}},
    "required": ["path", "line", "mode"],
    "additionalProperties": False,
    "x-guidance": CANONICAL_JSON_GUIDANCE,
}
EDIT_GRAMMAR = FenceGrammar("%llguidance {}\nstart: %json " + json.dumps(SCHEMA))
EDIT_EXAMPLE = '{"path": "src/app.py", "line": 42, "mode": "replace"}'


def encode(text: str) -> list[int]:
    return tiny_qwen_tokenizer().encode(text, add_special_tokens=False)


def check_edit(text: str) -> None:
    """`text` is an edit as SCHEMA allows it."""
    value = json.loads(text)
    assert set(value) == {"path", "line", "mode"} and value["mode"] in ("replace", "append")
    assert isinstance(value["path"], str) and len(value["path"]) <= 12
    assert type(value["line"]) is int and value["line"] <= 99


# ---------------------------------------------------------------------------------------------- model hooks


class ModelHooks:
    """Context manager base: the handles `_hooks()` registers on entry are removed on exit."""

    def _hooks(self) -> tuple:
        raise NotImplementedError

    def __enter__(self):
        self._handles = self._hooks()
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()


def force_rows(logits: torch.Tensor, targets: list[tuple[int, int]]) -> torch.Tensor:
    """`logits` ([1, rows, vocab], numpy or torch) with each (row, token_id) of `targets` made certain to pick
    that token."""
    if not targets:
        return logits
    forced = logits.copy() if isinstance(logits, np.ndarray) else logits.clone()
    for row, token_id in targets:
        forced[0, row] = -1e4
        forced[0, row, token_id] = 1e4
    return forced


class echo_model(ModelHooks):
    """Make `model` continue `script` at every position: after script[i] it emits script[i + 1] (the first such
    pair wins for a repeated token), after any other token script[0]; after a `gaps` token its own random
    logits pass through. Keyed by each position's input token — unlike scripted_output, which counts forward
    passes — so a k-token verify forward sees what k decode steps see."""

    def __init__(self, model, script: list[int], gaps: tuple[int, ...] = ()):
        self.model, self.first, self.gaps = model, script[0], set(gaps)
        self.next: dict[int, int] = {}
        for token_id, following in zip(script, script[1:]):
            self.next.setdefault(token_id, following)
        self._ids: torch.Tensor | None = None

    def _hooks(self) -> tuple:
        return (self.model.get_input_embeddings().register_forward_pre_hook(self._capture),
                self.model.get_output_embeddings().register_forward_hook(self._force))

    def _capture(self, module, args):
        self._ids = args[0]  # input_ids [1, n]

    def _force(self, module, inputs, output):  # output: [1, kept positions, vocab]
        kept_inputs = self._ids[0, -output.shape[1]:].tolist()
        return force_rows(output, [(position, self.next.get(token_id, self.first))
                                   for position, token_id in enumerate(kept_inputs) if token_id not in self.gaps])


# ---------------------------------------------------------------------------------------------- the drivers


@dataclass
class Generation:
    tokens: list[int]
    ending: str
    cache_length: int


def emit(token_id: int, tokens: list[int], max_tokens: int, fence, guard) -> str | None:
    """The engine loop's per-token output path, in its order: fence, stop/budget, loop guard."""
    tokens.append(token_id)
    if fence is not None:
        fence.advance(token_id)
    if token_id in STOP_IDS:
        return "stop"
    if len(tokens) >= max_tokens:
        return "length"
    if guard is not None:
        guard.observe(token_id)
        if guard.verdict() is not None:
            return "repetition"
    return None


def plain(runner, prompt, max_tokens, sampling=GREEDY, *, fence=None, guard=None) -> Generation:
    """EngineLoop.step, one token per forward."""
    sampler, cache, tokens = Sampler(sampling), runner.new_cache(), []
    logits = runner.prefill(prompt, cache)
    while True:
        if guard is not None:
            guard.ban(logits, fence)
        token = sample_fenced(sampler, logits, fence)
        if (ending := emit(token.item(), tokens, max_tokens, fence, guard)) is not None:
            return Generation(tokens, ending, cache.get_seq_length())
        logits = runner.decode(token, cache)


def speculative(runner, prompt, max_tokens, sampling=GREEDY, *, fence=None, guard=None, cache=None,
                config=SpeculationConfig(), drafter: Drafter | None = None,
                on_step: Callable[[SpeculativeStep, list[int]], None] | None = None
                ) -> tuple[Generation, SpeculativeStep]:
    """The engine loop with the integration patch: spec.step, then each token through the output path.
    `drafter`: SpeculativeStep's (None: prompt lookup); `on_step(spec, tokens)` runs after every step that does
    not end the request."""
    cache = cache if cache is not None else runner.new_cache()
    spec, tokens = SpeculativeStep(runner, Sampler(sampling), prompt, config, STOP_IDS, drafter=drafter), []
    logits = runner.prefill(prompt, cache)
    while True:
        run = spec.step(logits, cache, remaining=max_tokens - len(tokens), fence=fence, loop_guard=guard)
        for token_id in run.tokens:
            if (ending := emit(token_id, tokens, max_tokens, fence, guard)) is not None:
                crop_to(cache, len(prompt) + len(tokens) - 1)  # the plain loop never feeds the ending token
                return Generation(tokens, ending, cache.get_seq_length()), spec
        assert cache.get_seq_length() == len(prompt) + len(tokens), "the cache holds prompt + fed tokens"
        if on_step is not None:
            on_step(spec, tokens)
        logits = run.logits
