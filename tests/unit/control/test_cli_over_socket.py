"""The CLI verbs against a fake daemon on a real control socket: (exit code, stdout, stderr) for each."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from types import SimpleNamespace

import pytest

from tests.unit.control.test_control_methods import FakeCache, fake_engine
from zllm import __version__
from zllm.cli import trace as trace_cli
from zllm.cli.app import main
from zllm.control.methods import ControlMethods, DaemonFacts
from zllm.control.protocol import LoadedModelInfo
from zllm.runtime.report import RequestReport
from zllm.runtime.trace import LogHub, TraceHub


@pytest.fixture()
def env(monkeypatch, short_dir, tmp_path):
    for name, path in {"RUNTIME": short_dir / "run", "STATE": tmp_path / "state", "DATA": tmp_path / "data",
                       "CACHE": tmp_path / "cache"}.items():
        monkeypatch.setenv(f"ZLLM_{name}_DIR", str(path))
    monkeypatch.setenv("ZLLM_CONFIG", str(tmp_path / "config.toml"))
    (tmp_path / "config.toml").write_text("")
    monkeypatch.setenv("NO_COLOR", "1")


def real_explainer(record):
    from zllm.diagnosis.explain import explain_near_miss

    return explain_near_miss(dataclasses.asdict(record))


@pytest.fixture()
def fake_daemon(env, serve, loop_thread):
    def start(version: str = __version__, extra_methods: dict | None = None, explain=real_explainer):
        trace = TraceHub(loop_thread.loop)
        facts = DaemonFacts(version=version, pid=4242, started_at=time.time() - 75, model="tiny",
                            http_url="http://127.0.0.1:1/v1", host="127.0.0.1", port=1, socket="s", data_dir="d",
                            log_file="l", max_queue=8)
        control = ControlMethods(facts, trace=trace, logs=LogHub(loop_thread.loop).ring,
                                 request_shutdown=lambda: None)
        model = LoadedModelInfo(name="tiny", architecture="Qwen3ForCausalLM", parameters=1_234_567,
                                model_bytes=4_938_268, context_length=192, device="cpu", dtype="float32",
                                backend="torch", backend_reason="safetensors", dialect_round_trip=False,
                                dialect_problem="the parser reads 0 calls back")
        control.attach(fake_engine(FakeCache(), explain=explain), model)
        serve({**control.methods(), **(extra_methods or {})}, control.streams(), version=version)
        for i in range(3):
            loop_thread.call(trace.publish, RequestReport(
                phase="finished", request_id=f"chat-{i}", api="chat", model="tiny", prompt_tokens=100 + i,
                cached_tokens=90, cache_tier="device", tool_calls=("read_file",), finish_reason="stop"))
        return SimpleNamespace(trace=trace)
    return start


def zllm(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    captured = capsys.readouterr()
    return exited.value.code, captured.out, " ".join(captured.err.split())  # rich wraps stderr at 80 columns


def test_status_is_data_on_stdout(fake_daemon, capsys) -> None:
    fake_daemon()
    code, out, err = zllm(capsys, "status")
    assert code == 0 and err == ""
    assert out.splitlines()[0] == f"zllm {__version__} is ready (pid 4242)"
    assert "uptime   1m15s" in out and "api      http://127.0.0.1:1/v1" in out
    code, out, _ = zllm(capsys, "status", "--json")
    data = json.loads(out)
    assert code == 0 and data["running"] is True and data["queue_waiting"] == 2 and data["max_queue"] == 8


def test_status_shows_a_prefilling_request_and_its_progress(fake_daemon, capsys, loop_thread) -> None:
    daemon = fake_daemon()
    loop_thread.call(daemon.trace.publish, RequestReport(
        phase="prefilling", request_id="msg_long", api="messages", prompt_tokens=18_749, prefilled_tokens=4_352,
        cached_tokens=1_024))
    code, out, _ = zllm(capsys, "status")
    assert code == 0 and "queue     0 running, 1 prefilling, 2 waiting (max 8)" in out
    assert "prefill   msg_long 4,352/18,749 prompt tokens (23%), 1,024 from the cache" in out
    code, out, _ = zllm(capsys, "status", "--json")
    data = json.loads(out)
    assert (data["requests_running"], data["requests_prefilling"]) == (0, 1)
    [progress] = data["prefilling"]
    assert {k: progress[k] for k in ("request_id", "api", "prompt_tokens", "prefilled_tokens", "cached_tokens")} == {
        "request_id": "msg_long", "api": "messages", "prompt_tokens": 18_749, "prefilled_tokens": 4_352,
        "cached_tokens": 1_024}
    loop_thread.call(daemon.trace.publish, RequestReport(phase="started", request_id="msg_long",
                                                         prompt_tokens=18_749, prefilled_tokens=18_749))
    code, out, _ = zllm(capsys, "status", "--json")
    data = json.loads(out)
    assert (data["requests_running"], data["requests_prefilling"], data["prefilling"]) == (1, 0, [])


def test_a_trace_row_shows_a_prefill_s_progress() -> None:
    report = RequestReport(phase="prefilling", request_id="msg_long", api="messages", prompt_tokens=18_749,
                           prefilled_tokens=4_352).to_json()
    cells = dict(zip(trace_cli.COLUMNS, trace_cli.row(report), strict=True))
    assert (cells["STATE"], cells["PROMPT"]) == ("prefill 23%", "4,352/18,749")
    assert trace_cli.state({**report, "phase": "started"}) == "running"


def test_a_version_skew_is_reported_on_stderr(fake_daemon, capsys) -> None:
    fake_daemon(version="0.0.1")
    code, out, err = zllm(capsys, "status", "--json")
    assert code == 0 and json.loads(out)["version"] == "0.0.1"
    assert f"warning: the daemon runs zllm 0.0.1, this CLI is zllm {__version__}" in err
    assert "hint: restart it to run this version: zllm restart" in err


def test_ps_shows_memory_and_the_dialect(fake_daemon, capsys) -> None:
    fake_daemon()
    code, out, err = zllm(capsys, "ps")
    header, row = out.splitlines()
    assert code == 0 and header.split()[:3] == ["NAME", "ARCHITECTURE", "PARAMS"]
    cells = row.split()
    assert cells[:14] == ["tiny", "Qwen3ForCausalLM", "1.2M", "torch", "cpu", "float32", "192", "4.9", "MB", "4.5",
                          "KB", "/", "16.0", "KB"]
    assert cells[15] in ("MB", "GB") and float(cells[14]) > 0 and cells[16] == "hermes_json"  # the real RSS
    assert err == ("backend torch: safetensors dialect hermes_json: template mentions <tool_call> dialect hermes_json: "
                   "round trip FAILS: the parser reads 0 calls back (served anyway; see `zllm dialect`)")
    code, out, _ = zllm(capsys, "ps", "--json")
    model = json.loads(out)[0]
    assert model["kv_cache_bytes"] == 4500
    assert (model["dialect_round_trip"], model["dialect_problem"]) == (False, "the parser reads 0 calls back")


def test_cache_ls_stats_and_json(fake_daemon, capsys) -> None:
    fake_daemon()
    code, out, _ = zllm(capsys, "cache", "ls")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["ID", "TIER", "NAMESPACE", "TOKENS", "SIZE", "AGE", "HITS"]
    cells = lines[1].split()
    assert cells[:6] + cells[7:] == ["req-new", "device", "aaaa1111", "300", "3.0", "KB", "4"]
    assert re.fullmatch(r"1m0\ds", cells[6])  # created a minute before the fake daemon started
    code, out, _ = zllm(capsys, "cache", "ls", "--json")
    assert [e["id"] for e in json.loads(out)] == ["req-new", "req-old", "req-old"]
    code, out, _ = zllm(capsys, "cache", "stats")
    assert code == 0 and "10: 6 device hits (60%), 1 ssd hits (10%), 3 cold" in out
    assert "1,000 prompt, 700 cached (70%)" in out


def test_cache_prune_dry_run_lists_what_would_go(fake_daemon, capsys) -> None:
    fake_daemon()
    code, out, err = zllm(capsys, "cache", "prune", "--namespace", "bbbb", "--dry-run")
    assert code == 0 and [line.split()[:2] for line in out.splitlines()[1:]] == [["req-old", "device"],
                                                                                  ["req-old", "ssd"]]
    assert err == "would remove 2 entries, 6.0 KB"
    code, out, err = zllm(capsys, "cache", "prune", "--older-than", "2h", "--json")
    assert code == 0 and json.loads(out)["dry_run"] is False


@pytest.mark.parametrize(("argv", "message"), [
    (("cache", "prune"), "error: nothing to prune by hint: give --older-than, --max-size, --namespace or --all"),
    (("cache", "prune", "--older-than", "soon"), "error: `soon` is not a duration"),
    (("cache", "prune", "--max-size", "big"), "error: `big` is not a size"),
    (("cache", "prune", "--namespace", "zzz"), "error: no cached entries in namespace `zzz`"),
])
def test_cache_prune_user_errors_exit_1(fake_daemon, capsys, argv, message) -> None:
    fake_daemon()
    code, out, err = zllm(capsys, *argv)
    assert (code, out) == (1, "") and err.startswith(message)


def test_explain_miss_from_the_daemon(fake_daemon, capsys) -> None:
    fake_daemon()
    code, out, _ = zllm(capsys, "cache", "explain-miss")
    assert code == 0
    headline, cause = out.splitlines()[:2]
    assert headline == "diverged from req-b (ssd) at token 2000 (cached 2100, request 2200 tokens), in system block"
    assert cause.startswith("cause: ")
    code, out, _ = zllm(capsys, "cache", "explain-miss", "--json")
    answer = json.loads(out)
    assert answer["near_miss"]["entry_id"] == "req-b" and answer["explanation"]["divergence"] == 2000


def test_explain_miss_without_an_explainer_shows_the_raw_record(fake_daemon, capsys) -> None:
    fake_daemon(explain=None)
    code, out, _ = zllm(capsys, "cache", "explain-miss")
    lines = out.splitlines()
    assert code == 0 and lines[0] == ("near miss of req-b (ssd tier) at token 2,000 of 2,100 cached; "
                                      "the request has 2,200 tokens")
    assert lines[1:] == ["where     system (in the cached prompt)", "shared    …shared", "cached    10:00…",
                         "request   10:05…"]


def test_trace_last_as_ndjson_and_as_lines(fake_daemon, capsys) -> None:
    fake_daemon()
    code, out, _ = zllm(capsys, "trace", "--last", "2", "--json")
    reports = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["request_id"] for r in reports] == ["chat-1", "chat-2"]
    code, out, _ = zllm(capsys, "trace", "--last", "1")
    [line] = out.splitlines()
    assert " done chat-2 chat tiny " in line and "prompt 102 cached 90 (device)" in line
    assert line.endswith("stop · tools: read_file")


def test_an_internal_daemon_error_exits_2(fake_daemon, capsys) -> None:
    async def broken(params: dict) -> dict:
        raise RuntimeError("boom")

    fake_daemon(extra_methods={"status": broken})
    code, out, err = zllm(capsys, "status")
    assert (code, out) == (2, "") and err.startswith("error: RuntimeError: boom")


def test_no_daemon_exits_3_and_a_stale_pid_file_is_cleaned(env, short_dir, capsys) -> None:
    (short_dir / "run").mkdir()
    (short_dir / "run" / "zllm.pid").write_text("999999\n")
    (short_dir / "run" / "zllm.sock").write_text("")
    code, out, err = zllm(capsys, "cache", "ls")
    assert (code, out) == (3, "")
    assert "removed a stale pid file and socket left by a daemon that died (pid 999999)" in err
    assert "error: no zllm daemon is running" in err and "hint: start one: zllm start" in err
    assert not (short_dir / "run" / "zllm.pid").exists() and not (short_dir / "run" / "zllm.sock").exists()
    code, out, err = zllm(capsys, "status", "--json")
    assert code == 3 and json.loads(out) == {"running": False}


def test_usage_errors_exit_1_and_internal_errors_exit_2(env, capsys, monkeypatch) -> None:
    code, _, err = zllm(capsys, "cache", "ls", "--bogus")
    assert code == 1 and err.startswith("error: No such option: --bogus")
    monkeypatch.setattr("zllm.cli.cache.connect", lambda: 1 / 0)
    code, _, err = zllm(capsys, "cache", "ls")
    assert code == 2 and err.startswith("error: internal error: ZeroDivisionError")
    assert "Traceback" not in err


def test_running_daemon_answers_for_the_client_verbs(fake_daemon, env) -> None:
    from zllm.cli.connect import RunningDaemon, running_daemon
    from zllm.config import load_settings

    assert running_daemon(load_settings()) is None  # nothing answers yet
    fake_daemon()
    assert running_daemon(load_settings()) == RunningDaemon(host="127.0.0.1", port=1, model="tiny", context_length=192)
