"""zllm's own overhead in front of vLLM: the same chat requests to vLLM's OpenAI server and to zllm in front of it.

    .venv/bin/python bench/vllm_front.py MODEL_DIR --vllm-python PATH [--threads 1] [--rounds 8] [--tokens 64]
        [--vllm-args "--enforce-eager"] [--vllm-url http://127.0.0.1:PORT]

MODEL_DIR: a safetensors model in a zllm store, DATA_DIR/models/NAME. One `zllm serve --backend vllm` starts one
vLLM server (the flags zllm passes, plus --vllm-args), or attaches to one already running (--vllm-url: started
with the flags server.py's `server_args` lists); both sides are then that one server: vLLM's own
`/v1/chat/completions` (its template, its detokenizer) and zllm's (zllm's template, token ids through
`/inference/v1/generate`, zllm's detokenizer and parsers). Requests are streamed, temperature 0, `--tokens`
output tokens forced (ignore_eos on vLLM's side; zllm: max_tokens and a prompt that rarely ends early), and
each side's conversation starts with its own nonce, so turn 1 is cold on both (zllm's cache_salt also keeps the
two apart). Per round and side:

    ttft_s        turn 1: request sent → first content delta
    decode_tok_s  turn 1: (completion tokens - 1) / (last delta - first delta)
    turn2_ttft_s  turn 2 (turn 1's prompt + answer + a new user turn): vLLM's prefix cache serves the prefix
    zllm_cpu_ms_per_token  (zllm only) the daemon process's CPU time over turn 1 / its completion tokens: zllm's
                  own cost per streamed token, which the wall-clock figures hide in noise on a busy machine

The sides alternate which goes first each round (a machine that gets busier or quieter favours neither). One
JSON line per round, then the medians and ratios zllm / vLLM (TTFT > 1: zllm adds time; decode < 1: zllm
streams slower). On a shared 2-core box single rounds swing 2x either way: run --rounds 8 or more.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_server import private_store  # noqa: E402  (bench/llamacpp_server.py)

SYSTEM = ("You are a careful coding assistant. You read the code, explain what it does, and propose small, safe "
          "changes with a short reason for each. ") * 8


def start_daemon(model_dir: Path, python: str, threads: int, vllm_args: str,
                 vllm_url: str | None) -> tuple[subprocess.Popen, int, Path]:
    scratch = Path(tempfile.mkdtemp(prefix="zllm-vllm-bench-"))
    port = free_port()
    data = private_store(model_dir, scratch / "data")  # one daemon per store: never the e2e tests' shared one
    env = {**os.environ, "ZLLM_DATA_DIR": str(data), "ZLLM_STATE_DIR": str(scratch / "state"),
           "ZLLM_CACHE_DIR": str(scratch / "cache"), "ZLLM_RUNTIME_DIR": str(scratch / "run")}
    log = open(scratch / "daemon.log", "w")
    engine = ["--vllm-url", vllm_url] if vllm_url else ["--vllm-python", python, "--vllm-args", vllm_args,
                                                        "--context-length", "4096"]
    proc = subprocess.Popen([sys.executable, "-m", "zllm", "serve", "--model", model_dir.name, "--port", str(port),
                             "--threads", str(threads), "--backend", "vllm", *engine, "--cache-budget-mb", "1024"],
                            stdout=subprocess.DEVNULL, stderr=log, env=env)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"zllm exited: see {scratch / 'daemon.log'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc, port, scratch
        except OSError:
            time.sleep(1)
    proc.kill()
    raise SystemExit("zllm was not ready after 900 s")


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def vllm_url(scratch: Path) -> str:
    from zllm.control.client import ControlClient

    return ControlClient(scratch / "run" / "zllm.sock", timeout=10).call("ps")["models"][0]["device"]


def timed_stream(client: openai.OpenAI, model: str, messages: list[dict], tokens: int, extra: dict) -> dict:
    sent = time.perf_counter()
    stamps, text, usage = [], [], None
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=tokens, temperature=0,
                                            stream=True, stream_options={"include_usage": True}, extra_body=extra)
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                stamps.append(time.perf_counter())
                text.append(choice.delta.content)
    completion = usage.completion_tokens if usage else len(stamps)
    decode = (completion - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 and stamps[-1] > stamps[0] else None
    return {"ttft_s": stamps[0] - sent if stamps else None, "decode_tok_s": decode, "text": "".join(text),
            "completion_tokens": completion, "prompt_tokens": usage.prompt_tokens if usage else None,
            "cached_tokens": (usage.prompt_tokens_details.cached_tokens
                              if usage and usage.prompt_tokens_details else None)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` itself (not its children: the vLLM server zllm started)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def conversation(client: openai.OpenAI, model: str, tokens: int, extra: dict, pid: int | None) -> dict:
    nonce = uuid.uuid4().hex[:12]
    messages = [{"role": "system", "content": f"[session {nonce}] {SYSTEM}"},
                {"role": "user", "content": "Write a long numbered list of ideas for a Python CLI tool."}]
    cpu_before = cpu_seconds(pid) if pid is not None else 0.0
    first = timed_stream(client, model, messages, tokens, extra)
    cpu = (cpu_seconds(pid) - cpu_before) * 1000 / first["completion_tokens"] if pid is not None else None
    messages += [{"role": "assistant", "content": first["text"]},
                 {"role": "user", "content": "Now pick the third idea and describe it."}]
    second = timed_stream(client, model, messages, 1, extra)
    return {"ttft_s": first["ttft_s"], "decode_tok_s": first["decode_tok_s"],
            "completion_tokens": first["completion_tokens"], "turn2_ttft_s": second["ttft_s"],
            "turn2_cached_tokens": second["cached_tokens"], "turn2_prompt_tokens": second["prompt_tokens"],
            **({"zllm_cpu_ms_per_token": round(cpu, 3)} if cpu is not None else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--vllm-python", default="")
    parser.add_argument("--vllm-url", default=None, help="a vLLM server already running (else zllm starts one)")
    parser.add_argument("--vllm-args", default="--enforce-eager")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    if not (args.vllm_python or args.vllm_url):
        parser.error("--vllm-python or --vllm-url is needed")
    proc, port, scratch = start_daemon(args.model_dir.resolve(), args.vllm_python, args.threads, args.vllm_args,
                                       args.vllm_url)
    try:
        url = vllm_url(scratch)
        sides = {"vllm": (openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=600),
                          {"ignore_eos": True}),
                 "zllm": (openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0,
                                        timeout=600), {})}
        model = args.model_dir.name
        for client, extra in sides.values():  # warm-up: first-request costs out of the figures
            timed_stream(client, model, [{"role": "user", "content": "hi"}], 4, extra)
        rows = {"vllm": [], "zllm": []}
        for round_ in range(args.rounds):
            order = list(sides.items()) if round_ % 2 == 0 else list(reversed(sides.items()))
            for side, (client, extra) in order:
                row = conversation(client, model, args.tokens, extra, proc.pid if side == "zllm" else None)
                rows[side].append(row)
                print(json.dumps({"round": round_, "side": side, **row}), flush=True)
        summary = {}
        for key in ("ttft_s", "decode_tok_s", "turn2_ttft_s"):
            medians = {side: statistics.median(r[key] for r in rows[side] if r[key] is not None) for side in rows}
            summary[key] = {**{side: round(value, 4) for side, value in medians.items()},
                            "ratio_zllm_over_vllm": round(medians["zllm"] / medians["vllm"], 3)}
        cpu = statistics.median(r["zllm_cpu_ms_per_token"] for r in rows["zllm"])
        summary["zllm_cpu_ms_per_token"] = round(cpu, 3)
        print(json.dumps({"summary": summary, "threads": args.threads, "tokens": args.tokens,
                          "rounds": args.rounds}), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


if __name__ == "__main__":
    main()
