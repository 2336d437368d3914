"""The dashboard end to end in a real browser: Debian's headless Chromium driven by
Playwright, a worker process, the dashboard on a free port, the scripted model server
(the worker's agents call it through the openai SDK over HTTP). Log in with the token,
answer a waiting object from the inbox by clicking, watch it complete; approve, reject
and edit an agent's risky tool call from the inbox; send an event, cancel and fork from
an object's page; screenshots of every page checked not blank (into .screenshots/, or
docs/images/ with PERDURE_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perdure.core.lifecycle import Status
from perdure.llm.scripted import ScriptedServer
from tests.web import agents
from tests.web.pixels import variance
from tests.web.support import (
    ROOT,
    Served,
    actions_noted,
    serve,
    start_worker,
    stop_serving,
    stop_worker,
    wait_until,
)

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
# Screenshots land in an ignored folder; PERDURE_UPDATE_SCREENSHOTS=1 writes the docs'
# images instead, so a test run never rewrites tracked files by the way.
IMAGES = (ROOT / "docs" / "images" if os.environ.get("PERDURE_UPDATE_SCREENSHOTS") == "1"
          else ROOT / ".screenshots")

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason="no system chromium (apt-get install chromium; ./dev test does)"),
]


@pytest.fixture
def model() -> Iterator[ScriptedServer]:
    """The scripted model server the ``assistant`` agents call."""
    with ScriptedServer(responder=agents.scripted) as server:
        yield server


@pytest.fixture
def outbox(tmp_path: Path) -> Path:
    """Where the worker's ``send_email`` writes."""
    return tmp_path / "outbox.jsonl"


@pytest.fixture
def stack(sqlite_url: str, key_dir: Path, tmp_path: Path, outbox: Path,
          model: ScriptedServer) -> Iterator[Served]:
    """A dashboard and a worker process on one SQLite store."""
    served = serve(sqlite_url, key_dir)
    worker = start_worker(sqlite_url, key_dir, tmp_path / "worker.log",
                          env={agents.OUTBOX_ENV: str(outbox)})
    try:
        yield served
    finally:
        stop_worker(worker)
        stop_serving(served)


@pytest.fixture
def page(stack: Served) -> Iterator[Any]:
    """A logged-in operator's browser page."""
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 860})
            tab = context.new_page()
            tab.set_default_timeout(20_000)
            tab.goto(stack.url + "/")
            assert tab.url.endswith("/login")
            tab.fill("input[name=name]", "alice")
            tab.fill("input[name=secret]", stack.tokens["operator"])
            tab.click("#login")
            tab.wait_for_url(stack.url + "/")
            yield tab
        finally:
            browser.close()


def shoot(tab: Any, name: str, *, full_page: bool = False) -> None:
    """A screenshot of the page into ``IMAGES``, checked not blank."""
    png = tab.screenshot(full_page=full_page)
    assert variance(png) > 50, f"screenshot {name} looks blank"
    IMAGES.mkdir(parents=True, exist_ok=True)
    (IMAGES / f"dashboard-{name}.png").write_bytes(png)


