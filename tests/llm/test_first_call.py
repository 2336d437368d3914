"""A process's first model calls do no SDK work on the event loop.

Each dialect in a fresh process (the SDKs' lazy paths are per process): the first whole
call, stream and failures, on a loop under a ``LoopWatchdog`` at the suite's limit. The
SDK's first-use work must have been done by the warm-up, on the import thread.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.llm.support import KINDS

PROVIDER = {"chat": "openai.chat", "responses": "openai.responses", "anthropic": "anthropic"}

SCRIPT = textwrap.dedent('''
    import asyncio, json, sys
    from perdure.engine.stalls import LoopWatchdog
    from perdure.llm import Message, ModelCallError, ModelRequest
    from perdure.llm._warm import warmed
    from perdure.llm.scripted import ScriptedFailure, ScriptedReply, ScriptedServer
    from tests.llm.support import make_client

    async def main(kind, limit):
        stalls = []
        watchdog = LoopWatchdog(limit, stalls.append)
        watchdog.start()
        reply = ScriptedReply(text="hello there", chunk_chars=2)
        steps = [reply, reply, ScriptedFailure(429), ScriptedFailure(500),
                 ScriptedReply(text="abcd", chunk_chars=1, error_after=2),
                 ScriptedReply(text="abcd", chunk_chars=1, drop_after=2)]
        outcomes = []
        request = ModelRequest(model="m", messages=(Message.user("hi"),))
        with ScriptedServer(*steps) as server:
            client = make_client(kind, server)
            for call in ("complete", "stream", "complete", "complete", "stream", "stream"):
                try:
                    if call == "complete":
                        outcomes.append((await client.complete(request)).text)
                    else:
                        async for item in client.stream(request):
                            pass
                        outcomes.append(item.text)
                except ModelCallError as exc:
                    outcomes.append(exc.failure.kind.value)
            await client.aclose()
        watchdog.stop()
        print(json.dumps({"warmed": sorted(warmed()), "outcomes": outcomes,
                          "stalls": [f"{s.seconds * 1000:.0f} ms at:\\n{s.stack}"
                                     for s in stalls]}))

    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
''')


@pytest.mark.parametrize("kind", KINDS)
def test_the_first_calls_of_a_process_leave_the_loop_free(kind: str) -> None:
    limit = float(os.environ.get("PERDURE_TEST_STALL_MS", "100")) or 100
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", SCRIPT, kind, str(limit / 1000)],
                          capture_output=True, text=True, timeout=300, cwd=root,
                          env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert PROVIDER[kind] in report["warmed"], done.stderr  # the warm-up worked
    assert report["outcomes"][:2] == ["hello there", "hello there"]
    assert report["outcomes"][2:] == ["rate_limited", "transient", "transient", "transient"]
    assert report["stalls"] == [], "\n".join(report["stalls"])
