"""zllm's llama.cpp backend vs llama.cpp's own `llama-bench`, side by side in one run (design/PERF.md P0).

    .venv/bin/python bench/llamacpp_engine.py [MODEL_DIR] [--llama-bench PATH] [--thread-counts 1,2]
        [--prompt-tokens 512] [--new-tokens 128] [--repeats 3] [--ubatches 128,256,512] [--streams 1,4,8]
        [--figures decode,prefill,ubatch,streams] [--no-torch] [--exact-cache | --no-exact-cache]

MODEL_DIR: a zllm model directory holding model.gguf (default: the store's default model, else the e2e
tests' copy; it must be a GGUF pull). llama-bench: bench/build_llama_tools.sh builds it from the llama.cpp
source that the installed llama-cpp-python bundles (default /tmp/llama-tools/bin/llama-bench), so both sides
run the same kernels on the same GGUF with the same threads.

Sides, interleaved per round (machine noise hits them alike), best of --repeats rounds:

- zllm_llamacpp: the real engine loop (EngineLoop + EngineRequest, greedy, model EOS off so a request makes
  exactly the tokens asked for) over `load_gguf_model(dir, threads=T, exact_cache=...).engine`, the daemon's
  loader, with the daemon's exact_cache setting (off by default; --exact-cache: Q8_0 cells, per-cell kernel,
  padded 1-token decodes — the loader's own default is on, which is not what `zllm serve` runs).
  decode tok/s = (new_tokens - 1) / (last token's event - first token's event), a short chat prompt
  (llama-bench's tg starts from an empty context; ~30 positions more changes nothing measurable);
  prefill tok/s = prompt_tokens / TTFT (submit -> first token event, max_tokens=1), one step (the scheduler's
  idle_prefill_chunk is 512).
- zllm_step: the same llama.cpp context driven by `engine.step` in a bare Python loop (argmax, no engine
  loop): splits the gap to llama-bench into the backend's step vs the engine loop around it.
- llama_bench: `llama-bench -m GGUF -t T -p P -n N -r 1 -o json` (its own warm-up run first), one call per
  round; its samples_ts.
- zllm_torch: the torch backend on the same model dir (`load_for_backend(dir, backend="torch")`: the GGUF
  dequantized to fp32), the same engine-loop measurement.

Figures, one JSON line each (ratio = zllm_llamacpp / llama_bench; goal >= 0.9):
- decode_tok_s and prefill_tok_s, per thread count.
- prefill_ubatch_tok_s: prefill of the same prompt with llama.cpp's n_ubatch (ContextSettings.ubatch) swept,
  both sides, per thread count: whether a ubatch other than the default 512 prefills faster on this CPU.
- aggregate_decode_tok_s: K concurrent streams through the engine loop on llama.cpp (batching.py's
  decode_window: all admitted in one step, decode-only window), ratio = tok_s / tok_s of 1 stream (goal: 4
  streams >= 2.5x, 8 streams >= 4x).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batching import Stream, chat_ids, decode_window, long_prompt, story_prompts  # noqa: E402  (bench/batching.py)
from bench_args import model_parser, resolve_model_dir  # noqa: E402  (bench/bench_args.py)

from zllm.config import load_settings  # noqa: E402
from zllm.engine.contract import Row  # noqa: E402
from zllm.engine.llamacpp.loader import load_gguf_model  # noqa: E402
from zllm.model_files import GGUF_FILE  # noqa: E402
from zllm.engine.select import load_for_backend  # noqa: E402
from zllm.engine.torch.runner import ModelRunner  # noqa: E402
from zllm.prompt import PromptRenderer  # noqa: E402
from zllm.runtime.engine_loop import EngineLoop  # noqa: E402
from zllm.runtime.scheduler import SchedulerConfig  # noqa: E402

FIGURES = ("decode", "prefill", "ubatch", "streams")
DECODE_QUESTION = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def parse_args() -> argparse.Namespace:
    parser = model_parser(__doc__.splitlines()[0], dtype=False)
    parser.add_argument("--llama-bench", type=Path, default=Path("/tmp/llama-tools/bin/llama-bench"))
    parser.add_argument("--thread-counts", default="1,2")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ubatches", default="128,256,512", help="n_ubatch values of prefill_ubatch_tok_s")
    parser.add_argument("--streams", default="1,4,8")
    parser.add_argument("--stream-tokens", type=int, default=64, help="tokens each concurrent stream decodes")
    parser.add_argument("--stream-threads", type=int, default=0, help="threads of the streams figure (0: max)")
    parser.add_argument("--figures", default=",".join(FIGURES), help=f"any of {','.join(FIGURES)}")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch backend side")
    parser.add_argument("--exact-cache", action=argparse.BooleanOptionalAction, default=load_settings().exact_cache,
                        help="llama.cpp's exact cache mode (default: the daemon's setting)")
    args = parser.parse_args()
    unknown = set(args.figures.split(",")) - set(FIGURES)
    if unknown:
        parser.error(f"unknown figures {sorted(unknown)}; choose from {','.join(FIGURES)}")
    if not args.llama_bench.is_file() and set(args.figures.split(",")) & {"decode", "prefill", "ubatch"}:
        parser.error(f"no llama-bench at {args.llama_bench}: run bench/build_llama_tools.sh")
    return args


# ------------------------------------------------------------------ zllm through the engine loop

def loop_for(runner, loaded, threads: int) -> EngineLoop:
    return EngineLoop(runner, loaded.tokenizer, frozenset(), threads=threads, scheduler=SchedulerConfig())


def loop_prefill(runner, loaded, threads: int, prompt: list[int]) -> float:
    """prompt tokens / TTFT (submit -> first token) on an idle, started engine loop."""
    engine = loop_for(runner, loaded, threads)
    engine.start()
    try:
        stream = Stream("prefill", prompt, 1)
        engine.submit(stream.request)
        stream.wait_all_tokens()
    finally:
        engine.shutdown()
    return len(prompt) / stream.ttft


def loop_decode(runner, loaded, threads: int, prompt: list[int], new_tokens: int) -> float:
    """(new_tokens - 1) / (Finished - first token event): every decode step after the first token."""
    engine = loop_for(runner, loaded, threads)
    engine.start()
    try:
        stream = Stream("decode", prompt, new_tokens)
        engine.submit(stream.request)
        stream.wait_all_tokens()
    finally:
        engine.shutdown()
    return (new_tokens - 1) / (stream.finished_at - stream.token_times[0])


def step_decode(engine, prompt: list[int], new_tokens: int) -> float:
    """The backend's step in a bare loop: prefill, then (new_tokens - 1) single-token steps + argmax."""
    seq = engine.open()
    try:
        logits = engine.step([Row(seq, prompt)])[0]
        token = int(logits.argmax())  # numpy (llama.cpp) or torch
        start = time.perf_counter()
        for _ in range(new_tokens - 1):
            logits = engine.step([Row(seq, [token])])[0]
            token = int(logits.argmax())  # numpy (llama.cpp) or torch
        return (new_tokens - 1) / (time.perf_counter() - start)
    finally:
        engine.release(seq)


