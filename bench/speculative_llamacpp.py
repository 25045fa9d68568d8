"""Speculation on llama.cpp over long agent turns: greedy identity and decode tok/s, side by side in one run.

    .venv/bin/python bench/speculative_llamacpp.py [MODEL_DIR] [--threads 1] [--new-tokens 300] [--turns ...]
        [--context 8192] [--sides plain,padded,speculative,no_guess] [--llama-server PATH]

One engine (the default model: F16 weights, F16 cells) with ContextSettings.uniform_rows, as a speculating
server loads it: it pads 1-token decodes unless its kernels give a verify's rows 1-token decoding's bits
without a pad (measured at load, engine/llamacpp/row_agreement.py: quantized weights such as the Q4_1 file
of the default model; "pads" and "verify_rows" in the output). Per turn, from the same prefilled prompt, greedy
with the model's EOS ignored (exactly --new-tokens tokens), timed after the prefill:

    plain        1-token decodes without the pad row: the server without --speculative
    padded       1-token decodes as the speculating engine runs them (with the pad row, if it pads): what every
                 step of a speculating server costs when it drafts nothing
    speculative  the runtime's SpeculativeStep (prompt lookup over prompt + output, SpeculationConfig defaults;
                 a step with no draft verifies a 1-token guess in the pad row's place)
    no_guess     the same without the guess (a step with no draft is a padded 1-token step)
    previous     (--previous) the drafting before the cost gate: drafts of 12 at most, a 5-gram lookup, no gate
    ngram_mod    (--ngram-mod) llama-server --spec-default's drafting idea in zllm's step: a table from every
                 24-token n-gram of prompt + output to the token after it, followed link by link, a draft only
                 when 48+ tokens chain (capped at 62 here: 63 rows keep the per-cell attention)
    draft:NAME   (--draft-model GGUF, repeatable) a GGUF draft model drafting greedily (engine/llamacpp/
                 draft_model.py) with the daemon's draft-model settings (runtime/client.DRAFT_MODEL_SPECULATION).
                 The draft's cells keep the prompt across repeats (as across a conversation's turns): the first
                 repeat also prefills the prompt on the draft ("draft_cold_tok_s"), later ones reuse it

--context N: the turn's user message opens with files of this repository (zllm/*.py, as an agent's earlier Reads)
until the prompt is about N tokens: where attention over the conversation outweighs the weights' products (issue
26's echo turn at ~8.5K). --sides: the zllm sides to run (the speculative one always runs). --llama-server PATH:
also llama-server plain and --spec-default, one server each, on the same prompt tokens (POST /completion with the
token ids, temperature 0, ignore_eos, exactly --new-tokens tokens; `-c` fits the prompt; decode time from its
`timings`, with its draft_n / draft_n_accepted), "llama_server" in the output; `same_as_zllm` compares its tokens
with zllm's plain ones.
"profile" breaks the speculative side's time down (the engine timed around each call, the rest is Python):
lone steps (1 token fed: a padded step), verifies (their rows, what a row costs, rows rejected), crops.
--clock cpu: CPU seconds instead of wall (this process for zllm; for llama-server its process over the measured
request, after a 1-token request prefilled the prompt): other processes on a shared machine stretch wall time only.

Turns: echo (rewrite a file just read, one value changed), edit (apply a small change to a function and print
the whole file), json (repeat a tool call's JSON arguments with one field changed) and free (a story: nothing to
copy); and session: bench/session.py's echo turn itself (its recorded Claude Code request, bench/
claude_code_request.py, grown to the echo turn with --session-turns and --session-scale, rendered as zllm renders
a Messages request: 8,495 tokens at 10 turns, scale 0.3; the default model's answer copies the file's blocks with
their counters changed). The script fails unless speculative == padded token for token on every turn (the identity
a speculating server guarantees); `plain_first_diff` says where 1-token decoding without the pad first parts from
them (None: never, within --new-tokens).

One JSON line per turn:
    {"bench": "speculative_llamacpp", "turn": "echo", "tok_s": {"plain": .., "padded": .., "speculative": ..},
     "speculative_vs_plain": .., "acceptance": .., "tokens_per_forward": .., "identical": true, ...}
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import model_parser, resolve_model_dir  # noqa: E402  (bench/bench_args.py)
from speculative import ASK, FILE, STORY  # noqa: E402  (bench/speculative.py: the P4 echo turn)

from zllm.engine.contract import Row  # noqa: E402
from zllm.engine.llamacpp.loader import load_gguf_model  # noqa: E402
from zllm.engine.sampler import Sampler, SamplingConfig  # noqa: E402
from zllm.engine.llamacpp.draft_model import LlamaDraftModel  # noqa: E402
from zllm.runtime.client import DRAFT_MODEL_SPECULATION  # noqa: E402
from zllm.runtime.speculative import SpeculationConfig, SpeculativeStep  # noqa: E402

FUNCTION = '''def retry(call, attempts=3, delay=0.5):
    """Call `call` until it succeeds, at most `attempts` times, sleeping `delay` seconds between tries."""
    last = None
    for attempt in range(attempts):
        try:
            return call()
        except OSError as error:
            last = error
            time.sleep(delay * (attempt + 1))
    raise RuntimeError(f"gave up after {attempts} attempts") from last
'''
TOOL_CALL = json.dumps({"name": "Edit", "arguments": {
    "file_path": "/home/user/project/src/settings.py", "old_string": "cache_mb = 512", "new_string": "cache_mb = 1024",
    "replace_all": False, "description": "Raise the default cache size so long sessions keep their prefix"}},
    indent=2)
TURNS = {
    "echo": ASK.format(file=FILE),
    "edit": f"Here is retry.py:\n\n```python\n{FUNCTION}```\n\nChange the default delay to 1.0 and print the whole "
            "file again in one code block.",
    "json": f"Here is the tool call you made:\n\n{TOOL_CALL}\n\nRepeat the same call with replace_all set to true. "
            "Reply with the JSON only.",
    "free": STORY,
}


def parse_args() -> argparse.Namespace:
    parser = model_parser(__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=300)
    parser.add_argument("--turns", default=",".join(TURNS))
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side, interleaved; the best is kept")
    parser.add_argument("--ngram-mod", action="store_true", help="also draft as llama-server --spec-default does")
    parser.add_argument("--draft-model", type=Path, action="append", default=[],
                        help="a GGUF file drafting for the model (repeatable: one side each)")
    parser.add_argument("--previous", action="store_true",
                        help="also the drafting before the cost gate (max_draft 12, 5-gram lookup, no gate)")
    parser.add_argument("--session-turns", type=int, default=10, help="the session turn: bench/session.py's --turns")
    parser.add_argument("--session-scale", type=float, default=0.3, help="the session turn: its --prompt-scale")
    parser.add_argument("--context", type=int, default=0, help="prompt tokens, a repository-files prefix (0: none)")
    parser.add_argument("--sides", default=",".join(ZLLM_SIDES), help="zllm sides (speculative always runs)")
    parser.add_argument("--llama-server", type=Path, default=None, help="also llama-server plain and --spec-default")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: CPU seconds (this process's; llama-server's), steadier on a shared machine")
    return parser.parse_args()


ZLLM_SIDES = ("plain", "padded", "speculative", "no_guess")
CLOCK = [time.perf_counter]  # --clock cpu: time.process_time
ROOT = Path(__file__).resolve().parents[1]


def prompt_tokens(tokenizer, turn: str, context: int, args: argparse.Namespace | None = None) -> list[int]:
    """The turn's chat prompt; with `context`, its message opened by repository files up to ~context tokens."""
    if turn == "session":
        return session_echo_prompt(tokenizer, args.session_turns, args.session_scale)

    def render(content: str) -> list[int]:
        text = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
        return tokenizer.encode(text, add_special_tokens=False)

    bare = render(TURNS[turn])
    if context <= len(bare):
        return bare
    files = sorted((ROOT / "zllm").rglob("*.py"))
    reads = "".join(f"Contents of {path.relative_to(ROOT)}:\n\n```python\n{path.read_text()}```\n\n" for path in files)
    ids = tokenizer.encode(reads, add_special_tokens=False)[:context - len(bare)]
    prefix = tokenizer.decode(ids)
    prefix = prefix[:prefix.rfind("\n") + 1]
    return render(f"I read these files earlier.\n\n{prefix}\n{TURNS[turn]}")


