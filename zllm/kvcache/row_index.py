"""`RowTable`: the SSD tier's rows by id, indexed for the longest-prefix lookup.

A lookup used to compare the request with every snapshot. Any snapshot sharing at least `BLOCK` tokens with
the request shares its first `BLOCK` tokens exactly, so rows are bucketed by (namespace, those tokens): a
lookup compares the request only with its bucket (plus the namespace's rows shorter than a block, and every
row of the namespace when the request itself is shorter). A shorter shared prefix is never worth a restore.

    rows = RowTable(namespace_of=lambda row: row.namespace, tokens_of=lambda row: row.tokens)   # int32 LE bytes
    rows[row.id] = row; rows.pop(row.id)      # a dict; the index follows every change
    rows.candidates(namespace, packed_prompt) # the rows that can share a useful prefix with the prompt
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

BLOCK = 16  # tokens
_BLOCK_BYTES = 4 * BLOCK  # tokens are packed int32 LE


class RowTable(dict):
    def __init__(self, rows=(), *, namespace_of: Callable = lambda row: row.namespace,
                 tokens_of: Callable = lambda row: row.tokens):
        super().__init__()
        self._namespace_of, self._tokens_of = namespace_of, tokens_of
        self._buckets: dict[tuple[str, bytes], set[str]] = defaultdict(set)
        self._by_namespace: dict[str, set[str]] = defaultdict(set)
        for key, row in dict(rows).items():
            self[key] = row

    def _key(self, row) -> tuple[str, bytes]:
        tokens = self._tokens_of(row)
        return self._namespace_of(row), tokens[:_BLOCK_BYTES] if len(tokens) >= _BLOCK_BYTES else b""

    def __setitem__(self, key, row) -> None:
        if key in self:
            self._unindex(key, self[key])
        super().__setitem__(key, row)
        self._buckets[self._key(row)].add(key)
        self._by_namespace[self._namespace_of(row)].add(key)

    def __delitem__(self, key) -> None:
        self._unindex(key, self[key])
        super().__delitem__(key)

    def pop(self, key, *default):
        if key in self:
            self._unindex(key, self[key])
        return super().pop(key, *default)

    def clear(self) -> None:
        super().clear()
        self._buckets.clear()
        self._by_namespace.clear()

    def _unindex(self, key, row) -> None:
        for index, name in ((self._buckets, self._key(row)), (self._by_namespace, self._namespace_of(row))):
            index[name].discard(key)
            if not index[name]:
                del index[name]

    def candidates(self, namespace: str, packed: bytes) -> list:
        """Rows of `namespace` that can share at least a block with `packed` (or any prefix, for rows or
        requests shorter than a block)."""
        if len(packed) < _BLOCK_BYTES:
            ids = self._by_namespace.get(namespace, ())
        else:
            ids = self._buckets.get((namespace, packed[:_BLOCK_BYTES]), set()) | \
                self._buckets.get((namespace, b""), set())
        return [self[key] for key in ids]
