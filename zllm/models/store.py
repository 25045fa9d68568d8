"""The model store: one directory per model under `settings.models_dir`, each with its manifest.

    models/
      smollm2/                          config.json, model.safetensors, tokenizer.json, chat_template.jinja,
                                        generation_config.json, zllm-manifest.json
      smollm2-gguf/                     model.gguf (linked, not converted), config.json, tokenizer.json,
                                        chat_template.jinja, zllm-manifest.json (see weights.py)
      HuggingFaceTB--SmolLM2-135M-Instruct/
      .staging/  .lock                  see staging.py

Invariant: a directory in the store is a whole model or not there at all. A pull builds the model in
`.staging/<token>/model`, checks it, hashes it, fsyncs it, writes the manifest last, then renames it into
place in one step; `--force` swaps the old one out the same way. Failed, interrupted or killed pulls leave
only a staging directory, which is deleted at once or, after a crash, when a store is next opened.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from zllm.durable import fsync_path
from zllm.errors import InvalidRequest, ModelNotFound, PullError, ZllmError
from zllm.models.aliases import upgrade_for
from zllm.models.checks import check_model_dir
from zllm.models.files import fsync_tree, listing_digest, regular_files, sha256_file
from zllm.models.manifest import MANIFEST_FILE, Manifest, read_manifest, write_manifest
from zllm.models.names import check_name, dir_name, is_valid_name
from zllm.models.progress import NullProgress, PullProgress
from zllm.models.resolve import resolve_source
from zllm.models.sources import Fetched, Source
from zllm.models.staging import STORE_LOCK, Stage, StagingArea, locked


@dataclass(frozen=True)
class StoredModel:
    name: str
    # the model directory: pass it to from_pretrained
    path: Path
    manifest: Manifest


def _load(model_dir: Path) -> StoredModel | None:
    try:
        manifest = read_manifest(model_dir)
    except (OSError, ValueError, TypeError):
        return None  # no (readable) manifest: not a model, whatever else the directory holds
    return StoredModel(manifest.name, model_dir, manifest)


class ModelStore:
    def __init__(self, models_dir: Path):
        self.models_dir = Path(models_dir)
        self.models_dir.mkdir(parents=True, exist_ok=True)
        self._staging = StagingArea(self.models_dir)
        self._staging.clean_stale()

    # --- reading -------------------------------------------------------------------------------------

    def list(self) -> list[StoredModel]:
        entries = (e for e in self.models_dir.iterdir() if e.is_dir() and not e.name.startswith("."))
        models = [m for m in map(_load, entries) if m is not None]
        return sorted(models, key=lambda m: m.name)

    def names(self) -> list[str]:
        return [m.name for m in self.list()]

    def get(self, name: str) -> StoredModel:
        if is_valid_name(name):
            model = _load(self.models_dir / dir_name(name))
            if model is not None and model.name == name:
                return model
        raise ModelNotFound(name, available=self.names())

    def has(self, name: str) -> bool:
        try:
            self.get(name)
            return True
        except ModelNotFound:
            return False

    # --- changing ------------------------------------------------------------------------------------

    def remove(self, name: str) -> None:
        model = self.get(name)
        # the lock is released before the staging directory (and with it the model's files) is deleted
        with self._staging.new() as stage, locked(self.models_dir / STORE_LOCK):
            os.rename(model.path, stage.removed)  # gone from the store in one step
            fsync_path(self.models_dir, best_effort=True)

    def resolve_name(self, source: str, name: str | None = None, *, file: str | None = None) -> str:
        """The name `pull(source, name=name, file=file)` would store the model under."""
        return _checked_name(resolve_source(source, file).default_name if name is None else name)

    def pull(
        self,
        source: str,
        *,
        name: str | None = None,
        force: bool = False,
        progress: PullProgress | None = None,
        file: str | None = None,
    ) -> StoredModel:
        """Fetch `source` into the store as `name`; the stored model. Idempotent unless `force`.

        `file` names one GGUF in a hub repo or LM Studio folder (`zllm pull --file`).
        """
        progress = progress or NullProgress()
        recipe = resolve_source(source, file)
        name = _checked_name(recipe.default_name if name is None else name)
        if not force and self.has(name):
            return self.refresh(name, progress)
        with self._staging.new() as stage:
            fetched = _fetch(recipe, stage, progress, source)
            _seal(stage, name, source, fetched, progress)
            self._commit(stage, name, force)
        return self.get(name)

    def outdated(self, name: str) -> str | None:
        """Why the stored `name` is not what its built-in alias makes now (see refresh); None when it is."""
        model = self.get(name)
        upgrade = upgrade_for(model.manifest, model.path)
        return None if upgrade is None else upgrade[0]

    def refresh(self, name: str, progress: PullProgress | None = None) -> StoredModel:
        """The stored `name`, made again first when a built-in alias now makes it otherwise.

        The default model an older zllm stored as Q4_1 is re-encoded as F16 from its own stored file (offline,
        about as long as the first pull's import; aliases.py), swapped in like `pull --force`. Any other model
        is returned as it is.
        """
        progress = progress or NullProgress()
        model = self.get(name)
        upgrade = upgrade_for(model.manifest, model.path)
        if upgrade is None:
            progress.stage(f"{name} is already in the store")
            return model
        reason, recipe = upgrade
        progress.stage(reason)
        with self._staging.new() as stage:
            fetched = _fetch(recipe, stage, progress, name)
            _seal(stage, name, model.manifest.source, fetched, progress)
            self._commit(stage, name, force=True)
        return self.get(name)

    def _commit(self, stage: Stage, name: str, force: bool) -> None:
        """Rename the sealed model into place (swapping out the old one when forced)."""
        target = self.models_dir / dir_name(name)
        with locked(self.models_dir / STORE_LOCK):
            if target.exists():
                if not force and _load(target) is not None:
                    return  # a concurrent pull of the same name won; its model is as good as ours
                # the swap: old model aside (into the staging dir, which deletes it), new one in
                os.rename(target, stage.replaced)
            os.rename(stage.model, target)
            fsync_path(self.models_dir, best_effort=True)


def _checked_name(name: str) -> str:
    try:
        return check_name(name)
    except InvalidRequest as exc:
        raise PullError(exc.message, hint=(exc.hint or "") + "; choose one with --name") from None


def _fetch(recipe: Source, stage: Stage, progress: PullProgress, source: str) -> Fetched:
    try:
        return recipe.fetch(stage, progress)
    except ZllmError:
        raise
    except Exception as exc:  # disk full, a bug in a source, ...: the caller still gets one error type
        raise PullError(f"pulling `{source}` failed: {exc}") from exc


def _seal(stage: Stage, name: str, source: str, fetched: Fetched, progress: PullProgress) -> Manifest:
    """Check the staged model, hash it, fsync it and write its manifest: after this it may be committed."""
    progress.stage("checking the model")
    facts = check_model_dir(stage.model, source)
    files = [p for p in regular_files(stage.model) if p.name != MANIFEST_FILE]
    total = sum(p.stat().st_size for p in files)
    progress.stage("hashing")
    digests: dict[str, str] = {}
    hashed = 0
    for path in files:

        def report(done: int, before: int = hashed) -> None:
            progress.transfer("hashing", before + done, total)

        relative = path.relative_to(stage.model).as_posix()
        known = fetched.known_digests.get(relative)
        digests[relative] = known if known is not None else sha256_file(path, report)
        hashed += path.stat().st_size
    manifest = Manifest(
        name=name,
        source=fetched.source,
        sha256=listing_digest(digests),
        size_bytes=total,
        architecture=facts.architecture,
        added_at=time.time(),
        model_type=facts.model_type,
        context_length=facts.context_length,
        dtype=facts.dtype,
        files=digests,
        origin=fetched.origin,
        weights_format=facts.weights_format,
        quantization=facts.quantization,
    )
    fsync_tree(stage.model)
    write_manifest(stage.model, manifest)  # last: a directory with a manifest is a whole model
    fsync_path(stage.model, best_effort=True)
    return manifest
