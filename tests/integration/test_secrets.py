"""Secrets at rest, on both stores: sealed where they are written, opened for the agent,
never run by a node without the key, re-wrapped without rewriting memory, and a changed
byte reported as an integrity failure."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure import DataKeys, Secret
from perdure.core.sealing import new_data_key
from perdure.errors import (
    AgentFailedError,
    AgentParkedError,
    DataKeyError,
    SerializationError,
)
from perdure.keys.sealer import rewrap
from tests.integration.test_tamper import RawSQL

MakeApp = Callable[..., perdure.App]
CANARY = "sk-canary-4c1d8e2f9a7b6350"


@pytest.fixture
def raw(store_url: str) -> Iterator[RawSQL]:
    conn = RawSQL(store_url)
    yield conn
    conn.close()


def stored_bytes(raw: RawSQL) -> bytes:
    """Everything perdure keeps in the store's tables, as bytes (bodies, payloads,
    results, notes, wrapped keys)."""
    parts: list[bytes] = []
    for table, columns in (("records", "body"), ("inbox", "payload"),
                           ("objects", "result, note"), ("data_keys", "wrapped, key_id")):
        for row in raw.execute(f"SELECT {columns} FROM {table}"):
            parts.extend(v if isinstance(v, bytes) else str(v).encode() for v in row)
    return b"\n".join(parts)


def echo(key: Secret[str]) -> Secret[str]:
    assert isinstance(key, Secret)
    return Secret(key.reveal())


def register(app: perdure.App) -> None:
    @app.agent(name="keeper")
    async def keeper(run: perdure.Run, key: Secret[str], label: str) -> dict[str, Any]:
        again = await run.step(echo, key)
        await run.progress(cursor=Secret(f"{key.reveal()}#cursor"), at=1)
        got = await run.wait_for("creds")
        await run.sleep(0.05)  # one more claim: the whole memory is replayed, opened
        return {"label": label, "same": again == key and got["token"] == key,
                "token": got["token"]}

    @app.agent(name="all_sealed", encrypt=True)
    async def all_sealed(run: perdure.Run, text: str) -> str:
        doubled = await run.step(lambda t: t + t, text, name="double")
        note = await run.wait_for("note")
        await run.progress(seen=note)
        return f"{doubled}|{note}"


def wait_for_status(app: perdure.App, oid: str, status: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while str(app.get(oid).status) != status:
        assert time.monotonic() < deadline, f"{oid} is {app.get(oid).status}, not {status}"
        time.sleep(0.02)


def test_secrets_are_sealed_and_opened_for_the_agent(make_app: MakeApp, raw: RawSQL) -> None:
    """A secret argument, a step's secret result, a secret progress marker and a secret
    in an event: none in clear in the store; the agent and the caller get Secrets."""
    app = make_app()
    register(app)
    handle = app.options(object_id="k1").start("keeper", Secret(CANARY), "visible-label")
    with app.background_worker():
        wait_for_status(app, "k1", "dormant")
        app.send("k1", "creds", {"token": Secret(CANARY), "user": "ada"})
        result = handle.result(timeout=10)
    assert result == {"label": "visible-label", "same": True, "token": Secret(CANARY)}
    assert isinstance(result["token"], Secret)
    data = stored_bytes(raw)
    assert CANARY.encode() not in data
    assert b"visible-label" in data and b"perdure:sealed" in data  # the scan sees data
    assert app.verify("k1").ok
    kinds = [r.kind for r in app.history("k1")]
    assert "progress" in kinds and "event_received" in kinds


def test_an_agent_that_encrypts_all_leaves_nothing_in_clear(make_app: MakeApp,
                                                             raw: RawSQL) -> None:
    """``encrypt=True``: arguments, results, events and notes all sealed, even plain
    strings; names, kinds and times stay readable (and ``verify`` works)."""
    app = make_app()
    register(app)
    handle = app.options(object_id="a1").start("all_sealed", f"plain-{CANARY}")
    with app.background_worker():
        wait_for_status(app, "a1", "dormant")
        app.send("a1", "note", f"note-{CANARY}")
        assert handle.result(timeout=10) == f"plain-{CANARY}plain-{CANARY}|note-{CANARY}"
    data = stored_bytes(raw)
    assert CANARY.encode() not in data
    assert b'"name":"double"' in data  # what is not encrypted: names, kinds
    assert app.verify("a1").ok


def test_a_step_error_quoting_a_secret_is_redacted(make_app: MakeApp, raw: RawSQL) -> None:
    """An exception whose message quotes a secret is recorded with [secret] in its
    place: in the failure record, the terminal record and the row's note."""
    app = make_app()

    def leaky(key: Secret[str]) -> None:
        raise ValueError(f"the server refused key {key.reveal()}")

    @app.agent(name="leaker")
    async def leaker(run: perdure.Run, key: Secret[str]) -> None:
        await run.step(leaky, key, retry=perdure.RetryPolicy(max_attempts=1))

    handle = app.options(object_id="l1").start("leaker", Secret(CANARY))
    with app.background_worker(), pytest.raises(AgentFailedError) as failed:
        handle.result(timeout=10)
    assert CANARY not in str(failed.value)
    assert "the server refused key [secret]" in str(failed.value)
    assert CANARY.encode() not in stored_bytes(raw)


