"""The HTTP edge: aiohttp app, SSE, error mapping, and one package per wire protocol.

Talks to the core only through `zllm.canonical.EngineClient`; never imports torch, engine/, kvcache/ or
runtime/ (tests/unit/api checks this).
"""

from zllm.api.app import bound_port, create_app, create_runner, run_server, start_site

__all__ = ["bound_port", "create_app", "create_runner", "run_server", "start_site"]
