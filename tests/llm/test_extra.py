"""The optional extra: perdure imports without it; perdure.llm says how to install it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.llm.conftest import MISSING_EXTRA

BLOCKED = textwrap.dedent("""
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {BLOCK!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, Block())
    import perdure
    import perdure.demo
    try:
        import perdure.llm
    except perdure.ConfigurationError as exc:
        print("ConfigurationError:", exc)
    else:
        print("imported")
""")


def _run_without(*modules: str) -> str:
    code = BLOCKED.replace("{BLOCK!r}", repr(set(modules)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout.strip()


def test_the_extra_is_installed_here() -> None:
    """The rest of tests/llm runs only with ``perdure[llm]``; without it, this says why."""
    if MISSING_EXTRA is not None:
        pytest.skip(f"perdure[llm] is not installed ({MISSING_EXTRA}); tests/llm skipped")


@pytest.mark.parametrize(("blocked", "named"), [
    (("openai", "anthropic", "bpe_openai"), "openai"),
    (("anthropic",), "anthropic"),
    (("bpe_openai",), "bpe-openai"),
])
def test_import_without_the_extra_names_the_install(blocked: tuple[str, ...],
                                                    named: str) -> None:
    """Without an SDK, ``import perdure`` still works and ``import perdure.llm`` raises a
    ``ConfigurationError`` naming the missing package and ``pip install 'perdure[llm]'``."""
    out = _run_without(*blocked)
    assert out.startswith("ConfigurationError:"), out
    assert f"{named!r}" in out
    assert "pip install 'perdure[llm]'" in out
