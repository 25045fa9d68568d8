"""A whole Claude Code session against zllm and `llama-server` side by side: wall, TTFT and decode time per turn.

    .venv/bin/python bench/session.py [--model MODEL] [--threads 1] [--turns 16] [--prompt-scale 1.0]
        [--speculative] [--llama-server PATH] [--request FILE] [--claude PATH]

The session (bench/session_script.py): a real Claude Code request, recorded once from the installed `claude` CLI
(bench/claude_code_request.py; kept in ~/.cache/zllm-bench, not committed) — its system prompt, its tools, its
first user message and mid-conversation system turn —, grown by scripted Read/Bash tool turns, a new user message
and an echo turn (a file just read, asked back in full), with Claude Code's side requests (quota, title, a
Bash-command classifier) between main turns, and both servers restarted after the middle main turn (zllm on
SIGTERM writes its SSD tier; llama-server keeps nothing across a restart).

Both servers run at once, same GGUF, same threads, and every request goes to both, through the Anthropic Messages
API on both (`POST /v1/messages`, streaming; llama-server has its own /v1/messages that renders the same messages
with the model's chat template via --jinja); which server goes first alternates step by step. Per request: wall
(from this process), TTFT (to the first content delta), decode = wall - TTFT, prompt tokens each side counted
(input + cache read + cache creation) and the cached part, output tokens, and each server process's CPU
seconds (utime + stime, all threads) over the step: on a shared machine other processes stretch wall time, not CPU
time, and work a server does after its answer (zllm's SSD write of the turn) is counted in the step.

llama-server gets its best settings for one agent user: `-c CONTEXT --jinja -np 1 --cache-reuse 256 --cache-ram
8192` (one slot with the whole window: an agent sends one request at a time; the host-RAM prompt cache keeps the
main conversation while a side request takes the slot, --cache-reuse lets a shifted prefix be reused). With
--speculative: `zllm serve --speculative` against `llama-server --spec-default`. Its unified-pool option (-kvu)
is off: with one slot llama-server moves the conversation to the RAM cache when a side request takes the slot, so
the side request attends over its own cells only. Two more flags make the work the same on both sides:
--chat-template-file (`llama_template`: a model template that ignores tools, SmolLM2's, gets a ChatML one that
renders them as zllm's hermes dialect does; the prompt tokens then agree within ~1%) and, for a window past the
model's training one, --override-kv ARCH.context_length (llama-server caps its slot at the training window).

--model: a model in a zllm store (DATA_DIR/models/NAME or its model.gguf; default: the default model's F16 copy the
end-to-end tests pull, ~/.cache/zllm-tests/e2e-data/models/smollm2, an 8K window: use --prompt-scale 0.25 with it,
or stretch it: --context 32768).
--prompt-scale shortens the recorded prompt (texts and tools) and the tool results for a quick run.
--texts FILE keeps every answer's full text per side; --compare-texts FILE (another run's --texts, e.g. the plain
pair's when this one is --speculative) prints, per step and side, whether the answers are identical or where they
first differ: zllm's greedy answers with speculation must equal its answers without.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import E2E_SMOLLM2  # noqa: E402  (bench/bench_args.py)
from claude_code_request import load_or_record  # noqa: E402  (bench/claude_code_request.py)
from llamacpp_server import Server, llama_window, zllm_command  # noqa: E402  (bench/llamacpp_server.py)
from session_script import Step, session_steps  # noqa: E402  (bench/session_script.py)

from tests.support.daemon import free_port  # noqa: E402
from tests.support.tiny_models import QWEN25_CHAT_TEMPLATE  # noqa: E402

SIDES = ("zllm", "llama_server")
LLAMA_SERVER_BEST = ["--jinja", "-np", "1", "--cache-reuse", "256", "--cache-ram", "8192", "--no-webui"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=E2E_SMOLLM2, help="DATA_DIR/models/NAME or its model.gguf")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--turns", type=int, default=16, help="main turns (the restart after turns // 2)")
    parser.add_argument("--prompt-scale", type=float, default=1.0, help="shorten the recorded prompt (0 < s <= 1)")
    parser.add_argument("--context", type=int, default=0, help="both servers' window (0: the model's)")
    parser.add_argument("--speculative", action="store_true", help="zllm --speculative vs llama-server --spec-default")
    parser.add_argument("--llama-server", type=Path, default=Path("/tmp/llama-tools/bin/llama-server"))
    parser.add_argument("--request", type=Path, default=None, help="a recorded Claude Code request body (JSON)")
    parser.add_argument("--claude", default=None, help="the claude CLI to record one with if none is recorded")
    parser.add_argument("--echo-tokens", type=int, default=512)
    parser.add_argument("--json", action="store_true", help="also one JSON line per request")
    parser.add_argument("--texts", type=Path, default=None,
                        help="write every request's full answer text, per side, to this JSON file (after each step)")
    parser.add_argument("--logs", type=Path, default=None,
                        help="copy both servers' logs here at the end (zllm's per-request prefill / decode lines, "
                             "llama-server's print_timing)")
    parser.add_argument("--compare-texts", type=Path, default=None,
                        help="a --texts file of another run (e.g. the plain pair's): compare zllm's answers with "
                             "its zllm answers step by step (identical, or the first differing character)")
    parser.add_argument("--llama-template", default="auto",
                        help="llama-server's --chat-template-file: auto (ChatML with tools as zllm renders them when "
                             "the model's own template ignores tools), model (the GGUF's own), or a file")
    args = parser.parse_args()
    if not args.llama_server.is_file():
        parser.error(f"no llama-server at {args.llama_server}: run bench/build_llama_tools.sh")
    if not 0 < args.prompt_scale <= 1:
        parser.error("--prompt-scale must be in (0, 1]")
    return args


def model_dir_of(path: Path) -> Path:
    model_dir = path.parent if path.suffix == ".gguf" else path
    if model_dir.parent.name != "models" or not (model_dir / "model.gguf").is_file():
        sys.exit(f"error: {path} is not a model in a zllm store (DATA_DIR/models/NAME/model.gguf): "
                 "`zllm pull` the GGUF first")
    return model_dir.resolve()


def model_window(model_dir: Path) -> int:
    manifest = json.loads((model_dir / "zllm-manifest.json").read_text())
    return int(manifest.get("context_length") or 0)


def private_data_dir(model_dir: Path, scratch: Path) -> Path:
    """A data dir of the bench's own holding the model's files as links: a daemon locks its data dir for its whole
    run, and the model's own store (the e2e tests' cache, say) must stay usable by others meanwhile."""
    linked = scratch / "data" / "models" / model_dir.name
    linked.mkdir(parents=True)
    for item in model_dir.iterdir():
        (linked / item.name).symlink_to(item)
    return linked.parent.parent


def servers(args, model_dir: Path, context: int, scratch: Path) -> dict[str, Server]:
    zllm_env = {**os.environ, "ZLLM_DATA_DIR": str(private_data_dir(model_dir, scratch)),
                "ZLLM_STATE_DIR": str(scratch / "state"),
                "ZLLM_CACHE_DIR": str(scratch / "cache"), "ZLLM_RUNTIME_DIR": str(scratch / "run"),
                "ZLLM_CONFIG": str(scratch / "config.toml"), "HF_HUB_OFFLINE": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                            os.environ.get("PYTHONPATH")]))}
    (scratch / "config.toml").write_text("")
    zllm_port, llama_port = free_port(), free_port()
    threads = str(args.threads)
    zllm = [*zllm_command(), "serve", "--model", model_dir.name, "--threads", threads, "--port", str(zllm_port),
            "--context-length", str(context)] + (["--speculative", "on"] if args.speculative else [])
    llama = [str(args.llama_server), "-m", str(model_dir / "model.gguf"), "-t", threads, "-tb", threads,
             "-c", str(context), "--port", str(llama_port), *LLAMA_SERVER_BEST,
             *llama_template(args.llama_template, model_dir, scratch), *llama_window(model_dir, context)] + (
                 ["--spec-default"] if args.speculative else [])
    return {"zllm": Server("zllm", zllm, zllm_port, zllm_env, scratch),
            "llama_server": Server("llama_server", llama, llama_port, dict(os.environ), scratch)}


def llama_template(choice: str, model_dir: Path, scratch: Path) -> list[str]:
    """llama-server's template flags. A template that ignores `tools` (SmolLM2's) would show llama-server's model a
    prompt without the 13 tool schemas that zllm's hermes dialect writes into the system turn (about half the
    tokens): "auto" then gives llama-server Qwen2.5's ChatML template, which renders tools, tool calls and tool
    results the way zllm does (zllm/dialects/hermes/render.py), with the model's own default system prompt."""
    if choice == "model":
        return []
    if choice != "auto":
        return ["--chat-template-file", str(Path(choice).resolve())]
    own = (model_dir / "chat_template.jinja").read_text() if (model_dir / "chat_template.jinja").is_file() else ""
    if "tools" in own:
        return []
    default = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", own, re.S)
    qwen_default = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    template = QWEN25_CHAT_TEMPLATE.replace(qwen_default, default.group(1) if default else qwen_default)
    path = scratch / "chatml_tools.jinja"
    path.write_text(template)
    return ["--chat-template-file", str(path)]


