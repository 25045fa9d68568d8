"""Settings precedence (flag > ZLLM_* env > config file > default), source tracking and `zllm config`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zllm.config import Source, load_settings, resolve_settings
from zllm.errors import ConfigError


def write_config(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return {"ZLLM_CONFIG": str(path)}


def test_flag_beats_env_beats_config_beats_default(tmp_path) -> None:
    env = write_config(tmp_path, 'port = 12000\nmodel = "from-config"\nmax_queue = 5\nssd-cache = false\n')
    env |= {"ZLLM_PORT": "13000", "ZLLM_MODEL": "from-env"}
    resolved = resolve_settings(env, model="from-flag")
    s = resolved.settings
    assert (s.model, s.port, s.max_queue, s.ssd_cache, s.host) == ("from-flag", 13000, 5, False, "127.0.0.1")
    assert resolved.sources["model"] == Source("flag", "--model")
    assert resolved.sources["port"] == Source("env", "ZLLM_PORT")
    assert resolved.sources["max_queue"] == Source("config", env["ZLLM_CONFIG"])
    assert resolved.sources["host"] == Source("default")
    assert str(resolved.sources["port"]) == "env (ZLLM_PORT)" and resolved.config_found


def test_load_settings_keeps_its_signature_and_reads_the_config_file(tmp_path) -> None:
    env = write_config(tmp_path, 'data_dir = "~/zllm-data"\ncache_rounds = 2\n')
    settings = load_settings(env, cache_rounds=None)  # None = flag not given
    assert settings.data_dir == Path("~/zllm-data").expanduser() and settings.cache_rounds == 2
    assert load_settings({"ZLLM_RESPONSES_WEBSOCKET": "off"}).responses_websocket is False


@pytest.mark.parametrize(("text", "message", "hint"), [
    ("prot = 1\n", "unknown setting `prot`", "did you mean `port`?"),
    ("port = \"high\"\n", "`port` must be a int", None),
    ("ssd_cache = 1\n", "`ssd_cache` must be a bool", None),
    ("port = [\n", "is not valid TOML", "ZLLM_CONFIG"),
])
def test_a_bad_config_file_is_a_clear_error(tmp_path, text, message, hint) -> None:
    with pytest.raises(ConfigError) as bad:
        resolve_settings(write_config(tmp_path, text))
    assert message in bad.value.message and str(tmp_path) in bad.value.message
    assert hint is None or hint in bad.value.hint


def test_a_named_config_file_must_exist_the_default_may_be_absent(tmp_path, monkeypatch) -> None:
    with pytest.raises(ConfigError) as missing:
        resolve_settings({"ZLLM_CONFIG": str(tmp_path / "nope.toml")})
    assert "does not exist" in missing.value.message
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    absent = resolve_settings({})
    assert (absent.config_file, absent.config_found) == (tmp_path / "zllm" / "config.toml", False)
    absent.config_file.parent.mkdir()
    absent.config_file.write_text("port = 12001\n")
    assert resolve_settings({}).settings.port == 12001


def test_runtime_files_live_in_the_runtime_dir_and_the_log_in_the_state_dir(tmp_path) -> None:
    s = load_settings({"ZLLM_RUNTIME_DIR": str(tmp_path / "run"), "ZLLM_STATE_DIR": str(tmp_path / "state")})
    assert (s.control_socket, s.pid_file) == (tmp_path / "run" / "zllm.sock", tmp_path / "run" / "zllm.pid")
    assert s.log_file == tmp_path / "state" / "zllm.log"


def zllm(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zllm", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **env})


def test_zllm_config_shows_values_and_sources_with_secrets_masked(tmp_path) -> None:
    env = write_config(tmp_path, "port = 12000\n") | {"ZLLM_API_KEY": "s3cret", "ZLLM_MODEL": "tiny"}
    result = zllm("config", "--json", env=env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["config_file"] == env["ZLLM_CONFIG"] and data["config_found"] is True
    assert data["settings"]["port"] == {"value": 12000, "source": "config", "origin": env["ZLLM_CONFIG"]}
    assert data["settings"]["model"] == {"value": "tiny", "source": "env", "origin": "ZLLM_MODEL"}
    assert data["settings"]["api_key"]["value"] == "********"
    table = zllm("config", env=env)
    assert "s3cret" not in table.stdout + table.stderr
    assert any(line.split() == ["port", "12000", "config", f"({env['ZLLM_CONFIG']})"]
               for line in table.stdout.splitlines())
    assert table.stderr.startswith("config file: ")


def test_zllm_config_with_a_broken_file_is_a_user_error(tmp_path) -> None:
    result = zllm("config", env=write_config(tmp_path, "prot = 1\n"))
    assert result.returncode == 1 and result.stdout == ""
    assert "error:" in result.stderr and "hint: did you mean `port`?" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("env", "config", "want"), [
    ({}, "", "auto"),  # the default
    ({"ZLLM_SPECULATIVE": "off"}, "", "off"),
    ({"ZLLM_SPECULATIVE": "ON"}, "", "on"),
    ({"ZLLM_SPECULATIVE": "1"}, "", "on"),  # the setting was a bool: its spellings still read
    ({"ZLLM_SPECULATIVE": "false"}, "", "off"),
    ({}, 'speculative = "auto"\n', "auto"),
    ({}, "speculative = true\n", "on"),
    ({}, "speculative = false\n", "off"),
    ({"ZLLM_SPECULATIVE": "auto"}, "speculative = false\n", "auto"),  # env beats the file
])
def test_speculative_is_auto_on_or_off(tmp_path, env, config, want) -> None:
    env = {**env, **write_config(tmp_path, config)}
    assert load_settings(env).speculative == want


@pytest.mark.parametrize(("env", "config", "message"), [
    ({"ZLLM_SPECULATIVE": "maybe"}, "", "ZLLM_SPECULATIVE='maybe' is not a valid mode (auto, on or off)"),
    ({}, "speculative = 2\n", "`speculative` must be a mode (auto, on or off)"),
    ({}, 'speculative = "sometimes"\n', "`speculative` must be a mode (auto, on or off)"),
])
def test_a_bad_speculative_value_is_a_clear_error(tmp_path, env, config, message) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_settings({**env, **write_config(tmp_path, config)})


@pytest.mark.parametrize(("args", "want"), [
    ([], "auto"), (["--speculative", "on"], "on"), (["--speculative", "OFF"], "off"),
    (["--speculative", "true"], "on"), (["--no-speculative"], "off"), (["--port", "12001", "--no-speculative"], "off"),
])
def test_serve_reads_speculative_as_a_mode_and_no_speculative_as_off(tmp_path, monkeypatch, args, want) -> None:
    """`zllm serve --speculative auto|on|off`; `--no-speculative` (the old negative flag) still means off."""
    import typer
    from typer.testing import CliRunner

    from zllm import daemon
    from zllm.cli import serve

    seen = []
    monkeypatch.setattr(daemon, "run", lambda settings, progress_factory: seen.append(settings.speculative))
    monkeypatch.setenv("ZLLM_CONFIG", str(tmp_path / "absent.toml"))
    (tmp_path / "absent.toml").write_text("")
    app = typer.Typer()
    serve.register(app)
    app.command("other")(lambda: None)
    result = CliRunner().invoke(app, ["serve", *args])
    assert result.exit_code == 0, result.output
    assert seen == [want]


def test_serve_refuses_an_unknown_speculative_mode(tmp_path, monkeypatch) -> None:
    import typer
    from typer.testing import CliRunner

    from zllm.cli import serve

    app = typer.Typer()
    serve.register(app)
    app.command("other")(lambda: None)
    result = CliRunner().invoke(app, ["serve", "--speculative", "maybe"])
    assert result.exit_code != 0 and "auto, on or off" in result.output
