"""Issue 22's must-hold on llama.cpp: agent-shaped prompts answered cold, from the device tier and from the SSD
tier after a restart give the same greedy tokens, with other conversations in the cache (engine level).

    .venv/bin/python bench/cache_exactness_agents.py MODEL_DIR_OR_GGUF [--config exact] [--prompts 20]
        [--min-tokens 2000] [--max-tokens 6000] [--new-tokens 64] [--keep 3] [--threads 1]

Two contexts play the daemon before and after a restart; each holds two other conversations first. Each prompt
(2K..6K tokens, spread evenly, each its own files and question) is
- cold: prefilled in the first context in 512-token steps like the runtime's idle prefill, beside everything
  cached there, and answered greedily (--new-tokens one-token steps);
- a device-tier hit: its cached cells shared (seq_cp) up to all but the last token, which is fed again (what the
  runtime does on a repeated prompt), and answered again;
- an SSD hit after the restart: saved like the SSD tier (llama_state_seq_get_data of the prompt less its last
  token) to a scratch file, read back into the second context, its last token fed, answered.
Only the last --keep prompts stay cached in the first context, every other one (the last --keep of them) in
the second (the rest are released: free cells before kept ones, which an exact pool compacts before it places
more). --first N starts at prompt N (the rest of a run cut short).

One JSON line per prompt (`agree` = leading greedy tokens equal to cold's, `max_dlogit` = max |Δlogit| over
the steps whose inputs were equal), then a summary: prompts whose three answers are equal, the max |Δlogit|,
cold prefill and decode tok/s, KV bytes per token, compactions and the seconds they took.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cache_exactness import CONFIGS, OTHER, compare, greedy, prefill, tokenize  # noqa: E402
from zllm.engine.contract import Row  # noqa: E402
from zllm.engine.llamacpp.backend import ContextSettings, LlamaCppEngine  # noqa: E402

SYSTEM = ("You are a coding agent working in a repository. Follow the user's instructions exactly, keep answers "
          "short, and use the tools when a file must be read. Prefer small diffs; run the tests you touch. ")
QUESTIONS = ("Which function feeds the tokens?", "Where is the batch freed?", "What does the scheduler return?",
             "Which class owns the cache?", "Name the function that samples.")


def agent_prompt(index: int, n_tokens: int, engine: LlamaCppEngine) -> list[int]:
    """A ChatML agent transcript of ~n_tokens: system prompt, tool calls reading files, tool results, a question."""
    parts = [f"<|im_start|>system\n{SYSTEM * 3}<|im_end|>\n"]
    j = 0
    while len(tokenize(engine, "".join(parts))) < n_tokens - 60:
        name = f"src/pkg_{index}/mod_{j}.py"
        body = "".join(f"def f_{index}_{j}_{k}(rows, batch):\n    feeds = [(r.seq, t) for r in rows for t in r.ids]\n"
                       f"    return batch.decode(feeds[:{k + 1}])  # step {k}\n" for k in range(6))
        parts.append(f"<|im_start|>assistant\n<tool_call>\n{{\"name\": \"read\", \"arguments\": {{\"path\": "
                     f"\"{name}\"}}}}\n</tool_call><|im_end|>\n<|im_start|>tool\n# {name}\n{body}<|im_end|>\n")
        j += 1
    parts.append(f"<|im_start|>user\n{QUESTIONS[index % len(QUESTIONS)]} One sentence.<|im_end|>\n"
                 "<|im_start|>assistant\n")
    return tokenize(engine, "".join(parts))


class Timed:
    """Seconds spent in an engine's pool compactions (the exact mode's cost after cells are freed)."""

    def __init__(self, engine: LlamaCppEngine):
        self.seconds, original = 0.0, getattr(engine, "_compact", None)
        if original is None:
            return

        def compact():
            t0 = time.perf_counter()
            original()
            self.seconds += time.perf_counter() - t0
        engine._compact = compact


def others(engine: LlamaCppEngine, n: int = 900) -> None:
    for i in range(2):
        prefill(engine, engine.open(), tokenize(engine, f"Conversation {i}. " + OTHER * (n // 20 + 1))[:n])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--config", default="exact", choices=list(CONFIGS))
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--min-tokens", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=6000)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--first", type=int, default=0, help="start at this prompt (the rest of a run cut short)")
    args = parser.parse_args()
    gguf = str(args.model / "model.gguf" if args.model.is_dir() else args.model)
    flash, kv_type, ubatch, exact = CONFIGS[args.config]
    cells = 2 * 900 + (args.keep + 2) * (args.max_tokens + args.new_tokens)
    settings = ContextSettings(cells=cells, threads=args.threads, flash_attention=flash, kv_type=kv_type, ubatch=ubatch, exact=exact)
    scratch = Path(tempfile.mkdtemp(prefix="cache-exactness-"))
    sizes = [args.min_tokens + (args.max_tokens - args.min_tokens) * i // max(args.prompts - 1, 1)
             for i in range(args.prompts)]
    sizes = [sizes[i // 2] if i % 2 == 0 else sizes[-1 - i // 2] for i in range(len(sizes))]  # short, long, ...
    n, results, prefill_s, prefill_tokens, decode_s = args.new_tokens, [], 0.0, 0, 0.0

    engine, restarted = LlamaCppEngine(gguf, settings), LlamaCppEngine(gguf, settings)  # before / after a restart
    timers = [Timed(engine), Timed(restarted)]
    try:
        others(engine)
        others(restarted)
        kept, kept_after = [], []
        for i, size in enumerate(sizes):
            if i < args.first:
                continue
            ids = agent_prompt(i, size, engine)
            seq = engine.open()
            t0 = time.perf_counter()
            logits = prefill(engine, seq, ids)
            t1 = time.perf_counter()
            cold = greedy(engine, seq, logits, n)
            decode_s += time.perf_counter() - t1
            prefill_s, prefill_tokens = prefill_s + t1 - t0, prefill_tokens + len(ids)
            hit = engine.share(seq, len(ids) - 1)
            device = greedy(engine, hit, engine.step([Row(hit, ids[-1:])])[0], n)
            engine.release(hit)
            snapshot = engine.share(seq, len(ids) - 1)
            (scratch / "state").write_bytes(engine.export_state(snapshot))
            engine.release(snapshot)
            kept.append(seq)
            if len(kept) > args.keep:
                engine.release(kept.pop(0))
            restored = restarted.import_state(bytearray((scratch / "state").read_bytes()), len(ids) - 1)
            ssd = greedy(restarted, restored, restarted.step([Row(restored, ids[-1:])])[0], n)
            if i % 2:  # every other one stays cached there too: later restores land beside and after holes
                restarted.release(restored)
            else:  # the last --keep of them (a bounded pool, as the SSD tier's restores evict)
                kept_after.append(restored)
                if len(kept_after) > args.keep:
                    restarted.release(kept_after.pop(0))
            results.append({"prompt": i, "tokens": len(ids), "device": compare(cold, device), "ssd": compare(cold, ssd)})
            print(json.dumps(results[-1]), flush=True)
        bytes_per_token = engine.bytes_per_token
    finally:
        engine.close()
        restarted.close()
        (scratch / "state").unlink(missing_ok=True)
        scratch.rmdir()
    compactions = engine.compactions + restarted.compactions
    compact_s = sum(timer.seconds for timer in timers)
    equal = sum(r["device"]["agree"] == n and r["ssd"]["agree"] == n for r in results)
    print(json.dumps({"summary": True, "model": Path(gguf).name, "config": args.config, "threads": args.threads,
                      "prompts": len(results), "tokens": [min(r["tokens"] for r in results), max(r["tokens"] for r in results)],
                      "all_three_equal": equal,
                      "max_dlogit": max(max(r["device"]["max_dlogit"], r["ssd"]["max_dlogit"]) for r in results),
                      "prefill_tok_s": round(prefill_tokens / prefill_s, 1),
                      "decode_tok_s": round(len(results) * (n - 1) / decode_s, 1),
                      "kv_bytes_per_token": bytes_per_token, "compactions": compactions,
                      "compact_s": round(compact_s, 2)}), flush=True)


if __name__ == "__main__":
    main()
