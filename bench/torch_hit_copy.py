"""torch prefix cache: a hit that copies the kept prefix vs one that runs in the kept working set, side by side.

    .venv/bin/python bench/torch_hit_copy.py [--kept 4096 16384] [--turns 10] [--new 64] [--decode 24] [--threads 1]

A random-weight Qwen3 with a realistic KV per token (16 layers x 8 KV heads x 64 x float32: 64 KiB, Llama-3-8B's
bf16 KV is 128 KiB) on the CPU, driven through the cache and engine seams in the engine loop's order
(tests/support/cache_contract.py). Turn 1's kept state is written straight into its working set (random KV: a
hit's time does not depend on the values, and a 16K-token cold prefill on one thread would take minutes); each
later turn continues the previous one: `--new` new prompt tokens, then `--decode` greedy tokens.

Both modes run in one process, turn by turn (each pair back to back, the order alternating): `copy` is
TorchKV(keep_working_sets=False), every kept span cloned and every hit copied (the behaviour before), `adopt` the
default. Per mode and size: hit TTFT (acquire + open + prefill of the new tokens + the first token's logits), the
acquire alone, decode tok/s after the hit, the bytes the cache holds after the last turn (kept + pool), and the
median of the per-pair ratios. One JSON line per figure.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from zllm.engine.contract import Row  # noqa: E402
from zllm.engine.torch.cache.kv import TorchKV  # noqa: E402
from zllm.engine.torch.cache.state import KVLayout, slice_state  # noqa: E402
from zllm.engine.torch.runner import ModelRunner  # noqa: E402
from zllm.kvcache import CacheConfig  # noqa: E402
from zllm.kvcache.prefix_cache import PrefixCache  # noqa: E402

VOCAB = 4096


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kept", type=int, nargs="+", default=[4096, 16384], help="kept tokens before the hit")
    parser.add_argument("--turns", type=int, default=10, help="hits per mode and size (each continues the last)")
    parser.add_argument("--new", type=int, default=64, help="new prompt tokens per turn")
    parser.add_argument("--decode", type=int, default=24, help="greedy tokens per turn")
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args()


def model() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=16,
                         num_attention_heads=8, num_key_value_heads=8, head_dim=64, max_position_embeddings=65536,
                         tie_word_embeddings=True)
    return Qwen3ForCausalLM(config).eval()


def tokens(n: int, seed: int) -> tuple[int, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(10, VOCAB, (n,), generator=generator).tolist())


def first_turn(cache: PrefixCache, prompt: tuple[int, ...]) -> None:
    """A finished turn's state without its prefill: random KV written into the working set, then kept."""
    lease = cache.acquire("ns", prompt, max_new_tokens=1)
    for layer in lease.kv:
        for tensor in layer:
            tensor[..., :len(prompt), :].normal_()
    cache.finish(lease, prompt, slice_state(lease.kv, 0, len(prompt)), entry_id="t0", prompt_length=len(prompt))


def hit_turn(cache: PrefixCache, engine: ModelRunner, prompt: tuple[int, ...], decode: int, rid: str):
    """One continuing turn: (TTFT s, acquire s, decode tok/s, the sequence kept)."""
    started = time.perf_counter()
    lease = cache.acquire("ns", prompt, max_new_tokens=decode)
    acquired = time.perf_counter()
    seq = engine.open(lease)
    logits = engine.step([Row(seq, prompt[lease.cached_tokens:])])[0]
    generated = [int(logits.argmax())]
    ttft = time.perf_counter() - started
    assert lease.tier == "device", lease.tier
    decode_started = time.perf_counter()
    for _ in range(decode - 1):
        logits = engine.step([Row(seq, generated[-1:])])[0]
        generated.append(int(logits.argmax()))
    decode_s = time.perf_counter() - decode_started
    sequence = prompt + tuple(generated[:-1])
    kept = engine.kept_state(seq)
    cache.finish(lease, sequence, kept.state, entry_id=rid, prompt_length=len(prompt), buffers=kept.buffers)
    return ttft, acquired - started, (decode - 1) / decode_s, sequence


class Conversation:
    """One mode's cache and the conversation it keeps continuing."""

    def __init__(self, layout: KVLayout, adopt: bool, kept: int):
        self.mode = "adopt" if adopt else "copy"
        self.kv = TorchKV(layout, "cpu", keep_working_sets=adopt)
        self.cache = PrefixCache(CacheConfig(device_budget_bytes=64 << 30), self.kv, cost_key="bench")
        self.sequence = tokens(kept, seed=1)
        first_turn(self.cache, self.sequence)
        self.ttft, self.acquire, self.decode = [], [], []

    def turn(self, engine: ModelRunner, turn: int, args) -> None:
        prompt = self.sequence + tokens(args.new, seed=100 + turn)
        ttft, acquire, tok_s, self.sequence = hit_turn(self.cache, engine, prompt, args.decode, f"t{turn + 1}")
        self.ttft.append(ttft)
        self.acquire.append(acquire)
        self.decode.append(tok_s)

    def summary(self) -> dict[str, object]:
        return {"mode": self.mode, "tokens_at_end": len(self.sequence), "hits": len(self.ttft),
                "hit_ttft_s": round(statistics.median(self.ttft), 4),
                "acquire_s": round(statistics.median(self.acquire), 4),
                "decode_tok_s": round(statistics.median(self.decode), 2), "held_mib": self.kv.held_bytes() >> 20,
                "pool_mib": self.kv.pool_bytes() >> 20, "adoptions": self.kv.adoptions}


def compare(engine: ModelRunner, layout: KVLayout, kept: int, args) -> None:
    """Both modes, turn by turn (each pair back to back, the order alternating: the load of a shared machine
    changes by 2x within minutes, so only a pair's ratio means something)."""
    copy, adopt = Conversation(layout, False, kept), Conversation(layout, True, kept)
    for turn in range(args.turns):
        for conversation in (copy, adopt) if turn % 2 == 0 else (adopt, copy):
            conversation.turn(engine, turn, args)
    ratios = [a / c for a, c in zip(adopt.ttft, copy.ttft)]
    decode = [a / c for a, c in zip(adopt.decode, copy.decode)]
    for conversation in (copy, adopt):
        print(json.dumps(conversation.summary()), flush=True)
    print(json.dumps({"figure": "hit adopt / copy, per turn", "kept_tokens": kept,
                      "ttft_ratio_median": round(statistics.median(ratios), 3),
                      "ttft_ratios": [round(r, 3) for r in ratios],
                      "decode_ratio_median": round(statistics.median(decode), 3),
                      "held_plus_pool_mib": [c.kv.held_bytes() + c.kv.pool_bytes() >> 20 for c in (copy, adopt)]}),
          flush=True)
    copy.cache.close()
    adopt.cache.close()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    engine = ModelRunner(model())
    with engine.engine_thread(args.threads):
        layout = KVLayout.of(engine.probe_kv_state())
        print(json.dumps({"kv_bytes_per_token": layout.bytes_per_token}), flush=True)
        for kept in args.kept:
            compare(engine, layout, kept, args)
            gc.collect()


if __name__ == "__main__":
    main()
