"""Render a canonical `ChatRequest` to the exact prompt token ids the model sees.

The model's tool dialect (zllm/dialects) owns the text: it injects the tool instructions, renders past calls
and results as the model itself writes them, and either hands plain `{"role", "content"}` messages to the
model's own chat template (Jinja, `tokenizer.apply_chat_template`) for the framing or writes the framing itself
(DeepSeek DSML). The text is then encoded with `add_special_tokens=False`, so special-token text
(`<|im_start|>`, `<s>`) becomes one special token each and nothing is added twice. A tokenizer that normally
prepends BOS gets it here only when the text did not already start with it.

Which dialect: `choose_dialect` (dialects/registry.py) from the tokenizer's added tokens and template, unless
the caller passes one (`--dialect`). The request's reasoning switch is resolved against the family's default.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from zllm.canonical import ChatRequest, Message
from zllm.diagnosis.busters import drop_billing_headers
from zllm.dialects import Conversation, Dialect
from zllm.dialects.registry import DialectChoice, TokenizerFacts, choose_dialect
from zllm.errors import ConfigError, ContextLengthExceeded, InvalidRequest
from zllm.prompt.length_bound import LengthBound
from zllm.prompt.prefix_encode import PrefixReusingEncoder


@dataclass(frozen=True)
class RenderedPrompt:
    token_ids: tuple[int, ...]
    # the template's text output (before BOS repair), for traces and debugging
    text: str
    # per-session lines removed before rendering because they defeat the prefix cache (zllm/diagnosis/busters.py)
    dropped: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.token_ids)


class PromptRenderer:
    """Turns canonical requests into prompt token ids with one model's tokenizer and chat template.

    Safe to call from several threads (the tokenizer's Rust encoder is); its only state is the encoder's memory of
    recent prompts, which changes how fast a prompt is tokenized, never its ids.
    """

    def __init__(self, tokenizer, dialect: Dialect | DialectChoice | None = None, *,
                 dialect_override: str | None = None):
        """`dialect` None: chosen from the tokenizer (or by name with `dialect_override`, e.g. config)."""
        if dialect is None:
            dialect = choose_dialect(tokenizer_facts(tokenizer), dialect_override)
        self.choice = dialect if isinstance(dialect, DialectChoice) else DialectChoice(dialect, "given by the caller")
        self.dialect = self.choice.dialect
        self._template = _template_of(tokenizer)
        if self._template is None and self.dialect.needs_chat_template:
            raise ConfigError(f"the model's tokenizer has no chat template and dialect {self.dialect.name} needs one",
                              hint="use an instruct/chat model, or a dialect that renders its own framing")
        self.tokenizer = tokenizer
        self._encoder = PrefixReusingEncoder(tokenizer)  # a continuing conversation: only its new text is encoded
        self._bos_id = _default_bos_id(tokenizer)

    @property
    def chat_template(self):
        """The model's template as the dialect renders through it (None: the dialect writes the framing)."""
        return self._template

    def thinking(self, request: ChatRequest) -> bool:
        """Whether this request's output opens with reasoning (the parser and the fence must agree with it)."""
        return self.dialect.wants_thinking(request.thinking)

    def render(self, request: ChatRequest, *, window: int | None = None) -> RenderedPrompt:
        """`window`: refuse (`ContextLengthExceeded`) a prompt that its length alone proves cannot leave room in
        a window of that many tokens, before it is tokenized (see length_bound.py)."""
        messages, dropped = drop_billing_headers(request.messages)
        text = self._render_messages(request, messages)
        if window is not None:
            self._refuse_hopeless(text, window)
        ids = self._encoder.encode(text)
        if self._bos_id is not None and ids[:1] != [self._bos_id]:
            ids = [self._bos_id, *ids]
        return RenderedPrompt(token_ids=tuple(ids), text=text, dropped=dropped)

    @cached_property
    def length_bound(self) -> LengthBound | None:
        """Read off the vocabulary once (it walks every token), on the first request that needs it."""
        return LengthBound.of(self.tokenizer)

    def _refuse_hopeless(self, text: str, window: int) -> None:
        bound = self.length_bound
        if bound is None:
            return
        # the same rule as after tokenizing: the prompt must leave room for one token (so a bound of `window`
        # already refuses; counting on to window + 1 makes the message read true: "at least 8193 > 8192")
        at_least = bound.min_tokens(text, enough=window + 1)
        if at_least >= window:
            raise ContextLengthExceeded(at_least, window, at_least=True)

    def template_text(self, request: ChatRequest, messages: tuple[Message, ...], *, tools: bool = True,
                      add_generation_prompt: bool = True) -> str:
        """The template's text for `messages` (already free of cache busters) with `request`'s tools or none,
        with or without the generation prompt: the partial renders zllm/diagnosis/segments.py compares."""
        return self._render_messages(request, messages, tools=tools, add_generation_prompt=add_generation_prompt)

    def token_starts(self, text: str) -> list[int]:
        """Where each token of the prompt ids for `text` (as `render` builds them) starts in `text`: exact with
        a fast tokenizer's offsets, else approximated by the decoded length of each token. A BOS this renderer
        adds starts at 0."""
        try:
            encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            ids, starts = list(encoded["input_ids"]), [start for start, _ in encoded["offset_mapping"]]
        except (NotImplementedError, KeyError, TypeError):  # a slow (Python) tokenizer has no offsets
            ids, starts, at = self.tokenizer.encode(text, add_special_tokens=False), [], 0
            for token_id in ids:
                starts.append(at)
                at += len(self.tokenizer.decode([token_id]))
        if self._bos_id is not None and ids[:1] != [self._bos_id]:
            starts = [0, *starts]
        return starts

    def _render_messages(self, request: ChatRequest, messages: tuple[Message, ...], *, tools: bool = True,
                         add_generation_prompt: bool = True) -> str:
        if not messages:
            raise InvalidRequest("nothing to render once per-session header lines are removed", param="messages")
        conversation = Conversation(messages=messages, tools=request.tools if tools else (),
                                    thinking=self.thinking(request), add_generation_prompt=add_generation_prompt,
                                    reasoning_effort=request.reasoning_effort)
        return self.dialect.render(conversation, self._template)

    def count(self, request: ChatRequest) -> int:
        return len(self.render(request).token_ids)


class _TemplateAdapter:
    """The tokenizer's Jinja chat template as a dialects.ChatTemplate (plain messages in, text out)."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __call__(self, messages: list[dict[str, str]], *, add_generation_prompt: bool) -> str:
        try:
            return self._tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                       tokenize=False)
        except Exception as exc:  # jinja2 TemplateError ("roles must alternate", raise_exception(...)), etc.
            raise InvalidRequest(f"the model's chat template rejected the conversation: {exc}",
                                 param="messages") from exc


def _template_of(tokenizer) -> _TemplateAdapter | None:
    return _TemplateAdapter(tokenizer) if getattr(tokenizer, "chat_template", None) else None


def tokenizer_facts(tokenizer) -> TokenizerFacts:
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return TokenizerFacts(added_tokens=frozenset(token.content for token in added.values()),
                          chat_template=getattr(tokenizer, "chat_template", None) or None,
                          bos_token=_token_text(tokenizer, "bos_token"), eos_token=_token_text(tokenizer, "eos_token"))


def _token_text(tokenizer, attribute: str) -> str:
    # transformers' tokenizers have `eos_token`; prompt/tokenizer_files.py's (the llama.cpp path, `zllm dialect`)
    # only its special_tokens_map: without this a derived Mistral template rendered no `</s>` after a turn
    value = getattr(tokenizer, attribute, None) or (getattr(tokenizer, "special_tokens_map", None) or {}).get(attribute)
    return value if isinstance(value, str) else ""


def _default_bos_id(tokenizer) -> int | None:
    """BOS id when this tokenizer prepends BOS by default (Llama/SentencePiece style), else None."""
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos_id is None:
        return None
    with_specials = tokenizer.encode("a", add_special_tokens=True)
    return bos_id if with_specials[:1] == [bos_id] else None
