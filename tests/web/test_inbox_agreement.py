"""What waits for a person is one list wherever it is read: ``app.questions()`` /
``app.approvals()`` / parked objects, ``perdure questions`` / ``perdure approvals`` /
``perdure ls --status parked``, and the dashboard's inbox agree, for every kind: a
question with a prompt (the second one asked on the same event), a wait without a prompt,
a tool call waiting for approval, a parked object. Both stores."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from click.testing import CliRunner

from perdure.cli import cli
from perdure.core.lifecycle import Status
from perdure.llm.scripted import ScriptedServer
from tests.web import agents
from tests.web.support import Served, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def model() -> Iterator[ScriptedServer]:
    """The scripted model server of the ``assistant`` agent."""
    with ScriptedServer(responder=agents.scripted) as server:
        yield server


def _cards(html: str, kind: str) -> set[str]:
    if kind == "parked":
        return set(re.findall(r'class="card parked"><p><a href="/objects/([^"]+)"', html))
    return set(re.findall(rf'class="card {kind}" data-object="([^"]+)"', html))


def test_every_reader_lists_the_same_waiting_objects(
        served: Served, model: ScriptedServer, store_url: str, key_dir: Path) -> None:
    app = served.app
    with app.background_worker():
        asked = app.start("twice").object_id
        plain = app.start("asker", "lunch").object_id  # run.wait_for("answer"), no prompt
        proposed = app.start("assistant", model.openai_base_url).object_id
        parked = app.start("fickle").object_id
        wait_until(lambda: app.get(parked).status is Status.DORMANT)
        app.send(parked, "go")
        wait_until(lambda: app.get(parked).status is Status.PARKED)
        wait_until(lambda: [q.prompt for q in app.get(asked).asking] == ["first?"])
        app.send(asked, "answer", "yes")
        wait_until(lambda: [q.prompt for q in app.get(asked).asking] == ["second?"])
        wait_until(lambda: any(p.object_id == proposed for p in app.approvals()), 30)
        wait_until(lambda: bool(app.get(plain).asking))

        api = {"question": {(q.object_id, q.event) for q in app.questions()},
               "approval": {p.object_id for p in app.approvals()},
               "parked": {i.object_id for i in app.list(status="parked")}}
        assert api == {"question": {(asked, "answer"), (plain, "answer")},
                       "approval": {proposed}, "parked": {parked}}

        runner = CliRunner()
        base = ["--store", store_url, "--key-dir", str(key_dir)]

        def cli_json(*args: str) -> list[dict[str, object]]:
            done = runner.invoke(cli, [*base, *args, "--json"])
            assert done.exit_code == 0, done.output
            return list(json.loads(done.output))

        assert {(q["object_id"], q["event"]) for q in cli_json("questions")} == \
            api["question"]
        assert {p["object_id"] for p in cli_json("approvals")} == api["approval"]
        assert {o["object_id"] for o in cli_json("ls", "--status", "parked")} == \
            api["parked"]
        text = runner.invoke(cli, [*base, "questions"]).output
        assert f"{plain}  asker" in text and "waits for event 'answer'" in text
        assert "asks 'second?'" in text and "first?" not in text
        assert "also 1 tool call(s) wait for approval: perdure approvals" in text
        assert "also 1 parked object(s) wait for a retry" in text

        with closing(served.login(name="ann")) as client:
            inbox = client.get("/inbox").text
        assert {(oid, "answer") for oid in _cards(inbox, "question")} == api["question"]
        assert _cards(inbox, "approval") == api["approval"]
        assert _cards(inbox, "parked") == api["parked"]
        assert "second?" in inbox
