"""The engine-owner loop and everything per request around it: detokenizer, stop conditions, the client.

No JSON and no protocol names here; events are `zllm.canonical` events.
"""

from zllm.runtime.client import LocalEngineClient, LocalRequestStream

__all__ = ["LocalEngineClient", "LocalRequestStream"]
