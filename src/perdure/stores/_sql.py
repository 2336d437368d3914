"""Loading named SQL blocks and migration files shipped beside the stores."""

from __future__ import annotations

from importlib import resources

__all__ = ["load_migrations", "load_queries"]


def load_queries(backend: str) -> dict[str, str]:
    """Parse ``sql/<backend>/queries.sql`` into ``{name: statement}``."""
    text = (resources.files("perdure.stores") / "sql" / backend / "queries.sql").read_text()
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("-- name:"):
            if name is not None:
                queries[name] = "\n".join(lines).strip()
            name = line.removeprefix("-- name:").strip()
            lines = []
        elif name is not None and not line.startswith("--"):
            lines.append(line)
    if name is not None:
        queries[name] = "\n".join(lines).strip()
    return {key: value.rstrip(";") for key, value in queries.items()}


def load_migrations(backend: str) -> list[tuple[int, str, str]]:
    """Every ``sql/<backend>/migrations/NNNN_name.sql`` as ``(version, name, text)`` in order."""
    folder = resources.files("perdure.stores") / "sql" / backend / "migrations"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append((version, entry.name, entry.read_text()))
    return sorted(found)
