"""llama-server's draft-model speculation (`-md`) on the turns of bench/speculative_llamacpp.py, to set beside
zllm's `--draft-model` figures from that bench (same model, same drafts, same threads, same turns).

    .venv/bin/python bench/draft_model_llama_server.py MODEL_DIR --llama-server PATH --draft-model F.gguf \
        [--draft-model Q.gguf] [--threads 1] [--new-tokens 200] [--turns echo,json,free]

One llama-server at a time (`-m MODEL_DIR/model.gguf -t T -tb T -c 4096 --jinja -np 1`, and for each draft
`-md DRAFT --spec-type draft-simple -td T -tbd T`, its other speculation settings llama.cpp's defaults: up to 3
draft tokens), each turn's prompt sent as one chat completion (temperature 0, `ignore_eos`, exactly --new-tokens
tokens). Per (server, turn) one JSON line: decode tok/s from llama-server's own timings (predicted_per_second),
the drafted and accepted counts it reports, the text's first 60 characters, and whether the text equals the
plain server's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llamacpp_server import Server  # noqa: E402  (bench/llamacpp_server.py)
from speculative_llamacpp import TURNS  # noqa: E402  (bench/speculative_llamacpp.py: the same turns)

from tests.support.daemon import free_port  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--draft-model", type=Path, action="append", default=[])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--turns", default="echo,json,free")
    return parser.parse_args()


def complete(port: int, text: str, new_tokens: int) -> dict:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": new_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": False}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=900) as response:
        return json.loads(response.read())


def main() -> None:
    args = parse_args()
    threads = ["-t", str(args.threads), "-tb", str(args.threads)]
    sides = {"plain": []}
    for draft in args.draft_model:
        sides[f"draft:{draft.stem}"] = ["-md", str(draft), "--spec-type", "draft-simple", "-td", str(args.threads),
                                        "-tbd", str(args.threads)]
    plain_text: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="draft-llama-server-") as scratch:
        for side, extra in sides.items():
            port = free_port()
            server = Server(side.replace(":", "-"), [str(args.llama_server), "-m", str(args.model_dir / "model.gguf"),
                                                     *threads, "-c", "4096", "--jinja", "-np", "1", "--port",
                                                     str(port), *extra], port, {}, Path(scratch)).start()
            try:
                for turn in args.turns.split(","):
                    reply = complete(port, TURNS[turn], args.new_tokens)
                    timings, text = reply["timings"], reply["choices"][0]["message"]["content"]
                    plain_text.setdefault(turn, text)
                    drafted, accepted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
                    print(json.dumps({
                        "bench": "draft_model_llama_server", "side": side, "turn": turn,
                        "tok_s": round(timings["predicted_per_second"], 2), "tokens": timings["predicted_n"],
                        "drafted": drafted, "accepted": accepted,
                        "acceptance": round(accepted / drafted, 3) if drafted else None,
                        "same_as_plain": text == plain_text[turn], "text": text[:60], "threads": args.threads}),
                        flush=True)
            finally:
                server.stop()


if __name__ == "__main__":
    main()
