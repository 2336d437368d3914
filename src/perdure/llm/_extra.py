"""The check that ``perdure[llm]`` is installed, made when ``perdure.llm`` is imported.

The package's modules import the SDKs and the token encodings only when first used (an
``import perdure.llm`` stays light), so their presence is checked here, by name.
"""

from __future__ import annotations

import importlib.util

from perdure.errors import ConfigurationError

__all__ = ["EXTRA_PACKAGES", "require_extra"]

EXTRA_PACKAGES = (("openai", "openai"), ("anthropic", "anthropic"),
                  ("bpe_openai", "bpe-openai"))
"""(module, distribution) pairs the extra installs."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a finder that refuses the name outright
        return False


def require_extra() -> None:
    """Raise ``ConfigurationError`` naming the first missing package and the install."""
    for module, package in EXTRA_PACKAGES:
        if not _installed(module):
            raise ConfigurationError(
                f"perdure.llm needs the {package!r} package, which is not installed: "
                "pip install 'perdure[llm]'"
            )
