"""What a new user sees first in the dashboard, in a real browser (Debian's Chromium):
a completed object's result; the error colour only on what went wrong; a cut value
marked with an ellipsis; a question's choices as buttons; the page usable 420 px wide
(no horizontal overflow of the page, no table cell squeezed to a few letters)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perdure.core.lifecycle import Status
from tests.web.support import Served, serve, start_worker, stop_serving, stop_worker, wait_until

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
SHOTS = Path(os.environ.get("PERDURE_TEST_SHOTS", "/tmp/perdure-ui-shots"))

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason="no system chromium (apt-get install chromium; .ci/run does)"),
]


@pytest.fixture
def stack(sqlite_url: str, key_dir: Path, tmp_path: Path) -> Iterator[Served]:
    """A dashboard and a worker process on one SQLite store."""
    served = serve(sqlite_url, key_dir)
    worker = start_worker(sqlite_url, key_dir, tmp_path / "worker.log")
    try:
        yield served
    finally:
        stop_worker(worker)
        stop_serving(served)


def _browser(stack: Served, width: int) -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            tab = browser.new_context(viewport={"width": width, "height": 860}).new_page()
            tab.set_default_timeout(20_000)
            tab.goto(stack.url + "/login")
            tab.fill("input[name=name]", "alice")
            tab.fill("input[name=secret]", stack.tokens["operator"])
            tab.click("#login")
            tab.wait_for_url(stack.url + "/")
            yield tab
        finally:
            browser.close()


def _chosen(stack: Served, tmp_path: Path, tab: Any) -> str:
    """A ``chooser`` object answered by clicking its ``blue`` button in the inbox; its id."""
    handle = stack.app.options(object_id="choose-1").start("chooser", str(tmp_path / "wd"))
    wait_until(lambda: stack.app.get(handle.object_id).status == Status.DORMANT
               and stack.app.get(handle.object_id).waiting_event == "pick", timeout=30)
    tab.goto(stack.url + "/inbox")
    card = tab.locator(".card.question[data-object='choose-1']")
    assert card.locator("input[name=payload]").count() == 0  # no free text: its choices
    assert card.locator("button.choice").all_inner_texts() == ["red", "blue"]
    tab.goto(stack.url + "/objects/choose-1")
    assert tab.input_value("form.send input[name=event]") == "pick"
    tab.goto(stack.url + "/inbox")
    card.locator("button.choice", has_text="blue").click()
    assert handle.result(timeout=30) == "blue"
    return handle.object_id


def test_result_colours_choices_and_cuts(stack: Served, tmp_path: Path) -> None:
    """The answered object shows its result; its ordinary rows (instantiated, sleep)
    are not in the error colour; a long argument is cut with an ellipsis."""
    for tab in _browser(stack, 1280):
        oid = _chosen(stack, tmp_path, tab)
        tab.goto(f"{stack.url}/objects/{oid}")
        assert tab.inner_text("#result").strip() == '"blue"'
        colour = "tr.k-{} td:nth-child(5)"
        for kind in ("instantiated", "sleep_until", "emitted"):
            cells = tab.locator(colour.format(kind))
            for i in range(cells.count()):
                assert cells.nth(i).evaluate("e => getComputedStyle(e).color") != \
                    "rgb(138, 28, 28)", kind
        assert tab.locator("tr.trouble").count() == 0

        stack.app.options(object_id="ask-long").start("asker", "x" * 3000)
        tab.goto(f"{stack.url}/objects/ask-long")
        args = tab.locator("table.kv tr", has_text="arguments").first.inner_text()
        assert args.rstrip().endswith("…") and len(args) < 2100
        SHOTS.mkdir(parents=True, exist_ok=True)
        tab.goto(f"{stack.url}/objects/{oid}")
        tab.screenshot(path=str(SHOTS / "object-completed.png"), full_page=True)


NARROW = """() => {
  const doc = document.documentElement;
  const squeezed = [...document.querySelectorAll('td, th')]
    .filter(c => c.offsetParent !== null && c.innerText.trim().length > 3)
    .filter(c => c.getBoundingClientRect().width < 36)
    .map(c => c.innerText.slice(0, 30));
  return {overflow: doc.scrollWidth - window.innerWidth, squeezed};
}"""


def test_a_phone_wide_page_stays_usable(stack: Served, tmp_path: Path) -> None:
    """At 420 px every page fits the screen's width (a wide table scrolls in its own
    box) and no cell holding a word is squeezed narrower than about four letters."""
    for tab in _browser(stack, 420):
        oid = _chosen(stack, tmp_path, tab)
        SHOTS.mkdir(parents=True, exist_ok=True)
        for name, path in (("overview", "/"), ("objects", "/objects"), ("inbox", "/inbox"),
                           ("nodes", "/nodes"), ("object", f"/objects/{oid}")):
            tab.goto(stack.url + path)
            tab.screenshot(path=str(SHOTS / f"narrow-{name}.png"), full_page=True)
            found = tab.evaluate(NARROW)
            assert found["overflow"] <= 0, (name, found)
            assert found["squeezed"] == [], (name, found)
