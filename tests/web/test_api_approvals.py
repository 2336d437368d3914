"""Tool-call decisions through the API, on both stores: signed with the server's key and
naming the token, exactly as the dashboard's (the one approval policy); refused with
nothing written when the server's identity may not decide, when the token lacks the
``approve`` scope, or when the proposal is unknown or decided."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from perdure.core.records import Kind
from perdure.llm.scripted import ScriptedServer
from tests.web import agents
from tests.web.api_support import ServedApi, problem, serve_api, stop_api
from tests.web.support import actions_noted, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def model() -> Iterator[ScriptedServer]:
    """The scripted model server of the ``assistant`` agent."""
    with ScriptedServer(responder=agents.scripted) as server:
        yield server


@pytest.fixture
def outbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where ``send_email`` writes."""
    path = str(tmp_path / "outbox.jsonl")
    monkeypatch.setenv(agents.OUTBOX_ENV, path)
    return path


def _waiting(served: ServedApi, oid: str) -> str:
    wait_until(lambda: any(p.object_id == oid for p in served.app.approvals()), 30)
    return next(p.proposal_id for p in served.app.approvals() if p.object_id == oid)


def test_approve_and_reject_through_the_api(store_url: str, key_dir: Path,
                                            model: ScriptedServer, outbox: str) -> None:
    served = serve_api(store_url, key_dir)
    app = served.app
    try:
        with app.background_worker(), closing(served.client("approver")) as client, \
                closing(served.client("operator")) as operator:
            first = app.start("assistant", model.openai_base_url).object_id
            second = app.start("assistant", model.openai_base_url).object_id
            p1, p2 = _waiting(served, first), _waiting(served, second)
            listed = client.get("/approvals").json()
            assert {(a["object_id"], a["proposal_id"], a["tool"]) for a in listed[
                "approvals"]} == {(first, p1, "send_email"), (second, p2, "send_email")}
            only = client.get("/approvals", params={"object_id": first}).json()["approvals"]
            assert [a["arguments"]["to"] for a in only] == [agents.TEAM]

            # an operator token may not decide; nothing is written
            problem(operator.post(f"/objects/{first}/approvals/{p1}",
                                  json={"decision": "approve"}), 403)
            assert app.store.pending_events(first) == []
            problem(client.post(f"/objects/{first}/approvals/{p1}", json={}), 422, "decision")
            problem(client.post(f"/objects/{first}/approvals/{p1}",
                                json={"decision": "maybe"}), 422, "decision")
            problem(client.post(f"/objects/{second}/approvals/{p2}",
                                json={"decision": "reject"}), 422, "reason")
            problem(client.post(f"/objects/{first}/approvals/{p1}",
                                json={"decision": "approve", "edit": [1]}), 422, "edit")
            problem(client.post(f"/objects/{first}/approvals/nope",
                                json={"decision": "approve"}), 404)
            problem(client.post(f"/objects/nobody/approvals/{p1}",
                                json={"decision": "approve"}), 404)
            assert app.store.pending_events(first) == []

            done = client.post(f"/objects/{first}/approvals/{p1}",
                               json={"decision": "approve", "reason": "looks fine"})
            assert done.status_code == 200, done.text
            assert done.json()["decision"] == "approve"
            assert done.json()["approval"]["proposal_id"] == p1
            problem(client.post(f"/objects/{first}/approvals/{p1}",
                                json={"decision": "approve"}), 409)
            got = client.post(f"/objects/{second}/approvals/{p2}",
                              json={"decision": "reject", "reason": "not today"})
            assert got.json()["decision"] == "reject"
            assert app.handle(first).result(timeout=30).startswith("Done")
            assert "not today" in app.handle(second).result(timeout=30)
        assert app.verify(first).ok and app.verify(second).ok
    finally:
        stop_api(served)
    assert [m["to"] for m in agents.outbox(outbox)] == [agents.TEAM]
    [approved] = [r.body for r in app.history(first) if r.kind == Kind.TOOL_DECIDED]
    assert approved["identity"] == app.node_id and approved["decision"] == "approve"
    assert approved["reason"] == "looks fine [approver (approve, token) via api]"
    [rejected] = [r.body for r in app.history(second) if r.kind == Kind.TOOL_DECIDED]
    assert rejected["reason"] == "not today [approver (approve, token) via api]"
    noted = actions_noted(app, first)
    assert [(n["action"], n["by"], n["via"], n["proposal"], n["token"]) for n in noted] == [
        ("approve", "approver", "api", p1, served.token_ids["approver"])]
    assert [n["action"] for n in actions_noted(app, second)] == ["reject"]


def test_a_server_whose_identity_may_not_decide_is_refused(
        sqlite_url: str, key_dir: Path, model: ScriptedServer, outbox: str) -> None:
    served = serve_api(sqlite_url, key_dir)
    app = served.app
    try:
        with app.background_worker(), closing(served.client("approver")) as client:
            held = app.start("assistant", model.openai_base_url, boss_only=True).object_id
            pid = _waiting(served, held)
            head = app.get(held).records
            refused = problem(client.post(f"/objects/{held}/approvals/{pid}",
                                          json={"decision": "approve"}), 403)
            assert refused["type"] == "urn:perdure:problem:identity-may-not-decide"
            assert f"decides as {app.node_id!r}" in refused["detail"]
            assert "the-boss" in refused["detail"]
            problem(client.post(f"/objects/{held}/approvals/{pid}",
                                json={"decision": "reject", "reason": "no"}), 403)
            assert app.store.pending_events(held) == []
            assert app.get(held).records == head
            assert [p.proposal_id for p in app.approvals()] == [pid]
    finally:
        stop_api(served)
    boss = serve_api(sqlite_url, key_dir, node_id="the-boss")
    try:
        with boss.app.background_worker(), closing(boss.client("approver")) as client:
            assert client.post(f"/objects/{held}/approvals/{pid}",
                               json={"decision": "approve"}).status_code == 200
            assert boss.app.handle(held).result(timeout=30).startswith("Done")
    finally:
        stop_api(boss)
    [decided] = [r.body for r in app.history(held) if r.kind == Kind.TOOL_DECIDED]
    assert decided["identity"] == "the-boss"
    assert decided["reason"] == "by approver (approve, token) via api"
    assert len(agents.outbox(outbox)) == 1