def test_answer_send_cancel_in_the_browser(stack: Served, page: Any) -> None:
    app = stack.app
    lunch = app.options(labels={"team": "kitchen"}).start("asker", "lunch")
    dinner = app.start("asker", "dinner")
    nap = app.start("sleeper", 3600.0)
    family = app.start("parent")
    wait_until(lambda: all(app.get(h.object_id).status is Status.DORMANT
                           for h in (lunch, dinner, nap)))
    wait_until(lambda: len(app.list(parent=family.object_id)) == 2)

    # The inbox shows the question; answering it by clicking completes the object.
    page.goto(stack.url + "/inbox")
    card = page.locator(f".question[data-object='{lunch.object_id}']")
    card.wait_for()
    shoot(page, "inbox")
    card.locator("input[name=payload]").fill('"pasta"')
    card.locator("button.answer-btn").click()
    page.wait_for_url(re.compile(r"/inbox$"))
    assert "event 'answer' sent" in page.inner_text(".flash")
    assert lunch.result(timeout=20) == {"topic": "lunch", "answer": "pasta"}
    page.goto(f"{stack.url}/objects/{lunch.object_id}")
    page.wait_for_selector(".headline .s-completed")
    assert "send by alice (operator, token) via dashboard" in page.inner_text("#memory")
    shoot(page, "object")
    assert actions_noted(app, lunch.object_id)[0]["by"] == "alice"

    # Send an event from the object's page; the page updates itself (no reload).
    page.goto(f"{stack.url}/objects/{dinner.object_id}")
    assert page.input_value("form.send input[name=event]") == "answer"
    page.fill("form.send input[name=payload]", "soup")
    page.click("#send")
    page.wait_for_selector(".flash")
    page.wait_for_selector(".headline .s-completed")
    assert dinner.result(timeout=5) == {"topic": "dinner", "answer": "soup"}

    # Cancel a sleeping object; memory says who cancelled it before it ended.
    page.goto(f"{stack.url}/objects/{nap.object_id}")
    page.click("#cancel")
    page.wait_for_selector(".headline .s-cancelled")
    noted = actions_noted(app, nap.object_id)
    assert [n["action"] for n in noted] == ["cancel"] and noted[0]["role"] == "operator"
    kinds = [r.kind for r in app.history(nap.object_id)]
    assert kinds[-2:] == ["progress", "terminated"]

    # The lineage tree and children of the parent; the list, its filters; nodes; overview.
    page.goto(f"{stack.url}/objects/{family.object_id}")
    assert page.locator(".tree a").count() == 3
    page.goto(f"{stack.url}/objects?label=team%3Dkitchen")
    assert page.locator("table.objects tbody tr").count() == 1
    page.goto(f"{stack.url}/objects")
    page.wait_for_selector(f"text={nap.object_id}")
    shoot(page, "objects")
    page.goto(f"{stack.url}/nodes")
    assert page.locator("table.nodes tbody tr").count() >= 1
    shoot(page, "nodes")
    page.goto(stack.url + "/")
    page.wait_for_function("() => [...document.querySelectorAll('figure.chart rect')]"
                           ".some(r => +r.getAttribute('height') > 0)")  # lunch, dinner
    shoot(page, "overview")


def test_approve_reject_edit_in_the_browser(stack: Served, page: Any, model: ScriptedServer,
                                            outbox: Path) -> None:
    app = stack.app
    sent, refused, edited = (app.start("assistant", model.openai_base_url) for _ in range(3))
    wait_until(lambda: {p.object_id for p in app.approvals()} ==
               {sent.object_id, refused.object_id, edited.object_id}, 60)

    # The inbox lists the risky call with its arguments; approving runs the tool once.
    page.goto(stack.url + "/inbox")
    card = page.locator(f".approval[data-object='{sent.object_id}']")
    card.wait_for()
    assert '"to": "team@example.com"' in card.locator("pre").inner_text()
    assert "send_email" in card.inner_text() and "risk high" in card.inner_text()
    shoot(page, "inbox-approval")
    card.locator("button.approve").click()
    page.wait_for_url(re.compile(r"/inbox$"))
    assert "(send_email) approved" in page.inner_text(".flash")
    assert sent.result(timeout=30).startswith("Done")
    assert [m["to"] for m in agents.outbox(str(outbox))] == ["team@example.com"]

    # Reject with a reason, from the object's page: the model is told; nothing is sent.
    page.goto(f"{stack.url}/objects/{refused.object_id}")
    card = page.locator(f"#approvals .approval[data-object='{refused.object_id}']")
    assert '"body": "Sunny in Oslo."' in card.locator("pre").inner_text()
    card.locator("input[name=reason]").fill("not today")
    card.locator("button.reject").click()
    page.wait_for_url(f"{stack.url}/objects/{refused.object_id}")
    assert "rejected" in page.inner_text(".flash")
    assert "not today" in refused.result(timeout=30)

    # Edit: the new arguments go through the gate again; the policy denies this address.
    page.goto(stack.url + "/inbox")
    card = page.locator(f".approval[data-object='{edited.object_id}']")
    card.locator("textarea[name=edit]").fill('{"to": "evil@example.com", "body": "hi"}')
    card.locator("button.approve").click()
    page.wait_for_url(re.compile(r"/inbox$"))
    assert "gate again" in page.inner_text(".flash")
    edited.result(timeout=30)
    page.goto(f"{stack.url}/objects/{edited.object_id}")
    assert "DENIED" in page.inner_text("#calls")
    assert len(agents.outbox(str(outbox))) == 1

    # The object page: the model-call ledger, proposals, the gate's verdicts, who decided.
    page.goto(f"{stack.url}/objects/{sent.object_id}")
    page.wait_for_selector(".headline .s-completed")
    calls = page.inner_text("#calls")
    assert "gpt-4o-mini via openai" in calls and "$" in calls
    assert "needs approval" in calls and f"approved by {app.node_id}" in calls
    assert "approve by alice (operator, token) via dashboard" in page.inner_text("#memory")
    shoot(page, "object-agent", full_page=True)
    assert actions_noted(app, sent.object_id)[0]["by"] == "alice"


