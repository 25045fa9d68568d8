"""One `response.create`, shared by HTTP and WebSocket: decode → find the chain → submit → an encoder that
records the response when it finishes.

    turn = await begin_turn(body, engine=engine, chain=chain, namespace=ns)   # raises before any event
    turn.stream is None         → `generate: false`: send `turn.encoder.prewarm()`, nothing runs
    (`prompt_cache_options.prewarm` runs a prefill-only request: a stream like any other, with no output)
    else                        → send `turn.encoder.start()`, then `turn.encoder.feed(event)` per event

Everything that can be the client's fault (bad body, unknown previous response, unknown model, prompt too
long) raises here, before a stream exists, so it is answered as a plain error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from zllm import ids
from zllm.api.cache_diagnostics import (
    CacheDiagnostics,
    comparison_response_id,
    responses_diagnostics,
    responses_options_echo,
)
from zllm.api.collect import StreamedAnswer, run_to_finish
from zllm.api.openai_responses import wire
from zllm.api.openai_responses.chain import ResponseChain
from zllm.api.openai_responses.compaction_turn import CompactionEventEncoder, summary_request
from zllm.api.openai_responses.decode import (
    Plan,
    ResponsesCall,
    chat_request,
    decode_responses_request,
    plan_turn,
)
from zllm.api.openai_responses.encode import ResponseEventEncoder
from zllm.api.openai_responses.items import decode_input
from zllm.api.openai_responses.response_object import response_shell
from zllm.canonical import EngineClient, Message, RequestStream
from zllm.errors import InvalidRequest
from zllm.store import StoredResponse

_TERMINAL_TYPES = frozenset(wire.TERMINAL_EVENTS.values())


@dataclass
class Turn:
    call: ResponsesCall
    encoder: ResponseEventEncoder
    stream: RequestStream | None  # None for `generate: false`


async def begin_turn(body: dict, *, engine: EngineClient, chain: ResponseChain, namespace: str,
                     diagnostics: CacheDiagnostics | None = None) -> Turn:
    """`diagnostics`: where prompt fingerprints are kept (None: no `prompt_cache_diagnostics`)."""
    call = decode_responses_request(body, seal=chain.seal)
    cache_options, compared = comparison_response_id(body)
    previous = await chain.previous(call.previous_response_id, namespace)
    plan = plan_turn(call, previous)
    response_id, created_at = ids.new_id(wire.RESPONSE_ID), int(time.time())
    compacting = call.input.compaction_trigger

    def record(response: dict) -> None:
        # a compaction replaces the history: a turn chained to it continues from the summary alone
        history = () if compacting else plan.conversation
        chain.remember(_stored(response, history, plan, namespace, created_at, chain), persist=call.store)

    shell = response_shell(response_id, model=call.model, created_at=created_at, echo=call.echo)
    if compacting:
        encoder = CompactionEventEncoder(shell, plan.tools, seal=chain.seal, on_finish=record)
    else:
        encoder = ResponseEventEncoder(shell, plan.tools, encrypted_reasoning=call.encrypted_reasoning,
                                       on_finish=record)
    if compacting and call.prewarm:
        raise InvalidRequest("`prompt_cache_options.prewarm` cannot run a compaction", param="prompt_cache_options")
    if not call.generate and not call.prewarm:
        # checked as `submit` checks a turn; a kept one is held to a turn's window too (or the store fills with
        # the unusable)
        kept = call.store and plan.conversation
        await engine.check(call.model, chat_request(call, plan, request_id=ids.request_id(), namespace=namespace)
                           if kept else None)
        return Turn(call, encoder, None)
    build = summary_request if compacting else chat_request
    request = build(call, plan, request_id=ids.request_id(), namespace=namespace)
    stream = await engine.submit(request)
    if diagnostics is not None:
        diagnosis = await diagnostics.note(engine, stream, namespace=namespace, response_id=response_id,
                                           previous_id=compared)
        if cache_options is not None:
            encoder.response["prompt_cache_options"] = responses_options_echo(cache_options, compared)
        if diagnosis is not None:
            encoder.response["prompt_cache_diagnostics"] = responses_diagnostics(diagnosis)
    return Turn(call, encoder, stream)


async def collect(turn: Turn) -> dict:
    """Run the turn to its end without streaming; the final response object (or the engine's error)."""
    if turn.stream is None:
        return turn.encoder.prewarm()[-1]["response"]
    terminal = TerminalResponse()
    answer = StreamedAnswer(turn.encoder, terminal)
    await run_to_finish(turn.stream, answer.feed)
    if terminal.cancelled:
        return terminal.result()  # cancelled: the caller gets what was generated (other ABORTs raise)
    return answer.result()


class TerminalResponse:
    """Responses stream events → the response object the terminal event carries (the encoder builds it)."""

    def __init__(self) -> None:
        self._response: dict | None = None

    def apply(self, event: dict) -> None:
        if event["type"] in _TERMINAL_TYPES:
            self._response = event["response"]

    @property
    def cancelled(self) -> bool:
        return self._response is not None and self._response["status"] == wire.STATUS_CANCELLED

    def result(self) -> dict:
        assert self._response is not None, "the encoder answers every completed Finished with a terminal event"
        return self._response


def _stored(response: dict, history: tuple[Message, ...], plan: Plan, namespace: str, created_at: int,
            chain: ResponseChain) -> StoredResponse:
    # The output is read back with the same item decoder a client's echo goes through, so a chained turn
    # and a resent history yield the same canonical messages.
    return StoredResponse(
        id=response["id"],
        namespace=namespace,
        created_at=created_at,
        input_messages=history,
        output_messages=decode_input(response["output"], "output", seal=chain.seal).messages,
        input_tools=plan.input_tools,
        response=response,
    )
