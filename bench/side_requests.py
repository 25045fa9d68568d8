"""Side requests against the main conversation: a Claude-Code-shaped session under a small cache budget, with and
without the main-conversation rule (zllm/kvcache/retention.py).

    .venv/bin/python bench/side_requests.py [MODEL_DIR] [--backend auto] [--budget-mb 1] [--turns 6] [--threads 1]

The session replays the shape of a recorded Claude Code session: one main conversation (a long system prompt
with the tool schemas, growing by a tool call and its result each turn) and, between its turns, the side requests
Claude Code sends: a quota check ("quota", max_tokens 1), a title (a short fixed system prompt and the first user
message), a command classifier (a ~600-token fixed system prompt and the command) and a subagent (a system prompt
and tools of its own, one of four agent types, and a task). 4 side requests per gap: 20 for 6 turns.

Every turn of the main conversation should restore the previous turn's prompt from the device tier. The budget:
llama.cpp's pool is sized at load (`--budget-mb`; never fewer cells than the window: 8192 for the default model);
on torch `--budget-mb` is the device tier's budget. Each run is done twice — plain LRU (the rule switched off by
this script) and the rule — and prints one JSON line per run: main turns that hit, cached/prompt tokens of turns
2.., prefilled tokens of the whole session, wall seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_args import model_parser, resolve_model_dir  # noqa: E402  (bench/bench_args.py)
from prefix_cache import TOOLS, history_turn  # noqa: E402  (bench/prefix_cache.py: the agent conversation)
from session_script import CLASSIFIER_SYSTEM, TITLE_SYSTEM  # noqa: E402  (Claude Code's side-request prompts)

from zllm.canonical import ChatRequest, Finished, Message, SamplingParams  # noqa: E402
from zllm.engine.select import load_for_backend  # noqa: E402
from zllm.kvcache import CacheConfig, retention  # noqa: E402
from zllm.runtime.client import LocalEngineClient  # noqa: E402

MODEL_NAME = "bench"
MiB = 1 << 20
AGENT_TYPES = ("general-purpose", "Explore", "Plan", "statusline-setup")


def parse_args() -> argparse.Namespace:
    parser = model_parser(__doc__.splitlines()[0], dtype=False)
    parser.add_argument("--backend", default="auto", help="auto (GGUF on llama.cpp), torch or llamacpp")
    parser.add_argument("--budget-mb", type=int, default=1, help="llama.cpp: --cache-budget-mb; torch: device budget")
    parser.add_argument("--turns", type=int, default=6)
    return parser.parse_args()


def main_system() -> str:
    """A Claude-Code-shaped system prompt cut to ~1.3K tokens (the measurement runs on shared CPUs): rules, then
    the tool schemas."""
    rules = "\n".join(f"{i}. Read the relevant files first, keep changes small, run the tests." for i in range(1, 9))
    schemas = [{"name": name, "description": f"{name.replace('_', ' ')} in the workspace; paths are relative.",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"},
                                                                  "pattern": {"type": "string"}},
                                 "required": ["path"]}} for name in TOOLS]
    return "You are an autonomous coding agent.\n# Rules\n" + rules + "\n# Tools\n" + json.dumps(schemas, indent=1)


def subagent_system(kind: str) -> str:
    tools = [{"name": f"{kind}_{name}", "description": f"{name} for the {kind} agent; read-only unless told.",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
             for name in ("read", "grep", "glob", "list", "fetch", "search", "bash", "todo")]
    return (f"You are the {kind} agent, launched by a coding agent for one task. Report what you found in a short "
            f"final answer; the user never sees it.\n# Tools\n" + json.dumps(tools, indent=1))


def side_requests(turn: int, first_user: str) -> list[tuple[str, list[Message], int]]:
    """The side requests Claude Code sends after main turn `turn`: (name, messages, max_tokens)."""
    kind = AGENT_TYPES[turn % len(AGENT_TYPES)]
    return [
        ("quota", [Message("user", "quota")], 1),
        ("title", [Message("system", TITLE_SYSTEM), Message("user", first_user)], 16),
        ("classifier", [Message("system", CLASSIFIER_SYSTEM),
                        Message("user", f"Command: pytest tests/test_module_{turn}.py -x -q")], 8),
        ("subagent", [Message("system", subagent_system(kind)),
                      Message("user", f"Find every caller of update_{turn} and say which ones pass a state.")], 8),
    ]


async def run(client: LocalEngineClient, rid: str, messages: list[Message], max_tokens: int) -> Finished:
    request = ChatRequest(id=rid, model=MODEL_NAME, messages=tuple(messages),
                          sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens))
    finished = None
    async for event in await client.submit(request):
        finished = event if isinstance(event, Finished) else finished
    return finished


def session(client: LocalEngineClient, turns: int) -> dict:
    first_user = "Step 0: the update functions are slow. Please profile them and fix the worst one."
    main = [Message("system", main_system()), Message("user", first_user)]
    hits, cached, prompt, prefilled, previous, sides, per_turn = 0, 0, 0, 0, None, {}, []
    started = time.perf_counter()
    for turn in range(1, turns + 1):
        finished = asyncio.run(run(client, f"main{turn}", main, 8))
        prefilled += finished.usage.prompt_tokens - finished.usage.cached_tokens
        per_turn.append(f"{finished.usage.cached_tokens}/{finished.usage.prompt_tokens}")
        if previous is not None:
            hits += finished.usage.cached_tokens >= previous
            cached, prompt = cached + finished.usage.cached_tokens, prompt + finished.usage.prompt_tokens
        previous = finished.usage.prompt_tokens
        if turn == turns:
            break
        for name, messages, max_tokens in side_requests(turn, first_user):
            side = asyncio.run(run(client, f"{name}{turn}", messages, max_tokens))
            prefilled += side.usage.prompt_tokens - side.usage.cached_tokens
            sides[name] = side.usage.prompt_tokens
        main = main + history_turn(turn)[1:] + [Message("user", "Continue with the next step.")]
    stats = client.prefix_cache.stats()
    return {"main_turns_hit": f"{hits}/{turns - 1}", "main_cached_over_prompt": round(cached / prompt, 4),
            "main_cached_per_turn": per_turn, "session_prefilled_tokens": prefilled,
            "wall_s": round(time.perf_counter() - started, 1), "main_spared": stats.main_spared,
            "entries_left": stats.entries, "side_prompt_tokens": sides}


def main() -> None:
    args = parse_args()
    model_dir = resolve_model_dir(args)
    loaded = load_for_backend(model_dir, backend=args.backend, device=args.device, threads=args.threads,
                              cache_budget_mb=args.budget_mb)
    config = CacheConfig(device_budget_bytes=args.budget_mb * MiB)  # llama.cpp: its pool, sized at load
    common = {"model": model_dir.name, "backend": loaded.backend, "budget_mb": args.budget_mb,
              "cells": getattr(loaded.engine, "cells", None), "threads": args.threads}
    for rule in (False, True):
        with mock.patch.object(retention, "main_conversations", retention.main_conversations if rule
                               else lambda kept, now: {}):  # no main conversation: plain LRU
            client = LocalEngineClient(loaded, MODEL_NAME, 0, cache_config=config)
            try:
                print(json.dumps({"rule": rule, **session(client, args.turns), **common}), flush=True)
            finally:
                client.close()
    loaded.close()


if __name__ == "__main__":
    main()
