"""Tampered or corrupted memory is detected, named by sequence number, and never resumed.

Every test edits a real store behind perdure's back, the way damage or an attacker
would: record-level edits go through a plain driver connection of the backend under
test (``sqlite3`` on the SQLite file, ``psycopg`` on the PostgreSQL database); the
damaged-file test overwrites pages of a SQLite file with raw bytes.
"""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import perdure
from perdure.core.chain import Signer, seal
from perdure.core.codec import decode
from perdure.core.records import Kind, RecordDraft
from perdure.errors import (
    AgentParkedError,
    RecordDecodeError,
    StoreCorruptError,
)
from tests.integration.engine_support import ClaimRounds, wait_until

MakeApp = Callable[..., perdure.App]
OID = "obj-1"


def _db_path(store_url: str) -> str:
    return store_url.removeprefix("sqlite:///")


class RawSQL:
    """A plain driver connection to the store in autocommit mode, outside perdure.

    Statements use ``?`` placeholders and portable SQL; blobs go in and come out as
    ``bytes`` (BLOB on SQLite, BYTEA on PostgreSQL). ``BEGIN``/``COMMIT`` group edits.
    """

    def __init__(self, store_url: str) -> None:
        self.postgres = not store_url.startswith("sqlite:")
        if self.postgres:
            import psycopg

            self._pg = psycopg.connect(store_url, autocommit=True)
        else:
            self._lite = sqlite3.connect(_db_path(store_url), isolation_level=None)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement; its rows (none for a statement that returns none)."""
        if not self.postgres:
            return self._lite.execute(sql, tuple(params)).fetchall()
        cur = self._pg.execute(sql.replace("?", "%s").encode(), tuple(params))
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                for row in cur.fetchall()] if cur.description else []

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
        """Run a query that returns exactly one row; that row."""
        (row,) = self.execute(sql, params)
        return row

    def close(self) -> None:
        """Close the connection."""
        (self._pg if self.postgres else self._lite).close()


@pytest.fixture
def db(store_url: str) -> Iterator[Callable[[], RawSQL]]:
    """Plain driver connections to the test's store, closed after the test."""
    opened: list[RawSQL] = []

    def connect() -> RawSQL:
        conn = RawSQL(store_url)
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        conn.close()


def _cli(store_url: str, key_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )


def _double(x: int) -> int:
    return x * 2


def _sum_doubles(app: perdure.App) -> Any:
    """Register the agent the fixtures run: ``n`` steps doubling ``0..n-1``, summed."""

    @app.agent(name="sum_doubles")
    async def sum_doubles(run: perdure.Run, n: int) -> int:
        total = 0
        for i in range(n):
            total += await run.step(_double, i)
        return total

    return sum_doubles


@pytest.fixture
def finished(make_app: MakeApp) -> perdure.App:
    """An App whose object ``obj-1`` ran six steps to completion: seven records."""
    app = make_app()
    sum_doubles = _sum_doubles(app)
    handle = app.options(object_id=OID).start(sum_doubles, 6)
    with app.background_worker():
        assert handle.result(timeout=10) == 30
    report = app.verify(OID)
    assert report.ok and report.records == 8
    return app


def _assert_bad(app: perdure.App, store_url: str, key_dir: Path, seq: int, reason: str) -> None:
    report = app.verify(OID)
    assert not report.ok
    assert report.bad_seq == seq, report
    assert reason in (report.reason or ""), report
    done = _cli(store_url, key_dir, "verify", OID)
    assert done.returncode == 1, done
    assert f"record #{seq} is bad" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr


def test_untouched_memory_verifies(finished: perdure.App, store_url: str, key_dir: Path) -> None:
    """The baseline: an intact object verifies through the App and the CLI (exit 0)."""
    done = _cli(store_url, key_dir, "verify", OID)
    assert done.returncode == 0, done
    assert "8 records verified" in done.stdout