def test_a_node_without_the_key_verifies_but_does_not_run(make_app: MakeApp,
                                                          raw: RawSQL) -> None:
    """A node whose key-encryption key is another one leaves the object alone with a
    note saying which key it needs; memory is untouched; a node with the key runs it."""
    app = make_app()
    register(app)
    app.options(object_id="n1").start("keeper", Secret(CANARY), "x")
    stranger = make_app(data_keys=DataKeys([new_data_key()]))
    register(stranger)
    records = len(stranger.history("n1"))
    with stranger.background_worker():
        deadline = time.monotonic() + 10
        while "cannot run this object" not in (stranger.get("n1").note or ""):
            assert time.monotonic() < deadline, stranger.get("n1")
            time.sleep(0.02)
    info = stranger.get("n1")
    wanted = raw.one("SELECT key_id FROM data_keys WHERE object_id = ?", ("n1",))[0]
    assert f"wrapped under key-encryption key {wanted}" in (info.note or "")
    assert str(info.status) == "ready" and len(stranger.history("n1")) == records
    assert stranger.verify("n1").ok  # verifying needs no key
    with pytest.raises(DataKeyError, match=str(wanted)):
        stranger.send("n1", "creds", {"token": Secret(CANARY)})
    with app.background_worker():
        wait_for_status(app, "n1", "dormant")  # the node with the key ran it


def test_rotation_rewraps_without_rewriting_memory(make_app: MakeApp, raw: RawSQL,
                                                   key_dir: Path) -> None:
    """After rotation every data key is wrapped under the new key; records keep their
    hashes; with the old key gone, the object still opens."""
    app = make_app()
    register(app)
    handle = app.options(object_id="r1").start("keeper", Secret(CANARY), "r")
    with app.background_worker():
        wait_for_status(app, "r1", "dormant")
    hashes = [r.hash for r in app.history("r1")]
    old_id = raw.one("SELECT key_id FROM data_keys WHERE object_id = ?", ("r1",))[0]
    folder = key_dir / "data-keys"
    keys = DataKeys.folder(folder)
    new_id = keys.rotate()
    done = rewrap(app.store, keys)
    assert (done.key_id, done.rewrapped, done.missing) == (new_id, 1, {})
    assert raw.one("SELECT key_id FROM data_keys WHERE object_id = ?", ("r1",))[0] == new_id
    assert [r.hash for r in app.history("r1")] == hashes
    (folder / f"{old_id}.key").unlink()
    fresh = make_app()  # reads the folder anew: only the new key
    register(fresh)
    assert fresh.data_keys.get(old_id) is None
    with fresh.background_worker():
        fresh.send("r1", "creds", {"token": Secret(CANARY)})
        assert handle.result(timeout=10)["same"] is True
    assert rewrap(app.store, keys).rewrapped == 0  # nothing left to do


