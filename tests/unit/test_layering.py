"""The import graph points one way (ARCHITECTURE.md). Checked statically, so a violation fails here first."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "zllm"

# package → top-level imports it must never make
FORBIDDEN = {
    "canonical": {"torch", "transformers", "aiohttp", "zllm.api", "zllm.runtime", "zllm.engine", "zllm.prompt",
                  "zllm.models", "zllm.cli", "zllm.daemon", "zllm.diagnosis"},
    "api": {"torch", "transformers", "safetensors", "zllm.engine", "zllm.runtime", "zllm.kvcache", "zllm.prompt",
            "zllm.models", "zllm.cli", "zllm.daemon", "zllm.diagnosis"},
    "engine": {"aiohttp", "zllm.api", "zllm.runtime", "zllm.cli", "zllm.daemon", "zllm.models"},
    "runtime": {"torch", "transformers", "aiohttp", "zllm.api", "zllm.cli", "zllm.daemon", "zllm.models"},
    # the cache layer imports nothing above it and no engine library: it gets token ids, a backend's state and an
    # injected decode callable (the torch backend's tensor cache is engine/torch/cache/)
    "kvcache": {"torch", "aiohttp", "transformers", "zllm.api", "zllm.runtime", "zllm.engine", "zllm.prompt",
                "zllm.models", "zllm.cli", "zllm.daemon", "zllm.store", "zllm.dialects", "zllm.canonical",
                "zllm.diagnosis"},
    # dialects are pure text ⇄ canonical: no tensors, no tokenizer library, no protocol
    "dialects": {"torch", "transformers", "tokenizers", "llguidance", "aiohttp", "zllm.api", "zllm.runtime",
                 "zllm.engine", "zllm.kvcache", "zllm.prompt", "zllm.models", "zllm.cli", "zllm.daemon", "zllm.store",
                 "zllm.diagnosis"},
    "prompt": {"aiohttp", "torch", "zllm.api", "zllm.runtime", "zllm.engine", "zllm.cli", "zllm.daemon",
               "zllm.diagnosis"},
    "models": {"aiohttp", "zllm.api", "zllm.runtime", "zllm.engine", "zllm.prompt", "zllm.daemon"},
    "store": {"torch", "transformers", "aiohttp", "zllm.api", "zllm.runtime", "zllm.engine", "zllm.prompt",
              "zllm.models", "zllm.cli", "zllm.daemon", "zllm.diagnosis"},
    # the control socket (client and server) works on injected objects: the CLI imports its client, so it
    # must stay free of tensors, tokenizers and every layer of the daemon
    "control": {"torch", "transformers", "tokenizers", "aiohttp", "zllm.api", "zllm.runtime", "zllm.engine",
                "zllm.kvcache", "zllm.prompt", "zllm.dialects", "zllm.models", "zllm.store", "zllm.inspect",
                "zllm.cli", "zllm.daemon", "zllm.diagnosis"},
    # the CLI talks to a daemon through zllm.control's client; it may read config, the model store and run
    # the offline zllm.inspect analyses; `zllm serve` goes through zllm.daemon, never a layer of it
    "cli": {"torch", "transformers", "tokenizers", "aiohttp", "zllm.api", "zllm.runtime", "zllm.engine",
            "zllm.kvcache", "zllm.prompt", "zllm.dialects", "zllm.store", "zllm.diagnosis"},
    # cache diagnosis reads canonical requests, token ids and an injected renderer/decoder: never the serving
    # layers that call it, and never the prompt package (which imports its busters; renderers are protocols)
    "diagnosis": {"torch", "transformers", "tokenizers", "aiohttp", "zllm.api", "zllm.runtime", "zllm.engine",
                  "zllm.kvcache", "zllm.prompt", "zllm.dialects", "zllm.models", "zllm.control", "zllm.inspect",
                  "zllm.cli", "zllm.daemon"},
}

# the one door each lower layer has into zllm.diagnosis (a leaf that loads nothing else of it); everything
# else of the package is reached through the engine client (runtime) or the offline tool (inspect)
DIAGNOSIS_DOORS = {
    "kvcache": {"zllm.diagnosis.near_miss"},  # the prefix caches record near misses
    "prompt": {"zllm.diagnosis.busters"},  # the renderer drops the per-session billing header
    "canonical": {"zllm.diagnosis.records"},  # EngineClient.diagnose_cache returns a CacheDiagnosis
    "api": {"zllm.diagnosis.records"},  # ... which the edge writes in each API's shape
}


# the request-level engine (engine/vllm/: a vLLM server behind HTTP) stands where runtime/client.py stands for the
# step-level engines: it speaks aiohttp to vLLM and runs each token through the runtime's pure output stages
# (detokenizer, stop rules, stream parsers, loop guard), itself running no engine loop; its client shares the local
# client's prompt side and admission checks (runtime/client_base.py)
REQUEST_LEVEL_ENGINE = {
    "zllm/engine/vllm": {"aiohttp", "zllm.runtime.client_base", "zllm.runtime.detokenizer", "zllm.runtime.loop_guard",
                         "zllm.runtime.output", "zllm.runtime.report", "zllm.runtime.stops",
                         "zllm.runtime.turn_output"},
}


def allowed_here(path: Path, name: str) -> bool:
    relative = path.relative_to(ROOT.parent).as_posix()
    return any(relative.startswith(folder + "/") and name in names for folder, names in REQUEST_LEVEL_ENGINE.items())


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
        if violates(name, FORBIDDEN[package]) and name not in DIAGNOSIS_DOORS.get(package, ())
        and not allowed_here(path, name)
    ]
    assert not bad, "\n".join(bad)


def test_the_diagnosis_doors_are_leaves() -> None:
    """A door into zllm.diagnosis imports nothing else of the package, and the package face imports nothing,
    so a layer that opens one door never loads the rest."""
    assert not imported_names(ROOT / "diagnosis" / "__init__.py")
    for door in set().union(*DIAGNOSIS_DOORS.values()):
        path = ROOT / (door.removeprefix("zllm.").replace(".", "/") + ".py")
        inner = sorted(name for name in imported_names(path) if violates(name, {"zllm.diagnosis"}))
        assert not inner, f"{door} imports {inner}"


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import torch.nn\nfrom zllm.engine.torch.runner import x\n")
    names = imported_names(module)
    assert violates("torch.nn", FORBIDDEN["api"]) and "zllm.engine.torch.runner" in names


# the engine seam: each engine library is imported only by its backend, and the seam itself imports none
ENGINE_LIBRARIES = {"llama_cpp": "engine/llamacpp"}
LIBRARY_FREE = {"engine/contract.py": {"torch", "transformers", "llama_cpp"},
                "engine/select.py": {"llama_cpp"},
                # the one prefix cache and its graph hold opaque KV handles, never tensors or engine sequences
                "kvcache/prefix_cache.py": {"torch", "transformers", "llama_cpp"},
                "kvcache/entry_graph.py": {"torch", "transformers", "llama_cpp"},
                "kvcache/kv_interface.py": {"torch", "transformers", "llama_cpp"},
                # the one SSD store and its format: bytes a backend exports, never tensors or engine sequences
                "kvcache/snapshot_store.py": {"torch", "transformers", "llama_cpp"},
                "kvcache/snapshot_frame.py": {"torch", "transformers", "llama_cpp"},
                # the cache seam the runtime is typed against: both backends' caches fill it
                "kvcache/contract.py": {"torch", "llama_cpp"}}


@pytest.mark.parametrize("library", sorted(ENGINE_LIBRARIES))
def test_an_engine_library_is_imported_only_by_its_backend(library: str) -> None:
    home = ROOT / ENGINE_LIBRARIES[library]
    bad = [str(path.relative_to(ROOT.parent)) for path in sorted(ROOT.rglob("*.py"))
           if home not in path.parents and any(violates(name, {library}) for name in imported_names(path))]
    assert not bad, f"{library} imported outside {ENGINE_LIBRARIES[library]}: {bad}"


@pytest.mark.parametrize("module", sorted(LIBRARY_FREE))
def test_the_seam_and_the_cache_import_no_engine_library(module: str) -> None:
    bad = [name for name in imported_names(ROOT / module) if violates(name, LIBRARY_FREE[module])]
    assert not bad, f"zllm/{module} imports {bad}"


# torch is one backend, one package: torch, transformers and safetensors are imported only inside engine/torch/
# (anywhere in a module: top level, functions, `if TYPE_CHECKING`), and engine/torch/ only by itself and by the
# backend chooser (engine/select.py), in every package the daemon serves from. models/ (pull, checks) and inspect/
# (offline analyses) are no part of serving. tests/unit/engine/test_llamacpp_torch_free.py checks a real process.
TORCH_HOME = "engine/torch"
TORCH_LIBRARIES = {"torch", "transformers", "safetensors"}
BACKEND_CHOOSER = "engine/select.py"
SERVING = ("engine", "runtime", "kvcache", "prompt", "dialects", "api", "canonical", "control", "store", "daemon.py")


def serving_modules() -> list[Path]:
    return sorted(path for name in SERVING
                  for path in ([ROOT / name] if name.endswith(".py") else (ROOT / name).rglob("*.py")))


def torch_imports_outside_its_package(paths: list[Path], root: Path = ROOT) -> list[str]:
    bad = []
    for path in paths:
        where = path.relative_to(root).as_posix()
        if where.startswith(TORCH_HOME + "/"):
            continue
        forbidden = TORCH_LIBRARIES | ({"zllm.engine.torch"} if where != BACKEND_CHOOSER else set())
        bad += [f"{where} imports {name}" for name in sorted(imported_names(path)) if violates(name, forbidden)]
    return bad


def test_only_the_torch_backend_imports_torch() -> None:
    assert (ROOT / TORCH_HOME / "backend.py").is_file(), "the torch backend is the package engine/torch/"
    bad = torch_imports_outside_its_package(serving_modules())
    assert not bad, "\n".join(bad)


def test_the_torch_check_sees_functions_type_checking_and_the_package(tmp_path: Path) -> None:
    runtime = tmp_path / "zllm" / "runtime"
    runtime.mkdir(parents=True)
    samples = {"lazy.py": "def f():\n    import torch\n",
               "typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from transformers import X\n",
               "backend.py": "from zllm.engine.torch.runner import ModelRunner\n",
               "clean.py": "import numpy\nfrom zllm.engine.contract import Row\n"}
    for name, text in samples.items():
        (runtime / name).write_text(text)
    bad = torch_imports_outside_its_package(sorted(runtime.glob("*.py")), root=tmp_path / "zllm")
    assert bad == ["runtime/backend.py imports zllm.engine.torch.runner", "runtime/lazy.py imports torch",
                   "runtime/typed.py imports transformers"]


# the cache's typed views are shared by the cache layer, the control socket and the CLI, which may not import
# each other: a leaf of the standard library only, so that any of them can import it
LEAF_MODULES = {"cache_views.py": {"__future__", "dataclasses", "enum", "typing"},
                # the values the API edge and the engine-client contract share with the diagnosis package
                "diagnosis/records.py": {"__future__", "dataclasses", "time"},
                # what the prefix caches record near misses with
                "diagnosis/near_miss.py": {"__future__", "logging", "threading", "time", "collections",
                                           "collections.abc", "dataclasses", "zllm.cache_views"}}


@pytest.mark.parametrize("module", sorted(LEAF_MODULES))
def test_shared_leaf_modules_import_only_the_standard_library(module: str) -> None:
    extra = imported_names(ROOT / module) - LEAF_MODULES[module]
    assert not extra, f"zllm/{module} imports {sorted(extra)}"
