"""Fixtures for the Anthropic Messages edge: the official `anthropic` SDK against the app on a real port.

The fake engine, `serve` and `server` fixtures come from tests/unit/api/conftest.py.
"""

from __future__ import annotations

import anthropic
import pytest


def anthropic_client(server, api_key: str = "test-key") -> anthropic.Anthropic:
    # no retries: a test that gets a 5xx must see it once, not wait through backoff
    return anthropic.Anthropic(base_url=server.url, api_key=api_key, max_retries=0, timeout=10)


@pytest.fixture
def make_anthropic():
    """`make_anthropic(server, api_key="test-key") -> anthropic.Anthropic`."""
    return anthropic_client


@pytest.fixture
def claude(server) -> anthropic.Anthropic:
    return anthropic_client(server)
