"""One GGUF out of a Hugging Face hub repository: `zllm pull org/name-GGUF:Q4_K_M` (or `--file NAME.gguf`).

GGUF repos hold one file per quantization (often tens of GB in all), so the repo's file list is read
first (`model_info`: the files and the commit they are at), one file is picked (gguf_pick.py), and only that
file is downloaded, with `hf_hub_download`, into the hub's own cache: resumable, shared with other HF tools,
and hard-linked from there into the store (stage_gguf; a copy across file systems). The config and tokenizer come out of
the GGUF itself, so nothing else from the repo is fetched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from zllm.models.names import name_from_path_stem
from zllm.models.progress import PullProgress
from zllm.models.sources import Fetched
from zllm.models.sources.gguf_import import Placement, stage_gguf
from zllm.models.sources.gguf_pick import pick_gguf
from zllm.models.sources.hub import hub_cache_dir, hub_endpoint, hub_errors, progress_bar_class
from zllm.models.staging import Stage

_GGUF_ID = re.compile(
    r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)"
    r"(?:@(?P<rev>[^\s@:]+))?(?::(?P<quant>[A-Za-z0-9][A-Za-z0-9_.-]*))?$"
)


def parse_hub_gguf_id(text: str) -> tuple[str, str | None, str | None] | None:
    """`(repo, revision, quant)` for `org/name[@rev][:QUANT]`, else None."""
    match = _GGUF_ID.match(text)
    return (match["repo"], match["rev"], match["quant"]) if match else None


def is_gguf_repo_name(repo_id: str) -> bool:
    """By the hub's convention GGUF repos are named `...-GGUF` (they hold no safetensors to pull)."""
    return repo_id.lower().endswith("gguf")


@dataclass(frozen=True)
class HubGgufSource:
    repo_id: str
    revision: str | None = None
    quant: str | None = None
    file: str | None = None

    @property
    def default_name(self) -> str:
        """`org/name-GGUF-Q4_K_M` (`:` cannot be in a store name); with --file, `org/<file stem>`."""
        if self.file is not None:
            name = f"{self.repo_id.split('/')[0]}/{name_from_path_stem(PurePosixPath(self.file).stem)}"
        else:
            name = self.repo_id + (f"-{name_from_path_stem(self.quant)}" if self.quant else "")
        return name + (f"@{self.revision}" if self.revision else "")

    @property
    def where(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")

    def _pick(self, progress: PullProgress) -> tuple[str, str]:
        """(the file to fetch, the commit the listing is at): the download is pinned to what was listed."""
        from huggingface_hub import HfApi

        progress.stage(f"listing the files of {self.where} on {hub_endpoint()}")
        with hub_errors(self.repo_id, self.revision):
            info = HfApi(endpoint=hub_endpoint()).model_info(self.repo_id, revision=self.revision or "main")
        files = [sibling.rfilename for sibling in info.siblings or []]
        return pick_gguf(files, self.where, quant=self.quant, file=self.file), str(info.sha)

    def fetch(self, stage: Stage, progress: PullProgress) -> Fetched:
        from huggingface_hub import hf_hub_download

        file, commit = self._pick(progress)
        progress.stage(f"fetching {file} from {self.where}")
        with hub_errors(self.repo_id, self.revision):
            cached = Path(
                hf_hub_download(
                    self.repo_id,
                    file,
                    revision=commit,
                    endpoint=hub_endpoint(),
                    cache_dir=hub_cache_dir(),
                    tqdm_class=progress_bar_class(progress, f"downloading {PurePosixPath(file).name}"),
                )
            )
        staged = stage_gguf(cached, stage, progress, placement=Placement.LINK_OR_COPY, label=f"{self.where}/{file}")
        origin = {"repo_id": self.repo_id, "commit": commit, "endpoint": hub_endpoint(), "gguf_file": file}
        return staged.fetched(f"hf:{self.where}/{file}", origin)