def session_echo_prompt(tokenizer, turns: int, scale: float) -> list[int]:
    """bench/session.py's echo turn, rendered as zllm's Messages route renders it."""
    from claude_code_request import load_or_record  # noqa: E402  (bench/claude_code_request.py)
    from session_script import session_steps  # noqa: E402  (bench/session_script.py)

    from zllm.api.anthropic_messages.decode import decode_messages_request
    from zllm.prompt.renderer import PromptRenderer

    body = next(step.body for step in session_steps(load_or_record(None, None), turns, scale) if step.kind == "echo")
    request = decode_messages_request(body, request_id="bench", namespace="bench").request
    return list(PromptRenderer(tokenizer).render(request).token_ids)


@dataclasses.dataclass
class Profile:
    """The speculative side's engine calls, timed (`TimedEngine`)."""

    lone_steps: int = 0
    lone_s: float = 0.0
    verifies: int = 0
    verify_rows: int = 0
    verify_s: float = 0.0
    rejected_rows: int = 0
    crops: int = 0
    crop_s: float = 0.0
    trace: list = dataclasses.field(default_factory=list)  # per step [rows fed, rows kept]

    def summary(self, wall: float) -> dict:
        engine = self.lone_s + self.verify_s + self.crop_s
        return {"lone_steps": self.lone_steps, "lone_ms": _ms(self.lone_s, self.lone_steps),
                "verifies": self.verifies, "verify_rows": self.verify_rows,
                "verify_ms_per_row": _ms(self.verify_s, self.verify_rows),
                "mean_rows": round(self.verify_rows / max(self.verifies, 1), 1), "rejected_rows": self.rejected_rows,
                "crop_ms": _ms(self.crop_s, self.crops), "lone_s": round(self.lone_s, 2),
                "verify_s": round(self.verify_s, 2), "python_s": round(wall - engine, 2),
                "trace": " ".join(f"{fed}" if kept == fed else f"{fed}/{kept}" for fed, kept in self.trace)}


