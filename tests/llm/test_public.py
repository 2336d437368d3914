"""The public surface of ``perdure.llm`` and ``perdure.llm.scripted``."""

from __future__ import annotations

import types

import pytest

import perdure
import perdure.llm
import perdure.llm.scripted


@pytest.mark.parametrize("package", [perdure.llm, perdure.llm.scripted])
def test_all_equals_the_public_names(package: types.ModuleType) -> None:
    """``__all__`` is sorted, unique, and lists exactly the public attributes."""
    exports = package.__all__
    assert exports == sorted(exports) and len(set(exports)) == len(exports)
    public = {name for name, value in vars(package).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType)
              and type(value).__module__ != "__future__"}
    assert set(exports) == public


def test_the_perdure_namespace_is_unchanged() -> None:
    """Model calls live in ``perdure.llm``; nothing of them is in ``perdure`` itself
    (``ModelQuota`` is flow control, declared like a ``Queue``, and needs no extra)."""
    assert not any(name.startswith(("Model", "Chat", "Anthropic", "Responses"))
                   for name in perdure.__all__ if name != "ModelQuota")


def test_model_call_error_is_a_perdure_error() -> None:
    """``ModelCallError`` is under the one root, like every error perdure raises."""
    assert issubclass(perdure.llm.ModelCallError, perdure.PerdureError)
