"""The engine-owner loop and everything per request around it: detokenizer, stop conditions, the client.

No JSON and no protocol names here; events are `zllm.canonical` events.
"""

from __future__ import annotations

__all__ = ["LocalEngineClient", "LocalRequestStream"]


def __getattr__(name: str):
    # lazy: the daemon imports `zllm.runtime.trace` to open its control socket while the model loads (`zllm
    # status` says "loading"), and that must not wait for the client's engine imports (torch, transformers)
    if name in __all__:
        from zllm.runtime import client

        return getattr(client, name)
    raise AttributeError(f"module 'zllm.runtime' has no attribute {name!r}")
