"""TTFT of an agent-shaped chat: the zllm daemon (llama.cpp backend) vs `llama-server`, same GGUF, same threads.

    .venv/bin/python bench/llamacpp_server.py [MODEL_DIR] [--llama-server PATH] [--thread-counts 2]
        [--tokens 3000]

MODEL_DIR: a GGUF pull in a zllm store, DATA_DIR/models/NAME (default as bench_args.resolve_model_dir); the
daemon gets ZLLM_DATA_DIR=DATA_DIR and --model NAME, its state, cache and runtime dirs in a temp dir.
llama-server: built by bench/build_llama_tools.sh from the llama.cpp source llama-cpp-python bundles (default
/tmp/llama-tools/bin/llama-server). Both servers run as real processes on their own ports:

    zllm serve --model NAME --threads T --port P
    llama-server -m MODEL_DIR/model.gguf -t T -tb T -c 8192 --port P2 --jinja

The conversation is bench/prefix_cache.py's (a long system prompt with tool schemas, a history of user /
assistant / tool-result turns, about --tokens tokens); turn 2 adds a fixed assistant answer and a new ~150-token
user turn. Each request is POST /v1/chat/completions, non-streaming, max_tokens 1, temperature 0: its wall time
is the TTFT (rendering included), measured from this process. Steps, the two servers interleaved:

    start both, one tiny warm-up request each
    cold      turn 1 (nothing cached)
    turn2     turn 2 (zllm: device-tier hit; llama-server: its slot's prompt cache)
    restart   both stopped (SIGTERM: zllm writes its SSD tier) and started again, warm-up, then turn 2 again
              (zllm: SSD-tier restore; llama-server: recomputes, it keeps no prompt cache across restarts)

One JSON line per (threads, step): seconds for each server, ratio = zllm / llama-server, prompt tokens each
side reports (the two templates' renderings may differ by a few tokens) and cached tokens where reported, and
where each side's time went: engine_s, the prompt's prefill inside the engine (zllm: its trace's prefill_s,
restore included; llama-server: timings.prompt_ms), and overhead_s = wall - engine_s (HTTP, rendering,
tokenizing, the cache lookup, sampling the token, the answer). On turn 2 both sides prefill the same new
tokens from the same cached prefix: the engine_s of both is the same llama_decode.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import model_parser, resolve_model_dir  # noqa: E402  (bench/bench_args.py)
from prefix_cache import conversation, new_user_turn  # noqa: E402  (bench/prefix_cache.py: the same prompt)

from tests.support.daemon import free_port  # noqa: E402
from zllm.canonical import Message  # noqa: E402
from zllm.model_files import GGUF_FILE  # noqa: E402
from zllm.prompt import PromptRenderer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ANSWER = "I'll read src/module_0.py first and then profile the function that the user asked about."


def parse_args() -> argparse.Namespace:
    parser = model_parser(__doc__.splitlines()[0], dtype=False)
    parser.add_argument("--llama-server", type=Path, default=Path("/tmp/llama-tools/bin/llama-server"))
    parser.add_argument("--thread-counts", default="2")
    parser.add_argument("--tokens", type=int, default=3000, help="turn-1 prompt size")
    parser.add_argument("--context", type=int, default=8192,
                        help="both servers' window (llama-server -c; zllm --context-length)")
    parser.add_argument("--steps", default="cold,turn2,restart",
                        help="cold alone measures a cold prefill of --tokens tokens on both (no restart)")
    args = parser.parse_args()
    if not args.llama_server.is_file():
        parser.error(f"no llama-server at {args.llama_server}: run bench/build_llama_tools.sh")
    return args


class Server:
    """One server process on its own port; its stderr in a log file."""

    def __init__(self, name: str, command: list[str], port: int, env: dict[str, str], log_dir: Path):
        self.name, self.command, self.port, self.env = name, command, port, env
        self.log = log_dir / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 300.0) -> "Server":
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=log, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"{self.name} not ready after {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def chat(self, messages: list[Message], model: str) -> tuple[float, dict]:
        body = {"model": model, "messages": [{"role": m.role, "content": m.content} for m in messages],
                "max_tokens": 1, "temperature": 0.0, "stream": False}
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions",
                                         data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=900) as response:
            reply = json.loads(response.read())
        return time.perf_counter() - started, reply


def usage_facts(reply: dict) -> dict:
    usage = reply.get("usage") or {}
    facts = {"prompt_tokens": usage.get("prompt_tokens")}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None and "timings" in reply:
        cached = reply["timings"].get("cache_n")
    facts["cached_tokens"] = cached
    if "timings" in reply:
        facts["engine_s"] = round(reply["timings"].get("prompt_ms", 0.0) / 1e3, 3)
    elif "_trace" in reply:
        facts["engine_s"] = round(reply["_trace"].get("prefill_s") or 0.0, 3)
    return facts


def with_trace(server: Server, reply: dict) -> dict:
    """zllm's own account of the request just served (`zllm trace --last 1`): its prefill_s, restore_s."""
    done = subprocess.run([*server.command[:server.command.index("serve")], "trace", "--json", "--last", "1"],
                          check=False, env=server.env, capture_output=True, text=True, timeout=60)
    lines = done.stdout.strip().splitlines()
    return {**reply, "_trace": json.loads(lines[-1])} if done.returncode == 0 and lines else reply


