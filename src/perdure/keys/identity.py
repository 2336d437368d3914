"""A node's identity and trust, as an ``App`` holds them: key, certificate, roots.

Which roots a node trusts comes from its configuration (``App(trust=...)``,
``--trust``/``PERDURE_TRUST``) or, by default, from its key folder's ``roots`` file;
never from the store. The store only carries certificates and revocations, which
count when a trusted root signed them.

Who a node is comes from its certificate: its node id is a name a trusted root
certified its key under (by default the name in ``node.cert``). A node configured
with another id acts under it only once a root certified its key under that id too;
otherwise ``NodeIdentityError`` before it writes or sends anything.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from perdure.core.chain import Signer
from perdure.core.trust import (
    Certificate,
    KeyRing,
    key_text,
    parse_public_key,
    public_key_bytes,
    when,
)
from perdure.errors import ConfigurationError, NodeIdentityError
from perdure.keys.anchors import HeadAnchors
from perdure.keys.folder import KeyFolder, default_node_id, read_roots
from perdure.keys.verifier import Verifier
from perdure.stores.base import Store

__all__ = ["NodeIdentity", "TrustSpec", "parse_trust"]

TrustSpec = str | os.PathLike[str] | bytes | Sequence[str | os.PathLike[str] | bytes]


def parse_trust(spec: TrustSpec) -> list[bytes]:
    """Root public keys from a trust setting.

    Accepts a key (64 hex digits, optionally ``ed25519:``-prefixed, or 32 raw bytes), a
    roots file (one key per line), a key folder (its ``roots`` file), or a list of
    those; a string may hold several, separated by commas.
    """
    items: list[str | os.PathLike[str] | bytes]
    items = [spec] if isinstance(spec, bytes | str | os.PathLike) else list(spec)
    roots: list[bytes] = []
    for item in items:
        if isinstance(item, bytes):
            if len(item) != 32:
                raise ConfigurationError("a trusted root given as bytes must be 32 raw bytes")
            roots.append(item)
            continue
        parts = [p.strip() for p in str(item).split(",")] if isinstance(item, str) else [item]
        for part in parts:
            if part == "":
                continue
            roots.extend(_one_root(part))
    if not roots:
        raise ConfigurationError(f"trust setting {spec!r} names no root key")
    return roots


def _one_root(part: str | os.PathLike[str]) -> list[bytes]:
    text = str(part)
    if isinstance(part, str):
        try:
            return [parse_public_key(text)]
        except ValueError:
            pass
    path = Path(text)
    if path.is_dir():
        KeyFolder(path).check_folder()
        path = path / "roots"
    try:
        mode = path.stat().st_mode
        if mode & 0o022 or path.parent.stat().st_mode & 0o002:
            raise ConfigurationError(
                f"trusted roots file {path} (or its folder) may be written by others, who "
                f"could add a root of their own; run `chmod 644 {path}` and `chmod go-w "
                f"{path.parent}`")
        content = path.read_text()
    except OSError as exc:
        raise ConfigurationError(
            f"trusted root {text!r} is neither a public key (64 hex digits) nor a readable "
            f"roots file or key folder ({exc.strerror or exc})") from exc
    return read_roots(content, str(path))


class NodeIdentity:
    """This node's key folder, signer, trusted roots and certificate."""

    def __init__(self, key_dir: Path, *, node_id: str | None, trust: TrustSpec | None,
                 passphrase: bytes | None) -> None:
        self.folder = KeyFolder(key_dir, passphrase)
        self._node_id = node_id
        self._trust = trust
        self._roots: list[bytes] | None = None if trust is None else parse_trust(trust)
        self._lock = threading.RLock()
        self._signer: Signer | None = None
        self._cert: Certificate | None = None

    @property
    def node_id_setting(self) -> str | None:
        """The node id given in the configuration (``None``: derived from the key)."""
        return self._node_id

    @property
    def explicit_trust(self) -> bool:
        """Whether the roots come from the configuration rather than the key folder."""
        return self._roots is not None

    def signer(self) -> Signer:
        """This node's id and signing key (the key created on first use). The id is the
        configured one, else the name ``node.cert`` certifies this key under, else
        ``hostname-keyfingerprint``."""
        with self._lock:
            if self._signer is None:
                key: Ed25519PrivateKey = self.folder.node_key()
                name = self._node_id
                if name is None:
                    cert = (self.folder.certificate() if self.folder.certificate_installed()
                            else None)
                    ours = cert is not None and cert.public_key == public_key_bytes(key)
                    name = cert.name if ours and cert is not None else default_node_id(key)
                self._signer = Signer(name, key)
            return self._signer

    def roots(self) -> list[bytes]:
        """The root public keys this node trusts."""
        if self._roots is not None:
            return list(self._roots)
        return self.folder.roots()

    def ring(self) -> KeyRing:
        """A fresh ``KeyRing`` of the trusted roots, with this folder's certificate and
        revocations."""
        return self.folder.ring(self._roots)

    def certified(self, store: Store) -> Certificate:
        """This node's certificate under its node id, found or made, and published in
        ``store``.

        On one machine with nothing configured, the first use creates a root in the key
        folder and certifies this node's key with it. Otherwise the certificate comes
        from ``node.cert`` or from the store (the newest one still valid), or from the
        root key kept in the folder (which may certify its node's key under any id it
        is given: whoever holds a root can name anyone). ``NodeIdentityError`` when
        the key is certified, but under other names than the node id; ``ConfigurationError``
        says what to run when there is no certificate, when it expired, when the key
        was revoked, or when the installed certificate comes from a root this node does
        not trust.
        """
        with self._lock:
            if self._cert is not None:
                return self._cert
            signer = self.signer()
            if self._roots is None and not self.folder.certificate_installed():
                self.folder.ensure_trust(signer.node_id)
            ring = self.ring()
            ring.offer(store.trust_items())
            public = public_key_bytes(signer.private_key)
            name = signer.node_id
            cert = self._find(ring, public, name)
            if cert is None:
                root = self.folder.root_key()
                if root is not None and public_key_bytes(root) in ring.roots:
                    cert = self.folder.issue(public, name=name)
                    ring.add(cert)
                    if self._find(ring, public, name) is None:  # pragma: no cover
                        cert = None
            revoked = ring.revoked_since(public)
            if revoked is not None and revoked <= time.time():
                raise ConfigurationError(
                    f"this node's key {key_text(public)} was revoked (from {when(revoked)}); "
                    "records it signs do not count: give the node a new key with `perdure "
                    "keys rotate` and have it certified")
            if cert is None and ring.certificates(public):
                raise NodeIdentityError(self._misnamed(ring, public, name))
            if cert is None:
                raise ConfigurationError(self._uncertified(ring, public, name))
            if cert.expires_at is not None and cert.expires_at < time.time():
                raise ConfigurationError(
                    f"this node's certificate (key {key_text(public)}) expired at "
                    f"{when(cert.expires_at)}; where the root key is, run `perdure keys issue "
                    f"{public.hex()} --name {name} --publish` (or `--out FILE`, then "
                    "`perdure keys install FILE` here)")
            store.publish_trust(_item_id("certificate", cert.to_bytes()), "certificate",
                                cert.to_bytes(), time.time())
            self._cert = cert
            return cert

    def _uncertified(self, ring: KeyRing, public: bytes, name: str) -> str:
        """What to tell a node whose key no trusted root certified."""
        installed = self.folder.certificate() if self.folder.certificate_installed() else None
        if installed is not None and installed.public_key == public and (
                installed.issuer not in ring.roots):
            return (f"this node's certificate ({self.folder.path / 'node.cert'}) was issued "
                    f"by root ed25519:{installed.issuer.hex()}, which this node does not "
                    f"trust; run `perdure keys trust ed25519:{installed.issuer.hex()}` (or "
                    "set --trust / PERDURE_TRUST)")
        return (f"this node's key ed25519:{public.hex()} (folder {self.folder.path}) is not "
                f"certified by a root it trusts ({ring.roots_text()}); where the root key is, "
                f"run `perdure keys issue {public.hex()} --name {name} --publish` (or "
                "`--out FILE`, then `perdure keys install FILE` here)")

    def _misnamed(self, ring: KeyRing, public: bytes, name: str) -> str:
        """What to tell a node whose key is certified, but not under ``name``."""
        carried = sorted({c.name for c in ring.certificates(public)})
        shown = ", ".join(repr(n) for n in carried)
        return (f"this node's key {key_text(public)} (folder {self.folder.path}) is "
                f"certified as {shown}, not as {name!r}: a key acts only under a name its "
                f"certificate carries. Drop --node-id / PERDURE_NODE_ID (or node_id=) to "
                f"act as {carried[0]!r}, or, where the root key is, run `perdure keys "
                f"issue {public.hex()} --name {name} --publish`")

    def _find(self, ring: KeyRing, public: bytes, name: str) -> Certificate | None:
        """The newest certificate of ``public`` under ``name`` the ring accepts (from
        ``node.cert`` or the store), preferring one still valid; kept in ``node.cert``
        if it came from the store and ``node.cert`` holds no certificate of this key
        under another name (the node's own name, its default id, stays)."""
        local = self.folder.certificate() if self.folder.certificate_installed() else None
        if local is not None and local.public_key == public:
            ring.add(local)
        found = [c for c in ring.certificates(public) if c.name == name]
        if not found:
            return None
        now = time.time()
        valid = [c for c in found if c.expires_at is None or c.expires_at >= now]
        best = max(valid or found, key=lambda c: c.issued_at)
        if best != local and (local is None or local.public_key != public
                              or local.name == name):
            self.folder.install_certificate(best)
        return best

    def verifier(self, store: Store) -> Verifier:
        """A ``Verifier`` over ``store`` with this node's roots."""
        return Verifier(store, self.ring())

    def anchors(self) -> HeadAnchors:
        """The heads this node saw, kept in its key folder."""
        path = self.folder.heads_path if self.folder.exists() else None
        return HeadAnchors(path)


def _item_id(kind: str, body: bytes) -> str:
    return f"{kind}:{hashlib.sha256(body).hexdigest()[:32]}"


def publish(store: Store, item: Certificate | object, now: float | None = None) -> None:
    """Put a certificate or revocation into ``store`` (once)."""
    from perdure.core.trust import Revocation

    if isinstance(item, Certificate):
        kind, body = "certificate", item.to_bytes()
    elif isinstance(item, Revocation):
        kind, body = "revocation", item.to_bytes()
    else:
        raise TypeError(f"cannot publish {item!r}")
    store.publish_trust(_item_id(kind, body), kind, body, time.time() if now is None else now)
