"""Trust: certificates, revocations and event seals are believed only under trusted roots."""

from __future__ import annotations

import dataclasses

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from perdure.core.chain import Signer, seal, seal_commit, verify_chain
from perdure.core.records import GENESIS_HASH, Kind, RecordDraft
from perdure.core.trust import (
    Certificate,
    EventSeal,
    KeyRing,
    Revocation,
    check_event_seal,
    fingerprint,
    issue_certificate,
    issue_revocation,
    key_text,
    parse_public_key,
    public_key_bytes,
    seal_event,
)
from tests.unit.builders import T0, chain


def _key(seed: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)


ROOT = _key(1)
OTHER_ROOT = _key(2)
NODE = _key(3)
NODE_PUB = public_key_bytes(NODE)


def _ring(*roots: Ed25519PrivateKey) -> KeyRing:
    return KeyRing(frozenset(public_key_bytes(r) for r in roots))


def test_a_certificate_from_a_trusted_root_makes_its_key_count() -> None:
    """A key certified by a trusted root counts; uncertified, or certified by a root the
    node does not trust, it does not, and the reason says which."""
    ring = _ring(ROOT)
    assert ring.problem(NODE_PUB, 1) == (
        f"key {key_text(NODE_PUB)} is not certified by a root this node trusts "
        f"({key_text(public_key_bytes(ROOT))})")
    assert key_text(NODE_PUB) == f"ed25519:{NODE_PUB.hex()[:16]}…"
    foreign = issue_certificate(OTHER_ROOT, NODE_PUB, name="n", now=T0)
    assert ring.add(foreign) is False
    assert ring.problem(NODE_PUB, 1) is not None
    cert = issue_certificate(ROOT, NODE_PUB, name="n", now=T0)
    assert ring.add(cert) is True
    assert ring.problem(NODE_PUB, 1) is None


def test_a_certificate_round_trips_and_any_edit_breaks_it() -> None:
    """``to_bytes``/``from_bytes`` round trip; changing any field voids the root's
    signature, so a store writer cannot widen or move a certificate."""
    cert = issue_certificate(ROOT, NODE_PUB, name="node-a", now=T0, days=30)
    again = Certificate.from_bytes(cert.to_bytes())
    assert again == cert and again.intact()
    for change in ({"name": "node-b"}, {"expires_at": None}, {"public_key": bytes(32)},
                   {"issued_at": T0 + 1}):
        assert not dataclasses.replace(cert, **change).intact()  # type: ignore[arg-type]
    ring = _ring(ROOT)
    assert ring.add(dataclasses.replace(cert, name="node-b")) is False


def test_an_expired_certificate_covers_only_records_written_before_it_expired() -> None:
    """Records stamped after the certificate's expiry do not count; earlier ones do."""
    cert = issue_certificate(ROOT, NODE_PUB, name="n", now=T0, days=1)
    ring = _ring(ROOT)
    ring.add(cert)
    assert ring.problem(NODE_PUB, int((T0 + 3600) * 1e6)) is None
    why = ring.problem(NODE_PUB, int((T0 + 2 * 86400) * 1e6))
    assert why is not None and "expired" in why


def test_a_revocation_refuses_records_from_its_time_on() -> None:
    """A root's revocation voids a key for records stamped at or after ``since``; one
    signed by an untrusted root is ignored."""
    ring = _ring(ROOT)
    ring.add(issue_certificate(ROOT, NODE_PUB, name="n", now=T0))
    fake = issue_revocation(OTHER_ROOT, fingerprint(NODE_PUB), since=T0, reason="x", now=T0)
    assert ring.add(fake) is False
    revoked = issue_revocation(ROOT, fingerprint(NODE_PUB), since=T0 + 10, reason="stolen",
                               now=T0 + 20)
    assert Revocation.from_bytes(revoked.to_bytes()) == revoked
    assert ring.add(revoked)
    assert ring.problem(NODE_PUB, int((T0 + 5) * 1e6)) is None
    why = ring.problem(NODE_PUB, int((T0 + 10) * 1e6))
    assert why is not None and "revoked" in why


