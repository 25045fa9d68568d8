"""Continuous batching, side by side in one run (zllm issue 7, design/PERF.md P7): aggregate decode speed of
concurrent streams, and what a long prefill does to the requests around it, chunked vs unchunked.

    .venv/bin/python bench/batching.py [MODEL_DIR] [--threads 1] [--new-tokens 64] [--streams 1,4,8]
        [--long-tokens 6000] [--short-delay S] [--repeats 2] [--figures streams,ttft,gap,packing,speculative]

MODEL_DIR defaults to the store's SmolLM2 ($ZLLM_DATA_DIR/models/smollm2), else the e2e tests' copy
(~/.cache/zllm-tests/e2e-data/models/smollm2). Everything goes through the real engine loop (EngineLoop +
EngineRequest: engine thread, scheduler, packed forwards, detokenizer, events), greedy, model EOS off, so every
request produces exactly the tokens it asks for. A token's time is that of its text event, taken on the engine
thread as the token is emitted (a character split over several tokens, rare in English, shows as one event).
Each figure keeps the best of --repeats, the compared sides interleaved so machine noise hits them alike: on a
shared machine the ratios are the figures, absolute numbers are noise. One JSON line per figure:

- aggregate_decode_tok_s, one line per --streams count K: K streams with distinct prompts of similar length,
  all admitted and prefilled in the same step (submitted before the engine starts), each decoding exactly
  --new-tokens tokens. Decode only: the window runs from the moment every stream has its first token to the
  last Finished; tok_s = tokens emitted in the window / its length, ratio = tok_s / tok_s of 1 stream (P7 goal:
  >= 5 at 8 streams on a GPU; on a CPU expect little). step_ms: one decode step of all K rows; on CUDA,
  hbm_floor_ratio = (weight bytes / 4.3 TB/s) / step_ms, how close a step is to the weight-read floor.
- short_ttft_during_long_prefill: a ~--long-tokens prompt is submitted; once its prefill is under way
  (--short-delay s later; default a quarter of that prefill's time alone) a short request (~50 prompt tokens, 8
  new) arrives. The short one's TTFT and the long one's prefill time (submit to first token), chunked
  (SchedulerConfig defaults) vs unchunked (both chunk sizes = the context window: the whole prompt in one
  forward); ratio = unchunked TTFT / chunked TTFT. Alone: each request on an idle engine, for scale. With
  nothing decoding the scheduler prefills idle_prefill_chunk tokens a step, so --long-tokens must exceed it for
  the two modes to differ at all.
- decode_gap_during_long_prefill: a stream is decoding when the long prompt arrives: its largest gap between two
  tokens while the long one prefills (max_gap_ms) vs its usual gap (steady_gap_ms), chunked vs unchunked, and
  the long prefill time in each; ratio = unchunked max gap / chunked max gap.
- packed_decode_tok_s: one lone stream through the packed forward (engine/torch/packed.py) vs the unpacked path
  (ModelRunner(model, packing=False)), measured as aggregate_decode_tok_s at K=1; ratio = packed / unpacked,
  goal ~1.0 (what packing costs a request that has nobody to batch with).
- speculative_echo_decode_tok_s: the echo-heavy agent turn of bench/speculative.py (rewrite a file shown in the
  prompt, one edit) through the engine loop, plain vs prompt-lookup speculation (`--speculative`), greedy;
  ratio = speculative / plain decode tok/s (goal >= 1.8), identical = the two texts are equal.

The prefill figures run the long prompt 4 times (warm-up, alone) plus 4 per repeat. On the shared 2-core CPU,
--long-tokens 3000 --new-tokens 32 --repeats 2 took ~6.5 min (a 3000-token prefill of the 135M model in fp32 on
one thread: 20-30 s); the 6000-token default is meant for a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import FILLER, model_parser, resolve_model_dir  # noqa: E402  (bench/bench_args.py)
from speculative import TURNS  # noqa: E402  (bench/speculative.py: the same echo turn)

from zllm.canonical import ChatRequest, Finished, FinishReason, Message, TextDelta  # noqa: E402
from zllm.engine.loaded import LoadedModel  # noqa: E402
from zllm.engine.sampler import SamplingConfig  # noqa: E402
from zllm.engine.torch.loader import load_model  # noqa: E402
from zllm.engine.torch.runner import ModelRunner  # noqa: E402
from zllm.prompt import PromptRenderer  # noqa: E402
from zllm.runtime.engine_loop import EngineLoop, EngineRequest  # noqa: E402
from zllm.runtime.scheduler import SchedulerConfig  # noqa: E402
from zllm.runtime.speculative import SpeculationConfig  # noqa: E402

FIGURES = ("streams", "ttft", "gap", "packing", "speculative")
ECHO_TURN = TURNS["echo"]
HBM_BYTES_PER_S = 4.3e12  # measured on an H200 (PERF.md)
TOPICS = ("a lighthouse keeper who finds a message in a bottle", "a cartographer mapping a city that moves",
          "a baker who opens a shop on the moon", "two robots repairing an old clock tower",
          "a violinist lost in a snowed-in train station", "a beekeeper who can hear the hive think",
          "a ship's cook during the last voyage of a whaler", "a child who builds a radio from scrap")
SHORT_QUESTION = "In two sentences, explain what a lighthouse keeper does on a stormy night and why ships need it."
SHORT_NEW_TOKENS = 8
STEADY_TOKENS = 8  # the decoding stream's tokens before the long prompt arrives (its usual gap)


def parse_args() -> argparse.Namespace:
    parser = model_parser(__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens each concurrent stream decodes")
    parser.add_argument("--streams", default="1,4,8", help="concurrency levels of aggregate_decode_tok_s")
    parser.add_argument("--long-tokens", type=int, default=6000, help="the long prompt of the prefill figures")
    parser.add_argument("--short-delay", type=float, default=None,
                        help="seconds between the long and the short request (default: 1/4 of the long prefill)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--figures", default=",".join(FIGURES), help=f"any of {','.join(FIGURES)}")
    args = parser.parse_args()
    unknown = set(args.figures.split(",")) - set(FIGURES)
    if unknown:
        parser.error(f"unknown figures {sorted(unknown)}; choose from {','.join(FIGURES)}")
    if args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2: the decode window starts after the first token")
    return args


# ------------------------------------------------------------------ requests and their event times

class Stream:
    """One request and its events, timestamped on the engine thread as they are emitted."""

    def __init__(self, request_id: str, prompt_ids: list[int], max_tokens: int,
                 speculation: SpeculationConfig | None = None):
        self._changed = threading.Condition()
        self.token_times: list[float] = []
        self.text = ""
        self.first_event_at: float | None = None
        self.finished: Finished | None = None
        self.finished_at = 0.0
        # built last: the request's submitted_at (the TTFT's start) is its creation time
        self.request = EngineRequest(request_id=request_id, prompt_ids=tuple(prompt_ids),
                                     sampling=SamplingConfig(0.0), max_tokens=max_tokens, sink=self._sink,
                                     use_model_stop_tokens=False, speculation=speculation)

    def _sink(self, event) -> None:
        now = time.perf_counter()
        with self._changed:
            if self.first_event_at is None:
                self.first_event_at = now
            if isinstance(event, TextDelta):
                self.token_times.append(now)
                self.text += event.text
            elif isinstance(event, Finished):
                self.finished, self.finished_at = event, now
            self._changed.notify_all()

    @property
    def ttft(self) -> float:
        return self.first_event_at - self.request.submitted_at

    def wait_tokens(self, count: int) -> None:
        with self._changed:
            self._changed.wait_for(lambda: len(self.token_times) >= count or self.finished is not None)

    def wait_finished(self) -> Finished:
        with self._changed:
            self._changed.wait_for(lambda: self.finished is not None)
        if self.finished.reason is FinishReason.ERROR:
            raise RuntimeError(f"{self.request.request_id} failed: {self.finished.error_message}")
        return self.finished

    def wait_all_tokens(self) -> None:
        """Finished with exactly the tokens asked for (EOS is off: anything else is a bug)."""
        finished = self.wait_finished()
        wanted = self.request.max_tokens
        if finished.reason is not FinishReason.LENGTH or finished.usage.completion_tokens != wanted:
            raise RuntimeError(f"{self.request.request_id} ended {finished}, not after {wanted} tokens")


def new_engine(loaded: LoadedModel, runner: ModelRunner, scheduler: SchedulerConfig | None = None) -> EngineLoop:
    return EngineLoop(runner, loaded.tokenizer, frozenset(), threads=loaded.threads, scheduler=scheduler)


def submitted(engine: EngineLoop, stream: Stream) -> Stream:
    engine.submit(stream.request)
    return stream


# ------------------------------------------------------------------ prompts

def chat_ids(renderer: PromptRenderer, text: str) -> list[int]:
    request = ChatRequest(id="bench", model="bench", messages=(Message("user", text),))
    return list(renderer.render(request).token_ids)


def story_prompts(renderer: PromptRenderer, count: int) -> list[list[int]]:
    """Distinct prompts of similar length: no two streams decode the same text."""
    return [chat_ids(renderer, f"Write a long story about {TOPICS[i % len(TOPICS)]}."
                     + (f" Chapter {i // len(TOPICS) + 1}." if i >= len(TOPICS) else "")) for i in range(count)]


def long_prompt(renderer: PromptRenderer, target: int) -> list[int]:
    return chat_ids(renderer, FILLER * (target // 20 + 1))[:target]


# ------------------------------------------------------------------ figure: aggregate decode of K streams

def decode_window(loaded: LoadedModel, runner: ModelRunner, prompts: list[list[int]],
                  new_tokens: int) -> tuple[float, int]:
    """(seconds, tokens) of the decode-only window: from every stream having its first token to the last
    Finished. All streams are admitted and prefilled in the engine's first step, so they decode in lockstep."""
    scheduler = SchedulerConfig(max_batch=max(len(prompts), SchedulerConfig.max_batch),
                                idle_prefill_chunk=max(sum(map(len, prompts)), SchedulerConfig.idle_prefill_chunk))
    engine = new_engine(loaded, runner, scheduler)
    streams = [submitted(engine, Stream(f"stream-{i}", prompt, new_tokens)) for i, prompt in enumerate(prompts)]
    engine.start()  # after the submits: the first step sees every stream
    try:
        for stream in streams:
            stream.wait_all_tokens()
    finally:
        engine.shutdown()
    start = max(stream.token_times[0] for stream in streams)
    end = max(stream.finished_at for stream in streams)
    tokens = sum(new_tokens - sum(t <= start for t in stream.token_times) for stream in streams)
    return end - start, tokens


