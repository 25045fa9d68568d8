"""Send a corpus of bad requests (tests/support/bad_requests.py) to a daemon at once, and judge each answer.

    outcomes = asyncio.run(send_all(base_url, cases, concurrency=12, timeout_s=30))
    failures = [(o, why) for o in outcomes if (why := failure(o))]

An answer fails when it is a 5xx, a server error inside a stream (SSE or WebSocket event), Python exception
text anywhere in it, or no answer within the timeout (a hang). A well-shaped 4xx and a served 2xx both pass.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass

import aiohttp

from tests.support.bad_requests import PATHS, BadRequest

# an exception's text as Python prints it ("ValueError: Overflow…", "Traceback (most recent call last)")
_EXCEPTION_TEXT = re.compile(r"Traceback \(most recent call last\)|\b[A-Z][A-Za-z]*(?:Error|Exception): ")
_SERVER_ERROR_TYPES = ('"server_error"', '"api_error"', '"internal_error"', '"engine_error"')
_WS_TERMINAL = frozenset({"error", "response.completed", "response.failed", "response.incomplete"})
# frames of one socket that the server may close on (too big, not UTF-8): a normal, non-5xx end
_WS_CLIENT_FAULT_CLOSES = frozenset({1000, 1002, 1003, 1007, 1009})


@dataclass(frozen=True)
class Outcome:
    case: BadRequest
    status: int | None   # HTTP status; for a WebSocket frame its error event's status, 200 when served
    text: str            # the answer (body, or the frames a WebSocket case got back)
    hung: bool = False
    close_code: int | None = None  # the WebSocket was closed by the server while answering this frame


def failure(outcome: Outcome) -> str | None:
    """Why `outcome` is a failure of the server, or None when it is an acceptable answer."""
    if outcome.hung:
        return "no answer within the timeout"
    if outcome.status is not None and outcome.status >= 500:
        return f"HTTP {outcome.status}"
    if outcome.close_code is not None and outcome.close_code not in _WS_CLIENT_FAULT_CLOSES:
        return f"websocket closed with {outcome.close_code}"
    if any(marker in outcome.text for marker in _SERVER_ERROR_TYPES):
        return "a server error in the answer"
    if _EXCEPTION_TEXT.search(outcome.text):
        return "Python exception text in the answer"
    return None


async def send_all(base_url: str, cases: list[BadRequest], *, concurrency: int, timeout_s: float,
                   ws_connections: int = 4) -> list[Outcome]:
    """Every case, HTTP ones `concurrency` at a time, WebSocket frames over `ws_connections` sockets."""
    http = [case for case in cases if case.api in PATHS]
    frames = [case for case in cases if case.api == "ws"]
    slots = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def one(case: BadRequest) -> Outcome:
            async with slots:
                return await post(session, base_url, case, timeout)

        shares = [frames[i::ws_connections] for i in range(ws_connections)]
        results = await asyncio.gather(*(one(case) for case in http),
                                       *(send_frames(session, base_url, share, timeout_s) for share in shares))
    outcomes = [r for r in results[:len(http)]]
    for share in results[len(http):]:
        outcomes += share
    return outcomes


async def post(session: aiohttp.ClientSession, base_url: str, case: BadRequest,
               timeout: aiohttp.ClientTimeout) -> Outcome:
    try:
        async with session.post(base_url + PATHS[case.api], data=case.body, timeout=timeout,
                                headers={"Content-Type": "application/json"}) as response:
            return Outcome(case, response.status, await response.text(errors="replace"))
    except TimeoutError:
        return Outcome(case, None, "", hung=True)


async def send_frames(session: aiohttp.ClientSession, base_url: str, cases: list[BadRequest],
                      timeout_s: float) -> list[Outcome]:
    """Each case as one frame, in order, on one socket (a new one after the server closes it)."""
    outcomes: list[Outcome] = []
    ws = None
    try:
        for case in cases:
            if ws is None or ws.closed:
                ws = await session.ws_connect(base_url.replace("http", "ws", 1) + PATHS["responses"],
                                              max_msg_size=0)
            try:
                outcomes.append(await asyncio.wait_for(_exchange(ws, case), timeout_s))
            except TimeoutError:
                outcomes.append(Outcome(case, None, "", hung=True))
                await ws.close()
    finally:
        if ws is not None:
            await ws.close()
    return outcomes


async def _exchange(ws: aiohttp.ClientWebSocketResponse, case: BadRequest) -> Outcome:
    try:
        text = case.body.decode("utf-8")
    except UnicodeDecodeError:  # no WebSocket text frame can carry invalid UTF-8: send it as binary
        await ws.send_bytes(case.body)
    else:
        await ws.send_str(text)
    frames: list[str] = []
    while True:
        message = await ws.receive()
        if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
            return Outcome(case, None, "\n".join(frames), close_code=ws.close_code or 1006)
        if message.type == aiohttp.WSMsgType.ERROR:
            return Outcome(case, None, "\n".join(frames), close_code=1006)
        frames.append(message.data)
        event = json.loads(message.data)
        if event.get("type") in _WS_TERMINAL:
            status = event.get("status", 200) if event["type"] == "error" else 200
            return Outcome(case, status, "\n".join(frames))
