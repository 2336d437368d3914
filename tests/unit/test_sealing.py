"""Secrets and sealing, pure: what a Secret shows, how values are sealed and opened,
what a changed byte does, redaction, and where key-encryption keys come from."""

from __future__ import annotations

import base64
import json
import logging
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perdure import DataKeys, Secret
from perdure.core.codec import encode
from perdure.core.sealing import (
    SEALED,
    has_secrets,
    key_id,
    marked,
    new_data_key,
    open_sealed,
    redact,
    revealed,
    seal,
    sealed_shown,
    unwrap_data_key,
    wrap_data_key,
)
from perdure.errors import ConfigurationError, SealBrokenError, SerializationError

CANARY = "sk-canary-7f3a9c1e55d04b2a"


def keys_of(**keys: bytes) -> Any:
    return lambda object_id: keys[object_id]


def test_a_secret_never_shows_its_value(caplog: pytest.LogCaptureFixture) -> None:
    """repr, str, format, an f-string, a log line and an exception show Secret('***')."""
    secret = Secret(CANARY)
    shown = [repr(secret), str(secret), f"{secret}", f"{secret!r}", format(secret, ">40"),
             repr([secret]), repr({"k": secret}), str(ValueError(secret))]
    with caplog.at_level(logging.INFO):
        logging.getLogger("test").info("key is %s / %r", secret, secret)
    shown.append(caplog.text)
    assert all(CANARY not in text for text in shown)
    assert "Secret('***')" in shown[0]
    assert secret.reveal() == CANARY


def test_a_secret_refuses_json_and_pickle() -> None:
    """Code that writes a Secret out without perdure's sealing fails instead of leaking."""
    with pytest.raises(TypeError):
        json.dumps({"k": Secret(CANARY)})
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(Secret(CANARY))
    with pytest.raises(SerializationError) as caught:
        encode(Secret(CANARY))
    assert CANARY not in str(caught.value)


def test_secret_equality_and_values() -> None:
    """Secrets compare by value; they hold JSON values; a Secret of a Secret is one."""
    assert Secret("a") == Secret("a") and Secret("a") != Secret("b")
    assert hash(Secret({"x": 1})) == hash(Secret({"x": 1}))
    assert Secret(Secret("a")).reveal() == "a"
    with pytest.raises(SerializationError, match="JSON value") as caught:
        Secret(object())
    assert "object at" not in str(caught.value)


def test_seal_each_secret_and_open_it_back() -> None:
    """Each Secret is sealed on its own; opening gives back the same value with Secrets."""
    dek = new_data_key()
    value = {"user": "ada", "keys": [Secret(CANARY), Secret({"token": "t0k3n-xyz"})],
             "n": (1, 2)}
    stored = seal(value, dek, "obj-1", whole=False)
    data = encode(stored)
    assert CANARY.encode() not in data and b"t0k3n-xyz" not in data
    assert b'"user":"ada"' in data and marked(data)
    assert stored["keys"][0].keys() == {SEALED}
    opened = open_sealed(json.loads(data), keys_of(**{"obj-1": dek}), owner="obj-1")
    assert opened == {"user": "ada", "keys": [Secret(CANARY), Secret({"token": "t0k3n-xyz"})],
                      "n": [1, 2]}
    assert isinstance(opened["keys"][0], Secret)


def test_seal_whole_hides_everything_and_keeps_inner_secrets() -> None:
    """Sealed whole (an agent that encrypts all), nothing of the value is left in clear."""
    dek = new_data_key()
    value = {"note": f"plain {CANARY}", "inner": Secret("s3cret-inner")}
    data = encode(seal(value, dek, "obj-2", whole=True))
    assert CANARY.encode() not in data and b"note" not in data and b"s3cret" not in data
    opened = open_sealed(json.loads(data), keys_of(**{"obj-2": dek}), owner="obj-2")
    assert opened == {"note": f"plain {CANARY}", "inner": Secret("s3cret-inner")}


@pytest.mark.parametrize("at", [0, 5, 12, 20, -1])
def test_a_changed_byte_is_an_integrity_failure(at: int) -> None:
    """A flipped ciphertext (or nonce, or tag) byte fails AES-GCM: SealBrokenError,
    never a wrong value."""
    dek = new_data_key()
    stored = seal(Secret(CANARY), dek, "obj-3", whole=False)
    raw = bytearray(base64.b64decode(stored[SEALED]["data"]))
    raw[at] ^= 0x01
    stored[SEALED]["data"] = base64.b64encode(bytes(raw)).decode()
    with pytest.raises(SealBrokenError, match="does not decrypt") as caught:
        open_sealed(stored, keys_of(**{"obj-3": dek}), owner="obj-3")
    assert caught.value.object_id == "obj-3"


