"""``DataKeys``: where a node's key-encryption keys come from.

A key-encryption key (KEK, 32 bytes) wraps the per-object data keys that seal secrets
(``perdure.core.sealing``). It never goes into the store. A node holds one *current*
KEK, which wraps new data keys, and may hold older ones, still accepted for
unwrapping until ``perdure keys rotate --data`` has re-wrapped every data key.

Sources (``DataKeys.parse`` reads the same as a one-line spec, e.g. ``--data-keys``):

- a **folder** (the default: ``data-keys/`` in the node's key folder): one
  ``<id>.key`` file per KEK (base64, mode 0600) and a ``current`` file naming the
  current one. The first key is made on first use, as the node's signing key is;
  copy the folder to every node that must run objects with secrets.
- an **environment variable** (``env:NAME``): base64 keys separated by commas, the
  current one first.
- the **OS keyring** (``keyring:SERVICE/USER``, the ``perdure[keyring]`` extra): a
  password holding the same text as the variable.
- keys given directly (``DataKeys([key, ...])``), for tests and embedding.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from perdure.core.sealing import KEY_BYTES, key_id
from perdure.errors import ConfigurationError

__all__ = ["DataKeys"]

_CURRENT = "current"


def _parse_keys(text: str, origin: str) -> list[bytes]:
    keys = []
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            raw = base64.b64decode(part, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigurationError(
                f"{origin} holds something that is not a base64 key; make one with "
                "`perdure keys data-key`") from None
        if len(raw) != KEY_BYTES:
            raise ConfigurationError(
                f"{origin} holds a key of {len(raw)} bytes, not {KEY_BYTES}; make one with "
                "`perdure keys data-key`")
        keys.append(raw)
    return keys


class DataKeys:
    """The key-encryption keys a node holds (see the module). Never shows a key."""

    def __init__(self, keys: Sequence[bytes] = (), *, origin: str = "keys given",
                 folder: str | os.PathLike[str] | None = None) -> None:
        for key in keys:
            if len(key) != KEY_BYTES:
                raise ConfigurationError(f"a data key-encryption key is {KEY_BYTES} bytes, "
                                         f"not {len(key)}")
        self._keys: dict[str, bytes] = {key_id(k): bytes(k) for k in keys}
        self._current = key_id(keys[0]) if keys else None
        self._folder = Path(folder) if folder is not None else None
        self.origin = origin if folder is None else f"key folder {self._folder}"
        self._lock = threading.Lock()
        if self._folder is not None:
            self._load()

    def __repr__(self) -> str:
        return f"DataKeys({self.origin}, current={self._current}, keys={len(self._keys)})"

    # -- sources ------------------------------------------------------------------

    @classmethod
    def folder(cls, path: str | os.PathLike[str]) -> DataKeys:
        """Keys in a folder (made with its first key when a node first needs one)."""
        return cls(folder=path)

    @classmethod
    def from_env(cls, name: str = "PERDURE_DATA_KEY") -> DataKeys:
        """Keys in the environment variable ``name`` (base64, comma-separated, current
        first); ``ConfigurationError`` if it is unset or wrong."""
        text = os.environ.get(name)
        if not text:
            raise ConfigurationError(f"environment variable {name} is not set; put a key "
                                     "made with `perdure keys data-key` in it")
        return cls(_parse_keys(text, f"environment variable {name}"),
                   origin=f"environment variable {name}")

    @classmethod
    def from_keyring(cls, service: str = "perdure", username: str = "data-key") -> DataKeys:
        """Keys stored in the OS keyring as the password of ``service``/``username``
        (needs ``pip install 'perdure[keyring]'``)."""
        try:
            import keyring
            import keyring.errors
        except ImportError:
            raise ConfigurationError("the OS keyring needs the keyring package: "
                                     "pip install 'perdure[keyring]'") from None
        try:
            text = keyring.get_password(service, username)
        except keyring.errors.KeyringError as exc:
            raise ConfigurationError(f"the OS keyring cannot be read: {exc}") from None
        if not text:
            raise ConfigurationError(
                f"the OS keyring holds no data key for {service}/{username}; store one with "
                f"`keyring set {service} {username}` (a key from `perdure keys data-key`)")
        return cls(_parse_keys(text, f"keyring {service}/{username}"),
                   origin=f"keyring {service}/{username}")

    @classmethod
    def parse(cls, spec: str) -> DataKeys:
        """From a one-line spec: ``env:NAME``, ``keyring:SERVICE/USER``, ``dir:PATH``
        or a folder path."""
        if spec.startswith("env:"):
            return cls.from_env(spec[4:] or "PERDURE_DATA_KEY")
        if spec.startswith("keyring:"):
            service, _, user = spec[8:].partition("/")
            return cls.from_keyring(service or "perdure", user or "data-key")
        path = spec[4:] if spec.startswith("dir:") else spec
        if not path:
            raise ConfigurationError("--data-keys takes env:NAME, keyring:SERVICE/USER or "
                                     "a folder path")
        return cls.folder(path)

    @staticmethod
    def generate() -> str:
        """A new key-encryption key as base64 text (for a variable or the keyring)."""
        return base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")

    # -- the folder -----------------------------------------------------------------

    def _load(self) -> None:
        folder = self._folder
        if folder is None or not folder.is_dir():
            return
        for path in sorted(folder.glob("*.key")):
            if os.name == "posix" and path.stat().st_mode & 0o077:
                raise ConfigurationError(
                    f"key file {path} is readable by others; make it private "
                    f"(chmod 600 {path}) before this node uses it")
            for key in _parse_keys(path.read_text(), f"key file {path}"):
                self._keys.setdefault(key_id(key), key)
        current = folder / _CURRENT
        if current.exists():
            named = current.read_text().strip()
            if named not in self._keys:
                raise ConfigurationError(f"{current} names key {named}, which {folder} does "
                                         "not hold; restore its .key file")
            self._current = named

    def _add_to_folder(self, key: bytes, *, make_current: bool) -> str:
        assert self._folder is not None
        folder = self._folder
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        ident = key_id(key)
        path = folder / f"{ident}.key"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(base64.b64encode(key).decode("ascii") + "\n")
            out.flush()
            os.fsync(out.fileno())
        current = folder / _CURRENT
        if make_current:
            tmp = folder / f".{_CURRENT}.{os.getpid()}.tmp"
            tmp.write_text(ident + "\n")
            os.replace(tmp, current)
        else:
            try:  # the first key: another process may be making one at the same moment
                fd = os.open(current, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as out:
                    out.write(ident + "\n")
        self._keys[ident] = key
        self._load()
        return self._current or ident

    # -- what a node asks -------------------------------------------------------------

    def current(self, *, create: bool = True) -> tuple[str, bytes] | None:
        """The current key as ``(id, key)``; a folder without one makes it (``create``),
        any other source without one gives ``None``."""
        with self._lock:
            if self._current is None and self._folder is not None:
                self._load()
                if self._current is None and create:
                    self._current = self._add_to_folder(os.urandom(KEY_BYTES),
                                                        make_current=False)
            if self._current is None:
                return None
            return self._current, self._keys[self._current]

    def get(self, ident: str) -> bytes | None:
        """The key with id ``ident``, if this node holds it (a folder is read again on a
        miss: a key copied in since is found)."""
        key = self._keys.get(ident)
        if key is None and self._folder is not None:
            with self._lock:
                self._load()
            key = self._keys.get(ident)
        return key

    def ids(self) -> list[str]:
        """The ids of the keys held, the current one first."""
        rest = sorted(k for k in self._keys if k != self._current)
        return ([self._current] if self._current else []) + rest

    def rotate(self) -> str:
        """Make a new current key (a folder only: other sources are rotated where they
        live); the old ones are kept for unwrapping. Returns the new key's id."""
        if self._folder is None:
            raise ConfigurationError(
                f"data keys from {self.origin} are rotated where they live: put a new key "
                "(`perdure keys data-key`) first in it, keep the old one after it, then run "
                "`perdure keys rotate --data` to re-wrap")
        with self._lock:
            self._load()
            return self._add_to_folder(os.urandom(KEY_BYTES), make_current=True)
