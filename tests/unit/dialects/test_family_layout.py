"""Every dialect family is one package with the same role modules, and its fence builder has one name.

A newcomer adding a family copies one of these packages; the registry, the fence and the tests find the
pieces by role, so a family that names them differently (or builds its fence under another name) fails here.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

import zllm.dialects
from zllm.dialects.base import Dialect, FenceSpec, MarkupTokens, StreamParser
from zllm.dialects.registry import NAMES, dialect_named

ROLES = ("dialect", "format", "render", "parse", "grammar")
FAMILIES = ("hermes", "glm", "dsml", "harmony", "derived")
ROOT = Path(zllm.dialects.__file__).parent


def test_the_families_are_the_packages_beside_the_shared_files() -> None:
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())
    assert packages == sorted(FAMILIES)
    assert sorted(p.stem for p in ROOT.glob("*.py")) == ["__init__", "bare_json", "base", "registry", "round_trip",
                                                         "scan", "string_values", "template_match"]


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_has_every_role(family: str) -> None:
    for role in ROLES:
        importlib.import_module(f"zllm.dialects.{family}.{role}")


@pytest.mark.parametrize("family", FAMILIES)
def test_each_grammar_exposes_fence_grammar_over_spec_and_markup(family: str) -> None:
    builder = importlib.import_module(f"zllm.dialects.{family}.grammar").fence_grammar
    parameters = list(inspect.signature(builder).parameters.values())
    assert [p.name for p in parameters[:2]] == ["spec", "markup"]
    # anything past the two is a family variant, given by name
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[2:])


@pytest.mark.parametrize("name", NAMES)
def test_each_registered_dialect_lives_in_its_family_dialect_module(name: str) -> None:
    dialect = dialect_named(name)
    module = type(dialect).__module__.split(".")
    assert module[:2] == ["zllm", "dialects"] and module[2] in FAMILIES and module[3:] == ["dialect"]
    assert isinstance(dialect, Dialect)
    assert dialect.fence_grammar(FenceSpec(), MarkupTokens()) is None  # nothing to constrain
    assert isinstance(dialect.parser((), thinking=False, new_call_id=lambda: "call_0"), StreamParser)


def _state_machines() -> list[tuple[str, object]]:
    from zllm.dialects.hermes.json_cursor import JsonCursor

    machines = [("JsonCursor", JsonCursor())]
    for name in NAMES:
        machines.append((name, dialect_named(name).parser((), thinking=True, new_call_id=lambda: "call_0")))
    return machines


@pytest.mark.parametrize(("name", "machine"), _state_machines())
def test_each_state_machine_has_one_handler_per_state(name: str, machine: object) -> None:
    """Every parser (and the Hermes JSON cursor) is a private `_State` enum with handler tables built once; a
    state added without its handler fails here, not on the one output that reaches it."""
    states = set(importlib.import_module(type(machine).__module__)._State)
    tables = {attr: table for attr, table in vars(machine).items() if attr.endswith("_handlers")}
    assert tables, f"{name} dispatches without a handler table"
    for attr, table in tables.items():
        assert set(table) == states, f"{name}.{attr} misses {states - set(table)}"
        assert all(callable(handler) for handler in table.values())
