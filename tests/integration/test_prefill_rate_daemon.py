"""A real daemon measures its prefill rate from the requests it serves, `ps` reports it, and `zllm claude` /
`zllm codex` read it over the control socket to size the clients' timeouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import anthropic

from tests.support.daemon import Daemon
from zllm.cli import clients

PROMPT = "describe the weather in some detail " * 12  # ~100 tokens: above the 64 a measurement needs


def zllm(daemon: Daemon, tmp_path: Path, *args: str) -> str:
    """The CLI as a user runs it, finding the daemon by its control socket (and nothing of the user's)."""
    config = tmp_path / "config.toml"
    config.write_text("")
    env = {**os.environ, "ZLLM_RUNTIME_DIR": str(daemon.control_socket.parent), "ZLLM_CONFIG": str(config),
           "ZLLM_STATE_DIR": str(tmp_path / "state"), "ZLLM_DATA_DIR": str(tmp_path / "data")}
    result = subprocess.run([sys.executable, "-m", "zllm", *args], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_measured_rate_reaches_the_client_settings(daemon: Daemon, tmp_path: Path) -> None:
    client = anthropic.Anthropic(base_url=daemon.base_url, api_key="k", max_retries=0, timeout=60)
    client.messages.create(model="tiny-qwen", max_tokens=4, messages=[{"role": "user", "content": PROMPT}])
    (model,) = daemon.control().ps()
    assert model.prefill_tokens_per_s is not None and model.prefill_tokens_per_s > 0
    claude = json.loads(zllm(daemon, tmp_path, "claude", "--json"))
    assert claude["prefill_tokens_per_s"] > 0 and claude["base_url"] == daemon.base_url
    # the tiny model prefills its 192-token window in well under a second: the 10-minute floor
    assert claude["client_timeout_s"] == clients.CLIENT_TIMEOUT_FLOOR_S
    assert claude["env"]["CLAUDE_STREAM_IDLE_TIMEOUT_MS"] == "600000"
    codex = tomllib.loads(zllm(daemon, tmp_path, "codex", "--toml"))
    assert codex["model_providers"]["zllm"]["stream_idle_timeout_ms"] == 600_000
