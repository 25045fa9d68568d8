"""Call ids a model writes itself (Mistral's `[CALL_ID]a1B2c3D4e`, Nemo's `"id": "a1B2c3D4e"`): carried on the
core's id so the next turn's prompt writes the same id back, and made up for ids from elsewhere.

    with_written_id("call_3f2a", "a1B2c3D4e")   → "call_3f2a-w613142..."   (the written id, hex, after `-w`)
    template_id("call_3f2a-w613142...", fmt)    → "a1B2c3D4e"
    template_id("toolu_01ab", fmt)              → "Xq3...": nine letters and digits derived from the id, where
                                                   the template accepts no other shape (format.py STRICT_ID)

The written id rides on the id (hex: every API's id alphabet takes it, Anthropic's `[a-zA-Z0-9_-]` included)
because the id is the one part of a call every client sends back, as `ToolCall.form` does.
"""

from __future__ import annotations

import hashlib
import re

from zllm.dialects.derived.format import ID_SLOT, CallFormat

_MARK = "-w"
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def with_written_id(call_id: str, written: str) -> str:
    return f"{call_id}{_MARK}{written.encode().hex()}" if written else call_id


def written_id(call_id: str) -> str:
    """The id the model wrote, carried on `call_id` ("" when none is)."""
    head, mark, tail = call_id.rpartition(_MARK)
    if not mark or not head:
        return ""
    try:
        return bytes.fromhex(tail).decode()
    except ValueError:
        return ""


def template_id(call_id: str, fmt: CallFormat) -> str:
    """The id the template is given for a call (and for its result): the model's own where it wrote one."""
    if fmt.slot != ID_SLOT:
        return call_id
    written = written_id(call_id)
    if written:
        return written
    if fmt.id_pattern and not re.fullmatch(fmt.id_pattern, call_id):
        digest = hashlib.sha256(call_id.encode()).digest()
        return "".join(_ALPHABET[b % len(_ALPHABET)] for b in digest[:9])
    return call_id
