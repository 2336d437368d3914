"""An agent that asks a model twice, durably: each call recorded, streamed and priced.

Run it: python examples/model_call.py           (offline: a scripted local model server)
Against a real endpoint:
    OPENAI_BASE_URL=https://api.openai.com/v1 OPENAI_API_KEY=sk-... \
    OPENAI_MODEL=gpt-4o-mini python examples/model_call.py
(any OpenAI-compatible server: vLLM, llama.cpp server, Ollama, a LiteLLM proxy).

Run it again: it finds the finished object m-1 and prints the same answer without asking
the model: the replies are in memory. `perdure --store sqlite:///model_call.db show m-1`
prints each call, its tokens and cost, and the ledger. Needs `pip install 'perdure[llm]'`.
"""

import os
from contextlib import ExitStack

import perdure
from perdure.describe import usage
from perdure.llm import ChatCompletionsClient, Message, Price, PriceTable

MODEL = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
# Prices are yours to set (dollars per million tokens in / out); these are illustrative.
app = perdure.App(store="sqlite:///model_call.db", key_dir=".perdure-keys",
                  prices=PriceTable({MODEL: Price("0.15", "0.60")}))


@app.agent()
async def explain(run: perdure.Run, topic: str, base_url: str | None) -> dict:
    # The key comes from OPENAI_API_KEY in the worker's environment, never from memory.
    client = ChatCompletionsClient(base_url=base_url)
    messages = [Message.system("Be brief."), Message.user(f"Explain {topic} in two sentences.")]
    try:
        first = await run.model(client, model=MODEL, messages=messages, stream=True,
                                name="explain")       # a worker killed mid-stream: continued
        messages += [first.message(), Message.user("Now give one example.")]
        second = await run.model(client, model=MODEL, messages=messages, stream=True,
                                 name="example")      # each message is stored once
    finally:
        await client.aclose()
    return {"explanation": first.text, "example": second.text}


if __name__ == "__main__":
    with ExitStack() as stack:
        base_url = os.environ.get("OPENAI_BASE_URL")
        if not base_url:  # offline: the scripted server echoes the question back
            from perdure.llm.scripted import ScriptedServer

            base_url = stack.enter_context(ScriptedServer()).openai_base_url
            os.environ.setdefault("OPENAI_API_KEY", "offline")  # it takes any key
        with app.background_worker():
            handle = app.options(object_id="m-1").start(explain, "durable execution", base_url)
            print(handle.result(timeout=120))
        print(usage(app.usage("m-1")))
