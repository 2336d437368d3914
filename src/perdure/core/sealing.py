"""Sealing: how secrets (and whole payloads) are written to memory encrypted.

Two layers of keys, as in every envelope scheme:

- each object has its own **data key** (DEK, 32 random bytes, AES-256-GCM). Values are
  sealed under it. It is stored only *wrapped* (encrypted) by a key-encryption key, in
  the store's ``data_keys`` table, outside the hash chain: re-wrapping it under a new
  key-encryption key (``perdure keys rotate --data``) rewrites no record.
- a **key-encryption key** (KEK) lives with the nodes (a key file, an environment
  variable, the OS keyring; ``perdure.DataKeys``), never in the store. Its id is a
  fingerprint of it (``key_id``), recorded beside each wrapped data key.

A sealed value is one JSON object with one reserved key::

    {"perdure:sealed": {"v": 1, "of": "<object id>", "data": "<base64 nonce+ciphertext>"}}

``of`` names the object whose data key sealed it (a child's result folded into its
parent's memory stays sealed under the child's key). The plaintext is the canonical
JSON of the value in which every ``Secret`` is written as ``{"perdure:secret": value}``,
so opening it gives back the same ``Secret`` objects. The associated data binds the
ciphertext to ``of``: moved to another object it does not open. A sealed value sits in
a record body like any other JSON, so the record's hash and signature cover the
ciphertext and ``perdure verify`` needs no key. A changed byte fails AES-GCM's tag:
``SealBrokenError``, never garbage.

Pure apart from drawing random nonces and keys (``os.urandom``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Callable, Collection
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from perdure.core.codec import MAX_DEPTH, decode, encode
from perdure.core.secret import Secret
from perdure.errors import SealBrokenError, SerializationError

__all__ = [
    "KEY_BYTES",
    "SEALED",
    "SECRET_TAG",
    "canonical_with_secrets",
    "check_reserved",
    "has_secrets",
    "key_id",
    "marked",
    "new_data_key",
    "open_sealed",
    "redact",
    "revealed",
    "seal",
    "sealed_shown",
    "texts",
    "unwrap_data_key",
    "wrap_data_key",
]

SEALED = "perdure:sealed"  # the one key of a sealed value
SECRET_TAG = "perdure:secret"  # noqa: S105 - a tag, not a password: a Secret inside a plaintext
KEY_BYTES = 32  # AES-256
_MARK = b'"perdure:se'  # what both reserved keys start with, as canonical JSON writes them
_VALUE_AAD = b"perdure:sealed:1\x00"
_KEY_AAD = b"perdure:data-key:1\x00"
_NONCE = 12
SHOWN = "[secret]"  # what redaction puts where a secret's text was
_SHAPE = frozenset(("type", "lib", "dropped", "error_class"))  # never redacted


def key_id(kek: bytes) -> str:
    """A key-encryption key's id: 16 hex digits of a hash of it (safe to show and store)."""
    return hashlib.sha256(b"perdure:kek:" + kek).hexdigest()[:16]


def new_data_key() -> bytes:
    """A fresh random data key."""
    return os.urandom(KEY_BYTES)


def wrap_data_key(kek: bytes, dek: bytes, object_id: str) -> bytes:
    """``dek`` encrypted under ``kek`` for ``object_id`` (nonce + ciphertext + tag)."""
    nonce = os.urandom(_NONCE)
    return nonce + AESGCM(kek).encrypt(nonce, dek, _KEY_AAD + object_id.encode("utf-8"))


def unwrap_data_key(kek: bytes, wrapped: bytes, object_id: str) -> bytes:
    """The data key ``wrapped`` holds; ``SealBrokenError`` if it does not decrypt under
    ``kek`` for ``object_id`` (damaged, forged, or moved from another object)."""
    try:
        dek = AESGCM(kek).decrypt(wrapped[:_NONCE], wrapped[_NONCE:],
                                  _KEY_AAD + object_id.encode("utf-8"))
    except (InvalidTag, ValueError):
        raise SealBrokenError(object_id, f"its wrapped data key does not decrypt under key "
                                         f"{key_id(kek)}") from None
    if len(dek) != KEY_BYTES:
        raise SealBrokenError(object_id, "its data key has the wrong length")
    return dek


def marked(data: bytes) -> bool:
    """Whether canonical JSON ``data`` may hold a sealed value or a secret tag (a fast
    byte search: false means certainly not)."""
    return _MARK in data


def has_secrets(value: Any) -> bool:
    """Whether ``value`` holds a ``Secret`` anywhere in its lists and dicts."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, Secret):
            return True
        if isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, list | tuple):
            todo.extend(item)
    return False


def _map(value: Any, leaf: Callable[[Secret[Any]], Any]) -> Any:
    """``value`` with every ``Secret`` replaced by ``leaf(secret)`` (tuples as lists)."""
    if isinstance(value, Secret):
        return leaf(value)
    if isinstance(value, dict):
        return {key: _map(item, leaf) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_map(item, leaf) for item in value]
    return value


def _tagged(secret: Secret[Any]) -> dict[str, Any]:
    return {SECRET_TAG: secret.reveal()}


def _blob(plain: Any, dek: bytes, object_id: str, what: str) -> dict[str, Any]:
    data = encode(plain, what=what, max_depth=MAX_DEPTH + 1)
    nonce = os.urandom(_NONCE)
    sealed = nonce + AESGCM(dek).encrypt(nonce, data, _VALUE_AAD + object_id.encode("utf-8"))
    return {SEALED: {"v": 1, "of": object_id,
                     "data": base64.b64encode(sealed).decode("ascii")}}


def check_reserved(value: Any, what: str) -> None:
    """Refuse a value that holds perdure's reserved keys itself (it would be opened as
    a sealed value on replay)."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            if SEALED in item or SECRET_TAG in item:
                raise SerializationError(
                    f"{what} cannot be stored: it holds the key {SEALED!r} or "
                    f"{SECRET_TAG!r}, which perdure reserves for sealed values; rename it")
            todo.extend(item.values())
        elif isinstance(item, list | tuple):
            todo.extend(item)


