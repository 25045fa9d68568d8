"""What the Responses routes share through the app (aiohttp `AppKey`s)."""

from __future__ import annotations

from aiohttp import web

from zllm.api.openai_responses.chain import BackgroundStore
from zllm.api.openai_responses.compaction_seal import CompactionSeal
from zllm.api.openai_responses.in_flight import InFlightResponses

RESPONSES = web.AppKey("zllm.responses.store", BackgroundStore)
IN_FLIGHT = web.AppKey("zllm.responses.in_flight", InFlightResponses)
SEAL = web.AppKey("zllm.responses.compaction_seal", CompactionSeal)


def store_of(request: web.Request) -> BackgroundStore:
    return request.app[RESPONSES]


def in_flight_of(request: web.Request) -> InFlightResponses:
    return request.app[IN_FLIGHT]


def seal_of(request: web.Request) -> CompactionSeal:
    return request.app[SEAL]
