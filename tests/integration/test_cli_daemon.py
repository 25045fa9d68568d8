"""The real `zllm` CLI driving a real background daemon (pexpect on a terminal, subprocess for data):
pull from a local dir, start, status, a request through the API, trace (live and --last), cache ls, ps,
prune, a second daemon refused, recovery after kill -9, stop. The tests run in order and share one daemon."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys

import openai
import pexpect
import pytest

from tests.support.daemon import CliEnv
from tests.support.tiny_models import tiny_qwen_dir

pytestmark = pytest.mark.timeout(300)  # a daemon start on a loaded 2-core machine took over 60 s

MODEL = "tiny-qwen"


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory):
    env = CliEnv(tmp_path_factory.mktemp("zllm-cli-data"))
    yield env
    env.close()  # kills whatever the tests left running


def spawn(cli: CliEnv, *args: str, timeout: float = 150) -> pexpect.spawn:
    """`zllm ARGS` on a terminal (progress, live views), wide enough that table cells are not cut."""
    return pexpect.spawn(sys.executable, ["-m", "zllm", *args], env=cli.env, encoding="utf-8", timeout=timeout,
                         dimensions=(40, 250))


def finish(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


def ask(cli: CliEnv, text: str) -> None:
    client = openai.OpenAI(base_url=f"{cli.base_url}/v1", api_key="test-key", max_retries=0, timeout=60)
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=4)


def data(cli: CliEnv, *args: str):
    result = cli.run(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_pull_from_a_local_dir_then_start_in_the_background(cli: CliEnv) -> None:
    before = cli.run("status")
    assert before.returncode == 3 and "error: no zllm daemon is running" in before.stderr
    pulled = cli.run("pull", str(tiny_qwen_dir()), "--name", MODEL)
    assert pulled.returncode == 0 and f"pulled {MODEL}" in pulled.stderr, pulled.stderr

    start = spawn(cli, "start", "--model", MODEL, "--context-length", "256")
    start.expect(rf"zllm started \(pid (\d+)\): {MODEL} on http://127\.0\.0\.1:{cli.port}/v1")
    pid = int(start.match.group(1))
    assert finish(start) == 0

    status = data(cli, "status")
    assert (status["running"], status["phase"], status["pid"], status["model"]) == (True, "ready", pid, MODEL)
    assert cli.daemon_pid() == pid and oct(cli.control_socket.stat().st_mode & 0o777) == "0o600"
    again = cli.run("start")
    assert again.returncode == 0 and f"zllm is already running (pid {pid})" in again.stderr
    logs = cli.run("logs", "-n", "20")
    assert logs.returncode == 0 and f"serving {MODEL} on http://127.0.0.1:{cli.port}/v1" in logs.stdout


def test_a_request_shows_up_live_in_trace_then_in_trace_last_and_cache_ls(cli: CliEnv) -> None:
    live = spawn(cli, "trace")  # a terminal: the rich live table
    live.expect("REQUEST")
    ndjson = spawn(cli, "trace", "--json")  # NDJSON, following
    ask(cli, "hello")
    live.expect(r"(req_[0-9a-f]+) +openai_chat +tiny-qwen")
    request_id = live.match.group(1)
    ndjson.expect(r'\{"phase":"finished","request_id":"(req_[0-9a-f]+)"')
    assert ndjson.match.group(1) == request_id
    for child in (live, ndjson):
        child.sendintr()  # Ctrl-C is how a follow ends: cleanly
        assert finish(child) == 0

    [report] = [json.loads(line) for line in cli.run("trace", "--json", "--last", "1").stdout.splitlines()]
    assert (report["request_id"], report["api"], report["model"]) == (request_id, "openai_chat", MODEL)
    assert report["completion_tokens"] == 4 and report["cache_tier"] == "cold" and report["prompt_tokens"] > 5
    entries = data(cli, "cache", "ls")
    assert [(e["id"], e["tier"]) for e in entries] == [(request_id, "device")]
    assert entries[0]["tokens"] == report["prompt_tokens"] + 3  # the prompt and the answer fed back (4 - 1)
    [model] = data(cli, "ps")
    assert model["name"] == MODEL and model["context_length"] == 256 and model["kv_cache_bytes"] > 0
    assert (model["dialect_round_trip"], model["dialect_problem"]) == (True, "")  # checked at load


def test_prune_removes_what_the_dry_run_listed(cli: CliEnv) -> None:
    [entry] = data(cli, "cache", "ls")
    dry = cli.run("cache", "prune", "--all", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.splitlines()[1].split()[:2] == [entry["id"], "device"]
    assert "would remove 1 entries" in dry.stderr and len(data(cli, "cache", "ls")) == 1
    pruned = data(cli, "cache", "prune", "--all")
    assert [e["id"] for e in pruned["removed"]] == [entry["id"]] and pruned["device_freed_bytes"] > 0
    assert data(cli, "cache", "ls") == []


def test_a_second_daemon_on_the_same_store_is_refused(cli: CliEnv) -> None:
    second = CliEnv(cli.env["ZLLM_DATA_DIR"])  # its own runtime dir and port, the same data dir
    try:
        result = second.run("serve", "--model", MODEL, timeout=30)
    finally:
        second.close()
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert re.search(r"error: another zllm daemon \(pid \d+\) is using the data dir", result.stderr)


def test_recovery_after_kill_9(cli: CliEnv) -> None:
    pid = cli.daemon_pid()
    os.kill(pid, signal.SIGKILL)
    cli.kill_daemon(signal.SIGKILL)  # waits until its lock is gone
    assert cli.pid_file.exists() and cli.control_socket.exists()  # nobody cleaned up
    status = cli.run("status")
    assert status.returncode == 3
    assert f"removed a stale pid file and socket left by a daemon that died (pid {pid})" in status.stderr
    assert not cli.pid_file.exists() and not cli.control_socket.exists()

    with socket.socket() as busy:  # a start that fails shows why, from the daemon's log
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        failed = cli.run("start", "--port", str(taken), "--model", MODEL)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert f"error: cannot listen on 127.0.0.1:{taken}" in failed.stderr  # the log tail
    assert "error: the daemon exited with status 1 while starting" in failed.stderr

    restarted = cli.run("restart", timeout=90)  # with the flags of the last start (model, context length)
    assert restarted.returncode == 0, restarted.stderr
    assert f"zllm started (pid {cli.daemon_pid()}): {MODEL}" in restarted.stderr
    assert data(cli, "status")["phase"] == "ready" and cli.daemon_pid() != pid


def test_stop(cli: CliEnv) -> None:
    pid = cli.daemon_pid()
    stopped = cli.run("stop")
    assert stopped.returncode == 0 and f"zllm stopped (pid {pid})" in stopped.stderr
    assert cli.run("status").returncode == 3
    assert not cli.pid_file.exists() and not cli.control_socket.exists()
    log = cli.log_file.read_text()
    assert "shutting down" in log and "Traceback" not in log
    from_file = cli.run("logs")
    assert from_file.returncode == 0 and "zllm is not running; the log of its last background run" in from_file.stderr
    assert from_file.stdout.rstrip().endswith("INFO zllm.daemon: shutting down")


def test_explain_miss_between_two_request_files_needs_no_daemon(cli: CliEnv, tmp_path) -> None:
    def request(stamp: str) -> str:
        path = tmp_path / f"{stamp.replace(':', '')}.json"
        path.write_text(json.dumps({"model": MODEL, "messages": [
            {"role": "system", "content": f"You are a coding agent. Current time: 2026-11-30 {stamp} UTC."},
            {"role": "user", "content": "Run the tests."}]}))
        return str(path)

    a, b = request("10:00:00"), request("10:05:00")
    assert cli.run("status").returncode == 3  # stopped: this is offline
    cli.config_file.write_text(f'model = "{MODEL}"\n')  # no --model: the configured one
    try:
        result = cli.run("cache", "explain-miss", "--between", a, b)
    finally:
        cli.config_file.write_text("")
    assert result.returncode == 0, result.stderr
    headline, cause = result.stdout.splitlines()[:2]
    assert headline.startswith("diverged at token ") and headline.endswith("in system block")
    assert cause == "cause: timestamp in the prompt"
