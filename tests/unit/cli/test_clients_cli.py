"""`zllm claude` / `zllm codex`: the printed settings (shell, JSON, TOML) and running the client with them — a
fake `claude` / `codex` on PATH records the arguments and environment it was started with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.unit.inspect.tiny_store import TINY, TINY_WINDOW, linked_store
from zllm.cli import clients

# the verbs in a stand-alone app, as `zllm` registers them (a callback keeps the verb names)
DRIVER = ("import typer; from zllm.cli import clients; app = typer.Typer(); app.callback()(lambda: None); "
          "clients.register(app); app(prog_name='zllm')")
FAKE_CLIENT = """#!{python}
import json, os, sys
with open(os.environ["RECORD_TO"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
sys.exit(7)
"""


def cli() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)
    clients.register(app)
    return app


@pytest.fixture()
def settings_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    (tmp_path / "config.toml").write_text("")  # no user config file leaks in
    env = {"ZLLM_DATA_DIR": str(tmp_path / "data"), "ZLLM_STATE_DIR": str(tmp_path / "state"),
           "ZLLM_MODEL": "qwen3-8b", "ZLLM_PORT": "12345",
           "ZLLM_CONTEXT_LENGTH": "8192", "ZLLM_HOST": "127.0.0.1", "ZLLM_CONFIG": str(tmp_path / "config.toml")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("ZLLM_API_KEY", raising=False)
    return env


def invoke(*args: str):
    return CliRunner().invoke(cli(), list(args))


def test_claude_prints_an_environment_a_shell_can_eval(settings_env: dict[str, str]) -> None:
    result = invoke("claude")
    assert result.exit_code == 0
    # the one warning: Claude Code's full prompt alone overflows an 8K window
    assert " ".join(result.stderr.split()) == (
        "warning: Claude Code's own prompt (about 20,500 tokens: system prompt and tool schemas) does not fit the "
        "8,192-token window of qwen3-8b; run it with --bare, or serve a model with a larger window")
    shell = subprocess.run(["sh", "-c", result.stdout + '\nprintf "%s|" "$ANTHROPIC_BASE_URL" "$ANTHROPIC_AUTH_TOKEN" '
                            '"$ANTHROPIC_MODEL" "$CLAUDE_CODE_MAX_CONTEXT_TOKENS" "$CLAUDE_CODE_MAX_OUTPUT_TOKENS" '
                            '"${ANTHROPIC_API_KEY-unset}"'],
                           env={**os.environ, "ANTHROPIC_API_KEY": "sk-real"}, capture_output=True, text=True,
                           check=True)
    assert shell.stdout == "http://127.0.0.1:12345|zllm|qwen3-8b|8192|1024|unset|"


def test_claude_json(settings_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZLLM_API_KEY", "secret-key")
    monkeypatch.setenv("ZLLM_HOST", "0.0.0.0")  # a wildcard bind is dialled on loopback
    data = json.loads(invoke("claude", "--json").stdout)
    assert (data["base_url"], data["model"], data["context_length"]) == ("http://127.0.0.1:12345", "qwen3-8b", 8192)
    assert data["env"]["ANTHROPIC_AUTH_TOKEN"] == "secret-key" and data["unset"] == ["ANTHROPIC_API_KEY"]
    assert data["env"]["ANTHROPIC_SMALL_FAST_MODEL"] == "qwen3-8b"


def test_the_window_comes_from_the_stored_model_when_no_length_is_set(settings_env: dict[str, str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    linked_store(Path(settings_env["ZLLM_DATA_DIR"]))
    monkeypatch.setenv("ZLLM_MODEL", TINY)
    monkeypatch.delenv("ZLLM_CONTEXT_LENGTH")
    env = json.loads(invoke("claude", "--json").stdout)["env"]
    assert (env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"], env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) == (str(TINY_WINDOW), "1024")


def test_an_unknown_window_is_left_out_with_a_warning(settings_env: dict[str, str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZLLM_CONTEXT_LENGTH")
    result = invoke("claude", "--json")
    assert result.exit_code == 0 and "CLAUDE_CODE_MAX_CONTEXT_TOKENS" not in json.loads(result.stdout)["env"]
    assert "warning: the context window of qwen3-8b is unknown" in " ".join(result.stderr.split())
    assert not Path(settings_env["ZLLM_DATA_DIR"]).exists()  # printing settings creates no store


@pytest.mark.parametrize(("window", "budget"), [(8192, 1024), (32768, 4096), (1_000_000, 32000), (1024, 512)])
def test_the_output_budget_fits_the_window(window: int, budget: int) -> None:
    assert clients.output_budget(window) == budget


def test_codex_toml_is_a_responses_provider_with_the_model_catalog(settings_env: dict[str, str]) -> None:
    config = tomllib.loads(invoke("codex", "--toml").stdout)
    catalog = Path(settings_env["ZLLM_STATE_DIR"]) / "codex-catalog.json"
    assert config == {"model": "qwen3-8b", "model_provider": "zllm", "model_catalog_json": str(catalog),
                      "model_context_window": 8192, "model_auto_compact_token_limit": 6553,
                      "model_providers": {"zllm": {"name": "zllm", "base_url": "http://127.0.0.1:12345/v1",
                                                   "wire_api": "responses", "env_key": "ZLLM_API_KEY",
                                                   # no daemon, so no measured prefill rate: 30 minutes
                                                   "stream_idle_timeout_ms": 1_800_000}}}
    assert json.loads(catalog.read_text())["models"][0]["slug"] == "qwen3-8b"


def test_the_codex_catalog_entry_has_the_window_plain_tools_and_no_responses_lite(settings_env: dict[str, str],
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZLLM_CONTEXT_LENGTH", "32768")
    catalog = Path(json.loads(invoke("codex", "--json").stdout)["catalog"])
    (entry,) = json.loads(catalog.read_text())["models"]
    assert (entry["slug"], entry["context_window"], entry["max_context_window"]) == ("qwen3-8b", 32768, 32768)
    assert entry["auto_compact_token_limit"] == 26214  # compacts with room left for the summary
    assert (entry["shell_type"], entry["apply_patch_tool_type"], entry["tool_mode"]) == ("shell_command", "freeform",
                                                                                          None)
    assert entry["use_responses_lite"] is False and entry["input_modalities"] == ["text"]
    assert entry["truncation_policy"] == {"mode": "tokens", "limit": 4096}
    assert entry["base_instructions"] and entry["supports_search_tool"] is False


def test_an_unknown_window_leaves_it_out_of_the_catalog(settings_env: dict[str, str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZLLM_CONTEXT_LENGTH")
    data = json.loads(invoke("codex", "--json").stdout)
    (entry,) = json.loads(Path(data["catalog"]).read_text())["models"]
    assert "context_window" not in entry and "auto_compact_token_limit" not in entry
    assert "model_context_window" not in data["config"] and data["config"]["model_catalog_json"] == data["catalog"]


FULL, BARE = clients.CLAUDE_FIXED_PROMPT_TOKENS, clients.CLAUDE_BARE_FIXED_PROMPT_TOKENS


@pytest.mark.parametrize(("window", "fixed", "compacts_at"), [(32768, BARE, 15672), (65536, FULL, 44344),
                                                               (131072, FULL, 91750), (200_000, FULL, 144000)])
def test_claude_compacts_before_the_window_fills(window: int, fixed: int, compacts_at: int) -> None:
    env = clients.claude_window_env(window, fixed_prompt=fixed)
    assert (env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"], env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"]) == (str(window),) * 2
    assert env["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] == "80" and "DISABLE_AUTO_COMPACT" not in env
    assert clients.claude_compact_threshold(window) == compacts_at
    assert compacts_at + int(env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) < window
    # above Claude Code's own prompt, with a conversation worth summarizing on top of it
    assert compacts_at >= fixed + clients.CLAUDE_MIN_CONVERSATION_TOKENS


@pytest.mark.parametrize(("window", "fixed"), [(8192, FULL), (16384, FULL), (32768, FULL), (40960, FULL),
                                               (8192, BARE), (16384, BARE)])
def test_auto_compaction_is_off_where_it_cannot_help(window: int, fixed: int) -> None:
    # issue 20: at 32K Claude Code's threshold (15,672) lay below its own 20K prompt, so it tried to compact
    # before every turn ("compaction cannot help", then "compact_error too_few_groups")
    assert clients.claude_compact_threshold(window) < fixed + clients.CLAUDE_MIN_CONVERSATION_TOKENS
    assert clients.claude_window_env(window, fixed_prompt=fixed)["DISABLE_AUTO_COMPACT"] == "1"


def test_whenever_auto_compaction_is_on_its_threshold_clears_the_fixed_prompt() -> None:
    for window in range(4096, 262_144, 1024):
        for fixed in (FULL, BARE):
            on = "DISABLE_AUTO_COMPACT" not in clients.claude_window_env(window, fixed_prompt=fixed)
            assert on == (clients.claude_compact_threshold(window) >= fixed + clients.CLAUDE_MIN_CONVERSATION_TOKENS)


def endpoint(window: int | None = 32768, rate: float | None = None) -> clients.ServedEndpoint:
    return clients.ServedEndpoint(host="127.0.0.1", port=1, model="m", context_length=window, api_key="k",
                                  prefill_tokens_per_s=rate)


@pytest.mark.parametrize(("window", "rate", "seconds"), [
    (32768, None, 1800),      # never measured: assume a slow CPU
    (None, 500.0, 1800),      # the window unknown: likewise
    (8192, 2000.0, 600),      # a fast prefill: the floor (3 × 4 s is less)
    (32768, 50.0, 1966),      # issue 20's machine: 3 × 655 s
    (131072, 100.0, 3932),
])
def test_client_timeouts_hold_a_cold_prefill_of_the_window(window, rate, seconds) -> None:
    ep = endpoint(window, rate)
    assert clients.client_timeout_s(ep) == seconds
    env = clients.claude_env(ep)
    assert (env["CLAUDE_STREAM_IDLE_TIMEOUT_MS"], env["API_TIMEOUT_MS"]) == (str(seconds * 1000),
                                                                             str(2 * seconds * 1000))
    assert clients.codex_config(ep)[1]["stream_idle_timeout_ms"] == seconds * 1000


def test_claude_code_keeps_its_300_s_floor_so_the_timeout_never_goes_below_it() -> None:
    # Claude Code takes max(CLAUDE_STREAM_IDLE_TIMEOUT_MS, 300000): a value below would be silently ignored
    assert clients.CLIENT_TIMEOUT_FLOOR_S >= 300


def test_codex_text_and_json_say_the_same(settings_env: dict[str, str]) -> None:
    text = invoke("codex").stdout
    data = json.loads(invoke("codex", "--json").stdout)
    assert data["config"] == tomllib.loads(data["toml"]) and data["env"] == {"ZLLM_API_KEY": "zllm"}
    overrides = data["overrides"]
    assert overrides[0::2] == ["-c"] * (len(overrides) // 2)
    parsed = {}
    for pair in overrides[1::2]:  # each -c value is TOML, as codex reads it
        key, _, value = pair.partition("=")
        parsed[key] = tomllib.loads(f"v = {value}")["v"]
    assert parsed["model_providers.zllm.wire_api"] == "responses" and parsed["model_context_window"] == 8192
    assert "export ZLLM_API_KEY=zllm" in text.splitlines()
    assert "#   wire_api = \"responses\"" in text.splitlines()


@pytest.fixture()
def fake_clients(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("claude", "codex"):
        script = bin_dir / name
        script.write_text(FAKE_CLIENT.format(python=sys.executable))
        script.chmod(0o755)
    return bin_dir


def run_verb(settings_env: dict[str, str], path: str, *args: str, record: Path | None = None,
             **extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **settings_env, "PATH": path, "RECORD_TO": str(record or "/dev/null"), **extra}
    return subprocess.run([sys.executable, "-c", DRIVER, *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_claude_runs_with_the_environment(settings_env: dict[str, str], fake_clients: Path, tmp_path: Path) -> None:
    record = tmp_path / "claude.json"
    result = run_verb(settings_env, f"{fake_clients}:/usr/bin:/bin", "claude", "--", "-p", "say hi", "--bare",
                      record=record, ANTHROPIC_API_KEY="sk-real", KEEP_ME="1")
    assert result.returncode == 7, result.stderr  # the client's own exit code: zllm exec'd it
    seen = json.loads(record.read_text())
    assert seen["argv"] == ["-p", "say hi", "--bare"]
    env = seen["env"]
    assert (env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_AUTH_TOKEN"], env["ANTHROPIC_MODEL"]) == (
        "http://127.0.0.1:12345", "zllm", "qwen3-8b")
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "8192" and env["KEEP_ME"] == "1"
    assert env["CLAUDE_STREAM_IDLE_TIMEOUT_MS"] == "1800000" and env["API_TIMEOUT_MS"] == "3600000"
    assert "ANTHROPIC_API_KEY" not in env
    assert "does not fit" not in result.stderr  # --bare: Claude Code's small prompt fits


def test_claude_with_bare_may_compact_where_the_full_prompt_may_not(settings_env: dict[str, str],
                                                                   fake_clients: Path, tmp_path: Path) -> None:
    settings_env = {**settings_env, "ZLLM_CONTEXT_LENGTH": "32768"}
    for args, disabled in ((["-p", "hi", "--bare"], False), (["-p", "hi"], True)):
        record = tmp_path / "claude.json"
        result = run_verb(settings_env, f"{fake_clients}:/usr/bin:/bin", "claude", "--", *args, record=record)
        assert result.returncode == 7, result.stderr
        assert ("DISABLE_AUTO_COMPACT" in json.loads(record.read_text())["env"]) is disabled


def test_codex_runs_with_config_overrides(settings_env: dict[str, str], fake_clients: Path, tmp_path: Path) -> None:
    record = tmp_path / "codex.json"
    result = run_verb(settings_env, f"{fake_clients}:/usr/bin:/bin", "codex", "--", "exec", "say hi", record=record)
    assert result.returncode == 7, result.stderr
    seen = json.loads(record.read_text())
    assert seen["argv"][-2:] == ["exec", "say hi"]
    settings = clients.load_settings(settings_env)
    catalog = clients.codex_catalog_path(settings)
    assert seen["argv"][:-2] == clients.codex_overrides(clients.served_endpoint(settings), catalog)
    assert 'model_providers.zllm.wire_api="responses"' in seen["argv"]
    assert f'model_catalog_json="{catalog}"' in seen["argv"] and catalog.is_file()  # written before codex ran
    assert seen["env"]["ZLLM_API_KEY"] == "zllm"


def test_a_missing_client_is_an_error_with_an_install_hint(settings_env: dict[str, str], tmp_path: Path) -> None:
    result = run_verb(settings_env, str(tmp_path), "codex", "--", "exec", "hi")
    stderr = " ".join(result.stderr.split())
    assert (result.returncode, result.stdout) == (1, "")
    assert "error: `codex` is not on PATH" in stderr and "hint: install Codex" in stderr


def test_print_flags_do_not_go_with_client_arguments(settings_env: dict[str, str]) -> None:
    result = invoke("claude", "--json", "--", "-p", "hi")
    assert result.exit_code == 1 and "error: --json and --toml print the settings" in " ".join(result.stderr.split())


def test_a_bad_setting_is_an_error_not_a_traceback(settings_env: dict[str, str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZLLM_PORT", "not-a-port")
    result = invoke("codex")
    assert (result.exit_code, result.stdout) == (1, "") and "error: ZLLM_PORT" in result.stderr
