"""The scripted model server itself: routes, script files, the command line."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from perdure.llm import Message, ModelRequest
from perdure.llm.scripted import (
    RecordedRequest,
    ScriptedFailure,
    ScriptedReply,
    ScriptedServer,
    ScriptedToolCall,
    load_script,
    step_from_json,
)
from tests.llm.support import KEY, KINDS, complete, make_client, run


def _post(url: str, body: object, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


@pytest.mark.parametrize("kind", KINDS)
def test_echo_when_the_script_is_empty(kind: str, server: ScriptedServer) -> None:
    """With nothing scripted the server echoes the last user text, in every dialect."""
    reply = run(complete(make_client(kind, server),
                         ModelRequest("m", (Message.user("first"), Message.assistant("a"),
                                            Message.user("ping")))))
    assert reply.text == "echo: ping"
    assert server.pending == 0 and len(server.requests) == 1
    assert server.requests[0].api == kind
    assert server.requests[0].credential_sha256 == hashlib.sha256(KEY.encode()).hexdigest()


def test_unknown_path_and_bad_body(server: ScriptedServer) -> None:
    """An unknown path is 404 and a body that is not JSON 400; neither uses a step."""
    server.script(ScriptedReply(text="kept"))
    assert _post(server.url + "/v1/embeddings", {})[0] == 404
    bad = urllib.request.Request(server.openai_base_url + "/chat/completions",
                                 data=b"{nope", method="POST")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(bad, timeout=10)
    with caught.value as error:
        assert error.code == 400
    assert server.pending == 1


def test_credentials_are_kept_only_as_a_hash(server: ScriptedServer) -> None:
    """The recorded headers hold no credential; its hash says which key came."""
    _post(server.openai_base_url + "/chat/completions",
          {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
          {"Authorization": "Bearer sk-secret"})
    recorded = server.requests[0]
    assert "authorization" not in recorded.headers
    assert recorded.credential_sha256 == hashlib.sha256(b"sk-secret").hexdigest()


def test_failure_headers_are_sent(server: ScriptedServer) -> None:
    """A scripted failure carries its retry headers and a dialect's error body."""
    server.script(ScriptedFailure(429, retry_after="3", retry_after_ms="2500",
                                  should_retry=True))
    status, text = _post(server.url + "/v1/messages", {"model": "m", "messages": []})
    assert status == 429
    assert json.loads(text) == {"type": "error", "error": {"type": "rate_limit_error",
                                                           "message": "scripted failure"}}


def test_last_user_text_in_every_dialect() -> None:
    """The echo finds the user's text in chat, Responses and Anthropic bodies."""
    bodies = [
        {"messages": [{"role": "user", "content": "a"}]},
        {"input": "b"},
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "c"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "d"}]},
                      {"role": "assistant", "content": "x"}]},
        {"messages": []},
    ]
    texts = [RecordedRequest("chat", "/", b, False, {}, None).last_user_text()
             for b in bodies]
    assert texts == ["a", "b", "c", "d", ""]


def test_script_json() -> None:
    """Steps load from JSON; unknown fields and shapes are refused."""
    steps = load_script(json.dumps([
        {"reply": {"text": "hi", "chunk_delay": 0.01,
                   "tool_calls": [{"name": "f", "arguments": "{}"}]}},
        {"failure": {"status": 429, "retry_after": "2"}},
    ]))
    assert steps == [ScriptedReply(text="hi", chunk_delay=0.01,
                                   tool_calls=(ScriptedToolCall("f", "{}"),)),
                     ScriptedFailure(429, retry_after="2")]
    for bad in ({"reply": {"txt": "x"}}, {"failure": {"status": 500, "wait": 1}},
                {"both": {}}):
        with pytest.raises(ValueError):
            step_from_json(bad)
    with pytest.raises(ValueError):
        load_script("{}")


def test_command_line_serves_a_script(tmp_path: Path) -> None:
    """``python -m perdure.llm.scripted --script FILE`` prints its URLs and serves."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"reply": {"text": "from the file"}}]))
    process = subprocess.Popen(
        [sys.executable, "-m", "perdure.llm.scripted", "--port", "0", "--script", str(script)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        openai_url = process.stdout.readline().split()[-1]
        anthropic_url = process.stdout.readline().split()[-1]
        assert openai_url == anthropic_url + "/v1"
        status, text = _post(openai_url + "/chat/completions",
                             {"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert status == 200
        assert json.loads(text)["choices"][0]["message"]["content"] == "from the file"
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()
