"""The dashboard's adapter to the API perdure is growing (``perdure.web._actions``):
with an App that has ``approvals``/``approve``/``reject``/``questions``, the inbox lists
the approvals newest first with their arguments readable, and approving (with edited
arguments) or rejecting with a reason reaches the App, noted in the object's memory.

The App here adds those methods over a list, in the shape the upcoming API has
(object id, proposal id, tool, arguments, risk, requested/expires): what is tested is the
dashboard's side, which the lead adapts in one module when the real API lands."""

from __future__ import annotations

import time
from contextlib import closing
from pathlib import Path
from typing import Any

import perdure
from perdure import web
from tests.web.agents import app as agents_app
from tests.web.support import Served, csrf_of, free_port, stop_serving


class GrowingApp(perdure.App):
    """An App with the approvals, questions and fork calls of the upcoming API."""

    pending: list[dict[str, Any]]
    decided: list[tuple[Any, ...]]

    def approvals(self) -> list[dict[str, Any]]:
        return list(self.pending)

    def approve(self, object_id: str, proposal_id: str, *, edit: Any = None) -> None:
        self.decided.append(("approve", object_id, proposal_id, edit))

    def reject(self, object_id: str, proposal_id: str, *, reason: str) -> None:
        self.decided.append(("reject", object_id, proposal_id, reason))

    def questions(self) -> list[dict[str, Any]]:
        return []

    def fork(self, object_id: str, *, at: int, new_id: str | None = None) -> perdure.Handle:
        self.decided.append(("fork", object_id, at, new_id))
        return self.start("sleeper", 3600.0, object_id=new_id)


def test_approvals_through_the_adapter(sqlite_url: str, key_dir: Path) -> None:
    app = GrowingApp(store=sqlite_url, key_dir=key_dir)
    app._agents = dict(agents_app.agents)
    oid = app.start("sleeper", 3600.0).object_id
    now = time.time()
    app.pending = [
        {"object_id": oid, "proposal_id": "p-old", "tool": "refund",
         "arguments": {"amount": 5}, "risk": "low", "requested_at": now - 60,
         "expires_at": now + 600},
        {"object_id": oid, "proposal_id": "p-new", "tool": "wire_money",
         "arguments": {"amount": 900, "to": "<b>acct</b>"}, "risk": "high",
         "requested_at": now, "expires_at": now + 600},
    ]
    app.decided = []
    port = free_port()
    asgi, tokens = web.dashboard(app, port=port)
    _, server = web.serve_in_thread(asgi, host="127.0.0.1", port=port)
    while not server.started:  # type: ignore[attr-defined]
        time.sleep(0.02)
    served = Served(f"http://127.0.0.1:{port}", port, tokens, app, server)
    try:
        with closing(served.login(name="ann")) as client:
            inbox = client.get("/inbox").text
            assert inbox.index("wire_money") < inbox.index("refund")  # newest first
            assert "&quot;to&quot;: &quot;&lt;b&gt;acct&lt;/b&gt;&quot;" in inbox
            assert "<b>acct</b>" not in inbox
            csrf = csrf_of(inbox)
            got = client.post("/inbox/approve", data={
                "csrf": csrf, "object_id": oid, "proposal_id": "p-new",
                "edit": '{"amount": 90, "to": "acct"}'})
            assert got.status_code == 303
            assert "proposal p-new approved" in client.get("/inbox").text
            client.post("/inbox/reject", data={"csrf": csrf, "object_id": oid,
                                               "proposal_id": "p-old", "reason": ""})
            assert "say why" in client.get("/inbox").text
            client.post("/inbox/reject", data={"csrf": csrf, "object_id": oid,
                                               "proposal_id": "p-old", "reason": "too late"})
            client.post("/inbox/approve", data={"csrf": csrf, "object_id": oid,
                                                "proposal_id": "p-x", "edit": "{bad"})
            assert "Expecting" in client.get("/inbox").text
            page = client.get(f"/objects/{oid}").text
            assert 'id="fork"' in page
            client.post("/act/fork", data={"csrf": csrf, "object_id": oid, "at": "1",
                                           "new_id": "forked-1"})
            assert "forked as forked-1" in client.get(f"/objects/{oid}").text
            client.post("/act/fork", data={"csrf": csrf, "object_id": oid, "at": "x"})
            assert "fork needs a record number" in client.get(f"/objects/{oid}").text
        assert app.decided == [("approve", oid, "p-new", {"amount": 90, "to": "acct"}),
                               ("reject", oid, "p-old", "too late"),
                               ("fork", oid, 1, "forked-1")]
        assert [e.name for e in app.store.pending_events("forked-1")] == ["perdure:refine"]
        notes = [e for e in app.store.pending_events(oid) if e.name == "perdure:refine"]
        assert len(notes) == 2  # who approved and who rejected, for the object's memory
    finally:
        stop_serving(served)