def test_a_sealed_value_moved_to_another_object_does_not_open() -> None:
    """The object id is bound into the ciphertext: a value copied elsewhere fails, even
    when the attacker edits the ``of`` field to point at the other object's key."""
    dek_a, dek_b = new_data_key(), new_data_key()
    stored = seal(Secret(CANARY), dek_a, "a", whole=False)
    stored[SEALED]["of"] = "b"
    with pytest.raises(SealBrokenError):
        open_sealed(stored, keys_of(a=dek_a, b=dek_b), owner="b")
    with pytest.raises(SealBrokenError):  # the same key under another id: still refused
        open_sealed(stored, keys_of(a=dek_a, b=dek_a), owner="b")


@pytest.mark.parametrize("broken", [
    {SEALED: "x"}, {SEALED: {"v": 2, "of": "o", "data": ""}},
    {SEALED: {"v": 1, "of": "o", "data": "!!notbase64!!"}},
    {SEALED: {"v": 1, "of": "o", "data": "AAAA", "extra": 1}},
])
def test_malformed_sealed_values_fail_closed(broken: dict[str, Any]) -> None:
    with pytest.raises(SealBrokenError):
        open_sealed(broken, keys_of(o=new_data_key()), owner="o")


def test_values_holding_the_reserved_keys_are_refused() -> None:
    """A value that looks sealed itself would be opened on replay: refused up front."""
    values: list[Any] = [{SEALED: 1}, [{"perdure:secret": "x"}], {"a": {SEALED: {}}}]
    for value in values:
        with pytest.raises(SerializationError, match="reserves"):
            seal(value, new_data_key(), "o", whole=False)


def test_data_keys_wrap_and_unwrap() -> None:
    """A wrapped data key opens only under its key-encryption key and for its object."""
    kek, other, dek = new_data_key(), new_data_key(), new_data_key()
    wrapped = wrap_data_key(kek, dek, "o")
    assert unwrap_data_key(kek, wrapped, "o") == dek
    assert dek not in wrapped
    bad_calls: list[Callable[[], bytes]] = [
        lambda: unwrap_data_key(other, wrapped, "o"),
        lambda: unwrap_data_key(kek, wrapped, "p"),
        lambda: unwrap_data_key(kek, wrapped[:-1] + bytes([wrapped[-1] ^ 1]), "o")]
    for bad in bad_calls:
        with pytest.raises(SealBrokenError):
            bad()
    assert key_id(kek) != key_id(other) and len(key_id(kek)) == 16


def test_redaction_replaces_secret_texts_and_leaves_ciphertext() -> None:
    secrets = revealed({"k": Secret(CANARY), "short": Secret("abc"), "d": Secret({"p": "pw-1234"})})
    assert secrets == {CANARY, "pw-1234"}  # too short a text is not looked for
    message = {"type": "x:ValueError", "message": f"bad key {CANARY}; pw-1234 refused",
               "args": [CANARY]}
    assert redact(message, secrets) == {"type": "x:ValueError",
                                        "message": "bad key [secret]; [secret] refused",
                                        "args": ["[secret]"]}
    assert redact({"type": "x:Value"}, {"Value"}) == {"type": "x:Value"}  # a class path
    sealed = {SEALED: {"v": 1, "of": "o", "data": CANARY}}  # ciphertext is never touched
    assert redact(sealed, secrets) == sealed
    assert sealed_shown({"a": sealed, "b": [sealed]}) == {"a": "<sealed>", "b": ["<sealed>"]}
    assert has_secrets([1, {"x": (Secret(1),)}]) and not has_secrets({"x": [1, "s"]})


