"""Plain vs prompt-lookup speculative decode on an echo-heavy agent turn, side by side in one run (PERF.md P4).

    .venv/bin/python bench/speculative.py [MODEL_DIR] [--threads 1] [--new-tokens 160] [--turns echo,free]

The echo turn asks the model to repeat a file from its prompt with one edit — what an agent does when it
rewrites a file it was shown; SmolLM2-135M copies such text. The free turn (a story) has nothing to copy: it
shows what speculation costs when drafts fail (the drafter backs off).

Both sides run greedy from the same prefilled prompt with the model's EOS ignored (exactly --new-tokens
tokens), through the engine's own pieces: the plain side is the engine loop's step (sample, decode), the
speculative side `SpeculativeStep`. Runs are interleaved, the best of --repeats kept; prefill is outside the
timed part. On a CPU in fp32 the speculative output must equal the plain output token for token (greedy
exactness), or the script fails; elsewhere `same_prefix` says how far they agree (bf16 kernels may round a
k-row forward differently from a 1-row one).

One JSON line per figure:
    {"bench": "speculative", "figure": "decode_tok_s", "turn": "echo", "plain": .., "speculative": ..,
     "ratio": .., "acceptance": .., "tokens_per_forward": .., "identical": true, ...}
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import model_parser, resolve_model_dir  # noqa: E402  (bench/bench_args.py)

from zllm.canonical import ChatRequest, Message  # noqa: E402
from zllm.engine.sampler import (
    Sampler,  # noqa: E402
    SamplingConfig,  # noqa: E402
)
from zllm.engine.torch.loader import load_model  # noqa: E402
from zllm.engine.torch.runner import ModelRunner  # noqa: E402
from zllm.prompt import PromptRenderer  # noqa: E402
from zllm.runtime.speculative import SpeculationConfig, SpeculativeStep  # noqa: E402

FILE = '''import json
from pathlib import Path


def load_settings(path: Path) -> dict:
    """Read the settings file; missing keys fall back to the defaults."""
    defaults = {"threads": 1, "device": "cpu", "cache_mb": 512}
    if not path.exists():
        return defaults
    with path.open() as handle:
        values = json.load(handle)
    return {**defaults, **values}


def save_settings(path: Path, values: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        json.dump(values, handle, indent=2, sort_keys=True)
'''
STORY = "Write a long story about a lighthouse keeper who finds a message in a bottle."
ASK = ("Here is settings.py:\n\n```python\n{file}```\n\nRewrite the whole file with the default cache_mb changed "
       "from 512 to 1024. Reply with the complete file in one code block and nothing else.")


TURNS = {"echo": ASK.format(file=FILE), "free": STORY}


def parse_args() -> argparse.Namespace:
    parser = model_parser(__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=160)
    parser.add_argument("--draft", type=int, default=SpeculationConfig.max_draft, help="k: tokens per verify")
    parser.add_argument("--min-ngram", type=int, default=SpeculationConfig.min_ngram)
    parser.add_argument("--max-ngram", type=int, default=SpeculationConfig.max_ngram)
    parser.add_argument("--max-backoff", type=int, default=SpeculationConfig.max_backoff)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--turns", default="echo,free",
                        help="echo: rewrite a file from the prompt (the P4 figure); free: a story (no echo)")
    return parser.parse_args()


def prefilled(runner: ModelRunner, prompt: list[int]):
    cache = runner.new_cache()
    return cache, runner.prefill(prompt, cache)


def plain_decode(runner: ModelRunner, prompt: list[int], new_tokens: int) -> tuple[list[int], float, int]:
    """The engine loop's plain step: sample, one decode forward per token."""
    cache, logits = prefilled(runner, prompt)
    sampler, tokens = Sampler(SamplingConfig(0.0), runner.device), []
    start = time.perf_counter()
    while True:
        token = sampler(logits)
        tokens.append(token.item())
        if len(tokens) == new_tokens:
            break
        logits = runner.decode(token, cache)
    _synchronize(runner)
    return tokens, time.perf_counter() - start, new_tokens - 1


