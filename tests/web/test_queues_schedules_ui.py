"""The Queues and Schedules pages over HTTP, on both stores: what each shows (limits,
slots held of the cap, the keys holding most, ready and dormant counts; a schedule's
spec, state, fires and runs linked to their pages), the schedule controls an operator
posts (noted in the schedule's memory, then taken by a worker), refused for a viewer,
without CSRF or unconfirmed, and hostile names rendered inert."""

from __future__ import annotations

import re
import time
from contextlib import closing
from html import escape
from urllib.parse import quote

import pytest

from perdure.core.lifecycle import Status
from perdure.core.schedules import schedule_id
from tests.web.support import Served, actions_noted, csrf_of, wait_until

pytestmark = pytest.mark.timeout(120)

EVIL = "<script>alert(1)</script>"
EVIL_KEY = "<img src=x onerror=alert(2)>"


def _inert(html: str) -> None:
    """No markup a hostile name carried made it into the page as markup."""
    assert "<script>alert" not in html and "<img src=x" not in html
    assert escape(EVIL) in html or escape(EVIL_KEY) in html


def test_the_queues_page_shows_limits_slots_keys_and_counts(served: Served) -> None:
    app = served.app
    name = f"mail {EVIL}"
    app.queue(name, concurrency=4, per_key=2, worker_concurrency=3,
              limiter={"limit": 9, "period": 60})
    app.queue("quiet")
    starter = app.options(queue=name, key=EVIL_KEY)
    for _ in range(3):
        starter.start("sleeper", 3600.0)
    app.options(queue=name, key="user-1").start("sleeper", 3600.0)
    app.options(queue=name).start("sleeper", 3600.0)
    app.options(queue=name, key="later", delay=3600).start("sleeper", 3600.0)
    # A node holds what the queue lets it: its slots, as a worker's claim takes them.
    now = time.time()
    held = app.store.claim("test-node/w1", now, now + 60, 10)
    assert len(held) == 3  # two of the hostile key (per key 2), one more: per worker 3
    app.options(queue="quiet").start("sleeper", 3600.0)  # declared in the store by it
    with closing(served.login("viewer", "vera")) as client:
        page = client.get("/queues")
    assert page.status_code == 200
    html = page.text
    _inert(html)
    row = re.search(r'<tr data-queue="mail &lt;script&gt;.*?</tr>', html)
    assert row is not None, html
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(0))
    assert cells[1] == "3 / 4" and cells[2] == "2" and cells[3] == "3"
    assert cells[4] == "9 per 60s (3 in it now)" and cells[5] == "no"
    holders = cells[6]
    assert holders.startswith(f"<code>{escape(EVIL_KEY)}</code>: 2")
    assert cells[7] == "2" and cells[8] == "1"  # ready: two; dormant: the delayed one
    assert 'data-queue="quiet"' in html
    assert '<a href="/queues" class="on">Queues</a>' in html
    assert "<form" not in html.split('id="queues"')[1].split("</section>")[0]


