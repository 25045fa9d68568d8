"""Token bitmasks (llguidance's layout) → logits set to -inf, without Python loops over the vocabulary.

Layout: one int32 word per 32 token ids; token `t` is allowed ⇔ bit `t % 32` of word `t // 32` is set
(little-endian bit order, so the words viewed as bytes unpack with numpy's `bitorder="little"`).

    words:  [..., mask_words] int32 (CPU)      logits: [..., vocab] float (any device)

Host float32 logits (numpy from llama.cpp, or a CPU torch tensor viewed as numpy without a copy) are masked
through numpy: where most tokens are allowed (inside a JSON string), unpack the inverted bytes and
`copyto(where=)` -inf; where few are (structure, markup), gather the allowed logits, fill the row with -inf
and put them back. Faster than torch ops and than llguidance.torch's compiled kernel, which also needs a
torch.compile warm-up (bench/fence.py). Torch tensors on other devices or dtypes unpack with shifts on the
logits' device (the kernels their backend registered: engine/sampler.py, engine/torch/sampling.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from zllm.engine.sampler import kernels_for

_BIT_OFFSETS = np.arange(32)
# below 1 nonzero word in this many, keeping the allowed logits beats masking the disallowed ones
_SPARSE_RATIO = 8


def mask_logits(logits: Any, words: np.ndarray) -> None:
    """Set `logits[..., t] = -inf` for every token t whose bit is clear in `words` (ids past the mask too).

    logits: [..., vocab] numpy array or torch tensor; words: [..., mask_words] int32 numpy (llguidance's)."""
    vocab = logits.shape[-1]
    covered = min(vocab, words.shape[-1] * 32)
    if covered < vocab:  # logits wider than the tokenizer llguidance saw: those ids never exist
        logits[..., covered:] = float("-inf")
    host = logits if isinstance(logits, np.ndarray) else kernels_for(logits).host_view(logits)
    if host is not None:
        _mask_cpu(host, words, covered)
    else:
        kernels_for(logits).mask_logits(logits, words, covered)


def _mask_cpu(logits: np.ndarray, words: np.ndarray, covered: int) -> None:
    rows_logits = logits.reshape(-1, logits.shape[-1])
    rows_words = words.reshape(-1, words.shape[-1])
    for row_logits, row_words in zip(rows_logits, rows_words, strict=True):
        nonzero_words = np.flatnonzero(row_words)
        if len(nonzero_words) * _SPARSE_RATIO < len(row_words):
            _mask_sparse(row_logits[:covered], row_words, nonzero_words)
        else:
            disallowed = np.unpackbits(np.invert(row_words.view(np.uint8)), bitorder="little", count=covered)
            np.copyto(row_logits[:covered], -np.inf, where=disallowed.view(bool))


def _mask_sparse(row: np.ndarray, words: np.ndarray, nonzero_words: np.ndarray) -> None:
    """Few tokens allowed (JSON structure, markup): keep those, fill the rest — no pass over a bool mask."""
    bits = np.unpackbits(words[nonzero_words].view(np.uint8), bitorder="little").reshape(-1, 32)  # [nz, 32]
    allowed = (nonzero_words[:, None] * 32 + _BIT_OFFSETS)[bits.view(bool)]
    allowed = allowed[allowed < len(row)]
    kept = row[allowed]
    row.fill(-np.inf)
    row[allowed] = kept


def bit_is_set(words: np.ndarray, token_id: int) -> bool:
    if not 0 <= token_id < len(words) * 32:
        return False
    return bool((int(words[token_id >> 5]) >> (token_id & 31)) & 1)


def count_set(words: np.ndarray) -> int:
    return int(np.count_nonzero(np.unpackbits(words.view(np.uint8))))


def any_set_except(words: np.ndarray, token_id: int) -> bool:
    """Whether some token other than `token_id` is allowed; O(words) with no unpacking."""
    nonzero = np.flatnonzero(words)
    if len(nonzero) != 1:
        return len(nonzero) > 1
    word = int(nonzero[0])
    value = int(words[word]) & 0xFFFFFFFF
    if word == token_id >> 5:
        value &= ~(1 << (token_id & 31))
    return value != 0
