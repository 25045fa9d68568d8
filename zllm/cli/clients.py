"""`zllm claude` / `zllm codex`: point Claude Code or Codex at the daemon — print the settings, or run the
client with them (CLIENTS.md has what each client needs).

    $ zllm claude                              # shell-evalable: eval "$(zllm claude)"
    export ANTHROPIC_BASE_URL=http://127.0.0.1:11435
    export ANTHROPIC_AUTH_TOKEN=zllm
    export ANTHROPIC_MODEL=smollm2
    export CLAUDE_CODE_MAX_CONTEXT_TOKENS=8192
    export CLAUDE_CODE_AUTO_COMPACT_WINDOW=8192
    export CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=80
    export CLAUDE_CODE_MAX_OUTPUT_TOKENS=1024
    export DISABLE_AUTO_COMPACT=1             # where compaction cannot help (claude_compacts)
    export CLAUDE_STREAM_IDLE_TIMEOUT_MS=1800000   # a cold prefill of the window must fit (client_timeout_s)
    export API_TIMEOUT_MS=3600000
    unset ANTHROPIC_API_KEY
    $ zllm claude -- -p "say hi" --bare        # exec claude with that environment

    $ zllm codex                               # export ZLLM_API_KEY=… plus the config as comments
    $ zllm codex --toml >> ~/.codex/config.toml
    $ zllm codex -- exec "say hi"              # exec codex -c model_provider="zllm" -c … exec "say hi"

Each `zllm codex` also writes the model's Codex catalog entry (state dir, codex-catalog.json; see
codex_catalog.py) and points `model_catalog_json` at it, so Codex knows the window, when to compact and which
tools to give the model.

Codex speaks only the Responses API (`wire_api = "responses"`, base URL with `/v1`); Claude Code appends
`/v1/messages` itself (base URL without `/v1`). The context window tells each client when to compact: Codex from the catalog entry (and
`model_auto_compact_token_limit`), Claude Code from its window variables (`claude_env`).
Both clients give up on a stream after 300 s without an event (Claude Code's `CLAUDE_STREAM_IDLE_TIMEOUT_MS`,
Codex's `stream_idle_timeout_ms`), and a cold prefill of a large window on a CPU takes longer: zllm sends
heartbeat events meanwhile (api/stream_pump.py), and these settings raise the timeouts to what a full window's prefill
takes at the daemon's measured rate (`client_timeout_s`).
Where the daemon is comes from the settings (flags of `serve`, ZLLM_* variables, the config file) and the
model's manifest; `served_endpoint(ask_daemon=…)` is the seam for asking a running daemon instead.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.markup import escape

from zllm.cli.codex_catalog import auto_compact_limit, write_catalog
from zllm.cli.output import err, fail, fail_with, print_json
from zllm.config import Settings, configured_api_keys, load_settings
from zllm.errors import ZllmError

# any non-empty key works when the daemon has none; clients refuse to start without one
PLACEHOLDER_KEY = "zllm"
CODEX_PROVIDER = "zllm"
CODEX_KEY_ENV = "ZLLM_API_KEY"
CODEX_CATALOG_FILE = "codex-catalog.json"
# Claude Code compacts at (window - reserved output) - AUTOCOMPACT_BUFFER tokens, or at CLAUDE_COMPACT_PERCENT
# of (window - reserved output) when that comes first (the percentage can only bring it earlier)
CLAUDE_AUTOCOMPACT_BUFFER = 13_000
CLAUDE_COMPACT_PERCENT = 80
# Claude Code's own fixed prompt (system prompt, tool schemas, agent list), sent with every request, which no
# compaction can shrink. Measured in the default model's tokenizer on the first request Claude Code 2.1.197
# sends (`zllm count-tokens` on the captured body): 20,132 tokens (24 tools), 1,043 with --bare; rounded up
# for a project's CLAUDE.md and git status.
CLAUDE_FIXED_PROMPT_TOKENS = 20_500
CLAUDE_BARE_FIXED_PROMPT_TOKENS = 1_500
# what compaction must find to summarize above the fixed prompt: a few turns ("compact_error too_few_groups"
# otherwise)
CLAUDE_MIN_CONVERSATION_TOKENS = 8_192
# The clients' timeouts: a stream's idle timeout and a whole request's must hold a cold prefill of the full
# window. The measured rate comes mostly from shorter prompts, a long prompt's later tokens cost more (each
# attends to all before it: about twice the average per-token cost over a full window of a small model) and
# other requests share the engine, hence the factor.
PREFILL_SAFETY = 3
CLIENT_TIMEOUT_FLOOR_S = 600  # 10 min, the Anthropic SDK's default request timeout
UNMEASURED_TIMEOUT_S = 1_800  # no prefill measured yet: assume a slow CPU (issue 20: >300 s for 18.7K tokens)
# a real Anthropic key in the environment would be sent to the local daemon next to ours
CLAUDE_UNSET = ("ANTHROPIC_API_KEY",)
INSTALL_HINTS = {
    "claude": "install Claude Code (npm install -g @anthropic-ai/claude-code), or print the settings: zllm claude",
    "codex": "install Codex (npm install -g @openai/codex), or print the settings: zllm codex",
}


@dataclass(frozen=True)
class ServedEndpoint:
    host: str  # as a client should dial it (a wildcard bind becomes loopback)
    port: int
    model: str
    context_length: int | None  # None: unknown (the model is not pulled and no --context-length is set)
    api_key: str
    prefill_tokens_per_s: float | None = None  # the running daemon's measured rate; None: not measured

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def register(app: typer.Typer) -> None:
    app.command("claude")(claude)
    app.command("codex")(codex)


def served_endpoint(settings: Settings, ask_daemon: Callable[[Settings], ServedEndpoint | None] | None = None,
                    ) -> ServedEndpoint:
    """Where the clients should point. `ask_daemon`: a running daemon's own answer, preferred when it has one."""
    found = ask_daemon(settings) if ask_daemon else None
    if found:
        return found
    return ServedEndpoint(host=_dial_host(settings.host), port=settings.port, model=settings.model,
                          context_length=settings.context_length or _stored_window(settings),
                          api_key=client_key(settings))


