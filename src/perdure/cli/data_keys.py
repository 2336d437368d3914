"""``perdure keys data-key`` and ``perdure keys rotate --data``: the keys of secrets at rest.

The key-encryption keys come from ``--data-keys`` (``PERDURE_DATA_KEYS``: a folder,
``env:NAME`` or ``keyring:SERVICE/USER``), else the App's, else the ``data-keys``
folder of the key folder. See ``docs/howto/secrets.md``.
"""

from __future__ import annotations

from typing import Any

import click

from perdure.keys.data_keys import DataKeys
from perdure.keys.sealer import rewrap

__all__ = ["data_key", "rotate_data"]


def node_data_keys(obj: Any) -> DataKeys:
    """The data keys the CLI's options (and ``--app``) give this node."""
    spec = getattr(obj, "data_keys", None)
    if spec:
        return DataKeys.parse(spec)
    base = obj.loaded()
    if base is not None and not obj.key_dir:
        found: DataKeys = base.data_keys
        return found
    return DataKeys.folder(obj.key_folder().path / "data-keys")


@click.command("data-key")
@click.option("--generate", is_flag=True,
              help="Print a new key-encryption key (base64) for PERDURE_DATA_KEY or the "
                   "OS keyring, and exit.")
@click.pass_obj
def data_key(obj: Any, generate: bool) -> None:
    """Show this node's key-encryption keys and, with a store, what each one wraps."""
    if generate:
        click.echo(DataKeys.generate())
        return
    found = node_data_keys(obj)
    ids = found.ids()
    click.echo(f"data keys from {found.origin}: "
               + (", ".join(f"{k} (current)" if i == 0 else k for i, k in enumerate(ids))
                  or "none yet (the first is made when a secret is first sealed)"))
    if obj.store_url or obj.app_spec:
        counts = obj.app().store.data_key_counts()
        for ident, count in counts.items():
            held = "held" if found.get(ident) is not None else "NOT held by this node"
            click.echo(f"  {ident}: wraps {count} object data key(s), {held}")
        if not counts:
            click.echo("  the store holds no data keys (no secret sealed yet)")


def rotate_data(obj: Any) -> None:
    """Make a new current key-encryption key (in a key folder) and re-wrap every data
    key in the store under it; no memory record is rewritten."""
    found = node_data_keys(obj)
    if found.origin.startswith("key folder"):
        new = found.rotate()
        click.echo(f"new key-encryption key {new} in {found.origin} (the old ones are kept "
                   "for unwrapping; copy the folder to every node that runs secrets)")
    app = obj.app()
    done = rewrap(app.store, found)
    click.echo(f"re-wrapped {done.rewrapped} data key(s) under {done.key_id} "
               f"({done.current} were already under it); no record was rewritten")
    for ident, count in done.missing.items():
        click.echo(f"left {count} data key(s) wrapped under {ident}, which this node does "
                   "not hold: run this again where that key is")
