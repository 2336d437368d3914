"""Agents the dashboard tests run: the ``--app`` of their worker processes."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import openai  # noqa: F401 - imported now, not on the worker's loop at its first call

import perdure
from perdure.llm import ChatCompletionsClient, Message, Price, PriceTable
from perdure.llm.scripted import RecordedRequest, ScriptedReply, ScriptedToolCall

app = perdure.App(prices=PriceTable({"gpt-4o-mini": Price("0.15", "0.60")}))


@app.agent()
def asker(run: perdure.SyncRun, topic: str) -> dict[str, Any]:
    """Asks a person (waits for the event ``answer``), then completes with the answer."""
    run.progress(asking=topic)
    answer = run.wait_for("answer")
    return {"topic": topic, "answer": answer}


@app.agent()
async def twice(run: perdure.Run) -> list[Any]:
    """Asks twice, both answered by the event ``answer``."""
    return [await run.wait_for("answer", prompt="first?"),
            await run.wait_for("answer", prompt="second?")]


@app.agent()
def sleeper(run: perdure.SyncRun, seconds: float) -> str:
    """Sleeps, released, then completes: something to cancel."""
    run.sleep(seconds)
    return "slept"


@app.agent()
def parent(run: perdure.SyncRun) -> list[Any]:
    """Delegates two askers and joins them: a lineage to draw."""
    kids = [run.delegate(asker, f"part {n}") for n in range(2)]
    return run.join(*kids)


_SEEN: set[str] = set()


def first_way() -> int:
    """The step the first run of ``fickle`` takes."""
    return 1


def second_way() -> int:
    """The step its replays take instead: memory says otherwise, so the object parks."""
    return 2


@app.agent()
def fickle(run: perdure.SyncRun) -> int:
    """Changes its mind on replay (in one process): parked for non-determinism."""
    fresh = run.object_id not in _SEEN
    _SEEN.add(run.object_id)
    got = run.step(first_way if fresh else second_way)
    run.wait_for("go")
    return got


# -- an agent whose model proposes tool calls, one of them risky -------------------------

OUTBOX_ENV = "WEB_TEST_OUTBOX"  # where send_email writes (a file; one line per email)
TEAM = "team@example.com"


@app.tool(risk="low")
def weather(city: str) -> str:
    """Today's weather in a city.

    Args:
        city: the city's name
    """
    return f"sunny in {city}"


@app.tool(risk="high", constraints=[perdure.OneOf("to", (TEAM,))])
def send_email(to: str, body: str, idempotency_key: str) -> str:
    """Send an email (a person approves first; only to the team).

    Args:
        to: the address
        body: what the email says
    """
    with open(os.environ[OUTBOX_ENV], "a", encoding="utf-8") as out:
        out.write(json.dumps({"to": to, "body": body, "key": idempotency_key}) + "\n")
    return "sent"


POLICY = perdure.Policy("web-test", rules=(perdure.Allow({"weather", "send_email"}),))
ONLY_BOSS = perdure.Policy("boss-approves", rules=POLICY.rules,
                           approvers={"high": {"the-boss"}})


@app.agent()
async def assistant(run: perdure.Run, base_url: str, boss_only: bool = False,
                    ttl: float | None = None) -> str:
    """Asks the model to check the weather and email the team: the email waits for a
    person (with ``boss_only``, only the identity ``the-boss`` may decide; with ``ttl``,
    for that many seconds)."""
    client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "offline")
    try:
        result = await run.agent(
            client, model="gpt-4o-mini", tools=[weather, send_email],
            policy=dataclasses.replace(ONLY_BOSS if boss_only else POLICY, approval_ttl=ttl),
            messages=[Message.user(f"Check the weather in Oslo and email it to {TEAM}.")])
    finally:
        await client.aclose()
    return result.text


def scripted(request: RecordedRequest) -> ScriptedReply:
    """The model of ``assistant``: the weather, then the email, then an answer."""
    turn = sum(m.get("role") == "assistant" for m in request.body["messages"])
    if turn == 0:
        return ScriptedReply(tool_calls=(ScriptedToolCall("weather", '{"city": "Oslo"}'),),
                             input_tokens=120, output_tokens=12)
    if turn == 1:
        return ScriptedReply(tool_calls=(ScriptedToolCall("send_email", json.dumps(
            {"to": TEAM, "body": "Sunny in Oslo."})),), input_tokens=160, output_tokens=30)
    last = request.body["messages"][-1]
    return ScriptedReply(text=f"Done: {str(last.get('content'))[:200]}", input_tokens=200,
                         output_tokens=15)


def outbox(path: str) -> list[dict[str, Any]]:
    """The emails ``send_email`` sent, from its file."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