def test_offer_ignores_damaged_or_forged_items() -> None:
    """Stored trust items that do not parse or are not signed by a trusted root are
    skipped without an error."""
    ring = _ring(ROOT)
    good = issue_certificate(ROOT, NODE_PUB, name="n", now=T0)
    ring.offer([("certificate", b"not json"), ("revocation", b"{}"),
                ("certificate", issue_certificate(OTHER_ROOT, NODE_PUB, name="x",
                                                  now=T0).to_bytes()),
                ("certificate", good.to_bytes())])
    assert ring.certificates(NODE_PUB) == [good]


def test_verify_chain_with_trust_refuses_a_key_registered_but_not_certified() -> None:
    """A chain re-signed by a key the store registers but no trusted root certified
    fails at its first record, naming the node and why (the report says it cannot be
    vouched for, not that it is bad); certified under another name it fails too (the
    key speaks only for its certificate's name); certified under the node's id it
    passes."""
    records = chain([(Kind.PROGRESS, {"n": n}) for n in range(3)])
    signer_id = records[0].node_id
    forged = Signer(signer_id, _key(9))
    resigned = [r._replace(signature=forged.sign(bytes.fromhex(r.hash))) for r in records]
    keys = {signer_id: public_key_bytes(_key(9))}
    assert verify_chain("obj-1", resigned, keys).ok  # taken at its word without trust
    report = verify_chain("obj-1", resigned, keys, trust=_ring(ROOT))
    assert not report.ok and report.bad_seq == 1 and report.untrusted
    assert signer_id in str(report.reason) and "not certified" in str(report.reason)
    assert "is bad" not in str(report) and "cannot be vouched for" in str(report)
    ring = _ring(ROOT)
    ring.add(issue_certificate(ROOT, public_key_bytes(_key(9)), name="n", now=T0))
    report = verify_chain("obj-1", resigned, keys, trust=ring)
    assert not report.ok and f"{signer_id!r} is not certified" in str(report.reason)
    ring.add(issue_certificate(ROOT, public_key_bytes(_key(9)), name=signer_id, now=T0))
    assert verify_chain("obj-1", resigned, keys, trust=ring).ok


def test_a_name_is_whoever_a_trusted_root_certified_not_what_the_store_maps() -> None:
    """A record names its writer; a key mapped to that name by the caller (a store row)
    but certified for another name does not count, whoever mapped it first; the key
    certified under the name counts, and two keys certified under one name (a rotation)
    both do."""
    records = chain([(Kind.PROGRESS, {"n": 1})])
    dave = records[0].node_id
    bob = _key(7)
    forged = [r._replace(signature=Signer(dave, bob).sign(bytes.fromhex(r.hash)))
              for r in records]
    ring = _ring(ROOT)
    ring.add(issue_certificate(ROOT, public_key_bytes(bob), name="bob", now=T0))
    rows = {dave: public_key_bytes(bob)}  # a forged store row: "dave is bob's key"
    report = verify_chain("obj-1", forged, rows, trust=ring)
    assert not report.ok and f"{dave!r} is not certified" in str(report.reason)
    real = _key(8)
    ring.add(issue_certificate(ROOT, public_key_bytes(real), name=dave, now=T0))
    genuine = [r._replace(signature=Signer(dave, real).sign(bytes.fromhex(r.hash)))
               for r in records]
    assert verify_chain("obj-1", genuine, rows, trust=ring).ok
    report = verify_chain("obj-1", forged, rows, trust=ring)
    assert not report.ok and not report.untrusted  # a certified name, a forged signature
    assert "does not verify under any key certified as" in str(report.reason)
    rotated = _key(6)
    ring.add(issue_certificate(ROOT, public_key_bytes(rotated), name=dave, now=T0))
    again = [r._replace(signature=Signer(dave, rotated).sign(bytes.fromhex(r.hash)))
             for r in records]
    assert verify_chain("obj-1", again, {}, trust=ring).ok
    assert verify_chain("obj-1", genuine, {}, trust=ring).ok