def speculative_decode(runner: ModelRunner, prompt: list[int], new_tokens: int,
                       config: SpeculationConfig) -> tuple[list[int], float, int, SpeculativeStep]:
    cache, logits = prefilled(runner, prompt)
    spec = SpeculativeStep(runner, Sampler(SamplingConfig(0.0), runner.device), prompt, config)
    tokens: list[int] = []
    start = time.perf_counter()
    while len(tokens) < new_tokens:
        run = spec.step(logits, cache, remaining=new_tokens - len(tokens))
        tokens += run.tokens
        logits = run.logits
    _synchronize(runner)
    return tokens, time.perf_counter() - start, spec.stats.steps, spec


def _synchronize(runner: ModelRunner) -> None:
    if runner.device.type == "cuda":
        torch.cuda.synchronize()


def measure(runner: ModelRunner, prompt: list[int], new_tokens: int, config: SpeculationConfig,
            repeats: int) -> dict:
    best = {"plain": float("inf"), "speculative": float("inf")}
    plain_decode(runner, prompt, 8)  # warm-up: allocator, kernels, lazy inits
    speculative_decode(runner, prompt, 8, config)
    for _ in range(repeats):  # interleaved: machine noise hits both alike
        want, elapsed, plain_forwards = plain_decode(runner, prompt, new_tokens)
        best["plain"] = min(best["plain"], elapsed)
        got, elapsed, spec_forwards, spec = speculative_decode(runner, prompt, new_tokens, config)
        best["speculative"] = min(best["speculative"], elapsed)
    rates = {side: new_tokens / seconds for side, seconds in best.items()}
    same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
    return {**{side: round(rate, 2) for side, rate in rates.items()},
            "ratio": round(rates["speculative"] / rates["plain"], 3), "acceptance": round(spec.stats.acceptance, 3),
            "tokens_per_forward": round(new_tokens / max(spec_forwards, 1), 2),
            "forwards": {"plain": plain_forwards, "speculative": spec_forwards},
            "identical": got == want, "same_prefix": same, "text": got}


def main() -> None:
    args = parse_args()
    model_dir = resolve_model_dir(args)
    loaded = load_model(model_dir, device=args.device, dtype=args.dtype, threads=args.threads)
    runner, renderer = ModelRunner(loaded.model), PromptRenderer(loaded.tokenizer)
    config = SpeculationConfig(max_draft=args.draft, max_ngram=args.max_ngram, min_ngram=args.min_ngram,
                               max_backoff=args.max_backoff)
    dtype = str(loaded.dtype).removeprefix("torch.")
    facts = {"model": model_dir.name, "device": str(loaded.device), "dtype": dtype,
             "threads": torch.get_num_threads(), "draft": args.draft, "ngram": [args.min_ngram, args.max_ngram],
             "max_backoff": args.max_backoff, "new_tokens": args.new_tokens, "repeats": args.repeats}
    exact = loaded.device.type == "cpu" and dtype == "float32"  # bf16 kernels may differ between 1 and k rows
    for turn in args.turns.split(","):
        request = ChatRequest(id="bench", model="bench", messages=(Message("user", TURNS[turn]),))
        prompt = list(renderer.render(request).token_ids)
        with torch.inference_mode():
            figures = measure(runner, prompt, args.new_tokens, config, args.repeats)
        text = loaded.tokenizer.decode(figures.pop("text"))
        print(json.dumps({"bench": "speculative", "figure": "decode_tok_s", "turn": turn, **figures, **facts,
                          "prompt_tokens": len(prompt)}), flush=True)
        print(f"--- {turn} turn output:\n{text}", file=sys.stderr)  # for people: what the turn produced
        if exact and not figures["identical"]:
            sys.exit(f"error: speculative greedy output differs from the plain one at token {figures['same_prefix']}")


if __name__ == "__main__":
    main()
