"""The import graph points one way (ARCHITECTURE.md). Checked statically, so a violation fails here first."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "zllm"

# package → top-level imports it must never make
FORBIDDEN = {
    "canonical": {"torch", "transformers", "aiohttp", "zllm.api", "zllm.runtime", "zllm.engine", "zllm.prompt",
                  "zllm.models", "zllm.cli", "zllm.daemon"},
    "api": {"torch", "transformers", "safetensors", "zllm.engine", "zllm.runtime", "zllm.kvcache", "zllm.prompt",
            "zllm.models", "zllm.cli", "zllm.daemon"},
    "engine": {"aiohttp", "zllm.api", "zllm.runtime", "zllm.cli", "zllm.daemon", "zllm.models"},
    "runtime": {"aiohttp", "zllm.api", "zllm.cli", "zllm.daemon", "zllm.models"},
    # the cache layer imports nothing above it: it gets token ids, tensors and an injected decode callable
    "kvcache": {"aiohttp", "transformers", "zllm.api", "zllm.runtime", "zllm.engine", "zllm.prompt", "zllm.models",
                "zllm.cli", "zllm.daemon", "zllm.store", "zllm.dialects", "zllm.canonical"},
    # dialects are pure text ⇄ canonical: no tensors, no tokenizer library, no protocol
    "dialects": {"torch", "transformers", "tokenizers", "llguidance", "aiohttp", "zllm.api", "zllm.runtime",
                 "zllm.engine", "zllm.kvcache", "zllm.prompt", "zllm.models", "zllm.cli", "zllm.daemon", "zllm.store"},
    "prompt": {"aiohttp", "torch", "zllm.api", "zllm.runtime", "zllm.engine", "zllm.cli", "zllm.daemon"},
    "models": {"aiohttp", "zllm.api", "zllm.runtime", "zllm.engine", "zllm.prompt", "zllm.daemon"},
    "store": {"torch", "transformers", "aiohttp", "zllm.api", "zllm.runtime", "zllm.engine", "zllm.prompt",
              "zllm.models", "zllm.cli", "zllm.daemon"},
    # the control socket (client and server) works on injected objects: the CLI imports its client, so it
    # must stay free of tensors, tokenizers and every layer of the daemon
    "control": {"torch", "transformers", "tokenizers", "aiohttp", "zllm.api", "zllm.runtime", "zllm.engine",
                "zllm.kvcache", "zllm.prompt", "zllm.dialects", "zllm.models", "zllm.store", "zllm.inspect",
                "zllm.cli", "zllm.daemon"},
    # the CLI talks to a daemon through zllm.control's client; it may read config, the model store and run
    # the offline zllm.inspect analyses; `zllm serve` goes through zllm.daemon, never a layer of it
    "cli": {"torch", "transformers", "tokenizers", "aiohttp", "zllm.api", "zllm.runtime", "zllm.engine",
            "zllm.kvcache", "zllm.prompt", "zllm.dialects", "zllm.store"},
}


def imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def violates(name: str, forbidden: set[str]) -> bool:
    return any(name == f or name.startswith(f + ".") for f in forbidden)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_point_one_way(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"zllm/{package} has no modules"
    bad = [
        f"{path.relative_to(ROOT.parent)} imports {name}"
        for path in files
        for name in sorted(imported_names(path))
        if violates(name, FORBIDDEN[package])
    ]
    assert not bad, "\n".join(bad)


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import torch.nn\nfrom zllm.engine.runner import x\n")
    names = imported_names(module)
    assert violates("torch.nn", FORBIDDEN["api"]) and "zllm.engine.runner" in names


# the engine seam: each engine library is imported only by its backend, and the seam itself imports none
ENGINE_LIBRARIES = {"llama_cpp": "engine/llamacpp"}
LIBRARY_FREE = {"engine/contract.py": {"torch", "transformers", "llama_cpp"},
                "engine/select.py": {"llama_cpp"},
                # the cache over engine-held sequences handles opaque state bytes, never tensors
                "kvcache/sequence_cache.py": {"torch", "llama_cpp"},
                "kvcache/sequence_snapshots.py": {"torch", "llama_cpp"},
                # the cache seam the runtime is typed against: both backends' caches fill it
                "kvcache/contract.py": {"torch", "llama_cpp"}}


@pytest.mark.parametrize("library", sorted(ENGINE_LIBRARIES))
def test_an_engine_library_is_imported_only_by_its_backend(library: str) -> None:
    home = ROOT / ENGINE_LIBRARIES[library]
    bad = [str(path.relative_to(ROOT.parent)) for path in sorted(ROOT.rglob("*.py"))
           if home not in path.parents and any(violates(name, {library}) for name in imported_names(path))]
    assert not bad, f"{library} imported outside {ENGINE_LIBRARIES[library]}: {bad}"


@pytest.mark.parametrize("module", sorted(LIBRARY_FREE))
def test_the_seam_and_the_sequence_cache_import_no_engine_library(module: str) -> None:
    bad = [name for name in imported_names(ROOT / module) if violates(name, LIBRARY_FREE[module])]
    assert not bad, f"zllm/{module} imports {bad}"


# torch and transformers at module level: only the torch backend and the torch tensors' prefix cache. Everything
# the llama.cpp path loads imports them lazily, inside a torch-only function, or not at all
# (tests/unit/engine/test_llamacpp_torch_free.py checks a real process).
TORCH_HOMES = {"engine/loader.py", "engine/runner.py", "engine/packed.py", "engine/kv_layers.py",
               "engine/torch_sampling.py", "runtime/draft_model.py", "kvcache/prefix_cache.py", "kvcache/pool.py",
               "kvcache/state.py", "kvcache/ssd_format.py", "kvcache/ssd_tier.py", "kvcache/device_tier.py",
               "kvcache/radix.py", "kvcache/ssd_maintenance.py"}
SERVING_PACKAGES = ("engine", "runtime", "kvcache", "prompt", "dialects", "api", "canonical")


def module_level_imports(path: Path) -> set[str]:
    """Imports a module runs when it is imported: its top level, `try` and `if` blocks (not `if TYPE_CHECKING`)."""
    names: set[str] = set()
    pending = list(ast.parse(path.read_text(), str(path)).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            pending.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend(node.body + node.orelse + node.finalbody + [n for h in node.handlers for n in h.body])
    return names


def test_only_the_torch_backend_imports_torch_at_module_level() -> None:
    bad = [f"{path.relative_to(ROOT)} imports {name}"
           for package in SERVING_PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
           if str(path.relative_to(ROOT)) not in TORCH_HOMES
           for name in sorted(module_level_imports(path)) if violates(name, {"torch", "transformers"})]
    assert not bad, "\n".join(bad)


def test_the_module_level_checker_skips_type_checking_and_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
                      "def f():\n    import transformers\ntry:\n    import torch.nn\nexcept ImportError:\n    pass\n")
    assert module_level_imports(module) == {"typing", "torch.nn"}


# the cache's typed views are shared by the cache layer, the control socket and the CLI, which may not import
# each other: a leaf of the standard library only, so that any of them can import it
LEAF_MODULES = {"cache_views.py": {"__future__", "dataclasses", "enum", "typing"}}


@pytest.mark.parametrize("module", sorted(LEAF_MODULES))
def test_shared_leaf_modules_import_only_the_standard_library(module: str) -> None:
    extra = imported_names(ROOT / module) - LEAF_MODULES[module]
    assert not extra, f"zllm/{module} imports {sorted(extra)}"
