"""A model from Ollama's local store: `zllm pull ollama:qwen2.5-coder:7b` (or `ollama:user/model:tag`).

Ollama keeps an OCI-style store (OLLAMA_MODELS, default ~/.ollama/models):

    manifests/registry.ollama.ai/library/qwen2.5-coder/7b      JSON: {"layers": [{"mediaType", "digest", "size"}]}
    blobs/sha256-<hex>                                         content-addressed files

The layer of mediaType `application/vnd.ollama.image.model` is the GGUF itself. It is hard-linked into
the zllm store (a symlink across file systems): no gigabytes copied. Its digest is its name, checked by
Ollama when it downloaded it, so it is not hashed again here; its size is checked against the manifest
and its header against the tensor data it declares (truncation). Ollama's own Go prompt template is not
used: zllm renders with the GGUF's jinja chat template, as llama.cpp does.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from zllm.errors import PullError
from zllm.models.names import name_from_path_stem
from zllm.models.progress import PullProgress
from zllm.models.sources import Fetched
from zllm.models.sources.gguf_import import Placement, stage_gguf
from zllm.models.staging import Stage

PREFIX = "ollama:"
DEFAULT_REGISTRY = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
MODEL_LAYER = "application/vnd.ollama.image.model"


def ollama_models_dir() -> Path:
    """OLLAMA_MODELS as the environment says now, else Ollama's default."""
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


@dataclass(frozen=True)
class OllamaRef:
    registry: str
    namespace: str
    model: str
    tag: str

    @property
    def display(self) -> str:
        """The name as `ollama list` prints it."""
        prefix = "" if self.registry == DEFAULT_REGISTRY else f"{self.registry}/"
        prefix += "" if self.namespace == DEFAULT_NAMESPACE and not prefix else f"{self.namespace}/"
        return f"{prefix}{self.model}:{self.tag}"

    def manifest_path(self, models_dir: Path) -> Path:
        return models_dir / "manifests" / self.registry / self.namespace / self.model / self.tag


def parse_ollama_ref(text: str) -> OllamaRef:
    """`model[:tag]`, `namespace/model[:tag]` or `registry/namespace/model[:tag]`, as Ollama reads them."""
    head, _, last = text.rpartition("/")
    model, _, tag = last.partition(":")  # the tag is in the last segment (a registry may be host:port)
    parts = [*(head.split("/") if head else []), model]
    if not 1 <= len(parts) <= 3 or not all(parts) or any(p in (".", "..") for p in parts) or ":" in tag:
        raise PullError(
            f"`{PREFIX}{text}` is not an Ollama model name",
            hint=f"use {PREFIX}MODEL[:TAG] or {PREFIX}NAMESPACE/MODEL[:TAG], as `ollama list` shows them",
        )
    defaults = [DEFAULT_REGISTRY, DEFAULT_NAMESPACE]
    registry, namespace, model = [*defaults[: 3 - len(parts)], *parts]
    return OllamaRef(registry, namespace, model, tag or DEFAULT_TAG)


def _read_manifest(ref: OllamaRef, models_dir: Path) -> dict:
    path = ref.manifest_path(models_dir)
    if not path.is_file():
        tags = sorted(p.name for p in path.parent.iterdir()) if path.parent.is_dir() else []
        hint = f"its tags here: {', '.join(tags)}" if tags else f"fetch it first: ollama pull {ref.display}"
        raise PullError(
            f"Ollama's store ({models_dir}) has no model `{ref.display}`",
            hint=hint + " (OLLAMA_MODELS moves the store)",
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        layers = list(manifest["layers"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PullError(f"the Ollama manifest of `{ref.display}` ({path}) is not valid JSON with layers") from exc
    return {"path": path, "layers": layers}


def _model_layer(ref: OllamaRef, layers: list) -> dict:
    models = [layer for layer in layers if isinstance(layer, dict) and layer.get("mediaType") == MODEL_LAYER]
    if len(models) != 1:
        raise PullError(
            f"the Ollama model `{ref.display}` has {len(models)} GGUF layers ({MODEL_LAYER}), expected one",
            hint="zllm pulls Ollama models that are one GGUF file",
        )
    digest = models[0].get("digest")
    if not isinstance(digest, str) or not digest.startswith("sha256:") or len(digest) != 7 + 64:
        raise PullError(f"the Ollama model `{ref.display}` names its GGUF by a malformed digest `{digest}`")
    return models[0]


def _blob(ref: OllamaRef, layer: dict, models_dir: Path) -> Path:
    blob = models_dir / "blobs" / layer["digest"].replace(":", "-")
    if not blob.is_file():
        raise PullError(
            f"the weights of the Ollama model `{ref.display}` are missing: no blob {blob.name} in {blob.parent}",
            hint=f"Ollama's store is incomplete; fetch it again with `ollama pull {ref.display}`",
        )
    size = layer.get("size")
    if isinstance(size, int) and blob.stat().st_size != size:
        raise PullError(
            f"the Ollama blob {blob.name} of `{ref.display}` is {blob.stat().st_size} bytes, its manifest says {size}",
            hint=f"Ollama's store is damaged; fetch it again with `ollama pull {ref.display}`",
        )
    return blob


@dataclass(frozen=True)
class OllamaSource:
    ref: OllamaRef

    @property
    def default_name(self) -> str:
        """`qwen2.5-coder-7b`; `user/model` for other namespaces; `latest` left out."""
        name = self.ref.model + ("" if self.ref.tag == DEFAULT_TAG else f"-{self.ref.tag}")
        namespace = "" if self.ref.namespace == DEFAULT_NAMESPACE else name_from_path_stem(self.ref.namespace) + "/"
        return namespace + name_from_path_stem(name)

    def fetch(self, stage: Stage, progress: PullProgress) -> Fetched:
        models_dir = ollama_models_dir()
        progress.stage(f"reading {self.ref.display} from Ollama's store ({models_dir})")
        manifest = _read_manifest(self.ref, models_dir)
        layer = _model_layer(self.ref, manifest["layers"])
        blob = _blob(self.ref, layer, models_dir)
        digest = layer["digest"].removeprefix("sha256:")
        staged = stage_gguf(
            blob, stage, progress, placement=Placement.LINK_OR_SYMLINK, label=f"{PREFIX}{self.ref.display}",
            known_sha256=digest,
        )  # fmt: skip
        origin = {"ollama_model": self.ref.display, "ollama_manifest": str(manifest["path"]), "gguf_file": blob.name}
        return staged.fetched(f"{PREFIX}{self.ref.display}", origin)


def ollama_source(text: str) -> OllamaSource:
    """The source for `ollama:NAME` (text without the prefix)."""
    return OllamaSource(parse_ollama_ref(text))
