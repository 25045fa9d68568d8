"""How much of a speculative draft the model accepts, from the target logits at each drafted position.

    rows:  [n, vocab]   logits at draft positions 0..n-1 (the caller has applied any fence mask)
    draft: [d1 .. dn]   row i decides d(i+1): it is the distribution after the tokens before d(i+1)

Greedy: accept while d(i+1) == argmax(row i); the first mismatching row is the model's own next step.

Sampled: the drafter is deterministic, so its proposal q is one-hot on d and the standard rule
"accept with probability min(1, p(d) / q(d))" is "accept with probability p(d)"; on rejection the next token
comes from the residual norm(max(p - q, 0)), which is p with d removed and renormalized. Every emitted token is
then distributed exactly as p:  P(d) = p(d),  P(x != d) = (1 - p(d)) * p(x) / (1 - p(d)) = p(x).
p is the row's sampling distribution as `Sampler` draws it: temperature, then top-k, then top-p.

Tensors only (no fence, no tokens as text); the runtime's speculative step (zllm/runtime/speculative.py)
drafts, masks and decides what to commit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from zllm.engine.sampler import _MIN_EXPONENTIAL, SamplingConfig, _top_p_mask


def sampling_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """The distribution `Sampler(config)` draws from for `logits` ([vocab]), dense in id order: [vocab] float32
    summing to 1 (-inf logits, e.g. fence-masked ones, get probability 0)."""
    assert not config.greedy, "greedy rows are compared by argmax"
    scaled = logits.float() / config.temperature  # [vocab]
    if 0 < config.top_k < scaled.shape[-1]:
        values, ids = scaled.topk(config.top_k)  # [k], descending, as Sampler takes them
    elif config.top_p < 1.0:
        values, ids = scaled.sort(descending=True)
    else:
        return torch.softmax(scaled, dim=-1)
    probs = torch.softmax(values, dim=-1)
    if config.top_p < 1.0:
        probs = _top_p_mask(probs, config.top_p)  # the same nucleus rule as Sampler
        probs = probs / probs.sum()
    return torch.zeros_like(scaled).scatter_(0, ids, probs)


def greedy_accepts(rows: torch.Tensor, draft: Sequence[int]) -> int:
    """How many leading draft tokens equal the row-wise argmax (rows: [len(draft), vocab])."""
    targets = rows.argmax(dim=-1).tolist()  # the one host sync of the check
    accepted = 0
    while accepted < len(draft) and draft[accepted] == targets[accepted]:
        accepted += 1
    return accepted


def sampled_accepts(rows: torch.Tensor, draft: Sequence[int], config: SamplingConfig,
                    generator: torch.Generator) -> tuple[int, torch.Tensor | None]:
    """Accept/reject each draft token in turn against its row's distribution.

    Returns (accepted, residual): residual is None when the whole draft was accepted; otherwise it is the
    distribution ([vocab], unnormalized) the token at the first rejected position must be drawn from
    (`sample_from`). Rows past the first rejection are never looked at."""
    uniforms = torch.rand(len(draft), generator=generator, device=rows.device).tolist()
    for position, token_id in enumerate(draft):
        probs = sampling_probs(rows[position], config)
        if uniforms[position] < probs[token_id].item():
            continue
        probs[token_id] = 0.0  # p(d) < 1 here (uniforms are < 1), so something is left
        return position, probs
    return len(draft), None


def sample_from(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw from `probs` ([vocab], nonnegative, any positive sum) → [1, 1] long, by the same exponential race
    `Sampler` uses (argmax(p / E), E ~ Exp(1)): no normalization, no multinomial."""
    draws = torch.empty_like(probs).uniform_(generator=generator).log_().neg_().clamp_min_(_MIN_EXPONENTIAL)
    return (probs / draws).argmax().view(1, 1)
