"""`zllm serve` as a process: signals, exposure rules, API keys, and failures that must be loud."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import openai
import pytest

from tests.integration.conftest import TINY
from tests.support.daemon import Daemon


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_shuts_down_gracefully_mid_request(tiny_data_dir, sig) -> None:
    daemon = Daemon(tiny_data_dir, TINY).wait_ready()
    client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="k", max_retries=0, timeout=60)
    outcome: dict = {}
    streaming = threading.Event()

    def long_request() -> None:
        try:
            stream = client.chat.completions.create(
                model=TINY, messages=[{"role": "user", "content": "hi"}], max_tokens=2000, stream=True
            )
            outcome["chunks"] = 0
            for _ in stream:
                outcome["chunks"] += 1
                streaming.set()
        except Exception as exc:  # the stream may be cut at the end of the grace period
            outcome["error"] = exc
        finally:
            streaming.set()

    worker = threading.Thread(target=long_request)
    worker.start()
    assert streaming.wait(30)
    assert daemon.stop(sig) == 0, daemon.log()
    worker.join(30)
    assert not worker.is_alive()
    assert "shutting down" in daemon.log()
    assert "Traceback" not in daemon.log()


def test_api_key_is_enforced(tiny_data_dir) -> None:
    daemon = Daemon(tiny_data_dir, TINY, "--api-key", "s3cret").wait_ready()
    try:
        wrong = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="s3cret", max_retries=0)
        assert [m.id for m in right.models.list().data] == [TINY]
    finally:
        daemon.stop()


def run_serve(tiny_data_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zllm", "serve", *args],
        capture_output=True, text=True, timeout=60,
        env={"ZLLM_DATA_DIR": str(tiny_data_dir), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )


def test_binding_beyond_loopback_needs_an_api_key(tiny_data_dir) -> None:
    result = run_serve(tiny_data_dir, "--model", TINY, "--host", "0.0.0.0")
    assert result.returncode == 1
    assert "error: refusing to bind 0.0.0.0 without an API key" in result.stderr
    assert "hint:" in result.stderr
    assert result.stdout == ""


def test_an_unknown_model_fails_loudly(tiny_data_dir) -> None:
    result = run_serve(tiny_data_dir, "--model", "./no/such/dir")
    assert result.returncode == 1
    assert result.stderr.startswith("error:") or "\nerror:" in result.stderr
    assert "Traceback" not in result.stderr