def test_key_folder_makes_its_first_key_once(tmp_path: Path) -> None:
    """A folder source makes a key on first need, private to its owner, and keeps it."""
    folder = tmp_path / "data-keys"
    first = DataKeys.folder(folder)
    assert first.ids() == [] and first.current(create=False) is None
    ident, key = first.current() or ("", b"")
    assert (folder / f"{ident}.key").stat().st_mode & 0o077 == 0
    again = DataKeys.folder(folder)
    assert again.current(create=False) == (ident, key)
    assert key.hex() not in repr(again) and base64.b64encode(key).decode() not in repr(again)
    new = again.rotate()
    assert again.ids()[0] == new and again.get(ident) == key  # the old one kept
    assert DataKeys.folder(folder).ids()[0] == new
    assert first.get(new) is not None  # a folder is read again on a miss


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "data-keys"
    ident, _ = DataKeys.folder(folder).current() or ("", b"")
    (folder / f"{ident}.key").chmod(0o644)
    with pytest.raises(ConfigurationError, match="chmod 600"):
        DataKeys.folder(folder)


@settings(max_examples=60, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20)
    | st.builds(Secret, st.text(max_size=20)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                  max_size=4),
    max_leaves=12), st.booleans())
def test_any_value_opens_as_it_was_sealed(value: Any, whole: bool) -> None:
    """Sealed (each secret, or whole) and opened, every value comes back equal to what
    replay of the plain value would give, Secrets in place."""
    dek = new_data_key()
    opened = open_sealed(json.loads(encode(seal(value, dek, "o", whole=whole))),
                         keys_of(o=dek), owner="o")
    assert opened == value


def test_env_and_spec_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    new, old = DataKeys.generate(), DataKeys.generate()
    monkeypatch.setenv("MY_KEK", f"{new},{old}")
    keys = DataKeys.parse("env:MY_KEK")
    assert keys.ids() == [key_id(base64.b64decode(new)), key_id(base64.b64decode(old))]
    with pytest.raises(ConfigurationError, match="rotated where they live"):
        keys.rotate()
    monkeypatch.setenv("MY_KEK", "not base64!")
    with pytest.raises(ConfigurationError, match="not a base64 key"):
        DataKeys.parse("env:MY_KEK")
    monkeypatch.setenv("MY_KEK", base64.b64encode(b"short").decode())
    with pytest.raises(ConfigurationError, match="5 bytes"):
        DataKeys.parse("env:MY_KEK")
    monkeypatch.delenv("MY_KEK")
    with pytest.raises(ConfigurationError, match="not set"):
        DataKeys.parse("env:MY_KEK")
    assert DataKeys.parse(f"dir:{tmp_path}").origin == f"key folder {tmp_path}"


def test_keyring_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """The OS keyring, through the keyring package's own API (an in-process backend)."""
    keyring = pytest.importorskip("keyring")
    from keyring.backend import KeyringBackend

    class Memory(KeyringBackend):
        priority = 1
        store: dict[tuple[str, str], str] = {}  # noqa: RUF012 - per test class

        def get_password(self, service: str, username: str) -> str | None:
            return self.store.get((service, username))

        def set_password(self, service: str, username: str, password: str) -> None:
            self.store[(service, username)] = password

        def delete_password(self, service: str, username: str) -> None:
            self.store.pop((service, username), None)

    before = keyring.get_keyring()
    keyring.set_keyring(Memory())  # type: ignore[no-untyped-call]
    try:
        with pytest.raises(ConfigurationError, match="holds no data key"):
            DataKeys.parse("keyring:perdure/data-key")
        text = DataKeys.generate()
        keyring.set_password("perdure", "data-key", text)
        keys = DataKeys.parse("keyring:perdure/data-key")
        assert keys.ids() == [key_id(base64.b64decode(text))]
    finally:
        keyring.set_keyring(before)


def test_the_sealed_scan_reads_each_record_once() -> None:
    """A node scans an object's memory for sealed values once; a later claim looks only
    at records appended since, and a memory that is not the one scanned is read again."""
    from perdure.core.records import Record
    from perdure.keys.sealer import SealedScan

    def rec(seq: int, body: bytes, digest: str = "") -> Record:
        return Record("o", seq, "t", 0, "n", "p", "step_done", body, "", digest or f"h{seq}",
                      b"", {})

    scan = SealedScan()
    plain = [rec(i, b'{"result":1}') for i in range(1, 6)]
    assert not scan.sealed("o", plain)
    sealed = rec(6, b'{"result":{"perdure:sealed":{}}}')
    assert scan.sealed("o", [*plain, sealed])
    assert scan.sealed("o", [*plain, sealed, rec(7, b"{}")])  # once found, found
    other = SealedScan()
    assert not other.sealed("o", plain)
    changed = [*plain[:4], rec(5, b'{"x":{"perdure:sealed":{}}}', "other")]
    assert other.sealed("o", changed)  # the head it saw is not there: read all again
