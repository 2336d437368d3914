"""Trust: which node keys a node believes, decided by roots it was configured with.

Pure: keys come in as values; nothing here reads files or the store.

A **root** key (one per cluster or tenant) certifies node keys. A certificate names
a node's Ed25519 public key, a free-form name (usually the node id or host), when it
was issued, when it expires (optional) and the root that issued it, and carries the
root's signature over all of that. A **revocation** names a key's fingerprint and the
time from which records signed by it no longer count, signed by a root.

Certificates and revocations may sit in the shared store: anyone can read them, and
nobody without a root key can make one. What a node trusts is its list of root public
keys, which comes from its own configuration, never from the store. A ``KeyRing``
holds those roots plus the certificates and revocations it accepted, and answers one
question: may a record stamped at time T, signed by this public key under this name,
count?

**A certificate's name is who the key speaks for.** A record, an event or a checkpoint
names its writer (a node id, or a person's name); it counts only when signed by a key
that a trusted root certified *under that name* (``KeyRing.signer``). Nothing else ties
a name to a key: not the store's rows, not who used a name first.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from perdure.core.codec import decode, encode

try:  # libsodium checks a signature in half the time OpenSSL takes here
    from nacl.bindings import crypto_sign_open as _sodium_open
    from nacl.exceptions import CryptoError as _SodiumError
except ImportError:  # pragma: no cover - PyNaCl is a dependency; a platform without wheels
    _sodium_open = None  # type: ignore[assignment]
    _SodiumError = ValueError  # type: ignore[assignment,misc]

__all__ = [
    "Certificate",
    "EventSeal",
    "KeyRing",
    "Revocation",
    "check_event_seal",
    "event_digest",
    "fingerprint",
    "issue_certificate",
    "issue_revocation",
    "key_text",
    "parse_public_key",
    "public_key_bytes",
    "seal_event",
    "verify_signature",
    "when",
]

_CERT_DOMAIN = b"perdure node certificate v1\n"
_REVOKE_DOMAIN = b"perdure key revocation v1\n"
_EVENT_DOMAIN = b"perdure event v1\n"


def public_key_bytes(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """The raw 32-byte public key of ``key``."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_text(public_key: bytes) -> str:
    """A public key as messages show it: ``ed25519:`` and its first 16 hex digits (the
    form ``perdure keys show`` prints in full)."""
    return f"ed25519:{public_key.hex()[:16]}…"


def when(ts: float) -> str:
    """A time in seconds since the epoch, as UTC for messages."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def fingerprint(public_key: bytes) -> str:
    """A key's fingerprint: the hex SHA-256 of its 32 raw bytes (64 characters)."""
    return hashlib.sha256(public_key).hexdigest()


def parse_public_key(text: str) -> bytes:
    """A public key written as 64 hex digits, optionally prefixed ``ed25519:``.

    ``ValueError`` for anything else.
    """
    raw = text.strip()
    raw = raw.removeprefix("ed25519:")
    if len(raw) != 64:
        raise ValueError(f"{text.strip()[:80]!r} is not an Ed25519 public key "
                         "(64 hex digits, optionally prefixed ed25519:)")
    try:
        key = bytes.fromhex(raw)
    except ValueError as exc:
        raise ValueError(f"{text.strip()[:80]!r} is not an Ed25519 public key "
                         "(64 hex digits)") from exc
    Ed25519PublicKey.from_public_bytes(key)  # any 32 bytes are accepted; checked anyway
    return key


