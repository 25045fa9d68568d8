"""`zllm config`: the effective settings and where each came from (flag > ZLLM_* env > config file > default).

    $ zllm config
    SETTING     VALUE        SOURCE
    port        11500        env (ZLLM_PORT)
    model       smollm2      config (/home/me/.config/zllm/config.toml)
    ...
    $ zllm config --json     {"config_file": ..., "config_found": true, "settings": {"port": {"value": 11500,
                              "source": "env", "origin": "ZLLM_PORT"}, ...}}
"""

from __future__ import annotations

from pathlib import Path

import typer

from zllm.cli.output import err, fail_with, print_json
from zllm.cli.table import write_table
from zllm.config import SETTING_NAMES, ResolvedSettings, resolve_settings
from zllm.errors import ZllmError

SECRET = ("api_key", "api_keys")


def register(app: typer.Typer) -> None:
    app.command("config")(config)


def config(as_json: bool = typer.Option(False, "--json", help="Print the settings as JSON.")) -> None:
    """Show the effective settings and where each value came from."""
    try:
        resolved = resolve_settings()
    except ZllmError as exc:
        fail_with(exc)
    if as_json:
        print_json(settings_json(resolved))
        return
    found = "" if resolved.config_found else " (not present)"
    err.print(f"config file: {resolved.config_file}{found}", markup=False, highlight=False)
    rows = [(name, _shown(name, value), str(resolved.sources[name])) for name, value in _values(resolved)]
    write_table(("SETTING", "VALUE", "SOURCE"), rows)


def settings_json(resolved: ResolvedSettings) -> dict:
    return {
        "config_file": str(resolved.config_file),
        "config_found": resolved.config_found,
        "settings": {name: {"value": _json_value(name, value), "source": resolved.sources[name].kind,
                            "origin": resolved.sources[name].origin} for name, value in _values(resolved)},
    }


def _values(resolved: ResolvedSettings) -> list[tuple[str, object]]:
    return [(name, getattr(resolved.settings, name)) for name in SETTING_NAMES]


def _shown(name: str, value: object) -> str:
    if name in SECRET and value:
        return "********"  # set, but a terminal (or a pasted bug report) is no place for it
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if value != "" else '""'


def _json_value(name: str, value: object) -> object:
    if name in SECRET and value:
        return "********"
    return str(value) if isinstance(value, Path) else value
