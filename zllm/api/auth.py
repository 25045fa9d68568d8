"""API keys: the auth middleware, and the cache namespace derived from the key a client presents.

Clients send the key as `Authorization: Bearer K` (OpenAI SDKs, and the Anthropic SDK too) or `x-api-key: K`
(Claude Code). Both are accepted on every route. `/health`, `/healthz` and `/` (Ollama clients' "is it
running" probe) stay open.
"""

from __future__ import annotations

import hashlib
import hmac

from aiohttp import web

from zllm.api.errors import Unauthorized

PUBLIC_PATHS = frozenset({"/health", "/healthz", "/"})


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


def namespace_for_key(key: str | None) -> str:
    """A short, stable, non-reversible tag for `key`; "" for no key.

    Requests with different keys get different namespaces, so one client's prefix cache is never matched
    by another's prompt (the cache would otherwise leak timing about what others sent).
    """
    if not key:
        return ""
    return hashlib.sha256(b"zllm-namespace\0" + key.encode()).hexdigest()[:16]


def request_namespace(request: web.Request) -> str:
    keys = presented_keys(request)
    return namespace_for_key(keys[0] if keys else None)


def auth_middleware(api_key: str):
    """Require `api_key` on every non-public route; compared in constant time."""
    expected = api_key.encode()

    @web.middleware
    async def check_api_key(request: web.Request, handler):
        if request.path not in PUBLIC_PATHS:
            presented = presented_keys(request)
            if not presented:
                raise Unauthorized("missing API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`")
            if not any(hmac.compare_digest(key.encode(), expected) for key in presented):
                raise Unauthorized("incorrect API key provided")
        return await handler(request)

    return check_api_key
