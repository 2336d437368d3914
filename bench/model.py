"""Model calls: storage of a conversation, and the cost of journaling a stream.

Against the scripted local model server (``perdure.llm.scripted``), through the real
``openai`` SDK, on SQLite:

* ``conversation``: one object converses N turns (10, 100, 200) with ``run.model``: a
  system message, then a ~300-character user message per turn, each call sending the
  whole conversation so far; the server echoes the user text. Figures: the store's
  bytes (the SQLite file after a WAL checkpoint), the bytes of the object's record
  bodies, the bytes of the conversation's unique messages (each message's JSON form
  once), both per turn, and ``records_to_unique``, the record bytes over the unique
  message bytes, against the bound of 2 (PASS/FAIL). The agent returns only a digest
  of its messages (checked against the expected conversation), so its result record
  does not hold the conversation a second time. Beside it, LangGraph's
  ``SqliteSaver`` holding the same conversation through a ``StateGraph`` with an
  appending ``messages`` state (``bench/peers/langgraph_model.py``, in a process of its
  own; "n/a" when LangGraph is not installed), and the ratio of its store bytes to
  perdure's; and the same graph with perdure's ``PerdureSaver``
  (``perdure.adapters.langgraph``) on a perdure SQLite store, with its store bytes over
  ``SqliteSaver``'s.
* ``stream``: a reply of 2,000 tokens (8,000 characters in chunks of 4, no delay
  between chunks) from the scripted server running in a process of its own, read by
  the plain ``openai`` SDK (``AsyncOpenAI``, ``stream=True``) and by
  ``run.model(stream=True)`` with the default ``FlushPolicy`` (each batch a durable
  commit), in alternating rounds. Tokens per second of each (the reply's output tokens
  over the time from the request to the last chunk; for ``run.model`` timed inside the
  agent around the call), the medians, and the journal's overhead in per cent of the
  plain SDK's rate, against the target of at most 5% (PASS/FAIL). A third reader,
  perdure's ``ChatCompletionsClient.stream`` without ``run.model`` (no journal), shows
  how much of the difference is the client's own parsing and how much the journal.
  ``stream_paced``: the same with the server waiting 1 ms before each token (a stream
  of at most 1,000 tokens per second, still faster than hosted models), where the
  journal's commits overlap the wait for the next chunk.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import perdure
from bench import storage
from bench.common import REPO, progress
from bench.model_conversation import SYSTEM, user_text

__all__ = ["FULL", "QUICK", "STREAM_TARGET_PCT", "UNIQUE_BOUND", "conversation", "measure",
           "stream_overhead"]

QUICK = {"turns": [10, 30], "stream_tokens": 500, "stream_rounds": 2, "paced_s": 0.001,
         "paced_rounds": 1}
# paced_s: a second stream figure with the server waiting this long before each token
# (at most 1,000 tokens per second, faster than hosted models stream).
FULL = {"turns": [10, 100, 200], "stream_tokens": 2000, "stream_rounds": 7, "paced_s": 0.001,
        "paced_rounds": 3}
UNIQUE_BOUND = 2.0  # a conversation's records hold at most twice its unique messages
STREAM_TARGET_PCT = 5.0  # the stream journal costs at most 5% of tokens per second
_LONG = "The river bent twice before the mill, and each bend had a name of its own. "


def _app(folder: Path, name: str) -> perdure.App:
    folder.mkdir(parents=True, exist_ok=True)
    return perdure.App(store=f"sqlite:///{folder / (name + '.db')}", key_dir=folder / "keys",
                       node_id=f"bench-{name}", poll_interval=0.005)


def _register_conversation(app: perdure.App) -> None:
    from perdure.llm import ChatCompletionsClient, Message

    @app.agent(name="conversation")
    async def conversation(run: perdure.Run, base_url: str, turns: int) -> str:
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "bench")
        messages = [Message.system(SYSTEM)]
        try:
            for i in range(turns):
                messages.append(Message.user(user_text(i)))
                reply = await run.model(client, model="gpt-4o", messages=messages)
                messages.append(reply.message())
        finally:
            await client.aclose()
        # Only a digest: a result holding the messages would store them a second time.
        return _digest([m.to_json() for m in messages])


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _digest(messages: list[Any]) -> str:
    return hashlib.sha256(_canonical(messages)).hexdigest()


def expected_messages(turns: int) -> list[Any]:
    """The JSON forms of the conversation's messages after ``turns`` turns."""
    from perdure.llm import Message

    out = [Message.system(SYSTEM).to_json()]
    for i in range(turns):
        out += [Message.user(user_text(i)).to_json(),
                Message.assistant(f"echo: {user_text(i)}").to_json()]
    return out