@dataclass
class Result:
    """One request on one server, as the client saw it."""

    wall: float = 0.0
    ttft: float = 0.0
    cpu: float = 0.0  # the server process's CPU seconds (all threads) over the whole step: robust to other load
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    stop_reason: str | None = None
    text: str = ""
    usage: dict = field(default_factory=dict)

    @property
    def decode(self) -> float:
        return self.wall - self.ttft


def send(port: int, body: dict, model: str) -> Result:
    """POST /v1/messages (streaming) and read the SSE to its end: TTFT at the first content delta."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    payload = json.dumps({**body, "model": model}).encode()
    started = time.perf_counter()
    connection.request("POST", "/v1/messages", body=payload, headers={
        "content-type": "application/json", "anthropic-version": "2023-06-01", "x-api-key": "sk-bench"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"port {port}: HTTP {response.status}: {response.read()[:2000]!r}")
    result, usage, event = Result(), {}, None
    for raw in response:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            event = data.get("type") or event  # a data-only frame names its event in "type"
            if event == "content_block_delta":
                if not result.ttft:
                    result.ttft = time.perf_counter() - started
                delta = data.get("delta", {})
                result.text += delta.get("text") or delta.get("partial_json") or delta.get("thinking") or ""
            elif event in ("message_start", "message_delta"):
                usage.update({k: v for k, v in ((data.get("message") or {}).get("usage") or data.get("usage")
                                                or {}).items() if v is not None})
                result.stop_reason = (data.get("delta") or {}).get("stop_reason") or result.stop_reason
            elif event == "error":
                raise RuntimeError(f"port {port}: {data}")
    result.wall = time.perf_counter() - started
    connection.close()
    result.ttft = result.ttft or result.wall
    cached = usage.get("cache_read_input_tokens", 0) or 0
    result.prompt_tokens = (usage.get("input_tokens", 0) or 0) + cached + (usage.get("cache_creation_input_tokens", 0)
                                                                         or 0)
    result.cached_tokens, result.output_tokens, result.usage = cached, usage.get("output_tokens", 0) or 0, usage
    return result


def turn_line(step: Step, results: dict[str, Result]) -> str:
    z, l = results["zllm"], results["llama_server"]
    return (f"{step.name:<13} {z.prompt_tokens:>6}/{l.prompt_tokens:<6} {z.cached_tokens:>6}/{l.cached_tokens:<6} "
            f"{z.ttft:8.2f} {l.ttft:8.2f} {z.decode:7.2f} {l.decode:7.2f} {z.output_tokens:>4}/{l.output_tokens:<4} "
            f"{z.wall:8.2f} {l.wall:8.2f} {z.wall / l.wall:6.2f} {z.cpu:8.2f} {l.cpu:8.2f} "
            f"{z.cpu / max(l.cpu, 1e-9):6.2f}")


HEADER = (f"{'step':<13} {'prompt z/l':>13} {'cached z/l':>13} {'ttft z':>8} {'ttft l':>8} {'dec z':>7} {'dec l':>7} "
          f"{'out z/l':>9} {'wall z':>8} {'wall l':>8} {'ratio':>6} {'cpu z':>8} {'cpu l':>8} {'cpu r':>6}")


def summary(rows: list[tuple[str, Step, dict[str, Result]]]) -> list[dict]:
    out = []
    for phase in ("total", "before", "after"):
        chosen = [r for p, _, r in rows if phase == "total" or p == phase]
        if not chosen:
            continue
        sums = {side: {key: round(sum(getattr(r[side], key) for r in chosen), 2)
                       for key in ("wall", "ttft", "decode", "cpu", "prompt_tokens", "cached_tokens",
                                   "output_tokens")}
                for side in SIDES}
        out.append({"phase": phase, "requests": len(chosen),
                    "ratio": round(sums["zllm"]["wall"] / sums["llama_server"]["wall"], 3),
                    "ttft_ratio": round(sums["zllm"]["ttft"] / max(sums["llama_server"]["ttft"], 1e-9), 3),
                    "decode_ratio": round(sums["zllm"]["decode"] / max(sums["llama_server"]["decode"], 1e-9), 3),
                    "cpu_ratio": round(sums["zllm"]["cpu"] / max(sums["llama_server"]["cpu"], 1e-9), 3), **sums})
    return out


def first_difference(a: str, b: str) -> int | None:
    """The index of the first character where a and b differ (the shorter one's length if one is a prefix of the
    other), None when they are identical."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare_texts(texts: dict[str, dict[str, str]], other_file: Path, side: str = "zllm") -> list[dict]:
    """This run's `side` answers against another run's, step by step (the steps both runs made)."""
    other = json.loads(other_file.read_text())
    out = []
    for step, answers in texts.items():
        if step not in other:
            continue
        mine, theirs = answers[side], other[step][side]
        at = first_difference(mine, theirs)
        out.append({"step": step, "identical": at is None, "first_difference": at,
                    "chars": [len(mine), len(theirs)],
                    "context": None if at is None else [mine[max(0, at - 20):at + 20], theirs[max(0, at - 20):at + 20]]})
    return out


