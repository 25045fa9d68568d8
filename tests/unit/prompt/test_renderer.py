"""PromptRenderer: canonical request → the template's text → token ids, with tools and BOS handled right."""

import json

import pytest

from zllm.canonical import ChatRequest, FunctionTool, Message, ToolCall
from zllm.errors import ConfigError, InvalidRequest
from zllm.prompt import PromptRenderer, model_stop_token_ids

IM_START, IM_END = 151644, 151645


def chat(*messages: Message, tools: tuple[FunctionTool, ...] = ()) -> ChatRequest:
    return ChatRequest(id="req_1", model="tiny", messages=messages, tools=tools)


def test_chatml_text_and_ids(qwen_tokenizer) -> None:
    prompt = PromptRenderer(qwen_tokenizer).render(chat(Message("system", "Be brief."), Message("user", "Hi!")))
    assert prompt.text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )
    assert list(prompt.token_ids) == qwen_tokenizer.encode(prompt.text, add_special_tokens=False)
    assert prompt.token_ids[0] == IM_START and prompt.token_ids.count(IM_END) == 2
    assert qwen_tokenizer.decode(prompt.token_ids[-3:]) == "<|im_start|>assistant\n"


def test_tools_tool_calls_and_results(qwen_tokenizer) -> None:
    weather = FunctionTool("get_weather", "Weather for a city",
                           {"type": "object", "properties": {"city": {"type": "string"}}})
    request = chat(
        Message("user", "Weather in Paris?"),
        Message("assistant", "", tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)),
        Message("tool", "sunny", tool_call_id="call_1", name="get_weather"),
        tools=(weather,),
    )
    text = PromptRenderer(qwen_tokenizer).render(request).text
    assert "# Tools" in text and '"name": "get_weather"' in text and '"description": "Weather for a city"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>" in text
    ids = PromptRenderer(qwen_tokenizer).render(request).token_ids
    assert 151657 in ids and 151658 in ids  # <tool_call> / </tool_call> are single tokens


def test_no_tools_means_no_tools_section(qwen_tokenizer) -> None:
    assert "# Tools" not in PromptRenderer(qwen_tokenizer).render(chat(Message("user", "x"))).text


def test_bos_rendered_by_the_template_is_not_doubled(llama_tokenizer) -> None:
    prompt = PromptRenderer(llama_tokenizer).render(chat(Message("user", "Hello world")))
    bos = llama_tokenizer.bos_token_id
    assert prompt.text.startswith("<s>[INST]")
    assert prompt.token_ids[0] == bos and prompt.token_ids.count(bos) == 1


def test_bos_is_added_when_the_template_omits_it_and_the_tokenizer_wants_it(llama_tokenizer, monkeypatch) -> None:
    tokenizer = llama_tokenizer
    monkeypatch.setattr(tokenizer, "chat_template", "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}")
    prompt = PromptRenderer(tokenizer).render(chat(Message("user", "Hello")))
    assert prompt.token_ids[0] == tokenizer.bos_token_id and prompt.token_ids.count(tokenizer.bos_token_id) == 1


def test_qwen_gets_no_bos(qwen_tokenizer) -> None:
    assert PromptRenderer(qwen_tokenizer).render(chat(Message("user", "x"))).token_ids[0] == IM_START


def test_template_errors_are_invalid_requests(qwen_tokenizer, monkeypatch) -> None:
    template = "{{ raise_exception('Conversation roles must alternate user/assistant') }}"
    monkeypatch.setattr(qwen_tokenizer, "chat_template", template)
    with pytest.raises(InvalidRequest, match="roles must alternate"):
        PromptRenderer(qwen_tokenizer).render(chat(Message("user", "x")))


def test_no_chat_template_is_a_config_error(qwen_tokenizer, monkeypatch) -> None:
    monkeypatch.setattr(qwen_tokenizer, "chat_template", None)
    with pytest.raises(ConfigError):
        PromptRenderer(qwen_tokenizer)


def test_count_matches_render(qwen_tokenizer) -> None:
    request = chat(Message("user", "count me " * 50))
    renderer = PromptRenderer(qwen_tokenizer)
    assert renderer.count(request) == len(renderer.render(request).token_ids)


def test_tool_parameters_render_as_json(qwen_tokenizer) -> None:
    schema = {"type": "object", "properties": {"path": {"type": "string", "description": "ünïcode"}},
              "required": ["path"]}
    request = chat(Message("user", "x"), tools=(FunctionTool("read", "", schema),))
    text = PromptRenderer(qwen_tokenizer).render(request).text
    line = next(line for line in text.splitlines() if line.startswith('{"type": "function"'))
    assert json.loads(line)["function"]["parameters"] == schema


# ---------------------------------------------------------------------------------------- stop tokens


def test_qwen_stop_tokens(qwen_tokenizer) -> None:
    assert model_stop_token_ids(qwen_tokenizer, [IM_END, 151643], IM_END) == {IM_END, 151643}


def test_template_end_of_turn_is_a_stop_token_even_when_eos_is_not(qwen_tokenizer) -> None:
    # a base-model style eos; the ChatML template still ends every turn with <|im_end|>
    original = qwen_tokenizer.eos_token
    qwen_tokenizer.eos_token = "<|endoftext|>"
    try:
        assert qwen_tokenizer.eos_token_id == 151643
        assert model_stop_token_ids(qwen_tokenizer, 151643) == {151643, IM_END}
    finally:
        qwen_tokenizer.eos_token = original


def test_llama_stop_tokens(llama_tokenizer) -> None:
    assert model_stop_token_ids(llama_tokenizer, 2, None) == {2}