def perdure_conversation(folder: Path, turns: int, base_url: str) -> dict[str, Any]:
    """One object conversing ``turns`` turns; its store, record and unique-message bytes."""
    app = _app(folder, "conversation")
    try:
        _register_conversation(app)
        began = time.perf_counter()
        handle = app.options(object_id=f"conversation-{turns}").start(
            "conversation", base_url, turns)
        with app.background_worker(concurrency=1):
            digest = handle.result(timeout=600)
        took = time.perf_counter() - began
        records = list(app.history(f"conversation-{turns}"))
        record_bytes = sum(len(r.body_bytes) for r in records)
        model_bytes = sum(len(r.body_bytes) for r in records if r.kind.startswith("model_"))
    finally:
        app.close()
    messages = expected_messages(turns)
    if digest != _digest(messages):
        raise RuntimeError("the conversation is not the one the benchmark expects")
    unique = {_canonical(m) for m in messages}
    unique_bytes = sum(len(u) for u in unique)
    size = storage.sqlite_bytes(folder / "conversation.db")
    return {"turns": turns, "seconds": round(took, 2), "records": len(records),
            "store_bytes": size, "store_bytes_per_turn": size / turns,
            "record_bytes": record_bytes, "record_bytes_per_turn": record_bytes / turns,
            "model_record_bytes": model_bytes, "unique_messages": len(unique),
            "unique_message_bytes": unique_bytes,
            "unique_message_bytes_per_turn": unique_bytes / turns,
            "records_to_unique": record_bytes / unique_bytes,
            "within_bound": record_bytes <= UNIQUE_BOUND * unique_bytes}


def langgraph_conversation(folder: Path, turns: int, saver: str = "sqlite") -> dict[str, Any]:
    """The same conversation in LangGraph's ``SqliteSaver`` (its own process), or with
    ``saver="perdure"`` in perdure's ``PerdureSaver`` on a perdure SQLite store; or n/a."""
    from bench import peers

    if not peers.installed("langgraph"):
        return {"na": f"{peers.NEEDS['langgraph'][0]} not installed ({peers.INSTALL})"}
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "bench.peers.langgraph_model", "--db",
                           str(folder / "langgraph.db"), "--turns", str(turns),
                           "--saver", saver],
                          cwd=REPO, env=peers._env(), capture_output=True, text=True,
                          timeout=900, check=False)
    if proc.returncode != 0:
        return {"na": f"failed: {proc.stderr.strip()[-500:]}"}
    got: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    got["store_bytes_per_turn"] = got["store_bytes"] / turns
    return got


def conversation(folder: Path, sizes: dict[str, Any], with_peers: bool = True
                 ) -> dict[str, Any]:
    """perdure (and LangGraph) at every conversation length of ``sizes["turns"]``."""
    from perdure.llm.scripted import ScriptedServer

    out: dict[str, Any] = {"bound": UNIQUE_BOUND}
    with ScriptedServer() as server:
        for turns in sizes["turns"]:
            here = folder / f"turns{turns}"
            got = perdure_conversation(here / "perdure", turns, server.openai_base_url)
            if with_peers:
                peer = langgraph_conversation(here / "langgraph", turns)
                got["langgraph"] = peer
                if "na" not in peer:
                    got["langgraph_to_perdure_store"] = peer["store_bytes"] / got["store_bytes"]
                saver = langgraph_conversation(here / "perdure-saver", turns, "perdure")
                got["langgraph_perdure_saver"] = saver
                if "na" not in peer and "na" not in saver:
                    got["perdure_saver_to_sqlite_saver"] = (saver["store_bytes"]
                                                            / peer["store_bytes"])
            out[str(turns)] = got
            progress(f"model conversation {turns} turns: {got['seconds']} s")
    longest = out[str(max(sizes["turns"]))]
    out["verdict"] = "PASS" if longest["within_bound"] else "FAIL"
    return out


