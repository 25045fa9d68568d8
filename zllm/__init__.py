"""zllm: a local LLM serving daemon for coding agents."""

__version__ = "0.1.0"
