"""How much of a speculative draft the model accepts, from the target logits at each drafted position.

    rows:  [n, vocab]   logits at draft positions 0..n-1 (the caller has applied any fence mask)
    draft: [d1 .. dn]   row i decides d(i+1): it is the distribution after the tokens before d(i+1)

Greedy: accept while d(i+1) == argmax(row i); the first mismatching row is the model's own next step.

Sampled: the drafter is deterministic, so its proposal q is one-hot on d and the standard rule
"accept with probability min(1, p(d) / q(d))" is "accept with probability p(d)"; on rejection the next token
comes from the residual norm(max(p - q, 0)), which is p with d removed and renormalized. Every emitted token is
then distributed exactly as p:  P(d) = p(d),  P(x != d) = (1 - p(d)) * p(x) / (1 - p(d)) = p(x).
p is the row's sampling distribution as `Sampler` draws it: temperature, then top-k, then top-p.

Arrays only (numpy, or torch tensors: engine/sampler.py's kernels for their kind; no fence, no tokens as
text); the runtime's speculative step (zllm/runtime/speculative.py) drafts, masks and decides what to commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zllm.engine.sampler import SamplingConfig, kernels_for


def sampling_probs(logits: Any, config: SamplingConfig) -> Any:
    """The distribution `Sampler(config)` draws from for `logits` ([vocab]), dense in id order: [vocab] float32
    summing to 1 (-inf logits, e.g. fence-masked ones, get probability 0)."""
    assert not config.greedy, "greedy rows are compared by argmax"
    return kernels_for(logits).sampling_probs(logits, config)


def greedy_accepts(rows: Any, draft: Sequence[int]) -> int:
    """How many leading draft tokens equal the row-wise argmax (rows: [len(draft), vocab])."""
    targets = rows.argmax(-1).tolist()  # the one host sync of the check
    accepted = 0
    while accepted < len(draft) and draft[accepted] == targets[accepted]:
        accepted += 1
    return accepted


def sampled_accepts(rows: Any, draft: Sequence[int], config: SamplingConfig, generator: Any) -> tuple[int, Any]:
    """Accept/reject each draft token in turn against its row's distribution.

    Returns (accepted, residual): residual is None when the whole draft was accepted; otherwise it is the
    distribution ([vocab], unnormalized) the token at the first rejected position must be drawn from
    (`sample_from`). Rows past the first rejection are never looked at."""
    kernels = kernels_for(rows)
    uniforms = kernels.uniforms(len(draft), generator, rows)
    for position, token_id in enumerate(draft):
        probs = kernels.sampling_probs(rows[position], config)
        if uniforms[position] < probs[token_id].item():
            continue
        probs[token_id] = 0.0  # p(d) < 1 here (uniforms are < 1), so something is left
        return position, probs
    return len(draft), None


def sample_from(probs: Any, generator: Any) -> Any:
    """One draw from `probs` ([vocab], nonnegative, any positive sum) → [1, 1] integer array, by the same
    exponential race `Sampler` uses (argmax(p / E), E ~ Exp(1)): no normalization, no multinomial."""
    return kernels_for(probs).draw(probs, generator)