def test_edited_body_is_named(finished: perdure.App, db: Callable[[], RawSQL],
                              store_url: str, key_dir: Path) -> None:
    """Changing one byte of a record's body (still valid JSON) fails at that record."""
    conn = db()
    (body,) = conn.one("SELECT body FROM records WHERE object_id=? AND seq=4", (OID,))
    edited = bytes(body).replace(b'"result":4', b'"result":5')
    assert edited != bytes(body)
    conn.execute("UPDATE records SET body=? WHERE object_id=? AND seq=4", (edited, OID))
    _assert_bad(finished, store_url, key_dir, 4, "content does not match its hash")


def test_deleted_middle_record_is_named(finished: perdure.App,
                                        db: Callable[[], RawSQL],
                                        store_url: str, key_dir: Path) -> None:
    """Deleting a record from the middle reports the missing sequence number."""
    db().execute("DELETE FROM records WHERE object_id=? AND seq=3", (OID,))
    _assert_bad(finished, store_url, key_dir, 3, "sequence gap")


def test_swapped_records_are_named(finished: perdure.App, db: Callable[[], RawSQL],
                                   store_url: str, key_dir: Path) -> None:
    """Swapping two records' contents while keeping their seq fails at the first of them."""
    conn = db()
    cols = "trace_id, ts_us, node_id, policy_ref, kind, body, prev_hash, hash, signature"
    rows = {
        seq: conn.one(f"SELECT {cols} FROM records WHERE object_id=? AND seq=?", (OID, seq))
        for seq in (3, 5)
    }
    sets = ", ".join(f"{c.strip()}=?" for c in cols.split(","))
    conn.execute("BEGIN")
    for seq, other in ((3, 5), (5, 3)):
        conn.execute(f"UPDATE records SET {sets} WHERE object_id=? AND seq=?",
                     (*rows[other], OID, seq))
    conn.execute("COMMIT")
    _assert_bad(finished, store_url, key_dir, 3, "previous-hash link is broken")


def test_swapped_bodies_are_named(finished: perdure.App, db: Callable[[], RawSQL],
                                  store_url: str, key_dir: Path) -> None:
    """Swapping only two bodies (headers, hashes and signatures stay) fails at the first."""
    conn = db()
    b3, b6 = (conn.one("SELECT body FROM records WHERE object_id=? AND seq=?", (OID, s))[0]
              for s in (3, 6))
    conn.execute("UPDATE records SET body=? WHERE object_id=? AND seq=3", (b6, OID))
    conn.execute("UPDATE records SET body=? WHERE object_id=? AND seq=6", (b3, OID))
    _assert_bad(finished, store_url, key_dir, 3, "content does not match its hash")


@pytest.mark.parametrize("claimed_node", ["real", "forger"])
def test_resigned_forgery_fails_on_signature(
    finished: perdure.App, db: Callable[[], RawSQL], store_url: str,
    key_dir: Path, claimed_node: str,
) -> None:
    """A forger rewrites #4 onwards with correct hashes and links, signs with an unknown key.

    Whether the forged records claim the real node's id or a new one, the chain
    fails on the signature of #4.
    """
    app = finished
    records = app.history(OID)
    node_id = app.node_id if claimed_node == "real" else "forger"
    forger = Signer(node_id, Ed25519PrivateKey.generate())
    conn = db()
    prev = records[2].hash
    conn.execute("BEGIN")
    for rec in records[3:]:
        body = dict(rec.body)
        if rec.seq == 4:
            body["result"] = 1000
        forged = seal(RecordDraft(Kind(rec.kind), body), object_id=OID, seq=rec.seq,
                      prev_hash=prev, trace_id=rec.trace_id, ts_us=rec.ts_us,
                      policy_ref=rec.policy_ref, signer=forger)
        conn.execute(
            "UPDATE records SET node_id=?, body=?, prev_hash=?, hash=?, signature=? "
            "WHERE object_id=? AND seq=?",
            (forged.node_id, forged.body_bytes, bytes.fromhex(forged.prev_hash),
             bytes.fromhex(forged.hash), forged.signature, OID, rec.seq),
        )
        prev = forged.hash
    conn.execute("UPDATE objects SET head_hash=? WHERE object_id=?", (bytes.fromhex(prev), OID))
    conn.execute("COMMIT")
    assert app.history(OID)[3].body["result"] == 1000
    reason = ("signature does not verify" if claimed_node == "real"
              else "'forger' is not certified by a root this node trusts")
    _assert_bad(app, store_url, key_dir, 4, reason)


