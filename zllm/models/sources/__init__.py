"""Where models come from. Each source writes a complete model directory into the staging area.

A source never touches the store itself: `fetch` fills `stage.model` (and may use `stage.work` as
scratch), and the store checks, hashes, writes the manifest and renames. So a source that fails halfway
cannot leave anything behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from zllm.models.progress import PullProgress
from zllm.models.staging import Stage


@dataclass(frozen=True)
class Fetched:
    """What a source tells the manifest about what it wrote."""

    # short URI-ish origin shown by `zllm ls`: hf:org/name[@rev], dir:/abs, gguf:/abs.gguf, pypi:req
    source: str
    # source-specific facts kept in the manifest's `origin` (hub commit, GGUF sha256, ...)
    origin: dict[str, str] = field(default_factory=dict)
    # relative path → sha256 of files the source has already hashed (a multi-GB GGUF): the store trusts
    # these instead of reading the file a second time
    known_digests: dict[str, str] = field(default_factory=dict)


class Source(Protocol):
    # the store name used when the user gives no --name
    default_name: str

    def fetch(self, stage: Stage, progress: PullProgress) -> Fetched:
        """Fill `stage.model` with a model directory; raise PullError (anything else is wrapped)."""
        ...