def test_schedule_controls_are_noted_and_taken(served: Served) -> None:
    app = served.app
    name = f"nightly{EVIL}"
    app.schedule(name, "sleeper", 0.0, interval=3600)
    oid = schedule_id(name)
    with app.background_worker():
        wait_until(lambda: app.get(oid).status is Status.DORMANT)
        with closing(served.login("operator", "alice")) as client:
            page = client.get("/schedules")
            assert page.status_code == 200
            _inert(page.text)
            assert "every 3600 s, agent sleeper" in page.text
            csrf = csrf_of(page.text)
            for action in ("pause", "trigger"):
                done = client.post(f"/schedules/{action}", data={"csrf": csrf, "name": name})
                assert done.status_code == 303 and done.headers["location"] == "/schedules"
            wait_until(lambda: app.schedule_handle(name).info().state == "paused")
            wait_until(lambda: len(app.list(parent=oid)) == 1)
            run = app.list(parent=oid)[0]
            page = client.get("/schedules")
            assert "pause asked" not in page.text  # the flash was for the redirect
            assert f'href="/objects/{quote(run.object_id, safe="")}"' in page.text
            assert 'data-action="resume"' in page.text and 'data-action="pause"' not in page.text
            done = client.post("/schedules/resume", data={"csrf": csrf, "name": name})
            assert done.status_code == 303
            wait_until(lambda: app.schedule_handle(name).info().state == "active")
            # Delete asks for its box to be ticked; without it nothing is sent.
            done = client.post("/schedules/delete", data={"csrf": csrf, "name": name})
            assert done.status_code == 303
            assert "tick the box" in client.get("/schedules").text
            assert app.schedule_handle(name).info().state == "active"
            done = client.post("/schedules/delete", data={"csrf": csrf, "name": name,
                                                          "confirm": "yes"})
            assert done.status_code == 303
            wait_until(lambda: app.get(oid).status is Status.COMPLETED)
            page = client.get("/schedules")
            assert "state-deleted" in page.text and 'data-action="pause"' not in page.text
            # A deleted schedule takes no control: refused, nothing written.
            before = app.store.get(oid)
            client.post("/schedules/trigger", data={"csrf": csrf, "name": name})
            assert "was deleted" in client.get("/schedules").text
            assert app.store.get(oid) == before
    noted = actions_noted(app, oid)
    assert [n["action"] for n in noted] == ["schedule_pause", "schedule_trigger",
                                            "schedule_resume", "schedule_delete"]
    assert {(n["by"], n["role"], n["schedule"]) for n in noted} == {
        ("alice", "operator", name)}
    assert app.verify(oid).ok
    assert [r.verdict for r in app.replay_check([oid])] == ["compatible"]


def test_schedule_controls_are_refused_to_viewers_and_without_csrf(served: Served) -> None:
    app = served.app
    app.schedule("hourly", "sleeper", 0.0, interval=3600)
    oid = schedule_id("hourly")
    before = app.store.pending_events(oid)
    with closing(served.login("viewer", "vera")) as viewer:
        page = viewer.get("/schedules")
        assert page.status_code == 200 and 'data-schedule="hourly"' in page.text
        assert "/schedules/pause" not in page.text  # no forms for a viewer
        refused = viewer.post("/schedules/pause", data={"csrf": csrf_of(page.text),
                                                        "name": "hourly"})
        assert refused.status_code == 403
    with closing(served.login("operator", "alice")) as operator:
        operator.get("/schedules")
        refused = operator.post("/schedules/pause", data={"name": "hourly"})
        assert refused.status_code == 403
        page = operator.get("/schedules")
        unknown = operator.post("/schedules/frobnicate", data={
            "csrf": csrf_of(page.text), "name": "hourly"})
        assert unknown.status_code == 303
        assert "unknown schedule action" in operator.get("/schedules").text
        missing = operator.post("/schedules/pause", data={
            "csrf": csrf_of(page.text), "name": "nobody"})
        assert missing.status_code == 303
        assert "no schedule" in operator.get("/schedules").text
    assert app.store.pending_events(oid) == before
    assert app.store.pending_events(schedule_id("nobody")) == []


def test_the_queues_page_shows_model_quotas_and_their_windows(served: Served) -> None:
    """A model quota and its window: tokens used and reserved of the limit, requests, the
    rate in force; a hostile model name rendered inert."""
    from perdure import ModelQuota

    store = served.app.store
    now = time.time()
    store.declare_model_quota(ModelQuota("openai", f"gpt {EVIL}", tokens_per_minute=1000,
                                         requests_per_minute=10), now)
    grant = store.reserve_quota("openai", f"gpt {EVIL}", 300, "q-1", "q-1:call", now)
    assert grant.granted and grant.ticket is not None
    with closing(served.login("viewer", "vera")) as client:
        html = client.get("/queues").text
    _inert(html)
    row = re.search(r'<tr data-quota="openai/gpt &lt;script&gt;.*?</tr>', html)
    assert row is not None, html
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(0))
    assert cells[2] == "300 of 1000 per minute (0 used, 300 reserved)"
    assert cells[3] == "1 of 10 per minute" and cells[4] == "100%" and cells[5] == "0"
