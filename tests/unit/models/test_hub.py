"""The hub source against a local stand-in for huggingface.co, reached through HF_ENDPOINT.

The stand-in implements the endpoints huggingface_hub's snapshot_download uses:

    GET  /api/models/{repo}/revision/{rev}        → {"id", "sha", "siblings"}  (repo_info / model_info)
    GET  /api/models/{repo}/tree/{commit}         → [{"type", "path", "size", "oid"}]  (list_repo_tree)
    HEAD /{repo}/resolve/{commit}/{file}          → X-Repo-Commit, ETag, Content-Length
    GET  /{repo}/resolve/{commit}/{file}          → the bytes (honouring Range, to resume)
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from zllm.errors import PullError
from zllm.models import MANIFEST_FILE

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class HubStandIn:
    # repo id → {path in repo: bytes}
    repos: dict[str, dict[str, bytes]]
    # file → how many more GETs of it are cut off halfway (a flaky network)
    cut_off: dict[str, int] = field(default_factory=dict)
    # files whose GET fails with a 500 (the hub client does not retry those, so tests stay fast)
    broken: set[str] = field(default_factory=set)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/models/{org}/{name}/revision/{rev}", self._info)
        app.router.add_get("/api/models/{org}/{name}/tree/{rev}", self._tree)
        app.router.add_get("/{org}/{name}/resolve/{rev}/{path:.+}", self._resolve)
        return app

    def _repo(self, request: web.Request) -> dict[str, bytes]:
        self.requests.append((request.method, request.path_qs, dict(request.headers)))
        repo = f"{request.match_info['org']}/{request.match_info['name']}"
        if repo not in self.repos:
            raise web.HTTPNotFound(headers={"X-Error-Code": "RepoNotFound"}, text="Repository not found")
        return self.repos[repo]

    async def _info(self, request: web.Request) -> web.Response:
        files = self._repo(request)
        repo_id = f"{request.match_info['org']}/{request.match_info['name']}"
        return web.json_response({"id": repo_id, "sha": COMMIT, "siblings": [{"rfilename": p} for p in sorted(files)]})

    async def _tree(self, request: web.Request) -> web.Response:
        files = self._repo(request)
        return web.json_response(
            [{"type": "file", "path": p, "size": len(b), "oid": _git_oid(b)} for p, b in sorted(files.items())]
        )

    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        files = self._repo(request)
        path = request.match_info["path"]
        if path not in files:
            raise web.HTTPNotFound(headers={"X-Error-Code": "EntryNotFound"})
        body = files[path]
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{_git_oid(body)}"', "Accept-Ranges": "bytes"}
        start = _range_start(request.headers.get("Range"))
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(len(body))})
        if request.method == "GET" and path in self.broken:
            raise web.HTTPInternalServerError(text="storage backend unavailable")
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
        response = web.StreamResponse(status=status, headers={**headers, "Content-Length": str(len(body) - start)})
        await response.prepare(request)
        if self.cut_off.get(path, 0) > 0:
            self.cut_off[path] -= 1
            await response.write(body[start : start + (len(body) - start) // 2])
            request.transport.close()  # the connection drops mid-file
            return response
        await response.write(body[start:])
        return response

    def serve(self):
        """Start in a thread; returns a stop function."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        runner = web.AppRunner(self.app())

        async def start() -> None:
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}"
            ready.set()

        thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
        thread.start()
        ready.wait(10)

        def stop() -> None:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)

        return stop


def _sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _git_oid(body: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()


def _range_start(header: str | None) -> int:
    if not header or not header.startswith("bytes="):
        return 0
    return int(header[len("bytes=") :].split("-")[0] or 0)


def repo_files(model_dir: Path) -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in model_dir.iterdir() if p.is_file()}
    # what a real repo also holds, none of which a pull may fetch
    files["pytorch_model.bin"] = b"pickle weights"
    files["onnx/model.onnx"] = b"onnx"
    files["original/config.json"] = b"{}"
    files["README.md"] = b"# tiny"
    return files


@pytest.fixture
def hub(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch):
    standin = HubStandIn({"org/tiny": repo_files(tiny_model_dir)})
    stop = standin.serve()
    monkeypatch.setenv("HF_ENDPOINT", standin.url)
    yield standin
    stop()


def _downloaded(hub: HubStandIn) -> set[str]:
    return {
        path.split(f"/resolve/{COMMIT}/")[1]
        for method, path, _ in hub.requests
        if method == "GET" and "/resolve/" in path
    }


