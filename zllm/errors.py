"""One error tree for the whole daemon.

Every error a user or client can cause is a `ZllmError` with a stable `code`; the API layer maps codes to
each protocol's own error shape and HTTP status (api/errors.py), the CLI prints `error:` / `hint:` lines.
Nothing here knows about HTTP or JSON.
"""

from __future__ import annotations


class ZllmError(Exception):
    """Base of every expected failure. `code` is stable and machine-readable."""

    code = "internal_error"

    def __init__(self, message: str, *, hint: str | None = None, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.param = param


class InvalidRequest(ZllmError):
    """The request is malformed: bad JSON, a missing or ill-typed field, an impossible value."""

    code = "invalid_request"


class ModelNotFound(ZllmError):
    """The request names a model that is not in the store (or not the one being served)."""

    code = "model_not_found"

    def __init__(self, model: str, *, available: list[str] | None = None):
        hint = f"available: {', '.join(available)}" if available else "pull it first: zllm pull MODEL"
        super().__init__(f"The model `{model}` does not exist.", hint=hint, param="model")
        self.model = model


class ContextLengthExceeded(ZllmError):
    """The rendered prompt alone does not fit the model's context window. Never truncated silently."""

    code = "context_length_exceeded"

    def __init__(self, prompt_tokens: int, max_context: int, *, at_least: bool = False):
        """`at_least`: `prompt_tokens` is a lower bound, proved from the prompt's length without tokenizing it."""
        super().__init__(
            f"prompt is too long: {'at least ' if at_least else ''}{prompt_tokens} tokens > {max_context} maximum",
            hint="shorten the conversation or serve the model with a larger --context-length",
            param="messages",
        )
        self.prompt_tokens = prompt_tokens
        self.max_context = max_context


class Overloaded(ZllmError):
    """The daemon cannot take the request now (queue full, shutting down). Clients retry these."""

    code = "overloaded"


class EngineFailure(ZllmError):
    """The engine failed while running a request (a bug or an out-of-memory), not the client's fault."""

    code = "engine_error"


class PullError(ZllmError):
    """A model could not be pulled or imported; the store is left as it was."""

    code = "pull_failed"


class ConfigError(ZllmError):
    """A setting has an invalid value."""

    code = "config_error"