def test_deleted_tail_fails_on_the_head(finished: perdure.App,
                                        db: Callable[[], RawSQL],
                                        store_url: str, key_dir: Path) -> None:
    """Deleting the last record leaves a valid-looking chain the row's head contradicts."""
    db().execute("DELETE FROM records WHERE object_id=? AND seq=8", (OID,))
    _assert_bad(finished, store_url, key_dir, 8, "records missing")


def test_non_json_body_names_object_and_seq(finished: perdure.App,
                                            db: Callable[[], RawSQL],
                                            store_url: str, key_dir: Path) -> None:
    """A body that is not JSON raises RecordDecodeError naming object and seq; never None."""
    db().execute("UPDATE records SET body=? WHERE object_id=? AND seq=5",
                 (b"\xff\x00{not json", OID))
    with pytest.raises(RecordDecodeError) as caught:
        finished.history(OID)
    assert (caught.value.object_id, caught.value.seq) == (OID, 5)
    assert f"{OID!r}" in str(caught.value) and "record #5" in str(caught.value)
    _assert_bad(finished, store_url, key_dir, 5, "not valid JSON")
    shown = _cli(store_url, key_dir, "show", OID)
    assert shown.returncode == 1
    assert "Traceback" not in shown.stderr
    lines = shown.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "record #5" in lines[0]


# -- damaged memory is parked, not resumed ------------------------------------------------


@pytest.mark.parametrize("damage", ["edit", "text", "not-json", "prev-hash", "delete-middle",
                                    "delete-tail"])
def test_tampered_dormant_object_is_parked(make_app: MakeApp,
                                           db: Callable[[], RawSQL],
                                           damage: str) -> None:
    """A dormant object whose memory was changed is parked with a note when claimed.

    Its agent code does not run again and nothing more is appended to its memory.
    """
    app = make_app()
    calls: list[str] = []

    def note(what: str) -> str:
        calls.append(what)
        return what

    @app.agent(name="waits")
    async def waits(run: perdure.Run) -> str:
        await run.step(note, "a")
        await run.step(note, "b")
        await run.wait_for("go", timeout=60)
        return await run.step(note, "after")

    handle = app.options(object_id=OID).start(waits)
    with app.background_worker():
        deadline = time.monotonic() + 10
        while app.get(OID).status != "dormant":
            assert time.monotonic() < deadline, app.get(OID)
            time.sleep(0.01)
    assert calls == ["a", "b"]
    conn = db()
    if damage == "text" and conn.postgres:
        pytest.skip("PostgreSQL enforces the BYTEA type: a body cannot be stored as text")
    (count_before,) = conn.one("SELECT count(*) FROM records")
    if damage == "edit":
        (body,) = conn.one("SELECT body FROM records WHERE object_id=? AND seq=2", (OID,))
        edited = bytes(body).replace(b'"a"', b'"z"')
        assert edited != bytes(body)
        conn.execute("UPDATE records SET body=? WHERE object_id=? AND seq=2", (edited, OID))
    elif damage == "text":
        conn.execute("UPDATE records SET body=CAST(body AS TEXT) WHERE object_id=? AND seq=2",
                     (OID,))
    elif damage == "not-json":
        conn.execute("UPDATE records SET body=? WHERE object_id=? AND seq=2",
                     (b"\x00\xff", OID))
    elif damage == "prev-hash":
        conn.execute("UPDATE records SET prev_hash=? WHERE object_id=? AND seq=2",
                     (b"\1" * 32, OID))
    elif damage == "delete-middle":
        conn.execute("DELETE FROM records WHERE object_id=? AND seq=2", (OID,))
        count_before -= 1
    else:
        (tail,) = conn.one("SELECT max(seq) FROM records WHERE object_id=?", (OID,))
        conn.execute("DELETE FROM records WHERE object_id=? AND seq=?", (OID, tail))
        count_before -= 1
    app.send(OID, "go", True)

    with ClaimRounds(app) as rounds, app.background_worker():
        deadline = time.monotonic() + 10
        while not (row := app.store.get(OID)) or not row.parked:
            assert time.monotonic() < deadline, row
            time.sleep(0.01)
        # A wrongly resuming worker has its chance to take the object and append.
        claimed = rounds.look("the worker to look at the store after parking the object")
        assert OID not in claimed, "a parked object was claimed again"
    row = app.store.get(OID)
    assert row is not None and row.parked and row.lease_owner is None
    assert row.note is not None and "memory damaged" in row.note
    assert ("#2" if damage != "delete-tail" else "records missing") in row.note
    assert calls == ["a", "b"]
    assert conn.one("SELECT count(*) FROM records") == (count_before,)
    assert app.get(OID).status == "parked"
    with pytest.raises(AgentParkedError, match="memory damaged"):
        handle.result(timeout=1)


