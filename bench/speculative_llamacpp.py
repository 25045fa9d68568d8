"""Speculation on llama.cpp over long agent turns: greedy identity and decode tok/s, side by side in one run.

    .venv/bin/python bench/speculative_llamacpp.py [MODEL_DIR] [--threads 1] [--new-tokens 300] [--turns ...]

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

Turns: echo (rewrite a file just read, one value changed), edit (apply a small change to a function and print
the whole file), json (repeat a tool call's JSON arguments with one field changed) and free (a story: nothing to
copy). The script fails unless speculative == padded token for token on every turn (the identity a speculating
server guarantees); `plain_first_diff` says where 1-token decoding without the pad first parts from them (None:
never, within --new-tokens).

One JSON line per turn ("cpu_vs_plain": each side's tokens per CPU second of this process against plain's, which
a shared machine's other processes stretch far less than the wall clock):
    {"bench": "speculative_llamacpp", "turn": "echo", "tok_s": {"plain": .., "padded": .., "speculative": ..},
     "speculative_vs_plain": .., "cpu_vs_plain": {"speculative": .., ...}, "acceptance": .., "tokens_per_forward": .., "identical": true, ...}
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
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
    return parser.parse_args()


def greedy_plain(engine, prompt: list[int], new_tokens: int) -> tuple[list[int], Elapsed]:
    seq = engine.open()
    try:
        logits = engine.step([Row(seq, prompt)])[0]
        tokens = []
        start = Elapsed.start()
        while True:
            tokens.append(int(np.argmax(logits)))
            if len(tokens) == new_tokens:
                return tokens, start.since()
            logits = engine.step([Row(seq, [tokens[-1]])])[0]
    finally:
        engine.release(seq)


@dataclasses.dataclass(frozen=True)
class Elapsed:
    """Wall seconds, and this process's CPU seconds (other processes on a shared machine stretch the wall clock
    far more than they stretch the CPU time a decode takes at 1 thread)."""

    wall: float
    cpu: float

    @classmethod
    def start(cls) -> Elapsed:
        return cls(time.perf_counter(), time.process_time())

    def since(self) -> Elapsed:
        return Elapsed(time.perf_counter() - self.wall, time.process_time() - self.cpu)


def keep_best(best: dict[str, Elapsed], side: str, elapsed: Elapsed) -> None:
    old = best.get(side, Elapsed(float("inf"), float("inf")))
    best[side] = Elapsed(min(old.wall, elapsed.wall), min(old.cpu, elapsed.cpu))


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
                       config: SpeculationConfig | None = None,
                       ) -> tuple[list[int], Elapsed, SpeculativeStep]:
    seq = engine.open()
    try:
        logits = engine.step([Row(seq, prompt)])[0]
        config = config or (SpeculationConfig(max_draft=62, max_backoff=0, first_draft=62) if ngram_mod
                            else SpeculationConfig(**DRAFT_MODEL_SPECULATION) if draft is not None
                            else SpeculationConfig())
        drafter = NgramTable(prompt) if ngram_mod else draft.drafter_for(prompt) if draft is not None else None
        spec = kind(engine, Sampler(SamplingConfig(temperature=0.0), None), prompt, config, drafter=drafter)
        tokens: list[int] = []
        start = Elapsed.start()
        while len(tokens) < new_tokens:
            run = spec.step(logits, seq, remaining=new_tokens - len(tokens))
            tokens += run.tokens
            logits = run.logits
        return tokens, start.since(), spec
    finally:
        engine.release(seq)


def main() -> None:
    args = parse_args()
    model_dir = resolve_model_dir(args)
    loaded = load_gguf_model(model_dir, threads=args.threads, exact_cache=False, uniform_rows=True)
    engine, tokenizer = loaded.engine, loaded.tokenizer
    padded = engine.settings
    unpadded = dataclasses.replace(padded, uniform_rows=False)
    drafts = {f"draft:{path.stem}": LlamaDraftModel(path, engine, threads=args.threads) for path in args.draft_model}
    failed = []
    for turn in args.turns.split(","):
        text = tokenizer.apply_chat_template([{"role": "user", "content": TURNS[turn]}], add_generation_prompt=True)
        prompt = tokenizer.encode(text, add_special_tokens=False)
        best: dict[str, Elapsed] = {}
        identical = True
        draft_specs: dict[str, SpeculativeStep] = {}
        cold: dict[str, float] = {}  # each draft's first run: the draft prefills the prompt too
        for _ in range(args.repeats):  # interleaved: the machine's noise hits every side alike
            engine.settings = unpadded
            plain, seconds = greedy_plain(engine, prompt, args.new_tokens)
            keep_best(best, "plain", seconds)
            engine.settings = padded
            pad, seconds = greedy_plain(engine, prompt, args.new_tokens)
            keep_best(best, "padded", seconds)
            got, seconds, spec = greedy_speculative(engine, prompt, args.new_tokens)
            keep_best(best, "speculative", seconds)
            unguessed, seconds, _ = greedy_speculative(engine, prompt, args.new_tokens, NoGuess)
            keep_best(best, "no_guess", seconds)
            identical = identical and got == pad == unguessed
            if args.previous:
                before, seconds, previous_spec = greedy_speculative(engine, prompt, args.new_tokens, config=PREVIOUS)
                keep_best(best, "previous", seconds)
                identical = identical and before == pad
            if args.ngram_mod:
                table, seconds, table_spec = greedy_speculative(engine, prompt, args.new_tokens, NoGuess, True)
                keep_best(best, "ngram_mod", seconds)
                identical = identical and table == pad
            for name, draft in drafts.items():
                drafted, seconds, draft_specs[name] = greedy_speculative(engine, prompt, args.new_tokens, draft=draft)
                cold.setdefault(name, seconds.wall)
                keep_best(best, name, seconds)
                identical = identical and drafted == pad
        rate = {side: args.new_tokens / seconds.wall for side, seconds in best.items()}
        cpu_rate = {side: args.new_tokens / seconds.cpu for side, seconds in best.items()}
        print(json.dumps({
            "bench": "speculative_llamacpp", "turn": turn, "prompt_tokens": len(prompt), "new_tokens": args.new_tokens,
            "tok_s": {side: round(value, 2) for side, value in rate.items()},
            "speculative_vs_plain": round(rate["speculative"] / rate["plain"], 3),
            "cpu_vs_plain": {side: round(cpu_rate[side] / cpu_rate["plain"], 3) for side in cpu_rate},
            "padded_vs_plain": round(rate["padded"] / rate["plain"], 3),
            "no_guess_vs_plain": round(rate["no_guess"] / rate["plain"], 3), "repeats": args.repeats,
            "acceptance": round(spec.stats.acceptance, 3), "drafted": spec.stats.drafted,
            "tokens_per_forward": round(args.new_tokens / max(spec.stats.steps, 1), 2), "gated": spec.stats.gated,
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
            "identical": identical, "plain_first_diff": _first_diff(plain, pad),
            "pads": engine.step_rows == 2, "verify_rows": engine.verify_rows,
            "verify_row_cost": round(engine.verify_row_cost or 0.0, 3),
            "model": model_dir.name, "threads": args.threads}), flush=True)
        if not identical:
            failed.append(f"{turn} at token {_first_diff(got, pad)}")
    if failed:
        sys.exit(f"error: speculative greedy output differs from padded plain greedy: {', '.join(failed)}")


def _first_diff(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


if __name__ == "__main__":
    main()
