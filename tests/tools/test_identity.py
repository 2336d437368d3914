"""Who decides is who a trusted root certified: a key certified for a non-approver cannot
decide under an approver's name, before or after the approver first used the store, and
no store row changes who a record or decision is attributed to. Both stores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import perdure
from perdure.approvals import APPROVAL_EVENT
from perdure.core.chain import Signer, verify_chain
from perdure.core.codec import encode
from perdure.core.trust import public_key_bytes, seal_event
from perdure.llm.scripted import ScriptedReply, ScriptedServer, ScriptedToolCall
from tests.cluster import one_root
from tests.integration.engine_support import REPO_ROOT, wait_until
from tests.tools import support
from tests.tools.support import effects


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def _app(make_app: Callable[..., perdure.App], key_dir: Path, node_id: str | None = None
         ) -> perdure.App:
    app = make_app(key_dir=key_dir, node_id=node_id)
    app.agent(name="strict_agent")(support.app.agents["strict_agent"].fn)
    for tool in support.app.tools.values():
        app.tool(tool)
    return app


def _send() -> ScriptedReply:
    return ScriptedReply(tool_calls=(
        ScriptedToolCall("send_message", json.dumps({"to": "bob", "body": "hi"}), "c1"),))


def _cli(*args: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
    return subprocess.run([sys.executable, "-m", "perdure", *map(str, args)], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("approver_first", [False, True], ids=["before", "after"])
def test_a_non_approver_cannot_decide_under_any_approver_name(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path,
        store_url: str, tmp_path: Path, approver_first: bool) -> None:
    """``bob``'s key (certified as bob, not an approver) tries every approver name of the
    pending call, through the API and the CLI: each is refused at the sender with a typed
    error / one line; an event sealed by hand under the approver's name, with a forged
    store row mapping that name to bob's key, is refused on record by the worker and
    nothing is decided. The real approver then decides, is not locked out, and the
    decision and its records are attributed to the approver's certified key."""
    folders = {name: tmp_path / f"keys-{name}" for name in ("worker", "bob", "alice")}
    one_root(tmp_path / "keys-root", *((path, name) for name, path in folders.items()))
    server.script(_send(), ScriptedReply(text="Sent."))
    worker = _app(make_app, folders["worker"])
    alice = _app(make_app, folders["alice"])
    assert (worker.node_id, alice.node_id) == ("worker", "alice")
    if approver_first:  # alice's node certified and its certificate in the store
        alice.client.certified()
        assert "alice" in worker.verifier.names()
    worker.options(object_id="id-1").start("strict_agent", server.openai_base_url, "go")
    bob_key = perdure.KeyFolder(folders["bob"]).node_key()
    with worker.background_worker():
        assert wait_until(lambda: any(p.object_id == "id-1" for p in worker.approvals()),
                          timeout=15)
        [pending] = [p for p in worker.approvals() if p.object_id == "id-1"]
        assert pending.approvers == ("alice",)
        for name in pending.approvers:
            impostor = _app(make_app, folders["bob"], node_id=name)
            with pytest.raises(perdure.NodeIdentityError,
                               match=f"certified as 'bob', not as '{name}'"):
                impostor.approve("id-1", pending.proposal_id)
            done = _cli("--store", store_url, "--key-dir", folders["bob"], "--node-id", name,
                        "approve", "id-1", pending.proposal_id)
            assert done.returncode == 1 and done.stdout == "", done
            [line] = done.stderr.strip().splitlines()
            assert line.startswith("error: ") and f"not as '{name}'" in line
            # By hand: bob's key seals a decision as the approver, and a store row
            # claims the approver's name for bob's key.
            if not approver_first:
                now = time.time()
                worker.store.heartbeat(name, public_key_bytes(bob_key), [], [], now, now + 60)
            payload = encode({"proposal": pending.proposal_id, "args_hash": pending.args_hash,
                              "tool": pending.tool, "decision": "approve", "reason": ""})
            seal, _ = seal_event(bob_key.sign, name, "id-1", APPROVAL_EVENT, payload,
                                 f"forged:{name}", "f" * 24)
            assert worker.store.send("id-1", APPROVAL_EVENT, payload, f"forged:{name}",
                                     time.time(), seal)
        assert wait_until(lambda: any(r.kind == "event_refused"
                                      for r in worker.history("id-1")), timeout=15)
        refused = [r.body["reason"] for r in worker.history("id-1")
                   if r.kind == "event_refused"]
        assert all("'alice' is not certified" in why or "certified as 'alice'" in why
                   for why in refused), refused
        assert not any(r.kind == "tool_decided" for r in worker.history("id-1"))
        assert not sink.exists() or effects(sink) == []
        alice.approve("id-1", pending.proposal_id)  # the real approver: not locked out
        result = worker.handle("id-1").result(timeout=20)
    assert result["calls"][0][:2] == ["send_message", "done"]
    [decided] = [r.body for r in worker.history("id-1") if r.kind == "tool_decided"]
    alice_key = perdure.KeyFolder(folders["alice"]).node_key()
    assert decided["identity"] == "alice"
    assert decided["key"] == public_key_bytes(alice_key).hex()
    assert worker.verify("id-1").ok
    assert {r.node_id for r in worker.history("id-1")} == {"worker"}


def test_a_forged_store_row_does_not_change_who_wrote_a_record(
        make_app: Callable[..., perdure.App], store_url: str, tmp_path: Path) -> None:
    """Records re-signed by bob's key under the worker's name verify for nobody, even with
    a store row mapping the worker's name to bob's key; the worker's own records keep
    verifying under its certified key."""
    folders = {name: tmp_path / f"keys-{name}" for name in ("worker", "bob")}
    one_root(tmp_path / "keys-root", *((path, name) for name, path in folders.items()))
    worker = make_app(key_dir=folders["worker"])
    worker.agent(name="job")(_job)
    worker.options(object_id="w-1").start("job", 1)
    assert worker.verify("w-1").ok
    bob_key = perdure.KeyFolder(folders["bob"]).node_key()
    now = time.time()
    for name in ("intruder-row", "worker-2", "worker"):  # rows people read, trusted by none
        worker.store.heartbeat(name, public_key_bytes(bob_key), [], [], now, now + 60)
    reader = make_app(key_dir=folders["bob"])
    assert reader.verify("w-1").ok  # attribution comes from the worker's certificate
    forged = [r._replace(signature=Signer("worker", bob_key).sign(bytes.fromhex(r.hash)))
              for r in worker.history("w-1")]
    report = verify_chain("w-1", forged, {"worker": public_key_bytes(bob_key)},
                          trust=reader.verifier.ring)
    assert not report.ok and "does not verify under any key certified as 'worker'" in str(
        report.reason)


async def _job(run: perdure.Run, n: int) -> dict[str, int]:
    return {"n": n}
