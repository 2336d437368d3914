"""An agent whose model proposes tool calls: a policy lets the safe one run, a person
approves the risky one. Needs `pip install 'perdure[llm]'`.

Run it: python examples/approvals.py            (offline: a scripted local model server)
Against a real endpoint: OPENAI_BASE_URL=... OPENAI_API_KEY=... python examples/approvals.py

It starts object a-1 and a worker. The model looks up the weather (low risk: it runs at
once) and proposes an email (high risk: the object goes dormant, no process holds it).
The script then does what a person would do with `perdure approvals` and
`perdure approve a-1 PROPOSAL`, and prints the answer. Run it again: the finished object
answers from memory. `perdure --store sqlite:///approvals.db show a-1` prints every
proposal, the policy's verdict, who approved and the results.
"""

import json
import os
import time
from contextlib import ExitStack

import perdure
from perdure.llm import ChatCompletionsClient, Message

MODEL = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
app = perdure.App(store="sqlite:///approvals.db", key_dir=".perdure-keys")
OUTBOX: list[str] = []


@app.tool(risk="low")
def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"sunny in {city}"


@app.tool(risk="high", constraints=[perdure.OneOf("to", ("team@example.com",))])
def send_email(to: str, body: str, idempotency_key: str) -> str:
    """Send an email (a person approves first; only to the team)."""
    OUTBOX.append(f"{idempotency_key}: {to}: {body}")
    return "sent"


POLICY = perdure.Policy("example", rules=(perdure.Allow({"weather", "send_email"}),))


@app.agent()
async def assistant(run: perdure.Run, base_url: str | None) -> str:
    client = ChatCompletionsClient(base_url=base_url)  # key: OPENAI_API_KEY
    try:
        result = await run.agent(
            client, model=MODEL, tools=app.tools, policy=POLICY,
            messages=[Message.user("Check the weather in Oslo and email it to "
                                   "team@example.com.")])
    finally:
        await client.aclose()
    return result.text


def scripted(request):  # the offline model: weather, then the email, then an answer
    from perdure.llm.scripted import ScriptedReply, ScriptedToolCall

    turn = sum(m.get("role") == "assistant" for m in request.body["messages"])
    if turn == 0:
        return ScriptedReply(tool_calls=(ScriptedToolCall("weather", '{"city": "Oslo"}'),))
    if turn == 1:
        return ScriptedReply(tool_calls=(ScriptedToolCall("send_email", json.dumps(
            {"to": "team@example.com", "body": "Sunny in Oslo."})),))
    return ScriptedReply(text="Done: it is sunny in Oslo and the team knows.")


if __name__ == "__main__":
    with ExitStack() as stack:
        base_url = os.environ.get("OPENAI_BASE_URL")
        if not base_url:
            from perdure.llm.scripted import ScriptedServer

            base_url = stack.enter_context(ScriptedServer(responder=scripted)).openai_base_url
            os.environ.setdefault("OPENAI_API_KEY", "offline")
        with app.background_worker():
            handle = app.options(object_id="a-1").start(assistant, base_url)
            decided: set[str] = set()
            while not handle.info().terminal:
                for item in app.approvals():  # what `perdure approvals` lists
                    if item.proposal_id in decided:
                        continue  # approved; the object has not woken up yet
                    print(f"{item.tool} wants {json.dumps(item.arguments)} "
                          f"({item.reason}); approving {item.proposal_id}")
                    app.approve(item.object_id, item.proposal_id)
                    decided.add(item.proposal_id)
                time.sleep(0.1)
            print(handle.result(timeout=60))
