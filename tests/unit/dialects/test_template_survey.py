"""Issue 21's bar over llama.cpp's 70 chat templates (tests/support/template_survey.py): which write tool calls, which
dialect each is served with (the registry's choice over a vocabulary carrying the template's markers), and whether
the load-time round trip holds. The lists below are the measured state: a template that starts (or stops) holding
fails here until the list says so. Printed with -s (`python -m tests.support.template_survey` prints the same).
"""

from __future__ import annotations

import pytest

from zllm.dialects.round_trip import RoundTrip

# templates whose conversations never show a call's name (they drop `tool_calls`, or render no probe at all)
WRITES_NO_CALLS = {
    "HuggingFaceTB-SmolLM3-3B", "LFM2-8B-A1B", "LFM2.5-Instruct", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
    "google-gemma-2-2b-it", "ibm-granite-granite-3.3-2B-Instruct", "llama-cpp-rwkv-world",
    "microsoft-Phi-3.5-mini-instruct",
    "fireworks-ai-llama-3-firefunction-v2",  # needs a `datetime` variable neither transformers nor zllm gives
}

# write calls, served, and the load check says what breaks (one line each: why)
NOT_HOLDING = {
    # the generation prompt opens (or closes) a reasoning block the rendered turn drops: the prompt is rewritten
    # before the calls, the cache forks at each turn whatever the dialect; the calls are derived all the same
    # (Nemotron Nano v2's `<TOOLCALL>`, QwQ's Hermes JSON, the R1 distill's DeepSeek calls, Apriel 1.6's
    # `<tool_calls>`, llama.cpp's own R1, which writes a turn's calls only where it has no text:
    # test_derived_templates REASONING_DROPPED)
    "NVIDIA-Nemotron-Nano-v2", "Qwen-QwQ-32B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "Apriel-1.6-15b-Thinker-fixed", "llama-cpp-deepseek-r1",
    # writes its `Action:` instruction after the last message, so no next prompt starts with this one (the load
    # check says so, and that the calls read back); derived: calls as indented JSON
    # `{"tool_name": ..., "parameters": {...}}`, rendered with its tools (test_derived_templates AFTER_LAST_MESSAGE)
    "CohereForAI-c4ai-command-r-plus-tool_use",
}

# round-trip their calls, and fork the cache after a turn of text (the load check's `text_turn`, said in its line):
# why, in the words the check uses
_DROPS = "drops the turn's reasoning"  # earlier turns' reasoning is left out of the next prompt, by design
_DROPS_OPEN = "drops its reasoning"  # ... and the prompt's `<think>\n` with it
TEXT_TURN_FORKS = {
    **dict.fromkeys(("Apertus-8B-Instruct", "GLM-4.6", "Kimi-K2-Thinking", "LFM2.5-8B-A1B", "Qwen-Qwen3-0.6B",
                     "deepseek-ai-DeepSeek-V3.1", "google-gemma-4-31B-it", "google-gemma-4-31B-it-interleaved",
                     "inclusionai-ling-3.0-flash", "openai-gpt-oss-120b", "openbmb-MiniCPM5-1B",
                     "poolside-Laguna-XS-2.1", "poolside-Laguna-XS.2"), _DROPS),
    **dict.fromkeys(("GLM-4.7-Flash", "MiniMax-M2", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "Qwen3.5-4B", "Reka-Edge",
                     "StepFun3.5-Flash", "deepseek-ai-DeepSeek-V3.2"), _DROPS_OPEN),
    # the generation prompt closes an empty plan (reasoning off) that a turn of text never writes
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "<|START_THINKING|><|END_THIN' became",
    "Cohere2MoE": "<|START_THINKING|>' became",
    # the tools block is written before the last user message: it moves at each turn
    "Mistral-Small-3.2-24B-Instruct-2506": "[AVAILABLE_TOOLS]", "mistralai-Mistral-Nemo-Instruct-2407":
        "[AVAILABLE_TOOLS]",
}

# the registry's choice where a vocabulary token would pick a hand-written family whose calls the template
# writes otherwise (template_match.py), and where a Hermes template needs its tools to render
CHOSEN = {
    "GLM-4.6": "glm45", "GLM-4.7-Flash": "derived", "Spark2.5": "derived", "poolside-Laguna-S-2.1": "derived",
    "deepseek-ai-DeepSeek-V3.2": "deepseek-v3.2", "deepseek-ai-DeepSeek-V4": "deepseek-v4",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "derived", "deepseek-ai-DeepSeek-V3.1": "derived",
    # the prompt's reasoning block dropped from the turns: `<TOOLCALL>`, `<|START_ACTION|>` (Hermes / Qwen3 before)
    "NVIDIA-Nemotron-Nano-v2": "derived", "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "derived",
    "Cohere2MoE": "derived", "Qwen-QwQ-32B": "derived", "Apriel-1.6-15b-Thinker-fixed": "derived",
    "openai-gpt-oss-120b": "harmony", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "derived",
    "Qwen-Qwen2.5-7B-Instruct": "hermes", "LFM2.5-8B-A1B": "derived",
    # Hermes JSON calls, but the generation prompt opens the reasoning block under `enable_thinking`
    "Reka-Edge": "derived", "Bielik-11B-v3.0-Instruct": "derived", "Qwen-Qwen3-0.6B": "qwen3",
    # derived where Hermes (Command R+: no `<tool_call>` in its template) or Qwen3 (R1's `<think>`) served them
    "CohereForAI-c4ai-command-r-plus-tool_use": "derived", "llama-cpp-deepseek-r1": "derived",
}


