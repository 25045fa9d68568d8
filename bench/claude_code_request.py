"""A real Claude Code request for the session benchmark: recorded from the installed `claude` CLI, not written by us.

    .venv/bin/python bench/claude_code_request.py [--claude PATH] [--out FILE]

Runs `claude -p PROMPT --model some-model` (Claude Code's agent request for a model it does not know: its system
prompt, its tools, the first user message and the mid-conversation system turn) against a recording server on a
free localhost port, which answers with a short text and keeps the request body. The body is written to FILE
(default `DEFAULT_RECORDING`) and reused by bench/session.py. Nothing leaves the machine: the client is pointed at
the recorder and its non-essential traffic is switched off. The recording is not committed (it is Claude Code's
own prompt text); any `claude` on PATH (npm @anthropic-ai/claude-code) can record it again.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DEFAULT_RECORDING = Path.home() / ".cache" / "zllm-bench" / "claude-code-request.json"
FIRST_PROMPT = ("The update functions in src/state.py are slow. Read the file, run the tests, and make the worst "
                "one faster without changing what it returns.")
ANSWER_EVENTS = [
    ("message_start", {"type": "message_start", "message": {
        "id": "msg_rec", "type": "message", "role": "assistant", "model": "some-model", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}}),
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0,
                             "delta": {"type": "text_delta", "text": "Done."}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                       "usage": {"output_tokens": 2}}),
    ("message_stop", {"type": "message_stop"}),
]


def recorder(bodies: list[dict]) -> ThreadingHTTPServer:
    """A localhost server that keeps every POST body and answers Anthropic Messages with a short streamed text."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            bodies.append({"path": self.path, "body": body})
            if "count_tokens" in self.path:
                return self.reply(b'{"input_tokens": 1}', "application/json")
            if not body.get("stream"):
                message = {**ANSWER_EVENTS[0][1]["message"], "content": [{"type": "text", "text": "Done."}],
                           "stop_reason": "end_turn"}
                return self.reply(json.dumps(message).encode(), "application/json")
            frames = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in ANSWER_EVENTS)
            self.reply(frames.encode(), "text/event-stream")

        def reply(self, data: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def record(claude: str, out: Path = DEFAULT_RECORDING) -> dict:
    """Run Claude Code once against the recorder; write and return its agent request (the body with tools)."""
    bodies: list[dict] = []
    server = recorder(bodies)
    home = Path(tempfile.mkdtemp(prefix="zllm-cc-home-"))
    project = home / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "state.py").write_text("def update(state):\n    return dict(state)\n")
    env = {**os.environ, "HOME": str(home), "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{server.server_port}",
           "ANTHROPIC_API_KEY": "sk-bench", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "32768",
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1,localhost"}
    try:
        subprocess.run([claude, "-p", FIRST_PROMPT, "--model", "some-model"], cwd=project, env=env,
                       capture_output=True, timeout=180, check=False)
    finally:
        server.shutdown()
        shutil.rmtree(home, ignore_errors=True)
    agent = [entry["body"] for entry in bodies if "count_tokens" not in entry["path"] and entry["body"].get("tools")]
    if not agent:
        raise RuntimeError(f"{claude} sent no agent request (saw {[entry['path'] for entry in bodies]})")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(agent[0], indent=1))
    return agent[0]


def load_or_record(path: Path | None, claude: str | None) -> dict:
    """The recorded request at `path` (default `DEFAULT_RECORDING`), recorded first with `claude` if missing."""
    path = path or DEFAULT_RECORDING
    if path.is_file():
        return json.loads(path.read_text())
    claude = claude or shutil.which("claude")
    if claude is None:
        raise SystemExit(f"error: no recorded request at {path} and no `claude` to record one: install "
                         "@anthropic-ai/claude-code (npm) and pass --claude PATH, or pass --request FILE")
    return record(claude, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claude", default=shutil.which("claude"))
    parser.add_argument("--out", type=Path, default=DEFAULT_RECORDING)
    args = parser.parse_args()
    if args.claude is None:
        parser.error("no `claude` on PATH: pass --claude PATH")
    body = record(args.claude, args.out)
    print(json.dumps({"recorded": str(args.out), "bytes": len(json.dumps(body)),
                      "tools": [tool.get("name") for tool in body.get("tools", [])],
                      "system_blocks": len(body.get("system") or []), "messages": len(body["messages"])}))


if __name__ == "__main__":
    main()
