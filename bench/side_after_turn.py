"""The CPU a side request costs right after a long main turn, per thread, on llama.cpp (issue 26).

    .venv/bin/python bench/side_after_turn.py [MODEL_DIR] [--threads 1] [--main-tokens 2048] [--rounds 3]

Through the prefix cache as the daemon builds it (an SSD tier, parking on, the contract tests' request order:
tests/support/cache_contract.py): a kept conversation of --main-tokens, then per round one more main-turn token
(its end exports the conversation for the SSD tier) and at once a 107-token side request sharing nothing (Claude
Code's title request). One JSON line per round, CPU seconds: the engine thread's `finish` (the SSD export), the side
request's admission (parking the conversation) and prefill, and the writer thread's write of the snapshot.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import model_parser, resolve_model_dir  # noqa: E402  (bench/bench_args.py)

from tests.support.cache_contract import ContractBackend  # noqa: E402
from zllm.engine.contract import Row  # noqa: E402
from zllm.engine.llamacpp.loader import load_gguf_model  # noqa: E402

SIDE_TOKENS = 107


def thread_cpu(native_id: int) -> float:
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tokens(n: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(100, 40000) for _ in range(n))


def cpu_of(fn):
    started = time.thread_time()
    result = fn()
    return result, round(time.thread_time() - started, 3)


def main() -> None:
    parser = model_parser(__doc__.splitlines()[0], dtype=False)
    parser.add_argument("--main-tokens", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    loaded = load_gguf_model(resolve_model_dir(args), threads=args.threads, context_length=32768, exact_cache=False)
    backend = ContractBackend("llamacpp", loaded, loaded.engine, loaded.engine.bytes_per_token)
    scratch = Path(tempfile.mkdtemp(prefix="zllm-bench-side-"))
    with backend.engine.engine_thread(args.threads):
        cache = backend.cache(scratch / "kv", budget_tokens=60000, ssd_min_tokens=256)
        writer = cache.writer._thread.native_id
        conversation = tokens(args.main_tokens, 1)
        _, prefill_cpu = cpu_of(lambda: backend.run(cache, conversation, "main0"))
        cache.flush()
        print(json.dumps({"bench": "side_after_turn", "main_tokens": args.main_tokens, "prefill_cpu_s": prefill_cpu}))
        for round_ in range(args.rounds):
            written_before = thread_cpu(writer)
            conversation += tokens(1, 50 + round_)
            lease = backend.acquire(cache, conversation)
            seq = backend.engine.open(lease)
            backend.engine.step([Row(seq, conversation[lease.cached_tokens:])])
            state = backend.engine.kept_state(seq).state
            _, finish_cpu = cpu_of(lambda: cache.finish(lease, conversation, state, entry_id=f"main{round_ + 1}",
                                                        prompt_length=len(conversation)))
            side = tokens(SIDE_TOKENS, 100 + round_)
            side_lease, admit_cpu = cpu_of(lambda: backend.acquire(cache, side))
            side_seq = backend.engine.open(side_lease)
            _, side_prefill_cpu = cpu_of(lambda: backend.engine.step([Row(side_seq, side[side_lease.cached_tokens:])]))
            cache.release(side_lease, backend.engine.kept_state(side_seq).buffers)
            cache.flush()
            print(json.dumps({"bench": "side_after_turn", "round": round_ + 1, "finish_cpu_s": finish_cpu,
                              "side_admit_cpu_s": admit_cpu, "side_prefill_cpu_s": side_prefill_cpu,
                              "writer_cpu_s": round(thread_cpu(writer) - written_before, 3),
                              "parks": cache.kv.parks,
                              "park_exports": getattr(cache.kv, "park_exports", None)}),  # None: before it was counted
                  flush=True)
        cache.close()
    loaded.close()
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