def main() -> None:
    args = parse_args()
    model_dir = model_dir_of(args.model)
    context = args.context or model_window(model_dir)
    recorded = load_or_record(args.request, args.claude)
    steps = session_steps(recorded, args.turns, args.prompt_scale, echo_tokens=args.echo_tokens)
    scratch = Path(tempfile.mkdtemp(prefix="zllm-bench-session-"))
    pair = servers(args, model_dir, context, scratch)
    print(f"# model {model_dir} window {context} threads {args.threads} turns {args.turns} "
          f"scale {args.prompt_scale} speculative {args.speculative}")
    print("# llama-server: " + " ".join(pair["llama_server"].command[1:]))
    print("# zllm: " + " ".join(pair["zllm"].command[-10:]))
    rows, phase, order = [], "before", list(SIDES)
    texts: dict[str, dict[str, str]] = {}
    try:
        for server in pair.values():
            server.start()
            send(server.port, {"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 1}, model_dir.name)
        print(HEADER, flush=True)
        for step in steps:
            if step.kind == "restart":
                for server in pair.values():
                    server.stop()
                for server in pair.values():
                    server.start()
                    send(server.port, {"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 1},
                         model_dir.name)
                phase = "after"
                print("# both servers restarted", flush=True)
                continue
            cpu_before = {side: pair[side].cpu_seconds() for side in SIDES}
            results = {side: send(pair[side].port, step.body, model_dir.name) for side in order}
            for side in SIDES:  # over the step, so work a server does after its answer (an SSD write) counts too
                results[side].cpu = pair[side].cpu_seconds() - cpu_before[side]
            order.reverse()  # the other server goes first next time
            rows.append((phase, step, results))
            print(turn_line(step, results), flush=True)
            texts[step.name] = {side: r.text for side, r in results.items()}
            if args.texts:
                args.texts.write_text(json.dumps(texts, indent=1))
            if args.json:
                print(json.dumps({"bench": "session", "step": step.name, "kind": step.kind, "phase": phase,
                                  **{side: {**vars(r), "decode": r.decode, "text": r.text[:200]}
                                     for side, r in results.items()}}), flush=True)
    finally:
        for server in pair.values():
            server.stop()
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            for server in pair.values():
                if server.log.is_file():
                    shutil.copy(server.log, args.logs / server.log.name)
        shutil.rmtree(scratch, ignore_errors=True)
    apart = [step.name for _, step, r in rows
             if abs(r["zllm"].prompt_tokens - r["llama_server"].prompt_tokens)
             > max(0.1 * r["llama_server"].prompt_tokens, 64)]  # a side request's few tokens: zllm drops the
    #                                                           per-session billing line Claude Code sends
    if apart:  # e.g. a chat template that ignores tools: llama-server then never shows them to the model
        print(f"# WARNING: the two prompts differ by more than 10% on {', '.join(apart)}: the servers do not see the "
              "same conversation, so the ratios compare different work", flush=True)
    for line in summary(rows):
        print(json.dumps({"bench": "session", "speculative": args.speculative, "threads": args.threads,
                          "turns": args.turns, "prompt_scale": args.prompt_scale, **line}), flush=True)
    if args.compare_texts:
        for side in SIDES:
            compared = compare_texts(texts, args.compare_texts, side)
            for line in compared:
                print(json.dumps({"bench": "session", "compare": str(args.compare_texts), "side": side, **line}),
                      flush=True)
            same = sum(line["identical"] for line in compared)
            print(f"# {side}'s answers identical to {args.compare_texts}'s on {same} of {len(compared)} steps",
                  flush=True)


if __name__ == "__main__":
    main()