def servers_for(args, model_dir: Path, threads: int, scratch: Path) -> dict[str, Server]:
    # the daemon serves the store's copy (a path outside a store would be pulled, and pulls read safetensors)
    if model_dir.parent.name != "models":
        sys.exit(f"error: {model_dir} is not in a zllm store (DATA_DIR/models/NAME): pull the GGUF first")
    zllm_env = {**os.environ, "ZLLM_DATA_DIR": str(model_dir.parent.parent), "ZLLM_STATE_DIR": str(scratch / "state"),
                "ZLLM_CACHE_DIR": str(scratch / "cache"), "ZLLM_RUNTIME_DIR": str(scratch / "run"),
                "ZLLM_CONFIG": str(scratch / "config.toml"), "HF_HUB_OFFLINE": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    (scratch / "config.toml").write_text("")
    zllm_port, llama_port = free_port(), free_port()
    gguf = (model_dir / GGUF_FILE).resolve()
    return {
        "zllm": Server("zllm", [*zllm_command(), "serve", "--model", model_dir.name, "--threads",
                                str(threads), "--port", str(zllm_port), "--context-length", str(args.context)],
                       zllm_port, zllm_env, scratch),
        "llama_server": Server("llama_server", [str(args.llama_server), "-m", str(gguf), "-t", str(threads), "-tb",
                                                str(threads), "-c", str(args.context), "--port", str(llama_port),
                                                "--jinja", "--no-webui", *llama_window(model_dir, args.context)],
                               llama_port, dict(os.environ), scratch),
    }


def llama_window(model_dir: Path, context: int) -> list[str]:
    """llama-server caps its slot at the model's training window ("the slot context exceeds the training context of
    the model - capping"); zllm's --context-length does not. A longer window than the model's is given to both by
    overriding the GGUF's context_length key (read only for that cap and the warning)."""
    manifest = json.loads((model_dir / "zllm-manifest.json").read_text())
    arch = (manifest.get("origin") or {}).get("gguf_architecture")
    if not arch or context <= int(manifest.get("context_length") or 0):
        return []
    return ["--override-kv", f"{arch}.context_length=int:{context}"]


def zllm_command() -> list[str]:
    """The repository's .venv/bin/zllm, else this interpreter's `-m zllm` (with the repository on PYTHONPATH)."""
    script = ROOT / ".venv" / "bin" / "zllm"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "zllm"]


def emit(values: dict, facts: dict) -> None:
    print(json.dumps({"bench": "llamacpp_server", **values, **facts}), flush=True)


def main() -> None:
    args = parse_args()
    model_dir = resolve_model_dir(args).resolve()
    from transformers import AutoTokenizer

    renderer = PromptRenderer(AutoTokenizer.from_pretrained(model_dir))
    turn1 = conversation(renderer, args.tokens)
    turn2 = turn1 + [Message("assistant", ANSWER), new_user_turn(2)]
    warm = [Message("user", "Hi.")]
    for threads in (int(t) for t in args.thread_counts.split(",")):
        scratch = Path(tempfile.mkdtemp(prefix="zllm-bench-srv-"))
        servers = servers_for(args, model_dir, threads, scratch)
        facts = {"figure": "agent_ttft_s", "threads": threads, "model": model_dir.name}
        try:
            results: dict[str, dict[str, tuple[float, dict]]] = {"cold": {}, "turn2": {}, "restart": {}}
            for server in servers.values():
                server.start()
                server.chat(warm, model_dir.name)
            for step, messages in (("cold", turn1), ("turn2", turn2)):
                if step not in args.steps:
                    results.pop(step)
                    continue
                for name, server in servers.items():
                    seconds, reply = server.chat(messages, model_dir.name)
                    results[step][name] = (seconds, with_trace(server, reply) if name == "zllm" else reply)
            if "restart" in args.steps:
                for server in servers.values():
                    server.stop()
                for server in servers.values():
                    server.start()
                    server.chat(warm, model_dir.name)
                for name, server in servers.items():
                    seconds, reply = server.chat(turn2, model_dir.name)
                    results["restart"][name] = (seconds, with_trace(server, reply) if name == "zllm" else reply)
            else:
                results.pop("restart")
            for step, sides in results.items():
                emit({"step": step, **{name: round(seconds, 3) for name, (seconds, _) in sides.items()},
                      "ratio": round(sides["zllm"][0] / sides["llama_server"][0], 3),
                      **{f"{name}_usage": usage_facts(reply) for name, (_, reply) in sides.items()},
                      **{f"{name}_overhead_s": round(seconds - usage_facts(reply)["engine_s"], 3)
                         for name, (seconds, reply) in sides.items() if "engine_s" in usage_facts(reply)}}, facts)
        finally:
            for server in servers.values():
                server.stop()
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
