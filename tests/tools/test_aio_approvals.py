"""Approving and rejecting tool calls from an event loop (``app.aio``), against a worker
process, on both stores: the listing, the decisions and the results are the synchronous
ones, awaited."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import perdure
from perdure.llm.scripted import ScriptedReply, ScriptedServer, ScriptedToolCall
from tests.integration.engine_support import kill_process
from tests.tools import support
from tests.tools.support import effects, start_tool_worker

WAIT = 30.0


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def _send(to: str) -> ScriptedReply:
    return ScriptedReply(tool_calls=(
        ScriptedToolCall("send_message", json.dumps({"to": to, "body": "hi"}), "c1"),))


async def _pending(aio: perdure.AsyncApp, object_id: str) -> perdure.PendingApproval:
    """The proposal of ``object_id`` waiting for a person, once there is one."""
    deadline = time.monotonic() + WAIT
    while True:
        found = [p for p in await aio.approvals() if p.object_id == object_id]
        if found or time.monotonic() > deadline:
            assert len(found) == 1, found
            return found[0]
        await asyncio.sleep(0.02)


def test_approve_and_reject_awaited(make_app: Callable[..., perdure.App],
                                    server: ScriptedServer, sink: Path, store_url: str,
                                    key_dir: Path, tmp_path: Path) -> None:
    app = make_app()
    app.agent(name="tool_agent")(support.app.agents["tool_agent"].fn)
    app.client.certified()  # the key folder made here, before the worker reads it
    log = tmp_path / "worker.log"
    proc = start_tool_worker(store_url, key_dir, log, sink)

    async def main() -> tuple[object, object]:
        aio = app.aio
        server.script(_send("bob"), ScriptedReply(text="Sent."))
        yes = await aio.options(object_id="yes").start("tool_agent", server.openai_base_url,
                                                       "greet bob")
        pending = await _pending(aio, "yes")
        assert pending.tool == "send_message"
        decided = await aio.approve("yes", pending.proposal_id)
        assert decided.proposal_id == pending.proposal_id
        with pytest.raises(perdure.ApprovalError):  # one decision per proposal
            await aio.approve("yes", pending.proposal_id)
        approved = await yes.result(timeout=WAIT)

        server.script(_send("eve"), ScriptedReply(text="Understood."))
        no = await aio.options(object_id="no").start("tool_agent", server.openai_base_url,
                                                     "greet eve")
        pending = await _pending(aio, "no")
        await aio.reject("no", pending.proposal_id, reason="not eve")
        rejected = await no.result(timeout=WAIT)
        assert await aio.approvals() == []
        return approved, rejected

    try:
        approved, rejected = asyncio.run(main())
    finally:
        kill_process(proc)
    assert isinstance(approved, dict) and isinstance(rejected, dict), log.read_text()
    assert approved["calls"][0][:2] == ["send_message", "done"]
    assert rejected["calls"][0][:2] == ["send_message", "rejected"]
    assert "not eve" in rejected["calls"][0][2]
    assert [e[1] for e in effects(sink)] == ["bob:hi"]
