"""Speculative decoding with a model-free drafter (prompt lookup), exact under the fence and the loop guard.

One step, for one request (a batch row later) whose cache holds prompt + every emitted token and whose
`logits` are the distribution for the next token — the engine loop's state between plain steps:

    first  = sample(logits)                      ban + fence, as a plain step; or the residual of a rejection
    draft  = forced tokens of the grammar after `first`, then prompt lookup: the longest recent n-gram of
             prompt + output (n = max_ngram .. min_ngram) seen earlier → the tokens that followed it there
             (cut at a stop token, at the fence-valid prefix, before a position where the loop guard would ban)
    rows   = runner.verify([first, *draft])     one forward, logits after each fed token: [1 + k, vocab]
    accept = leading draft tokens the model agrees with (engine/verify.py: argmax, or accept/reject),
             each row masked by the fence probe's mask at that position
    crop the cache to (length before + 1 + accepted): rejected drafts leave nothing behind
    return tokens [first, *draft[:accepted]] and rows[accepted], the logits for the token after them

The loop then feeds the returned tokens one by one through its usual output path (generated, fence.advance,
output.accept, loop guard) and, when one of them ends the request, crops the cache to prompt + emitted − 1
(the plain loop never feeds the ending token). A step emits 1..k+1 tokens per forward, as many as a
"accepted + correction token" formulation, but the token after the accepted run is drawn at the start of the
next step from `rows[accepted]` — by the real fence and loop guard, with nothing to undo. When sampling, a
rejection leaves its residual distribution (p without the draft token) for that draw, which keeps every
emitted token distributed exactly as the plain path's.

With no draft (nothing matched, or backing off after drafts that failed) a step is a plain decode step; when
the sampled token is a stop token or the budget's last, no forward runs at all (`SpeculativeRun.logits` None).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from zllm.engine.contract import Engine, Logits, Row
from zllm.engine.sampler import Sampler
from zllm.engine.verify import greedy_accepts, sample_from, sampled_accepts
from zllm.runtime.fence import Fence, sample_fenced
from zllm.runtime.fence_mask import mask_logits
from zllm.runtime.loop_guard import LoopGuard


@dataclass(frozen=True)
class SpeculationConfig:
    # defaults from bench/speculative.py on a CPU: a verify forward costs well over a decode step even for a
    # 2-token draft, so drafts are long and only drafted from a 3-gram match or longer (a 1-gram "match" is
    # right too rarely to pay for its forward on text that is not an echo)
    max_draft: int = 62  # k: draft tokens verified per forward at most (k + 1 < 64: llama.cpp's per-cell attention)
    # longest suffix n-gram looked up: the draft follows the latest occurrence of the longest match, and how long
    # that match is tells the gate how likely the text is copied (`long_match`)
    max_ngram: int = 16
    min_ngram: int = 3  # shortest (1: any earlier occurrence of the last token)
    # after a draft whose first token is rejected, plain steps before the next draft: 1, 2, 4 .. max_backoff
    # for consecutive failures (0: always draft). A verify forward over k + 1 tokens costs more than a decode
    # step on a CPU (matrix-vector becomes matrix-matrix), so drafting on text that is not an echo must back off.
    max_backoff: int = 16
    # the draft's limit adapts (bench/speculative_llamacpp.py): first_draft tokens at first and after a draft that
    # was not wholly accepted (or its accepted tokens + 1 if more), doubled after one that was, up to max_draft.
    # A CPU's verify is compute-bound: 13 rows cost ~4x a 1-token step at 1 thread, so a long draft must be earned
    first_draft: int = 2
    # the cost gate (`CostGate`; prompt lookup on an engine that measures what a verified row costs): a suffix
    # match of this many tokens or more drafts as a "long" match, whose acceptance is tracked apart from short
    # ones' (an echo's 16-token matches are right where a story's 3-token ones are not)
    long_match: int = 8
    gate: bool = True

    def __post_init__(self) -> None:
        assert self.max_draft >= 1 and 1 <= self.min_ngram <= self.max_ngram and self.max_backoff >= 0
        assert self.first_draft >= 1 and self.long_match >= self.min_ngram


class Drafter(Protocol):
    """Proposes draft tokens continuing a sequence it is told about (prompt, then every emitted token)."""

    def __len__(self) -> int: ...

    def extend(self, tokens: Iterable[int]) -> None: ...

    def propose(self, limit: int, tail: Sequence[int] = ()) -> list[int]: ...


class PromptLookup:
    """The drafter: find the longest suffix n-gram (n = max_ngram .. min_ngram) of prompt + output that occurred
    earlier, and propose the tokens that followed its latest occurrence.

        tokens:  a b c d a b  →  propose(2) matches the suffix "a b" (n = 2) at 0..1 → draft [c, d]

    A vectorized scan per lookup, no index: one comparison of the last token against the whole sequence (one
    numpy pass, small next to a forward even for long prompts) finds the 1-gram hits, each longer n-gram keeps
    the hits whose previous token matches too. Nothing to build at admission, 4 bytes per token."""

    def __init__(self, tokens: Iterable[int] = (), *, max_ngram: int = 3, min_ngram: int = 1):
        assert 1 <= min_ngram <= max_ngram
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._buffer = np.empty(256, dtype=np.int32)  # token ids; the first `_length` are the sequence
        self._length = 0
        self.matched = 0  # the last `propose`'s match: its suffix n-gram's length (0: none)
        self.extend(tokens)

    def __len__(self) -> int:
        return self._length

    def extend(self, tokens: Iterable[int]) -> None:
        new = np.fromiter(tokens, dtype=np.int32)
        needed = self._length + len(new)
        if needed > len(self._buffer):
            grown = np.empty(max(needed, 2 * len(self._buffer)), dtype=np.int32)
            grown[:self._length] = self._buffer[:self._length]
            self._buffer = grown
        self._buffer[self._length:needed] = new
        self._length = needed

    def propose(self, limit: int, tail: Sequence[int] = (), *, min_ngram: int | None = None) -> list[int]:
        """Up to `limit` tokens that followed the longest matching suffix of tokens + `tail` (tail: tokens
        already chosen for this step, not part of the sequence yet), at least `min_ngram` long (default: the
        drafter's). Empty when nothing matches."""
        # an earlier occurrence ends before the suffix's own last token, so inside the sequence, at last_end or
        # before (the sequence's last token is the suffix's own unless a tail follows it)
        last_end = self._length - 1 if tail else self._length - 2
        self.matched = 0
        if limit <= 0 or last_end < 0:
            return []
        sequence = self._buffer[:self._length]
        recent = [*sequence[-self.max_ngram:].tolist(), *tail]
        ends = np.flatnonzero(sequence[:last_end + 1] == recent[-1])  # 1-gram hits, ascending
        shortest = self.min_ngram if min_ngram is None else min_ngram
        best, matched = (ends, 1) if shortest == 1 else (None, 0)
        for n in range(2, min(self.max_ngram, len(recent)) + 1):
            ends = ends[ends >= n - 1]
            ends = ends[sequence[ends - (n - 1)] == recent[-n]]
            if not len(ends):
                break
            if n >= shortest:
                best, matched = ends, n
        if best is None or not len(best):
            return []
        self.matched = matched
        start = int(best[-1]) + 1  # the latest occurrence: nearer text is likelier to be what is echoed
        # what followed it: the rest of the sequence, then the tail; past the end the text repeats with the period
        # between the occurrence and the suffix (a run of repeated lines drafts as long as the limit allows)
        draft = [*sequence[start:start + limit].tolist(), *tail][:limit]
        period = self._length + len(tail) - start
        while len(draft) < limit:
            draft.append(draft[len(draft) - period])
        return draft


@dataclass
class SpeculationStats:
    steps: int = 0  # forwards run by `step` (drafted or not)
    drafted: int = 0  # draft tokens verified
    accepted: int = 0  # draft tokens accepted
    emitted: int = 0  # tokens returned (accepted drafts + one per step)
    gated: int = 0  # steps whose draft the cost gate shortened (to nothing: a plain step, or the pad row's guess)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass
class SpeculativeRun:
    tokens: list[int]  # to emit in order: the step's sampled token, then the accepted draft
    # logits for the token after the last one ([vocab]); None when no forward ran (the first token ends the
    # request: a stop token, or the last token of the budget), so the cache holds all tokens but the last
    logits: Logits | None


@dataclass
class DraftPlan:
    """What a step feeds forward: the sampled token, then the draft to verify."""

    first_id: int
    draft: list[int]
    masks: np.ndarray | None  # the fence's mask at each draft position ([len(draft), words]), None: no fence
    guess: bool = False  # a 1-token draft in the row the engine would pad anyway (`_guess`): no backoff on it
    long: bool = False  # drafted from a long suffix match (SpeculationConfig.long_match): the gate's class

    @property
    def feed(self) -> list[int]:
        return [self.first_id, *self.draft]


GATE_DECAY = 0.8  # weight of the past per draft in the gate's acceptance counts: the last ~5 drafts of a class
GATE_RELAX = 0.95  # per step a class drafts nothing, its counts move this much less toward their prior
# a class's prior (accepted tokens, rejections): a long match is a copy more often than not (an echo, a tool call's
# JSON repeated), a short one is a coin toss, a guess (`_guess`: a 1-gram) is right about a third of the time
GATE_PRIORS = {"long": (4.0, 1.0), "short": (1.0, 1.0), "guess": (1.0, 2.0)}


@dataclass
class CostGate:
    """Whether a draft pays, from what its rows cost and how often drafts like it were accepted.

    A draft of k tokens verifies k + 1 rows in one forward. With p the chance that a draft token is accepted given
    the one before it was, the step emits 1 + p + p^2 + .. + p^k tokens on average. Its cost, in plain steps over
    a sequence of n cells: (1 + row_cost * max(0, k + 1 - step_rows) + a * n * (k + 1)) / (1 + a * n), where
    `row_cost` is a row's products measured over a short sequence (llamacpp/verify_cost.py; rows the engine
    computes anyway, a pad row, are free there) and a = `cell_cost` a row's attention per cell, which batching does
    not share (a pad row attends to its own cell only). The gate keeps the k with the most tokens per step, and 0 —
    a plain step — where none beats the plain step's 1. p is counted per class of draft (from a long suffix match,
    a short one, or a 1-token guess in the pad row) over the last few drafts of that class; a class drafting nothing
    relaxes toward its prior, so a turn that starts copying later is drafted again. Only the speed depends on it:
    any draft length keeps greedy output the plain output."""

    row_cost: float
    step_rows: int
    cell_cost: float = 0.0
    counts: dict[str, list[float]] = field(default_factory=lambda: {c: list(p) for c, p in GATE_PRIORS.items()})

    def acceptance(self, kind: str) -> float:
        accepted, rejected = self.counts[kind]
        return accepted / (accepted + rejected)

    def draft_length(self, available: int, kind: str, cells: int = 0) -> int:
        """The best draft length up to `available` tokens for a draft of this class (0: none pays), `cells` the
        sequence's length."""
        p = self.acceptance(kind)
        attention = self.cell_cost * cells
        best_length, best, expected, chance = 0, 1.0, 1.0, 1.0
        for length in range(1, available + 1):
            chance *= p
            expected += chance
            rows = length + 1
            cost = (1.0 + self.row_cost * max(0, rows - self.step_rows) + attention * rows) / (1.0 + attention)
            if expected / cost > best:
                best_length, best = length, expected / cost
        if best_length == 0:  # nothing drafted in this class: its evidence ages toward the prior
            counts, prior = self.counts[kind], GATE_PRIORS[kind]
            for i in range(2):
                counts[i] = GATE_RELAX * counts[i] + (1 - GATE_RELAX) * prior[i]
        return best_length

    def observe(self, kind: str, drafted: int, accepted: int) -> None:
        counts = self.counts[kind]
        counts[0] = GATE_DECAY * counts[0] + accepted
        counts[1] = GATE_DECAY * counts[1] + (accepted < drafted)


@dataclass(eq=False)
class SpeculativeStep:
    """One request's speculative decoder. Holds the drafter over prompt + output and, after a sampled
    rejection, the residual distribution the next token must come from. Engine thread only."""

    runner: Engine  # the engine seam (engine/contract.py): verifies drafts, crops rejected ones
    sampler: Sampler  # the request's sampler: its settings and its seeded stream
    prompt_ids: Sequence[int]
    config: SpeculationConfig = field(default_factory=SpeculationConfig)
    # the ids the loop's output path ends the request on (model + request stop tokens), never drafted past
    stop_token_ids: frozenset[int] = frozenset()
    stats: SpeculationStats = field(default_factory=SpeculationStats)
    # drafts from a draft model (engine/torch/draft_model.py) instead of prompt lookup, through the same interface
    drafter: Drafter | None = None
    lookup: Drafter = field(init=False)
    _residual: Logits | None = field(init=False, default=None)
    _backoff: int = field(init=False, default=0)  # plain steps the last failed draft costs (doubles per failure)
    _skip: int = field(init=False, default=0)  # plain steps left before drafting again
    _limit: int = field(init=False, default=0)  # the next draft's length at most (SpeculationConfig.first_draft)
    gate: CostGate | None = field(init=False, default=None)  # prompt lookup on an engine that measures row costs

    def __post_init__(self) -> None:
        self._limit = self.config.first_draft
        self.lookup = self.drafter if self.drafter is not None else PromptLookup(
            self.prompt_ids, max_ngram=self.config.max_ngram, min_ngram=self.config.min_ngram)
        row_cost = getattr(self.runner, "verify_row_cost", None)  # engine/contract.py: None where unmeasured
        if self.config.gate and self.drafter is None and row_cost is not None:
            self.gate = CostGate(row_cost, self.runner.step_rows, getattr(self.runner, "attention_cell_cost", 0.0))

    def step(self, logits: Logits, cache: Any, *, remaining: int, fence: Fence | None = None,
             loop_guard: LoopGuard | None = None) -> SpeculativeRun:
        """Sample the next token from `logits`, draft after it, verify, and return what to emit.

        `cache` holds prompt + every emitted token; `remaining` is the token budget left (≥ 1); `fence` and
        `loop_guard` are the request's real ones: this step moves neither (the loop advances them as it
        emits), it works on probes. The cache afterwards holds every returned token."""
        plan = self.plan(logits, remaining=remaining, fence=fence, loop_guard=loop_guard)
        if isinstance(plan, SpeculativeRun):
            return plan
        rows = self.runner.step([Row(cache, plan.feed, all_logits=True)])[0]  # [1 + len(draft), vocab]
        return self.resolve(plan, rows, cache)

    def plan(self, logits: Logits, *, remaining: int, fence: Fence | None = None,
             loop_guard: LoopGuard | None = None) -> DraftPlan | SpeculativeRun:
        """The first half of a step: sample the next token and draft after it. Returns the tokens to feed
        forward (a batched engine packs them with other rows' tokens), or a finished run when no forward is
        needed (the sampled token is a stop token or the budget's last)."""
        assert remaining >= 1, "the loop ends a request when its budget is spent"
        first = self._sample_first(logits, fence, loop_guard)  # [1, 1]
        first_id = first.item()  # the step's one host sync before the forward
        if remaining == 1 or first_id in self.stop_token_ids:
            self.lookup.extend([first_id])
            self.stats.emitted += 1
            return SpeculativeRun([first_id], None)
        draft, probe = self._draft(first_id, fence, loop_guard, self._draft_limit(remaining))
        long = getattr(self.lookup, "matched", 0) >= self.config.long_match
        if draft and self.gate is not None:
            draft = self._gated(draft, "long" if long else "short")
        if not draft and self._guess(remaining):
            draft, probe = self._draft(first_id, fence, loop_guard, 1, min_ngram=1)
            return DraftPlan(first_id, *_masked(draft, probe), guess=True)
        return DraftPlan(first_id, *_masked(draft, probe), long=long)

    def resolve(self, plan: DraftPlan, rows: Logits, cache: Any) -> SpeculativeRun:
        """The second half: `rows` are the logits after each fed token (`[len(plan.feed), vocab]`), and the
        cache holds them all. Accept the draft's longest valid prefix and crop the rest out of the cache."""
        held = self.runner.length(cache) - len(plan.feed)
        accepted = self._accept(rows[:len(plan.draft)], plan.draft, plan.masks)
        self.runner.crop(cache, held + 1 + accepted)
        tokens = [plan.first_id, *plan.draft[:accepted]]
        self.lookup.extend(tokens)
        self._count(len(plan.draft), accepted, backs_off=not plan.guess)
        if self.gate is not None and plan.draft:
            self.gate.observe("guess" if plan.guess else "long" if plan.long else "short", len(plan.draft), accepted)
        return SpeculativeRun(tokens, rows[accepted])

    # ------------------------------------------------------------------ sampling the first token

    def _sample_first(self, logits: Logits, fence: Fence | None, guard: LoopGuard | None) -> Any:
        if self._residual is not None:
            # the previous step rejected a draft token at this position: draw from p without it. The fence
            # mask is already in it; the loop guard had no loop here (drafts stop before one), so no ban.
            probs, self._residual = self._residual, None
            assert guard is None or guard.next_banned() is None, "drafts stop before a loop-guard ban"
            return sample_from(probs, self.sampler.generator)
        if guard is not None:
            guard.ban(logits, fence)
        return sample_fenced(self.sampler, logits, fence)

    # ------------------------------------------------------------------ drafting

    def _guess(self, remaining: int) -> bool:
        """Whether a step that drafts nothing should still verify one guessed token: when the engine computes 2+
        rows per step anyway (a pad row: engine/contract.py's step_rows), the guess takes the pad's place and
        costs nothing over a short sequence (the cost gate weighs its attention over a long one), so a no-copy
        turn gains whatever the guesses get right. The guess is what followed the latest earlier occurrence of
        the last token (prompt lookup down to a 1-gram)."""
        if remaining < 2 or self.runner.step_rows < 2 or not isinstance(self.lookup, PromptLookup):
            return False
        # over a long sequence the guess is not free: it attends to every cell where the pad row attends to one
        return self.gate is None or self.gate.draft_length(1, "guess", cells=len(self.lookup)) == 1

    def _draft(self, first_id: int, fence: Fence | None, guard: LoopGuard | None,
               limit: int, min_ngram: int | None = None) -> tuple[list[int], Fence | None]:
        """The draft after `first_id`, cut before the first token the fence forbids (it would be rejected anyway:
        never verified), and the fence's probe after `first_id` (None: no fence) that masks it (`_masked`, once
        the cost gate has cut it: a mask costs a grammar step over the vocabulary)."""
        if limit <= 0:
            return [], None
        probe = None
        forced: list[int] = []
        if fence is not None:
            probe = fence.clone()
            probe.advance(first_id)
            # text the grammar forces, tokenized canonically: a free draft, verified like any other (the mask
            # may allow another tokenization of it, which the model may prefer)
            forced = probe.forced_tokens()[:limit]
        shorter = {} if min_ngram is None else {"min_ngram": min_ngram}  # PromptLookup's (`_guess`)
        draft = forced + self.lookup.propose(limit - len(forced), tail=[first_id, *forced], **shorter)
        draft = _through_first_stop(draft, self.stop_token_ids)
        draft = draft[:_loop_free_length(guard, first_id, draft)]
        if probe is None or not draft:
            return draft, probe
        return draft[:probe.valid_prefix(draft)], probe

    def _gated(self, draft: list[int], kind: str) -> list[int]:
        """The draft cut to the length the cost gate expects to pay best (nothing: a plain step)."""
        length = self.gate.draft_length(len(draft), kind, cells=len(self.lookup))
        if length < len(draft):
            self.stats.gated += 1
        return draft[:length]

    # ------------------------------------------------------------------ verifying

    def _accept(self, rows: Logits, draft: list[int], masks: np.ndarray | None) -> int:
        """rows: [len(draft), vocab], row i deciding draft[i]. Masked in place: row `accepted` becomes the
        next step's logits, and the mask it gets is the one the real fence applies there anyway."""
        if not draft:
            return 0
        if masks is not None:
            mask_logits(rows, masks)
        if self.sampler.generator is None:
            return greedy_accepts(rows, draft)
        accepted, self._residual = sampled_accepts(rows, draft, self.sampler.config, self.sampler.generator)
        return accepted

    def _draft_limit(self, remaining: int) -> int:
        if self._skip:
            self._skip -= 1
            return 0
        # verify_rows: the engine's verify gives 1-token steps' bits up to that many tokens (engine/contract.py)
        return min(self.config.max_draft, self._limit, remaining - 1, self.runner.verify_rows - 1)

    def _count(self, drafted: int, accepted: int, backs_off: bool = True) -> None:
        if backs_off and drafted:
            self._limit = (min(2 * self._limit, self.config.max_draft) if accepted == drafted
                           else max(self.config.first_draft, accepted + 1))
        if backs_off and drafted and not accepted:
            self._backoff = min(max(1, 2 * self._backoff), self.config.max_backoff)
            self._skip = self._backoff
        elif backs_off and accepted:
            self._backoff = 0
        stats = self.stats
        stats.steps += 1
        stats.drafted += drafted
        stats.accepted += accepted
        stats.emitted += 1 + accepted


def _masked(draft: list[int], probe: Fence | None) -> tuple[list[int], np.ndarray | None]:
    """The draft and the fence's mask before each of its tokens ([len(draft), words]; None: no fence), computed
    for the tokens verified only. A token the masks find forbidden (the prefix check said otherwise) ends it."""
    if probe is None or not draft:
        return draft, None
    masks = probe.draft_masks(draft)
    return (draft[:masks.shape[0]], masks) if masks.shape[0] else ([], None)


def _through_first_stop(draft: list[int], stop_token_ids: frozenset[int]) -> list[int]:
    """Nothing after a stop token is ever emitted: drafting past one only wastes the forward."""
    for position, token_id in enumerate(draft):
        if token_id in stop_token_ids:
            return draft[:position + 1]
    return draft


def _loop_free_length(guard: LoopGuard | None, first_id: int, draft: list[int]) -> int:
    """How many draft tokens can be checked without the loop guard: the draft stops before the first position
    where the guard (having seen `first_id` and the draft so far) would ban a token. That position's token is
    then drawn by the next step, with the real guard's ban, exactly as the plain loop draws it."""
    if guard is None or not draft:
        return len(draft)
    probe = copy.deepcopy(guard)
    probe.observe(first_id)
    for position, token_id in enumerate(draft):
        if probe.next_banned() is not None:
            return position
        probe.observe(token_id)
    return len(draft)