# ------------------------------------------------------------------ llama-bench

def llama_bench(binary: Path, gguf: Path, threads: int, prompt_tokens: int, new_tokens: int,
                ubatches: list[int] | None = None) -> list[dict]:
    command = [str(binary), "-m", str(gguf), "-t", str(threads), "-p", str(prompt_tokens), "-n", str(new_tokens),
               "-r", "1", "-o", "json"]
    if ubatches:
        command += ["-ub", ",".join(map(str, ubatches))]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def bench_rate(results: list[dict], *, prefill: bool, ubatch: int | None = None) -> float:
    for test in results:
        if (test["n_prompt"] > 0) == prefill and (test["n_gen"] > 0) != prefill \
                and (ubatch is None or test["n_ubatch"] == ubatch):
            return max(test["samples_ts"])
    raise KeyError(f"no {'prefill' if prefill else 'decode'} test (ubatch {ubatch}) in llama-bench's output")


# ------------------------------------------------------------------ figures

def keep_best(best: dict, key, value: float) -> None:
    best[key] = max(best.get(key, 0.0), value)


def p0_figures(args, model_dir: Path, gguf: Path, renderer, facts: dict, figures: set[str]) -> None:
    thread_counts = [int(t) for t in args.thread_counts.split(",")]
    engines = {t: load_gguf_model(model_dir, threads=t, exact_cache=args.exact_cache) for t in thread_counts}
    some = next(iter(engines.values()))
    torch_loaded = None if args.no_torch else load_for_backend(model_dir, backend="torch", threads=thread_counts[0])
    torch_runner = None if torch_loaded is None else ModelRunner(torch_loaded.model)
    prefill_ids = long_prompt(renderer, args.prompt_tokens)
    decode_ids = chat_ids(renderer, DECODE_QUESTION)
    facts = {**facts, "prompt_tokens": len(prefill_ids), "new_tokens": args.new_tokens,
             "decode_prompt_tokens": len(decode_ids), "ubatch": some.engine.settings.ubatch,
             "batch": some.engine.settings.batch, "cells": some.engine.cells}
    want_decode, want_prefill = "decode" in figures, "prefill" in figures
    for t, loaded in engines.items():  # warm-up: pages, kernels, repacked weights
        loop_decode(loaded.engine, loaded, t, decode_ids, 8)
        loop_prefill(loaded.engine, loaded, t, prefill_ids)
    if torch_loaded is not None:
        loop_decode(torch_runner, torch_loaded, thread_counts[0], decode_ids, 8)
        loop_prefill(torch_runner, torch_loaded, thread_counts[0], prefill_ids)
    best: dict = {}
    for round_ in range(args.repeats):
        for t, loaded in engines.items():
            if want_decode:
                keep_best(best, ("decode", "zllm_llamacpp", t),
                          loop_decode(loaded.engine, loaded, t, decode_ids, args.new_tokens))
                keep_best(best, ("decode", "zllm_step", t), step_decode(loaded.engine, decode_ids, args.new_tokens))
            if want_prefill:
                keep_best(best, ("prefill", "zllm_llamacpp", t), loop_prefill(loaded.engine, loaded, t, prefill_ids))
            results = llama_bench(args.llama_bench, gguf, t, len(prefill_ids) if want_prefill else 0,
                                  args.new_tokens if want_decode else 0)
            if round_ == 0:
                facts["llama_bench_build"] = f"{results[0]['build_commit']} ({results[0]['build_number']})"
                facts["llama_bench_fa"] = results[0].get("flash_attn")
            if want_decode:
                keep_best(best, ("decode", "llama_bench", t), bench_rate(results, prefill=False))
            if want_prefill:
                keep_best(best, ("prefill", "llama_bench", t), bench_rate(results, prefill=True))
            if torch_loaded is not None:
                if want_decode:
                    keep_best(best, ("decode", "zllm_torch", t),
                              loop_decode(torch_runner, torch_loaded, t, decode_ids, args.new_tokens))
                if want_prefill:
                    keep_best(best, ("prefill", "zllm_torch", t),
                              loop_prefill(torch_runner, torch_loaded, t, prefill_ids))
    for kind in ("decode", "prefill"):
        if kind not in figures:
            continue
        for t in thread_counts:
            sides = {side: round(best[(kind, side, t)], 2) for side in ("zllm_llamacpp", "zllm_step", "llama_bench",
                                                                         "zllm_torch") if (kind, side, t) in best}
            reference = best[(kind, "llama_bench", t)]
            line = {"threads": t, **sides, "ratio": round(best[(kind, "zllm_llamacpp", t)] / reference, 3)}
            if (kind, "zllm_step", t) in best:
                line["step_ratio"] = round(best[(kind, "zllm_step", t)] / reference, 3)
            if (kind, "zllm_torch", t) in best:
                line["torch_ratio"] = round(best[(kind, "zllm_torch", t)] / reference, 3)
            emit(f"{kind}_tok_s", line, facts)
    for loaded in engines.values():
        loaded.engine.close()
    del torch_loaded, torch_runner
    gc.collect()


