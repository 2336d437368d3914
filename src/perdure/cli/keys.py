"""``perdure keys ...``: roots, node certificates, revocation and rotation.

Everything here works on the key folder (``--key-dir``) and, where a command
publishes or lists, on the store (``--store``/``--app``). See
``docs/howto/keys-and-trust.md``.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from perdure.core.trust import (
    Certificate,
    fingerprint,
    key_text,
    parse_public_key,
    public_key_bytes,
    when,
)
from perdure.errors import ConfigurationError
from perdure.keys.folder import KeyFolder, default_node_id

__all__ = ["keys"]


def _folder(obj: Any) -> KeyFolder:
    folder: KeyFolder = obj.key_folder()
    return folder


def _echo(text: str) -> None:
    click.echo(text)


def _when(ts: float | None) -> str:
    return "never" if ts is None else when(ts)


def _time(text: str) -> float:
    """``now``, seconds since the epoch, or an ISO date/time (local time if no zone)."""
    if text == "now":
        return time.time()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError as exc:
        raise ConfigurationError(
            f"--since {text!r} is not a time: use now, seconds since the epoch, or an ISO "
            "date such as 2026-11-24T09:00") from exc


@click.group()
def keys() -> None:
    """Manage trust: roots, node certificates, revocation and rotation."""


@keys.command()
@click.option("--root-only", is_flag=True,
              help="Only create the root (for a folder kept off the worker machines).")
@click.pass_obj
def init(obj: Any, root_only: bool) -> None:
    """Create a root key in the key folder, trust it, and certify this node's key."""
    folder = _folder(obj)
    root = folder.init_root()
    pub = public_key_bytes(root)
    _echo(f"root created in {folder.path}: ed25519:{pub.hex()}")
    if not root_only:
        key = folder.node_key()
        cert = folder.certify_self(obj.node_id or default_node_id(key))
        _echo(f"node key {key_text(cert.public_key)} certified (node.cert)")
    _echo("give the root's public key to every node that should trust it: "
          f"`perdure keys trust ed25519:{pub.hex()}` or PERDURE_TRUST")


@keys.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
def show(obj: Any, as_json: bool) -> None:
    """Show this node's key, its certificate and the roots it trusts."""
    folder = _folder(obj)
    key = folder.node_key()
    public = public_key_bytes(key)
    ring = obj.identity().ring()
    cert = folder.certificate() if (folder.path / "node.cert").exists() else None
    status = "none (node.cert missing)"
    if cert is not None:
        if cert.public_key != public:
            status = "for another key"
        elif not ring.add(cert):
            status = "not issued by a trusted root"
        elif cert.expires_at is not None and cert.expires_at < time.time():
            status = f"expired {_when(cert.expires_at)}"
        else:
            status = f"valid (expires {_when(cert.expires_at)})"
    root = folder.root_key()
    roots = [r.hex() for r in sorted(ring.roots)]
    doc: dict[str, Any] = {
        "key_dir": str(folder.path),
        "node_id": obj.identity().signer().node_id,
        "public_key": public.hex(),
        "fingerprint": fingerprint(public),
        "certificate": status,
        "trusted_roots": roots,
        "root_here": None if root is None else public_key_bytes(root).hex(),
    }
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    _echo(f"key folder   {doc['key_dir']}")
    _echo(f"node id      {doc['node_id']}")
    _echo(f"public key   ed25519:{doc['public_key']}")
    _echo(f"fingerprint  sha256:{doc['fingerprint']}")
    _echo(f"certificate  {status}")
    for r in roots:
        _echo(f"trusts root  ed25519:{r}")
    if not roots:
        _echo("trusts root  none")
    if root is not None:
        _echo(f"root here    ed25519:{doc['root_here']} (root.key: keep it safe)")


@keys.command()
@click.argument("public_key")
@click.option("--name", required=True, help="Who the key belongs to (node id or host).")
@click.option("--days", type=float, help="Valid for this many days (default: no expiry).")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the certificate here.")
@click.option("--publish", "do_publish", is_flag=True,
              help="Also put the certificate into the store (--store or --app).")
