"""Several nodes of one cluster in tests: one root certifies every node's key folder."""

from __future__ import annotations

from pathlib import Path

import perdure

__all__ = ["one_root"]


def one_root(root_dir: Path, *key_dirs: Path) -> perdure.KeyFolder:
    """Make ``root_dir`` hold a root (created on first use) and admit each of ``key_dirs``:
    they trust that root and their node keys carry its certificate, as an operator's
    ``perdure keys issue`` / ``install`` / ``trust`` would set them up."""
    root = perdure.KeyFolder(root_dir)
    for key_dir in key_dirs:
        root.admit(perdure.KeyFolder(key_dir))
    return root
