"""`TokenizerFiles` (tokenizers + jinja2, the llama.cpp path's tokenizer) answers as transformers' tokenizer
answers on the same model directory: ids (with and without special tokens), offsets, decoding, special ids,
the chat template's text, and the prompt renderer's token ids for the same request."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from tests.support.tiny_gguf import SPECS, tiny_model_dir
from zllm.canonical import ChatRequest, FunctionTool, Message
from zllm.prompt import PromptRenderer
from zllm.prompt.tokenizer_files import TokenizerFiles

TEXTS = ["Hello, world!", "  spaced\tout\n\nlines ", "naïve café 日本語 🙂", "<|im_start|>user\nhi<|im_end|>", ""]
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]


@pytest.fixture(scope="module", params=SPECS)
def pair(request):
    directory = tiny_model_dir(request.param)
    return AutoTokenizer.from_pretrained(directory), TokenizerFiles.from_dir(directory)


@pytest.mark.parametrize("special", [False, True])
def test_ids_offsets_and_text_match_transformers(pair, special) -> None:
    reference, files = pair
    for text in TEXTS:
        expected = reference(text, add_special_tokens=special, return_offsets_mapping=True)
        got = files(text, add_special_tokens=special, return_offsets_mapping=True)
        assert got["input_ids"] == expected["input_ids"]
        assert [tuple(o) for o in got["offset_mapping"]] == [tuple(o) for o in expected["offset_mapping"]]
        assert files.encode(text, add_special_tokens=special) == reference.encode(text, add_special_tokens=special)
        ids = expected["input_ids"]
        assert files.decode(ids, skip_special_tokens=True) == reference.decode(
            ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_vocabulary_facts_match_transformers(pair) -> None:
    reference, files = pair
    assert (files.bos_token_id, files.eos_token_id) == (reference.bos_token_id, reference.eos_token_id)
    assert files.get_added_vocab() == reference.get_added_vocab()
    assert files.get_vocab() == reference.get_vocab()
    assert set(files.all_special_ids) == set(reference.all_special_ids)
    assert {i: (t.content, t.special) for i, t in files.added_tokens_decoder.items()} == {
        i: (t.content, t.special) for i, t in reference.added_tokens_decoder.items()}


@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_the_chat_template_renders_the_same_text(pair, add_generation_prompt) -> None:
    reference, files = pair
    if not reference.chat_template:
        pytest.skip("this tiny tokenizer has no chat template")
    assert files.chat_template == reference.chat_template
    assert files.apply_chat_template(CONVERSATION, add_generation_prompt=add_generation_prompt) == \
        reference.apply_chat_template(CONVERSATION, add_generation_prompt=add_generation_prompt, tokenize=False)


def test_the_renderer_gives_the_same_prompt_ids(pair) -> None:
    reference, files = pair
    if not reference.chat_template:
        pytest.skip("this tiny tokenizer has no chat template")
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    messages = (Message("system", "Be brief."), Message("user", "Weather in Oslo?"))
    request = ChatRequest(id="r", model="m", messages=messages, tools=(FunctionTool("get_weather", "Weather", schema),))
    expected, got = PromptRenderer(reference).render(request), PromptRenderer(files).render(request)
    assert got.text == expected.text and got.token_ids == expected.token_ids
    assert PromptRenderer(files).token_starts(got.text) == PromptRenderer(reference).token_starts(expected.text)
