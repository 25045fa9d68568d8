"""The session benchmark's conversation, built from a recorded Claude Code request (bench/claude_code_request.py):
what is sent, in which order. Pure data: no server, no model; bench/session.py sends it.

The main conversation is the recorded body (its system prompt, tools, first user message and mid-conversation
system turn), grown after each main turn by a scripted assistant turn and its result, the way Claude Code grows it:
a `tool_use` (Read or Bash) and a user turn holding its `tool_result` (the newest one carries the cache_control
breakpoint), or a new user message. One main turn is an "echo" turn: the user asks for a file just read back in
full, so its answer copies the conversation (what prompt-lookup speculation is for). The model's own answers are
not kept: both servers get byte-identical requests. Between main turns come Claude Code's short side requests: a
quota check at start (max_tokens 1), a title for the first message, and a Bash-command classifier before each Bash
result. One restart of both servers sits after the middle main turn.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

MAIN_MAX_TOKENS = 64
ECHO_MAX_TOKENS = 512
TITLE_SYSTEM = ("Analyze if this message indicates a new conversation topic. If it does, extract a 2-3 word title "
                "that captures the new topic. Format your response as a JSON object with two fields: "
                "'isNewTopic' (boolean) and 'title' (string, or null if isNewTopic is false).")
CLASSIFIER_SYSTEM = ("Your task is to process Bash commands that an AI coding agent wants to run. This policy spec "
                     "defines how to determine the prefix of a Bash command. " + " ".join(
                         f"Example {i}: `git diff --stat HEAD~{i}` => `git diff`; `npm run test:{i}` => `npm run "
                         f"test:{i}`; `cat file_{i} | grep x` => command_injection_detected." for i in range(6)))
# what the assistant "did" after each main turn, in a cycle: (action, argument)
ACTIONS = (("read", "src/state.py"), ("bash", "python -m pytest tests -x -q"), ("read", "src/cache.py"),
           ("echo", "src/cache.py"), ("bash", "git diff --stat"), ("user", "Good. Now add a test for the fast path "
                                                                        "and run the whole suite again."))
KEEP_TOOLS = ("Bash", "Read")  # the scripted turns call them: never scaled away


@dataclass(frozen=True)
class Step:
    """One request of the session (`kind` main, echo or side), or the restart of both servers (`kind` restart)."""

    kind: str
    name: str
    body: dict | None = None


def scaled(recorded: dict, scale: float) -> dict:
    """The recorded request shortened for a quick run: every long text (system blocks, message text) cut to `scale`
    of its length at a line end, and the tools kept in recorded order while their JSON fits `scale` of the whole
    (Bash and Read always kept). scale 1.0 returns a copy."""
    body = copy.deepcopy(recorded)
    if scale >= 1.0:
        return body

    def cut(text: str) -> str:
        if len(text) < 400:
            return text
        keep = text[: int(len(text) * scale)]
        return keep[: keep.rfind("\n") + 1] or keep

    if isinstance(body.get("system"), list):
        for block in body["system"]:
            block["text"] = cut(block.get("text", ""))
    elif isinstance(body.get("system"), str):
        body["system"] = cut(body["system"])
    for message in body["messages"]:
        if isinstance(message["content"], str):
            message["content"] = cut(message["content"])
        else:
            for block in message["content"]:
                if block.get("type") == "text":
                    block["text"] = cut(block["text"])
    tools, budget = [], scale * sum(len(json.dumps(tool)) for tool in body.get("tools", []))
    for tool in body.get("tools", []):
        size = len(json.dumps(tool))
        if tool.get("name") in KEEP_TOOLS or size <= budget:
            tools.append(tool)
            budget -= size
    body["tools"] = tools
    return body


def source_file(path: str, lines: int) -> str:
    """A Python file's text, `lines` long, different per path (what Read returns, before numbering)."""
    stem = path.rsplit("/", 1)[-1].removesuffix(".py")
    out = [f'"""{stem}: state updates for the agent session."""', "", "from __future__ import annotations", ""]
    i = 0
    while len(out) < lines:
        out += [f"def update_{stem}_{i}(state: dict, key: str, value: int) -> dict:",
                f"    # copy first: callers keep the old {stem} state for undo",
                "    new = dict(state)",
                f"    new[key] = new.get(key, 0) + value * {i + 1}",
                "    return new", ""]
        i += 1
    return "\n".join(out[:lines]) + "\n"


def numbered(text: str) -> str:
    """Claude Code's Read result: `cat -n` style lines."""
    return "".join(f"{n}\t{line}\n" for n, line in enumerate(text.splitlines(), 1))


