"""The layers of docs/concepts/architecture.md, held by the imports themselves.

An ``ast`` walk over every module of the package (type-only imports included: a layer
that needs another's types for its signatures depends on it all the same). It fails when:

- ``core`` imports anything but ``core`` and the shared vocabulary (``errors``);
- ``stores``, ``llm``, ``resources`` or ``keys`` import a layer above them;
- ``engine`` imports a top-level API module (``app``, ``handle``, ``approvals``, ...);
- anything outside ``stores/`` imports a private module of ``stores/``;
- an edge (``cli``, ``web``, ``adapters``, ``demo``, ``triggers``) imports a private
  member of another package (a name or a module starting with ``_``);
- ``triggers`` imports the engine, a store or the key machinery: a consumer uses the
  App's public API, as any program would.
"""

from __future__ import annotations

import ast
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import perdure

PACKAGE = Path(perdure.__file__).parent

# The shared vocabulary every layer may use: the error tree and the hooks' event types.
VOCABULARY = {"errors", "hooks"}
# Top-level modules that are the API (everything at the top that is not vocabulary).
# ``tools`` is the vocabulary of tools (what ``@app.tool`` makes and the engine runs).
LOW_TOP = {"errors", "hooks", "tools"}

# Which first-level parts of the package each layer may import (besides itself).
ALLOWED: dict[str, set[str]] = {
    "core": {"errors"},
    "stores": {"core", "errors"},
    "llm": {"core", "errors"},
    "keys": {"core", "errors", "hooks", "stores"},
    "resources": {"core", "errors", "hooks", "stores"},
}
EDGES = {"cli", "web", "adapters", "demo", "triggers", "telemetry"}
# What the broker and folder consumers may not reach below the API.
TRIGGERS_AVOID = {"engine", "stores", "keys"}


def _part(module: str) -> str:
    """``perdure.keys.folder`` -> ``keys``; ``perdure.app`` -> ``app``; ``perdure`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> Iterator[tuple[int, str, str | None]]:
    """Every ``(line, module, name)`` the file imports from perdure (``name`` for
    ``from module import name``; ``None`` for ``import module``)."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "perdure":
                    yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] != "perdure":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if (PACKAGE.parent / sub.replace(".", "/")).is_dir() or (
                    PACKAGE.parent / (sub.replace(".", "/") + ".py")
                ).exists():
                    yield node.lineno, sub, None  # a submodule imported by name
                else:
                    yield node.lineno, target, alias.name


def _files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _problems() -> list[str]:
    problems: list[str] = []
    for path in _files():
        here = _module_of(path)
        layer = _part(here)
        rel = path.relative_to(PACKAGE.parent)
        for line, target, name in _imports(path):
            there = _part(target)
            where = f"{rel}:{line} imports {target}{'.' + name if name else ''}"
            if there == layer or (target == "perdure" and layer == ""):
                continue
            if layer in ALLOWED and there not in ALLOWED[layer] and there != layer:
                problems.append(f"{where}: {layer} may import only {sorted(ALLOWED[layer])}")
            if layer == "engine" and there and there not in {
                "core", "stores", "keys", "llm", "resources", *LOW_TOP,
            }:
                problems.append(f"{where}: the engine imports a layer above it")
            if there == "stores" and layer != "stores" and any(
                part.startswith("_") for part in target.split(".")[2:]
            ):
                problems.append(f"{where}: a private module of stores/")
            if layer == "triggers" and there in TRIGGERS_AVOID:
                problems.append(f"{where}: triggers use the App's API, not the {there}")
            if layer in EDGES and there != layer:
                private_module = any(
                    p.startswith("_") and p != "__init__" for p in target.split(".")[1:]
                )
                private_name = (name is not None and name.startswith("_")
                                and not name.startswith("__"))
                if private_module or private_name:
                    problems.append(f"{where}: an edge reaches a private member of {there}")
        if layer in EDGES:
            problems.extend(f"{rel}:{line} {what}" for line, what in _private_reaches(path))
    return problems


def _private_reaches(path: Path) -> Iterator[tuple[int, str]]:
    """``thing._member`` in an edge, where ``thing`` is not ``self`` or ``cls``: reaching
    into another object's private state (a store's connection, the App's helpers)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    # Names bound to modules outside perdure (``import os``): their ``_x`` are theirs.
    outside = {alias.asname or alias.name for node in ast.walk(tree)
               if isinstance(node, ast.Import) for alias in node.names
               if alias.name.split(".")[0] != "perdure"}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name)
                         and node.value.id in {"self", "cls", *outside})):
            yield node.lineno, f"reaches the private member .{node.attr}"


def test_layers_import_only_downwards() -> None:
    """No module imports a layer above its own, and no edge reaches another's privates."""
    problems = _problems()
    assert not problems, "layer rules broken:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("layer", "target"),
    [("core", "perdure.stores.base"), ("stores", "perdure.engine.run"),
     ("engine", "perdure.app"), ("web", "perdure.stores._rows"),
     ("triggers", "perdure.engine.worker")],
)
def test_the_walk_sees_a_forbidden_import(layer: str, target: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk is not blind: a forbidden import planted in a copy of the tree is found."""
    copy = tmp_path / "perdure"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / layer / "planted.py").write_text(f"import {target}\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", copy, raising=True)
    assert any("planted.py" in problem for problem in _problems())