def test_a_sealed_head_is_vouched_for_by_its_commit_seal() -> None:
    """A record signed through a commit seal verifies under trust like a signed one."""
    node = Signer("node-a", NODE)
    first = seal(RecordDraft(Kind.INSTANTIATED, {"n": 1}), object_id="o", seq=1,
                 prev_hash=GENESIS_HASH, trace_id="t", ts_us=1, policy_ref="p", signer=node,
                 sign=False)
    second = seal(RecordDraft(Kind.PROGRESS, {"n": 2}), object_id="o", seq=2,
                  prev_hash=first.hash, trace_id="t", ts_us=2, policy_ref="p", signer=node,
                  sign=False)
    commit, refs = seal_commit([first, second], node)
    ring = _ring(ROOT)
    ring.add(issue_certificate(ROOT, NODE_PUB, name="node-a", now=T0))
    report = verify_chain("o", refs, {"node-a": NODE_PUB}, seals={commit.digest: commit},
                          trust=ring)
    assert report.ok, report


def test_an_event_seal_binds_every_field() -> None:
    """An event verifies under its certified sender; changing its payload, name, object,
    dedupe key or sender makes it fail, naming the cause."""
    ring = _ring(ROOT)
    ring.add(issue_certificate(ROOT, NODE_PUB, name="client", now=T0))
    seal_bytes, digest = seal_event(NODE.sign, "client", "o-1", "approval", b'{"ok":true}',
                                    "k1", "n" * 24)
    assert check_event_seal(seal_bytes, "o-1", "approval", b'{"ok":true}', "k1",
                            ring) == (digest, NODE_PUB, None)
    for args in (("o-1", "approval", b'{"ok":false}', "k1"), ("o-1", "reject",
                 b'{"ok":true}', "k1"), ("o-2", "approval", b'{"ok":true}', "k1"),
                 ("o-1", "approval", b'{"ok":true}', None)):
        _, _, why = check_event_seal(seal_bytes, *args, ring)
        assert why is not None and "changed after it was sent" in why
    unsigned, _, why = check_event_seal(b"", "o-1", "approval", b"{}", None, ring)
    assert unsigned is None and why == "the event carries no signature"
    impostor = EventSeal("mallory", "n" * 24, EventSeal.from_bytes(seal_bytes).signature)
    _, _, why = check_event_seal(impostor.to_bytes(), "o-1", "approval", b'{"ok":true}',
                                 "k1", ring)
    assert why is not None and "mallory" in why


def test_an_event_sealed_under_a_name_its_key_is_not_certified_for_is_refused() -> None:
    """A key certified as ``bob`` sealing an event as ``dave`` is refused, naming
    ``dave``, whether or not ``dave`` has a certified key of its own."""
    ring = _ring(ROOT)
    ring.add(issue_certificate(ROOT, NODE_PUB, name="bob", now=T0))
    forged, _ = seal_event(NODE.sign, "dave", "o-1", "perdure:approval", b"{}", None,
                           "n" * 24)
    _, key, why = check_event_seal(forged, "o-1", "perdure:approval", b"{}", None, ring)
    assert key is None and why is not None and "'dave' is not certified" in why
    assert ring.problem(NODE_PUB, name="dave") == (
        f"key {key_text(NODE_PUB)} is certified as 'bob', not as 'dave'")
    ring.add(issue_certificate(ROOT, public_key_bytes(_key(5)), name="dave", now=T0))
    _, _, why = check_event_seal(forged, "o-1", "perdure:approval", b"{}", None, ring)
    assert why is not None and "'dave'" in why


def test_parse_public_key_accepts_hex_with_or_without_prefix() -> None:
    """Root keys are written as 64 hex digits, optionally ``ed25519:``-prefixed."""
    assert parse_public_key(NODE_PUB.hex()) == NODE_PUB
    assert parse_public_key(f"  ed25519:{NODE_PUB.hex()}\n") == NODE_PUB
    for bad in ("", "ed25519:abc", "zz" * 32):
        with pytest.raises(ValueError, match="not an Ed25519 public key"):
            parse_public_key(bad)
