"""Notes of who acted, in memory, on both stores: folded before a cancel ends the object
(a paused one too); refused at the sender whose key the workers do not trust, and
refused into memory when sealed by such a key all the same."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import perdure
from perdure.core.codec import MAX_DEPTH, encode
from perdure.core.lifecycle import Status
from perdure.core.trust import seal_event
from perdure.engine.actions import ACTION_NOTE, REFINE_EVENT
from perdure.web import _actions as actions
from perdure.web._auth import Principal
from tests.web.agents import app as agents_app
from tests.web.support import actions_noted, wait_until

pytestmark = pytest.mark.timeout(120)

ALICE = Principal("alice", "operator", "password")


def _app(store_url: str, key_dir: Path) -> perdure.App:
    return agents_app.with_settings(store=store_url, key_dir=key_dir, lease_seconds=2.0,
                                    poll_interval=0.01)


def test_pause_then_cancel_is_noted_before_the_end(store_url: str, key_dir: Path) -> None:
    app = _app(store_url, key_dir)
    try:
        with app.background_worker():
            oid = app.start("sleeper", 3600.0).object_id
            wait_until(lambda: app.get(oid).status is Status.DORMANT)
            actions.pause(app, ALICE, oid)
            actions.cancel(app, ALICE, oid)
            wait_until(lambda: app.get(oid).status is Status.CANCELLED)
        noted = actions_noted(app, oid)
        assert [n["action"] for n in noted] == ["pause", "cancel"]
        assert {(n["by"], n["role"], n["method"], n["via"]) for n in noted} == {
            ("alice", "operator", "password", "dashboard")}
        history = app.history(oid)
        assert history[-1].kind == "terminated" and history[-1].body["outcome"] == "cancelled"
        assert app.verify(oid).ok
        # A note in memory is none of the agent's doing: its code still replays it.
        ask = app.start("asker", "replayed").object_id
        with app.background_worker():
            wait_until(lambda: app.get(ask).status is Status.DORMANT)
            actions.send(app, ALICE, ask, "answer", "yes")
            app.handle(ask).result(timeout=20)
        assert [r.verdict for r in app.replay_check([ask, oid])] == ["compatible"] * 2
        # An ended object takes no note and no action.
        with pytest.raises(perdure.ObjectTerminatedError):
            actions.cancel(app, ALICE, oid)
    finally:
        app.close()


def test_a_note_from_an_untrusted_key_is_refused(store_url: str, key_dir: Path,
                                                 tmp_path: Path) -> None:
    app = _app(store_url, key_dir)
    stranger = perdure.App(store=store_url, key_dir=tmp_path / "stranger-keys")
    try:
        with app.background_worker():
            oid = app.start("asker", "who").object_id
            wait_until(lambda: app.get(oid).status is Status.DORMANT)
            eve = Principal("eve", "operator", "token")
            with pytest.raises(perdure.ConfigurationError,
                               match="its workers would refuse what this key signs"):
                actions.record_action(stranger, oid, eve, "send", event="answer")
            assert app.store.pending_events(oid) == []  # refused at the sender: nothing sent
            # Sealed past that check (an older sender): the workers refuse it into memory.
            data = encode({ACTION_NOTE: {"action": "send", "by": "eve"}},
                          what="action note", max_depth=MAX_DEPTH)
            signer = stranger.client.certified()
            seal, _ = seal_event(signer.sign, signer.node_id, oid, REFINE_EVENT, data, None,
                                 os.urandom(12).hex())
            app.store.send(oid, REFINE_EVENT, data, None, time.time(), seal)
            wait_until(lambda: any(r.kind == "event_refused" for r in app.history(oid)))
        assert actions_noted(app, oid) == []
        assert app.get(oid).status is Status.DORMANT
    finally:
        stranger.close()
        app.close()