def client_key(settings: Settings) -> str:
    """The key a launched client presents: the first the server accepts, or a placeholder when auth is off."""
    return (configured_api_keys(settings) or (PLACEHOLDER_KEY,))[0]


def claude_env(ep: ServedEndpoint, *, bare: bool = False) -> dict[str, str]:
    """`bare`: Claude Code runs with --bare (a much smaller fixed prompt: compaction fits smaller windows)."""
    timeout_ms = str(client_timeout_s(ep) * 1000)
    env = {
        "ANTHROPIC_BASE_URL": ep.base_url,
        # Bearer auth: Claude Code asks no "use this API key?" question for it
        "ANTHROPIC_AUTH_TOKEN": ep.api_key,
        "ANTHROPIC_MODEL": ep.model,
        # background calls (titles, summaries) ask for a small model by its Anthropic name: the same one here
        "ANTHROPIC_SMALL_FAST_MODEL": ep.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": ep.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": ep.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": ep.model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        # its stream watchdog (300 s at least; a lower value is ignored) and its request timeout, which a
        # non-streamed answer (Claude Code's fallback) must fit in: prefill, then decoding the answer
        "CLAUDE_STREAM_IDLE_TIMEOUT_MS": timeout_ms,
        "API_TIMEOUT_MS": str(2 * int(timeout_ms)),
    }
    if ep.context_length:
        fixed = CLAUDE_BARE_FIXED_PROMPT_TOKENS if bare else CLAUDE_FIXED_PROMPT_TOKENS
        env.update(claude_window_env(ep.context_length, fixed_prompt=fixed))
    return env