def test_a_tampered_data_key_parks_the_object(make_app: MakeApp, raw: RawSQL) -> None:
    """A wrapped data key whose bytes were changed does not unwrap: the object parks
    with that reason; it never runs with a wrong key."""
    app = make_app()
    register(app)
    handle = app.options(object_id="t1").start("keeper", Secret(CANARY), "t")
    wrapped = raw.one("SELECT wrapped FROM data_keys WHERE object_id = ?", ("t1",))[0]
    flipped = wrapped[:-3] + bytes([wrapped[-3] ^ 0x40]) + wrapped[-2:]
    raw.execute("UPDATE data_keys SET wrapped = ? WHERE object_id = ?", (flipped, "t1"))
    with app.background_worker(), pytest.raises(AgentParkedError) as parked:
        handle.result(timeout=10)
    assert "wrapped data key does not decrypt" in str(parked.value)


def test_a_tampered_ciphertext_fails_verification(make_app: MakeApp, raw: RawSQL) -> None:
    """A changed byte in a sealed value breaks the record's hash: verify names it and
    no node runs the object."""
    app = make_app()
    register(app)
    handle = app.options(object_id="c1").start("keeper", Secret(CANARY), "c")
    body = raw.one("SELECT body FROM records WHERE object_id = ? AND seq = 1", ("c1",))[0]
    at = body.index(b'"data":"') + 20
    changed = body[:at] + (b"A" if body[at:at + 1] != b"A" else b"B") + body[at + 1:]
    raw.execute("UPDATE records SET body = ? WHERE object_id = ? AND seq = 1", (changed, "c1"))
    report = app.verify("c1")
    assert not report.ok and report.bad_seq == 1
    with app.background_worker(), pytest.raises(AgentParkedError):
        handle.result(timeout=10)


def test_delegation_and_repeated_starts_keep_secrets(make_app: MakeApp, raw: RawSQL) -> None:
    """A child gets a secret argument sealed under its own key and returns one that
    its parent opens; a repeated start compares secrets by value without quoting them."""
    app = make_app()

    @app.agent(name="child")
    async def child(run: perdure.Run, key: Secret[str]) -> Secret[str]:
        return await run.step(echo, key)

    @app.agent(name="parent")
    async def parent(run: perdure.Run, key: Secret[str]) -> bool:
        got = await (await run.delegate("child", key)).result()
        return bool(got == key and isinstance(got, Secret))

    handle = app.options(object_id="p1").start("parent", Secret(CANARY))
    with app.background_worker():
        assert handle.result(timeout=10) is True
    assert CANARY.encode() not in stored_bytes(raw)
    assert raw.one("SELECT count(*) FROM data_keys")[0] == 2
    assert app.options(object_id="p1").start("parent", Secret(CANARY)).differs is None
    differs = app.options(object_id="p1").start("parent", Secret("another-secret-value")).differs
    assert differs is not None and "a secret differs" in differs
    assert CANARY not in differs and "another-secret-value" not in differs


def test_reserved_keys_are_refused(make_app: MakeApp) -> None:
    """A payload that holds perdure's reserved keys itself is refused, never stored."""
    app = make_app()
    register(app)
    app.options(object_id="v1").start("keeper", Secret(CANARY), "x")
    with pytest.raises(SerializationError, match="reserves"):
        app.send("v1", "creds", {"perdure:sealed": {"v": 1}})
    with pytest.raises(SerializationError, match="reserves"):
        app.options(object_id="v2").start("keeper", {"perdure:secret": "x"}, "y")


def test_cli_output_never_shows_a_secret(make_app: MakeApp, store_url: str,
                                         key_dir: Path) -> None:
    """``show``, ``show --json``, ``result``, ``ls`` and ``export-heads`` print sealed
    values as such, with or without the key (the CLI never opens); the CLI of a node
    without the key says so in one line when it must seal (a send)."""
    app = make_app()
    register(app)
    handle = app.options(object_id="s1").start("keeper", Secret(CANARY), "cli")
    with app.background_worker():
        wait_for_status(app, "s1", "dormant")
        app.send("s1", "creds", {"token": Secret(CANARY)})
        handle.result(timeout=10)

    def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             *args], capture_output=True, text=True, timeout=60, check=False, env=env)

    outputs = [cli("show", "s1"), cli("show", "s1", "--json"), cli("result", "s1"),
               cli("result", "s1", "--json"), cli("ls"), cli("export-heads"),
               cli("verify", "s1"), cli("keys", "data-key")]
    for done in outputs:
        assert done.returncode == 0, done
        assert CANARY not in done.stdout + done.stderr
    assert "<sealed>" in outputs[0].stdout
    assert '"token": "<sealed>"' in outputs[2].stdout  # the CLI never opens
    import os

    env = dict(os.environ, OTHER_KEK=DataKeys.generate())
    # The CLI never opens, so a node without the key prints the same.
    stranger = cli("--data-keys", "env:OTHER_KEK", "result", "s1", env=env)
    assert stranger.returncode == 0, stranger.stderr
    assert stranger.stdout == outputs[2].stdout
    # Sending to an encrypt-all object needs the key: one line saying which.
    app.options(object_id="s2").start("all_sealed", "x")
    stranger = cli("--data-keys", "env:OTHER_KEK", "send", "s2", "note", '"hi"', env=env)
    assert stranger.returncode == 1
    lines = stranger.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not hold" in lines[0], stranger.stderr


