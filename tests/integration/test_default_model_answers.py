"""The README's first example answers right: "What is the capital of France?", greedy, through a real daemon.

The default model (SmolLM2-135M-Instruct) ships as Q4_1, and on llama.cpp's quantized kernels it answers
"L'Étoile, la Marseillaise, …"; the store keeps it re-encoded as F16, which answers "The capital of France
is Paris." Here a store holds the default as an older zllm stored it (the Q4_1 file), and `zllm serve` with
no model must upgrade it — offline, from the stored file — and answer right.
"""

from __future__ import annotations

import openai
import pytest

pytest.importorskip("llama_cpp")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # the first run fetches the default GGUF from PyPI

from tests.support.daemon import Daemon  # noqa: E402
from tests.support.default_gguf import NAME, old_default_data_dir  # noqa: E402
from zllm.models import ModelStore  # noqa: E402
from zllm.models.aliases import SMOLLM2_MIRROR  # noqa: E402

README_EXAMPLE = "What is the capital of France?"


def test_serve_upgrades_the_old_q4_1_default_and_it_answers_paris(tmp_path) -> None:
    data_dir = old_default_data_dir(tmp_path / "data")
    # no network: the upgrade must come from the stored file (a mirror pull would fail at pip)
    env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "no-wheels"), "HF_ENDPOINT": "http://127.0.0.1:9"}
    daemon = Daemon(data_dir, None, env=env).wait_ready(timeout=600)
    try:
        (model,) = daemon.control().ps()
        assert (model.backend, model.quantization) == ("llamacpp", "F16")
        assert "re-encoding it as F16" in daemon.log()
        client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
        reply = client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": README_EXAMPLE}], temperature=0, max_tokens=24
        )
        assert "Paris" in reply.choices[0].message.content
    finally:
        assert daemon.stop() == 0
    manifest = ModelStore(data_dir / "models").get(NAME).manifest
    assert (manifest.quantization, manifest.source) == ("F16", SMOLLM2_MIRROR.source)
    # provenance: the wheel and the Q4_1 file it was made from, and how
    assert manifest.origin["wheel_sha256"] == SMOLLM2_MIRROR.wheel_sha256
    assert (manifest.origin["source_gguf_sha256"], manifest.origin["source_gguf_file_type"]) == (
        SMOLLM2_MIRROR.member_sha256, "Q4_1")
    assert manifest.origin["upgraded_from"] == "the stored copy" and "F16" in manifest.origin["reencoded"]
