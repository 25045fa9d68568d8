"""The engine-owner loop and everything per request around it: detokenizer, stop conditions, the client.

No JSON and no protocol names here; events are `zllm.canonical` events.
"""

from __future__ import annotations

__all__ = ["LocalEngineClient", "LocalRequestStream"]


def __getattr__(name: str):
    # lazy: `zllm.runtime.trace` / `report` are imported by the control socket and CLI, which must not pay for
    # importing torch and transformers (seconds) just to name a dataclass
    if name in __all__:
        from zllm.runtime import client

        return getattr(client, name)
    raise AttributeError(f"module 'zllm.runtime' has no attribute {name!r}")
