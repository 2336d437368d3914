"""The dashboard's inbox and object page against the real approvals, questions and fork
(``app.approvals``/``approve``/``reject``, ``app.fork``), on both stores: an agent's model
(the scripted server, over HTTP through the openai SDK) proposes a risky tool call; the
inbox shows it with its arguments; approving runs the tool once, rejecting tells the
model why, an edit goes through the gate again (and is denied when the policy says so).
Every decision is signed with the dashboard's key and names the person logged in; a
dashboard whose identity may not decide is refused with nothing written."""

from __future__ import annotations

import html
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from perdure.core.lifecycle import Status
from perdure.core.records import Kind
from perdure.llm.scripted import ScriptedServer
from tests.web import agents
from tests.web.support import (
    Served,
    actions_noted,
    csrf_of,
    serve,
    stop_serving,
    wait_until,
)

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


def _waiting(served: Served, oid: str) -> str:
    """The proposal ``oid`` waits on, once it waits."""
    wait_until(lambda: any(p.object_id == oid for p in served.app.approvals()), 30)
    return next(p.proposal_id for p in served.app.approvals() if p.object_id == oid)


def test_approve_reject_edit_from_the_inbox(served: Served, model: ScriptedServer,
                                            outbox: str) -> None:
    app = served.app
    with app.background_worker():
        first = app.start("assistant", model.openai_base_url)
        second = app.start("assistant", model.openai_base_url)
        third = app.start("assistant", model.openai_base_url)
        p1, p2, p3 = (_waiting(served, h.object_id) for h in (first, second, third))
        with closing(served.login(name="ann")) as client:
            inbox = client.get("/inbox").text
            for oid in (first.object_id, second.object_id, third.object_id):
                assert f'data-object="{oid}"' in inbox
            assert "send_email" in inbox and "&quot;to&quot;: &quot;team@example.com&quot;" \
                in inbox
            assert "who may decide: any trusted identity" in inbox
            csrf = csrf_of(inbox)

            # approve: the tool runs once, the object completes
            got = client.post("/inbox/approve", data={
                "csrf": csrf, "object_id": first.object_id, "proposal_id": p1, "edit": ""})
            assert got.status_code == 303
            assert f"proposal {p1} (send_email) approved" in client.get("/inbox").text
            assert first.result(timeout=30).startswith("Done")
            assert [m["to"] for m in agents.outbox(outbox)] == ["team@example.com"]
            again = client.post("/inbox/approve", data={
                "csrf": csrf, "object_id": first.object_id, "proposal_id": p1})
            assert again.status_code == 303
            assert "no proposal" in client.get("/inbox").text

            # reject: a reason is needed; the model is told it; no email
            before = len(app.store.pending_events(second.object_id))
            client.post("/inbox/reject", data={"csrf": csrf, "object_id": second.object_id,
                                               "proposal_id": p2, "reason": "  "})
            assert "say why" in client.get("/inbox").text
            assert len(app.store.pending_events(second.object_id)) == before
            client.post("/inbox/reject", data={"csrf": csrf, "object_id": second.object_id,
                                               "proposal_id": p2, "reason": "not today"})
            assert "not today" in second.result(timeout=30)

            # edit: gated again; to an address the policy's constraint refuses: denied
            client.post("/inbox/approve", data={"csrf": csrf, "object_id": third.object_id,
                                                "proposal_id": p3, "edit": "{bad"})
            assert "not JSON" in client.get("/inbox").text
            client.post("/inbox/approve", data={
                "csrf": csrf, "object_id": third.object_id, "proposal_id": p3,
                "edit": '{"to": "evil@example.com", "body": "all our secrets"}'})
            assert "edited" in client.get("/inbox").text
            third.result(timeout=30)
            assert len(agents.outbox(outbox)) == 1  # only the approved email was sent

            page = html.unescape(client.get(f"/objects/{third.object_id}").text)
            assert "DENIED" in page and "evil@example.com" in page
            page = html.unescape(client.get(f"/objects/{first.object_id}").text)
            assert "<h2>Model calls</h2>" in page and "gpt-4o-mini via openai" in page
            assert "$0.0000" in page or "$0.0001" in page  # priced from the App's table
            assert "<h2>Tool calls</h2>" in page
            assert f"approved by {app.node_id}" in page
            assert "needs approval" in page and "policy web-test" in page

    decided = [r for r in app.history(first.object_id) if r.kind == Kind.TOOL_DECIDED]
    assert len(decided) == 1
    body = decided[0].body
    assert body["identity"] == app.node_id and body["decision"] == "approve"
    assert "ann (operator, token) via dashboard" in body["reason"]
    noted = actions_noted(app, first.object_id)
    assert [(n["action"], n["by"], n["proposal"]) for n in noted] == [("approve", "ann", p1)]
    rejected = [r.body for r in app.history(second.object_id) if r.kind == Kind.TOOL_DECIDED]
    assert rejected[0]["decision"] == "reject" and rejected[0]["reason"].startswith(
        "not today [ann (operator, token) via dashboard]")
    assert [n["action"] for n in actions_noted(app, third.object_id)] == ["edit"]
    for h in (first, second, third):
        assert app.verify(h.object_id).ok


