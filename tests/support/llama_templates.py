"""llama.cpp's test chat templates (70 upstream models' templates), from the llama-cpp-python 0.3.36 sdist zllm
pins: `pip download --no-binary :all:` once per cache dir (76 MB), only `models/templates/*.jinja` kept.

    template_dir() / "Qwen3-Coder.jinja"
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tests.support.tiny_models import artifact_cache_dir

SDIST = "llama-cpp-python==0.3.36"
MEMBER = "vendor/llama.cpp/models/templates/"


class TemplatesUnavailable(RuntimeError):
    """pip could not fetch the sdist (no registry): the tests that need the templates skip."""


def template_dir() -> Path:
    final = artifact_cache_dir() / "llama-cpp-templates-v1"
    if any(final.glob("*.jinja")):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".llama-cpp-templates-", dir=final.parent))
    try:
        _fetch(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not any(final.glob("*.jinja")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _fetch(out: Path) -> None:
    download = out / "sdist"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--disable-pip-version-check",
               "-q", SDIST, "-d", str(download)]
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        raise TemplatesUnavailable(f"pip could not fetch {SDIST}: {detail.decode(errors='replace')[-300:]}") from exc
    archive = next(download.glob("*.tar.gz"))
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if member.isfile() and MEMBER in member.name and member.name.endswith(".jinja"):
                (out / Path(member.name).name).write_bytes(tar.extractfile(member).read())
    shutil.rmtree(download)
