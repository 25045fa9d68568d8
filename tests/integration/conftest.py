"""Integration fixtures: a real daemon serving a tiny random-weight model over the real Qwen tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from tests.support.daemon import Daemon
from tests.support.tiny_models import tiny_qwen_dir
from zllm.models import ModelStore

TINY = "tiny-qwen"
# small window so "prompt too long" and "max_tokens clamped to the window" are cheap to reach
CONTEXT = 192


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("zllm-data")
    ModelStore(data_dir / "models").pull(str(tiny_qwen_dir()), name=TINY)
    return data_dir


def linked_data_dir(shared: Path, where: Path) -> Path:
    """A data dir of its own (a daemon locks its data dir: one daemon per store) whose `models` is the shared
    store's, so tests that run a second daemon beside a module-scoped one need not pull again."""
    data_dir = where / "data"
    if not data_dir.exists():
        data_dir.mkdir(parents=True)
        (data_dir / "models").symlink_to(shared / "models", target_is_directory=True)
    return data_dir


@pytest.fixture(scope="module")
def daemon(tiny_data_dir: Path):
    proc = Daemon(tiny_data_dir, TINY, "--context-length", str(CONTEXT)).wait_ready()
    yield proc
    proc.stop()


@pytest.fixture()
def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="test-key", max_retries=0, timeout=60)


# ---------------------------------------------------------------------- one daemon per engine, for contract tests


@dataclass(frozen=True)
class Served:
    """A daemon and the model it serves, on one engine: what a contract test (the same on every engine) needs."""

    backend: str
    daemon: Daemon
    model: str
    context: int
    data_dir: Path
    # what another daemon passes to serve the same engine: the same local model, or the same vLLM server (attached)
    sibling_args: tuple[str, ...]

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.daemon.base_url}/v1", api_key="test-key", max_retries=0, timeout=120)

    def sibling(self, where: Path, env: dict[str, str] | None = None) -> Daemon:
        """Another daemon on the same engine, beside the module's (its own data dir over the same models): a
        restart test starts one, stops it and starts another with the same state. On vLLM it attaches to the
        module's server, so zllm restarts while vLLM stays up (one vLLM start per module)."""
        return Daemon(linked_data_dir(self.data_dir, where), self.model, *self.sibling_args,
                      env=env).wait_ready(timeout=300)


# local: the tiny random-weight model in process; vllm: the default model as safetensors behind a real vLLM server
# (skipped, saying how to get one, when no vLLM Python is configured: tests/support/vllm_server.py)
BACKENDS = ("local", "vllm")
VLLM_CONTEXT = 1024
LOCAL_CONTEXT = 512  # two tools' schemas in the tiny model's template need more than CONTEXT


@pytest.fixture(scope="module", params=BACKENDS)
def served(request: pytest.FixtureRequest, tiny_data_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The module's daemon on each engine in turn (module-scoped: one vLLM server per module at most)."""
    if request.param == "local":
        data_dir = linked_data_dir(tiny_data_dir, tmp_path_factory.mktemp("served-local"))
        args = ("--context-length", str(LOCAL_CONTEXT))
        daemon = Daemon(data_dir, TINY, *args).wait_ready()
        yield Served("local", daemon, TINY, LOCAL_CONTEXT, data_dir, args)
    else:
        from tests.support.vllm_server import vllm_model_dir, vllm_python

        python = vllm_python()
        data_dir = tmp_path_factory.mktemp("served-vllm")
        ModelStore(data_dir / "models").pull(str(vllm_model_dir()), name="smollm2-st")
        daemon = Daemon(data_dir, "smollm2-st", "--backend", "vllm", "--vllm-python", python,
                        "--vllm-args", "--enforce-eager", "--context-length", str(VLLM_CONTEXT),
                        "--cache-budget-mb", "1024").wait_ready(timeout=600)
        url = daemon.control().call("ps")["models"][0]["device"]
        yield Served("vllm", daemon, "smollm2-st", VLLM_CONTEXT, data_dir,
                     ("--backend", "vllm", "--vllm-url", url, "--cache-budget-mb", "1024"))
    daemon.stop()
