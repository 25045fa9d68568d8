"""Fixtures for the HTTP edge: a fake engine, the app on a real port, and an openai SDK client."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# `tests.support` must be importable however pytest was started (`pytest` or `python -m pytest`).
_REPO_ROOT = Path(__file__).resolve().parents[3]
if str(_REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(_REPO_ROOT))

import openai  # noqa: E402

from tests.support.fake_engine import FakeEngineClient  # noqa: E402
from tests.support.http_server import ThreadedServer  # noqa: E402
from zllm.api import create_app  # noqa: E402


@pytest.fixture
def engine() -> FakeEngineClient:
    return FakeEngineClient()


@pytest.fixture
def serve():
    """`serve(engine, api_key=..., **create_app_options) -> ThreadedServer`, stopped after the test."""
    servers: list[ThreadedServer] = []

    def start(engine, **options) -> ThreadedServer:
        server = ThreadedServer(create_app(engine, **options)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def server(serve, engine) -> ThreadedServer:
    return serve(engine)


def sdk_client(server: ThreadedServer, api_key: str = "test-key") -> openai.OpenAI:
    # no retries: a test that gets a 5xx must see it once, not wait through backoff
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=api_key, max_retries=0, timeout=10)


@pytest.fixture
def make_client():
    """`make_client(server, api_key="test-key") -> openai.OpenAI`."""
    return sdk_client


@pytest.fixture
def client(server) -> openai.OpenAI:
    return sdk_client(server)
