"""Model names and their directory names in the store.

A name is what users type (`smollm2`, `HuggingFaceTB/SmolLM2-135M-Instruct`, `org/name@v2`). On disk each
`/` becomes `--`: `org/name` → `models/org--name/`. That escape is only unambiguous because names may not
contain `--` themselves (the Hugging Face hub forbids it in repo ids for the same reason). The real name is
always read back from the manifest, never reconstructed from the directory name.
"""

from __future__ import annotations

import re

from zllm.errors import InvalidRequest

# one or more path segments, then an optional @revision (which may itself hold `/`, e.g. refs/pr/1)
_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_NAME_RE = re.compile(rf"^{_SEGMENT}(?:/{_SEGMENT})*(?:@[A-Za-z0-9][A-Za-z0-9._/-]*)?$")
MAX_NAME_LENGTH = 200


def is_valid_name(name: str) -> bool:
    return (
        len(name) <= MAX_NAME_LENGTH
        and _NAME_RE.match(name) is not None
        and "--" not in name
        and ".." not in name
        and not name.endswith((".", "/"))
    )


def check_name(name: str) -> str:
    """`name` itself, or InvalidRequest saying what a name may hold."""
    if not is_valid_name(name):
        raise InvalidRequest(
            f"`{name}` is not a valid model name",
            hint="use letters, digits, `.`, `_`, `-`, `/` between parts and an optional `@revision`; no `--` or `..`",
            param="name",
        )
    return name


def dir_name(name: str) -> str:
    """The directory that holds model `name` inside the store (`org/name` → `org--name`)."""
    return check_name(name).replace("/", "--")


def name_from_path_stem(stem: str) -> str:
    """A valid default name made from a file or directory name (`My Model.Q4` → `My-Model.Q4`)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", stem)
    cleaned = re.sub(r"-{2,}", "-", cleaned)
    cleaned = re.sub(r"\.{2,}", ".", cleaned).strip("-._")
    return cleaned or "model"
