"""`compaction` items: a conversation's history replaced by a summary the local model wrote.

    {"type": "compaction", "id": "cmp_…", "encrypted_content": "zllm.c1.<payload>.<signature>"}

OpenAI's `encrypted_content` is ciphertext only OpenAI reads; ours is zllm's own opaque form: the payload is
base64url of a versioned JSON object (`{"v": 1, "summary": "…"}`) and the signature an HMAC-SHA256 of it with
this install's compaction key (zllm/install_secrets.py). Not secret (the daemon is local and the summary is the
client's own conversation) but checked: an edited or forged item is refused with a 400 rather than put into the
prompt, and an item from another server (OpenAI's own) is refused too, since what it holds cannot be read.

Expanding an item gives one user message, the summary under a fixed header, always the same text for the
same item: the compacted prefix renders to the same tokens every turn, so it hits the prefix cache.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets

from zllm.api.summary import EXPANDED_HEADER, summary_message
from zllm.canonical import Message
from zllm.errors import InvalidRequest

__all__ = ["EXPANDED_HEADER", "CompactionRefused", "CompactionSeal"]

COMPACTION = "compaction"
COMPACTION_SUMMARY = "compaction_summary"
COMPACTION_TRIGGER = "compaction_trigger"
COMPACTION_ID = "cmp"
SEAL_PREFIX = "zllm.c1."
PAYLOAD_VERSION = 1


class CompactionRefused(InvalidRequest):
    """A compaction item zllm will not expand (a 400, as any bad input)."""


class CompactionSeal:
    """Seals summaries into `encrypted_content` and opens them again, with one install's key."""

    def __init__(self, key: bytes):
        self._key = key

    @classmethod
    def ephemeral(cls) -> CompactionSeal:
        """A key for this process only (an app without a state dir): items do not survive a restart."""
        return cls(secrets.token_bytes(32))

    def seal(self, summary: str) -> str:
        payload = _b64(json.dumps({"v": PAYLOAD_VERSION, "summary": summary}, ensure_ascii=False).encode())
        return f"{SEAL_PREFIX}{payload}.{_b64(self._sign(payload))}"

    def open(self, content: object, param: str) -> str:
        """The summary in an item's `encrypted_content`; `CompactionRefused` (400) unless this install made it."""
        if not isinstance(content, str) or not content.startswith(SEAL_PREFIX):
            raise CompactionRefused("this compaction item was not made by this zllm server, so its content cannot "
                                    "be read: start a new conversation or compact it here", param=param)
        payload, _, signature = content[len(SEAL_PREFIX):].partition(".")
        if not hmac.compare_digest(_unb64(signature, param), self._sign(payload)):
            raise CompactionRefused("this compaction item's content was changed or was not made by this zllm "
                                    "install (its signature does not match)", param=param)
        return _summary(_unb64(payload, param), param)

    def expand(self, content: object, param: str) -> Message:
        return summary_message(self.open(content, param))

    def _sign(self, payload: str) -> bytes:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).digest()


def _summary(raw: bytes, param: str) -> str:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        data = None
    # signed by this install yet unreadable: written by a later zllm with another payload version
    if not isinstance(data, dict) or data.get("v") != PAYLOAD_VERSION or not isinstance(data.get("summary"), str):
        raise CompactionRefused("this compaction item was made by another zllm version and cannot be read here",
                                param=param)
    return data["summary"]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str, param: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise CompactionRefused("this compaction item's content is malformed", param=param) from None
