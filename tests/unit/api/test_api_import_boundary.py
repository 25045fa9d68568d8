"""The edge talks to the core only through zllm.canonical: importing it must not pull in the heavy core."""

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]

FORBIDDEN = ("torch", "transformers", "zllm.engine", "zllm.runtime", "zllm.kvcache", "zllm.prompt", "zllm.models")

PROBE = f"""
import sys, pkgutil, importlib
import zllm.api
for info in pkgutil.walk_packages(zllm.api.__path__, "zllm.api."):
    importlib.import_module(info.name)
leaked = sorted(m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in {FORBIDDEN!r}))
print(",".join(leaked))
"""


def test_api_modules_import_no_core_internals():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"zllm.api imported: {result.stdout.strip()}"
