"""Token bitmasks (llguidance's layout) → logits set to -inf, without Python loops over the vocabulary.

Layout: one int32 word per 32 token ids; token `t` is allowed ⇔ bit `t % 32` of word `t // 32` is set
(little-endian bit order, so the words viewed as bytes unpack with numpy's `bitorder="little"`).

    words:  [..., mask_words] int32 (CPU)      logits: [..., vocab] float (any device)

On CPU a float32 row is masked through numpy: where most tokens are allowed (inside a JSON string), unpack
the inverted bytes and `copyto(where=)` -inf; where few are (structure, markup), gather the allowed logits,
fill the row with -inf and put them back. Measured ~2x faster than torch ops and ~1.5x faster than
llguidance.torch's compiled kernel (which also needs ~10 s of torch.compile warm-up). Other devices and
dtypes unpack with shifts on the logits' device.
"""

from __future__ import annotations

import numpy as np
import torch

_SHIFTS: dict[torch.device, torch.Tensor] = {}
_BIT_OFFSETS = np.arange(32)
# below 1 nonzero word in this many, keeping the allowed logits beats masking the disallowed ones
_SPARSE_RATIO = 8


def mask_logits(logits: torch.Tensor, words: torch.Tensor) -> None:
    """Set `logits[..., t] = -inf` for every token t whose bit is clear in `words` (ids past the mask too)."""
    vocab = logits.shape[-1]
    covered = min(vocab, words.shape[-1] * 32)
    if covered < vocab:  # logits wider than the tokenizer llguidance saw: those ids never exist
        logits[..., covered:] = float("-inf")
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.is_contiguous():
        _mask_cpu(logits.numpy(), words.numpy(), covered)
    else:
        _mask_torch(logits, words, covered)


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


def _mask_torch(logits: torch.Tensor, words: torch.Tensor, covered: int) -> None:
    device = logits.device
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS.setdefault(device, torch.arange(32, dtype=torch.int32, device=device))
    on_device = words.to(device, non_blocking=True)  # [..., mask_words]
    bits = (on_device.unsqueeze(-1) >> shifts) & 1  # [..., mask_words, 32]
    allowed = bits.flatten(-2)[..., :covered]  # [..., covered]
    logits[..., :covered].masked_fill_(allowed == 0, float("-inf"))


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
