"""The engine seam (contract.py: step-level backends; loaded.py: the one backend object the runtime holds) and
its backends, each one package: torch + transformers (torch/) and llama.cpp (llamacpp/). Tensors in, tensors out.

No JSON, no protocol names, no chat templates (those live in prompt/), no scheduling (runtime/). Only a backend's
package imports its engine library: torch and transformers are imported inside engine/torch/ only.
"""
