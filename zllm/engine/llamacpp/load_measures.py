"""The load-time measures of a speculating llama.cpp engine, kept across loads: the row agreement check
(row_agreement.py) and a verified row's cost (verify_cost.py).

`--speculative auto` (the default) measures them on every llama.cpp load, and on a quantized file they are most of
the load: for the default model's Q4_1 file at 1 thread the agreement check takes 8-9 s (7 s of it prefilling the
576 tokens its second pass needs: Q4_1 prefills at ~85 tokens/s on one core) and the cost 1.1 s, against a 1.2-1.6 s
load without them. Both depend only on the GGUF file, the llama.cpp build (its kernels; the CPU it picked them for)
and the pool's cells' type and attention: a file of them, one entry per such key, in the daemon's state dir, lets
every later load of the same model skip them.

    measures = LoadMeasures(state_dir / "llamacpp-measures.json")
    key = measures.key(gguf_path, kv_type=..., flash_attention=..., cells=...)
    measures.get(key)                      # {"agreeing_rows": 16, "verify_row_cost": 0.74} or None
    measures.put(key, {...})               # written whole (a temporary file renamed over it)

A file that cannot be read is treated as empty; one that cannot be written leaves the next load measuring again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import llama_cpp as lc

log = logging.getLogger("zllm.runtime")

VERSION = 1  # bump when what a measure means changes (e.g. row_agreement's CHECKED_ROWS)


def build_identity() -> str:
    """llama-cpp-python's version, the CPU features ggml was built for and its libraries' sizes and times: a
    rebuild (other kernels) gives another identity."""
    lib = Path(lc.__file__).parent / "lib"
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in lib.glob("*") if p.is_file()) \
        if lib.is_dir() else []
    return json.dumps([lc.__version__, lc.llama_print_system_info().decode(errors="replace"), files])


class LoadMeasures:
    def __init__(self, path: Path):
        self.path = path

    @staticmethod
    def key(gguf_path: str, **shape: object) -> str:
        """The file (resolved path, size, modification time), the build and `shape` (the pool's settings the
        measures depend on), hashed."""
        stat = os.stat(gguf_path)
        identity = [VERSION, str(Path(gguf_path).resolve()), stat.st_size, stat.st_mtime_ns, build_identity(),
                    sorted(shape.items())]
        return hashlib.sha256(json.dumps(identity, default=str).encode()).hexdigest()[:32]

    def get(self, key: str) -> dict | None:
        entry = self._read().get(key)
        return entry if isinstance(entry, dict) else None

    def put(self, key: str, measures: dict) -> None:
        entries = self._read()
        entries[key] = measures
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            temporary.write_text(json.dumps(entries, indent=1) + "\n")
            os.replace(temporary, self.path)
        except OSError as exc:
            log.warning("llama.cpp: could not keep the load-time measures in %s: %s", self.path, exc)

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}