def test_encrypt_all_without_arguments_and_its_errors(make_app: MakeApp, raw: RawSQL) -> None:
    """An ``encrypt=True`` agent started without arguments still has its key (and flag)
    at once, so an event sent before any worker ran is sealed; an error quoting one of
    its values is redacted, as a secret's would be."""
    app = make_app()

    def fails(text: str) -> None:
        raise RuntimeError(f"cannot parse {text}")

    @app.agent(name="quiet", encrypt=True)
    async def quiet(run: perdure.Run) -> None:
        text = await run.wait_for("doc")
        await run.step(fails, text, retry=perdure.RetryPolicy(max_attempts=1))

    handle = app.options(object_id="q1").start("quiet")
    app.send("q1", "doc", f"report {CANARY}")
    assert CANARY.encode() not in stored_bytes(raw)
    with app.background_worker(), pytest.raises(AgentFailedError) as failed:
        handle.result(timeout=10)
    assert "cannot parse [secret]" in str(failed.value)
    assert CANARY.encode() not in stored_bytes(raw)


def test_cli_rotates_the_data_key(make_app: MakeApp, store_url: str, key_dir: Path,
                                  raw: RawSQL) -> None:
    """``perdure keys rotate --data`` makes a new key-encryption key and re-wraps; the
    records are untouched and ``keys data-key`` shows where every data key stands."""
    app = make_app()
    register(app)
    app.options(object_id="cr1").start("keeper", Secret(CANARY), "x")
    hashes = [r.hash for r in app.history("cr1")]
    old = raw.one("SELECT key_id FROM data_keys WHERE object_id = ?", ("cr1",))[0]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             *args], capture_output=True, text=True, timeout=60, check=False)

    done = cli("keys", "rotate", "--data")
    assert done.returncode == 0, done.stderr
    new = raw.one("SELECT key_id FROM data_keys WHERE object_id = ?", ("cr1",))[0]
    assert new != old
    assert f"re-wrapped 1 data key(s) under {new}" in done.stdout
    assert "no record was rewritten" in done.stdout
    assert [r.hash for r in app.history("cr1")] == hashes
    shown = cli("keys", "data-key")
    assert f"{new} (current)" in shown.stdout and f"{old}" in shown.stdout
    assert f"{new}: wraps 1 object data key(s), held" in shown.stdout
    again = cli("keys", "rotate", "--data")
    assert "re-wrapped 1 data key(s)" in again.stdout  # a second rotation: a third key


def test_plain_def_agents_and_gather_branches_get_secrets(make_app: MakeApp,
                                                          raw: RawSQL) -> None:
    """A ``def`` agent (``SyncRun``) and the branches of a ``gather`` seal and replay
    secrets the same way; a sleep in between makes the second claim replay them."""
    app = make_app()

    @app.agent(name="plain")
    def plain(run: perdure.SyncRun, key: Secret[str]) -> bool:
        got = run.step(echo, key)
        run.sleep(0.05)
        return bool(got == key and isinstance(got, Secret))

    @app.agent(name="branches")
    async def branches(run: perdure.Run, key: Secret[str]) -> bool:
        one, two = await run.gather(run.step(echo, key), run.step(echo, key))
        await run.sleep(0.05)
        return bool(one == two == key)

    first = app.options(object_id="d1").start("plain", Secret(CANARY))
    second = app.options(object_id="g1").start("branches", Secret(CANARY))
    with app.background_worker():
        assert first.result(timeout=10) is True
        assert second.result(timeout=10) is True
    assert CANARY.encode() not in stored_bytes(raw)