def test_an_edit_the_gate_allows_runs_with_the_new_arguments(
        served: Served, model: ScriptedServer, outbox: str) -> None:
    app = served.app
    with app.background_worker():
        held = app.start("assistant", model.openai_base_url)
        pid = _waiting(served, held.object_id)
        with closing(served.login(name="ed")) as client:
            csrf = csrf_of(client.get("/inbox").text)
            client.post("/inbox/approve", data={
                "csrf": csrf, "object_id": held.object_id, "proposal_id": pid,
                "edit": '{"to": "team@example.com", "body": "Cloudy in Oslo."}'})
            assert "gate again" in client.get("/inbox").text
            held.result(timeout=30)
            page = html.unescape(client.get(f"/objects/{held.object_id}").text)
    assert [(m["to"], m["body"]) for m in agents.outbox(outbox)] == [
        ("team@example.com", "Cloudy in Oslo.")]
    assert f"(edit of {pid})" in page  # the new proposal, gated again
    kinds = [(r.body.get("decision"), r.body.get("identity")) for r in app.history(
        held.object_id) if r.kind == Kind.TOOL_DECIDED]
    assert kinds and all(identity == app.node_id for _, identity in kinds)
    assert kinds[0][0] == "edit"
    assert app.approvals() == []


def test_a_dashboard_not_allowed_to_decide_is_refused(served: Served,
                                                      model: ScriptedServer,
                                                      outbox: str) -> None:
    app = served.app
    with app.background_worker():
        held = app.start("assistant", model.openai_base_url, boss_only=True)
        pid = _waiting(served, held.object_id)
        head = app.get(held.object_id).records
        with closing(served.login(name="ann")) as client:
            inbox = client.get("/inbox").text
            assert "who may decide: the-boss" in inbox
            csrf = csrf_of(inbox)
            for verdict, extra in (("approve", {}), ("reject", {"reason": "no"})):
                client.post(f"/inbox/{verdict}", data={
                    "csrf": csrf, "object_id": held.object_id, "proposal_id": pid, **extra})
                said = html.unescape(client.get("/inbox").text)
                assert f"this client decides as '{app.node_id}', which may not decide " \
                       "on high-risk calls (allowed: the-boss)" in said
        assert app.store.pending_events(held.object_id) == []  # nothing sent, no note
        assert app.get(held.object_id).records == head
        assert [p.proposal_id for p in app.approvals()] == [pid]
        assert agents.outbox(outbox) == []


def test_a_dashboard_whose_key_the_workers_refuse_decides_nothing(
        served: Served, store_url: str, tmp_path: Path, model: ScriptedServer,
        outbox: str) -> None:
    """A dashboard on the same store whose key folder holds a root of its own: its
    approve and reject say the object's workers would refuse its key (not that memory
    is forged), show no "approved", and write nothing."""
    app = served.app
    foreign = serve(store_url, tmp_path / "foreign-keys")
    try:
        with app.background_worker():
            held = app.start("assistant", model.openai_base_url)
            pid = _waiting(served, held.object_id)
            head = app.get(held.object_id).records
            with closing(foreign.login(name="eve")) as client:
                csrf = csrf_of(client.get("/inbox").text)
                for verdict, extra in (("approve", {}), ("reject", {"reason": "no"})):
                    client.post(f"/inbox/{verdict}", data={
                        "csrf": csrf, "object_id": held.object_id, "proposal_id": pid,
                        **extra})
                    said = html.unescape(client.get("/inbox").text)
                    assert "its workers would refuse what this key signs" in said
                    assert "approved" not in said and "rejected" not in said
            assert app.store.pending_events(held.object_id) == []  # nothing sent, no note
            assert app.get(held.object_id).records == head
            assert [p.proposal_id for p in app.approvals()] == [pid]
    finally:
        stop_serving(foreign)
    assert agents.outbox(outbox) == []


