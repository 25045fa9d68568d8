"""Id minting. Ids are opaque to clients; the prefixes follow each vendor's own convention."""

from __future__ import annotations

import secrets


def new_id(prefix: str, nbytes: int = 12) -> str:
    return f"{prefix}-{secrets.token_hex(nbytes)}" if prefix.endswith("cmpl") else f"{prefix}_{secrets.token_hex(nbytes)}"


def request_id() -> str:
    return new_id("req")


def chat_completion_id() -> str:
    return new_id("chatcmpl")


def tool_call_id() -> str:
    return new_id("call")
