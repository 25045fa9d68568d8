"""API keys: who a request is, for the auth check and for the namespace its cache and stored Responses live in.

Clients send the key as `Authorization: Bearer K` (OpenAI SDKs, and the Anthropic SDK too) or `x-api-key: K`
(Claude Code). Both are accepted on every route. `/health`, `/healthz` and `/` (Ollama clients' "is it
running" probe) stay open.

The namespace rule, pinned by tests/unit/api/test_namespaces.py:

- auth on (one or more configured keys): the namespace comes from the key the server *verified*, never from
  another header the client adds. A right key next to a wrong one is accepted and lands in the right key's
  namespace (Bearer first when both are right); a wrong key alone, or none, is 401.
- auth off: the client's own key (Bearer first) picks the namespace; no key is the shared namespace "".

A namespace id is HMAC-SHA256(the install's namespace key, key), cut to 16 hex digits: stable across restarts
(the SSD tier and the Responses store keep it; the daemon loads that key from zllm/install_secrets.py), and it
reveals nothing about the key without the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Sequence

from aiohttp import web

from zllm.api.errors import Unauthorized

PUBLIC_PATHS = frozenset({"/health", "/healthz", "/"})
NAMESPACE_SECRET = web.AppKey("namespace_secret", bytes)
# where the middleware leaves the request's namespace (a typed key from aiohttp 3.13; a string before)
_NAMESPACE = web.RequestKey("namespace", str) if hasattr(web, "RequestKey") else "zllm.namespace"


def new_namespace_secret() -> bytes:
    return os.urandom(32)


def presented_keys(request: web.Request) -> list[str]:
    """Every key the request carries, Bearer first."""
    keys = []
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        keys.append(token.strip())
    api_key_header = request.headers.get("x-api-key", "").strip()
    if api_key_header:
        keys.append(api_key_header)
    return keys


def namespace_for_key(key: str | None, secret: bytes) -> str:
    """A short, stable tag for `key` that reveals nothing without `secret`; "" for no key.

    Requests with different keys get different namespaces, so one client's prefix cache is never matched
    by another's prompt (the cache would otherwise leak timing about what others sent).
    """
    if not key:
        return ""
    return hmac.new(secret, b"zllm-namespace\0" + key.encode(), hashlib.sha256).hexdigest()[:16]


def request_namespace(request: web.Request) -> str:
    """The namespace `identity_middleware` settled for this request."""
    return request[_NAMESPACE]


def verified_key(presented: Sequence[str], accepted: Sequence[bytes]) -> str | None:
    """The first presented key that is one of `accepted`, compared in constant time against every one."""
    found = None
    for key in presented:
        encoded = key.encode()
        matches = [hmac.compare_digest(encoded, expected) for expected in accepted]
        if found is None and any(matches):
            found = key
    return found


def identity_middleware(api_keys: Sequence[str], secret: bytes):
    """With `api_keys`, require one of them on every non-public route; either way, set the namespace."""
    accepted = [key.encode() for key in api_keys]

    @web.middleware
    async def identify(request: web.Request, handler):
        presented = presented_keys(request)
        if not accepted:
            request[_NAMESPACE] = namespace_for_key(presented[0] if presented else None, secret)
        elif request.path in PUBLIC_PATHS:
            request[_NAMESPACE] = ""
        else:
            if not presented:
                raise Unauthorized("missing API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`")
            key = verified_key(presented, accepted)
            if key is None:
                raise Unauthorized("incorrect API key provided")
            request[_NAMESPACE] = namespace_for_key(key, secret)
        return await handler(request)

    return identify
