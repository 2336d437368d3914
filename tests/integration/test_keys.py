"""Keys and trust as an operator meets them, through the API and the real ``perdure`` CLI.

Which node keys a node believes is decided by the root public keys in its own
configuration, never by the store. Each test below simulates one or several machines
with separate key folders on one store (SQLite file or PostgreSQL database) and checks
what ``docs/howto/keys-and-trust.md`` tells a user: one machine needs no set-up; on
several, a root certifies each node key (``perdure keys init/issue/install/trust``);
revocation, rotation, expiry, passphrases, file permissions; seen heads and exported
heads that catch a store moved backwards.

CLI commands run as ``python -m perdure`` subprocesses with no ``PERDURE_*`` variables
but the ones a test sets; a refused command exits 1 with one ``error: ...`` line and no
traceback. This module is the ``--app`` of those processes.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.core.trust import fingerprint, issue_certificate, key_text, public_key_bytes
from perdure.errors import ConfigurationError, NodeIdentityError
from tests.cluster import one_root

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.integration.test_keys"
APP = ("--app", f"{MODULE}:app")

app = perdure.App(store="sqlite:///keys-never-opened.db")


def work(i: int) -> dict[str, int]:
    """A step."""
    return {"i": i}


@app.agent(name="job")
async def job(run: perdure.Run, i: int) -> dict[str, int]:
    """One recorded step."""
    return await run.step(work, i)


@app.agent(name="waiter")
async def waiter(run: perdure.Run, i: int) -> dict[str, Any]:
    """A step, an event, another step: records written on both sides of a wait."""
    first = await run.step(work, i)
    got = await run.wait_for("go", timeout=600)
    return {"first": first, "go": got, "second": await run.step(work, i + 1)}


# -- helpers ----------------------------------------------------------------------------

Nodes = Callable[..., perdure.App]


@pytest.fixture
def opened() -> Iterator[list[perdure.App]]:
    """The nodes a test built, closed afterwards."""
    made: list[perdure.App] = []
    yield made
    for node in made:
        node.close()


def _factory(url: str, made: list[perdure.App]) -> Nodes:
    def make(key_dir: Path, **settings: Any) -> perdure.App:
        node = app.with_settings(store=url, key_dir=key_dir, lease_seconds=2.0,
                                 poll_interval=0.01, **settings)
        made.append(node)
        return node

    return make


@pytest.fixture
def nodes(store_url: str, opened: list[perdure.App]) -> Nodes:
    """Build nodes (this module's agents) on the test's store, SQLite and PostgreSQL:
    ``nodes(key_dir, node_id=..., trust=..., key_passphrase=...)``."""
    return _factory(store_url, opened)


@pytest.fixture
def lite(sqlite_url: str, opened: list[perdure.App]) -> Nodes:
    """``nodes`` on a SQLite store only, for what does not depend on the store."""
    return _factory(sqlite_url, opened)


def cli(*args: str | Path, env: dict[str, str] | None = None,
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``perdure ARGS`` with no ``PERDURE_*`` variables but ``env``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
    environ.update(PYTHONPATH=str(ROOT), COLUMNS="200", **(env or {}))
    return subprocess.run([sys.executable, "-m", "perdure", *map(str, args)], cwd=ROOT,
                          env=environ, input=stdin, capture_output=True, text=True,
                          timeout=60, check=False)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    """The stdout of a command that must have exited 0 without a traceback."""
    assert done.returncode == 0, done
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


def one_error_line(done: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The one ``error:`` line of a command that must have exited 1, holding ``needles``.

    ``perdure worker`` may say which node it is before the error; nothing else may come.
    """
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines()
             if line.strip() and not line.startswith("node ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def init_root(root_dir: Path) -> str:
    """``perdure keys init --root-only`` in ``root_dir``: the root's public key (hex)."""
    out = ok(cli("--key-dir", root_dir, "keys", "init", "--root-only"))
    found = re.search(r"root created in .*: ed25519:([0-9a-f]{64})", out)
    assert found, out
    assert f"perdure keys trust ed25519:{found[1]}" in out
    return found[1]


def public_key(key_dir: Path) -> str:
    """The node key of ``key_dir`` (made on first use), from ``perdure keys show --json``."""
    shown = json.loads(ok(cli("--key-dir", key_dir, "keys", "show", "--json")))
    return str(shown["public_key"])


def wait_until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def rewind(url: str, object_id: str, keep: perdure.Record) -> None:
    """Move the store back to record ``keep`` of ``object_id``, behind perdure's back
    (as a restore from an earlier backup, or someone who controls the store, would)."""
    statements = [
        ("DELETE FROM records WHERE object_id = ? AND seq > ?", (object_id, keep.seq)),
        ("DELETE FROM inbox WHERE object_id = ?", (object_id,)),
        # The row as it stood then (a careful forger leaves nothing the row gives away).
        ("UPDATE objects SET head_seq = ?, head_hash = ?, status = 'ready', "
         "phase = 'instantiated', result = NULL WHERE object_id = ?",
         (keep.seq, bytes.fromhex(keep.hash), object_id)),
    ]
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            for sql, params in statements:
                conn.execute(sql, params)
        conn.close()
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        for sql, params in statements:
            pg.execute(sql.replace("?", "%s").encode(), params)


def copy_sqlite(source: Path, target: Path) -> None:
    """Copy a SQLite store file into another with SQLite's backup API (safe while
    workers have the target open): how a backup is taken, and restored."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    src.close()
    dst.close()


# -- file permissions -------------------------------------------------------------------


def test_a_private_key_readable_by_others_is_refused(tmp_path: Path, sqlite_url: str,
                                                     lite: Nodes) -> None:
    """A node key others may read (0644) is refused with a ConfigurationError naming
    ``chmod 600 PATH``, by the API and by the CLI (one ``error:`` line); after that
    ``chmod`` the node works again."""
    keys = tmp_path / "keys"
    lite(keys).options(object_id="p-1").start("job", 1)
    (keys / "node.key").chmod(0o644)
    hint = f"chmod 600 {keys / 'node.key'}"

    with pytest.raises(ConfigurationError, match="readable by its group and everyone") as caught:
        lite(keys).options(object_id="p-2").start("job", 2)
    assert hint in str(caught.value)
    one_error_line(cli("--store", sqlite_url, "--key-dir", keys, *APP, "start", "job",
                       "--args", "2", "--id", "p-2"), hint)
    one_error_line(cli("--key-dir", keys, "keys", "show"), hint)

    (keys / "node.key").chmod(0o600)
    assert lite(keys).options(object_id="p-2").start("job", 2).created


def test_a_key_folder_writable_by_others_is_refused(tmp_path: Path, sqlite_url: str,
                                                    lite: Nodes) -> None:
    """A key folder others may write to (0777; they could swap its keys) is refused
    with a message naming ``chmod 700 FOLDER``, by the API and the CLI."""
    keys = tmp_path / "keys"
    lite(keys).options(object_id="w-1").start("job", 1)
    keys.chmod(0o777)
    hint = f"chmod 700 {keys}"

    with pytest.raises(ConfigurationError, match="writable by its group and everyone") as caught:
        lite(keys).options(object_id="w-2").start("job", 2)
    assert hint in str(caught.value)
    one_error_line(cli("--store", sqlite_url, "--key-dir", keys, *APP, "start", "job",
                       "--args", "2", "--id", "w-2"), hint)
    one_error_line(cli("--key-dir", keys, "keys", "trust", "ed25519:" + "ab" * 32), hint)
    keys.chmod(0o700)


def test_a_reader_whose_key_folder_others_may_write_is_refused(tmp_path: Path,
                                                               sqlite_url: str,
                                                               lite: Nodes) -> None:
    """Verifying trusts the roots file of the key folder: a folder others may write to
    (who could put their own root into it) is refused for verifying too, with the
    ``chmod 700`` to run."""
    keys = tmp_path / "keys"
    lite(keys).options(object_id="r-1").start("job", 1)
    keys.chmod(0o777)
    try:
        done = cli("--store", sqlite_url, "--key-dir", keys, "verify", "r-1")
        one_error_line(done, f"chmod 700 {keys}")
        with pytest.raises(ConfigurationError, match="chmod 700"):
            lite(keys).verify("r-1")
    finally:
        keys.chmod(0o700)


def test_key_folders_are_made_private_whatever_the_umask(tmp_path: Path,
                                                         lite: Nodes) -> None:
    """Under ``umask 0`` the key folder perdure creates, and each missing parent of it,
    is 0700, and the private keys in it are 0600."""
    keys = tmp_path / "made" / "by" / "perdure" / "keys"
    old = os.umask(0)
    try:
        lite(keys).options(object_id="u-1").start("job", 1)
    finally:
        os.umask(old)
    for folder in (tmp_path / "made", tmp_path / "made" / "by",
                   tmp_path / "made" / "by" / "perdure", keys):
        assert mode(folder) == 0o700, folder
    assert mode(keys / "node.key") == 0o600
    assert mode(keys / "root.key") == 0o600


# -- passphrase-protected keys ----------------------------------------------------------


def test_a_protected_key_opens_only_with_its_passphrase(tmp_path: Path, sqlite_url: str,
                                                        lite: Nodes) -> None:
    """``perdure keys protect`` with ``PERDURE_KEY_PASSPHRASE`` encrypts the folder's
    private keys. From then on the CLI works with the passphrase in the environment or
    in ``--key-passphrase-file``, ``App`` with
    ``key_passphrase=``; without it, or with a wrong one, it fails in one clear line.
    Reading and verifying need no private key, so no passphrase."""
    keys = tmp_path / "keys"
    lite(keys).options(object_id="pp-1").start("job", 1)
    store = ("--store", sqlite_url, "--key-dir", keys)

    one_error_line(cli("--key-dir", keys, "keys", "protect"), "set PERDURE_KEY_PASSPHRASE")
    out = ok(cli("--key-dir", keys, "keys", "protect", env={"PERDURE_KEY_PASSPHRASE": "s3cret"}))
    assert out.strip() == f"protected node.key, root.key in {keys} with the passphrase"
    for name in ("node.key", "root.key"):
        first = (keys / name).read_text().splitlines()[0]
        assert first == "-----BEGIN ENCRYPTED PRIVATE KEY-----", name
        assert mode(keys / name) == 0o600

    # The API.
    with pytest.raises(ConfigurationError, match="protected by a passphrase") as caught:
        lite(keys).options(object_id="pp-2").start("job", 2)
    assert "PERDURE_KEY_PASSPHRASE" in str(caught.value)
    with pytest.raises(ConfigurationError, match="the passphrase does not open this key"):
        lite(keys, key_passphrase="wrong").options(object_id="pp-2").start("job", 2)
    node = lite(keys, key_passphrase="s3cret")
    with node.background_worker():
        assert node.options(object_id="pp-2").start("job", 2).result(timeout=20) == {"i": 2}

    # The CLI.
    start = (*store, *APP, "start", "job", "--args", "3", "--id")
    one_error_line(cli(*start, "pp-3"), "node.key is protected by a passphrase",
                   "PERDURE_KEY_PASSPHRASE")
    one_error_line(cli(*store, *APP, "worker"), "is protected by a passphrase")
    one_error_line(cli(*start, "pp-3", env={"PERDURE_KEY_PASSPHRASE": "wrong"}),
                   "the passphrase does not open this key")
    assert ok(cli(*start, "pp-3", env={"PERDURE_KEY_PASSPHRASE": "s3cret"})).strip() == "pp-3"
    secret = tmp_path / "passphrase"
    secret.write_text("s3cret\n")
    secret.chmod(0o600)
    assert ok(cli("--key-passphrase-file", secret, *start, "pp-4")).strip() == "pp-4"
    one_error_line(cli("--key-passphrase-file", tmp_path / "missing", *start, "pp-6"),
                   "--key-passphrase-file", "No such file or directory")
    verified = ok(cli(*store, "verify", "pp-1", "pp-2", "pp-3", "pp-4"))
    assert [line.split()[0] for line in verified.splitlines()] == ["ok"] * 4


# -- one machine ------------------------------------------------------------------------


def test_one_machine_needs_no_setup(tmp_path: Path, store_url: str, nodes: Nodes) -> None:
    """A fresh key folder gets, on the first ``start``, a node key, a root of its own that
    it trusts, and a certificate for the node key from that root; ``perdure keys show``
    (and ``--json``) reports the certificate valid and the root."""
    keys = tmp_path / "keys"
    node = nodes(keys)
    with node.background_worker():
        assert node.options(object_id="one-1").start("job", 1).result(timeout=20) == {"i": 1}
    assert {p.name for p in keys.iterdir()} >= {"node.key", "root.key", "roots", "node.cert"}
    assert node.verify("one-1").ok

    shown = json.loads(ok(cli("--key-dir", keys, "keys", "show", "--json")))
    root = shown["root_here"]
    assert shown["certificate"] == "valid (expires never)"
    assert shown["trusted_roots"] == [root]
    assert f"ed25519:{root}" in (keys / "roots").read_text()
    assert shown["public_key"] == public_key_bytes(perdure.KeyFolder(keys).node_key()).hex()
    assert shown["node_id"] == node.node_id
    text = ok(cli("--key-dir", keys, "keys", "show"))
    assert "certificate  valid (expires never)" in text
    assert f"trusts root  ed25519:{root}" in text
    assert f"root here    ed25519:{root} (root.key: keep it safe)" in text
    assert ok(cli("--store", store_url, "--key-dir", keys, "verify", "one-1")).startswith("ok")


# -- several machines -------------------------------------------------------------------


def test_several_machines_step_by_step(tmp_path: Path, store_url: str,
                                       nodes: Nodes) -> None:
    """The how-to's steps. A node that trusts the root but whose key it has not certified
    cannot start objects or run a worker: the error says the ``perdure keys issue``
    command to run where the root is. After ``keys issue --publish`` (certificate in the
    store) it works; a second node gets its certificate as a file (``issue --out``,
    ``keys install``). A worker in one key folder runs objects started from another, and
    ``keys list`` shows both keys trusted."""
    root_dir, a_dir, b_dir = tmp_path / "root", tmp_path / "eu-1", tmp_path / "eu-2"
    store = ("--store", store_url)
    root = init_root(root_dir)
    assert {"root.key", "roots"} <= {p.name for p in root_dir.iterdir()}
    assert not (root_dir / "node.key").exists()

    a_pub = public_key(a_dir)
    trusted = ok(cli("--key-dir", a_dir, "keys", "trust", f"ed25519:{root}"))
    assert trusted.strip() == f"{a_dir / 'roots'} now trusts ed25519:{root}"
    todo = f"perdure keys issue {a_pub} --name eu-1 --publish"
    node_a = nodes(a_dir, node_id="eu-1")
    with pytest.raises(ConfigurationError, match="not certified by a root it trusts") as caught:
        node_a.options(object_id="m-1").start("job", 1)
    assert todo in str(caught.value)
    with pytest.raises(ConfigurationError, match="not certified"):
        node_a.worker()
    one_error_line(cli(*store, "--key-dir", a_dir, "--node-id", "eu-1", *APP, "start", "job",
                       "--args", "1", "--id", "m-1"), todo)
    one_error_line(cli(*store, "--key-dir", a_dir, "--node-id", "eu-1", *APP, "worker"), todo)
    assert not (a_dir / "root.key").exists(), "a node that trusts a root makes none of its own"

    issued = cli(*store, "--key-dir", root_dir, "keys", "issue", a_pub, "--name", "eu-1",
                 "--publish")
    cert = json.loads(ok(issued))
    assert (cert["public_key"], cert["issuer"], cert["name"]) == (a_pub, root, "eu-1")
    assert "published in" in issued.stderr
    node_a = nodes(a_dir, node_id="eu-1")
    assert node_a.options(object_id="m-1").start("job", 1).created
    assert (a_dir / "node.cert").exists()  # found in the store and kept

    b_pub = public_key(b_dir)
    cert_file = tmp_path / "eu-2.cert"
    ok(cli("--key-dir", root_dir, "keys", "issue", b_pub, "--name", "eu-2", "--out", cert_file))
    installed = cli("--key-dir", b_dir, "keys", "install", cert_file)
    b_key = key_text(bytes.fromhex(b_pub))
    assert ok(installed).startswith(f"installed certificate for key {b_key} (eu-2)")
    assert f"its issuer ed25519:{root} is not among this node's trusted roots" in installed.stderr
    ok(cli("--key-dir", b_dir, "keys", "trust", root))

    node_b = nodes(b_dir, node_id="eu-2")
    with node_b.background_worker():
        assert node_a.handle("m-1").result(timeout=20) == {"i": 1}
        assert node_b.options(object_id="m-2").start("job", 2).result(timeout=20) == {"i": 2}
    assert [r.node_id for r in node_a.history("m-1")] == ["eu-1", "eu-2", "eu-2"]
    for node in (node_a, node_b):
        assert node.verify("m-1").ok and node.verify("m-2").ok
    listed = ok(cli(*store, "--key-dir", a_dir, "keys", "list")).splitlines()
    assert listed == [f"eu-1  {key_text(bytes.fromhex(a_pub))}  trusted",
                      f"eu-2  {b_key}  trusted"]


def test_untrusted_keys_are_listed_and_refused(tmp_path: Path, store_url: str,
                                               nodes: Nodes) -> None:
    """A node that made its own root (a one-machine folder on a shared store) writes
    records nobody else trusts: ``keys list`` says NOT TRUSTED and why, a trusting worker
    parks its objects without running them, and ``verify`` names the record, saying its
    writer is certified by no root it trusts (not that it is bad). A reader that trusts
    no root at all is refused in one line; ``keys list`` says why nothing counts."""
    one_root(tmp_path / "root", (tmp_path / "a", "node-a"))
    node_a = nodes(tmp_path / "a", node_id="node-a")
    loner = nodes(tmp_path / "loner", node_id="loner")
    node_a.options(object_id="u-a").start("job", 1)
    loner.options(object_id="u-loner").start("job", 2)
    store = ("--store", store_url)

    listed = ok(cli(*store, "--key-dir", tmp_path / "a", "keys", "list"))
    lines = dict(line.split("  ", 1) for line in listed.splitlines())
    assert lines["node-a"].endswith("  trusted")
    assert "NOT TRUSTED: 'loner'" in lines["loner"]
    assert "is not certified by a root this node trusts" in lines["loner"]
    rows = json.loads(ok(cli(*store, "--key-dir", tmp_path / "a", "keys", "list", "--json")))
    assert {row["node_id"]: row["trusted"] for row in rows} == {"node-a": True, "loner": False}

    with node_a.background_worker():
        assert node_a.handle("u-a").result(timeout=20) == {"i": 1}
        wait_until(lambda: node_a.get("u-loner").status == perdure.Status.PARKED,
                   "the untrusted object to be parked")
    note = str(node_a.get("u-loner").note)
    assert "refused it" in note and "not certified by a root this node trusts" in note
    assert node_a.get("u-loner").records == 1  # nothing ran
    report = node_a.verify("u-loner")
    assert not report.ok and report.bad_seq == 1
    assert "signed by node 'loner'" in str(report.reason)

    nobody = tmp_path / "trusts-nothing"
    done = cli(*store, "--key-dir", nobody, "verify", "u-a")
    assert done.returncode == 1 and done.stdout == "", done
    assert done.stderr.startswith(f"error: no trusted root in key folder {nobody}")
    done = cli(*store, "--key-dir", tmp_path / "loner", "verify", "u-a")
    assert done.returncode == 1, done
    assert done.stdout.startswith("FAIL u-a: record #1 is signed by a key that no root in ")
    assert "is bad" not in done.stdout and "--key-dir" in done.stdout
    report = nodes(nobody).verify("u-a")
    assert not report.ok and "trusts no root key" in str(report.reason)
    listed = ok(cli(*store, "--key-dir", nobody, "keys", "list"))
    assert listed.count("NOT TRUSTED") == 2 and "trusts no root key" in listed
    assert not nobody.exists(), "reading makes no key folder"


def test_trust_settings_name_a_key_a_roots_file_or_a_key_folder(tmp_path: Path,
                                                                 sqlite_url: str,
                                                                 lite: Nodes) -> None:
    """Instead of the key folder's ``roots`` file, ``--trust`` / ``PERDURE_TRUST`` (and
    ``App(trust=...)``) may name the root's public key, a roots file or a key folder (or
    several, comma-separated), and a node so configured never makes a root of its own.
    A bad value is one error line. (SQLite only: nothing here depends on the store.)"""
    root_dir, node_dir = tmp_path / "root", tmp_path / "node"
    root = init_root(root_dir)
    pub = public_key(node_dir)
    ok(cli("--store", sqlite_url, "--key-dir", root_dir, "keys", "issue", pub, "--name", "n",
           "--publish"))
    settings = {"key": f"ed25519:{root}", "file": str(root_dir / "roots"),
                "folder": str(root_dir)}
    common = ("--store", sqlite_url, "--key-dir", node_dir, "--node-id", "n", *APP)
    done = cli("--trust", settings["key"], *common, "start", "job", "--args", "1", "--id", "t-1")
    assert ok(done).strip() == "t-1"
    done = cli(*common, "start", "job", "--args", "1", "--id", "t-2",
               env={"PERDURE_TRUST": settings["file"]})
    assert ok(done).strip() == "t-2"
    done = cli("--trust", settings["folder"], *common, "start", "job", "--args", "1", "--id",
               "t-3")
    assert ok(done).strip() == "t-3"
    for how, value in [*settings.items(), ("list", [root_dir]), ("bytes", bytes.fromhex(root))]:
        assert lite(node_dir, node_id="n", trust=value).options(object_id=f"t-api-{how}").start(
            "job", 1).created
    assert not (node_dir / "roots").exists() and not (node_dir / "root.key").exists()

    reader = tmp_path / "reader"
    verified = ok(cli("--store", sqlite_url, "--key-dir", reader, "verify", "t-1", "t-2", "t-3",
                      env={"PERDURE_TRUST": f"{settings['folder']},{settings['key']}"}))
    assert [line.split()[0] for line in verified.splitlines()] == ["ok"] * 3
    for value in settings.values():
        assert lite(reader, trust=value).verify("t-api-key").ok
    one_error_line(cli("--trust", "ed25519:12ab", *common, "start", "job", "--id", "t-bad"),
                   "'ed25519:12ab' is neither a public key (64 hex digits) nor a readable "
                   "roots file or key folder")
    with pytest.raises(ConfigurationError, match="names no root key"):
        lite(node_dir, trust="")


def test_an_installed_certificate_is_not_replaced_by_a_root_of_its_own(tmp_path: Path,
                                                                       lite: Nodes) -> None:
    """A node whose operator installed a certificate (``perdure keys install``) but forgot
    ``perdure keys trust`` is refused with the command that trusts the certificate's
    issuer; its certificate stays as installed and no root is made in its folder."""
    root_dir, node_dir = tmp_path / "root", tmp_path / "node"
    root = init_root(root_dir)
    cert_file = tmp_path / "node.cert"
    ok(cli("--key-dir", root_dir, "keys", "issue", public_key(node_dir), "--name", "n",
           "--out", cert_file))
    ok(cli("--key-dir", node_dir, "keys", "install", cert_file))
    installed = (node_dir / "node.cert").read_bytes()
    try:
        with pytest.raises(ConfigurationError, match=f"perdure keys trust ed25519:{root}"):
            lite(node_dir, node_id="n").options(object_id="i-1").start("job", 1)
    finally:
        assert (node_dir / "node.cert").read_bytes() == installed
        assert not (node_dir / "root.key").exists()


# -- revocation -------------------------------------------------------------------------


def test_a_revoked_key_no_longer_counts_from_since(tmp_path: Path, store_url: str,
                                                   nodes: Nodes) -> None:
    """``perdure keys revoke NODE --since T --reason R`` (with the root's folder) is
    published: records signed by that key and stamped at or after T no longer count.
    ``verify`` names the record ("revoked"), ``keys list`` shows the key revoked, and a
    worker of another node parks such an object without running it."""
    one_root(tmp_path / "root", (tmp_path / "a", "node-a"), (tmp_path / "b", "node-b"))
    node_a = nodes(tmp_path / "a", node_id="node-a")
    node_a.options(object_id="before").start("job", 1)
    time.sleep(0.02)
    since = time.time()
    time.sleep(0.02)
    node_a.options(object_id="after").start("job", 2)

    done = cli("--store", store_url, "--key-dir", tmp_path / "root", "keys", "revoke",
               "node-a", "--since", f"{since:.6f}", "--reason", "laptop stolen")
    a_key = key_text(node_a.verifier.names()["node-a"][0])
    out = ok(done)
    assert out.startswith(f"revoked key {a_key} from ")
    assert ": laptop stolen\n" in out and "published in" in out
    assert (tmp_path / "root" / "revocations").exists()

    node_b = nodes(tmp_path / "b", node_id="node-b")
    report = node_b.verify("after")
    assert not report.ok and report.bad_seq == 1
    assert f"key {a_key} was revoked" in str(report.reason)
    done = cli("--store", store_url, "--key-dir", tmp_path / "b", "verify", "after")
    assert done.returncode == 1, done
    assert done.stdout.startswith("FAIL after: record #1 is bad: signed by node 'node-a'")
    assert "was revoked" in done.stdout
    listed = ok(cli("--store", store_url, "--key-dir", tmp_path / "b", "keys", "list"))
    line = next(line for line in listed.splitlines() if line.startswith("node-a "))
    assert "REVOKED from" in line and "records stamped before still count" in line

    with node_b.background_worker():
        wait_until(lambda: node_b.get("after").status == perdure.Status.PARKED,
                   "the object signed after the revocation to be parked")
    info = node_b.get("after")
    assert info.records == 1 and "was revoked" in str(info.note)


def test_records_signed_before_a_revocation_still_count(tmp_path: Path, sqlite_url: str,
                                                        lite: Nodes) -> None:
    """After a revocation from T, records the key signed before T still count: an object
    written entirely before T verifies, one written on both sides of T fails at its first
    record stamped from T on, and another node's worker runs an object the revoked node
    started before T."""
    one_root(tmp_path / "root", (tmp_path / "a", "node-a"), (tmp_path / "b", "node-b"))
    node_a = lite(tmp_path / "a", node_id="node-a")
    with node_a.background_worker():
        node_a.options(object_id="early").start("job", 1).result(timeout=20)
        node_a.options(object_id="mixed").start("waiter", 1)
        wait_until(lambda: node_a.get("mixed").status == perdure.Status.DORMANT,
                   "the waiter to wait")
    node_a.options(object_id="pending").start("job", 3)
    node_a.pause("pending")
    time.sleep(0.02)
    since = time.time()
    time.sleep(0.02)
    node_a.send("mixed", "go", "now")
    with node_a.background_worker():
        node_a.handle("mixed").result(timeout=20)
    first_after = next(r.seq for r in node_a.history("mixed") if r.ts_us >= since * 1e6)
    assert first_after > 1
    ok(cli("--store", sqlite_url, "--key-dir", tmp_path / "root", "keys", "revoke", "node-a",
           "--since", f"{since:.6f}", "--reason", "laptop stolen"))

    node_b = lite(tmp_path / "b", node_id="node-b")
    assert node_b.verify("early").ok
    report = node_b.verify("mixed")
    assert not report.ok and report.bad_seq == first_after, report
    node_b.resume("pending")
    with node_b.background_worker():
        assert node_b.handle("pending").result(timeout=20) == {"i": 3}


def test_a_node_whose_key_is_revoked_stops(tmp_path: Path, sqlite_url: str,
                                           lite: Nodes) -> None:
    """A node whose own key was revoked (the revocation in its folder or in the store)
    refuses to start objects or run a worker, as with an expired certificate, instead of
    writing records that no other node will accept."""
    one_root(tmp_path / "root", (tmp_path / "a", "node-a"))
    lite(tmp_path / "a", node_id="node-a").options(object_id="rv-1").start("job", 1)
    ok(cli("--store", sqlite_url, "--key-dir", tmp_path / "root", "keys", "revoke", "node-a",
           "--reason", "retired"))
    node_a = lite(tmp_path / "a", node_id="node-a")
    with pytest.raises(ConfigurationError, match="revoked"):
        node_a.options(object_id="rv-2").start("job", 2)
    with pytest.raises(ConfigurationError, match="revoked"):
        node_a.worker()


# -- rotation ---------------------------------------------------------------------------


def test_rotate_gives_the_node_a_new_key_under_the_same_id(tmp_path: Path, store_url: str,
                                                           nodes: Nodes) -> None:
    """``perdure keys rotate`` in a folder holding the root gives the node a new key,
    certified there under the same node id (its certificate's name). The old key is
    kept aside; objects written before still verify, also for another node that trusts
    the root; new records are signed by the new key."""
    keys = tmp_path / "keys"
    out = ok(cli("--key-dir", keys, "keys", "init"))
    assert re.search(r"node key ed25519:[0-9a-f]{16}… certified \(node\.cert\)", out), out
    old = nodes(keys)
    with old.background_worker():
        old.options(object_id="rot-old").start("job", 1).result(timeout=20)
    old_id = old.node_id
    old_fp = fingerprint(perdure.KeyFolder(keys).certificate().public_key)  # type: ignore[union-attr]

    out = ok(cli("--store", store_url, "--key-dir", keys, "keys", "rotate"))
    found = re.search(r"new node key ed25519:([0-9a-f]{64}) for node id (\S+)", out)
    assert found, out
    new_pub, new_id = found[1], found[2]
    assert new_id == old_id
    assert "certified with the root in this folder (node.cert)" in out
    assert (keys / f"node.key.{old_fp[:16]}.old").exists()
    assert (keys / f"node.cert.{old_fp[:16]}.old").exists()
    assert mode(keys / f"node.key.{old_fp[:16]}.old") == 0o600

    new = nodes(keys)
    assert new.node_id == old_id
    with new.background_worker():
        new.options(object_id="rot-new").start("job", 2).result(timeout=20)
    assert {r.node_id for r in new.history("rot-new")} == {old_id}
    assert new_pub in [k.hex() for k in new.verifier.names()[old_id]]
    assert new.verify("rot-old").ok and new.verify("rot-new").ok
    shown = json.loads(ok(cli("--key-dir", keys, "keys", "show", "--json")))
    assert (shown["public_key"], shown["certificate"]) == (new_pub, "valid (expires never)")
    verified = ok(cli("--store", store_url, "--key-dir", tmp_path / "reader", "--trust", keys,
                      "verify", "rot-old", "rot-new"))
    assert [line.split()[0] for line in verified.splitlines()] == ["ok", "ok"]


def test_a_key_acts_only_under_a_name_its_certificate_carries(tmp_path: Path,
                                                              sqlite_url: str,
                                                              lite: Nodes) -> None:
    """A node whose key a root elsewhere certified as ``n`` is refused (typed, naming
    both names and what to run) when told to act as ``other``; once the root certifies
    its key as ``other`` too, it may act as either."""
    one_root(tmp_path / "root", (tmp_path / "node", "n"))
    assert lite(tmp_path / "node").node_id == "n"  # the certificate names the node
    with pytest.raises(NodeIdentityError, match=r"certified as 'n', not as 'other'.*perdure "
                                                r"keys issue [0-9a-f]{64} --name other"):
        lite(tmp_path / "node", node_id="other").options(object_id="nm-1").start("job", 1)
    pub = public_key(tmp_path / "node")
    ok(cli("--store", sqlite_url, "--key-dir", tmp_path / "root", "keys", "issue", pub,
           "--name", "other", "--publish"))
    node = lite(tmp_path / "node", node_id="other")
    assert node.options(object_id="nm-1").start("job", 1).created
    assert node.verify("nm-1").ok


def test_rotate_without_the_root_says_what_to_issue(tmp_path: Path, sqlite_url: str,
                                                    lite: Nodes) -> None:
    """Rotating a node whose root lives elsewhere prints the ``perdure keys issue``
    command for the new key under the node's id; the node refuses to start until that is
    done, then goes on under the same id."""
    one_root(tmp_path / "root", (tmp_path / "node", "n"))
    lite(tmp_path / "node", node_id="n").options(object_id="wr-1").start("job", 1)
    out = ok(cli("--key-dir", tmp_path / "node", "--node-id", "n", "keys", "rotate"))
    found = re.search(r"certify it where the root is: perdure keys issue ([0-9a-f]{64}) "
                      r"--name n --publish", out)
    assert found, out
    with pytest.raises(ConfigurationError, match=f"perdure keys issue {found[1]}"):
        lite(tmp_path / "node", node_id="n").options(object_id="wr-2").start("job", 2)
    ok(cli("--store", sqlite_url, "--key-dir", tmp_path / "root", "keys", "issue", found[1],
           "--name", "n", "--publish"))
    node = lite(tmp_path / "node", node_id="n")
    assert node.options(object_id="wr-2").start("job", 2).created
    assert node.verify("wr-1").ok and node.verify("wr-2").ok


# -- certificate expiry -----------------------------------------------------------------


def _expired_certificate(tmp_path: Path) -> tuple[Path, Path, str]:
    """A root folder and a node folder trusting it whose ``node.cert`` (installed with
    ``perdure keys install``) expired a day ago; the node's public key."""
    root_dir, node_dir = tmp_path / "root", tmp_path / "node"
    root = init_root(root_dir)
    pub = public_key(node_dir)
    root_key = perdure.KeyFolder(root_dir).root_key()
    assert root_key is not None
    cert = issue_certificate(root_key, bytes.fromhex(pub), name="n",
                             now=time.time() - 2 * 86400, days=1)
    cert_file = tmp_path / "expired.cert"
    cert_file.write_bytes(cert.to_bytes())
    ok(cli("--key-dir", node_dir, "keys", "trust", root))
    assert ok(cli("--key-dir", node_dir, "keys", "install", "-",
                  stdin=cert_file.read_text())).startswith("installed certificate for key")
    return root_dir, node_dir, pub


def test_an_expired_certificate_stops_the_node(tmp_path: Path, sqlite_url: str,
                                               lite: Nodes) -> None:
    """A node whose certificate has expired refuses to start objects or run a worker,
    saying it expired; ``keys show`` says so too."""
    _, node_dir, _ = _expired_certificate(tmp_path)
    with pytest.raises(ConfigurationError, match=r"this node's certificate .* expired at"):
        lite(node_dir, node_id="n").options(object_id="x-1").start("job", 1)
    one_error_line(cli("--store", sqlite_url, "--key-dir", node_dir, "--node-id", "n", *APP,
                       "start", "job", "--args", "1", "--id", "x-1"),
                   "this node's certificate", "expired at", "perdure keys issue")
    with pytest.raises(ConfigurationError, match="expired at"):
        lite(node_dir, node_id="n").worker()
    shown = json.loads(ok(cli("--key-dir", node_dir, "keys", "show", "--json")))
    assert shown["certificate"].startswith("expired ")


def test_a_renewed_certificate_in_the_store_replaces_an_expired_one(tmp_path: Path,
                                                                    sqlite_url: str,
                                                                    lite: Nodes) -> None:
    """After ``perdure keys issue PUB --name N --publish`` renews an expired certificate,
    the node finds the new certificate in the store and starts."""
    root_dir, node_dir, pub = _expired_certificate(tmp_path)
    ok(cli("--store", sqlite_url, "--key-dir", root_dir, "keys", "issue", pub, "--name", "n",
           "--publish"))
    assert lite(node_dir, node_id="n").options(object_id="x-1").start("job", 1).created


def test_records_written_before_expiry_still_verify(tmp_path: Path, sqlite_url: str,
                                                    lite: Nodes) -> None:
    """A certificate issued with ``perdure keys issue --days`` covers what the node wrote
    while it was valid: once it expired the node refuses to start, and its earlier
    records still verify for any node that trusts the root. (SQLite only: the store
    plays no part in expiry.)"""
    root_dir, node_dir = tmp_path / "root", tmp_path / "node"
    root = init_root(root_dir)
    pub = public_key(node_dir)
    ok(cli("--key-dir", node_dir, "keys", "trust", root))
    lifetime = 3.0
    cert_file = tmp_path / "short.cert"
    ok(cli("--key-dir", root_dir, "keys", "issue", pub, "--name", "n", "--days",
           repr(lifetime / 86400), "--out", cert_file))
    ok(cli("--key-dir", node_dir, "keys", "install", cert_file))
    expires = json.loads(cert_file.read_text())["expires_at"]

    node = lite(node_dir, node_id="n")
    node.options(object_id="exp-1").start("job", 1)
    assert node.history("exp-1")[-1].ts < expires
    time.sleep(max(0.0, expires - time.time()) + 0.1)
    with pytest.raises(ConfigurationError, match="expired"):
        lite(node_dir, node_id="n").options(object_id="exp-2").start("job", 2)
    assert lite(root_dir).verify("exp-1").ok
    verified = ok(cli("--store", sqlite_url, "--key-dir", tmp_path / "reader", "--trust",
                      root, "verify", "exp-1"))
    assert verified.startswith("ok   exp-1: 1 records verified")


# -- heads: a store moved backwards -----------------------------------------------------


def test_export_heads_and_verify_anchors(tmp_path: Path, store_url: str,
                                         nodes: Nodes) -> None:
    """``perdure export-heads`` writes each verifying object's head; ``perdure verify
    --anchors FILE`` on the intact store exits 0. After the store is moved back behind an
    exported head, a reader that never saw the object (another key folder of the same
    cluster) still passes plain ``verify`` (every prefix of a signed chain is signed),
    but ``verify --anchors`` fails naming the record, exit 1; the node that ran the
    object catches it without the file (it saw the head)."""
    one_root(tmp_path / "root", (tmp_path / "a", "node-a"), tmp_path / "reader")
    node = nodes(tmp_path / "a", node_id="node-a")
    with node.background_worker():
        for i in range(3):
            node.options(object_id=f"h-{i}").start("job", i).result(timeout=20)
    store = ("--store", store_url, "--key-dir", tmp_path / "reader")
    heads_file = tmp_path / "heads.jsonl"
    done = cli(*store, "export-heads", "--out", heads_file)
    ok(done)
    assert "3 head(s) written to" in done.stderr
    heads = [json.loads(line) for line in heads_file.read_text().splitlines()]
    assert {h["object_id"]: h["seq"] for h in heads} == {"h-0": 3, "h-1": 3, "h-2": 3}

    verified = ok(cli(*store, "verify", "--anchors", heads_file))
    assert sorted(line.split()[0] for line in verified.splitlines()) == ["ok"] * 3

    rewind(store_url, "h-1", node.history("h-1")[0])
    assert ok(cli(*store, "verify", "h-1")).startswith("ok")
    done = cli(*store, "verify", "--anchors", heads_file)
    assert done.returncode == 1, done
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and failed[0].startswith("FAIL h-1: record #3 is bad: the store "
                                                     "holds records up to #1, but the "
                                                     "exported heads hold #3"), done.stdout
    assert "rolled back" in failed[0]
    done = cli("--store", store_url, "--key-dir", tmp_path / "a", "verify", "h-1")
    assert done.returncode == 1 and "this node saw #3" in done.stdout, done
    one_error_line(cli(*store, "verify", "--anchors", tmp_path / "nope"), "--anchors")


def test_seen_heads_outlive_the_worker_process(tmp_path: Path, sqlite_url: str,
                                               lite: Nodes) -> None:
    """The heads a node saw are kept in its key folder (``heads.db``): after the worker
    stopped, a store moved back behind them is refused by the same node (``verify``
    names the record and says to run ``forget-heads``), until ``perdure forget-heads``
    says the restore was meant."""
    keys = tmp_path / "keys"
    node = lite(keys, node_id="n")
    with node.background_worker():
        node.options(object_id="seen-1").start("job", 1).result(timeout=20)
    first = node.history("seen-1")[0]
    rewind(sqlite_url, "seen-1", first)

    report = lite(keys, node_id="n").verify("seen-1")
    assert not report.ok and report.bad_seq == 3, report
    assert "perdure forget-heads seen-1" in str(report.reason)
    forgot = ok(cli("--key-dir", keys, "forget-heads", "seen-1"))
    assert forgot.startswith("forgot 1 head(s)")
    assert lite(keys, node_id="n").verify("seen-1").ok


def test_forget_heads_reaches_a_running_node(tmp_path: Path, sqlite_url: str,
                                             lite: Nodes) -> None:
    """A running node parks an object whose store was moved back behind what it saw, and
    its note says what to do: ``perdure forget-heads ID`` where the node runs, then
    resume. Doing exactly that lets the running node carry the object on."""
    keys = tmp_path / "keys"
    live, backup = Path(sqlite_url.removeprefix("sqlite:///")), tmp_path / "backup.db"
    node = lite(keys, node_id="n")
    with node.background_worker():
        node.options(object_id="back-1").start("waiter", 1)
        wait_until(lambda: node.get("back-1").status == perdure.Status.DORMANT, "the wait")
        copy_sqlite(live, backup)
        node.send("back-1", "go", 1)
        node.handle("back-1").result(timeout=20)
        copy_sqlite(backup, live)  # restore the backup taken while the object waited
        assert node.get("back-1").status == perdure.Status.DORMANT
        node.send("back-1", "go", 2)
        wait_until(lambda: node.get("back-1").status == perdure.Status.PARKED, "the park")
        note = str(node.get("back-1").note)
        assert "rolled back" in note and "perdure forget-heads back-1" in note
        ok(cli("--key-dir", keys, "forget-heads", "back-1"))
        node.resume("back-1")
        assert node.handle("back-1").result(timeout=10)["go"] == 2
