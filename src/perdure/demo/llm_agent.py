"""The ``perdure demo --llm`` agent: a research brief written in three streamed model calls.

The agent asks a model for an outline, then a draft (the long, slow stream the demo
kills mid-way), then a one-line summary: a multi-turn conversation where each reply is
appended to the next request. Every call is ``run.model(..., stream=True)``, so each is
recorded in memory, its stream journaled in batches, and a call cut short by a dead
worker is continued from the salvaged text on the next worker.

Offline, the model is the scripted local server (``conversation`` answers it: the
outline, a draft streamed slowly, the summary, and, asked to continue, exactly the rest
of the draft). With ``OPENAI_BASE_URL`` set the same agent asks that endpoint instead,
with the key in ``OPENAI_API_KEY`` (the key is read by the worker from its environment
and never enters memory).

``perdure.demo.llm_agent:app`` is the App for worker processes; its folder comes from
``PERDURE_DEMO_DIR`` (default ``demo-llm``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from perdure import App, Run
from perdure.demo.agents import DEMO_DIR_ENV, LEASE_SECONDS
from perdure.llm import ChatCompletionsClient, Message, ModelParams, Price, PriceTable
from perdure.llm.scripted import RecordedRequest, ScriptedReply, Step

__all__ = ["DEMO_PRICE", "DRAFT", "LLM_AGENT", "LLM_DEFAULT_DIR", "OFFLINE_KEY", "OUTLINE",
           "SUMMARY", "TOPIC", "app", "build_llm_app", "conversation", "draft_reply", "prompts"]

LLM_AGENT = "brief"
LLM_DEFAULT_DIR = "demo-llm"
TOPIC = "why durable execution matters for long-running AI agents"
OFFLINE_KEY = "offline-demo"  # the scripted server takes any non-empty key
DEMO_PRICE = Price("0.15", "0.60")
"""The demo's own price (dollars per million tokens in / out): illustrative, not a quote."""

OUTLINE = ("1. Agents run for hours and call models many times.\n"
           "2. Processes die: deploys, OOM kills, preemptions.\n"
           "3. Durable memory turns a crash into a pause.")
DRAFT = (
    "Long-running AI agents make dozens of model calls, each one slow and billed by the "
    "token. When the process running an agent dies, a deploy, an out-of-memory kill or a "
    "preempted machine, most frameworks throw away everything the agent was doing, "
    "including the half-written reply streaming back from the model. The agent starts "
    "over and pays again. A durable agent keeps its memory outside the process: every "
    "model call is recorded with its usage and cost, and a streamed reply is journaled "
    "as it arrives, a batch at a time. When a worker is killed mid-stream, another worker "
    "replays memory, gets every finished call back without asking the model again, and "
    "asks the model to continue the interrupted reply from the text that was salvaged. "
    "Nothing is paid twice that need not be, and the whole conversation stays auditable."
)
SUMMARY = "Durable memory lets an agent survive a crash mid-stream and pick up where it stopped."
DRAFT_CHUNK_CHARS = 6
DRAFT_CHUNK_DELAY = 0.04  # about 2.8 s for the whole draft: time to kill it mid-way


def prompts(topic: str) -> tuple[str, str, str]:
    """The three user turns: outline, draft, summary."""
    return (f"Outline, in three short points, {topic}.",
            "Now write a one-paragraph draft from that outline.",
            "Summarise the draft in one sentence.")


def _last(request: RecordedRequest, role: str) -> str | None:
    messages = request.body.get("messages") or []
    for item in reversed(messages):
        if isinstance(item, dict) and item.get("role") == role:
            content = item.get("content")
            return content if isinstance(content, str) else None
    return None


def draft_reply(text: str = DRAFT) -> ScriptedReply:
    """The draft as the scripted server streams it: small chunks, slowly."""
    return ScriptedReply(text=text, chunk_chars=DRAFT_CHUNK_CHARS,
                         chunk_delay=DRAFT_CHUNK_DELAY)


def conversation(request: RecordedRequest) -> Step:
    """The scripted model: answers the demo's conversation, whatever order it comes in.

    A request whose last assistant message is a strict start of the draft is a request
    to continue it: the answer is exactly the rest of the draft, as a model continuing
    from the salvaged text would write it.
    """
    before = _last(request, "assistant")
    if before is not None and before != DRAFT and DRAFT.startswith(before) and before:
        return ScriptedReply(text=DRAFT[len(before):], chunk_chars=12, chunk_delay=0.01)
    asked = request.last_user_text()
    outline_q, draft_q, summary_q = prompts(TOPIC)
    if asked == outline_q:
        return ScriptedReply(text=OUTLINE, chunk_chars=12, chunk_delay=0.005)
    if asked == draft_q:
        return draft_reply()
    if asked == summary_q:
        return ScriptedReply(text=SUMMARY, chunk_chars=12, chunk_delay=0.005)
    return ScriptedReply(text=f"(the scripted demo model has no answer to {asked!r})")


def build_llm_app(folder: str | Path, *, node_id: str | None = None) -> App:
    """The LLM demo App: store ``<folder>/demo.db``, keys in ``<folder>/keys``, agent
    ``brief``."""
    root = Path(folder).resolve()
    demo_app = App(store=f"sqlite:///{root / 'demo.db'}", key_dir=root / "keys",
                   node_id=node_id, lease_seconds=LEASE_SECONDS, poll_interval=0.05)

    @demo_app.agent(name=LLM_AGENT)
    async def brief(run: Run, model: str, base_url: str | None = None,
                    offline: bool = True, topic: str = TOPIC) -> dict[str, Any]:
        """Outline, draft and summarise ``topic`` in three streamed, recorded calls.

        ``base_url`` is the OpenAI-compatible endpoint (``None``: the SDK's default and
        ``OPENAI_BASE_URL``); ``offline`` sends a placeholder key (the scripted server),
        else the key comes from ``OPENAI_API_KEY``.
        """
        client = (ChatCompletionsClient(base_url=base_url, api_key=lambda: OFFLINE_KEY)
                  if offline else ChatCompletionsClient(base_url=base_url))
        prices = PriceTable({model: DEMO_PRICE})
        messages = [Message.system("You are a concise technical writer.")]
        texts: dict[str, str] = {}
        try:
            for name, asked in zip(("outline", "draft", "summary"), prompts(topic),
                                   strict=True):
                messages.append(Message.user(asked))
                reply = await run.model(client, model=model, messages=messages,
                                        params=ModelParams(max_tokens=600), stream=True,
                                        name=name, prices=prices)
                messages.append(reply.message())
                texts[name] = reply.text
        finally:
            await client.aclose()
        return texts

    return demo_app


app = build_llm_app(os.environ.get(DEMO_DIR_ENV) or LLM_DEFAULT_DIR)
"""The LLM demo App for ``perdure --app perdure.demo.llm_agent:app worker``."""
