"""A first durable agent: a recorded step, a sleep and an approval.

Run it: python examples/quickstart.py
Run it again: it finds the finished object r-1 and prints the same result.
The agent waits up to 5 minutes for its approval, time enough to send it by hand with
`perdure send`; this script sends it itself, so it finishes at once.
"""

import perdure

app = perdure.App(store="sqlite:///quickstart.db", key_dir=".perdure-keys")

def fetch(topic: str) -> list[str]:
    print(f"fetching pages about {topic}")  # runs once, however often the agent resumes
    return [f"{topic}-page-{i}" for i in range(3)]

@app.agent()
async def research(run: perdure.Run, topic: str) -> dict:
    pages = await run.step(fetch, topic)          # recorded: on resume returns the record
    await run.sleep(0.3)                          # dormant: the object is released
    ok = await run.wait_for("approval", timeout=300)  # dormant until the event comes
    return {"pages": pages, "approved": ok}

if __name__ == "__main__":
    with app.background_worker():
        handle = app.options(object_id="r-1").start(research, "tides")
        if not handle.info().terminal:
            handle.send("approval", {"by": "me"}, dedupe_key="approve-r-1")
        print(handle.result(timeout=30))
