"""The load-time / `zllm dialect` round trip (dialects/round_trip.py, prompt/dialect_check.py): render a probe
conversation, parse the dialect's own output, render again, compare tokens. It holds for the hand-written families
over their vocabularies, and when it does not it says what breaks."""

import logging
from types import SimpleNamespace

import pytest

from zllm.canonical import TextDelta
from zllm.dialects.hermes.dialect import HermesJson
from zllm.dialects.hermes.parse import HermesParser
from zllm.dialects.registry import DialectChoice
from zllm.dialects.round_trip import RoundTrip
from zllm.prompt.dialect_check import check_renderer, describe_dialect, round_trip_line
from zllm.prompt.renderer import PromptRenderer


@pytest.mark.parametrize("dialect", ["hermes", "qwen3"])
def test_it_holds_for_hermes_and_qwen3_over_the_qwen_vocabulary(qwen_tokenizer, dialect):
    check = check_renderer(PromptRenderer(qwen_tokenizer, dialect_override=dialect))
    # Qwen's template leaves earlier turns' reasoning out of the next prompt: a turn of text with reasoning forks
    dropped = ("after a turn of text with reasoning on, the template drops the turn's reasoning from the next prompt: "
               "the prefix cache forks at each answer") if dialect == "qwen3" else ""
    assert check == RoundTrip(True, "", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                                        "</tool_call>", dropped, text_turn_costs_only_the_answer=bool(dropped))


def test_it_holds_for_glm_and_dsml():
    from tests.support.deepseek_models import deepseek_v31_tokenizer
    from tests.support.glm_models import glm_tokenizer

    for tokenizer, name, opening in ((glm_tokenizer(), "glm45", "\n<tool_call>get_weather"),
                                     (deepseek_v31_tokenizer(), "deepseek-v3.2", "\n\n<｜DSML｜function_calls>")):
        renderer = PromptRenderer(tokenizer)
        check = check_renderer(renderer)
        assert (renderer.choice.name, check.held, check.problem) == (name, True, "")
        assert check.sample.startswith(opening)


class _BlindHermes(HermesJson):
    """Renders Hermes calls but its parser reads nothing back as a call (a mismatched dialect)."""

    def parser(self, tools, *, thinking, new_call_id):
        return _Text(thinking=False, new_call_id=new_call_id)


class _Text(HermesParser):
    def feed(self, text):
        return [TextDelta(text)]


def test_a_parser_that_misses_the_calls_is_reported(qwen_tokenizer):
    check = check_renderer(PromptRenderer(qwen_tokenizer, DialectChoice(_BlindHermes(), "test")))
    assert not check.held and "reads 0 calls back" in check.problem and "as text" in check.problem


def test_a_template_that_adds_text_before_the_output_is_reported(llama_tokenizer):
    # the Llama-2 style template writes " " + content: the model's output starts after "[/INST]", so the space
    # reads back as text and the re-rendered turn separates it from the call with "\n"
    check = check_renderer(PromptRenderer(llama_tokenizer, dialect_override="hermes"))
    assert not check.held and "prefix cache forks" in check.problem and "[/INST]" in check.problem


def test_a_template_that_rejects_the_probe_is_reported(qwen_tokenizer):
    class Refusing:
        def __call__(self, messages, *, add_generation_prompt):
            raise ValueError("roles must alternate")

    renderer = SimpleNamespace(dialect=HermesJson(), chat_template=Refusing(), tokenizer=qwen_tokenizer)
    check = check_renderer(renderer)
    assert not check.held and "does not render: roles must alternate" in check.problem


def test_the_report_says_how_the_dialect_was_found_and_when_the_template_writes_no_calls(qwen_tokenizer):
    report = describe_dialect(PromptRenderer(qwen_tokenizer, dialect_override="hermes"))
    assert report.to_json() | {"sample": ""} == {
        "dialect": "hermes", "derived": False, "reason": "set by configuration (dialect = hermes)",
        "round_trip": True, "problem": "", "sample": "", "text_turn": "", "compared": "tokens"}


def test_the_startup_line_says_what_breaks(caplog):
    from zllm.daemon import log_dialect_check

    engine = SimpleNamespace(dialect_choice=SimpleNamespace(name="hermes"),
                             dialect_check=RoundTrip(False, "the parser reads 0 calls back"))
    with caplog.at_level(logging.INFO, logger="zllm"):
        log_dialect_check(engine)
    [record] = [r for r in caplog.records if "round trip" in r.getMessage()]
    assert record.levelno == logging.WARNING and "FAILS: the parser reads 0 calls back" in record.getMessage()
    assert "served anyway" in record.getMessage()
    assert round_trip_line("hermes", RoundTrip(True)).endswith("round trip holds (render → parse → render gives "
                                                               "the same tokens)")


def test_the_startup_line_warns_when_a_turn_of_text_forks(caplog):
    from zllm.daemon import log_dialect_check

    engine = SimpleNamespace(dialect_choice=SimpleNamespace(name="derived"),
                             dialect_check=RoundTrip(True, text_turn="after a turn of text, the cache forks"))
    with caplog.at_level(logging.INFO, logger="zllm"):
        log_dialect_check(engine)
    [record] = [r for r in caplog.records if "round trip" in r.getMessage()]
    assert record.levelno == logging.WARNING and "round trip holds" in record.getMessage()
    assert "; after a turn of text, the cache forks" in record.getMessage()


def test_a_fork_that_costs_only_the_last_answer_is_said_without_a_warning(caplog):
    from zllm.daemon import log_dialect_check

    check = RoundTrip(True, text_turn="after a turn of text with reasoning on, the template drops the turn's "
                                      "reasoning", text_turn_costs_only_the_answer=True)
    engine = SimpleNamespace(dialect_choice=SimpleNamespace(name="qwen3"), dialect_check=check)
    with caplog.at_level(logging.INFO, logger="zllm"):
        log_dialect_check(engine)
    [record] = [r for r in caplog.records if "round trip" in r.getMessage()]
    assert record.levelno == logging.INFO and "drops the turn's reasoning" in record.getMessage()


def test_ps_says_when_a_turn_of_text_forks():
    from zllm.cli.ps import _round_trip
    from zllm.control.protocol import LoadedModelInfo

    info = LoadedModelInfo.from_json(LoadedModelInfo(name="m", dialect_round_trip=True,
                                                     dialect_text_turn="after a turn of text, X").to_json())
    assert _round_trip(info) == ("round trip holds (render → parse → render gives the same tokens); after a turn of "
                                 "text, X")