def _ms(seconds: float, count: int) -> float:
    return round(1e3 * seconds / max(count, 1), 2)


class TimedEngine:
    """The engine as SpeculativeStep's runner, each step and crop timed into a Profile."""

    def __init__(self, engine, profile: Profile):
        self._engine, self.profile = engine, profile

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def step(self, rows):
        start = CLOCK[0]()
        out = self._engine.step(rows)
        seconds, fed = CLOCK[0]() - start, sum(len(row.token_ids) for row in rows)
        self.profile.trace.append([fed, fed])
        if fed == 1:
            self.profile.lone_steps += 1
            self.profile.lone_s += seconds
        else:
            self.profile.verifies += 1
            self.profile.verify_rows += fed
            self.profile.verify_s += seconds
        return out

    def crop(self, seq, length):
        self.profile.rejected_rows += seq.length - length
        self.profile.trace[-1][1] -= seq.length - length
        start = CLOCK[0]()
        self._engine.crop(seq, length)
        self.profile.crop_s += CLOCK[0]() - start
        self.profile.crops += 1


def greedy_plain(engine, prompt: list[int], new_tokens: int) -> tuple[list[int], float]:
    seq = engine.open()
    try:
        logits = engine.step([Row(seq, prompt)])[0]
        tokens = []
        start = CLOCK[0]()
        while True:
            tokens.append(int(np.argmax(logits)))
            if len(tokens) == new_tokens:
                return tokens, CLOCK[0]() - start
            logits = engine.step([Row(seq, [tokens[-1]])])[0]
    finally:
        engine.release(seq)


class NoGuess(SpeculativeStep):
    def _guess(self, remaining: int) -> bool:
        return False


class NgramTable:
    """llama.cpp's ngram-mod drafting as its header describes it (written here, not ported): n-gram → the token
    that followed it (the latest), chained; nothing unless at least `least` tokens chain."""

    def __init__(self, tokens, n: int = 24, least: int = 48, most: int = 62):
        self.n, self.least, self.most = n, least, most
        self.tokens: list[int] = []
        self.table: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens) -> None:
        for token in tokens:
            self.tokens.append(token)
            if len(self.tokens) > self.n:
                self.table[tuple(self.tokens[-self.n - 1:-1])] = token

    def propose(self, limit: int, tail=()) -> list[int]:
        context = [*self.tokens[-self.n:], *tail][-self.n:]
        draft: list[int] = []
        while len(draft) < min(limit, self.most):
            token = self.table.get(tuple(context))
            if token is None:
                break
            draft.append(token)
            context = [*context[1:], token]
        return draft if len(draft) >= min(self.least, limit) else []


PREVIOUS = SpeculationConfig(max_draft=12, max_ngram=5, gate=False)  # the defaults before the cost gate