def seal(value: Any, dek: bytes, object_id: str, *, whole: bool, what: str = "value") -> Any:
    """``value`` as memory keeps it: every ``Secret`` sealed on its own, or (``whole``)
    the entire value sealed as one (its secrets tagged inside). A value holding the
    reserved keys itself is refused (``SerializationError``)."""
    check_reserved(_map(value, lambda secret: None), what)
    if whole:
        return _blob(_map(value, _tagged), dek, object_id, what)
    return _map(value, lambda secret: _blob(_tagged(secret), dek, object_id, what))


def canonical_with_secrets(value: Any, *, what: str) -> Any:
    """``value`` through the canonical encoder and back, its ``Secret`` objects kept
    (``SerializationError`` naming ``what`` if the rest is not a JSON value)."""
    check_reserved(_map(value, lambda secret: None), what)
    return _untag(decode(encode(_map(value, _tagged), what=what, max_depth=MAX_DEPTH + 1)))


def _untag(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and SECRET_TAG in value:
            return Secret(value[SECRET_TAG])
        return {key: _untag(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_untag(item) for item in value]
    return value


def _opened(sealed: Any, data_key: Callable[[str], bytes], owner: str) -> Any:
    if (not isinstance(sealed, dict) or set(sealed) != {"v", "of", "data"}
            or sealed["v"] != 1 or not isinstance(sealed["of"], str)
            or not isinstance(sealed["data"], str)):
        raise SealBrokenError(owner, "a sealed value in its memory is malformed")
    of = sealed["of"]
    try:
        raw = base64.b64decode(sealed["data"], validate=True)
    except (binascii.Error, ValueError):
        raise SealBrokenError(owner, "a sealed value in its memory is not base64") from None
    dek = data_key(of)
    try:
        plain = AESGCM(dek).decrypt(raw[:_NONCE], raw[_NONCE:],
                                    _VALUE_AAD + of.encode("utf-8"))
        return _untag(decode(plain))
    except (InvalidTag, ValueError, UnicodeDecodeError):
        raise SealBrokenError(owner, f"a value sealed under the data key of {of!r} does "
                                     "not decrypt") from None


def open_sealed(value: Any, data_key: Callable[[str], bytes], *, owner: str) -> Any:
    """``value`` with every sealed value in it opened (``Secret`` objects where secrets
    were). ``data_key(object_id)`` gives the data key a value names (it raises
    ``DataKeyError`` when this node cannot have it); ``owner`` names the object whose
    memory is read, for errors. A value without sealed parts comes back as it is."""
    if isinstance(value, dict):
        if len(value) == 1 and SEALED in value:
            return _opened(value[SEALED], data_key, owner)
        return {key: open_sealed(item, data_key, owner=owner) for key, item in value.items()}
    if isinstance(value, list):
        return [open_sealed(item, data_key, owner=owner) for item in value]
    return value


def revealed(value: Any) -> set[str]:
    """The text of every ``Secret`` in ``value`` that redaction can look for (strings of
    4 characters or more: a shorter one would blot out ordinary words)."""
    found: set[str] = set()

    def note(secret: Secret[Any]) -> None:
        inner = secret.reveal()
        if isinstance(inner, str):
            if len(inner) >= 4:
                found.add(inner)
        else:
            found.update(text for text in _strings(inner) if len(text) >= 4)

    _map(value, note)
    return found


def texts(value: Any) -> set[str]:
    """Every string of 4 characters or more in ``value`` (secrets' values included):
    what redaction looks for when a whole value is secret."""
    plain = _map(value, lambda secret: secret.reveal())
    return {text for text in _strings(plain) if len(text) >= 4}


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list | tuple):
        return [s for item in value for s in _strings(item)]
    return []


def sealed_shown(value: Any) -> Any:
    """``value`` for a person to read: each sealed value as ``"<sealed>"`` (tuples as
    lists)."""
    if isinstance(value, dict):
        if len(value) == 1 and SEALED in value:
            return "<sealed>"
        return {key: sealed_shown(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [sealed_shown(item) for item in value]
    return value


def redact(value: Any, secrets: Collection[str]) -> Any:
    """``value`` with every occurrence of each text in ``secrets`` replaced by
    ``[secret]`` in its strings (not in keys, nor in an error's class path under
    ``type``). What an error message or a note says
    about a secret it was given is kept out of memory and logs this way; a secret
    transformed first (encoded, cut, hashed) is not recognised."""
    if not secrets:
        return value
    return _redacted(value, sorted(secrets, key=len, reverse=True))  # longest first


def _redacted(value: Any, ordered: list[str]) -> Any:
    if isinstance(value, str):
        for text in ordered:
            if text in value:
                value = value.replace(text, SHOWN)
        return value
    if isinstance(value, dict):
        if SEALED in value:  # ciphertext: its base64 must stay as it is
            return value
        # Keys, class paths and library names are the record's shape, not what it says:
        # kept, so that an error still rebuilds as its class.
        return {key: item if key in _SHAPE else _redacted(item, ordered)
                for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(item, ordered) for item in value]
    return value