def verify_signature(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is ``public_key``'s Ed25519 signature of ``message``.

    Through libsodium (PyNaCl) when it is installed: the same answer in half the time
    OpenSSL takes here (a claim checks one, an event one more).
    """
    if _sodium_open is not None:
        if len(signature) != 64 or len(public_key) != 32:
            return False
        try:
            _sodium_open(signature + message, public_key)
        except (_SodiumError, ValueError, TypeError):
            return False
        return True
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


_verify = verify_signature


def _hex(value: Any, size: int, what: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{what} is not a hex string")
    raw = bytes.fromhex(value)
    if len(raw) != size:
        raise ValueError(f"{what} is not {size} bytes")
    return raw


def _number(value: Any, what: str, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} is not a number")
    return float(value)


@dataclass(frozen=True, slots=True)
class Certificate:
    """A root's statement that ``public_key`` is a node key it vouches for."""

    public_key: bytes
    name: str
    issued_at: float
    expires_at: float | None
    issuer: bytes  # the root's public key
    signature: bytes = b""

    @property
    def fingerprint(self) -> str:
        """The certified key's fingerprint."""
        return fingerprint(self.public_key)

    def _body(self) -> dict[str, Any]:
        return {"v": 1, "public_key": self.public_key.hex(), "name": self.name,
                "issued_at": self.issued_at, "expires_at": self.expires_at,
                "issuer": self.issuer.hex()}

    def signed_bytes(self) -> bytes:
        """What the root signs: a domain tag and the canonical fields."""
        return _CERT_DOMAIN + encode(self._body())

    def to_bytes(self) -> bytes:
        """The certificate as canonical JSON, signature included."""
        return encode({**self._body(), "signature": self.signature.hex()})

    @classmethod
    def from_bytes(cls, data: bytes | str) -> Certificate:
        """Parse ``to_bytes`` output; ``ValueError`` saying what is wrong."""
        try:
            body = decode(data.encode() if isinstance(data, str) else data)
        except (ValueError, UnicodeError) as exc:
            raise ValueError(f"certificate is not JSON: {exc}") from exc
        if not isinstance(body, dict) or body.get("v") != 1:
            raise ValueError("not a perdure node certificate (version 1)")
        name = body.get("name")
        if not isinstance(name, str):
            raise ValueError("certificate name is not a string")
        issued = _number(body.get("issued_at"), "issued_at")
        assert issued is not None
        return cls(
            public_key=_hex(body.get("public_key"), 32, "public_key"),
            name=name,
            issued_at=issued,
            expires_at=_number(body.get("expires_at"), "expires_at", optional=True),
            issuer=_hex(body.get("issuer"), 32, "issuer"),
            signature=_hex(body.get("signature"), 64, "signature"),
        )

    def intact(self) -> bool:
        """Whether the signature is the issuer's over these fields."""
        return _verify(self.issuer, self.signature, self.signed_bytes())


def issue_certificate(root: Ed25519PrivateKey, public_key: bytes, *, name: str, now: float,
                      days: float | None = None) -> Certificate:
    """Certify ``public_key`` with ``root``; valid for ``days`` (``None``: no expiry)."""
    if len(public_key) != 32:
        raise ValueError("an Ed25519 public key is 32 bytes")
    unsigned = Certificate(public_key=public_key, name=name, issued_at=round(now, 3),
                           expires_at=None if days is None else round(now + days * 86400, 3),
                           issuer=public_key_bytes(root))
    return Certificate(unsigned.public_key, unsigned.name, unsigned.issued_at,
                       unsigned.expires_at, unsigned.issuer,
                       root.sign(unsigned.signed_bytes()))


@dataclass(frozen=True, slots=True)
class Revocation:
    """A root's statement that records signed by the key ``key_fingerprint`` at or after
    ``since`` no longer count."""

    key_fingerprint: str
    since: float
    reason: str
    issued_at: float
    issuer: bytes
    signature: bytes = b""

    def _body(self) -> dict[str, Any]:
        return {"v": 1, "fingerprint": self.key_fingerprint, "since": self.since,
                "reason": self.reason, "issued_at": self.issued_at,
                "issuer": self.issuer.hex()}

    def signed_bytes(self) -> bytes:
        """What the root signs."""
        return _REVOKE_DOMAIN + encode(self._body())

    def to_bytes(self) -> bytes:
        """The revocation as canonical JSON, signature included."""
        return encode({**self._body(), "signature": self.signature.hex()})

    @classmethod
    def from_bytes(cls, data: bytes | str) -> Revocation:
        """Parse ``to_bytes`` output; ``ValueError`` saying what is wrong."""
        try:
            body = decode(data.encode() if isinstance(data, str) else data)
        except (ValueError, UnicodeError) as exc:
            raise ValueError(f"revocation is not JSON: {exc}") from exc
        if not isinstance(body, dict) or body.get("v") != 1:
            raise ValueError("not a perdure key revocation (version 1)")
        fp = body.get("fingerprint")
        reason = body.get("reason")
        if not isinstance(fp, str) or len(fp) != 64:
            raise ValueError("revocation fingerprint is not 64 hex digits")
        since = _number(body.get("since"), "since")
        issued = _number(body.get("issued_at"), "issued_at")
        assert since is not None and issued is not None
        return cls(key_fingerprint=fp, since=since,
                   reason=reason if isinstance(reason, str) else "",
                   issued_at=issued, issuer=_hex(body.get("issuer"), 32, "issuer"),
                   signature=_hex(body.get("signature"), 64, "signature"))

    def intact(self) -> bool:
        """Whether the signature is the issuer's over these fields."""
        return _verify(self.issuer, self.signature, self.signed_bytes())


def issue_revocation(root: Ed25519PrivateKey, key_fingerprint: str, *, since: float,
                     reason: str, now: float) -> Revocation:
    """Revoke the key with ``key_fingerprint`` for records stamped at or after ``since``."""
    unsigned = Revocation(key_fingerprint, round(since, 6), reason, round(now, 3),
                          public_key_bytes(root))
    return Revocation(unsigned.key_fingerprint, unsigned.since, unsigned.reason,
                      unsigned.issued_at, unsigned.issuer, root.sign(unsigned.signed_bytes()))


@dataclass
class KeyRing:
    """The roots a node trusts, and the certificates and revocations it accepted.

    ``problem(public_key, ts_us)`` says why a record signed by ``public_key`` and
    stamped ``ts_us`` does not count, or ``None`` if it does. Certificates and
    revocations not signed by a trusted root are ignored as they are offered.
    """

    roots: frozenset[bytes]
    _certs: dict[bytes, list[Certificate]] = field(default_factory=dict)
    _named: dict[str, list[bytes]] = field(default_factory=dict)
    _strangers: dict[str, list[Certificate]] = field(default_factory=dict)
    _revoked: dict[str, float] = field(default_factory=dict)
    _seen: set[bytes] = field(default_factory=set)

    def add(self, item: Certificate | Revocation) -> bool:
        """Accept ``item`` if a trusted root signed it; ``False`` (ignored) otherwise.

        An intact certificate from a root this ring does not trust is kept aside, only
        to say in messages who certified a name (it never makes a key count)."""
        if item.issuer not in self.roots or not item.intact():
            if (isinstance(item, Certificate) and item.issuer not in self.roots
                    and item.intact()):
                aside = self._strangers.setdefault(item.name, [])
                if item not in aside:
                    aside.append(item)
            return False
        if isinstance(item, Certificate):
            known = self._certs.setdefault(item.public_key, [])
            if item not in known:
                known.append(item)
                named = self._named.setdefault(item.name, [])
                if item.public_key not in named:
                    named.append(item.public_key)
        else:
            earlier = self._revoked.get(item.key_fingerprint)
            self._revoked[item.key_fingerprint] = (
                item.since if earlier is None else min(earlier, item.since))
        return True

    def offer(self, blobs: Iterable[tuple[str, bytes]]) -> None:
        """Parse and ``add`` stored trust items ``(kind, bytes)``; bad ones are ignored."""
        for kind, data in blobs:
            key = hashlib.sha256(kind.encode() + b"\0" + data).digest()
            if key in self._seen:
                continue
            self._seen.add(key)
            try:
                item: Certificate | Revocation = (
                    Certificate.from_bytes(data) if kind == "certificate"
                    else Revocation.from_bytes(data))
            except ValueError:
                continue
            self.add(item)

    def certificates(self, public_key: bytes) -> list[Certificate]:
        """The accepted certificates of ``public_key``."""
        return list(self._certs.get(public_key, ()))

    def keys_named(self, name: str) -> list[bytes]:
        """The keys a trusted root certified under ``name`` (whatever their state)."""
        return list(self._named.get(name, ()))

    def names(self) -> dict[str, list[bytes]]:
        """Every certified name and its keys, as accepted so far."""
        return {name: list(keys) for name, keys in self._named.items()}

    def strangers(self) -> dict[str, list[bytes]]:
        """Names certified only by roots this ring does not trust, and those keys (for
        listings: none of them counts)."""
        return {name: [c.public_key for c in certs] for name, certs in self._strangers.items()
                if name not in self._named}

    def signer(self, name: str, signature: bytes, message: bytes,
               ts_us: int | None = None, *, first: bytes | None = None
               ) -> tuple[bytes | None, str | None]:
        """Which key made ``signature`` over ``message`` for the writer ``name``:
        ``(key, None)`` when a key certified under ``name`` (or a trusted root) made it
        and counts at ``ts_us``; ``(key or None, why not)`` otherwise. ``first`` is a
        key to try before the others (the one that signed last time)."""
        candidates = self.keys_named(name)
        if first is not None and first in candidates:
            candidates.remove(first)
            candidates.insert(0, first)
        for key in (*candidates, *sorted(self.roots)):
            if _verify(key, signature, message):
                return key, self.problem(key, ts_us, name=name)
        if candidates:
            return None, (f"its signature does not verify under any key certified as "
                          f"{name!r}")
        return None, self.unknown_name(name)

    def unknown_name(self, name: str) -> str:
        """Why nothing signed for ``name`` can count: no trusted root certified it."""
        if not self.roots:
            return (f"{name!r} cannot be checked: this node trusts no root key "
                    "(add one with `perdure keys trust ROOT_PUBLIC_KEY`, or configure "
                    "App(trust=...), --trust or PERDURE_TRUST)")
        strangers = sorted({key_text(c.issuer) for c in self._strangers.get(name, ())})
        if strangers:
            return (f"{name!r} is not certified by a root this node trusts (it trusts "
                    f"{self.roots_text()}), only by root {', '.join(strangers)}")
        return (f"{name!r} is not certified by a root this node trusts "
                f"({self.roots_text()})")

    def revoked_since(self, public_key: bytes) -> float | None:
        """From when records signed by ``public_key`` no longer count, if revoked."""
        return self._revoked.get(fingerprint(public_key))

    def problem(self, public_key: bytes, ts_us: int | None = None, *,
                name: str | None = None) -> str | None:
        """Why a record by ``public_key`` stamped ``ts_us`` does not count, or ``None``.

        With ``name``, the key must be certified under that name: a key speaks only
        for the names its certificates carry."""
        if public_key in self.roots:
            return None  # a root may sign records itself (a one-machine setup never does)
        certs = self._certs.get(public_key)
        short = key_text(public_key)
        if not certs:
            if not self.roots:
                return (f"key {short} cannot be checked: this node trusts no root key "
                        "(add one with `perdure keys trust ROOT_PUBLIC_KEY`, or configure "
                        "App(trust=...), --trust or PERDURE_TRUST)")
            return (f"key {short} is not certified by a root this node trusts "
                    f"({self.roots_text()})")
        if name is not None:
            named = [c for c in certs if c.name == name]
            if not named:
                carried = ", ".join(sorted({repr(c.name) for c in certs}))
                return f"key {short} is certified as {carried}, not as {name!r}"
            certs = named
        revoked = self._revoked.get(fingerprint(public_key))
        if revoked is not None and (ts_us is None or ts_us >= revoked * 1_000_000):
            return (f"key {short} was revoked (records stamped from {when(revoked)} on "
                    "do not count)")
        if ts_us is None:
            return None
        if any(c.expires_at is None or ts_us <= c.expires_at * 1_000_000 for c in certs):
            return None
        return f"key {short}'s certificate had expired when the record was written"

    def roots_text(self) -> str:
        """The trusted roots, shortened, for messages."""
        return ", ".join(sorted(key_text(r) for r in self.roots)) or "none"


@dataclass(frozen=True, slots=True)
class EventSeal:
    """Who accepted an event into an inbox and their signature over it.

    Stored beside the event (opaque bytes to the store); the receiving node checks it
    before delivering, and the receipt record names ``digest``.
    """

    sender: str  # node id of the node or client that accepted the event
    nonce: str
    signature: bytes

    def to_bytes(self) -> bytes:
        """Canonical JSON of the seal."""
        return encode({"v": 1, "sender": self.sender, "nonce": self.nonce,
                       "signature": self.signature.hex()})

    @classmethod
    def from_bytes(cls, data: bytes) -> EventSeal:
        """Parse ``to_bytes`` output; ``ValueError`` if it is not one."""
        if not data:
            raise ValueError("the event carries no signature")
        try:
            body = decode(data)
        except (ValueError, UnicodeError) as exc:
            raise ValueError(f"the event's seal is not JSON: {exc}") from exc
        if (not isinstance(body, dict) or body.get("v") != 1
                or not isinstance(body.get("sender"), str)
                or not isinstance(body.get("nonce"), str)):
            raise ValueError("the event's seal is malformed")
        return cls(body["sender"], body["nonce"], _hex(body.get("signature"), 64, "signature"))


def event_digest(object_id: str, name: str, payload: bytes, dedupe_key: str | None,
                 sender: str, nonce: str) -> bytes:
    """SHA-256 over what an event's seal vouches for (32 bytes)."""
    head = encode([object_id, name, dedupe_key, sender, nonce])
    return hashlib.sha256(b"%b%b\n%b" % (_EVENT_DOMAIN, head, payload)).digest()


def seal_event(sign: Callable[[bytes], bytes], sender: str, object_id: str, name: str,
               payload: bytes, dedupe_key: str | None, nonce: str) -> tuple[bytes, bytes]:
    """Seal an event as ``sender`` with ``sign`` (a function signing 32 bytes) and a fresh
    random ``nonce`` (so that two equal events differ): the seal's bytes to store beside
    the event, and the event's digest."""
    digest = event_digest(object_id, name, payload, dedupe_key, sender, nonce)
    return EventSeal(sender, nonce, bytes(sign(digest))).to_bytes(), digest


def check_event_seal(seal_bytes: bytes, object_id: str, name: str, payload: bytes,
                     dedupe_key: str | None, ring: KeyRing, ts_us: int | None = None
                     ) -> tuple[bytes | None, bytes | None, str | None]:
    """``(digest, key, None)`` for an event whose seal verifies under a key a trusted
    root certified as the seal's sender, else ``(digest or None, key or None, why not)``."""
    try:
        seal = EventSeal.from_bytes(seal_bytes)
    except ValueError as exc:
        return None, None, str(exc)
    digest = event_digest(object_id, name, payload, dedupe_key, seal.sender, seal.nonce)
    key, why = ring.signer(seal.sender, seal.signature, digest, ts_us)
    if why is not None:
        if key is None and ring.keys_named(seal.sender):
            why = (f"its signature does not verify under any key certified as "
                   f"{seal.sender!r} (the event was changed after it was sent, or another "
                   "key signed it)")
        return digest, key, f"its sender {seal.sender!r}: {why}"
    return digest, key, None
