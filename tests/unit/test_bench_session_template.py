"""bench/session.py gives llama-server a chat template that renders tools the way zllm's hermes dialect does, so
both servers prefill the same conversation (SmolLM2's own template drops `tools`)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import jinja2

from zllm.canonical import FunctionTool
from zllm.dialects.hermes.render import chatml, tool_spec, tools_block

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
_spec = importlib.util.spec_from_file_location("bench_session", BENCH / "session.py")
session = importlib.util.module_from_spec(_spec)
sys.modules["bench_session"] = session  # its dataclasses look their module up
_spec.loader.exec_module(session)

SMOLLM2_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                    "{% endif %}")
TOOL = FunctionTool(name="Read", description="Read a file", parameters={
    "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]})


def render(template: str, messages: list[dict]) -> str:
    """As transformers (and llama.cpp's jinja) render a chat template: trimmed blocks, tojson = json.dumps."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    return env.from_string(template).render(messages=messages, tools=[tool_spec(TOOL)], add_generation_prompt=True)


def written_template(tmp_path: Path, own: str) -> list[str]:
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    (model / "chat_template.jinja").write_text(own)
    return session.llama_template("auto", model, tmp_path)


def test_a_template_without_tools_gets_chatml_with_zllms_tool_block(tmp_path: Path) -> None:
    flags = written_template(tmp_path, SMOLLM2_TEMPLATE)
    assert flags[0] == "--chat-template-file"
    template = Path(flags[1]).read_text()
    user = {"role": "user", "content": "What does calc.py do?"}
    assert render(template, [{"role": "system", "content": "You are Claude Code."}, user]) == chatml(
        [{"role": "system", "content": "You are Claude Code.\n\n" + tools_block((TOOL,))}, user],
        add_generation_prompt=True)
    # no system message: the model's own default system prompt, then the tools (as zllm renders it)
    default = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert render(template, [user]) == chatml([{"role": "system", "content": default + "\n\n" + tools_block((TOOL,))},
                                               user], add_generation_prompt=True)


def test_a_template_that_renders_tools_is_kept(tmp_path: Path) -> None:
    assert written_template(tmp_path, "{% if tools %}{{ tools | tojson }}{% endif %}") == []


def test_compare_texts_names_the_first_differing_character(tmp_path: Path) -> None:
    """The speculative pair's answers against the plain pair's: identical, or where they first part."""
    other = tmp_path / "plain.json"
    other.write_text(json.dumps({"main1": {"zllm": "abcdef", "llama_server": "x"},
                                 "main2": {"zllm": "same", "llama_server": "y"},
                                 "main3": {"zllm": "prefix", "llama_server": "z"}}))
    mine = {"main1": {"zllm": "abcXef", "llama_server": "x"}, "main2": {"zllm": "same", "llama_server": "y"},
            "main3": {"zllm": "prefix and more", "llama_server": "z"}, "main4": {"zllm": "new", "llama_server": "n"}}
    compared = {line["step"]: line for line in session.compare_texts(mine, other)}
    assert sorted(compared) == ["main1", "main2", "main3"]  # a step only one run made is not compared
    assert compared["main1"]["first_difference"] == 3 and not compared["main1"]["identical"]
    assert compared["main2"]["identical"] and compared["main2"]["first_difference"] is None
    assert compared["main3"]["first_difference"] == len("prefix")  # one answer a prefix of the other
