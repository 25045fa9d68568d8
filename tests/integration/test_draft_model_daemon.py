"""`zllm serve --draft-model`: a draft model named by store name drafts for the served model, the output is the
greedy output of a daemon without one, and a draft with another vocabulary is refused at startup (torch); a GGUF
draft named by its .gguf path drafts on llama.cpp, its output the plain greedy one turn after turn (llama.cpp's
vocabulary check: tests/unit/engine/test_llamacpp_draft_model.py)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time

import openai
import pytest

from tests.integration.conftest import TINY, linked_data_dir
from tests.integration.test_load import tiny_gguf_data_dir
from tests.support.daemon import Daemon
from tests.support.tiny_models import tiny_llama_dir
from zllm.models import ModelStore

# echo-heavy, so a draft (here the model itself: every greedy draft is right) has something to propose
PROMPT = "Repeat exactly: alpha beta gamma delta epsilon, alpha beta gamma delta epsilon, alpha beta gamma"


def greedy_text(daemon: Daemon) -> tuple[str, int]:
    client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="k", max_retries=0, timeout=60)
    answer = client.chat.completions.create(model=TINY, messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=40, temperature=0)
    return answer.choices[0].message.content, answer.usage.completion_tokens


def finished_report(daemon: Daemon, timeout: float = 10.0) -> dict:
    """The request's finished report (published just after the client's last event: poll for it)."""
    deadline = time.monotonic() + timeout
    while True:
        finished = [r for r in daemon.control().trace(last=5) if r.get("phase") == "finished"]
        if finished or time.monotonic() > deadline:
            assert finished, "no finished report in the trace"
            return finished[-1]
        time.sleep(0.1)


def test_a_draft_model_from_the_store_gives_the_plain_greedy_output(tiny_data_dir, tmp_path) -> None:
    plain = Daemon(linked_data_dir(tiny_data_dir, tmp_path / "plain"), TINY).wait_ready()
    try:
        expected = greedy_text(plain)
    finally:
        plain.stop()
    drafted = Daemon(linked_data_dir(tiny_data_dir, tmp_path / "drafted"), TINY, "--draft-model", TINY).wait_ready()
    try:
        assert greedy_text(drafted) == expected
        report = finished_report(drafted)
        assert report["drafted_tokens"] > 0 and report["accepted_tokens"] > 0
    finally:
        drafted.stop()
    assert "Traceback" not in drafted.log()


def test_a_draft_model_with_another_vocabulary_is_refused(tiny_data_dir, tmp_path) -> None:
    data_dir = linked_data_dir(tiny_data_dir, tmp_path / "refused")
    result = subprocess.run(
        [sys.executable, "-m", "zllm", "serve", "--model", TINY, "--draft-model", str(tiny_llama_dir())],
        capture_output=True, text=True, timeout=120,
        env={"ZLLM_DATA_DIR": str(data_dir), "ZLLM_STATE_DIR": str(tmp_path / "state"),
             "ZLLM_CACHE_DIR": str(tmp_path / "cache"), "ZLLM_RUNTIME_DIR": str(tmp_path / "run"),
             "ZLLM_THREADS": "1", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 1, result.stderr
    assert "error:" in result.stderr and "hint:" in result.stderr and "Traceback" not in result.stderr
    assert "draft" in result.stderr.lower()


# ------------------------------------------------------------------ llama.cpp: a GGUF draft model

LLAMA_PROMPT = PROMPT + ", alpha beta gamma delta epsilon. " * 3


@pytest.fixture(scope="module")
def gguf_drafted(tmp_path_factory):
    """The tiny model's GGUF served on llama.cpp, drafting for itself through --draft-model with a .gguf path."""
    pytest.importorskip("llama_cpp")
    shared = tiny_gguf_data_dir()
    draft = tmp_path_factory.mktemp("draft") / "draft.gguf"
    shutil.copyfile(ModelStore(shared / "models").get(TINY).path / "model.gguf", draft)
    daemon = Daemon(linked_data_dir(shared, tmp_path_factory.mktemp("gguf-drafted")), TINY, "--backend", "llamacpp",
                    "--draft-model", str(draft)).wait_ready()
    yield daemon
    daemon.stop()


def plain_in_process(prompt: str, max_tokens: int) -> str:
    """What a daemon without a draft model answers: the same model and settings, in this process."""
    from zllm.canonical import ChatRequest, Message, SamplingParams, TextDelta
    from zllm.config import Settings
    from zllm.engines import local_client

    model_dir = ModelStore(tiny_gguf_data_dir() / "models").get(TINY).path
    client = local_client(model_dir, Settings(backend="llamacpp", threads=1), name=TINY, created=1)

    async def answer() -> str:
        stream = await client.submit(ChatRequest(id="plain", model=TINY, messages=(Message("user", prompt),),
                                                 sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens)))
        return "".join([event.text async for event in stream if isinstance(event, TextDelta)])

    try:
        return asyncio.run(asyncio.wait_for(answer(), timeout=120))
    finally:
        client.close()


def test_a_gguf_draft_model_on_llama_cpp_gives_the_plain_greedy_output(gguf_drafted) -> None:
    expected = plain_in_process(LLAMA_PROMPT, 120)
    client = openai.OpenAI(base_url=f"{gguf_drafted.base_url}/v1", api_key="k", max_retries=0, timeout=120)
    for turn in range(2):  # the second turn drafts from the first one's draft cells
        answer = client.chat.completions.create(model=TINY, messages=[{"role": "user", "content": LLAMA_PROMPT}],
                                                max_tokens=120, temperature=0)
        assert answer.choices[0].message.content == expected, f"turn {turn}"
        report = finished_report(gguf_drafted)
        assert report["drafted_tokens"] > 0 and report["accepted_tokens"] > 0
    assert "draft model (llama.cpp)" in gguf_drafted.log() and "Traceback" not in gguf_drafted.log()

