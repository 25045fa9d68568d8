"""TTFT of an agent-shaped chat: the zllm daemon (llama.cpp backend) vs `llama-server`, same GGUF, same threads.

    .venv/bin/python bench/llamacpp_server.py [MODEL_DIR] [--llama-server PATH] [--thread-counts 2]
        [--tokens 3000]
    .venv/bin/python bench/llamacpp_server.py [MODEL_DIR] --steps cold --tokens 2000,8000 --repeats 3
        [--zllm-modes fast,exact] [--llama-flags "-np 1 -ub 512"] [--thread-counts 1]

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

Cold rounds (`--steps cold`): for each --tokens size, --repeats pairs; each pair sends the same new prompt (a
nonce opens the system prompt, so nothing is cached on either side) to every server, the order alternating
pair by pair (zllm first, then llama-server first), and prints one line per pair: wall seconds, CPU seconds
(the server process's utime + stime over the request, all its threads: what the prefill cost, robust to the
other processes a shared machine runs, which stretch wall time only), both ratios, the load average. Then a
summary line per size: the median ratios. A size below the agent prompt's ~3.2K-token floor (its system prompt)
cuts the system prompt's text to fit. --zllm-modes runs one daemon per mode, up at once: fast (the default
cells: F16, llama.cpp's kernel choice) and exact (`--exact-cache`: Q8_0 cells, the per-cell kernel).

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
import shlex
import signal
import statistics
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
from zllm.canonical import ChatRequest, Message  # noqa: E402
from zllm.model_files import GGUF_FILE  # noqa: E402
from zllm.prompt import PromptRenderer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ZLLM_MODES = {"fast": ["--no-exact-cache"], "exact": ["--exact-cache"]}
ANSWER = "I'll read src/module_0.py first and then profile the function that the user asked about."


def parse_args() -> argparse.Namespace:
    parser = model_parser(__doc__.splitlines()[0], dtype=False)
    parser.add_argument("--llama-server", type=Path, default=Path("/tmp/llama-tools/bin/llama-server"))
    parser.add_argument("--thread-counts", default="2")
    parser.add_argument("--tokens", default="3000", help="turn-1 prompt size; cold rounds: sizes, comma-separated")
    parser.add_argument("--context", type=int, default=8192,
                        help="both servers' window (llama-server -c; zllm --context-length)")
    parser.add_argument("--steps", default="cold,turn2,restart",
                        help="cold alone: cold rounds (a cold prefill of each --tokens size on every server)")
    parser.add_argument("--repeats", type=int, default=1, help="cold rounds: pairs per size, the order alternated")
    parser.add_argument("--zllm-modes", default="fast", help="cold rounds: fast and/or exact (--exact-cache)")
    parser.add_argument("--llama-flags", default="", help="more llama-server flags (e.g. \"-np 1 -ub 1024\")")
    parser.add_argument("--request-timeout", type=float, default=900.0,
                        help="seconds one request may take (a 30K cold prefill on a loaded 2-core machine: over 900)")
    args = parser.parse_args()
    args.sizes = [int(size) for size in args.tokens.split(",")]
    if set(args.zllm_modes.split(",")) - set(ZLLM_MODES):
        parser.error(f"--zllm-modes: choose from {','.join(ZLLM_MODES)}")
    if not args.llama_server.is_file():
        parser.error(f"no llama-server at {args.llama_server}: run bench/build_llama_tools.sh")
    return args


class Server:
    """One server process on its own port; its stderr in a log file."""

    def __init__(self, name: str, command: list[str], port: int, env: dict[str, str], log_dir: Path,
                 request_timeout: float = 900.0):
        self.name, self.command, self.port, self.env = name, command, port, env
        self.request_timeout = request_timeout
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

    def cpu_seconds(self) -> float:
        """utime + stime of the process, all its threads (/proc/PID/stat fields 14 and 15)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def chat(self, messages: list[Message], model: str) -> tuple[float, dict]:
        body = {"model": model, "messages": [{"role": m.role, "content": m.content} for m in messages],
                "max_tokens": 1, "temperature": 0.0, "stream": False}
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions",
                                         data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=self.request_timeout) as response:
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


def servers_for(args, model_dir: Path, threads: int, scratch: Path,
                modes: tuple[str, ...] = ("fast",)) -> dict[str, Server]:
    """A zllm daemon per mode ("zllm", "zllm_exact") and llama-server. Each daemon gets a private store under
    `scratch` holding the model's files as hard links (one daemon per store: its lock), and its own state, cache
    and runtime dirs there; both servers' logs go to `scratch`."""
    # the daemon serves the store's copy (a path outside a store would be pulled, and pulls read safetensors)
    if model_dir.parent.name != "models":
        sys.exit(f"error: {model_dir} is not in a zllm store (DATA_DIR/models/NAME): pull the GGUF first")
    found: dict[str, Server] = {}
    for mode in modes:
        home = scratch / f"zllm-{mode}"
        data = private_store(model_dir, home / "data")
        env = {**os.environ, "ZLLM_DATA_DIR": str(data), "ZLLM_STATE_DIR": str(home / "state"),
               "ZLLM_CACHE_DIR": str(home / "cache"), "ZLLM_RUNTIME_DIR": str(home / "run"),
               "ZLLM_CONFIG": str(home / "config.toml"), "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        (home / "config.toml").write_text("")
        port = free_port()
        name = "zllm" if mode == "fast" else f"zllm_{mode}"
        found[name] = Server(name, [*zllm_command(), "serve", "--model", model_dir.name, "--threads", str(threads),
                                    "--port", str(port), "--context-length", str(args.context), *ZLLM_MODES[mode]],
                             port, env, scratch, args.request_timeout)
    llama_port = free_port()
    gguf = (model_dir / GGUF_FILE).resolve()
    found["llama_server"] = Server(
        "llama_server", [str(args.llama_server), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), "-c",
                         str(args.context), "--port", str(llama_port), "--jinja", "--no-webui",
                         *shlex.split(args.llama_flags), *llama_window(model_dir, args.context)],
        llama_port, dict(os.environ), scratch, args.request_timeout)
    return found


