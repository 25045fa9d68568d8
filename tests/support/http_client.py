"""A raw JSON POST for tests that must send what no SDK would (bad JSON, missing fields, odd headers)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def post_raw(base_url: str, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    """(status, parsed JSON body) of `POST base_url + path`, error statuses included."""
    request = urllib.request.Request(f"{base_url}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)
