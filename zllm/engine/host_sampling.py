"""The sampling rule on numpy arrays in host memory (engine/sampler.py says what it is; torch/sampling.py is the
same rule on torch tensors). Every function takes one row of logits or probabilities, `[vocab]` float."""

from __future__ import annotations

from typing import Any

import numpy as np

MIN_EXPONENTIAL = 1e-20


def greedy(logits: np.ndarray) -> np.ndarray:
    return np.array([[int(np.argmax(logits))]], dtype=np.int64)


def sample(logits: np.ndarray, config: Any, generator: np.random.Generator) -> np.ndarray:
    """One draw from the temperature / top-k / top-p distribution of `logits` → [1, 1] int64."""
    probs, candidate_ids = _distribution(logits, config)
    choice = int(np.argmax(probs / _exponentials(len(probs), generator)))
    return np.array([[choice if candidate_ids is None else int(candidate_ids[choice])]], dtype=np.int64)


def sampling_probs(logits: np.ndarray, config: Any) -> np.ndarray:
    """The distribution `sample` draws from, dense in id order: [vocab] float32 summing to 1."""
    probs, candidate_ids = _distribution(logits, config)
    if candidate_ids is None:
        return probs
    dense = np.zeros(logits.shape[-1], dtype=np.float32)
    dense[candidate_ids] = probs / probs.sum()
    return dense


def draw(probs: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    """One draw from `probs` ([vocab], nonnegative, any positive sum) → [1, 1] int64, by the same race."""
    return np.array([[int(np.argmax(probs / _exponentials(len(probs), generator)))]], dtype=np.int64)


def uniforms(count: int, generator: np.random.Generator, like: np.ndarray) -> list[float]:
    return generator.random(count).tolist()


def top_p_mask(sorted_probs: np.ndarray, top_p: float) -> np.ndarray:
    """Zero every token after the smallest prefix (of the descending order) whose mass reaches `top_p`; the most
    likely token always survives (a token is kept while the mass *before* it is below top_p)."""
    mass_before = np.cumsum(sorted_probs) - sorted_probs
    return np.where(mass_before >= top_p, np.float32(0.0), sorted_probs)


def _distribution(logits: np.ndarray, config: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """(probs, ids): the unnormalized distribution sampling draws from over candidate `ids` (descending by logit),
    or over the whole vocabulary in id order (ids None) when neither top-k nor top-p cuts it.

    top-k: softmax over the k best. top-p alone: the probabilities of the whole vocabulary (the nucleus is a
    share of ITS mass), over the shortest descending prefix known to hold the nucleus — found by partitioning
    the best 64, 256, ... ids instead of sorting the whole vocabulary (most of which the nucleus never reaches).
    Then the nucleus rule zeroes what falls past top_p; the most likely token always stays."""
    scaled = logits.astype(np.float32, copy=False) / np.float32(config.temperature)
    if 0 < config.top_k < scaled.shape[-1]:
        ids = _best(scaled, config.top_k)
        probs = _softmax(scaled[ids])
    elif config.top_p < 1.0:
        everything = _softmax(scaled)
        ids = _nucleus_prefix(scaled, everything, config.top_p)
        probs = everything[ids]
    else:
        return _softmax(scaled), None
    if config.top_p < 1.0:
        probs = top_p_mask(probs, config.top_p)
    return probs, ids


def _best(scaled: np.ndarray, count: int) -> np.ndarray:
    """The `count` highest-scoring ids, sorted descending (ties: lower id first)."""
    if count >= len(scaled):
        return np.argsort(-scaled, kind="stable")
    top = np.argpartition(-scaled, count - 1)[:count]
    return top[np.lexsort((top, -scaled[top]))]


def _nucleus_prefix(scaled: np.ndarray, probs: np.ndarray, top_p: float) -> np.ndarray:
    count = 64
    while count < len(scaled):
        ids = _best(scaled, count)
        if probs[ids].sum() >= top_p:
            return ids
        count *= 4
    return _best(scaled, len(scaled))


def _softmax(scaled: np.ndarray) -> np.ndarray:
    exps = np.exp(scaled - scaled.max())
    exps /= exps.sum()
    return exps


def _exponentials(count: int, generator: np.random.Generator) -> np.ndarray:
    """E ~ Exp(1) as -log(U), floored so a masked (0) probability never becomes 0/0."""
    draws = generator.random(count, dtype=np.float32)
    with np.errstate(divide="ignore"):  # U = 0 gives E = inf: that token's p / E is 0, as it should be
        np.log(draws, out=draws)
    np.negative(draws, out=draws)
    return np.maximum(draws, np.float32(MIN_EXPONENTIAL), out=draws)