def ubatch_figure(args, model_dir: Path, gguf: Path, renderer, facts: dict) -> None:
    thread_counts = [int(t) for t in args.thread_counts.split(",")]
    ubatches = [int(u) for u in args.ubatches.split(",")]
    prefill_ids = long_prompt(renderer, args.prompt_tokens)
    best: dict = {}
    for t in thread_counts:
        engines = {u: load_gguf_model(model_dir, threads=t, ubatch=u, exact_cache=args.exact_cache) for u in ubatches}
        for u, loaded in engines.items():  # warm-up
            loop_prefill(loaded.engine, loaded, t, prefill_ids)
        for _ in range(args.repeats):
            for u, loaded in engines.items():
                keep_best(best, ("zllm_llamacpp", t, u), loop_prefill(loaded.engine, loaded, t, prefill_ids))
            results = llama_bench(args.llama_bench, gguf, t, len(prefill_ids), 0, ubatches)
            for u in ubatches:
                keep_best(best, ("llama_bench", t, u), bench_rate(results, prefill=True, ubatch=u))
        for loaded in engines.values():
            loaded.engine.close()
        default = 512 if 512 in ubatches else ubatches[-1]
        for side in ("zllm_llamacpp", "llama_bench"):
            rates = {str(u): round(best[(side, t, u)], 1) for u in ubatches}
            emit("prefill_ubatch_tok_s", {"side": side, "threads": t, "tok_s": rates,
                                          "vs_ubatch_512": {str(u): round(best[(side, t, u)] / best[(side, t, default)], 3)
                                                            for u in ubatches},
                                          "best_ubatch": max(ubatches, key=lambda u: best[(side, t, u)])},
                 {**facts, "prompt_tokens": len(prefill_ids)})


