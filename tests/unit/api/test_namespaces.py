"""The namespace rule (api/auth.py), pinned for every mix of key headers, with auth on and off.

Auth on: the namespace is the *verified* key's, whatever else the client sends; auth off: the client's own
key (Bearer first) picks it. Namespace ids are salted with the install's secret.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from zllm.api.auth import NAMESPACE_SECRET, namespace_for_key
from zllm.config import Settings, configured_api_keys
from zllm.errors import ConfigError

RIGHT, OTHER_RIGHT, WRONG = "key-right", "key-other", "key-wrong"

# (name, headers, auth on: (status, namespace key or None), auth off: namespace key)
MIXES = [
    ("bearer only", {"Authorization": f"Bearer {RIGHT}"}, (200, RIGHT), RIGHT),
    ("x-api-key only", {"x-api-key": RIGHT}, (200, RIGHT), RIGHT),
    ("both right", {"Authorization": f"Bearer {RIGHT}", "x-api-key": RIGHT}, (200, RIGHT), RIGHT),
    ("right bearer, wrong x-api-key", {"Authorization": f"Bearer {RIGHT}", "x-api-key": WRONG}, (200, RIGHT), RIGHT),
    ("wrong bearer, right x-api-key", {"Authorization": f"Bearer {WRONG}", "x-api-key": RIGHT}, (200, RIGHT), WRONG),
    ("wrong only", {"Authorization": f"Bearer {WRONG}"}, (401, None), WRONG),
    ("wrong x-api-key only", {"x-api-key": WRONG}, (401, None), WRONG),
    ("none", {}, (401, None), None),
]


def chat(server, headers: dict) -> int:
    body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(f"{server.url}/v1/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize(("name", "headers", "on", "off"), MIXES, ids=[m[0] for m in MIXES])
def test_auth_on_the_namespace_is_the_verified_keys(serve, engine, name, headers, on, off) -> None:
    server = serve(engine, api_keys=(RIGHT, OTHER_RIGHT))
    status, key = on
    assert chat(server, headers) == status
    if status == 200:
        assert engine.submitted[-1].namespace == namespace_for_key(key, server.app[NAMESPACE_SECRET]) != ""
    else:
        assert engine.submitted == []


@pytest.mark.parametrize(("name", "headers", "on", "off"), MIXES, ids=[m[0] for m in MIXES])
def test_auth_off_the_clients_key_picks_the_namespace(serve, engine, name, headers, on, off) -> None:
    server = serve(engine)
    assert chat(server, headers) == 200
    assert engine.submitted[-1].namespace == namespace_for_key(off, server.app[NAMESPACE_SECRET])


def test_each_configured_key_has_its_own_namespace(serve, engine) -> None:
    server = serve(engine, api_key=RIGHT, api_keys=(OTHER_RIGHT,))
    for key in (RIGHT, OTHER_RIGHT):
        assert chat(server, {"x-api-key": key}) == 200
    first, second = (request.namespace for request in engine.submitted)
    assert first != second and "" not in (first, second)


def test_namespace_ids_are_salted() -> None:
    """Without the install's secret an id cannot be matched to a guessed key."""
    assert namespace_for_key(RIGHT, b"install a") != namespace_for_key(RIGHT, b"install b")
    assert namespace_for_key(RIGHT, b"install a") == namespace_for_key(RIGHT, b"install a")
    assert namespace_for_key(None, b"install a") == ""


def test_health_stays_open_with_auth_on(serve, engine) -> None:
    server = serve(engine, api_keys=(RIGHT,))
    with urllib.request.urlopen(f"{server.url}/health", timeout=10) as response:
        assert response.status == 200


def test_keys_come_from_the_key_settings_and_the_keys_file(tmp_path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("# one key a line\nfile-key-1\n\n  file-key-2  \n")
    settings = Settings(api_key="main", api_keys="a, b,,main", api_keys_file=str(keys_file))
    assert configured_api_keys(settings) == ("main", "a", "b", "file-key-1", "file-key-2")
    assert configured_api_keys(Settings()) == ()


@pytest.mark.parametrize("content", [None, "# only a comment\n\n"], ids=["missing", "no key"])
def test_an_unusable_keys_file_is_a_config_error_not_auth_off(tmp_path, content) -> None:
    keys_file = tmp_path / "keys"
    if content is not None:
        keys_file.write_text(content)
    with pytest.raises(ConfigError):
        configured_api_keys(Settings(api_keys_file=str(keys_file)))