def greedy_speculative(engine, prompt: list[int], new_tokens: int, kind: type[SpeculativeStep] = SpeculativeStep,
                       ngram_mod: bool = False, draft: LlamaDraftModel | None = None,
                       config: SpeculationConfig | None = None, profile: Profile | None = None,
                       ) -> tuple[list[int], float, SpeculativeStep]:
    seq = engine.open()
    try:
        logits = engine.step([Row(seq, prompt)])[0]
        config = config or (SpeculationConfig(max_draft=62, max_backoff=0, first_draft=62) if ngram_mod
                            else SpeculationConfig(**DRAFT_MODEL_SPECULATION) if draft is not None
                            else SpeculationConfig())
        drafter = NgramTable(prompt) if ngram_mod else draft.drafter_for(prompt) if draft is not None else None
        runner = TimedEngine(engine, profile) if profile is not None else engine
        spec = kind(runner, Sampler(SamplingConfig(temperature=0.0), None), prompt, config, drafter=drafter)
        tokens: list[int] = []
        start = CLOCK[0]()
        while len(tokens) < new_tokens:
            run = spec.step(logits, seq, remaining=new_tokens - len(tokens))
            tokens += run.tokens
            logits = run.logits
        return tokens, CLOCK[0]() - start, spec
    finally:
        engine.release(seq)


def main() -> None:
    args = parse_args()
    if args.clock == "cpu":
        CLOCK[0] = time.process_time
    model_dir = resolve_model_dir(args)
    loaded = load_gguf_model(model_dir, threads=args.threads, exact_cache=False, uniform_rows=True,
                             context_length=max(args.context + args.new_tokens + 64, 0) if args.context else 0)
    engine, tokenizer = loaded.engine, loaded.tokenizer
    padded = engine.settings
    unpadded = dataclasses.replace(padded, uniform_rows=False)
    drafts = {f"draft:{path.stem}": LlamaDraftModel(path, engine, threads=args.threads) for path in args.draft_model}
    sides = [side for side in args.sides.split(",") if side != "speculative"]
    failed = []
    for turn in args.turns.split(","):
        assert turn in TURNS or turn == "session", f"no turn {turn}"
        prompt = prompt_tokens(tokenizer, turn, args.context, args)
        best = {side: float("inf") for side in ("speculative", *sides)}
        outputs: dict[str, list[int]] = {}
        identical = True
        draft_specs: dict[str, SpeculativeStep] = {}
        cold: dict[str, float] = {}  # each draft's first run: the draft prefills the prompt too
        profiles: list[tuple[float, Profile]] = []
        for _ in range(args.repeats):  # interleaved: the machine's noise hits every side alike
            if "plain" in sides:
                engine.settings = unpadded
                outputs["plain"], seconds = greedy_plain(engine, prompt, args.new_tokens)
                best["plain"] = min(best["plain"], seconds)
            engine.settings = padded
            if "padded" in sides:
                outputs["padded"], seconds = greedy_plain(engine, prompt, args.new_tokens)
                best["padded"] = min(best["padded"], seconds)
            profile = Profile()
            got, seconds, spec = greedy_speculative(engine, prompt, args.new_tokens, profile=profile)
            profiles.append((seconds, profile))
            best["speculative"] = min(best["speculative"], seconds)
            if "no_guess" in sides:
                outputs["no_guess"], seconds, _ = greedy_speculative(engine, prompt, args.new_tokens, NoGuess)
                best["no_guess"] = min(best["no_guess"], seconds)
            pad = outputs.get("padded", got)  # the reference: padded 1-token decoding (if it ran)
            identical = identical and got == pad == outputs.get("no_guess", pad)
            if args.previous:
                before, seconds, previous_spec = greedy_speculative(engine, prompt, args.new_tokens, config=PREVIOUS)
                best["previous"] = min(best.get("previous", float("inf")), seconds)
                identical = identical and before == pad
            if args.ngram_mod:
                table, seconds, table_spec = greedy_speculative(engine, prompt, args.new_tokens, NoGuess, True)
                best["ngram_mod"] = min(best.get("ngram_mod", float("inf")), seconds)
                identical = identical and table == pad
            for name, draft in drafts.items():
                drafted, seconds, draft_specs[name] = greedy_speculative(engine, prompt, args.new_tokens, draft=draft)
                cold.setdefault(name, seconds)
                best[name] = min(best.get(name, float("inf")), seconds)
                identical = identical and drafted == pad
        rate = {side: args.new_tokens / seconds for side, seconds in best.items()}
        plain_rate = rate.get("plain")
        servers = (run_llama_servers(args, model_dir, prompt, outputs.get("plain"))
                   if args.llama_server is not None else {})
        print(json.dumps({
            "bench": "speculative_llamacpp", "turn": turn, "prompt_tokens": len(prompt), "new_tokens": args.new_tokens,
            "tok_s": {side: round(value, 2) for side, value in rate.items()},
            **{f"{side}_vs_plain": round(rate[side] / plain_rate, 3)
               for side in ("speculative", "padded", "no_guess") if plain_rate and side in rate},
            "repeats": args.repeats,
            "acceptance": round(spec.stats.acceptance, 3), "drafted": spec.stats.drafted,
            "tokens_per_forward": round(args.new_tokens / max(spec.stats.steps, 1), 2), "gated": spec.stats.gated,
            "profile": min(profiles, key=lambda pair: pair[0])[1].summary(min(profiles, key=lambda p: p[0])[0]),
            **({"previous_vs_plain": round(rate["previous"] / rate["plain"], 3),
                "previous_tokens_per_forward": round(args.new_tokens / max(previous_spec.stats.steps, 1), 2)}
               if args.previous else {}),
            **({"ngram_mod": {"acceptance": round(table_spec.stats.acceptance, 3), "drafted": table_spec.stats.drafted,
                              "tokens_per_forward": round(args.new_tokens / max(table_spec.stats.steps, 1), 2)}}
               if args.ngram_mod else {}),
            **{name: {"vs_plain": round(rate[name] / rate["plain"], 3),
                      "draft_cold_tok_s": round(args.new_tokens / cold[name], 2),
                      "acceptance": round(step.stats.acceptance, 3), "drafted": step.stats.drafted,
                      "tokens_per_forward": round(args.new_tokens / max(step.stats.steps, 1), 2)}
               for name, step in draft_specs.items()},
            **({"llama_server": servers,
                "speculative_vs_llama_spec": round(rate["speculative"] / servers["spec_default"]["tok_s"], 3)}
               if servers else {}),
            "identical": identical,
            "plain_first_diff": _first_diff(outputs["plain"], pad) if "plain" in outputs else None,
            "pads": engine.step_rows == 2, "verify_rows": engine.verify_rows,
            "verify_row_cost": round(engine.verify_row_cost or 0.0, 3),
            "attention_cell_cost": engine.attention_cell_cost,
            "model": model_dir.name, "threads": args.threads}), flush=True)
        if not identical:
            failed.append(f"{turn} at token {_first_diff(got, pad)}")
    if failed:
        sys.exit(f"error: speculative greedy output differs from padded plain greedy: {', '.join(failed)}")


