"""The engine seam (contract.py) and its backends: torch + transformers (loader.py, runner.py, packed.py,
kv_layers.py, torch_sampling.py) and llama.cpp (llamacpp/). Tensors in, tensors out.

No JSON, no protocol names, no chat templates (those live in prompt/), no scheduling (runtime/). The names below
are imported on first use: importing `zllm.engine.<module>` for the llama.cpp path must not load torch.
"""

__all__ = ["LoadedModel", "ModelRunner", "Sampler", "SamplingConfig", "load_model", "resolve_device", "resolve_dtype"]

_HOMES = {"LoadedModel": "loaded", "ModelRunner": "runner", "Sampler": "sampler", "SamplingConfig": "sampler",
          "load_model": "loader", "resolve_device": "loader", "resolve_dtype": "loader"}


def __getattr__(name: str):
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(f"zllm.engine.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'zllm.engine' has no attribute {name!r}")
