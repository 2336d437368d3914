"""A node's key folder: its Ed25519 key, the roots it trusts, its certificate.

Everything here lives outside the store, on the node's own disk::

    KEYDIR/                     0700, never writable by others
      node.key                  this node's private key (PEM, 0600; may be passphrase-protected)
      node.cert                 the certificate a root issued for node.key
      roots                     root public keys this node trusts, one per line
      revocations               revocations this node was given, one JSON per line
      root.key                  a root private key (only where a root was created)
      heads.db                  the highest head this node wrote or checked, per object

On a machine that has none of these, the first use makes a root in the folder, trusts
it, and certifies the node key with it: one machine needs no set-up. For several
machines, see ``docs/howto/keys-and-trust.md``.

Where the folder is, unless ``--key-dir`` / ``PERDURE_KEY_DIR`` / ``App(key_dir=...)``
says: ``keys/`` beside the database file for a SQLite store (so every command given
the same ``--store`` uses the keys its workers use), ``~/.perdure/keys`` for any other
store (``default_key_dir``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from perdure.core.trust import (
    Certificate,
    KeyRing,
    Revocation,
    fingerprint,
    issue_certificate,
    issue_revocation,
    parse_public_key,
    public_key_bytes,
)
from perdure.errors import ConfigurationError

__all__ = ["KeyFolder", "default_key_dir", "default_node_id", "public_bytes", "read_roots"]

NODE_KEY = "node.key"
NODE_CERT = "node.cert"
ROOT_KEY = "root.key"
ROOTS = "roots"
REVOCATIONS = "revocations"
HEADS = "heads.db"


def default_key_dir(store: str | None = None) -> Path:
    """Where a node keeps its keys unless told otherwise: for a SQLite store
    (``sqlite:///dir/agents.db``), ``keys`` beside the database file (``dir/keys``);
    for any other store, or none, ``~/.perdure/keys``."""
    from perdure.stores import sqlite_file

    database = sqlite_file(store) if store is not None else None
    if database is not None:
        return database.parent / "keys"
    return Path.home() / ".perdure" / "keys"


def public_bytes(key: Ed25519PrivateKey) -> bytes:
    """The raw 32-byte public key."""
    return public_key_bytes(key)


def default_node_id(key: Ed25519PrivateKey) -> str:
    """``hostname-fingerprint``: stable for one key on one host."""
    return f"{socket.gethostname()}-{hashlib.sha256(public_bytes(key)).hexdigest()[:8]}"


def read_roots(text: str, origin: str) -> list[bytes]:
    """Root public keys from a roots file's text: one key per line, ``#`` comments."""
    roots: list[bytes] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            roots.append(parse_public_key(line.split()[0]))
        except ValueError as exc:
            raise ConfigurationError(f"{origin}, line {number}: {exc}") from exc
    return roots


class KeyFolder:
    """One key folder. Reading never creates anything; ``node_key`` creates the node's
    key on first use and ``ensure_trust`` the one-machine root."""

    def __init__(self, path: str | os.PathLike[str], passphrase: bytes | None = None) -> None:
        self.path = Path(path)
        self.passphrase = passphrase
        self._held = 0  # depth of ``_locked`` calls holding the folder's lock
        self._thread_lock = threading.RLock()

    def __repr__(self) -> str:
        return f"KeyFolder({str(self.path)!r})"

    # -- the folder and its files ----------------------------------------------------

    def _file(self, name: str) -> Path:
        return self.path / name

    def exists(self) -> bool:
        """Whether the folder exists."""
        return self.path.is_dir()

    def _make(self) -> None:
        """Create the folder (and missing parents) as 0700, whatever the umask."""
        missing = []
        here = self.path
        while not here.exists():
            missing.append(here)
            if here.parent == here:
                break
            here = here.parent
        for folder in reversed(missing):
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=0o700)
            os.chmod(folder, 0o700)
        self.check_folder()

    def check_folder(self) -> None:
        """Refuse a folder that others may write to (they could swap the keys)."""
        try:
            mode = self.path.stat().st_mode
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ConfigurationError(f"key folder {self.path} cannot be read: {exc}") from exc
        if mode & 0o022:
            raise ConfigurationError(
                f"key folder {self.path} is writable by {_who(mode, 0o020, 0o002)}, who could "
                f"replace its keys; run `chmod 700 {self.path}`"
            )

    def _check_private(self, path: Path) -> None:
        mode = path.stat().st_mode
        if mode & 0o077:
            raise ConfigurationError(
                f"private key {path} is readable by {_who(mode, 0o070, 0o007)}; "
                f"run `chmod 600 {path}`"
            )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the folder's lock (``.lock``, an advisory ``flock``) for a read-modify-write
        of its files: several processes (or Apps) may set the folder up at once."""
        with self._thread_lock:  # reentrant: a nested call in this thread goes on
            if self._held:
                self._held += 1
                try:
                    yield
                finally:
                    self._held -= 1
                return
            self._make()
            fd = os.open(self._file(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._held = 1
                yield
            finally:
                self._held = 0
                os.close(fd)  # releases the lock

    def _staged(self, name: str, data: bytes, mode: int) -> str:
        """``data`` written and synced to a temporary file beside ``name``, with ``mode``."""
        self._make()
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f".{name}-", suffix=".tmp")
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, mode)
        return tmp

    def _write_new(self, name: str, data: bytes, mode: int) -> bool:
        """Write ``name`` atomically unless it exists; ``False`` if another process won."""
        tmp = self._staged(name, data, mode)
        try:
            os.link(tmp, self._file(name))
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def _replace(self, name: str, data: bytes, mode: int) -> None:
        """Write ``name`` atomically, replacing it if it exists."""
        os.replace(self._staged(name, data, mode), self._file(name))

    # -- private keys ----------------------------------------------------------------

    def _pem(self, key: Ed25519PrivateKey) -> bytes:
        crypt: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(self.passphrase) if self.passphrase
            else serialization.NoEncryption())
        return key.private_bytes(serialization.Encoding.PEM,
                                 serialization.PrivateFormat.PKCS8, crypt)

    def _load_private(self, path: Path) -> Ed25519PrivateKey:
        self.check_folder()
        self._check_private(path)
        data = path.read_bytes()
        encrypted = b"ENCRYPTED" in data.split(b"\n", 1)[0]
        if encrypted and not self.passphrase:
            raise ConfigurationError(
                f"{path} is protected by a passphrase: set PERDURE_KEY_PASSPHRASE, or pass "
                "--key-passphrase-file FILE (PERDURE_KEY_PASSPHRASE_FILE), or "
                "key_passphrase= to App"
            )
        try:
            loaded = serialization.load_pem_private_key(
                data, password=self.passphrase if encrypted else None)
        except (ValueError, TypeError) as exc:
            if encrypted:
                raise ConfigurationError(
                    f"{path}: the passphrase does not open this key") from exc
            raise ConfigurationError(f"{path} is not a readable Ed25519 key: {exc}") from exc
        if not isinstance(loaded, Ed25519PrivateKey):
            raise ConfigurationError(f"{path} holds a key that is not Ed25519")
        return loaded

    def node_key(self, *, create: bool = True) -> Ed25519PrivateKey:
        """This node's private key, created (0600, in a 0700 folder) on first use."""
        path = self._file(NODE_KEY)
        try:
            if not path.exists():
                if not create:
                    raise ConfigurationError(f"no node key in {self.path}")
                self._write_new(NODE_KEY, self._pem(Ed25519PrivateKey.generate()), 0o600)
            return self._load_private(path)
        except OSError as exc:
            raise ConfigurationError(
                f"key folder {self.path} cannot be used ({exc}); pass key_dir= to App "
                "or set PERDURE_KEY_DIR to a writable folder"
            ) from exc

    def root_key(self) -> Ed25519PrivateKey | None:
        """The root private key kept here, if this folder holds one."""
        path = self._file(ROOT_KEY)
        if not path.exists():
            return None
        return self._load_private(path)

    def init_root(self) -> Ed25519PrivateKey:
        """Create a root key here (refusing to replace one) and trust it."""
        if self._file(ROOT_KEY).exists():
            raise ConfigurationError(f"{self._file(ROOT_KEY)} exists already; a root is "
                                     "made once (keep it, and its backups, safe)")
        root = Ed25519PrivateKey.generate()
        if not self._write_new(ROOT_KEY, self._pem(root), 0o600):
            loaded = self.root_key()
            assert loaded is not None
            return loaded
        self.trust(public_key_bytes(root), note="created here")
        return root

    # -- trust -----------------------------------------------------------------------

    def roots(self) -> list[bytes]:
        """The root public keys this folder trusts (its ``roots`` file). ``ConfigurationError``
        when the folder or the file may be written by others (they could add a root)."""
        path = self._file(ROOTS)
        self.check_folder()
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ConfigurationError(f"{path} cannot be read: {exc}") from exc
        if mode & 0o022:
            raise ConfigurationError(
                f"{path} is writable by {_who(mode, 0o020, 0o002)}, who could add a root of "
                f"their own; run `chmod 644 {path}`")
        try:
            text = path.read_text()
        except FileNotFoundError:
            return []
        except (OSError, UnicodeError) as exc:
            raise ConfigurationError(f"{path} cannot be read: {exc}") from exc
        return read_roots(text, str(path))

    def trust(self, root: bytes, note: str = "") -> None:
        """Add ``root`` to the trusted roots (once)."""
        with self._locked():
            if root in self.roots():
                return
            line = f"ed25519:{root.hex()}" + (f"  # {note}" if note else "") + "\n"
            old = self._file(ROOTS).read_bytes() if self._file(ROOTS).exists() else b""
            self._replace(ROOTS, old + line.encode(), 0o644)

    def certificate_installed(self) -> bool:
        """Whether ``node.cert`` exists."""
        return self._file(NODE_CERT).exists()

    def certificate(self) -> Certificate | None:
        """The certificate in ``node.cert``, if any (not checked here)."""
        path = self._file(NODE_CERT)
        if not path.exists():
            return None
        try:
            return Certificate.from_bytes(path.read_bytes())
        except ValueError as exc:
            raise ConfigurationError(f"{path} is not a perdure certificate: {exc}") from exc

    def install_certificate(self, cert: Certificate) -> None:
        """Keep ``cert`` as this node's certificate (it must be for this node's key)."""
        key = public_key_bytes(self.node_key())
        if cert.public_key != key:
            raise ConfigurationError(
                f"that certificate is for key {cert.fingerprint[:16]}, not this node's key "
                f"{fingerprint(key)[:16]} ({self.path})")
        self._replace(NODE_CERT, cert.to_bytes() + b"\n", 0o644)

    def revocations(self) -> list[Revocation]:
        """The revocations kept in this folder."""
        path = self._file(REVOCATIONS)
        if not path.exists():
            return []
        found = []
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    found.append(Revocation.from_bytes(line))
                except ValueError as exc:
                    raise ConfigurationError(f"{path}, line {number}: {exc}") from exc
        return found

    def add_revocation(self, revocation: Revocation) -> None:
        """Keep ``revocation`` in this folder."""
        with self._locked():
            path = self._file(REVOCATIONS)
            old = path.read_bytes() if path.exists() else b""
            self._replace(REVOCATIONS, old + revocation.to_bytes() + b"\n", 0o644)

    def ensure_trust(self, name: str) -> None:
        """One machine, first use: with no roots configured and no root here, create a
        root, trust it, and certify this node's key with it.

        A folder that trusts roots, or holds an installed certificate (an operator's
        ``perdure keys install``), is left alone: it belongs to a cluster with a root
        elsewhere.
        """
        if self.roots() or self.certificate_installed():
            return
        with self._locked():  # a root.key without roots: another process is setting up
            if self.roots() or self._file(ROOT_KEY).exists():
                return  # another process set it up meanwhile
            self.node_key()
            self.init_root()
            self.certify_self(name)

    def certify_self(self, name: str, days: float | None = None) -> Certificate:
        """Certify this node's key with the root kept here (``node.cert``)."""
        root = self.root_key()
        if root is None:
            raise ConfigurationError(f"{self.path} holds no root key to certify with")
        cert = issue_certificate(root, public_key_bytes(self.node_key()), name=name,
                                 now=time.time(), days=days)
        self.install_certificate(cert)
        return cert

    def issue(self, public_key: bytes, *, name: str, days: float | None = None
              ) -> Certificate:
        """Certify another node's ``public_key`` with the root kept here."""
        root = self.root_key()
        if root is None:
            raise ConfigurationError(
                f"{self.path} holds no root key (root.key); run this where the root is, "
                "or create one with `perdure keys init`")
        return issue_certificate(root, public_key, name=name, now=time.time(), days=days)

    def admit(self, other: KeyFolder, *, name: str | None = None,
              days: float | None = None) -> Certificate:
        """Bring the node of key folder ``other`` into this folder's trust: ``other``
        trusts the roots this folder trusts, and its node key gets a certificate from
        the root kept here (creating that root on first use). The way to give several
        nodes on one machine, or in tests, one root."""
        if self.root_key() is None:
            self.ensure_trust(self.path.name)
        for root in self.roots():
            other.trust(root)
        public = public_key_bytes(other.node_key())
        cert = self.issue(public, name=name or other.path.name, days=days)
        other.install_certificate(cert)
        return cert

    def revoke(self, key_fingerprint: str, *, since: float, reason: str) -> Revocation:
        """Revoke a key with the root kept here, and keep the revocation here."""
        root = self.root_key()
        if root is None:
            raise ConfigurationError(f"{self.path} holds no root key (root.key) to revoke with")
        revocation = issue_revocation(root, key_fingerprint, since=since, reason=reason,
                                      now=time.time())
        self.add_revocation(revocation)
        return revocation

    def rotate(self) -> Ed25519PrivateKey:
        """Replace the node key with a new one; the old one is kept as
        ``node.key.<fingerprint>.old`` and its certificate removed from ``node.cert``."""
        old = self.node_key()
        fp = fingerprint(public_key_bytes(old))[:16]
        self._file(NODE_KEY).rename(self._file(f"{NODE_KEY}.{fp}.old"))
        with contextlib.suppress(FileNotFoundError):
            self._file(NODE_CERT).rename(self._file(f"{NODE_CERT}.{fp}.old"))
        return self.node_key()

    def protect(self) -> list[str]:
        """Rewrite the private keys kept here encrypted with ``passphrase``; their names."""
        if not self.passphrase:
            raise ConfigurationError("no passphrase to protect the keys with")
        done = []
        for name in (NODE_KEY, ROOT_KEY):
            if self._file(name).exists():
                key = self._load_private(self._file(name))
                self._replace(name, self._pem(key), 0o600)
                done.append(name)
        return done

    def ring(self, extra_roots: list[bytes] | None = None) -> KeyRing:
        """A ``KeyRing`` of the trusted roots (``extra_roots`` if given, else the folder's),
        with this folder's certificate and revocations offered."""
        ring = KeyRing(frozenset(self.roots() if extra_roots is None else extra_roots))
        cert = self.certificate() if self._file(NODE_CERT).exists() else None
        if cert is not None:
            ring.add(cert)
        for revocation in self.revocations():
            ring.add(revocation)
        return ring

    @property
    def heads_path(self) -> Path:
        """Where this node keeps the heads it saw (``heads.db``)."""
        return self._file(HEADS)


def _who(mode: int, group: int, other: int) -> str:
    parts = [name for bits, name in ((group, "its group"), (other, "everyone")) if mode & bits]
    return " and ".join(parts)