def run_llama_servers(args, model_dir: Path, prompt: list[int], plain: list[int] | None) -> dict:
    """llama-server plain and --spec-default on `prompt`'s tokens: decode tok/s (its timings, the best of
    --repeats requests; the prompt cached after the first), drafts, and whether its tokens are zllm's plain ones."""
    from llamacpp_server import Server, llama_window  # noqa: E402  (bench/llamacpp_server.py)

    from tests.support.daemon import free_port

    window = max(len(prompt) + args.new_tokens + 64, 4096)
    results = {}
    with tempfile.TemporaryDirectory(prefix="spec-llama-server-") as scratch:
        for side, extra in (("plain", []), ("spec_default", ["--spec-default"])):
            port = free_port()
            command = [str(args.llama_server), "-m", str(model_dir / "model.gguf"), "-t", str(args.threads),
                       "-tb", str(args.threads), "-c", str(window), *llama_window(model_dir, window), "-np", "1",
                       "--no-webui", "--port", str(port), *extra]
            server = Server(f"llama-server-{side}", command, port, dict(os.environ), Path(scratch)).start()
            try:
                _complete(port, prompt, 1)  # the prompt prefilled and cached: the measured requests decode only
                replies, cpu = [], []
                for _ in range(args.repeats):
                    before = server.cpu_seconds()
                    replies.append(_complete(port, prompt, args.new_tokens))
                    cpu.append(server.cpu_seconds() - before)
            finally:
                server.stop()
            timings = min((reply["timings"] for reply in replies), key=lambda t: t["predicted_ms"])
            seconds = min(cpu) if args.clock == "cpu" else timings["predicted_ms"] / 1e3
            tokens = replies[-1].get("tokens", [])
            results[side] = {
                "tok_s": round(timings["predicted_n"] / seconds, 2), "decode_s": round(seconds, 2),
                "wall_decode_s": round(timings["predicted_ms"] / 1e3, 2), "tokens": timings["predicted_n"],
                "draft_n": timings.get("draft_n", 0), "draft_n_accepted": timings.get("draft_n_accepted", 0),
                "same_as_zllm": tokens == plain if plain is not None else None,
                "first_diff": _first_diff(tokens, plain) if plain is not None else None}
    return results


def _complete(port: int, prompt: list[int], new_tokens: int) -> dict:
    body = {"prompt": prompt, "n_predict": new_tokens, "temperature": 0.0, "ignore_eos": True, "stream": False,
            "cache_prompt": True, "return_tokens": True}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=1800) as response:
        return json.loads(response.read())


def _first_diff(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


if __name__ == "__main__":
    main()
