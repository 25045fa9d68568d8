"""A corpus of malformed requests for every API the daemon serves: hand-picked cases plus seeded mutations.

    cases = corpus(model="tiny-qwen", per_api=1000, seed=13)     # [BadRequest(api, label, body), ...]

`api` is one of `APIS` (`PATHS` gives each HTTP route; "ws" is a `response.create` frame on the Responses
WebSocket). `body` is raw bytes, so a case may be what no JSON library would write: invalid UTF-8, lone
surrogates, `NaN`, a number of 5,000 digits, nesting 10,000 levels deep, JSON cut short.

A generated case is a valid request (`valid_request`) with one to three mutations applied at random nodes
of its JSON tree (`MUTATIONS`): a wrong type, a missing field, a bad enum, an out-of-range or non-finite
number, a lone surrogate, an oversized string, deep nesting, unknown fields; then, now and then, the bytes
are damaged (invalid UTF-8, truncation). Some cases stay valid: they must be served, not refused.
The same seed always gives the same corpus, so a failure names a case that can be replayed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

# the Ollama routes last: a corpus's earlier cases stay the same for a seed when an API is added
APIS = ("chat", "responses", "messages", "count_tokens", "ws", "ollama_chat", "ollama_generate")
PATHS = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "count_tokens": "/v1/messages/count_tokens",
    "ollama_chat": "/api/chat",
    "ollama_generate": "/api/generate",
}

# replaced after serialization: json.dumps itself recurses, so deep nesting is spliced into the text
_DEEP_MARK = "\u2063deep:"


@dataclass(frozen=True)
class BadRequest:
    api: str
    label: str
    body: bytes


def valid_request(api: str, model: str, rng: random.Random) -> dict:
    """A small valid request for `api` (max tokens tiny so that cases that stay valid finish fast)."""
    tool = {"name": "sh", "description": "run a command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}
    if api == "chat":
        body = {"model": model, "max_tokens": 2, "temperature": 0, "seed": 7, "stop": ["\n\n"],
                "messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                             {"role": "assistant", "content": None, "tool_calls": [
                                 {"id": "call_1", "type": "function",
                                  "function": {"name": "sh", "arguments": "{\"cmd\":\"ls\"}"}}]},
                             {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}],
                "tools": [{"type": "function", "function": tool}], "tool_choice": "auto",
                "stream": rng.random() < 0.3, "stream_options": {"include_usage": True}}
    elif api in ("responses", "ws"):
        body = {"model": model, "max_output_tokens": 2, "temperature": 0, "store": False,
                "instructions": "Be brief.",
                "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                          {"type": "function_call", "call_id": "call_1", "name": "sh", "arguments": "{}"},
                          {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"}],
                "tools": [{"type": "function", **tool}], "tool_choice": "auto",
                "reasoning": {"effort": "low"}, "text": {"format": {"type": "text"}},
                "stream": rng.random() < 0.3}
        if rng.random() < 0.2:
            body["previous_response_id"] = "resp_" + "0" * 24
        if api == "ws":
            body = {"type": "response.create", **body}
    elif api.startswith("ollama"):
        body = _ollama_request(api, model, tool, rng)
    else:
        body = {"model": model, "system": [{"type": "text", "text": "Be brief."}],
                "messages": [{"role": "user", "content": "hi"},
                             {"role": "assistant", "content": [
                                 {"type": "tool_use", "id": "toolu_1", "name": "sh", "input": {"cmd": "ls"}}]},
                             {"role": "user", "content": [
                                 {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}]}],
                "tools": [{"name": "sh", "description": "run", "input_schema": tool["parameters"]}],
                "tool_choice": {"type": "auto"}, "temperature": 0}
        if api == "messages":
            body.update(max_tokens=2, stop_sequences=["\n\n"], stream=rng.random() < 0.3)
    return body


# ------------------------------------------------------------------------------------------- mutations

_WRONG_TYPES = (None, True, False, 0, -1, 1.5, "", "x", [], {}, [1, "a"], {"a": 1}, [[[]]])
_BAD_NUMBERS = (10**30, 2**63, 2**64, -(2**63) - 1, -1, -(10**9), 0, 1e308, -1e308, 1e-320, 0.5, 3.7,
                float("nan"), float("inf"), float("-inf"))
_BAD_STRINGS = ("bogus", "", " ", "NONE", "function ", "\x00", "user\n", "a" * 300, "\ud800", "x\udfffy",
                "\ud83d", "😀", "\u202e", "\ufeff")


def _nodes(tree: object, path: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys/indexes) in `tree`, the root included."""
    paths = [path]
    if isinstance(tree, dict):
        for key, value in tree.items():
            paths += _nodes(value, (*path, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            paths += _nodes(value, (*path, i))
    return paths


def _get(tree: object, path: tuple) -> object:
    for step in path:
        tree = tree[step]
    return tree


def _set(tree: object, path: tuple, value: object) -> object:
    if not path:
        return value
    _get(tree, path[:-1])[path[-1]] = value
    return tree


def _replace(pick):
    def mutate(tree, path, rng):
        return _set(tree, path, pick(rng, _get(tree, path)))
    return mutate


def _delete(tree, path, rng):
    if path:
        del _get(tree, path[:-1])[path[-1]]
    return tree


def _deep(tree, path, rng):
    depth = rng.choice((100, 300, 900, 1100, 2500, 10_000))
    return _set(tree, path, f"{_DEEP_MARK}{rng.choice('[{')}{depth}")


def _surrogate(rng, value):
    lone = rng.choice(("\ud800", "\udbff", "\udc00", "\udfff"))
    text = value if isinstance(value, str) else "text"
    at = rng.randrange(len(text) + 1)
    return text[:at] + lone + text[at:]


def _surrogate_key(tree, path, rng):
    parent = _get(tree, path)
    if isinstance(parent, dict) and parent:
        key = rng.choice(list(parent))
        parent[_surrogate(rng, key)] = parent.pop(key)
    return tree


def _unknown_fields(tree, path, rng):
    target = _get(tree, path)
    if isinstance(target, dict):
        target[rng.choice(("x_extra", "cache_control", "metadata", "type", "role", ""))] = rng.choice(_WRONG_TYPES)
    return tree


def _oversized(rng, value):
    return rng.choice(("a", "ab ", "\u00e9", "😀", "<|im_start|>")) * rng.choice((2_000, 20_000, 100_000))


def _wrap(rng, value):
    return rng.choice(([value], {"value": value}, [value, value]))


MUTATIONS = {
    "wrong_type": _replace(lambda rng, value: rng.choice(_WRONG_TYPES)),
    "bad_number": _replace(lambda rng, value: rng.choice(_BAD_NUMBERS)),
    "bad_enum": _replace(lambda rng, value: rng.choice(_BAD_STRINGS)),
    "surrogate": _replace(_surrogate),
    "surrogate_key": _surrogate_key,
    "oversized": _replace(_oversized),
    "wrapped": _replace(_wrap),
    "missing": _delete,
    "deep": _deep,
    "unknown_field": _unknown_fields,
}
# oversized strings are the costly ones to send and to parse: rarer than the rest
_WEIGHTS = {"oversized": 0.1, "deep": 0.6}


def _serialize(tree: object, rng: random.Random) -> bytes:
    # ensure_ascii=True writes lone surrogates as \ud800 escapes; False writes them raw (as invalid UTF-8)
    text = json.dumps(tree, ensure_ascii=rng.random() < 0.5, allow_nan=True)
    while (start := text.find(f'"{_DEEP_MARK}')) >= 0:
        end = text.index('"', start + 1)
        spec = text[start + 1 + len(_DEEP_MARK):end]
        text = text[:start] + _nested(spec[0], int(spec[1:])) + text[end + 1:]
    return text.encode("utf-8", "surrogatepass")


def _nested(opener: str, depth: int) -> str:
    if opener == "[":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def _damage_bytes(body: bytes, rng: random.Random) -> tuple[bytes, str]:
    roll = rng.random()
    if roll < 0.04 and len(body) > 2:
        return body[:rng.randrange(1, len(body) - 1)], "truncated"
    if roll < 0.08:
        at = body.find(b'"', rng.randrange(len(body))) + 1 or 1
        junk = rng.choice((b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80", b"\xe2\x82"))
        return body[:at] + junk + body[at:], "invalid_utf8"
    return body, ""


def generated(api: str, model: str, rng: random.Random) -> BadRequest:
    tree = valid_request(api, model, rng)
    names = list(MUTATIONS)
    weights = [_WEIGHTS.get(name, 1.0) for name in names]
    labels = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        name = rng.choices(names, weights)[0]
        path = rng.choice(_nodes(tree))
        tree = MUTATIONS[name](tree, path, rng)
        labels.append(f"{name}@{'.'.join(map(str, path)) or '<root>'}")
    body, damage = _damage_bytes(_serialize(tree, rng), rng)
    return BadRequest(api, " ".join(labels + ([damage] if damage else [])), body)


# ------------------------------------------------------------------------------------------- by hand


def _ollama_request(api: str, model: str, tool: dict, rng: random.Random) -> dict:
    """Ollama's shape: sampling under `options`, streaming unless `stream` is false (so mostly false here)."""
    body = {"model": model, "options": {"num_predict": 2, "temperature": 0, "seed": 7, "top_k": 40, "stop": ["\n\n"]},
            "stream": rng.random() < 0.3, "keep_alive": "5m"}
    if api == "ollama_generate":
        return {**body, "prompt": "hi", "system": "Be brief."}
    return {**body, "tools": [{"type": "function", "function": tool}],
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "",
                          "tool_calls": [{"function": {"name": "sh", "arguments": {"cmd": "ls"}}}]},
                         {"role": "tool", "content": "a.txt", "tool_name": "sh"}]}


def table(api: str, model: str) -> list[BadRequest]:
    """Cases picked by hand: each cause of a 5xx seen so far, and the shapes a broken client sends."""
    base = valid_request(api, model, random.Random(0))
    base.pop("stream", None)
    raw = {
        "empty": b"",
        "whitespace": b"  \n",
        "null": b"null",
        "array": b"[]",
        "string": b'"hi"',
        "number": b"42",
        "truncated": json.dumps(base).encode()[:-1],
        "trailing_garbage": json.dumps(base).encode() + b"}",
        "nan_literal": json.dumps(base).encode()[:-1] + b', "temperature": NaN}',
        "infinity_literal": json.dumps(base).encode()[:-1] + b', "temperature": -Infinity}',
        "huge_exponent": json.dumps(base).encode()[:-1] + b', "temperature": 1e999}',
        "5000_digits": json.dumps(base).encode()[:-1] + b', "seed": ' + b"9" * 5000 + b"}",
        "deep_array_2000": b'{"model": "m", "x": ' + b"[" * 2000 + b"]" * 2000 + b"}",
        "deep_object_100000": b'{"x": ' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}",
        "unclosed_deep": b"[" * 50_000,
        "utf16_body": json.dumps(base).encode("utf-16"),
        "bom_then_garbage": b"\xef\xbb\xbf{",
        "nul_bytes": b"\x00" * 64,
        "encoded_surrogate": json.dumps(base).encode().replace(b'"hi"', b'"h\xed\xa0\x80i"').replace(
            b'"Be brief."', b'"Be \xed\xb0\x80brief."'),
        "escaped_surrogate": json.dumps(base).replace("Be brief.", "Be \\ud800brief.").replace(
            '"hi"', '"h\\udc00i"').encode(),
    }
    for key in ("seed", "max_tokens", "max_output_tokens", "top_k", "temperature", "top_p"):
        for value in (2**64, 2**63, -(2**63) - 1, 10**40, -5, 1e300):
            raw[f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"] = json.dumps(
                {**base, key: value}).encode()
    for seed in (2**64, 2**63, -(2**63) - 1, -1):  # sampling, not greedy: the seed reaches a torch.Generator
        raw[f"sampled_seed={seed}"] = json.dumps({**base, "temperature": 1, "seed": seed}).encode()
    if api.startswith("ollama"):  # Ollama reads its sampling settings from `options`
        for key in ("seed", "num_predict", "num_ctx", "top_k", "temperature", "top_p"):
            for value in (2**64, 2**63, -(2**63) - 1, 10**40, -5, 1e300, "7", None):
                raw[f"options.{key}={value!r:.12}"] = json.dumps(
                    {**base, "options": {**base["options"], key: value}}).encode()
    cases = [BadRequest(api, label, body) for label, body in raw.items()]
    if api in ("responses", "ws"):
        for pid in ("resp_\ud800", "\udfff", "x" * 100_000, "", 5, ["resp_1"]):
            body = json.dumps({**base, "previous_response_id": pid}).encode()
            cases.append(BadRequest(api, f"previous_response_id={pid!r:.20}", body))
    if api == "ws":
        # a server event's name (`response.cancel` and `response.processed` are client frames answered by
        # nothing when there is nothing to cancel or answer; see websocket_frames.py)
        cases.append(BadRequest(api, "wrong_type_field", json.dumps({**base, "type": "response.completed"}).encode()))
        cases.append(BadRequest(api, "no_type_field", json.dumps({k: v for k, v in base.items() if k != "type"})
                                .encode()))
    return cases


def corpus(model: str, *, per_api: int, seed: int, apis: tuple[str, ...] = APIS) -> list[BadRequest]:
    """`per_api` generated cases for each of `apis`, after its table: the same seed, the same corpus."""
    rng = random.Random(seed)
    cases: list[BadRequest] = []
    for api in apis:
        cases += table(api, model)
        cases += [generated(api, model, rng) for _ in range(per_api)]
    return cases
