"""The Hugging Face hub: `org/name` or `org/name@revision`, through `huggingface_hub.snapshot_download`.

Downloads go to the hub's own cache (HF_HUB_CACHE / HF_HOME, shared with every other HF tool), so an
interrupted pull resumes where it stopped and a model already fetched by another tool is not fetched
again. The store then hard-links (or copies) the top-level model files out of the cached snapshot.
HF_TOKEN and HF_ENDPOINT are honoured, read when the pull runs (not when huggingface_hub was imported).
Only safetensors, config, tokenizer and chat-template files are fetched: never .bin/.pth/.onnx, and
nothing in sub-folders (`original/`, `onnx/`, ...).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from zllm.errors import PullError
from zllm.models.checks import MODEL_FILE_PATTERNS
from zllm.models.files import link_or_copy
from zllm.models.progress import PullProgress
from zllm.models.sources import Fetched
from zllm.models.sources.local_dir import model_files
from zllm.models.staging import Stage

DEFAULT_ENDPOINT = "https://huggingface.co"
_REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)(?:@(?P<rev>[^\s@]+))?$")


def parse_hub_id(text: str) -> tuple[str, str | None] | None:
    """`("org/name", "rev" | None)` for `org/name[@rev]`, else None."""
    match = _REPO_ID.match(text)
    return (match["repo"], match["rev"]) if match else None


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or DEFAULT_ENDPOINT


def hub_cache_dir() -> str | None:
    """The hub cache as the environment says *now* (None: huggingface_hub's own default)."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return cache
    if home := os.environ.get("HF_HOME"):
        return str(Path(home) / "hub")
    return None


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Can a TCP connection to the hub be opened within `timeout_s`? Fast "no" when offline or firewalled."""
    if hub_offline():
        return False
    url = urlparse(hub_endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def progress_bar_class(progress: PullProgress, label: str) -> type:
    """A tqdm look-alike for snapshot_download's `tqdm_class`: forwards byte counts, draws nothing."""

    class ForwardingBar:
        _lock = threading.Lock()

        def __init__(self, *args: object, total: float | None = None, initial: float = 0, **kwargs: object):
            unit, desc = kwargs.get("unit", "it"), kwargs.get("desc")
            self.total, self.n, self.unit, self.desc = total, initial, unit, str(desc or "")
            self.format_dict: dict[str, object] = {"rate": None}  # the hub reads it for its rate postfix

        def update(self, n: float | None = 1) -> None:
            with self._lock:
                self.n += n or 0
                # the hub keeps a "bytes received" twin of the "bytes written" bar; report only one of them
                if self.unit == "B" and not self.desc.startswith("Downloading bytes"):
                    progress.transfer(label, int(self.n), int(self.total) if self.total else None)

        def __enter__(self) -> ForwardingBar:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def __getattr__(self, name: str):  # any other tqdm method (refresh, close, set_postfix_str, ...)
            return lambda *args, **kwargs: None

    return ForwardingBar


def download_snapshot(
    repo_id: str, revision: str | None, progress: PullProgress, *, local_files_only: bool = False
) -> Path:
    """The cached snapshot directory of `repo_id` at `revision`, fetched (or resumed) as needed."""
    from huggingface_hub import snapshot_download

    if not local_files_only:  # a cache lookup is instant; whoever asked for it says so
        progress.stage(f"fetching {repo_id}{'@' + revision if revision else ''} from {hub_endpoint()}")
    with hub_errors(repo_id, revision):
        return Path(
            snapshot_download(
                repo_id,
                revision=revision,
                allow_patterns=list(MODEL_FILE_PATTERNS),
                ignore_patterns=["*/*"],
                endpoint=hub_endpoint(),
                cache_dir=hub_cache_dir(),
                local_files_only=local_files_only,
                tqdm_class=progress_bar_class(progress, f"downloading {repo_id}"),
            )
        )


@contextlib.contextmanager
def hub_errors(repo_id: str, revision: str | None) -> Iterator[None]:
    """huggingface_hub's exceptions as PullErrors that say what to do (shared by the safetensors and GGUF pulls)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except PullError:
        raise
    except GatedRepoError as exc:
        raise PullError(f"`{repo_id}` is gated", hint="accept its license on the hub, then set HF_TOKEN") from exc
    except RepositoryNotFoundError as exc:
        raise PullError(
            f"there is no model `{repo_id}` on {hub_endpoint()}", hint="check the name; private repos need HF_TOKEN"
        ) from exc
    except RevisionNotFoundError as exc:
        raise PullError(f"`{repo_id}` has no revision `{revision}`") from exc
    except LocalEntryNotFoundError as exc:
        raise PullError(
            f"cannot reach {hub_endpoint()} and `{repo_id}` is not in the local hub cache",
            hint="check the network (HF_ENDPOINT, proxies), or pull a local .gguf file or model directory",
        ) from exc
    except Exception as exc:  # HTTP errors, disk full, ...: the store stays as it was either way
        if _is_connection_error(exc):
            raise PullError(
                f"cannot reach {hub_endpoint()} to look up `{repo_id}`",
                hint="check the network (HF_ENDPOINT, proxies), or pull a local .gguf file, ollama:, lmstudio: "
                "or a model directory",
            ) from exc
        raise PullError(f"downloading `{repo_id}` from {hub_endpoint()} failed") from exc


_CONNECTION_ERRORS = ("ConnectionError", "ConnectError", "ConnectTimeout")


def _is_connection_error(exc: BaseException | None) -> bool:
    """No connection at all (refused, DNS, timeout), as opposed to an answer the hub gave."""
    while exc is not None:
        # the builtin ones, and the HTTP client's (requests / httpx: ConnectionError, ConnectError, ConnectTimeout)
        if isinstance(exc, ConnectionError) or type(exc).__name__ in _CONNECTION_ERRORS:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@dataclass(frozen=True)
class HubSource:
    repo_id: str
    revision: str | None = None
    # only the local hub cache (the alias uses it when the hub is unreachable)
    local_files_only: bool = False

    @property
    def default_name(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")

    def fetch(self, stage: Stage, progress: PullProgress) -> Fetched:
        snapshot = download_snapshot(self.repo_id, self.revision, progress, local_files_only=self.local_files_only)
        files = model_files(snapshot)
        progress.stage(f"linking {len(files)} files into the store")
        for path in files:
            link_or_copy(path, stage.model / path.name)
        return Fetched(
            source=f"hf:{self.default_name}",
            # the snapshot directory is named after the commit it holds
            origin={"repo_id": self.repo_id, "commit": snapshot.name, "endpoint": hub_endpoint()},
        )