# -- what other features record: emitted events, questions with choices, restores ------


@app.agent()
async def chooser(run: perdure.Run, workdir: str) -> Any:
    """Holds a working directory across a sleep (a restore report), emits its progress,
    then asks which colour, offering two."""
    from perdure.resources import WorkingDirectory

    await run.resource("wd", WorkingDirectory(workdir))
    await run.emit("progress", {"done": 1, "of": 2})
    await run.sleep(0.05)
    await run.emit("progress", {"done": 2, "of": 2})
    return await run.wait_for("pick", prompt="Which colour for the <b>logo</b>?",
                              choices=("red", "blue"))


@app.agent()
async def ticker(run: perdure.Run, ticks: int) -> dict[str, Any]:
    """Emits ``ticks`` events, waits for the event ``go``, emits one more and ends: a
    stream to follow, break off and pick up again."""
    for n in range(ticks):
        await run.emit("tick", {"n": n})
    go = await run.wait_for("go")
    await run.emit("done", {"go": go})
    return {"ticks": ticks, "go": go}


@app.define_query(agent="ticker")
def ticks(view: perdure.MemoryView, at_least: int = 0) -> list[Any]:
    """The ticks emitted so far (none unless at least ``at_least``)."""
    found = view.emitted("tick")
    return found if len(found) >= at_least else []


#: A file each effect of the cart's steps appends a line to (set by the update tests).
EFFECTS_ENV = "PERDURE_TEST_UPDATE_EFFECTS"
#: While this file exists, the step ``hold`` does not return (a handler caught mid-way).
HOLD_ENV = "PERDURE_TEST_UPDATE_HOLD"


def reserve(item: str) -> str:
    """An effect of the ``add_item`` update: one line in the effects file each time it runs."""
    with open(os.environ[EFFECTS_ENV], "a", encoding="utf-8") as sink:
        sink.write(f"reserve {item}\n")
    return item


def hold(item: str) -> str:
    """A step that waits while the hold file exists (a worker is killed meanwhile)."""
    with open(os.environ[EFFECTS_ENV], "a", encoding="utf-8") as sink:
        sink.write(f"hold {item}\n")
    flag = os.environ.get(HOLD_ENV, "")
    while flag and os.path.exists(flag):
        time.sleep(0.02)
    return item


@app.agent()
async def cart(run: perdure.Run, owner: str) -> dict[str, Any]:
    """Takes ``add_item`` updates while it waits for ``checkout``."""
    items: list[str] = []

    async def add_item(item: str) -> int:
        await run.step(reserve, item)
        if item.startswith("slow"):
            await run.step(hold, item)
        if item == "boom":
            raise RuntimeError("no room for boom")
        items.append(item)
        return len(items)

    run.on_update("add_item", add_item)
    paid = await run.wait_for("checkout")
    return {"owner": owner, "items": items, "paid": paid}


@app.agent()
async def gathered_cart(run: perdure.Run, owner: str) -> list[Any]:
    """Has an ``add_item`` handler but waits only inside a gather, which takes none."""
    run.on_update("add_item", lambda item: item)
    return await run.gather(run.wait_for("left"), run.wait_for("right"))


@app.define_update(gathered_cart, name="add_item")
def check_gathered_item(item: Any) -> None:
    """Pure: any item is fine; the wait it reaches is what refuses it."""


@app.define_update(cart, name="add_item")
def check_item(item: Any) -> None:
    """Pure: an item is a non-empty name."""
    if not isinstance(item, str) or not item:
        raise ValueError("an item is a non-empty name")