@pytest.fixture(scope="module")
def entries():
    from tests.support.llama_templates import TemplatesUnavailable, template_dir
    from tests.support.template_survey import survey
    from tests.support.tiny_models import tiny_qwen_dir

    try:
        directory = template_dir()
    except TemplatesUnavailable as exc:
        pytest.skip(str(exc))
    found = {entry.name: entry for entry in survey(directory, tiny_qwen_dir() / "tokenizer.json")}
    print()
    for entry in sorted(found.values(), key=lambda e: (not e.writes_calls, e.holds, e.name)):
        print(entry.line())
    return found


def test_which_templates_write_calls(entries):
    assert len(entries) == 70
    assert {name for name, entry in entries.items() if not entry.writes_calls} == WRITES_NO_CALLS


def test_which_calling_templates_round_trip(entries):
    failing = {name for name, entry in entries.items() if entry.writes_calls and not entry.holds}
    assert failing == NOT_HOLDING, {name: entries[name].problem for name in failing ^ NOT_HOLDING}


def test_each_that_does_not_hold_is_served_with_the_warning(entries):
    """A calling template that cannot round-trip still loads, and the load check says what breaks (the line the
    daemon logs and `zllm ps` shows): never a silent fork."""
    from zllm.dialects.round_trip import RoundTrip
    from zllm.prompt.dialect_check import round_trip_line

    for name in NOT_HOLDING:
        entry = entries[name]
        assert entry.dialect and not entry.round_trip and entry.problem, name
        assert "round trip FAILS: " + entry.problem in round_trip_line(entry.dialect, RoundTrip(False, entry.problem))


def test_which_fork_the_cache_after_a_turn_of_text(entries):
    """The load check probes a turn of text too: where the template renders it otherwise than its prompt began it,
    the line says so (the calls' round trip is judged apart)."""
    from zllm.prompt.dialect_check import round_trip_line

    forking = {name for name, entry in entries.items() if entry.writes_calls and entry.holds and entry.text_turn}
    assert forking == set(TEXT_TURN_FORKS), {name: entries[name].text_turn for name in forking ^ set(TEXT_TURN_FORKS)}
    for name, why in TEXT_TURN_FORKS.items():
        entry = entries[name]
        assert why in entry.text_turn and "the prefix cache forks at each answer" in entry.text_turn, (name, entry)
        line = round_trip_line(entry.dialect, RoundTrip(True, text_turn=entry.text_turn))
        assert "round trip holds" in line and entry.text_turn in line
    # only a tools block that moves to the last user message forks before it (the load check warns); every other
    # fork costs the last answer alone (said at INFO)
    costly = {name for name in TEXT_TURN_FORKS if not entries[name].text_turn_costs_only_the_answer}
    assert costly == {"Mistral-Small-3.2-24B-Instruct-2506", "mistralai-Mistral-Nemo-Instruct-2407"}


def test_a_family_token_picks_a_family_only_where_the_template_writes_its_calls(entries):
    assert {name: entries[name].dialect for name in CHOSEN} == CHOSEN


def test_a_derived_template_gets_the_tokenizer_files_special_tokens():
    """prompt/tokenizer_files.py (the llama.cpp path, `zllm dialect`) keeps bos / eos in its special_tokens_map only:
    the derived dialect's template still gets them (Mistral's ends each assistant turn with `eos_token`)."""
    from tokenizers import Tokenizer, models

    from zllm.canonical import Message
    from zllm.dialects.base import Conversation
    from zllm.prompt.renderer import PromptRenderer
    from zllm.prompt.tokenizer_files import TokenizerFiles

    template = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
                "{% elif m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | map(attribute='function') | list | tojson }}"
                "{{ eos_token }}{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
                "{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}")
    files = TokenizerFiles(Tokenizer(models.BPE()), {"bos_token": "<s>", "eos_token": "</s>"}, template)
    renderer = PromptRenderer(files)
    assert renderer.choice.derived
    text = renderer.dialect.render(Conversation((Message("user", "hi"), Message("assistant", "hello")), ()))
    assert text == "<s>[INST]hi[/INST]hello</s>"
