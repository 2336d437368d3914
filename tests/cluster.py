"""Several nodes of one cluster in tests: one root certifies every node's key folder."""

from __future__ import annotations

from pathlib import Path

import perdure

__all__ = ["one_root"]


def one_root(root_dir: Path, *key_dirs: Path | tuple[Path, str]) -> perdure.KeyFolder:
    """Make ``root_dir`` hold a root (created on first use) and admit each of ``key_dirs``:
    they trust that root and their node keys carry its certificate, as an operator's
    ``perdure keys issue`` / ``install`` / ``trust`` would set them up. A key folder
    given as ``(path, name)`` is certified under ``name`` (the node id it acts as),
    else under the folder's name."""
    root = perdure.KeyFolder(root_dir)
    for item in key_dirs:
        key_dir, name = item if isinstance(item, tuple) else (item, item.name)
        root.admit(perdure.KeyFolder(key_dir), name=name)
    return root