def streams_figures(loaded: LoadedModel, runner: ModelRunner, renderer: PromptRenderer, args, facts: dict) -> None:
    counts = sorted({int(k) for k in args.streams.split(",")} | {1})  # 1 stream is every ratio's base
    prompts = story_prompts(renderer, max(counts))
    new_tokens = min(args.new_tokens, loaded.context_length - max(map(len, prompts)))
    decode_window(loaded, runner, prompts, 4)  # warm-up: allocator, kernels, the widest batch's shapes
    best: dict[int, tuple[float, int]] = {}
    for _ in range(args.repeats):  # interleaved: noise hits every concurrency alike
        for count in counts:
            seconds, tokens = decode_window(loaded, runner, prompts[:count], new_tokens)
            if count not in best or tokens / seconds > best[count][1] / best[count][0]:
                best[count] = (seconds, tokens)
    floor_ms = weight_bytes(loaded.model) / HBM_BYTES_PER_S * 1e3 if loaded.device.type == "cuda" else None
    base = best[1][1] / best[1][0]
    for count in counts:
        seconds, tokens = best[count]
        step_ms = seconds / (tokens / count) * 1e3
        line = {"streams": count, "tok_s": round(tokens / seconds, 2), "ratio": round(tokens / seconds / base, 3),
                "per_stream_tok_s": round(tokens / seconds / count, 2), "step_ms": round(step_ms, 2),
                "window_tokens": tokens, "new_tokens": new_tokens}
        if floor_ms is not None:
            line["hbm_floor_ratio"] = round(floor_ms / step_ms, 3)
        emit("aggregate_decode_tok_s", line, facts)


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())