def test_fork_from_the_browser(stack: Served, page: Any) -> None:
    asking = stack.app.start("asker", "fork me")
    wait_until(lambda: stack.app.get(asking.object_id).status is Status.DORMANT)
    page.goto(f"{stack.url}/objects/{asking.object_id}")
    page.fill("form.fork input[name=at]", "2")
    page.fill("form.fork input[name=new_id]", "forked-copy")
    page.click("#fork")
    page.wait_for_selector(".flash")
    assert "forked as forked-copy" in page.inner_text(".flash")
    page.goto(f"{stack.url}/objects/forked-copy")
    assert f"forked from {asking.object_id} at #2" in page.inner_text("#state")
    wait_until(lambda: stack.app.get("forked-copy").status is Status.DORMANT)
    # the fork waits for its answer as the original did; answering it completes it alone
    page.fill("form.send input[name=payload]", "soup")
    page.click("#send")
    page.wait_for_selector(".headline .s-completed")
    assert stack.app.get("forked-copy").status is Status.COMPLETED
    assert stack.app.get(asking.object_id).status is Status.DORMANT
    assert [n["action"] for n in actions_noted(stack.app, "forked-copy")] == ["fork", "send"]


def test_pause_resume_a_schedule_in_the_browser(stack: Served, page: Any) -> None:
    """The Schedules page from the nav: pause a schedule by clicking, the page shows it
    paused once the worker took the control (no reload), resume it; memory says who."""
    app = stack.app
    app.schedule("digest", "sleeper", 0.0, interval=3600)
    app.queue("mail", concurrency=2, per_key=1)
    app.options(queue="mail", key="user-1").start("sleeper", 3600.0)
    oid = "schedule:digest"
    wait_until(lambda: app.get(oid).status is Status.DORMANT)
    page.click("nav a[href='/schedules']")
    card = page.locator(".schedule[data-schedule='digest']")
    card.wait_for()
    assert "active" in card.locator(".state").inner_text()
    assert "every 3600 s" in card.inner_text()
    card.locator("button[data-action=pause]").click()
    page.wait_for_url(re.compile(r"/schedules$"))
    assert "pause asked" in page.inner_text(".flash")
    page.wait_for_selector(".schedule[data-schedule='digest'] .state-paused")
    shoot(page, "schedules")
    page.locator(".schedule[data-schedule='digest'] button[data-action=resume]").click()
    page.wait_for_url(re.compile(r"/schedules$"))
    page.wait_for_selector(".schedule[data-schedule='digest'] .state-active")
    assert app.schedule_handle("digest").info().state == "active"
    noted = actions_noted(app, oid)
    assert [(n["action"], n["by"]) for n in noted] == [("schedule_pause", "alice"),
                                                       ("schedule_resume", "alice")]
    page.click("nav a[href='/queues']")
    row = page.locator("tr[data-queue='mail']")
    row.wait_for()
    assert row.locator("td").nth(1).inner_text().endswith("/ 2")
    shoot(page, "queues")
