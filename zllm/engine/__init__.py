"""torch + transformers: load a model, run prefill/decode forwards, sample. Tensors in, tensors out.

No JSON, no protocol names, no chat templates (those live in prompt/), no scheduling (runtime/).
"""

from zllm.engine.loader import LoadedModel, load_model, resolve_device, resolve_dtype
from zllm.engine.runner import ModelRunner
from zllm.engine.sampler import Sampler, SamplingConfig

__all__ = ["LoadedModel", "ModelRunner", "Sampler", "SamplingConfig", "load_model", "resolve_device", "resolve_dtype"]
