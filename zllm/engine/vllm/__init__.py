"""The vLLM backend: zllm's front half (APIs, dialects, fences, stop rules, diagnostics) in front of a vLLM server,
which owns scheduling, sampling and the KV cache. The only package that speaks to vLLM (HTTP, aiohttp).

    server.py   start / supervise / stop a vLLM server, or attach to one (`zllm serve --backend vllm`)
    wire.py     the token-in / token-out request body and its SSE chunks (`/inference/v1/generate`)
    client.py   VllmEngineClient: the API layer's EngineClient and the control layer's ServedEngine
"""
