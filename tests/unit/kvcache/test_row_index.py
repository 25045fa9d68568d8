"""RowTable: the SSD lookup's index gives exactly the rows a full scan would find sharing a useful prefix."""

from __future__ import annotations

import random
from dataclasses import dataclass

from zllm.engine.torch.cache.state import common_prefix_length
from zllm.kvcache.row_index import BLOCK, RowTable
from zllm.kvcache.ssd_index import pack_tokens


@dataclass(frozen=True)
class FakeRow:
    id: str
    namespace: str
    tokens: bytes


def test_candidates_hold_every_row_a_scan_finds_sharing_a_block_and_follow_every_change() -> None:
    rng = random.Random(3)
    stems = [[rng.randrange(50) for _ in range(40)] for _ in range(4)]
    table, everything = RowTable(), {}
    for i in range(300):
        tokens = rng.choice(stems)[:rng.randrange(1, 41)] + [rng.randrange(50) for _ in range(rng.randrange(0, 8))]
        row = FakeRow(f"r{i}", rng.choice("ab"), pack_tokens(tokens))
        table[row.id] = everything[row.id] = row
        if rng.random() < 0.3:  # removals and replacements keep the index in step
            victim = rng.choice(sorted(everything))
            table.pop(victim)
            del everything[victim]
    for _ in range(200):
        prompt = pack_tokens(rng.choice(stems)[:rng.randrange(1, 41)])
        for namespace in "ab":
            found = {row.id for row in table.candidates(namespace, prompt)}
            useful = {row.id for row in everything.values() if row.namespace == namespace
                      and (common_prefix_length(row.tokens, prompt) // 4 >= BLOCK
                           or len(prompt) < 4 * BLOCK or len(row.tokens) < 4 * BLOCK)}
            assert useful <= found  # nothing useful is missed
            assert found <= set(everything)  # nothing removed comes back
    assert set(table) == set(everything)