def test_pull_from_hub_fetches_only_model_files(store, hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")

    model = store.pull("org/tiny")

    assert model.name == "org/tiny"
    assert model.path.name == "org--tiny"
    assert model.manifest.source == "hf:org/tiny"
    assert model.manifest.origin["commit"] == COMMIT
    assert model.manifest.architecture == "LlamaForCausalLM"
    assert "pytorch_model.bin" not in model.manifest.files
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(model.manifest.files)
    assert _downloaded(hub) == {
        p for p in repo_files_names(hub) if "/" not in p and p.endswith((".json", ".safetensors", ".jinja"))
    }
    assert all(headers.get("Authorization") == "Bearer hf_test_token" for _, _, headers in hub.requests)


def repo_files_names(hub: HubStandIn) -> set[str]:
    return set(hub.repos["org/tiny"])


def test_pull_a_revision_names_the_model_after_it(store, hub):
    model = store.pull("org/tiny@v1")

    assert model.name == "org/tiny@v1"
    assert model.manifest.source == "hf:org/tiny@v1"
    assert any("/revision/v1" in path for _, path, _ in hub.requests)


def test_missing_repo_is_a_clear_error_and_changes_nothing(store, hub, models_dir, tree_snapshot):
    before = tree_snapshot(models_dir)

    with pytest.raises(PullError, match="no model `org/missing`"):
        store.pull("org/missing")

    assert tree_snapshot(models_dir) == before


def test_a_dropped_connection_is_resumed_with_a_range_request(store, hub, monkeypatch):
    import huggingface_hub.constants

    # the hub client hands bytes over in 10 MB chunks; the tiny test model needs smaller ones to resume
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    hub.cut_off["model.safetensors"] = 1

    model = store.pull("org/tiny")

    ranges = [h.get("Range") for m, p, h in hub.requests if m == "GET" and p.endswith("/model.safetensors")]
    assert ranges[0] is None and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"
    assert model.manifest.files["model.safetensors"] == _sha256(hub.repos["org/tiny"]["model.safetensors"])


def test_a_failed_download_leaves_the_store_unchanged_and_the_retry_reuses_the_hub_cache(
    store, hub, models_dir, tree_snapshot
):
    hub.broken.add("model.safetensors")
    before = tree_snapshot(models_dir)

    with pytest.raises(PullError, match="failed"):
        store.pull("org/tiny")

    assert tree_snapshot(models_dir) == before
    assert not store.has("org/tiny")

    hub.broken.clear()  # the server is back
    hub.requests.clear()
    model = store.pull("org/tiny")

    assert (model.path / MANIFEST_FILE).is_file()
    assert _downloaded(hub) == {"model.safetensors"}  # the files that made it are not fetched again


def test_hub_progress_reports_bytes(store, hub):
    seen: list[tuple[str, int, int | None]] = []

    class Recorder:
        def stage(self, message: str) -> None:
            pass

        def transfer(self, label: str, done: int, total: int | None) -> None:
            seen.append((label, done, total))

    store.pull("org/tiny", progress=Recorder())

    downloads = [s for s in seen if s[0] == "downloading org/tiny"]
    assert downloads and downloads[-1][1] == downloads[-1][2] > 0


def test_an_alias_prefers_the_hub_when_it_answers(store, hub, monkeypatch, fake_mirror):
    from zllm.models.aliases import ALIASES, AliasSource
    from zllm.models.sources.hub import HubSource

    monkeypatch.setitem(ALIASES, "tinyalias", AliasSource("tinyalias", HubSource("org/tiny"), fake_mirror))

    model = store.pull("tinyalias")

    assert model.name == "tinyalias"
    assert model.manifest.source == "hf:org/tiny"
    assert model.manifest.origin["alias"] == "tinyalias"


def test_a_repo_with_only_pickle_weights_is_refused(store, hub, tiny_model_dir, models_dir, tree_snapshot):
    files = {k: v for k, v in repo_files(tiny_model_dir).items() if not k.endswith(".safetensors")}
    hub.repos["org/pickles"] = files
    before = tree_snapshot(models_dir)

    with pytest.raises(PullError, match="`org/pickles` has no safetensors weights"):
        store.pull("org/pickles")

    assert tree_snapshot(models_dir) == before
    assert "pytorch_model.bin" not in _downloaded(hub)


# --- one GGUF out of a hub repo: org/name-GGUF:QUANT ---------------------------------------------------


@pytest.fixture
def gguf_hub(hub: HubStandIn, q8_gguf: Path, tiny_gguf: Path) -> HubStandIn:
    hub.repos["org/tiny-GGUF"] = {
        "tiny-Q8_0.gguf": q8_gguf.read_bytes(),
        "tiny.F32.gguf": tiny_gguf.read_bytes(),
        "Q4_K_M/tiny-Q4_K_M-00001-of-00002.gguf": b"GGUF part one",
        "Q4_K_M/tiny-Q4_K_M-00002-of-00002.gguf": b"GGUF part two",
        "mmproj-tiny-f16.gguf": b"GGUF projector",
        "README.md": b"# tiny GGUFs",
    }
    return hub


def test_pull_one_quantization_from_a_gguf_repo(store, gguf_hub, q8_gguf):
    model = store.pull("org/tiny-GGUF:q8_0")

    m = model.manifest
    assert (model.name, m.source) == ("org/tiny-GGUF-q8_0", "hf:org/tiny-GGUF/tiny-Q8_0.gguf")
    assert (m.weights_format, m.quantization, m.architecture) == ("gguf", "Q8_0", "LlamaForCausalLM")
    assert (model.path / "model.gguf").read_bytes() == q8_gguf.read_bytes()
    assert (m.origin["commit"], m.origin["gguf_file"], m.origin["gguf_link"]) == (COMMIT, "tiny-Q8_0.gguf", "hardlink")
    assert _downloaded(gguf_hub) == {"tiny-Q8_0.gguf"}  # one file; the config and tokenizer come out of it


def test_file_names_one_gguf_exactly(store, gguf_hub):
    model = store.pull("org/tiny-GGUF", file="tiny.F32.gguf")

    assert (model.name, model.manifest.quantization) == ("org/tiny.F32", "F32")
    assert _downloaded(gguf_hub) == {"tiny.F32.gguf"}


def test_a_gguf_repo_without_a_quantization_lists_them(store, gguf_hub, models_dir, tree_snapshot):
    before = tree_snapshot(models_dir)

    with pytest.raises(PullError, match="holds 4 GGUF files; say which quantization") as caught:
        store.pull("org/tiny-GGUF")

    assert "org/tiny-GGUF:QUANT, one of: F32, Q4_K_M, Q8_0" in caught.value.hint
    assert tree_snapshot(models_dir) == before and _downloaded(gguf_hub) == set()


def test_a_missing_quantization_is_refused_with_the_choices(store, gguf_hub):
    with pytest.raises(PullError, match="org/tiny-GGUF has no IQ2_XS GGUF") as caught:
        store.pull("org/tiny-GGUF:IQ2_XS")
    assert "F32, Q4_K_M, Q8_0" in caught.value.hint


def test_a_split_gguf_from_the_hub_is_refused_before_downloading(store, gguf_hub, models_dir, tree_snapshot):
    before = tree_snapshot(models_dir)

    with pytest.raises(PullError, match="split GGUFs are not supported yet"):
        store.pull("org/tiny-GGUF:Q4_K_M")

    assert tree_snapshot(models_dir) == before and _downloaded(gguf_hub) == set()


def test_a_missing_gguf_repo_is_a_clear_error(store, gguf_hub):
    with pytest.raises(PullError, match="no model `org/nothing-GGUF`"):
        store.pull("org/nothing-GGUF:Q4_K_M")


def test_a_truncated_download_is_refused_and_leaves_nothing(store, gguf_hub, q8_gguf, models_dir, tree_snapshot):
    gguf_hub.repos["org/tiny-GGUF"]["tiny-Q8_0.gguf"] = q8_gguf.read_bytes()[:-1000]  # the repo itself holds it
    before = tree_snapshot(models_dir)

    with pytest.raises(PullError, match="truncated"):
        store.pull("org/tiny-GGUF:Q8_0")

    assert tree_snapshot(models_dir) == before


def test_an_unreachable_hub_says_so_for_a_gguf_pull(store):
    # the autouse fixture points HF_ENDPOINT at a closed port
    with pytest.raises(PullError, match="cannot reach http://127.0.0.1:9 to look up `org/tiny-GGUF`") as caught:
        store.pull("org/tiny-GGUF:Q8_0")
    assert "ollama:" in caught.value.hint
