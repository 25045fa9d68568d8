"""`TokenizerFiles`: a model directory's tokenizer (tokenizer.json, tokenizer_config.json, its chat template) on
the `tokenizers` library and jinja2 alone, for the llama.cpp path, which must not import transformers (its
`AutoConfig` / `AutoTokenizer` import torch, resident memory a server that never runs it would carry).

It answers what zllm asks of a tokenizer (prompt/, runtime/ and the fence use these names, which are
transformers' own, so either object serves):

    encode(text, add_special_tokens=)      ids; the tokenizer.json post-processor decides what "special" adds
    tok(text, return_offsets_mapping=True) {"input_ids", "offset_mapping"}
    decode(ids, skip_special_tokens=)      backend_tokenizer: the `tokenizers.Tokenizer` itself
    apply_chat_template(messages, add_generation_prompt=, tokenize=False)
    chat_template, bos/eos_token(_id), added_tokens_decoder, get_added_vocab(), get_vocab(), all_special_ids

The chat template renders as transformers renders it: a sandboxed, immutable jinja2 environment with
trim_blocks and lstrip_blocks, loop controls, a `tojson` that keeps non-ASCII text, `raise_exception`,
`strftime_now`, a `{% generation %}` block that renders its body, and the special tokens (`bos_token`,
`eos_token`, ...) as variables. Tests compare both renderings on the suite's models.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer

from zllm.errors import ConfigError

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class TokenizerFiles:
    is_fast = True  # a Rust tokenizer (what the fence needs)

    def __init__(self, tokenizer: Tokenizer, config: dict, chat_template: str | None):
        self.backend_tokenizer = tokenizer
        self.chat_template = chat_template
        self.special_tokens_map = {name: _content(config[name]) for name in SPECIAL_TOKEN_NAMES if config.get(name)}
        self._extra_special = [_content(token) for token in config.get("additional_special_tokens") or ()]

    @classmethod
    def from_dir(cls, path: str | Path) -> TokenizerFiles:
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise ConfigError(f"{path} has no tokenizer.json", hint="pull the model again: zllm pull ...")
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        config = read_model_json(path / "tokenizer_config.json")
        _add_declared_tokens(tokenizer, config)
        return cls(tokenizer, config, _chat_template(path, config))

    # ------------------------------------------------------------------ ids and text

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str, add_special_tokens: bool = True, return_offsets_mapping: bool = False) -> dict:
        encoding = self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens)
        result: dict[str, Any] = {"input_ids": encoding.ids}
        if return_offsets_mapping:
            result["offset_mapping"] = encoding.offsets
        return result

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        return self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self.backend_tokenizer.token_to_id(token)

    # ------------------------------------------------------------------ vocabulary facts

    @cached_property
    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        return dict(self.backend_tokenizer.get_added_tokens_decoder())

    def get_added_vocab(self) -> dict[str, int]:
        return {token.content: token_id for token_id, token in self.added_tokens_decoder.items()}

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        return self._id_of("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._id_of("eos_token")

    @property
    def all_special_ids(self) -> list[int]:
        texts = [*self.special_tokens_map.values(), *self._extra_special]
        return sorted({i for i in map(self.backend_tokenizer.token_to_id, texts) if i is not None})

    def _id_of(self, name: str) -> int | None:
        text = self.special_tokens_map.get(name)
        return self.backend_tokenizer.token_to_id(text) if text else None

    # ------------------------------------------------------------------ the chat template

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = False,
                            tokenize: bool = False, tools: list[dict] | None = None, **kwargs) -> str:
        assert not tokenize, "zllm tokenizes the rendered text itself (prompt/renderer.py)"
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        return self._compiled_template.render(messages=messages, tools=tools, documents=None,
                                              add_generation_prompt=add_generation_prompt,
                                              **{**self.special_tokens_map, **kwargs})

    @cached_property
    def _compiled_template(self) -> jinja2.Template:
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                    extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return environment.from_string(self.chat_template)


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (marks assistant text for training masks): renders its body."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller) -> str:
        return caller()


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # jinja's own tojson escapes HTML characters, which no chat template wants
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                      default=_listed)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _content(token: str | dict) -> str:
    return token["content"] if isinstance(token, dict) else token


def read_model_json(path: Path) -> dict:
    """A model directory's JSON file ({} when it has none); an unreadable one is a ConfigError."""
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc


def _add_declared_tokens(tokenizer: Tokenizer, config: dict) -> None:
    """Added tokens tokenizer_config.json declares that tokenizer.json lacks (transformers adds them too)."""
    known = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    missing = [AddedToken(entry["content"], special=entry.get("special", False),
                          single_word=entry.get("single_word", False), lstrip=entry.get("lstrip", False),
                          rstrip=entry.get("rstrip", False), normalized=entry.get("normalized", False))
               for entry in (config.get("added_tokens_decoder") or {}).values() if entry["content"] not in known]
    tokenizer.add_special_tokens([token for token in missing if token.special])
    tokenizer.add_tokens([token for token in missing if not token.special])


def _chat_template(path: Path, config: dict) -> str | None:
    """The template transformers would use: chat_template.jinja, else chat_template.json, else the config's."""
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text(encoding="utf-8")
    template = read_model_json(path / "chat_template.json").get("chat_template") or config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {entry["name"]: entry["template"] for entry in template}
        return named.get("default")
    return template


def _listed(value):
    """What `tools | map(attribute='function') | tojson` hands json: a generator (llama.cpp's own DeepSeek R1
    template), written as the list it yields."""
    if hasattr(value, "__iter__") and not isinstance(value, (str, bytes, dict)):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
