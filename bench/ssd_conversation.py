"""SSD disk use of one N-turn conversation, with and without supersession (a turn's snapshot deleting the earlier
turns it holds, kvcache/snapshot_store.py).

    .venv/bin/python bench/ssd_conversation.py [--turns 10] [--first 300] [--per-turn 200] [--backends torch,llamacpp]

The tiny random-weight qwen3 of the tests (tests/support/tiny_models.py, CPU, one thread) on each backend, through
the prefix cache as the daemon builds it (runtime/prefix.py): turn n's prompt is turn n-1's prompt, its 4 generated
tokens and `--per-turn` new ones; the writer is drained after each turn. Then the SSD tier's snapshots and the
bytes its blob files take on disk. "without" is the same run with supersession switched off (what the store did
before). One JSON line per (backend, mode).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.cache_contract import contract_backend  # noqa: E402

from zllm.kvcache import snapshot_store  # noqa: E402


def conversation(backend, directory: Path, turns: int, first: int, per_turn: int) -> dict:
    rng = random.Random(0)
    new = lambda n: tuple(rng.randrange(30, 4000) for _ in range(n))  # noqa: E731
    cache, prompt = backend.cache(directory), new(first)
    for turn in range(turns):
        _, generated = backend.run(cache, prompt, f"t{turn}", generate=4)
        cache.flush()
        prompt = prompt + tuple(generated) + new(per_turn)
    ssd = cache.stats().ssd
    cache.close()
    blobs = list(backend.tier_dir(directory).joinpath("blobs").iterdir())
    return {"snapshots": ssd.snapshots, "disk_bytes": sum(p.stat().st_size for p in blobs), "files": len(blobs),
            "last_turn_tokens": len(prompt) - per_turn, "bytes_per_token": backend.bytes_per_token}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--first", type=int, default=300)
    parser.add_argument("--per-turn", type=int, default=200)
    parser.add_argument("--backends", default="torch,llamacpp")
    args = parser.parse_args()
    context = args.first + args.turns * (args.per_turn + 8) + 64
    for name in args.backends.split(","):
        fixture = contract_backend(name, context_length=context)
        backend = next(fixture)
        try:
            for mode in ("without", "with"):
                with tempfile.TemporaryDirectory(prefix="zllm-bench-ssd-conv-") as scratch, \
                        mock.patch.object(snapshot_store, "supersedes",
                                          snapshot_store.supersedes if mode == "with" else lambda newer, older: False):
                    figures = conversation(backend, Path(scratch) / "kv", args.turns, args.first, args.per_turn)
                print(json.dumps({"backend": name, "supersession": mode, "turns": args.turns, **figures}), flush=True)
        finally:
            fixture.close()


if __name__ == "__main__":
    main()
