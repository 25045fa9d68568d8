"""Decode and prefill speed of zllm's engine loop vs Hugging Face `model.generate()`, side by side in one run.

    .venv/bin/python bench/decode.py [MODEL_DIR] [--threads 1] [--new-tokens 128] [--prefill-tokens 1000]

MODEL_DIR defaults to the store's default model (`$ZLLM_DATA_DIR/models/smollm2`). Prints one JSON line per
figure (design/PERF.md, P3): absolute numbers on a shared machine are noise, the ratio zllm/generate is the
figure. Both sides run greedy, EOS disabled (exactly --new-tokens tokens), same prompt, same thread count;
runs are interleaved and the best of --repeats is kept.

- decode_tok_s: (new_tokens - 1) / (time(new_tokens) - time(1 token)) — prefill cancels out.
- e2e_tok_s:    new_tokens / time(new_tokens), prefill of the short chat prompt included.
- prefill_tok_s: prompt_tokens / time(1 token) for a ~--prefill-tokens prompt.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import FILLER, model_parser, resolve_model_dir  # noqa: E402  (bench/bench_args.py)

from zllm.canonical import ChatRequest, Finished, Message  # noqa: E402
from zllm.engine.loaded import LoadedModel  # noqa: E402
from zllm.engine.sampler import SamplingConfig  # noqa: E402
from zllm.engine.torch.loader import load_model  # noqa: E402
from zllm.engine.torch.runner import ModelRunner  # noqa: E402
from zllm.prompt import PromptRenderer  # noqa: E402
from zllm.runtime.engine_loop import EngineLoop, EngineRequest  # noqa: E402

CHAT_PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def parse_args() -> argparse.Namespace:
    parser = model_parser(__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prefill-tokens", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


class ZllmSide:
    """Requests through the real engine loop (engine thread, detokenizer, event hand-off)."""

    def __init__(self, loaded: LoadedModel):
        self.engine = EngineLoop(ModelRunner(loaded.model), loaded.tokenizer, frozenset(), threads=loaded.threads)
        self.engine.start()

    def run(self, prompt_ids: list[int], new_tokens: int) -> float:
        done = threading.Event()
        finished: list[Finished] = []

        def sink(event) -> None:
            if isinstance(event, Finished):
                finished.append(event)
                done.set()

        request = EngineRequest(request_id="bench", prompt_ids=tuple(prompt_ids), sampling=SamplingConfig(0.0),
                                max_tokens=new_tokens, sink=sink, use_model_stop_tokens=False)
        start = time.perf_counter()
        self.engine.submit(request)
        done.wait()
        elapsed = time.perf_counter() - start
        if finished[0].usage.completion_tokens != new_tokens:
            raise RuntimeError(f"zllm generated {finished[0]} instead of {new_tokens} tokens")
        return elapsed


class GenerateSide:
    def __init__(self, loaded: LoadedModel):
        self.model = loaded.model
        self.device = loaded.device
        self.config = copy.deepcopy(loaded.model.generation_config)
        self.config.eos_token_id = None  # exactly max_new_tokens, as zllm's side
        self.config.do_sample = False
        self.config.pad_token_id = None

    def run(self, prompt_ids: list[int], new_tokens: int) -> float:
        ids = torch.tensor([prompt_ids], device=self.device)
        config = copy.copy(self.config)
        config.max_new_tokens = new_tokens
        start = time.perf_counter()
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if out.shape[1] - len(prompt_ids) != new_tokens:
            raise RuntimeError(f"generate() produced {out.shape[1] - len(prompt_ids)} tokens, not {new_tokens}")
        return elapsed


def best_times(sides: dict, prompt_ids: list[int], new_tokens: int, repeats: int) -> dict[str, float]:
    """Interleave the sides so machine noise hits both alike; keep each side's best (least disturbed) run."""
    best = {name: float("inf") for name in sides}
    for _ in range(repeats):
        for name, side in sides.items():
            best[name] = min(best[name], side.run(prompt_ids, new_tokens))
    return best


def long_prompt(renderer: PromptRenderer, target: int) -> list[int]:
    text = FILLER * (target // 20 + 1)
    ids = list(renderer.render(chat(text)).token_ids)
    return ids[:target]


def chat(text: str) -> ChatRequest:
    return ChatRequest(id="bench", model="bench", messages=(Message("user", text),))


def emit(figure: str, values: dict[str, float], facts: dict) -> None:
    line = {"bench": "decode", "figure": figure, **{k: round(v, 2) for k, v in values.items()},
            "ratio": round(values["zllm"] / values["generate"], 3), **facts}
    print(json.dumps(line), flush=True)


def main() -> None:
    args = parse_args()
    model_dir = resolve_model_dir(args)
    loaded = load_model(model_dir, device=args.device, dtype=args.dtype, threads=args.threads)
    renderer = PromptRenderer(loaded.tokenizer)
    sides = {"zllm": ZllmSide(loaded), "generate": GenerateSide(loaded)}
    facts = {"model": model_dir.name, "device": str(loaded.device),
             "dtype": str(loaded.dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
             "repeats": args.repeats}

    short = list(renderer.render(chat(CHAT_PROMPT)).token_ids)
    new_tokens = min(args.new_tokens, loaded.context_length - len(short))
    best_times(sides, short, 8, 1)  # warm-up: allocator, kernels, lazy inits
    full = best_times(sides, short, new_tokens, args.repeats)
    first = best_times(sides, short, 1, args.repeats)
    decode = {n: (new_tokens - 1) / (full[n] - first[n]) for n in sides}
    emit("decode_tok_s", decode, {**facts, "new_tokens": new_tokens, "prompt_tokens": len(short)})
    emit("e2e_tok_s", {n: new_tokens / full[n] for n in sides},
         {**facts, "new_tokens": new_tokens, "prompt_tokens": len(short)})

    prompt = long_prompt(renderer, min(args.prefill_tokens, loaded.context_length - 1))
    prefill = best_times(sides, prompt, 1, args.repeats)
    emit("prefill_tok_s", {n: len(prompt) / prefill[n] for n in sides}, {**facts, "prompt_tokens": len(prompt)})
    sides["zllm"].engine.shutdown()


if __name__ == "__main__":
    main()