def claude_window_env(context_length: int, *, fixed_prompt: int = CLAUDE_FIXED_PROMPT_TOKENS) -> dict[str, str]:
    """The window, the output reservation and when to compact; where compaction cannot help
    (`claude_compacts`), automatic compaction is off (`/compact` still works, and zllm answers an overlong
    prompt with the "prompt is too long" error Claude Code tells the user about)."""
    output = output_budget(context_length)
    # Claude Code reads an auto-compact window below 100K as 100K and then takes the model's window when that is
    # smaller: the value only has to be there (proactive compaction runs only with a window configured)
    env = {"CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(context_length),
           "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(context_length),
           "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": str(CLAUDE_COMPACT_PERCENT),
           "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(output)}
    if not claude_compacts(context_length, fixed_prompt):
        env["DISABLE_AUTO_COMPACT"] = "1"
    return env


def claude_compacts(context_length: int, fixed_prompt: int = CLAUDE_FIXED_PROMPT_TOKENS) -> bool:
    """Whether automatic compaction can work in this window.

    Compaction summarizes the conversation; Claude Code's fixed prompt (`fixed_prompt` tokens) stays. So the
    threshold must lie above the fixed prompt plus a conversation worth summarizing, else Claude Code
    compacts before every turn and fails ("fixed prefix > threshold: compaction cannot help", then
    "compact_error too_few_groups"): at 32K its threshold is 15,672 tokens against a 20K fixed prompt. No
    percentage helps there: below a usable window of 65K tokens the threshold is the usable window less
    Claude Code's 13K buffer whatever the percentage (which only ever brings it earlier)."""
    return claude_compact_threshold(context_length) >= fixed_prompt + CLAUDE_MIN_CONVERSATION_TOKENS


def claude_compact_threshold(context_length: int) -> int:
    """The prompt size (tokens) at which Claude Code compacts, given `claude_window_env`."""
    usable = context_length - min(output_budget(context_length), 20_000)
    return min(usable - CLAUDE_AUTOCOMPACT_BUFFER, usable * CLAUDE_COMPACT_PERCENT // 100)


def client_timeout_s(ep: ServedEndpoint) -> int:
    """Seconds a client should wait for a stream's next event: a cold prefill of the whole window at the
    daemon's measured rate, `PREFILL_SAFETY` times over, at least `CLIENT_TIMEOUT_FLOOR_S`;
    `UNMEASURED_TIMEOUT_S` when the rate or the window is unknown (a daemon that has not prefilled yet)."""
    if not ep.context_length or not ep.prefill_tokens_per_s:
        return UNMEASURED_TIMEOUT_S
    cold_prefill_s = ep.context_length / ep.prefill_tokens_per_s
    return max(CLIENT_TIMEOUT_FLOOR_S, round(PREFILL_SAFETY * cold_prefill_s))


def output_budget(context_length: int) -> int:
    """Tokens Claude Code should reserve for an answer: an eighth of the window (1024 of 8192), at least 1024
    or half a small window, at most the 32000 it asks for by default."""
    return min(32000, max(context_length // 8, min(1024, context_length // 2)))


def codex_config(ep: ServedEndpoint, catalog: Path | None = None) -> tuple[dict[str, object], dict[str, str]]:
    """(top-level settings, the `[model_providers.zllm]` table) for ~/.codex/config.toml. `catalog`: the
    model's catalog file (`write_catalog`)."""
    top: dict[str, object] = {"model": ep.model, "model_provider": CODEX_PROVIDER}
    if catalog is not None:
        top["model_catalog_json"] = str(catalog)
    if ep.context_length:
        # also in the catalog entry; repeated here for a Codex that cannot read the catalog
        top["model_context_window"] = ep.context_length
        top["model_auto_compact_token_limit"] = auto_compact_limit(ep.context_length)
    provider = {"name": CODEX_PROVIDER, "base_url": f"{ep.base_url}/v1", "wire_api": "responses",
                "env_key": CODEX_KEY_ENV,
                # its stream watchdog (300 s by default): a cold prefill of the window must fit
                "stream_idle_timeout_ms": client_timeout_s(ep) * 1000}
    return top, provider


def codex_toml(ep: ServedEndpoint, catalog: Path | None = None) -> str:
    top, provider = codex_config(ep, catalog)
    lines = [f"{key} = {_toml(value)}" for key, value in top.items()]
    lines += ["", f"[model_providers.{CODEX_PROVIDER}]"]
    lines += [f"{key} = {_toml(value)}" for key, value in provider.items()]
    return "\n".join(lines) + "\n"


def codex_overrides(ep: ServedEndpoint, catalog: Path | None = None) -> list[str]:
    """The same config as `codex -c key=value` arguments (values are TOML)."""
    top, provider = codex_config(ep, catalog)
    pairs = [*top.items(), *((f"model_providers.{CODEX_PROVIDER}.{k}", v) for k, v in provider.items())]
    return [arg for key, value in pairs for arg in ("-c", f"{key}={_toml(value)}")]


def claude(
    as_json: bool = typer.Option(False, "--json", help="Print the settings as one JSON object."),
    args: list[str] = typer.Argument(None, help="Run claude with these arguments (after `--`) instead of printing."),
) -> None:
    """Print the environment that points Claude Code at zllm, or run `claude -- ARGS` with it."""
    _, ep = _endpoint()
    bare = "--bare" in (args or ())
    env = claude_env(ep, bare=bare)
    _warn_prompt_does_not_fit(ep, bare)
    if args:
        _refuse_print_flags(as_json, "claude")
        _exec("claude", args, env, unset=CLAUDE_UNSET)
    _warn_unknown_window(ep)
    if as_json:
        print_json({"client": "claude", **_describe(ep), "env": env, "unset": list(CLAUDE_UNSET)})
        return
    lines = [f"# Claude Code → zllm at {ep.base_url} ({_model_note(ep)})",
             *(f"export {key}={shlex.quote(value)}" for key, value in env.items()),
             *(f"unset {key}" for key in CLAUDE_UNSET),
             '# use: eval "$(zllm claude)" && claude   or   zllm claude -- -p "say hi"']
    sys.stdout.write("\n".join(lines) + "\n")


def codex(
    as_json: bool = typer.Option(False, "--json", help="Print the settings as one JSON object."),
    toml: bool = typer.Option(False, "--toml", help="Print only the ~/.codex/config.toml snippet."),
    args: list[str] = typer.Argument(None, help="Run codex with these arguments (after `--`) instead of printing."),
) -> None:
    """Print the config that points Codex at zllm, or run `codex -- ARGS` with it (as -c overrides). Either way
    the model's catalog entry is written first (the config points at it)."""
    settings, ep = _endpoint()
    env = {CODEX_KEY_ENV: ep.api_key}
    if args:
        _refuse_print_flags(as_json or toml, "codex")
    catalog = _write_codex_catalog(settings, ep)
    if args:
        _exec("codex", [*codex_overrides(ep, catalog), *args], env)
    _warn_unknown_window(ep)
    if toml:
        sys.stdout.write(codex_toml(ep, catalog))
        return
    if as_json:
        top, provider = codex_config(ep, catalog)
        print_json({"client": "codex", **_describe(ep), "env": env, "config": {**top, "model_providers": {
            CODEX_PROVIDER: provider}}, "overrides": codex_overrides(ep, catalog), "toml": codex_toml(ep, catalog),
            "catalog": str(catalog)})
        return
    lines = [f"# Codex → zllm at {ep.base_url}/v1 ({_model_note(ep)})",
             f"# model catalog entry written to {catalog}",
             f"export {CODEX_KEY_ENV}={shlex.quote(ep.api_key)}",
             "# add to ~/.codex/config.toml (or: zllm codex --toml >> ~/.codex/config.toml):",
             *(f"#   {line}" if line else "#" for line in codex_toml(ep, catalog).splitlines()),
             "# or pass it per run:  codex " + " ".join(shlex.quote(arg) for arg in codex_overrides(ep, catalog)),
             '# or let zllm do that:  zllm codex -- exec "say hi"']
    sys.stdout.write("\n".join(lines) + "\n")


def _endpoint() -> tuple[Settings, ServedEndpoint]:
    try:
        settings = load_settings()
        return settings, served_endpoint(settings, ask_daemon=_from_daemon)
    except ZllmError as exc:
        fail_with(exc)


def codex_catalog_path(settings: Settings) -> Path:
    return settings.state_dir / CODEX_CATALOG_FILE


def _write_codex_catalog(settings: Settings, ep: ServedEndpoint) -> Path:
    path = codex_catalog_path(settings)
    try:
        return write_catalog(path, ep.model, ep.context_length)
    except OSError as exc:
        fail(f"cannot write the Codex model catalog {path}: {exc.strerror}",
             hint="set ZLLM_STATE_DIR to a directory you can write")


def _from_daemon(settings: Settings) -> ServedEndpoint | None:
    """A running daemon's own address, model and window (it may have been started with other flags)."""
    from zllm.cli.connect import running_daemon

    found = running_daemon(settings)
    if found is None:
        return None
    return ServedEndpoint(host=_dial_host(found.host), port=found.port, model=found.model,
                          context_length=found.context_length, api_key=client_key(settings),
                          prefill_tokens_per_s=found.prefill_tokens_per_s)


def _exec(program: str, args: list[str], env_updates: dict[str, str], unset: tuple[str, ...] = ()) -> None:
    path = shutil.which(program)
    if path is None:
        fail(f"`{program}` is not on PATH", hint=INSTALL_HINTS[program])
    env = {key: value for key, value in os.environ.items() if key not in unset}
    env.update(env_updates)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(path, [program, *args], env)  # replaces this process: the client owns the terminal
    except OSError as exc:
        fail(f"cannot run {path}: {exc.strerror}", hint=INSTALL_HINTS[program])


def _refuse_print_flags(given: bool, program: str) -> None:
    if given:
        fail(f"--json and --toml print the settings; they do not go with arguments for {program}",
             hint=f"drop them to run {program}, or drop the arguments to print")


def _warn_unknown_window(ep: ServedEndpoint) -> None:
    if not ep.context_length:
        err.print(f"[yellow]warning[/]: the context window of {escape(ep.model)} is unknown (not pulled yet), so the "
                  "client is not told when to compact; pull it or set ZLLM_CONTEXT_LENGTH")


def _warn_prompt_does_not_fit(ep: ServedEndpoint, bare: bool) -> None:
    """Claude Code's fixed prompt alone overflows a small window: every request would be refused."""
    if bare or not ep.context_length:
        return
    if CLAUDE_FIXED_PROMPT_TOKENS + output_budget(ep.context_length) > ep.context_length:
        err.print(f"[yellow]warning[/]: Claude Code's own prompt (about {CLAUDE_FIXED_PROMPT_TOKENS:,} tokens: system "
                  f"prompt and tool schemas) does not fit the {ep.context_length:,}-token window of "
                  f"{escape(ep.model)}; run it with --bare, or serve a model with a larger window")


def _describe(ep: ServedEndpoint) -> dict[str, object]:
    return {"base_url": ep.base_url, "model": ep.model, "context_length": ep.context_length,
            "prefill_tokens_per_s": ep.prefill_tokens_per_s, "client_timeout_s": client_timeout_s(ep)}


def _model_note(ep: ServedEndpoint) -> str:
    window = f", {ep.context_length}-token window" if ep.context_length else ", window unknown"
    return f"model {ep.model}{window}"


def _stored_window(settings: Settings) -> int | None:
    """The model's own window from its manifest (what the daemon serves when no context_length is set)."""
    if not settings.models_dir.is_dir():
        return None  # nothing pulled yet: do not create the store just to look
    from zllm.models import ModelStore

    try:
        return ModelStore(settings.models_dir).get(settings.model).manifest.context_length
    except (ZllmError, OSError):
        return None


def _dial_host(host: str) -> str:
    """How a client on this machine reaches a daemon bound to `host`."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _toml(value: object) -> str:
    # a JSON string is a valid TOML basic string (same quotes and escapes); ints are the same in both
    return json.dumps(value) if isinstance(value, str) else str(value)
