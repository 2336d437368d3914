"""The public surface: ``perdure.__all__``, module ``__all__`` lists, the error tree, and
every type the API hands back is exported."""

from __future__ import annotations

import collections.abc
import importlib
import inspect
import pkgutil
import re
import sys
import types
import typing
from pathlib import Path

import pytest

import perdure
import perdure.errors
from perdure.errors import PerdureError, PerdureSignal

PACKAGE_DIR = Path(perdure.__file__).parent


def _source(module_name: str) -> Path:
    """The file a dotted module name under the package comes from."""
    path = PACKAGE_DIR.joinpath(*module_name.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _module_names() -> list[str]:
    """Every module of the package, by dotted name, except the ``python -m`` entry point."""
    names = ["perdure"]
    for info in pkgutil.walk_packages([str(PACKAGE_DIR)], prefix="perdure."):
        if info.name.rsplit(".", 1)[-1] != "__main__":
            names.append(info.name)
    return sorted(names)


MODULES = _module_names()
CODE_MODULES = [name for name in MODULES if _source(name).read_text().strip()]


def _is_reexported_module_or_future(value: object) -> bool:
    """Submodules and ``from __future__`` features are attributes, not public names."""
    return isinstance(value, types.ModuleType) or type(value).__module__ == "__future__"


# What the root must not hand out: the layers' machinery, reachable from its subpackage.
NOT_AT_THE_ROOT = {"Action", "Decision", "ObjectView", "ReasonCode", "evaluate", "Certificate",
                   "KeyRing", "Revocation", "HeadAnchors", "NodeIdentity", "Verifier",
                   "Signer", "Store", "Worker", "AgentDef", "GateDecision", "Proposal"}


def test_the_root_exports_what_users_write() -> None:
    """The root namespace holds what an agent or an operator script names; the layers'
    machinery stays in its subpackage (and is importable from there)."""
    assert not NOT_AT_THE_ROOT & set(perdure.__all__)
    assert set(FACE_NAMES) >= NOT_AT_THE_ROOT
    assert len(perdure.__all__) <= 100  # grown with queues, schedules, async and testing


def test_all_is_sorted_and_unique() -> None:
    """``perdure.__all__`` is sorted and has no duplicates."""
    assert perdure.__all__ == sorted(perdure.__all__)
    assert len(set(perdure.__all__)) == len(perdure.__all__)


def test_all_equals_the_public_names() -> None:
    """Every public attribute of ``perdure`` is in ``__all__`` and nothing else is."""
    public = {
        name
        for name, value in vars(perdure).items()
        if not name.startswith("_") and not _is_reexported_module_or_future(value)
    }
    assert set(perdure.__all__) - {"__version__"} == public


def test_all_has_no_private_names() -> None:
    """No name in ``__all__`` starts with an underscore, apart from ``__version__``."""
    assert [n for n in perdure.__all__ if n.startswith("_")] == ["__version__"]
    assert isinstance(perdure.__version__, str)


def test_every_name_is_importable() -> None:
    """``from perdure import *`` binds every name in ``__all__``."""
    namespace: dict[str, object] = {}
    exec("from perdure import *", namespace)
    for name in perdure.__all__:
        assert namespace[name] is getattr(perdure, name)


# Names the API promises verbatim although they are not errors of perdure's own making:
# ``CannotDo`` is raised by a user's step to say "not on this node".
PROMISED_NAMES = {"CannotDo"}


def test_exception_names() -> None:
    """Every exported exception ends with ``Error`` or is a ``PerdureSignal`` (or is one of
    the few names the API promises verbatim)."""
    for name in perdure.__all__:
        value = getattr(perdure, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert (name.endswith("Error") or issubclass(value, PerdureSignal)
                    or name in PROMISED_NAMES), name
            assert issubclass(value, PerdureError | PerdureSignal), name


def test_every_error_is_exported() -> None:
    """Each exception class in ``perdure.errors`` is reachable as ``perdure.<Name>``."""
    for name, value in vars(perdure.errors).items():
        if isinstance(value, type) and issubclass(value, BaseException):
            assert name in perdure.__all__, name


def test_modules_are_found() -> None:
    """The module walk sees the layers, so the per-module checks cannot pass vacuously."""
    for name in ("perdure.app", "perdure.core.cycle", "perdure.engine.worker",
                 "perdure.stores.sqlite", "perdure.errors"):
        assert name in CODE_MODULES


@pytest.mark.parametrize("module_name", CODE_MODULES)
def test_module_defines_all(module_name: str) -> None:
    """Each module with code lists its exports in ``__all__``, and each listed name exists."""
    module = importlib.import_module(module_name)
    exports = getattr(module, "__all__", None)
    assert isinstance(exports, list), f"{module_name} has no __all__ list"
    for name in exports:
        assert hasattr(module, name), f"{module_name}.__all__ names missing {name!r}"


def _tree_classes() -> list[type[BaseException]]:
    """Every subclass of the two roots, found across all imported perdure modules."""
    for name in MODULES:
        importlib.import_module(name)
    found: list[type[BaseException]] = []
    todo: list[type[BaseException]] = [PerdureError, PerdureSignal]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("perdure") and cls not in found:
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def _docstring_tree() -> dict[str, str | None]:
    """Parse the drawn tree in the errors docstring into ``{name: parent name}``."""
    doc = perdure.errors.__doc__ or ""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        match = re.match(r"^([\s│├└─]*)(_?[A-Z]\w+)\b", line)
        # A root names itself (``...Error``, ``...Signal``); below a root, a branch of
        # the drawing names any class (the engine's signals: ``Suspend``, ``Park``...).
        if match is None or not (match.group(2).endswith(("Error", "Signal"))
                                 or match.group(2) in PROMISED_NAMES
                                 or "─ " in match.group(1)):
            continue
        column = len(match.group(1))
        name = match.group(2)
        while stack and stack[-1][0] >= column:
            stack.pop()
        parents[name] = stack[-1][1] if stack else None
        stack.append((column, name))
    return parents


def test_errors_docstring_names_every_exception() -> None:
    """The errors module docstring names every exception class of the tree."""
    doc = perdure.errors.__doc__ or ""
    for cls in _tree_classes():
        assert re.search(rf"\b{cls.__name__}\b", doc), f"{cls.__name__} missing from the tree"


def test_errors_docstring_tree_matches_the_classes() -> None:
    """The drawn tree gives each class its real parent, and draws no class that is gone."""
    drawn = _docstring_tree()
    classes = {cls.__name__: cls for cls in _tree_classes()}
    assert set(drawn) == set(classes)
    for name, parent in drawn.items():
        cls = classes[name]
        if parent is None:
            assert cls in (PerdureError, PerdureSignal)
        else:
            assert classes[parent] in cls.__bases__, f"{name} is drawn under {parent}"


def test_signals_are_not_exceptions() -> None:
    """Control-flow signals cannot be swallowed by ``except Exception``."""
    for cls in _tree_classes():
        if issubclass(cls, PerdureSignal):
            assert not issubclass(cls, Exception), cls.__name__
    assert inspect.isclass(PerdureSignal)
    assert PerdureSignal.__bases__ == (BaseException,)


def _perdure_classes(annotation: object) -> set[type]:
    """The perdure classes an annotation names, inside unions and generics too."""
    found: set[type] = set()
    if isinstance(annotation, type) and annotation.__module__.startswith("perdure"):
        found.add(annotation)
    for arg in typing.get_args(annotation):
        found |= _perdure_classes(arg)
    return found


def _llm_names() -> dict[str, object]:
    """The public names of ``perdure.llm`` (the ``perdure[llm]`` extra's package, which
    ``run.model`` takes and gives types of), or none without the extra."""
    try:
        llm = importlib.import_module("perdure.llm")
    except PerdureError:
        return {}
    return {name: getattr(llm, name) for name in llm.__all__}


LLM_NAMES = _llm_names()


# The faces of the subpackages: what the root does not export (it exports what a user
# writes in an agent or an operator script) is importable from one of these.
FACES = ("perdure.keys", "perdure.engine", "perdure.stores", "perdure.core.cycle",
         "perdure.core.gate")


def _face_names() -> dict[str, object]:
    names: dict[str, object] = {}
    for face in FACES:
        module = importlib.import_module(face)
        names.update({name: getattr(module, name) for name in module.__all__})
    return names


FACE_NAMES = _face_names()


def _exported(found: type) -> bool:
    """Whether a caller can import ``found`` by its name from ``perdure``, from
    ``perdure.llm`` (a model call's types) or from a subpackage's face (``FACES``)."""
    name = found.__name__
    return (getattr(perdure, name, None) is found or LLM_NAMES.get(name) is found
            or FACE_NAMES.get(name) is found)


def _annotation(owner: object, name: str, value: object) -> object:
    """An annotation as written (a string, under ``from __future__ import annotations``),
    evaluated where it was written."""
    if not isinstance(value, str):
        return value
    namespace = {**vars(typing), **vars(collections.abc), **vars(perdure), **LLM_NAMES,
                 **FACE_NAMES,
                 **getattr(owner, "__globals__", {}),
                 **vars(sys.modules[getattr(owner, "__module__", "perdure")])}
    return eval(value, namespace)


# The store protocol and the evaluation cycle's input hand their own layers' types
# (store rows; memory facts): those live under ``perdure.stores`` and ``perdure.core``.
LAYER_INTERFACES = {"Store", "ObjectView"}
EXPORTED_CLASSES = [value for name in perdure.__all__
                    if isinstance(value := getattr(perdure, name), type)
                    and not issubclass(value, BaseException) and name not in LAYER_INTERFACES]


@pytest.mark.parametrize("cls", EXPORTED_CLASSES, ids=lambda cls: cls.__name__)
def test_every_type_the_api_returns_is_exported(cls: type) -> None:
    """What a public method, property or field of an exported class gives back is itself
    importable from ``perdure``: a caller can name the type of what it holds."""
    returned: dict[str, set[type]] = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("_"):
            continue
        fn = member.fget if isinstance(member, property) else member
        annotations = getattr(fn, "__annotations__", None)
        if callable(fn) and isinstance(annotations, dict) and "return" in annotations:
            returned[name] = _perdure_classes(_annotation(fn, "return", annotations["return"]))
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).get("__annotations__", {}).items():
            if not name.startswith("_") and "ClassVar" not in str(value):
                returned[name] = _perdure_classes(_annotation(klass, name, value))
    for name, classes in returned.items():
        for found in classes:
            assert _exported(found), (
                f"{cls.__name__}.{name} gives {found.__module__}.{found.__name__}, "
                "which neither perdure nor perdure.llm exports")


def test_module_level_functions_return_exported_types() -> None:
    """``evaluate``, ``current_step`` and the like return exported types too."""
    for name in perdure.__all__:
        fn = getattr(perdure, name)
        if isinstance(fn, types.FunctionType) and "return" in fn.__annotations__:
            for found in _perdure_classes(_annotation(fn, "return", fn.__annotations__["return"])):
                assert getattr(perdure, found.__name__, None) is found, (name, found)