def test_an_allowed_dashboard_decides(store_url: str, key_dir: Path,
                                      model: ScriptedServer, outbox: str) -> None:
    served = serve(store_url, key_dir, node_id="the-boss")
    app = served.app
    try:
        with app.background_worker():
            held = app.start("assistant", model.openai_base_url, boss_only=True)
            pid = _waiting(served, held.object_id)
            with closing(served.login(name="bea")) as client:
                csrf = csrf_of(client.get("/inbox").text)
                client.post("/inbox/approve", data={"csrf": csrf, "proposal_id": pid,
                                                    "object_id": held.object_id})
                assert "approved" in client.get("/inbox").text
            assert held.result(timeout=30).startswith("Done")
        [decided] = [r.body for r in app.history(held.object_id)
                     if r.kind == Kind.TOOL_DECIDED]
        assert decided["identity"] == "the-boss" and decided["decision"] == "approve"
        assert "bea (operator, token) via dashboard" in decided["reason"]
        assert len(agents.outbox(outbox)) == 1
    finally:
        stop_serving(served)


def test_fork_and_questions_on_the_object_page(served: Served) -> None:
    app = served.app
    with app.background_worker():
        asking = app.start("asker", "lunch")
        wait_until(lambda: app.get(asking.object_id).status is Status.DORMANT)
        with closing(served.login(name="bo")) as client:
            page = client.get(f"/objects/{asking.object_id}").text
            assert "waiting for event <code>answer</code>" in page
            csrf = csrf_of(page)
            client.post("/act/fork", data={"csrf": csrf, "object_id": asking.object_id,
                                           "at": "2", "new_id": "forked-1"})
            assert "forked as forked-1" in client.get(f"/objects/{asking.object_id}").text
            forked = client.get("/objects/forked-1").text
            assert f"forked from {asking.object_id} at #2" in forked
            client.post("/act/fork", data={"csrf": csrf, "object_id": asking.object_id,
                                           "at": "x"})
            assert "fork needs a record number" in client.get(
                f"/objects/{asking.object_id}").text
            client.post("/act/fork", data={"csrf": csrf, "object_id": asking.object_id,
                                           "at": "999"})
            assert "#999 is not one of them" in client.get(
                f"/objects/{asking.object_id}").text
        wait_until(lambda: app.get("forked-1").status is Status.DORMANT)
        origin = app.get("forked-1").forked_from or {}
        assert (origin.get("object_id"), origin.get("seq")) == (asking.object_id, 2)
        # the note is folded before the fork's next event at the latest (a note sent
        # while a node held the fork as it went dormant waits for its next wake)
        app.send("forked-1", "answer", "soup")
        assert app.handle("forked-1").result(timeout=30) == {"topic": "lunch",
                                                             "answer": "soup"}
        assert [(n["action"], n["by"], n["source"], n["at"])
                for n in actions_noted(app, "forked-1")] == [
            ("fork", "bo", asking.object_id, 2)]


def test_hostile_decisions_change_nothing(served: Served, model: ScriptedServer,
                                          outbox: str) -> None:
    app = served.app
    with app.background_worker():
        held = app.start("assistant", model.openai_base_url)
        pid = _waiting(served, held.object_id)
        head = app.get(held.object_id).records
        oid = held.object_id
        with closing(served.login("viewer", name="victor")) as viewer:
            page = viewer.get(f"/objects/{oid}").text
            assert "Waits for a person" in page and f'data-proposal="{pid}"' in page
            assert 'action="/inbox/approve"' not in page  # a viewer gets no forms
            csrf = csrf_of(viewer.get("/inbox").text)
            assert 'action="/inbox/approve"' not in viewer.get("/inbox").text
            got = viewer.post("/inbox/approve", data={"csrf": csrf, "object_id": oid,
                                                      "proposal_id": pid})
            assert got.status_code == 403
        with closing(served.login(name="mal")) as client:
            page = client.get(f"/objects/{oid}").text
            live = page.split('<section data-live id="state">')[1].split("</section>")[0]
            assert "<form" not in live  # the decision's forms are outside refreshed parts
            assert page.count('action="/inbox/approve"') == 1
            csrf = csrf_of(client.get("/inbox").text)
            for form, said in (
                    ({"object_id": "nobody", "proposal_id": pid}, "nobody"),
                    ({"object_id": oid, "proposal_id": "x" * 5000}, "no proposal"),
                    ({"object_id": oid, "proposal_id": pid, "edit": "[1, 2]"},
                     "must be a JSON object"),
                    ({"object_id": oid, "proposal_id": pid, "edit": "\"text\""},
                     "must be a JSON object"),
                    ({"object_id": oid, "proposal_id": pid, "edit": "9" * 5000},
                     "not JSON"),
            ):
                client.post("/inbox/approve", data={"csrf": csrf, **form})
                assert said in html.unescape(client.get("/inbox").text), form
            client.post("/inbox/reject", data={"csrf": csrf, "object_id": oid,
                                               "proposal_id": pid, "reason": "r" * 3000})
            assert "longer than 2000" in client.get("/inbox").text
        assert app.store.pending_events(oid) == []
        assert app.get(oid).records == head
        assert [p.proposal_id for p in app.approvals()] == [pid]
    # no worker now: a decision sent twice before the object takes it up counts once
    with closing(served.login(name="ann")) as client:
        csrf = csrf_of(client.get("/inbox").text)
        for _ in range(2):
            client.post("/inbox/reject", data={"csrf": csrf, "object_id": oid,
                                               "proposal_id": pid, "reason": "no"})
        assert "decided from this dashboard already" in client.get("/inbox").text
    assert sorted(e.name for e in app.store.pending_events(oid)) == [
        "perdure:approval", "perdure:refine"]
    with app.background_worker():
        assert "no" in held.result(timeout=30)
    assert [n["action"] for n in actions_noted(app, oid)] == ["reject"]
    assert agents.outbox(outbox) == []


