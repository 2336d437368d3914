"""The Alerts page over HTTP, on both stores: firing alerts, then recently resolved ones,
read-only for a viewer, notifications for people left out, and a hostile summary or
subject rendered inert."""

from __future__ import annotations

import time
from contextlib import closing
from html import escape

import pytest

from tests.web.support import Served

pytestmark = pytest.mark.timeout(120)

EVIL = "<script>alert(1)</script>"


def test_the_alerts_page_lists_firing_then_resolved(served: Served) -> None:
    store = served.app.store
    now = time.time()
    store.fire_alert("parked", f"obj {EVIL}", f"parked: {EVIL}", "node-a", now)
    store.fire_alert("few_workers", "nodes", "1 live node(s), fewer than 2", "node-b", now)
    store.resolve_alert("few_workers", "nodes", now + 1)
    store.fire_alert("notify.question", "o/3", "asks: ship it?", "node-a", now)
    with closing(served.login("viewer", "vera")) as client:
        page = client.get("/alerts")
        overview = client.get("/")
    assert page.status_code == 200
    html = page.text
    assert "<script>alert" not in html and escape(f"parked: {EVIL}") in html
    firing, resolved = html.split("Recently resolved")
    assert "Firing (1)" in firing and "parked" in firing and "few_workers" not in firing
    assert "few_workers" in resolved and "fewer than 2" in resolved
    assert "ship it?" not in html
    assert "<form" not in html.split("</nav>")[1]  # nothing to act on: read-only
    assert 'href="/alerts"' in overview.text
