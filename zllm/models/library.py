"""`StoreLibrary`: the model store as the API layer's `ModelLibrary` (canonical/library.py)."""

from __future__ import annotations

from zllm.canonical.library import LibraryModel, PullReporter
from zllm.models.store import ModelStore, StoredModel


def library_model(model: StoredModel) -> LibraryModel:
    manifest = model.manifest
    return LibraryModel(
        name=model.name,
        size_bytes=manifest.size_bytes,
        digest=manifest.sha256,
        modified_at=manifest.added_at,
        weights_format=manifest.weights_format,
        family=manifest.model_type,
        quantization=manifest.quantization or manifest.dtype or "",
        context_length=manifest.context_length,
        source=manifest.source,
    )


class StoreLibrary:
    def __init__(self, store: ModelStore):
        self.store = store

    def list_models(self) -> list[LibraryModel]:
        return [library_model(model) for model in self.store.list()]

    def resolve(self, source: str) -> str:
        return self.store.resolve_name(source)

    def pull(self, source: str, reporter: PullReporter) -> LibraryModel:
        # a reporter has the two methods of the store's PullProgress
        return library_model(self.store.pull(source, progress=reporter))
