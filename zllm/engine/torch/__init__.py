"""The torch backend: transformers models on torch, the only package that imports torch or transformers.

    loader.py       a safetensors (or GGUF, dequantized) model directory → TorchModel (backend.py)
    backend.py      TorchModel: the backend object the runtime holds (engine, tokenizer, facts, cache, drafter)
    runner.py       ModelRunner: the engine seam (engine/contract.py) over a DynamicCache per sequence
    packed.py       several rows in one forward;  kv_layers.py: DynamicCache layers over pooled buffers
    sampling.py     the sampling kernels for torch logits (engine/sampler.py holds the rule)
    draft_model.py  a small causal LM as the speculative drafter
    cache/          the prefix cache over per-layer tensors: radix tree, pooled buffers, tensor SSD snapshots
"""

from zllm.engine.torch import sampling  # noqa: F401  (registers torch's sampling kernels: engine/sampler.py)