# ------------------------------------------------------------------ figures: requests around a long prefill

def prefill_alone(loaded: LoadedModel, runner: ModelRunner, scheduler: SchedulerConfig, prompt: list[int],
                  max_tokens: int) -> float:
    """TTFT of one request on an idle engine."""
    engine = new_engine(loaded, runner, scheduler)
    engine.start()
    try:
        stream = submitted(engine, Stream("alone", prompt, max_tokens))
        stream.wait_all_tokens()
    finally:
        engine.shutdown()
    return stream.ttft


def short_during_long(loaded: LoadedModel, runner: ModelRunner, scheduler: SchedulerConfig, long_ids: list[int],
                      short_ids: list[int], delay: float) -> tuple[float, float]:
    """(short request's TTFT, long prefill seconds) when the short one arrives `delay` s after the long one."""
    engine = new_engine(loaded, runner, scheduler)
    engine.start()
    try:
        long = submitted(engine, Stream("long", long_ids, 1))
        time.sleep(delay)
        short = submitted(engine, Stream("short", short_ids, SHORT_NEW_TOKENS))
        long.wait_all_tokens()
        short.wait_all_tokens()
    finally:
        engine.shutdown()
    return short.ttft, long.ttft


def gap_during_long(loaded: LoadedModel, runner: ModelRunner, scheduler: SchedulerConfig, long_ids: list[int],
                    decode_ids: list[int]) -> tuple[float, float, float]:
    """(steady gap, largest gap while the long prompt prefills, long prefill seconds) of a stream that is
    decoding when the long prompt arrives."""
    engine = new_engine(loaded, runner, scheduler)
    engine.start()
    try:
        decoding = submitted(engine, Stream("decoding", decode_ids, loaded.context_length - len(decode_ids)))
        decoding.wait_tokens(STEADY_TOKENS)
        before = len(decoding.token_times)
        long = submitted(engine, Stream("long", long_ids, 1))
        long.wait_all_tokens()
        decoding.wait_tokens(len(decoding.token_times) + 2)  # the gaps right after the prefill count too
        decoding.request.abort()
        decoding.wait_finished()
    finally:
        engine.shutdown()
    times = decoding.token_times
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    return statistics.median(gaps[:before - 1]), max(gaps[before - 1:]), long.ttft