def streams_figure(args, model_dir: Path, renderer, facts: dict) -> None:
    threads = args.stream_threads or max(int(t) for t in args.thread_counts.split(","))
    counts = sorted({int(k) for k in args.streams.split(",")} | {1})
    loaded = load_gguf_model(model_dir, threads=threads, max_batch=max(counts),
                             exact_cache=args.exact_cache)
    prompts = story_prompts(renderer, max(counts))
    decode_window(loaded, loaded.engine, prompts, 4)  # warm-up, the widest batch
    best: dict[int, tuple[float, int]] = {}
    for _ in range(args.repeats):
        for count in counts:
            seconds, tokens = decode_window(loaded, loaded.engine, prompts[:count], args.stream_tokens)
            if count not in best or tokens / seconds > best[count][1] / best[count][0]:
                best[count] = (seconds, tokens)
    loaded.engine.close()
    base = best[1][1] / best[1][0]
    for count in counts:
        seconds, tokens = best[count]
        emit("aggregate_decode_tok_s", {
            "streams": count, "tok_s": round(tokens / seconds, 2), "ratio": round(tokens / seconds / base, 3),
            "per_stream_tok_s": round(tokens / seconds / count, 2),
            "step_ms": round(seconds / (tokens / count) * 1e3, 2), "window_tokens": tokens,
            "new_tokens": args.stream_tokens, "threads": threads}, facts)


def emit(figure: str, values: dict, facts: dict) -> None:
    print(json.dumps({"bench": "llamacpp_engine", "figure": figure, **values, **facts}), flush=True)


def main() -> None:
    args = parse_args()
    model_dir = resolve_model_dir(args)
    gguf = (model_dir / GGUF_FILE).resolve()
    if not gguf.is_file():
        sys.exit(f"error: {model_dir} holds no {GGUF_FILE} (pull the model's GGUF)")
    probe = load_gguf_model(model_dir, threads=1, exact_cache=args.exact_cache)
    renderer = PromptRenderer(probe.tokenizer)
    import llama_cpp

    facts = {"model": model_dir.name, "quantization": probe.quantization, "llama_cpp_python": llama_cpp.__version__,
             "repeats": args.repeats, "exact_cache": args.exact_cache}
    probe.engine.close()
    figures = set(args.figures.split(","))
    if figures & {"decode", "prefill"}:
        p0_figures(args, model_dir, gguf, renderer, facts, figures)
    if "ubatch" in figures:
        ubatch_figure(args, model_dir, gguf, renderer, facts)
    if "streams" in figures:
        streams_figure(args, model_dir, renderer, facts)


if __name__ == "__main__":
    main()