# -- damaged database file ------------------------------------------------------------------


def _pad(i: int) -> str:
    return f"{i:04d}-" + "x" * 150


def test_corrupt_pages_fail_closed(make_sqlite_app: MakeApp, sqlite_url: str,
                                   key_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Garbage over pages in the middle of the file gives StoreCorruptError, never a resume.

    SQLite only: it is about the store's own file. The App and the CLI both report
    the damage in one clear line; a worker on the damaged store does not run the
    dormant agent's next step.
    """
    make_app, store_url = make_sqlite_app, sqlite_url
    app = make_app()
    after: list[int] = []

    def grow(i: int) -> str:
        return _pad(i)

    def later() -> int:
        after.append(1)
        return 1

    @app.agent(name="big")
    async def big(run: perdure.Run, n: int) -> int:
        for i in range(n):
            await run.step(grow, i)
        await run.sleep(0.3)
        return await run.step(later)

    handles = [app.options(object_id=f"big-{k}").start(big, 100) for k in range(3)]
    with app.background_worker():
        deadline = time.monotonic() + 30
        while any(app.get(h.object_id).status != "dormant" for h in handles):
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert sum(app.get(h.object_id).records for h in handles) >= 300
    app.close()

    path = Path(_db_path(store_url))
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    data = bytearray(path.read_bytes())
    page = 4096
    pages = len(data) // page
    assert pages > 30
    noise = random.Random(7)
    for index in range(pages // 3, 2 * pages // 3):
        data[index * page:(index + 1) * page] = noise.randbytes(page)
    path.write_bytes(bytes(data))

    reopened = make_app()
    with pytest.raises((StoreCorruptError, RecordDecodeError)) as caught:
        for handle in handles:
            reopened.store.get(handle.object_id)
            reopened.history(handle.object_id)
    message = str(caught.value)
    assert "damaged" in message or "cannot be decoded" in message
    assert str(path) in message or "record #" in message

    done = _cli(store_url, key_dir, "verify", "--all")
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr
    errors = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and errors[0].startswith("error:"), done.stderr
    assert "damaged" in errors[0] or "cannot be decoded" in errors[0]

    time.sleep(0.3)  # the agents' timers are due now

    @reopened.agent(name="big")
    async def big_again(run: perdure.Run, n: int) -> int:
        return await big(run, n)

    heard: list[object] = []
    reopened.hooks.subscribe(heard.append)
    with reopened.background_worker():
        assert wait_until(lambda: any(getattr(r, "action", None) == "store_corrupt"
                                      for r in caplog.records), timeout=30), \
            "the worker did not say that the store is damaged"
    assert after == []
    assert heard == [], "the worker claimed or ran something on the damaged store"


def test_decoded_body_round_trips(finished: perdure.App) -> None:
    """Sanity for the edits above: stored bodies are the canonical JSON of the record body."""
    for rec in finished.history(OID):
        assert decode(rec.body_bytes) == rec.body


# -- commit seals: records of many objects sharing one commit share one signature -------


@pytest.fixture
def sealed(make_app: MakeApp) -> tuple[perdure.App, str]:
    """Objects run side by side, so their steps share commits: an object whose memory
    holds records under commit seals, and the App."""
    app = make_app()
    sum_doubles = _sum_doubles(app)
    handles = [app.options(object_id=f"obj-{i}").start(sum_doubles, 6) for i in range(8)]
    with app.background_worker(concurrency=8):
        assert [h.result(timeout=20) for h in handles] == [30] * 8
    for handle in handles:
        assert app.verify(handle.object_id).ok
        if sum(len(r.signature) == 33 for r in app.history(handle.object_id)) >= 2:
            return app, handle.object_id
    raise AssertionError("no object had records under a commit seal")


def _first_sealed(app: perdure.App, oid: str) -> Any:
    return next(r for r in app.history(oid) if len(r.signature) == 33)


def _assert_bad_object(app: perdure.App, store_url: str, key_dir: Path, oid: str, seq: int,
                       reason: str) -> None:
    report = app.verify(oid)
    assert not report.ok and report.bad_seq == seq, report
    assert reason in (report.reason or ""), report
    done = _cli(store_url, key_dir, "verify", oid)
    assert done.returncode == 1 and f"record #{seq} is bad" in done.stdout, done


def test_sealed_memory_verifies_through_the_cli(sealed: tuple[perdure.App, str],
                                               store_url: str, key_dir: Path) -> None:
    """Intact objects whose records share commit seals verify through the CLI too."""
    app, oid = sealed
    done = _cli(store_url, key_dir, "verify", "--all")
    assert done.returncode == 0, done
    assert f"{oid}: {len(app.history(oid))} records verified" in done.stdout


def test_deleted_seal_is_named(sealed: tuple[perdure.App, str], db: Callable[[], RawSQL],
                               store_url: str, key_dir: Path) -> None:
    """Deleting a commit seal leaves its records unsigned: the first of them is named."""
    app, oid = sealed
    rec = _first_sealed(app, oid)
    db().execute("DELETE FROM seals WHERE digest=?", (rec.signature[1:],))
    _assert_bad_object(app, store_url, key_dir, oid, rec.seq, "is missing from the store")


def test_edited_sealed_record_is_not_covered(sealed: tuple[perdure.App, str],
                                            db: Callable[[], RawSQL],
                                            store_url: str, key_dir: Path) -> None:
    """A sealed record rewritten with its hash, the next link and the head made to match
    still points at a seal that never signed its new hash."""
    app, oid = sealed
    records = app.history(oid)
    last = records[-1]
    forged = seal(RecordDraft(Kind(last.kind), {**last.body, "result": 1000}),
                  object_id=oid, seq=last.seq, prev_hash=last.prev_hash,
                  trace_id=last.trace_id, ts_us=last.ts_us, policy_ref=last.policy_ref,
                  signer=Signer(last.node_id, Ed25519PrivateKey.generate()), sign=False)
    conn = db()
    conn.execute("BEGIN")
    conn.execute("UPDATE records SET body=?, hash=?, signature=? WHERE object_id=? AND seq=?",
                 (forged.body_bytes, bytes.fromhex(forged.hash), last.signature, oid,
                  last.seq))
    conn.execute("UPDATE objects SET head_hash=? WHERE object_id=?",
                 (bytes.fromhex(forged.hash), oid))
    conn.execute("COMMIT")
    if len(last.signature) == 33:
        reason = "does not cover this record's hash"
    else:  # the last record (terminated) had a commit of its own: its signature fails
        reason = "signature does not verify"
    _assert_bad_object(app, store_url, key_dir, oid, last.seq, reason)


def test_edited_seal_hash_list_is_altered(sealed: tuple[perdure.App, str],
                                          db: Callable[[], RawSQL],
                                          store_url: str, key_dir: Path) -> None:
    """A seal whose list of hashes was edited no longer matches its digest."""
    app, oid = sealed
    rec = _first_sealed(app, oid)
    conn = db()
    (hashes,) = conn.one("SELECT hashes FROM seals WHERE digest=?", (rec.signature[1:],))
    conn.execute("UPDATE seals SET hashes=? WHERE digest=?",
                 (bytes(32) + bytes(hashes)[32:], rec.signature[1:]))
    _assert_bad_object(app, store_url, key_dir, oid, rec.seq, "was altered")
