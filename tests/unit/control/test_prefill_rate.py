"""The measured prefill rate: from the trace ring's recent prefills (else the prefix cache's estimate), reported
by `ps`, and what `zllm claude` / `zllm codex` size the clients' timeouts from (a fake daemon on a real control
socket, the real CLI)."""

from __future__ import annotations

import json
import tomllib

from tests.unit.control.test_cli_over_socket import env, fake_daemon, zllm  # noqa: F401 (fixtures)
from zllm.control.prefill_rate import measured_prefill_rate
from zllm.runtime.report import RequestReport


def report(prompt: int, cached: int, prefill_s: float | None) -> RequestReport:
    return RequestReport(phase="finished", request_id="r", prompt_tokens=prompt, cached_tokens=cached,
                         prefill_s=prefill_s)


def test_the_rate_is_all_prefilled_tokens_over_all_their_time() -> None:
    # 1000 + 3000 tokens prefilled in 2 + 4 s; the cached part of a prompt was not prefilled
    assert measured_prefill_rate([report(1000, 0, 2.0), report(4000, 1000, 4.0)]) == 4000 / 6


def test_short_and_untimed_prefills_do_not_count() -> None:
    # a 40-token prefill is mostly fixed overhead; an aborted request may have no prefill time
    assert measured_prefill_rate([report(40, 0, 1.0), report(5000, 0, None), report(500, 0, 1.0)]) == 500.0


def test_without_recent_prefills_the_cache_estimate_serves_then_nothing() -> None:
    assert measured_prefill_rate([], cost_s_per_token=0.004) == 250.0
    assert measured_prefill_rate([report(40, 0, 1.0)], cost_s_per_token=None) is None


def test_ps_reports_the_rate_and_zllm_claude_and_codex_size_their_timeouts_from_it(
        fake_daemon, loop_thread, capsys) -> None:  # noqa: F811
    trace = fake_daemon().trace
    code, out, _ = zllm(capsys, "ps", "--json")
    assert code == 0 and json.loads(out)[0]["prefill_tokens_per_s"] is None  # the fake's reports have no timing
    loop_thread.call(trace.publish, report(2000, 0, 25.0))
    loop_thread.call(trace.publish, report(1100, 100, 1000.0))  # 3000 tokens in 1025 s: 2.93 tokens/s
    code, out, _ = zllm(capsys, "ps", "--json")
    rate = json.loads(out)[0]["prefill_tokens_per_s"]
    assert code == 0 and abs(rate - 3000 / 1025) < 1e-9
    code, out, _ = zllm(capsys, "claude", "--json")
    data = json.loads(out)
    seconds = round(3 * 192 / rate)  # a cold prefill of the 192-token window, three times over: 197 s
    assert seconds < 600 and data["client_timeout_s"] == 600  # the floor
    assert data["env"]["CLAUDE_STREAM_IDLE_TIMEOUT_MS"] == "600000" and data["env"]["API_TIMEOUT_MS"] == "1200000"
    loop_thread.call(trace.publish, report(1100, 100, 10_000.0))  # 4000 tokens in 11025 s: 3 × 192 / 0.363 s
    code, out, _ = zllm(capsys, "codex", "--toml")
    assert tomllib.loads(out)["model_providers"]["zllm"]["stream_idle_timeout_ms"] == 1_588_000
