"""What the other features record, on an object's page and in the inbox, worded by
``perdure.describe`` as ``perdure show`` words it: a question's prompt and choices, the
events an agent emits (in the live stream too), restore reports. Both stores."""

from __future__ import annotations

import html
import json
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from perdure import describe as view
from perdure.core.lifecycle import Status
from tests.web.support import Served, csrf_of, wait_until

pytestmark = pytest.mark.timeout(60)


def test_questions_emits_and_restores(served: Served, tmp_path: Path) -> None:
    app = served.app
    with app.background_worker():
        handle = app.options(object_id="chooser-1").start("chooser", str(tmp_path / "wd"))
        wait_until(lambda: bool(app.get("chooser-1").asking), 30)
        records = app.history("chooser-1")
        with closing(served.login(name="cy")) as client:
            raw = client.get("/objects/chooser-1").text
            assert "<b>logo</b>" not in raw  # escaped
            page = html.unescape(raw)
            assert view.question("Which colour for the <b>logo</b>?", ("red", "blue")) in page
            assert "red" in page and "blue" in page
            assert "<h2>Restores</h2>" in page
            for row in view.restores(records):
                assert row.what.startswith("restore restored") and row.what in page
            emitted = [row.what for row in view.timeline(records) if row.kind == "emitted"]
            assert len(emitted) == 2 and all(line in page for line in emitted)
            inbox = html.unescape(client.get("/inbox").text)
            card = inbox.split('data-object="chooser-1"')[1].split("</div>")[0]
            assert "Which colour for the <b>logo</b>?" in card and "blue" in card

            docs: list[dict[str, Any]] = []
            seen = threading.Event()

            def read() -> None:
                with client.stream("GET", "/stream", params={"id": "chooser-1"}) as events:
                    for line in events.iter_lines():
                        if line.startswith('data: {"seq'):
                            docs.append(json.loads(line[6:]))
                        if line == "event: end":
                            seen.set()
                            return

            reader = threading.Thread(target=read)
            reader.start()
            csrf = csrf_of(raw)
            client.post("/act/send", data={"csrf": csrf, "object_id": "chooser-1",
                                           "event": "pick", "payload": '"blue"'})
            assert handle.result(timeout=30) == "blue"
            reader.join(30)
        assert seen.is_set()
        lines = [d["line"] for d in docs if d["kind"] == "emitted"]
        assert lines == emitted  # the live stream words them as the page and the CLI do
        assert [d["seq"] for d in docs] == list(range(1, len(docs) + 1))
        assert app.get("chooser-1").status is Status.COMPLETED