def private_store(model_dir: Path, data: Path) -> Path:
    """DATA/models/NAME holding model_dir's files as hard links (copies across file systems)."""
    target = data / "models" / model_dir.name
    target.mkdir(parents=True)
    for path in model_dir.iterdir():
        if path.is_file():
            try:
                os.link(path, target / path.name)
            except OSError:
                shutil.copy2(path, target / path.name)
    return data


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


def cold_prompt(renderer: PromptRenderer, tokens: int, nonce: str) -> list[Message]:
    """bench/prefix_cache.py's conversation of about `tokens` tokens, its system prompt opened by `nonce` (no
    prefix of it is cached anywhere); below the conversation's floor the system prompt's text is cut to fit."""
    messages = conversation(renderer, tokens)

    def with_system(text: str) -> list[Message]:
        return [Message("system", f"{nonce}\n{text}"), *messages[1:]]

    def size(candidate: list[Message]) -> int:
        return len(renderer.render(ChatRequest(id="probe", model="bench", messages=tuple(candidate))).token_ids)

    system = messages[0].content
    if size(with_system(system)) <= tokens * 1.05:
        return with_system(system)
    low, high = 0, len(system)  # the longest cut that fits
    while high - low > 64:
        middle = (low + high) // 2
        low, high = (middle, high) if size(with_system(system[:middle])) <= tokens else (low, middle)
    return with_system(system[:low])


def cold_rounds(args, renderer: PromptRenderer, model_dir: Path, threads: int) -> None:
    """--repeats pairs per size, every server prefilling the same new prompt, the order alternating per pair."""
    scratch = Path(tempfile.mkdtemp(prefix="zllm-bench-cold-"))
    servers = servers_for(args, model_dir, threads, scratch, tuple(args.zllm_modes.split(",")))
    facts = {"figure": "cold_ttft_s", "threads": threads, "model": model_dir.name}
    print("# llama-server: " + " ".join(servers["llama_server"].command[1:]), flush=True)
    try:
        for server in servers.values():
            server.start()
            server.chat([Message("user", "Hi.")], model_dir.name)
        for tokens in args.sizes:
            pairs = []
            for n in range(args.repeats):
                prompt = cold_prompt(renderer, tokens, f"Session {tokens}-{n}-{time.time_ns()}.")
                order = list(servers.items()) if n % 2 == 0 else list(reversed(servers.items()))
                pair = {}
                for name, server in order:
                    cpu = server.cpu_seconds()
                    seconds, reply = server.chat(prompt, model_dir.name)
                    pair[name] = (seconds, server.cpu_seconds() - cpu, reply)
                pairs.append(pair)
                emit({"tokens": tokens, "pair": n, "first": order[0][0], "load": round(os.getloadavg()[0], 2),
                      **{name: {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), **usage_facts(reply)}
                         for name, (wall, cpu, reply) in pair.items()},
                      **pair_ratios(pair)}, facts)
            emit({"tokens": tokens, "summary": True, "pairs": len(pairs),
                  **{f"median_{key}": round(statistics.median(pair_ratios(pair)[key] for pair in pairs), 3)
                     for key in pair_ratios(pairs[0])}}, facts)
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def pair_ratios(pair: dict[str, tuple[float, float, dict]]) -> dict[str, float]:
    """wall and CPU ratios of each zllm daemon over llama-server."""
    wall, cpu, _ = pair["llama_server"]
    ratios = {}
    for name, (zllm_wall, zllm_cpu, _) in pair.items():
        if name != "llama_server":
            ratios[f"{name}_wall_ratio"] = round(zllm_wall / wall, 3)
            ratios[f"{name}_cpu_ratio"] = round(zllm_cpu / max(cpu, 1e-3), 3)
    return ratios


def main() -> None:
    args = parse_args()
    model_dir = resolve_model_dir(args).resolve()
    from transformers import AutoTokenizer

    renderer = PromptRenderer(AutoTokenizer.from_pretrained(model_dir))
    if args.steps == "cold":
        for threads in (int(t) for t in args.thread_counts.split(",")):
            cold_rounds(args, renderer, model_dir, threads)
        return
    turn1 = conversation(renderer, args.sizes[0])
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
