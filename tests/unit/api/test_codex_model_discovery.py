"""Codex's model discovery (`GET {base_url}/models?client_version=…`) against a real port: one body that Codex
decodes as its own catalog (`ModelsResponse`) and the official openai SDK still reads as the OpenAI list.

Checked by hand with the real Codex 0.171 CLI (a provider written in config.toml, no `model_catalog_json`):
it asks `/v1/models?client_version=0.171.0`, prints no fallback-metadata warning and caches the window."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.fake_engine import FAKE_MODEL, FakeEngineClient
from zllm.canonical import ModelCard
from zllm.cli.codex_catalog import write_catalog

# ModelInfo's fields without a serde default (codex-rs/protocol/src/openai_models.rs): one missing fails the
# whole catalog, silently, and Codex falls back to its guesses
CODEX_REQUIRED = ("slug", "display_name", "description", "supported_reasoning_levels", "shell_type", "visibility",
                  "supported_in_api", "priority", "upgrade", "base_instructions", "supports_reasoning_summaries",
                  "support_verbosity", "default_verbosity", "apply_patch_tool_type", "truncation_policy",
                  "supports_parallel_tool_calls", "experimental_supported_tools")
AUTH = {"Authorization": "Bearer test-key"}


def get(server, path: str, **params) -> dict:
    response = httpx.get(f"{server.url}{path}", params=params, headers=AUTH, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("path", ["/v1/models", "/models"])
def test_codex_discovery_answers_its_catalog_with_the_real_window(server, path):
    body = get(server, path, client_version="0.171.0")
    (entry,) = body["models"]
    assert [field for field in CODEX_REQUIRED if field not in entry] == []
    assert (entry["slug"], entry["context_window"]) == ("fake-model", FAKE_MODEL.context_length)
    assert entry["auto_compact_token_limit"] < FAKE_MODEL.context_length
    assert entry["truncation_policy"]["mode"] in ("tokens", "bytes")  # Codex's TruncationMode
    assert (entry["shell_type"], entry["apply_patch_tool_type"]) == ("shell_command", "freeform")
    # the OpenAI list is in the same body, for a client that sends the query but reads `data`
    assert [model["id"] for model in body["data"]] == ["fake-model"]


def test_other_clients_keep_the_plain_openai_list(server, client):
    assert "models" not in get(server, "/v1/models")
    # the SDK reads the Codex-shaped body as the OpenAI list (it ignores the `models` key)
    listed = client.models.list(extra_query={"client_version": "0.171.0"})
    assert [model.id for model in listed.data] == ["fake-model"]
    assert [model.id for model in client.models.list().data] == ["fake-model"]


def test_every_served_model_gets_an_entry_and_the_file_zllm_codex_writes_is_the_same(serve, tmp_path):
    small = ModelCard(id="small/model", created=1, context_length=2048)
    server = serve(FakeEngineClient(models=(FAKE_MODEL, small)))
    served = {entry["slug"]: entry for entry in get(server, "/v1/models", client_version="0.171.0")["models"]}
    assert {slug: entry["context_window"] for slug, entry in served.items()} == {"fake-model": 8192,
                                                                                 "small/model": 2048}
    written = json.loads(write_catalog(tmp_path / "catalog.json", "small/model", 2048).read_text())
    assert written == {"models": [served["small/model"]]}


def test_anthropic_clients_still_get_their_own_list(server):
    response = httpx.get(f"{server.url}/v1/models", params={"client_version": "1"},
                         headers={"x-api-key": "test-key", "anthropic-version": "2023-06-01"}, timeout=10)
    assert response.status_code == 200 and "models" not in response.json()
    assert response.json()["data"][0]["type"] == "model"
