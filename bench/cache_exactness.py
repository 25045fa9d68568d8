"""Does a cached prefix answer like a cold prefill on llama.cpp? Engine-level experiments (issue 22).

    .venv/bin/python bench/cache_exactness.py [MODEL_DIR or GGUF] [--threads 1] [--configs base,fa_off,...]
        [--prompt-tokens 1500] [--new-tokens 16] [--other-tokens 900] [--cost --rounds 3]

For each llama.cpp context configuration (--configs; CONFIGS below), on the same model and the same tokens,
one JSON line per scenario, each compared with `cold` (the same tokens prefilled in a fresh context, alone):

- cold_beside: the same tokens prefilled beside another sequence (--other-tokens cells before them in the pool)
- hit_same: a device-tier hit on the same prompt (the runtime's repeat: share all but the last token, feed it)
- hit_turn2: a device-tier hit on turn 2 of a conversation: turn 1's prompt and its greedy answer are kept (the
  answer's KV made by one-token decode steps), turn 2 shares them and prefills only its new message
- hit_turn2_after_hole: hit_turn2 again after the other sequence (placed first) is released: the new cells
  land in the hole before the kept ones (llama.cpp's find_slot restarts at cell 0 when the space before its head
  is large), so the sequence's cells are no longer in position order
- ssd_turn2: the same kept sequence exported (llama_state_seq_get_data), loaded into a fresh context that holds
  another sequence, and continued like hit_turn2

Figures per scenario: `agree` = how many of the --new-tokens greedy tokens equal cold's (from the first),
`max_dlogit` = max |logit difference| over the steps whose inputs were still equal (the first token's logits
and every step while the tokens agree). Per configuration: `prefill_tok_s` (cold prefill of the turn-2 prompt,
512-token steps like the runtime's idle prefill) and `decode_tok_s` (one-token greedy steps), so a
configuration's cost sits beside its exactness.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llama_cpp as lc  # noqa: E402
import numpy as np  # noqa: E402

from zllm.engine.contract import Row  # noqa: E402
from zllm.engine.llamacpp.backend import ContextSettings, LlamaCppEngine  # noqa: E402

FA_AUTO, FA_OFF = lc.LLAMA_FLASH_ATTN_TYPE_AUTO, lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
FA_ON = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
F16, Q8_0 = lc.GGML_TYPE_F16, lc.GGML_TYPE_Q8_0
CONFIGS = {  # name: (flash attention, KV type, ubatch, ContextSettings.exact)
    "base": (FA_AUTO, F16, 512, False),  # what zllm ran before issue 22 (and --no-exact-cache)
    "fa_off": (FA_OFF, F16, 512, False),
    "fa_on": (FA_ON, F16, 512, False),
    "fa_on_ub32": (FA_ON, F16, 32, False),  # < 64 query rows: the per-cell FA kernel, never the tiled one
    "fa_on_q8": (FA_ON, Q8_0, 512, False),  # a quantized KV: the per-cell FA kernel always
    "exact": (FA_ON, Q8_0, 512, True),  # --exact-cache: + no 1-row matmul, cells kept in position order
}
CHUNK = 512  # the scheduler's idle_prefill_chunk
SYSTEM = ("You are a coding agent working in a repository. Follow the user's instructions exactly, keep answers "
          "short, and use the tools when a file must be read. ")
CODE = ("def step(self, rows):\n    feeds = [(row.seq, t) for row in rows for t in row.token_ids]\n"
        "    return self._decode(feeds)  # one llama_decode per batch\n")
OTHER = "Unrelated conversation about the weather in Lisbon, the price of bread and a football match. "


def chat_text(n_tokens_hint: int, seed: int = 0) -> str:
    """An agent-shaped ChatML prompt: a system prompt, tool results (code), a user turn; ~n_tokens_hint tokens."""
    parts = [f"<|im_start|>system\n{SYSTEM * 4}<|im_end|>\n"]
    i = seed
    while sum(len(p) for p in parts) < n_tokens_hint * 3.2:
        parts.append(f"<|im_start|>user\nRead file src/mod_{i}.py<|im_end|>\n<|im_start|>tool\n"
                     f"# src/mod_{i}.py\n{CODE * 3}<|im_end|>\n")
        i += 1
    parts.append("<|im_start|>user\nWhich function feeds the tokens? Answer in one sentence.<|im_end|>\n"
                 "<|im_start|>assistant\n")
    return "".join(parts)


def tokenize(engine: LlamaCppEngine, text: str) -> list[int]:
    vocab = lc.llama_model_get_vocab(engine.model)
    data = text.encode()
    buffer = (lc.llama_token * (len(data) + 16))()
    n = lc.llama_tokenize(vocab, data, len(data), buffer, len(buffer), False, True)
    assert n > 0
    return list(buffer[:n])


def prefill(engine: LlamaCppEngine, seq, ids: list[int], chunk: int = CHUNK) -> np.ndarray:
    """ids appended to seq in `chunk`-token steps (the runtime's idle prefill); the last token's logits."""
    logits = None
    for start in range(0, len(ids), chunk):
        (logits,) = engine.step([Row(seq, ids[start:start + chunk])])
    return logits


def greedy(engine: LlamaCppEngine, seq, logits: np.ndarray, n: int) -> tuple[list[int], list[np.ndarray]]:
    """n greedy tokens from `logits`; every step's logits (the first = the given ones). The last token sampled
    is not fed (as in the runtime: a kept sequence ends one token short of its answer)."""
    tokens, steps = [], [logits]
    for i in range(n):
        tokens.append(int(np.argmax(logits)))
        if i + 1 < n:
            (logits,) = engine.step([Row(seq, [tokens[-1]])])
            steps.append(logits)
    return tokens, steps


def compare(reference, other) -> dict:
    (ref_tokens, ref_steps), (tokens, steps) = reference, other
    agree = next((i for i, (a, b) in enumerate(zip(ref_tokens, tokens)) if a != b), len(ref_tokens))
    equal_inputs = min(agree + 1, len(steps))  # step i's logits come from equal inputs while tokens[:i] agree
    delta = max(float(np.max(np.abs(ref_steps[i] - steps[i]))) for i in range(equal_inputs))
    return {"agree": agree, "of": len(ref_tokens), "max_dlogit": round(delta, 5)}


class Experiment:
    def __init__(self, gguf: str, config: str, threads: int, args):
        flash, kv_type, ubatch, exact = CONFIGS[config]
        self.settings = ContextSettings(cells=max(8192, 4 * (args.prompt_tokens + args.other_tokens)),
                                        threads=threads, flash_attention=flash, kv_type=kv_type, ubatch=ubatch,
                                        exact=exact)
        self.gguf, self.args = gguf, args

    def engine(self) -> LlamaCppEngine:
        return LlamaCppEngine(self.gguf, self.settings)

    def with_other(self, engine: LlamaCppEngine):
        """A sequence of unrelated tokens placed first in the pool (another conversation in the cache)."""
        other = engine.open()
        ids = tokenize(engine, OTHER * (self.args.other_tokens // 20 + 1))[: self.args.other_tokens]
        prefill(engine, other, ids)
        return other

    def cold(self, ids: list[int], *, beside: bool = False, timed: bool = False):
        engine = self.engine()
        try:
            if beside:
                self.with_other(engine)
            seq = engine.open()
            t0 = time.perf_counter()
            logits = prefill(engine, seq, ids)
            t1 = time.perf_counter()
            result = greedy(engine, seq, logits, self.args.new_tokens)
            t2 = time.perf_counter()
            if timed:
                self.cost = {"prefill_tok_s": round(len(ids) / (t1 - t0), 1),
                             "decode_tok_s": round((self.args.new_tokens - 1) / (t2 - t1), 1)}
            return result
        finally:
            engine.close()

    def run(self) -> dict:
        n = self.args.new_tokens
        probe = self.engine()
        turn1 = tokenize(probe, chat_text(self.args.prompt_tokens))
        probe.close()
        figures = {}
        cold1 = self.cold(turn1)
        figures["cold_beside"] = compare(cold1, self.cold(turn1, beside=True))
        engine = self.engine()
        try:
            other = self.with_other(engine)
            first = engine.open()
            answer, _ = greedy(engine, first, prefill(engine, first, turn1), n)  # KV: turn1 + answer[:-1]
            hit = engine.share(first, len(turn1) - 1)
            figures["hit_same"] = compare(cold1, greedy(engine, hit, prefill(engine, hit, turn1[-1:]), n))
            engine.release(hit)
            turn2 = turn1 + answer + tokenize(engine, "<|im_end|>\n<|im_start|>user\nAnd which one samples? "
                                                      "One sentence.<|im_end|>\n<|im_start|>assistant\n")
            kept = len(turn1) + n - 1
            saved = bytes(engine.export_state(first))
            hit = engine.share(first, kept)
            hit2 = greedy(engine, hit, prefill(engine, hit, turn2[kept:]), n)
            engine.release(hit)
            engine.release(other)  # a hole before the kept cells: llama.cpp refills from cell 0 when it is big
            hole = engine.share(first, kept)
            hole2 = greedy(engine, hole, prefill(engine, hole, turn2[kept:]), n)
        finally:
            engine.close()
        cold2 = self.cold(turn2, timed=True)
        figures["hit_turn2"] = compare(cold2, hit2)
        figures["hit_turn2_after_hole"] = compare(cold2, hole2)
        engine = self.engine()
        try:
            self.with_other(engine)
            restored = engine.import_state(bytearray(saved), kept)
            figures["ssd_turn2"] = compare(cold2, greedy(engine, restored, prefill(engine, restored, turn2[kept:]), n))
        finally:
            engine.close()
        return {"prompt_tokens": [len(turn1), len(turn2)], **figures, **self.cost}


def cost(gguf: str, configs: list[str], args) -> None:
    """Prefill and decode tok/s per configuration, interleaved per round (machine noise hits them alike), best
    of --rounds; and the KV bytes a token takes (the cache's capacity per MB)."""
    best: dict[str, dict] = {c: {"prefill_tok_s": 0.0, "decode_tok_s": 0.0} for c in configs}
    for _ in range(args.rounds):
        for config in configs:
            experiment = Experiment(gguf, config, args.threads, args)
            engine = experiment.engine()
            try:
                ids = tokenize(engine, chat_text(args.prompt_tokens))
                seq = engine.open()
                t0 = time.perf_counter()
                logits = prefill(engine, seq, ids)
                t1 = time.perf_counter()
                greedy(engine, seq, logits, args.new_tokens)
                t2 = time.perf_counter()
                figures = best[config]
                figures["prefill_tok_s"] = max(figures["prefill_tok_s"], round(len(ids) / (t1 - t0), 1))
                figures["decode_tok_s"] = max(figures["decode_tok_s"], round((args.new_tokens - 1) / (t2 - t1), 1))
                figures["kv_bytes_per_token"] = engine.bytes_per_token
                figures["prompt_tokens"] = len(ids)
            finally:
                engine.close()
    for config, figures in best.items():
        print(json.dumps({"model": Path(gguf).name, "config": config, "threads": args.threads, "cost": figures}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="a GGUF file or a zllm model directory holding model.gguf")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--prompt-tokens", type=int, default=1500)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--other-tokens", type=int, default=900)
    parser.add_argument("--cost", action="store_true", help="only prefill/decode tok/s and KV bytes per token")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    gguf = args.model / "model.gguf" if args.model.is_dir() else args.model
    if args.cost:
        return cost(str(gguf), args.configs.split(","), args)
    for config in args.configs.split(","):
        t0 = time.perf_counter()
        figures = Experiment(str(gguf), config, args.threads, args).run()
        print(json.dumps({"model": gguf.name, "config": config, "threads": args.threads, **figures,
                          "wall_s": round(time.perf_counter() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