@click.pass_obj
def issue(obj: Any, public_key: str, name: str, days: float | None, out: str | None,
          do_publish: bool) -> None:
    """Certify a node's PUBLIC_KEY (64 hex digits) with the root in the key folder."""
    try:
        raw = parse_public_key(public_key)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    cert = _folder(obj).issue(raw, name=name, days=days)
    text = cert.to_bytes().decode()
    if out:
        Path(out).write_text(text + "\n")
        click.echo(f"certificate for {key_text(cert.public_key)} ({name}) written to {out}",
                   err=True)
    else:
        click.echo(text)
    if do_publish:
        obj.app().publish(cert)
        click.echo(f"published in {obj.app().store_url}", err=True)


@keys.command()
@click.argument("cert_file")
@click.option("--publish", "do_publish", is_flag=True,
              help="Also put the certificate into the store (--store or --app).")
@click.pass_obj
def install(obj: Any, cert_file: str, do_publish: bool) -> None:
    """Install CERT_FILE (- for stdin) as this node's certificate."""
    data = sys.stdin.read() if cert_file == "-" else Path(cert_file).read_text()
    try:
        cert = Certificate.from_bytes(data.strip())
    except ValueError as exc:
        raise ConfigurationError(f"{cert_file}: {exc}") from None
    folder = _folder(obj)
    folder.install_certificate(cert)
    ring = obj.identity().ring()
    trusted = cert.issuer in ring.roots and cert.intact()
    _echo(f"installed certificate for key {key_text(cert.public_key)} ({cert.name})")
    if not trusted:
        click.echo(f"warning: its issuer ed25519:{cert.issuer.hex()} is not among this node's "
                   "trusted roots; add it with `perdure keys trust`", err=True)
    if do_publish:
        obj.app().publish(cert)


@keys.command()
@click.argument("root_public_key")
@click.pass_obj
def trust(obj: Any, root_public_key: str) -> None:
    """Trust ROOT_PUBLIC_KEY (64 hex digits): add it to the key folder's roots file."""
    try:
        raw = parse_public_key(root_public_key)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    _folder(obj).trust(raw)
    _echo(f"{_folder(obj).path / 'roots'} now trusts ed25519:{raw.hex()}")


@keys.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
def list_(obj: Any, as_json: bool) -> None:
    """List the names trusted roots certified (node ids and people) and their keys, as
    the certificates in this folder and the store say, and whether each counts now."""
    app = obj.app()
    verifier = app.verifier
    verifier.refresh()
    rows = []
    pairs = [(name, public) for name, keys in verifier.names().items() for public in keys]
    strangers = verifier.ring.strangers()
    pairs += [(name, public) for name, keys in strangers.items() for public in keys]
    for node_id, public in sorted(pairs):
        why = (verifier.ring.unknown_name(node_id) if node_id in strangers
               else verifier.ring.problem(public, name=node_id))
        certs = [c for c in verifier.ring.certificates(public) if c.name == node_id]
        expires = max((c.expires_at or float("inf") for c in certs), default=None)
        rows.append({"node_id": node_id, "public_key": public.hex(),
                     "fingerprint": fingerprint(public),
                     "trusted": why is None, "problem": why,
                     "expires": None if expires in (None, float("inf")) else expires,
                     "revoked_since": verifier.ring.revoked_since(public)})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        if row["revoked_since"] is not None and not row["trusted"]:
            state = (f"REVOKED from {_when(row['revoked_since'])} (records stamped before "
                     "still count)")
        else:
            state = "trusted" if row["trusted"] else f"NOT TRUSTED: {row['problem']}"
        extra = f", expires {_when(row['expires'])}" if row["expires"] else ""
        _echo(f"{row['node_id']}  {key_text(bytes.fromhex(row['public_key']))}  {state}{extra}")
    if not rows:
        _echo(f"no key is certified by a root this node trusts ({verifier.ring.roots_text()})")