def bash_output(command: str, turn: int, lines: int) -> str:
    if command.startswith("git diff"):
        files = "".join(f" src/module_{i}.py | {i + turn} +{'+' * (i % 7)}{'-' * (i % 3)}\n" for i in range(lines // 4))
        return files + f" {lines // 4} files changed, {turn * 9} insertions(+), {turn * 2} deletions(-)\n"
    passed = "".join(f"tests/test_state_{i}.py ........{'.' * (i % 5)}  [{(i + 1) * 100 // lines:3d}%]\n"
                     for i in range(lines))
    return passed + f"{lines * 9} passed in {0.5 + turn / 10:.2f}s\n"


def tool_turns(turn: int, action: str, argument: str, file_lines: int) -> list[dict]:
    """The assistant's tool_use and the user turn with its tool_result (cache_control on it, as Claude Code does)."""
    tool_id = f"toolu_bench_{turn:02d}"
    if action == "read":
        call, result = ("Read", {"file_path": f"/project/{argument}"}), numbered(source_file(argument, file_lines))
        text = f"Let me read {argument}."
    else:
        call, result = ("Bash", {"command": argument, "description": "Run " + argument.split()[0]}), \
            bash_output(argument, turn, max(4, file_lines // 4))
        text = f"Running `{argument}`."
    return [{"role": "assistant", "content": [{"type": "text", "text": text},
                                              {"type": "tool_use", "id": tool_id, "name": call[0], "input": call[1]}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": result,
                                          "is_error": False, "cache_control": {"type": "ephemeral"}}]}]


def without_breakpoints(messages: list[dict]) -> list[dict]:
    """Claude Code keeps one message breakpoint, on the newest tool_result: drop the older ones."""
    out = copy.deepcopy(messages)
    for message in out:
        if isinstance(message["content"], list):
            for block in message["content"]:
                if block.get("type") == "tool_result":
                    block.pop("cache_control", None)
    return out


def first_user_text(body: dict) -> str:
    for message in body["messages"]:
        if message["role"] == "user":
            content = message["content"]
            return content if isinstance(content, str) else [b["text"] for b in content if b["type"] == "text"][-1]
    return ""


def side_body(base: dict, system: str, user: str, max_tokens: int) -> dict:
    """A side request as Claude Code sends it: the billing header, its own short system prompt, no tools."""
    header = [block for block in base.get("system", []) if isinstance(block, dict)
              and block.get("text", "").startswith("x-anthropic-billing-header")]
    return {"model": base.get("model", "some-model"), "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "system": header + [{"type": "text", "text": system}] if system else header,
            "messages": [{"role": "user", "content": user}]}


def session_steps(recorded: dict, turns: int, scale: float = 1.0, file_lines: int = 160,
                  echo_tokens: int = ECHO_MAX_TOKENS) -> list[Step]:
    """The whole session: `turns` main turns (one of them the echo turn when turns >= 5), side requests between
    them, and one restart after main turn `turns // 2`."""
    base = scaled(recorded, scale)
    base.update({"temperature": 0, "stream": True})
    lines = max(12, int(file_lines * min(scale, 1.0)))
    first = first_user_text(base)
    steps = [Step("side", "quota", side_body(base, "", "quota", 1))]
    messages = copy.deepcopy(base["messages"])
    pending: tuple[str, str] | None = None  # the action whose result the next main turn carries
    for turn in range(1, turns + 1):
        kind, max_tokens = "main", MAIN_MAX_TOKENS
        if pending is not None:
            action, argument = pending
            if action == "echo":
                messages = without_breakpoints(messages) + [
                    {"role": "assistant", "content": [{"type": "text", "text": f"I have read {argument}."}]},
                    {"role": "user", "content": f"Write {argument} back to me in full, exactly as you read it, in "
                                                "one ```python block and nothing else."}]
                kind, max_tokens = "echo", echo_tokens
            elif action == "user":
                messages = without_breakpoints(messages) + [
                    {"role": "assistant", "content": [{"type": "text", "text": "The change is in and tests pass."}]},
                    {"role": "user", "content": argument}]
            else:
                if action == "bash":
                    steps.append(Step("side", f"classifier{turn}", side_body(
                        base, CLASSIFIER_SYSTEM, f"Command: {argument}", 8)))
                messages = without_breakpoints(messages) + tool_turns(turn, action, argument, lines)
        steps.append(Step(kind, f"{kind}{turn}", {**base, "messages": copy.deepcopy(messages),
                                                   "max_tokens": max_tokens}))
        if turn == 1:
            steps.append(Step("side", "title", side_body(base, TITLE_SYSTEM, first, 32)))
        if turn == turns // 2:
            steps.append(Step("restart", "restart"))
        pending = ACTIONS[(turn - 1) % len(ACTIONS)]
    return steps