def test_forged_arguments_are_not_approved(sqlite_url: str, key_dir: Path,
                                           model: ScriptedServer, outbox: str) -> None:
    """Someone with write access to the store rewrites a waiting proposal's arguments to
    look harmless: the inbox shows what the store says, but the dashboard verifies the
    memory before it signs, refuses, and writes nothing."""
    import sqlite3

    from perdure.core.codec import encode

    served = serve(sqlite_url, key_dir)
    app = served.app
    try:
        with app.background_worker():
            held = app.start("assistant", model.openai_base_url)
            pid = _waiting(served, held.object_id)
        [proposed] = [r for r in app.history(held.object_id)
                      if r.kind == Kind.TOOL_PROPOSED and r.body["name"] == "send_email"]
        body = dict(proposed.body)
        body["args"] = encode({"to": "team@example.com", "body": "harmless"}).decode()
        db = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
        db.execute("UPDATE records SET body = ? WHERE object_id = ? AND seq = ?",
                   (encode(body), held.object_id, proposed.seq))
        db.commit()
        db.close()
        head = app.get(held.object_id).records
        with closing(served.login(name="ann")) as client:
            inbox = client.get("/inbox").text
            assert "harmless" in inbox
            client.post("/inbox/approve", data={"csrf": csrf_of(inbox), "proposal_id": pid,
                                                "object_id": held.object_id})
            said = html.unescape(client.get("/inbox").text)
            assert f"memory does not verify (record #{proposed.seq}" in said
        assert app.store.pending_events(held.object_id) == []
        assert app.get(held.object_id).records == head
        assert agents.outbox(outbox) == []
    finally:
        stop_serving(served)


def test_a_damaged_object_leaves_the_inbox_listing_the_others(
        sqlite_url: str, key_dir: Path, model: ScriptedServer, outbox: str) -> None:
    import sqlite3

    served = serve(sqlite_url, key_dir)
    app = served.app
    try:
        with app.background_worker():
            hurt = app.options(object_id="hurt").start("assistant", model.openai_base_url)
            fine = app.options(object_id="fine").start("assistant", model.openai_base_url)
            _waiting(served, hurt.object_id)
            pid = _waiting(served, fine.object_id)
        db = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
        db.execute("UPDATE records SET body = X'ff00fe' WHERE object_id = 'hurt' AND seq = 3")
        db.commit()
        db.close()
        with closing(served.login()) as client:
            got = client.get("/inbox")
            assert got.status_code == 200
            assert "object hurt: its memory cannot be read" in got.text
            assert f'data-proposal="{pid}"' in got.text and 'data-object="fine"' in got.text
    finally:
        stop_serving(served)


def test_a_decision_past_the_deadline_is_refused_on_the_page(
        served: Served, model: ScriptedServer, outbox: str) -> None:
    """No worker runs when the deadline passes: the inbox still shows the call, but an
    approval sent after the deadline is refused on the page, and nothing is written (no
    decision, no note of who acted)."""
    app = served.app
    with app.background_worker():
        held = app.start("assistant", model.openai_base_url, ttl=3.0)
        pid = _waiting(served, held.object_id)
    [pending] = [p for p in app.approvals() if p.object_id == held.object_id]
    wait_until(lambda: time.time() > float(pending.expires_at or 0) + 0.2, 10)
    head = app.get(held.object_id).records
    with closing(served.login(name="ann")) as client:
        csrf = csrf_of(client.get("/inbox").text)
        got = client.post("/inbox/approve", data={"csrf": csrf, "proposal_id": pid,
                                                  "object_id": held.object_id})
        assert got.status_code == 303
        said = html.unescape(client.get("/inbox").text)
    assert f"proposal '{pid}' of object '{held.object_id}' expired" in said
    assert "counts as rejected and the tool will not run" in said
    assert app.store.pending_events(held.object_id) == []
    assert app.get(held.object_id).records == head and agents.outbox(outbox) == []
