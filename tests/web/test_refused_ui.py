"""Events that do not count, seen where the person who sent them looks, in a real
browser (Debian's Chromium): an event the workers refused is on the object's page and
on its card in the inbox, with the reason; a dashboard whose key the object's workers
would refuse says so at once, shows no "sent", and writes nothing."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.core.lifecycle import Status
from perdure.core.trust import seal_event
from tests.web.support import Served, serve, start_worker, stop_serving, stop_worker, wait_until

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason="no system chromium (apt-get install chromium; .ci/run does)"),
]


@pytest.fixture
def stack(sqlite_url: str, key_dir: Path, tmp_path: Path) -> Iterator[Served]:
    """A dashboard and a worker process on one SQLite store, with one key folder."""
    served = serve(sqlite_url, key_dir)
    worker = start_worker(sqlite_url, key_dir, tmp_path / "worker.log")
    try:
        yield served
    finally:
        stop_worker(worker)
        stop_serving(served)


def _browser(served: Served) -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            tab = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
            tab.set_default_timeout(20_000)
            tab.goto(served.url + "/login")
            tab.fill("input[name=name]", "alice")
            tab.fill("input[name=secret]", served.tokens["operator"])
            tab.click("#login")
            tab.wait_for_url(served.url + "/")
            yield tab
        finally:
            browser.close()


def _waiting(served: Served, object_id: str) -> None:
    """Start an ``asker`` as ``object_id`` and wait until it waits for ``answer``."""
    served.app.options(object_id=object_id).start("asker", "refusals")
    wait_until(lambda: served.app.get(object_id).status is Status.DORMANT
               and served.app.get(object_id).waiting_event == "answer", timeout=30)


def _inbox_rows(store_path: Path, object_id: str) -> int:
    with sqlite3.connect(store_path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM inbox WHERE object_id = ?",
                                (object_id,)).fetchone()[0])


def test_a_refused_answer_is_on_the_page_and_in_the_inbox(stack: Served, sqlite_url: str,
                                                           tmp_path: Path) -> None:
    """An answer sealed by a key of another cluster (sent past the sender's own check,
    as an older client would) is refused by the worker; the object's page and its card
    in the inbox say so, with the reason, while it still waits."""
    _waiting(stack, "asks-1")
    stranger = perdure.App(store=sqlite_url, key_dir=tmp_path / "stranger-keys")
    try:
        signer = stranger.client.certified()
        data = b'"yes"'
        seal, _ = seal_event(signer.sign, signer.node_id, "asks-1", "answer", data, None,
                             os.urandom(12).hex())
        stack.app.store.send("asks-1", "answer", data, None, time.time(), seal)
    finally:
        stranger.close()
    wait_until(lambda: any(r.kind == "event_refused" for r in stack.app.history("asks-1")),
               timeout=30)
    assert stack.app.get("asks-1").status is Status.DORMANT
    for tab in _browser(stack):
        tab.goto(stack.url + "/objects/asks-1")
        refused = tab.locator("#refused p.refused")
        assert refused.count() == 1
        text = refused.inner_text()
        assert "refused event 'answer'" in text
        assert "is not certified by a root this node trusts" in text
        row = tab.locator("table.timeline tr.k-event_refused")
        assert "trouble" in (row.get_attribute("class") or "")
        tab.goto(stack.url + "/inbox")
        card = tab.locator(".card.question[data-object='asks-1']")
        assert "refused event 'answer'" in card.locator("p.refused").inner_text()
        assert "is not certified by a root this node trusts" in card.inner_text()


def test_a_dashboard_with_a_foreign_key_says_so_and_writes_nothing(
        stack: Served, sqlite_url: str, tmp_path: Path) -> None:
    """A second dashboard on the same store whose key folder holds a root of its own:
    its Answer and Send event show an error naming what to do, never "sent", and the
    object's inbox stays empty."""
    _waiting(stack, "asks-2")
    foreign = serve(sqlite_url, tmp_path / "foreign-keys")
    try:
        for tab in _browser(foreign):
            tab.goto(foreign.url + "/inbox")
            card = tab.locator(".card.question[data-object='asks-2']")
            card.locator("input[name=payload]").fill("yes")
            card.locator("button.answer-btn").click()
            tab.wait_for_url(foreign.url + "/inbox")
            error = tab.locator("p.error").first.inner_text()
            assert "its workers would refuse what this key signs" in error
            assert "--key-dir" in error
            assert tab.locator("p.flash").count() == 0
            tab.goto(foreign.url + "/objects/asks-2")
            tab.fill("form.send input[name=payload]", "yes")
            tab.click("#send")
            tab.wait_for_url(foreign.url + "/objects/asks-2")
            assert "its workers would refuse" in tab.locator("p.error").first.inner_text()
            assert tab.locator("p.flash").count() == 0
    finally:
        stop_serving(foreign)
    assert _inbox_rows(Path(sqlite_url.removeprefix("sqlite:///")), "asks-2") == 0
    info = stack.app.get("asks-2")
    assert info.status is Status.DORMANT and info.waiting_event == "answer"
    assert not any(r.kind == "event_refused" for r in stack.app.history("asks-2"))
