"""Resident memory of the daemon serving a GGUF on llama.cpp, against the GGUF file plus its KV pool.

    python bench/resident_memory.py [MODEL_DIR] [--threads 2] [--modules]

MODEL_DIR: a GGUF pull in a zllm store, DATA_DIR/models/NAME (default as bench_args.resolve_model_dir). The
daemon (`python -m zllm serve --model NAME`, this interpreter, state in a temp dir) is read from outside, from
/proc: after it is ready, after one served chat turn, after a tool-call turn (which builds the fence) and
after a long turn (--long-tokens of prompt: llama.cpp's compute buffers at their full ubatch). Each
JSON line gives VmRSS, smaps_rollup's anonymous / file-backed parts, `zllm ps`'s KV bytes and model bytes, and
ratio = VmRSS / (GGUF file + KV pool), the issue's goal ≤ 1.3. --modules prints which heavy modules the
daemon imported (from its `-X importtime` log).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import FILLER, model_parser, resolve_model_dir
from llamacpp_server import private_store  # noqa: E402  (bench/llamacpp_server.py)

from tests.support.daemon import free_port
from zllm.model_files import GGUF_FILE

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "numpy", "tokenizers", "jinja2", "aiohttp", "llguidance", "llama_cpp", "sqlite3",
         "huggingface_hub", "safetensors", "pydantic", "rich", "typer", "gguf", "yaml", "uvloop")
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                          "required": ["path"]}}}]


def proc_memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM from status, the anonymous / file parts from smaps_rollup, in kB."""
    facts: dict[str, int] = {}
    for name in ("status", "smaps_rollup"):
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "Pss_Anon", "Pss_File", "Private_Dirty"):
                facts[key] = int(rest.split()[0])
    return facts


def chat(port: int, model: str, content: str = "Read the file src/app.py, please.", **extra) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": 16, "temperature": 0.0, **extra}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def wait_ready(proc: subprocess.Popen, port: int, log: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"daemon not ready after {timeout}s")


def ps(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "zllm", "ps", "--json"], env=env, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)[0]


def imported_heavy(log: Path) -> list[str]:
    """Top-level packages among HEAVY that the importtime log shows, with their cumulative import µs."""
    found: dict[str, int] = {}
    for line in log.read_text().splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if match and match.group(3).split(".")[0] in HEAVY and match.group(3) in HEAVY:
            found[match.group(3)] = int(match.group(1))
    return [f"{name} {us / 1e3:.0f} ms" for name, us in sorted(found.items(), key=lambda kv: -kv[1])]


def main() -> None:
    parser = model_parser(__doc__.splitlines()[0], dtype=False)
    parser.set_defaults(threads=2)
    parser.add_argument("--modules", action="store_true", help="list the heavy modules the daemon imported")
    parser.add_argument("--long-tokens", type=int, default=2000, help="about this many prompt tokens in the long turn")
    args = parser.parse_args()
    model_dir = resolve_model_dir(args).resolve()
    if model_dir.parent.name != "models":
        sys.exit(f"error: {model_dir} is not in a zllm store (DATA_DIR/models/NAME): pull the GGUF first")
    scratch = Path(tempfile.mkdtemp(prefix="zllm-bench-mem-"))
    data = private_store(model_dir, scratch / "data")  # one daemon per store: never the e2e tests' shared one
    env = {**os.environ, "ZLLM_DATA_DIR": str(data), "ZLLM_STATE_DIR": str(scratch / "state"),
           "ZLLM_CACHE_DIR": str(scratch / "cache"), "ZLLM_RUNTIME_DIR": str(scratch / "run"),
           "ZLLM_CONFIG": str(scratch / "config.toml"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if args.modules:
        env["PYTHONPROFILEIMPORTTIME"] = "1"
    (scratch / "config.toml").write_text("")
    port, log = free_port(), scratch / "daemon.log"
    gguf_bytes = (model_dir / GGUF_FILE).stat().st_size
    with open(log, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "zllm", "serve", "--model", model_dir.name, "--threads",
                                 str(args.threads), "--port", str(port)], stdout=log_file, stderr=log_file, env=env)
    try:
        wait_ready(proc, port, log)
        long_text = FILLER * (args.long_tokens // 24 + 1)  # ~24 tokens of FILLER each
        steps = (("ready", None), ("chat_turn", {}), ("tool_turn", {"tools": TOOLS, "tool_choice": "required"}),
                 ("long_turn", {"content": long_text + "\nSummarize that."}))
        for step, extra in steps:
            prompt_tokens = None
            if extra is not None:
                prompt_tokens = chat(port, model_dir.name, **extra).get("usage", {}).get("prompt_tokens")
            time.sleep(0.5)
            memory, model = proc_memory(proc.pid), ps(env)
            kv = model.get("kv_cache_bytes") or 0
            print(json.dumps({"bench": "resident_memory", "step": step, "prompt_tokens": prompt_tokens,
                              "vm_rss_mb": round(memory["VmRSS"] / 1024, 1),
                              "vm_hwm_mb": round(memory["VmHWM"] / 1024, 1),
                              "rss_anon_mb": round(memory["RssAnon"] / 1024, 1),
                              "rss_file_mb": round(memory["RssFile"] / 1024, 1),
                              "gguf_mb": round(gguf_bytes / 2**20, 1), "kv_mb": round(kv / 2**20, 1),
                              "ratio": round(memory["VmRSS"] * 1024 / (gguf_bytes + kv), 3)}), flush=True)
        if args.modules:
            print(json.dumps({"bench": "resident_memory", "imported": imported_heavy(log)}), flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