@keys.command()
@click.argument("key")
@click.option("--since", default="now", show_default=True,
              help="Records signed from this time on no longer count (now, epoch seconds, "
                   "or an ISO date).")
@click.option("--reason", required=True, help="Why (kept in the revocation).")
@click.option("--publish/--no-publish", "do_publish", default=True, show_default=True,
              help="Also put the revocation into the store.")
@click.pass_obj
def revoke(obj: Any, key: str, since: str, reason: str, do_publish: bool) -> None:
    """Revoke KEY (a public key, a fingerprint, or a name certified for one key)."""
    folder = _folder(obj)
    key_fp, shown = _fingerprint_of(obj, key)
    revocation = folder.revoke(key_fp, since=_time(since), reason=reason)
    _echo(f"revoked key {shown} from {_when(revocation.since)}: {reason}")
    if do_publish:
        obj.app().publish(revocation)
        _echo(f"published in {obj.app().store_url}; nodes that trust this root refuse "
              "records it signs from then on")


def _fingerprint_of(obj: Any, key: str) -> tuple[str, str]:
    """The fingerprint of the key ``key`` names (a name certified for one key, a public
    key, ``ed25519:KEY`` or ``sha256:FINGERPRINT``), and how to show that key."""
    names = obj.app().verifier.names()
    if key in names:
        if len(names[key]) > 1:
            raise ConfigurationError(
                f"{key!r} is certified for {len(names[key])} keys; name the one to revoke "
                "by its public key or fingerprint (see `perdure keys list`)")
        return fingerprint(names[key][0]), key_text(names[key][0])
    lowered = key.strip().lower()
    if lowered.startswith("sha256:"):
        lowered = lowered[7:]
        if len(lowered) == 64 and all(c in "0123456789abcdef" for c in lowered):
            return lowered, f"with fingerprint sha256:{lowered[:16]}…"
    for keys in names.values():
        for public in keys:
            if fingerprint(public) == lowered:
                return lowered, key_text(public)
    try:
        raw = parse_public_key(key)
    except ValueError:
        raise ConfigurationError(
            f"{key!r} is neither a certified name, a public key (ed25519:HEX) nor a key "
            "fingerprint (sha256:HEX)") from None
    return fingerprint(raw), key_text(raw)


@keys.command()
@click.option("--days", type=float, help="Validity of the new key's certificate.")
@click.option("--data", is_flag=True,
              help="Rotate the key-encryption key of secrets at rest instead: a new one, "
                   "and every data key in the store re-wrapped under it.")
@click.pass_obj
def rotate(obj: Any, days: float | None, data: bool) -> None:
    """Give this node a new key (the old one is kept as node.key.<fingerprint>.old);
    with --data, re-wrap the data keys of secrets under a new key-encryption key."""
    if data:
        from perdure.cli.data_keys import rotate_data

        rotate_data(obj)
        return
    folder = _folder(obj)
    node_id = obj.identity().signer().node_id  # the name the old key speaks for
    new = folder.rotate()
    public = public_key_bytes(new)
    _echo(f"new node key ed25519:{public.hex()} for node id {node_id}")
    if folder.root_key() is not None:
        folder.certify_self(node_id, days=days)
        _echo("certified with the root in this folder (node.cert)")
    else:
        _echo(f"certify it where the root is: perdure keys issue {public.hex()} "
              f"--name {node_id} --publish")
    _echo(f"records {node_id!r} signed with the old key keep verifying under its certificate")


@keys.command()
@click.pass_obj
def protect(obj: Any) -> None:
    """Encrypt the key folder's private keys with the passphrase in PERDURE_KEY_PASSPHRASE
    (or the file PERDURE_KEY_PASSPHRASE_FILE names)."""
    folder = _folder(obj)
    if not folder.passphrase:
        raise ConfigurationError("give the passphrase to protect the keys with: set "
                                 "PERDURE_KEY_PASSPHRASE, or pass --key-passphrase-file FILE "
                                 "(PERDURE_KEY_PASSPHRASE_FILE)")
    done = folder.protect()
    _echo(f"protected {', '.join(done)} in {folder.path} with the passphrase")
