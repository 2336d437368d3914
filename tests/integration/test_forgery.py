"""Forged memory is refused: ``verify`` names the record, workers park without running code.

Every test forges a real store behind perdure's back, as someone with write access to
the store (but no trusted key) would: a plain driver connection edits rows (``RawSQL``
from the tamper suite), hashes are recomputed so that every link holds, signatures are
kept, made with keys the forger owns, or borrowed from other records and commits.

Two nodes of one cluster (one root certifies both key folders) share the test's store:

- node A runs the objects in the test's process and keeps running across the forgery,
  so it holds the chain it wrote and the head it saw;
- node B is a fresh node in another key folder, with no held records and no seen heads:
  only links, hashes and certified signatures can tell it what is forged.

For a forged chain, each test checks that ``App.verify`` and ``perdure verify`` name the
first bad record, that node A (still running) and then node B park the object without
running any of its code (agent entries and step bodies are counted in a file) and
without appending to its memory, and that each of them then runs another object to
completion. The CLI processes load this module as their ``--app``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import perdure
from perdure.core.chain import CommitSeal, Signer, seal_parts
from perdure.core.codec import encode
from perdure.core.records import GENESIS_HASH, Kind, Record, compute_hash
from perdure.core.trust import (
    EventSeal,
    event_digest,
    issue_certificate,
    public_key_bytes,
    seal_event,
)
from perdure.errors import AgentParkedError, IntegrityError
from tests.cluster import one_root
from tests.integration.test_tamper import RawSQL

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.integration.test_forgery"
OID = "victim"
TERMINAL = ("completed", "failed", "cancelled")
# What the victim's log holds once it waits for "go": its code entered once, two steps.
DORMANT_LOG = ["enter:1", "step:a", "step:b"]
DORMANT_RECORDS = 4  # instantiated, step a, step b, dormant

app = perdure.App(store="sqlite:///forgery-never-opened.db", lease_seconds=2.0,
                  poll_interval=0.01)


# -- agents: every entry into their code and every step body leaves a line in a file ----


def mark(log: str, line: str) -> None:
    """Append ``line`` to the file ``log`` (user code ran)."""
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def work(log: str, what: str) -> str:
    """A step: marks that its body ran."""
    mark(log, f"step:{what}")
    return what


@app.agent(name="waits")
async def waits(run: perdure.Run, log: str, amount: int) -> list[Any]:
    """Two steps, a wait for ``go`` (dormant meanwhile), a last step."""
    mark(log, f"enter:{amount}")  # outside any step: runs on every replay
    first = await run.step(work, log, "a")
    second = await run.step(work, log, "b")
    go = await run.wait_for("go", timeout=300)
    return [first, second, await run.step(work, log, f"after:{go}")]


@app.agent(name="quick")
async def quick(run: perdure.Run, log: str) -> str:
    """One step: the unrelated object a worker must still serve."""
    mark(log, "enter")
    return await run.step(work, log, "quick")


@app.agent(name="listens")
async def listens(run: perdure.Run, log: str) -> list[Any]:
    """Receives ``go``, then after ``gate`` another ``go``; each payload goes to a step."""
    mark(log, "enter")
    first = await run.wait_for("go", timeout=300)
    await run.step(work, log, f"got:{json.dumps(first)}")
    await run.wait_for("gate", timeout=300)
    second = await run.wait_for("go", timeout=300)
    await run.step(work, log, f"got:{json.dumps(second)}")
    return [first, second]


HOLD = threading.Event()  # the ``pauses`` agent waits on it (in the test's process)


def hold(log: str) -> str:
    """A step that marks and returns."""
    return work(log, "held")


@app.agent(name="pauses")
def pauses(run: perdure.SyncRun, log: str) -> Any:
    """A recorded step, then code that waits for the test, then a wait for ``go``."""
    run.step(hold, log)
    HOLD.wait(timeout=60)
    return run.wait_for("go", timeout=300)


# -- the cluster ------------------------------------------------------------------------


@dataclass
class Cluster:
    """Nodes A and B on the test's store, the CLI (node A's key folder), raw SQL."""

    url: str
    tmp: Path
    keys_a: Path
    keys_b: Path
    a: perdure.App
    b: perdure.App
    _conns: list[RawSQL] = field(default_factory=list)
    _reader: RawSQL | None = None

    def raw(self) -> RawSQL:
        """A plain driver connection to the store (closed after the test)."""
        conn = RawSQL(self.url)
        self._conns.append(conn)
        return conn

    def close_raw(self) -> None:
        """Close the plain driver connections opened so far."""
        for conn in self._conns:
            conn.close()
        self._conns.clear()
        self._reader = None

    def log(self, name: str) -> Path:
        """The file where the object ``name``'s code marks what ran."""
        return self.tmp / f"{name}.log"

    def cli(self, *args: str, keys: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``perdure`` on the store as node A (or the node of ``keys``)."""
        command = [sys.executable, "-m", "perdure", "--store", self.url,
                   "--key-dir", str(keys or self.keys_a), *args]
        return subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True,
                              timeout=60, check=False)

    def worker_process(self, log: Path) -> subprocess.Popen[bytes]:
        """A ``perdure worker`` process of node A on this module's agents, logging to
        ``log``."""
        with open(log, "ab") as sink:
            return subprocess.Popen(
                [sys.executable, "-m", "perdure", "--store", self.url, "--key-dir",
                 str(self.keys_a), "--app", f"{MODULE}:app", "worker", "--lease", "2",
                 "--poll", "0.01"],
                cwd=ROOT, env=_env(), stdout=sink, stderr=subprocess.STDOUT,
            )

    def count(self, oid: str) -> int:
        """How many records the store holds for ``oid``."""
        if self._reader is None:
            self._reader = self.raw()
        (n,) = self._reader.one("SELECT count(*) FROM records WHERE object_id=?", (oid,))
        return int(n)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.fixture
def cluster(store_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """Nodes A and B (one root certifies both) on the test's store, with this module's
    agents."""
    keys_a, keys_b = tmp_path / "keys-a", tmp_path / "keys-b"
    one_root(tmp_path / "keys-root", keys_a, keys_b)
    c = Cluster(store_url, tmp_path, keys_a, keys_b,
                app.with_settings(store=store_url, key_dir=keys_a),
                app.with_settings(store=store_url, key_dir=keys_b))
    yield c
    c.close_raw()
    c.a.close()
    c.b.close()


@pytest.fixture
def sqlite_only(backend: str) -> None:
    """Skip on PostgreSQL (before its database is made): the test damages bytes only a
    SQLite file lets through."""
    if backend != "sqlite":
        pytest.skip("SQLite only: PostgreSQL refuses text that is not valid UTF-8, and "
                    "the damage is to the SQLite file's own bytes")


def wait_until(predicate: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    """Poll ``predicate`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"not reached in {timeout}s: {what}")
        time.sleep(0.01)


def lines(path: Path) -> list[str]:
    """The lines ``mark`` wrote to ``path``."""
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []


def dormant_victim(c: Cluster, oid: str = OID) -> Path:
    """Start ``waits`` as ``oid`` (node A's worker must run) and wait until it sleeps,
    waiting for ``go``; its log."""
    log = c.log(oid)
    c.a.options(object_id=oid).start(waits, str(log), 1)
    wait_until(lambda: c.a.get(oid).status == "dormant", what=f"{oid} dormant")
    assert lines(log) == DORMANT_LOG
    assert c.count(oid) == DORMANT_RECORDS
    return log


def settled_waiting(node: perdure.App, oid: str, event: str) -> bool:
    """``oid`` is let go, waiting for ``event``, next due only at its wait's timeout."""
    row = node.store.get(oid)
    return (row is not None and row.lease_owner is None and row.waiting_event == event
            and row.ready_at is not None and row.ready_at > time.time() + 60)


def serves(c: Cluster, node: perdure.App, name: str) -> None:
    """``node``'s worker (running) carries a new, unrelated object to its result."""
    log = c.log(name)
    handle = node.options(object_id=name).start(quick, str(log))
    assert handle.result(timeout=15) == "quick"
    assert lines(log) == ["enter", "step:quick"]


def refused(c: Cluster, node: perdure.App, log: Path, *phrases: str, oid: str = OID,
            expected_log: Sequence[str] = DORMANT_LOG,
            records: int = DORMANT_RECORDS) -> str:
    """``node``'s running worker parks ``oid`` with a note naming it and ``phrases``, runs
    none of its code, appends nothing to its memory, and goes on with other work.
    Returns the note."""
    wait_until(lambda: (row := node.store.get(oid)) is not None and bool(row.parked),
               what=f"{oid} parked by {node.node_id}")
    row = node.store.get(oid)
    assert row is not None and row.lease_owner is None
    note = row.note or ""
    assert "memory damaged or forged" in note, note
    assert f"node {node.node_id} refused it" in note, note
    for phrase in phrases:
        assert phrase in note, (phrase, note)
    serves(c, node, f"other-{node.node_id}-{time.monotonic_ns()}")
    assert lines(log) == list(expected_log)  # checked after the other object ran
    assert c.count(oid) == records
    assert node.get(oid).status == "parked"
    with pytest.raises(AgentParkedError, match="memory damaged or forged"):
        node.handle(oid).result(timeout=1)
    return note


def assert_bad(c: Cluster, seq: int, reason: str, oid: str = OID) -> None:
    """``App.verify`` and ``perdure verify`` (exit 1, no traceback) name record ``seq``."""
    report = c.a.verify(oid)
    assert not report.ok and report.bad_seq == seq, report
    assert reason in (report.reason or ""), report
    done = c.cli("verify", oid)
    assert done.returncode == 1, done
    assert f"record #{seq} is bad" in done.stdout and reason in done.stdout, done.stdout
    assert "Traceback" not in done.stderr + done.stdout


# -- the forger's tools -------------------------------------------------------------------


def rehashed(records: Sequence[Record], start: int,
             edit: Callable[[dict[str, Any]], dict[str, Any]] | None = None, *,
             node_id: str | None = None,
             sign: Callable[[bytes], bytes] | None = None) -> list[Record]:
    """Records ``#start`` to the head, rebuilt onto ``#start - 1``: the body of
    ``#start`` passed through ``edit``, every hash and link recomputed so the chain
    holds together. Each record keeps its old signature bytes unless ``sign`` (a
    forger's key) signs the new hash; ``node_id`` makes them claim another node."""
    prev = records[start - 2].hash if start > 1 else GENESIS_HASH
    forged = []
    for rec in records[start - 1:]:
        body, body_bytes = rec.body, rec.body_bytes
        if rec.seq == start and edit is not None:
            body = edit(dict(rec.body))
            body_bytes = encode(body)
        node = node_id or rec.node_id
        digest = compute_hash(object_id=rec.object_id, seq=rec.seq, trace_id=rec.trace_id,
                              ts_us=rec.ts_us, node_id=node, policy_ref=rec.policy_ref,
                              kind=rec.kind, body_bytes=body_bytes, prev_hash=prev)
        signature = rec.signature if sign is None else sign(bytes.fromhex(digest))
        forged.append(rec._replace(node_id=node, body=body, body_bytes=body_bytes,
                                   prev_hash=prev, hash=digest, signature=signature))
        prev = digest
    return forged


def under_seal(records: Sequence[Record], seal_node: str, sign: Callable[[bytes], bytes]
               ) -> tuple[CommitSeal, list[Record]]:
    """One commit seal over ``records`` that names ``seal_node`` and is signed by
    ``sign``, and the records referring to it (their own node ids unchanged)."""
    digest, hashes, refs = seal_parts([r._replace(node_id=seal_node) for r in records],
                                      seal_node)
    sealed = CommitSeal(digest, seal_node, hashes, sign(digest))
    return sealed, [rec._replace(signature=ref.signature)
                    for rec, ref in zip(records, refs, strict=True)]


def store_chain(conn: RawSQL, records: Sequence[Record], seal: CommitSeal | None = None
                ) -> None:
    """Write forged ``records`` over the stored ones (same seq) in one transaction, with
    ``seal`` if given, and point the object's row at the new head."""
    conn.execute("BEGIN")
    for rec in records:
        conn.execute(
            "UPDATE records SET node_id=?, body=?, prev_hash=?, hash=?, signature=? "
            "WHERE object_id=? AND seq=?",
            (rec.node_id, rec.body_bytes, bytes.fromhex(rec.prev_hash),
             bytes.fromhex(rec.hash), rec.signature, rec.object_id, rec.seq))
    if seal is not None:
        conn.execute("INSERT INTO seals (digest, node_id, hashes, signature) VALUES (?,?,?,?)",
                     (seal.digest, seal.node_id, seal.hashes, seal.signature))
    head = records[-1]
    conn.execute("UPDATE objects SET head_seq=?, head_hash=? WHERE object_id=?",
                 (head.seq, bytes.fromhex(head.hash), head.object_id))
    conn.execute("COMMIT")


def add_forger_node(conn: RawSQL, node_id: str) -> Signer:
    """A node the forger registers in the store with a fresh key, and a certificate for
    it from the forger's own root in the store's trust table; the forger's signer."""
    key = Ed25519PrivateKey.generate()
    now = time.time()
    conn.execute("INSERT INTO nodes (node_id, public_key, created_at) VALUES (?, ?, ?)",
                 (node_id, public_key_bytes(key), now))
    cert = issue_certificate(Ed25519PrivateKey.generate(), public_key_bytes(key),
                             name=node_id, now=now)
    conn.execute("INSERT INTO trust (item_id, kind, body, created_at) VALUES (?, ?, ?, ?)",
                 ("certificate:forged", "certificate", cert.to_bytes(), now))
    return Signer(node_id, key)


def wake(app: perdure.App) -> None:
    """The victim's wake-up event, sealed by ``app`` and put into the inbox directly: a
    sender refuses to send to an object whose head it cannot vouch for, and these tests
    are about the worker."""
    data = encode("now")
    seal, _ = seal_event(app.signer.sign, app.node_id, OID, "go", data, None, "w" * 24)
    app.client.certified()
    app.store.send(OID, "go", data, None, time.time(), seal)


def refused_by_a_then_b(c: Cluster, forge: Callable[[], None], phrase_a: str,
                        phrase_b: str) -> None:
    """Node A runs the victim to its wait and keeps running while ``forge`` rewrites the
    store; woken, the victim is parked by A (``phrase_a`` in the note). Resumed with
    only node B running, B parks it too (``phrase_b``). Neither runs any of its code."""
    with c.a.background_worker():
        log = dormant_victim(c)
        forge()
        wake(c.a)
        refused(c, c.a, log, phrase_a)
    with c.b.background_worker():
        c.a.resume(OID)
        refused(c, c.b, log, phrase_b)


# -- 1, 2: an edited record, the chain re-hashed to the head, old signatures kept ----------


def test_edited_step_result_rehashed_to_the_head(cluster: Cluster) -> None:
    """A step's result edited, every hash from there to the head recomputed (the old
    signature bytes kept) and the row pointed at the new head: ``verify`` names the
    edited record (#2) by its signature; node A, which saw the real head, refuses the
    rewritten history; a fresh node B refuses the head's signature. No code runs."""
    c = cluster

    def forge() -> None:
        forged = rehashed(c.a.history(OID), 2, lambda body: {**body, "result": "forged"})
        store_chain(c.raw(), forged)
        assert c.a.history(OID)[1].body["result"] == "forged"

    refused_by_a_then_b(c, forge, "history was rewritten", "signature does not verify")
    assert_bad(c, 2, "signature does not verify")


def test_edited_intent_rehashed_to_the_head(cluster: Cluster) -> None:
    """The ``instantiated`` record's arguments edited (amount 1 -> 1000) and the chain
    re-hashed to the head with old signatures: ``verify`` names #1; both nodes park the
    victim on the head's signature and never run its code with the forged arguments (or
    any)."""
    c = cluster

    def forge() -> None:
        def more(body: dict[str, Any]) -> dict[str, Any]:
            intent = dict(body["intent"])
            assert intent["args"][1] == 1
            intent["args"] = [intent["args"][0], 1000]
            return {**body, "intent": intent}

        store_chain(c.raw(), rehashed(c.a.history(OID), 1, more))
        assert c.a.history(OID)[0].body["intent"]["args"][1] == 1000

    # Seen heads are kept per first record: a new #1 makes the chain another object to
    # them, so node A too refuses it on the head's signature.
    refused_by_a_then_b(c, forge, "signature does not verify", "signature does not verify")
    assert_bad(c, 1, "signature does not verify")
    assert not any("1000" in line for line in lines(c.log(OID)))


# -- 3: a node the forger added to the store, with a key of its own ------------------------


@pytest.mark.parametrize("signing", ["per-record", "commit-seal"])
def test_chain_resigned_by_a_node_added_to_the_store(cluster: Cluster, signing: str) -> None:
    """The forger adds a node row with a fresh key (and a certificate from a root of
    its own to the store's trust table), edits #2 and re-signs #2..#4 as that node,
    record by record or under one commit seal of its own. The key is in the store but
    no trusted root certified it: ``verify`` says #2 is "not certified", node A refuses
    the rewritten history, node B refuses the head's key. No code runs."""
    c = cluster

    def forge() -> None:
        conn = c.raw()
        forger = add_forger_node(conn, "forger")
        edit = lambda body: {**body, "result": "forged"}  # noqa: E731
        if signing == "per-record":
            store_chain(conn, rehashed(c.a.history(OID), 2, edit, node_id="forger",
                                       sign=forger.sign))
        else:
            chain = rehashed(c.a.history(OID), 2, edit, node_id="forger")
            sealed, refs = under_seal(chain, "forger", forger.sign)
            store_chain(conn, refs, sealed)
            assert all(len(r.signature) == 33 for r in c.a.history(OID)[1:])

    refused_by_a_then_b(c, forge, "history was rewritten", "not certified")
    assert_bad(c, 2, "not certified")


# -- 4: a genuine record of another object spliced in -------------------------------------


def test_record_spliced_from_another_object(cluster: Cluster) -> None:
    """Another object's head record (same seq, genuinely signed by a certified node)
    replaces the victim's, and the row names it as head: its previous-hash link does
    not fit, so ``verify`` names #4 and both nodes park the victim."""
    c = cluster
    donor_log = c.log("donor")

    def forge() -> None:
        c.a.options(object_id="donor").start(waits, str(donor_log), 1)
        wait_until(lambda: c.a.get("donor").status == "dormant", what="donor dormant")
        conn = c.raw()
        cols = "trace_id, ts_us, node_id, policy_ref, kind, body, prev_hash, hash, signature"
        row = conn.one(f"SELECT {cols} FROM records WHERE object_id='donor' AND seq=4")
        sets = ", ".join(f"{col.strip()}=?" for col in cols.split(","))
        conn.execute("BEGIN")
        conn.execute(f"UPDATE records SET {sets} WHERE object_id=? AND seq=4", (*row, OID))
        conn.execute("UPDATE objects SET head_hash=? WHERE object_id=?", (row[7], OID))
        conn.execute("COMMIT")

    refused_by_a_then_b(c, forge, "previous-hash link is broken",
                        "previous-hash link is broken")
    assert_bad(c, 4, "previous-hash link is broken")
    assert c.a.verify("donor").ok  # the donor itself is untouched
    assert lines(donor_log) == DORMANT_LOG


# -- 5: a store rolled back -------------------------------------------------------------


def _roll_back(c: Cluster, to: int = 2, oid: str = OID) -> None:
    """Delete ``oid``'s records after ``#to`` and set its row's head back to ``#to``."""
    conn = c.raw()
    (digest,) = conn.one("SELECT hash FROM records WHERE object_id=? AND seq=?", (oid, to))
    conn.execute("BEGIN")
    conn.execute("DELETE FROM records WHERE object_id=? AND seq>?", (oid, to))
    conn.execute("UPDATE objects SET head_seq=?, head_hash=? WHERE object_id=?",
                 (to, digest, oid))
    conn.execute("COMMIT")


def test_rollback_refused_by_its_node_caught_by_exported_heads_then_forgotten(
        cluster: Cluster) -> None:
    """Records deleted from the tail, the row's head set back: every prefix of a signed
    chain is signed, so only a head seen before can tell. Node A, which ran the victim
    to #4 and still runs, refuses it ("rolled back", naming #4) without running code; a
    fresh node B with no seen heads accepts the shorter memory (its ``verify`` is ok),
    but heads exported with ``perdure export-heads`` before the rollback catch it:
    ``perdure verify --anchors FILE`` exits 1 naming #4. Then the documented way after
    restoring a store from a backup on purpose: ``perdure forget-heads ID`` in A's key
    folder and ``perdure resume ID`` let A (its worker started again) carry on from the
    restored memory: step b, whose record the restore lost, runs again, then the rest."""
    c = cluster
    heads = c.tmp / "heads.jsonl"
    with c.a.background_worker():
        log = dormant_victim(c)
        exported = c.cli("export-heads", "--out", str(heads))
        assert exported.returncode == 0, exported
        (head,) = [json.loads(line) for line in heads.read_text().splitlines()]
        assert (head["object_id"], head["seq"]) == (OID, DORMANT_RECORDS)
        _roll_back(c)
        c.a.send(OID, "go", "now")
        refused(c, c.a, log, "rolled back", f"saw #{DORMANT_RECORDS}", records=2)

    fresh = c.b.verify(OID)
    assert fresh.ok and fresh.records == 2, fresh
    report = c.b.verify(OID, anchors={OID: (head["seq"], head["hash"])})
    assert not report.ok and report.bad_seq == DORMANT_RECORDS, report
    assert "rolled back" in (report.reason or "")
    caught = c.cli("verify", "--anchors", str(heads), keys=c.keys_b)
    assert caught.returncode == 1, caught
    assert f"record #{DORMANT_RECORDS} is bad" in caught.stdout, caught.stdout
    assert "rolled back" in caught.stdout and "Traceback" not in caught.stderr

    forgot = c.cli("forget-heads", OID)
    assert forgot.returncode == 0, forgot
    resumed = c.cli("resume", OID)
    assert resumed.returncode == 0, resumed
    with c.a.background_worker():
        assert c.a.handle(OID).result(timeout=15) == ["a", "b", "after:now"]
    assert lines(log) == [*DORMANT_LOG, "enter:1", "step:b", "step:after:now"]
    assert c.a.verify(OID).ok


def test_rollback_fails_verify_in_the_key_folder_of_the_node_that_ran_it(
        cluster: Cluster) -> None:
    """After node A ran the victim to #4 (its worker has stopped), a rollback to #2 fails
    ``App.verify`` and ``perdure verify`` in A's key folder, naming #4: the heads a
    node saw are kept in its key folder (``heads.db``), outside the store."""
    c = cluster
    with c.a.background_worker():
        dormant_victim(c)
    _roll_back(c)
    assert_bad(c, DORMANT_RECORDS, "rolled back")


def test_rollback_refused_by_a_restarted_worker_process(cluster: Cluster) -> None:
    """A ``perdure worker`` process of node A runs the victim to #4 and is stopped
    (SIGTERM, exit 0), which writes the head it saw to A's key folder; the store is
    rolled back to #2; the next worker process of the same node refuses the victim
    ("rolled back", #4) without re-running step b, and runs another object."""
    c = cluster
    log = c.log(OID)
    first = c.worker_process(c.tmp / "worker-1.log")
    try:
        c.a.options(object_id=OID).start(waits, str(log), 1)
        wait_until(lambda: c.a.get(OID).status == "dormant", what="victim dormant")
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=20) == 0
    assert lines(log) == DORMANT_LOG
    _roll_back(c)
    second = c.worker_process(c.tmp / "worker-2.log")
    try:
        c.a.send(OID, "go", "now")
        wait_until(lambda: (row := c.a.store.get(OID)) is not None
                   and (bool(row.parked) or row.status in TERMINAL), what="victim settled")
        assert lines(log) == DORMANT_LOG  # step b was not run a second time
        refused(c, c.a, log, "rolled back", f"saw #{DORMANT_RECORDS}", records=2)
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=20) == 0


def kept_head(keys: Path, oid: str) -> int | None:
    """The seq of the head of ``oid`` that the node of ``keys`` wrote to its heads.db."""
    conn = sqlite3.connect(keys / "heads.db")
    try:
        row = conn.execute("SELECT max(seq) FROM heads WHERE object_id=?", (oid,)).fetchone()
    finally:
        conn.close()
    return None if row is None or row[0] is None else int(row[0])


def test_forget_heads_and_resume_while_the_node_runs(cluster: Cluster) -> None:
    """As the refusal's note says: ``perdure forget-heads ID`` where the node runs
    (once it has written the head it saw to its key folder), then ``perdure resume
    ID``: node A, still running, carries on from the shorter memory."""
    c = cluster
    with c.a.background_worker():
        log = dormant_victim(c)
        _roll_back(c)
        c.a.send(OID, "go", "now")
        refused(c, c.a, log, "rolled back", records=2)
        wait_until(lambda: kept_head(c.keys_a, OID) == DORMANT_RECORDS,
                   what="the head written to heads.db")
        forgot = c.cli("forget-heads", OID)
        assert forgot.returncode == 0 and "forgot 1 head" in forgot.stdout, forgot
        assert c.cli("resume", OID).returncode == 0
        wait_until(lambda: (row := c.a.store.get(OID)) is not None
                   and (bool(row.parked) or row.status in TERMINAL), what="victim settled")
        assert c.a.get(OID).status == "completed", c.a.get(OID)
    assert lines(log) == [*DORMANT_LOG, "enter:1", "step:b", "step:after:now"]


def test_forget_heads_before_the_node_wrote_the_head(cluster: Cluster) -> None:
    """``perdure forget-heads ID`` while node A runs and has not yet written the head it
    saw to its key folder (its leases are 30 s long, so it writes them every 10 s or when
    it stops); then A stops, starts again, and ``perdure resume ID``: A carries on."""
    c = cluster
    slow = app.with_settings(store=c.url, key_dir=c.keys_a, lease_seconds=30)
    try:
        with slow.background_worker():
            log = c.log(OID)
            slow.options(object_id=OID).start(waits, str(log), 1)
            wait_until(lambda: slow.get(OID).status == "dormant", what="victim dormant")
            _roll_back(c)
            slow.send(OID, "go", "now")
            refused(c, slow, log, "rolled back", records=2)
            assert kept_head(c.keys_a, OID) is None  # not written yet
            assert c.cli("forget-heads", OID).returncode == 0
        with slow.background_worker():
            assert c.cli("resume", OID).returncode == 0
            wait_until(lambda: (row := slow.store.get(OID)) is not None
                       and (bool(row.parked) or row.status in TERMINAL),
                       what="victim settled")
            assert slow.get(OID).status == "completed", slow.store.get(OID)
    finally:
        slow.close()


# -- 6: an edited result column ------------------------------------------------------------


def test_edited_result_column_is_never_served(cluster: Cluster) -> None:
    """``UPDATE objects SET result=...`` on a completed object: ``Handle.result()``,
    ``App.result_of``, ``App.outcome`` and ``perdure result`` (exit 1, one ``error:``
    line, with or without ``--json``) report an integrity error; nothing, ``perdure
    show`` included, prints the edited value."""
    c = cluster
    with c.a.background_worker():
        handle = c.a.options(object_id=OID).start(quick, str(c.log("done")))
        assert handle.result(timeout=15) == "quick"
    c.raw().execute("UPDATE objects SET result=? WHERE object_id=?",
                    (encode("FORGED-31337"), OID))
    with pytest.raises(IntegrityError, match="stored result differs"):
        handle.result(timeout=1)
    with pytest.raises(IntegrityError, match="stored result differs"):
        c.a.result_of(OID)
    with pytest.raises(IntegrityError, match="stored result differs"):
        c.a.outcome(OID)
    shown, plain, as_json = (c.cli(*args) for args in (
        ("show", OID, "--json"), ("result", OID), ("result", OID, "--json")))
    for done in (plain, as_json):
        assert done.returncode == 1, done
        errors = done.stderr.strip().splitlines()
        assert len(errors) == 1 and errors[0].startswith("error:"), done.stderr
        assert "differs" in errors[0]
    assert json.loads(as_json.stdout)["error"]["type"] == "IntegrityError"
    assert shown.returncode == 0 and '"quick"' in shown.stdout
    for done in (shown, plain, as_json):
        assert "FORGED" not in done.stdout + done.stderr
        assert "Traceback" not in done.stderr


# -- 7: forged events in the inbox ------------------------------------------------------


@pytest.mark.parametrize(("forgery", "reason"), [
    ("edited-payload", "changed after it was sent"),
    ("unsigned", "carries no signature"),
    ("replayed-copy", "replayed copy"),
], ids=["edited-payload", "unsigned", "replayed-copy"])
def test_forged_event_is_refused_and_consumed(cluster: Cluster, forgery: str,
                                              reason: str) -> None:
    """A forged ``go`` waits in the inbox while the agent waits for ``gate``: a genuine
    event whose payload was edited, an event inserted without a seal, or the consumed
    first ``go`` copied back as pending. When the agent then waits for ``go`` it never
    gets it: memory gains an ``event_refused`` record naming the reason, the event is
    consumed, the agent stays dormant; a genuine ``go`` sent afterwards is received.
    Every receipt holds the ``event_hash`` its seal gives."""
    c = cluster
    log = c.log(OID)
    conn = c.raw()
    with c.a.background_worker():
        handle = c.a.options(object_id=OID).start(listens, str(log))
        wait_until(lambda: c.a.get(OID).waiting_event == "go", what="waits for go")
        c.a.send(OID, "go", {"n": 1})
        wait_until(lambda: c.a.get(OID).waiting_event == "gate", what="waits for gate")
        if forgery == "edited-payload":
            c.a.send(OID, "go", {"n": 2})
            conn.execute("UPDATE inbox SET payload=? WHERE object_id=? AND consumed_seq IS "
                         "NULL", (encode({"n": 666}), OID))
        elif forgery == "unsigned":
            conn.execute("INSERT INTO inbox (object_id, name, payload, dedupe_key, sent_at) "
                         "VALUES (?, 'go', ?, NULL, ?)", (OID, encode({"n": 666}), time.time()))
        else:
            conn.execute("INSERT INTO inbox (object_id, name, payload, dedupe_key, sent_at, "
                         "seal) SELECT object_id, name, payload, dedupe_key, sent_at, seal "
                         "FROM inbox WHERE object_id=? AND name='go'", (OID,))
        (forged_id,) = conn.one("SELECT event_id FROM inbox WHERE object_id=? AND "
                                "consumed_seq IS NULL", (OID,))
        assert c.a.get(OID).status == "dormant"
        c.a.send(OID, "gate", None)
        # Settled: the refusal's commit lets go with the refused event still counted as
        # pending, so the victim is claimed once more at once; send the genuine event
        # after that (test_event_sent_while_a_node_lets_go_is_not_lost is why).
        wait_until(lambda: settled_waiting(c.a, OID, "go"), what="waits for go again")
        (consumed,) = conn.one("SELECT consumed_seq FROM inbox WHERE event_id=?",
                               (forged_id,))
        assert consumed is not None  # consumed: it never comes back
        c.a.send(OID, "go", {"n": 3})
        assert handle.result(timeout=15) == [{"n": 1}, {"n": 3}]
        serves(c, c.a, "other")
    assert [line for line in lines(log) if line.startswith("step:")] == [
        'step:got:{"n": 1}', 'step:got:{"n": 3}']
    history = c.a.history(OID)
    (refusal,) = [r for r in history if r.kind == Kind.EVENT_REFUSED]
    assert refusal.body["event_id"] == forged_id and refusal.body["name"] == "go"
    assert reason in refusal.body["reason"], refusal.body
    receipts = [r for r in history if r.kind == Kind.EVENT_RECEIVED]
    assert [r.body["name"] for r in receipts] == ["go", "gate", "go"]
    assert [r.body["payload"] for r in receipts if r.body["name"] == "go"] == [{"n": 1},
                                                                             {"n": 3}]
    for receipt in receipts:
        payload, dedupe, seal_bytes = conn.one(
            "SELECT payload, dedupe_key, seal FROM inbox WHERE event_id=?",
            (receipt.body["event_id"],))
        seal = EventSeal.from_bytes(bytes(seal_bytes))
        digest = event_digest(OID, receipt.body["name"], bytes(payload), dedupe, seal.sender,
                              seal.nonce)
        assert receipt.body["event_hash"] == digest.hex()
    if forgery == "replayed-copy":
        assert refusal.body["event_hash"] == receipts[0].body["event_hash"]
    assert c.a.verify(OID).ok


def test_event_sent_while_a_node_lets_go_is_not_lost(cluster: Cluster, backend: str) -> None:
    """An event sent while the node that holds the object is letting it go wakes the
    object: ``App.send`` locks the object's row, queues the event and (the object being
    leased) leaves it to the release; the release, which started while the send held the
    lock, must still see the event and leave the object runnable, not dormant until its
    wait's timeout. The send's transaction is replayed statement by statement through a
    plain connection so that the release can be caught waiting for its lock."""
    if backend != "postgresql":
        pytest.skip("SQLite runs one writer at a time: a send and a release cannot overlap")
    c = cluster
    HOLD.clear()
    sender, watcher = c.raw(), c.raw()
    payload = encode({"n": 7})
    with c.a.background_worker():
        handle = c.a.options(object_id=OID).start(pauses, str(c.log(OID)))
        wait_until(lambda: c.count(OID) == 2, what="the step recorded")
        seal, _ = seal_event(c.a.signer.sign, c.a.node_id, OID, "go", payload, None,
                             os.urandom(12).hex())
        now = time.time()
        sender.execute("BEGIN")
        try:
            sender.execute("SELECT status FROM objects WHERE object_id=? FOR UPDATE", (OID,))
            sender.execute("INSERT INTO inbox (object_id, name, payload, dedupe_key, "
                           "sent_at, seal) VALUES (?, 'go', ?, NULL, ?, ?)",
                           (OID, payload, now, seal))
            sender.execute("UPDATE objects SET ready_at=? WHERE object_id=? AND lease_owner "
                           "IS NULL AND waiting_event='go' AND (ready_at IS NULL OR "
                           "ready_at>?)", (now, OID, now))
            HOLD.set()  # the agent waits for go, finds none committed, its node lets go
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not watcher.one(  # the release's append
                    "SELECT count(*) FROM pg_stat_activity WHERE datname=current_database() "
                    "AND wait_event_type='Lock' AND query LIKE '%%INSERT INTO seals%%'")[0]:
                time.sleep(0.01)
        finally:
            HOLD.set()
            sender.execute("COMMIT")
        wait_until(lambda: c.a.get(OID).status == "completed"
                   or settled_waiting(c.a, OID, "go"), what="the victim settled")
        assert c.a.get(OID).status == "completed", c.a.store.get(OID)
        assert handle.result(timeout=1) == {"n": 7}


# -- 8: invalid UTF-8 in a record's text column (SQLite) ---------------------------------


def test_invalid_utf8_in_a_record_column(sqlite_only: None, cluster: Cluster,
                                         caplog: pytest.LogCaptureFixture) -> None:
    """A record's ``node_id`` made invalid UTF-8 text: ``verify`` names #2 ("not valid
    UTF-8"); a worker started afterwards parks the victim within a couple of seconds
    (no "store unavailable" loop in its log) and runs another object; ``perdure verify
    --all`` reports every object, the damaged one as FAIL, the others ok."""
    c = cluster
    with c.a.background_worker():
        log = dormant_victim(c)
        serves(c, c.a, "intact")
    c.raw().execute("UPDATE records SET node_id=CAST(X'FF' AS TEXT) WHERE object_id=? AND "
                    "seq=2", (OID,))
    assert_bad(c, 2, "not valid UTF-8")
    caplog.set_level(logging.INFO, logger="perdure")
    with c.b.background_worker():
        c.a.send(OID, "go", "now")
        started = time.monotonic()
        wait_until(lambda: bool((row := c.a.store.get(OID)) and row.parked), timeout=3,
                   what="victim parked")
        assert time.monotonic() - started < 3
        refused(c, c.b, log, "#2", "not valid UTF-8")
    unavailable = [r for r in caplog.records if "store unavailable" in r.getMessage()]
    assert len(unavailable) <= 1, unavailable
    assert any(getattr(r, "action", None) == "integrity_failure" for r in caplog.records)
    everything = c.cli("verify", "--all")
    assert everything.returncode == 1, everything
    assert "Traceback" not in everything.stderr
    reported = {line.split()[1].rstrip(":"): line.split()[0]
                for line in everything.stdout.splitlines() if line.strip()}
    assert reported.pop(OID) == "FAIL", everything.stdout
    assert set(reported) == {"intact", *(i.object_id for i in c.a.list()
                                         if i.object_id.startswith("other-"))}
    assert set(reported.values()) == {"ok"}, everything.stdout


# -- 9: one damaged byte in the SQLite schema --------------------------------------------


def check_damage_line(args: Sequence[str], done: subprocess.CompletedProcess[str],
                      path: Path) -> None:
    """The CLI ``args`` on a damaged store: exit 1, one ``error:`` line saying the file is
    damaged and what to do, no traceback."""
    assert done.returncode == 1, (args, done)
    assert "Traceback" not in done.stderr + done.stdout, (args, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error:"), (args, done.stderr)
    assert str(path) in errors[0] and " is damaged" in errors[0], (args, errors[0])
    assert "backup" in errors[0], (args, errors[0])


@pytest.mark.parametrize("damage", [
    "indexed-column",
    "column",
    "padding",
])
def test_damaged_schema_byte(sqlite_only: None, cluster: Cluster, damage: str) -> None:
    """One byte of the ``CREATE TABLE objects`` text in the SQLite file overwritten with
    0xFF: in a column name an index uses (the SQL no longer holds together), in a column
    name no index uses, or in the padding before a column's type (the SQL still parses,
    the text is not UTF-8). Every CLI command prints exactly one ``error:`` line naming
    the file and saying what to do, no traceback; a ``perdure worker`` process stays up
    for several seconds, logs the damage once, and exits 0 on SIGTERM."""
    c = cluster
    with c.a.background_worker():
        dormant_victim(c)
    c.close_raw()
    c.a.close()
    c.b.close()
    path = Path(c.url.removeprefix("sqlite:///"))
    wal = Path(f"{path}-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    data = bytearray(path.read_bytes())
    start = data.index(b"CREATE TABLE objects")
    if damage == "indexed-column":  # objects_agent indexes "agent"
        at = data.index(b"\n    agent ", start) + 5
    elif damage == "column":  # no index names agent_version
        at = data.index(b"agent_version", start)
    else:  # a space between "agent_version" and "TEXT"
        at = data.index(b"agent_version    TEXT", start) + len("agent_version ")
    data[at] = 0xFF
    path.write_bytes(bytes(data))

    commands: list[tuple[str, ...]] = [
        ("ls",), ("show", OID), ("verify", OID), ("verify", "--all"), ("result", OID),
        ("send", OID, "go", '"now"'), ("resume", OID), ("export-heads",),
        ("--app", f"{MODULE}:app", "start", "quick", "--id", "new", "--args", '["x"]'),
    ]
    first = c.cli(*commands[0])  # alone first: the others only when it holds
    check_damage_line(commands[0], first, path)
    worker_log = c.tmp / "worker.log"
    worker = c.worker_process(worker_log)
    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda args: c.cli(*args), commands[1:]))
        for args, done in zip(commands[1:], results, strict=True):
            check_damage_line(args, done, path)
        wait_until(lambda: "ERROR" in worker_log.read_text() or worker.poll() is not None,
                   what="the worker says what is wrong")
        time.sleep(2.5)  # and stays up, waiting for the store to be restored
        assert worker.poll() is None, worker_log.read_text()
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=20)
    text = worker_log.read_text()
    assert code == 0, text
    assert "Traceback" not in text
    said = [line for line in text.splitlines() if " is damaged" in line]
    assert len(said) == 1 and str(path) in said[0], text
    assert "store unavailable" not in text


# -- 10: commit seals under trust ------------------------------------------------------


@pytest.mark.parametrize(("seal_by", "reason"), [
    ("other-node", "its commit seal was made by node"),
    ("other-key", "commit seal's signature does not verify"),
], ids=["seal-naming-b", "seal-naming-a-signed-by-b"])
def test_rewritten_chain_under_another_nodes_seal(cluster: Cluster, seal_by: str,
                                                  reason: str) -> None:
    """#2..#4 rewritten (still claiming node A) under one commit seal made with node
    B's key, B being a certified member of the cluster: a seal naming B cannot vouch
    for A's records, and a seal naming A but signed with B's key does not verify. Node
    A refuses the rewritten history, node B refuses the head; ``verify`` names #2."""
    c = cluster

    def forge() -> None:
        chain = rehashed(c.a.history(OID), 2, lambda body: {**body, "result": "forged"})
        insider = c.b.signer
        node = insider.node_id if seal_by == "other-node" else c.a.node_id
        sealed, refs = under_seal(chain, node, insider.sign)
        store_chain(c.raw(), refs, sealed)

    refused_by_a_then_b(c, forge, "history was rewritten", reason)
    assert_bad(c, 2, reason)
