"""The GLM-4.5 stand-in (tests/support/glm_models.py): GLM's specials over the Qwen BPE, and a tiny GLM-MoE model
that loads through zllm's loader and generates."""

from __future__ import annotations

import json

import torch

from tests.support.glm_models import (
    GLM_ADDED_TOKENS,
    glm_eos_ids,
    glm_token_id,
    glm_tokenizer,
    tiny_glm_dir,
)
from zllm.engine.torch.loader import load_model


def test_glm_tags_are_single_tokens_and_only_framing_is_special():
    tokenizer = glm_tokenizer()
    text = "[gMASK]<sop><|user|>\nhi<|assistant|>\n<think>r</think>\n<tool_call>f\n<arg_key>k</arg_key>\n" \
           "<arg_value>v</arg_value>\n</tool_call><|observation|>\n<tool_response>\nok\n</tool_response>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    for tag, _ in GLM_ADDED_TOKENS:
        if tag in text:
            assert glm_token_id(tag) in ids, tag
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    # framing tokens are skipped, the reasoning / tool / argument tags decode as text (the parser needs them)
    assert tokenizer.decode(ids, skip_special_tokens=True) == (
        "\nhi\n<think>r</think>\n<tool_call>f\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>"
        "\n<tool_response>\nok\n</tool_response>")
    assert tokenizer.encode("Hello world!", add_special_tokens=False) == [9707, 1879, 0]  # the Qwen BPE itself


def test_no_chat_template_and_glm_eos_ids():
    assert glm_tokenizer().chat_template is None  # the dialect writes GLM's framing itself
    assert glm_tokenizer().eos_token == "<|endoftext|>"
    eos = [glm_token_id("<|endoftext|>"), glm_token_id("<|user|>"), glm_token_id("<|observation|>")]
    assert glm_eos_ids() == eos
    config = json.loads((tiny_glm_dir() / "config.json").read_text())
    generation = json.loads((tiny_glm_dir() / "generation_config.json").read_text())
    assert config["eos_token_id"] == eos and generation["eos_token_id"] == eos
    assert config["architectures"] == ["Glm4MoeForCausalLM"]


def test_tiny_glm_loads_and_generates_varied_text():
    loaded = load_model(tiny_glm_dir(), device="cpu", dtype="float32", threads=1)
    prompt = loaded.tokenizer.encode("[gMASK]<sop><|user|>\nhi<|assistant|>", add_special_tokens=False)
    with torch.no_grad():
        out = loaded.model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
    new = out[0, len(prompt):].tolist()
    assert len(new) == 8 and len(set(new)) > 2  # random weights, but not one token repeated
    assert all(token < glm_token_id("<|endoftext|>") for token in new)  # special ids are never chosen