def prefill_figures(loaded: LoadedModel, runner: ModelRunner, renderer: PromptRenderer, args, facts: dict,
                    figures: set[str]) -> None:
    long_ids = long_prompt(renderer, min(args.long_tokens, loaded.context_length - 1))
    short_ids = chat_ids(renderer, SHORT_QUESTION)
    decode_ids = story_prompts(renderer, 1)[0]
    window = loaded.context_length
    modes = {"chunked": SchedulerConfig(),
             "unchunked": SchedulerConfig(prefill_chunk=window, idle_prefill_chunk=window)}
    for scheduler in modes.values():  # warm-up: allocator, kernels, each mode's forward shapes
        prefill_alone(loaded, runner, scheduler, long_ids, 1)
    alone = {mode: prefill_alone(loaded, runner, scheduler, long_ids, 1) for mode, scheduler in modes.items()}
    short_alone = prefill_alone(loaded, runner, modes["chunked"], short_ids, SHORT_NEW_TOKENS)
    delay = args.short_delay if args.short_delay is not None else alone["unchunked"] / 4
    ttft: dict[str, tuple[float, float]] = {}
    gap: dict[str, tuple[float, float, float]] = {}
    for _ in range(args.repeats):  # interleaved: noise hits both modes alike; best = least disturbed
        for mode, scheduler in modes.items():
            if "ttft" in figures:
                ttft[mode] = min(ttft.get(mode, (float("inf"),)),
                                 short_during_long(loaded, runner, scheduler, long_ids, short_ids, delay))
            if "gap" in figures:
                run = gap_during_long(loaded, runner, scheduler, long_ids, decode_ids)
                gap[mode] = run if mode not in gap or run[1] < gap[mode][1] else gap[mode]
    chunks = {"prefill_chunk": modes["chunked"].prefill_chunk,
              "idle_prefill_chunk": modes["chunked"].idle_prefill_chunk, "unchunked_chunk": window}
    sizes = {"long_tokens": len(long_ids), "short_tokens": len(short_ids), **chunks}
    if ttft:
        emit("short_ttft_during_long_prefill", {
            "short_ttft_ms": {mode: round(value[0] * 1e3, 1) for mode, value in ttft.items()},
            "long_prefill_s": {mode: round(value[1], 3) for mode, value in ttft.items()},
            "ratio": round(ttft["unchunked"][0] / ttft["chunked"][0], 3),
            "alone": {"short_ttft_ms": round(short_alone * 1e3, 1),
                      "long_prefill_s": {mode: round(value, 3) for mode, value in alone.items()}},
            "short_delay_s": round(delay, 3), "short_new_tokens": SHORT_NEW_TOKENS, **sizes}, facts)
    if gap:
        emit("decode_gap_during_long_prefill", {
            "max_gap_ms": {mode: round(value[1] * 1e3, 1) for mode, value in gap.items()},
            "steady_gap_ms": {mode: round(value[0] * 1e3, 1) for mode, value in gap.items()},
            "long_prefill_s": {mode: round(value[2], 3) for mode, value in gap.items()},
            "ratio": round(gap["unchunked"][1] / gap["chunked"][1], 3), **sizes}, facts)


