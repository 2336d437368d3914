"""Continuing from salvaged text: what each client sends, and the joined reply."""

from __future__ import annotations

import pytest

from perdure.errors import ConfigurationError
from perdure.llm import (
    ChatCompletionsClient,
    Continuation,
    Message,
    ModelCallError,
    ModelRequest,
)
from perdure.llm._stream import CONTINUE_PROMPT
from perdure.llm.scripted import ScriptedReply, ScriptedServer
from tests.llm.support import KEY, KINDS, complete, make_client, run, stream

STORY = "Once upon a time there was a worker that never lost its place in a story."
ASK = ModelRequest("m", (Message.system("Tell stories."), Message.user("A story, please.")))


def _continued(prefix: str) -> ModelRequest:
    return ModelRequest(ASK.model, ASK.messages, prefix=prefix)


@pytest.mark.parametrize("streaming", [False, True])
def test_anthropic_prefills_the_salvaged_text(streaming: bool, server: ScriptedServer) -> None:
    """Anthropic gets the prefix as the start of the assistant's turn (trailing space cut,
    as the API requires) and the reply is the prefix joined with what followed; streamed
    chunks carry only the new text."""
    server.script(ScriptedReply(text=" time there was a worker.", chunk_chars=5))
    request = _continued("Once upon a ")
    client = make_client("anthropic", server)
    if streaming:
        chunks, reply = run(stream(client, request))
        assert "".join(c.text for c in chunks) == " time there was a worker."
    else:
        reply = run(complete(client, request))
    assert reply.text == "Once upon a time there was a worker."
    last = server.requests[0].body["messages"][-1]
    assert last == {"role": "assistant", "content": [{"type": "text", "text": "Once upon a"}]}


def test_chat_continue_final_message(server: ScriptedServer) -> None:
    """On servers that support it, the chat client sends the prefix as the final
    assistant message with ``continue_final_message`` and no generation prompt."""
    server.script(ScriptedReply(text="time there was a worker."))
    client = ChatCompletionsClient(base_url=server.openai_base_url, api_key=lambda: KEY,
                                   continuation="continue_final_message")
    reply = run(complete(client, _continued("Once upon a ")))
    body = server.requests[0].body
    assert body["messages"][-1] == {"role": "assistant", "content": "Once upon a "}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert reply.text == "Once upon a time there was a worker."


@pytest.mark.parametrize("kind", ["chat", "responses"])
def test_explicit_continuation_turn(kind: str, server: ScriptedServer) -> None:
    """Elsewhere the prefix is an assistant message followed by a user message asking to
    continue exactly where it stopped."""
    server.script(ScriptedReply(text="time there was a worker."))
    reply = run(complete(make_client(kind, server), _continued("Once upon a ")))
    body = server.requests[0].body
    sent = body.get("messages") or body["input"]
    assert sent[-2] == {"role": "assistant", "content": "Once upon a "}
    assert sent[-1] == {"role": "user", "content": CONTINUE_PROMPT}
    assert reply.text == "Once upon a time there was a worker."
    assert "continue_final_message" not in body


@pytest.mark.parametrize("kind", KINDS)
def test_salvage_then_continue(kind: str, server: ScriptedServer) -> None:
    """The whole recovery: a stream drops after four chunks, the partial text is kept,
    and a continuation from it yields the complete story."""
    server.script(ScriptedReply(text=STORY, chunk_chars=6, drop_after=4))
    with pytest.raises(ModelCallError) as caught:
        run(stream(make_client(kind, server), ASK))
    partial = caught.value.partial
    assert partial == STORY[:24]
    joined = partial.rstrip() if kind == "anthropic" else partial
    server.script(ScriptedReply(text=STORY[len(joined):], chunk_chars=6))
    _, reply = run(stream(make_client(kind, server), _continued(partial)))
    assert reply.text == STORY
    assert partial.rstrip() in str(server.requests[1].body)


def test_chat_has_no_prefill() -> None:
    """Asking a chat client for a prefill continuation is a configuration error."""
    with pytest.raises(ConfigurationError):
        ChatCompletionsClient(continuation=Continuation.PREFILL)
