"""Tokenize a continuing conversation without re-tokenizing the part an earlier prompt already held.

An agent resends its whole conversation every turn, and a fast (Rust) tokenizer takes about a second of CPU for
40K tokens on a loaded core: on a warm turn that is more than the prefill of what is new. A fast tokenizer splits
its input at special (added) tokens before anything else, so the ids of the text before a special token do not
depend on what follows it. When a new prompt repeats a recent one's text up to and past one of its special tokens
(a chat template opens every turn with one), the ids before that token are reused and only the rest is encoded:
the result is exactly the full encoding (tests/unit/prompt/test_prefix_encode.py checks it on several
tokenizers). Slow (Python) tokenizers, and tokens that eat the whitespace before them, are left to the tokenizer.
"""

from __future__ import annotations

import bisect
import threading
from array import array
from dataclasses import dataclass

from zllm.token_prefix import common_prefix_length  # noqa: F401 (its tests import it from here)

KEEP = 8  # recent prompts remembered: a main conversation and the side requests between its turns


@dataclass(frozen=True)
class _Encoded:
    text: str
    ids: array  # int32: a 40K-token prompt in 160 KB, not the 1.4 MB of a list of ints
    cut_chars: list[int]  # where a special token starts in text (ascending) ...
    cut_ids: list[int]  # ... and its index in ids


class PrefixReusingEncoder:
    """`encode(text)` == `tokenizer.encode(text, add_special_tokens=False)`, reusing the ids of recent prompts."""

    def __init__(self, tokenizer, keep: int = KEEP):
        self._tokenizer = tokenizer
        # split_special_tokens: the tokenizer encodes special tokens' text as plain text, so there is nothing to cut at
        fast = getattr(tokenizer, "is_fast", False) and not getattr(tokenizer, "split_special_tokens", False)
        backend = getattr(tokenizer, "backend_tokenizer", None) if fast else None
        added = backend.get_added_tokens_decoder() if backend is not None else {}
        # a cut sits before a special token matched on the raw text, whatever precedes it (no lstrip, no single_word)
        self._cut_tokens = {token_id for token_id, token in added.items() if token.special and token.content
                            and not (token.lstrip or token.normalized or token.single_word)}
        # the longest added token: a cut this far inside the shared prefix is matched the same in both texts
        self._margin = max((len(token.content) for token in added.values()), default=0)
        self._backend = backend if self._cut_tokens else None
        self._keep = keep
        self._recent: list[_Encoded] = []
        self._lock = threading.Lock()
        self.last_reused_chars = 0  # how much of the last text came from a recent prompt (for tests and traces)

    def encode(self, text: str) -> list[int]:
        if self._backend is None:
            return list(self._tokenizer.encode(text, add_special_tokens=False))
        start, ids, cut_chars, cut_ids = self._reusable_prefix(text)
        self.last_reused_chars = start
        encoding = self._backend.encode(text[start:], add_special_tokens=False)
        for index, (token_id, (begin, _)) in enumerate(zip(encoding.ids, encoding.offsets)):
            if token_id in self._cut_tokens:
                cut_chars.append(start + begin)
                cut_ids.append(len(ids) + index)
        ids.extend(encoding.ids)
        self._remember(_Encoded(text, ids, cut_chars, cut_ids))
        return ids.tolist()

    def _reusable_prefix(self, text: str) -> tuple[int, array, list[int], list[int]]:
        """(chars reused, their ids, the cuts inside them) from the recent prompt that shares the most."""
        with self._lock:
            recent = list(self._recent)
        best = (0, array("i"), [], [])
        for entry in recent:
            shared = common_prefix_length(entry.text, text) - self._margin
            cut = bisect.bisect_right(entry.cut_chars, shared) - 1  # the last cut at or before `shared`
            if cut >= 0 and entry.cut_chars[cut] > best[0]:
                best = (entry.cut_chars[cut], entry.ids[:entry.cut_ids[cut]], entry.cut_chars[:cut],
                        entry.cut_ids[:cut])
        start, ids, cut_chars, cut_ids = best
        return start, array("i", ids), list(cut_chars), list(cut_ids)

    def _remember(self, encoded: _Encoded) -> None:
        with self._lock:
            # a prompt that extends a remembered one replaces it: one entry per conversation
            self._recent = [entry for entry in self._recent if not encoded.text.startswith(entry.text)]
            self._recent.append(encoded)
            del self._recent[:-self._keep]
