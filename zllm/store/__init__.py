"""Persistence that outlives the daemon: sqlite files in the state dir.

`ResponseStore` keeps OpenAI Responses (`previous_response_id` chains) as canonical messages. Imports only
`zllm.canonical` and `zllm.errors`: never the API edge, the runtime or torch (tests/unit/test_layering.py).
"""

from zllm.store.responses import ResponseStore, StoredResponse, StoreError

__all__ = ["ResponseStore", "StoreError", "StoredResponse"]
