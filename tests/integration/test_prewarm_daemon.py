"""Cache prewarm through the official SDKs against a real daemon: Anthropic `max_tokens: 0` and Responses
`prompt_cache_options.prewarm` prefill the prompt into the prefix cache and answer with usage and no content,
streamed and not; the same prompt plus one more turn then reads at least the warmed prompt from the cache.
Bad values are 400s in each API's shape."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.integration.conftest import TINY
from tests.support.daemon import Daemon

GREEDY = {"temperature": 0}


@pytest.fixture()
def claude(daemon: Daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.base_url, api_key="test-key", max_retries=0, timeout=60)


def prompt_size(usage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def conversation(first_user: str) -> tuple[list, list]:
    """(a first turn, the same turn answered plus one more user turn)."""
    first = [{"role": "user", "content": first_user}]
    return first, [*first, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Go on."}]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_messages_max_tokens_0_warms_the_prompt_the_next_turn_reads(claude: anthropic.Anthropic, stream) -> None:
    system = f"Warm the {'streamed' if stream else 'plain'} prompt. Be brief."  # its own prompt per case
    first, second = conversation("List the files.")
    kwargs = {"model": TINY, "max_tokens": 0, "system": system, "messages": first, "extra_body": GREEDY}
    if stream:
        with claude.messages.stream(**kwargs) as events:
            kinds = [event.type for event in events]
            warm = events.get_final_message()
        assert kinds == ["message_start", "message_delta", "message_stop"], "no content block, no text"
    else:
        warm = claude.messages.create(**kwargs)
    assert (warm.content, warm.stop_reason, warm.usage.output_tokens) == ([], "max_tokens", 0)
    warmed = prompt_size(warm.usage)
    assert warm.usage.cache_creation_input_tokens == warmed - warm.usage.cache_read_input_tokens > 0
    assert warm.usage.input_tokens == 0
    assert warmed == claude.messages.count_tokens(model=TINY, system=system, messages=first).input_tokens

    answer = claude.messages.create(model=TINY, max_tokens=2, system=system, messages=second, extra_body=GREEDY)
    assert answer.usage.cache_read_input_tokens >= warmed, "the next turn reads the whole warmed prompt"


def test_messages_negative_max_tokens_is_a_400_in_anthropics_shape(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=TINY, max_tokens=-1, messages=conversation("Hi.")[0])
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in caught.value.body["error"]["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_responses_prewarm_warms_the_prompt_the_next_turn_reads(client: openai.OpenAI, stream) -> None:
    instructions = f"Warm the {'streamed' if stream else 'plain'} input. Be brief."
    first, second = conversation("Read the plan.")
    kwargs = {"model": TINY, "instructions": instructions, "input": first, "temperature": 0,
              "prompt_cache_options": {"prewarm": True}}
    if stream:
        events = list(client.responses.create(stream=True, **kwargs))
        assert [e.type for e in events] == ["response.created", "response.in_progress", "response.completed"]
        warm = events[-1].response
    else:
        warm = client.responses.create(**kwargs)
    assert (warm.status, warm.output, warm.usage.output_tokens) == ("completed", [], 0)
    details = warm.usage.input_tokens_details
    assert details.cache_write_tokens == warm.usage.input_tokens - details.cached_tokens > 0

    answer = client.responses.create(model=TINY, instructions=instructions, input=second, temperature=0,
                                     max_output_tokens=2)
    assert answer.usage.input_tokens_details.cached_tokens >= warm.usage.input_tokens


def test_responses_prewarm_of_the_wrong_type_is_a_400_in_openais_shape(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=TINY, input="Hi.", prompt_cache_options={"prewarm": "yes"})
    assert caught.value.body["param"] == "prompt_cache_options.prewarm"
    assert "boolean" in caught.value.body["message"]
