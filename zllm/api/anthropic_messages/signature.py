"""Signatures of the thinking blocks zllm emits, and the check of echoed ones.

    {"type": "thinking", "thinking": "The user wants…", "signature": "zllm1.Vq3m…"}

Claude Code echoes each thinking block verbatim, signature included, in the next request. The signature
tells our own reasoning apart from a foreign one (real Claude's, another server's, another model's), and
only ours goes back into the prompt as the assistant's `reasoning`: re-rendering it reproduces what this
model wrote, while a foreign chain of thought would be put in its mouth. A block whose signature does not
check is accepted and dropped, as `redacted_thinking` is.

The key is a fixed constant, not a per-daemon secret: this is a provenance tag, not a security boundary
(the client writes the whole conversation anyway, and may put any text in a `text` block). A fixed key
keeps signatures valid across daemon restarts, so a resumed session renders the same prompt tokens and
still hits the (SSD-backed) prefix cache. The model id is signed too: another model's thinking is foreign.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

SIGNATURE_PREFIX = "zllm1."
_KEY = b"zllm thinking signature v1"


def sign_thinking(model: str, thinking: str) -> str:
    digest = hmac.new(_KEY, f"{model}\0{thinking}".encode(), hashlib.sha256).digest()
    return SIGNATURE_PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def is_own_thinking(model: str, thinking: str, signature: str) -> bool:
    return hmac.compare_digest(signature.encode(), sign_thinking(model, thinking).encode())