@contextmanager
def _server_process(folder: Path, steps: list[dict[str, Any]]) -> Iterator[str]:
    """The scripted server in a process of its own, answering ``steps``; its OpenAI URL."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "script.json"
    script.write_text(json.dumps(steps))
    proc = subprocess.Popen([sys.executable, "-m", "perdure.llm.scripted", "--script",
                             str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("openai base url:"):
            raise RuntimeError(f"the scripted server did not start: {line!r}")
        yield line.split(":", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def _plain_round(base_url: str) -> tuple[float, int]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    try:
        began = time.perf_counter()
        stream = await client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "Tell me a long story."}],
            stream=True, stream_options={"include_usage": True})
        tokens = 0
        async for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return time.perf_counter() - began, tokens
    finally:
        await client.close()


async def _client_round(base_url: str) -> tuple[float, int]:
    from perdure.llm import ChatCompletionsClient, Message, ModelReply, ModelRequest

    request = ModelRequest("gpt-4o", (Message.user("Tell me a long story."),))
    async with ChatCompletionsClient(base_url=base_url, api_key=lambda: "bench") as client:
        began = time.perf_counter()
        tokens = 0
        async for item in client.stream(request):
            if isinstance(item, ModelReply):
                tokens = item.usage.output_tokens
        return time.perf_counter() - began, tokens


def _register_streamer(app: perdure.App) -> None:
    from perdure.llm import ChatCompletionsClient, Message

    @app.agent(name="streamer")
    async def streamer(run: perdure.Run, base_url: str) -> list[float]:
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "bench")
        try:
            began = time.perf_counter()
            reply = await run.model(client, model="gpt-4o",
                                    messages=[Message.user("Tell me a long story.")],
                                    stream=True)
            took = time.perf_counter() - began
        finally:
            await client.aclose()
        return [took, float(reply.usage.output_tokens)]


def _journaled_batches(app: perdure.App, oid: str) -> int:
    return sum(1 for r in app.history(oid) if r.kind == "model_chunks")


def stream_overhead(folder: Path, sizes: dict[str, Any], pace: float = 0.0
                    ) -> dict[str, Any]:
    """Tokens per second of a long stream: plain SDK against ``run.model(stream=True)``.

    ``pace``: seconds the server waits before each chunk (one token), 0 for none.
    """
    tokens, rounds = int(sizes["stream_tokens"]), int(sizes["stream_rounds"])
    text = (_LONG * (tokens * 4 // len(_LONG) + 1))[:tokens * 4]
    reply = {"reply": {"text": text, "chunk_chars": 4, "output_tokens": tokens,
                       "chunk_delay": pace}}
    plain: list[float] = []
    unjournaled: list[float] = []
    journaled: list[float] = []
    batches: list[int] = []
    app = _app(folder / "perdure", "stream")
    try:
        _register_streamer(app)
        with _server_process(folder / "server", [reply] * (3 * rounds + 3)) as url, \
                app.background_worker(concurrency=1):
            asyncio.run(_plain_round(url))  # warm every path up once
            asyncio.run(_client_round(url))
            app.options(object_id="warm-up").start("streamer", url).result(timeout=120)
            for i in range(rounds):
                order = ("plain", "client", "perdure")
                for which in order if i % 2 == 0 else order[::-1]:
                    if which == "plain":
                        took, got = asyncio.run(_plain_round(url))
                        plain.append(got / took)
                    elif which == "client":
                        took, got = asyncio.run(_client_round(url))
                        unjournaled.append(got / took)
                    else:
                        oid = f"stream-{i}"
                        took, got = app.options(object_id=oid).start("streamer", url).result(
                            timeout=120)
                        journaled.append(got / took)
                        batches.append(_journaled_batches(app, oid))
    finally:
        app.close()
    p, j = statistics.median(plain), statistics.median(journaled)
    overhead = (p - j) / p * 100
    return {"tokens": tokens, "chunks": len(text) // 4, "rounds": rounds, "pace_s": pace,
            "plain_sdk_tokens_per_s": p, "run_model_tokens_per_s": j,
            "client_tokens_per_s": statistics.median(unjournaled),
            "plain_sdk_runs": plain, "client_runs": unjournaled, "run_model_runs": journaled,
            "batches_per_stream": statistics.median(batches),
            "overhead_pct": overhead, "target_pct": STREAM_TARGET_PCT,
            "verdict": "PASS" if overhead <= STREAM_TARGET_PCT else "FAIL"}


def measure(folder: Path, sizes: dict[str, Any], with_peers: bool = True) -> dict[str, Any]:
    """Both model-call figures: ``{"conversation": ..., "stream": ...}``."""
    t0 = time.monotonic()
    out = {"conversation": conversation(folder / "conversation", sizes, with_peers)}
    progress(f"model conversation: {time.monotonic() - t0:.1f} s")
    t0 = time.monotonic()
    out["stream"] = stream_overhead(folder / "stream", sizes)
    progress(f"model stream: {time.monotonic() - t0:.1f} s")
    if sizes.get("paced_s"):
        t0 = time.monotonic()
        paced = {**sizes, "stream_rounds": sizes.get("paced_rounds", sizes["stream_rounds"])}
        out["stream_paced"] = stream_overhead(folder / "stream_paced", paced,
                                              float(sizes["paced_s"]))
        progress(f"model stream, paced: {time.monotonic() - t0:.1f} s")
    return out
