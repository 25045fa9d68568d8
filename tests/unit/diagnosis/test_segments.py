"""Prompt segments: which message (or the tools, or the generation prompt) a token index falls in."""

from zllm.canonical import ChatRequest, FunctionTool, Message, ToolCall
from zllm.diagnosis.segments import describe_position, map_segments, position_describer
from zllm.prompt import PromptRenderer

IM_START, IM_END = 151644, 151645
WEATHER = FunctionTool("get_weather", "Weather for a city",
                       {"type": "object", "properties": {"city": {"type": "string"}}})


def chat(*messages: Message, tools: tuple[FunctionTool, ...] = ()) -> ChatRequest:
    return ChatRequest(id="req_1", model="tiny", messages=messages, tools=tools)


def index_of(tokenizer, ids, text: str) -> int:
    """The token that completes the first occurrence of `text` (its last token)."""
    for i in range(1, len(ids) + 1):
        if text in tokenizer.decode(ids[:i]):
            return i - 1
    raise AssertionError(f"{text!r} not in the prompt")


AGENT = chat(
    Message("system", "You are a careful agent."),
    Message("user", "Weather in Paris?"),
    Message("assistant", "", tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)),
    Message("tool", "sunny", tool_call_id="call_1", name="get_weather"),
    Message("assistant", "It is sunny in Paris."),
    Message("user", "And in Rome tomorrow?"),
    tools=(WEATHER,),
)


def test_each_token_is_named_after_its_message_tools_or_the_generation_prompt(qwen_tokenizer) -> None:
    renderer = PromptRenderer(qwen_tokenizer)
    ids = renderer.render(AGENT).token_ids
    where = {text: describe_position(renderer, AGENT, index_of(qwen_tokenizer, ids, text))
             for text in ("careful agent", "# Tools", '"Weather for a city"', "Weather in Paris",
                          '"arguments": {"city": "Paris"}', "sunny\n", "It is sunny", "Rome tomorrow")}
    assert where == {
        "careful agent": "system",
        "# Tools": "tools",
        '"Weather for a city"': "tools",
        "Weather in Paris": "message 1 (user)",
        '"arguments": {"city": "Paris"}': "message 2 (assistant tool call)",
        "sunny\n": "message 3 (tool result)",
        "It is sunny": "message 4 (assistant)",
        "Rome tomorrow": "message 5 (user)",
    }
    # the last turn's <|im_end|> closes message 5; what follows is the generation prompt
    assert describe_position(renderer, AGENT, len(ids) - 4) == "message 5 (user)"
    assert [describe_position(renderer, AGENT, i) for i in range(len(ids) - 3, len(ids))] == \
        ["generation prompt"] * 3
    assert describe_position(renderer, AGENT, len(ids)).startswith("past the end of the prompt")


def test_segments_are_contiguous_and_in_message_order(qwen_tokenizer) -> None:
    renderer = PromptRenderer(qwen_tokenizer)
    ids = renderer.render(AGENT).token_ids
    describe = position_describer(renderer, AGENT)
    runs: list[str] = []
    for i in range(len(ids)):
        name = describe(i)
        if not runs or runs[-1] != name:
            runs.append(name)
    assert runs == ["system", "tools", "system", "message 1 (user)", "message 2 (assistant tool call)",
                    "message 3 (tool result)", "message 4 (assistant)", "message 5 (user)", "generation prompt"]
    # each <|im_start|> opens its message's segment; each <|im_end|> closes it
    starts = [i for i, token in enumerate(ids) if token == IM_START]
    assert [describe(i) for i in starts] == ["system", "message 1 (user)", "message 2 (assistant tool call)",
                                             "message 3 (tool result)", "message 4 (assistant)", "message 5 (user)",
                                             "generation prompt"]
    ends = [i for i, token in enumerate(ids) if token == IM_END]
    assert [describe(i) for i in ends] == ["system", "message 1 (user)", "message 2 (assistant tool call)",
                                           "message 3 (tool result)", "message 4 (assistant)", "message 5 (user)"]


def test_without_a_system_message_or_tools(qwen_tokenizer) -> None:
    renderer = PromptRenderer(qwen_tokenizer)
    request = chat(Message("user", "first question"), Message("assistant", "an answer"), Message("user", "again"))
    ids = renderer.render(request).token_ids
    # the template's default system prompt comes before message 0 and counts as part of it
    assert describe_position(renderer, request, 3) == "message 0 (user)"
    assert describe_position(renderer, request, index_of(qwen_tokenizer, ids, "an answer")) \
        == "message 1 (assistant)"
    assert describe_position(renderer, request, index_of(qwen_tokenizer, ids, "again")) \
        == "message 2 (user)"


def test_message_numbers_count_a_stripped_billing_header_message(qwen_tokenizer) -> None:
    """A system message that is only a per-session header is not rendered, but keeps its number."""
    renderer = PromptRenderer(qwen_tokenizer)
    request = chat(Message("system", "x-anthropic-billing-header: cc_version=1.0"), Message("user", "hello there"),
                   Message("user", "second"))
    ids = renderer.render(request).token_ids
    assert describe_position(renderer, request, index_of(qwen_tokenizer, ids, "hello there")) \
        == "message 1 (user)"
    assert describe_position(renderer, request, index_of(qwen_tokenizer, ids, "second")) \
        == "message 2 (user)"


def test_token_starts_line_up_with_the_rendered_ids(qwen_tokenizer, llama_tokenizer) -> None:
    for tokenizer in (qwen_tokenizer, llama_tokenizer):
        renderer = PromptRenderer(tokenizer)
        prompt = renderer.render(AGENT)
        starts = renderer.token_starts(prompt.text)
        assert len(starts) == len(prompt.token_ids) and starts == sorted(starts)
        for i in (1, len(starts) // 2, len(starts) - 1):  # each token's text is where its offset says
            piece = tokenizer.decode(prompt.token_ids[i:i + 1]).strip("▁ ")
            assert prompt.text.find(piece, starts[i]) - starts[i] <= 1, (i, piece)


def test_one_token_is_named_as_the_whole_map_names_it_in_coarser_words(qwen_tokenizer) -> None:
    """The near-miss log's binary search and inspect's full map are one segmenter: they agree on every token."""
    renderer = PromptRenderer(qwen_tokenizer)
    ids = renderer.render(AGENT).token_ids
    coarse = {"system": "system", "tool": "tools", "tools": "tools"}
    segments = map_segments(renderer, AGENT)
    mapped = [coarse.get(segments.at(i).label.kind, segments.at(i).name) for i in range(len(ids))]
    assert mapped == [describe_position(renderer, AGENT, i) for i in range(len(ids))]
    assert {"system", "tools", "message 3 (tool result)", "generation prompt"} <= set(mapped)
