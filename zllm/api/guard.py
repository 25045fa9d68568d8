"""Only its own clients: the checks that keep a web page the user visits from driving the daemon.

A page cannot read a cross-origin answer, but it can *send* to 127.0.0.1, and with DNS rebinding (its own
name re-resolved to 127.0.0.1) it can read too. Three checks close that, the way Ollama and the local dev
servers that were bitten by it do:

- **Host**: refused (403) unless it names what zllm serves. A rebound page still sends its own name, so a
  name must be localhost (or *.localhost), the bound address, this machine's name when serving beyond
  loopback, or one of `allowed_hosts`. An IP literal is always fine: a rebinding attack needs a name.
- **Origin**: browsers add it to cross-origin requests (SDKs and agent CLIs do not). A request carrying one
  is refused (403) unless the origin is in `allowed_origins` ("*" = any); allowed origins get CORS headers
  and their preflights answered.
- **Content type**: a body must be JSON (`application/json` or `application/*+json`), else 415. A page can
  send `text/plain` or a form without a preflight; it cannot send JSON cross-origin without one. One
  exception: the Ollama API (`/api/...`) takes what `curl -d` sends (a form type, or none) when no Origin
  says a browser sent it — Ollama's own docs and users call it that way, and Ollama reads any body as JSON.

`/health` and `/healthz` skip all three: probes come from anywhere and read nothing private.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from aiohttp import hdrs, web

from zllm.errors import ZllmError

OPEN_PATHS = frozenset({"/health", "/healthz"})
ANY = "*"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_PREFLIGHT_MAX_AGE_S = "600"


class ForeignHost(ZllmError):
    code = "forbidden_host"


class ForeignOrigin(ZllmError):
    code = "forbidden_origin"


class NotJson(ZllmError):
    code = "unsupported_media_type"


def host_name(host_header: str) -> str:
    """The name in a Host header, lowercased, without the port, brackets or a trailing dot."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    name, colon, port = host.rpartition(":")
    if colon and port.isdigit() and ":" not in name:
        host = name
    return host.rstrip(".")


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_served_host(name: str, allowed: frozenset[str]) -> bool:
    return (ANY in allowed or name in allowed or is_ip_literal(name) or name == "localhost"
            or name.endswith(".localhost"))


def is_json_type(content_type: str) -> bool:
    """`application/json` or a `+json` type, any parameters (charset) aside."""
    main, _, subtype = content_type.partition(";")[0].strip().lower().partition("/")
    return main == "application" and (subtype == "json" or subtype.endswith("+json"))


def is_curl_to_ollama(request: web.Request) -> bool:
    labelled = request.headers.get(hdrs.CONTENT_TYPE)
    return request.path.startswith("/api/") and (labelled is None or is_form_type(request.content_type))


def is_form_type(content_type: str) -> bool:
    return content_type.partition(";")[0].strip().lower() == "application/x-www-form-urlencoded"


def origin_name(origin: str) -> str:
    return origin.strip().lower().rstrip("/")


class ClientGuard:
    """`allowed_hosts`: names served besides the built-in ones (the bound address among them);
    `allowed_origins`: browser origins allowed to call the API."""

    def __init__(self, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()):
        self.allowed_hosts = frozenset(host_name(h) for h in allowed_hosts if h.strip())
        self.allowed_origins = frozenset(origin_name(o) for o in allowed_origins if o.strip())

    def origin_allowed(self, origin: str) -> bool:
        return ANY in self.allowed_origins or origin_name(origin) in self.allowed_origins

    def check(self, request: web.Request) -> None:
        host = request.headers.get(hdrs.HOST)
        if host is not None and not is_served_host(host_name(host), self.allowed_hosts):
            raise ForeignHost(f"Host {host!r} is not a name this server answers to "
                              "(serve it with --allowed-hosts / ZLLM_ALLOWED_HOSTS)")
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is not None and not self.origin_allowed(origin):
            raise ForeignOrigin(f"cross-origin requests from {origin!r} are not allowed "
                                "(allow the origin with --allowed-origins / ZLLM_ALLOWED_ORIGINS)")
        if request.method in _BODY_METHODS and request.body_exists and not is_json_type(request.content_type) \
                and not (origin is None and is_curl_to_ollama(request)):
            raise NotJson(f"the request body must be JSON (Content-Type: application/json), not "
                          f"{request.headers.get(hdrs.CONTENT_TYPE) or 'unlabelled'}")

    def middleware(self):
        @web.middleware
        async def guard(request: web.Request, handler):
            if request.path in OPEN_PATHS:
                return await handler(request)
            self.check(request)
            if request.method == "OPTIONS" and hdrs.ACCESS_CONTROL_REQUEST_METHOD in request.headers:
                return self._preflight(request)
            return await handler(request)

        return guard

    def _preflight(self, request: web.Request) -> web.Response:
        """Reached only for an allowed origin (check() refused the others)."""
        headers = {hdrs.ACCESS_CONTROL_ALLOW_METHODS: "GET, POST, DELETE, OPTIONS",
                   hdrs.ACCESS_CONTROL_MAX_AGE: _PREFLIGHT_MAX_AGE_S}
        asked = request.headers.get(hdrs.ACCESS_CONTROL_REQUEST_HEADERS)
        if asked:
            headers[hdrs.ACCESS_CONTROL_ALLOW_HEADERS] = asked
        return web.Response(status=204, headers=headers)

    async def add_cors_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        """on_response_prepare: streamed answers (SSE) get their headers before the first byte too."""
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is not None and request.path not in OPEN_PATHS and self.origin_allowed(origin):
            response.headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = origin
            response.headers.add(hdrs.VARY, hdrs.ORIGIN)

    def install(self, app: web.Application) -> None:
        app.on_response_prepare.append(self.add_cors_headers)
