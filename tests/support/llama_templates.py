"""llama.cpp's test chat templates (70 upstream models' templates), from the llama-cpp-python 0.3.36 sdist zllm
pins: `pip download --no-binary :all:` once per cache dir (76 MB), only `models/templates/*.jinja` kept.

    template_dir() / "Qwen3-Coder.jinja"
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

from tests.support.tiny_models import _cached, pip_download

SDIST = "llama-cpp-python==0.3.36"
MEMBER = "vendor/llama.cpp/models/templates/"


class TemplatesUnavailable(RuntimeError):
    """pip could not fetch the sdist (no registry): the tests that need the templates skip."""


def template_dir() -> Path:
    return _cached("llama-cpp-templates-v1", _fetch, done="Qwen3-Coder.jinja")


def _fetch(out: Path) -> None:
    download = out / "sdist"
    archive = pip_download(SDIST, download, TemplatesUnavailable, sdist=True, timeout=600)
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if member.isfile() and MEMBER in member.name and member.name.endswith(".jinja"):
                (out / Path(member.name).name).write_bytes(tar.extractfile(member).read())
    shutil.rmtree(download)