def test_a_deleted_data_key_is_reported_not_replaced(make_app: MakeApp, raw: RawSQL) -> None:
    """Memory holds sealed values but the store lost the object's data key: nodes say so
    and run nothing; no new key is made in its place (even for an agent that encrypts
    all), so restoring the row from a backup brings the object back."""
    app = make_app()
    register(app)
    app.options(object_id="x1").start("all_sealed", "text")
    row = raw.one("SELECT key_id, wrapped FROM data_keys WHERE object_id = ?", ("x1",))
    raw.execute("DELETE FROM data_keys WHERE object_id = ?", ("x1",))
    with app.background_worker():
        deadline = time.monotonic() + 10
        while "no data key for it" not in (app.get("x1").note or ""):
            assert time.monotonic() < deadline, app.get("x1")
            time.sleep(0.02)
    assert raw.execute("SELECT key_id FROM data_keys WHERE object_id = ?", ("x1",)) == []
    assert len(app.history("x1")) == 1
    raw.execute("INSERT INTO data_keys (object_id, key_id, wrapped, seal_all, updated_at) "
                "VALUES (?, ?, ?, ?, ?)", ("x1", row[0], row[1], True, 0.0))
    with app.background_worker():
        wait_for_status(app, "x1", "dormant")


def test_a_signed_record_with_a_broken_sealed_value_parks(make_app: MakeApp) -> None:
    """A record signed by a trusted node (a node-key holder, or a bug) whose sealed value
    does not decrypt passes verification but is never run on: the object parks with a
    reason naming the sealed value."""
    import base64

    from perdure.core.sealing import SEALED
    from perdure.engine.instantiate import instantiate
    from perdure.keys.sealer import Sealer, sealed_arguments

    app = make_app()
    register(app)
    definition = app.agents["keeper"]
    sealer = Sealer(app.store, app.data_keys, "b1")
    args, kwargs = sealed_arguments(sealer, [Secret(CANARY), "x"], {}, agent="keeper")
    raw_bytes = bytearray(base64.b64decode(args[0][SEALED]["data"]))
    raw_bytes[-1] ^= 0x01
    args[0][SEALED]["data"] = base64.b64encode(bytes(raw_bytes)).decode()
    new = instantiate(definition, args, kwargs, object_id="b1", signer=app.client.certified(),
                      policy_ref=app.policy.ref, now=time.time())
    assert app.store.create(new, time.time())
    assert app.verify("b1").ok  # signed by a trusted node: the chain is fine
    with app.background_worker(), pytest.raises(AgentParkedError) as parked:
        app.handle("b1").result(timeout=10)
    assert "does not decrypt" in str(parked.value)
    assert CANARY not in str(parked.value)


def test_cli_sends_a_secret_from_stdin(make_app: MakeApp, store_url: str, key_dir: Path,
                                       raw: RawSQL) -> None:
    """``perdure send ID EVENT - --secret`` reads the secret from stdin (JSON, or plain
    text) and sends it sealed; the agent gets a Secret."""
    app = make_app()

    @app.agent(name="receiver")
    async def receiver(run: perdure.Run) -> list[Any]:
        first = await run.wait_for("key")
        second = await run.wait_for("doc")
        return [isinstance(first, Secret) and first.reveal() == CANARY,
                isinstance(second, Secret) and second.reveal() == {"pin": CANARY}]

    handle = app.options(object_id="cs1").start("receiver")

    def send(event: str, text: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             "send", "cs1", event, "-", "--secret"], input=text, capture_output=True,
            text=True, timeout=60, check=False)

    for done in (send("key", CANARY + "\n"), send("doc", json.dumps({"pin": CANARY}))):
        assert done.returncode == 0, done.stderr
        assert CANARY not in done.stdout + done.stderr
    assert CANARY.encode() not in stored_bytes(raw)
    with app.background_worker():
        assert handle.result(timeout=10) == [True, True]