# ------------------------------------------------------------------ figure: packed vs unpacked, one stream

def packing_figure(loaded: LoadedModel, runner: ModelRunner, renderer: PromptRenderer, args, facts: dict) -> None:
    if not runner.packing:
        emit("packed_decode_tok_s", {"skipped": "this model does not pack (engine/torch/packed.py probe)"}, facts)
        return
    sides = {"packed": runner, "unpacked": ModelRunner(loaded.model, packing=False)}
    prompt = story_prompts(renderer, 1)
    new_tokens = min(args.new_tokens, loaded.context_length - len(prompt[0]))
    for side in sides.values():
        decode_window(loaded, side, prompt, 4)  # warm-up
    best = {name: 0.0 for name in sides}
    for _ in range(args.repeats):
        for name, side in sides.items():
            seconds, tokens = decode_window(loaded, side, prompt, new_tokens)
            best[name] = max(best[name], tokens / seconds)
    emit("packed_decode_tok_s", {**{name: round(rate, 2) for name, rate in best.items()},
                                 "ratio": round(best["packed"] / best["unpacked"], 3), "new_tokens": new_tokens,
                                 "prompt_tokens": len(prompt[0])}, facts)


# ------------------------------------------------------------------ figure: speculative vs plain, echo turn

def speculative_figure(loaded: LoadedModel, runner: ModelRunner, renderer: PromptRenderer, args, facts: dict) -> None:
    """The echo-heavy agent turn of bench/speculative.py (rewrite a file from the prompt with one edit), through
    the engine loop and its packed forwards: plain vs prompt-lookup speculation, greedy, identical text."""
    prompt = chat_ids(renderer, ECHO_TURN)
    new_tokens = min(max(args.new_tokens, 160), loaded.context_length - len(prompt))
    sides = {"plain": None, "speculative": SpeculationConfig()}

    def run(config) -> tuple[float, Stream]:
        engine = new_engine(loaded, runner)
        stream = submitted(engine, Stream("echo", prompt, new_tokens, config))
        engine.start()
        try:
            stream.wait_all_tokens()
        finally:
            engine.shutdown()
        return stream.finished_at - stream.token_times[0], stream

    for config in sides.values():
        run(config)  # warm-up
    best, texts = {name: 0.0 for name in sides}, {}
    for _ in range(args.repeats):
        for name, config in sides.items():
            seconds, stream = run(config)
            best[name] = max(best[name], (new_tokens - 1) / seconds)
            texts[name] = stream.text
    emit("speculative_echo_decode_tok_s", {**{name: round(rate, 2) for name, rate in best.items()},
                                           "ratio": round(best["speculative"] / best["plain"], 3),
                                           "identical": texts["plain"] == texts["speculative"],
                                           "new_tokens": new_tokens, "prompt_tokens": len(prompt)}, facts)


def emit(figure: str, values: dict, facts: dict) -> None:
    print(json.dumps({"bench": "batching", "figure": figure, **values, **facts}), flush=True)


def main() -> None:
    args = parse_args()
    model_dir = resolve_model_dir(args)
    loaded = load_model(model_dir, device=args.device, dtype=args.dtype, threads=args.threads)
    renderer = PromptRenderer(loaded.tokenizer)
    runner = ModelRunner(loaded.model)  # packs when the model allows (the daemon's runner)
    facts = {"model": model_dir.name, "device": str(loaded.device), "dtype": str(loaded.dtype).removeprefix("torch."),
             "threads": torch.get_num_threads(), "packing": runner.packing, "repeats": args.repeats}
    figures = set(args.figures.split(","))
    if "streams" in figures:
        streams_figures(loaded, runner, renderer, args, facts)
    if figures & {"ttft", "gap"}:
        prefill_figures(loaded, runner, renderer, args, facts, figures)
    if "packing" in figures:
        packing_figure(loaded, runner, renderer, args, facts)
    if "speculative" in figures:
        speculative_figure(loaded, runner, renderer, args, facts)


if __name__ == "__main__":
    main()
