"""An agent to drive over the HTTP API, from any language (docs/howto/http-api.md).

The how-to serves it with `perdure --app examples.http_api:app worker` and
`perdure --app examples.http_api:app api`, and talks to it with curl. Run as a script,
it does the same in one process, as a caller in another language would: a worker and the
API in the background, then plain HTTP (the standard library's urllib) to start an
object, follow its events, answer its question and wait for its result.

Run it: python examples/http_api.py
"""

import json
import tempfile
import threading
import urllib.request
from pathlib import Path

import perdure
from perdure.triggers import Triggers

app = perdure.App(store="sqlite:///http-api.db")


def count_words(text: str) -> int:
    return len(text.split())


@app.agent()
async def review(run: perdure.Run, text: str, rounds: int = 3) -> dict:
    words = await run.step(count_words, text)           # recorded once
    for n in range(1, rounds + 1):
        await run.emit("progress", {"round": n, "of": rounds})  # what a stream shows
        await run.sleep(1)
    verdict = await run.wait_for("verdict", prompt=f"Publish {words} words?",
                                 choices=("yes", "no"))      # a question for a person
    return {"words": words, "verdict": verdict}


# Signed webhooks start reviews too: POST /api/v1/hooks/reviews, signed with the secret
# in $REVIEW_HOOK_SECRET (docs/howto/triggers.md#webhooks).
Triggers.of(app).webhook("reviews", agent=review, secret_env="REVIEW_HOOK_SECRET")  # noqa: S106 (a variable name)


def call(base: str, token: str, method: str, path: str, body: object = None) -> dict:
    """One request to the API: JSON in, JSON out."""
    request = urllib.request.Request(  # noqa: S310 (base is this example's http://127.0.0.1)
        base + path, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=70) as answer:  # noqa: S310
        return json.loads(answer.read())


def main() -> None:
    from perdure import web

    folder = Path(tempfile.mkdtemp(prefix="perdure-http-"))
    mine = app.with_settings(store=f"sqlite:///{folder / 'http-api.db'}",
                             key_dir=folder / "keys")
    token, _ = web.api_tokens(folder / "keys").create("example", ["read", "operate"])
    _, server = web.serve_in_thread(web.api(mine), host="127.0.0.1", port=0,
                                    sock=web.listen("127.0.0.1", 0))
    with mine.background_worker():
        while not getattr(server, "started", False):
            threading.Event().wait(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        base = f"http://127.0.0.1:{port}/api/v1"
        started = call(base, token, "POST", "/objects", {
            "agent": "review", "kwargs": {"text": "durable agents survive crashes",
                                          "rounds": 2}, "object_id": "review-1"})
        print("started", started["object"]["object_id"], started["object"]["status"])
        request = urllib.request.Request(base + "/objects/review-1/stream",  # noqa: S310
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as stream:  # noqa: S310
            for line in stream:
                if line.startswith(b"data:"):
                    event = json.loads(line[5:])
                    print("event", event["name"], event["data"])
                    if event["data"]["round"] == event["data"]["of"]:
                        break
        while not call(base, token, "GET", "/questions")["questions"]:
            threading.Event().wait(0.1)
        [question] = call(base, token, "GET", "/questions")["questions"]
        print("asks", question["prompt"], question["choices"])
        call(base, token, "POST", "/objects/review-1/answer", {"answer": "yes"})
        print("result", call(base, token, "GET", "/objects/review-1/result?wait=30"))
    server.should_exit = True


if __name__ == "__main__":
    main()
