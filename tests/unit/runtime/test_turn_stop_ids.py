"""A marker that ends a turn of text and opens a call too (GigaChat 3's `<|message_sep|>`, derived dialect
`ends_text_turn`) stops nothing where a call may follow, and ends the turn where none can: no tools, or tool_choice
none (ClientBase.turn_stop_ids → EngineRequest.turn_stop_ids, added to the model's own end-of-turn ids)."""

from __future__ import annotations

from types import SimpleNamespace

from tests.support.engine_run import run_to_the_end
from tests.support.speculation import GREEDY, IM_END, STOP_IDS, echo_model, encode
from zllm.canonical import ChatRequest, FunctionTool, Message, TextDelta, ToolChoice
from zllm.engine.torch.runner import ModelRunner
from zllm.runtime.client_base import ClientBase
from zllm.runtime.engine_loop import EngineLoop

TOOL = FunctionTool("search", "Search", {"type": "object", "properties": {"q": {"type": "string"}}})


def test_the_marker_ends_the_turn_only_where_no_call_can_follow():
    client = SimpleNamespace(_text_turn_end_ids=frozenset({7}))
    asked = lambda **kw: ChatRequest(id="r", model="m", messages=(Message("user", "hi"),), **kw)  # noqa: E731
    assert ClientBase.turn_stop_ids(client, asked()) == {7}
    assert ClientBase.turn_stop_ids(client, asked(tools=(TOOL,), tool_choice=ToolChoice("none"))) == {7}
    for choice in (ToolChoice("auto"), ToolChoice("required"), ToolChoice("tool", "search")):
        assert ClientBase.turn_stop_ids(client, asked(tools=(TOOL,), tool_choice=choice)) == frozenset()


def test_a_turn_stop_id_ends_generation_as_the_models_own_end(tiny_qwen):
    """The engine loop stops at a request's turn stop id with reason "stop" (not a client stop sequence), and the
    marker is not output text: the next prompt writes it after the text, as the model's EOS."""
    (marker,) = encode("<tool_call>")  # one added token in the Qwen vocabulary, standing for `<|message_sep|>`
    script = encode(" one two") + [marker] + encode(" three four") + [IM_END]
    with echo_model(tiny_qwen.model, script):
        went_on = _run(tiny_qwen, encode("Say:") + script[:1], frozenset())
        stopped = _run(tiny_qwen, encode("Say:") + script[:1], frozenset({marker}))
    assert went_on == (" two<tool_call> three four", "stop", len(script) - 1)
    assert stopped == (" two", "stop", 2)


def _run(tiny_qwen, prompt: list[int], turn_stop_ids: frozenset[int]):
    engine = EngineLoop(ModelRunner(tiny_qwen.model), tiny_qwen.tokenizer, STOP_IDS)
    events = run_to_the_end(engine, prompt_ids=tuple(prompt), sampling=GREEDY, max_tokens=20,
                            turn_stop_ids=turn_stop_ids)
    engine.shutdown()
    finished = events[-1]
    return ("".join(e.text for e in events if isinstance(e, TextDelta)), finished.reason.value,
            finished.usage.completion_tokens)
