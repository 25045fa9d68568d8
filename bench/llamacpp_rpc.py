"""A GGUF on this machine alone vs split over llama.cpp rpc-servers (`zllm serve --rpc`): load time, prefill and
decode tok/s, side by side.

    .venv/bin/python bench/llamacpp_rpc.py [MODEL_DIR] [--rpc-build DIR] [--servers 2] [--threads 1]
        [--prompt-tokens 256] [--new-tokens 64] [--repeats 3]

--rpc-build: what .ci/llama-rpc built (rpc-server and libggml-rpc.so; default: the newest under
~/.cache/zllm-tests). The servers run on 127.0.0.1 with --threads each: loopback measures what the RPC
protocol itself costs (a graph sent per step, activations crossing between devices), not a network.

Each side loads in a process of its own (RPC registration is process-wide and for good): `load_gguf_model`, the
daemon's loader, then `engine.step` in a bare loop (argmax): prefill tok/s = prompt tokens / its one step;
decode tok/s = (new tokens - 1) / time from the first decoded token to the last. Rounds interleave the sides,
best of --repeats. One JSON line per figure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_args import model_parser, resolve_model_dir  # noqa: E402

SIDE = """
import json, sys, time
import numpy as np
from zllm.engine.contract import Row
from zllm.engine.llamacpp.loader import load_gguf_model
model_dir, threads, servers, backend, prompt_tokens, new_tokens = sys.argv[1:7]
start = time.perf_counter()
model = load_gguf_model(model_dir, threads=int(threads), rpc_servers=tuple(s for s in servers.split(",") if s),
                        rpc_backend=backend, exact_cache=False)  # the daemon's default
load_s = time.perf_counter() - start
engine = model.engine
seq = engine.open()
prompt = [int(t) for t in np.random.default_rng(0).integers(100, 10000, int(prompt_tokens))]
start = time.perf_counter()
(logits,) = engine.step([Row(seq, prompt)])
prefill_s = time.perf_counter() - start
tokens = []
for _ in range(int(new_tokens)):
    tokens.append(int(np.argmax(logits)))
    if len(tokens) == 1:
        start = time.perf_counter()
    (logits,) = engine.step([Row(seq, [tokens[-1]])])
decode_s = time.perf_counter() - start
print(json.dumps({"load_s": load_s, "prefill_tok_s": len(prompt) / prefill_s,
                  "decode_tok_s": (len(tokens) - 1) / decode_s, "tokens": tokens, "placement": model.backend_reason}))
"""


def main() -> None:
    parser = model_parser(__doc__.splitlines()[0], dtype=False)
    parser.add_argument("--rpc-build", type=Path, default=None)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model_dir = resolve_model_dir(args)
    build = args.rpc_build or max((Path.home() / ".cache" / "zllm-tests").glob("llama-rpc-r*"),
                                  key=lambda p: p.stat().st_mtime)
    servers = [subprocess.Popen([str(build / "ggml-rpc-server"), "--port", str(50700 + i), "--threads",
                                 str(args.threads)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for i in range(args.servers)]
    endpoints = ",".join(f"127.0.0.1:{50700 + i}" for i in range(args.servers))
    time.sleep(1)
    best: dict[str, dict] = {}
    try:
        for _ in range(args.repeats):
            for side, rpc in (("local", ""), (f"rpc x{args.servers}", endpoints)):
                run = json.loads(subprocess.run(
                    [sys.executable, "-c", SIDE, str(model_dir), str(args.threads), rpc,
                     str(build / "libggml-rpc.so"), str(args.prompt_tokens), str(args.new_tokens)],
                    check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
                kept = best.setdefault(side, run)
                for key, better in (("load_s", min), ("prefill_tok_s", max), ("decode_tok_s", max)):
                    kept[key] = better(kept[key], run[key])
    finally:
        for server in servers:
            server.kill()
            server.wait()
    same = best["local"]["tokens"] == best[f"rpc x{args.servers}"]["tokens"]
    for figure in ("load_s", "prefill_tok_s", "decode_tok_s"):
        row = {"figure": figure, "threads": args.threads, **{side: round(run[figure], 2) for side, run in best.items()}}
        print(json.dumps(row))
    print(json.dumps({"same_greedy_tokens": same, "placement": best[f"rpc x{args.servers}"]["placement"]}))


if __name__ == "__main__":
    main()
